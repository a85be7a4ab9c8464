"""The unit's golden vectors: requests no well-behaved client sends, and what a unit answers
them (tests/golden/unit_replies.txt). The C matrix unit and the generated-Python one are judged
by the same file, so both runtimes keep one rule: how an op name is shown in a message (bytes
as the C runtime shows them: printable ASCII but the backslash as it is, every other byte as
\\xNN, cut after 64 bytes with "..."), what args with a key that is not a string get, and that a
malformed msgpack timestamp (ext type -1 of a length that is not 4, 8 or 12) is an ext like any
other, judged where its value is used.

    test_unit_golden.py --unit {c,py} --c-unit PATH [--print]

Each line of the file: a case name, the request payload in hex, and the answer as JSON:
["Protocol", "<message>"] for an error reply (its kind and message), ["ok"] for a result, or
["silent"] for no reply (a notify: judged by the reply to a ping sent after it on the same
connection, which must come first). --print writes the cases with the answers of the unit
given (the C unit's are the rule: `scripts/golden.sh` regenerates the file).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from typing import Any, Dict, List, Tuple

import msgpack  # type: ignore[import]
import zmq

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
FILE = os.path.join(ROOT, "tests", "golden", "unit_replies.txt")
WAIT_MS = 5000


def req(op: Any, args: bytes, rid: str = "golden") -> bytes:
    """[op, id, <args as given>]: op a str, or bytes for a name that is not UTF-8."""
    if isinstance(op, bytes):
        head = (bytes([0xA0 | len(op)]) if len(op) < 32 else b"\xd9" + bytes([len(op)])) + op
    else:
        head = msgpack.packb(op, use_bin_type=True)
    return b"\x93" + head + msgpack.packb(rid, use_bin_type=True) + args


def p(obj: Any) -> bytes:
    return msgpack.packb(obj, use_bin_type=True, strict_types=False)


def m(*pairs: Tuple[bytes, bytes]) -> bytes:
    """A map from already-packed keys and values."""
    return bytes([0x80 | len(pairs)]) + b"".join(k + v for k, v in pairs)


TS_BAD1 = b"\xd4\xff\x00"  # fixext 1, type -1: not a timestamp's length
TS_BAD3 = b"\xc7\x03\xff\x00\x00\x00"  # ext 8 of 3 bytes, type -1
TS_BAD16 = b"\xd8\xff" + bytes(16)  # fixext 16, type -1
TS_GOOD = b"\xd6\xff\x00\x00\x00\x01"  # a 32-bit timestamp: 1 s
AB = p({"data": b"ab", "times": 2})

CASES: Dict[str, bytes] = {
    "unknown_op_bytes": req(b"\xffop\t", p({})),
    "unknown_op_utf8_backslash": req("caf\u00e9\\", p({})),
    "unknown_op_controls": req("a\x00b\x1f\x7f", p({})),
    "unknown_op_long": req("x" * 70, p({})),
    "unknown_op_long_multibyte": req("\u00e9" * 40, p({})),
    "int_key": req("repeat", p({1: b"x"})),
    "bin_key": req("repeat", m((p(b"data"), p(b"x")))),
    "int_key_after_a_good_one": req("repeat", m((p("data"), p(b"x")), (p(2), p(1)))),
    "int_key_no_args": req("ping", p({7: 1})),
    "nil_key_no_args": req("ping", m((b"\xc0", p(1)))),
    "str_key_no_args": req("ping", p({"z": 1})),
    "int_key_builtin": req("_health", p({1: 1})),
    "str_key_builtin": req("_health", p({"x\ty": 1})),
    "int_key_notify": req("remember", p({1: 2})),
    "bad_timestamp_bin_arg": req("repeat", m((p("data"), TS_BAD1))),
    "bad_timestamp_ext8": req("repeat", m((p("data"), TS_BAD3))),
    "bad_timestamp_fixext16": req("repeat", m((p("data"), TS_BAD16))),
    "bad_timestamp_in_a_list": req("sum", m((p("ints"), b"\x92\x01" + TS_BAD1))),
    "bad_timestamp_unknown_arg": req("ping", m((p("z"), TS_BAD1))),
    "bad_timestamp_times": req("repeat", m((p("data"), p(b"x")), (p("times"), TS_BAD1))),
    "good_timestamp_bin_arg": req("repeat", m((p("data"), TS_GOOD))),
    "bad_timestamp_notify": req("remember", m((p("key"), TS_BAD1))),
    "args_not_a_map": req("repeat", p([1])),
    "known_op_good_args": req("repeat", p({"data": b"ab", "times": 2})),
    # Deadlines in ids (docs/PROTOCOL.md, "Deadlines"): past by more than the skew allowance,
    # skipped unanswered; far ahead, or no deadline by the strict form, served as before.
    "deadline_passed": req("repeat", AB, "0123456789ab@1"),
    "deadline_passed_zero_padded": req("repeat", AB, "0123456789ab@0000000000001"),
    "deadline_passed_unknown_op": req("nope", p({}), "0123456789ab@1"),
    "deadline_passed_bad_args": req("repeat", p([1]), "0123456789ab@1"),
    "deadline_passed_builtin": req("_health", p({}), "0123456789ab@1"),
    "deadline_ahead_16_digits": req("repeat", AB, "0123456789ab@9999999999999999"),
    "deadline_reference_id": req("repeat", AB, "0123456789ab"),
    "deadline_17_digits": req("repeat", AB, "x@00000000000000001"),
    "deadline_not_digits": req("repeat", AB, "x@1e3"),
    "deadline_last_at": req("repeat", AB, "x@1@9999999999999999"),
    "deadline_empty": req("repeat", AB, "x@"),
}


def answer(sock: zmq.Socket, payload: bytes) -> List[Any]:  # type: ignore[type-arg]
    """What the unit answers `payload` (then a ping, to tell "no reply" without a wait)."""
    sock.send(payload)
    sock.send(req("ping", p({}), "after"))
    got: List[Any] = []
    while True:
        if not sock.poll(WAIT_MS):
            return ["no answer within %d ms" % WAIT_MS]
        rid, ok, body = msgpack.unpackb(sock.recv(), raw=False, strict_map_key=False)
        if rid == "after":
            return got or ["silent"]
        got = ["ok"] if ok else [body.get("kind"), body.get("msg")]


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--unit", choices=("c", "py"), required=True)
    ap.add_argument("--c-unit", required=True)
    ap.add_argument("--print", action="store_true")
    a = ap.parse_args()
    cmd = [a.c_unit] if a.unit == "c" else [sys.executable, os.path.join(HERE, "matrix_unit.py")]
    unit = subprocess.Popen(cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    failed = 0
    ctx = zmq.Context()
    try:
        assert unit.stdout is not None
        endpoint = unit.stdout.readline().strip()
        if not endpoint.startswith("tcp://"):
            print(f"test_unit_golden: the {a.unit} unit did not start (said {endpoint!r})")
            return 1
        sock = ctx.socket(zmq.DEALER)
        sock.setsockopt(zmq.LINGER, 0)
        sock.connect(endpoint)
        answers = {name: answer(sock, payload) for name, payload in CASES.items()}
        sock.close()
        if a.print:
            print("# The unit's golden vectors (tests/pygen/test_unit_golden.py): <case> "
                  "<request in hex>\n# <answer as JSON>, as the C matrix unit answers; "
                  "regenerate with scripts/golden.sh.")
            for name, payload in CASES.items():
                print(name, payload.hex(), json.dumps(answers[name], ensure_ascii=True))
            return 0
        with open(FILE, encoding="utf-8") as f:
            want = {}
            for line in f:
                if line.startswith("#") or not line.strip():
                    continue
                name, hexreq, rest = line.rstrip("\n").split(" ", 2)
                want[name] = (bytes.fromhex(hexreq), json.loads(rest))
        for name, (payload, expected) in want.items():
            if name not in CASES:
                print(f"test_unit_golden: {name} is in the file but not a case")
                failed += 1
                continue
            if CASES[name] != payload:
                print(f"test_unit_golden: {name}: the request differs from the file's "
                      "(regenerate with scripts/golden.sh)")
                failed += 1
            got = answers[name]
            if got != expected:
                print(f"test_unit_golden: {name}: the {a.unit} unit answers {got}\n"
                      f"{' ' * 18}the vectors say {expected}")
                failed += 1
        for name in CASES:
            if name not in want:
                print(f"test_unit_golden: {name} is not in {FILE}")
                failed += 1
        print(f"test_unit_golden: {a.unit} unit, {len(CASES)} cases, {failed} failed")
    finally:
        ctx.term()
        assert unit.stdin is not None
        unit.stdin.close()
        try:
            urc = unit.wait(timeout=20)
        except subprocess.TimeoutExpired:
            unit.kill()
            urc = -1
    if urc != 0:
        print(f"test_unit_golden: the {a.unit} unit exited with status {urc}")
        return 1
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
