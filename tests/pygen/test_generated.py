"""The generated Python module (ctlrpc-gen --lang python) on its own: Client, Handlers and
serve() over the Python runtime. Argument checks before sending, keyword-named arguments,
handler exceptions, `raises` enforced, notify, unimplemented ops, bad replies named like the C
client names them, `_many`, docstrings, Python names for IDL names Python cannot take
(names.idl), and the command line (--lang, the output name, --depfile)."""

from __future__ import annotations

import logging
import os
import subprocess
import sys
import tempfile
import time
import unittest
from typing import Any, Dict, Optional

import support

import ctlrpc

import matrix_values

m = support.matrix()
names = support.load(os.path.join(support.HERE, "names.idl"), "names")
NOWHERE = "tcp://127.0.0.1:1"  # nothing listens: a call that got there would time out


class Unit(m.Handlers):  # type: ignore
    """Handlers that misbehave on request."""

    def __init__(self) -> None:
        self.store: Dict[str, int] = {}

    def describe(self, **kw: Any) -> str:
        return " ".join(f"{k}={kw[k]!r}" for k in sorted(kw))

    def sum(self, *, ints: Any, weights: Any, scale: float, extra: Any) -> Any:
        if scale == 666:
            raise RuntimeError("the handler broke")
        if scale == 7:
            return "seven"  # not an f64: a bug in the unit
        return float(sum(ints)) * scale

    def grow(self, *, depth: int, fanout: int, label: str) -> Any:
        if label == "busy":
            raise ctlrpc.Busy("not declared by grow", reason="x")
        if label == "stale":
            raise m.Stale("not declared by grow")
        return m.Tree(label=label, children=[m.Tree(label="kid", children=[])])

    def fail(self, *, kind: str, reason: Optional[str]) -> int:
        if kind == "NoSuchThing":
            raise m.NoSuchThing("none here", reason=reason)
        if kind == "Stray":
            raise m.Stray("stray")
        return 1

    def remember(self, *, key: str, value: int) -> None:
        if key == "boom":
            raise RuntimeError("a failing notify is silent")
        self.store[key] = value

    def remembered(self) -> Dict[str, int]:
        return self.store

    def find(self, *, name: Optional[str]) -> Any:
        return None if name is None else m.Inner(label=name)


class Generated(unittest.TestCase):
    @classmethod
    def setUpClass(cls) -> None:
        cls.unit = Unit()
        cls.server = m.serve(cls.unit, "tcp://127.0.0.1:0")
        cls.addr = cls.server.endpoint
        cls.client = m.Client(timeout=10.0)

    @classmethod
    def tearDownClass(cls) -> None:
        cls.client.close()
        cls.server.close()

    # -- before sending -----------------------------------------------------------------------

    def test_argument_checks(self) -> None:
        c = self.client
        cases = [
            (lambda: c.describe(NOWHERE, small="x"), TypeError,
             "describe: argument 'small' must be int, not str"),
            (lambda: c.describe(NOWHERE, count=-1), ValueError,
             "describe: argument 'count' must be a u32 (0 to 4294967295), not -1"),
            (lambda: c.describe(NOWHERE, total=2 ** 64), ValueError,
             "describe: argument 'total' must be a u64 (0 to 18446744073709551615), "
             "not 18446744073709551616"),
            (lambda: c.describe(NOWHERE, flag=1), TypeError,
             "describe: argument 'flag' must be bool, not int"),
            (lambda: c.grow(NOWHERE, depth=True), TypeError,
             "grow: argument 'depth' must be int, not bool"),
            (lambda: c.describe(NOWHERE, blob="text"), TypeError,
             "describe: argument 'blob' must be bytes, not str"),
            (lambda: c.describe(NOWHERE, ratio="1"), TypeError,
             "describe: argument 'ratio' must be float, not str"),
            (lambda: c.describe(NOWHERE, ratio=10 ** 400), ValueError,
             "describe: argument 'ratio' must be an f64, not " + str(10 ** 400) + " (too large)"),
            (lambda: c.describe(NOWHERE, note=5), TypeError,
             "describe: argument 'note' must be str or None, not int"),
            (lambda: c.describe(NOWHERE, tags="ab"), TypeError,
             "describe: argument 'tags' must be a sequence (list), not str"),
            (lambda: c.describe(NOWHERE, tags=["a", 2]), TypeError,
             "describe: argument 'tags[1]' must be str, not int"),
            (lambda: c.describe(NOWHERE, opts={1: 2}), TypeError,
             "describe: argument 'opts' must have str keys, not int"),
            (lambda: c.describe(NOWHERE, opts={"k": -1}), ValueError,
             "describe: argument 'opts['k']' must be a u64 (0 to 18446744073709551615), not -1"),
            (lambda: c.describe(NOWHERE, inner={"label": "x"}), TypeError,
             "describe: argument 'inner' must be Inner or None, not dict"),
            (lambda: c.echo(NOWHERE, value=m.Inner(label="x")), TypeError,
             "echo: argument 'value' must be Everything, not Inner"),
            (lambda: c.describe(NOWHERE, from_=-1), ValueError,
             "describe: argument 'from_' must be a u64 (0 to 18446744073709551615), not -1"),
            (lambda: c.describe_many([NOWHERE], small="x"), TypeError,
             "describe: argument 'small' must be int, not str"),
            (lambda: c.describe_many(NOWHERE), TypeError,
             "describe_many: addresses must be a sequence of addresses, not one str"),
            (lambda: c.remember(NOWHERE, key=b"k"), TypeError,
             "remember: argument 'key' must be str, not bytes"),
        ]
        for fn, cls, msg in cases:
            with self.assertRaises(cls) as cm:
                fn()
            self.assertEqual(str(cm.exception), msg)
        bad = matrix_values.full(m)
        bad.index["i"][1].tags = ["ok", None]
        with self.assertRaises(TypeError) as cm:
            c.echo(NOWHERE, value=bad)
        self.assertEqual(str(cm.exception), "echo: argument 'value.index['i'][1].tags[1]' "
                         "must be str, not NoneType")
        self.assertEqual(self.client.rpc.stats(NOWHERE)["calls"], 0)

    def test_inputs_accepted(self) -> None:
        # Tuples for lists, any mapping for maps, ints for f64, bytearray for bin.
        got = self.client.describe(self.addr, tags=("a", "b"), opts={"k": 1}, ratio=2,
                                   blob=bytearray(b"z"))
        self.assertIn("tags=['a', 'b']", got)
        self.assertIn("ratio=2.0", got)
        self.assertIn("blob=b'z'", got)

    # -- names ----------------------------------------------------------------------------------

    def test_keyword_named_args(self) -> None:
        got = self.client.describe(self.addr, from_=3, pass_="c", lambda_=True, address_="a",
                                   timeout_=4, self_=5, timeout=5.0)
        for part in ("from_=3", "pass_='c'", "lambda_=True", "address_='a'", "timeout_=4",
                     "self_=5"):
            self.assertIn(part, got)

    def test_python_names(self) -> None:
        # names.idl: each name Python cannot take as it is gets a trailing '_'.
        self.assertEqual(names.Exception_.__name__, "Exception_")
        self.assertEqual(names.object_(None_=True).None_, True)
        self.assertEqual(names.Client_.kind, "Client")
        self.assertEqual(names.SERVICE_.kind, "SERVICE")
        self.assertEqual(names.SERVICE, "names")
        e = names.Exception_(lambda_="l")
        self.assertEqual((e.self_, e.str, e.bytes, e.object), (1, "s", b"b", 0))
        for method in ("close_", "close_many", "import_", "import_many", "close"):
            self.assertTrue(hasattr(names.Client, method), method)

        class NamesUnit(names.Handlers):  # type: ignore
            def close_(self, **kw: Any) -> Any:
                if kw["from_"] == "raise":
                    raise names.Client_("declared", reason="r")
                return names.Exception_(lambda_=repr(sorted(kw.items())), self_=7, str="x")

            def import_(self, *, rpc: Any) -> Any:
                return [rpc, names.object_()]

        with names.serve(NamesUnit(), "tcp://127.0.0.1:0") as server, \
                names.Client(timeout=10.0) as c:
            got = c.close_(server.endpoint, from_="f", address_="a", address__="b",
                           addresses_=3, timeout_=2, self_=True,
                           True_=names.Exception_(lambda_="t"))
            self.assertEqual((got.self_, got.str, got.bytes), (7, "x", b"b"))
            self.assertIn("('address_', 'a'), ('address__', 'b'), ('addresses_', 3)",
                          got.lambda_)
            with self.assertRaises(names.Client_) as cm:
                c.close_(server.endpoint, from_="raise")
            self.assertEqual(cm.exception.reason, "r")
            self.assertEqual(c.import_(server.endpoint, rpc=names.object_(None_=True)),
                             [names.object_(None_=True), names.object_()])
            # On the wire the IDL names: a raw call by them works.
            raw = c.rpc.call(server.endpoint, "close", {"from": "f", "True": None,
                                                        "address_": "z"})
            self.assertIn("('address__', 'z')", raw["lambda"])

    def test_shadowing_names(self) -> None:
        # shadows.v1.idl: names the generated module could confuse with its own. Records
        # named like builtins it uses get a '_', the record opt_R keeps its name beside R?,
        # an op named str is str_, and an argument named like its op's result type keeps its
        # name.
        sh = support.load(os.path.join(support.HERE, "shadows.v1.idl"), "shadows")
        self.assertEqual([sh.property_.__name__, sh.chr_.__name__, sh.reversed_.__name__,
                          sh.hasattr_.__name__, sh.range_.__name__],
                         ["property_", "chr_", "reversed_", "hasattr_", "range_"])
        self.assertTrue(issubclass(sh.BaseException_, ctlrpc.DeclaredError))
        self.assertTrue(hasattr(sh.Client, "str_") and not hasattr(sh.Client, "str"))

        class ShadowsUnit(sh.Handlers):  # type: ignore
            def f(self, *, x: Any) -> Any:
                return sh.opt_R(b="none" if x is None else str(x.a))

            def g(self, *, y: Any) -> Any:
                return None if y.b == "none" else sh.R(a=int(y.b))

            def h(self, *, z: Any, w: Any) -> Any:
                return [sh.opt_R(b=str(len(z or [])))] + ([w] if w else [])

            def props(self, *, p: Any, c: Any, r: Any, h: Any, n: Any) -> Any:
                if p.p == 13:
                    raise sh.BaseException_("thirteen")
                return [p, sh.property_(p=c.q + r.r + h.s + n.t)]

            def str_(self, *, str: Any) -> Any:  # noqa: A002 (the IDL's name)
                return str * 2

            def read(self, *, offset: int, bytes: int) -> Any:  # noqa: A002
                return b"\x00" * bytes + offset.to_bytes(8, "big")

            def nested(self, *, property: Any, chr: int, Inner: Any) -> Any:  # noqa: A002
                return None if chr else [Inner, sh.Inner(i=property.p)]

        with sh.serve(ShadowsUnit(), "tcp://127.0.0.1:0") as server, \
                sh.Client(timeout=10.0) as c:
            a = server.endpoint
            self.assertEqual(c.f(a, x=sh.R(a=5)), sh.opt_R(b="5"))
            self.assertEqual(c.f(a), sh.opt_R(b="none"))
            self.assertEqual(c.g(a, y=sh.opt_R(b="7")), sh.R(a=7))
            self.assertIsNone(c.g(a, y=sh.opt_R(b="none")))
            self.assertEqual(c.h(a, z=[sh.R(a=1)] * 3, w=sh.opt_R(b="w")),
                             [sh.opt_R(b="3"), sh.opt_R(b="w")])
            self.assertEqual(c.props(a, p=sh.property_(p=1), c=sh.chr_(q=2),
                                     r=sh.reversed_(r=3), h=sh.hasattr_(s=4), n=sh.range_(t=5)),
                             [sh.property_(p=1), sh.property_(p=14)])
            with self.assertRaises(sh.BaseException_):
                c.props(a, p=sh.property_(p=13), c=sh.chr_(), r=sh.reversed_(),
                        h=sh.hasattr_(), n=sh.range_())
            with self.assertRaises(ValueError):  # a bad value is refused before sending
                c.props(a, p=sh.property_(p=-1), c=sh.chr_(), r=sh.reversed_(),
                        h=sh.hasattr_(), n=sh.range_())
            self.assertEqual(c.str_(a, str="ab"), "abab")
            self.assertEqual(c.read(a, offset=1, bytes=2), b"\x00\x00" + bytes(7) + b"\x01")
            self.assertEqual(c.nested(a, property=sh.property_(p=9), Inner=sh.Inner()),
                             [sh.Inner(i=-1), sh.Inner(i=9)])
            self.assertIsNone(c.nested(a, property=sh.property_(), chr=1, Inner=sh.Inner()))
            # On the wire the IDL names.
            self.assertEqual(c.rpc.call(a, "str", {"str": "x"}), "xx")

    def test_builtins_reserved(self) -> None:
        # Every builtin a generated module names is one a record or error kind may not take.
        import ast
        import builtins
        sys.path.insert(0, os.path.join(support.ROOT, "gen"))
        from ctlrpc_gen.render_py import _BUILTINS
        for mod in (m, names, support.load(os.path.join(support.HERE, "shadows.v1.idl"),
                                           "shadows")):
            with open(mod.__file__) as f:
                tree = ast.parse(f.read())
            bound = {n.arg for n in ast.walk(tree) if isinstance(n, ast.arg)} | \
                {n.id for n in ast.walk(tree)
                 if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Store)}
            used = {n.id for n in ast.walk(tree) if isinstance(n, ast.Name)
                    and hasattr(builtins, n.id) and n.id not in bound}
            self.assertEqual(used - _BUILTINS, set(), mod.__name__)

    # -- the unit -------------------------------------------------------------------------------

    def test_handler_exceptions(self) -> None:
        with self.assertRaises(ctlrpc.Transfer) as cm:
            self.client.sum(self.addr, ints=[], scale=666)
        self.assertEqual(cm.exception.remote_kind, "Protocol")
        self.assertIn("op 'sum' failed with an unexpected RuntimeError: the handler broke",
                      cm.exception.msg)
        with self.assertRaises(ctlrpc.Transfer) as cm:
            self.client.sum(self.addr, ints=[], scale=7)
        self.assertEqual(cm.exception.msg, "op 'sum': the handler's result must be float, "
                         "not str (a bug in the unit)")

    def test_raises_enforced(self) -> None:
        before = self.server.stats()["undeclared"]
        for label, kind in (("busy", "Busy"), ("stale", "Stale")):
            with self.assertRaises(ctlrpc.Transfer) as cm:
                self.client.grow(self.addr, depth=1, label=label)
            self.assertEqual(cm.exception.remote_kind, "Protocol")
            self.assertIn(f"op 'grow' failed with {kind}, which it does not declare in "
                          "'raises' (a bug in the unit)", cm.exception.msg)
        with self.assertRaises(ctlrpc.Transfer) as cm:
            self.client.fail(self.addr, kind="Stray")
        self.assertIn("failed with Stray", cm.exception.msg)
        self.assertEqual(self.server.stats()["undeclared"], before + 3)
        # A declared kind the op lists: its class, caught by its name.
        try:
            self.client.fail(self.addr, kind="NoSuchThing", reason="gone")
            self.fail("no exception")
        except m.NoSuchThing as e:
            self.assertEqual((e.msg, e.reason, e.kind, e.op, e.address),
                             ("none here", "gone", "NoSuchThing", "fail", self.addr))
            self.assertIsInstance(e, ctlrpc.DeclaredError)

    def test_unimplemented(self) -> None:
        with self.assertRaises(ctlrpc.Transfer) as cm:
            self.client.ping(self.addr)
        self.assertEqual(cm.exception.msg, "op 'ping' is not implemented by this unit")

    def test_notify(self) -> None:
        logging.getLogger("ctlrpc").setLevel(logging.CRITICAL)  # the failing notify is logged
        self.assertIsNone(self.client.remember(self.addr, key="boom"))
        self.assertIsNone(self.client.remember(self.addr, key="n1", value=9))
        deadline = time.monotonic() + 5
        while "n1" not in self.client.remembered(self.addr) and time.monotonic() < deadline:
            time.sleep(0.01)
        self.assertEqual(self.client.remembered(self.addr).get("n1"), 9)
        self.assertNotIn("boom", self.client.remembered(self.addr))

    def test_notify_bad_args_dropped(self) -> None:
        """A notify whose args do not fit the op's (sent untyped: the generated client would
        refuse them) is dropped and counted in its op's `dropped`, as in C; a failing handler
        is counted as an error."""
        logging.getLogger("ctlrpc").setLevel(logging.CRITICAL)  # the failing notify is logged

        def counts() -> Any:
            op = self.server.op_stats()["ops"]["remember"]
            return op["dropped"], sum(op["errors"].values())

        dropped, errs = counts()
        raw = ctlrpc.Client(timeout=10.0)
        try:
            raw.notify(self.addr, "remember", {"key": 5, "value": 1})  # key: a str
            raw.notify(self.addr, "remember", {"key": "k", "nope": 1})
            raw.notify(self.addr, "remember", {"key": "boom"})
            deadline = time.monotonic() + 5
            while counts() != (dropped + 2, errs + 1) and time.monotonic() < deadline:
                time.sleep(0.01)
        finally:
            raw.close()
        self.assertEqual(counts(), (dropped + 2, errs + 1))

    def test_defaults_applied_on_the_unit(self) -> None:
        got = self.client.rpc.call(self.addr, "describe", {})
        self.assertEqual(got, self.unit.describe(
            flag=False, small=-1, big=0, count=7, total=0, ratio=0.5, name="n", blob=b"b",
            note=None, tags=[], opts={}, inner=None, from_=0, pass_=None, lambda_=False,
            address_="", timeout_=0, self_=0))

    def test_many(self) -> None:
        outs = self.client.grow_many([self.addr, NOWHERE, self.addr], depth=1, timeout=0.5)
        self.assertEqual([o.ok for o in outs], [True, False, True])
        self.assertEqual([o.address for o in outs], [self.addr, NOWHERE, self.addr])
        self.assertEqual(outs[0].result.children[0].label, "kid")
        self.assertIsInstance(outs[1].error, ctlrpc.Transfer)  # nothing listens: refused
        self.assertEqual(outs[1].error.cause, "refused")
        self.assertEqual(self.client.grow_many([], depth=1), [])

    # -- replies --------------------------------------------------------------------------------

    def test_bad_replies(self) -> None:
        replies = {
            "find": {"label": 5},
            "grow": {"label": "a", "children": [{"label": "b", "children": [{"label": 1}]}]},
            "sum": "x",
            "repeat": [1],
            "remembered": {"a": 2 ** 63},
            "fail": -1,
            "describe": {"label": "x"},
        }
        raw = ctlrpc.Server({op: (lambda args, op=op: replies[op]) for op in replies},
                            "tcp://127.0.0.1:0")
        addr = raw.endpoint
        want = {
            "find": "bad reply: result.label: expected str, got int",
            "grow": "bad reply: result.children[0].children[0].label: expected str, got int",
            "sum": "bad reply: result: expected f64, got str",
            "repeat": "bad reply: result: expected bin, got array",
            "fail": "bad reply: result: expected u64, got -1 (out of range)",
            "describe": "bad reply: result: expected str, got map",
        }
        calls = {"find": lambda: self.client.find(addr, name="x"),
                 "grow": lambda: self.client.grow(addr, depth=1),
                 "sum": lambda: self.client.sum(addr, ints=[]),
                 "repeat": lambda: self.client.repeat(addr, data=b"x"),
                 "fail": lambda: self.client.fail(addr, kind="x"),
                 "describe": lambda: self.client.describe(addr)}
        try:
            for op, call in calls.items():
                with self.assertRaises(ctlrpc.Transfer) as cm:
                    call()
                e = cm.exception
                self.assertEqual((e.cause, e.op, e.address, e.msg), ("bad-reply", op, addr,
                                                                      want[op]))
                self.assertEqual(str(e), f"{op} at {addr}: {want[op]}")
            with self.assertRaises(ctlrpc.Transfer) as cm:
                self.client.remembered(addr)
            self.assertEqual(cm.exception.msg, "bad reply: result.a: expected i64, got "
                             "9223372036854775808 (out of range)")
            # In _many, a bad reply is that address's failure.
            outs = self.client.describe_many([addr, self.addr])
            self.assertFalse(outs[0].ok)
            self.assertEqual(outs[0].error.cause, "bad-reply")
            self.assertTrue(outs[1].ok)
            # Unknown fields skipped, missing defaulted ones filled, ints taken for f64.
            replies["find"] = {"label": "l", "weight": 2, "new_field": [1]}
            self.assertEqual(self.client.find(addr, name="x"),
                             m.Inner(label="l", weight=2.0, tags=[]))
            replies["find"] = {"weight": 1.0}
            with self.assertRaises(ctlrpc.Transfer) as cm:
                self.client.find(addr, name="x")
            self.assertEqual(cm.exception.msg,
                             "bad reply: result: record Inner: missing field 'label'")
            replies["find"] = None
            self.assertIsNone(self.client.find(addr, name="x"))
        finally:
            raw.close()

    def test_long_paths_are_cut(self) -> None:
        # The C runtime keeps the innermost 159 bytes of a path, marked with "...".
        deep: Any = {"label": 1, "children": []}
        for _ in range(14):  # 14 levels of ".children[0]": 168 bytes; 29 levels of nesting
            deep = {"label": "n", "children": [deep]}
        raw = ctlrpc.Server({"grow": lambda args: deep}, "tcp://127.0.0.1:0")
        try:
            with self.assertRaises(ctlrpc.Transfer) as cm:
                self.client.grow(raw.endpoint, depth=1)
            msg = cm.exception.msg
            # "result ...[0].children[0]...label": cut once, before a "[" (a kept part that
            # starts with "." would share it: "..").
            self.assertTrue(msg.startswith("bad reply: result ...[0].children[0]"), msg)
            self.assertEqual(msg.count(".."), 1)
            self.assertTrue(msg.endswith(".label: expected str, got int"), msg)
            where = msg[len("bad reply: result "):msg.index(": expected")]
            self.assertLessEqual(len(where), 159)
        finally:
            raw.close()

    # -- documentation --------------------------------------------------------------------------

    def test_docstrings(self) -> None:
        self.assertIn("The cross-language matrix", m.__doc__)
        self.assertIn("Every type once, and defaults of every kind.", m.Everything.__doc__)
        self.assertIn("Nothing by that name.", m.NoSuchThing.__doc__)
        doc = m.Client.describe.__doc__
        self.assertIn("The arguments as the unit received them", doc)
        self.assertIn("from_: Python keywords and the generated methods' own parameter names",
                      doc)
        self.assertIn("IDL: ``op describe(", doc)
        self.assertIn("Remember `value` under `key`.", m.Client.remember.__doc__)
        self.assertIn("notify op", m.Client.remember.__doc__)
        self.assertIn("Raises: ctlrpc.UnitFull, ctlrpc.Busy, ctlrpc.Missing, NoSuchThing, Stale",
                      m.Client.fail.__doc__)
        self.assertIn("Fails as `kind` asks", m.Handlers.fail.__doc__)
        self.assertTrue(m.Client.describe_many.__doc__)
        self.assertTrue(m.serve.__doc__)

    def test_idempotent_ops_on_the_runtime(self) -> None:
        # The runtime takes the keyword the generated methods of idempotent ops pass.
        self.assertEqual(self.client.find(self.addr, name="x").label, "x")
        self.assertIsNone(self.client.find(self.addr, name=None))
        outcomes = self.client.find_many([self.addr, self.addr], name="y")
        self.assertEqual([o.result.label for o in outcomes], ["y", "y"])
        self.assertIsInstance(self.client.remembered(self.addr), dict)

    def test_idempotent_docstrings(self) -> None:
        for cls in (m.Client, m.AsyncClient):
            self.assertIn("IDL: ``idempotent op find(name: str?) -> Inner?``", cls.find.__doc__)
            self.assertIn("Idempotent: running it twice does what running it once does",
                          cls.find.__doc__)
            self.assertIn("Idempotent: each address may be retried", cls.find_many.__doc__)
            self.assertNotIn("Idempotent", cls.sum.__doc__)
        self.assertIn("Idempotent: a retried call may run it more than once",
                      m.Handlers.find.__doc__)

    def test_records(self) -> None:
        inner = m.Inner(label="x")
        self.assertEqual((inner.weight, inner.tags), (0.5, []))
        self.assertIsNot(m.Inner(label="y").tags, m.Inner(label="z").tags)
        with self.assertRaises(TypeError):
            m.Inner("positional")  # type: ignore
        e = matrix_values.sparse(m)
        self.assertEqual((e.pass_, e.name_d, e.blob_d, e.ratio_d, e.maybe_d),
                         ("c", "d\u00e9", b"raw", 2.0, "set"))
        self.assertIn("pass_='c'", repr(e))


class _Recorder:
    """A stand-in for the ctlrpc client under a generated Client: records how each call was
    made and answers with `result`."""

    def __init__(self) -> None:
        self.calls: list = []

    def call(self, address: str, op: str, args: Any, timeout: Any, **kw: Any) -> Any:
        self.calls.append(("call", op, kw))
        return {"find": None, "remembered": {}, "sum": 1.0}[op]

    def call_many(self, op: str, targets: Any, timeout: Any, **kw: Any) -> Any:
        self.calls.append(("call_many", op, kw))
        return [ctlrpc.Outcome(a, True, {"find": None, "sum": 1.0}[op], None)
                for a, _ in targets]

    def close(self) -> None:
        pass


class _AsyncRecorder(_Recorder):
    async def call(self, *a: Any, **kw: Any) -> Any:  # type: ignore[override]
        return _Recorder.call(self, *a, **kw)

    async def call_many(self, *a: Any, **kw: Any) -> Any:  # type: ignore[override]
        return _Recorder.call_many(self, *a, **kw)


class Idempotent(unittest.TestCase):
    """The methods of an op declared idempotent pass idempotent=True to the runtime's call and
    call_many; the others pass nothing new (so they work on any runtime)."""

    WANT = [("call", "find", {"idempotent": True}), ("call", "remembered", {"idempotent": True}),
            ("call", "sum", {}), ("call_many", "find", {"idempotent": True}),
            ("call_many", "sum", {})]

    def seen(self, rec: _Recorder) -> list:
        return [(how, op, {k: v for k, v in kw.items() if k != "kinds"})
                for how, op, kw in rec.calls]

    def test_client(self) -> None:
        rec = _Recorder()
        c = m.Client(rpc=rec)
        c.find(NOWHERE, name="x")
        c.remembered(NOWHERE)
        c.sum(NOWHERE, ints=[1])
        c.find_many([NOWHERE], name="x")
        c.sum_many([NOWHERE], ints=[1])
        self.assertEqual(self.seen(rec), self.WANT)

    def test_async_client(self) -> None:
        import asyncio
        rec = _AsyncRecorder()
        c = m.AsyncClient(rpc=rec)

        async def run() -> None:
            await c.find(NOWHERE, name="x")
            await c.remembered(NOWHERE)
            await c.sum(NOWHERE, ints=[1])
            await c.find_many([NOWHERE], name="x")
            await c.sum_many([NOWHERE], ints=[1])
        asyncio.run(run())
        self.assertEqual(self.seen(rec), self.WANT)

    def test_async_runtime_takes_the_keyword(self) -> None:
        import asyncio
        unit = Unit()
        server = m.serve(unit, "tcp://127.0.0.1:0")
        try:
            async def run() -> Any:
                async with m.AsyncClient(timeout=10.0) as c:
                    one = await c.find(server.endpoint, name="z")
                    many = await c.find_many([server.endpoint], name="w")
                    return one.label, [o.result.label for o in many]
            self.assertEqual(asyncio.run(run()), ("z", ["w"]))
        finally:
            server.close()


class CommandLine(unittest.TestCase):
    def test_output_and_depfile(self) -> None:
        with tempfile.TemporaryDirectory() as out:
            dep = os.path.join(out, "x.d")
            idl = os.path.join(support.ROOT, "tests", "stubs", "errors.idl")
            subprocess.run([sys.executable, support.GEN, "--lang", "python", idl, "-o", out,
                            "--depfile", dep], check=True)
            self.assertEqual(sorted(os.listdir(out)), ["jobs_ctl.py", "x.d"])
            with open(dep) as f:
                text = f.read()
            self.assertIn(os.path.join(out, "jobs_ctl.py") + ":", text)
            self.assertIn(idl, text)
            # C stays the default.
            subprocess.run([sys.executable, support.GEN, idl, "-o", out], check=True)
            self.assertIn("errors.ctl.h", os.listdir(out))
            bad = subprocess.run([sys.executable, support.GEN, "--lang", "rust", idl, "-o",
                                  out], capture_output=True, text=True)
            self.assertEqual(bad.returncode, 1)
            self.assertIn("invalid choice: 'rust'", bad.stderr)


    def test_doc_comments_escaped(self) -> None:
        # A NUL, an ESC and a bidi override in a doc comment: the module imports, its source
        # shows them as escapes, and the docstring keeps them.
        with tempfile.TemporaryDirectory() as out:
            idl = os.path.join(out, "ctrl.idl")
            with open(idl, "w", encoding="utf-8") as f:
                f.write("service ctrl;\n/// a\x00b \x1b[31m c\u202ed \\x00\nop f();\n")
            subprocess.run([sys.executable, support.GEN, "--lang", "python", idl, "-o", out],
                           check=True)
            with open(os.path.join(out, "ctrl_ctl.py"), encoding="utf-8") as f:
                source = f.read()
            self.assertIn("a\\x00b \\x1b[31m c\\u202ed \\\\x00", source)
            for ch in "\x00\x1b\u202e":
                self.assertNotIn(ch, source)
            sys.path.insert(0, out)
            try:
                import ctrl_ctl  # type: ignore
            finally:
                sys.path.remove(out)
            self.assertIn("a\x00b \x1b[31m c\u202ed \\x00", ctrl_ctl.Client.f.__doc__)

    def test_long_names(self) -> None:
        with tempfile.TemporaryDirectory() as out:
            # A service name of 255 characters is valid, but too long for the module's file.
            idl = os.path.join(out, "long.idl")
            with open(idl, "w") as f:
                f.write("service %s;\nop f();\n" % ("s" * 255))
            bad = subprocess.run([sys.executable, support.GEN, "--lang", "python", idl, "-o",
                                  out], capture_output=True, text=True)
            self.assertEqual(bad.returncode, 1, bad.stderr)
            self.assertIn("long.idl:1:9: service 'sssss", bad.stderr)
            self.assertIn("at most 248 characters", bad.stderr)
            self.assertNotIn("Traceback", bad.stderr)
            # An IDL file whose generated names are as long as a file name can be (255 bytes):
            # written, through a temporary file of a shorter name.
            stem = "a" * (255 - len(".ctl.h"))
            idl = os.path.join(out, stem + ".idl")
            with open(idl, "w") as f:
                f.write("service a;\nop f();\n")
            subprocess.run([sys.executable, support.GEN, idl, "-o", out], check=True)
            self.assertIn(stem + ".ctl.h", os.listdir(out))
            self.assertEqual([n for n in os.listdir(out) if n.endswith(".tmp")], [])
            # One byte more: refused, naming the file.
            idl = os.path.join(out, stem + "a.idl")
            with open(idl, "w") as f:
                f.write("service a;\nop f();\n")
            bad = subprocess.run([sys.executable, support.GEN, idl, "-o", out],
                                 capture_output=True, text=True)
            self.assertEqual(bad.returncode, 1, bad.stderr)
            self.assertIn("its file name is 256 bytes, more than a file name may have (255)",
                          bad.stderr)

    def test_depfile_escapes_dollar(self) -> None:
        with tempfile.TemporaryDirectory() as out:
            idl = os.path.join(out, "a$b.idl")
            with open(idl, "w") as f:
                f.write("service ab;\nop f();\n")
            dep = os.path.join(out, "x.d")
            subprocess.run([sys.executable, support.GEN, idl, "-o", out, "--depfile", dep],
                           check=True)
            with open(dep) as f:
                text = f.read()
            self.assertIn("a$$b.ctl.h: ", text)
            self.assertIn("a$$b.idl", text)


if __name__ == "__main__":
    unittest.main(verbosity=1)
