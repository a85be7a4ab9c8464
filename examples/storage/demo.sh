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

# Headings in bold on a terminal only: a log or a pipe gets plain text.
if [ -t 1 ]; then bold=$'\033[1m' plain=$'\033[0m'; else bold='' plain=''; fi
say() { printf '\n%s## %s%s\n' "$bold" "$*" "$plain"; }
# A command line as a shell reads it back: words that need it in single quotes, so a printed
# command pastes as it ran (keys=["a"] stays one word with its quotes).
shell_words() {
  local w out=()
  for w in "$@"; do
    if [[ -n $w && $w =~ ^[A-Za-z0-9_./:=@%+,-]+$ ]]; then
      out+=("$w")
    else
      out+=("'${w//\'/\'\\\'\'}'")
    fi
  done
  printf '%s' "${out[*]}"
}
run() {
  printf '$ ctl-storage %s\n' "$(shell_words "$@")"
  local rc=0
  "$cli_bin" "$@" || rc=$?
  [ "$rc" -eq 0 ] || printf '  (exit status %d)\n' "$rc"
  return 0
}
# The same, returning the command's exit status (for `must`).
run_strict() {
  printf '$ ctl-storage %s\n' "$(shell_words "$@")"
  "$cli_bin" "$@"
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
caller() {
  printf '$ ctlrpc %s\n' "$(shell_words "$@")"
  PYTHONPATH="$root/runtime/python" "$python" "$root/tools/ctlrpc/ctlrpc" "$@" ||
    printf '  (exit status %d)\n' "$?"
}
caller_strict() {
  printf '$ ctlrpc %s\n' "$(shell_words "$@")"
  PYTHONPATH="$root/runtime/python" "$python" "$root/tools/ctlrpc/ctlrpc" "$@"
}
have_caller=0
if PYTHONPATH="$root/runtime/python" "$python" -c 'import zmq, msgpack' 2>/dev/null; then
  have_caller=1
  say "Any op from a shell with the generic caller ctlrpc (IDL fetched from the unit)"
  caller call "$u3" describe 'keys=["weights/shard-1"]'
  caller health "$u1" "$u2" "$u3" "$u4"
  caller stats "$u2"
fi

# The fleet part shows what must work, not errors: any command of it that fails, or a wait that
# runs out, ends the demo with a message and a non-zero status.
die() { echo "demo: $*" >&2; exit 1; }
must() {
  local rc=0
  "$@" || rc=$?
  [ "$rc" -eq 0 ] || die "the command above failed (exit status $rc)"
}
# within SECONDS COMMAND...: run COMMAND every 50 ms until it succeeds; false if it never did
# in SECONDS.
within() {
  local tries=$(($1 * 20)) _
  shift
  for _ in $(seq "$tries"); do "$@" && return 0; sleep 0.05; done
  return 1
}

# A fleet: the units register in a private etcd (never the packaged service on
# 2379: free ports, a data directory under $work) and are called by service name.
if ! command -v etcd >/dev/null || ! command -v etcdctl >/dev/null; then
  say "A fleet: skipped, etcd and etcdctl are not installed (Debian: etcd-server etcd-client)"
elif [ "$have_caller" -eq 0 ]; then
  say "A fleet: skipped, $python cannot import zmq and msgpack (Debian: python3-zmq" \
    "python3-msgpack)"
else
  say "A fleet: a private etcd, and three units that register in it"
  read -r cport pport < <("$python" -c 'import socket
s = [socket.socket() for _ in range(2)]
for x in s: x.bind(("127.0.0.1", 0))
print(*[x.getsockname()[1] for x in s])')
  etcd_url=http://127.0.0.1:$cport
  etcd --name demo --data-dir "$work/etcd" --listen-client-urls "$etcd_url" \
    --advertise-client-urls "$etcd_url" --listen-peer-urls "http://127.0.0.1:$pport" \
    --initial-advertise-peer-urls "http://127.0.0.1:$pport" \
    --initial-cluster "demo=http://127.0.0.1:$pport" >"$work/etcd.log" 2>&1 &
  pids+=($!)
  export ETCDCTL_API=3
  etcd_healthy() { etcdctl --endpoints "$etcd_url" endpoint health >/dev/null 2>&1; }
  within 10 etcd_healthy ||
    { cat "$work/etcd.log" >&2; die "etcd did not answer on $etcd_url within 10 s"; }
  echo "etcd on $etcd_url"
  for n in 1 2 3; do
    start_unit "fleet$n" --etcd "$etcd_url" --unit-id "unit-$n" --lease-ttl 3
    echo "unit-$n: $endpoint"
  done
  fleet_pid=${pids[$((${#pids[@]} - 2))]}   # unit-2
  # How many units are registered, read with etcdctl (only to wait: the demo shows ctlrpc's view).
  members() {
    etcdctl --endpoints "$etcd_url" get --prefix --keys-only /ctlrpc/v1/default/storage/ | grep -c . || true
  }
  three_registered() { [ "$(members)" -ge 3 ]; }
  within 5 three_registered || die "the three units did not register in etcd within 5 s"
  say "The membership (ctlrpc units; the keys and JSON values are in docs/PROTOCOL.md)"
  must caller_strict units --etcd "$etcd_url" --service storage
  say "A call to the whole service by name: every serving unit"
  must run_strict --etcd "$etcd_url" --service storage stats
  say "Stop unit-2 (SIGTERM): it marks itself draining, drains, and its key is gone at once"
  kill -TERM "$fleet_pid"
  wait "$fleet_pid" 2>/dev/null || true
  two_registered() { [ "$(members)" -le 2 ]; }
  within 5 two_registered || die "unit-2's key was still in etcd 5 s after it stopped"
  must caller_strict units --etcd "$etcd_url" --service storage
  must run_strict --etcd "$etcd_url" --service storage stats
fi

say "Stopping the units (SIGTERM: each shuts down cleanly)"
