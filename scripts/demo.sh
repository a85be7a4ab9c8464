#!/usr/bin/env bash
# The main job: install what is missing, build, and run the demo.
set -euo pipefail
. "$(dirname "$0")/deps.sh"
ctlrpc_install_deps
ctlrpc_build "$CTLRPC_ROOT/build" -DCTLRPC_TESTS=OFF
exec "$CTLRPC_ROOT/build/examples/ctl-runtime-demo" "$@"
