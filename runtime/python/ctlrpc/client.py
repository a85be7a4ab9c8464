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
- Thread-safe: several threads may share one Client; the pool's lock is the only shared state,
  and a socket is used by one thread at a time. `close()` must not run while another thread is
  still calling.
"""

from __future__ import annotations

import errno
import itertools
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

_NO_KINDS: Mapping[str, Type[errors.DeclaredError]] = types.MappingProxyType({})

# The counters kept per address (Client.stats); sockets_idle is computed.
COUNTERS = ("calls", "notifies", "timeouts", "late_replies", "sockets_opened",
            "sockets_retired", "sockets_closed")


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

    def _close(self, address: str, sock: zmq.Socket[Any], linger_ms: int) -> None:
        sock.close(linger=linger_ms)
        e = self.entries.get(address)
        if e is not None:
            e.counters["sockets_closed"] += 1

    def sweep(self, everything: bool = False) -> None:
        """Drain every retired socket, counting late replies, and close those whose grace
        period is over (all of them with `everything`). Called with the lock held."""
        now = time.monotonic()
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
            if self.keys:
                server, public, secret = self.keys
                sock.setsockopt(zmq.CURVE_SERVERKEY, server.encode("ascii"))
                sock.setsockopt(zmq.CURVE_PUBLICKEY, public.encode("ascii"))
                sock.setsockopt(zmq.CURVE_SECRETKEY, secret.encode("ascii"))
            sock.connect(address)
        except zmq.ZMQError:
            sock.close(linger=0)
            raise
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

    def stats(self, address: Optional[str]) -> Dict[str, Dict[str, int]]:
        with self.lock:
            self.sweep()
            out = {}
            for a, e in self.entries.items():
                if address is None or a == address:
                    out[a] = dict(e.counters, sockets_idle=len(e.idle))
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
        return _outcome(p, kinds, op)

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
                out.append(Outcome(p.address, True, _outcome(p, kinds, op), None))
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
        sock = self._lend(address, op)
        try:
            _send(sock, payload, deadline, address, op)
        except errors.Error:
            self._pool.retire(address, sock)
            raise
        self._pool.count(address, "notifies")
        self._pool.give_back(address, sock)

    # ---- state ---------------------------------------------------------------------------

    @overload
    def stats(self, address: str) -> Dict[str, int]: ...

    @overload
    def stats(self, address: None = None) -> Dict[str, Dict[str, int]]: ...

    def stats(self, address: Optional[str] = None) -> Any:
        """Counters per address: calls, notifies, timeouts, late_replies, sockets_opened,
        sockets_retired, sockets_closed, sockets_idle. For one address a dict (all zero for an
        address never called); without one, a dict of those dicts by address."""
        got = self._pool.stats(address)
        if address is None:
            return got
        return got.get(address, dict(dict.fromkeys(COUNTERS, 0), sockets_idle=0))

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

    def _start(self, p: _Pending, op: str, deadline: float) -> None:
        """Lend a socket and send the request of `p`; on failure `p` is done with its error."""
        self._check_open()
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
                ready = zmq.zmq_poll([(p.sock, zmq.POLLIN)], _ms(left))
            except zmq.ZMQError as e:
                if e.errno == errno.EINTR:
                    continue
                p.error = errors.Transfer(f"receive failed: {e.strerror}", cause="transport",
                                          address=p.address, op=op)
                self._finish(p, False)
                break
            while ready and not p.done and self._recv_one(p, op):
                pass

    def _collect(self, ps: List[_Pending], op: str, deadline: float, timeout_ms: int) -> None:
        """Wait for the replies of several requests until the one `deadline`; those still
        pending then end with a timeout."""
        while True:
            waiting = {id(p.sock): p for p in ps if not p.done}
            if not waiting:
                return
            poller = zmq.Poller()
            for p in waiting.values():
                poller.register(p.sock, zmq.POLLIN)
            left = deadline - time.monotonic()
            try:
                events = poller.poll(_ms(left)) if left > 0 else []
            except zmq.ZMQError as e:
                if e.errno == errno.EINTR:
                    continue
                events = []
            if not events:
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
