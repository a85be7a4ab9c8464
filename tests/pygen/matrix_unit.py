"""The generated-Python unit of the cross-language matrix: matrix_unit.c's twin, serving
matrix.idl through the module `ctlrpc-gen --lang python` writes. The two must behave the same
(the describe line, results, errors and their messages).

    matrix_unit.py [ENDPOINT]     (default tcp://127.0.0.1:0)

Prints the bound endpoint as the first line of stdout and serves until stdin reaches end of
file.
"""

from __future__ import annotations

import sys
from typing import Any, Dict, List, Mapping, Optional, Sequence

import support

import ctlrpc

m = support.matrix()


def quoted(text: Optional[str]) -> str:
    return "nil" if text is None else f"'{text}'"


def inner_text(inner: Any) -> str:
    if inner is None:
        return "nil"
    return f"{{{inner.label}|{'%.17g' % inner.weight}|[{','.join(inner.tags)}]}}"


class Unit(m.Handlers):  # type: ignore
    def __init__(self) -> None:
        self.store: Dict[str, int] = {}  # what remember was sent, in arrival order

    def echo(self, *, value: object) -> object:
        return value

    def grow(self, *, depth: int, fanout: int, label: str) -> object:
        if depth > 8 or fanout > 8:
            raise ctlrpc.Error("grow: at most 8 levels of 8")

        def tree(label: str, depth: int) -> object:
            if depth == 0:
                return m.Tree(label=label, children=[], next=m.Tree(label=label + "+",
                                                                   children=[]))
            return m.Tree(label=label, children=[tree(f"{label}.{i}", depth - 1)
                                                 for i in range(fanout)])
        return tree(label, depth)

    def describe(self, *, flag: bool, small: int, big: int, count: int, total: int,
                 ratio: float, name: str, blob: bytes, note: Optional[str], tags: List[str],
                 opts: Dict[str, int], inner: object, from_: int, pass_: Optional[str],
                 lambda_: bool, address_: str, timeout_: int, self_: int) -> str:
        opts_text = ",".join(f"{k}:{v}" for k, v in opts.items())
        return (f"flag={'true' if flag else 'false'} small={small} big={big} count={count} "
                f"total={total} ratio={'%.17g' % ratio} name={name} blob={blob.hex()} "
                f"note={quoted(note)} tags=[{','.join(tags)}] opts={{{opts_text}}} "
                f"inner={inner_text(inner)} from={from_} pass={quoted(pass_)} "
                f"lambda={'true' if lambda_ else 'false'} address={address_} "
                f"timeout={timeout_} self={self_}")

    def sum(self, *, ints: Sequence[int], weights: Mapping[str, float], scale: float,
            extra: Sequence[Optional[float]]) -> float:
        s = 0.0
        for i in ints:
            s += float(i)
        for w in weights.values():
            s += w
        for x in extra:
            if x is not None:
                s += x
        return s * scale

    def repeat(self, *, data: bytes, times: int) -> Optional[bytes]:
        return (data * times) or None

    def find(self, *, name: Optional[str]) -> object:
        return None if name is None else m.Inner(label=name)

    def fail(self, *, kind: str, reason: Optional[str]) -> int:
        msg = f"asked for {kind}"
        if kind == "UnitFull":
            raise ctlrpc.UnitFull(msg)
        if kind == "Busy":
            raise ctlrpc.Busy(msg, reason=reason)
        if kind == "Missing":
            raise ctlrpc.Missing(msg, blobs=["a", "b"])
        if kind == "NoSuchThing":
            raise m.NoSuchThing(msg, reason=reason)
        if kind == "Stale":
            raise m.Stale(msg, reason=reason)
        if kind == "Stray":
            raise m.Stray(msg, reason=reason)
        if kind == "Protocol":
            raise ctlrpc.Error(msg)
        return 42

    def remember(self, *, key: str, value: int) -> None:
        self.store[key] = value

    def remembered(self) -> Dict[str, int]:
        return self.store

    def ping(self) -> None:
        return None


def main() -> int:
    unit = Unit()
    server = m.serve(unit, sys.argv[1] if len(sys.argv) > 1 else "tcp://127.0.0.1:0")
    print(server.endpoint, flush=True)
    try:
        while sys.stdin.buffer.read(256):
            pass
    finally:
        server.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
