"""The client: call, call_many and notify over a per-address pool of DEALER sockets.

The semantics are the C runtime's (runtime/src/client.c, pool.c, call.c; docs/API.md, "Client"):

- One request in flight per socket. A call borrows a socket from the pool of its address (the
  most recently returned, so a notify and a following call from one thread ride one connection
  and arrive in order), sends `[op, id, args]` with a fresh 12-hex-digit id, and waits for the
  reply carrying that id.
- The socket goes back to the pool only after that complete, matching reply (a result or an
  error map). After a timeout, a bad reply, or a transport failure, it is retired: never lent
  again, kept for `late_grace` seconds while anything arriving on it is drained and counted as
  a late reply, then closed. A reply for another id seen during a call is counted as late and
  skipped; the call goes on waiting for its own until its deadline, and its socket is retired
  afterwards. So a late reply can never reach a later call.
- Nothing waits without a deadline. `call_many` sends every request before it reads any reply,
  then collects replies until the one deadline of the batch.
- Failing fast: every pooled socket has a ZeroMQ socket monitor, read by a call that has waited
  100 ms without its reply (and every 100 ms after). A connection refused or a host that does not
  resolve on two attempts in a row, a CURVE handshake the unit did not accept, or a connection
  this side dropped for a reply over `max_msg_bytes` ends the call with Transfer, cause
  "refused", "unresolved", "auth" or "too-large", well before its deadline (the C client's rules,
  docs/API.md "Failures that end a call early"). A request over `max_msg_bytes` is not sent.
- Thread-safe: several threads may share one Client; the pool's lock is the only shared state,
  and a socket is used by one thread at a time. `close()` must not run while another thread is
  still calling.
"""

from __future__ import annotations

import errno
import ipaddress
import itertools
import logging
import math
import secrets
import threading
import time
import types
from collections import deque
from dataclasses import dataclass
from typing import (Any, Deque, Dict, List, Mapping, Optional, Sequence, Tuple, Type,
                    overload)

import zmq

from . import _wire, curve, errors, net

DEFAULT_TIMEOUT = 30.0
DEFAULT_LATE_GRACE = 1.0
DEFAULT_MAX_IDLE_PER_ADDRESS = 16
DEFAULT_MAX_RETIRED = 64
IDLE_LINGER_MS = 100
CHECK_S = 0.100  # a call reads its connection's monitor after this long without a reply
FAILS_TO_END = 2  # failed connection attempts in a row that end a call
BROKEN_SETTLE_S = 0.300  # a broken handshake not retried within this has been given up
DROP_SETTLE_S = 0.050  # a drop not followed by a reconnect within this is this side's own
RECONNECT_IVL_MAX_MS = 1000
IDLE_DRAIN_S = 1.0  # idle sockets' monitors are read at most this often
_MONITOR_EVENTS = (zmq.EVENT_CONNECT_DELAYED | zmq.EVENT_CONNECT_RETRIED | zmq.EVENT_CLOSED
                   | zmq.EVENT_DISCONNECTED | zmq.EVENT_HANDSHAKE_SUCCEEDED
                   | zmq.EVENT_HANDSHAKE_FAILED_NO_DETAIL
                   | zmq.EVENT_HANDSHAKE_FAILED_PROTOCOL | zmq.EVENT_HANDSHAKE_FAILED_AUTH)
_MECHANISM_MISMATCH = 0x11000001  # ZMQ_PROTOCOL_ERROR_ZMTP_MECHANISM_MISMATCH
_CRYPTOGRAPHIC = 0x11000002  # ZMQ_PROTOCOL_ERROR_ZMTP_CRYPTOGRAPHIC

log = logging.getLogger("ctlrpc")

_NO_KINDS: Mapping[str, Type[errors.DeclaredError]] = types.MappingProxyType({})

# The counters kept per address (Client.stats); sockets, retired, sockets_idle and errors (by
# cause) are computed. calls, timeouts, late_replies, sockets, retired and errors.<cause> are the
# C client's names (ctl_address_stats).
COUNTERS = ("calls", "notifies", "timeouts", "late_replies", "sockets_opened",
            "sockets_retired", "sockets_closed")


class _Watch:
    """What the monitor of one socket has said so far (the C client's ctl_conn_state). ZeroMQ's
    sequences (libzmq 4.3):
      refused:     CONNECT_DELAYED, CLOSED, CONNECT_RETRIED (every ~100 ms)
      unresolved:  CONNECT_RETRIED alone (no TCP socket was ever opened)
      handshake broken off by the peer (CURVE, wrong server key):
                   HANDSHAKE_FAILED_NO_DETAIL, DISCONNECTED, CONNECT_RETRIED
      refused by ZAP / mechanism mismatch: HANDSHAKE_FAILED_AUTH (value: the ZAP status) or
                   _PROTOCOL (value: the protocol error), DISCONNECTED, no reconnect
      up:          HANDSHAKE_SUCCEEDED
      closed by the peer: DISCONNECTED, CONNECT_RETRIED at once
      closed by this side (a message over MAXMSGSIZE): DISCONNECTED, no reconnect"""

    __slots__ = ("mon", "fails", "fail", "hs_no_detail", "closed", "up", "after_drop",
                 "dropped_at", "broken", "broken_at", "verdict_event", "verdict_value")

    def __init__(self, mon: zmq.Socket[Any]) -> None:
        self.mon = mon
        self.fails = 0
        self.fail = ""
        self.hs_no_detail = False
        self.closed = False
        self.up = False
        self.after_drop = False
        self.dropped_at = 0.0
        self.broken = False  # connected, then closed before the handshake completed
        self.broken_at = 0.0
        self.verdict_event = 0
        self.verdict_value = 0

    def fold(self, ev: int, value: int) -> None:
        if ev == zmq.EVENT_CONNECT_DELAYED:
            self.closed = False
        elif ev == zmq.EVENT_CLOSED:
            self.closed = True
        elif ev == zmq.EVENT_CONNECT_RETRIED:
            if self.after_drop:  # the reconnect after a drop by the peer: not a failure
                self.after_drop = False
                self.dropped_at = 0.0
            else:
                self.fails += 1
                self.fail = ("handshake" if self.hs_no_detail or self.broken else
                             "refused" if self.closed else "unresolved")
            self.closed = self.hs_no_detail = self.broken = False
            self.broken_at = 0.0
        elif ev == zmq.EVENT_HANDSHAKE_SUCCEEDED:
            self.fails = 0
            self.up = True
            self.verdict_event = 0
        elif ev == zmq.EVENT_HANDSHAKE_FAILED_NO_DETAIL:
            self.hs_no_detail = True
        elif ev in (zmq.EVENT_HANDSHAKE_FAILED_PROTOCOL, zmq.EVENT_HANDSHAKE_FAILED_AUTH):
            self.verdict_event = ev
            self.verdict_value = value
        elif ev == zmq.EVENT_DISCONNECTED and self.up:
            self.up = False
            self.after_drop = True
            self.dropped_at = 0.0
        elif ev == zmq.EVENT_DISCONNECTED:
            # The peer broke the handshake off, whether or not an event said so.
            self.broken = True
            self.broken_at = 0.0

    def drain(self) -> None:
        for ev, value in net.monitor_events(self.mon):
            self.fold(ev, value)

    def verdict(self, now: float) -> str:
        """What ends a call: "" (nothing), "refused", "unresolved", "handshake", "denied",
        "mechanism", "protocol" or "dropped"."""
        self.drain()
        if self.verdict_event == zmq.EVENT_HANDSHAKE_FAILED_AUTH:
            return "denied"
        if self.verdict_event == zmq.EVENT_HANDSHAKE_FAILED_PROTOCOL:
            return ("mechanism" if self.verdict_value == _MECHANISM_MISMATCH else
                    "handshake" if self.verdict_value == _CRYPTOGRAPHIC else "protocol")
        if self.fails >= FAILS_TO_END:
            return self.fail
        if self.broken:  # not retried: libzmq has given up on the peer
            if not self.broken_at:
                self.broken_at = now
            elif now - self.broken_at >= BROKEN_SETTLE_S:
                return "handshake"
        if self.after_drop:
            if not self.dropped_at:
                self.dropped_at = now
            elif now - self.dropped_at >= DROP_SETTLE_S:
                return "dropped"
        return ""


@dataclass
class Outcome:
    """One target's outcome in call_many: its result (`ok`), or the error its call raised."""

    address: str
    ok: bool
    result: Any
    error: Optional[errors.Error]


class _Entry:
    """One address: its idle sockets (a stack) and its counters."""

    def __init__(self) -> None:
        self.idle: List[zmq.Socket[Any]] = []
        self.counters: Dict[str, int] = dict.fromkeys(COUNTERS, 0)
        self.errors: Dict[str, int] = dict.fromkeys(errors.CAUSES, 0)


class _Pool:
    """Sockets per address, lent and returned under one lock, and the retired ones in their
    grace period (swept, without blocking, at every lend and return)."""

    def __init__(self, ctx: zmq.Context[Any], max_idle: int, max_retired: int, late_grace: float,
                 max_msg_bytes: int, keys: Optional[Tuple[str, str, str]]) -> None:
        self.ctx = ctx
        self.max_idle = max_idle
        self.max_retired = max_retired
        self.late_grace = late_grace
        self.max_msg_bytes = max_msg_bytes
        self.keys = keys  # (server public, own public, own secret)
        self.lock = threading.Lock()
        self.entries: Dict[str, _Entry] = {}
        self.retired: Deque[Tuple[zmq.Socket[Any], float, str]] = deque()
        self.closed = False
        self.watches: Dict[zmq.Socket[Any], _Watch] = {}  # each socket's monitor
        self.monitors = itertools.count()
        self.idle_drained = time.monotonic()

    def _entry(self, address: str) -> _Entry:
        """Find or create an address's entry, validating the address on creation. Called with
        the lock held."""
        e = self.entries.get(address)
        if e is None:
            net.dialable(address)
            e = self.entries[address] = _Entry()
        return e

    def count(self, address: str, counter: str, n: int = 1) -> None:
        with self.lock:
            self._entry(address).counters[counter] += n

    def count_error(self, address: str, cause: str) -> None:
        with self.lock:
            e = self._entry(address)
            e.errors[cause] = e.errors.get(cause, 0) + 1

    def check(self, sock: zmq.Socket[Any]) -> Tuple[str, int]:
        """What the monitor of a lent socket says (_Watch.verdict) and the value of the event
        behind it. Called by the thread holding the socket."""
        w = self.watches.get(sock)
        if w is None:
            return "", 0
        return w.verdict(time.monotonic()), w.verdict_value

    def _close(self, address: str, sock: zmq.Socket[Any], linger_ms: int) -> None:
        w = self.watches.pop(sock, None)
        if w is not None:
            try:
                sock.disable_monitor()
            except zmq.ZMQError:
                pass
            w.mon.close(linger=0)
        sock.close(linger=linger_ms)
        e = self.entries.get(address)
        if e is not None:
            e.counters["sockets_closed"] += 1

    def sweep(self, everything: bool = False) -> None:
        """Drain every retired socket, counting late replies, and close those whose grace
        period is over (all of them with `everything`). Called with the lock held."""
        now = time.monotonic()
        if now - self.idle_drained >= IDLE_DRAIN_S:  # keep idle monitors' queues short
            self.idle_drained = now
            for e in self.entries.values():
                for sock in e.idle:
                    w = self.watches.get(sock)
                    if w is not None:
                        w.drain()
        for _ in range(len(self.retired)):
            sock, close_at, address = self.retired.popleft()
            late = 0
            try:
                while True:
                    sock.recv(zmq.NOBLOCK)
                    if not sock.getsockopt(zmq.RCVMORE):
                        late += 1
            except zmq.ZMQError:
                pass  # nothing more (EAGAIN), or a broken socket: closed below in any case
            if late:
                self.entries[address].counters["late_replies"] += late
            if everything or close_at <= now:
                self._close(address, sock, 0)
            else:
                self.retired.append((sock, close_at, address))

    def _dial(self, address: str) -> zmq.Socket[Any]:
        sock: zmq.Socket[Any] = self.ctx.socket(zmq.DEALER)
        try:
            sock.setsockopt(zmq.LINGER, 0)
            sock.setsockopt(zmq.MAXMSGSIZE, self.max_msg_bytes)
            sock.setsockopt(zmq.RECONNECT_IVL_MAX, RECONNECT_IVL_MAX_MS)
            if self.keys:
                server, public, secret = self.keys
                sock.setsockopt(zmq.CURVE_SERVERKEY, server.encode("ascii"))
                sock.setsockopt(zmq.CURVE_PUBLICKEY, public.encode("ascii"))
                sock.setsockopt(zmq.CURVE_SECRETKEY, secret.encode("ascii"))
            # The monitor is set up before the connect, so no event is missed. Its reader has
            # no high-water mark: ZeroMQ sends events blocking.
            endpoint = f"inproc://ctlrpc-client-monitor-{id(self):x}-{next(self.monitors)}"
            sock.monitor(endpoint, _MONITOR_EVENTS)
            mon: zmq.Socket[Any] = self.ctx.socket(zmq.PAIR)
            try:
                mon.setsockopt(zmq.LINGER, 0)
                mon.setsockopt(zmq.RCVHWM, 0)
                mon.connect(endpoint)
            except zmq.ZMQError:
                mon.close(linger=0)
                raise
            sock.connect(address)
        except zmq.ZMQError:
            sock.close(linger=0)
            raise
        with self.lock:
            self.watches[sock] = _Watch(mon)
        return sock

    def lend(self, address: str) -> zmq.Socket[Any]:
        """A socket to `address`: an idle one, or a new one. ValueError for an address that is
        not tcp://host:port; zmq.ZMQError when a socket cannot be made."""
        with self.lock:
            if self.closed:
                raise RuntimeError("the client is closed")
            self.sweep()
            e = self._entry(address)
            if e.idle:
                return e.idle.pop()
        # Dialing needs no lock: the new socket is not in the pool yet.
        sock = self._dial(address)
        self.count(address, "sockets_opened")
        return sock

    def give_back(self, address: str, sock: zmq.Socket[Any]) -> None:
        """Return a socket after a complete reply with its request's id (or a sent notify)."""
        with self.lock:
            self.sweep()
            e = self._entry(address)
            if not self.closed and len(e.idle) < self.max_idle:
                e.idle.append(sock)
                return
            self._close(address, sock, IDLE_LINGER_MS)

    def retire(self, address: str, sock: zmq.Socket[Any]) -> None:
        """Take a socket out of use: closed after its grace period, late replies counted."""
        with self.lock:
            e = self._entry(address)
            e.counters["sockets_retired"] += 1
            if self.late_grace <= 0 or self.closed:
                self._close(address, sock, 0)
                return
            if len(self.retired) >= self.max_retired:
                old, _, old_address = self.retired.popleft()  # full: the oldest leaves early
                self._close(old_address, old, 0)
            self.retired.append((sock, time.monotonic() + self.late_grace, address))

    def stats(self, address: Optional[str]) -> Dict[str, Dict[str, Any]]:
        with self.lock:
            self.sweep()
            out = {}
            for a, e in self.entries.items():
                if address is None or a == address:
                    out[a] = _address_stats(e.counters, e.errors, len(e.idle))
            return out

    def close(self) -> None:
        with self.lock:
            if self.closed:
                return
            self.closed = True
            self.sweep(everything=True)
            for address, e in self.entries.items():
                while e.idle:
                    self._close(address, e.idle.pop(), IDLE_LINGER_MS)


def _address_stats(counters: Mapping[str, int], errs: Mapping[str, int],
                   idle: int) -> Dict[str, Any]:
    """An address's counters as Client.stats shows them."""
    c = dict(counters)
    return dict(c, sockets=c["sockets_opened"] - c["sockets_closed"],
                retired=c["sockets_retired"], sockets_idle=idle, errors=dict(errs))


class _Pending:
    """One request of a call or a fan-out."""

    def __init__(self, address: str, request: Tuple[bytes, bytes]) -> None:
        self.address = address
        self.request = request  # the packed request around its id (see _request)
        self.sock: Optional[zmq.Socket[Any]] = None
        self.id = ""
        self.dirty = False  # saw a reply for another id: never back to the pool
        self.done = False
        self.ok = False
        self.result: Any = None
        self.error: Optional[errors.Error] = None


class Client:
    """Calls units: `call`, `call_many`, `notify`. See the module's docstring for the rules.

    timeout: the default deadline of a call, in seconds. context: a ZeroMQ context to make the
    sockets in (borrowed; default: the client's own). curve_server_key: the units' CURVE public
    key (its text, or a key file); curve_secret: this client's secret key (text, or a key file
    that its group and others cannot read), for units with an allowlist; without it, a key pair
    for the client's lifetime. max_msg_bytes: the largest reply accepted (ZMQ_MAXMSGSIZE).
    late_grace, max_idle_per_address, max_retired: the pool's knobs, as in the C client.
    """

    def __init__(self, timeout: float = DEFAULT_TIMEOUT, *,
                 context: Optional[zmq.Context[Any]] = None,
                 curve_server_key: Optional[str] = None, curve_secret: Optional[str] = None,
                 max_msg_bytes: int = _wire.DEFAULT_MAX_MSG_BYTES,
                 late_grace: float = DEFAULT_LATE_GRACE,
                 max_idle_per_address: int = DEFAULT_MAX_IDLE_PER_ADDRESS,
                 max_retired: int = DEFAULT_MAX_RETIRED) -> None:
        if timeout < 0:
            raise ValueError(f"client: timeout {timeout} is negative")
        if max_msg_bytes <= 0:
            raise ValueError(f"client: max_msg_bytes {max_msg_bytes} is not positive")
        self.timeout = float(timeout)
        self.limits = _wire.Limits(max_msg_bytes=max_msg_bytes)
        keys: Optional[Tuple[str, str, str]] = None
        if curve_server_key is not None:
            server = curve.load_key(curve_server_key, False, "curve_server_key")
            if curve_secret is not None:
                secret = curve.load_key(curve_secret, True, "curve_secret")
                public = curve.public_of(secret)
            else:
                public, secret = curve.keypair()
            keys = (server, public, secret)
        elif curve_secret is not None:
            raise ValueError("client: a CURVE secret key needs the units' public key "
                             "(curve_server_key)")
        self._own_ctx = context is None
        self._ctx = zmq.Context() if context is None else context
        self._pool = _Pool(self._ctx, max(1, max_idle_per_address), max(1, max_retired),
                           late_grace, max_msg_bytes, keys)
        self._ids = itertools.count(secrets.randbits(48))
        self._ids_lock = threading.Lock()
        self._closed = False

    # ---- the calls -----------------------------------------------------------------------

    def call(self, address: str, op: str, args: Optional[Mapping[str, Any]] = None,
             timeout: Optional[float] = None, *,
             kinds: Mapping[str, Type[errors.DeclaredError]] = _NO_KINDS) -> Any:
        """Call `op` at `address` with the named `args`; return the decoded result.

        Raises an errors.Error: UnitFull, Busy, Missing, a class of `kinds` (the declared
        kinds this op lists, by name) for the unit's error replies; Transfer for a Protocol
        error or a kind not in `kinds` (cause "remote"), a bad reply or a transport failure;
        Timeout when no complete reply came within `timeout` seconds (default: the client's).
        ValueError for an address that is not tcp://host:port, TypeError for args msgpack
        cannot pack.
        """
        tmo = self._timeout(timeout)
        deadline = time.monotonic() + tmo
        p = _Pending(net.dialable(address), _request(address, op, args))
        self._start(p, op, deadline)
        self._collect_one(p, op, deadline, _ms(tmo))
        return self._result(p, kinds, op)

    def call_many(self, op: str, targets: Sequence[Tuple[str, Optional[Mapping[str, Any]]]],
                  timeout: Optional[float] = None, *,
                  kinds: Mapping[str, Type[errors.DeclaredError]] = _NO_KINDS) -> List[Outcome]:
        """Call `op` at every (address, args) of `targets` under one deadline for the batch.

        Every request goes out before any reply is read. Returns one Outcome per target, in
        order: its result, or the error its call raised (as `call` would raise it); one unit's
        failure, slowness or death does not affect the others. The same address may appear
        twice: each entry is its own request. ValueError / TypeError as for `call`, before
        anything is sent.
        """
        tmo = self._timeout(timeout)
        deadline = time.monotonic() + tmo
        ps = [_Pending(net.dialable(a), _request(a, op, args)) for a, args in targets]
        for p in ps:
            self._start(p, op, deadline)
        self._collect(ps, op, deadline, _ms(tmo))
        out = []
        for p in ps:
            try:
                out.append(Outcome(p.address, True, self._result(p, kinds, op), None))
            except errors.Error as e:
                out.append(Outcome(p.address, False, None, e))
        return out

    def notify(self, address: str, op: str, args: Optional[Mapping[str, Any]] = None) -> None:
        """Send `[op, "", args]` to a notify op; return once it is queued (waiting for queue
        space no longer than the client's timeout). Units send nothing back for notify ops.
        Raises Transfer/Timeout when it cannot be queued; ValueError / TypeError as `call`."""
        net.dialable(address)
        head, packed_args = _request(address, op, args)
        payload = head + _wire.pack("") + packed_args
        deadline = time.monotonic() + self.timeout
        self._check_open()
        if len(payload) > self.limits.max_msg_bytes:
            e = self._too_large(address, op, len(payload))
            self._pool.count_error(address, e.cause)
            raise e
        sock = self._lend(address, op)
        try:
            _send(sock, payload, deadline, address, op)
        except errors.Transfer as e:
            self._pool.retire(address, sock)
            self._pool.count_error(address, e.cause)
            raise
        self._pool.count(address, "notifies")
        self._pool.give_back(address, sock)

    # ---- state ---------------------------------------------------------------------------

    @overload
    def stats(self, address: str) -> Dict[str, Any]: ...

    @overload
    def stats(self, address: None = None) -> Dict[str, Dict[str, Any]]: ...

    def stats(self, address: Optional[str] = None) -> Any:
        """Counters per address, named as the C client names them (ctl_address_stats): calls
        (requests sent expecting a reply), timeouts, late_replies, sockets (open now), retired,
        errors (a dict: calls and notifies that ended in Transfer, by cause: "refused",
        "unresolved", "auth", "too-large", "timeout", "remote", ...); and notifies,
        sockets_opened, sockets_retired (= retired), sockets_closed, sockets_idle. For one
        address a dict (all zero for an address never called); without one, a dict of those
        dicts by address."""
        got = self._pool.stats(address)
        if address is None:
            return got
        return got.get(address, _address_stats(dict.fromkeys(COUNTERS, 0),
                                               dict.fromkeys(errors.CAUSES, 0), 0))

    def close(self) -> None:
        """Close every socket (idle ones linger up to 100 ms so queued notifies can leave) and
        the client's own context. Idempotent; must not run while another thread is calling."""
        if self._closed:
            return
        self._closed = True
        self._pool.close()
        if self._own_ctx:
            self._ctx.term()

    def __enter__(self) -> Client:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # ---- the steps every call shares --------------------------------------------------------

    def _timeout(self, timeout: Optional[float]) -> float:
        if timeout is None:
            return self.timeout
        if timeout < 0:
            raise ValueError(f"timeout {timeout} is negative")
        return float(timeout)

    def _check_open(self) -> None:
        if self._closed:
            raise RuntimeError("the client is closed")

    def _new_id(self) -> str:
        with self._ids_lock:
            n = next(self._ids)
        return format(n & 0xFFFFFFFFFFFF, "012x")

    def _lend(self, address: str, op: str) -> zmq.Socket[Any]:
        try:
            return self._pool.lend(address)
        except zmq.ZMQError as e:
            raise errors.Transfer(f"cannot make a socket: {e.strerror}", cause="transport",
                                  address=address, op=op) from None

    def _result(self, p: _Pending, kinds: Mapping[str, Type[errors.DeclaredError]],
                op: str) -> Any:
        """The result of a finished request, or raise its error; a Transfer is counted in its
        address's errors by cause."""
        try:
            return _outcome(p, kinds, op)
        except errors.Transfer as e:
            self._pool.count_error(p.address, e.cause)
            raise

    def _too_large(self, address: str, op: str, size: int) -> errors.Transfer:
        e = errors.Transfer(f"the request is {size} bytes, larger than this client's limit of "
                            f"{self.limits.max_msg_bytes} bytes (max_msg_bytes); not sent",
                            cause="too-large", address=address, op=op)
        log.warning("ctlrpc client: %s", e)
        return e

    def _start(self, p: _Pending, op: str, deadline: float) -> None:
        """Lend a socket and send the request of `p`; on failure `p` is done with its error."""
        self._check_open()
        if deadline <= time.monotonic():  # timeout 0: no time at all, nothing is sent
            p.error = errors.Timeout("no time left (timeout 0): not sent", address=p.address,
                                     op=op)
            p.done = True
            return
        size = len(p.request[0]) + len(p.request[1]) + 13  # the id: 12 hex digits
        if size > self.limits.max_msg_bytes:
            p.error, p.done = self._too_large(p.address, op, size), True
            return
        try:
            p.sock = self._lend(p.address, op)
        except errors.Error as e:
            p.error, p.done = e, True
            return
        p.id = self._new_id()
        head, args = p.request
        data = head + _wire.pack(p.id) + args
        try:
            _send(p.sock, data, deadline, p.address, op)
        except errors.Error as e:
            self._pool.retire(p.address, p.sock)
            p.sock, p.error, p.done = None, e, True
            return
        self._pool.count(p.address, "calls")

    def _finish(self, p: _Pending, clean: bool) -> None:
        """End `p`: its socket goes back only after a clean, matching reply."""
        if p.sock is not None:
            if clean and not p.dirty:
                self._pool.give_back(p.address, p.sock)
            else:
                self._pool.retire(p.address, p.sock)
            p.sock = None
        p.done = True

    def _recv_one(self, p: _Pending, op: str) -> bool:
        """Receive one message on p.sock without waiting and judge it. Ends `p` when its own
        reply came (result or error) or the socket failed; a reply for another id is counted
        and skipped. Returns False when nothing was there."""
        assert p.sock is not None
        try:
            data = p.sock.recv(zmq.NOBLOCK)
            frames = 1
            while p.sock.getsockopt(zmq.RCVMORE):
                p.sock.recv()
                frames += 1
        except zmq.Again:
            return False
        except zmq.ZMQError as e:
            p.error = errors.Transfer(f"receive failed: {e.strerror}", cause="transport",
                                      address=p.address, op=op)
            self._finish(p, False)
            return True
        if frames != 1:
            p.error = errors.Transfer("reply has more than one frame", cause="bad-reply",
                                      address=p.address, op=op)
            self._finish(p, False)
            return True
        try:
            reply = _wire.decode_reply(data, self.limits)
        except _wire.BadReply as e:
            p.error = errors.Transfer(f"bad reply: {e.why}", cause="bad-reply",
                                      address=p.address, op=op)
            self._finish(p, False)
            return True
        if reply.id != p.id:
            # A reply to something else: an earlier notify the unit answered, or a peer that
            # mixes ids up.
            self._pool.count(p.address, "late_replies")
            p.dirty = True
            return True
        p.ok, p.result = reply.ok, reply.body
        self._finish(p, True)  # its own reply, result or error: the socket is clean
        return True

    def _check(self, p: _Pending, op: str) -> None:
        """Read the monitor of p's socket; end `p` when what it says means no reply can come
        (the C client's messages, docs/API.md "Failures that end a call early")."""
        assert p.sock is not None
        verdict, value = self._pool.check(p.sock)
        if not verdict:
            return
        curve = self._pool.keys is not None
        cause = "auth"
        if verdict == "refused":
            cause, msg = "refused", "connection refused (nothing listens there?)"
        elif verdict == "unresolved":
            host = net.parse_endpoint(p.address).host
            if _literal(host):
                cause, msg = "transport", ("cannot open a connection (out of file "
                                           "descriptors?)")
            else:
                cause, msg = "unresolved", f"host '{host}' does not resolve"
        elif verdict == "handshake":
            msg = ("authentication failed: the unit did not accept this client's CURVE "
                   "handshake (wrong server key, or this client is not on its allowlist; or "
                   "the unit does not speak CURVE)" if curve else
                   "authentication failed: the unit broke off the handshake (it speaks CURVE? "
                   "this client has no server key, curve_server_key)")
        elif verdict == "denied":
            msg = ("authentication failed: the unit refused this client's CURVE key (not on "
                   f"its allowlist; ZAP status {value})")
        elif verdict == "mechanism":
            msg = ("authentication failed: this client speaks CURVE (curve_server_key is set) "
                   "and the unit does not speak CURVE" if curve else
                   "authentication failed: the unit speaks CURVE and this client has no "
                   "server key (curve_server_key)")
        elif verdict == "protocol":
            cause, msg = "transport", f"the ZeroMQ handshake failed (protocol error 0x{value:08x})"
        else:  # dropped
            cause = "too-large"
            msg = (f"reply dropped: larger than this client's limit of "
                   f"{self.limits.max_msg_bytes} bytes (max_msg_bytes), so ZeroMQ closed the "
                   "connection")
            log.warning("ctlrpc client: %s at %s: %s", op, p.address, msg)
        p.error = errors.Transfer(msg, cause=cause, address=p.address, op=op)
        self._finish(p, False)

    def _time_out(self, p: _Pending, op: str, timeout_ms: int) -> None:
        p.error = errors.Timeout(f"no reply within {timeout_ms} ms", address=p.address, op=op)
        self._pool.count(p.address, "timeouts")
        self._finish(p, False)

    def _collect_one(self, p: _Pending, op: str, deadline: float, timeout_ms: int) -> None:
        """Wait for the reply of one request until `deadline`."""
        while not p.done:
            assert p.sock is not None
            left = deadline - time.monotonic()
            if left <= 0:
                self._time_out(p, op, timeout_ms)
                break
            try:
                # zmq_poll itself: Socket.poll would build a Poller for every wait.
                ready = zmq.zmq_poll([(p.sock, zmq.POLLIN)], _ms(min(left, CHECK_S)))
            except zmq.ZMQError as e:
                if e.errno == errno.EINTR:
                    continue
                p.error = errors.Transfer(f"receive failed: {e.strerror}", cause="transport",
                                          address=p.address, op=op)
                self._finish(p, False)
                break
            while ready and not p.done and self._recv_one(p, op):
                pass
            if not ready and not p.done:
                self._check(p, op)

    def _collect(self, ps: List[_Pending], op: str, deadline: float, timeout_ms: int) -> None:
        """Wait for the replies of several requests until the one `deadline`; those still
        pending then end with a timeout; every 100 ms, the monitors of those pending are read."""
        checked = time.monotonic()
        while True:
            waiting = {id(p.sock): p for p in ps if not p.done}
            if not waiting:
                return
            poller = zmq.Poller()
            for p in waiting.values():
                poller.register(p.sock, zmq.POLLIN)
            now = time.monotonic()
            left = deadline - now
            if left > 0 and now - checked >= CHECK_S:
                checked = now
                for p in waiting.values():
                    self._check(p, op)
                continue
            try:
                events = poller.poll(_ms(min(left, CHECK_S - (now - checked)))) \
                    if left > 0 else []
            except zmq.ZMQError as e:
                if e.errno == errno.EINTR:
                    continue
                events = []
            if not events:
                if deadline - time.monotonic() > 0:
                    continue
                for p in waiting.values():  # the deadline: whoever is left times out
                    self._time_out(p, op, timeout_ms)
                return
            for sock, _ in events:
                p = waiting[id(sock)]
                while not p.done and self._recv_one(p, op):
                    pass


def _request(address: str, op: str, args: Optional[Mapping[str, Any]]) -> Tuple[bytes, bytes]:
    """`[op, id, args]` packed once, as the bytes before the id and the bytes after it (the id
    is packed between them when the request is sent)."""
    if not isinstance(op, str) or not op:
        raise ValueError(f"call at {address}: op must be a non-empty string, not {op!r}")
    if args is not None and type(args) is not dict and not isinstance(args, Mapping):
        raise TypeError(f"{op} at {address}: args must be a mapping, not "
                        f"{type(args).__name__}")
    try:
        # A dict packs as it is (the fast path: the generated clients' args maps); any other
        # mapping as a dict of its items.
        packed_args = _wire.pack({} if args is None else
                                 args if type(args) is dict else dict(args))
    except (TypeError, ValueError, OverflowError) as e:
        raise TypeError(f"{op} at {address}: args cannot be packed: {e}") from None
    return b"\x93" + _wire.pack(op), packed_args


def _literal(host: str) -> bool:
    """Whether a host is an IP address (which needs no resolving)."""
    try:
        ipaddress.ip_address(host.strip("[]"))
    except ValueError:
        return False
    return True


_ZERO_COPY_MIN = 32 << 10


def _ms(seconds: float) -> int:
    """Seconds as whole milliseconds, rounded up (a wait never ends before its deadline)."""
    return max(0, math.ceil(seconds * 1000))


def _send(sock: zmq.Socket[Any], data: bytes, deadline: float, address: str,
          op: str) -> None:
    """Send one frame, waiting for queue space until `deadline`."""
    while True:
        try:
            # Small messages are copied: a zero-copy Frame costs more than the copy below 32
            # KiB (as the server decides for its replies).
            sock.send(data, zmq.NOBLOCK, copy=len(data) >= _ZERO_COPY_MIN)
            return
        except zmq.Again:
            left = deadline - time.monotonic()
            try:
                if left > 0 and sock.poll(_ms(left), zmq.POLLOUT):
                    continue
            except zmq.ZMQError as e:
                if e.errno == errno.EINTR:
                    continue
            if left > 0 and deadline - time.monotonic() > 0:
                continue
            raise errors.Timeout("timed out waiting to send", address=address, op=op) from None
        except zmq.ZMQError as e:
            if e.errno == errno.EINTR:
                continue
            raise errors.Transfer(f"send failed: {e.strerror}", cause="transport",
                                  address=address, op=op) from None


def _outcome(p: _Pending, kinds: Mapping[str, Type[errors.DeclaredError]], op: str) -> Any:
    """The result of a finished request, or raise its error."""
    if p.error is not None:
        raise p.error
    if not p.ok:
        raise _wire.error_from_body(p.result, p.address, op, kinds)
    return p.result
