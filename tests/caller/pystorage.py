"""A small storage unit in generated Python, for the caller's tests: generates `<service>_ctl.py`
from --idl with ctlrpc-gen --lang python, serves it with in-memory handlers, prints its endpoint
as its first line of stdout, and serves until SIGTERM.

    pystorage.py --gen GEN --idl IDL [--bind EP] [--capacity BYTES] [--no-describe]
                 [--curve-secret FILE [--curve-allow FILE]]

Every op of idl/storage.idl is implemented; so are an op `echo(text: str) -> str` and an op
`overflow(n: u32) -> u32 raises Overflow` (it always raises the declared kind Overflow, with a
reason), when the IDL has them (tests add them to a copy of storage.idl).
"""

import argparse
import importlib
import os
import signal
import subprocess
import sys
import tempfile

import ctlrpc


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--gen", required=True)
    ap.add_argument("--idl", required=True)
    ap.add_argument("--bind", default="tcp://127.0.0.1:0")
    ap.add_argument("--capacity", type=int, default=1 << 30)
    ap.add_argument("--no-describe", action="store_true")
    ap.add_argument("--curve-secret")
    ap.add_argument("--curve-allow")
    opts = ap.parse_args()

    out = tempfile.mkdtemp(prefix="pystorage-")
    subprocess.run([sys.executable, opts.gen, "--lang", "python", opts.idl, "-o", out,
                    "--display-root", os.path.dirname(os.path.abspath(opts.idl))], check=True)
    sys.path.insert(0, out)
    mod = importlib.import_module("storage_ctl")

    blobs = {}
    pinned = set()
    counts = {"requests": 0}

    def missing(keys):
        gone = [k for k in keys if k not in blobs]
        if gone:
            raise ctlrpc.Missing(f"{len(gone)} of {len(keys)} keys are not on this unit",
                                 blobs=gone)

    class Handlers(mod.Handlers):
        def put(self, *, key, data, pin):
            if key in pinned:
                raise ctlrpc.Busy(f"'{key}' is pinned", reason="pinned")
            used = sum(len(v) for k, v in blobs.items() if k != key)
            if used + len(data) > opts.capacity:
                raise ctlrpc.UnitFull(f"{len(data)} bytes do not fit")
            blobs[key] = bytes(data)
            if pin:
                pinned.add(key)
            return len(data)

        def get(self, *, keys):
            missing(keys)
            return [blobs[k] for k in keys]

        def describe(self, *, keys):
            missing(keys)
            return [mod.BlobInfo(key=k, size=len(blobs[k]), pinned=k in pinned, spilled=False)
                    for k in keys]

        def pin(self, *, keys):
            missing(keys)
            pinned.update(keys)
            return len(keys)

        def unpin(self, *, keys):
            pinned.difference_update(keys)

        def abort(self, *, keys):
            for k in keys:
                if k not in pinned:
                    blobs.pop(k, None)

        def delete(self, *, keys):
            if any(k in pinned for k in keys):
                raise ctlrpc.Busy("pinned", reason="pinned")
            n = sum(1 for k in keys if blobs.pop(k, None) is not None)
            return n

        def list(self, *, prefix, after, limit):
            keys = sorted(k for k in blobs if k.startswith(prefix) and k > after)
            return keys[:limit] if limit else keys

        def stats(self):
            return mod.UnitStats(blobs=len(blobs), bytes=sum(map(len, blobs.values())),
                                 capacity=opts.capacity, pinned=len(pinned), spilled=0,
                                 requests=counts["requests"], dropped=0)

        def echo(self, *, text):
            return text

        def overflow(self, *, n):
            raise mod.Overflow(f"{n} is more than this unit holds", reason="limit")

    kw = {}
    if opts.curve_secret:
        kw["curve_secret"] = opts.curve_secret
    if opts.curve_allow:
        kw["curve_allow"] = opts.curve_allow
    # SIGTERM and SIGINT are taken synchronously by this thread, blocked before any thread
    # starts: a handler set with signal.signal runs only once the main thread wakes, and a
    # signal that lands on another thread (after a SIGSTOP and SIGCONT, say) never wakes it.
    stop = {signal.SIGTERM, signal.SIGINT}
    signal.pthread_sigmask(signal.SIG_BLOCK, stop)
    server = mod.serve(Handlers(), opts.bind, describe=not opts.no_describe, **kw)
    print(server.endpoint, flush=True)
    signal.sigwait(stop)
    server.close()


if __name__ == "__main__":
    main()
