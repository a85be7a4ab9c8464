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
echo "installed-check: ok"
