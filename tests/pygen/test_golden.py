"""The golden vectors, Python side: every case of golden.c, called through the generated Python
client and the runtime's real request path, must put on the wire the args map the C stubs pack
(tests/golden/matrix_args.txt), byte for byte, after `[op, id,` (the id is the only part of a
request that may differ). Every case runs twice, through the blocking Client and through the
AsyncClient (on one event loop, warnings as errors, asyncio's debug mode): the two must send
the same bytes and end the same way.

    test_golden.py [VECTORS]     (default: tests/golden/matrix_args.txt)

A ROUTER socket stands in for the unit: it keeps each request and answers it with a Protocol
error, so every call returns at once.
"""

from __future__ import annotations

import asyncio
import os
import sys
import threading
import warnings
from typing import Any, Awaitable, Callable, Dict, List

import support  # noqa: F401  (sys.path)

import msgpack  # type: ignore[import]
import zmq

import ctlrpc

import matrix_values


def load_vectors(path: str) -> Dict[str, tuple]:
    out = {}
    with open(path, encoding="utf-8") as f:
        for line in f:
            if line.startswith("#") or not line.strip():
                continue
            name, op, hexargs = line.split()
            out[name] = (op, bytes.fromhex(hexargs))
    return out


def split_request(payload: bytes) -> tuple:
    """(op, id, the args map's bytes) of a request."""
    u = msgpack.Unpacker(raw=False)
    u.feed(payload)
    assert u.read_array_header() == 3, payload.hex()
    op = u.unpack()
    rid = u.unpack()
    return op, rid, payload[u.tell():]


def main() -> int:
    path = sys.argv[1] if len(sys.argv) > 1 else os.path.join(
        support.ROOT, "tests", "golden", "matrix_args.txt")
    vectors = load_vectors(path)
    m = support.matrix()
    ctx = zmq.Context()
    router = ctx.socket(zmq.ROUTER)
    router.setsockopt(zmq.LINGER, 0)
    router.bind("tcp://127.0.0.1:0")
    address = router.getsockopt(zmq.LAST_ENDPOINT).decode()
    captured: List[bytes] = []
    stop = threading.Event()

    def serve() -> None:
        while not stop.is_set():
            if not router.poll(50):
                continue
            ident, payload = router.recv_multipart()
            captured.append(payload)
            _, rid, _ = split_request(payload)
            if rid:  # notifies carry no id and get no reply
                router.send_multipart([ident, msgpack.packb(
                    [rid, False, {"kind": "Protocol", "msg": "captured", "reason": None,
                                  "blobs": None}], use_bin_type=True)])

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    failed = 0
    cases = matrix_values.cases(m)

    def judge(name: str, path_name: str, before: int, outcome: str) -> str:
        """Check the request a case sent; returns what the case ended with."""
        nonlocal failed
        for _ in range(200):
            if len(captured) > before:
                break
            stop.wait(0.01)
        if len(captured) != before + 1:
            print(f"test_golden: {name} ({path_name}): no request seen")
            failed += 1
            return outcome
        got_op, rid, args = split_request(captured[before])
        want_op, want = vectors.get(name, (None, b""))
        op = cases[name][0]
        if want_op is None:
            print(f"test_golden: {name}: not in {path}")
            failed += 1
        elif got_op != want_op or args != want:
            print(f"test_golden: {name} ({path_name}): Python sends {got_op} {args.hex()}\n"
                  f"{' ' * 13}the C stubs {want_op} {want.hex()}")
            failed += 1
        # The whole request is [op, id, args]: only the id may differ.
        elif captured[before] != (b"\x93" + msgpack.packb(op, use_bin_type=True)
                                  + msgpack.packb(rid, use_bin_type=True) + args):
            print(f"test_golden: {name} ({path_name}): the request around the args differs")
            failed += 1
        return outcome

    def ended(e: BaseException | None, result: Any = None) -> str:
        if e is None:
            return f"returned {result!r}"
        if isinstance(e, ctlrpc.Transfer):
            assert e.cause == "remote" and e.msg == "captured", repr(e)
        return f"raised {type(e).__name__}: {e}"

    blocking: Dict[str, str] = {}
    with m.Client(timeout=10.0) as client:
        for name, (op, kwargs) in cases.items():
            before = len(captured)
            try:
                r = getattr(client, op)(address, **kwargs)
                outcome = ended(None, r)
            except ctlrpc.Error as e:
                outcome = ended(e)
            blocking[name] = judge(name, "Client", before, outcome)

    async def run_async() -> Dict[str, str]:
        out: Dict[str, str] = {}
        async with m.AsyncClient(timeout=10.0) as aclient:
            for name, (op, kwargs) in cases.items():
                before = len(captured)
                call: Callable[..., Awaitable[Any]] = getattr(aclient, op)
                try:
                    r = await call(address, **kwargs)
                    outcome = ended(None, r)
                except ctlrpc.Error as e:
                    outcome = ended(e)
                out[name] = judge(name, "AsyncClient", before, outcome)
        return out

    with warnings.catch_warnings():
        warnings.simplefilter("error")
        asynchronous = asyncio.run(run_async(), debug=True)
    for name in cases:
        if blocking[name] != asynchronous.get(name):
            print(f"test_golden: {name}: Client {blocking[name]}\n"
                  f"{' ' * 13}AsyncClient {asynchronous.get(name)}")
            failed += 1
    stop.set()
    thread.join()
    router.close()
    ctx.term()
    missing = set(vectors) - set(cases)
    for name in sorted(missing):
        print(f"test_golden: {name} is in {path} but not a Python case")
        failed += 1
    print(f"test_golden: {len(cases)} cases, {failed} failed")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
