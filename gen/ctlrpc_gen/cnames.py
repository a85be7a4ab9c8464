"""C names: every identifier the generated files declare, define or rely on, owned in one place.

The render stage and the templates get each generated identifier from `CNames` (`get(role,
key)`), never by gluing strings, and the checker runs the same `CNames` over the program to
find, before anything is written, every pair of names that would meet in C. So the C that
ctlrpc-gen emits compiles whatever the (valid) names: a clash is a diagnostic at the IDL
declaration that causes it, not a compiler error in a generated file.

What is registered (S is the service name; N an op or record name; F a type's fragment, as
`list_str` for `list<str>`, see `fragment`):

- public file-scope names: `S_N` for records (struct tag and typedef) and ops (the client stub);
  per record `S_N_init` and the macro `S_N_INIT` (upper case); per op `S_N_args`,
  `S_N_args_init`, `S_N_ARGS_INIT`, `S_N_many`, `S_N_outcome`, `S_N_outcomes_fini`,
  `S_N_handler`; per list, map and non-record optional type `S_F`, per map `S_F_entry`; fixed:
  `S_handlers`, `S_serve`, `S_service` (and `S_client`, `S_server`, kept for the generator);
  the header guard; with declared error kinds, `S_error_code`, per kind the constant
  `S_ERR_<Kind>` (`S` in upper case, the kind as written), and per op and declared kind it
  raises `S_N_raise_<Kind>`.
- internal file-scope names (descriptors, helpers, long string constants): `S__<tag>_<...>`
  with a tag per kind (`t` type, `r` record, `f`/`d` a record's fields and defaults, `at`,
  `af`, `ad` an op's args, `op`, `invoke`, `s` a long string, `e` a declared error kind, `rk`
  the kinds an op raises, `idl` the IDL files' text). No IDL name starts with `_`, so
  none of them can meet a public name; the tags keep them apart from each other.
- members: record fields and op arguments (bare in C: struct members, designated
  initializers), `on_N` in `S_handlers`, and the fixed members of generated structs.
- parameters and locals of generated functions (`client`, `args`, ...), which a file-scope
  name must not shadow.
- C types the generated structs use (`uint64_t`, `size_t`, `ctl_str`, ...), which a member
  must not hide (in C++ a member named like a type used in its struct changes its meaning).

Checks (`problems`):
- file-scope names are distinct, ignoring case (macros are upper-case spellings of names), and
  none is a C or C++ keyword or a name the included headers define (`reserved_names.txt`, which
  scripts/reserved-names.py collects from the headers themselves);
- a member is not a generated file-scope name or macro, nor a C type the generated code uses;
- a parameter or local name is not a generated file-scope name.
Keywords and the headers' object-like macros are refused for member names by the checker's
name rules (`why_reserved(..., bare=True)`), where the message names just the IDL name.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Dict, FrozenSet, List, Optional, Sequence, Tuple

from . import model as m
from .diag import Loc, printable

RESERVED_FILE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "reserved_names.txt")

# C11 keywords, plus C23's new ones so that generated code survives newer compilers.
C_KEYWORDS = frozenset("""
    auto break case char const continue default do double else enum extern float for goto if
    inline int long register restrict return short signed sizeof static struct switch typedef
    union unsigned void volatile while
    alignas alignof bool constexpr false nullptr static_assert thread_local true typeof
    typeof_unqual
""".split())

# C++ keywords (C++20) and alternative tokens: generated headers are also included from C++.
CXX_KEYWORDS = frozenset("""
    and and_eq asm bitand bitor catch char8_t char16_t char32_t class co_await co_return
    co_yield compl concept const_cast consteval constinit decltype delete dynamic_cast explicit
    export friend mutable namespace new noexcept not not_eq operator or or_eq private protected
    public reinterpret_cast requires static_cast template this throw try typeid typename using
    virtual wchar_t xor xor_eq
""".split()) - C_KEYWORDS

# Longest IDL name: every generated string literal stays far below C's 4095 characters.
MAX_NAME = 255
# Longest string literal C11 compilers must accept (and -pedantic holds them to); a longer
# default is emitted as a character array instead.
MAX_STRING_LITERAL = 4095

# Parameters and locals of the generated functions.
PARAMS = ("client", "address", "addresses", "args", "timeout_ms", "result", "reply", "err",
          "count", "outcomes", "handlers", "opts", "out", "value", "ctx", "req", "h")
# Members of the generated structs other than fields and arguments.
FIXED_MEMBERS = ("items", "count", "present", "value", "key", "error", "reply", "result", "ctx")
# C types named in generated structs.
USED_TYPES = ("bool", "int32_t", "int64_t", "uint32_t", "uint64_t", "double", "size_t",
              "ctl_str", "ctl_error", "ctl_reply")

_reserved: Optional[Dict[str, Tuple[FrozenSet[str], str]]] = None


def reserved() -> Dict[str, Tuple[FrozenSet[str], str]]:
    """name -> (kinds, header) of every name the included headers define (loaded once)."""
    global _reserved
    if _reserved is None:
        table = {}
        with open(RESERVED_FILE, encoding="utf-8") as f:
            for line in f:
                if line.startswith("#") or not line.strip():
                    continue
                name, kinds, header = line.split()
                table[name] = (frozenset(kinds.split(",")), header)
        _reserved = table
    return _reserved


def why_reserved(name: str, bare: bool) -> Optional[str]:
    """Why `name` cannot be a C identifier of the generated code ('is a C keyword', ...), or
    None. `bare`: the name stands alone as a struct member (a field or an argument), where only
    keywords and object-like macros can break it; else it is a whole file-scope identifier."""
    if name in C_KEYWORDS:
        return "is a C keyword"
    if name in CXX_KEYWORDS:
        return "is a C++ keyword (generated headers are also included from C++)"
    entry = reserved().get(name)
    if entry is None:
        return None
    kinds, header = entry
    by = "the compiler" if header.startswith("<") else f"<{header}>"
    if "macro" in kinds:
        return f"is a macro defined by {by}" if by != "the compiler" else \
            "is a macro the compiler predefines"
    if bare:
        return None
    if "fmacro" in kinds:
        return f"is a function-like macro defined by {by}"
    if "id" in kinds:
        return f"is declared by {by}"
    return f"is a struct tag declared by {by}"


def fragment(t: m.Type) -> str:
    """A type's part of C names: `u64`, `list_str`, `map_opt_u64`, `BlobInfo`."""
    prefix = ""
    while not isinstance(t, (m.Scalar, m.RecordRef)):
        if isinstance(t, m.ListOf):
            prefix, t = prefix + "list_", t.elem
        elif isinstance(t, m.MapOf):
            prefix, t = prefix + "map_", t.value
        else:
            prefix, t = prefix + "opt_", t.inner
    return prefix + t.name


def has_c_type(t: m.Type) -> bool:
    """Whether `t` has a generated C type of its own: lists, maps and non-record optionals."""
    return isinstance(t, (m.ListOf, m.MapOf)) or (
        isinstance(t, m.OptionalOf) and not isinstance(t.inner, m.RecordRef))


def header_guard(stem: str) -> str:
    """The header guard of `<stem>.ctl.h`: a valid identifier whatever the file name (a digit
    first, a '-', non-ASCII letters, undecodable bytes), distinct for distinct stems: letters
    and digits stay, '_' doubles, anything else is '_' and the hex of its UTF-8 bytes."""
    out = []
    for ch in stem:
        if ch.isascii() and ch.isalnum():
            out.append(ch)
        elif ch == "_":
            out.append("__")
        else:
            data = ch.encode("utf-8", "surrogateescape")
            out.append("_" + data.hex().upper())
    return f"CTLRPC_GEN_{''.join(out)}_CTL_H"


@dataclass(frozen=True)
class Origin:
    """The IDL declaration a C name is made from."""

    kind: str  # 'record', 'op', 'notify', 'type', 'field', 'argument', 'service', 'file' or
    #            'error kind'
    name: str  # its IDL name (a type's IDL spelling)
    loc: Optional[Loc]

    def describe(self, path: Optional[str] = None) -> str:
        where = f" ({self.loc.where(path)})" if path is not None and self.loc else ""
        return f"{self.kind} '{printable(self.name)}'{where}"


@dataclass(frozen=True)
class CName:
    text: str
    space: str  # 'global' (file scope, macros included), 'member', 'param' or 'type' (used)
    role: str  # what the name is, for messages: 'the args struct', ...
    origin: Optional[Origin]  # None: fixed by the generator
    primary: bool = False  # the declaration's own C name (a record's type, an op's stub)
    owner: str = ""  # for members: the C struct


@dataclass(frozen=True)
class Problem:
    loc: Loc
    message: str


class CNames:
    """The C names of one service (see the module docstring).

    `records` and `ops` are model objects, each name once; members whose type did not resolve
    (None) are allowed, so the checker can run this alongside its other checks. `stem` is the
    IDL file's name without `.idl`.
    """

    def __init__(self, service: m.Service, stem: str, records: Sequence[m.Record],
                 ops: Sequence[m.Op], types: Sequence[m.Type], service_file: str = "",
                 errors: Sequence[m.ErrorKind] = ()) -> None:
        self.svc = service.name
        self.names: List[CName] = []
        self.by_key: Dict[Tuple[str, str], str] = {}
        self.long_strings: Dict[bytes, str] = {}
        self._register(service, stem, records, ops, types, service_file)
        self._register_errors(errors, ops)

    # -- lookups (the render stage's only source of C names) ----------------------------------

    def get(self, role: str, key: str = "") -> str:
        """The C name of `role` for `key` (an IDL name, or a type's IDL spelling)."""
        return self.by_key[(role, key)]

    def of_type(self, role: str, t: m.Type) -> str:
        return self.by_key[(role, t.idl)]

    def long_string(self, data: bytes) -> Optional[str]:
        """The array holding a string default too long for a C literal, or None."""
        return self.long_strings.get(data)

    # -- registration -------------------------------------------------------------------------

    def add(self, role_key: Optional[Tuple[str, str]], text: str, space: str, role: str,
            origin: Optional[Origin], primary: bool = False, owner: str = "") -> str:
        self.names.append(CName(text, space, role, origin, primary, owner))
        if role_key is not None:
            self.by_key[role_key] = text
        return text

    def _register(self, service, stem, records, ops, types, service_file) -> None:
        svc = self.svc
        S = svc.upper()
        glob = "global"
        svc_origin = Origin("service", svc, service.loc)
        self.add(("guard", ""), header_guard(stem), glob, "the header guard",
                 Origin("file", service_file or stem, None))
        for fixed, role in (("handlers", "the handler table"), ("serve", "the serve function"),
                            ("service", "the service descriptor"),
                            ("client", "a name kept for the generated code"),
                            ("server", "a name kept for the generated code")):
            self.add((fixed, ""), f"{svc}_{fixed}", glob, role, None)
        self.add(("ops", ""), f"{svc}__ops", glob, "the op table", svc_origin)
        self.add(("idl_files", ""), f"{svc}__idl_files", glob, "the IDL files' table", svc_origin)

        for r in records:
            o = Origin("record", r.name, r.loc)
            n = r.name
            self.add(("record", n), f"{svc}_{n}", glob, "the C type", o, primary=True)
            self.add(("record_init", n), f"{svc}_{n}_init", glob, "the initializer function", o)
            self.add(("record_INIT", n), f"{S}_{n.upper()}_INIT", glob, "the initializer macro", o)
            self.add(("r", n), f"{svc}__r_{n}", glob, "the descriptor", o)
            self.add(("f", n), f"{svc}__f_{n}", glob, "the field table", o)
            self.add(("d", n), f"{svc}__d_{n}", glob, "the defaults", o)
            for f in r.fields:
                self.add(None, f.name, "member", "a field", Origin("field", f.name, f.loc),
                         owner=f"{svc}_{n}")

        for op in ops:
            kind = "notify" if op.notify else "op"
            o = Origin(kind, op.name, op.loc)
            n = op.name
            self.add(("op", n), f"{svc}_{n}", glob, "the client stub", o, primary=True)
            self.add(("op_args", n), f"{svc}_{n}_args", glob, "the args struct", o)
            self.add(("op_args_init", n), f"{svc}_{n}_args_init", glob,
                     "the args initializer function", o)
            self.add(("op_ARGS_INIT", n), f"{S}_{n.upper()}_ARGS_INIT", glob,
                     "the args initializer macro", o)
            self.add(("op_many", n), f"{svc}_{n}_many", glob, "the fan-out stub", o)
            self.add(("op_outcome", n), f"{svc}_{n}_outcome", glob, "the outcome struct", o)
            self.add(("op_outcomes_fini", n), f"{svc}_{n}_outcomes_fini", glob,
                     "the outcome release function", o)
            self.add(("op_start", n), f"{svc}_{n}_start", glob, "the asynchronous stub", o)
            self.add(("op_done", n), f"{svc}_{n}_done", glob, "the completion type", o)
            self.add(("op_many_start", n), f"{svc}_{n}_many_start", glob,
                     "the asynchronous fan-out stub", o)
            self.add(("op_many_done", n), f"{svc}_{n}_many_done", glob,
                     "the fan-out completion type", o)
            self.add(("thunk", n), f"{svc}__thunk_{n}", glob, "the completion trampoline", o)
            self.add(("thunk_many", n), f"{svc}__thunkm_{n}", glob,
                     "the fan-out completion trampoline", o)
            self.add(("op_handler", n), f"{svc}_{n}_handler", glob, "the handler type", o)
            self.add(("at", n), f"{svc}__at_{n}", glob, "the args descriptor", o)
            self.add(("af", n), f"{svc}__af_{n}", glob, "the args field table", o)
            self.add(("ad", n), f"{svc}__ad_{n}", glob, "the args defaults", o)
            self.add(("invoke", n), f"{svc}__invoke_{n}", glob, "the handler call", o)
            self.add(("opd", n), f"{svc}__op_{n}", glob, "the op descriptor", o)
            self.add(("on", n), f"on_{n}", "member", "the handler member", o,
                     owner=f"{svc}_handlers")
            for a in op.args:
                self.add(None, a.name, "member", "an argument", Origin("argument", a.name, a.loc),
                         owner=f"{svc}_{n}_args")

        first_use = _first_uses(records, ops)
        for t in types:
            if t is None or isinstance(t, (m.Scalar, m.RecordRef)):
                continue
            o = Origin("type", t.idl, first_use.get(t))
            frag = fragment(t)
            self.add(("t", t.idl), f"{svc}__t_{frag}", glob, "the descriptor", o)
            if not has_c_type(t):
                continue  # an optional record: a pointer to the record's type
            self.add(("type", t.idl), f"{svc}_{frag}", glob, "the C type", o)
            if isinstance(t, m.MapOf):
                self.add(("entry", t.idl), f"{svc}_{frag}_entry", glob, "the entry type", o)

        index = 0
        for owner, members in ([(r, r.fields) for r in records] + [(op, op.args) for op in ops]):
            for mem in members:
                data = _string_default(mem)
                if data is not None and len(data) > MAX_STRING_LITERAL \
                        and data not in self.long_strings:
                    name = f"{svc}__s{index}"
                    index += 1
                    self.long_strings[data] = self.add(
                        None, name, glob, "a long string default",
                        Origin("field" if isinstance(owner, m.Record) else "argument",
                               mem.name, mem.loc))

        for p in PARAMS:
            self.add(None, p, "param", "a parameter name", None)
        for fm in FIXED_MEMBERS:
            self.add(None, fm, "member", "a member of generated structs", None)
        self.add(None, "ctx", "member", "the context member", None, owner=f"{svc}_handlers")
        for t in USED_TYPES:
            self.add(None, t, "type", "a C type the generated structs use", None)

    def register_idl_files(self, count: int) -> None:
        """The text of each IDL file read, embedded for the built-in op _describe."""
        for i in range(count):
            self.add(("idl", str(i)), f"{self.svc}__idl_{i}", "global", "an IDL file's text",
                     None)

    def _register_errors(self, errors: Sequence[m.ErrorKind], ops: Sequence[m.Op]) -> None:
        """Declared error kinds: the enum of their constants, a descriptor for each, and per op
        the list of the kinds it raises and a raise helper for each."""
        if not errors:
            return
        svc, S, glob = self.svc, self.svc.upper(), "global"
        self.add(("error_code", ""), f"{svc}_error_code", glob, "the error code enum", None)
        for e in errors:
            o = Origin("error kind", e.name, e.loc)
            self.add(("err", e.name), f"{S}_ERR_{e.name}", glob, "the error kind's constant", o,
                     primary=True)
            self.add(("e", e.name), f"{svc}__e_{e.name}", glob, "the error kind's descriptor", o)
        for op in ops:
            declared = op.raises_declared
            if not declared:
                continue
            o = Origin("notify" if op.notify else "op", op.name, op.loc)
            self.add(("rk", op.name), f"{svc}__rk_{op.name}", glob, "the kinds it raises", o)
            for k in declared:
                self.add(("raise", f"{op.name}.{k}"), f"{svc}_{op.name}_raise_{k}", glob,
                         f"the raise helper of '{k}'", o)

    # -- checks -------------------------------------------------------------------------------

    def problems(self) -> List[Problem]:
        """Every clash among the registered names and with reserved names, once each, at the
        IDL declaration that causes it."""
        out: List[Problem] = []
        seen: Dict[str, CName] = {}  # lower-case text -> first global name
        exact: Dict[str, CName] = {}
        reported: set = set()
        for n in self.names:
            if n.space != "global":
                continue
            exact.setdefault(n.text, n)
            why = why_reserved(n.text, bare=False)
            if why is not None and n.origin is not None:
                out.append(self._reserved_problem(n, why))
            prev = seen.setdefault(n.text.lower(), n)
            if prev is n or prev.origin == n.origin:  # e.g. `s_R_init` and `S_R_INIT`
                continue
            pair = (prev.origin, n.origin)
            if pair not in reported:
                reported.add(pair)
                out.append(self._clash(prev, n))

        used_types = {n.text: n for n in self.names if n.space == "type"}
        for n in self.names:
            if n.space == "member" and n.origin is not None and n.origin.kind in (
                    "field", "argument"):
                other = exact.get(n.text) or used_types.get(n.text)
                if other is None or why_reserved(n.text, bare=True):
                    continue  # (a keyword or macro: the checker's name rules report it)
                what = other.role + (f" of {other.origin.describe(n.origin.loc.path)}"
                                     if other.origin else "")
                out.append(Problem(n.origin.loc, f"{n.origin.kind} '{n.text}' would clash in C "
                                                 f"with '{n.text}', {what}; rename it"))
            elif n.space == "param":
                other = exact.get(n.text)
                if other is not None and other.origin is not None:
                    out.append(self._at(other, "which the generated functions use as a "
                                               "parameter name"))
        return out

    def _at(self, n: CName, which: str) -> Problem:
        o = n.origin
        if n.primary:
            return Problem(o.loc, f"{o.kind} '{o.name}' would be named '{n.text}' in C, {which}")
        return Problem(o.loc, f"'{n.text}' ({n.role} of {o.describe()}) would be generated in "
                              f"C, {which}")

    def _reserved_problem(self, n: CName, why: str) -> Problem:
        if n.origin.loc is None:  # the header guard: from the file name
            return Problem(Loc(n.origin.name, 0, 0), f"the header guard '{n.text}' {why}; "
                                                     "rename the file")
        return self._at(n, f"which {why}")

    @staticmethod
    def _rank(n: CName) -> int:
        """Where a clash is best reported: a declaration's own name, then a name derived from
        a declaration, then one derived from a type, never a fixed name."""
        if n.origin is None or n.origin.loc is None:
            return 0
        if n.primary:
            return 3
        return 1 if n.origin.kind == "type" else 2

    def _clash(self, a: CName, b: CName) -> Problem:
        """Two generated names equal ignoring case."""
        at, other = (a, b) if self._rank(a) > self._rank(b) else (b, a)
        path = at.origin.loc.path
        if other.origin is None:
            return self._at(at, "which the generated code uses")
        if at.primary:
            return self._at(at, f"which is generated for {other.origin.describe(path)}")
        return Problem(at.origin.loc, f"'{at.text}' would be generated in C both for "
                                      f"{at.origin.describe()} and for "
                                      f"{other.origin.describe(path)}; rename one of them")


def _string_default(mem: m.Member) -> Optional[bytes]:
    v = mem.default
    if v is None or v.kind not in ("str", "bin"):
        return None
    return v.value if isinstance(v.value, bytes) else str(v.value).encode("utf-8")


def _first_uses(records: Sequence[m.Record], ops: Sequence[m.Op]) -> Dict[m.Type, Loc]:
    """Where each type (inner types included) is first written: the member's location."""
    out: Dict[m.Type, Loc] = {}
    members: List[m.Member] = [f for r in records for f in r.fields]
    members += [a for op in ops for a in op.args]
    for mem in members:
        t = mem.type
        while t is not None:
            out.setdefault(t, mem.loc)
            kids = m.children(t)
            t = kids[0] if kids else None
    for op in ops:
        t = op.result
        while t is not None:
            out.setdefault(t, op.loc)
            kids = m.children(t)
            t = kids[0] if kids else None
    return out


def stem_of(path: str) -> str:
    return os.path.splitext(os.path.basename(path))[0]


def stem_problem(stem: str) -> Optional[str]:
    """Why the generated files cannot be named after `stem` (their `#include "<stem>.ctl.h"`
    could not spell it), or None."""
    for ch in stem:
        o = ord(ch)
        if 0xDC80 <= o <= 0xDCFF:
            return "it is not valid UTF-8"
        if ch in '"\\' or not ch.isprintable():
            return f"it contains {printable(repr(ch))}, which a C #include cannot spell"
    if "??" in stem:
        return "it contains '??', which C reads as the start of a trigraph"
    return None
