"""The asyncio client: `await client.call(...)`, `await client.call_many(...)`, `client.notify(...)`.

    async with ctlrpc.aio.Client(timeout=5.0) as c:
        size = await c.call("tcp://10.0.0.5:4100", "put", {"key": "k", "data": b"bytes"})
        outcomes = await c.call_many("stats", [(a, None) for a in addresses])

It is the blocking Client with another way to wait: both sit on one engine (client._Engine), so
the pool, the ids, the judging of replies, the monitors' verdicts, the retiring of sockets and
the counters are the same code, and a call ends the same way on either path (docs/PYTHON.md,
"The asyncio client"):

- Sockets are pooled per address, one request in flight per socket; a socket goes back only
  after its own complete reply, otherwise it is retired (late replies counted, closed after
  `late_grace`). A reply for another id is counted as late and skipped.
- The fail-fast causes end a call early as they do a blocking one: "refused", "unresolved",
  "auth", "too-large" (the monitor of a call's socket is read every 100 ms of waiting).
- Many calls may be in flight at once, from many tasks of one event loop: each waits on its own
  socket, and none blocks the loop. `call_many` sends every request before it reads any reply.
- Cancelling the task that awaits a call raises CancelledError in it at once; the sockets of
  the call are retired (a late reply can never reach another call), and nothing is left behind:
  no reader on the loop, no pending future, no timer. A retry's backoff (the client's
  RetryPolicy) is an asyncio sleep bounded by the call's deadline, cancelled the same way.
- A notify whose connection is not up yet (the sockets are ZMQ_IMMEDIATE) waits for it in an
  outbox of its address, sent by a task of the loop within the client's timeout; a call to that
  address waits for those notifies first, so they still arrive in order.

How it waits: pyzmq's asyncio support (zmq.asyncio) watches a socket's ZMQ_FD with the loop's
add_reader and checks ZMQ_EVENTS on every wake-up, because that descriptor only signals that
the socket's state may have changed. This module does the same itself, on the pool's plain
sockets: a socket's descriptor joins the loop the first time a call holds the socket, and stays
with it while the socket idles in the pool (registering and removing it at every call cost more
than a tenth of a call), until the socket is retired or closed. Such a socket is the loop's
(_Pool.owned): when the pool's janitor closes it (idle too long, its unit gone), the loop's
thread is asked to take it off the loop and close it (_Pool.close_owned), and the loop's reader
for an idle socket reads its ZMQ_EVENTS under the pool's lock, so the descriptor does not stay
readable. The loop must be a selector loop (the default on Linux). A client belongs to one event
loop at a time (a call from another loop moves every socket to it); `close()` ends the calls
still in flight with Transfer (cause "transport").
"""

from __future__ import annotations

import asyncio
import errno
import math
import threading
from collections import deque
from typing import Any, Deque, Dict, List, Mapping, Optional, Sequence, Set, Tuple, Type, cast

import zmq

from . import _wire, errors, net
from .client import (CHECK_S, _NO_KINDS, Outcome, _Engine, _ms, _Pending, _send_frame,
                     _pending_of, _request, log)
from .net import ZMQ_EVENTS, ZMQ_FD
from .retry import RetryPolicy

OUTBOX_MAX = 1000  # notifies to one address that may wait for its connection

__all__ = ["Client", "Outcome"]


def _wake(fut: "asyncio.Future[None]") -> None:
    if not fut.done():
        fut.set_result(None)


class _Waiter:
    """What one call (or fan-out) waits on: the sockets that have signalled since it last
    looked, and the future it sleeps on until then or its wake-up time (`wake_at`, on the
    client's clock: the client's _Alarm rings it). Only ever completed with a result (never an
    exception), so nothing is left unretrieved whatever ends the wait."""

    __slots__ = ("loop", "ps", "op", "fut", "ready", "wake_at", "alarm")

    def __init__(self, loop: asyncio.AbstractEventLoop, ps: Sequence[_Pending], op: str,
                 alarm: "_Alarm") -> None:
        self.loop = loop
        self.ps = ps
        self.op = op  # (for the errors that end it from outside: a close)
        self.fut: Optional[asyncio.Future[None]] = None
        self.ready: List[_Pending] = []
        self.wake_at = math.inf
        self.alarm = alarm

    def wake(self) -> None:
        if self.fut is not None:
            _wake(self.fut)

    async def sleep(self, until: float) -> None:
        """Until a socket signals, or the client's clock reaches `until`."""
        if self.ready:
            return
        fut = self.fut = self.loop.create_future()
        self.wake_at = until
        self.alarm.arm(self.loop, until)
        try:
            await fut
        finally:
            self.fut = None
            self.wake_at = math.inf


class _Alarm:
    """One loop timer for all of a client's calls in flight, set for the soonest time one of
    them must wake up without a signal (its deadline, its next look at the monitors, an
    attempt's limit). A call sets it only when it must wake sooner than that; when it rings, it
    wakes those due and sets itself for the next. So a call costs no timer of its own: most
    calls end long before the alarm's time, and it rings a few times a second at most while
    calls are in flight (each waits at most CHECK_S)."""

    __slots__ = ("now", "waiters", "handle", "at")

    def __init__(self, now: Any, waiters: Set[_Waiter]) -> None:
        self.now = now  # the client's clock
        self.waiters = waiters  # the calls in flight
        self.handle: Optional[asyncio.TimerHandle] = None
        self.at = math.inf

    def arm(self, loop: asyncio.AbstractEventLoop, at: float) -> None:
        if at < self.at:
            if self.handle is not None:
                self.handle.cancel()
            self.at = at
            self.handle = loop.call_later(max(0.0, at - self.now()), self.ring, loop)

    def ring(self, loop: asyncio.AbstractEventLoop) -> None:
        self.handle = None
        self.at = math.inf
        now = self.now()
        soonest = math.inf
        for w in self.waiters:
            if w.fut is None:
                continue
            if w.wake_at <= now:
                _wake(w.fut)
            elif w.wake_at < soonest:
                soonest = w.wake_at
        if soonest < math.inf:
            self.arm(loop, soonest)

    def cancel(self) -> None:
        if self.handle is not None:
            self.handle.cancel()
            self.handle = None
        self.at = math.inf


class _Reg:
    """A socket whose descriptor the client's loop watches: what its reader wakes (the request
    holding the socket, or the outbox sending on it; neither while it idles in the pool)."""

    __slots__ = ("sock", "fd", "p", "wake")

    def __init__(self, sock: zmq.Socket[Any], fd: int) -> None:
        self.sock = sock
        self.fd = fd
        self.p: Optional[_Pending] = None
        self.wake: Optional[Any] = None


class _Outbox:
    """Notifies to one address that wait for its connection to come up (the sockets are
    ZMQ_IMMEDIATE: nothing is queued before), in order, on one socket; a task of the loop
    sends them, for at most the client's timeout. A call to that address waits for them
    first, so a notify and a following call still arrive in order."""

    __slots__ = ("address", "sock", "queue", "reg", "loop", "fut", "task", "closed")

    def __init__(self, address: str, sock: zmq.Socket[Any], reg: _Reg,
                 loop: asyncio.AbstractEventLoop) -> None:
        self.address = address
        self.sock = sock
        self.queue: Deque[Tuple[str, bytes]] = deque()  # (op, payload)
        self.reg = reg
        self.loop = loop
        self.fut: Optional[asyncio.Future[None]] = None
        self.task: Optional[asyncio.Task[None]] = None
        self.closed = False
        reg.wake = self.wake

    def wake(self) -> None:
        if self.fut is not None:
            _wake(self.fut)


class Client(_Engine):
    """Calls units from asyncio tasks. The options are the blocking Client's (ctlrpc.Client),
    and so are the rules, the errors, the retries and the counters (`stats`); see the
    module's docstring.
    """

    _waiters: Set[_Waiter]
    _outboxes: Dict[str, _Outbox]
    _regs: Dict[zmq.Socket[Any], _Reg]
    _loop: Optional[asyncio.AbstractEventLoop]

    def _setup(self) -> None:
        self._waiters = set()  # the calls in flight, for close()
        self._outboxes = {}  # notifies waiting for a connection, by address
        self._regs = {}  # the sockets whose descriptors self._loop watches
        self._loop = None
        self._alarm = _Alarm(self._now, self._waiters)
        self._pool.unwatch = self._unwatch
        self._pool.on_to_close = self._ask_close

    def _sleeper(self, retry: RetryPolicy) -> Any:
        return retry.async_sleep()

    # ---- the calls -----------------------------------------------------------------------

    async def call(self, address: str, op: str, args: Optional[Mapping[str, Any]] = None,
                   timeout: Optional[float] = None, *,
                   kinds: Mapping[str, Type[errors.DeclaredError]] = _NO_KINDS,
                   idempotent: bool = False) -> Any:
        """Call `op` at `address` with the named `args`; return the decoded result. Raises as
        ctlrpc.Client.call does; CancelledError when the awaiting task is cancelled (during a
        retry's backoff too). `idempotent` as for ctlrpc.Client.call."""
        tmo = self._timeout(timeout)
        deadline = self._now() + tmo
        p = _Pending(net.dialable(address), _request(address, op, args), idempotent)
        await self._run([p], op, deadline, _ms(tmo))
        return self._result(p, kinds, op)

    async def call_many(self, op: str,
                        targets: Sequence[Tuple[str, Optional[Mapping[str, Any]]]],
                        timeout: Optional[float] = None, *,
                        kinds: Mapping[str, Type[errors.DeclaredError]] = _NO_KINDS,
                        idempotent: bool = False) -> List[Outcome]:
        """Call `op` at every (address, args) of `targets` under one deadline for the batch;
        one Outcome per target, in order, as ctlrpc.Client.call_many returns them (each
        target retried on its own)."""
        tmo = self._timeout(timeout)
        deadline = self._now() + tmo
        ps = _pending_of(op, targets, idempotent)
        await self._run(ps, op, deadline, _ms(tmo))
        out = []
        for p in ps:
            try:
                out.append(Outcome(p.address, True, self._result(p, kinds, op), None))
            except errors.Error as e:
                out.append(Outcome(p.address, False, None, e))
        return out

    def notify(self, address: str, op: str, args: Optional[Mapping[str, Any]] = None) -> None:
        """Queue `[op, "", args]` for a notify op without waiting (units send nothing back;
        a notify is never retried). When the address's connection is not up yet, the notify
        waits for it on the loop (for at most the client's timeout, in order with the others
        to that address; a call to the address waits for them first); one that cannot be
        sent then is counted in the address's errors and logged. Raises Timeout when the
        socket's send queue is full (a unit not reading: nothing is queued), Transfer when it
        cannot be sent; ValueError / TypeError as `call`. Call it from the loop's thread."""
        ob = self._outboxes.get(address)
        if ob is not None:
            net.dialable(address)
            head, packed_args = _request(address, op, args)
            payload = head + _wire.pack("") + packed_args
            if len(payload) > self.limits.max_msg_bytes:
                e = self._too_large(address, op, len(payload))
                self._pool.count_error(address, e.cause)
                raise e
            if len(ob.queue) >= OUTBOX_MAX:
                full = errors.Timeout(f"{len(ob.queue)} notifies already wait for the "
                                      "connection to the unit: not queued", address=address,
                                      op=op)
                full.unsent = True
                self._pool.count_error(address, full.cause)
                raise full
            ob.queue.append((op, payload))
            self._pool.count(address, "attempts")  # a try at sending, as any notify
            return
        sock, payload = self._notify_prepare(address, op, args)
        failure: Optional[errors.Transfer] = None
        while True:
            try:
                _send_frame(sock, payload)
            except zmq.Again:
                if not self._pool.connected(sock):
                    self._park(address, sock, op, payload)
                    return
                failure = errors.Timeout("the send queue is full (the unit is not reading): "
                                         "not queued", address=address, op=op)
                failure.unsent = True
            except zmq.ZMQError as e:
                if e.errno == errno.EINTR:
                    continue
                failure = errors.Transfer(f"send failed: {e.strerror}; nothing was sent",
                                          cause="transport", address=address, op=op)
                failure.unsent = True
            break
        self._notify_sent(address, sock, failure)

    def close(self) -> None:
        """Close every socket and the client's own context; calls still in flight end at once
        with Transfer (cause "transport"), and notifies still waiting for a connection are
        dropped, counted in their address's errors (cause "transport") and logged, as those
        that wait out the timeout are. Idempotent; call it from the loop's thread."""
        if self._closed:
            return
        for w in list(self._waiters):
            for p in w.ps:
                self._abandon([p], errors.Transfer("the client was closed during the call",
                                                   cause="transport", address=p.address,
                                                   op=w.op))
            w.wake()
        for ob in list(self._outboxes.values()):
            ob.closed = True
            if ob.queue:
                self._pool.count_error(ob.address, "transport")
                log.warning("ctlrpc client: %d notify(s) to %s not sent: the client was closed",
                            len(ob.queue), ob.address)
            self._pool.retire(ob.address, ob.sock)
            if ob.task is not None:
                ob.task.cancel()
        self._outboxes.clear()
        self._alarm.cancel()
        super().close()

    async def __aenter__(self) -> Client:
        return self

    async def __aexit__(self, *exc: object) -> None:
        self.close()

    # ---- notifies waiting for a connection -----------------------------------------------

    def _park(self, address: str, sock: zmq.Socket[Any], op: str, payload: bytes) -> None:
        """A notify whose socket has no connection yet: its outbox sends it when one is up."""
        try:
            loop = self._home()
        except RuntimeError:
            failure = errors.Timeout("no connection to the unit yet, and no running event "
                                     "loop to wait on; nothing was sent", address=address,
                                     op=op)
            failure.unsent = True
            self._notify_sent(address, sock, failure)
            return
        ob = _Outbox(address, sock, self._watch(sock), loop)
        ob.queue.append((op, payload))
        self._outboxes[address] = ob
        ob.task = loop.create_task(self._flush(ob))

    async def _flush(self, ob: _Outbox) -> None:
        deadline = self._now() + self.timeout
        failure: Optional[errors.Transfer] = None
        try:
            while ob.queue:
                op, payload = ob.queue[0]
                try:
                    _send_frame(ob.sock, payload)
                    ob.queue.popleft()
                    self._pool.count(ob.address, "notifies")
                    continue
                except zmq.Again:
                    pass
                except zmq.ZMQError as e:
                    if e.errno == errno.EINTR:
                        continue
                    failure = errors.Transfer(f"send failed: {e.strerror}; nothing was sent",
                                              cause="transport", address=ob.address, op=op)
                    break
                failure = self._conn_failure(ob.sock, ob.address, op, True)
                if failure is not None:
                    break
                left = deadline - self._now()
                if left <= 0:
                    failure = errors.Timeout(f"no connection to the unit within "
                                             f"{_ms(self.timeout)} ms; nothing was sent",
                                             address=ob.address, op=op)
                    break
                fut = ob.fut = ob.loop.create_future()
                timer = ob.loop.call_later(min(left, CHECK_S), _wake, fut)
                try:
                    await fut
                finally:
                    timer.cancel()
                    ob.fut = None
        finally:
            if not ob.closed:
                ob.closed = True
                ob.reg.wake = None
                if self._outboxes.get(ob.address) is ob:
                    del self._outboxes[ob.address]
                if failure is None and not ob.queue:
                    self._pool.give_back(ob.address, ob.sock)
                else:
                    self._pool.retire(ob.address, ob.sock)
                    if ob.queue:
                        cause = failure.cause if failure is not None else "transport"
                        self._pool.count_error(ob.address, cause)
                        log.warning("ctlrpc client: %d notify(s) to %s not sent: %s",
                                    len(ob.queue), ob.address,
                                    failure if failure is not None else "cancelled")

    # ---- waiting, on the event loop ----------------------------------------------------

    def _home(self) -> asyncio.AbstractEventLoop:
        """The running loop (RuntimeError: none), which the client's sockets are watched by:
        those another loop watched move to it."""
        loop = asyncio.get_running_loop()
        if loop is not self._loop:
            self._alarm.cancel()  # (the other loop's)
            with self._pool.lock:
                for sock in list(self._regs):
                    self._pool._disown(sock)
                self._loop = loop
                self._pool.owner_thread = threading.get_ident()
                self._pool._close_owned()
        return loop

    def _watch(self, sock: zmq.Socket[Any]) -> _Reg:
        """The loop's watch on a socket lent to this client: made (and the socket the loop's,
        _Pool.own) the first time the socket is lent."""
        reg = self._regs.get(sock)
        if reg is None:
            assert self._loop is not None
            reg = self._regs[sock] = _Reg(sock, cast(int, sock.getsockopt(ZMQ_FD)))
            self._loop.add_reader(reg.fd, self._signalled, reg)
            self._pool.own(sock)
        return reg

    def _unwatch(self, sock: zmq.Socket[Any]) -> None:
        """The pool's hook: `sock` is retired or closed, the loop stops watching it. Called on
        the loop's thread, with the pool's lock held."""
        reg = self._regs.pop(sock, None)
        if reg is not None and self._loop is not None:
            self._loop.remove_reader(reg.fd)  # a closed loop: nothing to remove

    def _ask_close(self) -> None:
        """The pool's hook, on any thread with its lock held: the pool has closed sockets the
        loop watches; the loop's thread closes them."""
        loop = self._loop
        if loop is not None:
            try:
                loop.call_soon_threadsafe(self._pool.close_owned)
            except RuntimeError:
                pass  # the loop is closed: the next call's loop, or close(), takes them

    def _signalled(self, reg: _Reg) -> None:
        """The loop's reader of a watched socket: the socket may have something."""
        p = reg.p
        if p is not None:
            w: _Waiter = p.waiter
            w.ready.append(p)
            if w.fut is not None:
                _wake(w.fut)
        elif reg.wake is not None:
            reg.wake()
        else:
            # Idle in the pool: read its state (the descriptor stays readable until then), as
            # the pool's lock allows any thread to touch an idle socket.
            with self._pool.lock:
                if reg.sock in self._pool.owned and not reg.sock.closed:
                    try:
                        reg.sock.getsockopt(ZMQ_EVENTS)
                    except zmq.ZMQError:
                        pass

    def _attach(self, p: _Pending) -> None:
        assert p.sock is not None
        reg = p.reg = self._watch(p.sock)
        reg.p = p

    def _release(self, p: _Pending) -> None:
        if p.reg is not None:
            p.reg.p = None
            p.reg = None

    async def _run(self, ps: List[_Pending], op: str, deadline: float,
                   timeout_ms: int) -> None:
        """Run every request of `ps` to its end, retries included, within the one `deadline`.
        However it ends (a cancel too), every socket has left the call and no reader stays on
        the loop."""
        loop = self._home()
        w = _Waiter(loop, ps, op, self._alarm)
        for p in ps:
            p.waiter = w
        self._waiters.add(w)
        try:
            for p in ps:
                if self._outboxes:  # (mostly none: no coroutine to run then)
                    await self._after_notifies(p.address, deadline)
                self._begin(p, op, deadline)
            await self._wait(ps, op, deadline, timeout_ms, w)
        except BaseException:  # CancelledError above all: the sockets are retired
            self._abandon(ps, errors.Transfer("cancelled", cause="transport", op=op))
            raise
        finally:
            self._waiters.discard(w)

    async def _after_notifies(self, address: str, deadline: float) -> None:
        """Wait (until `deadline` at most) for the notifies to `address` still waiting for a
        connection: a call after them arrives after them."""
        ob = self._outboxes.get(address)
        if ob is None or ob.task is None:
            return
        left = deadline - self._now()
        if left > 0:
            await asyncio.wait([ob.task], timeout=left)

    async def _wait(self, ps: List[_Pending], op: str, deadline: float, timeout_ms: int,
                    w: _Waiter) -> None:
        """Wait until every request of `ps` is done, as the blocking client's _wait does: send
        those whose connection comes up, read replies, read the monitors of those waiting
        every 100 ms, time out those still waiting at `deadline`, start the retries the policy
        asks for when their backoff is over (a backoff is an asyncio sleep)."""
        checked = self._now()
        todo: List[_Pending] = list(ps)  # the first time, every socket is looked at
        woken: List[_Pending] = []  # those whose socket signalled: most have their reply
        while True:
            w.ready = []
            for p in woken:
                if not p.done and p.sock is not None and not p.unsent:
                    ask = False  # receive at once: a reply is likelier than nothing
                    while not p.done and self._recv_one(p, op, ask):
                        ask = True
            for p in todo:
                if p.done or p.sock is None:
                    continue
                if p.unsent:
                    self._try_send(p, op)
                if not p.unsent:
                    while not p.done and self._recv_one(p, op):
                        pass
            todo = []
            now = self._now()
            live, backoff = self._pass(ps, op, deadline, now, todo)
            if todo:
                continue  # look at the sockets of the attempts just begun
            if not live and backoff == math.inf:
                return
            left = deadline - now
            if left <= 0:
                self._expire(ps, live, op, timeout_ms)
                continue
            if not live:  # only backoffs to wait out
                await self._retry_sleep(max(0.0, min(backoff, deadline) - self._now()))
                continue
            if self._attempts_due(live, op, now):
                continue  # settled (and maybe retried) at the top
            if now - checked >= CHECK_S:
                checked = now
                self._check_all(live, op)
                continue
            await w.sleep(min(deadline, checked + CHECK_S, backoff,
                              self._soonest(live, math.inf)))
            woken = w.ready
            todo = [p for p in live if p.unsent]  # (one also in woken: twice is harmless)
