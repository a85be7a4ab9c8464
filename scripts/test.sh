#!/usr/bin/env bash
# Every test: install what is missing, then build and run the whole suite
# twice, plainly (build/) and under AddressSanitizer + UBSan (build-asan/).
#   scripts/test.sh            both
#   scripts/test.sh plain      only the plain build
#   scripts/test.sh asan       only the sanitizer build
# Extra arguments after the mode go to ctest (e.g. -R client).
set -euo pipefail
. "$(dirname "$0")/deps.sh"
ctlrpc_install_deps

mode=${1:-all}
[ $# -gt 0 ] && shift
case "$mode" in all|plain|asan) ;; *) echo "usage: $0 [all|plain|asan] [ctest args...]" >&2; exit 2;; esac

run_suite() {
  local dir=$1; shift
  echo "== ctest in $dir" >&2
  ctest --test-dir "$dir" --output-on-failure -j"$(nproc)" "$@"
}

if [ "$mode" = all ] || [ "$mode" = plain ]; then
  ctlrpc_build "$CTLRPC_ROOT/build" -DCTLRPC_TESTS=ON
  run_suite "$CTLRPC_ROOT/build" "$@"
fi
if [ "$mode" = all ] || [ "$mode" = asan ]; then
  ctlrpc_build "$CTLRPC_ROOT/build-asan" -DCTLRPC_TESTS=ON -DCTLRPC_SANITIZE=ON
  ASAN_OPTIONS=detect_leaks=1:abort_on_error=1:strict_string_checks=1 \
  UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1 \
    run_suite "$CTLRPC_ROOT/build-asan" "$@"
fi
echo "ctlrpc: all tests passed ($mode)" >&2
