"""The runtime's own threads, started with every signal blocked (as libzmq starts its own).

A signal sent to the process (SIGTERM, SIGINT, ...) is taken by any one of its threads that does
not block it. Python runs the program's handler only in the main thread, and only when that thread
next runs Python code: a signal taken by another thread sets a flag and leaves a main thread
blocked in a wait without a timeout (`threading.Event().wait()`, a lock) blocked for good, its
handler never run. So the runtime's threads (a server's serving and monitor threads, the client's
janitor, a registration's keepalive) block every signal, and signals go to the program's threads.
"""

from __future__ import annotations

import contextlib
import signal
import threading
from typing import Any, Callable, Iterator

import zmq


@contextlib.contextmanager
def _all_blocked() -> Iterator[None]:
    """Every signal blocked in this thread for the block's length: a thread started in it has
    the full mask from its first instruction (a thread inherits its creator's mask)."""
    if not hasattr(signal, "pthread_sigmask"):
        yield
        return
    old = signal.pthread_sigmask(signal.SIG_BLOCK, signal.valid_signals())
    try:
        yield
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, old)


def start(target: Callable[[], None], name: str) -> threading.Thread:
    """Start a daemon thread running `target` with every signal blocked. The mask is set
    around the start; the caller's own mask is put back at once."""
    thread = threading.Thread(target=target, name=name, daemon=True)
    with _all_blocked():
        thread.start()
    return thread


def start_zmq(ctx: "zmq.Context[Any]") -> None:
    """Start the threads of ZeroMQ context `ctx` (its I/O thread and reaper) with every signal
    blocked, if they have not started. libzmq starts them with a context's first socket, from
    the thread that makes it, and each blocks signals itself only once it runs: until then a
    signal sent to the process can be taken by one, and SIGTERM, its action the default, ends
    the process under a main thread waiting for it in sigwait. Every client and server calls
    this on its context, its own or one it was given, before it makes a socket."""
    with _all_blocked():
        ctx.socket(zmq.PAIR).close(linger=0)


_gc_lock = threading.Lock()


def zero_copy_ready() -> None:
    """Before a zero-copy send (copy=False): pyzmq then keeps the buffer for libzmq through a
    collector thread of its own (with a context of its own), which it starts at its first such
    send from the sending thread, taking that thread's mask. Started here first, with every
    signal blocked, for the reason start_zmq gives. Cheap once it runs."""
    try:
        from zmq.utils import garbage
    except ImportError:  # a pyzmq without the collector: nothing to start
        return
    gc: Any = garbage.gc  # (pyzmq leaves it untyped)
    if gc.is_alive():
        return
    with getattr(gc, "_lock", _gc_lock), _all_blocked():  # the lock its own start takes
        if not gc.is_alive():
            gc.start()
