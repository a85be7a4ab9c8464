"""Membership in etcd: units register, directories resolve and watch a service.

The contract is docs/PROTOCOL.md's "Membership in etcd", shared with the C runtime
(ctlrpc/directory.h): a unit of service S in namespace N is the key
`/ctlrpc/v1/N/S/<unit_id>` under a lease of its own, its value a JSON object (address, state,
service, idl_hash, version, host, pid, started, curve_public_key). This module owns that
meaning; how etcd is reached (endpoints, TLS, users, deadlines) is `etcd.py`'s.

`Registration` keeps one unit's key alive on a thread of its own: lease grant, put with the
lease, keepalive every TTL/3 (each with a deadline shorter than that), a new lease and put when
the lease was lost, `draining` while the unit drains, revoke at close. A unit that cannot reach
etcd serves anyway: it logs that once and keeps trying with backoff and jitter.
`Server.register()` and the generated `serve(..., etcd=...)` start one.

`Directory` lists a service's prefix, then watches it from the listed revision + 1 on a thread
of its own. A dropped or idle stream is resumed from the last revision seen + 1 (so no event is
missed: the re-opened watch also tells the directory that etcd is there); a watch cancelled by
compaction, or a store whose revision went back (etcd restarted on an empty data directory),
makes it list again. When etcd cannot be reached it keeps the last membership, says `stale` with
the `age` of its last contact, and retries; it removes a unit only on a delete event or a new
complete listing. A value that is not a unit is skipped, counted (`skipped`) and logged once.

Threading: a Directory's snapshot is replaced whole under its lock; `units()` and
`addresses()` may be called from any thread; the change callback runs on the directory's
thread (keep it short; it must not call `close()`).
"""

from __future__ import annotations

import dataclasses
import json
import logging
import math
import os
import re
import secrets
import socket
import threading
import time
import urllib.parse
from typing import (Any, Callable, Dict, List, Mapping, Optional, Sequence, Tuple, Union)

from . import _threads
from . import etcd as _etcd
from . import net
from ._version import __version__
from .etcd import Etcd, EtcdError, EtcdUnreachable
from .retry import seconds

log = logging.getLogger("ctlrpc.directory")

ROOT = "/ctlrpc/v1/"
MAX_VALUE_BYTES = 4096
DEFAULT_LEASE_TTL = 10
MIN_LEASE_TTL = 2
MAX_LEASE_TTL = 86400  # a day, as in C
DEFAULT_HEARTBEAT = 2.0  # seconds a watch may be idle before the directory re-opens it
DRAINING_WAIT = 2.0  # at most this long for etcd to take the draining state
STATES = ("serving", "draining")
_NAME = re.compile(r"[A-Za-z0-9_-][A-Za-z0-9._-]{0,127}")

EtcdLike = Union[Etcd, str, Sequence[str]]


def check_name(what: str, name: str) -> str:
    """`name` when it is 1 to 128 characters of A-Z a-z 0-9 . _ - not starting with '.';
    else ValueError naming `what`."""
    if not isinstance(name, str) or not _NAME.fullmatch(name):
        raise ValueError(f"{what} '{name}' is not 1 to 128 characters of A-Z a-z 0-9 . _ - "
                         "(not starting with '.')")
    return name


def prefix(service: str, namespace: str = "default") -> str:
    """The key prefix of a service's units, with its trailing '/'."""
    return f"{ROOT}{check_name('namespace', namespace)}/{check_name('service', service)}/"


def default_unit_id() -> str:
    """`<host>-<pid>-<hex8>`: a new id per incarnation."""
    host = re.sub(r"[^A-Za-z0-9._-]", "-", socket.gethostname() or "host").lstrip(".")
    return f"{host[:100] or 'host'}-{os.getpid()}-{secrets.token_hex(4)}"


def _as_etcd(etcd: EtcdLike) -> Etcd:
    return etcd if isinstance(etcd, Etcd) else Etcd(etcd)


def _wildcard(address: str) -> bool:
    host = urllib.parse.urlsplit(address).netloc.rsplit(":", 1)[0]
    return host in ("*", "0.0.0.0", "[::]", "::", "[*]", "")


@dataclasses.dataclass(frozen=True)
class Unit:
    """One registered unit, as its key and value say. `fields` is the whole value (fields
    this release does not know included); `mod_revision` the etcd revision of its last put."""

    unit_id: str
    address: str
    state: str
    service: str
    idl_hash: str
    version: str
    host: str
    pid: int
    started: int
    curve_public_key: Optional[str]
    namespace: str
    key: str
    mod_revision: int
    fields: Mapping[str, Any] = dataclasses.field(compare=False, repr=False)

    @property
    def serving(self) -> bool:
        return self.state == "serving"

    def to_json(self) -> Dict[str, Any]:
        d = dict(self.fields)
        d.update(unit_id=self.unit_id, address=self.address, state=self.state,
                 service=self.service, idl_hash=self.idl_hash, version=self.version,
                 host=self.host, pid=self.pid, started=self.started, namespace=self.namespace)
        if self.curve_public_key is not None:
            d["curve_public_key"] = self.curve_public_key
        return d


def _no_repeats(pairs: List[Tuple[str, Any]]) -> Dict[str, Any]:
    d = dict(pairs)
    if len(d) != len(pairs):
        raise ValueError("a key given twice")
    return d


def _no_constant(name: str) -> Any:
    raise ValueError(f"{name} is not JSON")


def _check_json(v: Any) -> None:
    """What the C reader's JSON parser (jansson) refuses, refused here too, so that both readers
    take the same values for units: a NUL in a string, an integer beyond 64 bits."""
    if isinstance(v, str):
        if "\x00" in v:
            raise ValueError("a NUL in a string")
    elif isinstance(v, bool):
        pass
    elif isinstance(v, int):
        if not -(1 << 63) <= v < (1 << 63):
            raise ValueError("an integer beyond 64 bits")
    elif isinstance(v, float):
        if not math.isfinite(v):
            raise ValueError("a number out of range")
    elif isinstance(v, dict):
        for k, x in v.items():
            _check_json(k)
            _check_json(x)
    elif isinstance(v, list):
        for x in v:
            _check_json(x)


def _strict_json(text: str) -> Any:
    """json.loads as strict as the C reader: no key twice in an object, no NaN or Infinity,
    and _check_json. ValueError otherwise."""
    v = json.loads(text, object_pairs_hook=_no_repeats, parse_constant=_no_constant)
    _check_json(v)
    return v


def parse_unit(key: bytes, value: bytes, service: str, namespace: str,
               mod_revision: int = 0) -> Unit:
    """The unit a key and value under a service's prefix describe; ValueError saying why when
    they are not one (docs/PROTOCOL.md, "What a reader accepts")."""
    pre = prefix(service, namespace).encode()
    if not key.startswith(pre):
        raise ValueError("the key is not under the service's prefix")
    try:
        unit_id = key[len(pre):].decode("utf-8")
    except UnicodeDecodeError:
        raise ValueError("the key is not UTF-8") from None
    if not _NAME.fullmatch(unit_id):
        raise ValueError("the key's unit id is not a unit id")
    if len(value) > MAX_VALUE_BYTES:
        raise ValueError(f"the value is {len(value)} bytes (at most {MAX_VALUE_BYTES})")
    try:
        d = _strict_json(value.decode("utf-8"))
    except (UnicodeDecodeError, ValueError):
        raise ValueError("the value is not JSON") from None
    if not isinstance(d, dict):
        raise ValueError("the value is not a JSON object")
    address = d.get("address")
    if not isinstance(address, str):
        raise ValueError("the value has no address")
    if not address.startswith("tcp://") or len(address) <= len("tcp://"):
        raise ValueError(f"the address {address[:80]!r} is not tcp://")
    svc = d.get("service", service)
    if svc != service:
        raise ValueError(f"the value names another service ({str(svc)[:80]!r})")
    state = d.get("state")
    if not isinstance(state, str):  # any string: "serving" serves, any other is listed
        raise ValueError("the value has no state")

    def text(name: str) -> str:
        v = d.get(name)
        return v if isinstance(v, str) else ""

    def integer(name: str) -> int:
        v = d.get(name)
        return v if isinstance(v, int) and not isinstance(v, bool) else 0

    ck = d.get("curve_public_key")
    return Unit(unit_id=unit_id, address=address, state=state, service=service,
                idl_hash=text("idl_hash"), version=text("version"), host=text("host"),
                pid=integer("pid"), started=integer("started"),
                curve_public_key=ck if isinstance(ck, str) else None, namespace=namespace,
                key=key.decode("utf-8"), mod_revision=mod_revision, fields=d)


@dataclasses.dataclass
class Listing:
    """One complete listing of a service: its units by unit id, the revision it is as of, the
    values skipped as not units (with the first one's key and why), etcd's cluster id."""

    units: Dict[str, Unit]
    revision: int
    skipped: int
    first_bad: Optional[Tuple[str, str]]
    cluster: str
    header: Dict[str, Any]


def list_units(etcd: EtcdLike, service: str, namespace: str = "default",
               timeout: Optional[float] = None) -> Listing:
    """List a service's units once (no watch): what a command-line program needs. Raises
    EtcdUnreachable naming the endpoints, EtcdError for etcd's refusal, ValueError for a bad
    name."""
    e = _as_etcd(etcd)
    pre = prefix(service, namespace).encode()
    got = e.request("kv/range", {"key": _etcd.b64(pre),
                                 "range_end": _etcd.b64(_etcd.prefix_end(pre))}, timeout)
    header = got.get("header") if isinstance(got.get("header"), dict) else {}
    assert isinstance(header, dict)
    units: Dict[str, Unit] = {}
    skipped, first_bad = 0, None
    kvs = got.get("kvs")
    for kv in kvs if isinstance(kvs, list) else []:
        uid, unit, why = _parse_kv(kv, pre, service, namespace)
        if unit is not None and uid is not None:
            units[uid] = unit
        else:
            skipped += 1
            first_bad = first_bad or (why[0], why[1])
    return Listing(units, _etcd.num(header.get("revision")), skipped, first_bad,
                   str(header.get("cluster_id", "")), header)


def _parse_kv(kv: Any, pre: bytes, service: str,
              namespace: str) -> Tuple[Optional[str], Optional[Unit], Tuple[str, str]]:
    """(unit id or None, the unit or None, (key, why not a unit)) of one key-value of etcd."""
    try:
        key = _etcd.unb64(kv.get("key"))
        value = _etcd.unb64(kv.get("value"))
    except (ValueError, AttributeError):
        return None, None, ("?", "the gateway sent a key or value that is not base64")
    rest = key[len(pre):] if key.startswith(pre) else b""
    uid = rest.decode("utf-8", "replace") if rest else None
    try:
        return uid, parse_unit(key, value, service, namespace,
                               _etcd.num(kv.get("mod_revision"))), ("", "")
    except ValueError as e:
        return uid, None, (key.decode("utf-8", "replace"), str(e))


# ---- directories --------------------------------------------------------------------------

ChangeCallback = Callable[[List[Unit]], None]


class Directory:
    """The units of one service in etcd, listed then watched on a thread of its own.

    etcd: an `Etcd` (for https or a user), or its endpoints ("URL[,URL...]" or a list).
    service, namespace: which prefix (`/ctlrpc/v1/<namespace>/<service>/`). on_change: called
    with the new `units()` after each change (on the directory's thread), once per etcd
    revision that changed the membership, in order. start_timeout: how
    long the constructor tries to make its first listing; when none succeeds it raises
    EtcdUnreachable naming the endpoints (or EtcdError with etcd's refusal). heartbeat: a watch
    idle this long is re-opened, which is also how the directory learns etcd is still there.

    Raises ValueError for a bad service or namespace name or a bad endpoint.
    """

    def __init__(self, etcd: EtcdLike, service: str, namespace: str = "default", *,
                 on_change: Optional[ChangeCallback] = None, start_timeout: float = 5.0,
                 heartbeat: float = DEFAULT_HEARTBEAT) -> None:
        self.etcd = _as_etcd(etcd)
        self.service = service
        self.namespace = namespace
        self.prefix = prefix(service, namespace)
        if heartbeat <= 0:
            raise ValueError(f"directory: heartbeat {heartbeat} is not positive")
        start_timeout = seconds("directory: start_timeout", start_timeout)
        self.heartbeat = heartbeat
        self._pre = self.prefix.encode()
        self._on_change = on_change
        self._cond = threading.Condition()
        self._units: Dict[str, Unit] = {}
        self._revision = 0
        self._cluster = ""
        self._term = 0  # the highest raft term seen: a lower one is a replaced store
        self._contact: Optional[float] = None  # monotonic time of the last contact
        self._failing = False
        self._last_error: Optional[str] = None
        self.skipped = 0
        self.lists = 0  # complete listings made (the first one included)
        self._logged_bad = False
        self._logged_down = False
        self._stop = threading.Event()
        self._backoff = _etcd.Backoff()
        self._stream: Optional[_etcd.Stream] = None

        deadline = time.monotonic() + max(0.0, start_timeout)
        while True:
            try:
                self._list()
                break
            except EtcdError as e:
                if time.monotonic() + 0.1 < deadline and isinstance(e, EtcdUnreachable):
                    time.sleep(min(self._backoff.next(), max(0.0, deadline - time.monotonic())))
                    continue
                msg = f"directory of service '{service}' (namespace '{namespace}'): {e.msg}"
                if isinstance(e, EtcdUnreachable):
                    raise EtcdUnreachable(msg, e.endpoints) from None
                raise EtcdError(msg, e.code, e.auth) from None
        self._thread = _threads.start(self._run, f"ctlrpc-directory {self.prefix}")

    # ---- what callers read ------------------------------------------------------------------

    def units(self) -> List[Unit]:
        """Every unit listed (serving, draining or another state), by unit id."""
        with self._cond:
            return [self._units[k] for k in sorted(self._units)]

    def addresses(self) -> List[str]:
        """The addresses of the serving units, by unit id."""
        return [u.address for u in self.units() if u.serving]

    @property
    def revision(self) -> int:
        """The etcd revision the membership is as of."""
        with self._cond:
            return self._revision

    @property
    def age(self) -> float:
        """Seconds since etcd last answered this directory."""
        with self._cond:
            return 0.0 if self._contact is None else time.monotonic() - self._contact

    @property
    def stale(self) -> bool:
        """True while etcd cannot be reached (the last attempt failed, or nothing came for
        longer than a heartbeat and a request's deadline): the membership is the last one
        seen, `age` seconds old."""
        with self._cond:
            if self._failing or self._contact is None:
                return True
            return time.monotonic() - self._contact > 2 * self.heartbeat + self.etcd.timeout

    @property
    def last_error(self) -> Optional[str]:
        """Why the last attempt to reach etcd failed (None after a success)."""
        with self._cond:
            return self._last_error

    def wait(self, predicate: Callable[[List[Unit]], bool], timeout: float) -> bool:
        """Wait at most `timeout` seconds until `predicate(units())` is true; whether it is."""
        deadline = time.monotonic() + timeout
        with self._cond:
            while True:
                if predicate([self._units[k] for k in sorted(self._units)]):
                    return True
                left = deadline - time.monotonic()
                if left <= 0:
                    return False
                self._cond.wait(min(left, 0.5))

    def close(self) -> None:
        """Stop watching (the snapshot stays readable). Idempotent."""
        self._stop.set()
        s = self._stream
        if s is not None:
            s.abort()
        if threading.current_thread() is not self._thread:
            self._thread.join(self.heartbeat + self.etcd.timeout + 1.0)

    def __enter__(self) -> Directory:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # ---- the directory's thread ---------------------------------------------------------------

    def _touch(self, header: Any) -> None:
        """etcd answered: note the contact and the cluster it came from."""
        with self._cond:
            self._contact = time.monotonic()
            if self._failing:
                log.warning("directory %s: etcd %s answers again", self.prefix, self.etcd.where)
            self._failing = False
            self._last_error = None
            self._logged_down = False
            if isinstance(header, dict):
                self._cluster = str(header.get("cluster_id", self._cluster))
                self._term = max(self._term, _etcd.num(header.get("raft_term")))

    def _failed(self, e: Exception) -> None:
        with self._cond:
            self._failing = True
            self._last_error = str(e)
            first = not self._logged_down
            self._logged_down = True
        if first:
            log.warning("directory %s: %s; keeping the last membership (%d units) and retrying",
                        self.prefix, e, len(self._units))

    def _parse(self, kv: Any) -> Tuple[Optional[str], Optional[Unit]]:
        """(unit id or None, the unit or None when the value is not one: counted, logged once)."""
        uid, unit, why = _parse_kv(kv, self._pre, self.service, self.namespace)
        if unit is None:
            self._bad(*why)
        return uid, unit

    def _bad(self, key: str, why: str) -> None:
        self.skipped += 1
        if not self._logged_bad:
            self._logged_bad = True
            log.warning("directory %s: skipping %s: %s (further bad values are only counted)",
                        self.prefix, key[:200], why)

    def _list(self) -> None:
        """A complete listing: replaces the membership."""
        got = list_units(self.etcd, self.service, self.namespace)
        if got.first_bad is not None:
            self.skipped += got.skipped - 1
            self._bad(*got.first_bad)
        units = got.units
        with self._cond:
            self._term = 0  # a new listing: judge the store from here on
        self._touch(got.header)
        with self._cond:
            changed = units != self._units
            self._units = units
            self._revision = got.revision
            self.lists += 1
            self._cond.notify_all()
        self._backoff.reset()
        if changed:
            self._changed()

    def _changed(self) -> None:
        if self._on_change is not None:
            try:
                self._on_change(self.units())
            except Exception:
                log.exception("directory %s: the change callback raised", self.prefix)

    def _run(self) -> None:
        relist = False
        while not self._stop.is_set():
            try:
                if relist:
                    self._list()
                    relist = False
                relist = self._watch()
            except (EtcdError, OSError, ValueError) as e:
                if self._stop.is_set():
                    break
                self._failed(e)
                self._stop.wait(self._backoff.next())
            except Exception as e:  # a bug, or a library's surprise: never end the thread
                if self._stop.is_set():
                    break
                log.exception("directory %s: unexpected failure", self.prefix)
                self._failed(e)
                self._stop.wait(self._backoff.next())

    def _watch(self) -> bool:
        """One watch stream, from the revision after the membership's; returns whether the
        directory must list again. Raises on a failure to reach etcd."""
        with self._cond:
            start = self._revision + 1
            cluster = self._cluster
            term = self._term
        body = {"create_request": {"key": _etcd.b64(self._pre),
                                   "range_end": _etcd.b64(_etcd.prefix_end(self._pre)),
                                   "start_revision": str(start), "prev_kv": False}}
        stream = self.etcd.stream("watch", body, self.heartbeat)
        self._stream = stream
        try:
            if self._stop.is_set():
                return False
            heard = False
            for msg in stream:
                heard = True
                header = msg.get("header") or {}
                if msg.get("created"):
                    if cluster and str(header.get("cluster_id", cluster)) != cluster:
                        log.warning("directory %s: etcd is another cluster now: listing again",
                                    self.prefix)
                        return True
                    if _etcd.num(header.get("revision")) < start - 1 or \
                            0 < _etcd.num(header.get("raft_term")) < term:
                        # The store went back (an empty data directory): the revision waited
                        # for may never come, and the old membership is gone.
                        log.warning("directory %s: etcd's store was replaced (revision %s, "
                                    "term %s): listing again", self.prefix,
                                    header.get("revision"), header.get("raft_term"))
                        return True
                self._touch(header)
                self._backoff.reset()
                if msg.get("compact_revision") and _etcd.num(msg.get("compact_revision")):
                    log.info("directory %s: revision %d was compacted: listing again",
                             self.prefix, start)
                    return True
                if msg.get("canceled"):
                    return True
                events = msg.get("events") or []
                if events:
                    self._apply(events)
            if not heard and not self._stop.is_set():
                # Ended before etcd said anything: a failure (backed off), not a resume.
                raise OSError(f"etcd {stream.url}: the watch stream ended at once")
            return False  # the stream ended: resume it
        except OSError as e:
            if self._stop.is_set():
                return False
            if heard and (isinstance(e, (socket.timeout, TimeoutError))
                          or "timed out" in str(e)):
                return False  # idle for a heartbeat: re-open, which checks etcd is there
            raise
        finally:
            self._stream = None
            stream.close()

    def _apply(self, events: Sequence[Any]) -> None:
        """Apply one watch response. Its events may span several revisions (etcd batches what
        is pending): each revision is published on its own, so a callback sees every state
        etcd went through (a unit draining, then gone), never a merge of two."""
        with self._cond:
            units = dict(self._units)
            rev = self._revision
        changed = False
        for ev in events:
            if not isinstance(ev, dict) or not isinstance(ev.get("kv"), dict):
                continue
            kv = ev["kv"]
            ev_rev = _etcd.num(kv.get("mod_revision"))
            if ev_rev > rev and changed:
                self._publish(units, rev)  # the previous revision's state, complete
                units, changed = dict(units), False
            rev = max(rev, ev_rev)
            if ev.get("type") == "DELETE":
                try:
                    key = _etcd.unb64(kv.get("key"))
                except ValueError:
                    continue
                gone = key[len(self._pre):].decode("utf-8", "replace")
                if units.pop(gone, None) is not None:
                    changed = True
                continue
            uid, unit = self._parse(kv)
            if uid is None:
                continue
            if unit is None:
                # A key that held a unit now holds bad data: it is no longer a unit.
                changed = units.pop(uid, None) is not None or changed
            elif units.get(uid) != unit:
                units[uid] = unit
                changed = True
        if changed:
            self._publish(units, rev)
        else:
            with self._cond:
                self._revision = rev
                self._cond.notify_all()

    def _publish(self, units: Dict[str, Unit], rev: int) -> None:
        with self._cond:
            self._units = units
            self._revision = rev
            self._cond.notify_all()
        self._changed()


# ---- registration ---------------------------------------------------------------------------

class Registration:
    """One unit's key in etcd, kept alive on a thread of its own until `close()`.

    etcd: an `Etcd` or its endpoints. service: the service name (the IDL's, by default, when a
    server registers). address: the tcp:// endpoint clients dial (never a wildcard: give the
    advertised one). namespace, unit_id (default `<host>-<pid>-<hex8>`), lease_ttl (seconds, at
    least 2). idl_hash, version, curve_public_key: for the value; extra: more fields.

    It starts at once and never raises for etcd being away: it logs that once and retries
    with backoff and jitter. Raises ValueError for a bad name, address or TTL.
    """

    def __init__(self, etcd: EtcdLike, service: str, address: str, *,
                 namespace: str = "default", unit_id: Optional[str] = None,
                 lease_ttl: int = DEFAULT_LEASE_TTL, idl_hash: str = "",
                 version: str = __version__, curve_public_key: Optional[str] = None,
                 extra: Optional[Mapping[str, Any]] = None) -> None:
        self.etcd = _as_etcd(etcd)
        self.prefix = prefix(service, namespace)
        self.unit_id = check_name("unit id", unit_id if unit_id is not None
                                  else default_unit_id())
        self.key = self.prefix + self.unit_id
        if isinstance(lease_ttl, bool) or not isinstance(lease_ttl, int) \
                or not MIN_LEASE_TTL <= lease_ttl <= MAX_LEASE_TTL:
            raise ValueError(f"registration: lease TTL {lease_ttl!r} is out of range "
                             f"({MIN_LEASE_TTL} to {MAX_LEASE_TTL} s)")
        self.lease_ttl = lease_ttl
        if not isinstance(address, str):
            raise TypeError(f"registration: address must be a str, not "
                            f"{type(address).__name__}")
        try:  # what clients will dial: the C registration's check
            ep = net.parse_endpoint(address)
        except ValueError as e:
            raise ValueError(f"registration: advertise: {e}") from None
        if _wildcard(address) or ep.any_port:
            raise ValueError(f"registration: address '{address}' is a wildcard, which other "
                             "hosts cannot dial: give the address clients dial (--advertise)")
        self._value: Dict[str, Any] = dict(extra or {})
        self._value.update(address=address, state="serving", service=service,
                           idl_hash=idl_hash, version=version, host=socket.gethostname(),
                           pid=os.getpid(), started=int(time.time()))
        if curve_public_key:
            self._value["curve_public_key"] = curve_public_key
        self._encoded()  # refuse an oversized value now
        self._lock = threading.Lock()  # one etcd exchange at a time
        self._lease: Optional[str] = None
        self._live = False  # the key was put under the current lease
        self._expires = 0.0  # monotonic time the lease runs out, as last renewed
        self._dirty = False  # the value changed since it was put
        self._logged_down = False
        self.registrations = 0  # times the key was put under a new lease
        self._stop = threading.Event()
        self._kick = threading.Event()
        self._backoff = _etcd.Backoff()
        self._unanswered = False  # etcd did not answer the draining mark: not waited for
        self._thread = _threads.start(self._run, f"ctlrpc-registration {self.key}")

    @property
    def state(self) -> str:
        return str(self._value["state"])

    @property
    def value(self) -> Dict[str, Any]:
        return dict(self._value)

    @property
    def registered(self) -> bool:
        """Whether the key is in etcd under a live lease, as last heard."""
        return self._live and self._lease is not None and time.monotonic() < self._expires

    def set_state(self, state: str, wait: float = DRAINING_WAIT) -> bool:
        """Put the value again with `state` ("serving" or "draining"), waiting at most `wait`
        seconds for etcd to take it; whether it did (else the thread keeps trying)."""
        if state not in STATES:
            raise ValueError(f"registration: state '{state}' is not one of {', '.join(STATES)}")
        self._value["state"] = state
        self._dirty = True
        if not self._lock.acquire(timeout=max(0.0, wait)):
            self._kick.set()
            self._unanswered = state == "draining"
            return False
        try:
            if self._lease is None:
                self._kick.set()
                return False
            try:
                # Each endpoint tried gets its share of the wait.
                each = (min(wait, self.etcd.timeout) if wait > 0 else self.etcd.timeout) \
                    / max(1, len(self.etcd.endpoints))
                self._put(each)
                return True
            except (EtcdError, OSError) as e:
                self._kick.set()
                self._unanswered = state == "draining" and not isinstance(e, EtcdError)
                return False
        finally:
            self._lock.release()

    def close(self, revoke: bool = True) -> None:
        """Stop keeping the key alive and (by default) revoke the lease: the key is gone at
        once. Waits at most 2 s (DRAINING_WAIT) for etcd, and not at all when etcd did not
        answer the draining mark: then, as past those 2 s, the key goes when its lease
        expires. Idempotent."""
        if self._stop.is_set():
            return
        by = time.monotonic() + (0.0 if self._unanswered else DRAINING_WAIT)
        self._stop.set()
        self._kick.set()
        self._thread.join(max(0.0, by - time.monotonic()))
        if not self._lock.acquire(timeout=max(0.0, by - time.monotonic())):
            log.warning("registration %s: etcd did not answer in time (its draining mark, or "
                        "%g s at the stop); the key goes when its lease expires, within %d s",
                        self.key, DRAINING_WAIT, self.lease_ttl)
            return
        try:
            lease, self._lease = self._lease, None
        finally:
            self._lock.release()
        left = by - time.monotonic()
        if revoke and lease is not None:
            if left <= 0:
                log.warning("registration %s: its lease is not revoked (etcd did not answer "
                            "in time: its draining mark, or %g s at the stop); the key goes "
                            "when the lease expires, within %d s", self.key, DRAINING_WAIT,
                            self.lease_ttl)
                return
            try:
                self.etcd.request("lease/revoke", {"ID": lease},
                                  timeout=left / max(1, len(self.etcd.endpoints)))
            except (EtcdError, OSError) as e:
                log.warning("registration %s: cannot revoke its lease: %s (the key goes when "
                            "the lease expires, within %d s)", self.key, e, self.lease_ttl)

    def __enter__(self) -> Registration:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # ---- the registration's thread ------------------------------------------------------------

    def _encoded(self) -> str:
        text = json.dumps(self._value, separators=(",", ":"), ensure_ascii=False)
        if len(text.encode()) > MAX_VALUE_BYTES:
            raise ValueError(f"registration {self.key}: the value is more than "
                             f"{MAX_VALUE_BYTES} bytes")
        return text

    def _put(self, timeout: float) -> None:
        assert self._lease is not None
        self._dirty = False
        try:
            self.etcd.request("kv/put", {"key": _etcd.b64(self.key),
                                         "value": _etcd.b64(self._encoded()),
                                         "lease": self._lease}, timeout)
        except BaseException:
            self._dirty = True
            raise

    def _register(self) -> None:
        got = self.etcd.request("lease/grant", {"TTL": self.lease_ttl})
        lease = got.get("ID")
        ttl = _etcd.num(got.get("TTL"))
        if not lease or ttl <= 0:
            raise EtcdError(f"etcd {self.etcd.where}: lease grant answered {got.get('error') or got}")
        self._lease = str(lease)
        self._live = False
        self._expires = time.monotonic() + ttl
        try:
            self._put(self.etcd.timeout)
        except BaseException:
            self._lease = None
            raise
        self.registrations += 1
        self._live = True
        log.info("registered %s (%s, lease %s, TTL %d s)", self.key, self._value["address"],
                 self._lease, self.lease_ttl)

    def _keepalive(self) -> None:
        assert self._lease is not None
        period = self.lease_ttl / 3.0
        got = self.etcd.request("lease/keepalive", {"ID": self._lease},
                                min(self.etcd.timeout, period * 0.9))
        result = got.get("result") if isinstance(got.get("result"), dict) else got
        ttl = _etcd.num(result.get("TTL") if isinstance(result, dict) else None)
        if ttl <= 0:
            self._live = False
            log.warning("registration %s: lease %s was lost (etcd was away longer than its TTL, "
                        "or was reset): registering again", self.key, self._lease)
            self._lease = None
            return
        self._expires = time.monotonic() + ttl
        if not self._dirty and not self._key_present(min(self.etcd.timeout, period * 0.9)):
            # Deleted while its lease lives (an operator's `etcdctl del`, say): the unit still
            # serves, so its key goes back.
            log.warning("registration %s: the key was deleted while its lease lives; putting "
                        "it again", self.key)
            self._dirty = True
        if self._dirty:
            self._put(self.etcd.timeout)

    def _key_present(self, timeout: float) -> bool:
        got = self.etcd.request("kv/range", {"key": _etcd.b64(self.key), "count_only": True},
                                timeout)
        return _etcd.num(got.get("count")) > 0

    def _run(self) -> None:
        wait = 0.0
        while not self._stop.is_set():
            if wait > 0:
                self._kick.wait(wait)
                self._kick.clear()
                if self._stop.is_set():
                    break
            with self._lock:
                if self._stop.is_set():
                    break
                try:
                    if self._lease is None:
                        self._register()
                    else:
                        self._keepalive()
                        if self._lease is None:
                            wait = 0.0
                            continue  # lost: register again at once
                    if self._logged_down:
                        log.warning("registration %s: etcd %s answers again", self.key,
                                    self.etcd.where)
                    self._logged_down = False
                    self._backoff.reset()
                    wait = self.lease_ttl / 3.0
                except Exception as e:  # EtcdError, OSError; anything else is a bug: keep going
                    if not isinstance(e, (EtcdError, OSError)):
                        log.exception("registration %s: unexpected failure", self.key)
                    if not self._logged_down:
                        self._logged_down = True
                        log.warning("registration %s: %s; serving anyway and retrying", self.key,
                                    e)
                    if self._lease is not None and time.monotonic() >= self._expires:
                        self._lease = None  # it has run out: a new one is needed
                        self._live = False
                    wait = self._backoff.next()
                    if self._lease is not None:
                        # Keep trying before the lease runs out, not after.
                        wait = min(wait, max(0.05, (self._expires - time.monotonic()) / 3))
