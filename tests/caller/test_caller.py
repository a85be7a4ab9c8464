"""The built-in ops and the generic caller `ctlrpc`, against the C unit (ctl-storage-unit) and a
unit in generated Python (pystorage.py): the same assertions on both.

    test_caller.py --unit CTL_STORAGE_UNIT --gen CTLRPC_GEN --caller CTLRPC --pyunit PYUNIT

- Builtins*: the exact maps of _describe, _health and _stats (docs/PROTOCOL.md), the IDL hash
  rule, describe turned off, a built-in given args.
- Caller*: every storage op through `ctlrpc call` with the IDL fetched by _describe, fan-out,
  ops, health, stats (table, JSON, Prometheus text), exit codes, suggestions, a missing
  argument, --idl.
- CallerMisc: failures reported before the deadline (refused, unresolved, auth), keygen and
  CURVE, a peer without the built-ins (tests/interop/pyunit.py), and the evolution case: a new
  op added to a copy of storage.idl, reached with no code change.
"""

import base64
import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
import unittest

HERE = os.path.dirname(os.path.abspath(__file__))
TOP = os.path.normpath(os.path.join(HERE, "..", ".."))
sys.path.insert(0, os.path.join(TOP, "tests", "python"))

import ctlrpc  # noqa: E402

import support  # noqa: E402

IDL = os.path.join(TOP, "idl", "storage.idl")
OPTS = None


def c_unit(*extra):
    return support.Process([OPTS.unit, "--bind", "tcp://127.0.0.1:0", *extra])


def py_unit(*extra, idl=IDL):
    return support.Process([sys.executable, os.path.join(HERE, "pystorage.py"), "--gen",
                            OPTS.gen, "--idl", idl, *extra])


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
            "accept_failures", "connections", "disconnects"})
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
        # A notify whose args do not fit its IDL types fails in its handler: no reply, a
        # Protocol error counted.
        c.notify(self.addr, "unpin", {"keys": 5})
        support.wait_for(lambda: c.call(self.addr, "_stats")["ops"]["unpin"]["errors"]
                         ["Protocol"] == 1, "the bad notify counted")

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


class Caller(UnitCase):
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
        r = caller("stats", old.address)
        self.assertIn("does not answer the built-in op _stats", r.out)
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
