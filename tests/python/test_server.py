"""The Python runtime against itself, and its Server against hostile and old peers.

    test_server.py [unittest args]

A Python Client calling a Python Server: values of every msgpack family both ways, each error
kind raised by a handler and reported to the caller (declared kinds with and without the op
listing them), a handler raising ValueError (a Protocol error; the server keeps serving),
`raises` enforced as the C unit does, notifies, the handlers' lock, close and drain. Raw sockets
send the Server what no client should: truncated msgpack, wrong frame counts, deep nesting, huge
length headers, args that are not a map, unknown ops, messages over the size limit; each is
dropped and counted or answered with a Protocol error, and the server goes on serving. A fake
peer (a raw ROUTER) answers the Client with the reference design's earlier error form
`[kind, msg]`, with malformed replies, and with a reply for another id. Four threads share one
Client.
"""

import os
import threading
import time
import unittest

import msgpack
import zmq

import ctlrpc
from ctlrpc import _wire

import support

CALL_S = 5.0


def pack(obj):
    return msgpack.packb(obj, use_bin_type=True)


def unpack(data):
    return msgpack.unpackb(data, raw=False)


class NotFound(ctlrpc.DeclaredError):
    kind = "NotFound"


class Gone(ctlrpc.DeclaredError):
    kind = "Gone"


class Raiser:
    """Handlers that raise what their args ask for."""

    def __init__(self):
        self.notified = []
        self.event = threading.Event()

    def fail(self, args):
        what = args.get("what")
        msg = args.get("msg", "it failed")
        if what == "UnitFull":
            raise ctlrpc.UnitFull(msg)
        if what == "Busy":
            raise ctlrpc.Busy(msg, reason=args.get("reason"))
        if what == "Missing":
            raise ctlrpc.Missing(msg, blobs=args.get("blobs", []))
        if what == "NotFound":
            raise NotFound(msg, reason=args.get("reason"))
        if what == "Gone":
            raise Gone(msg)
        if what == "Error":
            raise ctlrpc.Error(msg)
        if what == "Transfer":
            raise ctlrpc.Transfer(msg, cause="timeout")
        if what == "ValueError":
            raise ValueError(msg)
        if what == "unpackable":
            return object()
        return "no failure"

    def note(self, args):
        self.notified.append(args)
        self.event.set()
        if args.get("fail"):
            raise ValueError("a notify handler failed")


class ServerCase(unittest.TestCase):

    def setUp(self):
        self.r = Raiser()
        self.ctx = zmq.Context()
        self.socks = []
        self.server = self.serve()
        self.c = ctlrpc.Client(timeout=CALL_S)

    def tearDown(self):
        self.c.close()
        for s in self.socks:
            s.close(0)
        self.server.close()
        self.ctx.term()

    def serve(self, **kw):
        handlers = {"echo": lambda args: args.get("v"), "fail": self.r.fail,
                    "note": self.r.note, "args": lambda args: args}
        kw.setdefault("notify", ["note"])
        return ctlrpc.Server(handlers, "tcp://127.0.0.1:0", **kw)

    def raw(self, kind=zmq.DEALER, server=None):
        s = self.ctx.socket(kind)
        s.setsockopt(zmq.LINGER, 0)
        s.connect((server or self.server).endpoint)
        self.socks.append(s)
        return s

    def recv(self, sock, timeout_s=CALL_S):
        self.assertTrue(sock.poll(int(timeout_s * 1000)), "no reply")
        return sock.recv_multipart()

    def nothing(self, sock, timeout_s=0.2):
        self.assertFalse(sock.poll(int(timeout_s * 1000)), "an unexpected reply")

    def call(self, op, args=None, **kw):
        return self.c.call(self.server.endpoint, op, args, **kw)


class TestCalls(ServerCase):

    def test_values(self):
        for v in [None, True, False, 0, -1, 2 ** 64 - 1, -(2 ** 63), 1.5, "", "caf\u00e9",
                  b"", b"\0\xff" * 1000, [], [1, "a", b"b", None, [2.5]], {"k": {"n": [{}]}},
                  os.urandom(1 << 20)]:
            self.assertEqual(self.call("echo", {"v": v}), v)
        got = self.call("args", {"b": b"x", "s": "y"})
        self.assertEqual(got, {"b": b"x", "s": "y"})
        self.assertIsInstance(got["b"], bytes)
        self.assertEqual(self.call("args"), {})
        self.assertEqual(self.call("args", None), {})

    def test_error_kinds(self):
        ep = self.server.endpoint
        with self.assertRaises(ctlrpc.UnitFull) as cm:
            self.call("fail", {"what": "UnitFull", "msg": "no room"})
        self.assertEqual((cm.exception.msg, cm.exception.op, cm.exception.address),
                         ("no room", "fail", ep))
        self.assertEqual(str(cm.exception), "fail at %s: unit full: no room" % ep)
        with self.assertRaises(ctlrpc.Busy) as cm:
            self.call("fail", {"what": "Busy", "reason": "pinned"})
        self.assertEqual(cm.exception.reason, "pinned")
        with self.assertRaises(ctlrpc.Busy) as cm:
            self.call("fail", {"what": "Busy"})
        self.assertIsNone(cm.exception.reason)
        with self.assertRaises(ctlrpc.Missing) as cm:
            self.call("fail", {"what": "Missing", "blobs": ["a", "b"]})
        self.assertEqual(cm.exception.blobs, ["a", "b"])
        for what in ("Error", "Transfer"):
            with self.assertRaises(ctlrpc.Transfer) as cm:
                self.call("fail", {"what": what, "msg": "plain"})
            self.assertEqual((cm.exception.cause, cm.exception.remote_kind), ("remote", "Protocol"))
            self.assertEqual(cm.exception.msg, "plain")
        self.assertEqual(self.call("fail", {"what": "nothing"}), "no failure")

    def test_declared_kinds(self):
        with self.assertRaises(NotFound) as cm:
            self.call("fail", {"what": "NotFound", "msg": "no job", "reason": "expired"},
                      kinds={"NotFound": NotFound})
        e = cm.exception
        self.assertEqual((e.kind, e.msg, e.reason, e.op), ("NotFound", "no job", "expired", "fail"))
        self.assertIn("NotFound error: no job", str(e))
        # Not listed for the op: an unknown kind, that is Protocol, its kind and reason kept.
        with self.assertRaises(ctlrpc.Transfer) as cm:
            self.call("fail", {"what": "NotFound", "reason": "expired"}, kinds={"Gone": Gone})
        self.assertEqual((cm.exception.cause, cm.exception.remote_kind, cm.exception.reason),
                         ("remote", "NotFound", "expired"))
        out = self.c.call_many("fail", [(self.server.endpoint, {"what": "Gone"}),
                                        (self.server.endpoint, {"what": "NotFound"})],
                               kinds={"Gone": Gone})
        self.assertIsInstance(out[0].error, Gone)
        self.assertIs(type(out[1].error), ctlrpc.Transfer)

    def test_wire_error_maps(self):
        """The exact maps a Python unit sends: four keys, reason and blobs only where due."""
        s = self.raw()
        for args, want in [
                ({"what": "UnitFull", "msg": "m"},
                 {"kind": "UnitFull", "msg": "m", "reason": None, "blobs": None}),
                ({"what": "Busy", "msg": "m", "reason": "pinned"},
                 {"kind": "Busy", "msg": "m", "reason": "pinned", "blobs": None}),
                ({"what": "Missing", "msg": "m", "blobs": ["x"]},
                 {"kind": "Missing", "msg": "m", "reason": None, "blobs": ["x"]}),
                ({"what": "NotFound", "msg": "m", "reason": "r"},
                 {"kind": "NotFound", "msg": "m", "reason": "r", "blobs": None}),
                ({"what": "Error", "msg": "m"},
                 {"kind": "Protocol", "msg": "m", "reason": None, "blobs": None})]:
            s.send(pack(["fail", "0123456789ab", args]))
            reply = unpack(self.recv(s)[-1])
            self.assertEqual(reply, ["0123456789ab", False, want])

    def test_handler_exception_keeps_serving(self):
        with self.assertRaises(ctlrpc.Transfer) as cm:
            self.call("fail", {"what": "ValueError", "msg": "bad value"})
        self.assertEqual(cm.exception.remote_kind, "Protocol")
        self.assertIn("op 'fail'", cm.exception.msg)
        self.assertIn("ValueError: bad value", cm.exception.msg)
        with self.assertRaises(ctlrpc.Transfer) as cm:
            self.call("fail", {"what": "unpackable"})
        self.assertIn("cannot be packed", cm.exception.msg)
        self.assertEqual(self.call("echo", {"v": 1}), 1)
        # Counted once sent, which may be just after the caller has its reply.
        support.wait_for(lambda: self.server.stats()["replies"] == 3, "3 replies counted")

    def test_notify(self):
        s = self.raw()
        self.c.notify(self.server.endpoint, "note", {"n": 1})
        self.assertTrue(self.r.event.wait(CALL_S))
        self.assertEqual(self.r.notified, [{"n": 1}])
        # Nothing comes back, not even for a failing handler or bad args.
        s.send(pack(["note", "", {"fail": True}]))
        s.send(pack(["note", "abc", [1]]))
        s.send(pack(["note", "abc", {"n": 2}]))
        self.nothing(s)
        support.wait_for(lambda: len(self.r.notified) == 3, "the notifies")
        self.assertEqual(self.call("echo", {"v": "after"}), "after")
        self.assertEqual(self.c.stats(self.server.endpoint)["notifies"], 1)

    def test_empty_and_odd_ids(self):
        s = self.raw()
        for rid in ("", "x" * 256, "\u00e9" * 128, "\u00e9"):
            s.send(pack(["echo", rid, {"v": 7}]))
            self.assertEqual(unpack(self.recv(s)[-1]), [rid, True, 7])

    def test_dropped_messages_logged(self):
        """At debug, each dropped message and notify says why, naming the unit (the C unit's
        lines); a closed connection is said too."""
        ep = self.server.endpoint
        with self.assertLogs("ctlrpc", level="DEBUG") as logs:
            s = self.raw()
            s.send(b"not msgpack")
            s.send(pack(["echo", 5, {}]))
            s.send(pack(["newer", "", {}]))
            s.send(pack(["note", "", [1]]))
            s.send_multipart([b"a", b"b"])  # with the identity, 3 frames

            def text():
                return "\n".join(logs.output)
            support.wait_for(lambda: text().count("dropped a ") >= 5, "the five lines")
            s.close(0)
            self.socks.remove(s)
            support.wait_for(lambda: "a connection closed" in text(), "the closed connection")
        t = text()
        self.assertIn(f"ctlrpc server {ep}: dropped a message: not a msgpack array of 3", t)
        self.assertIn(f"ctlrpc server {ep}: dropped a message: the request id is not a string",
                      t)
        self.assertIn(f"ctlrpc server {ep}: dropped a message: a notify of unknown op 'newer'",
                      t)
        self.assertIn(f"ctlrpc server {ep}: dropped a notify of 'note': args must be a map, "
                      "not array", t)
        self.assertIn(f"ctlrpc server {ep}: dropped a message: 3 frames (the middle one is not "
                      "empty)", t)
        self.assertIn(f"ctlrpc server {ep}: a connection closed", t)

    def test_ext_args_named(self):
        s = self.raw()
        s.send(pack(["echo", "x1", msgpack.ExtType(1, b"abc")]))
        self.assertEqual(unpack(self.recv(s)[-1])[2]["msg"], "op 'echo': args must be a map, "
                         "not ext")

    def test_long_ids_dropped(self):
        """Every reply echoes the id: one over 256 bytes (UTF-8) is dropped and counted, never
        answered, so no peer can make each error or Busy reply as large as its request."""
        s = self.raw()
        before = self.server.stats()["dropped"]
        for rid in ("x" * 257, "\u00e9" * 129, "y" * 70000):
            s.send(pack(["echo", rid, {"v": 7}]))
            s.send(pack(["nope", rid, {}]))
        self.nothing(s)
        support.wait_for(lambda: self.server.stats()["dropped"] == before + 6, "6 dropped")

    def test_raises_enforced(self):
        strict = self.serve(raises={"fail": ["UnitFull", "NotFound"], "echo": []})
        ep = strict.endpoint
        try:
            with self.assertRaises(ctlrpc.UnitFull):
                self.c.call(ep, "fail", {"what": "UnitFull"})
            with self.assertRaises(NotFound):
                self.c.call(ep, "fail", {"what": "NotFound"}, kinds={"NotFound": NotFound})
            for what, kind in (("Busy", "Busy"), ("Missing", "Missing"), ("Gone", "Gone")):
                with self.assertRaises(ctlrpc.Transfer) as cm:
                    self.c.call(ep, "fail", {"what": what, "msg": "why"},
                                kinds={"Gone": Gone})
                self.assertEqual(cm.exception.remote_kind, "Protocol")
                self.assertEqual(cm.exception.msg,
                                 "op 'fail' failed with %s, which it does not declare in "
                                 "'raises' (a bug in the unit): why" % kind)
            # Protocol is implicit on every op; an op not in `raises` declares nothing.
            with self.assertRaises(ctlrpc.Transfer):
                self.c.call(ep, "fail", {"what": "Error"})
            with self.assertRaises(ctlrpc.Transfer):
                self.c.call(ep, "fail", {"what": "ValueError"})
            self.assertEqual(strict.stats()["undeclared"], 3)
        finally:
            strict.close()
        with self.assertRaises(ValueError):
            self.serve(raises={"nope": []})
        with self.assertRaises(ValueError):
            self.serve(notify=["nope"])

    def test_lock(self):
        lock = threading.Lock()
        held = self.serve(lock=lock)
        try:
            self.assertIs(held.lock, lock)
            with lock:
                with self.assertRaises(ctlrpc.Timeout):
                    self.c.call(held.endpoint, "echo", {"v": 1}, timeout=0.2)
            self.assertEqual(self.c.call(held.endpoint, "echo", {"v": 2}), 2)
        finally:
            held.close()

    def test_default_bind_and_close(self):
        os.environ["CTLRPC_NODE_IP"] = "127.0.0.1"
        try:
            self.assertEqual(ctlrpc.node_ip(), "127.0.0.1")
            s = ctlrpc.Server({"echo": lambda a: a})
        finally:
            del os.environ["CTLRPC_NODE_IP"]
        self.assertTrue(s.endpoint.startswith("tcp://127.0.0.1:"), s.endpoint)
        self.assertEqual(self.c.call(s.endpoint, "echo", {"a": 1}), {"a": 1})
        s.close()
        s.close()
        with self.assertRaises(ctlrpc.Timeout):
            self.c.call(s.endpoint, "echo", timeout=0.2)
        with self.assertRaises(OSError):
            ctlrpc.Server({}, self.server.endpoint)  # in use
        with self.assertRaises(ValueError):
            ctlrpc.Server({}, "tcp://127.0.0.1")


class TestMalformed(ServerCase):
    """What no client should send; each dropped and counted, or answered Protocol."""

    def protocol(self, sock, payload, says):
        sock.send(payload)
        reply = unpack(self.recv(sock)[-1])
        self.assertEqual(reply[:2], ["id", False], reply)
        self.assertEqual(reply[2]["kind"], "Protocol")
        self.assertIn(says, reply[2]["msg"])
        return reply[2]["msg"]

    def test_dropped(self):
        s = self.raw()
        dropped = [b"", b"\x93\xa4echo", pack("hi"), pack(["echo", "id"]),
                   pack([1, "id", {}]), pack(["echo", 2, {}]), pack(["echo", None, {}]),
                   b"\xdd\xff\xff\xff\xff", b"\x93\xdb\xff\xff\xff\xffecho", b"\xc1"]
        for payload in dropped:
            s.send(payload)
        # Wrong frame counts: [identity, "x", payload], [identity, "", "", payload], and
        # [identity] alone cannot be sent by a DEALER; a REQ-style delimiter is fine.
        good = pack(["echo", "id", {"v": 1}])
        s.send_multipart([b"x", good])
        s.send_multipart([b"", b"", good])
        self.nothing(s)
        support.wait_for(lambda: self.server.stats()["dropped"] == len(dropped) + 2,
                         "the drops to be counted")
        # bytes_in: every frame after the identity, of dropped messages too (as in C).
        sent = sum(map(len, dropped)) + 1 + 2 * len(good)
        self.assertEqual(self.server.stats()["bytes_in"], sent)
        s.send_multipart([b"", b"abc", b"defgh", good])  # 5 frames at the unit
        support.wait_for(lambda: self.server.stats()["dropped"] == len(dropped) + 3,
                         "the 5-frame message to be dropped")
        self.assertEqual(self.server.stats()["bytes_in"], sent + 8 + len(good))
        s.send_multipart([b"", good])
        self.assertEqual(self.recv(s), [b"", pack(["id", True, 1])])
        self.assertEqual(self.server.stats()["requests"], 1)

    def test_req_peer(self):
        s = self.raw(zmq.REQ)
        s.send(pack(["echo", "r", {"v": "req"}]))
        self.assertEqual(unpack(self.recv(s)[0]), ["r", True, "req"])

    def test_protocol_errors(self):
        s = self.raw()
        deep = {"v": 1}
        for _ in range(40):
            deep = {"v": deep}
        self.protocol(s, pack(["echo", "id", deep]), "nested too deeply")
        self.protocol(s, pack(["echo", "id", [[[[]]]]]), "args must be a map, not array")
        self.protocol(s, pack(["echo", "id", [1, 2]]), "args must be a map")
        self.protocol(s, pack(["echo", "id", "text"]), "args must be a map, not str")
        self.protocol(s, pack(["echo", "id", {1: 2}]), "op 'echo': arg names must be strings, "
                      "not int")
        self.protocol(s, pack(["echo", "id"])[:0] + b"\x93\xa4echo\xa2id\xdd\xff\xff\xff\xff",
                      "container count exceeds the message size")
        self.protocol(s, b"\x93\xa4echo\xa2id\x81\xa1v\xdb\xff\xff\xff\xffab",
                      "truncated")
        self.protocol(s, b"\x93\xa4echo\xa2id\x81\xa1v\xc6\xff\xff\xff\xff", "truncated")
        self.protocol(s, b"\x93\xa4echo\xa2id", "truncated")
        self.protocol(s, b"\x93\xa4echo\xa2id\xc1", "invalid byte")
        self.protocol(s, pack(["echo", "id", {}]) + b"\x00\x01", "2 trailing bytes")
        msg = self.protocol(s, pack(["nope\n", "id", {}]), "unknown op")
        self.assertIn("nope\\x0a", msg)  # as the C unit shows it
        self.protocol(s, pack(["nope", "id", [1]]), "unknown op 'nope'")
        self.assertEqual(self.call("echo", {"v": "still serving"}), "still serving")
        support.wait_for(lambda: self.server.stats()["replies"] == 14, "14 replies counted")
        st = self.server.stats()
        self.assertEqual((st["dropped"], st["requests"]), (0, 14))

    def test_repeated_arg_refused(self):
        """A key given twice in the args is a Protocol error naming it, as the C unit says;
        a notify's is dropped."""
        s = self.raw()
        self.protocol(s, b"\x93\xa4echo\xa2id\x82\xa1v\x01\xa1v\x02", "arg v: given twice")
        self.protocol(s, b"\x93\xa4echo\xa2id\xde\x00\x02\xa1v\x01\xa1v\x02",
                      "arg v: given twice")
        self.assertEqual(self.call("echo", {"v": 3}), 3)

    def test_unknown_notify_dropped(self):
        """A notify of an op the unit does not know (a newer client's: notifies send the empty
        id) gets nothing back, not even an error, and is counted in `dropped`; with any other
        id the same op is refused."""
        s = self.raw()
        before = self.server.stats()["dropped"]
        s.send(pack(["newer", "", {}]))
        self.nothing(s)
        support.wait_for(lambda: self.server.stats()["dropped"] == before + 1,
                         "the notify to be counted as dropped")
        self.protocol(s, pack(["newer", "id", {}]), "unknown op 'newer'")
        self.assertEqual(self.server.stats()["dropped"], before + 1)

    def test_oversize(self):
        small = self.serve(max_msg_bytes=1000)
        try:
            s = self.raw(server=small)
            s.send(pack(["echo", "id", {"v": b"x" * 2000}]))
            self.nothing(s, 0.3)  # ZeroMQ disconnects the peer; nothing reaches the server
            self.assertEqual(small.stats()["requests"], 0)
            self.assertEqual(self.c.call(small.endpoint, "echo", {"v": b"x" * 500}), b"x" * 500)
        finally:
            small.close()


class FakeUnit:
    """A raw ROUTER that answers each request with what `answer(request)` returns (a list of
    payload frames), so a test can send the Client what no unit of ours would."""

    def __init__(self, answer):
        self.ctx = zmq.Context()
        self.sock = self.ctx.socket(zmq.ROUTER)
        self.sock.setsockopt(zmq.LINGER, 0)
        self.sock.bind("tcp://127.0.0.1:*")
        self.address = self.sock.getsockopt(zmq.LAST_ENDPOINT).decode()
        self.answer = answer
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self.run, daemon=True)
        self.thread.start()

    def run(self):
        while not self.stop.is_set():
            if not self.sock.poll(20):
                continue
            frames = self.sock.recv_multipart()
            req = unpack(frames[-1])
            for reply in self.answer(req):
                self.sock.send_multipart([frames[0]] + reply)

    def close(self):
        self.stop.set()
        self.thread.join(CALL_S)
        self.sock.close(0)
        self.ctx.term()


class TestReplies(ServerCase):

    def fake(self, answer):
        f = FakeUnit(answer)
        self.addCleanup(f.close)
        return f

    def test_old_error_form(self):
        """[kind, msg], the reference design's earlier error form, read like the map."""
        f = self.fake(lambda req: [[pack([req[1], False, req[2]["body"]])]])
        def err(body, **kw):
            with self.assertRaises(ctlrpc.Error) as cm:
                self.c.call(f.address, "op", {"body": body}, **kw)
            return cm.exception
        e = err(["Busy", "old busy"])
        self.assertIs(type(e), ctlrpc.Busy)
        self.assertEqual((e.msg, e.reason), ("old busy", None))
        e = err(["Missing", "old missing"])
        self.assertEqual((type(e), e.blobs), (ctlrpc.Missing, []))
        self.assertIs(type(err(["UnitFull", "full"])), ctlrpc.UnitFull)
        e = err(["Protocol", "p"])
        self.assertEqual((type(e), e.cause, e.remote_kind), (ctlrpc.Transfer, "remote", "Protocol"))
        e = err(["Weird", "w"])
        self.assertEqual((e.cause, e.remote_kind, e.msg), ("remote", "Weird", "w"))
        self.assertIs(type(err(["NotFound", "n"], kinds={"NotFound": NotFound})), NotFound)
        self.assertEqual(err(["Busy", None]).msg, "")
        # Neither form: a bad reply.
        for body in ([1, "m"], ["Busy", 2], ["Busy"], ["Busy", "m", "x"], "text", None,
                     {"msg": "no kind"}, {"kind": "Busy", "reason": 5},
                     {"kind": "Missing", "blobs": [1]}, {"kind": "Busy", "msg": b"bin"}):
            e = err(body)
            self.assertEqual((type(e), e.cause), (ctlrpc.Transfer, "bad-reply"), body)
        # The documented map, with extra keys ignored.
        e = err({"kind": "Missing", "msg": "m", "reason": None, "blobs": ["a"], "x": 1})
        self.assertEqual(e.blobs, ["a"])
        # An error reply of either form is its call's own: the socket stays in the pool.
        self.assertEqual(self.c.stats(f.address)["sockets_retired"], 0)

    def test_bad_replies(self):
        def answer(req):
            how = req[2]["how"]
            rid = req[1]
            if how == "not-array":
                return [[pack({"id": rid})]]
            if how == "two-frames":
                return [[pack([rid, True, 1]), b"more"]]
            if how == "ok-not-bool":
                return [[pack([rid, 1, 1])]]
            if how == "trailing":
                return [[pack([rid, True, 1]) + b"\x00"]]
            if how == "deep":
                return [[b"\x93" + pack(rid) + b"\xc3" + b"\x91" * 40 + b"\x01"]]
            if how == "huge":
                return [[b"\x93" + pack(rid) + b"\xc3\xdd\xff\xff\xff\xff"]]
            if how == "other-id-first":
                return [[pack(["zzzzzzzzzzzz", True, "stale"])], [pack([rid, True, "mine"])]]
            return [[pack([rid, True, "fine"])]]
        f = self.fake(answer)
        for how, says in (("not-array", "not a msgpack array of 3"),
                          ("two-frames", "more than one frame"),
                          ("ok-not-bool", "ok flag is not a bool"),
                          ("trailing", "1 trailing bytes"), ("deep", "nested too deeply"),
                          ("huge", "container count exceeds the message size")):
            with self.assertRaises(ctlrpc.Transfer) as cm:
                self.c.call(f.address, "op", {"how": how})
            self.assertEqual(cm.exception.cause, "bad-reply", how)
            self.assertIn(says, str(cm.exception))
        self.assertEqual(self.c.stats(f.address)["sockets_retired"], 6)
        # A reply for another id is counted and skipped; the call gets its own; the socket,
        # having seen a stranger's reply, is retired rather than lent again.
        self.assertEqual(self.c.call(f.address, "op", {"how": "other-id-first"}), "mine")
        st = self.c.stats(f.address)
        self.assertEqual((st["late_replies"], st["sockets_retired"]), (1, 7))
        self.assertEqual(self.c.call(f.address, "op", {"how": "ok"}), "fine")


class TestDrain(ServerCase):

    def test_drain(self):
        started = threading.Event()
        def slow(args):
            started.set()
            time.sleep(0.4)
            return "slow done"
        s = ctlrpc.Server({"slow": slow, "echo": lambda a: "served"}, "tcp://127.0.0.1:0")
        results = {}
        def call_slow():
            results["slow"] = self.c.call(s.endpoint, "slow")
        t = threading.Thread(target=call_slow)
        t.start()
        self.assertTrue(started.wait(CALL_S))
        d = threading.Thread(target=s.drain, args=(3.0,))
        t0 = time.monotonic()
        d.start()
        support.wait_for(lambda: s._draining, "the drain to begin")  # the handler still runs
        # A notify of an op this unit does not know (the empty id) is dropped, not answered
        # Busy: the reply would come to its client's next call.
        raw = self.raw(server=s)
        raw.send(pack(["newer", "", {}]))
        self.nothing(raw)
        # A request that reaches the unit while it drains is answered Busy "draining".
        other = ctlrpc.Client(timeout=CALL_S)
        try:
            with self.assertRaises(ctlrpc.Busy) as cm:
                other.call(s.endpoint, "echo")
            self.assertEqual(cm.exception.reason, "draining")
        finally:
            other.close()
        d.join(CALL_S)
        t.join(CALL_S)
        took = time.monotonic() - t0
        self.assertEqual(results["slow"], "slow done")  # the running handler finished
        self.assertLess(took, 2.0)  # quiet after 50 ms: well before the drain's timeout
        with self.assertRaises(ctlrpc.Timeout):
            self.c.call(s.endpoint, "echo", timeout=0.2)
        s.close()

    def test_close_from_a_handler(self):
        holder = {}
        def stop(args):
            holder["server"].close()
            return "stopping"
        s = holder["server"] = ctlrpc.Server({"stop": stop}, "tcp://127.0.0.1:0")
        # The handler's reply goes out before the socket closes. A bare DEALER reads it
        # whenever it gets to it; a ctlrpc client (ZMQ_IMMEDIATE) may lose a reply it has not
        # read when the connection goes (docs/API.md, "A reply and the connection's end").
        d = self.raw(server=s)
        d.send(pack(["stop", "000000000001", {}]))
        self.assertEqual(unpack(self.recv(d)[-1]), ["000000000001", True, "stopping"])
        support.wait_for(lambda: not s._thread.is_alive(), "the server thread to end")
        with self.assertRaises(ctlrpc.Timeout):
            self.c.call(s.endpoint, "stop", timeout=0.2)

    def test_drain_idle(self):
        s = self.serve()
        t0 = time.monotonic()
        s.drain(5.0)
        self.assertLess(time.monotonic() - t0, 1.0)
        s.drain(5.0)
        s.close()


class TestThreads(ServerCase):

    def test_four_threads_share_a_client(self):
        per_thread = 200
        failures = []
        def work(n):
            try:
                for i in range(per_thread):
                    v = [n, i, os.urandom(i % 64)]
                    got = self.call("echo", {"v": v})
                    if got != v:
                        failures.append((n, i, got))
                out = self.c.call_many("echo", [(self.server.endpoint, {"v": n})] * 3)
                if [o.result for o in out] != [n] * 3:
                    failures.append((n, "call_many", out))
            except Exception as e:  # reported below, in the test's thread
                failures.append((n, repr(e)))
        threads = [threading.Thread(target=work, args=(n,)) for n in range(4)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(60)
        self.assertEqual(failures, [])
        st = self.c.stats(self.server.endpoint)
        self.assertEqual(st["calls"], 4 * (per_thread + 3))
        self.assertEqual((st["timeouts"], st["late_replies"], st["sockets_retired"]), (0, 0, 0))
        self.assertLessEqual(st["sockets_opened"], 16)
        support.wait_for(lambda: self.server.stats()["replies"] == 4 * (per_thread + 3),
                         "every reply counted")


class TestBounds(ServerCase):
    """The bounds on hostile peers, as the C unit's (the hostile-peer suite runs the attacks)."""

    def test_reply_bound(self):
        """A result over max_reply_bytes is a Protocol error saying so; one within is sent."""
        srv = self.serve(max_reply_bytes=1000)
        try:
            with self.assertRaises(ctlrpc.Transfer) as cm:
                self.c.call(srv.endpoint, "echo", {"v": [b"x" * 100] * 50})
            self.assertIn("larger than this unit's max_reply_bytes (1000 bytes", str(cm.exception))
            self.assertEqual(self.c.call(srv.endpoint, "echo", {"v": b"x" * 900}), b"x" * 900)
            self.assertEqual(srv.op_stats()["ops"]["echo"]["errors"]["Protocol"], 1)
            # An error is bounded as a result is: a Missing listing more than that.
            with self.assertRaises(ctlrpc.Transfer) as cm:
                self.c.call(srv.endpoint, "fail", {"what": "Missing", "msg": "gone",
                                                   "blobs": ["k%04d" % i for i in range(500)]})
            self.assertEqual(cm.exception.remote_kind, "Protocol")
            self.assertRegex(cm.exception.msg, r"^the Missing reply is \d+ bytes, larger than "
                             r"this unit's max_reply_bytes \(1000 bytes\): ask for less in one "
                             r"call$")
            with self.assertRaises(ctlrpc.Missing) as cm:
                self.c.call(srv.endpoint, "fail", {"what": "Missing", "blobs": ["a", "b"]})
            self.assertEqual(cm.exception.blobs, ["a", "b"])
        finally:
            srv.close()

    def test_handshakes_go_on_under_slow_requests(self):
        """With the connection caps on (the ZAP handler), a peer that floods the unit with slow
        requests does not keep a new client out: its handshake is answered between them, not
        after a whole batch (200 x 30 ms here, past the 2 s handshake timeout)."""
        started = threading.Event()

        def slow(args):
            started.set()
            time.sleep(0.03)
            return 1
        srv = ctlrpc.Server({"slow": slow, "echo": lambda a: a.get("v")}, "tcp://127.0.0.1:0",
                            max_connections=100, handshake_timeout=2.0)
        flood = self.raw(server=srv)
        try:
            for i in range(200):
                flood.send(pack(["slow", "f%d" % i, {}]))
            self.assertTrue(started.wait(CALL_S), "the flood did not start")
            client = ctlrpc.Client(timeout=3.0)
            try:
                t0 = time.monotonic()
                self.assertEqual(client.call(srv.endpoint, "echo", {"v": 5}), 5)
                self.assertLess(time.monotonic() - t0, 3.0)
            finally:
                client.close()
        finally:
            srv.close()

    def test_unread_replies_bound(self):
        """A peer that sends requests and does not read the replies: once the large replies
        queued for its connection reach max_queued_reply_bytes, its further requests are
        answered Busy "replies_unread" without running; once it has read, it is served."""
        ran = []
        size, n = 256 << 10, 200

        def big(args):
            ran.append(1)
            return b"b" * size
        srv = ctlrpc.Server({"big": big}, "tcp://127.0.0.1:0", max_queued_reply_bytes=1 << 20)
        try:
            d = self.ctx.socket(zmq.DEALER)
            self.socks.append(d)
            d.setsockopt(zmq.LINGER, 0)
            d.setsockopt(zmq.RCVHWM, 1)
            d.setsockopt(zmq.RCVBUF, 4096)
            d.connect(srv.endpoint)
            for i in range(n):
                d.send(_wire.pack_request("big", "q%d" % i, {}))
            support.wait_for(lambda: srv.stats()["requests"] >= n,
                             "every request answered or refused", 30)
            served = busy = 0
            for _ in range(n):
                _rid, ok, body = msgpack.unpackb(self.recv(d, 30)[-1], raw=False)
                if ok:
                    self.assertEqual(len(body), size)
                    served += 1
                    continue
                err = body
                self.assertEqual((err["kind"], err["reason"]), ("Busy", "replies_unread"), err)
                self.assertRegex(err["msg"], r"^op 'big': \d+ bytes of replies to this "
                                 r"connection are unread \(max_queued_reply_bytes 1048576\)")
                busy += 1
            self.assertGreater(busy, 0)
            self.assertEqual(served + busy, n)
            self.assertEqual(len(ran), served)  # the refused ones did not run
            # Read: served again (libzmq frees the last reply read a moment after it left).
            def again():
                d.send(_wire.pack_request("big", "after", {}))
                return msgpack.unpackb(self.recv(d, 30)[-1], raw=False)[1]
            support.wait_for(again, "served again once the replies were read", 10)
        finally:
            srv.close()

    def test_packed_size(self):
        """packed_size counts what pack makes, and stops once past the limit."""
        for v in (None, True, 1, -1, 300, -300, 1 << 40, 1.5, "", "a" * 40, "é" * 200,
                  b"x" * 300, [1, [2, {"k": b"v"}]], {str(i): i for i in range(20)},
                  ["s" * 70000, b"b" * 70000]):
            self.assertEqual(_wire.packed_size(v, 1 << 30), len(_wire.pack(v)), repr(v)[:40])
        self.assertGreater(_wire.packed_size([b"x" * 100] * 1000000, 1000), 1000)
        self.assertIsNone(_wire.packed_size(object(), 1000))

    def test_connection_cap(self):
        """Connections over max_connections are refused (ZAP 500) and counted."""
        srv = self.serve(max_connections=2)
        try:
            clients = [ctlrpc.Client(timeout=CALL_S) for _ in range(2)]
            for c in clients:
                c.call(srv.endpoint, "echo", {"v": 1})
            for n in range(2):
                d = self.raw(server=srv)
                d.setsockopt(zmq.RECONNECT_IVL, 60000)
                support.wait_for(lambda: srv.stats()["accepted"] >= 3 + n,
                                 "the server to count the connection", CALL_S)
            support.wait_for(lambda: srv.stats()["conn_refused"] >= 1,
                             "a connection over the cap refused and counted", CALL_S)
            for c in clients:
                c.close()
        finally:
            srv.close()

    def test_set_allowlist(self):
        """set_allowlist takes effect for new handshakes; bad lists leave the old one."""
        if not ctlrpc.curve.available():
            self.skipTest("no CURVE in this libzmq")
        upub, usec = ctlrpc.curve.keypair()
        apub, asec = ctlrpc.curve.keypair()
        bpub, bsec = ctlrpc.curve.keypair()
        srv = self.serve(curve_secret=usec, curve_allow=[apub])
        try:
            def call(sec):
                with ctlrpc.Client(timeout=CALL_S, curve_server_key=upub,
                                   curve_secret=sec) as c:
                    return c.call(srv.endpoint, "echo", {"v": 7})
            self.assertEqual(call(asec), 7)
            with self.assertRaises(ctlrpc.Transfer):
                call(bsec)
            self.assertEqual(srv.set_allowlist([apub, bpub]), 2)
            self.assertEqual(call(bsec), 7)
            for bad, words in (([], "lists no keys"), ([usec], "the unit's own secret key"),
                               (["nope"], "not a 40-character Z85 key")):
                with self.assertRaises(ValueError) as cm:
                    srv.set_allowlist(bad)
                self.assertIn(words, str(cm.exception))
            self.assertEqual(call(bsec), 7)  # the old list stays
        finally:
            srv.close()
        with self.assertRaises(ValueError):
            self.server.set_allowlist([apub])  # no allowlist to replace

    def test_failed_handshakes_logged(self):
        """A CURVE unit logs a client that does not hold its public key at warning (the C
        unit's words) and counts it in handshake_failures; a plaintext client is counted too
        (whether the unit or the client sees the mismatch first is a race, so its line may be
        the unit's mechanism line or a debug line for a broken handshake)."""
        if not ctlrpc.curve.available():
            self.skipTest("no CURVE in this libzmq")
        upub, usec = ctlrpc.curve.keypair()
        opub, _ = ctlrpc.curve.keypair()
        cpub, csec = ctlrpc.curve.keypair()
        srv = self.serve(curve_secret=usec)
        try:
            with self.assertLogs("ctlrpc", level="WARNING") as logs:
                with ctlrpc.Client(timeout=0.5, curve_server_key=opub, curve_secret=csec) as c:
                    with self.assertRaises(ctlrpc.Transfer):
                        c.call(srv.endpoint, "echo", {"v": 1})
                support.wait_for(lambda: any("CURVE authentication failed" in line
                                             for line in logs.output),
                                 "the failed handshake logged", CALL_S)
            self.assertIn(f"ctlrpc server {srv.endpoint}: refused a connection's handshake: "
                          "CURVE authentication failed (the client does not hold this unit's "
                          "public key?) (ZeroMQ protocol error 0x11000001)",
                          "\n".join(logs.output))
            support.wait_for(lambda: srv.stats()["handshake_failures"] >= 1,
                             "the failed handshake counted", CALL_S)
            before = srv.stats()["handshake_failures"]
            with ctlrpc.Client(timeout=0.5) as c:
                with self.assertRaises(ctlrpc.Transfer):
                    c.call(srv.endpoint, "echo", {"v": 1})
            support.wait_for(lambda: srv.stats()["handshake_failures"] > before,
                             "the plaintext client's handshake counted", CALL_S)
        finally:
            srv.close()


class TestMisuse(unittest.TestCase):
    """A caller's mistakes: each a TypeError or ValueError naming what is at fault, before
    anything is sent or started (nothing left open, nothing hangs)."""

    def test_client_options(self):
        for kw, says in ((dict(late_grace="x"), "late_grace"),
                         (dict(late_grace=float("nan")), "late_grace"),
                         (dict(late_grace=-1), "late_grace"),
                         (dict(idle_timeout="x"), "idle_timeout"),
                         (dict(max_msg_bytes="x"), "max_msg_bytes"),
                         (dict(max_msg_bytes=2 ** 63), "max_msg_bytes"),
                         (dict(max_idle_per_address="x"), "max_idle_per_address"),
                         (dict(context="x"), "context"),
                         (dict(curve_server_key=5), "curve_server_key"),
                         (dict(curve_server_key="short"), "curve_server_key")):
            with self.assertRaises((TypeError, ValueError), msg=kw) as cm:
                ctlrpc.Client(**kw)
            self.assertIn(says, str(cm.exception), kw)
        self.assertIn("neither a 40-character Z85 key nor a key file",
                      str(self._raised(lambda: ctlrpc.Client(curve_server_key="short"))))
        with self.assertRaises(TypeError):
            ctlrpc.RetryPolicy(transparent="no")

    @staticmethod
    def _raised(fn):
        try:
            fn()
        except Exception as e:  # noqa: BLE001 (the test looks at it)
            return e
        raise AssertionError("nothing raised")

    def test_calls(self):
        c = ctlrpc.Client(timeout=1.0)
        try:
            for address in (4000, b"tcp://127.0.0.1:1", None):
                with self.assertRaises(TypeError) as cm:
                    c.call(address, "echo")
                self.assertIn("endpoint must be a str", str(cm.exception))
            with self.assertRaises(ValueError) as cm:
                c.call("tcp://_bad-host:4000", "echo")
            self.assertIn("starts with a letter or a digit", str(cm.exception))
            for targets in (None, "abc", [("tcp://127.0.0.1:1",)]):
                with self.assertRaises(TypeError) as cm:
                    c.call_many("echo", targets)
                self.assertIn("call_many echo", str(cm.exception))
            # The longest endpoint is C's: 299 bytes (a 253-byte host name fits).
            from ctlrpc import net
            self.assertEqual(net.parse_endpoint("tcp://" + "a" * 253 + ":4000").port, 4000)
            with self.assertRaises(ValueError) as cm:
                c.call("tcp://" + "a" * 300 + ":4000", "echo")
            self.assertIn("longer than 299 bytes", str(cm.exception))
        finally:
            c.close()

    def test_server_arguments(self):
        for args, kw, says in (((None,), {}, "handlers must be a mapping"),
                               (({"h": lambda a: 1}, 5), {}, "endpoint must be a str"),
                               (({"h": lambda a: 1},), {"notify": "h"}, "not one str"),
                               (({"h": lambda a: 1},), {"lock": 5}, "lock must be a lock")):
            with self.assertRaises(TypeError, msg=says) as cm:
                ctlrpc.Server(*args, **kw)
            self.assertIn(says, str(cm.exception))

    def test_keygen_prefix(self):
        with self.assertRaises(ValueError) as cm:
            ctlrpc.curve.keygen("")
        self.assertIn("names no file", str(cm.exception))
        with self.assertRaises(TypeError):
            ctlrpc.curve.keygen(None)

    def test_registration_arguments(self):
        from ctlrpc import directory
        s = ctlrpc.Server({"h": lambda a: 1}, "tcp://127.0.0.1:0", name="svc")
        etcd = "http://127.0.0.1:1"  # never reached: the arguments are refused first
        try:
            for kw, says in ((dict(advertise="tcp://x"), "registration: advertise"),
                             (dict(advertise="tcp://!!:1"), "registration: advertise"),
                             (dict(advertise="tcp://127.0.0.1:*"), "wildcard"),
                             (dict(lease_ttl=100000), "out of range (2 to 86400 s)")):
                with self.assertRaises(ValueError, msg=kw) as cm:
                    s.register(etcd, **kw)
                self.assertIn(says, str(cm.exception), kw)
        finally:
            s.close()
        with self.assertRaises(ValueError) as cm:
            s.register(etcd, advertise="tcp://127.0.0.1:4000")
        self.assertIn("is closed", str(cm.exception))
        with self.assertRaises(ValueError) as cm:
            ctlrpc.Etcd("http://127.0.0.1:1,,http://127.0.0.1:2")
        self.assertIn("empty etcd endpoint", str(cm.exception))
        ctlrpc.Etcd("http://127.0.0.1:1,")  # a trailing comma, as in C
        with self.assertRaises(ValueError) as cm:
            directory.Directory(etcd, "svc", start_timeout=-1)
        self.assertIn("start_timeout", str(cm.exception))


class TestWireUnits(unittest.TestCase):
    """The pieces the rest rely on, checked alone."""

    def test_wire_check(self):
        ok = pack(["a", [1, {"b": b"c"}], None])
        self.assertEqual(_wire.wire_check(ok)[:2], (_wire.WIRE_OK, len(ok)))
        self.assertEqual(_wire.wire_check(b"\x91" * 33 + b"\x01")[0], _wire.WIRE_TOO_DEEP)
        self.assertEqual(_wire.wire_check(b"\x91" * 32 + b"\x01")[0], _wire.WIRE_OK)
        self.assertEqual(_wire.wire_check(b"\x90")[0], _wire.WIRE_OK)
        self.assertEqual(_wire.wire_check(b"")[0], _wire.WIRE_TRUNCATED)
        self.assertEqual(_wire.wire_check(b"\xdc\x00\x05\x01")[0], _wire.WIRE_BAD_COUNT)
        self.assertEqual(_wire.wire_check(b"\xd9")[0], _wire.WIRE_TRUNCATED)
        limits = _wire.Limits(max_items=3)
        self.assertEqual(_wire.wire_check(b"\x93\x01\x02\x03", limits=limits)[0],
                         _wire.WIRE_TOO_MANY)

    def test_keys(self):
        pub, sec = ctlrpc.curve.keypair()
        self.assertTrue(ctlrpc.curve.key_valid(pub))
        self.assertEqual(ctlrpc.curve.public_of(sec), pub)
        self.assertFalse(ctlrpc.curve.key_valid(pub[:-1] + "~"))
        self.assertFalse(ctlrpc.curve.key_valid("%%%%%" * 8))  # decodes past 2**32

    def test_endpoints(self):
        from ctlrpc import net
        self.assertEqual(str(net.parse_endpoint("tcp://127.0.0.1:0")), "tcp://127.0.0.1:*")
        self.assertEqual(str(net.parse_endpoint("tcp://[::1]:80")), "tcp://[::1]:80")
        for bad in ("tcp://[::1:80", "tcp://h:65536", "tcp://h:", "tcp://:1", "tcp://h:1x"):
            with self.assertRaises(ValueError):
                net.parse_endpoint(bad)
        os.environ["CTLRPC_NODE_IP"] = "not-an-ip"
        try:
            with self.assertRaises(ValueError):
                ctlrpc.node_ip()
        finally:
            del os.environ["CTLRPC_NODE_IP"]
        self.assertTrue(ctlrpc.node_ip())


if __name__ == "__main__":
    import logging
    logging.getLogger("ctlrpc").setLevel(logging.CRITICAL)  # handler failures are expected
    support.run_tests(support.main()[1])
