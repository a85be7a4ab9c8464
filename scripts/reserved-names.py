#!/usr/bin/env python3
"""Collect every name the headers of generated code define, for gen/ctlrpc_gen/reserved_names.txt.

Generated code includes <stdbool.h>, <stddef.h>, <stdint.h>, <ctlrpc/ctlrpc.h> and
<ctlrpc/gen.h> (and through them msgpack.h, pthread.h, ...), from C and from C++. A generated
identifier equal to a name those headers define would not compile, so ctlrpc-gen refuses IDL
that would produce one (gen/ctlrpc_gen/cnames.py); this script is where its list comes from.
It asks each compiler found to preprocess a file that includes exactly those headers, as C and
as C++, and reads from the output:

    macro    an object-like macro (#define N ...)        from -dD
    fmacro   a function-like macro (#define N(...) ...)  from -dD
    id       an identifier at file scope: a declared function, variable or typedef, an enum
             constant, or a name used in such a declaration (a type specifier, say). Names
             inside parentheses (parameters, attributes) and inside struct bodies (members)
             do not count: they cannot meet a generated name.
    tag      a struct, union or enum tag

Names starting with '_' are left out: no IDL name can start with one, so no generated name can.
The list only grows: names collected on other systems stay (a name reserved on one platform is
reserved for all, since generated code must compile everywhere).

    scripts/reserved-names.py [-I DIR ...]           add what this system defines to the list
    scripts/reserved-names.py --check [-I DIR ...]   fail if this system defines a name the
                                                     list lacks (the ctest gen_reserved_names)
"""

import argparse
import os
import re
import shutil
import subprocess
import sys
import tempfile

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DATA = os.path.join(REPO, "gen", "ctlrpc_gen", "reserved_names.txt")
HEADERS = ("stdbool.h", "stddef.h", "stdint.h", "ctlrpc/ctlrpc.h", "ctlrpc/gen.h")
COMPILERS = (("gcc", "c"), ("clang", "c"), ("g++", "c++"), ("clang++", "c++"))

_TOKEN = re.compile(r'"(?:\\.|[^"\\])*"|\'(?:\\.|[^\'\\])*\'|[A-Za-z_][A-Za-z0-9_]*'
                    r"|\d[\w.]*|::|->|\S")
_LINEMARK = re.compile(r'^#\s*(?:line\s+)?\d+\s+"((?:\\.|[^"\\])*)"')
_DEFINE = re.compile(r"^#\s*define\s+([A-Za-z_][A-Za-z0-9_]*)(\()?")
_IDENT = re.compile(r"[A-Za-z_][A-Za-z0-9_]*$")


def header_name(path):
    """A header as an #include would name it: '/usr/include/x86_64-linux-gnu/bits/types.h' ->
    'bits/types.h'."""
    if path.startswith("<"):
        return path
    p = path.replace("\\", "/")
    if "/include/" in p:
        p = p.rsplit("/include/", 1)[1]
        first, _, rest = p.partition("/")
        if rest and re.match(r"^[a-z0-9_]+-[a-z0-9_]+-[a-z0-9_-]+$", first):  # multiarch dir
            p = rest
    return p


def preprocess(cc, lang, includes):
    with tempfile.TemporaryDirectory() as tmp:
        src = os.path.join(tmp, "names." + ("c" if lang == "c" else "cpp"))
        with open(src, "w") as f:
            f.writelines(f"#include <{h}>\n" for h in HEADERS)
        argv = [cc, "-E", "-dD", *[f"-I{d}" for d in includes], src]
        proc = subprocess.run(argv, capture_output=True, text=True, env=dict(os.environ, LC_ALL="C"))
        if proc.returncode != 0:
            sys.exit(f"reserved-names: {' '.join(argv)} failed:\n{proc.stderr}")
        return proc.stdout


def collect_output(text, names):
    """Add the names in one compiler's -E -dD output to `names` (name -> [kinds, header])."""
    header = "<built-in>"
    code = []  # (header, token)

    def add(name, kind, where):
        if name.startswith("_") or not _IDENT.match(name):
            return
        entry = names.setdefault(name, [set(), header_name(where)])
        entry[0].add(kind)

    for line in text.splitlines():
        m = _LINEMARK.match(line)
        if m:
            header = m.group(1)
            continue
        m = _DEFINE.match(line)
        if m:
            add(m.group(1), "fmacro" if m.group(2) else "macro", header)
            continue
        if line.startswith("#"):
            continue
        code.extend((header, t) for t in _TOKEN.findall(line))
    _declarations(code, add)


def _declarations(code, add):
    """File-scope names of a token stream (see the module docstring for what counts)."""
    # Each open brace: 'scope' (extern "C" {, namespace {: still file scope), 'enum' (its
    # constants are file-scope names), or 'body' (struct members, function bodies,
    # initializers: skipped).
    braces = []
    parens = 0
    prev = [None, None, None]
    for where, tok in code:
        file_scope = all(b == "scope" for b in braces)
        in_enum = bool(braces) and braces[-1] == "enum" and all(b == "scope" for b in braces[:-1])
        if _IDENT.match(tok):
            if prev[-1] in ("struct", "union", "enum", "class"):
                add(tok, "tag", where)
            elif file_scope and parens == 0:
                add(tok, "id", where)
            elif file_scope and parens >= 1 and prev[-1] == "*" and prev[-2] == "(":
                add(tok, "id", where)  # (*name): a function pointer, or a function returning one
            elif in_enum and parens == 0 and prev[-1] in ("{", ","):
                add(tok, "id", where)
        elif tok == "(":
            parens += 1
        elif tok == ")":
            parens = max(0, parens - 1)
        elif tok == "{":
            window = [t for t in prev if t is not None]
            if window[-1:] == ['"C"'] or window[-1:] == ['"C++"'] or "namespace" in window[-2:]:
                braces.append("scope")
            elif "enum" in window[-2:]:
                braces.append("enum")
            else:
                braces.append("body")
        elif tok == "}":
            if braces:
                braces.pop()
        prev = prev[1:] + [tok]


def collect(includes):
    names = {}
    found = []
    for cc, lang in COMPILERS:
        path = shutil.which(cc)
        if path:
            found.append(cc)
            collect_output(preprocess(path, lang, includes), names)
    if not found:
        sys.exit("reserved-names: no C compiler found (gcc, clang, g++, clang++)")
    return names, found


def read_data(path=DATA):
    names = {}
    with open(path, encoding="utf-8") as f:
        for line in f:
            if line.startswith("#") or not line.strip():
                continue
            name, kinds, header = line.split()
            names[name] = [set(kinds.split(",")), header]
    return names


def write_data(names, path=DATA):
    lines = [
        "# Names the headers of generated code define: name, kinds, the header that defines it.\n",
        "# Written by scripts/reserved-names.py (see it for the kinds); do not edit.\n",
    ]
    for name in sorted(names):
        kinds, header = names[name]
        lines.append(f"{name} {','.join(sorted(kinds))} {header}\n")
    with open(path, "w", encoding="utf-8") as f:
        f.writelines(lines)


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--check", action="store_true", help="compare instead of writing")
    p.add_argument("-I", dest="includes", action="append", default=[],
                   help="an include directory (the runtime's headers are always searched)")
    args = p.parse_args()
    includes = [os.path.join(REPO, "runtime", "include")] + args.includes
    fresh, compilers = collect(includes)
    try:
        known = read_data()
    except FileNotFoundError:
        known = {}
    missing = {n: e for n, e in fresh.items()
               if n not in known or not e[0] <= known[n][0]}
    if args.check:
        if missing:
            shown = ", ".join(sorted(missing)[:20]) + (" ..." if len(missing) > 20 else "")
            sys.exit(f"reserved-names: the headers define {len(missing)} names "
                     f"{os.path.relpath(DATA, REPO)} lacks ({shown}); run "
                     "scripts/reserved-names.py to add them")
        print(f"reserved-names: {len(fresh)} names from {', '.join(compilers)}, all listed")
        return
    for name, (kinds, header) in fresh.items():
        entry = known.setdefault(name, [set(), header])
        entry[0] |= kinds
    write_data(known)
    print(f"reserved-names: {len(known)} names ({len(missing)} new) from {', '.join(compilers)}")


if __name__ == "__main__":
    main()
