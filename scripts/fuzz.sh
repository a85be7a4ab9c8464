#!/usr/bin/env bash
# Fuzz: build the libFuzzer targets of tests/fuzz/ with clang (ASan + UBSan)
# in build-fuzz/ and run each for SECONDS (default 60) from the seed corpus.
# Fails when a target crashes, leaks or breaks one of its invariants; the
# input that did it is left in build-fuzz/fuzz-artifacts/<target>/ (copy it
# to tests/fuzz/crashes/<target>/ to keep it as a regression test).
#
#   scripts/fuzz.sh [SECONDS] [TARGET...]      targets: fuzz_unit fuzz_reply fuzz_endpoint
#   scripts/fuzz.sh 0 [TARGET...]              only build them
#
# Environment: CTLRPC_FUZZ_BUILD (build directory, default build-fuzz),
# CTLRPC_FUZZ_JOBS (parallel fuzzing processes per target, default 1),
# CTLRPC_FUZZ_ARGS (extra libFuzzer options). New inputs the fuzzer finds
# go to build-fuzz/fuzz-corpus/<target>/ (kept between runs, never
# committed); tests/fuzz/corpus/ is only read.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
secs=${1:-60}
[ $# -gt 0 ] && shift
case "$secs" in ''|*[!0-9]*) echo "usage: $0 [SECONDS] [TARGET...]" >&2; exit 2;; esac
targets=("$@")
[ ${#targets[@]} -gt 0 ] || targets=(fuzz_unit fuzz_reply fuzz_endpoint)
build=${CTLRPC_FUZZ_BUILD:-$root/build-fuzz}
jobs=${CTLRPC_FUZZ_JOBS:-1}

cc=${CC:-}
if [ -z "$cc" ] || ! "$cc" --version 2>/dev/null | grep -q clang; then
  cc=$(command -v clang || command -v clang-14 || true)
fi
if [ -z "$cc" ]; then
  echo "fuzz.sh: clang not found (Debian: apt-get install clang libclang-rt-14-dev)" >&2
  exit 2
fi

generator=()
if [ ! -f "$build/CMakeCache.txt" ] && command -v ninja >/dev/null; then
  generator=(-G Ninja)
fi
CC=$cc cmake -S "$root" -B "$build" "${generator[@]}" -DCMAKE_BUILD_TYPE=RelWithDebInfo \
  -DCTLRPC_FUZZ=ON -DCTLRPC_SANITIZE=ON -DCTLRPC_TESTS=ON >/dev/null
cmake --build "$build" -j"$(nproc)" --target "${targets[@]}"
if [ "$secs" -eq 0 ]; then
  echo "fuzz.sh: built ${targets[*]} in $build/tests/fuzz/ (0 s: nothing run)" >&2
  exit 0
fi

export ASAN_OPTIONS=${ASAN_OPTIONS:-detect_leaks=1:abort_on_error=1}
export UBSAN_OPTIONS=${UBSAN_OPTIONS:-print_stacktrace=1:halt_on_error=1}
failed=()
for t in "${targets[@]}"; do
  corpus=$build/fuzz-corpus/$t
  artifacts=$build/fuzz-artifacts/$t/
  mkdir -p "$corpus" "$artifacts"
  dict=()
  [ -f "$root/tests/fuzz/$t.dict" ] && dict=(-dict="$root/tests/fuzz/$t.dict")
  maxlen=4096
  [ "$t" = fuzz_endpoint ] && maxlen=512
  echo "== $t: ${secs}s" >&2
  log=$build/fuzz-$t.log
  # The first corpus directory receives new inputs; the seeds are read only.
  # -fork keeps fuzzing in child processes when jobs > 1.
  fork=()
  [ "$jobs" -gt 1 ] && fork=(-fork="$jobs")
  # shellcheck disable=SC2086
  if "$build/tests/fuzz/$t" -max_total_time="$secs" -max_len="$maxlen" \
      -timeout=10 -rss_limit_mb=2048 -print_final_stats=1 \
      -artifact_prefix="$artifacts" "${dict[@]}" "${fork[@]}" ${CTLRPC_FUZZ_ARGS:-} \
      "$corpus" "$root/tests/fuzz/corpus/$t" >"$log" 2>&1; then
    # The last status line (cov: edges, ft: features, corp: corpus) and
    # the totals.
    { grep -E ' cov: ' "$log" | tail -1
      grep -E '^stat::(number_of_executed_units|average_exec_per_sec|peak_rss_mb)' "$log"
    } >&2 || tail -3 "$log" >&2
  else
    echo "fuzz.sh: $t FAILED; log: $log; inputs: $artifacts" >&2
    grep -E 'ERROR|invariant broken|SUMMARY|Test unit written' "$log" | head -20 >&2 || tail -30 "$log" >&2
    failed+=("$t")
  fi
done
if [ ${#failed[@]} -gt 0 ]; then
  echo "fuzz.sh: crashes in: ${failed[*]}" >&2
  exit 1
fi
echo "fuzz.sh: ${targets[*]}: ${secs}s each, no crash" >&2
