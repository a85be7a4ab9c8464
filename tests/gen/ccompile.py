"""Compiling generated code from the generator's tests: each of gcc, clang, g++ and clang++ that
is installed checks a batch of generated file pairs in one invocation (-fsyntax-only).

For each pair `<stem>.ctl.c` / `<stem>.ctl.h` in its own directory:
- C compilers (-std=c11) check a .c that includes the header twice, then the generated .c;
- C++ compilers (-std=c++11) check a .cpp that includes the header twice;
all under -Wall -Wextra -Werror -pedantic. The header's include path and msgpack's come from
$CTLRPC_TEST_INCLUDES (os.pathsep-separated, set by CMake) or default to the repository's
runtime headers and the system's.
"""

import os
import shutil
import subprocess
from concurrent.futures import ThreadPoolExecutor

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
    """Write the test sources next to a generated pair; return their paths: a .c that includes
    the header twice (it must stand alone and its guard must hold) and then the generated .c,
    and a .cpp that includes the header twice."""
    header = f'#include "{stem}.ctl.h"\n#include "{stem}.ctl.h"\n'
    paths = {}
    for ext, text in (("c", header + f'#include "{stem}.ctl.c"\n'), ("cpp", header)):
        path = os.path.join(out_dir, f"check_{stem_id(stem)}.{ext}")
        with open(path, "w", encoding="utf-8") as f:
            f.write(text)
        paths[ext] = path
    return paths


def stem_id(stem):
    return "".join(ch if ch.isascii() and ch.isalnum() else "_" for ch in stem)


def compile_batch(pairs, compilers=None, timeout=600, jobs=None):
    """Compile generated pairs [(out_dir, stem)] with every available compiler, the compilers
    in parallel (`jobs`, default the CPU count), each over the whole batch in one invocation.
    Returns a list of failures (compiler, out_dir, message): the directories whose files the
    compiler refused (or all of them, if its output names none)."""
    incs = include_dirs()
    sources = [prepare(d, stem) for d, stem in pairs]

    def run(entry):
        cc, lang = entry
        files = [src["c" if lang == "c" else "cpp"] for src in sources]
        flags = C_FLAGS if lang == "c" else CXX_FLAGS
        argv = [cc, *flags, *[f"-I{d}" for d in incs], *files]
        proc = subprocess.run(argv, capture_output=True, timeout=timeout,
                              env=dict(os.environ, LC_ALL="C"))
        if proc.returncode == 0:
            return []
        text = proc.stderr.decode("utf-8", "replace")
        named = [(d, s) for d, s in pairs if (d + os.sep) in text]
        return [(os.path.basename(cc), d, text) for d, _ in named or pairs]

    todo = compilers if compilers is not None else available()
    with ThreadPoolExecutor(max_workers=jobs or os.cpu_count() or 1) as pool:
        return [f for result in pool.map(run, todo) for f in result]
