#!/usr/bin/env bash
# Build ctlrpc's Debian packages from this tree:
#   scripts/package.sh [OUTDIR]     (default: dist/)
# writes OUTDIR/ctlrpc-libctlrpc0_<v>-1_<arch>.deb (the shared library),
# OUTDIR/ctlrpc-libctlrpc-dev_<v>-1_<arch>.deb (headers, static library,
# ctlrpc-gen, the CMake package, ctlrpc.pc, docs) and
# OUTDIR/ctlrpc-storage_<v>-1_<arch>.deb (ctl-storage-unit, ctl-storage),
# built in build-deb/ for the prefix /usr. Install them with
#   apt-get install ./dist/ctlrpc*.deb
# Their dependencies on Debian's packages (libzmq5, libmsgpackc2, and for
# the development package libzmq3-dev, libmsgpack-dev, python3-jinja2) are
# computed by dpkg-shlibdeps or declared in cmake/package.cmake.
set -euo pipefail
. "$(dirname "$0")/deps.sh"
ctlrpc_install_deps
ctlrpc_apt_install dpkg-dev file

out=${1:-$CTLRPC_ROOT/dist}
mkdir -p "$out"
out=$(cd "$out" && pwd)
bld=$CTLRPC_ROOT/build-deb
cmake -S "$CTLRPC_ROOT" -B "$bld" -DCMAKE_BUILD_TYPE=RelWithDebInfo -DCMAKE_INSTALL_PREFIX=/usr \
  -DCTLRPC_TESTS=OFF -DCTLRPC_PYTHON=/usr/bin/python3 >/dev/null
cmake --build "$bld" -j"$(nproc)"
rm -rf "$bld/debs"
(cd "$bld" && cpack -G DEB -B "$bld/debs" >/dev/null)
n=0
for f in "$bld"/debs/*.deb; do
  cp "$f" "$out/"
  echo "$out/$(basename "$f")"
  n=$((n + 1))
done
[ "$n" -gt 0 ] || { echo "ctlrpc: cpack wrote no package (see $bld)" >&2; exit 1; }
