#!/usr/bin/env bash
# After the Debian packages are installed: the installed programs work together. Starts
# the installed ctl-storage-unit, stores a blob with ctl-storage, reads it and the unit's health
# back with the generic caller ctlrpc (which fetches the IDL with _describe), and stops the unit.
# Every wait is bounded.
set -euo pipefail
out=$(mktemp)
ctl-storage-unit --bind tcp://127.0.0.1:0 --capacity 16M > "$out" 2>/dev/null &
unit=$!
trap 'kill "$unit" 2>/dev/null || true; rm -f "$out"' EXIT
for _ in $(seq 100); do
  [ -s "$out" ] && break
  sleep 0.1
done
ep=$(head -n 1 "$out")
[ -n "$ep" ] || { echo "installed-check: ctl-storage-unit printed no endpoint" >&2; exit 1; }
ctl-storage --address "$ep" --timeout 5s put k - <<<"installed" >/dev/null
got=$(ctlrpc call --timeout 5 "$ep" get 'keys=["k"]')
echo "installed-check: get -> $got"
ctlrpc health "$ep"
ctlrpc stats --prometheus "$ep" | grep -q '^ctlrpc_' ||
  { echo "installed-check: no Prometheus lines from ctlrpc stats" >&2; exit 1; }
kill -TERM "$unit"
wait "$unit"

# A fleet (when etcd is installed): a private etcd on free ports, the installed unit registers,
# ctl-storage finds it by service name.
if command -v etcd >/dev/null; then
  dir=$(mktemp -d)
  read -r cport pport < <(/usr/bin/python3 -c 'import socket
s = [socket.socket() for _ in range(2)]
for x in s: x.bind(("127.0.0.1", 0))
print(*[x.getsockname()[1] for x in s])')
  url=http://127.0.0.1:$cport
  etcd --name ic --data-dir "$dir/data" --listen-client-urls "$url" --advertise-client-urls "$url" \
    --listen-peer-urls "http://127.0.0.1:$pport" --initial-advertise-peer-urls "http://127.0.0.1:$pport" \
    --initial-cluster "ic=http://127.0.0.1:$pport" >"$dir/etcd.log" 2>&1 &
  etcd_pid=$!
  ctl-storage-unit --bind tcp://127.0.0.1:0 --etcd "$url" > "$out" 2>/dev/null &
  unit=$!
  trap 'kill "$unit" "$etcd_pid" 2>/dev/null || true; rm -rf "$out" "$dir"' EXIT
  ok=0
  for _ in $(seq 100); do
    if ctl-storage --etcd "$url" --service storage stats >/dev/null 2>&1; then ok=1; break; fi
    sleep 0.1
  done
  [ "$ok" -eq 1 ] || { echo "installed-check: ctl-storage --etcd found no unit" >&2; exit 1; }
  echo "installed-check: ctl-storage --etcd $url --service storage stats: ok"
  kill -TERM "$unit"
  wait "$unit"
  kill -TERM "$etcd_pid"
  wait "$etcd_pid" || true
fi
echo "installed-check: ok"
