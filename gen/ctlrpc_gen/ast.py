"""Syntax tree: what the parser read, before any meaning is checked.

Nodes mirror the source closely: names are plain strings, types are unresolved expressions, default
values are literals as written. Every node carries a `Loc` (path:line:col) so the checker can point
at it. Nothing here is validated: a record may have duplicate fields, a type may name nothing, a
notify may declare a result. `check.py` turns this tree into the validated `model`.

All nodes are frozen; lists are tuples. (The module shares its name with the standard library's
`ast`; it is only ever imported as `ctlrpc_gen.ast`, so the package directory itself must not be
put on sys.path.)
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Dict, Optional, Tuple, Union

from .diag import Loc

# -- type expressions -------------------------------------------------------------------------


@dataclass(frozen=True)
class NamedType:
    """A builtin (`u64`, `str`, ...) or a record name; `list`/`map` without `<...>` too."""

    loc: Loc
    name: str


@dataclass(frozen=True)
class ListType:
    loc: Loc
    elem: "TypeExpr"


@dataclass(frozen=True)
class MapType:
    loc: Loc
    key: "TypeExpr"
    value: "TypeExpr"


@dataclass(frozen=True)
class OptionalType:
    """`inner?`; `loc` is the `?` itself."""

    loc: Loc
    inner: "TypeExpr"


TypeExpr = Union[NamedType, ListType, MapType, OptionalType]


def type_text(t: TypeExpr) -> str:
    """The type expression in canonical IDL spelling, for messages."""
    if isinstance(t, NamedType):
        return t.name
    if isinstance(t, ListType):
        return f"list<{type_text(t.elem)}>"
    if isinstance(t, MapType):
        return f"map<{type_text(t.key)}, {type_text(t.value)}>"
    return f"{type_text(t.inner)}?"


# -- literals (default values) ----------------------------------------------------------------


@dataclass(frozen=True)
class Literal:
    """A default value as written.

    kind: 'bool', 'int', 'float', 'str', 'null', 'list' or 'map'. `value` is the Python value
    (bool, int, float, str, None), None also when the lexer already reported the token as
    malformed (`bad`). `items` holds list elements, or map entries as (key, value) pairs.
    `text` is the canonical source spelling, used when a declaration is echoed into C comments.
    """

    loc: Loc
    kind: str
    value: object
    text: str
    items: Tuple = ()
    bad: bool = False


# -- declarations -----------------------------------------------------------------------------


# Declarations carry `start` (their keyword, where the declaration begins) and `loc` (the part
# most messages point at: the name, or an import's path).


@dataclass(frozen=True)
class Service:
    start: Loc
    loc: Loc
    name: str
    doc: Optional[str]


@dataclass(frozen=True)
class Import:
    start: Loc
    loc: Loc
    path: Optional[str]  # None if the string literal was malformed


@dataclass(frozen=True)
class Member:
    """A record field or an op argument: `name: type [= default]`."""

    loc: Loc  # the name
    name: str
    type: TypeExpr
    default: Optional[Literal]
    doc: Optional[str]


@dataclass(frozen=True)
class Record:
    start: Loc
    loc: Loc
    name: str
    fields: Tuple[Member, ...]
    doc: Optional[str]
    incomplete: bool = False  # a syntax error cut the body short; do not judge it empty


@dataclass(frozen=True)
class ErrorDecl:
    """`error NotFound;`: an error kind the service's ops may list in `raises`."""

    start: Loc
    loc: Loc
    name: str
    doc: Optional[str]


@dataclass(frozen=True)
class ErrorKindRef:
    loc: Loc
    name: str


@dataclass(frozen=True)
class Op:
    """`op` or `notify`. The parser accepts a result, raises and `idempotent` on notify so check
    can explain. `start` is the `op`/`notify` keyword; `idempotent` the modifier before it, if
    written."""

    start: Loc
    loc: Loc
    name: str
    notify: bool
    args: Tuple[Member, ...]
    result: Optional[TypeExpr]
    raises: Tuple[ErrorKindRef, ...]
    raises_loc: Optional[Loc]  # the `raises` keyword
    doc: Optional[str]
    idempotent: Optional[Loc] = None  # the `idempotent` keyword


Decl = Union[Service, Import, Record, Op, ErrorDecl]


@dataclass(frozen=True)
class File:
    """One parsed IDL file. `saw_service`/`saw_op` say a declaration was attempted even if a
    syntax error dropped it, so the checker does not add 'missing service'/'no ops' on top."""

    path: str
    decls: Tuple[Decl, ...]
    saw_service: bool = False
    saw_op: bool = False

    def of(self, kind: type) -> Tuple:
        return tuple(d for d in self.decls if isinstance(d, kind))


@dataclass(frozen=True)
class Program:
    """The main file and every file it imports, each read once.

    files: in load order, main first (imports depth-first in the order written).
    imports: display path -> display paths of the files it imports that were read.
    incomplete: display paths of files whose imports (directly or not) could not all be read;
        names from the missing files are unknown there, so the checker stays quiet about them.
    """

    main: File
    files: Tuple[File, ...]
    imports: Dict[str, Tuple[str, ...]] = field(default_factory=dict)
    incomplete: frozenset = frozenset()
