"""pybench.py - what the generated Python client costs over a minimal pyzmq + msgpack loop.

    pybench.py --unit PATH/ctl-storage-unit --module-dir DIR [--quick] [--rounds N]
               [--calls N] [--seconds S]

Starts one C storage unit (ctl-storage-unit, 127.0.0.1), stores one small blob, and measures in
the same run, in alternating rounds so that drift of the machine hits both sides alike:

- small call: `describe` of that one key, one call at a time, through the generated client
  (storage_ctl.Client, from `ctlrpc-gen --lang python idl/storage.idl`: argument checks, the
  runtime's socket pool, deadline, id check, the typed result, a BlobInfo) against a minimal
  hand-written loop on one DEALER socket that sends the very same bytes ([op, id, args] with a
  12-hex-digit id, `{"keys": ["k"]}`), waits for the reply, unpacks it, checks its id and ok
  flag and takes the result map. p50 and p99 of each, and the ratio of the medians;
- throughput: calls/s with 4 threads sharing one generated Client against 4 threads each with
  its own minimal loop (and socket).

Prints a table and exits 0 (no thresholds: docs/PERFORMANCE.md records the figures). Needs pyzmq,
msgpack and runtime/python on PYTHONPATH.
"""

from __future__ import annotations

import argparse
import itertools
import os
import platform
import select
import subprocess
import sys
import threading
import time
from typing import Any, Callable, List, Tuple

import msgpack
import zmq

KEY = "k"
DATA = b"0123456789abcdef"


def start_unit(unit: str) -> Tuple[subprocess.Popen[bytes], str]:
    proc = subprocess.Popen([unit, "--bind", "tcp://127.0.0.1:0", "--capacity", "64M"],
                            stdout=subprocess.PIPE)
    assert proc.stdout is not None
    fd = proc.stdout.fileno()
    buf = b""
    deadline = time.monotonic() + 20
    while not buf.endswith(b"\n"):
        if time.monotonic() > deadline or not select.select([fd], [], [], 1)[0] and \
                proc.poll() is not None:
            raise SystemExit("pybench: the unit did not print its endpoint")
        if select.select([fd], [], [], 0)[0]:
            chunk = os.read(fd, 1)
            if not chunk:
                raise SystemExit("pybench: the unit exited")
            buf += chunk
    return proc, buf.decode().strip()


class MinimalLoop:
    """The least a Python caller can do for the same call: one DEALER, msgpack both ways."""

    def __init__(self, ctx: zmq.Context[Any], address: str, start: int) -> None:
        self.sock = ctx.socket(zmq.DEALER)
        self.sock.setsockopt(zmq.LINGER, 0)
        self.sock.connect(address)
        self.ids = itertools.count(start)
        self.args = {"keys": [KEY]}

    def describe(self) -> Any:
        rid = format(next(self.ids) & 0xFFFFFFFFFFFF, "012x")
        self.sock.send(msgpack.packb(["describe", rid, self.args], use_bin_type=True))
        if not self.sock.poll(10000):
            raise RuntimeError("no reply")
        reply = msgpack.unpackb(self.sock.recv(), raw=False)
        if reply[0] != rid or reply[1] is not True:
            raise RuntimeError(f"bad reply {reply!r}")
        return reply[2]

    def close(self) -> None:
        self.sock.close()


def pct(sorted_ns: List[int], q: float) -> float:
    """The q-quantile of sorted samples, in microseconds."""
    i = min(len(sorted_ns) - 1, int(q * len(sorted_ns)))
    return sorted_ns[i] / 1000.0


def timed(fn: Callable[[], Any], n: int, out: List[int]) -> None:
    clock = time.perf_counter_ns
    for _ in range(n):
        t0 = clock()
        fn()
        out.append(clock() - t0)


def throughput(make: Callable[[], Callable[[], Any]], threads: int, seconds: float) -> float:
    """Calls/s of `threads` threads each calling its own `make()` for `seconds`."""
    counts = [0] * threads
    stop = threading.Event()
    ready = threading.Barrier(threads + 1)

    def run(i: int) -> None:
        fn = make()
        fn()  # connected and warm
        ready.wait()
        n = 0
        while not stop.is_set():
            fn()
            n += 1
        counts[i] = n

    ts = [threading.Thread(target=run, args=(i,)) for i in range(threads)]
    for t in ts:
        t.start()
    ready.wait()
    t0 = time.perf_counter()
    time.sleep(seconds)
    stop.set()
    for t in ts:
        t.join()
    return sum(counts) / (time.perf_counter() - t0)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--unit", required=True, help="ctl-storage-unit")
    ap.add_argument("--module-dir", required=True, help="where storage_ctl.py is")
    ap.add_argument("--quick", action="store_true", help="a smoke run: a few rounds")
    ap.add_argument("--rounds", type=int, default=20)
    ap.add_argument("--calls", type=int, default=2000, help="calls per round and side")
    ap.add_argument("--seconds", type=float, default=2.0, help="per throughput round")
    ap.add_argument("--threads", type=int, default=4)
    opts = ap.parse_args()
    if opts.quick:
        opts.rounds, opts.calls, opts.seconds = 2, 200, 0.3
    sys.path.insert(0, opts.module_dir)
    import storage_ctl

    proc, address = start_unit(opts.unit)
    ctx: zmq.Context[Any] = zmq.Context()
    try:
        client = storage_ctl.Client(timeout=10.0)
        client.put(address, key=KEY, data=DATA)
        want = client.describe(address, keys=[KEY])
        assert want[0].size == len(DATA), want
        loop = MinimalLoop(ctx, address, 1 << 40)
        assert loop.describe()[0]["size"] == len(DATA)

        def gen_call() -> Any:
            return client.describe(address, keys=[KEY])

        # Warm both up, then alternate rounds.
        timed(gen_call, opts.calls // 4 + 1, [])
        timed(loop.describe, opts.calls // 4 + 1, [])
        gen_ns: List[int] = []
        min_ns: List[int] = []
        round_ratios: List[float] = []
        for r in range(opts.rounds):
            g: List[int] = []
            m: List[int] = []
            first, second = ((gen_call, g), (loop.describe, m))[::1 if r % 2 else -1]
            timed(first[0], opts.calls, first[1])
            timed(second[0], opts.calls, second[1])
            round_ratios.append(pct(sorted(g), .5) / pct(sorted(m), .5))
            gen_ns += g
            min_ns += m
        gen_ns.sort()
        min_ns.sort()
        round_ratios.sort()

        shared = storage_ctl.Client(timeout=10.0)

        def make_gen() -> Callable[[], Any]:
            return lambda: shared.describe(address, keys=[KEY])

        loops: List[MinimalLoop] = []

        def make_min() -> Callable[[], Any]:
            lp = MinimalLoop(ctx, address, (len(loops) + 2) << 40)
            loops.append(lp)
            return lp.describe

        gen_tp: List[float] = []
        min_tp: List[float] = []
        tp_rounds = 2 if opts.quick else 4
        for r in range(tp_rounds):
            pair = [(make_gen, gen_tp), (make_min, min_tp)]
            for make, out in (pair if r % 2 else pair[::-1]):
                out.append(throughput(make, opts.threads, opts.seconds))
        for lp in loops:
            lp.close()
        shared.close()
        client.close()
        loop.close()
    finally:
        proc.terminate()
        proc.wait(20)
        ctx.term()

    g50, g99, m50, m99 = pct(gen_ns, .5), pct(gen_ns, .99), pct(min_ns, .5), pct(min_ns, .99)
    gtp, mtp = sorted(gen_tp)[len(gen_tp) // 2], sorted(min_tp)[len(min_tp) // 2]
    print(f"pybench: Python {platform.python_version()}, pyzmq {zmq.__version__}, "
          f"libzmq {zmq.zmq_version()}, msgpack {'.'.join(map(str, msgpack.version))}; "
          f"{os.cpu_count()} CPUs")
    print(f"small call (describe of one key) against ctl-storage-unit, {opts.rounds} "
          f"alternating rounds of {opts.calls} calls each side:")
    print(f"  {'':34} {'p50 us':>9} {'p99 us':>9}")
    print(f"  {'generated client (storage_ctl)':34} {g50:9.1f} {g99:9.1f}")
    print(f"  {'minimal pyzmq + msgpack loop':34} {m50:9.1f} {m99:9.1f}")
    print(f"  {'ratio':34} {g50 / m50:8.2f}x {g99 / m99:8.2f}x")
    print(f"  {'ratio of p50s, median of rounds':34} "
          f"{round_ratios[len(round_ratios) // 2]:8.2f}x   (rounds: "
          f"{round_ratios[0]:.2f}x to {round_ratios[-1]:.2f}x)")
    print(f"throughput, {opts.threads} threads, median of {tp_rounds // 2} rounds of "
          f"{opts.seconds:g} s each side:")
    print(f"  {'generated client, one shared':34} {gtp:9.0f} calls/s")
    print(f"  {'minimal loops, one per thread':34} {mtp:9.0f} calls/s")
    print(f"  {'ratio':34} {gtp / mtp:8.2f}x")
    return 0


if __name__ == "__main__":
    sys.exit(main())
