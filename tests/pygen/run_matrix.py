"""Run one combination of the cross-language matrix: start a unit (C or generated Python), read
its endpoint, run a driver (C or generated Python) against it, then stop the unit.

    run_matrix.py --client {c,py} --unit {c,py} --c-unit PATH --c-client PATH

Exits with the driver's status (1 if the unit did not start or stop cleanly).
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--client", choices=("c", "py"), required=True)
    p.add_argument("--unit", choices=("c", "py"), required=True)
    p.add_argument("--c-unit", required=True)
    p.add_argument("--c-client", required=True)
    a = p.parse_args()
    unit_cmd = [a.c_unit] if a.unit == "c" else [sys.executable,
                                                  os.path.join(HERE, "matrix_unit.py")]
    unit = subprocess.Popen(unit_cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        assert unit.stdout is not None
        endpoint = unit.stdout.readline().strip()
        if not endpoint.startswith("tcp://"):
            print(f"run_matrix: the {a.unit} unit did not start (said {endpoint!r})")
            return 1
        client_cmd = ([a.c_client] if a.client == "c" else
                      [sys.executable, os.path.join(HERE, "matrix_client.py")]) + [endpoint]
        start = time.monotonic()
        rc = subprocess.run(client_cmd, timeout=100).returncode
        print(f"run_matrix: {a.client} client -> {a.unit} unit: status {rc} "
              f"in {time.monotonic() - start:.2f}s")
    finally:
        assert unit.stdin is not None
        unit.stdin.close()
        try:
            urc = unit.wait(timeout=20)
        except subprocess.TimeoutExpired:
            unit.kill()
            urc = -1
    if urc != 0:
        print(f"run_matrix: the {a.unit} unit exited with status {urc}")
        return 1
    return rc


if __name__ == "__main__":
    sys.exit(main())
