"""Compiling generated code from the generator's tests: each of gcc, clang, g++ and clang++ that
is installed checks a batch of generated file pairs in one invocation (-fsyntax-only).

For each pair `<stem>.ctl.c` / `<stem>.ctl.h` in its own directory:
- C compilers (-std=c11) check the .c and a .c that includes only the header, twice;
- C++ compilers (-std=c++11) check a .cpp that includes only the header, twice;
all under -Wall -Wextra -Werror -pedantic. The header's include path and msgpack's come from
$CTLRPC_TEST_INCLUDES (os.pathsep-separated, set by CMake) or default to the repository's
runtime headers and the system's.
"""

import os
import re
import shutil
import subprocess

import support

C_FLAGS = ["-std=c11", "-Wall", "-Wextra", "-Werror", "-pedantic", "-fsyntax-only"]
CXX_FLAGS = ["-std=c++11", "-Wall", "-Wextra", "-Werror", "-pedantic", "-fsyntax-only"]
COMPILERS = [("gcc", "c"), ("clang", "c"), ("g++", "c++"), ("clang++", "c++")]


def include_dirs():
    env = os.environ.get("CTLRPC_TEST_INCLUDES")
    dirs = [d for d in env.split(os.pathsep) if d] if env else []
    return [os.path.join(support.REPO, "runtime", "include")] + dirs


def available():
    """[(compiler path, language)] of the compilers installed."""
    out = []
    for name, lang in COMPILERS:
        path = shutil.which(name)
        if path:
            out.append((path, lang))
    return out


def prepare(out_dir, stem):
    """Write the header-only test sources next to a generated pair; return their paths."""
    text = (f'#include "{stem}.ctl.h"\n#include "{stem}.ctl.h"\n'
            "int ctlrpc_header_only(void);\n"
            "int ctlrpc_header_only(void) { return 0; }\n")
    paths = {}
    for ext in ("c", "cpp"):
        path = os.path.join(out_dir, f"header_only.{ext}")
        with open(path, "w", encoding="utf-8") as f:
            f.write(text)
        paths[ext] = path
    return paths


def compile_batch(pairs, compilers=None, timeout=600):
    """Compile generated pairs [(out_dir, stem)] with every available compiler. Returns a list
    of failures (compiler, out_dir, message): the directories whose files the compiler refused
    (or all of them, if its output names none)."""
    failures = []
    incs = include_dirs()
    for cc, lang in compilers if compilers is not None else available():
        sources = []
        for out_dir, stem in pairs:
            extra = prepare(out_dir, stem)
            if lang == "c":
                sources += [os.path.join(out_dir, f"{stem}.ctl.c"), extra["c"]]
            else:
                sources.append(extra["cpp"])
        flags = C_FLAGS if lang == "c" else CXX_FLAGS
        argv = [cc, *flags, *[f"-I{d}" for d in incs]]
        # Each pair's directory on the include path would let one pair's header shadow
        # another's of the same name; so compile each source with its own directory, which
        # quoted includes search first.
        proc = subprocess.run(argv + sources, capture_output=True, timeout=timeout,
                              env=dict(os.environ, LC_ALL="C"))
        if proc.returncode == 0:
            continue
        text = proc.stderr.decode("utf-8", "replace")
        named = [(d, s) for d, s in pairs if re.search(re.escape(d + os.sep), text)]
        for out_dir, stem in named or pairs:
            failures.append((os.path.basename(cc), out_dir, text))
    return failures
