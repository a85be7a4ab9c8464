"""Diagnostics: source locations, messages, and their compiler-style rendering.

Every stage reports user mistakes through one `Diagnostics` collector instead of raising, so that
one run reports every error in every file it read. Python exceptions escaping a stage are therefore
always bugs in the generator; the CLI reports them as internal errors, never as diagnostics.

Rendering (what a user sees, on stderr):

    storage.idl:12:17: error: unknown type 'strng' (did you mean 'str'?)
    op put(key: strng, data: bin) -> u64;
                ^~~~~

- `line` and `col` are 1-based; `col` counts characters (code points), a tab counts as one. The
  caret line repeats the tabs of the source line so the caret lines up in a terminal.
- Diagnostics are printed sorted by (file in load order, line, col), ties in report order, so the
  output does not depend on which stage found what first. The output is deterministic.
- A location with line 0 denotes a whole file (for example one that cannot be read); it renders as
  `path: error: message` with no source line.
- A diagnostic may carry notes (`path:line:col: note: ...`, each with its source and caret lines),
  printed right after it whatever file they point into; `ctlrpc-gen --against` uses them to point
  at the old version of a declaration. A diagnostic may itself be a note.

Exit status is the CLI's business (1 if any error was reported); warnings never change it.
"""

from __future__ import annotations

import difflib
from dataclasses import dataclass
from typing import Dict, Iterable, List, Optional, Sequence, Tuple


@dataclass(frozen=True)
class Loc:
    """A position in an IDL file: `path` as displayed to the user, 1-based `line` and `col`.

    `span` is how many characters the caret underlines (at least 1). `path` is never made
    absolute by the generator: it is the path given on the command line, or an import's path
    joined to its importer's directory.
    """

    path: str
    line: int
    col: int
    span: int = 1

    def __str__(self) -> str:
        if self.line <= 0:
            return printable(self.path)
        return f"{printable(self.path)}:{self.line}:{self.col}"

    def where(self, other_path: str) -> str:
        """Point at this location from a message about `other_path`: 'line 4' or 'a.idl:4'."""
        if self.path == other_path:
            return f"line {self.line}"
        return f"{printable(self.path)}:{self.line}"


@dataclass(frozen=True)
class Diagnostic:
    severity: str  # 'error', 'warning' or 'note'
    loc: Loc
    message: str
    notes: Tuple["Diagnostic", ...] = ()  # shown right after it, in this order


class FatalError(Exception):
    """A user-facing failure outside any IDL text (unwritable output directory, missing jinja2).

    The CLI prints it as `ctlrpc-gen: error: <message>` and exits with status 1. Later stages
    (render) raise it; it is never used for mistakes in IDL files, which go to `Diagnostics`.
    """


class Diagnostics:
    """Collects diagnostics and the source text needed to show them."""

    def __init__(self) -> None:
        self._items: List[Diagnostic] = []
        self._lines: Dict[str, List[str]] = {}
        self._order: Dict[str, int] = {}

    def add_source(self, path: str, text: str) -> None:
        """Register a file's text (for source lines) and its position in the output order."""
        self._order.setdefault(path, len(self._order))
        self._lines[path] = [line.rstrip("\r") for line in text.split("\n")]

    def error(self, loc: Loc, message: str) -> None:
        self._items.append(Diagnostic("error", loc, message))

    def warning(self, loc: Loc, message: str) -> None:
        self._items.append(Diagnostic("warning", loc, message))

    def add(self, severity: str, loc: Loc, message: str,
            notes: Sequence[Tuple[Loc, str]] = ()) -> None:
        """A diagnostic of any severity ('error', 'warning' or 'note') with notes, each a
        (location, message) pair."""
        self._items.append(Diagnostic(severity, loc, message,
                                      tuple(Diagnostic("note", l, m) for l, m in notes)))

    @property
    def error_count(self) -> int:
        return sum(1 for d in self._items if d.severity == "error")

    def sorted(self) -> List[Diagnostic]:
        indexed = list(enumerate(self._items))
        indexed.sort(key=lambda p: (self._order.get(p[1].loc.path, len(self._order)),
                                    p[1].loc.line, p[1].loc.col, p[0]))
        return [d for _, d in indexed]

    def render(self) -> str:
        """All diagnostics as text: a header line, then the source line and a caret line."""
        out: List[str] = []
        for d in self.sorted():
            for one in (d,) + d.notes:
                out.append(f"{one.loc}: {one.severity}: {one.message}")
                if one.loc.line <= 0:
                    continue
                lines = self._lines.get(one.loc.path, [])
                source = lines[one.loc.line - 1] if one.loc.line <= len(lines) else ""
                out.append(source)
                out.append(_caret_line(source, one.loc.col, one.loc.span))
        return "".join(line + "\n" for line in out)


def _caret_line(source: str, col: int, span: int) -> str:
    lead = "".join("\t" if ch == "\t" else " " for ch in source[: col - 1])
    lead += " " * max(0, col - 1 - len(source))
    room = len(source) - (col - 1)
    return lead + "^" + "~" * max(0, min(span, room) - 1)


_ESCAPES = {"\n": "\\n", "\r": "\\r", "\t": "\\t"}


def printable(text: str) -> str:
    """`text` with non-printable characters escaped, for quoting user text inside a message
    (a raw newline there would break the one-line diagnostic header) or a generated comment.
    Control, format (bidi controls included), separator and unassigned characters become
    `\\xHH` or `\\uHHHH`; a file name's undecodable byte (a surrogate escape, as os.fsdecode
    gives) becomes `\\xHH` of that byte."""
    out = []
    for ch in text:
        o = ord(ch)
        if ch.isprintable():
            out.append(ch)
        elif ch in _ESCAPES:
            out.append(_ESCAPES[ch])
        elif 0xDC80 <= o <= 0xDCFF:
            out.append(f"\\x{o - 0xDC00:02x}")
        else:
            out.append(f"\\x{o:02x}" if o < 0x100 else f"\\u{o:04x}" if o < 0x10000
                       else f"\\U{o:08x}")
    return "".join(out)


def shorten(text: str, limit: int = 40) -> str:
    """`text` cut to about `limit` characters for a message (a literal may be thousands of
    characters long): its start, '...', and how long it is."""
    if len(text) <= limit:
        return text
    return f"{text[:limit - 16]}... ({len(text)} characters)"


def suggest(name: str, candidates: Iterable[str]) -> Optional[str]:
    """The candidate the user most likely meant by `name`, or None.

    A candidate equal to `name` ignoring case wins; otherwise difflib's closest match above a fixed
    cutoff. Candidates are sorted first, so ties resolve the same way on every run.
    """
    pool = sorted(set(candidates))
    for c in pool:
        if c.lower() == name.lower() and c != name:
            return c
    hits = difflib.get_close_matches(name, pool, n=1, cutoff=0.6)
    return hits[0] if hits else None


def did_you_mean(name: str, candidates: Iterable[str]) -> str:
    """' (did you mean 'X'?)' or '' -- ready to append to a message."""
    hit = suggest(name, candidates)
    return f" (did you mean '{hit}'?)" if hit else ""
