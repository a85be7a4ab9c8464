"""The runtime's own threads, started with every signal blocked (as libzmq starts its own).

A signal sent to the process (SIGTERM, SIGINT, ...) is taken by any one of its threads that does
not block it. Python runs the program's handler only in the main thread, and only when that thread
next runs Python code: a signal taken by another thread sets a flag and leaves a main thread
blocked in a wait without a timeout (`threading.Event().wait()`, a lock) blocked for good, its
handler never run. So the runtime's threads (a server's serving and monitor threads, the client's
janitor, a registration's keepalive) block every signal, and signals go to the program's threads.
"""

from __future__ import annotations

import signal
import threading
from typing import Callable


def start(target: Callable[[], None], name: str) -> threading.Thread:
    """Start a daemon thread running `target` with every signal blocked. The mask is set
    around the start, so the thread has it from its first instruction (a thread inherits its
    creator's mask); the caller's own mask is put back at once."""
    thread = threading.Thread(target=target, name=name, daemon=True)
    if not hasattr(signal, "pthread_sigmask"):
        thread.start()
        return thread
    old = signal.pthread_sigmask(signal.SIG_BLOCK, signal.valid_signals())
    try:
        thread.start()
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, old)
    return thread
