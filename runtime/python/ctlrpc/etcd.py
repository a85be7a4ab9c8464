"""etcd v3 through its HTTP/JSON gateway (`/v3/...`), with the standard library only.

This is the one place that knows how etcd is reached: endpoints tried in order, https with a
CA file and an optional client certificate pair, etcd users (a token from
`/v3/auth/authenticate`, renewed once when etcd refuses it), a deadline on every request and
the backoff with jitter of docs/PROTOCOL.md ("Membership in etcd"). What the keys and values
mean (units, leases, watches of a service) is `directory.py`'s, its only user in the runtime;
the client never imports either and the server only when it registers, and no request to a
unit waits on etcd.

Keys and values travel base64 in the JSON, 64-bit integers as strings: `b64()` and `num()`
convert. A request that fails on one endpoint goes on to the next; when every endpoint fails,
`EtcdUnreachable` names them all, each with what it did. A reply of etcd that is an error
(`{"error": ..., "code": N}`) is `EtcdError` with etcd's message and code.

Threading: an `Etcd` may be shared by threads; each request opens its own connection (urllib),
so nothing but the auth token (under a lock) and the index of the last good endpoint is
shared. A watch is a `Stream` read by one thread; `abort()` wakes it from another.
"""

from __future__ import annotations

import base64
import json
import os
import random
import socket
import ssl
import threading
import urllib.error
import urllib.parse
import urllib.request
from http.client import HTTPException, HTTPResponse
from typing import Any, Dict, Iterator, List, Optional, Sequence, Union

DEFAULT_TIMEOUT = 2.0  # seconds: the deadline of one request to one endpoint
MAX_REPLY_BYTES = 64 << 20  # the largest JSON reply (or watch message) read
BACKOFF_MIN = 0.1
BACKOFF_MAX = 5.0
PASSWORD_ENV = "CTLRPC_ETCD_PASSWORD"
ENDPOINTS_ENV = "CTLRPC_ETCD"


class EtcdError(Exception):
    """etcd answered with an error (`code` is etcd's gRPC code, 0 when there was none), or a
    reply could not be read. `auth` is true when etcd refused the credentials or the user's
    permissions. Not a ctlrpc.Error: calls to units never raise it."""

    def __init__(self, msg: str, code: int = 0, auth: bool = False) -> None:
        super().__init__(msg)
        self.msg = msg
        self.code = code
        # PermissionDenied, Unauthenticated, and the refusals etcd sends with other codes.
        self.auth = auth or code in (7, 16) or any(
            w in msg for w in ("permission denied", "user name is empty",
                               "authentication failed", "invalid auth token"))


class EtcdUnreachable(EtcdError):
    """No endpoint answered: `endpoints` were tried, the message says what each did last."""

    def __init__(self, msg: str, endpoints: Sequence[str]) -> None:
        super().__init__(msg)
        self.endpoints = list(endpoints)


def b64(data: Union[str, bytes]) -> str:
    raw = data.encode("utf-8") if isinstance(data, str) else data
    return base64.b64encode(raw).decode("ascii")


def unb64(text: Any) -> bytes:
    """The bytes of a base64 field; b"" when absent. Raises ValueError when it is not base64."""
    if text is None or text == "":
        return b""
    if not isinstance(text, str):
        raise ValueError("not a base64 string")
    return base64.b64decode(text, validate=True)


def num(v: Any, default: int = 0) -> int:
    """A 64-bit integer of the gateway's JSON (a string, or a number), `default` when absent
    or not one."""
    if isinstance(v, bool):
        return default
    if isinstance(v, int):
        return v
    if isinstance(v, str):
        try:
            return int(v)
        except ValueError:
            return default
    return default


def prefix_end(prefix: bytes) -> bytes:
    """The range_end that makes a range or watch cover every key starting with `prefix`."""
    p = bytearray(prefix)
    while p:
        if p[-1] < 0xFF:
            p[-1] += 1
            return bytes(p)
        p.pop()
    return b"\0"


class Backoff:
    """Exponential backoff from BACKOFF_MIN to BACKOFF_MAX, each wait with full jitter: a random
    time between half and all of it, so many processes started together do not retry in
    lockstep. `reset()` after a success."""

    def __init__(self, low: float = BACKOFF_MIN, high: float = BACKOFF_MAX) -> None:
        self.low, self.high = low, high
        self._next = low

    def reset(self) -> None:
        self._next = self.low

    def next(self) -> float:
        wait = self._next
        self._next = min(self.high, self._next * 2)
        return random.uniform(wait / 2, wait)


def split_endpoints(endpoints: Union[str, Sequence[str], None]) -> List[str]:
    """`URL[,URL...]` (or a list of them; None: $CTLRPC_ETCD) -> checked URLs without a trailing
    `/`. Raises ValueError naming a URL that is not http(s)://host:port."""
    if endpoints is None:
        endpoints = os.environ.get(ENDPOINTS_ENV, "")
    items = endpoints.split(",") if isinstance(endpoints, str) else list(endpoints)
    if isinstance(endpoints, str) and len(items) > 1 and items[-1] == "":
        items.pop()  # "URL," (as in C)
    if not any(isinstance(u, str) and u.strip() for u in items):
        raise ValueError(f"etcd: no endpoint given (--etcd URL[,URL...] or ${ENDPOINTS_ENV})")
    for u in items:
        if not isinstance(u, str):
            raise TypeError(f"etcd: an endpoint must be a str, not {type(u).__name__}")
        if not u.strip():
            raise ValueError(f"etcd: empty etcd endpoint in '{endpoints}'")
    urls = [u.strip().rstrip("/") for u in items]
    for u in urls:
        p = urllib.parse.urlsplit(u)
        try:
            port = p.port
        except ValueError:
            port = None
        if p.scheme not in ("http", "https") or not p.hostname or (p.path not in ("", "/")) \
                or p.query or p.fragment or p.username is not None:
            raise ValueError(f"etcd endpoint '{u}' is not http://host:port or https://host:port")
        if port is None and ":" not in p.netloc.rsplit("]", 1)[-1]:
            pass  # the scheme's port (80/443): allowed, as curl allows it
        elif port is None:
            raise ValueError(f"etcd endpoint '{u}' has a bad port")
    return urls


class Etcd:
    """A connection description of one etcd cluster: its endpoints (tried in order, starting
    from the one that last answered), TLS and credentials. Cheap: nothing is opened until a
    request.

    endpoints: "URL[,URL...]" or a list (None: $CTLRPC_ETCD). cacert: the CA file https
    endpoints are checked against (default: the system's). cert, key: the client certificate
    pair, for a cluster that asks for one. user: an etcd user; password: its password (None:
    $CTLRPC_ETCD_PASSWORD). timeout: the deadline of each request to one endpoint, seconds.

    Raises ValueError for a bad endpoint or a missing/unreadable TLS file (naming it).
    """

    def __init__(self, endpoints: Union[str, Sequence[str], None] = None, *,
                 cacert: Optional[str] = None, cert: Optional[str] = None,
                 key: Optional[str] = None, user: Optional[str] = None,
                 password: Optional[str] = None, timeout: float = DEFAULT_TIMEOUT) -> None:
        self.endpoints = split_endpoints(endpoints)
        if timeout <= 0:
            raise ValueError(f"etcd: timeout {timeout} is not positive")
        self.timeout = timeout
        if (cert is None) != (key is None):
            raise ValueError("etcd: a client certificate needs both --etcd-cert and --etcd-key")
        self._ssl: Optional[ssl.SSLContext] = None
        if any(u.startswith("https://") for u in self.endpoints) or cacert or cert:
            for what, path in (("--etcd-cacert", cacert), ("--etcd-cert", cert),
                               ("--etcd-key", key)):
                if path is not None and not os.path.isfile(path):
                    raise ValueError(f"etcd: {what} {path}: no such file")
                if path is not None and not os.access(path, os.R_OK):
                    raise ValueError(f"etcd: {what} {path}: cannot be read")
            try:
                ctx = ssl.create_default_context(cafile=cacert)
                if cert is not None:
                    ctx.load_cert_chain(cert, key)
            except FileNotFoundError as e:
                raise ValueError(f"etcd: cannot read {e.filename}: {e.strerror}") from None
            except (OSError, ssl.SSLError) as e:
                what = ", ".join(f for f in (cacert, cert, key) if f)
                raise ValueError(f"etcd: cannot load the TLS files {what}: {e}") from None
            self._ssl = ctx
        if user is not None and not user:
            raise ValueError("etcd: the user name is empty")
        self.user = user
        if user is not None and password is None:
            password = os.environ.get(PASSWORD_ENV)
            if password is None:
                raise ValueError(f"etcd: user '{user}' needs a password in ${PASSWORD_ENV}")
        self._password = password
        self._token: Optional[str] = None
        self._lock = threading.Lock()
        self._first = 0  # the endpoint that answered last

    def __repr__(self) -> str:
        return f"Etcd({','.join(self.endpoints)})"

    @property
    def where(self) -> str:
        return ",".join(self.endpoints)

    # ---- requests ---------------------------------------------------------------------------

    def request(self, path: str, body: Dict[str, Any],
                timeout: Optional[float] = None) -> Dict[str, Any]:
        """POST `body` to /v3/`path` on the first endpoint that answers; etcd's JSON reply.
        Raises EtcdError (etcd refused it) or EtcdUnreachable (no endpoint answered), each
        within about `timeout` (default: the Etcd's) per endpoint."""
        causes = []
        for i in self._order():
            url = self.endpoints[i]
            try:
                resp = self._open(url, path, body, timeout)
                try:
                    data = resp.read(MAX_REPLY_BYTES + 1)
                except (socket.timeout, TimeoutError):
                    raise _Down(f"no complete answer within {self._t(timeout):g} s") from None
                except (OSError, HTTPException) as e:
                    raise _Down(f"the reply broke off: {e}") from None
                finally:
                    resp.close()
                if len(data) > MAX_REPLY_BYTES:
                    raise EtcdError(f"etcd {url}: a reply of more than {MAX_REPLY_BYTES} "
                                    "bytes")
                self._first = i
                return _json(data, url)
            except _Down as e:
                causes.append(f"{url}: {e}")
        raise EtcdUnreachable("cannot reach etcd (" + "; ".join(causes) + ")",
                              self.endpoints)

    def stream(self, path: str, body: Dict[str, Any], timeout: float) -> "Stream":
        """POST to a streaming call (watch): a Stream of its messages, each read within
        `timeout` seconds or `socket.timeout`/OSError is raised. Raises as `request`."""
        causes = []
        for i in self._order():
            url = self.endpoints[i]
            try:
                resp = self._open(url, path, body, timeout)
                self._first = i
                return Stream(resp, url)
            except _Down as e:
                causes.append(f"{url}: {e}")
        raise EtcdUnreachable("cannot reach etcd (" + "; ".join(causes) + ")",
                              self.endpoints)

    # ---- inside -------------------------------------------------------------------------------

    def _t(self, timeout: Optional[float]) -> float:
        return self.timeout if timeout is None else timeout

    def _order(self) -> List[int]:
        n, first = len(self.endpoints), self._first
        return [(first + k) % n for k in range(n)]

    def _open(self, url: str, path: str, body: Dict[str, Any],
              timeout: Optional[float], retried: bool = False) -> HTTPResponse:
        """One POST to one endpoint; the response, open. Raises _Down (try the next endpoint)
        or EtcdError (etcd's answer was an error)."""
        t = self.timeout if timeout is None else timeout
        headers = {"Content-Type": "application/json"}
        token = self._auth(url, t) if self._password is not None else None
        if token is not None:
            headers["Authorization"] = token
        req = urllib.request.Request(f"{url}/v3/{path}", data=json.dumps(body).encode(),
                                     headers=headers, method="POST")
        try:
            resp: HTTPResponse = urllib.request.urlopen(req, timeout=t, context=self._ssl)
            return resp
        except urllib.error.HTTPError as e:
            try:
                data = e.read(MAX_REPLY_BYTES)
            except (OSError, HTTPException):
                data = b""
            finally:
                e.close()
            msg, code = _error_of(data, e.code)
            if token is not None and not retried and _auth_refused(msg, code):
                with self._lock:
                    self._token = None
                return self._open(url, path, body, timeout, True)
            if e.code >= 500 and code == 0:
                raise _Down(f"HTTP {e.code}") from None
            if code == 14:  # Unavailable: no leader, shutting down: try the next endpoint
                raise _Down(msg) from None
            raise EtcdError(f"etcd {url}: {msg}", code) from None
        except urllib.error.URLError as e:
            reason = e.reason
            if isinstance(reason, ssl.SSLError):
                raise _Down(f"TLS: {reason.reason or reason}") from None
            raise _Down(str(getattr(reason, "strerror", None) or reason)) from None
        except (socket.timeout, TimeoutError):
            raise _Down(f"no answer within {t:g} s") from None
        except (OSError, HTTPException, ValueError) as e:
            raise _Down(str(e) or type(e).__name__) from None

    def _auth(self, url: str, timeout: float) -> str:
        with self._lock:
            if self._token is not None:
                return self._token
        req = urllib.request.Request(
            f"{url}/v3/auth/authenticate",
            data=json.dumps({"name": self.user, "password": self._password}).encode(),
            headers={"Content-Type": "application/json"}, method="POST")
        try:
            with urllib.request.urlopen(req, timeout=timeout, context=self._ssl) as resp:
                got = _json(resp.read(MAX_REPLY_BYTES), url)
        except urllib.error.HTTPError as e:
            msg, code = _error_of(e.read(MAX_REPLY_BYTES), e.code)
            e.close()
            raise EtcdError(f"etcd {url}: user '{self.user}' cannot log in: {msg}", code,
                            auth=True) from None
        except urllib.error.URLError as e:
            raise _Down(str(getattr(e.reason, "strerror", None) or e.reason)) from None
        except (socket.timeout, TimeoutError):
            raise _Down(f"no answer within {timeout:g} s") from None
        except (OSError, HTTPException, ValueError) as e:
            raise _Down(str(e) or type(e).__name__) from None
        token = got.get("token")
        if not isinstance(token, str) or not token:
            raise EtcdError(f"etcd {url}: authentication gave no token (is auth enabled?)")
        with self._lock:
            self._token = token
        return token


class _Down(Exception):
    """This endpoint did not answer: try the next one."""


class Stream:
    """The messages of one streaming reply (a watch), one JSON object per line. Iterating
    yields each message's "result"; an error message raises EtcdError, a read that takes
    longer than the stream's timeout raises OSError (socket.timeout). `close()` ends it."""

    def __init__(self, resp: HTTPResponse, url: str) -> None:
        self._resp = resp
        self.url = url

    def __iter__(self) -> Iterator[Dict[str, Any]]:
        while True:
            try:
                line = self._resp.readline(MAX_REPLY_BYTES + 1)
            except HTTPException as e:
                raise OSError(f"etcd {self.url}: the stream broke: {e}") from None
            if not line:
                return
            if len(line) > MAX_REPLY_BYTES:
                raise EtcdError(f"etcd {self.url}: a stream message of more than "
                                f"{MAX_REPLY_BYTES} bytes")
            if not line.strip():
                continue
            msg = _json(line, self.url)
            if "error" in msg and "result" not in msg:
                err = msg["error"]
                text, code = (_error_of(json.dumps(err).encode(), 0) if isinstance(err, dict)
                              else (str(err), num(msg.get("code"))))
                raise EtcdError(f"etcd {self.url}: {text}", code)
            result = msg.get("result")
            yield result if isinstance(result, dict) else {}

    def close(self) -> None:
        try:
            self._resp.close()
        except (OSError, HTTPException):
            pass

    def abort(self) -> None:
        """From another thread: wake a read blocked on this stream (it sees the stream end).
        Shuts the socket down without touching the reader's objects (nor TLS state)."""
        fp = getattr(self._resp, "fp", None)
        raw = getattr(fp, "raw", None)
        sock = getattr(raw, "_sock", None)
        if isinstance(sock, socket.socket):
            try:
                socket.socket.shutdown(sock, socket.SHUT_RDWR)
            except OSError:
                pass

    def __enter__(self) -> "Stream":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _json(data: bytes, url: str) -> Dict[str, Any]:
    try:
        got = json.loads(data)
    except (ValueError, UnicodeDecodeError):
        raise EtcdError(f"etcd {url}: the reply is not JSON: {data[:80]!r}") from None
    if not isinstance(got, dict):
        raise EtcdError(f"etcd {url}: the reply is not a JSON object")
    return got


def _error_of(data: bytes, status: int) -> "tuple[str, int]":
    """etcd's message and gRPC code from an error reply; a reply that is not etcd's JSON is
    shown as its first line of text (the gateway answers some refusals in plain text)."""
    try:
        got = json.loads(data)
    except (ValueError, UnicodeDecodeError):
        got = None
    if not isinstance(got, dict):
        text = data.decode("utf-8", "replace").strip().splitlines()
        return (f"HTTP {status}: {text[0][:200]}" if text else f"HTTP {status}"), 0
    msg = got.get("message") or got.get("error") or f"HTTP {status}"
    return str(msg), num(got.get("code"))


def _auth_refused(msg: str, code: int) -> bool:
    return code == 16 or "token" in msg or "authentication" in msg
