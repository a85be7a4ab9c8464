"""The built-in ops and the generic caller `ctlrpc`, against the C unit (ctl-storage-unit) and a
unit in generated Python (pystorage.py): the same assertions on both.

    test_caller.py --unit CTL_STORAGE_UNIT --gen CTLRPC_GEN --caller CTLRPC --pyunit PYUNIT

- Builtins*: the exact maps of _describe, _health and _stats (docs/PROTOCOL.md), the IDL hash
  rule, describe turned off, a built-in given args.
- Caller*: every storage op through `ctlrpc call` with the IDL fetched by _describe (the
  idempotent ones passed on as such, in this process), fan-out,
  ops (service doc, records, kinds), health, stats (table in line, JSON, Prometheus text),
  exit codes, suggestions, a missing argument, --idl (and a warning for another service's),
  --raw refused for results it cannot write and with several addresses, the bool words, an
  address without tcp://, addresses given twice, a failure while fetching the IDL (unreachable,
  timeout, refused handshake) named as the op's.
- CallerMisc: a C and a Python unit on tcp://[::1]:0 (skipped: no ::1 where the machine has
  no IPv6 loopback), failures reported before the deadline (refused, unresolved, auth), keygen
  and CURVE (key files only, the other half of a pair refused), a declared kind's error line, a
  down unit under --prometheus, local failures (--idl, keygen), a peer without the built-ins
  (tests/interop/pyunit.py), and the evolution case: a new op added to a copy of storage.idl,
  reached with no code change.
"""

import base64
import contextlib
import hashlib
import io
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
import unittest
from unittest import mock

HERE = os.path.dirname(os.path.abspath(__file__))
TOP = os.path.normpath(os.path.join(HERE, "..", ".."))
sys.path.insert(0, os.path.join(TOP, "tests", "python"))

import ctlrpc  # noqa: E402

import support  # noqa: E402

IDL = os.path.join(TOP, "idl", "storage.idl")
OPTS = None


def c_unit(*extra, bind="tcp://127.0.0.1:0"):
    return support.Process([OPTS.unit, "--bind", bind, *extra])


def py_unit(*extra, idl=IDL, bind="tcp://127.0.0.1:0"):
    return support.Process([sys.executable, os.path.join(HERE, "pystorage.py"), "--gen",
                            OPTS.gen, "--idl", idl, "--bind", bind, *extra])


class Run:
    def __init__(self, r, took):
        self.status = r.returncode
        self.out = r.stdout.decode("utf-8", "replace")
        self.err = r.stderr.decode("utf-8", "replace")
        self.took = took

    def json(self):
        return json.loads(self.out)

    def rows(self):
        return [json.loads(line) for line in self.out.splitlines() if line.strip()]


def caller(*args, stdin=None):
    t0 = time.monotonic()
    r = subprocess.run([sys.executable, OPTS.caller, *args], input=stdin, capture_output=True,
                       timeout=support.RUN_S)
    return Run(r, time.monotonic() - t0)


class UnitCase(unittest.TestCase):
    """Runs against one unit: KIND "c" or "py"."""

    KIND = ""

    def start(self, *extra):
        p = (c_unit if self.KIND == "c" else py_unit)(*extra)
        self.addCleanup(p.stop)
        return p

    def setUp(self):
        self.unit = self.start()
        self.addr = self.unit.address
        self.client = ctlrpc.Client(5.0)
        self.addCleanup(self.client.close)


# ---- the built-in ops ------------------------------------------------------------------------

class Builtins(UnitCase):
    def test_describe(self):
        d = self.client.call(self.addr, "_describe")
        self.assertEqual(set(d), {"service", "version", "ops", "idl", "idl_sha256"})
        self.assertEqual(d["service"], "storage")
        self.assertEqual(d["version"], ctlrpc.__version__)
        self.assertEqual(d["ops"], ["put", "get", "describe", "pin", "unpin", "abort", "delete",
                                    "list", "stats"])
        self.assertEqual(len(d["idl"]), 1)
        self.assertEqual(set(d["idl"][0]), {"path", "text"})
        self.assertEqual(os.path.basename(d["idl"][0]["path"]), "storage.idl")
        self.assertFalse(os.path.isabs(d["idl"][0]["path"]))
        with open(IDL, "rb") as f:
            data = f.read()
        self.assertEqual(d["idl"][0]["text"].encode("utf-8"), data)
        self.assertIn("\nidempotent op get(keys: list<str>)", d["idl"][0]["text"])
        self.assertEqual(d["idl_sha256"],
                         hashlib.sha256(b"%d:%s," % (len(data), data)).hexdigest())
        with self.assertRaises(ctlrpc.Transfer) as cm:
            self.client.call(self.addr, "_describe", {"x": 1})
        self.assertIn("takes no arguments", str(cm.exception))

    def test_describe_off(self):
        u = self.start("--no-describe")
        with self.assertRaises(ctlrpc.Transfer) as cm:
            self.client.call(u.address, "_describe")
        self.assertEqual(cm.exception.remote_kind, "Protocol")
        self.assertIn("describe is turned off on this unit", str(cm.exception))
        self.assertEqual(self.client.call(u.address, "_health")["status"], "serving")
        r = caller("call", u.address, "list")
        self.assertEqual(r.status, 6, r.err)
        self.assertIn("describe is turned off on this unit: pass --idl FILE", r.err)
        r = caller("call", u.address, "list", "--idl", IDL)
        self.assertEqual((r.status, r.json()), (0, []), r.err)

    def test_health(self):
        h = self.client.call(self.addr, "_health")
        self.assertEqual(set(h), {"status", "uptime_s", "in_flight", "service", "version"})
        self.assertEqual((h["status"], h["in_flight"], h["service"], h["version"]),
                         ("serving", 0, "storage", ctlrpc.__version__))
        self.assertIsInstance(h["uptime_s"], float)
        self.assertGreaterEqual(h["uptime_s"], 0.0)

    def test_stats(self):
        c = self.client
        c.call(self.addr, "put", {"key": "k", "data": b"v"})
        with self.assertRaises(ctlrpc.Missing):
            c.call(self.addr, "get", {"keys": ["nope"]})
        with self.assertRaises(ctlrpc.Transfer):
            c.call(self.addr, "nosuchop")
        c.call(self.addr, "_health")
        s = c.call(self.addr, "_stats")
        self.assertEqual(set(s), {"service", "uptime_s", "totals", "ops"})
        self.assertEqual(s["service"], "storage")
        self.assertIsInstance(s["uptime_s"], float)
        t = s["totals"]
        self.assertEqual(set(t), {
            "requests", "replies", "dropped", "send_failures", "unknown_op", "undeclared",
            "errors", "bytes_in", "bytes_out", "auth_denied", "handshake_failures",
            "accept_failures", "conn_refused", "connections", "disconnects", "expired"})
        self.assertEqual((t["requests"], t["replies"], t["unknown_op"], t["dropped"]),
                         (5, 4, 1, 0))
        self.assertEqual(t["errors"], {"UnitFull": 0, "Busy": 0, "Missing": 1, "Protocol": 0})
        self.assertGreater(t["bytes_in"], 0)
        self.assertGreater(t["bytes_out"], 0)
        self.assertEqual(list(s["ops"]), ["put", "get", "describe", "pin", "unpin", "abort",
                                          "delete", "list", "stats", "_describe", "_health",
                                          "_stats"])
        for name, op in s["ops"].items():
            self.assertEqual(set(op), {"calls", "errors", "dropped", "p50_us", "p99_us",
                                       "max_us", "bytes_in", "bytes_out"}, name)
            self.assertLessEqual(op["p50_us"], op["p99_us"], name)
            self.assertLessEqual(op["p99_us"], op["max_us"], name)
            self.assertEqual(set(op["errors"]), {"UnitFull", "Busy", "Missing", "Protocol"},
                             name)
        self.assertEqual(s["ops"]["put"]["calls"], 1)
        self.assertGreater(s["ops"]["put"]["bytes_out"], 0)
        self.assertEqual(s["ops"]["get"]["errors"],
                         {"UnitFull": 0, "Busy": 0, "Missing": 1, "Protocol": 0})
        self.assertEqual(s["ops"]["_health"]["calls"], 1)
        self.assertEqual(s["ops"]["_stats"]["calls"], 1)  # this request is counted
        self.assertEqual(s["ops"]["_stats"]["bytes_out"], 0)  # its reply is not sent yet
        self.assertEqual(s["ops"]["pin"]["calls"], 0)
        # Connection events are counted as the unit's monitor reports them (a moment later).
        support.wait_for(lambda: c.call(self.addr, "_stats")["totals"]["connections"] == 1,
                         "one connection counted")
        # A notify whose args do not fit its IDL types is dropped (PROTOCOL.md): no reply,
        # counted in its op's dropped, not as an error.
        c.notify(self.addr, "unpin", {"keys": 5})
        support.wait_for(lambda: c.call(self.addr, "_stats")["ops"]["unpin"]["dropped"] == 1,
                         "the bad notify counted")
        self.assertEqual(c.call(self.addr, "_stats")["ops"]["unpin"]["errors"]["Protocol"], 0)

    def test_latency_buckets(self):
        """p50/p99 are bucket edges (1, 2, 3, 4, 5, 6, 7, 8, 10, 12, ...) or max_us."""
        edges = {1, 2, 3, 4}
        for e in range(2, 34):
            edges.update((5 + sub) << (e - 2) for sub in range(4))
        for _ in range(20):
            self.client.call(self.addr, "list")
        op = self.client.call(self.addr, "_stats")["ops"]["list"]
        for k in ("p50_us", "p99_us"):
            self.assertTrue(op[k] in edges or op[k] == op["max_us"], (k, op))
        self.assertGreaterEqual(op["p50_us"] * 5, op["max_us"] if op["p50_us"] ==
                                op["max_us"] else 0)


class BuiltinsC(Builtins):
    KIND = "c"


class BuiltinsPy(Builtins):
    KIND = "py"


# ---- the caller -----------------------------------------------------------------------------

PROM_LINE = re.compile(r'^(?P<name>[a-zA-Z_:][a-zA-Z0-9_:]*)'
                       r'(?P<labels>\{[a-zA-Z_][a-zA-Z0-9_]*="(?:\\.|[^"\\])*"'
                       r'(?:,[a-zA-Z_][a-zA-Z0-9_]*="(?:\\.|[^"\\])*")*\})? '
                       r'(?P<value>-?[0-9.e+-]+|NaN|\+Inf|-Inf)$')


def check_prometheus(test, text):
    """Every line a HELP, a TYPE or a sample of the family whose TYPE came last; a family's
    HELP and TYPE once, before its samples. Returns {(name, labels): value}."""
    samples = {}
    typed = {}
    current = None
    test.assertTrue(text.endswith("\n"))
    for line in text.splitlines():
        if line.startswith("# HELP "):
            name = line.split(" ")[2]
            test.assertNotIn(name, typed, "HELP after TYPE: " + line)
            continue
        if line.startswith("# TYPE "):
            _, _, name, kind = line.split(" ")
            test.assertNotIn(name, typed, "a second TYPE: " + line)
            test.assertIn(kind, ("counter", "gauge"))
            typed[name] = kind
            current = name
            continue
        mt = PROM_LINE.match(line)
        test.assertIsNotNone(mt, "not a sample line: " + line)
        test.assertEqual(mt.group("name"), current, "a sample outside its family: " + line)
        samples[(mt.group("name"), mt.group("labels") or "")] = float(mt.group("value"))
    return samples


def column_starts(line):
    """The offsets where the words of a table line end (columns are right-aligned numbers)."""
    return [m.end() for m in re.finditer(r"\S+", line)]


def check_columns(test, text):
    """Every table of `ctlrpc stats`: each op's line ends its numeric columns where the
    header's do."""
    lines = text.splitlines()
    for i, line in enumerate(lines):
        if not line.startswith("  OP "):
            continue
        head = column_starts(line)
        for row in lines[i + 1:]:
            if not row.startswith("  "):
                break
            ends = column_starts(row)
            # CALLS, then (after ERRORS, left-aligned) the six numeric columns: their ends
            # match the header's, wherever the ERRORS column's width comes out.
            test.assertEqual(ends[1], head[1], row)
            test.assertEqual(ends[-6:] if not row.startswith("  (totals)") else ends[-2:],
                             head[-6:] if not row.startswith("  (totals)") else head[-2:],
                             (line, row))


def caller_module():
    """tools/ctlrpc/ctlrpc_caller.py, imported in this process (as the launcher finds it)."""
    for p in (os.path.join(TOP, "tools", "ctlrpc"), os.path.join(TOP, "gen")):
        if p not in sys.path:
            sys.path.insert(0, p)
    import ctlrpc_caller
    return ctlrpc_caller


class Caller(UnitCase):
    def test_idempotent_ops_are_called_so(self):
        """The caller knows the idempotent ops from what _describe hands out, and passes
        idempotent=True for them (and only them) to call and call_many."""
        cc = caller_module()
        d = self.client.call(self.addr, "_describe")
        model = cc.load_idl_texts(d["idl"], self.addr)
        self.assertEqual(cc.idempotent_ops(model),
                         {"get", "describe", "pin", "list", "stats"})
        seen = []

        class Recording(ctlrpc.Client):
            def call(self, address, op, *a, **kw):
                if not op.startswith("_"):
                    seen.append(("call", op, kw.get("idempotent")))
                return super().call(address, op, *a, **kw)

            def call_many(self, op, *a, **kw):
                if not op.startswith("_"):
                    seen.append(("call_many", op, kw.get("idempotent")))
                return super().call_many(op, *a, **kw)

        other = self.start().address  # a fan-out needs two units (one address is one call)
        out = io.StringIO()
        with mock.patch.object(cc.ctlrpc, "Client", Recording), \
                contextlib.redirect_stdout(out):
            self.assertEqual(cc.main(["call", self.addr, "put", "key=i", "data=x"]), 0)
            self.assertEqual(cc.main(["call", self.addr, "get", 'keys=["i"]']), 0)
            self.assertEqual(cc.main(["call", "-a", self.addr, "-a", other, "stats"]), 0)
            self.assertEqual(cc.main(["call", "-a", self.addr, "-a", other, "delete",
                                      'keys=["i"]']), 0)
        self.assertEqual(seen, [("call", "put", False), ("call", "get", True),
                                ("call_many", "stats", True), ("call_many", "delete", False)])
        j = caller("ops", self.addr, "--json").json()
        self.assertEqual({op["name"]: op["idempotent"] for op in j["ops"]},
                         {"put": False, "get": True, "describe": True, "pin": True,
                          "unpin": False, "abort": False, "delete": False, "list": True,
                          "stats": True})
        r = caller("ops", self.addr)
        self.assertIn("  idempotent op get(keys: list<str>) -> list<bin> raises Missing;", r.out)

    def call(self, *args, status=0, stdin=None):
        r = caller("call", self.addr, *args, stdin=stdin)
        self.assertEqual(r.status, status, (args, r.out, r.err))
        return r

    def test_every_op(self):
        self.assertEqual(self.call("put", "key=a", "data=hello").json(), 5)
        with tempfile.NamedTemporaryFile() as f:
            f.write(b"\x00\x01binary\xff")
            f.flush()
            self.assertEqual(self.call("put", "key=b", "data=@" + f.name, "pin=true").json(), 9)
        self.assertEqual(self.call("put", "key=c", "data=-", stdin=b"from stdin").json(), 10)
        self.assertEqual(self.call("get", 'keys=["a","b","c"]').json(),
                         [base64.b64encode(x).decode() for x in
                          (b"hello", b"\x00\x01binary\xff", b"from stdin")])
        r = self.call("get", "--raw", 'keys=["b"]')
        self.assertEqual(r.out.encode("utf-8", "surrogateescape")[:2], b"\x00\x01")
        self.assertEqual(self.call("describe", "--json", '{"keys": ["a", "b"]}').json(),
                         [{"key": "a", "size": 5, "pinned": False, "spilled": False},
                          {"key": "b", "size": 9, "pinned": True, "spilled": False}])
        self.assertEqual(self.call("pin", 'keys=["a"]').json(), 1)
        self.assertEqual(self.call("unpin", 'keys=["a","b"]').out, "")
        self.assertEqual(self.call("abort", 'keys=["c"]').out, "")
        self.assertEqual(self.call("list", "prefix=", "limit=10").json(), ["a", "b"])
        self.assertEqual(self.call("delete", 'keys=["a"]').json(), 1)
        st = self.call("stats").json()
        self.assertEqual((st["blobs"], st["pinned"]), (1, 0))
        self.assertEqual(self.call("list", "--json", '{"prefix": "b"}').json(), ["b"])

    def test_retries(self):
        self.call("put", "key=rp", "data=x", "pin=true")
        r = self.call("put", "key=rp", "data=y", "--retries", "2", status=4)
        self.assertNotIn("attempts", r.err)  # Busy is retried only with --retry-busy
        r = self.call("put", "key=rp", "data=y", "--retries", "2", "--retry-busy", status=4)
        self.assertIn("(after 3 attempts)", r.err)
        r = self.call("list", "--retries", "x", status=2)
        self.assertIn("'x' is not a number of retries", r.err)
        dead = support.dead_address()
        r = caller("call", dead, "list", "--idl", IDL, "--retries", "1")
        self.assertEqual(r.status, 8, r.err)
        self.assertIn("nothing was sent (after 2 attempts)", r.err)

    def test_error_statuses(self):
        r = self.call("get", 'keys=["nope"]', status=5)
        self.assertIn("Missing", r.err)
        self.assertIn("nope", r.err)
        self.call("put", "key=p", "data=x", "pin=true")
        r = self.call("put", "key=p", "data=y", status=4)
        self.assertIn("Busy", r.err)
        r = self.call("gett", 'keys=["a"]', status=2)
        self.assertIn("has no op 'gett'; did you mean 'get'?", r.err)
        r = self.call("put", "kye=a", "data=x", status=2)
        self.assertIn("has no argument 'kye'; did you mean 'key'?", r.err)
        r = self.call("put", "data=x", status=2)
        self.assertIn("missing required argument 'key' (str)", r.err)
        r = self.call("list", "limit=-1", status=2)
        self.assertIn("out of range for u32", r.err)
        r = self.call("get", "keys=a", status=2)
        self.assertIn("expected list<str> as JSON", r.err)
        r = self.call("get", "--json", '{"keys": [1]}', status=2)
        self.assertIn("argument 'keys'[0]: expected str, got an integer", r.err)
        r = self.call("pin", "keys", status=2)
        self.assertIn("not name=value", r.err)

    def test_unit_full(self):
        u = self.start("--capacity", "16")
        r = caller("call", u.address, "put", "key=k", "data=" + "x" * 64)
        self.assertEqual(r.status, 3, r.err)
        self.assertIn("UnitFull", r.err)

    def test_fan_out(self):
        other = self.start()
        dead = support.dead_address()
        self.call("put", "key=a", "data=1")
        r = caller("call", "--address", self.addr, "--address", other.address,
                   "--address", dead, "list", "--timeout", "10")
        self.assertEqual(r.status, 8, r.err)
        self.assertLess(r.took, 5)
        rows = r.rows()
        self.assertEqual([x["address"] for x in rows], [self.addr, other.address, dead])
        self.assertEqual(rows[0]["result"], ["a"])
        self.assertEqual(rows[1]["result"], [])
        self.assertEqual(rows[2]["error"]["kind"], "Unreachable")
        self.assertEqual(rows[2]["error"]["cause"], "refused")

    def test_ops(self):
        r = caller("ops", self.addr)
        self.assertEqual(r.status, 0, r.err)
        self.assertIn("op put(key: str, data: bin, pin: bool = false) -> u64 raises UnitFull, "
                      "Busy;", r.out)
        self.assertIn("notify unpin(keys: list<str>);", r.out)
        self.assertIn("Store `data` under `key`", r.out)
        j = caller("ops", self.addr, "--json").json()
        self.assertEqual(j["service"], "storage")
        put = j["ops"][0]
        self.assertEqual((put["name"], put["result"], put["raises"]),
                         ("put", "u64", ["UnitFull", "Busy"]))
        self.assertEqual([(a["name"], a["type"], a["required"]) for a in put["args"]],
                         [("key", "str", True), ("data", "bin", True), ("pin", "bool", False)])
        r = caller("ops", "--idl", IDL)  # no unit needed
        self.assertEqual(r.status, 0, r.err)
        self.assertIn("op list(prefix: str = \"\"", r.out)

    def test_health(self):
        r = caller("health", self.addr)
        self.assertEqual(r.status, 0, r.err)
        self.assertRegex(r.out, r"serving\s+[0-9.]+\s+0\s+storage \(")
        j = caller("health", self.addr, "--json").json()
        self.assertEqual(j[0]["address"], self.addr)
        self.assertEqual(j[0]["health"]["status"], "serving")

    def test_stats(self):
        self.call("put", "key=a", "data=1")
        self.call("get", 'keys=["zz"]', status=5)
        other = self.start()
        r = caller("stats", self.addr, other.address)
        self.assertEqual(r.status, 0, r.err)
        self.assertIn("service storage", r.out)
        self.assertRegex(r.out, r"\n  get\s+1 Missing=1 ")
        check_columns(self, r.out)
        self.assertRegex(r.out, r"\n  put\s+1 0 ")
        self.assertIn(other.address, r.out)
        j = caller("stats", "--json", self.addr).json()
        self.assertEqual(j[0]["stats"]["ops"]["get"]["errors"]["Missing"], 1)
        r = caller("stats", "--prometheus", self.addr, support.dead_address())
        self.assertEqual(r.status, 8, r.err)
        got = check_prometheus(self, r.out)
        lab = '{address="%s",service="storage",op="get",kind="Missing"}' % self.addr
        self.assertEqual(got[("ctlrpc_op_errors_total", lab)], 1)
        lab = '{address="%s",service="storage",op="put"}' % self.addr
        self.assertEqual(got[("ctlrpc_op_calls_total", lab)], 1)
        self.assertIn(("ctlrpc_op_latency_p99_microseconds", lab), got)
        self.assertEqual(got[("ctlrpc_unit_up", '{address="%s"}' % self.addr)], 1)
        self.assertEqual(sum(v for (n, _), v in got.items() if n == "ctlrpc_unit_up"), 1)
        self.assertIn(("ctlrpc_unit_connections", '{address="%s",service="storage"}'
                       % self.addr), got)


    def test_stats_expired(self):
        """A request skipped past its deadline (docs/PROTOCOL.md, "Deadlines") shows as
        `expired` in every output of stats."""
        import msgpack
        import zmq
        ctx = zmq.Context()
        sock = ctx.socket(zmq.DEALER)
        sock.setsockopt(zmq.LINGER, 0)
        sock.connect(self.addr)
        try:
            sock.send(msgpack.packb(["put", "0123456789ab@1", {"key": "late", "data": b"x"}]))
            sock.send(msgpack.packb(["_health", "after", {}]))  # answered after the skip
            self.assertTrue(sock.poll(10000), "no reply to _health")
            self.assertEqual(msgpack.unpackb(sock.recv(), raw=False)[0], "after")
        finally:
            sock.close()
            ctx.term()
        r = caller("stats", self.addr)
        self.assertEqual(r.status, 0, r.err)
        self.assertIn("  expired 1  ", r.out)
        j = caller("stats", "--json", self.addr).json()
        self.assertEqual(j[0]["stats"]["totals"]["expired"], 1)
        self.assertEqual(j[0]["stats"]["ops"]["put"]["dropped"], 1)
        got = check_prometheus(self, caller("stats", "--prometheus", self.addr).out)
        self.assertEqual(got[("ctlrpc_unit_expired_total",
                              '{address="%s",service="storage"}' % self.addr)], 1)
        self.call("get", 'keys=["late"]', status=5)  # it never ran

    def test_raw_needs_bin(self):
        """--raw writes a bin or list<bin> result; for another result it is a usage error
        before anything is sent, never silent empty output."""
        self.call("put", "key=a", "data=hello")
        r = self.call("get", 'keys=["a"]', "--raw")
        self.assertEqual(r.out, "hello")
        for args, returns in ((["list"], "list<str>"), (["describe", 'keys=["a"]'],
                                                        "list<BlobInfo>"),
                              (["stats"], "UnitStats"), (["put", "key=b", "data=x"], "u64")):
            r = self.call(*args, "--raw", status=2)
            self.assertIn("--raw needs a bin or list<bin> result; op '%s' returns %s"
                          % (args[0], returns), r.err)
            self.assertEqual(r.out, "")
        self.assertEqual(self.call("list").json(), ["a"])  # the put above was not sent

    def test_raw_needs_one_address(self):
        """--raw writes one result's bytes: with several addresses it is a usage error, never
        JSON rows in its place; an address given twice is one."""
        self.call("put", "key=a", "data=hello")
        dead = support.dead_address()
        r = caller("call", "-a", self.addr, "-a", dead, "get", 'keys=["a"]', "--raw")
        self.assertEqual(r.status, 2, r.err)
        self.assertEqual(r.err, "ctlrpc: --raw needs one address; this call has 2 (drop --raw "
                         "for one JSON row per unit)\n")
        self.assertEqual(r.out, "")
        r = caller("call", "-a", self.addr, "-a", self.addr, "get", 'keys=["a"]', "--raw")
        self.assertEqual((r.status, r.out), (0, "hello"), r.err)

    def test_bool_words(self):
        for word, want in (("true", True), ("YES", True), ("on", True), ("1", True),
                           ("False", False), ("no", False), ("OFF", False), ("0", False)):
            self.call("put", "key=b-" + word, "data=x", "pin=" + word)
            got = self.call("describe", 'keys=["b-%s"]' % word).json()[0]["pinned"]
            self.assertEqual(got, want, word)
        r = self.call("put", "key=k", "data=x", "pin=maybe", status=2)
        self.assertIn("argument 'pin': expected bool (true/false, yes/no, on/off or 1/0), got "
                      "'maybe'", r.err)

    def test_address_without_scheme(self):
        port = self.addr.rsplit(":", 1)[1]
        r = caller("call", "127.0.0.1:" + port, "list")
        self.assertEqual(r.status, 2, r.err)
        self.assertIn("ctlrpc: call: endpoint '127.0.0.1:%s' is not tcp://host:port" % port,
                      r.err)
        r = caller("health", "127.0.0.1:" + port)
        self.assertEqual(r.status, 2, r.err)
        self.assertIn("endpoint '127.0.0.1:%s' is not tcp://host:port" % port, r.err)
        r = caller("call", "list")
        self.assertEqual(r.status, 2, r.err)
        self.assertIn("call: no address given", r.err)

    def test_duplicate_addresses(self):
        """An address given twice is asked once: no duplicate rows, no duplicate series."""
        r = caller("stats", "--prometheus", self.addr, self.addr, "-a", self.addr)
        self.assertEqual(r.status, 0, r.err)
        got = check_prometheus(self, r.out)  # a duplicate series would fail here
        self.assertEqual(sum(1 for (n, _) in got if n == "ctlrpc_unit_up"), 1)
        r = caller("call", "-a", self.addr, "-a", self.addr, "list")
        self.assertEqual(r.json(), [])  # one unit: the result alone, not rows
        r = caller("health", "--json", self.addr, self.addr)
        self.assertEqual(len(r.json()), 1)

    def test_ops_shows_everything(self):
        """ops (text): the service's doc, each op, each record with its fields and each
        declared kind, with their docs; --json has them too."""
        r = caller("ops", self.addr)
        self.assertEqual(r.status, 0, r.err)
        self.assertTrue(r.out.startswith("service storage\n    A storage unit: blobs"), r.out)
        self.assertIn("\n  record BlobInfo { key: str; size: u64; pinned: bool; spilled: bool; "
                      "}\n      What a unit knows about one blob.\n      key: The blob's key.\n",
                      r.out)
        self.assertIn("\n  record UnitStats {\n      blobs: u64;\n", r.out)
        self.assertIn("      index_capacity: u64 = 0;\n  }\n", r.out)
        j = caller("ops", self.addr, "--json").json()
        self.assertEqual([x["name"] for x in j["records"]], ["BlobInfo", "UnitStats"])
        self.assertEqual(j["records"][0]["fields"][0],
                         {"name": "key", "type": "str", "required": True, "default": None,
                          "doc": "The blob's key."})
        self.assertEqual(j["errors"], [])

    def test_describe_failure_names_the_op(self):
        """A unit that cannot be reached, or refuses the handshake, while its IDL is fetched:
        the failure is the op's."""
        dead = support.dead_address()
        r = caller("call", dead, "list")
        self.assertEqual(r.status, 8, r.err)
        self.assertIn("Unreachable: list at %s: connection refused" % dead, r.err)
        self.assertIn("(while fetching the unit's IDL with _describe)", r.err)
        self.unit.freeze()
        try:
            r = caller("call", self.addr, "put", "key=k", "data=v", "--timeout", "300ms")
        finally:
            self.unit.thaw()
        self.assertEqual(r.status, 7, r.err)
        # A frozen unit never completes the ZeroMQ handshake: the request never left.
        self.assertIn("Timeout: put at %s: no connection to the unit within 300 ms; nothing "
                      "was sent (while fetching the unit's IDL with _describe)" % self.addr,
                      r.err)
        # A refused CURVE handshake (the wrong server key) is reported as soon as the client
        # sees it, whatever the deadline: the op's failure too.
        keys = tempfile.mkdtemp(prefix="ctlrpc-caller-")
        self.addCleanup(shutil.rmtree, keys, True)
        unit, stranger = os.path.join(keys, "unit"), os.path.join(keys, "x")
        for prefix in (unit, stranger):
            self.assertEqual(caller("keygen", prefix).status, 0)
        secured = self.start("--curve-secret", unit + ".key").address
        r = caller("call", secured, "list", "--curve-server-key", stranger + ".pub",
                   "--timeout", "30")
        self.assertEqual(r.status, 9, r.err)
        self.assertIn("AuthFailed: list at %s: " % secured, r.err)
        self.assertIn("(while fetching the unit's IDL with _describe)", r.err)

    def test_idl_of_another_service(self):
        other = os.path.join(tempfile.mkdtemp(prefix="ctlrpc-caller-"), "other.idl")
        self.addCleanup(shutil.rmtree, os.path.dirname(other), True)
        with open(IDL) as f:
            text = f.read()
        with open(other, "w") as f:
            f.write(text.replace("service storage;", "service archive;"))
        r = self.call("list", "--idl", other)
        self.assertEqual(r.json(), [])
        self.assertIn("ctlrpc: warning: --idl %s declares service archive, but %s serves "
                      "storage: calling list anyway" % (other, self.addr), r.err)
        r = self.call("list", "--idl", IDL)
        self.assertEqual(r.err, "")


class CallerC(Caller):
    KIND = "c"


class CallerPy(Caller):
    KIND = "py"


class CallerMisc(unittest.TestCase):
    def setUp(self):
        self.dir = tempfile.mkdtemp(prefix="ctlrpc-caller-")
        self.addCleanup(shutil.rmtree, self.dir, True)

    def test_fan_out_c_and_python(self):
        c, p = c_unit(), py_unit()
        self.addCleanup(c.stop)
        self.addCleanup(p.stop)
        r = caller("call", "-a", c.address, "-a", p.address, "put", "key=k", "data=abc")
        self.assertEqual(r.status, 0, r.err)
        self.assertEqual([x["result"] for x in r.rows()], [3, 3])
        r = caller("health", "--json", c.address, p.address)
        self.assertEqual([x["health"]["status"] for x in r.json()], ["serving", "serving"])

    def test_fails_fast(self):
        dead = support.dead_address()
        r = caller("call", dead, "list", "--idl", IDL, "--timeout", "30")
        self.assertEqual(r.status, 8, r.err)
        self.assertIn("connection refused", r.err)
        self.assertLess(r.took, 5)
        r = caller("call", "tcp://nosuchhost.invalid:4100", "list", "--idl", IDL,
                   "--timeout", "30")
        self.assertEqual(r.status, 8, r.err)
        self.assertIn("host 'nosuchhost.invalid' does not resolve", r.err)
        self.assertLess(r.took, 5)
        # Without --idl, the describe fails the same way.
        r = caller("call", dead, "list", "--timeout", "30")
        self.assertEqual(r.status, 8, r.err)
        self.assertLess(r.took, 5)

    def test_ipv6(self):
        """A C and a Python unit bound to tcp://[::1]:0: health, calls, stats and a fan-out
        through the caller at the endpoints they print (skipped: no ::1 where the machine
        has no IPv6 loopback)."""
        if not support.have_ipv6_loopback():
            self.skipTest("skipped: no ::1")
        units = []
        for start in (c_unit, py_unit):
            u = start(bind="tcp://[::1]:0")
            self.addCleanup(u.stop)
            self.assertRegex(u.address, r"^tcp://\[::1\]:[1-9][0-9]*$")
            units.append(u.address)
            r = caller("health", u.address)
            self.assertEqual(r.status, 0, r.err)
            self.assertRegex(r.out, re.escape(u.address) + r"\s+serving\s")
            r = caller("call", u.address, "put", "key=v6", "data=six")
            self.assertEqual((r.status, r.out.strip()), (0, "3"), r.err)
            r = caller("call", u.address, "get", 'keys=["v6"]', "--raw")
            self.assertEqual((r.status, r.out), (0, "six"), r.err)
            r = caller("stats", "--prometheus", u.address)
            self.assertEqual(r.status, 0, r.err)
            got = check_prometheus(self, r.out)
            self.assertEqual(got[("ctlrpc_unit_up", '{address="%s"}' % u.address)], 1)
        r = caller("call", "-a", units[0], "-a", units[1], "list")
        self.assertEqual(r.status, 0, r.err)
        self.assertEqual([(x["address"], x["result"]) for x in r.rows()],
                         [(units[0], ["v6"]), (units[1], ["v6"])])

    def test_timeout(self):
        u = c_unit()
        self.addCleanup(u.stop)
        u.freeze()
        r = caller("call", u.address, "list", "--idl", IDL, "--timeout", "300ms")
        u.thaw()
        self.assertEqual(r.status, 7, r.err)
        self.assertIn("Timeout", r.err)

    def test_keygen_and_curve(self):
        unit, client, stranger = (os.path.join(self.dir, n) for n in ("unit", "client", "x"))
        for prefix in (unit, client, stranger):
            r = caller("keygen", prefix)
            self.assertEqual(r.status, 0, r.err)
            self.assertIn("wrote", r.out)
        self.assertEqual(caller("keygen", unit).status, 1)  # never overwrites
        for start in (c_unit, py_unit):
            u = start("--curve-secret", unit + ".key", "--curve-allow", client + ".pub")
            self.addCleanup(u.stop)
            r = caller("call", u.address, "put", "key=k", "data=v", "--curve-server-key",
                       unit + ".pub", "--curve-key", client + ".key")
            self.assertEqual((r.status, r.out.strip()), (0, "1"), r.err)
            r = caller("stats", u.address, "--curve-server-key", unit + ".pub",
                       "--curve-key", client + ".key")
            self.assertEqual(r.status, 0, r.err)
            # Not on the allowlist, the wrong server key, no CURVE: authentication failures,
            # reported within about a second, not as timeouts.
            for flags in (["--curve-server-key", unit + ".pub", "--curve-key",
                           stranger + ".key"],
                          ["--curve-server-key", stranger + ".pub"], []):
                r = caller("call", u.address, "list", "--idl", IDL, "--timeout", "30", *flags)
                self.assertEqual(r.status, 9, (flags, r.err))
                self.assertIn("AuthFailed", r.err)
                self.assertLess(r.took, 5)

    def test_declared_kind_line(self):
        """A declared kind's text error says the kind once, with the unit's message and its
        reason (the JSON row has them too); the stats table stays in line with the kind in it."""
        copy = os.path.join(self.dir, "storage.idl")
        with open(IDL) as f:
            text = f.read()
        with open(copy, "w") as f:
            f.write(text + "\n/// Too many for this unit.\nerror Overflow;\n/// Fails with "
                    "Overflow.\nop overflow(n: u32) -> u32 raises Overflow;\n")
        u = py_unit(idl=copy)
        self.addCleanup(u.stop)
        r = caller("call", u.address, "overflow", "n=7")
        self.assertEqual(r.status, 10, r.err)
        self.assertEqual(r.err, "ctlrpc: Overflow: overflow at %s: 7 is more than this unit "
                         "holds (reason: limit)\n" % u.address)
        r = caller("call", "-a", u.address, "overflow", "n=7", "-a", support.dead_address())
        row = r.rows()[0]["error"]
        self.assertEqual((row["kind"], row["reason"]), ("Overflow", "limit"))
        r = caller("ops", u.address)
        self.assertIn("\n  error Overflow;\n      Too many for this unit.\n", r.out)
        self.assertEqual(caller("ops", "--json", u.address).json()["errors"],
                         [{"name": "Overflow", "doc": "Too many for this unit."}])
        caller("call", u.address, "get", 'keys=["x"]')
        r = caller("stats", u.address)
        self.assertIn("Missing=1", r.out)
        self.assertIn("Overflow=2", r.out)
        check_columns(self, r.out)

    def test_prometheus_down_unit(self):
        """A unit that does not answer: `_up 0` on stdout, why on stderr, the usual status."""
        u = c_unit()
        self.addCleanup(u.stop)
        dead = support.dead_address()
        r = caller("stats", "--prometheus", u.address, dead)
        self.assertEqual(r.status, 8, r.err)
        got = check_prometheus(self, r.out)
        self.assertEqual(got[("ctlrpc_unit_up", '{address="%s"}' % dead)], 0)
        self.assertEqual(got[("ctlrpc_unit_up", '{address="%s"}' % u.address)], 1)
        self.assertEqual(r.err, "ctlrpc: %s: Unreachable: _stats at %s: connection refused "
                         "(nothing listens there?); nothing was sent\n" % (dead, dead))

    def test_local_failures(self):
        r = caller("ops", "--idl", os.path.join(self.dir, "nonexistent.idl"))
        self.assertEqual(r.status, 1, r.err)
        self.assertEqual(r.err, "ctlrpc: --idl %s: cannot read: No such file or directory\n"
                         % os.path.join(self.dir, "nonexistent.idl"))
        bad = os.path.join(self.dir, "bad.idl")
        with open(bad, "w") as f:
            f.write("service x;\nop f(a: strng);\n")
        r = caller("ops", "--idl", bad)
        self.assertEqual(r.status, 1, r.err)  # a local failure, as the exit table says
        self.assertIn("the IDL has errors", r.err)
        prefix = os.path.join(self.dir, "k")
        self.assertEqual(caller("keygen", prefix).status, 0)
        r = caller("keygen", prefix)
        self.assertEqual(r.status, 1)
        self.assertEqual(r.err, "ctlrpc: cannot create %s.key: File exists\n" % prefix)
        r = caller("keygen", os.path.join(self.dir, "nodir", "k"))
        self.assertEqual(r.status, 1)
        self.assertEqual(r.err, "ctlrpc: cannot create %s: No such file or directory\n"
                         % os.path.join(self.dir, "nodir", "k.key"))

    def test_curve_options_take_files(self):
        """--curve-server-key and --curve-key take key files only, as ctl-storage's do, and
        refuse the other half of a pair by its header."""
        unit, client = (os.path.join(self.dir, n) for n in ("unit", "client"))
        for prefix in (unit, client):
            self.assertEqual(caller("keygen", prefix).status, 0)
        with open(client + ".key") as f:
            secret_text = [x for x in f.read().split("\n") if x and x[0] != "#"][0]
        with open(unit + ".pub") as f:
            public_text = [x for x in f.read().split("\n") if x and x[0] != "#"][0]
        dead = support.dead_address()
        for flags, words in (
                # "=": a key's text may begin with "-"
                (["--curve-server-key", unit + ".pub", "--curve-key=" + secret_text],
                 "--curve-key: a key's text was given where a key file is wanted: give the file "
                 "(PREFIX.key); a secret on the command line is visible to every local user, "
                 "make a new key pair"),
                (["--curve-server-key=" + public_text],
                 "--curve-server-key: a key's text was given where a key file is wanted: give "
                 "the file (PREFIX.pub)"),
                (["--curve-server-key", unit + ".pub", "--curve-key", client + ".pub"],
                 "key file %s.pub: this is a public key; pass the .key file" % client),
                (["--curve-server-key", unit + ".key"],
                 "key file %s.key: this is a secret key; pass the .pub file" % unit)):
            r = caller("call", dead, "list", "--idl", IDL, *flags)
            self.assertEqual(r.status, 2, (flags, r.err))
            self.assertIn(words, r.err)

    def test_old_peer(self):
        old = support.Process([sys.executable, os.path.join(TOP, "tests", "interop",
                                                            "pyunit.py")])
        self.addCleanup(old.stop)
        r = caller("call", old.address, "list")
        self.assertEqual(r.status, 6, r.err)
        self.assertIn("this unit does not answer the built-in op _describe (an older ctlrpc "
                      "or another implementation): pass --idl FILE", r.err)
        r = caller("health", old.address)
        self.assertEqual(r.status, 6, r.err)
        self.assertIn("does not answer the built-in op _health", r.out)
        self.assertEqual(r.out.count(old.address), 1, r.out)  # the row's address, once
        r = caller("stats", old.address)
        self.assertIn("does not answer the built-in op _stats", r.out)
        self.assertEqual(r.out.count(old.address), 1, r.out)
        r = caller("stats", "--prometheus", old.address)
        self.assertEqual(r.err.count(old.address), 1, r.err)
        r = caller("call", old.address, "put", "key=k", "data=v", "--idl", IDL)
        self.assertEqual((r.status, r.out.strip()), (0, "1"), r.err)
        r = caller("call", old.address, "get", 'keys=["k"]', "--idl", IDL)
        self.assertEqual(r.json(), [base64.b64encode(b"v").decode()])

    def test_evolution(self):
        """A new op in a copy of storage.idl: a unit serving the copy is reached by the caller
        with no code change (the IDL comes from the unit)."""
        copy = os.path.join(self.dir, "storage.idl")
        with open(IDL) as f:
            text = f.read()
        with open(copy, "w") as f:
            f.write(text + "\n/// Echo `text` back.\nop echo(text: str) -> str;\n")
        u = py_unit(idl=copy)
        self.addCleanup(u.stop)
        r = caller("call", u.address, "echo", "text=hi")
        self.assertEqual((r.status, r.json()), (0, "hi"), r.err)
        r = caller("ops", u.address)
        self.assertIn("op echo(text: str) -> str;", r.out)
        self.assertIn("Echo `text` back.", r.out)
        r = caller("call", u.address, "echo")
        self.assertEqual(r.status, 2)
        self.assertIn("missing required argument 'text' (str)", r.err)
        # The original IDL does not know it: suggestions from the old op list.
        r = caller("call", u.address, "echo", "text=hi", "--idl", IDL)
        self.assertEqual(r.status, 2)
        self.assertIn("has no op 'echo'", r.err)

    def test_usage(self):
        self.assertEqual(caller().status, 2)
        self.assertEqual(caller("call").status, 2)
        r = caller("call", "tcp://127.0.0.1:1", "list", "--timeout", "soon")
        self.assertEqual(r.status, 2)
        r = caller("--help")
        self.assertEqual(r.status, 0)
        self.assertIn("exit status", r.out)


# The shared cases run through their subclasses only.
del Builtins, Caller


def main():
    global OPTS
    OPTS, argv = support.main("unit", "gen", "caller")
    support.run_tests(argv)


if __name__ == "__main__":
    main()
