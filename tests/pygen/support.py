"""Shared by the Python tests of tests/pygen/: the runtime on sys.path, and modules generated
from IDL files into a temporary directory with the in-tree ctlrpc-gen (CTLRPC_GEN overrides)."""

from __future__ import annotations

import atexit
import importlib
import os
import shutil
import subprocess
import sys
import tempfile
from types import ModuleType

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
GEN = os.environ.get("CTLRPC_GEN") or os.path.join(ROOT, "gen", "ctlrpc-gen")
MATRIX_IDL = os.path.join(HERE, "matrix.idl")

sys.path.insert(0, os.path.join(ROOT, "runtime", "python"))
sys.path.insert(0, HERE)
_OUT = tempfile.mkdtemp(prefix="ctlrpc-pygen-")
atexit.register(shutil.rmtree, _OUT, True)
sys.path.insert(0, _OUT)


def generate(idl: str, out: str = _OUT) -> str:
    """Run `ctlrpc-gen --lang python IDL -o out`; returns `out`."""
    subprocess.run([sys.executable, GEN, "--lang", "python", idl, "-o", out], check=True)
    return out


def load(idl: str, service: str) -> ModuleType:
    """The module generated from `idl` (its service is `service`), imported."""
    generate(idl)
    return importlib.import_module(f"{service}_ctl")


def matrix() -> ModuleType:
    return load(MATRIX_IDL, "matrix")
