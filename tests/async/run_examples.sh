#!/usr/bin/env bash
# The asynchronous examples against two real storage units: each program
# must put and get back every blob with many calls in flight, and fail
# (exit 1, naming the address) against an address where nothing listens.
# usage: run_examples.sh UNIT_BIN EPOLL_BIN [UV_BIN]
set -euo pipefail
unit=$1; epoll=$2; uv=${3:-}
dir=$(mktemp -d)
pids=()
cleanup() {
  for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done
  wait 2>/dev/null || true
  rm -rf "$dir"
}
trap cleanup EXIT
addrs=()
for i in 1 2; do
  "$unit" --bind tcp://127.0.0.1:0 --log-level warn >"$dir/unit$i.out" 2>"$dir/unit$i.err" &
  pids+=($!)
  for _ in $(seq 1 200); do   # up to 10 s for the endpoint line
    [ -s "$dir/unit$i.out" ] && break
    sleep 0.05
  done
  addr=$(head -1 "$dir/unit$i.out")
  case "$addr" in tcp://*) ;; *) echo "unit $i did not start: $(cat "$dir/unit$i.err")" >&2; exit 1;; esac
  addrs+=("$addr")
done
progs=("$epoll")
[ -n "$uv" ] && progs+=("$uv")
for prog in "${progs[@]}"; do
  out=$(timeout 120 "$prog" --calls 4000 --window 128 "${addrs[@]}")
  echo "$out"
  grep -q "put and got back 4000 blobs over 2 unit(s), up to 128 calls in flight" <<<"$out"
  set +e
  err=$(timeout 60 "$prog" --calls 5 tcp://127.0.0.1:1 2>&1 >/dev/null)
  rc=$?
  set -e
  [ "$rc" = 1 ] || { echo "$prog against a dead address: exit $rc, want 1" >&2; exit 1; }
  grep -q "tcp://127.0.0.1:1: connection refused" <<<"$err" || { echo "unexpected: $err" >&2; exit 1; }
  set +e
  timeout 10 "$prog" >/dev/null 2>&1
  rc=$?
  set -e
  [ "$rc" = 2 ] || { echo "$prog without addresses: exit $rc, want 2" >&2; exit 1; }
done
echo "async examples: ok"
