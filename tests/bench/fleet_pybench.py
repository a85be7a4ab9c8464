"""fleet_pybench.py: membership in etcd from Python, measured against a private etcd.

    fleet_pybench.py [--quick] [--units N] [--ttl SECONDS] [--rounds R] [--window SECONDS]

Starts its own etcd (tests/python/fleet_support.py: 127.0.0.1, free ports, a temporary data
directory), registers N units with ctlrpc.Registration (one lease and one keepalive thread per
unit, as N unit processes would; started 100 at a time), then measures, in the same run:

- list: ctlrpc.directory.list_units of the N units, and `etcdctl get --prefix` of the same keys
  (the etcdctl figure includes starting the process; `etcdctl` with `-w json` alone is also
  shown); median of R rounds each;
- Directory: constructing a ctlrpc.Directory (its first listing, thread started);
- appear: from a new Registration's constructor to a watching Directory's callback with it;
- expire: from a unit that stops without revoking (as a SIGKILL does) to its removal from the
  watching Directory (bounded by the TTL: etcd expires leases on its own clock);
- keepalives: the lease renewals etcd counted (etcd_debugging_lease_renewed_total) over a
  window, per second, beside the expected N / (TTL / 3).

Prints one line per figure, and exits 0; a figure it could not take is an error (exit 1).
`--quick` (ctest fleet_pybench_quick) is a smoke run of 50 units with no thresholds.
"""

import argparse
import logging
import os
import re
import statistics
import subprocess
import sys
import threading
import time
import urllib.request

HERE = os.path.dirname(os.path.abspath(__file__))
TOP = os.path.normpath(os.path.join(HERE, "..", ".."))
sys.path.insert(0, os.path.join(TOP, "tests", "python"))
sys.path.insert(0, os.path.join(TOP, "runtime", "python"))

import ctlrpc  # noqa: E402
from ctlrpc import directory as cdir  # noqa: E402

import fleet_support as fs  # noqa: E402


def ms(seconds):
    return f"{seconds * 1000:.1f} ms"


def renewed(url):
    with urllib.request.urlopen(url + "/metrics", timeout=5) as r:
        text = r.read().decode()
    m = re.search(r"^etcd_debugging_lease_renewed_total (\S+)$", text, re.M)
    return float(m.group(1)) if m else 0.0


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--units", type=int, default=1000)
    ap.add_argument("--ttl", type=int, default=10)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--window", type=float, default=10.0)
    ap.add_argument("--quick", action="store_true")
    a = ap.parse_args()
    if a.quick:
        a.units, a.rounds, a.window = 50, 2, 2.0
    # One line per unit when etcd is slow to answer a burst would drown the figures.
    logging.getLogger("ctlrpc").setLevel(logging.ERROR)
    status = fs.without_etcd("fleet_pybench.py")
    if status is not None:
        return status
    tmp = fs.TempDir()
    etcd = fs.Etcd(tmp.path)
    regs = []
    try:
        t0 = time.monotonic()
        for i in range(a.units):
            regs.append(ctlrpc.Registration(etcd.url, "bench",
                                            f"tcp://10.0.{i // 250}.{i % 250}:4100",
                                            unit_id=f"u{i:05d}", lease_ttl=a.ttl))
            if len(regs) % 100 == 0 or len(regs) == a.units:
                fs.wait_until(lambda: all(r.registered for r in regs),
                              f"{len(regs)} registrations", 60)
        t_registered = time.monotonic()
        print(f"register   {a.units} units (lease + put each): {time.monotonic() - t0:.2f} s")

        lists, ctls, dirs = [], [], []
        for _ in range(a.rounds):
            t = time.monotonic()
            got = cdir.list_units(etcd.url, "bench")
            lists.append(time.monotonic() - t)
            assert len(got.units) == a.units, len(got.units)
            t = time.monotonic()
            subprocess.run([fs.ETCDCTL, "--endpoints", etcd.url, "get", "--prefix",
                            "/ctlrpc/v1/default/bench/"], stdout=subprocess.DEVNULL, check=True,
                           timeout=60)
            ctls.append(time.monotonic() - t)
            t = time.monotonic()
            d = ctlrpc.Directory(etcd.url, "bench")
            dirs.append(time.monotonic() - t)
            assert len(d.units()) == a.units
            d.close()
        print(f"list       {a.units} units: list_units {ms(statistics.median(lists))}, "
              f"etcdctl get --prefix {ms(statistics.median(ctls))} (process start included), "
              f"Directory() {ms(statistics.median(dirs))}  [median of {a.rounds}]")

        seen = {}
        closing = set()
        cond = threading.Condition()

        def changed(units):
            now = time.monotonic()
            with cond:
                present = {u.unit_id for u in units}
                for uid in present:
                    seen.setdefault(("in", uid), now)
                for uid in closing - present:
                    seen.setdefault(("out", uid), now)
                cond.notify_all()

        d = ctlrpc.Directory(etcd.url, "bench", on_change=changed)
        appear = []
        extra = []
        for i in range(a.rounds * 4):
            uid = f"new{i:03d}"
            t = time.monotonic()
            extra.append(ctlrpc.Registration(etcd.url, "bench", "tcp://10.9.9.9:4100",
                                             unit_id=uid, lease_ttl=2))
            with cond:
                assert cond.wait_for(lambda: ("in", uid) in seen, 10), uid
                appear.append(seen[("in", uid)] - t)
        print(f"appear     registration -> watching directory: median "
              f"{ms(statistics.median(appear))}, max {ms(max(appear))}  [{len(appear)} units]")
        gone = []
        for r in extra[:a.rounds]:
            with cond:
                closing.add(r.unit_id)
            t = time.monotonic()
            r.close(revoke=False)  # what SIGKILL leaves: a lease nobody renews
            with cond:
                assert cond.wait_for(lambda: ("out", r.unit_id) in seen, 10), r.unit_id
                gone.append(seen[("out", r.unit_id)] - t)
        print(f"expire     stop without revoke (TTL 2 s) -> removed: median "
              f"{statistics.median(gone):.2f} s, max {max(gone):.2f} s  [{len(gone)} units]")
        for r in extra[a.rounds:]:
            r.close()
        d.close()

        # Steady state: every unit has renewed at least once (a period is TTL/3), then a window
        # of whole periods.
        period = a.ttl / 3.0
        fs.wait_until(lambda: time.monotonic() - t_registered > period, "a keepalive period",
                      period + 1)
        window = max(a.window, period * 3)
        r0, t = renewed(etcd.url), time.monotonic()
        time.sleep(window)  # the measuring window itself: the figure is a rate over it
        rate = (renewed(etcd.url) - r0) / (time.monotonic() - t)
        live = sum(1 for r in regs if r.registered)
        again = sum(r.registrations - 1 for r in regs)
        print(f"keepalive  {a.units} units, TTL {a.ttl} s: {rate:.0f} renewals/s on etcd "
              f"(expected {a.units / (a.ttl / 3):.0f}/s: one per unit every TTL/3); "
              f"{live} registered at the end, {again} leases lost and registered again")
    finally:
        for r in regs:
            r._stop.set()
            r._kick.set()
        etcd.close()
        tmp.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
