"""The Python runtime's decoders on the C fuzz targets' corpora and on seeded random mutations.

    test_fuzz.py --corpus tests/fuzz/corpus [--mutations N] [unittest args]

Every file of tests/fuzz/corpus/ (fuzz_unit: requests as a unit receives them; fuzz_reply:
replies as a client receives them; fuzz_endpoint: endpoint strings), split into messages the
way the C targets split them (tests/fuzz/fuzz.h: messages separated by 0xc1 "CTL", each with a
leading byte that picks the framing), and a bounded number of seeded mutations of them, go
through the Python paths that judge what a peer sent. Each may end only in its documented
outcomes:

    _wire.decode_request     a Request (op and id strings; args a dict of str keys, or `bad`
                             saying what is wrong), or DropRequest
    _wire.decode_reply       a Reply, or BadReply
    _wire.error_from_body    an errors.Error, never an exception
    server.Dispatch.handle   None (dropped or silent), or frames whose last is a reply that
                             decodes, with an error map of exactly the four keys
    net.parse_endpoint       an Endpoint, or ValueError

Any other exception is a failure, reported with the input that caused it.
"""

import argparse
import logging
import os
import random
import sys
import unittest

import ctlrpc
from ctlrpc import _wire, errors, net, server

SEP = b"\xc1CTL"
CORPUS = None
MUTATIONS = 20000
SEED = 20240601

INTERESTING = [b"\xc1", b"\xdd\xff\xff\xff\xff", b"\xdf\xff\xff\xff\xff", b"\xdb\xff\xff\xff\xff",
               b"\xc6\xff\xff\xff\xff", b"\x91" * 40, b"\x81" * 40, b"\x93", b"\xc3", b"\xc2",
               b"\xa0", b"\x80", b"\x90", b"\xc0", b"\xd4\xff\x00", b"\xc7\x00\xff"]


class NotFound(ctlrpc.DeclaredError):
    kind = "NotFound"


def dispatcher():
    """A dispatch core with storage-like handlers that look at their args carelessly (so bad
    args make them raise anything at all)."""
    blobs = {}

    def put(args):
        if len(args["data"]) > 64:
            raise ctlrpc.UnitFull("too big")
        if args.get("pin"):
            raise ctlrpc.Busy("pinned", reason="pinned")
        blobs[args["key"]] = args["data"]
        return len(args["data"])

    def get(args):
        gone = [k for k in args["keys"] if k not in blobs]
        if gone:
            raise ctlrpc.Missing("missing", blobs=gone)
        return [blobs[k] for k in args["keys"]]

    def find(args):
        raise NotFound("nothing", reason=str(args.get("key")))

    handlers = {"put": put, "get": get, "find": find, "stats": lambda a: {"blobs": len(blobs)},
                "unpin": lambda a: None, "delete": lambda a: len(a["keys"])}
    return server.Dispatch(handlers, notify=["unpin"],
                           raises={"put": ["UnitFull"], "get": ["Missing"], "find": ["NotFound"]},
                           name="storage")


def messages(data):
    """The messages of one fuzz input (fuzz.h's framing: split at SEP, at most 32)."""
    return data.split(SEP)[:32]


def mutate(rng, data):
    data = bytearray(data)
    for _ in range(rng.randint(1, 4)):
        how = rng.randrange(6)
        at = rng.randrange(len(data) + 1)
        if how == 0 and data:
            data[min(at, len(data) - 1)] = rng.randrange(256)
        elif how == 1:
            data[at:at] = bytes([rng.randrange(256)])
        elif how == 2 and data:
            del data[at:at + rng.randint(1, 8)]
        elif how == 3:
            del data[at:]
        elif how == 4:
            data[at:at] = rng.choice(INTERESTING)
        else:
            data[at:at] = data[rng.randrange(len(data) + 1):][:rng.randint(1, 16)]
    return bytes(data)


class TestDecoders(unittest.TestCase):

    @classmethod
    def setUpClass(cls):
        cls.inputs = {}
        for target in ("fuzz_unit", "fuzz_reply", "fuzz_endpoint"):
            d = os.path.join(CORPUS, target)
            files = sorted(os.listdir(d))
            assert files, "empty corpus " + d
            cls.inputs[target] = []
            for name in files:
                with open(os.path.join(d, name), "rb") as f:
                    cls.inputs[target].append((name, f.read()))

    def check(self, what, data, fn):
        try:
            fn(data)
        except AssertionError:
            raise
        except Exception as e:
            self.fail("%s(%r) raised %s: %s" % (what, data[:200], type(e).__name__, e))

    # ---- the judges --------------------------------------------------------------------------

    def request(self, payload):
        try:
            rq = _wire.decode_request(payload)
        except _wire.DropRequest as e:
            self.assertTrue(e.why)
            return
        self.assertIsInstance(rq.op, str)
        self.assertIsInstance(rq.id, str)
        if rq.bad is None:
            self.assertIsInstance(rq.args, dict)
            # A key that is not a str is the first one such, named for the layer that judges.
            odd = [k for k in rq.args if type(k) is not str]
            self.assertEqual(rq.has_odd_key, bool(odd))
            if odd:
                self.assertEqual(rq.odd_key, odd[0])
        else:
            self.assertIsNone(rq.args)
            self.assertIsInstance(rq.bad, str)

    def reply(self, payload):
        try:
            r = _wire.decode_reply(payload)
        except _wire.BadReply as e:
            self.assertTrue(e.why)
            return
        self.assertIsInstance(r.id, str)
        self.assertIsInstance(r.ok, bool)
        if not r.ok:
            for kinds in ({}, {"NotFound": NotFound}):
                err = _wire.error_from_body(r.body, "tcp://127.0.0.1:1", "op", kinds)
                self.assertIsInstance(err, errors.Error)
                self.assertIsInstance(str(err), str)
                if isinstance(err, errors.Transfer):
                    self.assertIn(err.cause, ("remote", "bad-reply"))

    def dispatch(self, core, mode, payload):
        """One message as the fuzz_unit target frames it (its first byte's mode)."""
        ident = b"\x00peer"
        frames = {4: [ident, b"", payload], 5: [ident, b"x", payload], 6: [ident],
                  7: [ident, b"", b"", payload]}.get(mode, [ident, payload])
        out = core.handle(frames)
        if out is None:
            return
        self.assertEqual(out[0], ident)
        self.assertEqual(len(out), 3 if mode == 4 else 2)
        r = _wire.decode_reply(out[-1])
        if not r.ok:
            self.assertEqual(set(r.body), {"kind", "msg", "reason", "blobs"})
            self.assertIn(r.body["kind"], ("UnitFull", "Busy", "Missing", "Protocol", "NotFound"))

    def endpoint(self, text):
        try:
            net.parse_endpoint(text)
        except ValueError:
            pass

    # ---- the runs --------------------------------------------------------------------------

    def run_unit(self, data, core):
        for msg in messages(data):
            self.check("decode_request", msg, self.request)
            if msg:
                self.check("decode_request", msg[1:], self.request)
                self.check("dispatch", msg, lambda m: self.dispatch(core, m[0] % 8, m[1:]))

    def run_reply(self, data):
        self.check("decode_reply", data, self.reply)
        for msg in messages(data[1:]):
            self.check("decode_reply", msg, self.reply)
            self.check("decode_reply", msg[1:], self.reply)

    def run_endpoint(self, data):
        text = data.decode("utf-8", "surrogateescape")
        self.check("parse_endpoint", text, self.endpoint)

    def test_corpus(self):
        core = dispatcher()
        for name, data in self.inputs["fuzz_unit"]:
            with self.subTest(unit=name):
                self.run_unit(data, core)
        for name, data in self.inputs["fuzz_reply"]:
            with self.subTest(reply=name):
                self.run_reply(data)
        for name, data in self.inputs["fuzz_endpoint"]:
            with self.subTest(endpoint=name):
                self.run_endpoint(data)
        st = core.counters
        self.assertGreater(st["requests"], 0)
        self.assertGreater(st["dropped"], 0)

    def test_mutations(self):
        rng = random.Random(SEED)
        core = dispatcher()
        unit = [d for _, d in self.inputs["fuzz_unit"]]
        reply = [d for _, d in self.inputs["fuzz_reply"]]
        endpoint = [d for _, d in self.inputs["fuzz_endpoint"]]
        for i in range(MUTATIONS):
            self.run_unit(mutate(rng, rng.choice(unit)), core)
            self.run_reply(mutate(rng, rng.choice(reply)))
            if i % 8 == 0:
                self.run_endpoint(mutate(rng, rng.choice(endpoint)))


if __name__ == "__main__":
    logging.getLogger("ctlrpc").setLevel(logging.CRITICAL)  # careless handlers fail on purpose
    parser = argparse.ArgumentParser()
    parser.add_argument("--corpus", required=True)
    parser.add_argument("--mutations", type=int, default=MUTATIONS)
    opts, rest = parser.parse_known_args()
    CORPUS, MUTATIONS = opts.corpus, opts.mutations
    unittest.main(argv=[sys.argv[0]] + rest, verbosity=2)
