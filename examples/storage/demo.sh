#!/usr/bin/env bash
# The storage demo: four units on this machine, and a short session against
# them with the ctl-storage client, showing what the control plane does,
# including each error kind happening for real.
#
#   examples/storage/demo.sh BUILD_DIR
#
# BUILD_DIR holds examples/ctl-storage-unit and examples/ctl-storage
# (scripts/demo.sh builds them first). Everything binds 127.0.0.1.
set -euo pipefail

build=${1:?usage: demo.sh BUILD_DIR}
unit_bin=$build/examples/ctl-storage-unit
cli_bin=$build/examples/ctl-storage
root=$(cd "$(dirname "$0")/../.." && pwd)
# The generic caller runs on the Python runtime (python3-zmq, python3-msgpack).
python=${CTLRPC_PYTHON:-/usr/bin/python3}
work=$(mktemp -d "${TMPDIR:-/tmp}/ctl-demo.XXXXXX")
pids=()

cleanup() {
  for p in "${pids[@]}"; do kill -CONT "$p" 2>/dev/null || true; kill -TERM "$p" 2>/dev/null || true; done
  wait 2>/dev/null || true
  rm -rf "$work"
}
trap cleanup EXIT

say() { printf '\n\033[1m## %s\033[0m\n' "$*"; }
run() {
  printf '$ ctl-storage %s\n' "$*"
  local rc=0
  "$cli_bin" "$@" || rc=$?
  [ "$rc" -eq 0 ] || printf '  (exit status %d)\n' "$rc"
  return 0
}

# Start a unit (not in a subshell: its pid must reach `pids`) and wait for
# the endpoint it prints as its first line; it lands in $endpoint.
start_unit() {
  local name=$1; shift
  "$unit_bin" --bind tcp://127.0.0.1:0 "$@" >"$work/$name.out" 2>"$work/$name.err" &
  pids+=($!)
  for _ in $(seq 100); do
    [ -s "$work/$name.out" ] && break
    sleep 0.05
  done
  endpoint=$(head -n1 "$work/$name.out")
  [ -n "$endpoint" ] || { echo "unit $name did not start:" >&2; cat "$work/$name.err" >&2; exit 1; }
}

say "Four storage units (unit 4 is small and has no spill directory; unit 3 spills to disk)"
start_unit u1 --capacity 64M; u1=$endpoint
start_unit u2 --capacity 64M; u2=$endpoint
start_unit u3 --capacity 4K --spill-dir "$work/spill3"; u3=$endpoint
start_unit u4 --capacity 4K; u4=$endpoint
units=("$u1" "$u2" "$u3" "$u4")
for i in 0 1 2 3; do echo "unit $((i + 1)): ${units[$i]}"; done

say "Put blobs, spread over the units by key"
head -c 3000 /dev/urandom >"$work/small.bin"
head -c 20000 /dev/urandom >"$work/large.bin"
printf 'the quick brown fox\n' >"$work/fox.txt"
run --address "$u1" put fox "$work/fox.txt"
run --address "$u2" put weights/shard-0 "$work/small.bin"
run --address "$u3" put weights/shard-1 "$work/large.bin"   # 20 KB > 4 KB: spilled to disk
run --address "$u4" put weights/shard-2 "$work/small.bin" --pin

say "Describe and read back (the spilled blob is served from disk, byte for byte)"
run --address "$u3" describe weights/shard-1
run --address "$u3" get weights/shard-1 -o "$work/back.bin"
cmp "$work/large.bin" "$work/back.bin" && echo "read back identical: $(wc -c <"$work/back.bin") bytes"
run --address "$u1" get fox

say "Pin, then list every unit at once (call_many: one request per unit, one deadline)"
run --address "$u2" pin weights/shard-0
run --address "$u1" --address "$u2" --address "$u3" --address "$u4" list --prefix weights/

say "Fan out stats to all four units"
run --address "$u1" --address "$u2" --address "$u3" --address "$u4" stats

say "Missing: a get names every key the unit does not have"
run --address "$u1" get fox no-such-key another-one

say "Busy: a pinned blob cannot be deleted until it is unpinned"
run --address "$u2" delete weights/shard-0
run --address "$u2" unpin weights/shard-0
sleep 0.1
run --address "$u2" delete weights/shard-0

say "UnitFull: unit 4 holds 4 KB in memory and has no spill directory"
run --address "$u4" put too-big "$work/large.bin"

say "Timeout: unit 1 is frozen (SIGSTOP); the call gives up at its deadline"
kill -STOP "${pids[0]}"
run --address "$u1" --timeout 300ms get fox
kill -CONT "${pids[0]}"
run --address "$u1" --timeout 2s get fox

say "Counters after the session (requests served, malformed payloads dropped)"
run --address "$u1" --address "$u2" --address "$u3" --address "$u4" --json stats

# The same units through the generic caller, which needs no code of the service: it asks each
# unit for its IDL (the built-in op _describe) and reads per-op metrics (_stats).
if PYTHONPATH="$root/runtime/python" "$python" -c 'import zmq, msgpack' 2>/dev/null; then
  caller() {
    printf '$ ctlrpc %s\n' "$*"
    PYTHONPATH="$root/runtime/python" "$python" "$root/tools/ctlrpc/ctlrpc" "$@" ||
      printf '  (exit status %d)\n' "$?"
  }
  say "Any op from a shell with the generic caller ctlrpc (IDL fetched from the unit)"
  caller call "$u3" describe 'keys=["weights/shard-1"]'
  caller health "$u1" "$u2" "$u3" "$u4"
  caller stats "$u2"
fi

say "Stopping the units (SIGTERM: each shuts down cleanly)"
