"""The messages of the wire, as bytes: requests and replies, both directions, bounded decoding.

Requests are `[op: str, id: str, args: map]`, replies `[id: str, ok: bool, result-or-error]`
(docs/PROTOCOL.md, "Messages"). This module is the Python twin of the C runtime's envelope and
codec: it packs requests, replies and error maps, and decodes what a peer sent without letting
a hostile header make it allocate.

Decoding reads an envelope's head by hand (which tells a payload that cannot be answered from
one that must get a Protocol error), then walks the body with `wire_check`, an iterative scan
that allocates nothing and refuses nesting deeper than `Limits.max_depth`, more objects than
`Limits.max_items`, and any container whose element count exceeds the bytes left (each element
takes at least one byte). Only then does msgpack unpack the body, with its own length limits
set from the message's size. So a 5-byte header that claims a 4 GiB array is refused at once.

Strings are decoded as UTF-8 with `surrogateescape`, and packed the same way, so a string that
is not valid UTF-8 survives a round trip byte for byte (as it does through the C runtime, which
keeps strings as bytes).

Everything here is pure: no sockets, no state; every function is reentrant. The outcomes are
closed sets, which the fuzz test holds them to: `decode_request` returns a `Request` or raises
`DropRequest`; `decode_reply` returns a `Reply` or raises `BadReply`; `error_from_body` always
returns an `errors.Error`.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass
from typing import Any, Dict, List, Mapping, Optional, Tuple, Type

import msgpack  # type: ignore[import]

from . import errors

DEFAULT_MAX_MSG_BYTES = 256 << 20
DEFAULT_MAX_DEPTH = 32  # the C runtime's (msgpack-c's own stack depth); the envelope is level 1
DEFAULT_MAX_ITEMS = 1 << 20

# The bytes msgpack never uses.
_BAD_BYTE = 0xC1


@dataclass(frozen=True)
class Limits:
    """Decoding bounds, with the C runtime's defaults (ctl_limits in ctlrpc/codec.h).

    `max_msg_bytes` is enforced by ZeroMQ (ZMQ_MAXMSGSIZE) before anything is read; the other two
    by `wire_check` before msgpack unpacks anything.
    """

    max_msg_bytes: int = DEFAULT_MAX_MSG_BYTES
    max_depth: int = DEFAULT_MAX_DEPTH
    max_items: int = DEFAULT_MAX_ITEMS


DEFAULT_LIMITS = Limits()


# ---- outcomes ---------------------------------------------------------------------------------

class WireError(Exception):
    """A payload this module refuses; `why` says what is wrong, in words for a message."""

    def __init__(self, why: str) -> None:
        super().__init__(why)
        self.why = why


class DropRequest(WireError):
    """A request payload with no usable op and id: nothing can be answered; drop and count it."""


class BadReply(WireError):
    """A reply payload that is not `[str, bool, any]` within the limits."""


@dataclass
class Request:
    """A decoded request. `op` and `id` are always usable; when `bad` is set (args not a map,
    truncated, too deep, trailing bytes...) it says what is wrong and `args` is None. Args with
    a key that is not a str are a map all the same (the C runtime's envelope takes them too):
    `odd_key` is then the first such key, for the layer that knows the op's args to judge."""

    op: str
    id: str
    args: Optional[Dict[str, Any]]
    bad: Optional[str] = None
    odd_key: Any = None
    has_odd_key: bool = False


@dataclass
class Reply:
    """A decoded reply: `body` is the result when `ok`, else what should be an error map."""

    id: str
    ok: bool
    body: Any


# ---- the bounded scan -------------------------------------------------------------------------

# Heads of fixed size beyond the first byte: byte -> bytes of inline body.
_FIXED = {0xCA: 4, 0xCB: 8, 0xCC: 1, 0xCD: 2, 0xCE: 4, 0xCF: 8, 0xD0: 1, 0xD1: 2, 0xD2: 4,
          0xD3: 8, 0xD4: 2, 0xD5: 3, 0xD6: 5, 0xD7: 9, 0xD8: 17}
# Length-prefixed heads: byte -> (bytes of the length field, form).
_BYTES, _EXT, _ARRAY, _MAP = range(4)
_PREFIXED = {0xC4: (1, _BYTES), 0xC5: (2, _BYTES), 0xC6: (4, _BYTES),
             0xC7: (1, _EXT), 0xC8: (2, _EXT), 0xC9: (4, _EXT),
             0xD9: (1, _BYTES), 0xDA: (2, _BYTES), 0xDB: (4, _BYTES),
             0xDC: (2, _ARRAY), 0xDD: (4, _ARRAY), 0xDE: (2, _MAP), 0xDF: (4, _MAP)}

WIRE_OK = "ok"
WIRE_TRUNCATED = "truncated"
WIRE_BAD_BYTE = "invalid byte 0xc1"
WIRE_TOO_DEEP = "nested too deeply"
WIRE_TOO_MANY = "too many objects"
WIRE_BAD_COUNT = "container count exceeds the message size"


def wire_check(data: bytes, pos: int = 0, limits: Limits = DEFAULT_LIMITS, depth0: int = 0,
               items: int = 0) -> Tuple[str, int, int]:
    """Scan exactly one msgpack object starting at `data[pos]` without building anything.

    Returns (status, end, items): status is WIRE_OK or one of the WIRE_* words above (they are
    the C runtime's ctl_wire_status names); `end` is where the object ends (meaningful with
    WIRE_OK); `items` is the running object count, starting from `items`, so one message's
    parts share one budget. `depth0` is the level the object sits at (0 at top level).
    """
    n = len(data)
    open_: List[int] = []  # children left per open container
    count = items
    while True:
        if pos >= n:
            return WIRE_TRUNCATED, pos, count
        count += 1
        if count > limits.max_items:
            return WIRE_TOO_MANY, pos, count
        b = data[pos]
        left = n - pos
        head = 1
        body = 0
        children = 0
        container = False
        if b <= 0x7F or b >= 0xE0 or b in (0xC0, 0xC2, 0xC3):
            pass
        elif b <= 0x8F:
            children = 2 * (b & 0x0F)
            container = True
        elif b <= 0x9F:
            children = b & 0x0F
            container = True
        elif b <= 0xBF:
            body = b & 0x1F
        elif b == _BAD_BYTE:
            return WIRE_BAD_BYTE, pos, count
        elif b in _FIXED:
            body = _FIXED[b]
        else:
            lenbytes, form = _PREFIXED[b]
            if left < 1 + lenbytes:
                return WIRE_TRUNCATED, pos, count
            length = int.from_bytes(data[pos + 1:pos + 1 + lenbytes], "big")
            head += lenbytes
            if form == _BYTES:
                body = length
            elif form == _EXT:
                body = length + 1  # the type byte
            elif form == _ARRAY:
                children = length
                container = True
            else:
                children = 2 * length
                container = True
        if left < head or body > left - head:
            return WIRE_TRUNCATED, pos, count
        pos += head + body
        if container and depth0 + len(open_) + 1 > limits.max_depth:
            return WIRE_TOO_DEEP, pos, count  # even an empty one opens a level
        if children > 0:
            if children > n - pos:  # each child takes at least one byte
                return WIRE_BAD_COUNT, pos, count
            open_.append(children)
            continue
        # One object complete: close every container it completes.
        while open_:
            open_[-1] -= 1
            if open_[-1]:
                break
            open_.pop()
        if not open_:
            return WIRE_OK, pos, count


# ---- packing ----------------------------------------------------------------------------------

def _packer() -> Any:
    return msgpack.Packer(use_bin_type=True, unicode_errors="surrogateescape")


_packers = threading.local()  # one Packer a thread (a Packer is not thread-safe)


def pack(obj: Any) -> bytes:
    """Pack one value: str as msgpack str, bytes as bin. TypeError/ValueError/OverflowError when
    msgpack cannot pack it."""
    try:
        packer = _packers.packer
    except AttributeError:
        packer = _packers.packer = _packer()
    try:
        out: bytes = packer.pack(obj)
    except BaseException:
        _packers.packer = _packer()  # a failed pack may leave bytes in its buffer
        raise
    return out


def _int_size(v: int) -> int:
    if -32 <= v <= 127:
        return 1
    if v >= 0:
        return 2 if v < 1 << 8 else 3 if v < 1 << 16 else 5 if v < 1 << 32 else 9
    return 2 if v >= -(1 << 7) else 3 if v >= -(1 << 15) else 5 if v >= -(1 << 31) else 9


def _head_size(n: int, fix: int) -> int:
    """The header of a str, bin, array or map of n items (fix: the largest fix-size count)."""
    return 1 if n <= fix else 3 if n < 1 << 16 else 5


def packed_size(obj: Any, limit: int) -> Optional[int]:
    """How many bytes `pack(obj)` makes, counted without packing, or a number over `limit` as
    soon as that is certain (so a result of many large blobs costs no copy and no full walk).
    None for a value whose size it cannot tell (a type msgpack packs by a hook): pack and
    measure then."""
    total = 0
    stack = [obj]
    while stack:
        v = stack.pop()
        t = type(v)
        if v is None or t is bool:
            total += 1
        elif t is int:
            total += _int_size(v)
        elif t is float:
            total += 9
        elif t is str:
            n = len(v) if v.isascii() else len(v.encode("utf-8", "surrogateescape"))
            total += _head_size(n, 31) + n if n > 255 or n <= 31 else 2 + n
        elif t is bytes or t is bytearray or t is memoryview:
            n = v.nbytes if t is memoryview else len(v)
            total += (2 if n < 1 << 8 else 3 if n < 1 << 16 else 5) + n
        elif t is list or t is tuple:
            total += _head_size(len(v), 15)
            stack.extend(v)
        elif t is dict:
            total += _head_size(len(v), 15)
            for k, item in v.items():
                stack.append(k)
                stack.append(item)
        else:
            return None
        if total > limit:
            return total
    return total


def pack_request(op: str, rid: str, args: Optional[Mapping[str, Any]]) -> bytes:
    """`[op, rid, args]` (an empty map for None)."""
    return pack([op, rid, {} if args is None else dict(args)])


def pack_reply(rid: str, result: Any) -> bytes:
    """`[rid, true, result]`."""
    return pack([rid, True, result])


def error_map(kind: str, msg: str, reason: Optional[str] = None,
              blobs: Optional[List[str]] = None) -> Dict[str, Any]:
    """The four-key error map: `reason` goes with Busy and declared kinds only, `blobs` with
    Missing only (else nil), as the C runtime sends them."""
    return {"kind": kind, "msg": msg,
            "reason": reason if kind not in ("UnitFull", "Missing", "Protocol") else None,
            "blobs": list(blobs or ()) if kind == "Missing" else None}


def pack_error_reply(rid: str, kind: str, msg: str, reason: Optional[str] = None,
                     blobs: Optional[List[str]] = None) -> bytes:
    """`[rid, false, {kind, msg, reason, blobs}]`."""
    return pack([rid, False, error_map(kind, msg, reason, blobs)])


# ---- deadlines in ids -------------------------------------------------------------------------

# The longest request id a unit takes, in bytes (docs/PROTOCOL.md): every reply echoes the id,
# so a longer one would let a peer make each small error or Busy reply as large as its request.
# A request with a longer id is dropped and counted.
ID_MAX = 256

# The longest deadline a unit reads from an id (docs/PROTOCOL.md, "Deadlines").
ID_DEADLINE_MAX_DIGITS = 16


def format_id(unique: int, deadline_ms: int) -> str:
    """A request id as the runtimes make them: the low 48 bits of `unique` as 12 lowercase hex
    digits, '@', and the call's deadline in milliseconds since the Unix epoch (wall clock) as
    13 decimal digits, zero-padded and clamped to what they hold (the C runtime's
    ctl_call_format_id)."""
    return "%012x@%013d" % (unique & 0xFFFFFFFFFFFF, min(max(deadline_ms, 0), 9999999999999))


def id_deadline(rid: str) -> Optional[int]:
    """The deadline (ms since the Unix epoch) that request id `rid` carries: when its last '@'
    is followed by 1 to 16 ASCII decimal digits and nothing else; otherwise (the reference
    design's 12 hex digits, "", anything else) None (the C runtime's ctl_env_id_deadline)."""
    _, at, digits = rid.rpartition("@")
    if not at or not 0 < len(digits) <= ID_DEADLINE_MAX_DIGITS or not digits.isascii() \
            or not digits.isdigit():
        return None
    return int(digits)


# ---- decoding ---------------------------------------------------------------------------------

def _read_array_of(data: bytes, pos: int, want: int) -> int:
    """The position after an array head of exactly `want` elements, or -1."""
    if pos >= len(data):
        return -1
    b = data[pos]
    if 0x90 <= b <= 0x9F:
        n, head = b & 0x0F, 1
    elif b == 0xDC and len(data) - pos >= 3:
        n, head = int.from_bytes(data[pos + 1:pos + 3], "big"), 3
    elif b == 0xDD and len(data) - pos >= 5:
        n, head = int.from_bytes(data[pos + 1:pos + 5], "big"), 5
    else:
        return -1
    return pos + head if n == want else -1


def _read_str(data: bytes, pos: int) -> Tuple[Optional[str], int]:
    """A str at `pos` and the position after it, or (None, pos)."""
    if pos >= len(data):
        return None, pos
    b = data[pos]
    left = len(data) - pos
    if 0xA0 <= b <= 0xBF:
        n, head = b & 0x1F, 1
    elif b == 0xD9 and left >= 2:
        n, head = data[pos + 1], 2
    elif b == 0xDA and left >= 3:
        n, head = int.from_bytes(data[pos + 1:pos + 3], "big"), 3
    elif b == 0xDB and left >= 5:
        n, head = int.from_bytes(data[pos + 1:pos + 5], "big"), 5
    else:
        return None, pos
    if n > left - head:
        return None, pos
    start = pos + head
    return bytes(data[start:start + n]).decode("utf-8", "surrogateescape"), start + n


def _unpack_one(data: memoryview) -> Any:
    """Unpack `data`, which wire_check has passed as exactly one object. Raises ValueError.

    An ext of type -1 (msgpack's timestamp) whose length is not a timestamp's (4, 8 or 12
    bytes) is an ExtType(-1, data) here, as any other ext: the C runtime reads every ext as an
    opaque ext, so a malformed timestamp is judged where its value is used (a typed op: "expected
    bin, got ext"), not refused with the whole request."""
    n = len(data)
    try:
        return msgpack.unpackb(data, raw=False, strict_map_key=False,
                               unicode_errors="surrogateescape",
                               max_str_len=n, max_bin_len=n, max_array_len=n,
                               max_map_len=n, max_ext_len=n)
    except Exception as e:  # the decoder's exceptions vary (ValueError, TypeError, ...)
        failure = e
    exts = _exts(bytes(data))
    bad = [at for at, code, size in exts if code == -1 and size not in (4, 8, 12)]
    if bad:
        # Retype the malformed timestamps to a code the message does not use, and back.
        used = {code for _, code, _ in exts}
        stand_in = next(c for c in range(128) if c not in used)
        fixed = bytearray(data)
        for at in bad:
            fixed[at] = stand_in

        def ext_hook(code: int, body: bytes) -> Any:
            if code == stand_in:  # ExtType itself refuses a negative code
                return tuple.__new__(msgpack.ExtType, (-1, body))
            return msgpack.ExtType(code, body)
        try:
            return msgpack.unpackb(bytes(fixed), raw=False, strict_map_key=False,
                                   unicode_errors="surrogateescape", ext_hook=ext_hook,
                                   max_str_len=n, max_bin_len=n, max_array_len=n,
                                   max_map_len=n, max_ext_len=n)
        except Exception as e:
            failure = e
    raise ValueError(f"cannot be decoded ({type(failure).__name__})") from None


# Sizes for _exts: the bytes after the head byte of a fixed-size value, and the length bytes of
# str, bin and ext; a container's head (its children follow it inline) takes only its count.
_AFTER_HEAD = {0xC0: 0, 0xC2: 0, 0xC3: 0, 0xCA: 4, 0xCB: 8, 0xCC: 1, 0xCD: 2, 0xCE: 4, 0xCF: 8,
               0xD0: 1, 0xD1: 2, 0xD2: 4, 0xD3: 8, 0xDC: 2, 0xDD: 4, 0xDE: 2, 0xDF: 4}
_LENGTH_BYTES = {0xC4: 1, 0xC5: 2, 0xC6: 4, 0xD9: 1, 0xDA: 2, 0xDB: 4}
_EXT_LENGTH_BYTES = {0xC7: 1, 0xC8: 2, 0xC9: 4}
_FIXEXT_SIZE = {0xD4: 1, 0xD5: 2, 0xD6: 4, 0xD7: 8, 0xD8: 16}


def _exts(data: bytes) -> List[Tuple[int, int, int]]:
    """(where its type byte is, its type, its size) for every ext in `data`, well-formed msgpack
    (a prefix code: a walk over the heads in order meets every value)."""
    out = []
    pos, n = 0, len(data)
    while pos < n:
        b = data[pos]
        if b <= 0x9F or b >= 0xE0:  # fixint, fixmap, fixarray, negative fixint
            pos += 1
        elif b <= 0xBF:
            pos += 1 + (b & 0x1F)
        elif b in _AFTER_HEAD:
            pos += 1 + _AFTER_HEAD[b]
        elif b in _LENGTH_BYTES:
            k = _LENGTH_BYTES[b]
            pos += 1 + k + int.from_bytes(data[pos + 1:pos + 1 + k], "big")
        elif b in _FIXEXT_SIZE or b in _EXT_LENGTH_BYTES:
            if b in _FIXEXT_SIZE:
                k, size = 0, _FIXEXT_SIZE[b]
            else:
                k = _EXT_LENGTH_BYTES[b]
                size = int.from_bytes(data[pos + 1:pos + 1 + k], "big")
            at = pos + 1 + k
            if at >= n:
                break
            out.append((at, data[at] - 256 if data[at] >= 128 else data[at], size))
            pos = at + 1 + size
        else:  # 0xc1: never used
            break
    return out


# The fast path of _read_body: bodies up to this long whose bytes cannot open more levels than
# allowed are unpacked without the scan (see there).
_FAST_BODY_MAX = 4096
_CONTAINER_HEADS = bytes(range(0x80, 0xA0)) + bytes((0xDC, 0xDD, 0xDE, 0xDF))
_NOT_CONTAINER_HEADS = bytes(b for b in range(256) if b not in _CONTAINER_HEADS)


def _fast_envelope(data: bytes, limits: Limits) -> Optional[List[Any]]:
    """The whole message unpacked at once, when it is small enough and cannot open more levels
    than allowed (the same bound as _read_body's fast path, the envelope's own head counted):
    a list of 3, or None when that is not what came (then the step-by-step path decides, and
    says why)."""
    n = len(data)
    if n > _FAST_BODY_MAX or n > limits.max_items or \
            len(data.translate(None, _NOT_CONTAINER_HEADS)) > limits.max_depth:
        return None
    try:
        env = _unpack_one(memoryview(data))
    except ValueError:
        return None
    if type(env) is not list or len(env) != 3:
        return None
    return env


def _read_body(data: bytes, pos: int, limits: Limits, what: str) -> Any:
    """Scan and unpack the envelope's last element, which must end the payload. Raises
    ValueError saying what is wrong."""
    # Fast path for small bodies: a body of n bytes holds at most n objects, and opens at most
    # as many levels as it has bytes that could head a container (0x80-0x9f, 0xdc-0xdf,
    # counted wherever they are: an over-count only sends it down the slow path). Within both
    # limits, what the scan would refuse msgpack refuses too (truncated, 0xc1, a count past
    # the end, trailing bytes), so msgpack alone decides; when it refuses, the scan below
    # says why, in its words.
    n = len(data) - pos
    if n <= _FAST_BODY_MAX and 3 + n <= limits.max_items:
        body = data[pos:]
        if 1 + len(body.translate(None, _NOT_CONTAINER_HEADS)) <= limits.max_depth:
            try:
                return _unpack_one(memoryview(body))
            except ValueError:
                pass
    status, end, _ = wire_check(data, pos, limits, 1, 3)  # the envelope and its head: 3
    if status != WIRE_OK:
        raise ValueError(f"{what}: {status}")
    if end != len(data):
        raise ValueError(f"{len(data) - end} trailing bytes after the message")
    try:
        return _unpack_one(memoryview(data)[pos:end])
    except ValueError as e:
        raise ValueError(f"{what}: {e}") from None


def show(text: str, limit: int = 64) -> str:
    """`text` safe to put in a message, as the C runtime shows a name (ctl_show): its bytes
    (UTF-8; undecodable bytes as they came), printable ASCII but the backslash as it is, every
    other byte as \\xNN, cut after `limit` bytes with "..."."""
    raw = text.encode("utf-8", "surrogateescape")
    shown = "".join(chr(c) if 0x20 <= c < 0x7F and c != 0x5C else f"\\x{c:02x}"
                    for c in raw[:limit])
    return shown + ("..." if len(raw) > limit else "")


def _args_repeated(data: bytes, args: Dict[Any, Any]) -> Optional[str]:
    """When the args map of request `data` (decoded as `args`) holds a key more than once, what
    to say of it ("arg key: given twice", as the C unit says); else None. A decoded dict keeps
    the last of a repeated key: its size against the map's declared one tells."""
    pos = _read_array_of(data, 0, 3)
    if pos < 0:
        return None
    _, pos = _read_str(data, pos)  # the op
    _, pos = _read_str(data, pos)  # the id
    if pos >= len(data):
        return None
    b = data[pos]
    if 0x80 <= b <= 0x8F:
        n = b & 0x0F
    elif b in (0xDE, 0xDF):
        w = 2 if b == 0xDE else 4
        n = int.from_bytes(data[pos + 1:pos + 1 + w], "big")
    else:
        return None
    if n == len(args):
        return None
    seen = set()
    try:
        pairs = msgpack.Unpacker(raw=False, object_pairs_hook=list, strict_map_key=False,
                                 max_buffer_size=len(data))
        pairs.feed(data[pos:])
        for k, _ in next(pairs):
            if k in seen:
                return f"arg {show(k) if isinstance(k, str) else repr(k)}: given twice"
            seen.add(k)
    except Exception:  # (it was decoded once already: this does not happen)
        pass
    return "args: a key given twice"


def decode_request(data: bytes, limits: Limits = DEFAULT_LIMITS) -> Request:
    """Decode a request payload.

    Raises DropRequest when it is not a msgpack array of 3 with a str op and a str id (no
    answer is possible). Otherwise returns a Request; its `bad` is set when the args are not a
    map with str keys, are truncated, too deep, or followed by trailing bytes.
    """
    if type(data) is not bytes:
        data = bytes(data)
    env = _fast_envelope(data, limits)
    if env is not None and type(env[0]) is str and type(env[1]) is str and \
            type(env[2]) is dict and len(env[1]) <= ID_MAX // 4 and \
            all(type(k) is str for k in env[2]):
        twice = _args_repeated(data, env[2])
        if twice is not None:
            return Request(env[0], env[1], None, twice)
        return Request(env[0], env[1], env[2])
    pos = _read_array_of(data, 0, 3)
    if pos < 0:
        raise DropRequest("not a msgpack array of 3")
    op, pos = _read_str(data, pos)
    if op is None:
        raise DropRequest("the op is not a string")
    rid, pos = _read_str(data, pos)
    if rid is None:
        raise DropRequest("the request id is not a string")
    size = len(rid.encode("utf-8", "surrogateescape"))
    if size > ID_MAX:
        raise DropRequest(f"the request id is {size} bytes, more than {ID_MAX}")
    try:
        args = _read_body(data, pos, limits, "args")
    except ValueError as e:
        return Request(op, rid, None, str(e))
    if not isinstance(args, dict):
        return Request(op, rid, None, f"args must be a map, not {type_name(args)}")
    for key in args:
        if type(key) is not str:
            return Request(op, rid, args, odd_key=key, has_odd_key=True)
    twice = _args_repeated(data, args)
    if twice is not None:
        return Request(op, rid, None, twice)
    return Request(op, rid, args)


def decode_reply(data: bytes, limits: Limits = DEFAULT_LIMITS) -> Reply:
    """Decode a reply payload; BadReply when it is not `[str, bool, any]` within the limits."""
    if type(data) is not bytes:
        data = bytes(data)
    env = _fast_envelope(data, limits)
    if env is not None and type(env[0]) is str and type(env[1]) is bool:
        return Reply(env[0], env[1], env[2])
    pos = _read_array_of(data, 0, 3)
    if pos < 0:
        raise BadReply("not a msgpack array of 3")
    rid, pos = _read_str(data, pos)
    if rid is None:
        raise BadReply("the request id is not a string")
    if pos >= len(data) or data[pos] not in (0xC2, 0xC3):
        raise BadReply("the ok flag is not a bool")
    ok = data[pos] == 0xC3
    try:
        body = _read_body(data, pos + 1, limits, "result" if ok else "error")
    except ValueError as e:
        raise BadReply(str(e)) from None
    return Reply(rid, ok, body)


def type_name(value: Any) -> str:
    """The msgpack family of a decoded value, as a word for messages."""
    if value is None:
        return "nil"
    if isinstance(value, bool):
        return "bool"
    if isinstance(value, int):
        return "int"
    if isinstance(value, float):
        return "float"
    if isinstance(value, str):
        return "str"
    if isinstance(value, bytes):
        return "bin"
    if isinstance(value, msgpack.ExtType):  # (a namedtuple: before the tuples)
        return "ext"
    if isinstance(value, (list, tuple)):
        return "array"
    if isinstance(value, dict):
        return "map"
    return "ext"


# ---- errors from replies ----------------------------------------------------------------------

def error_from_body(body: Any, address: str, op: str,
                    kinds: Mapping[str, Type[errors.DeclaredError]]) -> errors.Error:
    """The error an error reply's body describes.

    The body is the documented map `{kind, msg, reason, blobs}`, or the two-element array
    `[kind, msg]` of the reference design's earlier releases. UnitFull, Busy (reason) and
    Missing (blobs) keep their kind; a kind in `kinds` (the declared kinds the op lists) becomes
    that class; Protocol and any other kind become Transfer(cause="remote", remote_kind=kind).
    A body that is neither form becomes Transfer(cause="bad-reply") saying what is wrong.
    """
    def bad(why: str) -> errors.Error:
        return errors.Transfer(why, cause="bad-reply", address=address, op=op)

    reason: Optional[str] = None
    blobs: List[str] = []
    if isinstance(body, list) and len(body) == 2:
        kind, msg = body
        if not isinstance(kind, str):
            return bad("error reply's kind is not a string")
        if msg is not None and not isinstance(msg, str):
            return bad(f"error reply's message is a {type_name(msg)}")
    elif isinstance(body, dict):
        kind = body.get("kind")
        msg = body.get("msg")
        reason_v = body.get("reason")
        blobs_v = body.get("blobs")
        if not isinstance(kind, str):
            return bad("error reply has no string 'kind'")
        if msg is not None and not isinstance(msg, str):
            return bad(f"error reply's 'msg' is a {type_name(msg)}")
        if reason_v is not None and not isinstance(reason_v, str):
            return bad(f"error reply's 'reason' is a {type_name(reason_v)}")
        if blobs_v is not None:
            if not isinstance(blobs_v, list) or not all(isinstance(b, str) for b in blobs_v):
                return bad("error reply's 'blobs' is not a list of strings")
            blobs = list(blobs_v)
        reason = reason_v
    else:
        return bad(f"error reply is a {type_name(body)}, not a map")
    msg = msg or ""
    if kind == "UnitFull":
        return errors.UnitFull(msg, address=address, op=op)
    if kind == "Busy":
        return errors.Busy(msg, reason=reason, address=address, op=op)
    if kind == "Missing":
        return errors.Missing(msg, blobs=blobs, address=address, op=op)
    declared = kinds.get(kind) if kind != "Protocol" else None
    if declared is not None:
        return declared(msg, reason=reason, address=address, op=op)
    return errors.Transfer(msg, cause="remote", remote_kind=kind, reason=reason,
                           address=address, op=op)


def wire_error(err: BaseException) -> Tuple[str, str, Optional[str], Optional[List[str]]]:
    """What a handler's exception goes out as: (kind, msg, reason, blobs).

    An Error keeps its kind (Transfer and Timeout go out as Protocol; a DeclaredError under its
    own kind's name); its message is `str(err)`, which names the op and address when the error
    came from a call. Anything else is a Protocol error (the caller words that message).
    """
    if isinstance(err, errors.Missing):
        return "Missing", str(err), None, list(err.blobs)
    if isinstance(err, errors.Busy):
        return "Busy", str(err), err.reason, None
    if isinstance(err, errors.UnitFull):
        return "UnitFull", str(err), None, None
    if isinstance(err, errors.DeclaredError):
        return type(err).kind, str(err), err.reason, None
    return "Protocol", str(err), None, None
