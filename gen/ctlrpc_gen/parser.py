"""Parser: tokens -> syntax tree (`ast`), and the loader that follows imports.

Grammar (the full EBNF is in docs/IDL.md):

    file    = { decl } ;
    decl    = service | import | record | [ "idempotent" ] ( op | notify ) | error ;
    service = "service" IDENT ";" ;
    import  = "import" STRING ";" ;
    error   = "error" IDENT ";" ;
    record  = "record" IDENT "{" { IDENT ":" type [ "=" literal ] ";" } "}" ;
    op      = ( "op" | "notify" ) IDENT "(" [ arg { "," arg } [ "," ] ] ")"
              [ "->" type ] [ "raises" IDENT { "," IDENT } ] ";" ;
    type    = ( "list" "<" type ">" | "map" "<" type "," type ">" | IDENT ) { "?" } ;

Keywords are contextual: `service`, `import`, `record`, `op`, `notify`, `error` start a declaration
only where one can start, so `op: str;` is a field named `op` and `op list()` an op named `list`.
`idempotent` is a modifier that starts an op declaration (`idempotent op get(...)`); it is read
on a notify too, so that the checker can explain why it does not fit there.

Error recovery: a syntax error abandons the current field (resuming after its `;`, or at the
record's `}`) or the current declaration (resuming after the next `;` or `}` at its level, or at a
declaration keyword that starts a line). Every abandoned construct reports exactly one error, so
all independent mistakes in a file are reported in one run and cascades are rare. A record whose
name was read is kept even if its body is cut short (marked `incomplete`), so its uses do not turn
into 'unknown type' errors.

Invariants: the parser consumes at least one token per loop iteration (it always terminates),
never raises on user input, and nests at most MAX_DEPTH levels of types and literals, so a hostile
file cannot exhaust the Python stack.

The loader (`load_program`) reads the main file and its imports (paths relative to the importing
file), each file once even if imported twice, and diagnoses unreadable files, invalid UTF-8 and
import cycles.
"""

from __future__ import annotations

import os
from typing import Dict, List, Optional, Set, Tuple

from . import ast
from .diag import Diagnostics, Loc, printable, suggest
from .lexer import Token, strip_bom, tokenize

DECL_KEYWORDS = ("service", "import", "record", "op", "notify", "error", "idempotent")
# Words that can never name a type (so `-> raises` reads as a missing result type). `error`
# is not among them: a record may still be named so.
NOT_TYPES = frozenset(("service", "import", "record", "op", "notify", "raises", "true", "false",
                       "null"))
MAX_DEPTH = 32


class _Bail(Exception):
    """Abandon the current construct after its error was reported."""


class Parser:
    def __init__(self, tokens: List[Token], path: str, diags: Diagnostics) -> None:
        self.toks = tokens
        self.path = path
        self.diags = diags
        self.i = 0
        self.docs_taken: Set[int] = set()
        self.saw_service = False
        self.saw_op = False

    # -- token access ------------------------------------------------------------------------

    def peek(self, k: int = 0) -> Token:
        return self.toks[min(self.i + k, len(self.toks) - 1)]

    def advance(self) -> Token:
        t = self.toks[self.i]
        if t.kind != "eof":
            self.i += 1
        return t

    def prev(self) -> Optional[Token]:
        return self.toks[self.i - 1] if self.i > 0 else None

    def at_punct(self, p: str, k: int = 0) -> bool:
        t = self.peek(k)
        return t.kind == "punct" and t.value == p

    def at_word(self, w: str) -> bool:
        t = self.peek()
        return t.kind == "ident" and t.value == w

    def at_decl_start(self) -> bool:
        """A declaration keyword first on its line, not used as a field name (`op: str;`);
        `idempotent` only before `op` or `notify`, so that a field `idempotent u64;` that
        lacks its `:` is reported as a field."""
        t = self.peek()
        if not (t.first_on_line and self.at_decl_keyword()):
            return False
        n = self.peek(1)
        return t.value != "idempotent" or (n.kind == "ident" and n.value in ("op", "notify"))

    def at_decl_keyword(self) -> bool:
        """A declaration keyword anywhere on its line, not used as a field name."""
        t = self.peek()
        return t.kind == "ident" and t.value in DECL_KEYWORDS and not self.at_punct(":", 1)

    def take_doc(self, t: Token) -> Optional[str]:
        if t.doc is None:
            return None
        self.docs_taken.add(id(t))
        return t.doc.text

    # -- errors ------------------------------------------------------------------------------

    def fail(self, loc: Loc, message: str) -> "_Bail":
        """Report (unless a lexical error already explains this spot) and return _Bail to raise."""
        t, p = self.peek(), self.prev()
        if not (t.after_bad or t.bad or (p is not None and p.bad)):
            self.diags.error(loc, message)
        return _Bail()

    def fail_at(self, t: Token, expected: str) -> "_Bail":
        return self.fail(t.loc, f"expected {expected}, found {t.describe()}")

    def expect(self, p: str, where: str = "") -> Token:
        """Consume punctuation `p` or fail. A missing `;` or `}` at the end of a line is reported
        just after the previous token, where it belongs, like clang does."""
        if self.at_punct(p):
            return self.advance()
        t, prev = self.peek(), self.prev()
        what = f"'{p}'" + (f" {where}" if where else "")
        if p in ";}" and prev is not None and t.loc.line > prev.end_line:
            raise self.fail(Loc(self.path, prev.end_line, prev.end_col), f"expected {what}")
        raise self.fail_at(t, what)

    def expect_ident(self, what: str) -> Token:
        t = self.peek()
        if t.kind == "ident":
            return self.advance()
        raise self.fail_at(t, what)

    # -- recovery ----------------------------------------------------------------------------

    def skip(self) -> Token:
        """Advance past a token of a broken construct; its doc comment goes down with it."""
        self.docs_taken.add(id(self.peek()))
        return self.advance()

    def sync_decl(self) -> None:
        """Skip to the end of the broken declaration (see the module docstring)."""
        depth = 0
        while self.peek().kind != "eof":
            if self.at_decl_start():
                return
            t = self.skip()
            if t.kind != "punct":
                continue
            if t.value in "{([":
                depth += 1
            elif t.value in "})]":
                depth -= 1
                if t.value == "}" and depth <= 0:
                    return
            elif t.value == ";" and depth <= 0:
                return

    def sync_field(self) -> None:
        """Skip to the next field: past a `;`, or up to the record's `}`."""
        depth = 0
        while self.peek().kind != "eof" and not self.at_decl_start():
            if depth == 0 and self.at_punct("}"):
                return
            t = self.skip()
            if t.kind != "punct":
                continue
            if t.value in "{([":
                depth += 1
            elif t.value in ")]}":
                depth = max(0, depth - 1)
            elif t.value == ";" and depth == 0:
                return

    # -- declarations ------------------------------------------------------------------------

    def parse_file(self) -> ast.File:
        decls: List[ast.Decl] = []
        recovering = False
        while self.peek().kind != "eof":
            start = self.i
            if recovering and not self.at_decl_keyword():
                # What is left of a broken declaration after its `;` or `}` (the rest of a
                # record whose `{` was missing, say) is skipped without another error: one
                # mistake, one error.
                self.skip()
                continue
            recovering = False
            try:
                decls.append(self.parse_decl())
            except _Bail:
                self.sync_decl()
                recovering = True
            except _Partial as p:
                decls.append(p.node)
                self.sync_decl()
                recovering = True
            if self.i == start:
                self.advance()
        self.warn_stray_docs()
        return ast.File(self.path, tuple(decls), self.saw_service, self.saw_op)

    def warn_stray_docs(self) -> None:
        for t in self.toks:
            if t.doc is not None and id(t) not in self.docs_taken:
                self.diags.warning(t.doc.loc, "doc comment is not attached to a declaration "
                                              "(service, record, field, op, argument or "
                                              "error)")

    def parse_decl(self) -> ast.Decl:
        t = self.peek()
        if t.kind == "ident" and t.value in DECL_KEYWORDS:
            return getattr(self, "parse_" + t.value)()
        hint = ""
        if t.kind == "ident":
            guess = suggest(t.value, DECL_KEYWORDS)
            hint = f" (did you mean '{guess}'?)" if guess else ""
        raise self.fail(t.loc, "expected a declaration ('service', 'import', 'record', 'op', "
                               f"'notify' or 'error'), found {t.describe()}{hint}")

    def parse_service(self) -> ast.Service:
        kw = self.advance()
        doc = self.take_doc(kw)
        self.saw_service = True
        name = self.expect_ident("service name")
        self.expect(";", "after service declaration")
        return ast.Service(kw.loc, name.loc, name.value, doc)

    def parse_import(self) -> ast.Import:
        kw = self.advance()
        t = self.peek()
        if t.kind != "string":
            raise self.fail_at(t, "a file name in quotes after 'import'")
        self.advance()
        self.expect(";", "after import")
        return ast.Import(kw.loc, t.loc, t.value)

    def parse_error(self) -> ast.ErrorDecl:
        kw = self.advance()
        doc = self.take_doc(kw)
        name = self.expect_ident("error kind name")
        self.expect(";", "after error declaration")
        return ast.ErrorDecl(kw.loc, name.loc, name.value, doc)

    def parse_record(self) -> ast.Record:
        kw = self.advance()
        doc = self.take_doc(kw)
        name = self.expect_ident("record name")
        fields: List[ast.Member] = []
        try:
            self.expect("{", f"after record name '{name.value}'")
            incomplete = False
            while not self.at_punct("}") and self.peek().kind != "eof":
                if self.at_decl_start():
                    break
                try:
                    fields.append(self.parse_member("field"))
                    self.expect(";", "after field")
                except _Bail:
                    incomplete = True
                    self.sync_field()
            self.expect("}", f"to close record '{name.value}'")
        except _Bail:
            raise _Partial(ast.Record(kw.loc, name.loc, name.value, tuple(fields), doc,
                                      incomplete=True))
        return ast.Record(kw.loc, name.loc, name.value, tuple(fields), doc, incomplete)

    def parse_idempotent(self) -> ast.Op:
        """`idempotent op ...` (or `idempotent notify ...`, which the checker refuses)."""
        mod = self.advance()
        doc = self.take_doc(mod)
        self.saw_op = True  # an op was meant: no "declares no ops" on top of its error
        t = self.peek()
        if not (t.kind == "ident" and t.value in ("op", "notify")):
            raise self.fail_at(t, "'op' after 'idempotent' (it marks an op: "
                                  "'idempotent op NAME(...)')")
        return self.parse_op(mod.loc, doc)

    def parse_op(self, idempotent: Optional[Loc] = None, doc: Optional[str] = None) -> ast.Op:
        kw = self.advance()
        if doc is None:  # before the modifier, or (without one) before the keyword
            doc = self.take_doc(kw)
        self.saw_op = True
        notify = kw.value == "notify"
        name = self.expect_ident(f"{kw.value} name")
        self.expect("(", f"after {kw.value} name '{name.value}'")
        args: List[ast.Member] = []
        while not self.at_punct(")"):
            args.append(self.parse_member("argument"))
            if self.at_punct(","):
                self.advance()
                continue
            if not self.at_punct(")"):
                raise self.fail_at(self.peek(), "',' or ')' after argument")
        self.advance()
        result = None
        if self.at_punct("->"):
            self.advance()
            result = self.parse_type(0, "a result type after '->'")
        raises: List[ast.ErrorKindRef] = []
        raises_loc = None
        if self.at_word("raises"):
            raises_loc = self.advance().loc
            while True:
                k = self.expect_ident("an error kind")
                raises.append(ast.ErrorKindRef(k.loc, k.value))
                if not self.at_punct(","):
                    break
                self.advance()
        t = self.peek()
        if not self.at_punct(";") and t.loc.line == self.prev().end_line:
            if raises:
                raise self.fail_at(t, "',' or ';'")
            raise self.fail_at(t, "'raises' or ';'" if result else "'->', 'raises' or ';'")
        self.expect(";", f"after {kw.value} declaration")
        return ast.Op(kw.loc, name.loc, name.value, notify, tuple(args), result, tuple(raises),
                      raises_loc, doc, idempotent)

    def parse_notify(self) -> ast.Op:
        return self.parse_op()

    def parse_member(self, what: str) -> ast.Member:
        name = self.expect_ident(f"{what} name")
        doc = self.take_doc(name)
        self.expect(":", f"after {what} name '{name.value}'")
        typ = self.parse_type(0, "a type")
        default = None
        if self.at_punct("="):
            self.advance()
            default = self.parse_literal(0)
        return ast.Member(name.loc, name.value, typ, default, doc)

    # -- types and literals ------------------------------------------------------------------

    def parse_type(self, depth: int, expected: str) -> ast.TypeExpr:
        t = self.peek()
        if depth > MAX_DEPTH:
            raise self.fail(t.loc, f"type is nested too deeply (more than {MAX_DEPTH} levels)")
        if t.kind != "ident" or t.value in NOT_TYPES:
            raise self.fail_at(t, expected)
        self.advance()
        node: ast.TypeExpr
        if t.value == "list" and self.at_punct("<"):
            self.advance()
            elem = self.parse_type(depth + 1, "a type")
            self.expect(">", "to close 'list<'")
            node = ast.ListType(t.loc, elem)
        elif t.value == "map" and self.at_punct("<"):
            self.advance()
            key = self.parse_type(depth + 1, "a type")
            if not self.at_punct(","):
                raise self.fail_at(self.peek(), "',' and a value type (maps are map<str, T>)")
            self.advance()
            value = self.parse_type(depth + 1, "a type")
            self.expect(">", "to close 'map<'")
            node = ast.MapType(t.loc, key, value)
        else:
            node = ast.NamedType(t.loc, t.value)
        # `T?`, and `T??` for the checker to explain; a longer run of `?` says nothing more and
        # is folded into the second level, so that no input builds a deep tree.
        for level in range(2):
            if not self.at_punct("?"):
                break
            node = ast.OptionalType(self.advance().loc, node)
        while self.at_punct("?"):
            self.advance()
        return node

    def parse_literal(self, depth: int) -> ast.Literal:
        t = self.peek()
        if depth > MAX_DEPTH:
            raise self.fail(t.loc, f"value is nested too deeply (more than {MAX_DEPTH} levels)")
        if t.kind == "ident" and t.value in ("true", "false"):
            self.advance()
            return ast.Literal(t.loc, "bool", t.value == "true", t.value)
        if t.kind == "ident" and t.value == "null":
            self.advance()
            return ast.Literal(t.loc, "null", None, "null")
        if t.kind in ("int", "float"):
            self.advance()
            return ast.Literal(t.loc, t.kind, t.value, t.text, bad=t.bad)
        if t.kind == "string":
            self.advance()
            return ast.Literal(t.loc, "str", t.value, t.text, bad=t.bad)
        if self.at_punct("["):
            return self.parse_container(depth, "[", "]", "list")
        if self.at_punct("{"):
            return self.parse_container(depth, "{", "}", "map")
        hint = ""
        if t.kind == "ident":
            guess = suggest(t.value, ("true", "false", "null"))
            hint = f" (did you mean '{guess}'?)" if guess else ""
        raise self.fail(t.loc, f"expected a default value, found {t.describe()}{hint}")

    def parse_container(self, depth: int, open_: str, close: str, kind: str) -> ast.Literal:
        start = self.advance()
        items: List[object] = []
        while not self.at_punct(close):
            item = self.parse_literal(depth + 1)
            if kind == "map":
                self.expect(":", "between map key and value")
                item = (item, self.parse_literal(depth + 1))
            items.append(item)
            if self.at_punct(","):
                self.advance()
            elif not self.at_punct(close):
                raise self.fail_at(self.peek(), f"',' or '{close}'")
        end = self.advance()
        if kind == "map":
            text = "{" + ", ".join(f"{k.text}: {v.text}" for k, v in items) + "}"
        else:
            text = "[" + ", ".join(i.text for i in items) + "]"
        span = end.end_col - start.loc.col if end.end_line == start.loc.line else 1
        loc = Loc(start.loc.path, start.loc.line, start.loc.col, span)
        return ast.Literal(loc, kind, None, text, tuple(items))


class _Partial(Exception):
    """A declaration cut short by a syntax error, kept for the checker (already reported)."""

    def __init__(self, node: ast.Decl) -> None:
        super().__init__()
        self.node = node


def parse(text: str, path: str, diags: Diagnostics) -> ast.File:
    """Parse one file's text. Diagnostics go to `diags`; the tree holds what could be read.
    A leading byte-order mark is skipped: columns count from the character after it."""
    text = strip_bom(text)
    diags.add_source(path, text)
    return Parser(tokenize(text, path, diags), path, diags).parse_file()


# -- loading a program ------------------------------------------------------------------------


def load_program(path: str, diags: Diagnostics) -> Optional[ast.Program]:
    """Read and parse `path` and everything it imports. None if `path` itself cannot be read."""
    return _Loader(diags).run(path)


class Unreadable(Exception):
    """A file that cannot be read; the message says why."""


class _Loader:
    def __init__(self, diags: Diagnostics) -> None:
        self.diags = diags
        self.by_real: Dict[str, ast.File] = {}
        self.files: List[ast.File] = []
        self.imports: Dict[str, Tuple[str, ...]] = {}
        self.failed: Set[str] = set()  # files with an import that could not be read
        self.stack: List[Tuple[str, str]] = []  # (real, display) of files being loaded

    def run(self, path: str) -> Optional[ast.Program]:
        main = self.load(path, os.path.realpath(path), None)
        if main is None:
            return None
        return ast.Program(main, tuple(self.files), dict(self.imports), self.incomplete())

    def fetch(self, display: str) -> bytes:
        """The bytes of the file `display`; Unreadable says why not. (--against-git reads
        from a git revision instead.)"""
        try:
            with open(display, "rb") as f:
                return f.read()
        except OSError as e:
            raise Unreadable(e.strerror or str(e)) from None

    def read(self, display: str, via: Optional[ast.Import]) -> Optional[str]:
        """The text of `display` (UTF-8), or None after reporting why it cannot be read."""
        try:
            data = self.fetch(display)
        except Unreadable as e:
            if via is None:
                self.diags.error(Loc(display, 0, 0), f"cannot read file: {e}")
            else:
                self.diags.error(via.loc, f"cannot import '{printable(via.path)}': {e}")
            return None
        try:
            return data.decode("utf-8")
        except UnicodeDecodeError as e:
            good = data[:e.start].decode("utf-8")
            line = good.count("\n") + 1
            col = len(good) - (good.rfind("\n") + 1) + 1
            self.diags.add_source(display, data.decode("utf-8", "replace"))
            self.diags.error(Loc(display, line, col),
                             f"invalid UTF-8 (byte 0x{data[e.start]:02x}); IDL files are UTF-8")
            return None

    def open(self, display: str, real: str, via: Optional[ast.Import]) -> Optional[ast.File]:
        """Read and parse one file (None if it cannot be read) and register it as loaded."""
        text = self.read(display, via)
        if text is None:
            return None
        tree = parse(text, display, self.diags)
        self.by_real[real] = tree
        self.files.append(tree)
        return tree

    def load(self, display: str, real: str, via: Optional[ast.Import]) -> Optional[ast.File]:
        """Load a file and, depth-first in the order written, everything it imports. Iterative:
        an import chain as long as the file system allows cannot exhaust the Python stack."""
        tree = self.open(display, real, via)
        if tree is None:
            return None
        # One frame per file being loaded: (display, real, its imports still to follow, the
        # display paths of the files it imports that were read).
        frames = [(tree.path, real, iter(tree.of(ast.Import)), [])]
        self.stack.append((real, tree.path))
        while frames:
            f_display, f_real, pending, targets = frames[-1]
            for imp in pending:
                target = self.follow(imp, f_display, f_real)
                if target is None:
                    continue
                t_tree, t_real, fresh = target
                if t_tree.path not in targets:
                    targets.append(t_tree.path)
                if fresh:
                    frames.append((t_tree.path, t_real, iter(t_tree.of(ast.Import)), []))
                    self.stack.append((t_real, t_tree.path))
                    break
            else:
                frames.pop()
                self.stack.pop()
                self.imports[f_display] = tuple(targets)
        return tree

    def follow(self, imp: ast.Import, display: str, real: str):
        """The file `imp` (in the file `display`) names: (tree, real path, whether it was just
        read and its own imports remain to be followed), or None after reporting why not."""
        if imp.path is None:
            self.failed.add(display)
            return None
        if not imp.path:
            self.diags.error(imp.loc, "empty import path")
            return None
        if "\0" in imp.path:
            self.diags.error(imp.loc, "import path contains a NUL character")
            self.failed.add(display)
            return None
        t_display = os.path.normpath(os.path.join(os.path.dirname(display), imp.path))
        t_real = os.path.realpath(os.path.join(os.path.dirname(real), imp.path))
        reals = [r for r, _ in self.stack]
        if t_real in reals:
            cycle = [printable(d) for _, d in self.stack[reals.index(t_real):]]
            cycle.append(cycle[0])
            if len(cycle) > 9:  # a long chain shows its ends
                cycle[4:-4] = [f"... ({len(cycle) - 9} more) ..."]
            chain = " -> ".join(cycle)
            self.diags.error(imp.loc, f"import cycle: {chain}")
            return None
        if t_real in self.by_real:
            return self.by_real[t_real], t_real, False
        tree = self.open(t_display, t_real, imp)
        if tree is None:
            self.failed.add(display)
            return None
        return tree, t_real, True

    def incomplete(self) -> frozenset:
        """Files that see a failed import, directly or through the files they import."""
        out = set(self.failed)
        changed = True
        while changed:
            changed = False
            for f, targets in self.imports.items():
                if f not in out and any(t in out for t in targets):
                    out.add(f)
                    changed = True
        return frozenset(out)
