#!/usr/bin/env python3
"""unit.py - a storage unit in Python: idl/storage.idl served on the generated module.

    unit.py [--module-dir DIR] [--bind ENDPOINT] [--capacity BYTES] [--spill-dir DIR]
            [--max-msg-bytes BYTES] [--max-key-bytes BYTES] [--index-capacity BYTES]
            [--max-list-keys N] [--drain-timeout MS] [--deadline-skew-ms MS] [--no-describe]
            [--log-level LEVEL]
            [--curve-secret FILE [--curve-allow FILE]]
            [--etcd URL[,URL...] [--service NAME] [--namespace NAME] [--unit-id ID]
             [--lease-ttl SECONDS] [--advertise ENDPOINT] [--etcd-cacert FILE]
             [--etcd-cert FILE --etcd-key FILE] [--etcd-user NAME]]
    unit.py --gen-keys PREFIX

The twin of ctl-storage-unit (examples/storage/unit.c, store.c, handlers.c), with the same
command line, the same first line of stdout (the bound endpoint), the same ops, errors and
messages, so `ctl-storage`, the C stubs and their tests drive either. It stands on the module
`ctlrpc-gen --lang python idl/storage.idl -o DIR` writes (`storage_ctl.py`: the build puts it in
build/examples/python) and on the Python runtime (runtime/python): `--module-dir DIR` or
PYTHONPATH finds the first; the second is found on PYTHONPATH, else next to this file in a
checkout. Needs pyzmq and msgpack (Debian: python3-zmq python3-msgpack).

What differs from the C unit (docs/PYTHON.md, "The storage unit in Python"): the index charges
a blob its key and PY_BLOB_OVERHEAD bytes (a Python object, a dict slot and a list slot) where
the C unit charges 224; a blob is always a copy (no held request messages); the open-file
limit is raised as the C unit raises it. Like every unit it answers the built-in ops
(`_describe`, `_health`, `_stats`); `--no-describe` turns `_describe` off.

With `--etcd` (default: $CTLRPC_ETCD) the unit registers in etcd as docs/PROTOCOL.md says
("Membership in etcd"): under `/ctlrpc/v1/<namespace>/<service>/<unit id>`, leased, draining on
SIGTERM, revoked at exit; an etcd user's password comes from $CTLRPC_ETCD_PASSWORD.
"""

from __future__ import annotations

import argparse
import bisect
import errno
import logging
import os
import re
import resource
import signal
import sys
import threading
import time
from typing import Any, Dict, List, Optional

PROG = "ctl-storage-unit.py"

# What the index charges a blob beside its key: its Blob object (slots), its entry in the key
# table (a dict of bytes keys) and its slot in the sorted key list, with the allocator's
# rounding. Measured at about 180 bytes with 8-byte keys over a million blobs (CPython 3.11,
# 64-bit); this is on the high side. The C unit's figure is STORE_BLOB_OVERHEAD (224).
# tests/storage/test_storage.c uses the same number for a Python unit (CTL_UNIT_IS_PYTHON).
PY_BLOB_OVERHEAD = 320

DEFAULT_CAPACITY = 1 << 30
DEFAULT_DEADLINE_SKEW_MS = 1000  # --deadline-skew-ms 0: ctl-storage-unit's default, the runtime's
DEFAULT_MAX_KEY_BYTES = 4096
DEFAULT_INDEX_CAPACITY = 64 << 20
DEFAULT_MAX_LIST_KEYS = 100000
DEFAULT_MAX_MSG_BYTES = 64 << 20  # the C unit's: the largest blob a put brings

log = logging.getLogger("ctl-storage-unit")


def parse_size(text: str) -> Optional[int]:
    """A byte count with an optional binary suffix, as store_parse_size reads it: "1048576",
    "64K", "64M", "1G", "2T" (also "64MiB", "64MB"). None when it is not one."""
    m = re.fullmatch(r"([0-9]+)(?:([KMGTkmgt])[iI]?)?[Bb]?", text)
    if not m:
        return None
    value = int(m.group(1))
    shift = {"": 0, "K": 10, "M": 20, "G": 30, "T": 40}[(m.group(2) or "").upper()]
    if value >= 1 << 64 or value > (2 ** 64 - 1) >> shift:
        return None
    return value << shift


def _kb(key: str) -> bytes:
    """A key's bytes: keys that are not UTF-8 arrive with surrogateescape and go back as sent."""
    return key.encode("utf-8", "surrogateescape")


def _ks(kb: bytes) -> str:
    return kb.decode("utf-8", "surrogateescape")


class Blob:
    __slots__ = ("size", "cost", "pinned", "data", "spill_id")

    def __init__(self) -> None:
        self.size = 0
        self.cost = 0
        self.pinned = False
        self.data: Optional[bytes] = None  # in memory; None when spilled
        self.spill_id = -1  # the spill file's number when spilled


class Store:
    """The blob store: store.c's semantics. Keys are held as bytes (byte order is the order of
    `list`), in a dict and in a sorted list; not thread-safe (handlers run one at a time)."""

    def __init__(self, capacity: int, spill_dir: Optional[str], max_key: int,
                 index_capacity: int, max_list: int) -> None:
        self.capacity = capacity
        self.max_key = max_key
        self.index_capacity = index_capacity
        self.max_list = max_list
        self.blobs: Dict[bytes, Blob] = {}
        self.order: List[bytes] = []  # every key, sorted
        self.bytes = 0
        self.index_bytes = 0
        self.pinned = 0
        self.spilled = 0
        self.next_spill = 0
        self.spill_dir = spill_dir
        self.spill_fd = -1
        if spill_dir is not None:
            try:
                os.mkdir(spill_dir, 0o700)
            except FileExistsError:
                pass
            except OSError as e:
                raise OSError(f"spill directory {spill_dir}: cannot create it: "
                              f"{os.strerror(e.errno or 0)}") from None
            try:
                self.spill_fd = os.open(spill_dir, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
            except OSError as e:
                raise OSError(f"spill directory {spill_dir}: cannot open it: "
                              f"{os.strerror(e.errno or 0)}") from None

    # ---- files ---------------------------------------------------------------------------

    @staticmethod
    def spill_name(n: int) -> str:
        return "blob-%020d" % n

    def _unlink(self, name: str) -> None:
        try:
            os.unlink(name, dir_fd=self.spill_fd)
        except OSError:
            pass

    def _spill_failed(self, name: str, e: int, length: int) -> Exception:
        import ctlrpc
        return ctlrpc.UnitFull(f"{length} bytes do not fit in memory and cannot be spilled to "
                               f"{self.spill_dir}/{name}: {os.strerror(e)}")

    def _spill_write(self, data: bytes) -> int:
        """Write `data` to a new spill file, named by a counter (never the key), skipping names
        already taken (not ours); returns its number. A failure removes the partial file."""
        while True:
            n = self.next_spill
            self.next_spill += 1
            name = self.spill_name(n)
            try:
                fd = os.open(name, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o600,
                             dir_fd=self.spill_fd)
                break
            except FileExistsError:
                continue
            except OSError as e:
                raise self._spill_failed(name, e.errno or errno.EIO, len(data)) from None
        view = memoryview(data)
        try:
            off = 0
            while off < len(data):
                w = os.write(fd, view[off:])
                if w <= 0:  # a write of nothing: the device is full
                    raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
                off += w
        except OSError as e:
            os.close(fd)
            self._unlink(name)
            raise self._spill_failed(name, e.errno or errno.EIO, len(data)) from None
        try:
            os.close(fd)
        except OSError as e:
            self._unlink(name)
            raise self._spill_failed(name, e.errno or errno.EIO, len(data)) from None
        return n

    def read_spilled(self, b: Blob) -> bytes:
        import ctlrpc
        name = self.spill_name(b.spill_id)
        try:
            fd = os.open(name, os.O_RDONLY | os.O_CLOEXEC, dir_fd=self.spill_fd)
        except OSError as e:
            raise ctlrpc.Error(f"spill file {self.spill_dir}/{name}: "
                               f"{os.strerror(e.errno or 0)}") from None
        try:
            parts = []
            left = b.size
            while left > 0:
                chunk = os.read(fd, left)
                if not chunk:
                    raise ctlrpc.Error(f"spill file {self.spill_dir}/{name}: "
                                       "shorter than its blob")
                parts.append(chunk)
                left -= len(chunk)
            return parts[0] if len(parts) == 1 else b"".join(parts)
        except OSError as e:
            raise ctlrpc.Error(f"spill file {self.spill_dir}/{name}: "
                               f"{os.strerror(e.errno or 0)}") from None
        finally:
            os.close(fd)

    def _drop_data(self, b: Blob) -> None:
        if b.spill_id >= 0:
            self._unlink(self.spill_name(b.spill_id))
            self.spilled -= 1
        else:
            self.bytes -= b.size
        b.data = None
        b.spill_id = -1

    def close(self) -> None:
        """Remove the store's own spill files (and nothing else)."""
        for b in self.blobs.values():
            if b.spill_id >= 0:
                self._unlink(self.spill_name(b.spill_id))
        self.blobs.clear()
        self.order.clear()
        if self.spill_fd >= 0:
            os.close(self.spill_fd)
            self.spill_fd = -1

    # ---- the ops --------------------------------------------------------------------------

    def put(self, kb: bytes, data: bytes, pin: bool) -> None:
        import ctlrpc
        if len(kb) > self.max_key:
            raise ctlrpc.Error(f"a key of {len(kb)} bytes is longer than this unit's limit of "
                               f"{self.max_key} bytes (--max-key-bytes)")
        old = self.blobs.get(kb)
        if old is not None and old.pinned:
            raise ctlrpc.Busy("blob is pinned; unpin it first", reason="pinned")
        old_mem = old.size if old is not None and old.spill_id < 0 else 0
        base = self.bytes - old_mem
        size = len(data)
        fits = size <= self.capacity and base <= self.capacity - size
        cost = len(kb) + PY_BLOB_OVERHEAD
        index_base = self.index_bytes - (old.cost if old is not None else 0)
        if cost > self.index_capacity or index_base > self.index_capacity - cost:
            raise ctlrpc.UnitFull(f"no room for another key: {index_base} of "
                                  f"{self.index_capacity} bytes of keys and bookkeeping in use "
                                  "(--index-capacity)")
        spill_id = -1
        if not fits:
            if self.spill_fd < 0:
                raise ctlrpc.UnitFull(f"{size} bytes do not fit: {base} of {self.capacity} "
                                      "bytes in use")
            spill_id = self._spill_write(data)
        b = old
        if b is None:
            b = self.blobs[kb] = Blob()
            bisect.insort(self.order, kb)
        else:
            self._drop_data(b)
        self.index_bytes = index_base + cost
        b.cost = cost
        b.size = size
        if fits:
            b.data = data
            self.bytes += size
        else:
            b.spill_id = spill_id
            self.spilled += 1
        if pin and not b.pinned:
            b.pinned = True
            self.pinned += 1

    def remove(self, kb: bytes) -> None:
        b = self.blobs.pop(kb, None)
        if b is None:
            return
        del self.order[bisect.bisect_left(self.order, kb)]
        self._drop_data(b)
        self.index_bytes -= b.cost
        if b.pinned:
            self.pinned -= 1

    def set_pinned(self, b: Blob, pinned: bool) -> None:
        if b.pinned != pinned:
            b.pinned = pinned
            self.pinned += 1 if pinned else -1

    def list(self, prefix: bytes, after: bytes, walk: int) -> List[bytes]:
        """At most `walk` keys, in order, that start with `prefix` and sort after `after`: a
        seek (bisect) and then one step per key, however many keys the store holds."""
        order = self.order
        if after and after >= prefix:
            i = bisect.bisect_right(order, after)
        else:
            i = bisect.bisect_left(order, prefix)
        end = min(len(order), i + walk)
        out = order[i:end]
        if prefix and out and not out[-1].startswith(prefix):
            out = [k for k in out if k.startswith(prefix)]  # the run ends inside the slice
        return out


def build_handlers(storage_ctl: Any, store: Store, unit: Dict[str, Any]) -> Any:
    """The handlers, a subclass of the generated module's Handlers (built here because the
    module is imported at run time, from --module-dir or PYTHONPATH)."""
    import ctlrpc
    BlobInfo = storage_ctl.BlobInfo
    UnitStats = storage_ctl.UnitStats

    def check_present(keys: List[str]) -> List[bytes]:
        kbs = [_kb(k) for k in keys]
        blobs = store.blobs
        absent = [k for k, kb in zip(keys, kbs) if kb not in blobs]
        if absent:
            raise ctlrpc.Missing(f"{len(absent)} of {len(keys)} keys are not on this unit",
                                 blobs=absent)
        return kbs

    class Unit(storage_ctl.Handlers):  # type: ignore[misc,name-defined]
        def put(self, *, key: str, data: bytes, pin: bool) -> int:
            store.put(_kb(key), data, pin)
            return len(data)

        def get(self, *, keys: List[str]) -> List[bytes]:
            out = []
            for kb in check_present(keys):
                b = store.blobs[kb]
                out.append(b.data if b.data is not None else store.read_spilled(b))
            return out

        def describe(self, *, keys: List[str]) -> List[Any]:
            kbs = check_present(keys)
            out = []
            for key, kb in zip(keys, kbs):
                b = store.blobs[kb]
                out.append(BlobInfo(key=key, size=b.size, pinned=b.pinned,
                                    spilled=b.spill_id >= 0))
            return out

        def pin(self, *, keys: List[str]) -> int:
            kbs = check_present(keys)
            for kb in kbs:
                store.set_pinned(store.blobs[kb], True)
            return len(set(kbs))  # the distinct blobs this call names

        def unpin(self, *, keys: List[str]) -> None:
            for key in keys:
                b = store.blobs.get(_kb(key))
                if b is not None:
                    store.set_pinned(b, False)

        def abort(self, *, keys: List[str]) -> None:
            for key in keys:
                kb = _kb(key)
                b = store.blobs.get(kb)
                if b is not None and not b.pinned:
                    store.remove(kb)

        def delete(self, *, keys: List[str]) -> int:
            kbs = [_kb(k) for k in keys]
            for kb in kbs:
                b = store.blobs.get(kb)
                if b is not None and b.pinned:
                    raise ctlrpc.Busy("a named blob is pinned; nothing was deleted",
                                      reason="pinned")
            n = 0
            for kb in kbs:
                if kb in store.blobs:
                    store.remove(kb)
                    n += 1
            return n

        def list(self, *, prefix: str, after: str, limit: int) -> List[str]:
            page = store.max_list
            want = limit if limit and limit < page else page
            # Without a limit every match must fit in one page: one key past it tells.
            walk = want if limit else page + 1
            keys = store.list(_kb(prefix), _kb(after), walk)
            if len(keys) > page:
                raise ctlrpc.Error(f"more than {page} keys match, and this unit lists at most "
                                   "that many at once (--max-list-keys): page with 'after' "
                                   "and 'limit'")
            return [_ks(k) for k in keys]

        def stats(self) -> Any:
            server = unit.get("server")
            counters = server.stats() if server is not None else {}
            return UnitStats(blobs=len(store.blobs), bytes=store.bytes,
                             capacity=store.capacity, pinned=store.pinned,
                             spilled=store.spilled, requests=counters.get("requests", 0),
                             dropped=counters.get("dropped", 0),
                             index_bytes=store.index_bytes,
                             index_capacity=store.index_capacity)

    return Unit()


def raise_nofile_limit() -> None:
    """Allow as many open files as the hard limit does: one per connection."""
    import resource
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft >= hard:
        log.info("open-file limit %d (the hard limit)", soft)
        return
    try:
        resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
        log.info("open-file limit raised from %d to %d", soft, hard)
    except (OSError, ValueError) as e:
        log.warning("cannot raise the open-file limit from %d to %d: %s", soft, hard, e)


def deadline_skew(ms: int) -> Optional[float]:
    """Server(deadline_skew=) for --deadline-skew-ms: 0 the default, negative no check (as
    ctl-storage-unit reads it)."""
    if ms < 0:
        return None
    return (ms or DEFAULT_DEADLINE_SKEW_MS) / 1000.0


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> Any:  # usage errors: exit 2, as getopt's
        self.print_usage(sys.stderr)
        sys.stderr.write(f"{PROG}: {message}\n")
        sys.exit(2)


def _size_arg(name: str, positive: bool = True, most: Optional[int] = None,
              what: str = "a positive size") -> Any:
    def parse(text: str) -> int:
        v = parse_size(text)
        if v is None or (positive and v == 0) or (most is not None and v > most):
            raise argparse.ArgumentTypeError(f"{name} '{text}' is not {what}")
        return v
    return parse


def default_max_connections() -> int:
    """The default --max-connections, as the C unit's: the open-file limit less a reserve for
    the unit's own files (spill files, its sockets, connections still in their handshake), so
    that idle connections never take the last descriptor; 0 (no cap) when there is no limit."""
    soft, _hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft == resource.RLIM_INFINITY or soft > 2 ** 32 - 1:
        return 0
    reserve = 64 if soft > 256 else soft // 4
    return max(1, soft - reserve)


def _skew_arg(text: str) -> int:
    if not re.fullmatch(r"-?[0-9]{1,10}", text):
        raise argparse.ArgumentTypeError(f"--deadline-skew-ms '{text}' is not a number of "
                                         "milliseconds (negative: no check)")
    v = int(text)
    if not -2 ** 31 <= v < 2 ** 31:
        raise argparse.ArgumentTypeError(f"--deadline-skew-ms '{text}' is not a number of "
                                         "milliseconds (negative: no check)")
    return v


def parse_args(argv: List[str]) -> argparse.Namespace:
    ap = _Parser(prog=PROG, description="Serve one storage unit (idl/storage.idl) until SIGINT "
                 "or SIGTERM. The first line of stdout is the bound endpoint.")
    ap.add_argument("--module-dir", metavar="DIR",
                    help="where storage_ctl.py is (ctlrpc-gen --lang python idl/storage.idl "
                         "-o DIR; the build writes build/examples/python); default: PYTHONPATH")
    ap.add_argument("--bind", metavar="ENDPOINT",
                    help="tcp://host:port; port 0 or * picks a free one (default "
                         "tcp://<node ip>:0; $CTLRPC_NODE_IP sets the node ip)")
    ap.add_argument("--capacity", metavar="BYTES", default=DEFAULT_CAPACITY,
                    type=_size_arg("--capacity", False, what="a size (e.g. 1048576, 64M, 1G)"),
                    help="bytes held in memory, e.g. 64M, 1G (default 1G)")
    ap.add_argument("--spill-dir", metavar="DIR",
                    help="write blobs that do not fit in memory here (created if missing; its "
                         "blob files are removed at shutdown) instead of refusing them")
    ap.add_argument("--max-msg-bytes", metavar="N", default=DEFAULT_MAX_MSG_BYTES,
                    type=_size_arg("--max-msg-bytes"),
                    help="largest request frame accepted: a put's blob is a little smaller "
                         "(default 64M)")
    ap.add_argument("--max-reply-bytes", metavar="N", default=None,
                    type=_size_arg("--max-reply-bytes"),
                    help="largest reply sent; a get asking for more is refused with a "
                         "Protocol error before its reply is built (default: --max-msg-bytes)")
    ap.add_argument("--max-key-bytes", metavar="N", default=DEFAULT_MAX_KEY_BYTES,
                    type=_size_arg("--max-key-bytes"),
                    help="longest key a put accepts (default 4K)")
    ap.add_argument("--index-capacity", metavar="N", default=DEFAULT_INDEX_CAPACITY,
                    type=_size_arg("--index-capacity"),
                    help="bytes of keys and bookkeeping kept, beside the blobs' bytes "
                         "(default 64M); a put that needs more is refused with UnitFull")
    ap.add_argument("--max-list-keys", metavar="N", default=DEFAULT_MAX_LIST_KEYS,
                    type=_size_arg("--max-list-keys", most=2 ** 32 - 1,
                                   what="a count from 1 to 4294967295"),
                    help="most keys one list reply carries (default 100000)")
    ap.add_argument("--drain-timeout", metavar="MS", default=5000,
                    type=_size_arg("--drain-timeout", False, most=2 ** 31 - 1,
                                   what="a number of milliseconds"),
                    help="on SIGINT/SIGTERM, keep answering the requests that have arrived "
                         "for at most this long (default 5000), then exit")
    ap.add_argument("--max-queued-replies", metavar="N", default=1000,
                    type=_size_arg("--max-queued-replies", most=2 ** 31 - 1,
                                   what="a count from 1 to 2147483647"),
                    help="replies held for a client that does not read them, per connection "
                         "(default 1000); further ones are dropped and counted")
    ap.add_argument("--max-queued-reply-bytes", metavar="BYTES", default=256 << 20,
                    type=_size_arg("--max-queued-reply-bytes"),
                    help="bytes of unread replies one connection may hold (counting replies "
                         "of 32K and more); its requests beyond are answered Busy "
                         "\"replies_unread\" without running (default 256M)")
    ap.add_argument("--handshake-timeout", metavar="MS", default=5000,
                    type=_size_arg("--handshake-timeout", True, most=2 ** 31 - 1,
                                   what="a positive number of milliseconds"),
                    help="close a connection that has not completed its handshake by then "
                         "(default 5000)")
    ap.add_argument("--heartbeat", metavar="MS", default=10000,
                    type=_size_arg("--heartbeat", True, most=2 ** 31 - 1,
                                   what="a positive number of milliseconds"),
                    help="send each connection a heartbeat this often and close one silent "
                         "for three of them (default 10000; every ZeroMQ client answers by "
                         "itself)")
    ap.add_argument("--max-connections", metavar="N", default=None,
                    type=_size_arg("--max-connections", False, most=2 ** 32 - 1,
                                   what="a count from 0 to 4294967295"),
                    help="refuse connections beyond N open at once, during their handshake "
                         "(logged, counted; default: the open-file limit less 64, less a quarter at 256 "
                         "or below; 0: no cap)")
    ap.add_argument("--max-connections-per-address", metavar="N", default=0,
                    type=_size_arg("--max-connections-per-address", most=2 ** 32 - 1,
                                   what="a count from 1 to 4294967295"),
                    help="the same for the connections of one IP address")
    ap.add_argument("--deadline-skew-ms", metavar="MS", default=0, type=_skew_arg,
                    help="skip, unanswered, a request whose caller's deadline (carried in its "
                         "id) passed more than MS ago: the clock skew allowed between hosts "
                         "(default 1000; 0: the default; negative: no check)")
    ap.add_argument("--no-describe", action="store_true",
                    help="answer the built-in op _describe with a Protocol error instead of "
                         "the service's IDL")
    ap.add_argument("--log-level", metavar="LEVEL", default="warn",
                    choices=["error", "warn", "info", "debug"],
                    help="error, warn, info or debug (default warn): log lines go to stderr")
    ap.add_argument("--curve-secret", metavar="FILE",
                    help="encrypt with CURVE: the unit's secret key (the file must not be "
                         "readable by others)")
    ap.add_argument("--curve-allow", metavar="FILE",
                    help="also require clients to hold one of the public keys listed in FILE")
    fleet = ap.add_argument_group("fleet (membership in etcd)")
    fleet.add_argument("--etcd", metavar="URL[,URL...]", default=os.environ.get("CTLRPC_ETCD"),
                       help="register in etcd at these endpoints, tried in order (default "
                            "$CTLRPC_ETCD; none: no registration)")
    fleet.add_argument("--service", metavar="NAME",
                       help="the service to register under (default the IDL's: storage)")
    fleet.add_argument("--namespace", metavar="NAME", default="default",
                       help="the fleet's namespace (default 'default')")
    fleet.add_argument("--unit-id", metavar="ID",
                       help="this unit's id (default <host>-<pid>-<8 hex digits>, new per start)")
    fleet.add_argument("--lease-ttl", metavar="SECONDS", type=_ttl_arg, default=10,
                       help="the registration's lease TTL, at least 2 (default 10): a killed "
                            "unit leaves the membership this long after")
    fleet.add_argument("--advertise", metavar="ENDPOINT",
                       help="the tcp://host:port clients dial (default the bound endpoint; "
                            "needed when binding a wildcard or behind NAT)")
    fleet.add_argument("--etcd-cacert", metavar="FILE",
                       help="check https:// etcd endpoints against this CA")
    fleet.add_argument("--etcd-cert", metavar="FILE", help="client certificate for etcd")
    fleet.add_argument("--etcd-key", metavar="FILE", help="its private key")
    fleet.add_argument("--etcd-user", metavar="NAME",
                       help="log in to etcd as this user, the password from "
                            "$CTLRPC_ETCD_PASSWORD")
    ap.add_argument("--gen-keys", metavar="PREFIX",
                    help="write a new key pair to PREFIX.key (secret, mode 0600) and "
                         "PREFIX.pub, then exit")
    args = ap.parse_args(argv)
    if args.curve_allow and not args.curve_secret:
        ap.error("--curve-allow needs --curve-secret")
    if not args.etcd:
        args.etcd = None
        for flag in ("service", "unit_id", "advertise", "etcd_cacert", "etcd_cert", "etcd_key",
                     "etcd_user"):
            if getattr(args, flag) is not None:
                ap.error(f"--{flag.replace('_', '-')} needs --etcd (or $CTLRPC_ETCD)")
    if (args.etcd_cert is None) != (args.etcd_key is None):
        ap.error("--etcd-cert and --etcd-key go together")
    return args


def _ttl_arg(text: str) -> int:
    try:
        v = int(text)
    except ValueError:
        v = 0
    if v < 2 or v > 2 ** 31 - 1:
        raise argparse.ArgumentTypeError(f"--lease-ttl '{text}' is not a whole number of "
                                         "seconds of at least 2")
    return v


def _import_modules(module_dir: Optional[str]) -> Any:
    """Import ctlrpc (PYTHONPATH, else runtime/python of this checkout) and storage_ctl
    (--module-dir, else PYTHONPATH)."""
    try:
        import ctlrpc  # noqa: F401
    except ImportError:
        here = os.path.dirname(os.path.abspath(__file__))
        sys.path.insert(0, os.path.join(here, "..", "..", "runtime", "python"))
        import ctlrpc  # noqa: F401
    if module_dir is not None:
        sys.path.insert(0, module_dir)
    import storage_ctl
    return storage_ctl


def reload_allowlist(server: Any, allow_file: Optional[str]) -> None:
    """SIGHUP: read the allowlist file again, for the handshakes from now on; a file that is
    refused leaves the old list in force. Logged either way, as the C unit does (warn for a
    reload, as it changes who is admitted; error for a refusal)."""
    if allow_file is None:
        log.warning("SIGHUP: no --curve-allow file to reload (nothing else is reloaded)")
        return
    try:
        n = server.set_allowlist(allow_file)
    except (OSError, ValueError) as e:
        log.error("SIGHUP: the allowlist was not reloaded, the old one stays in force: %s", e)
        return
    log.warning("SIGHUP: reloaded the allowlist %s: %d keys, for new handshakes (connections "
                "already admitted stay)", allow_file, n)


class _LogFormat(logging.Formatter):
    """The C unit's log lines: `2025-01-31T09:15:02.417Z warn component: message`, the time in
    UTC with milliseconds, the level as the C runtime names it (OPERATIONS.md, "Logs")."""

    LEVELS = {"WARNING": "warn", "CRITICAL": "error"}

    def __init__(self) -> None:
        super().__init__("%(asctime)s %(level)s %(name)s: %(message)s")

    def formatTime(self, record: logging.LogRecord, datefmt: Optional[str] = None) -> str:
        return (time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(record.created)) +
                ".%03dZ" % min(999, int(record.msecs)))

    def format(self, record: logging.LogRecord) -> str:
        record.level = self.LEVELS.get(record.levelname, record.levelname.lower())
        return super().format(record)


def main(argv: Optional[List[str]] = None) -> int:
    args = parse_args(sys.argv[1:] if argv is None else argv)
    level = {"error": logging.ERROR, "warn": logging.WARNING, "info": logging.INFO,
             "debug": logging.DEBUG}[args.log_level]
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(_LogFormat())
    logging.basicConfig(level=level, handlers=[handler])
    try:
        storage_ctl = _import_modules(args.module_dir)
    except ImportError as e:
        if e.name in ("zmq", "msgpack"):
            print(f"{PROG}: this Python ({sys.executable}) has no {e.name}: run the unit with "
                  "a python3 that has pyzmq and msgpack (Debian: python3-zmq python3-msgpack, "
                  "for /usr/bin/python3)", file=sys.stderr)
        else:
            print(f"{PROG}: cannot import the generated module storage_ctl or the runtime "
                  f"ctlrpc ({e}): generate it with `ctlrpc-gen --lang python idl/storage.idl -o "
                  "DIR` and pass --module-dir DIR, with runtime/python on PYTHONPATH",
                  file=sys.stderr)
        return 1
    import ctlrpc

    if args.gen_keys is not None:
        try:
            ctlrpc.keygen(args.gen_keys)
        except (OSError, ValueError) as e:
            print(f"{PROG}: {e}", file=sys.stderr)
            return 1
        print(f"wrote {args.gen_keys}.key (secret) and {args.gen_keys}.pub")
        return 0

    secret = allow = None
    try:
        if args.curve_secret is not None:
            secret = ctlrpc.curve.read_key(args.curve_secret, True)
        if args.curve_allow is not None:
            allow = ctlrpc.curve.read_allowlist(args.curve_allow)
            if not allow:
                raise ValueError(f"allowlist {args.curve_allow} lists no keys")
            if secret in allow:
                raise ValueError(f"allowlist {args.curve_allow}: key #{allow.index(secret) + 1} "
                                 f"is the unit's own secret key ({args.curve_secret}): an "
                                 "allowlist holds client public keys; make a new key pair for "
                                 "the unit, this secret is exposed")
    except (OSError, ValueError) as e:
        print(f"{PROG}: {e}", file=sys.stderr)
        return 2
    etcd = None
    if args.etcd is not None:
        try:
            etcd = ctlrpc.Etcd(args.etcd, cacert=args.etcd_cacert, cert=args.etcd_cert,
                               key=args.etcd_key, user=args.etcd_user)
            ctlrpc.directory.check_name("--service", args.service or storage_ctl.SERVICE)
            ctlrpc.directory.check_name("--namespace", args.namespace)
            if args.unit_id is not None:
                ctlrpc.directory.check_name("--unit-id", args.unit_id)
        except ValueError as e:
            print(f"{PROG}: {e}", file=sys.stderr)
            return 2

    raise_nofile_limit()
    # Signals are taken synchronously by this thread (sigwait below); block them before any
    # thread starts (the server's, ZeroMQ's) so none of them gets one.
    stop = {signal.SIGINT, signal.SIGTERM, signal.SIGHUP}
    signal.pthread_sigmask(signal.SIG_BLOCK, stop)

    try:
        store = Store(args.capacity, args.spill_dir, args.max_key_bytes, args.index_capacity,
                      args.max_list_keys)
    except OSError as e:
        log.error("%s", e)
        print(f"{PROG}: {e}", file=sys.stderr)
        return 1
    unit: Dict[str, Any] = {}
    handlers = build_handlers(storage_ctl, store, unit)
    lock = threading.Lock()
    options: Dict[str, Any] = {"lock": lock, "max_msg_bytes": args.max_msg_bytes,
                               "describe": not args.no_describe,
                               "max_reply_bytes": args.max_reply_bytes,
                               "max_queued_replies": args.max_queued_replies,
                               "max_queued_reply_bytes": args.max_queued_reply_bytes,
                               "handshake_timeout": args.handshake_timeout / 1000.0,
                               "heartbeat": args.heartbeat / 1000.0,
                               "max_connections": default_max_connections()
                               if args.max_connections is None else args.max_connections,
                               "max_connections_per_address": args.max_connections_per_address,
                               "deadline_skew": deadline_skew(args.deadline_skew_ms)}
    if secret is not None:
        options["curve_secret"] = secret
    if allow is not None:
        options["curve_allow"] = allow
    # Hold the lock until unit["server"] is set: a request that arrives at once waits for it.
    with lock:
        try:
            server = storage_ctl.serve(handlers, args.bind, **options)
        except (OSError, ValueError) as e:
            print(f"{PROG}: {e}", file=sys.stderr)
            store.close()
            return 1
        unit["server"] = server
        if etcd is not None:
            try:
                # Registers on its own thread: an etcd that is away does not stop the unit.
                server.register(etcd, service=args.service, namespace=args.namespace,
                                unit_id=args.unit_id, lease_ttl=args.lease_ttl,
                                advertise=args.advertise)
            except ValueError as e:
                print(f"{PROG}: {e}", file=sys.stderr)
                server.close()
                store.close()
                return 2
    print(server.endpoint, flush=True)
    log.info("serving %s on %s", storage_ctl.SERVICE, server.endpoint)
    if server.registration is not None:
        log.info("registering as %s in etcd %s", server.registration.key, etcd)

    sig = signal.sigwait(stop)
    while sig == signal.SIGHUP:
        reload_allowlist(server, args.curve_allow)
        sig = signal.sigwait(stop)
    log.info("%s, shutting down", signal.Signals(sig).name)
    # Answer what has arrived (bounded by --drain-timeout), then stop.
    server.drain(args.drain_timeout / 1000.0)
    st = server.stats()
    log.info("stopped after %d requests, %d replies", st["requests"], st["replies"])
    with lock:
        store.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
