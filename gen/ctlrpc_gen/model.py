"""The validated model: what the render stage consumes.

`check.check()` builds it and only from an IDL file free of errors, so everything here holds:
names are unique and legal, every type resolves, every default fits its type, records can be
encoded (no cycle without an optional, list or map in it), notify ops have no result or raises.
All classes are frozen and all collections are tuples, so templates cannot change it and two runs
over the same input produce equal models.

Wire facts live here, computed once, never in templates:
- `Type.family`: the msgpack family a value of the type is written as ('bool', 'int', 'float',
  'str', 'bin', 'array', 'map'); `Type.nullable`: whether nil is accepted and written for absence.
  A record is a msgpack map keyed by field name; its decoder skips keys it does not declare (so
  a record can gain fields without breaking older readers; an op's args map, by contrast,
  rejects unknown keys, as docs/PROTOCOL.md says). Integers are written in the smallest encoding;
  decoders accept any integer width that holds the value and reject values out of the type's range.
  An f64 is written as float64; its decoder also accepts float32 and integers.
- `Op.no_reply`: notify ops, for which the unit sends nothing back.
- `Op.idempotent`: declared `idempotent` (never a notify op): running it twice does what running
  it once does, so a client whose retry policy allows may send it again after a timeout or a
  failure after the request left (docs/IDL.md, "Idempotent ops").
- `Model.op_index`: ops sorted by name in byte order (what strcmp/memcmp order means), for the
  binary search the runtime does when it dispatches; `Op.index` is the op's position in IDL order.
- `Member.required`: a peer must send it. A member with a default (an optional one has an implicit
  `null` default) may be omitted; the decoder then uses the default.
- `Record.recursive` and `Model.records_by_dependency`: what a C renderer needs to lay out
  structs (see their docstrings).

Not here: C identifiers (cnames.py owns them) and C spellings of values (the render stage's
filters, which also escape IDL text copied into comments and string defaults).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Dict, Optional, Tuple, Union

from .diag import Loc

# Built-in error kinds an op may list in `raises`, beside the kinds the IDL declares (`error X;`).
# `Protocol` is implicit on every op (see docs/IDL.md).
ERROR_KINDS = ("UnitFull", "Busy", "Missing")
IMPLICIT_ERROR_KIND = "Protocol"
# Names a declared kind cannot take: the built-in kinds, and the runtime's names for failures
# that are not kinds on the wire (C: CTL_TRANSFER, CTL_INVALID, CTL_DECLARED; Python: the
# exception classes Error, Transfer, Timeout).
RESERVED_ERROR_NAMES = ERROR_KINDS + (IMPLICIT_ERROR_KIND, "Transfer", "Timeout", "Error",
                                      "Invalid", "Declared", "OK")

INT_RANGES: Dict[str, Tuple[int, int]] = {
    "i32": (-(2 ** 31), 2 ** 31 - 1),
    "i64": (-(2 ** 63), 2 ** 63 - 1),
    "u32": (0, 2 ** 32 - 1),
    "u64": (0, 2 ** 64 - 1),
}
SCALAR_FAMILIES: Dict[str, str] = {
    "bool": "bool",
    "i32": "int", "i64": "int", "u32": "int", "u64": "int",
    "f64": "float",
    "str": "str",
    "bin": "bin",
}
SCALARS = tuple(SCALAR_FAMILIES)


# -- types ------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Scalar:
    """bool, i32, i64, u32, u64, f64, str or bin."""

    name: str

    @property
    def idl(self) -> str:
        return self.name

    @property
    def family(self) -> str:
        return SCALAR_FAMILIES[self.name]

    nullable = False

    @property
    def int_range(self) -> Optional[Tuple[int, int]]:
        """(min, max) for integer types, else None."""
        return INT_RANGES.get(self.name)


@dataclass(frozen=True)
class ListOf:
    elem: "Type"

    @property
    def idl(self) -> str:
        return f"list<{self.elem.idl}>"

    family = "array"
    nullable = False


@dataclass(frozen=True)
class MapOf:
    """map<str, value>: keys are always str."""

    value: "Type"

    @property
    def idl(self) -> str:
        return f"map<str, {self.value.idl}>"

    family = "map"
    nullable = False


@dataclass(frozen=True)
class RecordRef:
    """A record by name; look it up with `Model.record(name)` (names keep recursive types flat)."""

    name: str

    @property
    def idl(self) -> str:
        return self.name

    family = "map"
    nullable = False


@dataclass(frozen=True)
class OptionalOf:
    """`inner?`: the value or nil. `inner` is never itself optional."""

    inner: "Type"

    @property
    def idl(self) -> str:
        return f"{self.inner.idl}?"

    @property
    def family(self) -> str:
        return self.inner.family

    nullable = True


Type = Union[Scalar, ListOf, MapOf, RecordRef, OptionalOf]


def children(t: Type) -> Tuple[Type, ...]:
    """The types directly inside `t` (element, value or inner type)."""
    if isinstance(t, ListOf):
        return (t.elem,)
    if isinstance(t, MapOf):
        return (t.value,)
    if isinstance(t, OptionalOf):
        return (t.inner,)
    return ()


# -- values -----------------------------------------------------------------------------------


@dataclass(frozen=True)
class Value:
    """A checked default value.

    kind: 'bool', 'int', 'float', 'str', 'bin', 'null', 'list' (always empty) or 'map' (always
    empty). value: bool, int, float, str, bytes (UTF-8 of the literal), or None for the rest.
    `idl` is the value as written in the IDL ('0x10', '"a\\n"', 'null'), for echoing declarations.
    """

    kind: str
    value: object
    idl: str


NULL = Value("null", None, "null")


# -- declarations -----------------------------------------------------------------------------


@dataclass(frozen=True)
class Member:
    """A record field or an op argument. `name` is also its key on the wire."""

    name: str
    loc: Loc
    doc: Optional[str]
    type: Type
    default: Optional[Value]  # None: required. Optional members default to NULL implicitly.
    default_written: bool  # the IDL spelled the default out (False for implicit nulls)

    @property
    def required(self) -> bool:
        return self.default is None

    @property
    def idl(self) -> str:
        text = f"{self.name}: {self.type.idl}"
        if self.default_written:
            text += f" = {self.default.idl}"
        return text


@dataclass(frozen=True)
class Field(Member):
    pass


@dataclass(frozen=True)
class Arg(Member):
    pass


@dataclass(frozen=True)
class Record:
    """A record: a msgpack map keyed by field name.

    `recursive`: the record can contain itself (through optional, list or map fields; a cycle
    without one of those is an error). A C renderer stores such references by pointer.
    `deps`: the records its fields mention at any depth, in first-mention order.
    """

    name: str
    loc: Loc
    doc: Optional[str]
    fields: Tuple[Field, ...]
    recursive: bool
    deps: Tuple[str, ...]


@dataclass(frozen=True)
class Op:
    """An op (request/reply) or a notify op (no reply).

    `index` is the position in IDL order (the descriptor table's order). `result` None means the
    reply's result is nil. `raises` lists error kinds as written: built-in ones (ERROR_KINDS)
    and declared ones; Protocol is implicit. `idempotent`: declared so (only ops that reply).
    """

    name: str
    loc: Loc
    doc: Optional[str]
    index: int
    notify: bool
    args: Tuple[Arg, ...]
    result: Optional[Type]
    raises: Tuple[str, ...]
    idempotent: bool = False

    @property
    def no_reply(self) -> bool:
        return self.notify

    @property
    def raises_builtin(self) -> Tuple[str, ...]:
        return tuple(k for k in self.raises if k in ERROR_KINDS)

    @property
    def raises_declared(self) -> Tuple[str, ...]:
        return tuple(k for k in self.raises if k not in ERROR_KINDS)

    @property
    def idl(self) -> str:
        """The declaration in canonical IDL, e.g. `op put(key: str, pin: bool = false) -> u64`
        or `idempotent op get(key: str) -> bin`."""
        text = "idempotent " if self.idempotent else ""
        text += f"{'notify' if self.notify else 'op'} {self.name}("
        text += ", ".join(a.idl for a in self.args) + ")"
        if self.result is not None:
            text += f" -> {self.result.idl}"
        if self.raises:
            text += " raises " + ", ".join(self.raises)
        return text


@dataclass(frozen=True)
class ErrorKind:
    """A declared error kind (`error NotFound;`). `code` is its constant in generated code:
    1, 2, ... in declaration order (imported files' first); it never travels on the wire, where
    the kind is its name."""

    name: str
    loc: Loc
    doc: Optional[str]
    code: int


@dataclass(frozen=True)
class Service:
    name: str
    loc: Loc
    doc: Optional[str]


@dataclass(frozen=True)
class Model:
    """A checked IDL program.

    path: the main IDL file as given (display path, never made absolute).
    files: every IDL file read, main first: the generated files depend on all of them.
    records: every record, imported files' first, each file's in source order.
    records_by_dependency: every record after the records it holds by value (a field of type
        `R`; an `R?` field is a pointer and orders nothing), otherwise in `records` order. Such
        fields form no cycle (the checker refuses one).
    ops: IDL order. op_index: the same ops sorted by name in byte order.
    errors: the declared error kinds, imported files' first, each file's in source order.
    types: every distinct type used by a field, argument or result, inner types before the
        types containing them, in first-use order (records first, then ops).
    """

    path: str
    files: Tuple[str, ...]
    service: Service
    records: Tuple[Record, ...]
    records_by_dependency: Tuple[Record, ...]
    ops: Tuple[Op, ...]
    op_index: Tuple[Op, ...]
    types: Tuple[Type, ...]
    errors: Tuple[ErrorKind, ...] = ()
    error_kinds: Tuple[str, ...] = ERROR_KINDS
    _by_name: Dict[str, Record] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "_by_name", {r.name: r for r in self.records})

    def record(self, name: str) -> Record:
        return self._by_name[name]

    def error(self, name: str) -> ErrorKind:
        for e in self.errors:
            if e.name == name:
                return e
        raise KeyError(name)

    def op(self, name: str) -> Op:
        for op in self.ops:
            if op.name == name:
                return op
        raise KeyError(name)
