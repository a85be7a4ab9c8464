"""The skew matrix: today's clients against units of the first release, and back.

    test_skew.py --cli ctl-storage --unit ctl-storage-unit --pyunit examples/storage/unit.py
                 --module-dir DIR --unit-v1 skew-unit-v1 --pyunit-v1 tests/skew/unit_v1.py
                 --module-dir-v1 DIR --client-v1 skew-client-v1 --client-today skew-client-today
                 --caller tools/ctlrpc/ctlrpc [unittest args]

The first release of the storage service is tests/skew/storage_v1.idl: list(prefix) without
paging, stats without index_bytes and index_capacity. Its units refuse an argument they do not
know with a Protocol error naming it, as every ctlrpc unit does (skew-unit-v1, unit_v1.py),
or in the reference design's words (unit_v1.py --kwargs: "got an unexpected keyword argument
'limit'").

    client (today)                 units of the first release: C, Python, Python --kwargs
    ctl-storage                    put/get/describe/pin/delete/stats; list falls back to one
                                   call, says so on stderr (and "paged": false in JSON), and
                                   asks the unit to page only once
    generated C stubs              skew-client-today --old-unit (index fields read as 0; a
                                   list with a limit is a Protocol error naming it)
    generated Python stubs         the same session through storage_ctl.Client
    ctlrpc (generic caller)        call put/get/list/stats/describe, ops; with the unit's IDL
                                   (_describe) or today's (--idl)

    client (first release)         today's units: ctl-storage-unit, unit.py
    generated C stubs              skew-client-v1
    generated Python stubs         the same session through the v1 module's Client
    ctlrpc --idl storage_v1.idl    call put/list/stats
    (and ctl-storage)              pages through today's units, and says so with --verbose

Every cell starts its own units (each prints its endpoint as its first line: no sleeps) and
asserts the outcome of every call. Needs pyzmq, msgpack and jinja2 (for the caller).
"""

import argparse
import dataclasses
import importlib.util
import json
import os
import select
import signal
import subprocess
import sys
import tempfile
import time
import unittest

HERE = os.path.dirname(os.path.abspath(__file__))
TOP = os.path.normpath(os.path.join(HERE, "..", ".."))
sys.path.insert(0, os.path.join(TOP, "runtime", "python"))

import ctlrpc  # noqa: E402

OPT = None
START_S = 30  # a unit must print its endpoint within this
RUN_S = 60    # any one client run must end within this
TIMEOUT_S = 10.0
FELL_BACK = "unit at %s does not page list; listed everything in one call"


class Unit:
    """A unit process: started with `argv` (plus --bind), its endpoint read from stdout."""

    def __init__(self, name, argv):
        self.name = name
        self.proc = subprocess.Popen(argv + ["--bind", "tcp://127.0.0.1:0"],
                                     stdout=subprocess.PIPE)
        try:
            self.address = self._read_endpoint()
        except BaseException:
            self.stop()
            raise

    def _read_endpoint(self):
        fd = self.proc.stdout.fileno()
        buf = b""
        deadline = time.monotonic() + START_S
        while not buf.endswith(b"\n"):
            left = deadline - time.monotonic()
            if left <= 0:
                raise RuntimeError(f"{self.name} did not print its endpoint")
            ready, _, _ = select.select([fd], [], [], left)
            if ready:
                chunk = os.read(fd, 1)
                if not chunk:
                    raise RuntimeError(f"{self.name} exited before printing its endpoint")
                buf += chunk
        return buf.decode().strip()

    def stop(self):
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
        try:
            status = self.proc.wait(timeout=START_S)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            status = self.proc.wait(timeout=START_S)
        self.proc.stdout.close()
        return status


def old_units():
    """name -> the command of each kind of first-release unit."""
    py = [sys.executable, OPT.pyunit_v1, "--module-dir", OPT.module_dir_v1]
    return {"v1-c": [OPT.unit_v1], "v1-py": py, "v1-py-kwargs": py + ["--kwargs"]}


def new_units():
    return {"today-c": [OPT.unit, "--capacity", "64M"],
            "today-py": [sys.executable, OPT.pyunit, "--module-dir", OPT.module_dir,
                         "--capacity", "64M"]}


class Run:
    def __init__(self, proc):
        self.status = proc.returncode
        self.out = proc.stdout.decode(errors="replace")
        self.err = proc.stderr.decode(errors="replace")

    def json(self):
        return json.loads(self.out)


def run(argv, stdin=None):
    proc = subprocess.run(argv, input=stdin, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                          timeout=RUN_S)
    return Run(proc)


def import_module(name, where):
    """The generated module storage_ctl.py in `where`, imported as `name`: today's and the
    first release's have the same file name."""
    if name in sys.modules:
        return sys.modules[name]
    spec = importlib.util.spec_from_file_location(name, os.path.join(where, "storage_ctl.py"))
    mod = importlib.util.module_from_spec(spec)
    sys.modules[name] = mod  # before running it: its dataclasses look themselves up there
    spec.loader.exec_module(mod)
    return mod


class Cell(unittest.TestCase):
    """One client against one kind of unit; each test starts its unit and stops it."""

    unit_kind = None  # set on the generated subclasses
    unit_argv = None

    def setUp(self):
        self.tmp = tempfile.mkdtemp(prefix="skew-")
        self.units = []
        self.unit = self.start(self.unit_kind, self.unit_argv)
        self.rpc = ctlrpc.Client(timeout=TIMEOUT_S)

    def tearDown(self):
        self.rpc.close()
        # Every unit stops cleanly on SIGTERM (under a sanitizer, a leak or an error at exit
        # shows here).
        statuses = [(u.name, u.stop()) for u in self.units]
        self.assertEqual(statuses, [(u.name, 0) for u in self.units])

    def start(self, name, argv):
        u = Unit(name, argv)
        self.units.append(u)
        return u

    def file(self, name, data):
        path = os.path.join(self.tmp, name)
        with open(path, "wb") as f:
            f.write(data)
        return path

    def list_counts(self, unit):
        """calls and Protocol errors of op list on `unit`, from its _stats."""
        st = self.rpc.call(unit.address, "_stats", {})["ops"]["list"]
        return st["calls"], st["errors"]["Protocol"]

    # ---- the session every generated Python client runs -------------------------------------

    def python_session(self, mod, address, old_unit):
        """put/get/describe/pin/delete/unpin/list/stats through `mod`'s Client."""
        with mod.Client(timeout=TIMEOUT_S) as c:
            self.assertEqual(c.put(address, key="skew/a", data=b"alpha"), 5)
            self.assertEqual(c.put(address, key="skew/p", data=b"pinned!", pin=True), 7)
            self.assertEqual(c.get(address, keys=["skew/p", "skew/a"]), [b"pinned!", b"alpha"])
            with self.assertRaises(ctlrpc.Missing) as cm:
                c.get(address, keys=["skew/a", "skew/none"])
            self.assertEqual(cm.exception.blobs, ["skew/none"])
            info = c.describe(address, keys=["skew/a", "skew/p"])
            self.assertEqual([(i.key, i.size, i.pinned, i.spilled) for i in info],
                             [("skew/a", 5, False, False), ("skew/p", 7, True, False)])
            with self.assertRaises(ctlrpc.Busy) as cm:
                c.delete(address, keys=["skew/p"])
            self.assertEqual(cm.exception.reason, "pinned")
            self.assertEqual(c.pin(address, keys=["skew/a"]), 1)
            c.unpin(address, keys=["skew/a"])
            deadline = time.monotonic() + TIMEOUT_S  # a notify: wait until it is served
            while c.describe(address, keys=["skew/a"])[0].pinned:
                self.assertLess(time.monotonic(), deadline, "unpin was never served")
            self.assertEqual(c.put(address, key="other", data=b""), 0)
            self.assertEqual(c.list(address), ["other", "skew/a", "skew/p"])
            self.assertEqual(c.list(address, prefix="skew/"), ["skew/a", "skew/p"])
            s = c.stats(address)
            self.assertEqual((s.blobs, s.bytes, s.pinned, s.spilled), (3, 12, 1, 0))
            self.assertGreater(s.requests, 0)
            if hasattr(s, "index_bytes"):  # today's module
                if old_unit:
                    self.assertEqual((s.index_bytes, s.index_capacity), (0, 0))
                else:
                    self.assertGreater(s.index_bytes, 0)
                    self.assertGreater(s.index_capacity, 0)
            outcomes = c.stats_many([address, address])
            self.assertTrue(all(o.ok for o in outcomes), [o.error for o in outcomes])
            self.assertEqual([o.result.blobs for o in outcomes], [3, 3])
            if hasattr(s, "index_bytes"):
                if old_unit:
                    with self.assertRaises(ctlrpc.Transfer) as cm:
                        c.list(address, limit=1)
                    self.assertEqual(cm.exception.cause, "remote")
                    self.assertIn("limit", str(cm.exception))
                else:
                    self.assertEqual(c.list(address, limit=1), ["other"])


class TodayClientOldUnit(Cell):
    """Today's clients against a unit of the first release (unit_kind)."""

    def cli(self, *args, addresses=None):
        argv = [OPT.cli]
        for a in addresses or [self.unit.address]:
            argv += ["--address", a]
        return run(argv + list(args))

    def test_reproduce_old_unit_refuses_paging(self):
        """What broke `ctl-storage list`: the old unit refuses `limit`, naming it."""
        with self.assertRaises(ctlrpc.Transfer) as cm:
            self.rpc.call(self.unit.address, "list", {"limit": 1000})
        e = cm.exception
        self.assertEqual(e.cause, "remote")
        if self.unit_kind == "v1-py-kwargs":
            self.assertIn("unexpected keyword argument 'limit'", str(e))
        else:
            self.assertIn("op 'list': arg limit: not an arg of list", str(e))

    def test_ctl_storage(self):
        a = self.unit.address
        r = self.cli("put", "skew/a", self.file("a", b"alpha"))
        self.assertEqual((r.status, r.err), (0, ""))
        self.assertEqual(self.cli("put", "skew/p", self.file("p", b"pinned!"), "--pin").status, 0)
        out = os.path.join(self.tmp, "got")
        self.assertEqual(self.cli("get", "skew/a", "skew/p", "-o", out).status, 0)
        with open(out, "rb") as f:
            self.assertEqual(f.read(), b"alphapinned!")
        self.assertEqual(self.cli("get", "skew/none").status, 5)
        d = self.cli("--json", "describe", "skew/a", "skew/p").json()
        self.assertEqual([(b["key"], b["size"], b["pinned"]) for b in d],
                         [("skew/a", 5, False), ("skew/p", 7, True)])
        self.assertEqual(self.cli("delete", "skew/p").status, 4)
        self.assertEqual(self.cli("pin", "skew/a").status, 0)
        self.assertEqual(self.cli("unpin", "skew/a").status, 0)
        deadline = time.monotonic() + TIMEOUT_S  # a notify: wait until it is served
        while self.rpc.call(a, "describe", {"keys": ["skew/a"]})[0]["pinned"]:
            self.assertLess(time.monotonic(), deadline, "unpin was never served")

        calls0, refused0 = self.list_counts(self.unit)
        r = self.cli("list")
        self.assertEqual(r.status, 0, r.err)
        self.assertEqual(r.out, "skew/a\nskew/p\n")
        self.assertIn(FELL_BACK % a, r.err)
        # One page asked for and refused, then one plain list: nothing more.
        self.assertEqual(self.list_counts(self.unit), (calls0 + 2, refused0 + 1))
        r = self.cli("--json", "list", "--prefix", "skew/p")
        self.assertEqual(r.json(), [{"address": a, "paged": False, "keys": ["skew/p"]}])
        self.assertIn(FELL_BACK % a, r.err)

        r = self.cli("--json", "stats")
        self.assertEqual(r.status, 0, r.err)
        row = r.json()[0]
        self.assertEqual((row["blobs"], row["bytes"], row["pinned"]), (2, 12, 1))
        self.assertEqual((row["index_bytes"], row["index_capacity"]), (0, 0))
        r = self.cli("stats")
        self.assertEqual(r.status, 0, r.err)
        self.assertIn(a, r.out)

    def test_ctl_storage_list_many_keys(self):
        """More keys than a page: the old unit sends them all in its one reply."""
        keys = ["k%04d" % i for i in range(1500)]
        for k in keys:
            self.rpc.call(self.unit.address, "put", {"key": k, "data": b"x"})
        r = self.cli("list")
        self.assertEqual(r.status, 0, r.err)
        self.assertEqual(r.out.splitlines(), keys)

    def test_ctl_storage_list_mixed_fleet(self):
        """An old unit and today's in one list: today's pages, the old one does not."""
        new = self.start("today-c", new_units()["today-c"])
        for u in (self.unit, new):
            self.assertEqual(self.cli("put", "k", self.file("k", b"v"),
                                      addresses=[u.address]).status, 0)
        r = self.cli("--verbose", "--json", "list", addresses=[self.unit.address, new.address])
        self.assertEqual(r.status, 0, r.err)
        self.assertEqual(r.json(), [{"address": self.unit.address, "paged": False, "keys": ["k"]},
                                    {"address": new.address, "keys": ["k"]}])
        self.assertIn(FELL_BACK % self.unit.address, r.err)
        self.assertIn("unit at %s pages list; listed in 1 page" % new.address, r.err)
        self.assertNotIn("unit at %s does not page" % new.address, r.err)

    def test_generated_c(self):
        r = run([OPT.client_today, "--address", self.unit.address, "--old-unit"])
        self.assertEqual(r.status, 0, r.out + r.err)
        self.assertIn("ok list-limit\n", r.out)
        self.assertTrue(r.out.endswith("done\n"), r.out)

    def test_generated_python(self):
        mod = import_module("storage_today_ctl", OPT.module_dir)
        self.python_session(mod, self.unit.address, old_unit=True)

    def caller(self, *args):
        return run([sys.executable, OPT.caller] + list(args))

    def test_generic_caller(self):
        a = self.unit.address
        # The kwargs unit has no IDL to describe (a hand-written op table): give today's.
        idl = (["--idl", os.path.join(TOP, "idl", "storage.idl")]
               if self.unit_kind == "v1-py-kwargs" else [])
        r = self.caller("call", *idl, a, "put", "key=skew/a", "data=alpha")
        self.assertEqual((r.status, r.out), (0, "5\n"), r.err)
        r = self.caller("call", *idl, a, "get", "keys=[\"skew/a\"]")
        self.assertEqual(r.status, 0, r.err)
        self.assertEqual(r.json(), ["YWxwaGE="])  # base64 of alpha
        r = self.caller("call", *idl, a, "list")
        self.assertEqual((r.status, r.json()), (0, ["skew/a"]), r.err)
        r = self.caller("call", *idl, a, "describe", "keys=[\"skew/a\"]")
        self.assertEqual(r.status, 0, r.err)
        self.assertEqual(r.json(), [{"key": "skew/a", "size": 5, "pinned": False,
                                     "spilled": False}])
        r = self.caller("call", *idl, a, "stats")
        self.assertEqual(r.status, 0, r.err)
        st = r.json()
        self.assertEqual((st["blobs"], st["bytes"]), (1, 5))
        self.assertNotIn("index_bytes", st)  # what the unit sent, nothing made up
        if idl:
            # Today's IDL has the paging args; the unit does not: its refusal says so.
            r = self.caller("call", *idl, a, "list", "limit=1")
            self.assertEqual(r.status, 6, r.err)
            self.assertIn("limit", r.err)
        else:
            # The unit's own IDL has no paging args: refused before anything is sent.
            r = self.caller("call", a, "list", "limit=1")
            self.assertEqual(r.status, 2, r.err)
            self.assertIn("op 'list' has no argument 'limit'", r.err)
            r = self.caller("ops", a)
            self.assertEqual(r.status, 0, r.err)
            self.assertIn("list(prefix: str = \"\") -> list<str>", r.out)


class OldClientTodayUnit(Cell):
    """Clients generated from the first release's IDL against today's units (unit_kind)."""

    def test_generated_c(self):
        r = run([OPT.client_v1, "--address", self.unit.address])
        self.assertEqual(r.status, 0, r.out + r.err)
        self.assertTrue(r.out.endswith("done\n"), r.out)

    def test_generated_python(self):
        mod = import_module("storage_v1_ctl", OPT.module_dir_v1)
        self.assertNotIn("index_bytes", [f.name for f in dataclasses.fields(mod.UnitStats)])
        self.python_session(mod, self.unit.address, old_unit=False)

    def test_generic_caller_v1_idl(self):
        """The caller given the first release's IDL: what an old operator's copy would say."""
        a = self.unit.address
        idl = ["--idl", os.path.join(HERE, "storage_v1.idl")]
        r = run([sys.executable, OPT.caller, "call", *idl, a, "put", "key=k", "data=abc"])
        self.assertEqual((r.status, r.out), (0, "3\n"), r.err)
        r = run([sys.executable, OPT.caller, "call", *idl, a, "list", "prefix=k"])
        self.assertEqual((r.status, r.json()), (0, ["k"]), r.err)
        r = run([sys.executable, OPT.caller, "call", *idl, a, "stats"])
        self.assertEqual(r.status, 0, r.err)
        st = r.json()
        self.assertEqual((st["blobs"], st["bytes"]), (1, 3))
        self.assertGreater(st["index_bytes"], 0)  # today's unit sends it; shown as sent

    def test_today_generated_c_baseline(self):
        """Today's stubs against today's unit: the same session, paging included."""
        r = run([OPT.client_today, "--address", self.unit.address])
        self.assertEqual(r.status, 0, r.out + r.err)

    def test_ctl_storage_pages(self):
        a = self.unit.address
        self.assertEqual(run([OPT.cli, "--address", a, "put", "k", "-"], stdin=b"v").status, 0)
        r = run([OPT.cli, "--address", a, "--verbose", "list"])
        self.assertEqual((r.status, r.out), (0, "k\n"), r.err)
        self.assertIn("unit at %s pages list" % a, r.err)
        self.assertNotIn("does not page", r.err)
        r = run([OPT.cli, "--address", a, "list"])
        self.assertEqual((r.status, r.out, r.err), (0, "k\n", ""))


def make_cells():
    """One TestCase class per (client side, unit kind): ctest output names the cell."""
    cells = {}
    for base, units in ((TodayClientOldUnit, old_units()), (OldClientTodayUnit, new_units())):
        for kind, argv in units.items():
            name = f"{base.__name__}_{kind.replace('-', '_')}"
            cells[name] = type(name, (base,), {"unit_kind": kind, "unit_argv": argv})
    return cells


def main():
    global OPT
    ap = argparse.ArgumentParser()
    for flag in ("--cli", "--unit", "--pyunit", "--module-dir", "--unit-v1", "--pyunit-v1",
                 "--module-dir-v1", "--client-v1", "--client-today", "--caller"):
        ap.add_argument(flag, required=True)
    OPT, rest = ap.parse_known_args()
    loader = unittest.TestLoader()
    suite = unittest.TestSuite()
    cells = make_cells()
    names = [a for a in rest if not a.startswith("-")]
    for name, cls in cells.items():
        if not names or any(name.startswith(n) or n.startswith(name) for n in names):
            suite.addTests(loader.loadTestsFromTestCase(cls))
    verbosity = 2 if "-v" in rest else 1
    result = unittest.TextTestRunner(verbosity=verbosity).run(suite)
    return 0 if result.wasSuccessful() else 1


if __name__ == "__main__":
    sys.exit(main())
