"""The Python runtime's Client against the C storage unit (ctl-storage-unit).

    test_c_unit.py --unit PATH/ctl-storage-unit [unittest args]

Every op of the storage service (docs/STORAGE.md) and every error kind as the Python client
reports it: UnitFull (a small --capacity), Busy (deleting a pinned blob), Missing, Protocol (an
unknown op, bad args: Transfer with cause "remote"), a timeout (the unit frozen with SIGSTOP)
and the late reply that follows it, counted; call_many with a dead address among live ones under
one deadline; notifies, in order with the calls that follow them on one connection.
"""

import os
import time
import unittest

import msgpack
import zmq

import ctlrpc

import support

UNIT = None


class UnitCase(unittest.TestCase):

    def setUp(self):
        self.procs = []
        self.unit = self.start()
        self.c = ctlrpc.Client(timeout=10.0)

    def tearDown(self):
        self.c.close()
        for p in self.procs:
            self.assertEqual(p.stop(), 0, "unit exit status")

    def start(self, capacity="64M"):
        # The deadline check off: test_timeout_then_late_reply needs the request it gave up on
        # to run once the unit is thawed, however late the machine lets it.
        p = support.Process([UNIT, "--bind", "tcp://127.0.0.1:0", "--capacity", capacity,
                             "--deadline-skew-ms", "-1"])
        self.procs.append(p)
        return p

    def call(self, op, args=None, **kw):
        return self.c.call(self.unit.address, op, args, **kw)


class TestOps(UnitCase):

    def test_put_get_describe(self):
        blobs = {"empty": b"", "nuls": b"\0\x01\0\xff" * 1000, "mib": os.urandom(1 << 20),
                 "caf\u00e9/\u6f22": b"unicode key"}
        for k, v in blobs.items():
            r = self.call("put", {"key": k, "data": v})
            self.assertEqual(r, len(v))
            self.assertIs(type(r), int)
        order = ["mib", "empty", "caf\u00e9/\u6f22", "nuls"]
        self.assertEqual(self.call("get", {"keys": order}), [blobs[k] for k in order])
        self.assertEqual(self.call("put", {"key": "p", "data": b"y", "pin": True}), 1)
        self.assertEqual(self.call("describe", {"keys": ["p", "nuls"]}),
                         [{"key": "p", "size": 1, "pinned": True, "spilled": False},
                          {"key": "nuls", "size": 4000, "pinned": False, "spilled": False}])

    def test_pin_notify_delete_list_stats(self):
        for k in "abcd":
            self.call("put", {"key": k, "data": k.encode()})
        self.assertEqual(self.call("pin", {"keys": ["a", "b"]}), 2)
        # Notifies ride the connection the next call takes, so they arrive first.
        self.c.notify(self.unit.address, "unpin", {"keys": ["a", "nope"]})
        self.c.notify(self.unit.address, "abort", {"keys": ["a", "b", "c"]})
        self.assertEqual(self.call("list"), ["b", "d"])
        self.assertEqual(self.call("list", {"prefix": "d"}), ["d"])
        self.assertEqual(self.call("list", {"after": "b", "limit": 5}), ["d"])
        self.c.notify(self.unit.address, "unpin", {"keys": ["b"]})
        self.assertEqual(self.call("delete", {"keys": ["b", "d", "zz"]}), 2)
        st = self.call("stats")
        self.assertEqual((st["blobs"], st["bytes"], st["pinned"], st["dropped"]), (0, 0, 0, 0))
        self.assertEqual(st["requests"], 13)  # 10 calls and 3 notifies
        mine = self.c.stats(self.unit.address)
        self.assertEqual((mine["calls"], mine["notifies"], mine["timeouts"]), (10, 3, 0))
        self.assertEqual((mine["sockets_opened"], mine["sockets_retired"]), (1, 0))
        self.assertIn(self.unit.address, self.c.stats())


class TestFrames(UnitCase):

    def test_bytes_in_every_frame(self):
        """`bytes_in` counts every frame after the identity, of a dropped message too: the
        frames past the third included (as the Python unit does)."""
        def totals():
            return self.call("_stats")["totals"]

        s = zmq.Context.instance().socket(zmq.DEALER)
        s.setsockopt(zmq.LINGER, 0)
        s.connect(self.unit.address)
        try:
            good = msgpack.packb(["_health", "x1", {}])
            s.send(good)
            self.assertTrue(s.poll(10000))
            s.recv_multipart()
            before = totals()
            s.send_multipart([b"", b"abc", b"defgh", good])  # 5 frames at the unit: dropped
            support.wait_for(lambda: totals()["dropped"] == before["dropped"] + 1,
                             "the message to be dropped")
            after = totals()
            # The _stats calls made meanwhile are counted too: each [op, a 26-byte id, {}].
            calls = after["requests"] - before["requests"]
            one = len(msgpack.packb(["_stats", "0" * 26, {}]))
            self.assertEqual(after["bytes_in"] - before["bytes_in"],
                             3 + 5 + len(good) + calls * one)
        finally:
            s.close()


class TestErrors(UnitCase):

    def test_unit_full(self):
        small = self.start(capacity="1K")
        with self.assertRaises(ctlrpc.UnitFull) as cm:
            self.c.call(small.address, "put", {"key": "big", "data": b"x" * 4096})
        e = cm.exception
        self.assertEqual((e.kind, e.op, e.address), ("UnitFull", "put", small.address))
        self.assertTrue(e.msg)
        self.assertTrue(str(e).startswith("put at %s: unit full: " % small.address), str(e))

    def test_busy_pinned(self):
        self.call("put", {"key": "k", "data": b"v", "pin": True})
        with self.assertRaises(ctlrpc.Busy) as cm:
            self.call("delete", {"keys": ["k"]})
        self.assertEqual(cm.exception.reason, "pinned")
        self.assertEqual(cm.exception.kind, "Busy")
        with self.assertRaises(ctlrpc.Busy):
            self.call("put", {"key": "k", "data": b"w"})

    def test_missing(self):
        self.call("put", {"key": "here", "data": b"1"})
        with self.assertRaises(ctlrpc.Missing) as cm:
            self.call("get", {"keys": ["gone", "here", "lost"]})
        self.assertEqual(cm.exception.blobs, ["gone", "lost"])
        self.assertIn("2 blob(s) missing", str(cm.exception))

    def test_protocol(self):
        with self.assertRaises(ctlrpc.Transfer) as cm:
            self.call("no_such_op")
        e = cm.exception
        self.assertEqual((e.cause, e.remote_kind, e.kind), ("remote", "Protocol", "Protocol"))
        self.assertIn("no_such_op", str(e))
        with self.assertRaises(ctlrpc.Transfer) as cm:
            self.call("put", {"key": "k"})  # data missing
        self.assertIn("data", cm.exception.msg)
        with self.assertRaises(ctlrpc.Transfer):
            self.call("get", {"keys": "not a list"})
        # A declared kind the op does not list is still Protocol: no class is substituted.
        class NotFound(ctlrpc.DeclaredError):
            kind = "NotFound"
        with self.assertRaises(ctlrpc.Transfer):
            self.call("no_such_op", kinds={"NotFound": NotFound})

    def test_timeout_then_late_reply(self):
        self.call("stats")
        self.unit.freeze()
        try:
            t0 = time.monotonic()
            with self.assertRaises(ctlrpc.Timeout) as cm:
                self.call("stats", timeout=0.3)
            took = time.monotonic() - t0
        finally:
            self.unit.thaw()
        e = cm.exception
        self.assertIsInstance(e, ctlrpc.Transfer)
        self.assertEqual(e.cause, "timeout")
        self.assertIn("no reply within 300 ms", str(e))
        self.assertGreaterEqual(took, 0.29)
        self.assertLess(took, 2.0)
        # The unit answers the retired socket once thawed: a late reply, counted (within the
        # socket's grace period), never seen by a later call.
        support.wait_for(lambda: self.c.stats(self.unit.address)["late_replies"] == 1,
                         "the late reply to be counted", 5)
        self.assertEqual(self.call("stats")["requests"], 3)
        st = self.c.stats(self.unit.address)
        self.assertEqual((st["timeouts"], st["sockets_retired"], st["late_replies"]), (1, 1, 1))

    def test_call_many_one_dead(self):
        self.call("put", {"key": "k", "data": b"12345"})
        other = self.start()
        dead = support.dead_address()
        t0 = time.monotonic()
        out = self.c.call_many("stats", [(self.unit.address, None), (dead, None),
                                         (other.address, {}), (self.unit.address, None)],
                               timeout=0.5)
        took = time.monotonic() - t0
        self.assertEqual([o.address for o in out],
                         [self.unit.address, dead, other.address, self.unit.address])
        self.assertEqual([o.ok for o in out], [True, False, True, True])
        self.assertEqual(out[0].result["blobs"], 1)
        self.assertEqual(out[2].result["blobs"], 0)
        self.assertIsNone(out[0].error)
        # Nothing listens there: refused, before the batch's deadline.
        self.assertIsInstance(out[1].error, ctlrpc.Transfer)
        self.assertEqual(out[1].error.cause, "refused")
        self.assertEqual(out[1].error.address, dead)
        self.assertLess(took, 1.5)  # one deadline for the batch
        # Errors come back per target with their own kinds.
        out = self.c.call_many("get", [(self.unit.address, {"keys": ["k"]}),
                                       (other.address, {"keys": ["k"]})], timeout=5)
        self.assertEqual(out[0].result, [b"12345"])
        self.assertIsInstance(out[1].error, ctlrpc.Missing)
        self.assertEqual(out[1].error.blobs, ["k"])

    def test_bad_addresses(self):
        for bad in ("", "udp://1.2.3.4:5", "tcp://127.0.0.1:*", "tcp://*:4000",
                    "tcp://127.0.0.1"):
            with self.assertRaises(ValueError):
                self.c.call(bad, "stats")
        with self.assertRaises(ValueError):
            self.c.call_many("stats", [(self.unit.address, None), ("nope", None)])
        with self.assertRaises(TypeError):
            self.call("put", {"key": object()})


if __name__ == "__main__":
    opts, argv = support.main("unit")
    UNIT = opts.unit
    support.run_tests(argv)
