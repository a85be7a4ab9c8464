#!/usr/bin/env bash
# libzmq built with ThreadSanitizer, for the TSan build (scripts/test.sh tsan).
#
# TSan only sees the synchronization of code it instrumented: over Debian's
# libzmq it cannot see how the I/O thread hands messages to the application
# threads, and reports every such hand-over as a race. So this builds the
# libzmq that the installed libzmq3-dev came from (Debian's source package,
# same version, Debian's patches applied) with clang -fsanitize=thread, CURVE
# through libsodium as in Debian's build, only the shared library, and
# installs it into PREFIX. Run again, it does nothing while PREFIX holds a
# build of the same source version, compiler and flags (PREFIX/.ctlrpc-stamp).
#
#   scripts/tsan-libzmq.sh [PREFIX]      default: build-tsan/libzmq-tsan
#
# The source comes from the Debian archive through `apt-get source`: when no
# deb-src entry is configured for this release, one is added beside the
# existing deb entries (a new file, /etc/apt/sources.list.d/ctlrpc-deb-src.*,
# copied from them with the type changed; the existing files are not edited),
# followed by apt-get update. Needs root or sudo for that (and for installing
# what is missing: dpkg-dev, libsodium-dev, clang, ...), like scripts/deps.sh.
#
# Environment: CTLRPC_TSAN_JOBS (parallel compile jobs, default nproc).
set -euo pipefail
. "$(dirname "$0")/deps.sh"

prefix=${1:-$CTLRPC_ROOT/build-tsan/libzmq-tsan}
case "$prefix" in /*) ;; *) prefix=$PWD/$prefix ;; esac
jobs=${CTLRPC_TSAN_JOBS:-$(nproc)}
# Bump when the way the library is built changes (invalidates the cache).
recipe=1
flags="-fsanitize=thread -fno-omit-frame-pointer -g -O2"

log() { echo "tsan-libzmq: $*" >&2; }

ctlrpc_apt_install dpkg-dev libzmq3-dev libsodium-dev clang libclang-rt-dev \
                   cmake ninja-build pkg-config g++

cc=$(command -v clang)
cxx=$(command -v clang++)
# The source package and version of the libzmq whose headers the rest of the
# system (and Debian's pyzmq, which the interop tests use) agree on.
srcpkg=$(dpkg-query -W -f='${source:Package}' libzmq3-dev)
version=$(dpkg-query -W -f='${source:Version}' libzmq3-dev)
stamp="$srcpkg $version | $("$cxx" --version | head -n1) | $flags | recipe $recipe"

if [ -f "$prefix/.ctlrpc-stamp" ] && [ "$(cat "$prefix/.ctlrpc-stamp")" = "$stamp" ] \
   && [ -f "$prefix/lib/pkgconfig/libzmq.pc" ]; then
  log "reusing $prefix ($srcpkg $version)"
  echo "$prefix"
  exit 0
fi

sudo=()
if [ "$(id -u)" -ne 0 ]; then
  command -v sudo >/dev/null || { log "need root (or sudo) to configure deb-src and run apt-get update"; exit 1; }
  sudo=(sudo)
fi

# ---- a deb-src entry for this release ---------------------------------------
# apt-get indextargets lists what the sources configure, in either format
# (one-line .list or deb822 .sources), without the files apt ignores.
codename=$(. /etc/os-release && echo "${VERSION_CODENAME:-}")
[ -n "$codename" ] || { log "cannot tell the Debian release (VERSION_CODENAME in /etc/os-release)"; exit 1; }
have_src() {
  apt-get indextargets --format '$(RELEASE)' 'Created-By: Sources' 2>/dev/null \
    | grep -qx "$codename"
}
if ! have_src; then
  tmp=$(mktemp -d)
  trap 'rm -rf "$tmp"' EXIT
  # deb822: every stanza of Types "deb" for this release (Suites <codename>
  # or <codename>-*), copied whole (URIs, Components, Signed-By, ... must
  # match the deb stanza's, or apt reports conflicting options) with Types
  # deb-src. One-line: each "deb" line for this release as a "deb-src" line.
  shopt -s nullglob
  for f in /etc/apt/sources.list.d/*.sources; do
    awk -v cn="$codename" '
      function flush(   i, ok, n, s) {
        if (nl > 0 && isdeb && !enabled_no) {
          n = split(suites, s, /[ \t]+/); ok = 0
          for (i = 1; i <= n; i++) if (s[i] == cn || index(s[i], cn "-") == 1) ok = 1
          if (ok) { for (i = 1; i <= nl; i++) print lines[i]; print "" }
        }
        nl = 0; isdeb = 0; suites = ""; enabled_no = 0
      }
      /^[ \t]*$/ { flush(); next }
      /^#/ { next }
      {
        if (tolower($1) == "types:") {
          line = "Types: deb-src"; isdeb = 0
          for (i = 2; i <= NF; i++) if ($i == "deb") isdeb = 1
          lines[++nl] = line; next
        }
        if (tolower($1) == "suites:") { suites = substr($0, index($0, ":") + 1) }
        if (tolower($1) == "enabled:" && tolower($2) == "no") enabled_no = 1
        lines[++nl] = $0
      }
      END { flush() }' "$f" >>"$tmp/ctlrpc-deb-src.sources"
  done
  for f in /etc/apt/sources.list /etc/apt/sources.list.d/*.list; do
    [ -f "$f" ] || continue
    awk -v cn="$codename" '
      $1 == "deb" {
        # deb [options] uri suite components...
        i = 2
        if ($2 ~ /^\[/) { while (i <= NF && $i !~ /\]$/) i++; i++ }
        suite = $(i + 1)
        if (suite == cn || index(suite, cn "-") == 1) { sub(/^deb/, "deb-src"); print }
      }' "$f" >>"$tmp/ctlrpc-deb-src.list"
  done
  added=0
  for ext in sources list; do
    if [ -s "$tmp/ctlrpc-deb-src.$ext" ]; then
      log "adding deb-src entries: /etc/apt/sources.list.d/ctlrpc-deb-src.$ext"
      "${sudo[@]}" install -m 0644 "$tmp/ctlrpc-deb-src.$ext" "/etc/apt/sources.list.d/ctlrpc-deb-src.$ext"
      added=1
    fi
  done
  [ "$added" = 1 ] || { log "no deb entry for $codename in the apt sources to copy as deb-src"; exit 1; }
fi
log "apt-get update"
"${sudo[@]}" env DEBIAN_FRONTEND=noninteractive apt-get update -qq
have_src || { log "apt still lists no Sources index for $codename"; exit 1; }

# ---- source ------------------------------------------------------------------
work=$(dirname "$prefix")/libzmq-tsan-build
rm -rf "$work" "$prefix"
mkdir -p "$work"
# The installed version; should the archive have moved on (a point
# release), the archive's: the same upstream release and ABI within a
# Debian release.
log "apt-get source $srcpkg=$version"
if ! (cd "$work" && apt-get source -qq "$srcpkg=$version" >/dev/null); then
  log "$srcpkg $version is no longer in the archive: taking its current $srcpkg"
  rm -rf "${work:?}"/*
  (cd "$work" && apt-get source -qq "$srcpkg" >/dev/null)
fi
src=$(find "$work" -mindepth 1 -maxdepth 1 -type d | head -n1)
[ -n "$src" ] && [ -f "$src/CMakeLists.txt" ] || { log "no unpacked source with a CMakeLists.txt in $work"; exit 1; }

# ---- build -------------------------------------------------------------------
# CMake, only the shared library; no tests, tools, docs or draft API (Debian
# builds the stable API too). CURVE through the system libsodium.
start=$(date +%s)
generator=()
command -v ninja >/dev/null && generator=(-G Ninja)
log "building $srcpkg $version with $flags ($jobs jobs)"
CC=$cc CXX=$cxx cmake -Wno-dev -S "$src" -B "$work/build" "${generator[@]}" \
  -DCMAKE_BUILD_TYPE=None \
  -DCMAKE_C_FLAGS="$flags" -DCMAKE_CXX_FLAGS="$flags" \
  -DCMAKE_INSTALL_PREFIX="$prefix" -DCMAKE_INSTALL_LIBDIR=lib \
  -DBUILD_SHARED=ON -DBUILD_STATIC=OFF -DBUILD_TESTS=OFF -DWITH_PERF_TOOL=OFF \
  -DWITH_DOCS=OFF -DENABLE_DRAFTS=OFF -DENABLE_CPACK=OFF -DENABLE_PRECOMPILED=OFF \
  -DWITH_LIBSODIUM=ON -DENABLE_CURVE=ON \
  >"$work/configure.log" 2>&1 || { tail -n 40 "$work/configure.log" >&2; exit 1; }
grep -q "Using libsodium for CURVE security" "$work/configure.log" \
  || { log "libzmq would build without libsodium (CURVE): see $work/configure.log"; exit 1; }
cmake --build "$work/build" -j"$jobs" >"$work/build.log" 2>&1 \
  || { tail -n 40 "$work/build.log" >&2; exit 1; }
cmake --install "$work/build" >/dev/null
[ -f "$prefix/lib/pkgconfig/libzmq.pc" ] || { log "no libzmq.pc installed in $prefix/lib/pkgconfig"; exit 1; }
cp "$work/configure.log" "$work/build.log" "$prefix/" 2>/dev/null || true
echo "$stamp" >"$prefix/.ctlrpc-stamp"
rm -rf "$work"
log "built in $(( $(date +%s) - start )) s: $prefix"
echo "$prefix"
