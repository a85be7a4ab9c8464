#!/usr/bin/env python3
"""The hostile-peer suite: each attack against a running storage unit (the C ctl-storage-unit or
the Python unit.py, a child process on 127.0.0.1) while an honest client calls it in a loop.

    test_hostile.py --unit CMD --cli CTL-STORAGE [--sanitized] [--long]

For every attack it asserts what docs/RELIABILITY.md ("Security") promises, with the bound
computed from the unit's settings (SETTINGS below): the unit's RSS stays under the bound, the
honest client's calls keep being answered (p50 and timeouts are printed), new honest clients
connect during the connection attacks, a reply over the bound is refused before it is built
(the unit's peak RSS does not grow by it), and bad key and allowlist files are refused with
their messages. The attacks run on three kinds of unit:

  HostileTest         a plaintext unit: connection floods and the total cap, peers of a wrong
                      socket type, frames announced and not sent, a message never finished,
                      a message of many frames, replies over the bound, a peer that never reads
  PerAddressCapTest   a unit with --max-connections-per-address, attacked from a loopback
                      address of its own (127.0.0.2; skipped where it cannot be bound) while
                      the honest clients come from 127.0.0.1
  CurveAllowlistTest  a CURVE unit with an allowlist (keys made by ctlrpc.keygen), attacked by
                      strangers: a flood of connections and half handshakes with no key, a
                      valid key not on the list, and a NULL peer sending a message never
                      finished (refused at its greeting, so the unit holds none of it)

Everything is bounded in count and time; conditions are polled with deadlines, never slept on.
The short form (the default, run in CI) takes well under a minute per unit; CTL_HOSTILE_LONG=1
(or --long) makes each attack ten times larger and longer. Raw TCP speaks ZMTP 3.0 for the
attacks below the message level (a huge announced frame, a message never finished, a
handshake never finished); pyzmq for the rest.
"""

from __future__ import annotations

import argparse
import errno
import os
import re
import resource
import select
import shlex
import shutil
import signal
import socket
import struct
import subprocess
import sys
import tempfile
import threading
import time
import unittest
from typing import Any, Callable, Dict, List, Optional

import zmq

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.normpath(os.path.join(HERE, "..", ".."))
sys.path.insert(0, os.path.join(ROOT, "runtime", "python"))
import ctlrpc  # noqa: E402

MiB = 1 << 20
KiB = 1 << 10

# The unit's settings in every attack, and the bounds the docs derive from them.
SETTINGS = {
    "max_msg_bytes": 1 * MiB,
    "max_reply_bytes": 256 * KiB,
    "max_queued_replies": 32,
    "handshake_timeout_ms": 1000,
    "heartbeat_ms": 500,
    "max_connections": 300,
}
# What docs/RELIABILITY.md states a connection costs a unit at most (libzmq's buffers, its
# session and pipes, the runtime's bookkeeping), and a frame held in an unfinished message at
# most beyond its bytes (a zmq_msg_t and its allocation).
CONN_COST = 64 * KiB
FRAME_COST = 256
# Room for what the process allocates besides (the allocator's slack, the honest client's
# traffic, Python's own objects).
SLACK = 24 * MiB
# Where an attack must cost the unit nothing at all (a stranger refused at the handshake).
SMALL_SLACK = 8 * MiB
# The per-address cap of PerAddressCapTest, and the attacker's own loopback address.
PER_ADDRESS = 50
# The non-reading peer's unit: ZeroMQ's own count of queued replies, and a byte bound.
NON_READING_QUEUED = 1000
QUEUED_REPLY_BYTES = 1 * MiB
ATTACKER_ADDR = "127.0.0.2"

OPTS: argparse.Namespace


def unit_args(extra: List[str], cap: bool = True) -> List[str]:
    """The unit's command line: SETTINGS, then `extra`; without --max-connections when `cap`
    is false (the unit's own default)."""
    s = SETTINGS
    return (["--bind", "tcp://127.0.0.1:0", "--capacity", "64M", "--index-capacity", "16M",
             "--max-msg-bytes", str(s["max_msg_bytes"]),
             "--max-reply-bytes", str(s["max_reply_bytes"]),
             "--max-queued-replies", str(s["max_queued_replies"]),
             "--handshake-timeout", str(s["handshake_timeout_ms"]),
             "--heartbeat", str(s["heartbeat_ms"])]
            + (["--max-connections", str(s["max_connections"])] if cap else []) + extra)


def wait_for(cond: Callable[[], Any], timeout: float, what: str,
             explain: Optional[Callable[[], str]] = None) -> Any:
    """Poll `cond` until it is true, or fail naming `what` (and what `explain` says) after
    `timeout` seconds."""
    deadline = time.monotonic() + timeout
    while True:
        v = cond()
        if v:
            return v
        if time.monotonic() > deadline:
            more = f"; {explain()}" if explain else ""
            raise AssertionError(f"timed out after {timeout:.0f} s waiting for {what}{more}")
        time.sleep(0.02)  # polling interval, not a wait for correctness


class Unit:
    """A unit started as a child process; its stderr goes to a file read by `log()`."""

    def __init__(self, extra: List[str] = (), env: Optional[Dict[str, str]] = None,
                 client_opts: Optional[Dict[str, Any]] = None, cap: bool = True,
                 nofile: Optional[int] = None) -> None:
        self.client_opts = dict(client_opts or {})  # a CURVE unit's: its key, an allowed one
        self.errf = tempfile.TemporaryFile()
        e = dict(os.environ)
        e["PYTHONPATH"] = os.path.join(ROOT, "runtime", "python")
        e.update(env or {})
        def limit() -> None:  # in the child: its open-file limit, soft and hard
            if nofile is not None:
                resource.setrlimit(resource.RLIMIT_NOFILE, (nofile, nofile))
        self.proc = subprocess.Popen(shlex.split(OPTS.unit) + unit_args(list(extra), cap),
                                     stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                                     stderr=self.errf, env=e, preexec_fn=limit)
        ready, _, _ = select.select([self.proc.stdout], [], [], 30)
        line = self.proc.stdout.readline().decode().strip() if ready else ""
        if not line.startswith("tcp://"):
            self.proc.kill()
            self.proc.wait(10)
            raise AssertionError(f"the unit did not start: {line!r}; {self.log()}")
        self.endpoint = line
        self.host, self.port = "127.0.0.1", int(line.rsplit(":", 1)[1])
        self.client = ctlrpc.Client(timeout=5.0, **self.client_opts)

    def log(self) -> str:
        self.errf.seek(0)
        return self.errf.read().decode("utf-8", "replace")

    def status(self, field: str) -> int:
        with open(f"/proc/{self.proc.pid}/status") as f:
            for line in f:
                if line.startswith(field + ":"):
                    return int(line.split()[1]) * KiB
        return 0

    def rss(self) -> int:
        return self.status("VmRSS")

    def totals(self) -> Dict[str, Any]:
        return self.client.call(self.endpoint, "_stats", {}, 60.0)["totals"]

    def connections(self) -> int:
        """The open connections the unit has counted (0 when its own client's connection is
        refused over a cap)."""
        try:
            return int(self.totals()["connections"])
        except ctlrpc.Transfer as e:
            if e.cause != "refused":
                raise
            return 0

    def state(self) -> str:
        """The unit's counters and the end of its log, for a failure's message."""
        try:
            totals: Any = self.totals()
        except ctlrpc.Error as e:
            totals = f"(_stats failed: {e})"
        tail = self.log().strip().splitlines()[-5:]
        return f"the unit's totals {totals}; the end of its log: {tail}"

    def stop(self) -> None:
        self.client.close()
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(15)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(10)
        self.proc.stdout.close()
        self.errf.close()


class Honest:
    """An honest client calling `_health` in a loop on a thread of its own (one pooled
    connection), counting answers, timeouts and latencies. `client_opts` go to ctlrpc.Client
    (a CURVE unit's key and an allowed client's)."""

    def __init__(self, endpoint: str, timeout: float = 2.0, **client_opts: Any) -> None:
        self.endpoint = endpoint
        self.timeout = timeout
        self.lat: List[float] = []
        self.timeouts = 0
        self.failures: List[str] = []
        self._stop = threading.Event()
        self._client = ctlrpc.Client(timeout=timeout, **client_opts)
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.is_set():
            t0 = time.monotonic()
            try:
                self._client.call(self.endpoint, "_health", {}, self.timeout)
                self.lat.append(time.monotonic() - t0)
            except ctlrpc.Timeout:
                self.timeouts += 1
            except ctlrpc.Error as e:
                self.failures.append(str(e))
                self._stop.wait(0.05)

    def answered(self) -> int:
        return len(self.lat)

    def stop(self, name: str) -> None:
        self._stop.set()
        self._thread.join(self.timeout + 5)
        self._client.close()
        lat = sorted(self.lat)
        p50 = lat[len(lat) // 2] * 1000 if lat else float("nan")
        print(f"  {name}: honest calls answered {len(lat)}, p50 {p50:.1f} ms, timeouts "
              f"{self.timeouts}, other failures {len(self.failures)}", file=sys.stderr)


def fresh_call(endpoint: str, timeout: float = 5.0, **client_opts: Any) -> None:
    """A new client (a new connection) calls once: it must be answered."""
    with ctlrpc.Client(timeout=timeout, **client_opts) as c:
        c.call(endpoint, "_health", {}, timeout)


# ---- raw ZMTP 3.0 -------------------------------------------------------------------------------

def zmtp_greeting(mechanism: bytes = b"NULL") -> bytes:
    return (b"\xff" + b"\0" * 8 + b"\x7f" + b"\x03\x00" + mechanism.ljust(20, b"\0") + b"\0"
            + b"\0" * 31)


def zmtp_ready(socket_type: bytes = b"DEALER") -> bytes:
    body = b"\x05READY" + b"\x0bSocket-Type" + struct.pack(">I", len(socket_type)) + socket_type
    return b"\x04" + bytes([len(body)]) + body


def zmtp_frame_header(size: int, more: bool) -> bytes:
    if size < 256:
        return bytes([0x01 if more else 0x00, size])
    return bytes([0x03 if more else 0x02]) + struct.pack(">Q", size)


def raw_dealer(unit: Unit, timeout: float = 10.0) -> socket.socket:
    """A TCP connection that has done a NULL handshake as a DEALER (read the unit's greeting
    and READY)."""
    s = socket.create_connection((unit.host, unit.port), timeout=timeout)
    s.sendall(zmtp_greeting() + zmtp_ready())
    got = b""
    deadline = time.monotonic() + timeout
    while len(got) < 64 + 2 or len(got) < 64 + 2 + got[65]:
        if time.monotonic() > deadline:
            raise AssertionError("the unit's handshake did not come")
        chunk = s.recv(4096)
        if not chunk:
            raise AssertionError("the unit closed a raw DEALER during its handshake")
        got += chunk
    return s


def closed_by_peer(s: socket.socket) -> bool:
    """Whether the unit has closed this connection (EOF or reset), without blocking."""
    try:
        r, _, _ = select.select([s], [], [], 0)
        if not r:
            return False
        while True:
            data = s.recv(65536, socket.MSG_DONTWAIT)
            if not data:
                return True
    except BlockingIOError:
        return False
    except OSError:
        return True


# ---- the attacks ---------------------------------------------------------------------------------

class UnitUnderAttack(unittest.TestCase):
    """A unit started with unit_args() and `unit_extra()`, an honest client calling it in a
    loop, and what every attack asserts; the attacks are in the subclasses."""
    scale = 1
    cap = True  # start the unit with SETTINGS' --max-connections (False: its default)
    nofile: Optional[int] = None  # the unit's open-file limit (None: this process's)

    def unit_extra(self) -> List[str]:
        return []

    def client_opts(self) -> Dict[str, Any]:
        """What a client of this unit passes to ctlrpc.Client (a CURVE unit's keys)."""
        return {}

    def setUp(self) -> None:
        # Cleanups, not tearDown: they run even when setUp fails half-way (no unit is left).
        self.unit = Unit(self.unit_extra(), client_opts=self.client_opts(), cap=self.cap,
                         nofile=self.nofile)
        self.addCleanup(self.unit.stop)
        self.honest = Honest(self.unit.endpoint, **self.client_opts())
        self.addCleanup(self.honest.stop, self.id().rsplit(".", 1)[-1])
        wait_for(lambda: self.honest.answered() > 0, 30, "the honest client's first answer")
        self.base_rss = self.unit.rss()

    def assert_rss(self, bound: int, what: str) -> None:
        rss = self.unit.rss()
        print(f"  {what}: RSS {rss / MiB:.1f} MiB (started at {self.base_rss / MiB:.1f}, "
              f"bound {bound / MiB:.1f})", file=sys.stderr)
        if not OPTS.sanitized:  # a sanitizer's shadow memory is no part of the bound
            self.assertLessEqual(rss, bound, f"{what}: RSS over the documented bound")

    def assert_answering(self, since: int, what: str) -> None:
        wait_for(lambda: self.honest.answered() > since, 30,
                 f"the honest client to be answered during {what}")

    def await_refusal(self, pattern: str, what: str) -> None:
        """Wait for the unit to log a refusal matching `pattern` after a burst of connections
        past a cap: its ZAP handler reads the monitor's waiting events before judging, so the
        burst cannot pass the cap however far the monitor's thread is behind."""
        wait_for(lambda: re.search(pattern, self.unit.log()) is not None, 30,
                 f"the unit to log a refusal of {what}", self.unit.state)


class HostileTest(UnitUnderAttack):
    """The attacks on a plaintext unit with the settings above."""

    def test_connection_flood(self) -> None:
        """Silent TCP connections and half handshakes, up to the cap: new honest clients still
        connect and are answered; the silent ones are reaped within the handshake timeout."""
        n = min(SETTINGS["max_connections"] - 20, 100 * self.scale)
        socks = []
        try:
            for i in range(n):
                s = socket.create_connection((self.unit.host, self.unit.port), timeout=10)
                if i % 2:
                    s.sendall(zmtp_greeting()[:20])  # a handshake begun, never finished
                socks.append(s)
            before = self.honest.answered()
            for _ in range(3):
                fresh_call(self.unit.endpoint)
            self.assert_answering(before, "a connection flood")
            self.assert_rss(self.base_rss + n * CONN_COST + SLACK, "connection flood")
            # Reaped: every one of them is closed by the unit within the handshake timeout.
            wait_for(lambda: all(closed_by_peer(s) for s in socks),
                     SETTINGS["handshake_timeout_ms"] / 1000 + 15,
                     "the unit to close connections that never finished their handshake")
        finally:
            for s in socks:
                s.close()

    def test_connection_cap(self) -> None:
        """More idle ZeroMQ connections than max_connections: the ones beyond are refused
        (ZAP status 500, logged), the honest pooled client is still answered, and once the
        attacker leaves new clients connect."""
        cap = SETTINGS["max_connections"]
        self.unit.totals()  # the unit's own client connects before the cap is reached
        ctx = zmq.Context()
        socks = []

        def dial() -> None:
            d = ctx.socket(zmq.DEALER)
            d.setsockopt(zmq.LINGER, 0)
            d.setsockopt(zmq.RECONNECT_IVL, 5000)
            d.connect(self.unit.endpoint)
            socks.append(d)
        try:
            for _ in range(cap + 20):
                dial()
            self.await_refusal(r"refused a connection from 127\.0\.0\.1: \d+ connections are "
                               r"open \(max_connections %d\)" % cap,
                               "connections over max_connections")
            before = self.honest.answered()
            self.assert_answering(before, "connections at the cap")
            self.assert_rss(self.base_rss + (cap + 20) * CONN_COST + SLACK, "connection cap")
        finally:
            for d in socks:
                d.close(0)
            ctx.term()
        # Read once the attacker has left: a new connection (the unit's own client's first)
        # is refused over the cap like the attacker's until the unit has seen them close.
        def attacker_gone() -> bool:
            try:
                return self.unit.totals()["connections"] < 20
            except ctlrpc.Transfer as e:
                if e.cause != "refused":
                    raise
                return False
        wait_for(attacker_gone, 30, "the attacker's connections to close")
        self.assertGreater(self.unit.totals()["conn_refused"], 0,
                           "_stats totals count the connections refused over the cap")
        fresh_call(self.unit.endpoint)

    def test_wrong_socket_type(self) -> None:
        """Peers announcing a ZMTP socket type a ROUTER does not talk to are refused, counted
        in handshake_failures and logged (one line a second at most). Raw peers: a ZeroMQ
        socket of a wrong type refuses the unit too, and may leave first."""
        before = self.unit.totals()["handshake_failures"]
        socks = []
        try:
            for kind in (b"PUSH", b"PUB", b"PAIR"):
                s = socket.create_connection((self.unit.host, self.unit.port), timeout=10)
                s.sendall(zmtp_greeting() + zmtp_ready(kind))
                socks.append(s)
            wait_for(lambda: all(closed_by_peer(s) for s in socks), 30,
                     "the unit to close peers of a wrong socket type")
            wait_for(lambda: self.unit.totals()["handshake_failures"] >= before + 3, 30,
                     "three refused handshakes counted")
            # The address, unless the connection was gone before the monitor looked it up.
            self.assertRegex(self.unit.log(), r"refused a connection from (127\.0\.0\.1|an "
                             r"unknown address): its ZeroMQ socket type is not one a unit "
                             r"talks to \(a DEALER or REQ\)")
        finally:
            for s in socks:
                s.close()

    def test_huge_announced_frame(self) -> None:
        """Frames announcing max_msg_bytes (and more), a few bytes of each sent: RSS grows by
        what was sent, not by what was announced; the peers are closed by the heartbeat
        timeout; one announcing more than max_msg_bytes at once."""
        n = 20 * self.scale
        m = SETTINGS["max_msg_bytes"]
        over = raw_dealer(self.unit)
        over.sendall(zmtp_frame_header(m + 1, False))
        socks = [raw_dealer(self.unit) for _ in range(n)]
        try:
            for s in socks:
                s.sendall(zmtp_frame_header(m, False) + b"x" * 1000)
            wait_for(lambda: closed_by_peer(over), 15,
                     "the unit to close a peer announcing a frame over max_msg_bytes")
            before = self.honest.answered()
            self.assert_answering(before, "half frames")
            self.assert_rss(self.base_rss + n * (CONN_COST + 1000) + SLACK, "half frames")
            print(f"  half frames: address space {self.unit.status('VmSize') / MiB:.0f} MiB "
                  f"(at most {n} x max_msg_bytes beyond the start)", file=sys.stderr)
            timeout = 3 * SETTINGS["heartbeat_ms"] / 1000
            wait_for(lambda: all(closed_by_peer(s) for s in socks), timeout + 15,
                     "the heartbeat timeout to close peers stuck in a frame")
        finally:
            for s in socks + [over]:
                s.close()

    def test_unfinished_message(self) -> None:
        """A message whose last frame never comes: the unit holds its frames (ZeroMQ has no
        limit on a message's total size) within the documented cost per frame, keeps
        answering, and lets them go when the peer leaves."""
        frames = 20000 * self.scale
        size = 100
        socks = [raw_dealer(self.unit) for _ in range(2)]
        try:
            chunk = (zmtp_frame_header(size, True) + b"y" * size) * 1000
            for s in socks:
                for _ in range(frames // 1000):
                    s.sendall(chunk)
            sent = len(socks) * frames * size
            before = self.honest.answered()
            self.assert_answering(before, "an unfinished message")
            self.assert_rss(self.base_rss + len(socks) * (CONN_COST + frames * FRAME_COST)
                            + sent + SLACK, "unfinished message")
            self.assertEqual(self.unit.totals()["dropped"], 0)
        finally:
            for s in socks:
                s.close()

    def test_many_tiny_frames(self) -> None:
        """One whole message of many empty frames: dropped and counted, and the honest client
        is answered again soon after (the Python unit reads them a bounded number a turn)."""
        frames = 200000 * self.scale
        before_dropped = self.unit.totals()["dropped"]
        s = raw_dealer(self.unit)
        try:
            s.sendall(zmtp_frame_header(0, True) * (frames - 1) + zmtp_frame_header(0, False))
            wait_for(lambda: self.unit.totals()["dropped"] > before_dropped, 60,
                     "the message of many frames to be dropped and counted")
            before = self.honest.answered()
            self.assert_answering(before, "many tiny frames")
            self.assert_rss(self.base_rss + frames * FRAME_COST + SLACK, "many tiny frames")
        finally:
            s.close()

    def test_sighup_without_allowlist(self) -> None:
        """SIGHUP to a unit without --curve-allow: it says there is nothing to reload, and goes
        on serving (it used to die at once)."""
        self.unit.proc.send_signal(signal.SIGHUP)
        wait_for(lambda: "SIGHUP: no --curve-allow file to reload" in self.unit.log(), 30,
                 "the unit's line about SIGHUP")
        before = self.honest.answered()
        self.assert_answering(before, "a SIGHUP")
        self.assertIsNone(self.unit.proc.poll())

    def test_reply_bound(self) -> None:
        """A get whose reply would pass max_reply_bytes is refused with a Protocol error that
        says so, before the reply is built: the unit's peak RSS (VmHWM, which a reply built
        and freed between two looks would still raise) does not grow by it."""
        c = self.unit.client
        blob = b"z" * (100 * KiB)
        c.call(self.unit.endpoint, "put", {"key": "k", "data": blob})
        peak_before = self.unit.status("VmHWM")
        keys = ["k"] * 1000  # a 100 MB reply asked for: 400 times the bound, 4 times SLACK
        for _ in range(5):
            with self.assertRaises(ctlrpc.Transfer) as cm:
                c.call(self.unit.endpoint, "get", {"keys": keys})
            self.assertIn("larger than this unit's max_reply_bytes", str(cm.exception))
        self.assertEqual(len(c.call(self.unit.endpoint, "get", {"keys": ["k", "k"]})), 2)
        self.assert_rss(self.base_rss + len(blob) * 4 + SLACK, "replies over the bound")
        peak = self.unit.status("VmHWM")
        print(f"  replies over the bound: peak RSS {peak / MiB:.1f} MiB (before them "
              f"{peak_before / MiB:.1f})", file=sys.stderr)
        if not OPTS.sanitized:
            self.assertLessEqual(peak, peak_before + len(blob) * 4 + SLACK,
                                 "replies over the bound: peak RSS over the documented bound "
                                 "(was a reply built before it was refused?)")


class NonReadingPeerTest(UnitUnderAttack):
    """A peer that sends requests and never reads the replies, against a unit that would queue
    1000 replies a connection (ZeroMQ's own count) but only QUEUED_REPLY_BYTES of them."""

    def unit_extra(self) -> List[str]:
        return ["--max-queued-replies", str(NON_READING_QUEUED),
                "--max-queued-reply-bytes", str(QUEUED_REPLY_BYTES)]

    def test_non_reading_peer(self) -> None:
        """1000 gets of a 200 KiB blob (200 MB of replies) from a peer that reads nothing: the
        unit pins at most max_queued_reply_bytes + max_reply_bytes + max_queued_replies x 32
        KiB (plus the kernel's socket buffers); the gets past the byte bound are answered Busy
        "replies_unread" without running, and counted as Busy errors of `get`."""
        c = self.unit.client
        blob = b"w" * (200 * KiB)
        c.call(self.unit.endpoint, "put", {"key": "big", "data": blob})
        ctx = zmq.Context()
        d = ctx.socket(zmq.DEALER)
        d.setsockopt(zmq.LINGER, 0)
        d.setsockopt(zmq.RCVBUF, 4096)
        d.setsockopt(zmq.RCVHWM, 1)
        d.connect(self.unit.endpoint)
        try:
            from ctlrpc import _wire
            n = 1000 * self.scale
            for i in range(n):
                d.send(_wire.pack_request("get", f"r{i}", {"keys": ["big"]}))

            def busy() -> int:
                ops = self.unit.client.call(self.unit.endpoint, "_stats", {}, 60.0)["ops"]
                return int(ops["get"]["errors"]["Busy"])
            wait_for(lambda: self.unit.totals()["requests"] >= n, 60,
                     f"the unit to take the {n} gets", self.unit.state)
            self.assertGreater(busy(), 0, "gets past the byte bound answered Busy")
            before = self.honest.answered()
            self.assert_answering(before, "a non-reading peer")
            bound = (QUEUED_REPLY_BYTES + SETTINGS["max_reply_bytes"]
                     + NON_READING_QUEUED * 32 * KiB)
            self.assert_rss(self.base_rss + bound + len(blob) * 4 + SLACK, "non-reading peer")
        finally:
            d.close(0)
            ctx.term()


class DefaultCapTest(UnitUnderAttack):
    """A unit started without --max-connections, under an open-file limit of 256: it caps
    connections at that limit less a quarter (the reserve the storage units keep below 256
    files), so idle connections never take its last descriptor."""

    cap = False
    nofile = 256

    def test_default_connection_cap(self) -> None:
        """More idle connections than the default cap: the ones beyond are refused and logged
        with the cap the unit chose; honest clients are answered once the attacker leaves."""
        cap = self.nofile - self.nofile // 4
        ctx = zmq.Context()
        socks = []
        try:
            for _ in range(cap + 20):
                d = ctx.socket(zmq.DEALER)
                d.setsockopt(zmq.LINGER, 0)
                d.setsockopt(zmq.RECONNECT_IVL, 60000)
                d.connect(self.unit.endpoint)
                socks.append(d)
            self.await_refusal(r"refused a connection from 127\.0\.0\.1: \d+ connections are "
                               r"open \(max_connections %d\)" % cap,
                               "connections over the default max_connections")
            self.assertNotIn("Too many open files", self.unit.log())
        finally:
            for d in socks:
                d.close(0)
            ctx.term()
        wait_for(lambda: self.unit.connections() < 20, 60,
                 "the attacker's connections to close", self.unit.state)
        fresh_call(self.unit.endpoint)


class PerAddressCapTest(UnitUnderAttack):
    """--max-connections-per-address against an attacker on a loopback address of its own,
    127.0.0.2, while honest clients come from 127.0.0.1."""

    def unit_extra(self) -> List[str]:
        return ["--max-connections-per-address", str(PER_ADDRESS)]

    def setUp(self) -> None:
        try:
            with socket.socket() as s:
                s.bind((ATTACKER_ADDR, 0))
        except OSError as e:
            if e.errno != errno.EADDRNOTAVAIL:
                raise
            self.skipTest(f"this machine cannot bind {ATTACKER_ADDR} as a source address "
                          f"(EADDRNOTAVAIL), and the attacker needs an address of its own")
        super().setUp()

    def test_connection_cap_per_address(self) -> None:
        """The attacker opens max_connections_per_address ZeroMQ connections from 127.0.0.2
        (each answered once, so admitted), then 20 more: those are refused (ZAP status 500,
        logged with the address, counted in conn_refused) while its first ones stay open and
        answered; meanwhile new honest clients from 127.0.0.1 connect and are answered, and
        so is the pooled one."""
        from ctlrpc import _wire
        cap = PER_ADDRESS
        extra = 20 * self.scale
        endpoint = f"tcp://{ATTACKER_ADDR}:0;{self.unit.host}:{self.unit.port}"
        totals = self.unit.totals()
        refused_before, conns = totals["conn_refused"], totals["connections"]
        ctx = zmq.Context()
        socks: List[zmq.Socket] = []
        calls = iter(range(1 << 30))

        def dial(n: int, reconnect_ms: int) -> List[zmq.Socket]:
            new = []
            for _ in range(n):
                d = ctx.socket(zmq.DEALER)
                d.setsockopt(zmq.LINGER, 0)
                d.setsockopt(zmq.RECONNECT_IVL, reconnect_ms)
                d.connect(endpoint)
                socks.append(d)
                new.append(d)
            return new

        def ask(ds: List[zmq.Socket]) -> Callable[[], bool]:
            """Send `_health` on each; a condition true once every one has its answer."""
            pending = set(ds)
            for d in ds:
                d.send(_wire.pack_request("_health", f"a{next(calls)}", {}), zmq.NOBLOCK)

            def answered() -> bool:
                for d in list(pending):
                    if d.poll(0):
                        d.recv_multipart()
                        pending.discard(d)
                return not pending
            return answered
        try:
            # Up to the cap first, each answered: connections still in their handshake count
            # against the cap too, so a burst of cap + 20 could have any of them refused.
            # (One whose handshake timed out on a loaded machine dials again soon.)
            first = dial(cap, 250)
            wait_for(ask(first), 30, f"the attacker's first {cap} connections to be answered",
                     self.unit.state)
            dial(extra, 60000)
            # Over the cap once the unit counts more than `cap` from 127.0.0.2 (with the two
            # of 127.0.0.1: the honest client's and the unit's own client's).
            self.await_refusal(r"refused a connection from 127\.0\.0\.2: \d+ connections "
                               r"from that address are open \(max_connections_per_address "
                               r"%d\)" % cap,
                               "connections from 127.0.0.2 over max_connections_per_address")
            self.assertGreater(self.unit.totals()["conn_refused"], refused_before,
                               "_stats totals count the connections refused over the cap")
            # During the attack, its connections open: more than the cap in all, so a cap
            # counted over all addresses would refuse these.
            before = self.honest.answered()
            for _ in range(5):
                fresh_call(self.unit.endpoint)
            self.assert_answering(before, "an attack at the per-address cap")
            wait_for(ask(first), 30, "the attacker's first connections, still open, to be "
                     "answered again")
            self.assert_rss(self.base_rss + (cap + extra) * CONN_COST + SLACK,
                            "per-address cap")
        finally:
            for d in socks:
                d.close(0)
            ctx.term()


class CurveAllowlistTest(UnitUnderAttack):
    """Attacks by strangers on a CURVE unit with an allowlist (--curve-secret, --curve-allow;
    keys made by ctlrpc.keygen): the honest client holds alice's key, the new honest clients
    carol's, both listed; mallory's key pair is valid but not listed."""

    def setUp(self) -> None:
        self.keys = tempfile.mkdtemp(prefix="ctl-hostile-")
        self.addCleanup(shutil.rmtree, self.keys)
        os.chmod(self.keys, 0o700)
        for who in ("unit", "alice", "carol", "mallory"):
            ctlrpc.keygen(self.key(who))
        with open(self.key("clients.allow"), "w") as f:
            for who in ("alice", "carol"):
                with open(self.key(who + ".pub")) as pub:
                    f.write(pub.read())
        super().setUp()

    def key(self, name: str) -> str:
        return os.path.join(self.keys, name)

    def unit_extra(self) -> List[str]:
        return ["--curve-secret", self.key("unit.key"),
                "--curve-allow", self.key("clients.allow")]

    def client_opts(self, who: str = "alice") -> Dict[str, Any]:
        return {"curve_server_key": self.key("unit.pub"), "curve_secret": self.key(who + ".key")}

    def fresh_calls(self, n: int = 3) -> None:
        """New allowed clients connect and are answered."""
        for _ in range(n):
            fresh_call(self.unit.endpoint, **self.client_opts("carol"))

    def test_stranger_connection_flood(self) -> None:
        """A stranger with no key opens TCP connections that never finish a handshake: silent
        ones, ones that send part of a CURVE greeting, ones that send a whole greeting and no
        hello. New allowed clients connect and are answered meanwhile; the unit closes every
        one of them within the handshake timeout."""
        n = min(SETTINGS["max_connections"] - 20, 100 * self.scale)
        greeting = zmtp_greeting(b"CURVE")
        socks = []
        try:
            for i in range(n):
                s = socket.create_connection((self.unit.host, self.unit.port), timeout=10)
                if i % 3 == 1:
                    s.sendall(greeting[:20])
                elif i % 3 == 2:
                    s.sendall(greeting)
                socks.append(s)
            before = self.honest.answered()
            self.fresh_calls()
            self.assert_answering(before, "a stranger's connection flood")
            self.assert_rss(self.base_rss + n * CONN_COST + SLACK, "CURVE connection flood")
            wait_for(lambda: all(closed_by_peer(s) for s in socks),
                     SETTINGS["handshake_timeout_ms"] / 1000 + 15,
                     "the unit to close a stranger's connections that never finished their "
                     "handshake")
        finally:
            for s in socks:
                s.close()

    def test_key_not_on_allowlist(self) -> None:
        """A stranger with a valid CURVE key pair that is not on the allowlist connects many
        DEALERs, each with a request queued: every handshake is refused (counted in
        auth_denied, logged with the key), none of them gets an answer, and the allowed
        clients are answered meanwhile."""
        n = min(SETTINGS["max_connections"] - 20, 50 * self.scale)
        server = ctlrpc.curve.read_key(self.key("unit.pub"), False)
        public = ctlrpc.curve.read_key(self.key("mallory.pub"), False)
        secret = ctlrpc.curve.read_key(self.key("mallory.key"), True)
        before = self.unit.totals()["auth_denied"]
        from ctlrpc import _wire
        ctx = zmq.Context()
        socks = []
        try:
            for i in range(n):
                d = ctx.socket(zmq.DEALER)
                d.setsockopt(zmq.LINGER, 0)
                # A handshake that timed out (a loaded machine) is dialed again, and refused.
                d.setsockopt(zmq.RECONNECT_IVL, 500)
                d.curve_serverkey = server.encode()
                d.curve_publickey = public.encode()
                d.curve_secretkey = secret.encode()
                d.connect(self.unit.endpoint)
                d.send(_wire.pack_request("_health", f"m{i}", {}), zmq.NOBLOCK)
                socks.append(d)
            wait_for(lambda: self.unit.totals()["auth_denied"] >= before + n, 30,
                     f"{n} handshakes with a key not on the allowlist to be refused and "
                     "counted in auth_denied", self.unit.state)
            self.assertRegex(self.unit.log(), r"refused a CURVE handshake from 127\.0\.0\.1: "
                             r"client key %s is not on the allowlist" % re.escape(public))
            before_answered = self.honest.answered()
            self.fresh_calls()
            self.assert_answering(before_answered, "handshakes with a key not on the allowlist")
            self.assert_rss(self.base_rss + n * CONN_COST + SLACK, "key not on the allowlist")
            poller = zmq.Poller()
            for d in socks:
                poller.register(d, zmq.POLLIN)
            self.assertEqual(poller.poll(0), [], "a refused client got an answer")
        finally:
            for d in socks:
                d.close(0)
            ctx.term()

    def test_unfinished_message_refused(self) -> None:
        """The unfinished message of test_unfinished_message, from a NULL-mechanism peer: it
        is refused at the greeting (counted in handshake_failures), so the unit holds none of
        what it sent. The attacker dials again each time it is closed, until it has sent 20
        MB (ten times that in the long form) over many connections; the unit's RSS stays
        within a small slack of its start (held as on a plaintext unit, 20 MB of 100-byte
        frames would be about 50 MiB)."""
        target = 20 * 1000 * 1000 * self.scale
        size = 100
        first = zmtp_greeting() + zmtp_ready()
        chunk = (zmtp_frame_header(size, True) + b"y" * size) * 1000
        before = self.unit.totals()["handshake_failures"]
        sent = conns = 0
        while sent < target:
            s = socket.create_connection((self.unit.host, self.unit.port), timeout=30)
            conns += 1
            try:
                data = memoryview(first + chunk)
                while sent < target:
                    try:
                        k = s.send(data)
                    except (BrokenPipeError, ConnectionResetError):
                        break
                    except socket.timeout:
                        self.fail("the unit neither read a NULL peer's bytes nor closed it")
                    sent += k
                    data = data[k:] if k < len(data) else memoryview(chunk)
                wait_for(lambda: closed_by_peer(s), 15,
                         "the unit to close a NULL peer of a CURVE unit")
            finally:
                s.close()
        print(f"  NULL peer of a CURVE unit: {sent / 1e6:.0f} MB sent over {conns} "
              "connections", file=sys.stderr)
        wait_for(lambda: self.unit.totals()["handshake_failures"] >= before + conns, 30,
                 f"{conns} refused handshakes counted in handshake_failures", self.unit.state)
        before_answered = self.honest.answered()
        self.assert_answering(before_answered, "an unfinished message from a NULL peer")
        self.assert_rss(self.base_rss + SMALL_SLACK, "unfinished message on a CURVE unit")


class HeapTest(UnitUnderAttack):
    """Memory goes back after a burst: a unit that has held thousands of connections returns
    to about where it started once they have closed (the allocator keeps freed memory unless
    the unit trims its heap, docs/RELIABILITY.md)."""

    cap = False

    def test_memory_returns_after_bursts(self) -> None:
        soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
        want = 1500 + 200
        if soft < want and (hard == resource.RLIM_INFINITY or hard >= want):
            resource.setrlimit(resource.RLIMIT_NOFILE, (want, hard))
            self.addCleanup(resource.setrlimit, resource.RLIMIT_NOFILE, (soft, hard))
        # Within this process's files, and the unit's default cap (its open-file limit, the
        # hard one it raises itself to, less a quarter).
        unit_files = hard if hard != resource.RLIM_INFINITY else 1 << 20
        n = min(1500, resource.getrlimit(resource.RLIMIT_NOFILE)[0] - 200,
                unit_files - unit_files // 4 - 50)
        for _ in range(3):
            socks = []
            try:
                for i in range(n):  # from addresses of their own: no per-address cap applies
                    s = socket.socket()
                    s.bind((f"127.0.{1 + i // 250}.{1 + i % 250}", 0))
                    s.settimeout(10)
                    s.connect((self.unit.host, self.unit.port))
                    s.sendall(zmtp_greeting() + zmtp_ready())
                    socks.append(s)
                wait_for(lambda: self.unit.connections() >= n, 60,
                         f"the unit to count {n} connections", self.unit.state)
            finally:
                for s in socks:
                    s.close()
            wait_for(lambda: self.unit.connections() < 20, 60,
                     "the connections to close", self.unit.state)
        bound = self.base_rss + SLACK
        wait_for(lambda: OPTS.sanitized or self.unit.rss() <= bound, 30,
                 f"the unit's RSS back within {bound / MiB:.1f} MiB", self.unit.state)
        self.assert_rss(bound, "after three bursts of %d connections" % n)
        fresh_call(self.unit.endpoint)


class FilesTest(unittest.TestCase):
    """Bad key and allowlist files are refused with a message naming the file and the mistake,
    by the unit and by ctl-storage."""

    def setUp(self) -> None:
        self.dir = tempfile.mkdtemp(prefix="ctl-hostile-")
        os.chmod(self.dir, 0o700)
        for who in ("unit", "alice", "bob"):
            ctlrpc.keygen(os.path.join(self.dir, who))

    def tearDown(self) -> None:
        for f in os.listdir(self.dir):
            os.unlink(os.path.join(self.dir, f))
        os.rmdir(self.dir)

    def p(self, name: str) -> str:
        return os.path.join(self.dir, name)

    def run_unit(self, args: List[str]) -> subprocess.CompletedProcess:
        env = dict(os.environ, PYTHONPATH=os.path.join(ROOT, "runtime", "python"))
        return subprocess.run(shlex.split(OPTS.unit) + ["--bind", "tcp://127.0.0.1:0"] + args,
                              stdin=subprocess.DEVNULL, capture_output=True, timeout=60,
                              env=env)

    def refused(self, args: List[str], message: str) -> None:
        r = self.run_unit(args)
        self.assertEqual(r.returncode, 2, r.stderr)
        self.assertIn(message, r.stderr.decode())

    def allow(self, text: str, mode: int = 0o644) -> str:
        path = self.p("clients.allow")
        with open(path, "w") as f:
            f.write(text)
        os.chmod(path, mode)
        return path

    def pub(self, who: str) -> str:
        with open(self.p(who + ".pub")) as f:
            return f.read()

    def test_bad_files(self) -> None:
        key = self.p("unit.key")
        self.refused(["--curve-secret", self.p("unit.pub")],
                     f"key file {self.p('unit.pub')}: this is a public key; pass the .key file")
        os.chmod(key, 0o644)
        self.refused(["--curve-secret", key], f"key file {key} is readable by others")
        os.chmod(key, 0o600)
        a = self.allow(self.pub("alice") + self.pub("alice"))
        self.refused(["--curve-secret", key, "--curve-allow", a], "(a duplicate)")
        with open(key) as f:
            a = self.allow(self.pub("alice") + f.read())
        self.refused(["--curve-secret", key, "--curve-allow", a],
                     "this is a secret key file's header")
        a = self.allow(self.pub("alice"), 0o666)
        self.refused(["--curve-secret", key, "--curve-allow", a], "is writable by others")
        a = self.allow(self.pub("alice") + "\0junk\n")
        self.refused(["--curve-secret", key, "--curve-allow", a], "holds a NUL byte")
        link = self.p("link.allow")
        os.symlink(self.allow(self.pub("alice")), link)
        self.refused(["--curve-secret", key, "--curve-allow", link], "is a symbolic link")
        # Secrets as files only: a key's text is refused, and not echoed.
        text = ctlrpc.curve.read_key(key, True)
        r = self.run_unit(["--curve-secret", text])
        self.assertEqual(r.returncode, 2, r.stderr)
        self.assertIn("a key's text was given where a key file is wanted", r.stderr.decode())
        self.assertNotIn(text, r.stderr.decode())
        r = subprocess.run([OPTS.cli, "--address", "tcp://127.0.0.1:1", "--curve-server-key",
                            self.p("unit.pub"), "--curve-key", text, "stats"],
                           capture_output=True, timeout=30)
        self.assertEqual(r.returncode, 2, r.stderr)
        self.assertIn("a key's text was given where a key file is wanted", r.stderr.decode())
        self.assertNotIn(text, r.stderr.decode())
        r = subprocess.run([OPTS.cli, "--address", "tcp://127.0.0.1:1", "--curve-server-key",
                            key, "stats"], capture_output=True, timeout=30)
        self.assertEqual(r.returncode, 2, r.stderr)
        self.assertIn(f"key file {key}: this is a secret key; pass the .pub file",
                      r.stderr.decode())

    def test_sighup_reloads_allowlist(self) -> None:
        """SIGHUP reads the allowlist again for new handshakes; a bad file on reload keeps the
        old list, and the unit says why."""
        a = self.allow(self.pub("alice"))
        unit = Unit(["--curve-secret", self.p("unit.key"), "--curve-allow", a])
        try:
            def call(who: str) -> Any:
                with ctlrpc.Client(timeout=5.0, curve_server_key=self.p("unit.pub"),
                                   curve_secret=self.p(who + ".key")) as c:
                    return c.call(unit.endpoint, "_health", {}, 5.0)
            call("alice")
            with self.assertRaises(ctlrpc.Transfer) as cm:
                call("bob")
            self.assertEqual(cm.exception.cause, "auth")
            self.allow(self.pub("alice") + self.pub("bob"))
            unit.proc.send_signal(signal.SIGHUP)
            wait_for(lambda: "reloaded the allowlist" in unit.log(), 30, "the reload's line")
            call("bob")
            self.allow(self.pub("alice"), 0o666)  # refused: bob stays admitted
            unit.proc.send_signal(signal.SIGHUP)
            wait_for(lambda: "the allowlist was not reloaded" in unit.log(), 30,
                     "the refused reload's line")
            self.assertIn("is writable by others", unit.log())
            call("bob")
            self.assertIsNone(unit.proc.poll(), "SIGHUP must not stop the unit")
        finally:
            unit.stop()


def main() -> None:
    global OPTS
    ap = argparse.ArgumentParser()
    ap.add_argument("--unit", required=True, help="the unit's command line")
    ap.add_argument("--cli", required=True, help="ctl-storage")
    ap.add_argument("--sanitized", action="store_true", help="do not judge RSS")
    ap.add_argument("--long", action="store_true", default=bool(os.environ.get(
        "CTL_HOSTILE_LONG")), help="each attack ten times larger (also CTL_HOSTILE_LONG=1)")
    OPTS, rest = ap.parse_known_args()
    if OPTS.long:
        UnitUnderAttack.scale = 10
    unittest.main(argv=[sys.argv[0]] + rest, verbosity=2)


if __name__ == "__main__":
    main()
