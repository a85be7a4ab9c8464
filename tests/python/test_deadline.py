"""Deadlines carried in request ids (docs/PROTOCOL.md, "Deadlines"), both runtimes, both sides.

- The id parser (`_wire.id_deadline`): the last '@', then 1 to 16 ASCII decimal digits and
  nothing else; anything else carries no deadline. `_wire.format_id` writes what it reads.
- The clients put the call's deadline (wall clock, ms since the Unix epoch) in every id: the
  Python Client and ctlrpc.aio.Client, and the C client (ctl-storage), seen by a bare ROUTER;
  a notify's id stays "".
- A Python Server skips a request whose deadline passed more than `deadline_skew` ago (no
  handler, no reply, counted in `expired` and in its op's `dropped`), runs one without a
  deadline, one ahead and one within the allowance; built-ins answer whatever their deadline;
  deadline_skew=None turns the check off.
- Frozen units: ctl-storage-unit and unit.py SIGSTOPped while puts queue up, the callers time
  out, then SIGCONT once the deadlines are older than the allowance: none of the puts runs
  (every key is Missing), each is counted in `expired`, no reply comes back.
- Interop: ctl-storage (the C client) against unit.py and the Python client against
  ctl-storage-unit: their ids are accepted, nothing expires.

    test_deadline.py --unit ctl-storage-unit --pyunit unit.py --module-dir DIR --cli ctl-storage
"""

import asyncio
import os
import re
import subprocess
import sys
import threading
import time
import unittest

import msgpack
import zmq

import support

import ctlrpc
import ctlrpc.aio
from ctlrpc import _wire

OPTS = None
ID_RE = re.compile(r"^[0-9a-f]{12}@([0-9]{13})$")
SKEW_MS = 200  # the frozen units' allowance: the test waits it out, so keep it short
FROZEN_PUTS = 8
PUT_TIMEOUT = 0.3


def wall_ms():
    return time.time() * 1000


class IdParser(unittest.TestCase):
    def test_vectors(self):
        cases = [
            ("3f2a9c01b2d4e5f6@1796169600123", 1796169600123),
            ("abc@0", 0), ("@7", 7), ("a@b@12", 12),
            ("x@1234567890123456", 1234567890123456),
            ("x@9999999999999999", 9999999999999999),
            ("x@0000000000000001", 1),
            ("x@12345678901234567", None), ("x@99999999999999999999", None),
            ("12345678901234567", None), ("0123456789ab", None), ("", None), ("@", None),
            ("abc@", None), ("abc@12a", None), ("abc@12 ", None), ("abc@ 12", None),
            ("abc@+12", None), ("abc@-12", None), ("abc@1@", None), ("abc@12@x", None),
            ("abc@1_000", None), ("1796169600123", None),
            ("abc@\u0661\u0662", None),  # Arabic-Indic digits are not ASCII digits
            ("abc@\uff11", None),  # a fullwidth one
            ("abc@1\x00", None), ("abc@1\udcff", None),
        ]
        for rid, want in cases:
            self.assertEqual(_wire.id_deadline(rid), want, rid)

    def test_format_reads_back(self):
        for unique, deadline, want in [
                (0, 0, "000000000000@0000000000000"),
                (42, 1796169600123, "00000000002a@1796169600123"),
                (2 ** 64 - 1, 2 ** 62, "ffffffffffff@9999999999999"),  # clamped
                (0x1000000000007, -5, "000000000007@0000000000000")]:
            rid = _wire.format_id(unique, deadline)
            self.assertEqual(rid, want)
            self.assertEqual(_wire.id_deadline(rid), min(max(deadline, 0), 9999999999999))


class Raw:
    """A bare ROUTER on 127.0.0.1 that shows what clients send."""

    def __init__(self):
        self.ctx = zmq.Context()
        self.sock = self.ctx.socket(zmq.ROUTER)
        self.sock.setsockopt(zmq.LINGER, 0)
        port = self.sock.bind_to_random_port("tcp://127.0.0.1")
        self.address = "tcp://127.0.0.1:%d" % port

    def recv(self, timeout_s=10):
        """[identity, op, id, args] of the next request."""
        self.assertTrue(self.sock.poll(int(timeout_s * 1000)), "no request came")
        frames = self.sock.recv_multipart()
        op, rid, args = msgpack.unpackb(frames[-1], raw=False)
        return frames[0], op, rid, args

    def assertTrue(self, cond, msg):
        if not cond:
            raise AssertionError(msg)

    def reply(self, identity, rid, result):
        self.sock.send_multipart([identity, msgpack.packb([rid, True, result])])

    def close(self):
        self.sock.close()
        self.ctx.term()


class ClientIds(unittest.TestCase):
    """Every call's id carries its deadline, in every client."""

    def setUp(self):
        self.raw = Raw()

    def tearDown(self):
        self.raw.close()

    def check_id(self, rid, before_ms, after_ms, timeout_s):
        m = ID_RE.match(rid)
        self.assertIsNotNone(m, rid)
        deadline = int(m.group(1))
        self.assertEqual(_wire.id_deadline(rid), deadline)
        # The call's deadline on the wall clock: between the call's start and its sending,
        # plus the timeout (rounded up to the millisecond).
        self.assertGreaterEqual(deadline, before_ms + timeout_s * 1000 - 1)
        self.assertLessEqual(deadline, after_ms + timeout_s * 1000 + 1)

    def serve_one(self, seen):
        identity, op, rid, args = self.raw.recv()
        seen.append((op, rid, wall_ms()))
        self.raw.reply(identity, rid, "ok")

    def test_python_client(self):
        with ctlrpc.Client(timeout=7.0) as c:
            for timeout in (None, 2.5):
                seen = []
                t = threading.Thread(target=self.serve_one, args=(seen,))
                t.start()
                before = wall_ms()
                self.assertEqual(c.call(self.raw.address, "x", {}, timeout=timeout), "ok")
                t.join(10)
                self.check_id(seen[0][1], before, seen[0][2], 7.0 if timeout is None else timeout)
            # call_many: one deadline for the batch, in every id.
            seen = []
            t = threading.Thread(target=lambda: [self.serve_one(seen) for _ in range(3)])
            t.start()
            before = wall_ms()
            outs = c.call_many("x", [(self.raw.address, {})] * 3, timeout=3.0)
            t.join(10)
            self.assertTrue(all(o.ok for o in outs))
            ids = [rid for _, rid, _ in seen]
            self.assertEqual(len(set(ids)), 3)  # unique parts differ
            self.assertEqual(len({_wire.id_deadline(r) for r in ids}), 1)
            for rid in ids:
                self.check_id(rid, before, seen[-1][2], 3.0)
            # A notify keeps "": no deadline.
            c.notify(self.raw.address, "n", {})
            _, op, rid, _ = self.raw.recv()
            self.assertEqual((op, rid), ("n", ""))

    def test_aio_client(self):
        async def run():
            async with ctlrpc.aio.Client(timeout=4.0) as c:
                before = wall_ms()
                task = asyncio.ensure_future(c.call(self.raw.address, "x", {}, timeout=1.5))
                loop = asyncio.get_running_loop()
                identity, op, rid, _ = await loop.run_in_executor(None, self.raw.recv)
                after = wall_ms()
                self.raw.reply(identity, rid, "ok")
                self.assertEqual(await task, "ok")
                self.check_id(rid, before, after, 1.5)
        asyncio.run(run())

    def test_c_client(self):
        before = wall_ms()
        proc = subprocess.Popen([OPTS.cli, "--address", self.raw.address, "--timeout", "2s",
                                 "stats"], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
        try:
            identity, op, rid, _ = self.raw.recv()
            after = wall_ms()
            self.assertEqual(op, "stats")
            self.check_id(rid, before, after, 2.0)
        finally:
            proc.kill()
            proc.wait(support.RUN_S)
            proc.stderr.close()


class PythonServer(unittest.TestCase):
    """A Python Server honours the deadlines in ids."""

    def start(self, **kw):
        self.runs = []
        handlers = {"put": lambda a: self.runs.append(a["n"]) or a["n"],
                    "note": lambda a: self.runs.append(("note", a["n"]))}
        self.server = ctlrpc.Server(handlers, "tcp://127.0.0.1:0", notify=["note"], **kw)
        self.addCleanup(self.server.close)
        self.ctx = zmq.Context()
        self.sock = self.ctx.socket(zmq.DEALER)
        self.sock.setsockopt(zmq.LINGER, 0)
        self.sock.connect(self.server.endpoint)
        self.addCleanup(self.ctx.term)
        self.addCleanup(self.sock.close)

    def send(self, op, rid, args):
        self.sock.send(msgpack.packb([op, rid, args]))

    def answers(self):
        """The ids of the replies to what was sent, up to a ping sent now (same connection,
        so every earlier reply comes first)."""
        self.send("_health", "after", {})
        got = []
        while True:
            self.assertTrue(self.sock.poll(10000), "no reply to the ping")
            rid, ok, _ = msgpack.unpackb(self.sock.recv(), raw=False)
            if rid == "after":
                return got
            got.append(rid)

    def test_skips_expired(self):
        self.start()
        now = int(wall_ms())
        self.send("put", "a@1", {"n": 1})  # 1970
        self.send("put", "b@%d" % (now - 60000), {"n": 2})
        self.send("nosuchop", "c@1", {})  # unknown op: skipped too
        self.send("put", "d@1", [1])  # bad args: skipped too
        self.send("note", "e@1", {"n": 3})  # a notify with a deadline
        self.send("put", "f@%d" % (int(wall_ms()) + 60000), {"n": 4})  # ahead
        self.send("put", "g@%d" % (int(wall_ms()) - 200), {"n": 5})  # within the allowance
        self.send("put", "0123456789ab", {"n": 6})  # the reference's ids: no deadline
        self.send("put", "h@12345678901234567", {"n": 7})  # 17 digits: no deadline
        self.send("note", "", {"n": 8})  # a notify's "": runs
        self.send("_stats", "i@1", {})  # built-ins answer whatever their deadline
        got = self.answers()
        self.assertEqual([r.split("@")[0] for r in got], ["f", "g", "0123456789ab", "h", "i"])
        self.assertEqual(self.runs, [4, 5, 6, 7, ("note", 8)])
        st = self.server.stats()
        self.assertEqual(st["expired"], 5)
        self.assertEqual(st["requests"], 12)
        ops = self.server.op_stats()
        self.assertEqual(ops["totals"]["expired"], 5)
        self.assertEqual(ops["ops"]["put"]["dropped"], 3)
        self.assertEqual(ops["ops"]["note"]["dropped"], 1)
        self.assertEqual(ops["ops"]["put"]["calls"], 7)

    def test_allowance(self):
        self.start(deadline_skew=120.0)
        self.send("put", "a@%d" % (int(wall_ms()) - 60000), {"n": 1})
        self.send("put", "b@%d" % (int(wall_ms()) - 240000), {"n": 2})
        self.assertEqual(len(self.answers()), 1)
        self.assertEqual(self.runs, [1])
        self.assertEqual(self.server.stats()["expired"], 1)

    def test_off(self):
        for skew in (None, -1, -0.5):
            with self.subTest(skew=skew):
                self.start(deadline_skew=skew)
                self.send("put", "a@1", {"n": 1})
                self.assertEqual(self.answers(), ["a@1"])
                self.assertEqual(self.server.stats()["expired"], 0)
                self.server.close()

    def test_bad_skew(self):
        for bad in ("1", float("nan"), True, [1]):
            with self.assertRaises(ValueError) as cm:
                ctlrpc.Server({"x": lambda a: 1}, "tcp://127.0.0.1:0", deadline_skew=bad)
            self.assertIn("deadline_skew", str(cm.exception))

    def test_logged_rate_limited(self):
        self.start()
        with self.assertLogs("ctlrpc", level="INFO") as logs:
            for i in range(50):
                self.send("put", "x%d@1" % i, {"n": i})
            self.answers()
        lines = [r for r in logs.records if "deadline" in r.getMessage()]
        self.assertEqual(len(lines), 1)  # at most one a second, not one per request
        self.assertEqual(lines[0].levelname, "INFO")
        self.assertIn("'put'", lines[0].getMessage())
        self.assertEqual(self.server.stats()["expired"], 50)


def unit_cmd(kind, *extra):
    if kind == "c":
        return [OPTS.unit, "--bind", "tcp://127.0.0.1:0", *extra]
    return [sys.executable, OPTS.pyunit, "--module-dir", OPTS.module_dir,
            "--bind", "tcp://127.0.0.1:0", *extra]


class FrozenUnit(unittest.TestCase):
    """SIGSTOP a unit while puts queue up; SIGCONT after their deadlines: none runs."""

    def frozen(self, kind):
        unit = support.Process(unit_cmd(kind, "--deadline-skew-ms", str(SKEW_MS)))
        self.addCleanup(unit.stop)
        addr = unit.address
        # A long grace: the retired sockets stay connected until the unit has read what
        # they sent (the test is about the unit skipping them, not about a peer gone).
        with ctlrpc.Client(timeout=10.0, late_grace=60.0) as c:
            # Connections up before the freeze: a request is handed only to a connection
            # that is up, and a frozen unit completes no new handshake. A fan-out of as many
            # calls leaves as many sockets pooled; repeated until it has.
            deadline = time.monotonic() + 20
            while c.stats(addr)["sockets_idle"] < FROZEN_PUTS:
                self.assertLess(time.monotonic(), deadline, "the connections did not pool")
                for o in c.call_many("stats", [(addr, {})] * FROZEN_PUTS):
                    self.assertTrue(o.ok, o.error)
            self.assertEqual(c.call(addr, "_stats")["totals"]["expired"], 0)

            unit.freeze()
            keys = ["frozen-%d" % i for i in range(FROZEN_PUTS)]
            outs = c.call_many("put", [(addr, {"key": k, "data": b"v"}) for k in keys],
                               timeout=PUT_TIMEOUT)
            for o in outs:
                self.assertFalse(o.ok)
                self.assertIsInstance(o.error, ctlrpc.Timeout)
            st = c.stats(addr)
            self.assertEqual(st["timeouts"], FROZEN_PUTS)
            # Every deadline is behind (the batch ended at it); resume once they are older
            # than the allowance, by the wall clock the ids carry.
            thaw_at = wall_ms() + SKEW_MS + 50
            while wall_ms() < thaw_at:
                time.sleep(0.01)
            unit.thaw()
            got = {}

            def expired():
                got["n"] = c.call(addr, "_stats")["totals"]["expired"]
                return got["n"] >= FROZEN_PUTS
            support.wait_for(expired, "expired to reach %d" % FROZEN_PUTS, 20)
            self.assertEqual(got["n"], FROZEN_PUTS)
            for k in keys:
                with self.assertRaises(ctlrpc.Missing, msg=k):
                    c.call(addr, "get", {"keys": [k]})
            self.assertEqual(c.stats(addr)["late_replies"], 0)  # nothing came back
            # It serves on.
            self.assertEqual(c.call(addr, "put", {"key": "after", "data": b"v"}), 1)

    def test_c_unit(self):
        self.frozen("c")

    def test_python_unit(self):
        self.frozen("py")


class Interop(unittest.TestCase):
    """Ids with deadlines from one runtime's client accepted by the other runtime's unit."""

    def run_cli(self, addr, *args, data=None):
        return subprocess.run([OPTS.cli, "--address", addr, "--timeout", "5s", *args],
                              input=data, capture_output=True, timeout=support.RUN_S)

    def test_c_client_python_unit(self):
        unit = support.Process(unit_cmd("py"))
        self.addCleanup(unit.stop)
        r = self.run_cli(unit.address, "put", "k", "-", data=b"hello")
        self.assertEqual(r.returncode, 0, r.stderr)
        r = self.run_cli(unit.address, "get", "k")
        self.assertEqual((r.returncode, r.stdout), (0, b"hello"), r.stderr)
        with ctlrpc.Client() as c:
            t = c.call(unit.address, "_stats")["totals"]
        self.assertEqual(t["expired"], 0)
        self.assertGreaterEqual(t["requests"], 2)

    def test_python_client_c_unit(self):
        unit = support.Process(unit_cmd("c"))
        self.addCleanup(unit.stop)
        with ctlrpc.Client() as c:
            self.assertEqual(c.call(unit.address, "put", {"key": "k", "data": b"hi"}), 2)
            self.assertEqual(c.call(unit.address, "get", {"keys": ["k"]}), [b"hi"])
            self.assertEqual(c.call(unit.address, "_stats")["totals"]["expired"], 0)

    def test_units_take_the_flag(self):
        for kind in ("c", "py"):
            for bad in ("x", "1.5", "", "99999999999"):
                with self.subTest(kind=kind, bad=bad):
                    r = subprocess.run(unit_cmd(kind, "--deadline-skew-ms", bad),
                                       capture_output=True, timeout=support.RUN_S)
                    self.assertEqual(r.returncode, 2)
                    self.assertIn(b"--deadline-skew-ms", r.stderr)
            # Off: a request long past its deadline runs.
            unit = support.Process(unit_cmd(kind, "--deadline-skew-ms", "-1"))
            try:
                ctx = zmq.Context()
                s = ctx.socket(zmq.DEALER)
                s.setsockopt(zmq.LINGER, 0)
                s.connect(unit.address)
                s.send(msgpack.packb(["put", "old@1", {"key": "k", "data": b"v"}]))
                self.assertTrue(s.poll(10000))
                rid, ok, _ = msgpack.unpackb(s.recv(), raw=False)
                self.assertEqual((rid, ok), ("old@1", True))
                s.close()
                ctx.term()
            finally:
                unit.stop()


if __name__ == "__main__":
    OPTS, argv = support.main("unit", "pyunit", "module-dir", "cli")
    support.run_tests(argv)
