"""Compatibility of two versions of a service: `ctlrpc-gen --against OLD NEW`.

Peers are upgraded one at a time, so an old and a new version of a service talk to each other in
both directions: an old client calls a new unit, a new client calls an old unit. `compare()` lists
every change from OLD to NEW, each classified by what it does to those conversations:

- WIRE (wire-breaking): some old peer and some new peer can no longer talk: one sends what the
  other refuses, or an omitted member now means something else. Printed as `error:`.
- SOURCE (source-breaking): the wire still works, but the generated C API changes for code
  written against the old one. Printed as `warning:` (as `error:` under --strict).
- SAFE: nothing breaks (a new op, a new defaulted member, a widened integer, docs). Printed as
  `note:`.

The rules, each with its reason and an example, are docs/IDL.md's "Evolving a service"; the tests
(tests/gen/test_compat.py) run the examples of that page. They follow the runtime's decoders
(runtime/src/typed.c, codec.c): integers of any width are read if the value fits the type, f64
also reads integers, str and bin read only themselves, nil only an optional, a record skips
fields it does not know and requires those without a default, an op's args refuse unknown keys.

Every diagnostic sits in NEW (at the changed declaration, or at its op, record or service when
the declaration is gone) and carries a note pointing at the declaration in OLD. Messages end with
the class in brackets, like a compiler's warning flag: `[wire-breaking]`, `[source-breaking]`,
`[safe]`.

OLD is read from a file (`load_file`) or from a git revision (`load_git`: `git cat-file` of the
same path, and of the files it imports, from that revision). Both are checked like NEW; an OLD
with errors is reported and the comparison does not run. Error kinds declared in the IDL
are compared too (`Model.errors`); the built-in kinds are the same in both versions.
"""

from __future__ import annotations

import os
import secrets
import struct
import subprocess
from dataclasses import dataclass
from typing import Dict, List, Optional, Sequence, Set, Tuple

from . import ast, model as m
from .check import check
from .diag import Diagnostics, FatalError, Loc, printable
from .parser import Unreadable, _Loader, load_program

SAFE, SOURCE, WIRE = 0, 1, 2
CLASSES = ("safe", "source-breaking", "wire-breaking")


@dataclass(frozen=True)
class Change:
    """One difference between OLD and NEW: its class, where it is in NEW, what it is and why it
    matters, and notes (location in OLD, message)."""

    level: int
    loc: Loc
    message: str
    notes: Tuple[Tuple[Loc, str], ...] = ()


@dataclass(frozen=True)
class Version:
    """One version of a service: the syntax tree (for exact locations) and the checked model."""

    program: ast.Program
    model: m.Model


# -- loading OLD ------------------------------------------------------------------------------


def load_file(path: str, diags: Diagnostics) -> Optional[Version]:
    """OLD from a file (and its imports). None after reporting why not."""
    program = load_program(path, diags)
    checked = check(program, diags) if program is not None else None
    return Version(program, checked) if checked is not None else None


def load_git(rev: str, new_path: str, diags: Diagnostics) -> Optional[Version]:
    """OLD from git revision `rev`: the file at `new_path`'s place in its repository, and the files
    it imports (resolved inside the revision). Raises FatalError when git cannot be run, when
    `new_path` is not in a git work tree, or when `rev` names no commit; a file missing from the
    revision is a diagnostic like an unreadable file."""
    if rev.startswith("-"):
        raise FatalError(f"--against-git: '{printable(rev)}' is not a revision")
    where = os.path.dirname(os.path.abspath(new_path))
    r = _git(["rev-parse", "--show-toplevel", "--show-prefix"], where)
    if r.returncode != 0:
        raise FatalError(f"--against-git: {new_path} is not in a git work tree "
                         f"({_first_line(r.stderr)})")
    lines = r.stdout.decode("utf-8", "replace").split("\n")
    top, prefix = lines[0], lines[1] if len(lines) > 1 else ""
    r = _git(["rev-parse", "--verify", "--quiet", f"{rev}^{{commit}}"], top)
    if r.returncode != 0:
        raise FatalError(f"--against-git: '{printable(rev)}' names no commit in the git "
                         f"repository of {new_path}")
    commit = r.stdout.decode("ascii", "replace").strip()
    loader = _GitLoader(diags, top, commit, rev)
    program = loader.run(os.path.join(loader.root, prefix + os.path.basename(new_path)))
    checked = check(program, diags) if program is not None else None
    return Version(program, checked) if checked is not None else None


def _git(args: Sequence[str], cwd: str) -> subprocess.CompletedProcess:
    try:
        return subprocess.run(["git", *args], cwd=cwd, capture_output=True,
                              stdin=subprocess.DEVNULL)
    except OSError as e:
        raise FatalError(f"--against-git needs git, which cannot be run: "
                         f"{e.strerror or e}") from None


def _first_line(data: bytes) -> str:
    text = data.decode("utf-8", "replace").strip()
    return printable(text.split("\n")[0]) if text else "git failed"


class _GitLoader(_Loader):
    """The loader of parser.py, reading from a git revision instead of the file system.

    Paths inside the revision are kept as real paths under `root`, an absolute directory that
    does not exist, so the loader's import resolution (relative to the importing file, `..`
    included, cycles found by real path) works on them unchanged. Files are displayed as
    `REV:path` (git's own spelling), with `path` relative to the repository's top.
    """

    def __init__(self, diags: Diagnostics, top: str, commit: str, rev: str) -> None:
        super().__init__(diags)
        self.top = top
        self.commit = commit
        self.rev = rev
        self.root = os.path.join(os.sep, f"ctlrpc-git-{secrets.token_hex(8)}")
        self.in_rev: Dict[str, Optional[str]] = {}  # display -> path in the revision, or None

    def open(self, display: str, real: str, via: Optional[ast.Import]) -> Optional[ast.File]:
        # Every file the loader reads, the main one and each import, passes here.
        rel = os.path.relpath(real, self.root)
        display = f"{self.rev}:{rel.replace(os.sep, '/')}"
        outside = rel == os.pardir or rel.startswith(os.pardir + os.sep)
        self.in_rev[display] = None if outside else rel.replace(os.sep, "/")
        return super().open(display, real, via)

    def fetch(self, display: str) -> bytes:
        rel = self.in_rev.get(display)
        if rel is None:
            raise Unreadable("it is outside the git repository")
        r = _git(["cat-file", "-t", f"{self.commit}:{rel}"], self.top)
        kind = r.stdout.decode("ascii", "replace").strip()
        if r.returncode != 0:
            raise Unreadable(f"no such file in {self.rev}")
        if kind != "blob":
            raise Unreadable(f"not a file in {self.rev}")
        r = _git(["cat-file", "blob", f"{self.commit}:{rel}"], self.top)
        if r.returncode != 0:
            raise Unreadable(_first_line(r.stderr))
        return r.stdout


# -- reporting --------------------------------------------------------------------------------


def report(changes: Sequence[Change], diags: Diagnostics, strict: bool = False) -> None:
    """Add the changes to `diags`: wire-breaking ones as errors, source-breaking ones as warnings
    (errors if `strict`), safe ones as notes."""
    for c in changes:
        severity = ("note", "error" if strict else "warning", "error")[c.level]
        diags.add(severity, c.loc, f"{c.message} [{CLASSES[c.level]}]", c.notes)


def summary(changes: Sequence[Change]) -> str:
    """The last line of a comparison: how many changes of each class,
    `N wire-breaking, N source-breaking, N safe`, most severe first."""
    counts = [sum(1 for c in changes if c.level == level) for level in (2, 1, 0)]
    return ", ".join(f"{n} {CLASSES[level]}" for n, level in zip(counts, (2, 1, 0)))


# -- comparing --------------------------------------------------------------------------------


def compare(old: Version, new: Version) -> List[Change]:
    """Every change from `old` to `new`, in no particular order (diagnostics sort themselves)."""
    return _Compare(old, new).run()


_C_SCALARS = {"bool": "bool", "i32": "int32_t", "i64": "int64_t", "u32": "uint32_t",
              "u64": "uint64_t", "f64": "double", "str": "ctl_str", "bin": "ctl_str"}
_WHAT = {"bool": "a bool", "int": "an integer", "float": "a float", "str": "a str",
         "bin": "a bin", "array": "a list", "map": "a map"}


class _Where:
    """Exact locations in one version's syntax tree, found from the model's name locations."""

    def __init__(self, program: ast.Program) -> None:
        self.members: Dict[Loc, ast.Member] = {}
        self.ops: Dict[Loc, ast.Op] = {}
        for f in program.files:
            for d in f.decls:
                if isinstance(d, ast.Record):
                    self.members.update((x.loc, x) for x in d.fields)
                elif isinstance(d, ast.Op):
                    self.ops[d.loc] = d
                    self.members.update((x.loc, x) for x in d.args)

    def type_of(self, member: m.Member) -> Loc:
        node = self.members.get(member.loc)
        return _type_loc(node.type) if node is not None else member.loc

    def default_of(self, member: m.Member) -> Loc:
        node = self.members.get(member.loc)
        if node is None or node.default is None:
            return member.loc
        return node.default.loc

    def keyword_of(self, op: m.Op) -> Loc:
        node = self.ops.get(op.loc)
        if node is None:
            return op.loc
        return Loc(node.start.path, node.start.line, node.start.col,
                   len("notify" if node.notify else "op"))

    def idempotent_of(self, op: m.Op) -> Loc:
        """The `idempotent` keyword of an op (its name if it has none)."""
        node = self.ops.get(op.loc)
        return node.idempotent if node is not None and node.idempotent else op.loc

    def result_of(self, op: m.Op) -> Loc:
        node = self.ops.get(op.loc)
        return _type_loc(node.result) if node is not None and node.result else op.loc

    def raised(self, op: m.Op, kind: str) -> Loc:
        node = self.ops.get(op.loc)
        for ref in node.raises if node is not None else ():
            if ref.name == kind:
                return ref.loc
        return op.loc


def _type_loc(t: ast.TypeExpr) -> Loc:
    """The whole type expression (for list and map, as long as its canonical spelling)."""
    if isinstance(t, ast.OptionalType):
        inner = _type_loc(t.inner)
        if t.loc.line != inner.line or t.loc.path != inner.path:
            return inner
        return Loc(inner.path, inner.line, inner.col, t.loc.col + 1 - inner.col)
    if isinstance(t, (ast.ListType, ast.MapType)):
        return Loc(t.loc.path, t.loc.line, t.loc.col, len(ast.type_text(t)))
    return t.loc


def _same_value(a: m.Value, b: m.Value) -> bool:
    """Whether two defaults are the same value (floats bit for bit, as the C stubs compare)."""
    if isinstance(a.value, float) or isinstance(b.value, float):
        try:
            return struct.pack("<d", a.value) == struct.pack("<d", b.value)
        except (struct.error, TypeError):
            return False
    return a.kind == b.kind and a.value == b.value


def _order_changed(old: Sequence[str], new: Sequence[str]) -> Optional[Tuple[List[str],
                                                                              List[str]]]:
    """The names both sequences hold, in each one's order, if those orders differ."""
    both = set(old) & set(new)
    a = [n for n in old if n in both]
    b = [n for n in new if n in both]
    return (a, b) if a != b else None


class _Compare:
    def __init__(self, old: Version, new: Version) -> None:
        self.old, self.new = old.model, new.model
        self.where_old, self.where_new = _Where(old.program), _Where(new.program)
        self.svc = new.model.service.name
        self.changes: List[Change] = []
        self.renamed: Dict[str, str] = {}  # old record name -> new record name

    def add(self, level: int, loc: Loc, message: str, *notes: Tuple[Loc, str]) -> None:
        self.changes.append(Change(level, loc, message, tuple(notes)))

    def run(self) -> List[Change]:
        self.find_renamed_records()
        self.service()
        self.records()
        self.ops()
        self.error_kinds()
        return self.changes

    # -- names ---------------------------------------------------------------------------------

    def find_renamed_records(self) -> None:
        """Records renamed: R only in OLD, S only in NEW, and some member or result of type R
        (at any depth) in OLD has type S at the same place in NEW, with no other pairing of R or
        S. Records paired so are compared field by field like records of one name."""
        old_names = {r.name for r in self.old.records}
        new_names = {r.name for r in self.new.records}
        pairs: Set[Tuple[str, str]] = set()

        def walk(a: Optional[m.Type], b: Optional[m.Type]) -> None:
            if isinstance(a, m.RecordRef) and isinstance(b, m.RecordRef):
                if a.name != b.name:
                    pairs.add((a.name, b.name))
            elif type(a) is type(b) and a is not None:
                for x, y in zip(m.children(a), m.children(b)):
                    walk(x, y)

        def walk_members(a: Sequence[m.Member], b: Sequence[m.Member]) -> None:
            by_name = {x.name: x for x in b}
            for x in a:
                if x.name in by_name:
                    walk(x.type, by_name[x.name].type)

        new_ops = {o.name: o for o in self.new.ops}
        for op in self.old.ops:
            if op.name in new_ops:
                walk_members(op.args, new_ops[op.name].args)
                walk(op.result, new_ops[op.name].result)
        done: Set[Tuple[str, str]] = set()
        while True:
            for r in self.old.records:
                target = r.name if r.name in new_names else self.renamed.get(r.name)
                if target is not None and (r.name, target) not in done:
                    done.add((r.name, target))
                    walk_members(r.fields, self.new.record(target).fields)
            candidates = [(a, b) for a, b in pairs if a not in new_names and b not in old_names]
            found = {}
            for a, b in candidates:
                if sum(1 for x, _ in candidates if x == a) == 1 and \
                        sum(1 for _, y in candidates if y == b) == 1:
                    found[a] = b
            if all(self.renamed.get(a) == b for a, b in found.items()):
                break
            self.renamed.update(found)

    def as_new(self, t: Optional[m.Type]) -> Optional[m.Type]:
        """An OLD type with renamed records under their new names."""
        if isinstance(t, m.RecordRef):
            return m.RecordRef(self.renamed.get(t.name, t.name))
        if isinstance(t, m.ListOf):
            return m.ListOf(self.as_new(t.elem))
        if isinstance(t, m.MapOf):
            return m.MapOf(self.as_new(t.value))
        if isinstance(t, m.OptionalOf):
            return m.OptionalOf(self.as_new(t.inner))
        return t

    def c_type(self, t: m.Type) -> str:
        """The C spelling of a type of NEW's service, for messages."""
        svc = self.svc
        if isinstance(t, m.Scalar):
            return _C_SCALARS[t.name]
        if isinstance(t, m.RecordRef):
            return f"{svc}_{t.name}"
        if isinstance(t, m.OptionalOf) and isinstance(t.inner, m.RecordRef):
            return f"const {svc}_{t.inner.name} *"

        def fragment(t: m.Type) -> str:
            if isinstance(t, m.ListOf):
                return "list_" + fragment(t.elem)
            if isinstance(t, m.MapOf):
                return "map_" + fragment(t.value)
            if isinstance(t, m.OptionalOf):
                return "opt_" + fragment(t.inner)
            return t.name
        return f"{svc}_{fragment(t)}"

    # -- the service -----------------------------------------------------------------------------

    def service(self) -> None:
        old, new = self.old.service, self.new.service
        if old.name != new.name:
            self.add(SOURCE, new.loc,
                     f"service '{old.name}' was renamed to '{new.name}': the service name does "
                     f"not travel on the wire, but every generated C name changes from "
                     f"'{old.name}_...' to '{new.name}_...'",
                     (old.loc, f"it was '{old.name}' here"))
        self.doc(old.doc, new.doc, old.loc, new.loc, f"service '{new.name}'")

    def doc(self, old: Optional[str], new: Optional[str], old_loc: Loc, new_loc: Loc,
            what: str) -> None:
        if (old or "") != (new or ""):
            change = "added" if not old else "removed" if not new else "changed"
            self.add(SAFE, new_loc, f"the doc comment of {what} was {change}: docs do not "
                                    "travel on the wire", (old_loc, "the old declaration"))

    # -- records ---------------------------------------------------------------------------------

    def records(self) -> None:
        old_by = {r.name: r for r in self.old.records}
        new_by = {r.name: r for r in self.new.records}
        was = {b: a for a, b in self.renamed.items()}
        for rec in self.new.records:
            if rec.name in was:
                before = old_by[was[rec.name]]
                self.add(SOURCE, rec.loc,
                         f"record '{before.name}' was renamed to '{rec.name}': record names do "
                         f"not travel on the wire, but the C type '{self.svc}_{before.name}' is "
                         f"now '{self.svc}_{rec.name}'",
                         (before.loc, f"it was '{before.name}' here"))
                self.record(before, rec)
            elif rec.name in old_by:
                self.record(old_by[rec.name], rec)
            else:
                self.add(SAFE, rec.loc, f"record '{rec.name}' was added")
        for rec in self.old.records:
            if rec.name not in new_by and rec.name not in self.renamed:
                self.add(SOURCE, self.new.service.loc,
                         f"record '{rec.name}' was removed: record names do not travel on the "
                         f"wire, but the C type '{self.svc}_{rec.name}' is gone",
                         (rec.loc, f"record '{rec.name}' was declared here"))

    def record(self, old: m.Record, new: m.Record) -> None:
        what = f"record '{new.name}'"
        self.members(old.fields, new.fields, "field", what, None, new.loc)
        moved = _order_changed([f.name for f in old.fields], [f.name for f in new.fields])
        if moved:
            self.add(SOURCE, new.loc,
                     f"the fields of {what} were reordered (now {', '.join(moved[1])}; was "
                     f"{', '.join(moved[0])}): fields travel by name, but the members of "
                     f"'{self.svc}_{new.name}' change order, which breaks positional "
                     "initializers and positional constructors in other languages",
                     (old.loc, "the old declaration"))
        self.doc(old.doc, new.doc, old.loc, new.loc, what)

    # -- members (args and fields) -----------------------------------------------------------

    def members(self, old: Sequence[m.Member], new: Sequence[m.Member], kind: str, owner: str,
                op: Optional[m.Op], owner_loc: Loc) -> None:
        old_by = {x.name: x for x in old}
        new_by = {x.name: x for x in new}
        for x in new:
            if x.name in old_by:
                self.member(old_by[x.name], x, kind, owner, op)
            else:
                self.member_added(x, kind, owner, op)
        for x in old:
            if x.name not in new_by:
                self.member_removed(x, kind, owner, op, owner_loc)

    def refused(self, op: Optional[m.Op], why: str) -> str:
        """What a unit does with a call it cannot accept, `why` being the reason."""
        if op is not None and op.notify:
            return f"dropped ({why}) without a word, since a notify gets no reply"
        return f"refused with a Protocol error ({why})"

    def member_added(self, x: m.Member, kind: str, owner: str, op: Optional[m.Op]) -> None:
        what = f"{kind} '{x.name}' of {owner}"
        if kind == "arg" and x.required:
            self.add(WIRE, x.loc, f"{what} was added without a default: an old client does not "
                                  f"send it, so its calls to a new unit are "
                                  f"{self.refused(op, 'missing arg')}; give it a default or make "
                                  "it optional")
        elif kind == "arg":
            self.add(SAFE, x.loc, f"{what} was added with a default{_implicit(x)}: an old client "
                                  "leaves it out and gets the default; an old unit refuses a call "
                                  "that sends it (unknown arg), so upgrade units first")
        elif x.required:
            self.add(WIRE, x.loc, f"{what} was added without a default: a record from an old "
                                  "peer lacks it, so a new reader refuses it (missing field); "
                                  "give it a default or make it optional")
        else:
            self.add(SAFE, x.loc, f"{what} was added with a default{_implicit(x)}: an old reader "
                                  "skips it, and a new reader takes the default when an old peer "
                                  "leaves it out")

    def member_removed(self, x: m.Member, kind: str, owner: str, op: Optional[m.Op],
                       owner_loc: Loc) -> None:
        what = f"{kind} '{x.name}' of {owner}"
        note = (x.loc, f"{kind} '{x.name}' was declared here")
        if kind == "arg":
            self.add(WIRE, owner_loc, f"{what} was removed: a call from an old client that sends "
                                      f"it is {self.refused(op, 'unknown arg')}", note)
        elif x.required:
            self.add(WIRE, owner_loc, f"{what} was removed: an old reader requires it, so it "
                                      "refuses a record from a new peer (missing field)", note)
        else:
            rec = owner.split("'")[1]
            self.add(SOURCE, owner_loc, f"{what} was removed: an old reader takes its default "
                                        f"when it is missing, but the member '{x.name}' of "
                                        f"'{self.svc}_{rec}' is gone", note)

    def member(self, old: m.Member, new: m.Member, kind: str, owner: str,
               op: Optional[m.Op]) -> None:
        what = f"{kind} '{new.name}' of {owner}"
        wo, wn = self.where_old, self.where_new
        if self.as_new(old.type) != new.type:
            self.type_changed(old.type, new.type, what, kind, wn.type_of(new),
                              wo.type_of(old))
        optional = isinstance(old.type, m.OptionalOf), isinstance(new.type, m.OptionalOf)
        if optional[0] == optional[1]:
            self.default(old, new, what, kind, op)
        self.doc(old.doc, new.doc, old.loc, new.loc, what)

    def default(self, old: m.Member, new: m.Member, what: str, kind: str,
                op: Optional[m.Op]) -> None:
        wo, wn = self.where_old, self.where_new
        od, nd = old.default, new.default
        if od is None and nd is not None:
            if kind == "arg":
                why = (f"a new client leaves it out when it is {nd.idl}, and such a call to "
                       f"an old unit is {self.refused(op, 'missing arg')}")
            else:
                why = ("a new peer may leave it out, and an old reader refuses a record "
                       "without it (missing field)")
            self.add(WIRE, wn.default_of(new), f"{what} gained a default: {why}",
                     (old.loc, f"'{old.name}' had no default here"))
        elif od is not None and nd is None:
            if kind == "arg":
                why = (f"a call from an old client that leaves it out is "
                       f"{self.refused(op, 'missing arg')}")
            else:
                why = ("a new reader refuses a record from an old peer that leaves it out "
                       "(missing field)")
            self.add(WIRE, new.loc, f"{what} lost its default: {why}",
                     (wo.default_of(old), f"the default was {od.idl} here"))
        elif od is not None and nd is not None and not _same_value(od, nd):
            if kind == "arg":
                who = (f"an old client that leaves it out (a generated C client leaves out an "
                       f"arg equal to its default, {od.idl})")
            else:
                who = "a peer that leaves it out (one older than the field)"
            self.add(WIRE, wn.default_of(new),
                     f"the default of {what} changed from {od.idl} to {nd.idl}: {who} now "
                     f"means {nd.idl}", (wo.default_of(old), f"the default was {od.idl} here"))

    # -- types -----------------------------------------------------------------------------------

    def type_changed(self, old: m.Type, new: m.Type, what: str, pos: str, loc: Loc,
                     old_loc: Loc) -> None:
        """Report a member's or result's type change (pos: 'arg', 'field' or 'result')."""
        head = f"the type of {what} changed from '{old.idl}' to '{new.idl}'"
        note = (old_loc, f"it was '{old.idl}' here")
        writer, reader = {"arg": ("client", "unit"), "result": ("unit", "client"),
                          "field": ("peer", "peer")}[pos]
        send = "return" if pos == "result" else "send"
        ahead = self.reads(old, new, self.old, self.new, set())  # old writer, new reader
        back = self.reads(new, old, self.new, self.old, set())  # new writer, old reader
        if pos == "arg":  # a generated C client leaves out an arg that is null, its default
            ahead, back = (_or_omit(x) for x in (ahead, back))
        if ahead is not None and (ahead[0] or back is None or not back[0]):
            self.add(WIRE, loc, f"{head}: an old {writer} may {send} {ahead[1]}, which a new "
                                f"{reader} refuses", note)
        elif back is not None and back[0]:
            self.add(WIRE, loc, f"{head}: a new {writer} may {send} {back[1]}, which an old "
                                f"{reader} refuses", note)
        elif back is not None:
            scalar = isinstance(old, m.Scalar) and isinstance(new, m.Scalar)
            if scalar and pos != "result":
                self.add(SAFE, loc, f"{head}: every old value still decodes (an old {reader} "
                                    f"refuses {back[1]}, so keep to the old range until every "
                                    f"{reader} is upgraded)", note)
            else:
                self.add(SOURCE, loc, f"{head}: every old value still decodes, but the C type "
                                      f"changes from '{self.c_type(self.as_new(old))}' to "
                                      f"'{self.c_type(new)}'", note)
        else:
            self.add(SOURCE, loc, f"{head}: the wire is unchanged, but the C type changes from "
                                  f"'{self.c_type(self.as_new(old))}' to '{self.c_type(new)}'",
                     note)

    def reads(self, w: m.Type, r: m.Type, wm: m.Model, rm: m.Model,
              seen: Set[Tuple[str, str]]) -> Optional[Tuple[bool, str]]:
        """Whether a reader of type `r` (in model `rm`) accepts every value a writer of type `w`
        (in model `wm`) sends: None if so, else (hard, what it refuses). `hard` is False when
        only some values are refused (integers out of range), True when a kind of value is."""
        if isinstance(w, m.OptionalOf) and not isinstance(r, m.OptionalOf):
            return True, "nil"
        if isinstance(r, m.OptionalOf):
            return self.reads(w.inner if isinstance(w, m.OptionalOf) else w, r.inner, wm, rm,
                              seen)
        if isinstance(w, m.Scalar) and isinstance(r, m.Scalar):
            if w.name == r.name:
                return None
            if w.int_range and r.int_range:
                (wlo, whi), (rlo, rhi) = w.int_range, r.int_range
                if wlo < rlo:
                    return False, "negative values" if rlo == 0 else f"values below {rlo}"
                if whi > rhi:
                    return False, f"values above {rhi}"
                return None
            if w.int_range and r.name == "f64":
                if w.name in ("i64", "u64"):
                    return False, "integers beyond 2^53, which f64 rounds"
                return None
            return True, _WHAT[w.family]
        if isinstance(w, m.ListOf) and isinstance(r, m.ListOf):
            sub = self.reads(w.elem, r.elem, wm, rm, seen)
            return (sub[0], f"{sub[1]} as a list element") if sub else None
        if isinstance(w, m.MapOf) and isinstance(r, m.MapOf):
            sub = self.reads(w.value, r.value, wm, rm, seen)
            return (sub[0], f"{sub[1]} as a map value") if sub else None
        if isinstance(w, m.RecordRef) and isinstance(r, m.RecordRef):
            wname = self.renamed.get(w.name, w.name) if wm is self.old else w.name
            rname = self.renamed.get(r.name, r.name) if rm is self.old else r.name
            if wname == rname or (w.name, r.name) in seen:
                return None  # one record: its own changes are reported at its fields
            seen.add((w.name, r.name))
            wrec, rrec = wm.record(w.name), rm.record(r.name)
            wfields = {f.name: f for f in wrec.fields}
            for f in rrec.fields:
                g = wfields.get(f.name)
                if g is None or (g.default is not None and f.required):
                    if f.required:
                        return True, f"a '{w.name}' without field '{f.name}'"
                    continue
                sub = self.reads(g.type, f.type, wm, rm, seen)
                if sub:
                    return sub[0], f"{sub[1]} in field '{f.name}' of '{w.name}'"
            return None
        return True, "a record" if isinstance(w, m.RecordRef) else _WHAT[w.family]

    # -- ops -------------------------------------------------------------------------------------

    def ops(self) -> None:
        old_by = {o.name: o for o in self.old.ops}
        new_by = {o.name: o for o in self.new.ops}
        for op in self.new.ops:
            if op.name in old_by:
                self.op(old_by[op.name], op)
            else:
                kind = "notify" if op.notify else "op"
                self.add(SAFE, op.loc, f"{kind} '{op.name}' was added: an old unit refuses it "
                                       "(unknown op), so upgrade units before clients use it; a "
                                       f"unit must set its handler '{self.svc}_handlers.on_"
                                       f"{op.name}'")
        for op in self.old.ops:
            if op.name in new_by:
                continue
            kind = "notify" if op.notify else "op"
            hint = ""
            same = [o.name for o in self.new.ops if o.name not in old_by
                    and _signature(o) == _signature(op, self.as_new)]
            if len(same) == 1:
                hint = f" (renamed to '{same[0]}'? ops are found by name)"
            self.add(WIRE, self.new.service.loc,
                     f"{kind} '{op.name}' was removed{hint}: a call from an old client is "
                     f"{self.refused(op, 'unknown op')}",
                     (op.loc, f"{kind} '{op.name}' was declared here"))
        moved = _order_changed([o.name for o in self.old.ops], [o.name for o in self.new.ops])
        if moved:
            first = next(new_by[b] for a, b in zip(*moved) if a != b)
            self.add(SAFE, first.loc,
                     f"the ops were reordered (now {', '.join(moved[1])}; was "
                     f"{', '.join(moved[0])}): ops are found by name, and the handlers in "
                     f"'{self.svc}_handlers' are members named after them",
                     (old_by[first.name].loc, f"'{first.name}' was declared here"))

    def op(self, old: m.Op, new: m.Op) -> None:
        kind = "notify" if new.notify else "op"
        what = f"{kind} '{new.name}'"
        wo, wn = self.where_old, self.where_new
        if old.notify != new.notify:
            if new.notify:
                why = (f"op '{new.name}' became a notify: an old client waits for a reply that a "
                       "new unit never sends, until its timeout")
            else:
                why = (f"notify '{new.name}' became an op: a new client waits for a reply that "
                       "an old unit never sends, until its timeout")
            self.add(WIRE, wn.keyword_of(new), why,
                     (wo.keyword_of(old),
                      f"it was {'a notify' if old.notify else 'an op'} here"))
        self.members(old.args, new.args, "arg", what, new, new.loc)
        moved = _order_changed([a.name for a in old.args], [a.name for a in new.args])
        if moved:
            self.add(SOURCE, new.loc,
                     f"the args of {what} were reordered (now {', '.join(moved[1])}; was "
                     f"{', '.join(moved[0])}): args travel by name, but the members of "
                     f"'{self.svc}_{new.name}_args' change order, which breaks positional "
                     "initializers and positional calls in other languages",
                     (old.loc, "the old declaration"))
        if old.notify == new.notify and not new.notify:
            self.result(old, new)
            self.raises(old, new)
            self.idempotent(old, new)
        self.doc(old.doc, new.doc, old.loc, new.loc, what)

    def result(self, old: m.Op, new: m.Op) -> None:
        wo, wn = self.where_old, self.where_new
        name = new.name
        if old.result is None and new.result is not None:
            t = new.result
            if isinstance(t, m.OptionalOf):
                self.add(SOURCE, wn.result_of(new),
                         f"op '{name}' now returns '{t.idl}': an old client ignores the result, "
                         "and a new client reads an old unit's nil as absent, but the C "
                         f"function '{self.svc}_{name}' gains a result parameter",
                         (old.loc, f"op '{name}' had no result here"))
            else:
                self.add(WIRE, wn.result_of(new),
                         f"op '{name}' now returns '{t.idl}': a new client calling an old unit "
                         "gets nil, which it refuses",
                         (old.loc, f"op '{name}' had no result here"))
        elif old.result is not None and new.result is None:
            t = old.result
            if isinstance(t, m.OptionalOf):
                self.add(SOURCE, new.loc,
                         f"op '{name}' no longer returns a result: an old client reads the nil "
                         f"it gets as absent, but the C function '{self.svc}_{name}' loses its "
                         "result parameter", (wo.result_of(old), f"it returned '{t.idl}' here"))
            else:
                self.add(WIRE, new.loc,
                         f"op '{name}' no longer returns a result: an old client gets nil, "
                         f"which it refuses where it expects '{t.idl}'",
                         (wo.result_of(old), f"it returned '{t.idl}' here"))
        elif old.result is not None and self.as_new(old.result) != new.result:
            self.type_changed(old.result, new.result, f"the result of op '{name}'", "result",
                              wn.result_of(new), wo.result_of(old))

    def idempotent(self, old: m.Op, new: m.Op) -> None:
        """`idempotent` added or removed. Neither changes the wire or the C API; what changes is
        who retries: clients built from the IDL that says `idempotent` may send the op again
        after a timeout, to any unit. Adding it asks every unit still running, old ones
        included, to bear that (worth a look: source-breaking, for the handlers written
        against the old IDL); removing it only makes new clients stop retrying (safe; old
        clients still retry until they are upgraded)."""
        wo, wn = self.where_old, self.where_new
        name = new.name
        if new.idempotent and not old.idempotent:
            self.add(SOURCE, wn.idempotent_of(new),
                     f"op '{name}' is now idempotent: a new client may send it again after a "
                     "timeout or a failure after the request left (when its retry policy "
                     "allows), to old units too, so the handler of every unit version still "
                     "running must do the same run twice as once; check the old handlers, or "
                     "upgrade the units first",
                     (old.loc, f"op '{name}' was not idempotent here"))
        elif old.idempotent and not new.idempotent:
            self.add(SAFE, new.loc,
                     f"op '{name}' is no longer idempotent: a new client does not retry it "
                     "after a timeout; an old client still may, so keep the handler safe to "
                     "run twice until every client is upgraded",
                     (wo.idempotent_of(old), "it was idempotent here"))

    def raises(self, old: m.Op, new: m.Op) -> None:
        wo, wn = self.where_old, self.where_new
        why = ("every peer reads any kind as a well-formed error (one it does not know as "
               "Protocol), and a unit sends only the kinds its own IDL lists")
        for k in new.raises:
            if k not in old.raises:
                self.add(SAFE, wn.raised(new, k),
                         f"op '{new.name}' now lists '{k}' in 'raises': {why}",
                         (old.loc, f"op '{old.name}' did not list it here"))
        for k in old.raises:
            if k not in new.raises:
                if k in m.ERROR_KINDS:
                    self.add(SAFE, new.loc,
                             f"op '{new.name}' no longer lists '{k}' in 'raises': {why}",
                             (wo.raised(old, k), f"'{k}' was listed here"))
                else:
                    self.add(SOURCE, new.loc,
                             f"op '{new.name}' no longer lists the declared kind '{k}' in "
                             f"'raises': its generated raise helper ({new.name}_raise_{k}) "
                             "is gone, and a handler that still raises it is answered with "
                             "a Protocol error",
                             (wo.raised(old, k), f"'{k}' was listed here"))

    # -- error kinds declared in the IDL -------------------------------------------------------

    def error_kinds(self) -> None:
        """Declared error kinds (`Model.errors`); built-in kinds are the same in both
        versions."""
        def declared(mod: m.Model) -> Dict[str, object]:
            return {k.name: k for k in mod.errors}

        old, new = declared(self.old), declared(self.new)
        svc_loc = self.new.service.loc
        for name, k in new.items():
            loc = getattr(k, "loc", None) or svc_loc
            if name not in old:
                self.add(SAFE, loc, f"error kind '{name}' was added: an old client that gets "
                                    "it treats it as Protocol")
            else:
                before = old[name]
                self.doc(getattr(before, "doc", None), getattr(k, "doc", None),
                         getattr(before, "loc", None) or self.old.service.loc, loc,
                         f"error kind '{name}'")
        for name, k in old.items():
            if name not in new:
                self.add(SOURCE, svc_loc, f"error kind '{name}' was removed: the constant and "
                                          "the exception class generated for it are gone",
                         (getattr(k, "loc", None) or self.old.service.loc,
                          f"error kind '{name}' was declared here"))


def _implicit(x: m.Member) -> str:
    return "" if x.default_written else " (null)"


def _or_omit(refused: Optional[Tuple[bool, str]]) -> Optional[Tuple[bool, str]]:
    if refused is not None and refused[1] == "nil":
        return refused[0], "nil (or leave it out)"
    return refused


def _signature(op: m.Op, rename=lambda t: t) -> Tuple:
    """What an op looks like on the wire, for guessing renames."""
    return (op.notify, tuple((a.name, rename(a.type), a.default is None) for a in op.args),
            rename(op.result))
