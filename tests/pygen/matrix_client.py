"""The generated-Python driver of the cross-language matrix: matrix_client.c's assertions, made
through the module `ctlrpc-gen --lang python` writes, against the unit at ADDRESS (C or
Python). Then what only a raw peer can send: arguments of the wrong type, unknown or missing,
which both units must refuse with the same Protocol message, naming the spot.

    matrix_client.py ADDRESS

Prints one line per failed check and exits 1 if any failed.
"""

from __future__ import annotations

import sys
import time
import traceback
from typing import Any, Callable, Dict

import support

import ctlrpc

import matrix_values

m = support.matrix()
MS = 10.0

DEFAULT_LINE = ("flag=false small=-1 big=0 count=7 total=0 ratio=0.5 name=n blob=62 note=nil "
                "tags=[] opts={} inner=nil from=0 pass=nil lambda=false address= timeout=0 "
                "self=0")
ALL_LINE = ("flag=true small=-100000 big=-9223372036854775808 count=4294967295 "
            "total=18446744073709551615 ratio=-0.25 name=\u00fcn\u00ef blob=00ff note='n' "
            "tags=[a,] opts={z:0,a:300} inner={in|0.5|[]} from=1 pass='k' lambda=true "
            "address=tcp://x timeout=65536 self=-32")
FLAG_LINE = DEFAULT_LINE.replace("flag=false", "flag=true")

checks = 0
failures = 0


def check(cond: bool, what: str) -> None:
    global checks, failures
    checks += 1
    if not cond:
        failures += 1
        line = traceback.extract_stack(limit=2)[0].lineno
        print(f"matrix_client.py:{line}: FAILED {what}", file=sys.stderr)


def raises(fn: Callable[[], Any], cls: type, what: str) -> Any:
    """Run fn; check it raised `cls`; return the exception (or None)."""
    try:
        fn()
    except cls as e:
        check(True, what)
        return e
    except Exception as e:
        check(False, f"{what}: raised {e!r}, not {cls.__name__}")
        return None
    check(False, f"{what}: returned, did not raise {cls.__name__}")
    return None


def typed(c: Any, addr: str) -> None:
    check(c.ping(addr, timeout=MS) is None, "ping")

    for i, sent in enumerate((matrix_values.full(m), matrix_values.sparse(m))):
        got = c.echo(addr, value=sent, timeout=MS)
        check(got == sent, f"echo {i}: {got} != {sent}")

    t = c.grow(addr, depth=2)
    check(t.label == "t" and len(t.children) == 2 and t.next is None, "root")
    k = t.children[1]
    check(k.label == "t.1" and len(k.children) == 2, "t.1")
    leaf = k.children[0]
    check(leaf.label == "t.1.0" and leaf.children == [] and leaf.next is not None
          and leaf.next.label == "t.1.0+" and leaf.next.next is None, "leaf")
    t = c.grow(addr, depth=0, fanout=5, label="x")
    check(t.label == "x" and t.children == [] and t.next is not None and t.next.label == "x+",
          "grow depth 0")

    line = c.describe(addr)
    check(line == DEFAULT_LINE, f"describe(): {line!r}")
    line = c.describe(addr, inner=m.Inner(label="in"), **matrix_values.DESCRIBE_ALL)
    check(line == ALL_LINE, f"describe(all): {line!r}")

    r = c.sum(addr, ints=[1, 2, -3], weights={"a": 0.25, "b": 1}, scale=2, extra=[0.5, None])
    check(r == 3.5 and isinstance(r, float), f"sum: {r!r}")
    check(c.sum(addr, ints=()) == 0.0, "sum()")

    check(c.repeat(addr, data=b"ab", times=3) == b"ababab", "repeat ab*3")
    check(c.repeat(addr, data=b"") is None, "repeat empty")

    check(c.find(addr) is None, "find(null)")
    check(c.find(addr, name="q") == m.Inner(label="q", weight=0.5, tags=[]), "find(q)")

    check(c.fail(addr, kind="ok") == 42, "fail(ok)")
    e = raises(lambda: c.fail(addr, kind="UnitFull"), ctlrpc.UnitFull, "UnitFull")
    check(e is not None and e.msg == "asked for UnitFull" and e.address == addr
          and e.op == "fail", f"UnitFull: {e!r}")
    e = raises(lambda: c.fail(addr, kind="Busy", reason="why"), ctlrpc.Busy, "Busy")
    check(e is not None and e.reason == "why", f"Busy: {e!r}")
    e = raises(lambda: c.fail(addr, kind="Missing"), ctlrpc.Missing, "Missing")
    check(e is not None and e.blobs == ["a", "b"], f"Missing: {e!r}")
    e = raises(lambda: c.fail(addr, kind="NoSuchThing"), m.NoSuchThing, "NoSuchThing")
    check(e is not None and e.reason is None and e.msg == "asked for NoSuchThing"
          and e.kind == "NoSuchThing", f"NoSuchThing: {e!r}")
    e = raises(lambda: c.fail(addr, kind="Stale", reason="v2"), m.Stale, "Stale")
    check(e is not None and e.reason == "v2", f"Stale: {e!r}")
    e = raises(lambda: c.fail(addr, kind="Stray"), ctlrpc.Transfer, "Stray")
    check(e is not None and e.cause == "remote" and e.remote_kind == "Protocol"
          and "op 'fail' failed with Stray, which it does not declare in 'raises'" in e.msg,
          f"Stray: {e!r}")
    e = raises(lambda: c.fail(addr, kind="Protocol"), ctlrpc.Transfer, "Protocol")
    check(e is not None and e.cause == "remote" and e.remote_kind == "Protocol"
          and e.msg == "asked for Protocol", f"Protocol: {e!r}")

    check(c.remember(addr, key="k1", value=5) is None, "remember k1")
    check(c.remember(addr, key="k2") is None, "remember k2")
    seen: Dict[str, int] = {}
    for _ in range(500):
        seen = c.remembered(addr)
        if seen:
            break
        time.sleep(0.01)
    check(list(seen.items()) == [("k1", 5), ("k2", 1)], f"remembered: {seen}")

    outs = c.describe_many([addr, addr], flag=True, timeout=MS)
    check(len(outs) == 2, "describe_many")
    for i, o in enumerate(outs):
        check(o.ok and o.address == addr and o.result == FLAG_LINE and o.error is None,
              f"describe_many[{i}]: {o}")
    outs = c.fail_many([addr, addr], kind="Stale", reason="r", timeout=MS)
    check(len(outs) == 2, "fail_many")
    for i, o in enumerate(outs):
        check(not o.ok and isinstance(o.error, m.Stale) and o.error.reason == "r",
              f"fail_many[{i}]: {o}")


# What a raw peer sends, and the Protocol message both units must answer with.
def raw_cases() -> Any:
    value = m._OP_echo.args_to_wire((matrix_values.full(m),))["value"]

    def with_value(**changes: Any) -> Dict[str, Any]:
        v = dict(value)
        v.update(changes)
        return {"value": v}

    no_flag = dict(value)
    del no_flag["flag"]
    bad_inner = dict(value["inner"], label=5)
    return [
        ("echo", with_value(inner=bad_inner),
         "op 'echo': arg value.inner.label: expected str, got int"),
        ("echo", with_value(index={"i": [{"label": "a", "weight": "heavy"}]}),
         "op 'echo': arg value.index.i[0].weight: expected f64, got str"),
        ("echo", {"value": no_flag}, "op 'echo': arg value: record Everything: missing field "
         "'flag'"),
        ("echo", {"value": 5}, "op 'echo': arg value: expected record Everything, got int"),
        ("echo", with_value(grid=[[1], [2, "x"]]),
         "op 'echo': arg value.grid[1][1]: expected i32, got str"),
        ("echo", with_value(small=2 ** 31), "op 'echo': arg value.small: expected i32, got "
         "2147483648 (out of range)"),
        ("echo", with_value(holes=[1, -1]), "op 'echo': arg value.holes[1]: expected u64, got "
         "-1 (out of range)"),
        ("echo", with_value(names={"a": "x", 7: "y"}),
         "op 'echo': arg value.names[1]: expected a str key, got int"),
        ("grow", {"depth": -1}, "op 'grow': arg depth: expected u32, got -1 (out of range)"),
        ("grow", {}, "op 'grow': missing required arg 'depth'"),
        ("grow", {"depth": 1, "bogus": 1}, "op 'grow': arg bogus: not an arg of grow"),
        ("ping", {"x": 1}, "op 'ping': arg x: not an arg of ping, which takes none"),
        ("sum", {"ints": [1, 2.5]}, "op 'sum': arg ints[1]: expected i64, got float"),
        ("describe", {"opts": {"a": True}}, "op 'describe': arg opts.a: expected u64, got bool"),
        ("describe", {"opts": {"a\nb": "x"}},
         "op 'describe': arg opts.a\\x0ab: expected u64, got str"),
        ("describe", {"opts": {"k" * 70: "x"}},
         f"op 'describe': arg opts.{'k' * 64}...: expected u64, got str"),
        ("find", {"name": b"x"}, "op 'find': arg name: expected str, got bin"),
        ("describe", {"flag": None}, "op 'describe': arg flag: expected bool, got nil"),
    ]


def raw(c: Any, addr: str) -> None:
    for op, args, want in raw_cases():
        e = raises(lambda: c.rpc.call(addr, op, args, MS), ctlrpc.Transfer, f"raw {op} {want}")
        check(e is not None and e.cause == "remote" and e.remote_kind == "Protocol"
              and e.msg == want, f"raw {op}:\n  got  {e.msg if e else None!r}\n  want {want!r}")
    # What decoders accept: an int for an f64, a field they do not know.
    check(c.rpc.call(addr, "sum", {"ints": [], "scale": 3}, MS) == 0.0, "f64 from an int")
    value = m._OP_echo.args_to_wire((matrix_values.full(m),))["value"]
    got = c.rpc.call(addr, "echo", {"value": dict(value, zzz=[1, {"x": None}])}, MS)
    check(got == value, "an unknown field is skipped")


def main() -> int:
    addr = sys.argv[1]
    with m.Client(timeout=MS) as c:
        typed(c, addr)
        raw(c, addr)
    print(f"matrix_client.py: {checks} checks, {failures} failed (unit {addr})")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
