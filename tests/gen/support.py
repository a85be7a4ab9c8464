"""Shared helpers for the generator tests: where things are, and running the CLI in-process.

Run the whole suite from the repository root with:

    /usr/bin/python3 -m unittest discover -s tests/gen

The tests need only the Python standard library (no jinja2).
"""

import contextlib
import io
import os
import re
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(os.path.dirname(HERE))
GEN = os.path.join(REPO, "gen")
SCRIPT = os.path.join(GEN, "ctlrpc-gen")
GOOD = os.path.join(HERE, "good")
BAD = os.path.join(HERE, "bad")
STORAGE_IDL = os.path.join(REPO, "idl", "storage.idl")

if GEN not in sys.path:
    sys.path.insert(0, GEN)

from ctlrpc_gen import cli  # noqa: E402

HEADER = re.compile(r"^(?P<path>[^\s:][^:]*):(?P<line>\d+):(?P<col>\d+): "
                    r"(?P<severity>error|warning): (?P<message>.+)$")
CARET = re.compile(r"^[ \t]*\^~*$")
EXPECT = re.compile(r"^//\s*expect:\s*(?P<text>.+?)\s*$")


def run(argv, cwd=None):
    """Run ctlrpc-gen's main() in this process: (status, stdout, stderr)."""
    out, err = io.StringIO(), io.StringIO()
    old = os.getcwd()
    try:
        if cwd:
            os.chdir(cwd)
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            status = cli.main(list(argv))
    finally:
        os.chdir(old)
    return status, out.getvalue(), err.getvalue()


def expectations(path):
    """The `// expect:` lines of a fixture as full diagnostic headers. A bare `L:C: ...` means
    the fixture itself; anything else already names its file (relative to the fixture)."""
    name = os.path.basename(path)
    with open(path, "rb") as f:
        text = f.read().decode("utf-8", "replace")
    out = []
    for line in text.splitlines():
        m = EXPECT.match(line)
        if m:
            t = m.group("text")
            out.append(f"{name}:{t}" if re.match(r"^\d+:\d+: ", t) else t)
    return out


def diagnostics(stderr):
    """Check that stderr is made of well-formed diagnostics; return their header lines.

    Each diagnostic is a header `path:line:col: severity: message`, the source line, and a caret
    line whose caret sits under column `col`. Returns None (and a reason) if the shape is wrong.
    """
    lines = stderr.split("\n")
    if lines and lines[-1] == "":
        lines.pop()
    headers = []
    i = 0
    while i < len(lines):
        m = HEADER.match(lines[i])
        if not m:
            return None, f"line {i + 1} is not a diagnostic header: {lines[i]!r}"
        if i + 2 >= len(lines):
            return None, f"diagnostic {lines[i]!r} lacks its source and caret lines"
        caret = lines[i + 2]
        if not CARET.match(caret):
            return None, f"bad caret line {caret!r} after {lines[i]!r}"
        if caret.index("^") != int(m.group("col")) - 1:
            return None, f"caret at column {caret.index('^') + 1} under {lines[i]!r}"
        headers.append(lines[i])
        i += 3
    return headers, ""
