"""Lexer: IDL text -> a list of tokens, each with its location.

Token kinds:

    ident   [A-Za-z_][A-Za-z0-9_]*    value: the text. Keywords are identifiers too; the parser
                                      gives them meaning by position (so a field may be named 'op').
    int     123  0x7f  -5  -0x10      value: int
    float   1.5  -2e3  1.5e-3         value: float (finite)
    string  "text with \\n escapes"   value: str (escapes decoded)
    punct   { } ( ) < > [ ] , ; : = ? ->
    eof     one, always last          located just after the last token (1:1 if none)

Comments: `// ...` and `/* ... */` are skipped; `/// ...` is a doc comment. Consecutive doc lines
are joined and attached to the next token as `Token.doc`; the parser decides whether that token
starts a declaration that can carry documentation.

Invariants:
- The lexer never raises on bad input. A bad character is reported and skipped; a malformed
  number or string is reported and still yields a token, marked `bad` with value None, so the
  parser sees the shape the user meant and the checker skips the value.
- `after_bad` marks a token that follows a lexical error; the parser does not report a syntax
  error at such a token, since it would only repeat the lexical one.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from typing import List, Optional, Tuple

from .diag import Diagnostics, Loc, printable, shorten

PUNCT = frozenset("{}()<>[],;:=?")

_IDENT = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
_NUMBER = re.compile(r"-?(?:0[xX][0-9A-Fa-f]+|[0-9]+(?:\.[0-9]+)?(?:[eE][+-]?[0-9]+)?)")
_NUMBER_TAIL = re.compile(r"[A-Za-z0-9_.]+")
_WHITESPACE = " \t\r\f\v\ufeff"
_DIGITS = frozenset("0123456789")  # str.isdigit() would also accept non-ASCII digits
# More decimal digits than any f64 (309 before the point) or integer type can hold.
MAX_DECIMAL_DIGITS = 400

_SIMPLE_ESCAPES = {
    '"': '"', "\\": "\\", "'": "'", "n": "\n", "r": "\r", "t": "\t",
    "0": "\0", "a": "\a", "b": "\b", "f": "\f", "v": "\v",
}


@dataclass(frozen=True)
class Doc:
    """A doc comment: its text (the `///` and one following space removed) and where it starts."""

    text: str
    loc: Loc


@dataclass(frozen=True)
class Token:
    kind: str
    text: str
    value: object
    loc: Loc
    end_line: int
    end_col: int  # column just after the token
    first_on_line: bool
    doc: Optional[Doc] = None
    bad: bool = False
    after_bad: bool = False

    def describe(self) -> str:
        """How a message names this token: 'end of file', a quoted text, or 'string "..."'."""
        if self.kind == "eof":
            return "end of file"
        if self.kind == "string":
            text = self.text if len(self.text) <= 20 else self.text[:17] + "..."
            return f"string {printable(text)}"
        return f"'{printable(self.text)}'"


def tokenize(text: str, path: str, diags: Diagnostics) -> List[Token]:
    """The tokens of `text`. A leading byte-order mark is not part of the text: callers strip
    it (`strip_bom`) before registering the source, so that columns start after it."""
    return _Lexer(text, path, diags).run()


def strip_bom(text: str) -> str:
    return text[1:] if text.startswith("\ufeff") else text


class _Lexer:
    def __init__(self, text: str, path: str, diags: Diagnostics) -> None:
        self.text = text
        self.path = path
        self.diags = diags
        self.i = 0
        self.line = 1
        self.line_start = 0
        self.tokens: List[Token] = []
        self.doc_lines: List[str] = []
        self.doc_loc: Optional[Loc] = None
        self.last_token_line = 0
        self.error_pending = False

    # -- positions ---------------------------------------------------------------------------

    def loc(self, i: int, span: int = 1) -> Loc:
        return Loc(self.path, self.line, i - self.line_start + 1, max(1, span))

    def newline(self, i: int) -> None:
        """Account for the '\\n' at index i."""
        self.line += 1
        self.line_start = i + 1

    def error(self, loc: Loc, message: str) -> None:
        self.diags.error(loc, message)
        self.error_pending = True

    # -- driver ------------------------------------------------------------------------------

    def run(self) -> List[Token]:
        text = self.text
        n = len(text)
        while self.i < n:
            ch = text[self.i]
            if ch == "\n":
                self.newline(self.i)
                self.i += 1
            elif ch in _WHITESPACE:
                self.i += 1
            elif text.startswith("//", self.i):
                self.line_comment()
            elif text.startswith("/*", self.i):
                self.block_comment()
            elif ch == '"':
                self.string()
            elif ch in _DIGITS or (ch == "-" and text[self.i + 1:self.i + 2] in _DIGITS):
                self.number()
            elif ch == "-" and text.startswith("->", self.i):
                self.emit("punct", "->", "->", self.i)
            elif ch in PUNCT:
                self.emit("punct", ch, ch, self.i)
            elif ch.isascii() and (ch.isalpha() or ch == "_"):
                m = _IDENT.match(text, self.i)
                self.emit("ident", m.group(), m.group(), self.i)
            else:
                self.error(self.loc(self.i), f"unexpected character {_show_char(ch)}")
                self.i += 1
        self.emit_eof()
        return self.tokens

    def emit(self, kind: str, source: str, value: object, start: int, bad: bool = False) -> None:
        loc = self.loc(start, len(source))
        doc = None
        if self.doc_lines:
            doc = Doc("\n".join(self.doc_lines).strip("\n"), self.doc_loc)
            self.doc_lines, self.doc_loc = [], None
        self.tokens.append(Token(kind, source, value, loc, self.line, loc.col + len(source),
                                 first_on_line=self.last_token_line != self.line, doc=doc,
                                 bad=bad, after_bad=self.error_pending))
        self.error_pending = bad
        self.last_token_line = self.line
        self.i = start + len(source)

    def emit_eof(self) -> None:
        """EOF sits just after the last token, where 'expected ...' carets belong."""
        if self.tokens:
            last = self.tokens[-1]
            line, col = last.end_line, last.end_col
        else:
            line, col = 1, 1
        doc = Doc("\n".join(self.doc_lines), self.doc_loc) if self.doc_lines else None
        self.tokens.append(Token("eof", "", None, Loc(self.path, line, col), line, col,
                                 first_on_line=True, doc=doc, after_bad=self.error_pending))

    # -- comments ----------------------------------------------------------------------------

    def line_comment(self) -> None:
        end = self.text.find("\n", self.i)
        if end < 0:
            end = len(self.text)
        body = self.text[self.i:end].rstrip("\r")
        if body.startswith("///") and not body.startswith("////"):
            line = body[3:]
            if line.startswith(" "):
                line = line[1:]
            if not self.doc_lines:
                self.doc_loc = self.loc(self.i, 3)
            self.doc_lines.append(line.rstrip())
        self.i = end

    def block_comment(self) -> None:
        start_loc = self.loc(self.i, 2)
        end = self.text.find("*/", self.i + 2)
        if end < 0:
            self.error(start_loc, "unterminated comment")
            end = len(self.text)
        else:
            end += 2
        for j in range(self.i, end):
            if self.text[j] == "\n":
                self.newline(j)
        self.i = end

    # -- literals ----------------------------------------------------------------------------

    def number(self) -> None:
        text, start = self.text, self.i
        m = _NUMBER.match(text, start)
        end = m.end()
        tail = _NUMBER_TAIL.match(text, end)
        source = text[start:end]
        if tail:
            source = text[start:tail.end()]
            self.error(self.loc(start, len(source)), f"malformed number '{shorten(source)}'")
            self.emit("int", source, None, start, bad=True)
            return
        digits = source.lstrip("-")
        if len(digits) > 1 and digits[0] == "0" and digits[1].isdigit():
            self.error(self.loc(start, len(source)),
                       f"malformed number '{shorten(source)}' (leading zeros are not allowed)")
            self.emit("int", source, None, start, bad=True)
            return
        if digits[:2] in ("0x", "0X"):
            self.emit("int", source, int(source, 16), start)  # linear time at any length
        elif any(c in digits for c in ".eE"):
            value = float(source)
            mantissa = digits.split("e")[0].split("E")[0]
            if math.isinf(value):
                self.error(self.loc(start, len(source)),
                           f"number '{shorten(source)}' is out of range")
                self.emit("float", source, None, start, bad=True)
            elif value == 0.0 and mantissa.strip("0.") != "":
                self.error(self.loc(start, len(source)),
                           f"number '{shorten(source)}' is out of range (too small: it would "
                           "be 0 as an f64)")
                self.emit("float", source, None, start, bad=True)
            else:
                self.emit("float", source, value, start)
        elif len(digits) > MAX_DECIMAL_DIGITS:
            # Beyond every integer type and beyond f64's range; converting thousands of digits
            # is slow (and refused by Python past 4300), so a stand-in of the same sign and
            # still out of every range takes its place. The checker reports the range.
            sign = -1 if source.startswith("-") else 1
            self.emit("int", source, sign * 10 ** MAX_DECIMAL_DIGITS, start)
        else:
            self.emit("int", source, int(source, 10), start)

    def string(self) -> None:
        text, start = self.text, self.i
        j = start + 1
        out: List[str] = []
        bad = False
        while True:
            if j >= len(text) or text[j] == "\n":
                self.error(self.loc(start), "unterminated string literal")
                self.emit("string", text[start:j].rstrip("\r"), None, start, bad=True)
                self.i = j
                return
            ch = text[j]
            if ch == '"':
                j += 1
                break
            if ch == "\\":
                decoded, length, message = _escape(text, j)
                if message:
                    self.error(self.loc(j, length), message)
                    bad = True
                else:
                    out.append(decoded)
                j += length
                continue
            if (ord(ch) < 0x20 and ch != "\t") or ord(ch) == 0x7F:
                self.error(self.loc(j), f"control character {_show_char(ch)} in string literal "
                                        "(write it as an escape)")
                bad = True
            out.append(ch)
            j += 1
        self.emit("string", text[start:j], None if bad else "".join(out), start, bad=bad)


def _escape(text: str, j: int) -> Tuple[str, int, Optional[str]]:
    """Decode the escape at text[j] == '\\': (value, source length, error message or None)."""
    nxt = text[j + 1] if j + 1 < len(text) else ""
    if nxt in ("", "\n", "\r"):
        return "", 1, None  # the string is unterminated; that error is reported instead
    if nxt in _SIMPLE_ESCAPES:
        return _SIMPLE_ESCAPES[nxt], 2, None
    digits = {"x": 2, "u": 4, "U": 8}.get(nxt)
    if digits is None:
        shown = nxt if nxt and nxt.isprintable() else ""
        return "", 1 + len(shown), f"unknown escape sequence '\\{shown}'"
    hexpart = text[j + 2:j + 2 + digits]
    length = 2 + len(hexpart)
    if len(hexpart) < digits or not all(c in "0123456789abcdefABCDEF" for c in hexpart):
        return "", 2, f"'\\{nxt}' needs exactly {digits} hex digits"
    code = int(hexpart, 16)
    if nxt == "x" and code > 0x7F:
        return "", length, (f"'\\x{hexpart}' is not ASCII; strings are UTF-8, "
                            f"write '\\u{code:04x}' for that character")
    if code > 0x10FFFF or 0xD800 <= code <= 0xDFFF:
        return "", length, f"'\\{nxt}{hexpart}' is not a Unicode character"
    return chr(code), length, None


def _show_char(ch: str) -> str:
    if ch.isprintable() and not ch.isspace():
        return f"'{ch}'"
    return f"U+{ord(ch):04X}"
