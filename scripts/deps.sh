#!/usr/bin/env bash
# Install what ctlrpc needs to build, test and run on Debian, if it is not
# there yet. Sourced by the other scripts; safe to run again (it only calls
# apt-get when a package is missing).
set -euo pipefail

CTLRPC_PACKAGES=(
  build-essential cmake ninja-build pkg-config clang libclang-rt-dev
  libzmq3-dev libmsgpack-dev libcmocka-dev libuv1-dev
  libcurl4-openssl-dev libjansson-dev etcd-server etcd-client openssl
  python3 python3-jinja2 python3-zmq python3-msgpack mypy python3-prometheus-client
)

# Optional, not in the default install (nor CI's): gRPC C++, for the comparison `ctl-bench
# --vs-grpc` (docs/PERFORMANCE.md, "Against gRPC"; CMake builds it where these are found).
# Installed when CTLRPC_GRPC=1 is set, or by `bash scripts/deps.sh --grpc`.
CTLRPC_GRPC_PACKAGES=(
  g++ libgrpc++-dev protobuf-compiler-grpc libprotobuf-dev protobuf-compiler
)

ctlrpc_install_deps() {
  ctlrpc_apt_install "${CTLRPC_PACKAGES[@]}"
  if [ "${CTLRPC_GRPC:-0}" = 1 ]; then
    ctlrpc_apt_install "${CTLRPC_GRPC_PACKAGES[@]}"
  fi
}

# apt-get install those of the named packages that are not installed yet.
ctlrpc_apt_install() {
  local missing=()
  local p
  for p in "$@"; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" \
      || missing+=("$p")
  done
  [ ${#missing[@]} -eq 0 ] && return 0
  echo "ctlrpc: installing ${missing[*]}" >&2
  local sudo=()
  if [ "$(id -u)" -ne 0 ]; then
    command -v sudo >/dev/null || { echo "ctlrpc: need root (or sudo) to install: ${missing[*]}" >&2; return 1; }
    sudo=(sudo)
  fi
  "${sudo[@]}" env DEBIAN_FRONTEND=noninteractive apt-get update -qq
  "${sudo[@]}" env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${missing[@]}"
}

# Configure and build into $1 with extra CMake arguments.
ctlrpc_build() {
  local dir=$1; shift
  cmake -S "$CTLRPC_ROOT" -B "$dir" -DCMAKE_BUILD_TYPE=RelWithDebInfo "$@" >/dev/null
  cmake --build "$dir" -j"$(nproc)"
}

CTLRPC_ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)

if [ "${BASH_SOURCE[0]}" = "$0" ]; then
  case "${1:-}" in
    "") ;;
    --grpc) CTLRPC_GRPC=1 ;;
    *) echo "usage: $0 [--grpc]   (--grpc: also gRPC C++, for ctl-bench --vs-grpc)" >&2; exit 2 ;;
  esac
  ctlrpc_install_deps
fi
