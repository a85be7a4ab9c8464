"""Our ctl-storage CLI (and so our generated client stubs) against a storage
unit written in Python (pyunit.py).

    test_python_unit.py --cli PATH/ctl-storage --unit PATH/ctl-storage-unit [unittest args]

Every op through the CLI, with its text and JSON output and its exit status
for each error kind (3 UnitFull, 4 Busy, 5 Missing, 6 Transfer from a
Protocol error, 7 timeout), notifies included, and stats/list fanned out
over a Python unit, a C unit and a dead address at once. The Python unit is
also checked on the wire directly (REQ delimiter, Protocol error maps,
dropped payloads) so a failure here points at the right side.
"""

import argparse
import base64
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import unittest

import zmq

import peer

CLI = None
C_UNIT = None
PY_UNIT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "pyunit.py")
RUN_S = 30


class Run:
    def __init__(self, proc):
        self.status = proc.returncode
        self.out = proc.stdout
        self.text = proc.stdout.decode(errors="replace")
        self.err = proc.stderr.decode(errors="replace")

    def json(self):
        return json.loads(self.text)


def cli(addresses, *args, stdin=None):
    argv = [CLI]
    for a in addresses:
        argv += ["--address", a]
    p = subprocess.run(argv + list(args), input=stdin, stdout=subprocess.PIPE,
                       stderr=subprocess.PIPE, timeout=RUN_S)
    return Run(p)


class PyUnitCase(unittest.TestCase):

    def setUp(self):
        self.tmp = tempfile.mkdtemp(prefix="ctl-interop.")
        self.procs = []
        self.u = self.py_unit()

    def tearDown(self):
        try:
            for p in self.procs:
                self.assertEqual(p.stop(), 0, "unit exit status")
        finally:
            shutil.rmtree(self.tmp, ignore_errors=True)

    def py_unit(self, capacity="64M", spill=None):
        argv = [sys.executable, PY_UNIT, "--bind", "tcp://127.0.0.1:0", "--capacity", capacity]
        if spill:
            argv += ["--spill-dir", spill]
        p = peer.Process(argv)
        self.procs.append(p)
        return p

    def c_unit(self):
        p = peer.Process([C_UNIT, "--bind", "tcp://127.0.0.1:0", "--capacity", "64M"])
        self.procs.append(p)
        return p

    def ok(self, *args, u=None, stdin=None):
        r = cli([(u or self.u).address], *args, stdin=stdin)
        self.assertEqual(r.status, 0, "ctl-storage %s: %s" % (" ".join(args), r.err))
        return r

    def fails(self, status, *args, u=None, stdin=None):
        r = cli([(u or self.u).address], *args, stdin=stdin)
        self.assertEqual(r.status, status, "ctl-storage %s: %r %r" % (" ".join(args),
                                                                     r.text, r.err))
        return r


class TestCliOnPythonUnit(PyUnitCase):

    def test_put_get(self):
        blob = bytes(range(256)) * 100 + b"\0"
        path = os.path.join(self.tmp, "blob")
        with open(path, "wb") as f:
            f.write(blob)
        self.assertEqual(self.ok("put", "k", path).text,
                         "stored %d bytes under 'k'\n" % len(blob))
        self.assertEqual(self.ok("--json", "put", "e", "/dev/null", "--pin").json(),
                         {"key": "e", "stored": 0, "pinned": True})
        self.ok("put", "s", "-", stdin=b"from\0stdin")
        self.assertEqual(self.ok("get", "k", "e", "s").out, blob + b"from\0stdin")
        got = self.ok("--json", "get", "s", "k").json()["blobs"]
        self.assertEqual([(b["key"], b["size"], base64.b64decode(b["base64"])) for b in got],
                         [("s", 10, b"from\0stdin"), ("k", len(blob), blob)])
        out = os.path.join(self.tmp, "out")
        self.ok("get", "k", "-o", out)
        with open(out, "rb") as f:
            self.assertEqual(f.read(), blob)

    def test_describe_pin_delete(self):
        self.ok("put", "a", "-", stdin=b"12345")
        self.ok("put", "b", "-", stdin=b"")
        self.assertEqual(self.ok("--json", "describe", "a", "b").json(), [
            {"key": "a", "size": 5, "pinned": False, "spilled": False},
            {"key": "b", "size": 0, "pinned": False, "spilled": False}])
        self.assertEqual(self.ok("describe", "a").text.splitlines()[1].split(),
                         ["a", "5", "no", "no"])
        self.assertEqual(self.ok("pin", "a", "a").text, "pinned 1 blob\n")
        self.assertEqual(self.ok("--json", "pin", "a", "b").json(), {"pinned": 2})
        r = self.fails(4, "delete", "a")
        self.assertIn("ctl-storage: Busy: delete at %s" % self.u.address, r.err)
        self.assertIn("pinned", r.err)
        e = self.fails(4, "--json", "put", "a", "-", stdin=b"x").json()["error"]
        self.assertEqual((e["kind"], e["reason"]), ("Busy", "pinned"))
        self.assertEqual(self.ok("get", "a").out, b"12345")

        def pinned(k):
            return self.ok("--json", "describe", k).json()[0]["pinned"]

        self.assertEqual(self.ok("unpin", "a", "zz").text,
                         "sent unpin for 2 keys (notify: the unit does not reply)\n")
        peer.wait_for(lambda: not pinned("a"), "unpin")
        self.assertEqual(self.ok("--json", "abort", "a", "b").json(),
                         {"sent": "abort", "keys": 2})
        peer.wait_for(lambda: self.ok("list").text == "b\n", "abort")
        self.ok("unpin", "b")
        peer.wait_for(lambda: not pinned("b"), "unpin")
        self.assertEqual(self.ok("delete", "b", "zz").text, "deleted 1 blob\n")
        self.assertEqual(self.ok("--json", "delete", "b").json(), {"deleted": 0})

    def test_missing(self):
        self.ok("put", "here", "-", stdin=b"x")
        for cmd in ("get", "describe", "pin"):
            r = self.fails(5, cmd, "gone", "here", "x")
            self.assertIn("[missing: gone x]", r.err)
            e = self.fails(5, "--json", cmd, "here", "y").json()["error"]
            self.assertEqual((e["kind"], e["blobs"]), ("Missing", ["y"]))
        self.assertFalse(self.ok("--json", "describe", "here").json()[0]["pinned"])

    def test_unit_full(self):
        u = self.py_unit(capacity="1000")
        self.ok("put", "a", "-", u=u, stdin=b"x" * 600)
        r = self.fails(3, "put", "b", "-", u=u, stdin=b"x" * 401)
        self.assertIn("ctl-storage: UnitFull: put at %s" % u.address, r.err)
        self.assertEqual(self.fails(3, "--json", "put", "b", "-", u=u,
                                    stdin=b"x" * 2000).json()["error"]["kind"], "UnitFull")
        self.ok("put", "a", "-", u=u, stdin=b"x" * 1000)   # an overwrite frees the old size

    def test_spill_and_protocol_error(self):
        spill = os.path.join(self.tmp, "spill")
        u = self.py_unit(capacity="1000", spill=spill)
        data = os.urandom(4000)
        self.ok("put", "../../escape", "-", u=u, stdin=data)
        self.assertEqual(self.ok("get", "../../escape", u=u).out, data)
        self.assertTrue(self.ok("--json", "describe", "../../escape", u=u).json()[0]["spilled"])
        self.assertEqual(os.listdir(self.tmp), ["spill"])
        for name in os.listdir(spill):
            os.unlink(os.path.join(spill, name))
        # The unit answers a Protocol error; the CLI reports a Transfer, exit 6.
        r = self.fails(6, "get", "../../escape", u=u)
        self.assertIn("ctl-storage: Transfer: get at %s" % u.address, r.err)
        self.assertEqual(self.fails(6, "--json", "get", "../../escape", u=u)
                         .json()["error"]["kind"], "Transfer")

    def test_list_stats(self):
        for k in ("b/2", "a", "b/10", "b/1"):
            self.ok("put", k, "-", stdin=b"vv")
        self.assertEqual(self.ok("list").text, "a\nb/1\nb/10\nb/2\n")
        self.assertEqual(self.ok("--json", "list", "--prefix", "b/").json(),
                         [{"address": self.u.address, "keys": ["b/1", "b/10", "b/2"]}])
        s = self.ok("--json", "stats").json()[0]
        self.assertEqual((s["blobs"], s["bytes"], s["capacity"], s["pinned"], s["spilled"],
                          s["dropped"]), (4, 8, 64 << 20, 0, 0, 0))
        # 4 puts, 2 lists of two pages each (only an empty page ends one), stats.
        self.assertEqual(s["requests"], 9)
        row = self.ok("stats").text.splitlines()[1].split()
        self.assertEqual(row[:3], [self.u.address, "4", "8"])

    def test_timeout(self):
        self.ok("put", "k", "-", stdin=b"v")
        self.u.freeze()
        try:
            r = self.fails(7, "--timeout", "300ms", "get", "k")
            self.assertIn("ctl-storage: Timeout: get at %s" % self.u.address, r.err)
        finally:
            self.u.signal(signal.SIGCONT)
        self.assertEqual(self.ok("get", "k").out, b"v")

    def test_fan_out_mixed(self):
        c = self.c_unit()
        dead = peer.dead_address()
        self.ok("put", "py", "-", stdin=b"1")
        self.ok("put", "c1", "-", u=c, stdin=b"22")
        self.ok("put", "c2", "-", u=c, stdin=b"333")
        addrs = [self.u.address, c.address]
        rows = cli(addrs, "--json", "stats")
        self.assertEqual(rows.status, 0, rows.err)
        self.assertEqual([(r["address"], r["blobs"], r["bytes"]) for r in rows.json()],
                         [(self.u.address, 1, 1), (c.address, 2, 5)])
        r = cli(addrs + [dead], "--timeout", "1s", "--json", "list")
        self.assertEqual(r.status, 8)
        rows = r.json()
        self.assertEqual(rows[0], {"address": self.u.address, "keys": ["py"]})
        self.assertEqual(rows[1], {"address": c.address, "keys": ["c1", "c2"]})
        self.assertEqual(rows[2]["address"], dead)
        self.assertEqual(rows[2]["error"]["kind"], "Unreachable")
        r = cli([dead] + addrs, "--timeout", "1s", "stats")
        self.assertEqual(r.status, 8)
        lines = r.text.splitlines()
        self.assertEqual(len(lines), 4)
        self.assertIn("Unreachable:", lines[1])
        self.assertEqual(lines[2].split()[:3], [self.u.address, "1", "1"])
        self.assertEqual(lines[3].split()[:3], [c.address, "2", "5"])


class TestPythonUnitWire(PyUnitCase):
    """The Python unit itself, on the wire, so its failures are told apart
    from the CLI's."""

    def setUp(self):
        super().setUp()
        self.ctx = zmq.Context()

    def tearDown(self):
        self.ctx.destroy(0)
        super().tearDown()

    def test_wire(self):
        d = peer.Client(self.ctx, self.u.address)
        req = peer.Client(self.ctx, self.u.address, zmq.REQ)
        ok, body = req.call("put", {"key": "k", "data": b"v"})
        self.assertEqual((ok, body), (True, 1))
        ok, body = d.call("nosuchop", {})
        self.assertEqual((ok, body["kind"], body["reason"], body["blobs"]),
                         (False, "Protocol", None, None))
        ok, body = d.call("get", {"keys": "k"})
        self.assertEqual((ok, body["kind"]), (False, "Protocol"))
        self.assertIn("keys", body["msg"])
        d.send("unpin", {"keys": 1}, rid="abc")
        d.send_raw(b"junk")
        d.send_raw(b"a", b"b")
        ok, s = d.call("stats", {})
        self.assertTrue(d.nothing_within(0.2))
        self.assertEqual((s["dropped"], s["requests"]), (2, 5))
        d.send_raw(b"", peer.pack(["list", "x", {}]))
        self.assertEqual(d.sock.poll(peer.CALL_S * 1000), zmq.POLLIN)
        frames = d.sock.recv_multipart()
        self.assertEqual(frames[0], b"")
        self.assertEqual(peer.unpack(frames[1]), ["x", True, ["k"]])
        d.close()
        req.close()


def main():
    global CLI, C_UNIT
    ap = argparse.ArgumentParser()
    ap.add_argument("--cli", required=True)
    ap.add_argument("--unit", required=True, help="the C ctl-storage-unit, for fan-out")
    args, rest = ap.parse_known_args()
    CLI, C_UNIT = args.cli, args.unit
    unittest.main(argv=[sys.argv[0]] + rest, verbosity=2)


if __name__ == "__main__":
    main()
