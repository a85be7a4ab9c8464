"""The server: one ROUTER socket served by one thread, with the C unit's rules for every message.

What a message means is decided by `Dispatch`, which works on frames alone (the server thread
only reads frames and sends what it returns), in the order of the C runtime's dispatch core
(runtime/src/dispatch.c; docs/API.md, "Server"):

    input                                               outcome
    [op, id, args], known op, the handler returns       [id, true, result] (nothing for notify)
    the handler raises an Error                         [id, false, {kind, msg, reason, blobs}]
    the handler raises anything else                    Protocol error naming op and exception
    unknown op                                          Protocol error naming the op
    usable op and id; args not a map of str keys,       Protocol error saying what is wrong
      truncated, too deep, trailing bytes                 (nothing for notify ops)
    not an array of 3 with str op and id; frames        dropped, counted in `dropped`
      other than [identity, payload] and
      [identity, "", payload]
    [identity, "", payload] (a REQ peer)                answered with the delimiter

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
"""

from __future__ import annotations

import errno
import hashlib
import logging
import math
import os
import threading
import time
from typing import (Any, Callable, Collection, Dict, Iterable, List, Mapping, Optional, Sequence,
                    Tuple, Union)

import zmq

from . import _wire, curve, errors, net
from ._version import __version__

Handler = Callable[[Dict[str, Any]], Any]

LISTEN_BACKLOG = 4096  # connections the kernel queues (libzmq's default is 100)
BATCH = 256  # messages served per wake-up before the close pipe is looked at again
DRAIN_QUIET = 0.050  # a draining server stops once no request has come for this long
CLOSE_WAIT = 10.0  # how long close() waits for a running handler
ZAP_ENDPOINT = "inproc://zeromq.zap.01"

log = logging.getLogger("ctlrpc")

COUNTERS = ("requests", "replies", "dropped", "send_failures", "undeclared", "auth_denied",
            "unknown_op", "bytes_in", "bytes_out", "handshake_failures", "accept_failures",
            "accepted", "disconnects")

BUILTINS = ("_describe", "_health", "_stats")
# The kinds every op's errors are counted by, then `_other` (a declared kind a hand-written op
# sent without declaring it), then the op's declared kinds.
WIRE_KINDS = ("UnitFull", "Busy", "Missing", "Protocol")
OTHER_KIND = "_other"
LAT_BUCKETS = 128
# The ROUTER's connection events the unit counts (the C unit's SERVER_EVENTS).
_MONITOR_EVENTS = (zmq.EVENT_ACCEPTED | zmq.EVENT_ACCEPT_FAILED | zmq.EVENT_DISCONNECTED
                   | zmq.EVENT_HANDSHAKE_FAILED_NO_DETAIL
                   | zmq.EVENT_HANDSHAKE_FAILED_PROTOCOL)


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
                 idl_sha256: Optional[str] = None) -> None:
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

    def handle(self, frames: Sequence[bytes], count: Optional[int] = None) -> Optional[List[bytes]]:
        """The reply to the message `frames` (its first `count` frames, when more were
        received than kept), or None. Never raises."""
        self.cur = None
        self._t0 = time.perf_counter_ns()
        if frames:
            self.counters["bytes_in"] += len(frames[-1])
        try:
            return self._handle(frames, len(frames) if count is None else count)
        except Exception:  # a bug here must not end the serving thread
            log.exception("ctlrpc server: unexpected failure serving a message")
            self.counters["dropped"] += 1
            return None

    def _handle(self, frames: Sequence[bytes], count: int) -> Optional[List[bytes]]:
        delimited = count == 3 and len(frames) >= 2 and len(frames[1]) == 0
        if count < 2 or count > 3 or (count == 3 and not delimited) or len(frames) < count:
            self.counters["dropped"] += 1
            return None
        head = [frames[0], b""] if delimited else [frames[0]]
        try:
            rq = _wire.decode_request(frames[count - 1], self.limits)
        except _wire.DropRequest:
            self.counters["dropped"] += 1
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
        handler = self.handlers.get(rq.op)
        noreply = rq.op in self.notify
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
        if handler is None or cur is None:
            service = f" (service {self.name})" if self.name else ""
            return head + [self._refuse(rq.id, f"unknown op '{_wire.show(rq.op)}'{service}")]
        if rq.bad is not None or rq.args is None:
            if noreply:
                cur.dropped += 1
                return None
            cur.count_error("Protocol")
            return head + [self._refuse(rq.id, f"op '{rq.op}': {rq.bad}")]

        failure: Optional[BaseException] = None
        result: Any = None
        with self.lock:
            try:
                result = handler(rq.args)
            except Exception as e:
                failure = e
        if noreply:
            if failure is not None:
                if not isinstance(failure, errors.Error):
                    log.error("ctlrpc server: notify op '%s' failed", rq.op, exc_info=failure)
                cur.count_error(_failure_kind(failure))
            return None
        if failure is None:
            try:
                return head + [_wire.pack_reply(rq.id, result)]
            except (TypeError, ValueError, OverflowError) as e:
                cur.count_error("Protocol")
                return head + [self._refuse(rq.id, f"op '{rq.op}': its result cannot be "
                                            f"packed: {e}")]
        return head + [self._error_reply(rq.op, rq.id, failure)]

    def _refuse(self, rid: str, msg: str) -> bytes:
        return _wire.pack_error_reply(rid, "Protocol", msg)

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
            msg = f"op '{rq.op}' takes no arguments (got '{_wire.show(k)}')"
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
                  "connections": accepted - gone if accepted > gone else 0,
                  "disconnects": gone}
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
            out = _wire.pack_error_reply(rid, kind, msg, reason,
                                         None if blobs is None else [str(b) for b in blobs])
        except (TypeError, ValueError, OverflowError) as e:
            kind = "Protocol"
            out = self._refuse(rid, f"op '{op}': its error cannot be packed: {e}")
        if cur is not None:
            cur.count_error(kind)
        return out


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
    file, or the keys). max_msg_bytes: the largest request accepted. context: a ZeroMQ context
    (borrowed; default: the server's own; with curve_allow, at most one such server per
    context). name: the service's name, for messages and the built-in ops. describe: answer
    `_describe` (False: a Protocol error "describe is turned off on this unit"). idl: the IDL
    files the unit was generated from, main first, as (display path, text) pairs, and
    idl_sha256 their hash (computed when not given); a unit without IDL reports none.

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
                 idl_sha256: Optional[str] = None) -> None:
        if max_msg_bytes <= 0:
            raise ValueError(f"server: max_msg_bytes {max_msg_bytes} is not positive")
        self._core = Dispatch(handlers, notify=notify, raises=raises, lock=lock,
                              limits=_wire.Limits(max_msg_bytes=max_msg_bytes), name=name,
                              describe=describe, idl=idl, idl_sha256=idl_sha256)
        address = _bind_address(bind)
        secret = None if curve_secret is None else curve.load_key(curve_secret, True,
                                                                  "curve_secret")
        allow = None if curve_allow is None else curve.load_allowlist(curve_allow)
        if allow is not None and secret is None:
            raise ValueError("server: curve_allow needs curve_secret")
        if secret is not None and not curve.available():
            raise ValueError(f"server {address}: a CURVE key was given, but this libzmq has "
                             "no CURVE support")

        self._own_ctx = context is None
        self._ctx = zmq.Context() if context is None else context
        self._zap: Optional[zmq.Socket[Any]] = None
        self._monitor: Optional[zmq.Socket[Any]] = None
        self._allow = frozenset(curve.z85_decode(k) for k in allow or ())
        self._router = self._ctx.socket(zmq.ROUTER)
        try:
            self._router.setsockopt(zmq.LINGER, 0)
            self._router.setsockopt(zmq.ROUTER_MANDATORY, 1)
            self._router.setsockopt(zmq.MAXMSGSIZE, max_msg_bytes)
            self._router.setsockopt(zmq.BACKLOG, LISTEN_BACKLOG)
            # Connection events, for _stats: set up before the bind, so none is missed.
            self._monitor = self._router.get_monitor_socket(_MONITOR_EVENTS)
            if secret is not None:
                if allow is not None:
                    self._zap = self._ctx.socket(zmq.REP)
                    self._zap.setsockopt(zmq.LINGER, 0)
                    try:
                        self._zap.bind(ZAP_ENDPOINT)
                    except zmq.ZMQError as e:
                        raise ValueError(f"server {address}: cannot start the ZAP handler for "
                                         f"the allowlist ({e.strerror}): is another unit with "
                                         "an allowlist using this ZeroMQ context?") from None
                    self._router.setsockopt(zmq.ZAP_DOMAIN, b"ctlrpc")
                self._router.setsockopt(zmq.CURVE_SERVER, 1)
                self._router.setsockopt(zmq.CURVE_SECRETKEY, secret.encode("ascii"))
            try:
                self._router.bind(address)
            except zmq.ZMQError as e:
                raise OSError(e.errno, f"server: cannot bind {address}: {e.strerror}") \
                    from None
            last = self._router.getsockopt(zmq.LAST_ENDPOINT)
            self.endpoint: str = last.decode() if isinstance(last, bytes) else address
            self._wake_r, self._wake_w = os.pipe2(os.O_CLOEXEC | os.O_NONBLOCK)
        except BaseException:
            self._close_sockets()
            raise
        self._stopping = False
        self._draining = False
        self._drain_deadline = 0.0
        self._closed = False
        self._fds_lock = threading.Lock()
        self._abandoned = False  # close() gave up waiting: the thread closes the pipe
        self._thread = threading.Thread(target=self._serve, daemon=True,
                                        name=f"ctlrpc-server {self.endpoint}")
        self._thread.start()

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
        disconnects. The per-op figures are in `op_stats()`."""
        return dict(self._core.counters)

    def op_stats(self) -> Dict[str, Any]:
        """What the unit answers to `_stats`: {service, uptime_s, totals, ops}."""
        return self._core.stats_map()

    def health(self) -> Dict[str, Any]:
        """What the unit answers to `_health`."""
        return self._core.builtin_result("_health")

    def close(self, wait: float = CLOSE_WAIT) -> None:
        """Stop serving: the thread ends after a running handler returns (waiting at most
        `wait` seconds for it), the socket is closed; requests still queued are dropped (their
        callers time out). Idempotent."""
        if self._closed:
            return
        self._closed = True
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
        seconds pass; then the last replies are sent and the server closes."""
        if self._closed:
            return
        self._drain_deadline = time.monotonic() + max(0.0, timeout)
        self._draining = True
        self._wake()
        if threading.current_thread() is not self._thread:
            self._thread.join(max(0.0, timeout) + CLOSE_WAIT)
        self.close()

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
            if self._monitor is not None:
                poller.register(self._monitor, zmq.POLLIN)
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
                if self._monitor is not None and self._monitor in events:
                    self._read_monitor()
                # Requests still queued when close is called are not served, and those
                # queued when drain is called are answered by the drain.
                for _ in range(BATCH):
                    if self._stopping or self._draining or not self._serve_one():
                        break
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
            try:
                self._router.disable_monitor()
            except zmq.ZMQError:
                pass
            self._monitor.close(linger=0)
        self._router.close()
        if self._zap is not None:
            self._zap.close()
        if self._own_ctx:
            self._ctx.term()

    def _serve_one(self) -> bool:
        """Read one whole message (at most three frames kept), serve it, send the reply if
        any. False when nothing was there."""
        router = self._router
        try:
            frames = [router.recv(zmq.NOBLOCK)]
            count = 1
            while router.getsockopt(zmq.RCVMORE):
                frame = router.recv()
                count += 1
                if len(frames) < 3:
                    frames.append(frame)
        except zmq.ZMQError:
            return False  # nothing there (EAGAIN), or the socket is gone
        core = self._core
        reply = core.handle(frames, count)
        if reply is not None:
            try:
                router.send_multipart(reply, zmq.NOBLOCK, copy=len(reply[-1]) < (32 << 10))
                core.sent(True, len(reply[-1]))
            except zmq.ZMQError:
                core.sent(False, 0)
        core.done()
        return True

    def _read_monitor(self) -> None:
        """Count the ROUTER's connection events waiting on its monitor."""
        assert self._monitor is not None
        c = self._core.counters
        for event, _ in net.monitor_events(self._monitor):
            if event == zmq.EVENT_ACCEPTED:
                c["accepted"] += 1
            elif event == zmq.EVENT_DISCONNECTED:
                c["disconnects"] += 1
            elif event == zmq.EVENT_ACCEPT_FAILED:
                c["accept_failures"] += 1
            elif event in (zmq.EVENT_HANDSHAKE_FAILED_NO_DETAIL,
                           zmq.EVENT_HANDSHAKE_FAILED_PROTOCOL):
                c["handshake_failures"] += 1

    def _drain(self) -> None:
        """Answer what has arrived, and what arrives while that goes on, with Busy "draining",
        until the socket has been quiet for DRAIN_QUIET or the deadline passes; then let the
        last replies leave, waiting at most the time left."""
        deadline = self._drain_deadline
        self._core.draining = True
        while True:
            while not self._stopping and deadline > time.monotonic() and self._serve_one():
                pass
            left = deadline - time.monotonic()
            if left <= 0 or self._stopping:
                break
            try:
                ready = self._router.poll(min(_ms(left), _ms(DRAIN_QUIET)), zmq.POLLIN)
            except zmq.ZMQError as e:
                if e.errno == errno.EINTR:
                    continue
                break
            if not ready:
                break  # quiet: every request that came has its reply
        self._router.setsockopt(zmq.LINGER, _ms(deadline - time.monotonic()))

    def _serve_zap(self) -> None:
        """Answer every waiting ZAP request (RFC 27): 200 for a CURVE client whose key is on
        the allowlist, 400 for anything else (counted in auth_denied)."""
        assert self._zap is not None
        while True:
            try:
                req = self._zap.recv_multipart(zmq.NOBLOCK)
            except zmq.ZMQError:
                return
            # [version, request id, domain, address, identity, mechanism, key]
            allowed = len(req) >= 7 and req[5] == b"CURVE" and req[6] in self._allow
            if not allowed:
                self._core.counters["auth_denied"] += 1
            try:
                self._zap.send_multipart([b"1.0", req[1] if len(req) >= 2 else b"",
                                          b"200" if allowed else b"400",
                                          b"OK" if allowed else b"client key not allowed",
                                          b"", b""])
            except zmq.ZMQError:
                return


def _bind_address(bind: Optional[str]) -> str:
    """The endpoint to bind: `bind`, or tcp://<node_ip()>:* ; port 0 is written * for ZeroMQ."""
    if bind is None:
        return f"tcp://{net.node_ip()}:*"
    return str(net.parse_endpoint(bind))


def _ms(seconds: float) -> int:
    return max(0, math.ceil(seconds * 1000))
