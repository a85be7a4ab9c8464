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
"""

from __future__ import annotations

import errno
import logging
import math
import os
import threading
import time
from typing import Any, Callable, Collection, Dict, List, Mapping, Optional, Sequence, Union

import zmq

from . import _wire, curve, errors, net

Handler = Callable[[Dict[str, Any]], Any]

LISTEN_BACKLOG = 4096  # connections the kernel queues (libzmq's default is 100)
BATCH = 256  # messages served per wake-up before the close pipe is looked at again
DRAIN_QUIET = 0.050  # a draining server stops once no request has come for this long
CLOSE_WAIT = 10.0  # how long close() waits for a running handler
ZAP_ENDPOINT = "inproc://zeromq.zap.01"

log = logging.getLogger("ctlrpc")

COUNTERS = ("requests", "replies", "dropped", "send_failures", "undeclared", "auth_denied")


class Dispatch:
    """The rules for one message, on frames alone (no socket): see the module's docstring.

    `handle(frames)` takes a message as the ROUTER received it (identity first) and returns the
    frames to send back (identity first), or None when nothing is sent. It never raises.
    """

    def __init__(self, handlers: Mapping[str, Handler], *, notify: Collection[str] = (),
                 raises: Optional[Mapping[str, Collection[str]]] = None,
                 lock: Optional[Any] = None, limits: _wire.Limits = _wire.DEFAULT_LIMITS,
                 name: str = "") -> None:
        for op, fn in handlers.items():
            if not isinstance(op, str) or not op:
                raise ValueError(f"server: op name {op!r} is not a non-empty string")
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

    # ---- one message ----------------------------------------------------------------------

    def handle(self, frames: Sequence[bytes], count: Optional[int] = None) -> Optional[List[bytes]]:
        """The reply to the message `frames` (its first `count` frames, when more were
        received than kept), or None. Never raises."""
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
        handler = self.handlers.get(rq.op)
        noreply = rq.op in self.notify
        if self.draining:
            if handler is not None and noreply:
                return None
            return head + [_wire.pack_error_reply(
                rq.id, "Busy", "unit is shutting down: retry at another unit or later",
                reason="draining")]
        if handler is None:
            service = f" (service {self.name})" if self.name else ""
            return head + [self._refuse(rq.id, f"unknown op '{_wire.show(rq.op)}'{service}")]
        if rq.bad is not None or rq.args is None:
            return None if noreply else head + [self._refuse(rq.id, f"op '{rq.op}': {rq.bad}")]

        failure: Optional[BaseException] = None
        result: Any = None
        with self.lock:
            try:
                result = handler(rq.args)
            except Exception as e:
                failure = e
        if noreply:
            if failure is not None and not isinstance(failure, errors.Error):
                log.error("ctlrpc server: notify op '%s' failed", rq.op, exc_info=failure)
            return None
        if failure is None:
            try:
                return head + [_wire.pack_reply(rq.id, result)]
            except (TypeError, ValueError, OverflowError) as e:
                return head + [self._refuse(rq.id, f"op '{rq.op}': its result cannot be "
                                            f"packed: {e}")]
        return head + [self._error_reply(rq.op, rq.id, failure)]

    def _refuse(self, rid: str, msg: str) -> bytes:
        return _wire.pack_error_reply(rid, "Protocol", msg)

    def _error_reply(self, op: str, rid: str, failure: BaseException) -> bytes:
        """The error reply for a handler's exception."""
        if not isinstance(failure, errors.Error):
            log.error("ctlrpc server: op '%s' failed", op, exc_info=failure)
            return self._refuse(rid, f"op '{op}' failed with an unexpected "
                                f"{type(failure).__name__}: {failure}")
        kind, msg, reason, blobs = _wire.wire_error(failure)
        if isinstance(failure, errors.DeclaredError) and \
                (not kind or kind in errors.BUILTIN_KINDS):
            return self._refuse(rid, f"op '{op}': {type(failure).__name__} has kind "
                                f"'{errors.show_kind(kind)}', which is not a declared error "
                                f"kind: {msg}")
        if self.raises is not None and kind != "Protocol" and \
                kind not in self.raises.get(op, ()):
            self.counters["undeclared"] += 1
            return self._refuse(rid, f"op '{op}' failed with {errors.show_kind(kind)}, which "
                                "it does not declare in 'raises' (a bug in the unit): "
                                f"{msg}")
        try:
            return _wire.pack_error_reply(rid, kind, msg, reason,
                                          None if blobs is None else [str(b) for b in blobs])
        except (TypeError, ValueError, OverflowError) as e:
            return self._refuse(rid, f"op '{op}': its error cannot be packed: {e}")


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
    context). name: the service's name, for messages.

    Raises ValueError for bad arguments or keys, OSError when the endpoint cannot be bound.
    """

    def __init__(self, handlers: Mapping[str, Handler], bind: Optional[str] = None, *,
                 notify: Collection[str] = (),
                 raises: Optional[Mapping[str, Collection[str]]] = None,
                 lock: Optional[Any] = None, curve_secret: Optional[str] = None,
                 curve_allow: Union[str, Collection[str], None] = None,
                 max_msg_bytes: int = _wire.DEFAULT_MAX_MSG_BYTES,
                 context: Optional[zmq.Context[Any]] = None, name: str = "") -> None:
        if max_msg_bytes <= 0:
            raise ValueError(f"server: max_msg_bytes {max_msg_bytes} is not positive")
        self._core = Dispatch(handlers, notify=notify, raises=raises, lock=lock,
                              limits=_wire.Limits(max_msg_bytes=max_msg_bytes), name=name)
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
        self._allow = frozenset(curve.z85_decode(k) for k in allow or ())
        self._router = self._ctx.socket(zmq.ROUTER)
        try:
            self._router.setsockopt(zmq.LINGER, 0)
            self._router.setsockopt(zmq.ROUTER_MANDATORY, 1)
            self._router.setsockopt(zmq.MAXMSGSIZE, max_msg_bytes)
            self._router.setsockopt(zmq.BACKLOG, LISTEN_BACKLOG)
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
        does not declare, sent as Protocol), auth_denied (clients the allowlist refused)."""
        return dict(self._core.counters)

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
        reply = self._core.handle(frames, count)
        if reply is not None:
            try:
                router.send_multipart(reply, zmq.NOBLOCK, copy=len(reply[-1]) < (32 << 10))
                self._core.counters["replies"] += 1
            except zmq.ZMQError:
                self._core.counters["send_failures"] += 1
        return True

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
