"""Command line of ctlrpc-gen: run the stages, print diagnostics, choose the exit status.

    ctlrpc-gen IDL -o OUTDIR     parse, check, render the C files into OUTDIR
    ctlrpc-gen --lang python IDL -o OUTDIR
                                 the same, rendering OUTDIR/<service>_ctl.py instead
    ctlrpc-gen IDL --check       parse and check only (needs no jinja2, writes nothing)
    ctlrpc-gen --version         print `ctlrpc-gen X.Y.Z` (needs no jinja2)
    ctlrpc-gen --against OLD IDL compare IDL with an older version of it (compat.py), writing
                                 nothing; with -o OUTDIR, generate too, if the check passes
    ctlrpc-gen --against-git REV IDL   the same, OLD being IDL's path in git revision REV

Exit status:
    0  success (warnings may have been printed)
    1  a user-facing problem: errors in the IDL, a bad command line, an unreadable file, a
       missing jinja2, an unwritable output directory; with --against, a wire-breaking change
       (or, with --strict, a source-breaking one)
    2  a bug in ctlrpc-gen itself: an unexpected exception, reported as an internal error with
       its traceback, never dressed up as a diagnostic

Diagnostics go to stderr; nothing is printed on success.
"""

from __future__ import annotations

import argparse
import importlib
import os
import sys
import traceback
from typing import List, Optional

from . import compat
from .check import check
from .diag import Diagnostics, FatalError
from .parser import load_program
from .version import __version__

PROG = "ctlrpc-gen"

_EPILOG = """\
exit status: 0 success, 1 errors in the IDL or its use (diagnostics on stderr) or, with
--against, a wire-breaking change (with --strict, also a source-breaking one), 2 internal error
in ctlrpc-gen (please report it). The language, and how a service may evolve, are described in
docs/IDL.md.
"""


class _Exit(Exception):
    def __init__(self, status: int) -> None:
        super().__init__(status)
        self.status = status


class _ArgumentParser(argparse.ArgumentParser):
    """argparse that returns instead of exiting, and uses status 1 for usage errors (2 is
    reserved for internal errors)."""

    def exit(self, status: int = 0, message: Optional[str] = None) -> None:
        if message:
            sys.stderr.write(message)
        raise _Exit(status)

    def error(self, message: str) -> None:
        self.print_usage(sys.stderr)
        sys.stderr.write(f"{PROG}: error: {message}\n")
        raise _Exit(1)


def _arguments() -> _ArgumentParser:
    p = _ArgumentParser(prog=PROG, description="Compile a ctlrpc IDL file into C client stubs "
                        "and server dispatch tables.", epilog=_EPILOG,
                        formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--version", action="version", version=f"{PROG} {__version__}",
                   help="print the version and exit")
    p.add_argument("idl", metavar="IDL", help="the service's IDL file")
    p.add_argument("-o", "--out-dir", metavar="OUTDIR",
                   help="directory for the generated files (required unless --check)")
    p.add_argument("--check", action="store_true",
                   help="only parse and check the IDL; write nothing")
    p.add_argument("--lang", choices=("c", "python"), default="c",
                   help="what to generate: C stubs (S.ctl.h and S.ctl.c, the default) or a "
                   "Python module (<service>_ctl.py)")
    p.add_argument("--depfile", metavar="FILE",
                   help="also write a Makefile-style depfile listing every IDL file read "
                   "(for build systems)")
    p.add_argument("--display-root", metavar="DIR",
                   help="show IDL paths in generated files relative to DIR (default: as given, "
                   "or the file name for an absolute path)")
    old = p.add_mutually_exclusive_group()
    old.add_argument("--against", metavar="OLD",
                     help="compare IDL with OLD, an older version of the service, and report "
                     "every change: wire-breaking ones as errors (exit status 1), "
                     "source-breaking ones as warnings, safe ones as notes; writes nothing "
                     "unless -o is given too")
    old.add_argument("--against-git", metavar="REV",
                     help="like --against, OLD being IDL's path in git revision REV (and its "
                     "imports from there)")
    p.add_argument("--strict", action="store_true",
                   help="with --against or --against-git: source-breaking changes are errors "
                   "too")
    return p


def main(argv: Optional[List[str]] = None) -> int:
    """Run ctlrpc-gen with `argv` (default: sys.argv[1:]); return the exit status."""
    try:
        return _run(argv)
    except _Exit as e:
        return e.status
    except FatalError as e:
        sys.stderr.write(f"{PROG}: error: {e}\n")
        return 1
    except KeyboardInterrupt:
        return 130
    except Exception:  # a bug in the generator, whatever the input
        sys.stderr.write(f"{PROG}: internal error: this is a bug in ctlrpc-gen, not in your IDL; "
                         "please report it with the IDL file and the traceback below\n")
        traceback.print_exc(file=sys.stderr)
        return 2


def _run(argv: Optional[List[str]]) -> int:
    parser = _arguments()
    args = parser.parse_args(argv)
    against = args.against is not None or args.against_git is not None
    if args.strict and not against:
        parser.error("--strict needs --against or --against-git")
    if not args.check and args.out_dir is None and not against:
        parser.error("-o OUTDIR is required (or --check to only check)")

    diags = Diagnostics()
    program = load_program(args.idl, diags)
    model = check(program, diags) if program is not None else None
    old = None
    if model is not None and args.against is not None:
        old = compat.load_file(args.against, diags)
    elif model is not None and args.against_git is not None:
        try:
            old = compat.load_git(args.against_git, args.idl, diags)
        except FatalError:
            sys.stderr.write(diags.render())  # the warnings so far, before the one-line error
            raise
    changes = None
    if old is not None:
        new = compat.Version(program, model)
        changes = compat.compare(old, new)
        compat.report(changes, diags, strict=args.strict)
    sys.stderr.write(diags.render())
    if changes is not None:
        sys.stderr.write(compat.summary(changes) + "\n")
    if model is None or (against and old is None):
        if diags.error_count == 0:
            raise RuntimeError("no model was built, yet no error was reported")
        return 1
    if diags.error_count:
        return 1
    if args.check or args.out_dir is None:
        return 0
    extra = old.model.files if args.against is not None else ()
    return _render(model, args.out_dir, args.display_root, args.depfile, extra, args.lang)


# -- the render stage -------------------------------------------------------------------------
#
# ctlrpc_gen/render.py (model -> files through jinja2 templates) is imported only here, lazily,
# so that --check and --version work without jinja2. Its contract: render(model, out_dir)
# writes the generated files, writing each only when its content changes, and raises FatalError
# for problems the user must fix (e.g. an unwritable OUTDIR).


def _render(model, out_dir: str, display_root: Optional[str], depfile: Optional[str],
            extra_inputs=(), lang: str = "c") -> int:
    """Render `model` in `lang`; the depfile also names `extra_inputs` (the files --against
    read)."""
    module = f"{__package__}.render" + ("_py" if lang == "python" else "")
    try:
        render = importlib.import_module(module)
    except ImportError as e:
        if isinstance(e, ModuleNotFoundError) and e.name == module:
            sys.stderr.write(f"{PROG}: note: {model.path} checked; the render stage is not "
                             "written yet, so no files were written\n")
            return 0
        if _from_jinja2(e):
            why = (str(e).splitlines() or ["ImportError"])[0]
            python = sys.executable or "this Python"
            raise FatalError(f"rendering needs jinja2, which {python} cannot import ({why}): "
                             "install it for that Python (Debian: apt-get install "
                             "python3-jinja2), or pass --check to only check the IDL") from None
        raise
    if not extra_inputs:
        render.render(model, out_dir, display_root=display_root, depfile=depfile)
        return 0
    paths = render.render(model, out_dir, display_root=display_root)
    if depfile:
        render.write_depfile(depfile, paths, tuple(model.files) + tuple(extra_inputs))
    return 0


def _from_jinja2(e: ImportError) -> bool:
    """Whether an import error is jinja2's: jinja2 itself missing, or failing to import (it
    raised, or lacks a module it needs, such as markupsafe)."""
    if e.name and e.name.split(".")[0] in ("jinja2", "markupsafe"):
        return True
    tb = e.__traceback__
    while tb is not None:
        parts = os.path.normpath(tb.tb_frame.f_code.co_filename).split(os.sep)
        if "jinja2" in parts[:-1]:
            return True
        tb = tb.tb_next
    return False
