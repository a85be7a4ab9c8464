"""ctlrpc: the generic caller, in the spirit of grpcurl. Calls any op of any ctlrpc unit, C or
Python, with no generated code: the IDL comes from `--idl FILE` or from the unit itself (the
built-in op `_describe`), is read by ctlrpc-gen's own parser and checker, and every argument is
checked and encoded by its IDL type before anything is sent. An op the IDL declares `idempotent`
is called with idempotent=True (`idempotent_ops`), so that a retry policy may send it again after
a timeout.

    ctlrpc call ADDRESS OP [name=value ...] [--json '{...}']
    ctlrpc call --address A --address B OP ...       fan-out: one row per unit, one deadline
    ctlrpc ops ADDRESS | --idl FILE                  the ops, their signatures and docs
    ctlrpc describe ADDRESS                          what _describe answers
    ctlrpc health ADDRESS...                         _health of each unit
    ctlrpc stats ADDRESS... [--json | --prometheus]  _stats: a table per op
    ctlrpc keygen PREFIX                             a CURVE key pair

JSON conventions (docs/OPERATIONS.md, "The generic caller: ctlrpc"): results and rows are JSON;
a bin is a base64 string (standard alphabet, padded), both ways; integers are JSON numbers,
exact at any width; an optional's nil is null; a record is an object keyed by field name, a
map<str, T> an object. On the command line, `name=value` is parsed by the argument's type:
scalars as written (bool: true/false, yes/no, on/off, 1/0), bins as the text's UTF-8 bytes,
`@FILE` for a file's bytes or `-` for standard input, lists, maps and records as JSON.

Exit status as ctl-storage's: 0 ok, 1 local failure, 2 usage (a bad argument, an unknown op),
3 UnitFull, 4 Busy, 5 Missing, 6 Transfer (a Protocol error from the unit, transport, bad
reply, too large), 7 timeout, 8 unreachable (connection refused, host does not resolve),
9 authentication failed (CURVE), 10 an error kind the service declares. With several units,
the first failing unit's status.
"""

from __future__ import annotations

import argparse
import base64
import binascii
import difflib
import json
import math
import os
import re
import sys
import time
from typing import Any, Dict, List, Optional, Sequence, Set, Tuple

import ctlrpc
from ctlrpc import curve, errors, net

from ctlrpc_gen import model as m
from ctlrpc_gen.check import check
from ctlrpc_gen.diag import Diagnostics
from ctlrpc_gen.parser import _Loader, load_program

import ctlrpc_fleet as fleet

PROG = "ctlrpc"

EXIT_OK = 0
EXIT_LOCAL = 1
EXIT_USAGE = 2
EXIT_UNIT_FULL = 3
EXIT_BUSY = 4
EXIT_MISSING = 5
EXIT_TRANSFER = 6
EXIT_TIMEOUT = 7
EXIT_UNREACHABLE = 8
EXIT_AUTH = 9
EXIT_DECLARED = 10

DEFAULT_TIMEOUT_S = 5.0

_EPILOG = """\
JSON: a bin is base64 text; name=value takes a bin as text, @FILE or - (stdin), and lists,
maps and records as JSON.

exit status: 0 ok, 1 local failure, 2 usage, 3 UnitFull, 4 Busy, 5 Missing, 6 Transfer
(protocol, transport, bad reply, too large), 7 timeout, 8 unreachable (connection refused,
host does not resolve), 9 authentication failed (CURVE keys or allowlist), 10 an error kind
the service declares. See ctlrpc(1) and docs/OPERATIONS.md.
"""


class Fail(Exception):
    """Ends the program: `msg` on standard error, exit `status`."""

    def __init__(self, status: int, msg: str) -> None:
        super().__init__(msg)
        self.status = status
        self.msg = msg


def usage(msg: str) -> Fail:
    return Fail(EXIT_USAGE, msg)


# ---- errors of calls ------------------------------------------------------------------------

def status_of(e: errors.Error) -> int:
    if isinstance(e, errors.UnitFull):
        return EXIT_UNIT_FULL
    if isinstance(e, errors.Busy):
        return EXIT_BUSY
    if isinstance(e, errors.Missing):
        return EXIT_MISSING
    if isinstance(e, errors.DeclaredError):
        return EXIT_DECLARED
    if isinstance(e, errors.Transfer):
        if e.cause == "timeout":
            return EXIT_TIMEOUT
        if e.cause in ("refused", "unresolved"):
            return EXIT_UNREACHABLE
        if e.cause == "auth":
            return EXIT_AUTH
        if e.cause == "remote" and e.remote_kind and e.remote_kind != "Protocol":
            return EXIT_DECLARED  # a kind this caller's IDL does not know
    return EXIT_TRANSFER


def word_of(e: errors.Error) -> str:
    """The short word for an error (ctl-storage's words)."""
    if isinstance(e, errors.Transfer):
        if e.cause == "timeout":
            return "Timeout"
        if e.cause in ("refused", "unresolved"):
            return "Unreachable"
        if e.cause == "auth":
            return "AuthFailed"
        if e.cause == "remote" and e.remote_kind and e.remote_kind != "Protocol":
            return e.remote_kind
        return "Transfer"
    if isinstance(e, errors.DeclaredError):
        return type(e).kind
    return e.kind


def error_json(e: errors.Error) -> Dict[str, Any]:
    out: Dict[str, Any] = {"kind": word_of(e), "msg": str(e)}
    if isinstance(e, errors.Transfer):
        out["cause"] = e.cause
    reason = getattr(e, "reason", None)
    if reason is not None:
        out["reason"] = reason
    if isinstance(e, errors.Missing):
        out["blobs"] = list(e.blobs)
    return out


def error_line(e: errors.Error) -> str:
    """`Word: op at address: message`, the kind said once (as the word), with its reason."""
    word = word_of(e)
    declared = isinstance(e, errors.DeclaredError) or (
        isinstance(e, errors.Transfer) and e.cause == "remote" and word == e.remote_kind)
    if not declared:
        line = f"{word}: {e}"
    else:
        where = f"{e.op or '(op)'} at {e.address or '(address)'}: " if e.op or e.address else ""
        line = f"{word}: {where}{e.msg}"
        reason = getattr(e, "reason", None)
        if reason is not None:
            line += f" (reason: {reason})"
    if isinstance(e, errors.Missing):
        line += " [missing: " + " ".join(e.blobs) + "]"
    return line


def no_builtin(e: errors.Error, op: str) -> bool:
    """Whether `e` is a peer's answer that it does not know the built-in op `op`."""
    return (isinstance(e, errors.Transfer) and e.cause == "remote"
            and f"unknown op '{op}'" in e.msg)


def builtin_failure(e: errors.Error, op: str, address: str, for_op: str = "") -> Fail:
    """The failure of a built-in op, said plainly. `for_op`: the op the built-in was called
    for (the IDL fetched for a call): a timeout, an unreachable unit or a refused handshake is
    then that op's failure, "while" fetching."""
    if no_builtin(e, op):
        hint = ": pass --idl FILE" if op == "_describe" else ""
        return Fail(EXIT_TRANSFER, f"{address}: this unit does not answer the built-in op {op} "
                    f"(an older ctlrpc or another implementation){hint}")
    if isinstance(e, errors.Transfer) and e.cause == "remote" and "turned off" in e.msg:
        return Fail(EXIT_TRANSFER, f"{address}: describe is turned off on this unit: pass "
                    "--idl FILE")
    if for_op and isinstance(e, errors.Transfer) and e.cause != "remote":
        why = ("fetching the unit's IDL with _describe" if op == "_describe" else
               f"asking the unit's service with {op}")
        e.op = for_op
        return Fail(status_of(e), f"{error_line(e)} (while {why})")
    return Fail(status_of(e), error_line(e))


# ---- the IDL ----------------------------------------------------------------------------------

class _MemLoader(_Loader):
    """ctlrpc-gen's loader, reading the files a unit handed out with `_describe` instead of the
    file system (imports resolve among them by their paths)."""

    ROOT = os.path.join(os.sep, "ctlrpc-describe")

    def __init__(self, diags: Diagnostics, files: Dict[str, str]) -> None:
        super().__init__(diags)
        self.texts = {os.path.normpath(p): t for p, t in files.items()}

    def read(self, display: str, via: Any) -> Optional[str]:
        text = self.texts.get(os.path.normpath(display))
        if text is None:  # the same file name, wherever the paths disagree
            base = os.path.basename(display)
            found = [t for p, t in self.texts.items() if os.path.basename(p) == base]
            text = found[0] if len(found) == 1 else None
        if text is None:
            return super().read(os.path.join(self.ROOT, "missing", display), via)
        return text


def load_idl_file(path: str) -> m.Model:
    try:
        with open(path, "rb"):
            pass
    except OSError as e:
        raise Fail(EXIT_LOCAL, f"--idl {path}: cannot read: {e.strerror}") from None
    diags = Diagnostics()
    program = load_program(path, diags)
    got = check(program, diags) if program is not None else None
    if got is None or diags.error_count:
        sys.stderr.write(diags.render())
        raise Fail(EXIT_LOCAL, f"--idl {path}: the IDL has errors")
    return got


def load_idl_texts(files: Sequence[Dict[str, Any]], address: str) -> m.Model:
    texts = {str(f.get("path", "")): str(f.get("text", "")) for f in files}
    main = str(files[0].get("path", ""))
    diags = Diagnostics()
    loader = _MemLoader(diags, texts)
    program = loader.run(main)
    got = check(program, diags) if program is not None else None
    if got is None or diags.error_count:
        sys.stderr.write(diags.render())
        raise Fail(EXIT_LOCAL, f"{address}: the IDL the unit describes does not check (a newer "
                   "IDL language than this ctlrpc knows?): pass --idl FILE")
    return got


def describe(client: ctlrpc.Client, address: str, timeout: float,
             for_op: str = "") -> Dict[str, Any]:
    try:
        got = client.call(address, "_describe", {}, timeout)
    except errors.Error as e:
        raise builtin_failure(e, "_describe", address, for_op) from None
    if not isinstance(got, dict):
        raise Fail(EXIT_TRANSFER, f"{address}: _describe answered a {type(got).__name__}, "
                   "not a map")
    return got


def fetch_model(a: argparse.Namespace, client: ctlrpc.Client, address: str,
                for_op: str = "") -> m.Model:
    if a.idl:
        return load_idl_file(a.idl)
    d = describe(client, address, a.timeout, for_op)
    files = d.get("idl") or []
    if not files:
        raise Fail(EXIT_LOCAL, f"{address}: the unit reports no IDL (service "
                   f"'{d.get('service', '')}' has a hand-written op table): pass --idl FILE")
    return load_idl_texts(files, address)


def idempotent_ops(model: m.Model) -> Set[str]:
    """The names of the ops the IDL declares `idempotent` (from --idl or from what `_describe`
    handed out): a call of one of them passes idempotent=True, so that the client's retry
    policy may send it again after a timeout or a failure after the request left."""
    return {op.name for op in model.ops if op.idempotent}


# ---- values: command line and JSON -> wire, wire -> JSON ---------------------------------------

class BadValue(Exception):
    pass


# The words a bool argument takes on the command line, in any case (JSON takes true/false).
BOOL_TRUE = ("true", "yes", "on", "1")
BOOL_FALSE = ("false", "no", "off", "0")
BOOL_WORDS = "true/false, yes/no, on/off or 1/0"


def type_name(t: m.Type) -> str:
    return t.idl


def nearest(word: str, names: Sequence[str]) -> str:
    got = difflib.get_close_matches(word, list(names), n=1, cutoff=0.5)
    return f"; did you mean '{got[0]}'?" if got else ""


class Codec:
    """Checks and encodes values by the types of a model, and decodes results to JSON."""

    def __init__(self, model: m.Model) -> None:
        self.model = model

    def encode(self, t: m.Type, v: Any, where: str) -> Any:
        """A JSON value (as json.loads gives it) -> what goes on the wire."""
        if isinstance(t, m.OptionalOf):
            return None if v is None else self.encode(t.inner, v, where)
        if v is None:
            raise BadValue(f"{where}: expected {type_name(t)}, got null")
        if isinstance(t, m.Scalar):
            if t.name == "bool":
                if isinstance(v, bool):
                    return v
            elif t.int_range is not None:
                if isinstance(v, int) and not isinstance(v, bool):
                    lo, hi = t.int_range
                    if not lo <= v <= hi:
                        raise BadValue(f"{where}: {v} is out of range for {t.name} "
                                       f"({lo} to {hi})")
                    return v
            elif t.name == "f64":
                if isinstance(v, (int, float)) and not isinstance(v, bool):
                    return float(v)
            elif t.name == "str":
                if isinstance(v, str):
                    return v
            elif t.name == "bin":
                if isinstance(v, (bytes, bytearray)):
                    return bytes(v)
                if isinstance(v, str):
                    try:
                        return base64.b64decode(v, validate=True)
                    except (binascii.Error, ValueError):
                        raise BadValue(f"{where}: a bin in JSON is base64 text; '{v[:40]}' "
                                       "is not") from None
            raise BadValue(f"{where}: expected {type_name(t)}, got {json_kind(v)}")
        if isinstance(t, m.ListOf):
            if not isinstance(v, list):
                raise BadValue(f"{where}: expected {type_name(t)} (a JSON array), got "
                               f"{json_kind(v)}")
            return [self.encode(t.elem, x, f"{where}[{i}]") for i, x in enumerate(v)]
        if isinstance(t, m.MapOf):
            if not isinstance(v, dict):
                raise BadValue(f"{where}: expected {type_name(t)} (a JSON object), got "
                               f"{json_kind(v)}")
            return {k: self.encode(t.value, x, f"{where}[{k!r}]") for k, x in v.items()}
        rec = self.model.record(t.name)
        if not isinstance(v, dict):
            raise BadValue(f"{where}: expected record {rec.name} (a JSON object), got "
                           f"{json_kind(v)}")
        fields = {f.name: f for f in rec.fields}
        out = {}
        for k, x in v.items():
            f = fields.get(k)
            if f is None:
                raise BadValue(f"{where}: record {rec.name} has no field '{k}'"
                               f"{nearest(k, list(fields))}")
            out[k] = self.encode(f.type, x, f"{where}.{k}")
        for f in rec.fields:
            if f.required and f.name not in out:
                raise BadValue(f"{where}: record {rec.name}: missing required field "
                               f"'{f.name}' ({type_name(f.type)})")
        return out

    def parse_word(self, t: m.Type, text: str, where: str) -> Any:
        """`name=value`'s value -> what goes on the wire."""
        inner = t.inner if isinstance(t, m.OptionalOf) else t
        if isinstance(t, m.OptionalOf) and text == "null":
            return None
        if isinstance(inner, m.Scalar):
            n = inner.name
            if n == "str":
                return text
            if n == "bin":
                return read_bin(text, where)
            if n == "bool":
                low = text.lower()
                if low in BOOL_TRUE:
                    return True
                if low in BOOL_FALSE:
                    return False
                raise BadValue(f"{where}: expected bool ({BOOL_WORDS}), got '{text}'")
            if inner.int_range is not None:
                try:
                    v = int(text, 0)
                except ValueError:
                    raise BadValue(f"{where}: expected {n}, got '{text}'") from None
                return self.encode(inner, v, where)
            try:
                f = float(text)
            except ValueError:
                raise BadValue(f"{where}: expected f64, got '{text}'") from None
            return f
        try:
            v = json.loads(text)
        except ValueError as e:
            raise BadValue(f"{where}: expected {type_name(t)} as JSON: {e}") from None
        return self.encode(t, v, where)

    def decode(self, t: Optional[m.Type], v: Any) -> Any:
        """A wire value -> JSON (bins as base64), by its type where it fits."""
        if isinstance(t, m.RecordRef) and isinstance(v, dict):
            rec = self.model.record(t.name)
            fields = {f.name: f for f in rec.fields}
            return {k: self.decode(fields[k].type if k in fields else None, x)
                    for k, x in v.items()}
        if isinstance(t, m.OptionalOf):
            return None if v is None else self.decode(t.inner, v)
        if isinstance(t, m.ListOf) and isinstance(v, list):
            return [self.decode(t.elem, x) for x in v]
        if isinstance(t, m.MapOf) and isinstance(v, dict):
            return {str(k): self.decode(t.value, x) for k, x in v.items()}
        return plain(v)


def plain(v: Any) -> Any:
    """Any decoded msgpack value as JSON: bins as base64."""
    if isinstance(v, (bytes, bytearray)):
        return base64.b64encode(bytes(v)).decode("ascii")
    if isinstance(v, list):
        return [plain(x) for x in v]
    if isinstance(v, dict):
        return {str(k): plain(x) for k, x in v.items()}
    if isinstance(v, float) and not math.isfinite(v):
        return str(v)
    return v


def json_kind(v: Any) -> str:
    if v is None:
        return "null"
    if isinstance(v, bool):
        return "a bool"
    if isinstance(v, int):
        return "an integer"
    if isinstance(v, float):
        return "a number"
    if isinstance(v, str):
        return "a string"
    if isinstance(v, list):
        return "an array"
    if isinstance(v, dict):
        return "an object"
    return type(v).__name__


_stdin_used = False


def read_bin(text: str, where: str) -> bytes:
    global _stdin_used
    if text == "-":
        if _stdin_used:
            raise BadValue(f"{where}: standard input is already taken by another argument")
        _stdin_used = True
        return sys.stdin.buffer.read()
    if text.startswith("@"):
        path = text[1:]
        try:
            with open(path, "rb") as f:
                return f.read()
        except OSError as e:
            raise Fail(EXIT_LOCAL, f"{where}: cannot read {path}: {e.strerror}") from None
    return text.encode("utf-8")


def build_args(codec: Codec, op: m.Op, words: Sequence[str],
               json_args: Optional[str]) -> Dict[str, Any]:
    """The args map of a call of `op`: from `--json` and `name=value` words, each checked and
    encoded by its IDL type. Raises Fail (usage) naming what is wrong."""
    by_name = {a.name: a for a in op.args}
    names = list(by_name)
    out: Dict[str, Any] = {}

    def unknown(name: str) -> Fail:
        if not names:
            return usage(f"op '{op.name}' takes no arguments (got '{name}')")
        return usage(f"op '{op.name}' has no argument '{name}'{nearest(name, names)} "
                     f"(its arguments: {', '.join(names)})")

    try:
        if json_args is not None:
            try:
                given = json.loads(json_args)
            except ValueError as e:
                raise usage(f"--json: not JSON: {e}") from None
            if not isinstance(given, dict):
                raise usage(f"--json: expected a JSON object of arguments, got "
                            f"{json_kind(given)}")
            for k, v in given.items():
                if k not in by_name:
                    raise unknown(k)
                out[k] = codec.encode(by_name[k].type, v, f"argument '{k}'")
        for w in words:
            name, eq, value = w.partition("=")
            if not eq:
                raise usage(f"'{w}' is not name=value (op '{op.name}' takes: "
                            f"{', '.join(a.idl for a in op.args) or 'no arguments'})")
            if name not in by_name:
                raise unknown(name)
            if name in out:
                raise usage(f"argument '{name}' is given twice")
            out[name] = codec.parse_word(by_name[name].type, value, f"argument '{name}'")
    except BadValue as e:
        raise usage(str(e)) from None
    for a in op.args:
        if a.required and a.name not in out:
            raise usage(f"op '{op.name}': missing required argument '{a.name}' "
                        f"({type_name(a.type)})")
    return out


def find_op(model: m.Model, name: str) -> m.Op:
    for op in model.ops:
        if op.name == name:
            return op
    ops = [o.name for o in model.ops]
    raise usage(f"service {model.service.name} has no op '{name}'{nearest(name, ops)} "
                f"(its ops: {', '.join(ops)})")


# ---- output -----------------------------------------------------------------------------------

def dump(v: Any) -> str:
    return json.dumps(v, ensure_ascii=False)


def out(line: str) -> None:
    sys.stdout.write(line + "\n")


# ---- commands ---------------------------------------------------------------------------------

def unique(addresses: Sequence[str]) -> List[str]:
    """The addresses in the order given, each once: a unit named twice is asked once (and a
    scrape never gets the same series twice)."""
    return list(dict.fromkeys(addresses))


def split_address(a: argparse.Namespace, words: List[str], what: str) -> List[str]:
    """The addresses: --address, or the first word when it is one (it holds '://'). A first
    word that looks like an address without its scheme (127.0.0.1:4100) is named as such: an op
    name never holds ':'."""
    addresses = list(a.address or [])
    if words and "://" in words[0]:
        addresses.append(words.pop(0))
    elif words and not addresses and ":" in words[0] and "=" not in words[0]:
        try:
            net.parse_endpoint(words[0])
        except ValueError as e:
            raise usage(f"{what}: {e}") from None
    if not addresses:
        raise usage(f"{what}: no address given (ADDRESS or --address)")
    return unique(addresses)


def raw_ok(t: Optional[m.Type]) -> bool:
    """Whether --raw can write a result of type `t`: bin, or list<bin> (joined)."""
    if isinstance(t, m.OptionalOf):
        t = t.inner
    if isinstance(t, m.ListOf):
        t = t.elem
    return isinstance(t, m.Scalar) and t.name == "bin"


def check_service(a: argparse.Namespace, client: ctlrpc.Client, model: m.Model,
                  addresses: Sequence[str], op: str) -> float:
    """With --idl, ask each unit's _health which service it serves and warn, on standard error,
    of one that serves another than the IDL's: the call is still made, as asked. Waits at most
    a quarter of the deadline (and 1 s); returns the time left of it. A unit that does not
    answer in that time is not judged."""
    t0 = time.monotonic()
    wait = min(a.timeout / 4, 1.0)
    for o in client.call_many("_health", [(addr, {}) for addr in addresses], wait):
        if o.ok and isinstance(o.result, dict):
            served = str(o.result.get("service", ""))
            if served and served != model.service.name:
                sys.stderr.write(f"{PROG}: warning: --idl {a.idl} declares service "
                                 f"{model.service.name}, but {o.address} serves {served}: "
                                 f"calling {op} anyway\n")
        elif len(addresses) == 1 and o.error is not None and not (
                isinstance(o.error, errors.Transfer) and o.error.cause in ("timeout", "remote")):
            raise builtin_failure(o.error, "_health", o.address, op)
    return max(a.timeout - (time.monotonic() - t0), 0.001)


def cmd_call(a: argparse.Namespace, client: ctlrpc.Client) -> int:
    words = list(a.words)
    addresses = split_address(a, words, "call")
    if not words:
        raise usage("call: no op given")
    # The bytes of several results written back to back could not be told apart.
    if a.raw and len(addresses) > 1:
        raise usage(f"--raw needs one address; this call has {len(addresses)} (drop --raw for "
                    "one JSON row per unit)")
    op_name = words.pop(0)
    model = fetch_model(a, client, addresses[0], op_name)
    op = find_op(model, op_name)
    if a.raw and not raw_ok(op.result):
        raise usage(f"--raw needs a bin or list<bin> result; op '{op.name}' returns "
                    f"{'nothing' if op.result is None else type_name(op.result)} (drop --raw "
                    "for JSON)")
    codec = Codec(model)
    args = build_args(codec, op, words, a.json_args)
    timeout = check_service(a, client, model, addresses, op.name) if a.idl else a.timeout
    kinds = {k: type(k, (errors.DeclaredError,), {"kind": k}) for k in op.raises_declared}
    idempotent = op.name in idempotent_ops(model)
    if op.notify:
        status = 0
        for addr in addresses:
            try:
                client.notify(addr, op.name, args)
                row: Dict[str, Any] = {"address": addr, "sent": True}
            except errors.Error as e:
                status = status or status_of(e)
                row = {"address": addr, "error": error_json(e)}
            if len(addresses) > 1 or "error" in row:
                out(dump(row))
        return status
    if len(addresses) == 1:
        try:
            result = client.call(addresses[0], op.name, args, timeout, kinds=kinds,
                                 idempotent=idempotent)
        except errors.Error as e:
            raise Fail(status_of(e), error_line(e)) from None
        if a.raw and isinstance(result, (bytes, list, type(None))):
            data = result if isinstance(result, bytes) else b"".join(
                x for x in result or [] if isinstance(x, bytes))
            sys.stdout.buffer.write(data)
            sys.stdout.flush()
            return 0
        out(dump(codec.decode(op.result, result)))
        return 0
    status = 0
    for o in client.call_many(op.name, [(addr, args) for addr in addresses], timeout,
                              kinds=kinds, idempotent=idempotent):
        if o.ok:
            out(dump({"address": o.address, "result": codec.decode(op.result, o.result)}))
        else:
            assert o.error is not None
            status = status or status_of(o.error)
            out(dump({"address": o.address, "error": error_json(o.error)}))
    return status


def member_json(x: m.Member) -> Dict[str, Any]:
    return {"name": x.name, "type": type_name(x.type), "required": x.required,
            "default": None if x.default is None or not x.default_written else x.default.idl,
            "doc": x.doc}


def op_json(op: m.Op) -> Dict[str, Any]:
    return {"name": op.name, "notify": op.notify, "idempotent": op.idempotent,
            "signature": op.idl,
            "args": [member_json(x) for x in op.args],
            "result": None if op.result is None else type_name(op.result),
            "raises": list(op.raises), "doc": op.doc}


def record_lines(rec: m.Record, indent: str) -> List[str]:
    """A record as the IDL declares it: on one line when it fits in 100 columns."""
    one = f"{indent}record {rec.name} {{ " + " ".join(f"{f.idl};" for f in rec.fields) + " }"
    if len(one) <= 100:
        return [one]
    return ([f"{indent}record {rec.name} {{"] + [f"{indent}    {f.idl};" for f in rec.fields]
            + [f"{indent}}}"])


def doc_lines(doc: Optional[str], indent: str) -> List[str]:
    return [f"{indent}{line}".rstrip() for line in (doc or "").splitlines()]


def cmd_ops(a: argparse.Namespace, client: ctlrpc.Client) -> int:
    words = list(a.words)
    addresses = list(a.address or []) + words
    if not addresses and not a.idl:
        raise usage("ops: give an ADDRESS (the IDL is fetched with _describe) or --idl FILE")
    model = fetch_model(a, client, addresses[0] if addresses else "")
    if a.json:
        out(dump({"service": model.service.name, "doc": model.service.doc,
                  "ops": [op_json(op) for op in model.ops],
                  "records": [{"name": r.name, "doc": r.doc,
                               "fields": [member_json(f) for f in r.fields]}
                              for r in model.records],
                  "errors": [{"name": k.name, "doc": k.doc} for k in model.errors]}))
        return 0
    # As grpcurl's describe: the service and its doc, then each op, record and declared error
    # kind as the IDL declares it, with its doc and its members' docs.
    out(f"service {model.service.name}" + (f" ({', '.join(model.files)})" if a.idl else ""))
    for line in doc_lines(model.service.doc, "    "):
        out(line)
    for op in model.ops:
        out("")
        out(f"  {op.idl};")
        for line in doc_lines(op.doc, "      "):
            out(line)
        for x in op.args:
            if x.doc:
                out(f"      {x.name}: " + " ".join(x.doc.split()))
    for rec in model.records:
        out("")
        for line in record_lines(rec, "  "):
            out(line)
        for line in doc_lines(rec.doc, "      "):
            out(line)
        for f in rec.fields:
            if f.doc:
                out(f"      {f.name}: " + " ".join(f.doc.split()))
    for kind in model.errors:
        out("")
        out(f"  error {kind.name};")
        for line in doc_lines(kind.doc, "      "):
            out(line)
    return 0


def cmd_describe(a: argparse.Namespace, client: ctlrpc.Client) -> int:
    addresses = list(a.address or []) + list(a.words)
    if len(addresses) != 1:
        raise usage("describe takes exactly one address")
    d = describe(client, addresses[0], a.timeout)
    if a.idl_text:
        files = d.get("idl") or []
        if not files:
            raise Fail(EXIT_LOCAL, f"{addresses[0]}: the unit reports no IDL")
        sys.stdout.write(str(files[0].get("text", "")))
        return 0
    out(dump(plain(d)))
    return 0


def fan_builtin(a: argparse.Namespace, client: ctlrpc.Client, op: str,
                what: str) -> List[Tuple[str, Optional[Dict[str, Any]], Optional[Fail]]]:
    addresses = unique(list(a.address or []) + list(a.words))
    if not addresses:
        raise usage(f"{what}: no address given")
    rows: List[Tuple[str, Optional[Dict[str, Any]], Optional[Fail]]] = []
    for o in client.call_many(op, [(addr, {}) for addr in addresses], a.timeout):
        if o.ok and isinstance(o.result, dict):
            rows.append((o.address, o.result, None))
        elif o.ok:
            rows.append((o.address, None, Fail(EXIT_TRANSFER, f"{op} answered a "
                                               f"{type(o.result).__name__}, not a map")))
        else:
            assert o.error is not None
            rows.append((o.address, None, builtin_failure(o.error, op, o.address)))
    return rows


def first_status(rows: Sequence[Tuple[str, Any, Optional[Fail]]]) -> int:
    for _, _, f in rows:
        if f is not None:
            return f.status
    return 0


def row_msg(addr: str, f: Fail) -> str:
    """A unit's failure on its row, after its address: the message without that address again
    at its start (builtin_failure's messages begin with it, to stand alone)."""
    return f.msg[len(addr) + 2:] if f.msg.startswith(f"{addr}: ") else f.msg


def fail_json(f: Fail) -> Dict[str, Any]:
    return {"status": f.status, "msg": f.msg}


def cmd_health(a: argparse.Namespace, client: ctlrpc.Client) -> int:
    rows = fan_builtin(a, client, "_health", "health")
    if a.json:
        out(dump([dict({"address": addr}, **({"health": plain(h)} if h is not None
                                              else {"error": fail_json(f)}))  # type: ignore
                  for addr, h, f in rows]))
        return first_status(rows)
    out(f"{'UNIT':<28} {'STATUS':<9} {'UPTIME_S':>10} {'IN_FLIGHT':>9}  SERVICE (VERSION)")
    for addr, h, f in rows:
        if h is None:
            assert f is not None
            out(f"{addr:<28} {row_msg(addr, f)}")
            continue
        out(f"{addr:<28} {str(h.get('status')):<9} {float(h.get('uptime_s', 0)):>10.1f} "
            f"{h.get('in_flight', 0):>9}  {h.get('service', '')} ({h.get('version', '')})")
    return first_status(rows)


def errors_text(errs: Any) -> str:
    if not isinstance(errs, dict):
        return "?"
    nonzero = [f"{k}={v}" for k, v in errs.items() if v]
    return ",".join(nonzero) if nonzero else "0"


def cmd_stats(a: argparse.Namespace, client: ctlrpc.Client) -> int:
    if a.json and a.prometheus:
        raise usage("stats: --json or --prometheus, not both")
    rows = fan_builtin(a, client, "_stats", "stats")
    if a.json:
        out(dump([dict({"address": addr}, **({"stats": plain(s)} if s is not None
                                              else {"error": fail_json(f)}))  # type: ignore
                  for addr, s, f in rows]))
        return first_status(rows)
    if a.prometheus:
        sys.stdout.write(prometheus(rows))
        # A unit that did not answer is ctlrpc_unit_up 0; why is said here, as stats says it.
        for addr, _, f in rows:
            if f is not None:
                sys.stderr.write(f"{PROG}: {addr}: {row_msg(addr, f)}\n")
        return first_status(rows)
    for n, (addr, s, f) in enumerate(rows):
        if n:
            out("")
        if s is None:
            assert f is not None
            out(f"{addr}: {row_msg(addr, f)}")
            continue
        t = s.get("totals", {})
        out(f"{addr}  service {s.get('service', '')}  uptime {float(s.get('uptime_s', 0)):.1f} s"
            f"  requests {t.get('requests', 0)}  dropped {t.get('dropped', 0)}"
            f"  unknown_op {t.get('unknown_op', 0)}  expired {t.get('expired', 0)}"
            f"  connections {t.get('connections', 0)}")
        # The ERRORS column is as wide as its widest entry: a service's declared kinds make
        # it as long as they need without pushing the columns after it out of line.
        ops = s.get("ops") or {}
        errs = {name: errors_text(o.get("errors")) for name, o in ops.items()}
        total_errs = errors_text(t.get("errors"))
        ew = max([16, len(total_errs)] + [len(e) for e in errs.values()])
        nw = max([20] + [len(name) for name in ops])
        out(f"  {'OP':<{nw}} {'CALLS':>8} {'ERRORS':<{ew}} {'DROPPED':>7} {'P50_US':>8} "
            f"{'P99_US':>8} {'MAX_US':>9} {'BYTES_IN':>10} {'BYTES_OUT':>10}")
        for name, o in ops.items():
            out(f"  {name:<{nw}} {o.get('calls', 0):>8} {errs[name]:<{ew}} "
                f"{o.get('dropped', 0):>7} {o.get('p50_us', 0):>8} {o.get('p99_us', 0):>8} "
                f"{o.get('max_us', 0):>9} {o.get('bytes_in', 0):>10} {o.get('bytes_out', 0):>10}")
        out(f"  {'(totals)':<{nw}} {t.get('requests', 0):>8} {total_errs:<{ew}} "
            f"{t.get('dropped', 0):>7} {'':>8} {'':>8} {'':>9} {t.get('bytes_in', 0):>10} "
            f"{t.get('bytes_out', 0):>10}")
    return first_status(rows)


# The Prometheus text exposition format (version 0.0.4): per family a HELP and a TYPE line, then
# its samples.
_OP_METRICS = (
    ("calls", "ctlrpc_op_calls_total", "counter", "Requests naming the op."),
    ("dropped", "ctlrpc_op_dropped_total", "counter", "Requests of the op left unanswered."),
    ("bytes_in", "ctlrpc_op_bytes_in_total", "counter", "Request payload bytes of the op."),
    ("bytes_out", "ctlrpc_op_bytes_out_total", "counter", "Reply payload bytes of the op."),
    ("p50_us", "ctlrpc_op_latency_p50_microseconds", "gauge",
     "Median latency (upper edge of its log-scale bucket) since the unit started."),
    ("p99_us", "ctlrpc_op_latency_p99_microseconds", "gauge",
     "99th percentile latency (upper edge of its bucket) since the unit started."),
    ("max_us", "ctlrpc_op_latency_max_microseconds", "gauge",
     "Longest latency seen since the unit started."),
)
_TOTAL_GAUGES = {"connections": "Connections open now."}
_TOTAL_HELP = {
    "requests": "Requests decoded.", "replies": "Replies sent.",
    "dropped": "Payloads dropped without an answer.",
    "send_failures": "Replies that could not be sent.",
    "unknown_op": "Requests for an op the unit does not serve.",
    "undeclared": "Handler errors of a kind the op does not declare.",
    "bytes_in": "Payload bytes received.", "bytes_out": "Payload bytes sent.",
    "auth_denied": "CURVE clients refused by the allowlist.",
    "handshake_failures": "Connections refused during the ZeroMQ handshake.",
    "accept_failures": "Connections the unit could not accept.",
    "conn_refused": "Connections refused over a connection cap.",
    "disconnects": "Connections closed.",
    "expired": "Requests skipped unanswered: past their caller's deadline.",
}


def label_value(v: str) -> str:
    return v.replace("\\", "\\\\").replace("\n", "\\n").replace('"', '\\"')


def labels(**kw: str) -> str:
    return "{" + ",".join(f'{k}="{label_value(v)}"' for k, v in kw.items()) + "}"


def prometheus(rows: Sequence[Tuple[str, Optional[Dict[str, Any]], Optional[Fail]]],
               extra: Optional[Dict[str, Dict[str, str]]] = None) -> str:
    """The rows' _stats in the exposition format; `extra`: labels added to an address's
    samples (the exporter's `unit` and `state`)."""
    fam: Dict[str, Tuple[str, str, List[str]]] = {}

    def sample(name: str, kind: str, help_: str, lab: str, value: Any) -> None:
        if name not in fam:
            fam[name] = (kind, help_, [])
        v = float(value) if isinstance(value, float) else int(value)
        fam[name][2].append(f"{name}{lab} {v}")

    for addr, s, _ in rows:
        more = (extra or {}).get(addr, {})
        sample("ctlrpc_unit_up", "gauge", "Whether the unit answered _stats.",
               labels(address=addr, **more), 1 if s is not None else 0)
        if s is None:
            continue
        svc = str(s.get("service", ""))
        base = {"address": addr, **more, "service": svc}
        sample("ctlrpc_unit_uptime_seconds", "gauge", "Seconds since the unit started serving.",
               labels(**base), float(s.get("uptime_s", 0.0)))
        totals = s.get("totals") or {}
        for k, v in totals.items():
            if k == "errors" and isinstance(v, dict):
                for kind, n in v.items():
                    sample("ctlrpc_unit_errors_total", "counter", "Error replies, by kind.",
                           labels(**base, kind=str(kind)), n)
            elif k in _TOTAL_GAUGES:
                sample(f"ctlrpc_unit_{k}", "gauge", _TOTAL_GAUGES[k], labels(**base), v)
            elif isinstance(v, int):
                sample(f"ctlrpc_unit_{k}_total", "counter", _TOTAL_HELP.get(k, k + "."),
                       labels(**base), v)
        for op, o in (s.get("ops") or {}).items():
            for key, name, kind, help_ in _OP_METRICS:
                sample(name, kind, help_, labels(**base, op=str(op)), o.get(key, 0))
            for ek, n in (o.get("errors") or {}).items():
                sample("ctlrpc_op_errors_total", "counter", "Error replies of the op, by kind.",
                       labels(**base, op=str(op), kind=str(ek)), n)
    text = []
    for name, (kind, help_, samples) in fam.items():
        text.append(f"# HELP {name} {help_}")
        text.append(f"# TYPE {name} {kind}")
        text.extend(samples)
    return "\n".join(text) + "\n"


def cmd_keygen(a: argparse.Namespace) -> int:
    if len(a.words) != 1:
        raise usage("usage: ctlrpc keygen PREFIX")
    prefix = a.words[0]
    try:
        curve.keygen(prefix)
    except (OSError, ValueError) as e:
        raise Fail(EXIT_LOCAL, str(e)) from None
    out(f"wrote {prefix}.key (secret) and {prefix}.pub")
    return 0


# ---- the command line -------------------------------------------------------------------------

def key_file(path: Optional[str], secret: bool) -> Optional[str]:
    """The key in a --curve-server-key or --curve-key file, read as ctl-storage reads them:
    files only (a secret given as text would skip the file's checks and sit in
    /proc/PID/cmdline for every local user to read)."""
    if path is None:
        return None
    try:
        return curve.read_key(path, secret)
    except ValueError as e:
        # The shared words (OPERATIONS.md, "Key files"); a key's text, which they do not echo,
        # after the flag it was given to.
        msg = str(e)
        if msg.startswith("a key's text"):
            msg = f"{'--curve-key' if secret else '--curve-server-key'}: {msg}"
        raise usage(msg) from None


def parse_retries(text: str) -> int:
    """--retries N: a whole number >= 0 (the attempts after the first)."""
    try:
        n = int(text.strip())
    except ValueError:
        n = -1
    if n < 0:
        raise argparse.ArgumentTypeError(f"'{text}' is not a number of retries (0, 1, 2, ...)")
    return n


def parse_timeout(text: str) -> float:
    """"2.5" (seconds), "500ms", "3s" -> seconds."""
    mt = re.fullmatch(r"([0-9]*\.?[0-9]+)(ms|s)?", text.strip())
    if not mt:
        raise argparse.ArgumentTypeError(f"'{text}' is not a duration (2.5, 500ms, 3s)")
    v = float(mt.group(1))
    return v / 1000.0 if mt.group(2) == "ms" else v


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> Any:
        raise Fail(EXIT_USAGE, f"{message}\n(run ctlrpc --help for usage)")


def arguments() -> _Parser:
    def timeout_option(parser: argparse.ArgumentParser, what: str) -> None:
        parser.add_argument("--timeout", "-t", type=parse_timeout, default=DEFAULT_TIMEOUT_S,
                            metavar="T", help=f"deadline of {what}: 2.5, 500ms, 3s (default 5s)")

    def calling_options(parser: argparse.ArgumentParser) -> None:
        parser.add_argument("--retries", type=parse_retries, default=0, metavar="N",
                            help="retry a failed call up to N times within its deadline, with "
                            "backoff: a refused connection for any op; a timeout or a "
                            "connection lost mid-call only for an op the IDL declares "
                            "idempotent (default 0)")
        parser.add_argument("--retry-busy", action="store_true",
                            help="with --retries, retry Busy too (not Busy \"draining\")")
        parser.add_argument("--curve-server-key", metavar="FILE",
                            help="talk CURVE to units with this public key")
        parser.add_argument("--curve-key", "--curve-secret", dest="curve_key", metavar="FILE",
                            help="this client's secret key, for units with an allowlist")

    # The options of every command that calls the units it is given ...
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument("--address", "-a", action="append", metavar="ADDR",
                        help="a unit's tcp://host:port; repeat for several (fan-out)")
    common.add_argument("--idl", metavar="FILE",
                        help="the service's IDL (default: fetched from the unit with _describe)")
    timeout_option(common, "each call or fan-out")
    calling_options(common)
    fleet.add_arguments(common)
    # ... of one that calls every unit of a service (exporter) ...
    calling = argparse.ArgumentParser(add_help=False)
    timeout_option(calling, "each scrape's fan-out")
    calling_options(calling)
    fleet.add_arguments(calling)
    # ... and of one that only reads the fleet's etcd (units).
    base = argparse.ArgumentParser(add_help=False)
    timeout_option(base, "the listing (etcd unanswered is retried for about 1s within it)")
    fleet.add_arguments(base)
    p = _Parser(prog=PROG, description="Call any ctlrpc unit, C or Python, by its IDL.",
                epilog=_EPILOG, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--version", action="version", version=f"{PROG} {ctlrpc.__version__}")
    sub = p.add_subparsers(dest="command", metavar="COMMAND", parser_class=_Parser)
    c = sub.add_parser("call", parents=[common], help="call an op: ADDRESS OP [name=value ...]")
    c.add_argument("words", nargs="*", metavar="ADDRESS OP name=value")
    c.add_argument("--json", dest="json_args", metavar="'{...}'",
                   help="arguments as one JSON object (bins as base64)")
    c.add_argument("--raw", action="store_true",
                   help="write a bin result (or a list of bins, joined) as raw bytes; one "
                        "address only")
    o = sub.add_parser("ops", parents=[common], help="list the ops: ADDRESS or --idl FILE")
    o.add_argument("words", nargs="*", metavar="ADDRESS")
    o.add_argument("--json", action="store_true", help="print JSON")
    d = sub.add_parser("describe", parents=[common], help="what the unit answers to _describe")
    d.add_argument("words", nargs="*", metavar="ADDRESS")
    d.add_argument("--idl-text", action="store_true", help="print the main IDL file's text")
    h = sub.add_parser("health", parents=[common], help="_health of each unit")
    h.add_argument("words", nargs="*", metavar="ADDRESS")
    h.add_argument("--json", action="store_true", help="print JSON")
    s = sub.add_parser("stats", parents=[common], help="_stats of each unit: a table per op")
    s.add_argument("words", nargs="*", metavar="ADDRESS")
    s.add_argument("--json", action="store_true", help="print JSON")
    s.add_argument("--prometheus", action="store_true",
                   help="print the Prometheus text exposition format")
    k = sub.add_parser("keygen", help="write a CURVE key pair: PREFIX.key, PREFIX.pub")
    k.add_argument("words", nargs="*", metavar="PREFIX")
    fleet.add_commands(sub, calling, base)
    return p


COMMANDS = {"call": cmd_call, "ops": cmd_ops, "describe": cmd_describe, "health": cmd_health,
            "stats": cmd_stats, **fleet.COMMANDS}


def run(argv: Optional[Sequence[str]]) -> int:
    p = arguments()
    a, extra = p.parse_known_args(argv)
    # name=value words may follow options (argparse takes one run of positionals).
    for word in extra:
        if word.startswith("-") and word != "-" or not hasattr(a, "words"):
            raise usage(f"unrecognized argument '{word}'\n(run ctlrpc --help for usage)")
        a.words.append(word)
    if not a.command:
        raise usage("no command given")
    if a.command == "keygen":
        return cmd_keygen(a)
    fleet.resolve(a)
    if a.curve_key and not a.curve_server_key:
        raise usage("--curve-key needs --curve-server-key")
    # Each call retries on its own within its deadline (a fan-out: each unit); a timeout is
    # retried only for a call made with idempotent=True.
    retry = ctlrpc.RetryPolicy(max_attempts=a.retries + 1, retry_busy=a.retry_busy)
    try:
        client = ctlrpc.Client(a.timeout,
                               curve_server_key=key_file(a.curve_server_key, False),
                               curve_secret=key_file(a.curve_key, True), retry=retry)
    except (ValueError, OSError) as e:
        raise usage(str(e)) from None
    try:
        return COMMANDS[a.command](a, client)
    except ValueError as e:  # a malformed address, found by the runtime
        raise usage(str(e)) from None
    finally:
        client.close()


def main(argv: Optional[Sequence[str]] = None) -> int:
    try:
        return run(argv)
    except Fail as e:
        sys.stderr.write(f"{PROG}: {e.msg}\n")
        return e.status
    except KeyboardInterrupt:
        return 130
    except BrokenPipeError:
        return EXIT_LOCAL


if __name__ == "__main__":
    sys.exit(main())
