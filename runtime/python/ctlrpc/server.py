"""The server: one ROUTER socket served by one thread, with the C unit's rules for every message.

What a message means is decided by `Dispatch`, which works on frames alone (the server thread
only reads frames and sends what it returns), in the order of the C runtime's dispatch core
(runtime/src/dispatch.c; docs/API.md, "Server"):

    input                                               outcome
    [op, id, args], known op, the handler returns       [id, true, result] (nothing for notify)
    the handler raises an Error                         [id, false, {kind, msg, reason, blobs}]
    the handler raises anything else                    Protocol error naming op and exception
    unknown op                                          Protocol error naming the op
    unknown op, empty id (a notify of a newer op)       dropped, counted in `dropped`
    usable op and id; args not a map of str keys,       Protocol error saying what is wrong
      truncated, too deep, trailing bytes                 (nothing for notify ops)
    not an array of 3 with str op and id; frames        dropped, counted in `dropped`
      other than [identity, payload] and
      [identity, "", payload]
    [identity, "", payload] (a REQ peer)                answered with the delimiter
    an id carrying its caller's deadline, past by more  skipped: no handler, nothing sent,
      than the skew allowance (not a built-in op)         counted in `expired`

With `raises` (op -> the kinds it declares), a handler error of a built-in kind (UnitFull,
Busy, Missing) or a declared kind that its op does not list goes out as a Protocol error naming
the op and the kind, and is counted in `undeclared`: the IDL is the contract. Protocol is
implicit on every op.

Handlers run one at a time on the server thread, under the server's lock (given, or its own);
a program takes the same lock for its own out-of-band work on the unit's state.

Every unit also answers the built-in ops `_describe`, `_health` and `_stats` (docs/PROTOCOL.md,
"Built-in ops") with the C unit's maps: without the lock, while draining too, args an empty
map. `_stats` reads the per-op counters kept here (`OpCounters`: calls, errors by kind,
dropped, latency in the C runtime's log-scale buckets, bytes) and the connection events of the
ROUTER's socket monitor. The prefix `_` is reserved for them: an op table naming one is
refused.

`Server.register()` puts the unit in etcd (directory.Registration, on a thread of its own):
`drain()` marks it draining first, `close()` revokes it; serving never waits on etcd.
"""

from __future__ import annotations

import ctypes
import errno
import hashlib
import logging
import math
import os
import select
import socket
import sys
import threading
import time
from typing import (Any, Callable, Collection, Dict, Iterable, List, Mapping, Optional, Sequence,
                    Tuple, Union)

import zmq
from zmq.utils import z85

from . import _loglimit, _threads, _wire, curve, errors, net
from ._version import __version__

Handler = Callable[[Dict[str, Any]], Any]

LISTEN_BACKLOG = 4096  # connections the kernel queues (libzmq's default is 100)
BATCH = 256  # messages served per wake-up before the close pipe is looked at again
ZAP_SLICE = 0.010  # the longest a handshake waits for its ZAP answer behind requests
TRIM_AFTER_CLOSED = 64  # connections closed before the heap is trimmed (_HeapUpkeep)
TRIM_QUIET = 1.0  # seconds without one closing first
DRAIN_QUIET = 0.050  # a draining server stops once no request has come for this long
CLOSE_WAIT = 10.0  # how long close() waits for a running handler
ZAP_ENDPOINT = "inproc://zeromq.zap.01"

log = logging.getLogger("ctlrpc")

COUNTERS = ("requests", "replies", "dropped", "send_failures", "undeclared", "auth_denied",
            "unknown_op", "bytes_in", "bytes_out", "handshake_failures", "accept_failures",
            "accepted", "disconnects", "expired", "conn_refused")

# The bounds on what a peer can make a unit hold, as the C unit's (server.h,
# ctl_server_options): replies queued per connection (ZMQ_SNDHWM), the time a connection has to
# finish its handshake, the heartbeat that reaps silent peers.
DEFAULT_MAX_QUEUED_REPLIES = 1000
# Bytes of unread replies one connection may hold before its requests get Busy
# "replies_unread" (counting replies of ZERO_COPY_MIN bytes and more, sent without a copy and
# tracked until libzmq has handed them to the kernel).
DEFAULT_MAX_QUEUED_REPLY_BYTES = 256 << 20
ZERO_COPY_MIN = 32 << 10
DEFAULT_HANDSHAKE_TIMEOUT = 5.0
DEFAULT_HEARTBEAT = 10.0
# Frames of one message read per turn of the serving loop: between turns the close pipe and
# the ZAP handler are looked at, so a message of millions of tiny frames never stops a close,
# a drain or new clients' handshakes for long. A message of more than three frames is dropped
# (counted in `dropped`) once it has been read to its end.
FRAMES_PER_TURN = 1 << 16
# Monitor events read per hold of the monitor's lock. Out of file descriptors, libzmq's I/O
# thread retries its accept without pause and reports each failure: read without a bound, that
# flood would keep the lock (and the GIL) from the ZAP handler, whose refusals over the
# connection caps are what frees descriptors again.
MONITOR_BATCH = 1024
DEFAULT_DEADLINE_SKEW = 1.0  # seconds: the C runtime's CTL_DEFAULT_DEADLINE_SKEW_MS
EXPIRED_LOG_EVERY = 1.0  # skipped requests are logged at most this often

BUILTINS = ("_describe", "_health", "_stats")
# The kinds every op's errors are counted by, then `_other` (a declared kind a hand-written op
# sent without declaring it), then the op's declared kinds.
WIRE_KINDS = ("UnitFull", "Busy", "Missing", "Protocol")
OTHER_KIND = "_other"
LAT_BUCKETS = 128
# The ROUTER's connection events the unit counts (the C unit's SERVER_EVENTS).
_MONITOR_EVENTS = (zmq.EVENT_ACCEPTED | zmq.EVENT_ACCEPT_FAILED | zmq.EVENT_DISCONNECTED
                   | zmq.EVENT_HANDSHAKE_FAILED_NO_DETAIL
                   | zmq.EVENT_HANDSHAKE_FAILED_PROTOCOL | zmq.EVENT_HANDSHAKE_FAILED_AUTH
                   | zmq.EVENT_HANDSHAKE_SUCCEEDED | zmq.EVENT_MONITOR_STOPPED)
MONITOR_POLL_MS = 100  # the monitor thread looks at its stop flag this often
DRAIN_SLACK = 0.1  # drain() returns at most this long after its timeout


def _handshake_why(code: int) -> Tuple[str, str]:
    """The log limiter's kind and the words for a failed handshake's ZeroMQ protocol error
    (the C unit's wording)."""
    if code == zmq.PROTOCOL_ERROR_ZMTP_MECHANISM_MISMATCH:
        return "hs-mechanism", ("the client's security mechanism is not the unit's (CURVE on "
                                "one side only?)")
    if code == zmq.PROTOCOL_ERROR_ZMTP_CRYPTOGRAPHIC:
        return "hs-curve", ("CURVE authentication failed (the client does not hold this "
                            "unit's public key?)")
    return "hs-other", "a ZeroMQ protocol error"


def lat_bucket(us: int) -> int:
    """The latency bucket of `us` microseconds: [0,1) [1,2) [2,3) [3,4), then each octave
    [2^e, 2^(e+1)) in four equal parts up to 2^33 us; the last bucket takes anything longer
    (runtime/src/dispatch.c, ctl_lat_bucket)."""
    if us < 4:
        return max(0, us)
    e = us.bit_length() - 1
    i = 4 + (e - 2) * 4 + ((us >> (e - 2)) & 3)
    return min(i, LAT_BUCKETS - 1)


def lat_upper(i: int) -> int:
    """The upper edge, in microseconds, of latency bucket `i` (ctl_lat_upper)."""
    if i < 4:
        return i + 1
    e, sub = (i - 4) // 4 + 2, (i - 4) % 4
    return (5 + sub) << (e - 2)


def idl_hash(texts: Iterable[bytes]) -> str:
    """`idl_sha256` (docs/PROTOCOL.md, "Built-in ops"): SHA-256 of the files' bytes in order,
    each as a netstring (`<size>:<bytes>,`), paths left out. The generator's rule
    (ctlrpc_gen/render.py, idl_hash)."""
    return hashlib.sha256(b"".join(b"%d:%s," % (len(t), t) for t in texts)).hexdigest()


class OpCounters:
    """The counters of one op (the service's or a built-in), written by the serving thread."""

    __slots__ = ("name", "calls", "dropped", "bytes_in", "bytes_out", "max_us", "errors",
                 "declared", "hist")

    def __init__(self, name: str, declared: Sequence[str] = ()) -> None:
        self.name = name
        self.calls = 0
        self.dropped = 0
        self.bytes_in = 0
        self.bytes_out = 0
        self.max_us = 0
        self.declared = tuple(declared)
        self.errors: Dict[str, int] = dict.fromkeys(WIRE_KINDS + (OTHER_KIND,) + self.declared, 0)
        self.hist = [0] * LAT_BUCKETS

    def count_error(self, kind: str) -> None:
        self.errors[kind if kind in self.errors else OTHER_KIND] += 1

    def errors_map(self) -> Dict[str, int]:
        """The four wire kinds and the declared ones, zero or not; _other when not zero."""
        return {k: v for k, v in self.errors.items() if k != OTHER_KIND or v}

    def percentiles(self) -> Tuple[int, int]:
        """(p50_us, p99_us): the upper edge of the bucket that holds the percentile, or max_us
        when smaller (runtime/src/dispatch.c, ctl_dispatch_op_stats)."""
        hist = list(self.hist)
        total = sum(hist)
        want50, want99 = (total * 50 + 99) // 100, (total * 99 + 99) // 100
        p50 = p99 = seen = 0
        for i, n in enumerate(hist):
            if not total:
                break
            seen += n
            upper = lat_upper(i)
            edge = self.max_us if i == LAT_BUCKETS - 1 or upper > self.max_us else upper
            if not p50 and seen >= want50 and n:
                p50 = edge
            if not p99 and seen >= want99 and n:
                p99 = edge
                break
        return p50, p99

    def stats(self) -> Dict[str, Any]:
        p50, p99 = self.percentiles()
        return {"calls": self.calls, "errors": self.errors_map(), "dropped": self.dropped,
                "p50_us": p50, "p99_us": p99, "max_us": self.max_us,
                "bytes_in": self.bytes_in, "bytes_out": self.bytes_out}


class Dispatch:
    """The rules for one message, on frames alone (no socket): see the module's docstring.

    `handle(frames)` takes a message as the ROUTER received it (identity first) and returns the
    frames to send back (identity first), or None when nothing is sent. It never raises.
    """

    def __init__(self, handlers: Mapping[str, Handler], *, notify: Collection[str] = (),
                 raises: Optional[Mapping[str, Collection[str]]] = None,
                 lock: Optional[Any] = None, limits: _wire.Limits = _wire.DEFAULT_LIMITS,
                 name: str = "", describe: bool = True,
                 idl: Sequence[Tuple[str, Union[str, bytes]]] = (),
                 idl_sha256: Optional[str] = None,
                 max_reply_bytes: Optional[int] = None,
                 deadline_skew: Optional[float] = DEFAULT_DEADLINE_SKEW,
                 max_queued_reply_bytes: int = 0) -> None:
        self.deadline_skew_ms = _skew_ms(deadline_skew)
        self.who = "unit"  # what its log lines name: the server's endpoint once it is bound
        # A request (not a notify, not a built-in) from a connection holding at least this many
        # bytes of unread replies is answered Busy "replies_unread" without running; 0: none.
        self.max_queued_reply_bytes = max_queued_reply_bytes
        self._expired_log_at = 0.0  # monotonic: when the last skipped request was logged
        self._expired_unlogged = 0
        if not isinstance(handlers, Mapping):
            raise TypeError(f"server: handlers must be a mapping of op names to functions, not "
                            f"{type(handlers).__name__}")
        if isinstance(notify, str):
            raise TypeError("server: notify is a collection of op names, not one str")
        if lock is not None and not (callable(getattr(lock, "__enter__", None)) and
                                     callable(getattr(lock, "__exit__", None))):
            raise TypeError(f"server: lock must be a lock (a context manager), not "
                            f"{type(lock).__name__}")
        for op, fn in handlers.items():
            if not isinstance(op, str) or not op:
                raise ValueError(f"server: op name {op!r} is not a non-empty string")
            if op.startswith("_"):
                raise ValueError(f"server: op name '{op}' starts with '_', which is reserved "
                                 "for the built-in ops (_describe, _health, _stats)")
            if not callable(fn):
                raise ValueError(f"server: the handler of op '{op}' is not callable")
        self.handlers: Dict[str, Handler] = dict(handlers)
        self.notify = frozenset(notify)
        for op in self.notify:
            if op not in self.handlers:
                raise ValueError(f"server: notify op '{op}' has no handler")
        self.raises: Optional[Dict[str, frozenset[str]]] = None
        if raises is not None:
            if isinstance(raises, str):
                raise ValueError("server: raises maps op names to the kinds they declare")
            self.raises = {}
            for op, kinds in raises.items():
                if op not in self.handlers:
                    raise ValueError(f"server: raises names op '{op}', which has no handler")
                if isinstance(kinds, str):
                    raise ValueError(f"server: raises['{op}'] is a string; give a collection "
                                     "of kind names")
                self.raises[op] = frozenset(kinds)
        self.lock: Any = threading.Lock() if lock is None else lock
        self.limits = limits
        # The largest reply sent (default: the message limit); a larger one is refused with a
        # Protocol error saying so, measured before it is packed.
        self.max_reply_bytes = limits.max_msg_bytes if max_reply_bytes is None \
            else max_reply_bytes
        self.name = name
        self.draining = False
        self.counters: Dict[str, int] = dict.fromkeys(COUNTERS, 0)
        self.describe = describe
        self.idl: List[Dict[str, str]] = []
        for path, text in idl:
            self.idl.append({"path": str(path), "text": text.decode("utf-8")
                             if isinstance(text, bytes) else str(text)})
        if self.idl and idl_sha256 is None:
            idl_sha256 = idl_hash(f["text"].encode("utf-8") for f in self.idl)
        self.idl_sha256: Optional[str] = idl_sha256 if self.idl else None
        self.started = time.monotonic()
        # The service's ops in table order, then the built-ins.
        self.ops: Dict[str, OpCounters] = {}
        for op in self.handlers:
            declared = [] if self.raises is None else \
                [k for k in dict.fromkeys(raises[op] if raises and op in raises else ())
                 if k not in WIRE_KINDS]
            self.ops[op] = OpCounters(op, declared)
        for op in BUILTINS:
            self.ops[op] = OpCounters(op)
        self.cur: Optional[OpCounters] = None  # the op of the request being served
        self._t0 = 0

    # ---- one message ----------------------------------------------------------------------

    def handle(self, frames: Sequence[bytes], count: Optional[int] = None,
               unread: int = 0, discarded: int = 0) -> Optional[List[bytes]]:
        """The reply to the message `frames` (its first `count` frames, when more were
        received than kept, `discarded` the bytes of those not kept), or None; `unread`: the
        bytes of replies queued for its connection that the peer has not read. Never
        raises."""
        self.cur = None
        self._t0 = time.perf_counter_ns()
        # Every frame after the identity, of a dropped message too.
        if frames:
            self.counters["bytes_in"] += sum(map(len, frames)) - len(frames[0]) + discarded
        try:
            return self._handle(frames, len(frames) if count is None else count, unread)
        except Exception:  # a bug here must not end the serving thread
            log.exception("ctlrpc server %s: unexpected failure serving a message", self.who)
            self.counters["dropped"] += 1
            return None

    def _drop(self, why: str) -> None:
        """A message dropped: counted, and said at debug (the C unit's line)."""
        self.counters["dropped"] += 1
        if log.isEnabledFor(logging.DEBUG):
            log.debug("ctlrpc server %s: dropped a message: %s", self.who, why)

    def _drop_notify(self, op: str, why: Any) -> None:
        """A notify whose args are bad: counted in its op's dropped, said at debug."""
        if self.cur is not None:
            self.cur.dropped += 1
        if log.isEnabledFor(logging.DEBUG):
            log.debug("ctlrpc server %s: dropped a notify of '%s': %s", self.who,
                      _wire.show(op), why)

    def _handle(self, frames: Sequence[bytes], count: int,
                unread: int = 0) -> Optional[List[bytes]]:
        delimited = count == 3 and len(frames) >= 2 and len(frames[1]) == 0
        if count < 2 or count > 3 or (count == 3 and not delimited) or len(frames) < count:
            self._drop(f"{count} frames (" + ("the middle one is not empty" if count == 3
                                              else "expected [identity, payload]") + ")")
            return None
        head = [frames[0], b""] if delimited else [frames[0]]
        try:
            rq = _wire.decode_request(frames[count - 1], self.limits)
        except _wire.DropRequest as e:
            self._drop(str(e))
            return None
        self.counters["requests"] += 1
        cur = self.cur = self.ops.get(rq.op)
        if cur is None:
            self.counters["unknown_op"] += 1
        else:
            cur.calls += 1
            cur.bytes_in += len(frames[count - 1])
        if rq.op in BUILTINS:
            return head + [self._builtin(rq)]
        # Before anything else is done for it: its caller waits no more.
        if self.deadline_skew_ms >= 0 and self._expired(rq.id, rq.op):
            return None
        handler = self.handlers.get(rq.op)
        noreply = rq.op in self.notify
        if (handler is None or cur is None) and rq.id == "":
            # The empty id is a notify's (docs/PROTOCOL.md): of an op newer than this unit. A
            # notify gets nothing back, not even an error (nor Busy while draining): its client
            # reads no reply.
            self._drop(f"a notify of unknown op '{_wire.show(rq.op)}'")
            return None
        if self.draining:
            if handler is not None and noreply:
                if cur is not None:
                    cur.dropped += 1
                return None
            if cur is not None:
                cur.count_error("Busy")
            return head + [_wire.pack_error_reply(
                rq.id, "Busy", "unit is shutting down: retry at another unit or later",
                reason="draining")]
        if handler is not None and cur is not None and not noreply and \
                self.max_queued_reply_bytes and unread >= self.max_queued_reply_bytes:
            # Not run: its reply would join the ones its peer has not read. A notify makes no
            # reply and is served.
            cur.count_error("Busy")
            return head + [_wire.pack_error_reply(
                rq.id, "Busy", f"op '{rq.op}': {unread} bytes of replies to this connection are "
                f"unread (max_queued_reply_bytes {self.max_queued_reply_bytes}): read them, "
                "then retry", reason="replies_unread")]
        if handler is None or cur is None:
            service = f" (service {self.name})" if self.name else ""
            return head + [self._refuse(rq.id, f"unknown op '{_wire.show(rq.op)}'{service}")]
        if rq.bad is not None or rq.args is None:
            if noreply:
                self._drop_notify(rq.op, rq.bad)
                return None
            cur.count_error("Protocol")
            return head + [self._refuse(rq.id, f"op '{rq.op}': {rq.bad}")]
        if rq.has_odd_key and not getattr(handler, "checks_arg_names", False):
            # A handler of an op table gets str keys only; a generated op's checks them
            # against its args itself, in the C stubs' words.
            if noreply:
                self._drop_notify(rq.op, "arg names must be strings, not "
                                  f"{_wire.type_name(rq.odd_key)}")
                return None
            cur.count_error("Protocol")
            return head + [self._refuse(rq.id, f"op '{rq.op}': arg names must be strings, not "
                                        f"{_wire.type_name(rq.odd_key)}")]

        failure: Optional[BaseException] = None
        result: Any = None
        with self.lock:
            try:
                result = handler(rq.args)
            except Exception as e:
                failure = e
        if noreply:
            if failure is not None and getattr(failure, "bad_args", False):
                # Its args would not decode (a generated op's check): dropped, as an args map
                # that does not decode is above.
                self._drop_notify(rq.op, failure)
            elif failure is not None:
                if not isinstance(failure, errors.Error):
                    log.error("ctlrpc server: notify op '%s' failed", rq.op, exc_info=failure)
                cur.count_error(_failure_kind(failure))
            return None
        if failure is None:
            try:
                return head + [self._reply(rq, result)]
            except (TypeError, ValueError, OverflowError) as e:
                cur.count_error("Protocol")
                return head + [self._refuse(rq.id, f"op '{rq.op}': its result cannot be "
                                            f"packed: {e}")]
        return head + [self._error_reply(rq.op, rq.id, failure)]

    def _expired(self, rid: str, op: str) -> bool:
        """Whether the request is to be skipped: its id carries a deadline (docs/PROTOCOL.md,
        "Deadlines") that passed more than the skew allowance ago. Then it is counted (in
        `expired`, and in its op's `dropped`), and logged at most once a second, at info."""
        deadline = _wire.id_deadline(rid)
        if deadline is None:
            return False
        late = time.time() * 1000 - deadline
        if late <= self.deadline_skew_ms:
            return False
        self.counters["expired"] += 1
        if self.cur is not None:
            self.cur.dropped += 1
        now = time.monotonic()
        if now - self._expired_log_at < EXPIRED_LOG_EVERY or not log.isEnabledFor(logging.INFO):
            self._expired_unlogged += 1
            return True
        more = (f" ({self._expired_unlogged} more like this since the last such line)"
                if self._expired_unlogged else "")
        self._expired_log_at, self._expired_unlogged = now, 0
        log.info("ctlrpc server %s: skipped a request for '%s' unserved: its deadline passed "
                 "%d ms ago, more than the allowance of %d ms (deadline_skew), so its caller has "
                 "given up%s", self.who, _wire.show(op), late, self.deadline_skew_ms, more)
        return True

    def _refuse(self, rid: str, msg: str) -> bytes:
        return self._within(rid, _wire.pack_error_reply(rid, "Protocol", msg), "Protocol")

    def _within(self, rid: str, out: bytes, kind: str) -> bytes:
        """The error reply `out`, or, when it is over max_reply_bytes (a Missing that lists
        every blob of a large request, a long message), the Protocol error saying so: an
        error is bounded as a result is (the C runtime's words)."""
        if len(out) <= self.max_reply_bytes:
            return out
        return _wire.pack_error_reply(rid, "Protocol", f"the {kind} reply is {len(out)} bytes, "
                                      "larger than this unit's max_reply_bytes "
                                      f"({self.max_reply_bytes} bytes): ask for less in one "
                                      "call")

    def _reply(self, rq: _wire.Request, result: Any) -> bytes:
        """`[id, true, result]`, or the Protocol error of a reply over max_reply_bytes: its
        size is counted before anything is packed, so a get of many large blobs costs no copy
        (the C runtime's words)."""
        bound = self.max_reply_bytes
        # The envelope around the result: [id, true, result].
        room = bound - (1 + _wire.packed_size(rq.id, bound) + 1)  # type: ignore[operator]
        need = _wire.packed_size(result, max(room, 0))
        if need is not None and need > room:
            if self.cur is not None:
                self.cur.count_error("Protocol")
            # `need` stops growing once it is over: for a huge result it is a lower bound.
            return self._refuse(rq.id, f"op '{_wire.show(rq.op)}': the reply would be larger "
                                f"than this unit's max_reply_bytes ({bound} bytes; the result "
                                f"alone is at least {need}): ask for less in one call")
        out = _wire.pack_reply(rq.id, result)
        if len(out) > bound:  # a value packed by a hook: measured after packing
            if self.cur is not None:
                self.cur.count_error("Protocol")
            return self._refuse(rq.id, f"op '{_wire.show(rq.op)}': the reply is larger than "
                                f"this unit's max_reply_bytes ({bound} bytes): ask for less "
                                "in one call")
        return out

    # ---- what happens after handle() --------------------------------------------------------

    def sent(self, ok: bool, nbytes: int) -> None:
        """The reply to the message just handled was sent (`ok`) or could not be."""
        if ok:
            self.counters["replies"] += 1
            self.counters["bytes_out"] += nbytes
            if self.cur is not None:
                self.cur.bytes_out += nbytes
        else:
            self.counters["send_failures"] += 1

    def done(self) -> None:
        """The message just handled is finished: its op's latency is counted."""
        c = self.cur
        if c is not None:
            us = max(0, (time.perf_counter_ns() - self._t0) // 1000)
            c.hist[lat_bucket(us)] += 1
            if us > c.max_us:
                c.max_us = us
            self.cur = None

    # ---- the built-in ops ---------------------------------------------------------------------

    def _builtin(self, rq: _wire.Request) -> bytes:
        """The reply to a built-in op: answered without the lock, while draining too."""
        cur = self.cur
        assert cur is not None
        msg = None
        if rq.bad is not None or rq.args is None:
            msg = f"op '{rq.op}': {rq.bad}"
        elif rq.args:
            k = next(iter(rq.args))
            shown = _wire.show(k) if type(k) is str else "a key that is not a string"
            msg = f"op '{rq.op}' takes no arguments (got '{shown}')"
        elif rq.op == "_describe" and not self.describe:
            msg = "describe is turned off on this unit"
        if msg is None:
            try:
                return _wire.pack_reply(rq.id, self.builtin_result(rq.op))
            except (TypeError, ValueError, OverflowError) as e:
                msg = f"op '{rq.op}': cannot pack the reply: {e}"
        cur.count_error("Protocol")
        return self._refuse(rq.id, msg)

    def uptime(self) -> float:
        return time.monotonic() - self.started

    def builtin_result(self, op: str) -> Dict[str, Any]:
        """The result map of `_describe`, `_health` or `_stats` (docs/PROTOCOL.md)."""
        if op == "_describe":
            return {"service": self.name, "version": __version__,
                    "ops": list(self.handlers), "idl": [dict(f) for f in self.idl],
                    "idl_sha256": self.idl_sha256}
        if op == "_health":
            return {"status": "draining" if self.draining else "serving",
                    "uptime_s": float(self.uptime()), "in_flight": 0,
                    "service": self.name, "version": __version__}
        return self.stats_map()

    def stats_map(self) -> Dict[str, Any]:
        """What `_stats` answers: {service, uptime_s, totals, ops}."""
        c = self.counters
        ops = {name: oc.stats() for name, oc in self.ops.items()}
        errs: Dict[str, int] = dict.fromkeys(WIRE_KINDS, 0)
        other = 0
        for oc in self.ops.values():
            for k, v in oc.errors.items():
                if k == OTHER_KIND:
                    other += v
                else:
                    errs[k] = errs.get(k, 0) + v
        if other:
            errs[OTHER_KIND] = other
        accepted, gone = c["accepted"], c["disconnects"]
        totals = {"requests": c["requests"], "replies": c["replies"], "dropped": c["dropped"],
                  "send_failures": c["send_failures"], "unknown_op": c["unknown_op"],
                  "undeclared": c["undeclared"], "errors": errs, "bytes_in": c["bytes_in"],
                  "bytes_out": c["bytes_out"], "auth_denied": c["auth_denied"],
                  "handshake_failures": c["handshake_failures"],
                  "accept_failures": c["accept_failures"],
                  "conn_refused": c["conn_refused"],
                  "connections": accepted - gone if accepted > gone else 0,
                  "disconnects": gone, "expired": c["expired"]}
        return {"service": self.name, "uptime_s": float(self.uptime()), "totals": totals,
                "ops": ops}

    def _error_reply(self, op: str, rid: str, failure: BaseException) -> bytes:
        """The error reply for a handler's exception."""
        cur = self.cur
        if not isinstance(failure, errors.Error):
            log.error("ctlrpc server: op '%s' failed", op, exc_info=failure)
            if cur is not None:
                cur.count_error("Protocol")
            return self._refuse(rid, f"op '{op}' failed with an unexpected "
                                f"{type(failure).__name__}: {failure}")
        kind, msg, reason, blobs = _wire.wire_error(failure)
        if isinstance(failure, errors.DeclaredError) and \
                (not kind or kind in errors.BUILTIN_KINDS):
            if cur is not None:
                cur.count_error("Protocol")
            return self._refuse(rid, f"op '{op}': {type(failure).__name__} has kind "
                                f"'{errors.show_kind(kind)}', which is not a declared error "
                                f"kind: {msg}")
        if self.raises is not None and kind != "Protocol" and \
                kind not in self.raises.get(op, ()):
            self.counters["undeclared"] += 1
            if cur is not None:
                cur.count_error("Protocol")
            return self._refuse(rid, f"op '{op}' failed with {errors.show_kind(kind)}, which "
                                "it does not declare in 'raises' (a bug in the unit): "
                                f"{msg}")
        try:
            out = self._within(rid, _wire.pack_error_reply(
                rid, kind, msg, reason, None if blobs is None else [str(b) for b in blobs]),
                kind)
        except (TypeError, ValueError, OverflowError) as e:
            kind = "Protocol"
            out = self._refuse(rid, f"op '{op}': its error cannot be packed: {e}")
        if cur is not None:
            cur.count_error(kind)
        return out


class _HeapUpkeep:
    """Memory back to the system after a burst of connections, as the C unit does: once at
    least TRIM_AFTER_CLOSED of them have closed since the last time and none has for
    TRIM_QUIET seconds, glibc's malloc_trim returns the heap's free pages (libzmq's memory is
    glibc's; without it a unit's RSS stayed where the largest burst left it)."""

    def __init__(self) -> None:
        self.closed = 0
        self.trimmed_at = 0
        self.quiet_since = time.monotonic()

    def check(self, closed: int) -> None:
        now = time.monotonic()
        if closed != self.closed:
            self.closed, self.quiet_since = closed, now
        elif closed - self.trimmed_at >= TRIM_AFTER_CLOSED and \
                now - self.quiet_since >= TRIM_QUIET:
            self.trimmed_at = closed
            trim = _malloc_trim()
            if trim is not None:
                trim(0)


_TRIM: List[Any] = []


def _malloc_trim() -> Any:
    """glibc's malloc_trim, or None where there is none (looked up once)."""
    if not _TRIM:
        try:
            _TRIM.append(ctypes.CDLL(None).malloc_trim)
        except (OSError, AttributeError):
            _TRIM.append(None)
    return _TRIM[0]


def _skew_ms(deadline_skew: Optional[float]) -> int:
    """The skew allowance in whole milliseconds; -1 (no check) for None or a negative one."""
    if deadline_skew is None:
        return -1
    if isinstance(deadline_skew, bool) or not isinstance(deadline_skew, (int, float)) or \
            math.isnan(deadline_skew):
        raise ValueError(f"server: deadline_skew {deadline_skew!r} is not a number of seconds")
    if deadline_skew < 0:
        return -1
    return int(min(deadline_skew, 1e12) * 1000)


def _failure_kind(failure: BaseException) -> str:
    """The kind a handler's exception is counted as."""
    if isinstance(failure, errors.Error):
        return failure.kind or "Protocol"
    return "Protocol"


class Server:
    """A unit: binds one ROUTER and serves it on its own thread until `close()` or `drain()`.

    handlers: op name -> a callable taking the args map (a dict with str keys) and returning
    the result (anything msgpack packs: bytes go out as bin, str as str). bind: the endpoint
    (default tcp://<node_ip()>:*; port 0 or * picks a free one; `endpoint` is the real one).
    notify: the ops that get no reply. raises: op -> the kinds it declares (see the module's
    docstring; an op not in it declares none). lock: the lock handlers run under. curve_secret:
    serve CURVE only, with this secret key (text, or a key file its group and others cannot
    read). curve_allow: also require clients to hold one of these public keys (an allowlist
    file, or the keys; `set_allowlist` replaces them for new handshakes). max_msg_bytes: the
    largest frame accepted (ZMQ_MAXMSGSIZE). max_reply_bytes: the largest reply sent (default
    max_msg_bytes; a larger one is a Protocol error saying so, refused before it is packed).
    max_queued_replies: replies queued for one connection that does not read them (ZMQ_SNDHWM;
    further ones are dropped, counted in send_failures). max_queued_reply_bytes: the bytes of
    unread replies one connection may hold (default 256 MiB, counting the replies of 32 KiB and
    more until libzmq has handed them to the kernel); a request (not a notify, not a built-in)
    from a connection holding at least this many is answered Busy "replies_unread" without
    running, as the C unit's. handshake_timeout: seconds a
    connection has to finish its ZeroMQ handshake (0: no limit). heartbeat: seconds between the
    ZMTP heartbeats that close a connection silent for heartbeat_timeout (default three
    heartbeats; heartbeat 0: none). max_connections, max_connections_per_address: caps on open
    connections, in total and from one IP address (0: none), enforced by the server's ZAP
    handler during each handshake (plaintext and CURVE), a refusal logged and counted
    (conn_refused), ZAP status 500, as the C unit's. context: a ZeroMQ context
    (borrowed; default: the server's own; with curve_allow, at most one such server per
    context). name: the service's name, for messages and the built-in ops. describe: answer
    `_describe` (False: a Protocol error "describe is turned off on this unit"). idl: the IDL
    files the unit was generated from, main first, as (display path, text) pairs, and
    idl_sha256 their hash (computed when not given); a unit without IDL reports none.
    deadline_skew: seconds; a request whose id carries its caller's deadline (docs/PROTOCOL.md,
    "Deadlines") that passed more than this long ago when its turn comes is skipped: its handler
    does not run, nothing is sent, and it is counted in `expired` (default 1.0, the C unit's;
    negative or None: no check). Built-in ops are answered whatever their deadline.

    Raises ValueError for bad arguments or keys, OSError when the endpoint cannot be bound.
    """

    def __init__(self, handlers: Mapping[str, Handler], bind: Optional[str] = None, *,
                 notify: Collection[str] = (),
                 raises: Optional[Mapping[str, Collection[str]]] = None,
                 lock: Optional[Any] = None, curve_secret: Optional[str] = None,
                 curve_allow: Union[str, Collection[str], None] = None,
                 max_msg_bytes: int = _wire.DEFAULT_MAX_MSG_BYTES,
                 context: Optional[zmq.Context[Any]] = None, name: str = "",
                 describe: bool = True, idl: Sequence[Tuple[str, Union[str, bytes]]] = (),
                 idl_sha256: Optional[str] = None, max_reply_bytes: Optional[int] = None,
                 max_queued_replies: int = DEFAULT_MAX_QUEUED_REPLIES,
                 max_queued_reply_bytes: int = DEFAULT_MAX_QUEUED_REPLY_BYTES,
                 handshake_timeout: float = DEFAULT_HANDSHAKE_TIMEOUT,
                 heartbeat: float = DEFAULT_HEARTBEAT,
                 heartbeat_timeout: Optional[float] = None,
                 max_connections: int = 0, max_connections_per_address: int = 0,
                 deadline_skew: Optional[float] = DEFAULT_DEADLINE_SKEW) -> None:
        if max_msg_bytes <= 0:
            raise ValueError(f"server: max_msg_bytes {max_msg_bytes} is not positive")
        if max_reply_bytes is not None and max_reply_bytes <= 0:
            raise ValueError(f"server: max_reply_bytes {max_reply_bytes} is not positive")
        if not isinstance(max_queued_reply_bytes, int) or max_queued_reply_bytes <= 0:
            raise ValueError(f"server: max_queued_reply_bytes {max_queued_reply_bytes!r} is not "
                             "a positive size")
        for what, v in (("max_queued_replies", max_queued_replies),
                        ("max_connections", max_connections),
                        ("max_connections_per_address", max_connections_per_address)):
            if not isinstance(v, int) or v < 0:
                raise ValueError(f"server: {what} {v!r} is not a count")
        for what, t in (("handshake_timeout", handshake_timeout), ("heartbeat", heartbeat),
                        ("heartbeat_timeout", heartbeat_timeout or 0.0)):
            if not 0 <= t <= 2 ** 31 / 1000:
                raise ValueError(f"server: {what} {t!r} is not a time in seconds")
        self._core = Dispatch(handlers, notify=notify, raises=raises, lock=lock,
                              limits=_wire.Limits(max_msg_bytes=max_msg_bytes), name=name,
                              describe=describe, idl=idl, idl_sha256=idl_sha256,
                              max_reply_bytes=max_reply_bytes,
                              deadline_skew=deadline_skew,
                              max_queued_reply_bytes=max_queued_reply_bytes)
        # Large replies sent without a copy and not yet handed to the kernel, by routing id:
        # (tracker, bytes) each. The serving thread's own.
        self._unread: Dict[bytes, List[Tuple[zmq.MessageTracker, int]]] = {}
        self._unread_pruned = 0  # len(_unread) after the last sweep of every entry
        address = _bind_address(bind)
        secret = None if curve_secret is None else curve.load_key(curve_secret, True,
                                                                  "curve_secret")
        allow = None if curve_allow is None else curve.load_allowlist(curve_allow)
        if allow is not None and secret is None:
            raise ValueError("server: curve_allow needs curve_secret")
        if allow is not None and secret in allow:
            where = (f"allowlist {curve_allow}: key #{allow.index(secret) + 1}"
                     if isinstance(curve_allow, str) else
                     f"server {address}: allowed client key #{allow.index(secret)}")
            raise ValueError(f"{where} is the unit's own secret key: an allowlist holds client "
                             "public keys (make a new key pair for the unit, this secret is "
                             "exposed)")
        if secret is not None and not curve.available():
            raise ValueError(f"server {address}: a CURVE key was given, but this libzmq has "
                             "no CURVE support")

        self._own_ctx = context is None
        self._ctx = zmq.Context() if context is None else context
        self._zap: Optional[zmq.Socket[Any]] = None
        self._monitor: Optional[zmq.Socket[Any]] = None
        self._allow: Optional[frozenset[bytes]] = None if allow is None else \
            frozenset(curve.z85_decode(k) for k in allow)
        self._secret = secret
        # Open connections by descriptor and by peer address, for the caps: kept by the
        # monitor thread, read by the ZAP handler (under _conn_lock). _handshaking: the
        # descriptors whose handshake has no outcome yet, oldest first (a libzmq event of
        # success names no descriptor: the oldest is taken), to tell a peer of a wrong socket
        # type (closed by libzmq with no handshake event at all).
        self._caps = (max_connections, max_connections_per_address)
        self._conn_lock = threading.Lock()
        # The monitor's reader is read by the monitor thread and, to catch up before a cap is
        # judged, by the ZAP handler: under _mon_lock; _monitor_done once it has stopped.
        self._mon_lock = threading.Lock()
        self._monitor_done = False
        self._fd_addr: Dict[int, str] = {}
        self._by_addr: Dict[str, int] = {}
        self._handshaking: Dict[int, None] = {}
        self._limiter = _loglimit.LogLimiter(log)  # refusal lines, per kind
        self._last_closed_addr = "an unknown address"
        self._hs_failed = 0
        self._hs_unmatched = 0  # successes that found no connection (_handshake_succeeded)
        _threads.start_zmq(self._ctx)
        self._router = self._ctx.socket(zmq.ROUTER)
        try:
            self._router.setsockopt(zmq.LINGER, 0)
            self._router.setsockopt(zmq.ROUTER_MANDATORY, 1)
            self._router.setsockopt(zmq.MAXMSGSIZE, max_msg_bytes)
            self._router.setsockopt(zmq.SNDHWM, max_queued_replies)
            # pyzmq copies frames below its threshold even when asked not to; the replies it
            # tracks are the ones ZERO_COPY_MIN and larger, as the C unit's.
            self._router.copy_threshold = ZERO_COPY_MIN
            self._router.setsockopt(zmq.HANDSHAKE_IVL, _ms(handshake_timeout))
            if heartbeat > 0:
                self._router.setsockopt(zmq.HEARTBEAT_IVL, _ms(heartbeat))
                self._router.setsockopt(zmq.HEARTBEAT_TIMEOUT, _ms(
                    heartbeat_timeout if heartbeat_timeout else 3 * heartbeat))
            self._router.setsockopt(zmq.BACKLOG, LISTEN_BACKLOG)
            if net.wants_ipv6(net.parse_endpoint(address).host):
                self._router.setsockopt(zmq.IPV6, 1)
            # Connection events, for _stats: set up before the bind, so none is missed. Read
            # on a thread of its own (as the C unit does), so the events never pile up while a
            # handler runs or a drain goes on: a full monitor queue would stop libzmq's I/O
            # thread, and close() with it.
            self._monitor = net.open_monitor(self._ctx, self._router, _MONITOR_EVENTS,
                                             "server-monitor")
            if allow is not None or max_connections or max_connections_per_address:
                self._zap = self._ctx.socket(zmq.REP)
                self._zap.setsockopt(zmq.LINGER, 0)
                try:
                    self._zap.bind(ZAP_ENDPOINT)
                except zmq.ZMQError as e:
                    raise ValueError(f"server {address}: cannot start the ZAP handler for "
                                     f"the allowlist or the connection caps ({e.strerror}): "
                                     "is another unit with an allowlist or caps using this "
                                     "ZeroMQ context?") from None
                self._router.setsockopt(zmq.ZAP_DOMAIN, b"ctlrpc")
            if secret is not None:
                self._router.setsockopt(zmq.CURVE_SERVER, 1)
                self._router.setsockopt(zmq.CURVE_SECRETKEY, secret.encode("ascii"))
            try:
                self._router.bind(address)
            except zmq.ZMQError as e:
                # For a name it cannot resolve, libzmq says ENODEV ("No such device"): it
                # also tries the name as an interface's.
                why = e.strerror
                if e.errno == errno.ENODEV:
                    try:
                        why = (f"host '{net.parse_endpoint(address).host}' does not resolve "
                               "(nor name a network interface)")
                    except ValueError:
                        pass
                raise OSError(e.errno, f"server: cannot bind {address}: {why}") from None
            last = self._router.getsockopt(zmq.LAST_ENDPOINT)
            self.endpoint: str = last.decode() if isinstance(last, bytes) else address
            self._core.who = self.endpoint
            self._wake_r, self._wake_w = os.pipe2(os.O_CLOEXEC | os.O_NONBLOCK)
        except BaseException:
            self._close_sockets()
            raise
        # A message read in part: its first frames, their count, the bytes of those past 3.
        self._partial: Optional[Tuple[List[bytes], int, int]] = None
        self._stopping = False
        self._draining = False
        self._drain_deadline = 0.0
        self._closed = False
        self._curve_public = None if secret is None else curve.public_of(secret)
        self.registration: Optional[Any] = None  # a directory.Registration, by register()
        self._fds_lock = threading.Lock()
        self._abandoned = False  # close() gave up waiting: the thread closes the pipe
        self._monitor_stop = False
        self._monitor_thread = _threads.start(self._watch, f"ctlrpc-monitor {self.endpoint}")
        self._thread = _threads.start(self._serve, f"ctlrpc-server {self.endpoint}")

    # ---- the public surface ------------------------------------------------------------------

    @property
    def lock(self) -> Any:
        """The lock handlers run under: take it for out-of-band work on the unit's state."""
        return self._core.lock

    def stats(self) -> Dict[str, int]:
        """requests (decoded with a usable op and id), replies (sent), dropped (malformed
        payloads and frame counts), send_failures, undeclared (handler errors of a kind the op
        does not declare, sent as Protocol), auth_denied (clients the allowlist refused),
        unknown_op, bytes_in, bytes_out, handshake_failures, accept_failures, accepted,
        disconnects, expired (requests skipped unserved and unanswered: past their deadline by
        more than deadline_skew). The per-op figures are in `op_stats()`."""
        return dict(self._core.counters)

    def set_allowlist(self, allow: Union[str, Collection[str]]) -> int:
        """Replace the allowlist (a file, or the keys) for the handshakes from now on;
        connections already admitted stay. Returns how many keys it holds. ValueError (the
        old list is kept) for a bad file, an empty list, the unit's own secret key, or a
        server started without an allowlist."""
        if self._allow is None:
            raise ValueError(f"server {self.endpoint}: started without an allowlist "
                             "(curve_allow): there is none to replace")
        keys = curve.load_allowlist(allow)
        where = f"allowlist {allow}" if isinstance(allow, str) else \
            f"server {self.endpoint}: the allowlist"
        if not keys:
            raise ValueError(f"{where} lists no keys")
        if self._secret in keys:
            # A file's keys are counted from 1 (as its reader says), a list's from 0 (as C).
            n = keys.index(self._secret) + (1 if isinstance(allow, str) else 0)
            raise ValueError(f"{where}: key #{n} is the unit's own "
                             "secret key: an allowlist holds client public keys (make a new "
                             "key pair for the unit, this secret is exposed)")
        self._allow = frozenset(curve.z85_decode(k) for k in keys)  # one store: atomic
        return len(keys)

    def op_stats(self) -> Dict[str, Any]:
        """What the unit answers to `_stats`: {service, uptime_s, totals, ops}."""
        return self._core.stats_map()

    def health(self) -> Dict[str, Any]:
        """What the unit answers to `_health`."""
        return self._core.builtin_result("_health")

    def register(self, etcd: Any, *, service: Optional[str] = None,
                 namespace: str = "default", unit_id: Optional[str] = None,
                 lease_ttl: int = 10, advertise: Optional[str] = None,
                 version: Optional[str] = None) -> Any:
        """Join the fleet: register this unit in etcd (docs/PROTOCOL.md, "Membership in etcd")
        and keep it registered on a thread of its own until the server stops. `drain()` marks
        it draining first; `close()` revokes its lease (the key is gone at once).

        etcd: a ctlrpc.Etcd (https, users) or its endpoints ("URL[,URL...]"). service: default
        the server's name (the IDL's service). advertise: the tcp:// address clients dial
        (default `endpoint`; needed when the unit binds a wildcard or sits behind NAT).
        version: default the runtime's. Returns the directory.Registration. Never fails for
        etcd being away (it retries, logging once); raises ValueError for bad arguments (a
        wildcard address without advertise, an advertise clients cannot dial, a bad name, a TTL
        outside 2 s to a day) and for a closed server."""
        from .directory import Registration
        if self._closed:
            raise ValueError(f"registration: server {self.endpoint} is closed")
        if self.registration is not None:
            raise ValueError(f"server {self.endpoint}: already registered as "
                             f"{self.registration.key}")
        svc = service if service is not None else self._core.name
        if not svc:
            raise ValueError(f"server {self.endpoint}: no service name to register under "
                             "(give service=, or name= to the server)")
        self.registration = Registration(
            etcd, svc, advertise or self.endpoint, namespace=namespace, unit_id=unit_id,
            lease_ttl=lease_ttl, idl_hash=self._core.idl_sha256 or "",
            version=version or __version__, curve_public_key=self._curve_public)
        return self.registration

    def close(self, wait: float = CLOSE_WAIT) -> None:
        """Stop serving: the thread ends after a running handler returns (waiting at most
        `wait` seconds for it), the socket is closed; requests still queued are dropped (their
        callers time out). A registration in etcd is revoked first. Idempotent."""
        if self._closed:
            return
        self._closed = True
        if self.registration is not None:
            self.registration.close()
        self._stopping = True
        self._wake()
        if threading.current_thread() is self._thread:
            # From a handler: the thread stops once it returns, and cleans up after itself.
            with self._fds_lock:
                self._abandoned = True
            return
        self._thread.join(wait)
        with self._fds_lock:
            if self._thread.is_alive():
                self._abandoned = True  # a handler still runs: its thread cleans up
                return
            os.close(self._wake_r)
            os.close(self._wake_w)

    def drain(self, timeout: float = 5.0) -> None:
        """Stop gracefully: the running handler finishes with its reply; every request that
        has reached the unit since, or arrives meanwhile, is answered Busy with reason
        "draining" (notifies are dropped) until no request has come for 50 ms or `timeout`
        seconds pass; then the last replies are sent and the server closes. Returns within
        `timeout` (and a few milliseconds): a handler still running then finishes on its own
        and its thread closes the socket after it. A server registered in etcd first marks
        itself draining there, waiting at most 2 s for etcd to take it, and revokes its
        lease when it closes."""
        if self._closed:
            return
        if self.registration is not None:
            # Callers that watch the fleet see it draining before it goes.
            self.registration.set_state("draining")
        deadline = self._drain_deadline = time.monotonic() + max(0.0, timeout)
        self._draining = True
        self._wake()
        if threading.current_thread() is not self._thread:
            self._thread.join(max(0.0, deadline - time.monotonic()) + DRAIN_SLACK)
        self.close(wait=0.0)

    def __enter__(self) -> Server:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # ---- the serving thread ----------------------------------------------------------------

    def _wake(self) -> None:
        try:
            os.write(self._wake_w, b"x")
        except OSError:
            pass  # the pipe is full: the thread has been woken already

    def _serve(self) -> None:
        try:
            poller = zmq.Poller()
            poller.register(self._router, zmq.POLLIN)
            poller.register(self._wake_r, zmq.POLLIN)
            if self._zap is not None:
                poller.register(self._zap, zmq.POLLIN)
            while True:
                try:
                    # Waits without a timeout on purpose: close() and drain() wake it.
                    events = dict(poller.poll())
                except zmq.ZMQError as e:
                    if e.errno == errno.EINTR:
                        continue
                    log.error("ctlrpc server %s: poll failed: %s", self.endpoint, e)
                    break
                if self._wake_r in events:
                    if not self._stopping and self._draining:
                        self._drain()
                    break
                if self._zap is not None and self._zap in events:
                    self._serve_zap()
                # Requests still queued when close is called are not served, and those
                # queued when drain is called are answered by the drain. Handshakes wait at
                # most ZAP_SLICE behind the requests of a batch, however long they run.
                zap_at = time.monotonic() + ZAP_SLICE
                for _ in range(BATCH):
                    if self._stopping or self._draining or not self._serve_one() or \
                            self._partial is not None:
                        break
                    if self._zap is not None and time.monotonic() >= zap_at:
                        self._serve_zap()
                        zap_at = time.monotonic() + ZAP_SLICE
                if self._stopping:
                    break
        except Exception:
            log.exception("ctlrpc server %s: the serving thread failed", self.endpoint)
        finally:
            self._close_sockets()
            with self._fds_lock:
                if self._abandoned:
                    os.close(self._wake_r)
                    os.close(self._wake_w)

    def _close_sockets(self) -> None:
        if self._monitor is not None:
            # The monitor thread goes on reading until the monitor has stopped, so stopping
            # it never waits on a full queue.
            net.stop_monitor(self._router)
            self._monitor_stop = True
            thread = getattr(self, "_monitor_thread", None)
            if thread is not None and thread is not threading.current_thread():
                thread.join(CLOSE_WAIT)
                if thread.is_alive():
                    log.error("ctlrpc server %s: the monitor thread did not stop",
                              self.endpoint)
            else:
                self._monitor.close(linger=0)
        self._router.close()
        if self._zap is not None:
            try:
                self._zap.unbind(ZAP_ENDPOINT)  # free the name now, not on the reaper's time
            except zmq.ZMQError:
                pass
            self._zap.close()
        if self._own_ctx:
            self._ctx.term()

    def _watch(self) -> None:
        """The monitor thread: count the ROUTER's connection events as they come, until the
        monitor stops (then close its reader). It waits on the monitor's descriptor and reads
        under _mon_lock, as the ZAP handler's catch-up does (_catch_up_monitor)."""
        mon = self._monitor
        assert mon is not None
        try:
            waiter = select.poll()  # not select.select: the descriptor may be past 1024
            waiter.register(int(mon.getsockopt(zmq.FD)), select.POLLIN)
            heap = _HeapUpkeep()
            while True:
                with self._mon_lock:
                    if self._monitor_done or self._read_monitor():
                        self._monitor_done = True
                        break
                    more = int(mon.getsockopt(zmq.EVENTS)) & zmq.POLLIN
                if more:
                    continue  # a batch's worth read: let the ZAP handler in, then go on
                heap.check(self._core.counters["disconnects"])
                # ZeroMQ's descriptor says only that the socket's state may have changed;
                # the reads above (zmq.EVENTS first) rearm it. Either thread may have read
                # the events it signals: the next turn finds nothing, at no cost.
                try:
                    ready = waiter.poll(MONITOR_POLL_MS)
                except InterruptedError:
                    continue
                if not ready and self._monitor_stop:
                    break
        except Exception:
            log.exception("ctlrpc server %s: the monitor thread failed", self.endpoint)
        finally:
            with self._mon_lock:
                self._monitor_done = True
                mon.close(linger=0)

    def _catch_up_monitor(self) -> None:
        """Count the connection events already waiting on the monitor, from the ZAP handler:
        libzmq reports a connection's accept before its handshake asks ZAP, so the caps then
        judge it with every earlier connection counted, however far behind the monitor thread
        is (it shares the GIL with the serving thread and whatever else the process runs)."""
        with self._mon_lock:
            if not self._monitor_done and self._read_monitor():
                self._monitor_done = True

    def _serve_one(self) -> bool:
        """Read one message (at most three frames kept, at most FRAMES_PER_TURN frames a
        call: the rest of a longer one on the next calls), serve it once whole, send the reply
        if any. False when nothing was there."""
        router = self._router
        recv, more = router.recv, router.getsockopt
        try:
            if self._partial is None:
                frames = [recv(zmq.NOBLOCK)]
                count, discarded = 1, 0
            else:
                frames, count, discarded = self._partial
                self._partial = None
            turn = 0
            while more(zmq.RCVMORE):
                if turn == FRAMES_PER_TURN:
                    # go on after a look at the pipe and ZAP
                    self._partial = (frames, count, discarded)
                    return True
                frame = recv()
                count += 1
                turn += 1
                if count <= 3:
                    frames.append(frame)
                else:
                    discarded += len(frame)
        except zmq.ZMQError:
            return False  # nothing there (EAGAIN), or the socket is gone
        core = self._core  # (a message of more than 3 frames: dropped, counted and said there)
        reply = core.handle(frames, count,
                            self._unread_bytes(frames[0]) if 2 <= count <= 3 else 0, discarded)
        if reply is not None:
            size = len(reply[-1])
            try:
                if size < ZERO_COPY_MIN:
                    router.send_multipart(reply, zmq.NOBLOCK)
                else:
                    _threads.zero_copy_ready()
                    tracker = router.send_multipart(reply, zmq.NOBLOCK, copy=False, track=True)
                    self._charge(reply[0], tracker, size)
                core.sent(True, size)
            except zmq.ZMQError as e:
                core.sent(False, 0)
                self._limiter.log("send", logging.INFO, "ctlrpc server %s: cannot send a reply "
                                  "of %d bytes: %s%s", self.endpoint, size, e.strerror,
                                  " (the client is gone)" if e.errno == errno.EHOSTUNREACH
                                  else "")
        core.done()
        return True

    def _unread_bytes(self, identity: bytes) -> int:
        """The bytes of large replies to the connection `identity` that libzmq still holds."""
        held = self._unread.get(identity)
        if not held:
            return 0
        held[:] = [h for h in held if not h[0].done]
        if not held:
            del self._unread[identity]
            return 0
        return sum(h[1] for h in held)

    def _charge(self, identity: bytes, tracker: Any, size: int) -> None:
        """Keep a large reply's tracker until libzmq is done with it. Entries of connections
        that never ask again are swept once the table has doubled since the last sweep."""
        self._unread.setdefault(identity, []).append((tracker, size))
        if len(self._unread) > max(64, 2 * self._unread_pruned):
            for ident in list(self._unread):
                self._unread_bytes(ident)
            self._unread_pruned = len(self._unread)

    def _read_monitor(self) -> bool:
        """Count the ROUTER's connection events waiting on its monitor, at most MONITOR_BATCH
        of them; True once the monitor has said it stopped."""
        assert self._monitor is not None
        c = self._core.counters
        for event, value in net.monitor_events(self._monitor, MONITOR_BATCH):
            if event == zmq.EVENT_MONITOR_STOPPED:
                return True
            if event == zmq.EVENT_ACCEPTED:
                c["accepted"] += 1
                self._conn_opened(value)
            elif event == zmq.EVENT_DISCONNECTED:
                c["disconnects"] += 1
                if self._conn_closed(value):
                    # No handshake event at all: libzmq closed it for a ZMTP socket type a
                    # ROUTER does not talk to (a PUSH, PUB, SUB, PAIR...).
                    c["handshake_failures"] += 1
                    self._limiter.log("socktype", logging.WARNING, "ctlrpc server %s: refused "
                                      "a connection from %s: its ZeroMQ socket type is not "
                                      "one a unit talks to (a DEALER or REQ)", self.endpoint,
                                      self._last_closed_addr)
                elif log.isEnabledFor(logging.DEBUG):
                    log.debug("ctlrpc server %s: a connection closed (by the client, or by "
                              "ZeroMQ for a message over max_msg_bytes)", self.endpoint)
            elif event == zmq.EVENT_ACCEPT_FAILED:
                c["accept_failures"] += 1
            elif event == zmq.EVENT_HANDSHAKE_SUCCEEDED:
                self._handshake_succeeded()
            elif event in (zmq.EVENT_HANDSHAKE_FAILED_NO_DETAIL,
                           zmq.EVENT_HANDSHAKE_FAILED_PROTOCOL,
                           zmq.EVENT_HANDSHAKE_FAILED_AUTH):
                self._hs_failed += 1  # its disconnect comes next
                if event != zmq.EVENT_HANDSHAKE_FAILED_AUTH:  # the ZAP handler counted it
                    c["handshake_failures"] += 1
                if event == zmq.EVENT_HANDSHAKE_FAILED_PROTOCOL:
                    kind, why = _handshake_why(value)
                    self._limiter.log(kind, logging.WARNING, "ctlrpc server %s: refused a "
                                      "connection's handshake: %s (ZeroMQ protocol error "
                                      "0x%08x)", self.endpoint, why, value)
                elif event == zmq.EVENT_HANDSHAKE_FAILED_NO_DETAIL:
                    # The client went away during its handshake (value: an errno).
                    log.debug("ctlrpc server %s: a connection broke during its handshake: %s",
                              self.endpoint, "not finished within the handshake timeout"
                              if value == errno.EAGAIN else os.strerror(value))
        return False

    def _conn_opened(self, fd: int) -> None:
        addr = "an unknown address"
        try:
            with socket.socket(fileno=os.dup(fd)) as sk:
                addr = sk.getpeername()[0]
        except (OSError, IndexError, TypeError):
            pass
        with self._conn_lock:
            self._fd_addr[fd] = addr
            self._by_addr[addr] = self._by_addr.get(addr, 0) + 1
            self._handshaking[fd] = None

    def _conn_closed(self, fd: int) -> bool:
        """Forget a closed connection; True when it closed with its handshake unfinished and
        no handshake event (a failure's event names no connection, but its disconnect comes
        next)."""
        with self._conn_lock:
            addr = self._fd_addr.pop(fd, None)
            if addr is not None:
                n = self._by_addr.get(addr, 0) - 1
                if n > 0:
                    self._by_addr[addr] = n
                else:
                    self._by_addr.pop(addr, None)
            self._last_closed_addr = addr or "an unknown address"
            was_open = self._handshaking.pop(fd, 0) is None
            if self._hs_failed:
                self._hs_failed -= 1
                return False
            if was_open and self._hs_unmatched:
                self._hs_unmatched -= 1
                return False
            return was_open

    def _handshake_succeeded(self) -> None:
        """A success names no connection: take the oldest under way that has received a whole
        greeting and a command (a silent or half-done peer has not), as the C unit does. One
        that finds none (the peer called and left before this event was read: its descriptor
        is closed) is kept, and the next close of a connection under way is taken as its own,
        not as a wrong socket type: a refusal may go uncounted then, an honest peer is never
        logged as refused."""
        with self._conn_lock:
            for fd in self._handshaking:
                if _greeted(fd):
                    del self._handshaking[fd]
                    return
            if self._hs_unmatched < len(self._handshaking):
                self._hs_unmatched += 1

    def _drain(self) -> None:
        """Answer what has arrived, and what arrives while that goes on, with Busy "draining",
        until the socket has been quiet for DRAIN_QUIET or the deadline passes; then let the
        last replies leave, waiting at most the time left."""
        deadline = self._drain_deadline
        self._core.draining = True
        poller = zmq.Poller()
        poller.register(self._router, zmq.POLLIN)
        if self._zap is not None:
            poller.register(self._zap, zmq.POLLIN)
        while True:
            while not self._stopping and deadline > time.monotonic() and self._serve_one():
                pass
            left = deadline - time.monotonic()
            if left <= 0 or self._stopping:
                break
            try:
                # ZAP is served meanwhile, so a CURVE client connecting during the drain gets
                # its Busy too.
                ready = dict(poller.poll(min(_ms(left), _ms(DRAIN_QUIET))))
            except zmq.ZMQError as e:
                if e.errno == errno.EINTR:
                    continue
                break
            if self._zap is not None and self._zap in ready:
                self._serve_zap()
                if self._router not in ready:
                    continue
            if self._router not in ready:
                break  # quiet: every request that came has its reply
        self._router.setsockopt(zmq.LINGER, _ms(deadline - time.monotonic()))

    def _serve_zap(self) -> None:
        """Answer every waiting ZAP request (RFC 27): with an allowlist, 400 for a client that
        is not a CURVE client with a listed key (counted in auth_denied); then 500 for a
        connection over a cap (counted in conn_refused); else 200. Refusals are logged, each
        kind at most once a second."""
        assert self._zap is not None
        c = self._core.counters
        while True:
            try:
                req = self._zap.recv_multipart(zmq.NOBLOCK)
            except zmq.ZMQError:
                return
            # [version, request id, domain, address, identity, mechanism, key]
            addr = req[3].decode("utf-8", "replace") if len(req) >= 4 else "an unknown address"
            allow = self._allow
            code, text = b"200", b"OK"
            if allow is not None:
                is_curve = len(req) >= 7 and req[5] == b"CURVE"
                if not (is_curve and req[6] in allow):
                    code, text = b"400", b"client key not allowed"
                    c["auth_denied"] += 1
                    if is_curve:
                        self._limiter.log("key", logging.WARNING, "ctlrpc server %s: refused a "
                                          "CURVE handshake from %s: client key %s is not on "
                                          "the allowlist", self.endpoint, addr,
                                          _z85(req[6]))
                    else:
                        self._limiter.log("nocurve", logging.WARNING, "ctlrpc server %s: "
                                          "refused a CURVE handshake from %s: not a CURVE "
                                          "client", self.endpoint, addr)
            if code == b"200":
                why = self._over_cap(addr)
                if why is not None:
                    code, text = b"500", b"too many connections"
                    c["conn_refused"] += 1
                    self._limiter.log("cap", logging.WARNING, "ctlrpc server %s: refused a "
                                      "connection from %s: %s", self.endpoint, addr, why)
            try:
                self._zap.send_multipart([b"1.0", req[1] if len(req) >= 2 else b"", code,
                                          text, b"", b""])
            except zmq.ZMQError:
                return

    def _over_cap(self, addr: str) -> Optional[str]:
        """Why one more connection from `addr` is over a cap, or None. The connection being
        judged is counted already (its accept reaches the monitor before its handshake asks,
        and the monitor is caught up first), as the C unit's."""
        total_cap, per_cap = self._caps
        if not total_cap and not per_cap:
            return None
        self._catch_up_monitor()
        with self._conn_lock:
            total, per = len(self._fd_addr), self._by_addr.get(addr, 0)
        if per_cap and per > per_cap:
            return (f"{per} connections from that address are open "
                    f"(max_connections_per_address {per_cap})")
        if total_cap and total > total_cap:
            return f"{total} connections are open (max_connections {total_cap})"
        return None


_TCP_INFO_BYTES_RECEIVED = 128  # offsetof(struct tcp_info, tcpi_bytes_received), Linux
_GREETED = 66  # a ZMTP greeting (64 bytes) and a command's header


def _greeted(fd: int) -> bool:
    """Whether the connection on libzmq's descriptor `fd` has received a greeting and more."""
    try:
        with socket.socket(fileno=os.dup(fd)) as sk:
            info = sk.getsockopt(socket.IPPROTO_TCP, socket.TCP_INFO, 232)
    except OSError:
        return False
    off = _TCP_INFO_BYTES_RECEIVED
    return len(info) >= off + 8 and int.from_bytes(info[off:off + 8], sys.byteorder) >= _GREETED


def _z85(key: bytes) -> str:
    """A 32-byte key as Z85 text, for log lines."""
    if len(key) != 32:
        return "?"
    text: bytes = z85.encode(key)  # type: ignore[no-untyped-call]
    return text.decode("ascii")


def _bind_address(bind: Optional[str]) -> str:
    """The endpoint to bind: `bind`, or tcp://<node_ip()>:* ; port 0 is written * for ZeroMQ."""
    if bind is None:
        return f"tcp://{net.node_ip()}:*"
    return str(net.parse_endpoint(bind))


def _ms(seconds: float) -> int:
    return max(0, math.ceil(seconds * 1000))
