"""A Python client (DEALER, msgpack, 12-hex ids) against our ctl-storage-unit.

    test_python_client.py --unit PATH/ctl-storage-unit [unittest args]
    test_python_client.py --unit pyunit.py --python-unit [unittest args]

The second form runs the same checks against the Python unit (pyunit.py),
so the peer that the C client is tested against meets the same contract.

Calls every op of the storage service as a peer in another language would,
by its contract names (docs/STORAGE.md), and checks the results and the exact
error maps ({kind, msg, reason, blobs}) for every kind: UnitFull, Busy,
Missing and Protocol (bad args, unknown op). Also: notifies are never
answered (even with bad args), the empty request id is echoed, a REQ-style
peer is answered with the delimiter, malformed payloads are dropped and
counted.
"""

import argparse
import hashlib
import os
import shutil
import sys
import tempfile
import unittest

import zmq

import peer

UNIT = None
PYTHON_UNIT = False


class UnitCase(unittest.TestCase):

    @classmethod
    def setUpClass(cls):
        cls.ctx = zmq.Context()

    @classmethod
    def tearDownClass(cls):
        cls.ctx.term()

    def setUp(self):
        self.tmp = tempfile.mkdtemp(prefix="ctl-interop.")
        self.procs = []
        self.clients = []
        self.unit = self.start()
        self.c = self.client(self.unit)

    def tearDown(self):
        try:
            for c in self.clients:
                c.close()
            for p in self.procs:
                self.assertEqual(p.stop(), 0, "unit exit status")
        finally:
            shutil.rmtree(self.tmp, ignore_errors=True)

    def start(self, capacity="64M", spill=False):
        argv = UNIT + ["--bind", "tcp://127.0.0.1:0", "--capacity", capacity]
        if spill:
            argv += ["--spill-dir", os.path.join(self.tmp, "spill")]
        p = peer.Process(argv)
        self.procs.append(p)
        return p

    def client(self, unit, sock_type=zmq.DEALER):
        c = peer.Client(self.ctx, unit.address, sock_type)
        self.clients.append(c)
        return c

    # -- helpers ------------------------------------------------------------

    def ok(self, op, args=None, c=None):
        ok, body = (c or self.c).call(op, args)
        self.assertTrue(ok, "%s %r -> %r" % (op, args, body))
        return body

    def error(self, op, args, kind, c=None):
        ok, body = (c or self.c).call(op, args)
        self.assertFalse(ok, "%s %r -> %r" % (op, args, body))
        self.assertIsInstance(body, dict)
        self.assertEqual(set(body), {"kind", "msg", "reason", "blobs"})
        self.assertEqual(body["kind"], kind)
        self.assertIsInstance(body["msg"], str)
        self.assertTrue(body["msg"])
        if kind != "Busy":
            self.assertIsNone(body["reason"])
        if kind != "Missing":
            self.assertIsNone(body["blobs"])
        return body


class TestOps(UnitCase):

    def test_put_get(self):
        blobs = {"empty": b"", "nuls": b"\0\x01\0\xff" * 1000, "mib": os.urandom(1 << 20),
                 "caf\u00e9/\u6f22": b"unicode key"}
        for k, v in blobs.items():
            r = self.ok("put", {"key": k, "data": v})
            self.assertIsInstance(r, int)
            self.assertNotIsInstance(r, bool)
            self.assertEqual(r, len(v))
        order = ["mib", "empty", "caf\u00e9/\u6f22", "nuls", "empty"]
        got = self.ok("get", {"keys": order})
        self.assertIsInstance(got, list)
        self.assertTrue(all(isinstance(b, bytes) for b in got))
        self.assertEqual(got, [blobs[k] for k in order])
        self.assertEqual(self.ok("get", {"keys": []}), [])
        # pin given explicitly, false and true.
        self.assertEqual(self.ok("put", {"key": "empty", "data": b"x", "pin": False}), 1)
        self.assertEqual(self.ok("put", {"key": "p", "data": b"y", "pin": True}), 1)
        self.assertEqual(self.ok("describe", {"keys": ["p"]})[0]["pinned"], True)

    def test_describe(self):
        self.ok("put", {"key": "a", "data": b"12345"})
        self.ok("put", {"key": "b", "data": b"", "pin": True})
        got = self.ok("describe", {"keys": ["b", "a"]})
        self.assertEqual(got, [{"key": "b", "size": 0, "pinned": True, "spilled": False},
                               {"key": "a", "size": 5, "pinned": False, "spilled": False}])

    def test_pin_unpin_abort_delete(self):
        for k in "abcd":
            self.ok("put", {"key": k, "data": k.encode()})
        self.assertEqual(self.ok("pin", {"keys": ["a", "b", "a"]}), 2)
        # Notifies: nothing comes back; the reply to the next call is the
        # next message on the socket (same connection, so in order).
        self.c.notify("unpin", {"keys": ["a", "nope"]})
        self.c.notify("abort", {"keys": ["a", "b", "c"]})
        self.assertEqual(self.ok("list"), ["b", "d"])
        self.assertTrue(self.c.nothing_within(0.3))
        body = self.error("delete", {"keys": ["d", "b"]}, "Busy")
        self.assertEqual(body["reason"], "pinned")
        self.assertEqual(self.ok("list"), ["b", "d"])
        self.assertEqual(self.ok("delete", {"keys": ["d", "d", "zz"]}), 1)
        self.c.notify("unpin", {"keys": ["b"]})
        self.assertEqual(self.ok("delete", {"keys": ["b"]}), 1)
        self.assertEqual(self.ok("list"), [])

    def test_list(self):
        for k in ["b/2", "a", "b/10", "ab", "b", "b/1", "", "\u00e9", "z"]:
            self.ok("put", {"key": k, "data": b"v"})
        self.assertEqual(self.ok("list"), sorted(["b/2", "a", "b/10", "ab", "b", "b/1", "",
                                                  "\u00e9", "z"]))
        self.assertEqual(self.ok("list", {"prefix": "b/"}), ["b/1", "b/10", "b/2"])
        self.assertEqual(self.ok("list", {"prefix": ""})[0], "")
        self.assertEqual(self.ok("list", {"prefix": "nothing"}), [])

    def test_stats(self):
        self.ok("put", {"key": "a", "data": b"x" * 10, "pin": True})
        s = self.ok("stats")
        # index_bytes and index_capacity are defaulted fields: a unit that does
        # not count its keys (the Python one) leaves them out.
        self.assertEqual(set(s) - {"index_bytes", "index_capacity"},
                         {"blobs", "bytes", "capacity", "pinned", "spilled", "requests",
                          "dropped"})
        self.assertTrue(all(isinstance(v, int) and not isinstance(v, bool)
                            for v in s.values()))
        self.assertEqual((s["blobs"], s["bytes"], s["capacity"], s["pinned"], s["spilled"]),
                         (1, 10, 64 << 20, 1, 0))
        self.assertEqual(s["requests"], 2)
        self.assertEqual(s["dropped"], 0)
        # Malformed payloads: dropped, counted, never answered.
        for junk in [b"", b"junk", peer.pack(42), peer.pack(["stats", "id"]),
                     peer.pack([1, "id", {}]), peer.pack(["stats", 7, {}]),
                     peer.pack(["stats", "id", {}])[:3], b"\xc1"]:
            self.c.send_raw(junk)
        self.c.send_raw(b"two", b"frames")
        s2 = self.ok("stats")
        self.assertEqual(s2["dropped"], 9)
        self.assertEqual(s2["requests"], s["requests"] + 1)
        # With op and id readable, the rest broken: answered, Protocol.
        for rid, bad in (("trunc", peer.pack(["stats", "trunc", {}])[:-1]),
                         ("trail", peer.pack(["stats", "trail", {}]) + b"\x01")):
            self.c.send_raw(bad)
            reply = self.c.recv()
            self.assertEqual(reply[:2], [rid, False])
            self.assertEqual(reply[2]["kind"], "Protocol")
        s3 = self.ok("stats")
        self.assertEqual(s3["dropped"], 9)
        self.assertEqual(s3["requests"], s2["requests"] + 3)


class TestErrors(UnitCase):

    def test_missing(self):
        self.ok("put", {"key": "here", "data": b"x"})
        for op in ("get", "describe", "pin"):
            body = self.error(op, {"keys": ["gone", "here", "\u00e9", ""]}, "Missing")
            self.assertEqual(body["blobs"], ["gone", "\u00e9", ""])
        self.assertEqual(self.ok("describe", {"keys": ["here"]})[0]["pinned"], False)

    def test_busy(self):
        self.ok("put", {"key": "p", "data": b"first", "pin": True})
        body = self.error("put", {"key": "p", "data": b"second"}, "Busy")
        self.assertEqual(body["reason"], "pinned")
        self.assertEqual(self.ok("get", {"keys": ["p"]}), [b"first"])

    def test_unit_full(self):
        small = self.start(capacity="1000")
        c = self.client(small)
        self.ok("put", {"key": "a", "data": b"x" * 600}, c=c)
        self.error("put", {"key": "b", "data": b"x" * 401}, "UnitFull", c=c)
        self.ok("put", {"key": "b", "data": b"x" * 400}, c=c)
        self.assertEqual(self.ok("stats", c=c)["bytes"], 1000)

    def test_spill(self):
        u = self.start(capacity="1000", spill=True)
        c = self.client(u)
        data = os.urandom(5000)
        self.assertEqual(self.ok("put", {"key": "../../big", "data": data}, c=c), 5000)
        self.assertEqual(self.ok("get", {"keys": ["../../big"]}, c=c), [data])
        self.assertEqual(self.ok("describe", {"keys": ["../../big"]}, c=c)[0]["spilled"], True)
        self.assertEqual(os.listdir(self.tmp), ["spill"])

    def test_protocol(self):
        cases = [
            ("nosuchop", {}, "nosuchop"),
            ("put", {"key": "k"}, "data"),                      # missing required arg
            ("put", {"key": "k", "data": "not bin"}, "data"),   # str where bin is due
            ("put", {"key": b"k", "data": b"v"}, "key"),        # bin where str is due
            ("put", {"key": "k", "data": b"v", "pin": 1}, "pin"),
            ("get", {"keys": "k"}, "keys"),
            ("get", {"keys": ["k", 1]}, "keys"),
            ("list", {"prefix": None}, "prefix"),
            ("list", {"bogus": "x"}, "bogus"),                 # unknown arg
            ("stats", {"x": 1}, "x"),
            ("stats", [], "map"),
        ]
        for op, args, named in cases:
            body = self.error(op, args, "Protocol")
            self.assertIn(named, body["msg"], (op, args))
        # Nothing was stored by the refused puts.
        self.assertEqual(self.ok("list"), [])

    def test_notify_never_answered(self):
        self.ok("put", {"key": "k", "data": b"v"})
        self.c.send("unpin", {"keys": 5}, rid="abcdefabcdef")   # bad args, with an id
        self.c.send("abort", {"nope": []}, rid="")
        self.c.notify("unpin", {"keys": ["k"]})
        self.assertTrue(self.c.nothing_within(0.3))
        self.assertEqual(self.ok("list"), ["k"])

    def test_ids(self):
        # Any string is a request id, the empty one included; it is echoed.
        for rid in ["", "x", "0123456789ab", "\u00e9" * 100]:
            ok, body = self.c.call("list", {}, rid=rid)
            self.assertTrue(ok)

    def test_req_peer(self):
        c = self.client(self.unit, zmq.REQ)
        ok, body = c.call("stats", {})
        self.assertTrue(ok)
        self.assertEqual(body["capacity"], 64 << 20)
        ok, body = c.call("get", {"keys": ["absent"]})
        self.assertFalse(ok)
        self.assertEqual(body["blobs"], ["absent"])
        # The envelope a ROUTER sees from a REQ: the raw DEALER can send it too.
        self.c.send_raw(b"", peer.pack(["list", "delimited", {}]))
        frames = self.c.sock.recv_multipart() if self.c.sock.poll(peer.CALL_S * 1000) else []
        self.assertEqual(len(frames), 2)
        self.assertEqual(frames[0], b"")
        self.assertEqual(peer.unpack(frames[1]), ["delimited", True, []])


class TestBuiltins(UnitCase):
    """The built-in ops (docs/PROTOCOL.md, "Built-in ops"), read from the page: their exact
    maps on our unit, and a plain Protocol error from a peer that does not know them."""

    IDL = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "idl",
                       "storage.idl")

    def test_unknown_to_older_peers(self):
        if not PYTHON_UNIT:
            self.skipTest("our unit knows them")
        for op in ("_describe", "_health", "_stats"):
            body = self.error(op, {}, "Protocol")
            self.assertIn(op, body["msg"])

    def test_describe(self):
        if PYTHON_UNIT:
            self.skipTest("pyunit.py predates the built-ins")
        d = self.ok("_describe", {})
        self.assertEqual(set(d), {"service", "version", "ops", "idl", "idl_sha256"})
        self.assertEqual(d["service"], "storage")
        self.assertIn("put", d["ops"])
        self.assertEqual(len(d["idl"]), 1)
        self.assertEqual(set(d["idl"][0]), {"path", "text"})
        self.assertTrue(d["idl"][0]["path"].endswith("storage.idl"))
        with open(self.IDL, "rb") as f:
            text = f.read()
        self.assertEqual(d["idl"][0]["text"].encode(), text)
        texts = [f["text"].encode() for f in d["idl"]]
        want = hashlib.sha256(b"".join(b"%d:%s," % (len(t), t) for t in texts)).hexdigest()
        self.assertEqual(d["idl_sha256"], want)
        self.error("_describe", {"x": 1}, "Protocol")

    def test_health_and_stats(self):
        if PYTHON_UNIT:
            self.skipTest("pyunit.py predates the built-ins")
        h = self.ok("_health", {})
        self.assertEqual(set(h), {"status", "uptime_s", "in_flight", "service", "version"})
        self.assertEqual(h["status"], "serving")
        self.assertIsInstance(h["uptime_s"], float)
        self.assertEqual(h["in_flight"], 0)
        self.ok("put", {"key": "k", "data": b"v"})
        self.error("get", {"keys": ["nope"]}, "Missing")
        s = self.ok("_stats", {})
        self.assertEqual(set(s), {"service", "uptime_s", "totals", "ops"})
        self.assertEqual(set(s["totals"]), {
            "requests", "replies", "dropped", "send_failures", "unknown_op", "undeclared",
            "errors", "bytes_in", "bytes_out", "auth_denied", "handshake_failures",
            "accept_failures", "conn_refused", "connections", "disconnects", "expired"})
        self.assertEqual(s["totals"]["errors"]["Missing"], 1)
        for name in ("put", "get", "_describe", "_health", "_stats"):
            op = s["ops"][name]
            self.assertEqual(set(op), {"calls", "errors", "dropped", "p50_us", "p99_us",
                                       "max_us", "bytes_in", "bytes_out"}, name)
            self.assertLessEqual(op["p50_us"], op["p99_us"])
            self.assertLessEqual(op["p99_us"], op["max_us"])
        self.assertEqual(s["ops"]["put"]["calls"], 1)
        self.assertEqual(s["ops"]["get"]["errors"],
                         {"UnitFull": 0, "Busy": 0, "Missing": 1, "Protocol": 0})
        self.assertEqual(s["ops"]["_health"]["calls"], 1)


def main():
    global UNIT, PYTHON_UNIT
    ap = argparse.ArgumentParser()
    ap.add_argument("--unit", required=True)
    ap.add_argument("--python-unit", action="store_true",
                    help="--unit is a Python script, run with this interpreter")
    args, rest = ap.parse_known_args()
    UNIT = [sys.executable, args.unit] if args.python_unit else [args.unit]
    PYTHON_UNIT = args.python_unit
    unittest.main(argv=[sys.argv[0]] + rest, verbosity=2)


if __name__ == "__main__":
    main()
