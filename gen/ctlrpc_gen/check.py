"""Checker: syntax tree -> validated, frozen `model.Model`.

The checker finds every semantic error in the program and reports each one through `Diagnostics`;
it never stops at the first. It returns a model only when the whole run (parse included) reported
no error, so the render stage never sees a half-valid program. The rules are listed, with the
reasons behind them, in docs/IDL.md; in brief:

- The main file has exactly one `service`, first. Imported files hold only records and imports.
- Names: unique in their scope, not differing from another only in case, usable as bare C
  identifiers (no C or C++ keyword, no macro of the included headers, no leading `_`, no `ctl_`
  prefix, at most cnames.MAX_NAME characters), and such that every C identifier generated from
  them is distinct and not a name the included headers define (cnames.CNames, the one owner of
  generated C names). Ops and records share one scope, since both become `<service>_<name>`.
  The file name must be one a C `#include` can spell.
- Types resolve (with a suggestion when they do not), map keys are `str`, optionals do not nest,
  records are not empty and do not contain themselves without an optional, list or map on the way.
- Defaults fit their type: range for integers, exactness for integers given to f64, `null` only
  for optionals, only empty `[]` and `{}` for lists and maps, none for records.
- Declared error kinds (`error X;`, in the main file or an import) are CamelCase names, unique
  (ignoring case), none of the built-in or runtime kind names (RESERVED_ERROR_NAMES).
- `raises` names known error kinds (built-in or declared), each once, never the implicit
  `Protocol`; notify ops have no result, no raises and are not `idempotent`.

To keep the output readable, the checker stays quiet where a reported error already explains
a problem: unknown names in a file whose imports failed, an empty record whose body had a syntax
error, a service without ops when an op declaration failed to parse.
"""

from __future__ import annotations

from collections import OrderedDict
from typing import Dict, List, Optional, Sequence, Set, Tuple, Union

from . import ast, cnames, model
from .diag import Diagnostics, Loc, did_you_mean, shorten
from .model import ERROR_KINDS, IMPLICIT_ERROR_KIND, RESERVED_ERROR_NAMES, SCALARS

IDL_KEYWORDS = ("service", "import", "record", "op", "notify", "raises", "true", "false", "null")
BUILTIN_TYPE_NAMES = SCALARS + ("list", "map")

# Common spellings from other IDLs and languages, mapped to ours, for 'did you mean'.
TYPE_ALIASES = {
    "string": "str", "bytes": "bin", "binary": "bin", "boolean": "bool",
    "int": "i64", "uint": "u64", "i8": "i32", "i16": "i32", "u8": "u32", "u16": "u32",
    "int32": "i32", "int64": "i64", "uint32": "u32", "uint64": "u64",
    "f32": "f64", "float": "f64", "double": "f64", "array": "list", "dict": "map",
}

def check(program: ast.Program, diags: Diagnostics) -> Optional[model.Model]:
    """Check `program`; the model if no error was reported by any stage so far, else None."""
    return _Checker(program, diags).run()


class _Checker:
    def __init__(self, program: ast.Program, diags: Diagnostics) -> None:
        self.program = program
        self.diags = diags
        self.main = program.main
        self.files = {f.path: f for f in program.files}
        self.service: Optional[ast.Service] = None
        # record name -> (file path, node), first declaration wins
        self.record_decls: Dict[str, Tuple[str, ast.Record]] = {}
        self.visible: Dict[str, Set[str]] = {}
        # declared error kinds by name (check_errors)
        self.errors: "OrderedDict[str, model.ErrorKind]" = OrderedDict()

    def error(self, loc: Loc, message: str) -> None:
        self.diags.error(loc, message)

    # -- driver ------------------------------------------------------------------------------

    def run(self) -> Optional[model.Model]:
        self.check_service()
        self.check_imported_files()
        records = self.records_in_order()
        ops = list(self.main.of(ast.Op))
        unique = self.check_top_names(records, ops)
        for path, rec in records:
            self.record_decls.setdefault(rec.name, (path, rec))
        self.compute_visibility()

        self.errors = self.check_errors()
        checked_records = [self.check_record(path, rec) for path, rec in records]
        checked_ops = [self.check_op(op, i) for i, op in enumerate(ops)]
        self.check_c_names(unique, records, ops, checked_records, checked_ops)
        by_name = OrderedDict()
        for rec in checked_records:
            by_name.setdefault(rec.name, rec)
        self.check_cycles(by_name)

        if self.diags.error_count:
            return None
        return self.build(list(by_name.values()), checked_ops, list(self.errors.values()))

    # -- files and the service ---------------------------------------------------------------

    def check_service(self) -> None:
        main = self.main
        services = main.of(ast.Service)
        if not services:
            if not main.saw_service:
                loc = main.decls[0].start if main.decls else Loc(main.path, 1, 1)
                self.error(loc, "missing 'service' declaration: a service file starts with "
                                "'service NAME;'")
            return
        svc = self.service = services[0]
        if main.decls[0] is not svc:
            self.error(svc.start, "'service' must be the first declaration")
        for dup in services[1:]:
            self.error(dup.start, f"duplicate 'service' declaration (first declared at "
                                f"{svc.loc.where(dup.loc.path)})")
        self.check_name(svc.name, svc.loc, "service")
        if not main.saw_op:
            self.error(svc.loc, f"service '{svc.name}' declares no ops")

    def check_imported_files(self) -> None:
        for f in self.program.files[1:]:
            for d in f.decls:
                if isinstance(d, ast.Service):
                    self.error(d.start, "an imported file cannot declare a service "
                                      "(it may contain only records, errors and imports)")
                elif isinstance(d, ast.Op):
                    kind = "notify" if d.notify else "op"
                    self.error(d.start, f"an imported file cannot declare {kind} "
                                              f"'{d.name}' (it may contain only records, "
                                              "errors and imports)")

    def records_in_order(self) -> List[Tuple[str, ast.Record]]:
        """All records, imported files first (depth-first, in import order), each file's in
        source order."""
        order: List[str] = []
        seen: Set[str] = {self.main.path}
        # Depth-first post-order, iterative: import chains may be as long as the input makes them.
        stack = [(self.main.path, iter(self.program.imports.get(self.main.path, ())))]
        while stack:
            path, targets = stack[-1]
            for target in targets:
                if target not in seen:
                    seen.add(target)
                    stack.append((target, iter(self.program.imports.get(target, ()))))
                    break
            else:
                stack.pop()
                order.append(path)
        return [(p, r) for p in order for r in self.files[p].of(ast.Record)]

    def compute_visibility(self) -> None:
        """A file sees its own records and those of every file it imports, directly or not."""
        for path in self.files:
            names: Set[str] = set()
            stack, seen = [path], {path}
            while stack:
                p = stack.pop()
                names.update(r.name for r in self.files[p].of(ast.Record))
                for t in self.program.imports.get(p, ()):
                    if t not in seen:
                        seen.add(t)
                        stack.append(t)
            self.visible[path] = names

    # -- names -------------------------------------------------------------------------------

    def check_name(self, name: str, loc: Loc, what: str) -> None:
        why = None
        if name.startswith("_"):
            why = "names starting with '_' are reserved in C"
        elif name.lower().startswith("ctl_"):
            why = "the 'ctl_' prefix belongs to the ctlrpc runtime"
        elif what == "service" and name.lower() == "ctl":
            why = "generated names would start with 'ctl_', the ctlrpc runtime's prefix"
        elif len(name) > cnames.MAX_NAME:
            self.error(loc, f"{what} name is longer than {cnames.MAX_NAME} characters")
            return
        elif name in cnames.C_KEYWORDS:
            why = "it is a C keyword"
        elif what in ("field", "argument") and cnames.why_reserved(name, bare=True):
            # Fields and arguments stand alone in C (members, designated initializers); other
            # names only inside longer identifiers, which cnames.CNames checks whole.
            why = "it " + cnames.why_reserved(name, bare=True)
        elif what == "record" and name in BUILTIN_TYPE_NAMES:
            why = "it is a built-in type"
        elif what == "record" and name in IDL_KEYWORDS:
            why = "it is an IDL keyword"
        if why:
            self.error(loc, f"{what} name '{name}' is reserved: {why}")

    def check_scope(self, items: Sequence[Tuple[str, str, Loc]], scope: str = "") -> List[int]:
        """Report duplicates and case-only differences among (kind, name, loc) items of one
        scope; return the indexes of the items that are first of their name."""
        table: Dict[str, Tuple[str, str, Loc]] = {}
        firsts = []
        for i, (kind, name, loc) in enumerate(items):
            prev = table.get(name.lower())
            if prev is None:
                table[name.lower()] = (kind, name, loc)
                firsts.append(i)
                continue
            pkind, pname, ploc = prev
            where = ploc.where(loc.path)
            if pname == name and pkind == kind:
                self.error(loc, f"duplicate {kind} '{name}'{scope} (first declared at {where})")
            elif pkind == kind:
                self.error(loc, f"{kind} '{name}' differs from {kind} '{pname}' ({where}) "
                                "only in case")
            else:
                self.error(loc, f"{kind} '{name}' clashes with {pkind} '{pname}' ({where}): "
                                "ops and records share one namespace, compared ignoring case")
        return firsts

    def check_errors(self) -> "OrderedDict[str, model.ErrorKind]":
        """Declared error kinds of every file (imported files' first, like records), each name
        once. Returns name -> kind for the first declaration of each valid name."""
        decls: List[ast.ErrorDecl] = []
        for f in list(self.program.files[1:]) + [self.main]:
            decls += f.of(ast.ErrorDecl)
        out: "OrderedDict[str, model.ErrorKind]" = OrderedDict()
        seen: Dict[str, ast.ErrorDecl] = {}
        for d in decls:
            why = None
            if d.name in RESERVED_ERROR_NAMES:
                why = ("it is a built-in error kind" if d.name in ERROR_KINDS + (
                    IMPLICIT_ERROR_KIND,) else "the runtime uses it for failures that are "
                    "not error kinds")
            elif not (d.name[:1].isascii() and d.name[:1].isupper()) or "_" in d.name:
                why = "an error kind's name is CamelCase: a capital letter, then letters and "\
                      "digits (it travels on the wire as written)"
            if why:
                self.error(d.loc, f"error kind name '{d.name}' is not allowed: {why}")
                continue
            prev = seen.get(d.name.lower())
            if prev is not None:
                where = prev.loc.where(d.loc.path)
                if prev.name == d.name:
                    self.error(d.loc, f"duplicate error kind '{d.name}' (first declared at "
                                      f"{where})")
                else:
                    self.error(d.loc, f"error kind '{d.name}' differs from '{prev.name}' "
                                      f"({where}) only in case")
                continue
            seen[d.name.lower()] = d
            out[d.name] = model.ErrorKind(d.name, d.loc, d.doc, len(out) + 1)
        return out

    def check_top_names(self, records, ops) -> List[Tuple[str, object]]:
        """Records (imported first) and the main file's ops, in one scope. Returns the first
        declaration of each name as (kind, node)."""
        main_order = {id(d): i for i, d in enumerate(self.main.decls)}
        entries: List[Tuple[Tuple[int, int], str, object]] = []
        for n, (path, rec) in enumerate(records):
            if path == self.main.path:
                key = (1, main_order[id(rec)])
            else:
                key = (0, n)
            entries.append((key, "record", rec))
        entries += [((1, main_order[id(op)]), "op", op) for op in ops]
        entries.sort(key=lambda e: e[0])
        for _, kind, node in entries:
            self.check_name(node.name, node.loc, kind)
        firsts = self.check_scope([(k, n.name, n.loc) for _, k, n in entries])
        return [(entries[i][1], entries[i][2]) for i in firsts]

    def check_c_names(self, unique, records, ops, checked_records, checked_ops) -> None:
        """Every C identifier the generated code would derive from the names declared is
        distinct and free (cnames.CNames); and the file name can name the generated files.
        Runs on what could be checked, each name's first declaration only (duplicates are
        reported already)."""
        if self.service is None:
            return
        stem = cnames.stem_of(self.main.path)
        why = cnames.stem_problem(stem)
        if why:
            self.error(Loc(self.main.path, 0, 0), f"cannot name the generated files after "
                                                  f"this file: {why}; rename it")
        by_node = {id(r): c for (_, r), c in zip(records, checked_records)}
        by_node.update({id(o): c for o, c in zip(ops, checked_ops)})
        firsts = [by_node[id(node)] for _, node in unique]
        recs = [c for c in firsts if isinstance(c, model.Record)]
        op_list = [c for c in firsts if isinstance(c, model.Op)]
        svc = model.Service(self.service.name, self.service.loc, self.service.doc)
        names = cnames.CNames(svc, stem, recs, op_list, _types_used(recs, op_list),
                              self.main.path, list(self.errors.values()))
        seen = set()
        for p in names.problems():
            if (p.loc, p.message) not in seen:
                seen.add((p.loc, p.message))
                self.error(p.loc, p.message)

    # -- types -------------------------------------------------------------------------------

    def resolve(self, t: ast.TypeExpr, path: str) -> Optional[model.Type]:
        """The model type of `t` as seen from file `path`, or None after reporting why not."""
        if isinstance(t, ast.ListType):
            elem = self.resolve(t.elem, path)
            return model.ListOf(elem) if elem else None
        if isinstance(t, ast.MapType):
            key_ok = isinstance(t.key, ast.NamedType) and t.key.name == "str"
            if not key_ok:
                self.error(t.key.loc, f"map keys must be 'str', not '{ast.type_text(t.key)}'")
            value = self.resolve(t.value, path)
            return model.MapOf(value) if value and key_ok else None
        if isinstance(t, ast.OptionalType):
            if isinstance(t.inner, ast.OptionalType):
                self.error(t.loc, f"'{ast.type_text(t)}' nests optionals; nil cannot tell the "
                                  "levels apart, write a single '?'")
                return None
            inner = self.resolve(t.inner, path)
            return model.OptionalOf(inner) if inner else None
        name = t.name
        if name in SCALARS:
            return model.Scalar(name)
        if name == "list":
            self.error(t.loc, "'list' needs an element type, as in 'list<str>'")
            return None
        if name == "map":
            self.error(t.loc, "'map' needs key and value types, as in 'map<str, u64>'")
            return None
        if name in self.visible.get(path, ()):
            return model.RecordRef(name)
        if name in self.record_decls:
            where = self.record_decls[name][0]
            self.error(t.loc, f"record '{name}' is declared in '{where}', which this file does "
                              "not import")
            return None
        if path not in self.program.incomplete:
            if name in TYPE_ALIASES:
                hint = f" (did you mean '{TYPE_ALIASES[name]}'?)"
            else:
                hint = did_you_mean(name, BUILTIN_TYPE_NAMES + tuple(self.visible.get(path, ())))
            self.error(t.loc, f"unknown type '{name}'{hint}")
        return None

    # -- records and ops ---------------------------------------------------------------------

    def check_members(self, members: Sequence[ast.Member], what: str, owner: str,
                      path: str, cls) -> List[model.Member]:
        for m in members:
            self.check_name(m.name, m.loc, what)
        self.check_scope([(what, m.name, m.loc) for m in members], f" in {owner}")
        out = []
        for m in members:
            typ = self.resolve(m.type, path)
            default, written = self.check_default(m, typ, what)
            out.append(cls(m.name, m.loc, m.doc, typ, default, written))
        return out

    def check_record(self, path: str, rec: ast.Record) -> model.Record:
        if not rec.fields and not rec.incomplete:
            self.error(rec.loc, f"record '{rec.name}' has no fields")
        fields = self.check_members(rec.fields, "field", f"record '{rec.name}'", path,
                                    model.Field)
        return model.Record(rec.name, rec.loc, rec.doc, tuple(fields), False, ())

    def check_op(self, op: ast.Op, index: int) -> model.Op:
        kind = "notify" if op.notify else "op"
        args = self.check_members(op.args, "argument", f"{kind} '{op.name}'", self.main.path,
                                  model.Arg)
        result = self.resolve(op.result, self.main.path) if op.result else None
        if op.notify and op.result is not None:
            self.error(op.result.loc, f"notify '{op.name}' cannot have a result: the unit "
                                      "sends no reply")
        if op.notify and op.raises_loc is not None:
            self.error(op.raises_loc, f"notify '{op.name}' cannot raise errors: the unit "
                                      "sends no reply")
        if op.notify and op.idempotent is not None:
            self.error(op.idempotent, f"notify '{op.name}' cannot be idempotent: the unit sends "
                                      "no reply, so a client never learns that it failed and "
                                      "never retries it (write 'idempotent op' for an op that "
                                      "replies)")
        raises: List[str] = []
        if not op.notify:
            for k in op.raises:
                if k.name == IMPLICIT_ERROR_KIND:
                    self.error(k.loc, "'Protocol' is implicit on every op; do not list it in "
                                      "'raises'")
                elif k.name not in ERROR_KINDS and k.name not in self.errors:
                    known = ERROR_KINDS + tuple(self.errors)
                    hint = did_you_mean(k.name, known) or (
                        f" (expected {', '.join(known[:-1])} or {known[-1]}, or a kind "
                        "declared with 'error NAME;')")
                    self.error(k.loc, f"unknown error kind '{k.name}'{hint}")
                elif k.name in raises:
                    self.error(k.loc, f"error kind '{k.name}' is listed twice")
                else:
                    raises.append(k.name)
        return model.Op(op.name, op.loc, op.doc, index, op.notify, tuple(args), result,
                        tuple(raises), op.idempotent is not None and not op.notify)

    # -- defaults ----------------------------------------------------------------------------

    def check_default(self, m: ast.Member, typ: Optional[model.Type],
                      what: str) -> Tuple[Optional[model.Value], bool]:
        """(default value or None, whether the IDL wrote it). Optionals default to null."""
        lit = m.default
        if lit is None:
            return (model.NULL if isinstance(typ, model.OptionalOf) else None), False
        if typ is None or _has_bad(lit):
            return None, True
        optional = isinstance(typ, model.OptionalOf)
        inner = typ.inner if optional else typ
        if lit.kind == "null":
            if optional:
                return model.NULL, True
            self.error(lit.loc, f"{what} '{m.name}' is not optional ({typ.idl}), so it cannot "
                                "default to null")
            return None, True
        if isinstance(inner, model.RecordRef):
            self.error(lit.loc, f"{what} '{m.name}' is a record ({inner.name}); only an "
                                "optional record can have a default, and only null")
            return None, True
        value = _default_value(lit, inner)
        if isinstance(value, str):
            self.error(lit.loc, value)
            return None, True
        if value is None:
            expected = _expected(inner) + (" or null" if optional else "")
            self.error(lit.loc, f"default for {what} '{m.name}' must be {expected}, "
                                f"not {_found(lit)}")
        return value, True

    # -- record cycles -----------------------------------------------------------------------

    def check_cycles(self, records: "OrderedDict[str, model.Record]") -> None:
        """A record holding itself through fields of plain record type only would be infinite:
        report each such cycle once, at the first record on it in declaration order."""
        direct = {name: [(f.name, f.type.name) for f in rec.fields
                         if isinstance(f.type, model.RecordRef) and f.type.name in records]
                  for name, rec in records.items()}
        reported: Set[str] = set()
        for name, rec in records.items():
            if name in reported:
                continue
            path = _find_cycle(name, direct)
            if path is None:
                continue
            reported.update(r for r, _ in path)
            chain = " -> ".join(f"{r}.{f}" for r, f in path) + f" -> {name}"
            first_field = next(f for f in rec.fields if f.name == path[0][1])
            self.error(first_field.loc, f"record '{name}' contains itself: {chain} (make one of "
                                        "these fields optional, a list or a map)")

    # -- the model ---------------------------------------------------------------------------

    def build(self, records: List[model.Record], ops: List[model.Op],
              errors: Sequence[model.ErrorKind] = ()) -> model.Model:
        names = [r.name for r in records]
        mentions = {r.name: _mentions(r) for r in records}
        edges_all = {n: [(None, d) for d in mentions[n]] for n in names}
        records = [model.Record(r.name, r.loc, r.doc, r.fields,
                                _find_cycle(r.name, edges_all) is not None,
                                tuple(mentions[r.name])) for r in records]
        by_name = {r.name: r for r in records}

        def held_by_value(rec: model.Record) -> List[str]:
            # Only a plain record field holds another struct; an optional record is a pointer
            # (and counting it could put a struct before one it holds, by declaration order).
            return [f.type.name for f in rec.fields if isinstance(f.type, model.RecordRef)]

        # Depth-first post-order, iterative so that long chains of records cannot exhaust the
        # Python stack.
        order: List[model.Record] = []
        done: Set[str] = set()
        for rec in records:
            if rec.name in done:
                continue
            done.add(rec.name)
            stack = [(rec, iter(held_by_value(rec)))]
            while stack:
                node, deps = stack[-1]
                for dep in deps:
                    if dep not in done:
                        done.add(dep)
                        stack.append((by_name[dep], iter(held_by_value(by_name[dep]))))
                        break
                else:
                    stack.pop()
                    order.append(node)

        svc = model.Service(self.service.name, self.service.loc, self.service.doc)
        return model.Model(
            path=self.main.path,
            files=tuple(f.path for f in self.program.files),
            service=svc,
            records=tuple(records),
            records_by_dependency=tuple(order),
            ops=tuple(ops),
            op_index=tuple(sorted(ops, key=lambda o: o.name.encode("utf-8"))),
            types=tuple(_types_used(records, ops)),
            errors=tuple(errors),
        )


# -- helpers ----------------------------------------------------------------------------------


def _has_bad(lit: ast.Literal) -> bool:
    if lit.bad:
        return True
    for item in lit.items:
        parts = item if isinstance(item, tuple) else (item,)
        if any(_has_bad(p) for p in parts):
            return True
    return False


def _default_value(lit: ast.Literal, t: model.Type) -> Union[model.Value, str, None]:
    """The checked value of `lit` for non-optional, non-record type `t`; an error message if
    the kind fits but the value does not; None if the kind does not fit."""
    if isinstance(t, (model.ListOf, model.MapOf)):
        kind = "list" if isinstance(t, model.ListOf) else "map"
        if lit.kind != kind:
            return None
        if lit.items:
            empty = "[]" if kind == "list" else "{}"
            return f"only an empty {kind} '{empty}' can be a default"
        return model.Value(kind, None, lit.text)
    n = t.name
    if n == "bool" and lit.kind == "bool":
        return model.Value("bool", lit.value, lit.text)
    if t.int_range and lit.kind == "int":
        lo, hi = t.int_range
        if not lo <= lit.value <= hi:
            return f"default {shorten(lit.text)} is out of range for {n} ({lo} to {hi})"
        return model.Value("int", lit.value, lit.text)
    if n == "f64" and lit.kind == "float":
        return model.Value("float", lit.value, lit.text)
    if n == "f64" and lit.kind == "int":
        try:
            exact = float(lit.value) == lit.value
        except OverflowError:
            exact = False
        if not exact:
            return f"default {shorten(lit.text)} is not exactly representable as f64"
        return model.Value("float", float(lit.value), lit.text)
    if n == "str" and lit.kind == "str":
        return model.Value("str", lit.value, lit.text)
    if n == "bin" and lit.kind == "str":
        return model.Value("bin", lit.value.encode("utf-8"), lit.text)
    return None


def _types_used(records: Sequence[model.Record], ops: Sequence[model.Op]) -> List[model.Type]:
    """Every distinct type of a field, argument or result, inner types first, in first-use
    order (records, then ops). Unresolved types (None) are left out."""
    seen: "OrderedDict[model.Type, None]" = OrderedDict()

    def use(t: Optional[model.Type]) -> None:
        if t is None or t in seen:
            return
        for c in model.children(t):
            use(c)
        seen[t] = None

    for rec in records:
        for f in rec.fields:
            use(f.type)
    for op in ops:
        for a in op.args:
            use(a.type)
        use(op.result)
    return list(seen)


def _expected(t: model.Type) -> str:
    if isinstance(t, model.ListOf):
        return "'[]'"
    if isinstance(t, model.MapOf):
        return "'{}'"
    return {"bool": "true or false", "f64": "a number", "str": "a string",
            "bin": "a string (its UTF-8 bytes)"}.get(t.name, "an integer")


def _found(lit: ast.Literal) -> str:
    return {"bool": "a boolean", "int": "an integer", "float": "a float", "str": "a string",
            "list": "a list", "map": "a map"}[lit.kind]


def _mentions(rec: model.Record) -> List[str]:
    out: List[str] = []

    def walk(t: model.Type) -> None:
        if isinstance(t, model.RecordRef) and t.name not in out:
            out.append(t.name)
        for c in model.children(t):
            walk(c)

    for f in rec.fields:
        walk(f.type)
    return out


def _find_cycle(start: str, edges: Dict[str, List[Tuple[object, str]]]
                ) -> Optional[List[Tuple[str, object]]]:
    """A shortest path start -> ... -> start along `edges` (name -> [(label, target)]), as
    [(node, label), ...], or None. Breadth-first, edges in order: deterministic."""
    parent: Dict[str, Tuple[str, object]] = {}
    queue = [start]
    seen = {start}
    while queue:
        nxt = []
        for node in queue:
            for label, target in edges.get(node, ()):
                if target == start:
                    path = [(node, label)]
                    while path[0][0] != start:
                        path.insert(0, parent[path[0][0]])
                    return path
                if target not in seen:
                    seen.add(target)
                    parent[target] = (node, label)
                    nxt.append(target)
        queue = nxt
    return None
