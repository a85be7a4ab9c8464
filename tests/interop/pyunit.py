"""A storage unit in Python, written from docs/PROTOCOL.md and docs/STORAGE.md alone.

    pyunit.py --bind tcp://127.0.0.1:0 [--capacity BYTES] [--spill-dir DIR]

Prints its bound endpoint as the first line of stdout and serves until
SIGINT or SIGTERM, then removes its spill files and exits 0. One ROUTER
socket, served from one thread, as the protocol describes.

Semantics are those of the storage service: blobs in memory up to
`capacity` bytes (an overwrite frees the old size first), a blob that does
not fit goes to the spill directory when one is set (files named by a
counter, never by the key) or fails with UnitFull; a pinned blob makes put
and delete fail with Busy "pinned" and survives abort; get, describe and pin
raise Missing naming every absent key (pin then pins nothing). Notify ops
(unpin, abort) are never answered. A payload that is not [str, str, any] is
dropped and counted; an unknown op or bad args (missing, unknown, or of the
wrong type) get a Protocol error naming the argument. A REQ-style peer
([identity, "", payload]) is answered with the delimiter.
"""

import argparse
import os
import signal
import sys

import msgpack
import zmq

REQUIRED = object()

# op -> (args: {name: (type, default)}, notify)
OPS = {
    "put": ({"key": ("str", REQUIRED), "data": ("bin", REQUIRED),
             "pin": ("bool", False)}, False),
    "get": ({"keys": ("list<str>", REQUIRED)}, False),
    "describe": ({"keys": ("list<str>", REQUIRED)}, False),
    "pin": ({"keys": ("list<str>", REQUIRED)}, False),
    "unpin": ({"keys": ("list<str>", REQUIRED)}, True),
    "abort": ({"keys": ("list<str>", REQUIRED)}, True),
    "delete": ({"keys": ("list<str>", REQUIRED)}, False),
    "list": ({"prefix": ("str", ""), "after": ("str", ""), "limit": ("u32", 0)}, False),
    "stats": ({}, False),
}


class Fail(Exception):
    """An error reply: kind, msg, and reason (Busy) or blobs (Missing)."""

    def __init__(self, kind, msg, reason=None, blobs=None):
        super().__init__(msg)
        self.kind, self.msg, self.reason, self.blobs = kind, msg, reason, blobs

    def error_map(self):
        return {"kind": self.kind, "msg": self.msg, "reason": self.reason,
                "blobs": self.blobs}


def type_ok(kind, v):
    if kind == "str":
        return isinstance(v, str)
    if kind == "bin":
        return isinstance(v, bytes)
    if kind == "bool":
        return isinstance(v, bool)
    if kind == "list<str>":
        return isinstance(v, list) and all(isinstance(x, str) for x in v)
    if kind == "u32":
        return isinstance(v, int) and not isinstance(v, bool) and 0 <= v < 2 ** 32
    raise AssertionError(kind)


def check_args(op, spec, args):
    if not isinstance(args, dict):
        raise Fail("Protocol", "op '%s': args must be a map" % op)
    out = {}
    for name in args:
        if name not in spec:
            raise Fail("Protocol", "op '%s': unknown arg %r" % (op, name))
    for name, (kind, default) in spec.items():
        if name in args:
            if not type_ok(kind, args[name]):
                raise Fail("Protocol", "op '%s': arg %s: expected %s" % (op, name, kind))
            out[name] = args[name]
        elif default is REQUIRED:
            raise Fail("Protocol", "op '%s': missing required arg '%s'" % (op, name))
        else:
            out[name] = default
    return out


class Blob:
    __slots__ = ("size", "pinned", "data", "spill_name")

    def __init__(self):
        self.size, self.pinned, self.data, self.spill_name = 0, False, None, None


class Store:
    def __init__(self, capacity, spill_dir):
        self.blobs = {}
        self.capacity = capacity
        self.bytes = 0
        self.spill_dir = spill_dir
        self.next_spill = 0
        self.requests = 0
        self.dropped = 0
        if spill_dir:
            os.makedirs(spill_dir, mode=0o700, exist_ok=True)

    # -- blobs ----------------------------------------------------------

    def _drop_data(self, b):
        if b.spill_name is not None:
            try:
                os.unlink(os.path.join(self.spill_dir, b.spill_name))
            except FileNotFoundError:
                pass
        else:
            self.bytes -= b.size
        b.data, b.spill_name = None, None

    def _spill(self, data):
        while True:
            name = "blob-%020d" % self.next_spill
            self.next_spill += 1
            try:
                fd = os.open(os.path.join(self.spill_dir, name),
                             os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
            except FileExistsError:
                continue  # not ours: leave it alone
            except OSError as e:
                raise Fail("Protocol", "spill file %s: %s" % (name, e.strerror))
            with os.fdopen(fd, "wb") as f:
                f.write(data)
            return name

    def _read(self, key, b):
        if b.spill_name is None:
            return b.data
        try:
            with open(os.path.join(self.spill_dir, b.spill_name), "rb") as f:
                data = f.read()
        except OSError as e:
            raise Fail("Protocol", "spill file for %r: %s" % (key, e.strerror))
        if len(data) != b.size:
            raise Fail("Protocol", "spill file for %r is truncated" % key)
        return data

    def _missing(self, keys):
        absent = [k for k in keys if k not in self.blobs]
        if absent:
            raise Fail("Missing", "%d of %d keys are not on this unit"
                       % (len(absent), len(keys)), blobs=absent)

    def close(self):
        for b in self.blobs.values():
            self._drop_data(b)
        self.blobs.clear()

    # -- ops --------------------------------------------------------------

    def put(self, key, data, pin):
        old = self.blobs.get(key)
        if old is not None and old.pinned:
            raise Fail("Busy", "blob is pinned; unpin it first", reason="pinned")
        base = self.bytes - (old.size if old is not None and old.spill_name is None else 0)
        spill_name = None
        if base + len(data) > self.capacity:
            if not self.spill_dir:
                raise Fail("UnitFull", "%d bytes do not fit: %d of %d bytes in use"
                           % (len(data), base, self.capacity))
            spill_name = self._spill(data)
        b = old
        if b is None:
            b = self.blobs[key] = Blob()
        else:
            self._drop_data(b)
        b.size = len(data)
        b.spill_name = spill_name
        if spill_name is None:
            b.data = bytes(data)
            self.bytes += len(data)
        if pin:
            b.pinned = True
        return len(data)

    def get(self, keys):
        self._missing(keys)
        return [self._read(k, self.blobs[k]) for k in keys]

    def describe(self, keys):
        self._missing(keys)
        return [{"key": k, "size": self.blobs[k].size, "pinned": self.blobs[k].pinned,
                 "spilled": self.blobs[k].spill_name is not None} for k in keys]

    def pin(self, keys):
        self._missing(keys)
        for k in keys:
            self.blobs[k].pinned = True
        return len(set(keys))

    def unpin(self, keys):
        for k in keys:
            if k in self.blobs:
                self.blobs[k].pinned = False

    def abort(self, keys):
        for k in keys:
            b = self.blobs.get(k)
            if b is not None and not b.pinned:
                self._drop_data(b)
                del self.blobs[k]

    def delete(self, keys):
        if any(k in self.blobs and self.blobs[k].pinned for k in keys):
            raise Fail("Busy", "a named blob is pinned; nothing was deleted",
                       reason="pinned")
        n = 0
        for k in set(keys):
            b = self.blobs.pop(k, None)
            if b is not None:
                self._drop_data(b)
                n += 1
        return n

    def list(self, prefix, after, limit):
        keys = sorted(k for k in self.blobs if k.startswith(prefix) and (not after or k > after))
        return keys[:limit] if limit else keys

    def stats(self):
        return {"blobs": len(self.blobs), "bytes": self.bytes,
                "capacity": self.capacity,
                "pinned": sum(1 for b in self.blobs.values() if b.pinned),
                "spilled": sum(1 for b in self.blobs.values() if b.spill_name is not None),
                "requests": self.requests, "dropped": self.dropped}


def serve_payload(store, payload):
    """The reply payload for one request payload, or None (dropped, or a
    notify)."""
    # Read the envelope's head first: once op and id are known, whatever is
    # wrong with the rest is answered (Protocol) rather than dropped.
    u = msgpack.Unpacker(raw=False)
    u.feed(payload)
    try:
        if u.read_array_header() != 3:
            raise ValueError("not an array of 3")
        op, rid = u.unpack(), u.unpack()
    except Exception:
        op = rid = None
    if not (isinstance(op, str) and isinstance(rid, str)):
        store.dropped += 1
        return None
    store.requests += 1
    entry = OPS.get(op)
    notify = entry is not None and entry[1]
    try:
        if entry is None:
            raise Fail("Protocol", "unknown op '%s' (service storage)" % op)
        try:
            args = u.unpack()
        except Exception:
            raise Fail("Protocol", "op '%s': args: truncated or not msgpack" % op)
        if u.tell() != len(payload):
            raise Fail("Protocol", "op '%s': %d trailing bytes after the message"
                       % (op, len(payload) - u.tell()))
        result = getattr(store, op)(**check_args(op, entry[0], args))
        reply = [rid, True, result]
    except Fail as f:
        reply = [rid, False, f.error_map()]
    except Exception as e:  # a bug here must not take the unit down
        reply = [rid, False, Fail("Protocol", "op '%s' failed: %s" % (op, e)).error_map()]
    if notify:
        return None
    return msgpack.packb(reply, use_bin_type=True)


def parse_size(text):
    units = {"": 0, "K": 10, "M": 20, "G": 30}
    t = text.upper().rstrip("B").rstrip("I")
    suffix = t[-1:] if t[-1:] in "KMG" else ""
    return int(t[:-1] if suffix else t) << units[suffix]


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--bind", default="tcp://127.0.0.1:0")
    ap.add_argument("--capacity", default="1G")
    ap.add_argument("--spill-dir")
    opts = ap.parse_args()

    stop = []
    signal.signal(signal.SIGTERM, lambda *_: stop.append(1))
    signal.signal(signal.SIGINT, lambda *_: stop.append(1))

    store = Store(parse_size(opts.capacity), opts.spill_dir)
    ctx = zmq.Context()
    router = ctx.socket(zmq.ROUTER)
    router.setsockopt(zmq.LINGER, 0)
    router.bind(opts.bind)
    print(router.getsockopt(zmq.LAST_ENDPOINT).decode(), flush=True)

    poller = zmq.Poller()
    poller.register(router, zmq.POLLIN)
    while not stop:
        try:
            if not poller.poll(100):
                continue
        except zmq.ZMQError:
            continue  # interrupted by a signal
        frames = router.recv_multipart()
        # [identity, payload], or REQ style [identity, "", payload]: the
        # reply goes back with the same envelope.
        if len(frames) == 2 or (len(frames) == 3 and frames[1] == b""):
            reply = serve_payload(store, frames[-1])
            if reply is not None:
                router.send_multipart(frames[:-1] + [reply])
        else:
            store.dropped += 1
    store.close()
    router.close(0)
    ctx.term()
    print("pyunit: stopped", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
