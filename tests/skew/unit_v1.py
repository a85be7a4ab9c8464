#!/usr/bin/env python3
"""unit_v1.py - a storage unit of the first release in Python, for the skew tests.

    unit_v1.py --module-dir DIR [--bind ENDPOINT] [--capacity BYTES] [--kwargs]

Serves tests/skew/storage_v1.idl (list(prefix) without paging, stats without the index fields)
on the module `ctlrpc-gen --lang python tests/skew/storage_v1.idl -o DIR` writes
(`DIR/storage_ctl.py`, named after the service; the build puts it in build/tests/skew/python),
loaded here as `storage_v1_ctl`. The generated server checks
every request against that IDL, so an argument the first release did not have (`after`,
`limit`) is a Protocol error naming it: "op 'list': arg limit: not an arg of list".

With --kwargs the unit does what the reference design's Python units do instead: no checking
against the IDL, the args map handed to the handler as keyword arguments, so an unknown one
fails in Python and comes back as a Protocol error saying "list() got an unexpected keyword
argument 'limit'". Clients must recognise both wordings.

Prints its bound endpoint as the first line of stdout and serves until SIGINT or SIGTERM.
"""

import argparse
import importlib.util
import os
import signal
import sys
import threading

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "..", "runtime", "python"))

import ctlrpc  # noqa: E402


class Store:
    """The first release's storage service: blobs in memory up to a capacity, nothing else."""

    def __init__(self, capacity):
        self.capacity = capacity
        self.blobs = {}
        self.pinned = set()
        self.server = None

    def _missing(self, keys):
        gone = [k for k in keys if k not in self.blobs]
        if gone:
            raise ctlrpc.Missing(f"{len(gone)} of {len(keys)} keys are not on this unit",
                                 blobs=gone)

    def put(self, key, data, pin=False):
        if key in self.pinned:
            raise ctlrpc.Busy(f"blob '{key}' is pinned", reason="pinned")
        held = sum(len(v) for k, v in self.blobs.items() if k != key)
        if held + len(data) > self.capacity:
            raise ctlrpc.UnitFull(f"{len(data)} bytes do not fit ({held} of {self.capacity} "
                                  "bytes held)")
        self.blobs[key] = bytes(data)
        if pin:
            self.pinned.add(key)
        else:
            self.pinned.discard(key)
        return len(data)

    def get(self, keys):
        self._missing(keys)
        return [self.blobs[k] for k in keys]

    def describe(self, keys):
        self._missing(keys)
        return [{"key": k, "size": len(self.blobs[k]), "pinned": k in self.pinned,
                 "spilled": False} for k in keys]

    def pin(self, keys):
        self._missing(keys)
        self.pinned.update(keys)
        return len(keys)

    def unpin(self, keys):
        self.pinned.difference_update(keys)

    def abort(self, keys):
        for k in keys:
            if k in self.blobs and k not in self.pinned:
                del self.blobs[k]

    def delete(self, keys):
        for k in keys:
            if k in self.pinned:
                raise ctlrpc.Busy(f"blob '{k}' is pinned", reason="pinned")
        gone = [k for k in keys if k in self.blobs]
        for k in gone:
            del self.blobs[k]
        return len(gone)

    def list(self, prefix=""):
        # Byte order, then length: the order of the keys' UTF-8 bytes.
        return sorted((k for k in self.blobs if k.startswith(prefix)),
                      key=lambda k: k.encode("utf-8"))

    def stats(self):
        st = self.server.stats() if self.server is not None else {}
        return {"blobs": len(self.blobs), "bytes": sum(len(v) for v in self.blobs.values()),
                "capacity": self.capacity, "pinned": len(self.pinned), "spilled": 0,
                "requests": st.get("requests", 0), "dropped": st.get("dropped", 0)}


def generated_handlers(mod, store):
    """The store behind the generated module's Handlers: typed, checked against the IDL."""

    class Handlers(mod.Handlers):
        def put(self, *, key, data, pin):
            return store.put(key, data, pin)

        def get(self, *, keys):
            return store.get(keys)

        def describe(self, *, keys):
            return [mod.BlobInfo(**info) for info in store.describe(keys)]

        def pin(self, *, keys):
            return store.pin(keys)

        def unpin(self, *, keys):
            store.unpin(keys)

        def abort(self, *, keys):
            store.abort(keys)

        def delete(self, *, keys):
            return store.delete(keys)

        def list(self, *, prefix):
            return store.list(prefix)

        def stats(self):
            return mod.UnitStats(**store.stats())

    return Handlers()


def kwargs_handlers(store):
    """The reference design's way: each handler called with the args map as keywords."""
    ops = ("put", "get", "describe", "pin", "unpin", "abort", "delete", "list", "stats")

    def bind(name):
        method = getattr(store, name)
        return lambda args: method(**args)

    return {name: bind(name) for name in ops}


def load_module(name, path):
    """The generated module at `path`, imported as `name` (today's has the same file name)."""
    spec = importlib.util.spec_from_file_location(name, path)
    mod = importlib.util.module_from_spec(spec)
    sys.modules[name] = mod  # before running it: its dataclasses look themselves up there
    spec.loader.exec_module(mod)
    return mod


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--module-dir", required=True,
                    help="where the v1 storage_ctl.py is (ctlrpc-gen --lang python)")
    ap.add_argument("--bind", default="tcp://127.0.0.1:*")
    ap.add_argument("--capacity", type=int, default=1 << 20)
    ap.add_argument("--kwargs", action="store_true",
                    help="hand args to the handlers as keyword arguments, unchecked")
    opts = ap.parse_args()
    mod = load_module("storage_v1_ctl", os.path.join(opts.module_dir, "storage_ctl.py"))

    stop = {signal.SIGINT, signal.SIGTERM}
    signal.pthread_sigmask(signal.SIG_BLOCK, stop)
    store = Store(opts.capacity)
    lock = threading.Lock()
    with lock:
        if opts.kwargs:
            server = ctlrpc.Server(kwargs_handlers(store), opts.bind,
                                   notify=("unpin", "abort"), lock=lock, name=mod.SERVICE)
        else:
            server = mod.serve(generated_handlers(mod, store), opts.bind, lock=lock)
        store.server = server
    print(server.endpoint, flush=True)
    signal.sigwait(stop)
    server.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
