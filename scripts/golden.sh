#!/usr/bin/env bash
# Regenerate tests/golden/matrix_args.txt (and unit_replies.txt), the golden vectors of
# tests/pygen/matrix.idl, from the C stubs (tests/pygen/golden.c), after a
# change to the cases. The Python side (tests/pygen/test_golden.py) must then
# produce the same bytes: run `ctest -L python`.
#
#   scripts/golden.sh [BUILD_DIR]     (default: build)
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
build="${1:-$root/build}"
cmake --build "$build" --target ctl_golden
"$build/tests/pygen/ctl_golden" --print > "$root/tests/golden/matrix_args.txt"
echo "wrote tests/golden/matrix_args.txt"
# The unit's golden vectors: what the C matrix unit answers requests no
# well-behaved client sends (tests/pygen/test_unit_golden.py judges both units
# by them).
cmake --build "$build" --target ctl_matrix_unit
PYTHONPATH="$root/runtime/python" CTLRPC_GEN="$root/gen/ctlrpc-gen" \
    "${PYTHON:-python3}" "$root/tests/pygen/test_unit_golden.py" --unit c \
    --c-unit "$build/tests/pygen/ctl_matrix_unit" --print \
    > "$root/tests/golden/unit_replies.txt"
echo "wrote tests/golden/unit_replies.txt"
