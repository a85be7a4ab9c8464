#!/usr/bin/env bash
# Install what ctlrpc needs to build, test and run on Debian, if it is not
# there yet. Sourced by the other scripts; safe to run again (it only calls
# apt-get when a package is missing).
set -euo pipefail

CTLRPC_PACKAGES=(
  build-essential cmake ninja-build pkg-config clang libclang-rt-dev
  libzmq3-dev libmsgpack-dev libcmocka-dev
  python3 python3-jinja2 python3-zmq python3-msgpack mypy
)

ctlrpc_install_deps() {
  ctlrpc_apt_install "${CTLRPC_PACKAGES[@]}"
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
  ctlrpc_install_deps
fi
