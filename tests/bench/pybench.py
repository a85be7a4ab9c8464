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
  its own minimal loop (and socket);
- async throughput: calls/s with 64 calls in flight from one asyncio loop: 64 tasks calling
  through the generated AsyncClient (storage_ctl.AsyncClient on ctlrpc.aio.Client) against the
  bare zmq.asyncio loop that keeps to the wire protocol as the client does, one request in
  flight per socket: 64 tasks, each sending on a zmq.asyncio DEALER of its own and awaiting the
  reply (ids checked, no deadline), the baseline of the ratio, as ctl-bench's 64 bare DEALERs are the C
  engine's. For information, two loops that break that rule: one zmq.asyncio DEALER keeping 64
  requests pipelined (send one for every reply), and 64 tasks awaiting their replies on one
  shared zmq.asyncio DEALER (a reader task hands replies out by id).

Prints a table and exits 0 (no thresholds: docs/PERFORMANCE.md records the figures). Needs pyzmq,
msgpack and runtime/python on PYTHONPATH.
"""

from __future__ import annotations

import argparse
import asyncio
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
import zmq.asyncio

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
        rid = _rid(next(self.ids))
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


IN_FLIGHT = 64


def _rid(n: int) -> str:
    """A request id as the clients make them: 12 hex digits, '@', the call's deadline (10 s from
    now, the loops' wait) on the wall clock in ms (docs/PROTOCOL.md, "Deadlines")."""
    return "%012x@%013d" % (n & 0xFFFFFFFFFFFF, int(time.time() * 1000) + 10000)


def _request(rid: str) -> bytes:
    return msgpack.packb(["describe", rid, {"keys": [KEY]}], use_bin_type=True)


async def async_generated(module: Any, address: str, seconds: float) -> float:
    """Calls/s of IN_FLIGHT tasks calling describe through one generated AsyncClient."""
    async with module.AsyncClient(timeout=10.0) as client:
        await asyncio.gather(*[client.describe(address, keys=[KEY]) for _ in range(IN_FLIGHT)])
        count = [0]
        stop = time.perf_counter() + seconds

        async def worker() -> None:
            while time.perf_counter() < stop:
                await client.describe(address, keys=[KEY])
                count[0] += 1
        t0 = time.perf_counter()
        await asyncio.gather(*[worker() for _ in range(IN_FLIGHT)])
        return count[0] / (time.perf_counter() - t0)


async def async_bare_dealers(actx: zmq.asyncio.Context, address: str, seconds: float,
                             start: int) -> float:
    """Calls/s of IN_FLIGHT tasks, each with a zmq.asyncio DEALER of its own and one request
    in flight on it (the wire protocol's rule, which the clients keep)."""
    ids = itertools.count(start)
    socks = []
    for _ in range(IN_FLIGHT):
        sock = actx.socket(zmq.DEALER)
        sock.setsockopt(zmq.LINGER, 0)
        sock.connect(address)
        socks.append(sock)

    async def call(sock: zmq.asyncio.Socket) -> Any:
        rid = _rid(next(ids))
        await sock.send(_request(rid))
        # No deadline: the leanest loop there is (a real client needs one, which costs a
        # timer; the AsyncClient's calls have theirs).
        reply = msgpack.unpackb(await sock.recv(), raw=False)
        if reply[0] != rid or reply[1] is not True:
            raise RuntimeError(f"bad reply {reply!r}")
        return reply[2]
    try:
        await asyncio.gather(*[call(s) for s in socks])
        count = [0]
        stop = time.perf_counter() + seconds

        async def worker(sock: zmq.asyncio.Socket) -> None:
            while time.perf_counter() < stop:
                await call(sock)
                count[0] += 1
        t0 = time.perf_counter()
        await asyncio.gather(*[worker(s) for s in socks])
        return count[0] / (time.perf_counter() - t0)
    finally:
        for sock in socks:
            sock.close()


async def async_bare_pipelined(actx: zmq.asyncio.Context, address: str, seconds: float,
                               start: int) -> float:
    """Calls/s of a bare zmq.asyncio loop keeping IN_FLIGHT requests in flight on one DEALER."""
    sock = actx.socket(zmq.DEALER)
    sock.setsockopt(zmq.LINGER, 0)
    sock.connect(address)
    ids = itertools.count(start)
    pending = set()

    def next_request() -> bytes:
        rid = _rid(next(ids))
        pending.add(rid)
        return _request(rid)
    try:
        for _ in range(IN_FLIGHT):
            await sock.send(next_request())
        for _ in range(IN_FLIGHT):  # warm: a round trip each
            reply = msgpack.unpackb(await sock.recv(), raw=False)
            pending.remove(reply[0])
            await sock.send(next_request())
        n = 0
        t0 = time.perf_counter()
        stop = t0 + seconds
        while time.perf_counter() < stop:
            reply = msgpack.unpackb(await sock.recv(), raw=False)
            pending.remove(reply[0])  # KeyError: a reply nobody asked for
            if reply[1] is not True:
                raise RuntimeError(f"bad reply {reply!r}")
            n += 1
            await sock.send(next_request())
        took = time.perf_counter() - t0
        while pending:  # collect what is still in flight before closing
            if not await sock.poll(10000):
                raise RuntimeError("no reply")
            pending.remove(msgpack.unpackb(await sock.recv(), raw=False)[0])
        return n / took
    finally:
        sock.close()


async def async_bare_tasks(actx: zmq.asyncio.Context, address: str, seconds: float,
                           start: int) -> float:
    """Calls/s of IN_FLIGHT tasks each awaiting its reply on one shared zmq.asyncio DEALER."""
    loop = asyncio.get_running_loop()
    sock = actx.socket(zmq.DEALER)
    sock.setsockopt(zmq.LINGER, 0)
    sock.connect(address)
    ids = itertools.count(start)
    waiting: dict = {}

    async def reader() -> None:
        while True:
            reply = msgpack.unpackb(await sock.recv(), raw=False)
            waiting.pop(reply[0]).set_result(reply)

    async def call() -> Any:
        rid = _rid(next(ids))
        fut = waiting[rid] = loop.create_future()
        await sock.send(_request(rid))
        reply = await asyncio.wait_for(fut, 10.0)
        if reply[1] is not True:
            raise RuntimeError(f"bad reply {reply!r}")
        return reply[2]

    task = asyncio.create_task(reader())
    try:
        await asyncio.gather(*[call() for _ in range(IN_FLIGHT)])
        count = [0]
        stop = time.perf_counter() + seconds

        async def worker() -> None:
            while time.perf_counter() < stop:
                await call()
                count[0] += 1
        t0 = time.perf_counter()
        await asyncio.gather(*[worker() for _ in range(IN_FLIGHT)])
        return count[0] / (time.perf_counter() - t0)
    finally:
        task.cancel()
        try:
            await task
        except asyncio.CancelledError:
            pass
        sock.close()


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

        actx = zmq.asyncio.Context()
        gen_async: List[float] = []
        dealers_async: List[float] = []
        bare_async: List[float] = []
        tasks_async: List[float] = []
        cpu_us: List[List[float]] = [[], [], [], []]
        async_rounds = 2 if opts.quick else 6
        for r in range(async_rounds):
            sides = [lambda: async_generated(storage_ctl, address, opts.seconds),
                     lambda: async_bare_dealers(actx, address, opts.seconds, (r + 24) << 40),
                     lambda: async_bare_pipelined(actx, address, opts.seconds, (r + 8) << 40),
                     lambda: async_bare_tasks(actx, address, opts.seconds, (r + 16) << 40)]
            outs = [gen_async, dealers_async, bare_async, tasks_async]
            order = [0, 1, 2, 3] if r % 2 else [1, 0, 3, 2]
            for i in order:
                c0, t0 = time.thread_time(), time.perf_counter()
                rate = asyncio.run(sides[i]())
                # The loop thread's CPU a call (the run's warm-up and set-up included).
                cpu_us[i].append((time.thread_time() - c0) * 1e6
                                 / (rate * (time.perf_counter() - t0)))
                outs[i].append(rate)
        actx.term()
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

    def median(xs: List[float]) -> float:
        return sorted(xs)[len(xs) // 2]
    ga, da, ba, ta = (median(gen_async), median(dealers_async), median(bare_async),
                      median(tasks_async))
    print(f"async throughput, {IN_FLIGHT} calls in flight from one asyncio loop, median of "
          f"{len(gen_async)} alternating rounds of {opts.seconds:g} s each side:")
    gc_, dc, bc, tc = (median(c) for c in cpu_us)
    print(f"  {'':40} {'calls/s':>9} {'loop CPU us/call':>17}")
    print(f"  {'generated AsyncClient, 64 tasks':40} {ga:9.0f} {gc_:17.1f}")
    print(f"  {'bare zmq.asyncio, 64 DEALERs (baseline)':40} {da:9.0f} {dc:17.1f}")
    print(f"  {'ratio to the baseline (target >= 0.80x)':40} {ga / da:8.2f}x")
    print(f"  {'ratio per round':40} "
          + " ".join(f"{g / d:.2f}x" for g, d in zip(gen_async, dealers_async)))
    print("  for information, loops with more than one request in flight on a socket:")
    print(f"  {'bare zmq.asyncio, one pipelining DEALER':40} {ba:9.0f} {bc:17.1f}")
    print(f"  {'bare zmq.asyncio, 64 tasks on one DEALER':40} {ta:9.0f} {tc:17.1f}")
    print(f"  {'ratio to the pipelining DEALER':40} {ga / ba:8.2f}x")
    print(f"  {'ratio to the 64 tasks on one DEALER':40} {ga / ta:8.2f}x")
    return 0


if __name__ == "__main__":
    sys.exit(main())
