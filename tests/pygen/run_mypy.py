"""mypy --strict over the Python runtime (runtime/python/ctlrpc) and the modules generated from
the IDL files given, together (Debian's mypy). Exits 77 (a skip for ctest) when mypy is not
installed.

    run_mypy.py IDL...
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile

import support


def main() -> int:
    mypy = shutil.which("mypy")
    if mypy is None:
        print("run_mypy: SKIPPED: mypy is not installed (Debian: apt-get install mypy)")
        return 77
    out = tempfile.mkdtemp(prefix="ctlrpc-mypy-")
    try:
        for idl in sys.argv[1:]:
            support.generate(idl, out)
        modules = sorted(os.path.join(out, f) for f in os.listdir(out) if f.endswith(".py"))
        runtime = os.path.join(support.ROOT, "runtime", "python")
        env = dict(os.environ, MYPYPATH=runtime)
        cmd = [mypy, "--strict", "--no-incremental", "--cache-dir", os.devnull,
               os.path.join(runtime, "ctlrpc")] + modules
        print("run_mypy:", " ".join(os.path.basename(c) for c in cmd))
        return subprocess.run(cmd, env=env).returncode
    finally:
        shutil.rmtree(out, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
