"""The values the Python side of the matrix sends: the twins of matrix_values.h (the two
Everything records echo carries) and of golden.c's cases (the golden vectors)."""

from __future__ import annotations

from types import ModuleType
from typing import Any, Dict, Tuple


def full(m: ModuleType) -> Any:
    """Every field set, most away from their defaults (mv_full)."""
    return m.Everything(
        flag=True, small=-5, big=1 << 40, count=70000, total=2 ** 64 - 1, ratio=3.25,
        name="name", bytes=b"\x00\x01\xff", pass_="k", ints=[1, -2, 3 << 33],
        names={"a": "x", "b": ""}, maybe="m", grid=[[1, 2], [], [-3]], holes=[1, None, 3],
        index={"i": [m.Inner(label="l1", weight=0.25, tags=["t"]), m.Inner(label="l2")],
               "e": []},
        inner=m.Inner(label="in", weight=1.5, tags=("x", "y")), inner_maybe=m.Inner(label="im"),
        maybe_list=[0.5, -1],  # an int for an f64: sent as float64, as C sends -1.0
        flag_d=False, count_d=8, name_d="n", blob_d=b"b", ratio_d=-0.5, maybe_d=None)


def sparse(m: ModuleType) -> Any:
    """Empty containers, absent optionals, the defaults where there are some (mv_sparse)."""
    return m.Everything(
        flag=False, small=0, big=0, count=0, total=0, ratio=0.0, name="", bytes=b"", ints=[],
        names={}, maybe=None, grid=[], holes=[], index={}, inner=m.Inner(label=""),
        inner_maybe=None, maybe_list=None)


DESCRIBE_ALL: Dict[str, Any] = dict(
    flag=True, small=-100000, big=-2 ** 63, count=2 ** 32 - 1, total=2 ** 64 - 1, ratio=-0.25,
    name="\u00fcn\u00ef", blob=b"\x00\xff", note="n", tags=["a", ""], opts={"z": 0, "a": 300},
    from_=1, pass_="k", lambda_=True, address_="tcp://x", timeout_=65536, self_=-32)


def cases(m: ModuleType) -> Dict[str, Tuple[str, Dict[str, Any]]]:
    """golden.c's cases: name -> (op, keyword arguments of the generated client's method)."""
    return {
        "describe_defaults": ("describe", {}),
        "describe_all": ("describe", dict(DESCRIBE_ALL, inner=m.Inner(label="in"))),
        "describe_same_as_defaults": ("describe", dict(ratio=0.5, name="n", note=None)),
        "describe_ints_a": ("describe", dict(small=-32, big=-33, total=128, count=256,
                                             from_=65536, self_=127)),
        "describe_ints_b": ("describe", dict(small=-129, big=-32769, total=2 ** 32,
                                             from_=2 ** 63, count=0)),
        "describe_ints_c": ("describe", dict(small=-2 ** 31, big=-(2 ** 31) - 1,
                                             self_=2 ** 31 - 1)),
        "describe_floats_long": ("describe", dict(ratio=-0.0, name="0123456789" * 4,
                                                  blob=bytes(i % 256 for i in range(300)))),
        "echo_full": ("echo", dict(value=full(m))),
        "echo_sparse": ("echo", dict(value=sparse(m))),
        "grow_required_only": ("grow", dict(depth=3)),
        "sum_all": ("sum", dict(ints=[0, -1, 2 ** 62], weights={"b": 0.1, "a": 1e300},
                                extra=[None, 1.5])),
        "sum_scale_int": ("sum", dict(ints=[], scale=2)),
        "repeat_empty": ("repeat", dict(data=b"")),
        "find_null": ("find", dict(name=None)),
        "find_name": ("find", dict(name="x")),
        "fail_busy": ("fail", dict(kind="Busy")),
        "remember_default": ("remember", dict(key="k")),
        "remember_value": ("remember", dict(key="k", value=-1)),
        "ping": ("ping", {}),
        "remembered": ("remembered", {}),
    }
