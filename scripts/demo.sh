#!/usr/bin/env bash
# The main job: install what is missing, build, and run the storage demo
# (four units and a scripted client session; see examples/storage/demo.sh).
set -euo pipefail
. "$(dirname "$0")/deps.sh"
ctlrpc_install_deps
ctlrpc_build "$CTLRPC_ROOT/build" -DCTLRPC_TESTS=OFF
exec "$CTLRPC_ROOT/examples/storage/demo.sh" "$CTLRPC_ROOT/build" "$@"
