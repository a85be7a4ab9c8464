#!/usr/bin/env bash
# Build ctlrpc's Debian packages from this tree:
#   scripts/package.sh [OUTDIR]     (default: dist/)
# writes four packages, built in build-deb/ for the prefix /usr:
#   OUTDIR/ctlrpc-libctlrpc1_<v>-<r>_<arch>.deb      the shared library
#   OUTDIR/ctlrpc-libctlrpc-dev_<v>-<r>_<arch>.deb   headers, static library,
#       ctlrpc-gen, the generic caller ctlrpc, the CMake package, ctlrpc.pc,
#       the docs and the example project examples/consumer
#   OUTDIR/ctlrpc-python3-ctlrpc_<v>-<r>_all.deb     the Python runtime
#   OUTDIR/ctlrpc-storage_<v>-<r>_<arch>.deb         ctl-storage-unit, ctl-storage
# and removes the ctlrpc-*.deb of earlier builds from OUTDIR. Install them with
#   apt-get install ./dist/ctlrpc*.deb
# Each build has its own Debian revision <r>, 1.<UTC time of the build>, so
# that line installs what was just built over an earlier build of the same
# version; CTLRPC_DEB_RELEASE=1 scripts/package.sh makes a release's "-1".
# Their dependencies on Debian's packages (libzmq5, libmsgpackc2, libcurl4,
# libjansson4, and for the development package libzmq3-dev, libmsgpack-dev,
# libcurl4-openssl-dev, libjansson-dev, python3, python3-jinja2; python3-zmq
# and python3-msgpack for the Python runtime) are computed by dpkg-shlibdeps
# or declared in cmake/package.cmake; ctlrpc-storage suggests etcd-server and
# etcd-client (its --etcd flags).
set -euo pipefail
. "$(dirname "$0")/deps.sh"
ctlrpc_install_deps
ctlrpc_apt_install dpkg-dev file

out=${1:-$CTLRPC_ROOT/dist}
mkdir -p "$out"
out=$(cd "$out" && pwd)
bld=$CTLRPC_ROOT/build-deb
release=${CTLRPC_DEB_RELEASE:-1.$(date -u +%Y%m%d%H%M%S)}
cmake -S "$CTLRPC_ROOT" -B "$bld" -DCMAKE_BUILD_TYPE=RelWithDebInfo -DCMAKE_INSTALL_PREFIX=/usr \
  -DCTLRPC_TESTS=OFF -DCTLRPC_PYTHON=/usr/bin/python3 -DCTLRPC_DEB_RELEASE="$release" >/dev/null
cmake --build "$bld" -j"$(nproc)"
rm -rf "$bld/debs"
(cd "$bld" && cpack -G DEB -B "$bld/debs" >/dev/null)
# The packages of an earlier build would be installed beside these by ./dist/ctlrpc*.deb.
rm -f "$out"/ctlrpc-*.deb
n=0
for f in "$bld"/debs/*.deb; do
  cp "$f" "$out/"
  echo "$out/$(basename "$f")"
  n=$((n + 1))
done
[ "$n" -gt 0 ] || { echo "ctlrpc: cpack wrote no package (see $bld)" >&2; exit 1; }
