#!/usr/bin/env bash
# Every test: install what is missing, then build and run the suite three
# times: plainly (build/), under AddressSanitizer + UBSan (build-asan/; every
# test that runs C code of ours) and under ThreadSanitizer (build-tsan/; the
# tests of our threads).
#   scripts/test.sh            all three
#   scripts/test.sh plain      only the plain build
#   scripts/test.sh asan       only the ASan + UBSan build
#   scripts/test.sh tsan       only the TSan build
# Extra arguments after the mode go to ctest (e.g. -R client).
#
# The TSan build uses clang and a libzmq built with TSan from Debian's
# source (scripts/tsan-libzmq.sh; built once into build-tsan/libzmq-tsan/,
# then reused). It runs the tests of our threads: the runtime tests
# (stress included), the generated stubs, the storage service, the fault
# tests and the fleet tests (etcd); not the Python-driven tests, the compile-only checks, the fuzz
# corpus replays, the soak or the benchmark. Any TSan report fails
# the run, also one from a child process (a storage unit) whose exit status
# a test does not see: every process logs its reports under
# build-tsan/tsan-reports/, which must stay empty.
set -euo pipefail
. "$(dirname "$0")/deps.sh"
ctlrpc_install_deps

mode=${1:-all}
[ $# -gt 0 ] && shift
case "$mode" in all|plain|asan|tsan) ;; *) echo "usage: $0 [all|plain|asan|tsan] [ctest args...]" >&2; exit 2;; esac

# What runs under TSan: ctest labels, less the tests that run no code of
# ours in a thread (compile and symbol checks, the standalone projects of
# the regeneration and evolution tests) and the ones driven from Python.
# The soak runs too; it does not judge its RSS under a sanitizer.
CTLRPC_TSAN_LABELS='^(runtime|stubs|storage|faults|fleet|soak)$'
CTLRPC_TSAN_EXCLUDE='^(stubs_strict_.*|stubs_regen_.*|stubs_evolve_.*|core_imports_.*|test_storage_cli)$'

# What the ASan+UBSan build leaves out: the tests that run no C code of this
# build (the generator's own tests, the standalone projects of the
# regeneration, evolution and walk-through tests, the Python runtime's tests
# that start no C program); the plain build runs them.
CTLRPC_ASAN_EXCLUDE='^(gen_unittest|stubs_regen_.*|stubs_evolve_.*|using_walkthrough|test_python_(server|fuzz|churn|drain|retry|mypy)|pygen_(golden_py|generated|mypy))$'

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
    run_suite "$CTLRPC_ROOT/build-asan" -E "$CTLRPC_ASAN_EXCLUDE" "$@"
fi
if [ "$mode" = all ] || [ "$mode" = tsan ]; then
  tsan=$CTLRPC_ROOT/build-tsan
  zmq_prefix=$(bash "$CTLRPC_ROOT/scripts/tsan-libzmq.sh" "$tsan/libzmq-tsan")
  CC=$(command -v clang) ctlrpc_build "$tsan" -DCTLRPC_TESTS=ON -DCTLRPC_TSAN=ON \
    -DCTLRPC_ZMQ_PREFIX="$zmq_prefix"
  reports=$tsan/tsan-reports
  rm -rf "$reports"
  mkdir -p "$reports"
  rc=0
  TSAN_OPTIONS="halt_on_error=1:second_deadlock_stack=1:log_path=$reports/tsan:log_exe_name=1" \
    run_suite "$tsan" -L "$CTLRPC_TSAN_LABELS" -E "$CTLRPC_TSAN_EXCLUDE" "$@" || rc=$?
  if [ -n "$(ls -A "$reports")" ]; then
    for f in "$reports"/*; do
      echo "== $f" >&2
      cat "$f" >&2
    done
    echo "ctlrpc: ThreadSanitizer reports above (kept in $reports)" >&2
    rc=1
  fi
  [ "$rc" = 0 ] || exit "$rc"
fi
echo "ctlrpc: all tests passed ($mode)" >&2
