#!/usr/bin/env bash
# run.sh - build the consumer example one way and run its client against its unit.
#
#   examples/consumer/run.sh cmake  <ctlrpc prefix> <build dir>   find_package(ctlrpc)
#   examples/consumer/run.sh make   <ctlrpc prefix> <build dir>   pkg-config + ctlrpc-gen
#   examples/consumer/run.sh subdir <ctlrpc root>   <build dir>   add_subdirectory(<root>)
#
# <ctlrpc prefix> is where ctlrpc was installed (cmake --install build --prefix P);
# <ctlrpc root> is a ctlrpc source tree. The build dir is created (or reused).
# Then: start jobs-unit in the background, read the endpoint it prints, run
# jobs-client against it, stop the unit with SIGTERM. Exits 0 only if the
# build, the client and the unit's shutdown all succeed; every wait is bounded.
#
# Environment: CC, CFLAGS (default -O2 -g -Werror), CMAKE_GENERATOR,
# CTLRPC_PYTHON (the Python with jinja2 for the subdir build),
# RUN_TIMEOUT (seconds for each of: unit start, client run, unit stop; default 20).
set -euo pipefail

usage() {
    echo "usage: $0 cmake|make <ctlrpc prefix> <build dir>" >&2
    echo "       $0 subdir <ctlrpc source root> <build dir>" >&2
    exit 2
}
[ $# -eq 3 ] || usage
mode=$1 where=$2 build=$3
here=$(cd "$(dirname "$0")" && pwd)
[ -d "$where" ] || { echo "run.sh: $where is not a directory" >&2; exit 2; }
where=$(cd "$where" && pwd)
# A fresh build each time: generated files from another ctlrpc must not linger. (The build
# directory is this script's own: never the source tree, the prefix or a parent of them.)
for keep in "$where" "$here" "$HOME" /; do
    b=$(realpath -m "$build")
    case "$keep/" in "$b"/*) echo "run.sh: will not remove $build (it holds $keep)" >&2; exit 2;; esac
done
rm -rf "$build"
mkdir -p "$build"
build=$(cd "$build" && pwd)
limit=${RUN_TIMEOUT:-20}
export CFLAGS="${CFLAGS:--O2 -g -Werror}"

fail() {
    echo "run.sh ($mode): FAIL: $*" >&2
    exit 1
}

# ---- build ------------------------------------------------------------------
# The library directory of a prefix: lib/, or lib/<multiarch>/ as on Debian's /usr.
libdir=
for d in "$where"/lib "$where"/lib/*-linux-gnu* "$where"/lib64; do
    [ -f "$d/pkgconfig/ctlrpc.pc" ] && { libdir=$d; break; }
done

case $mode in
cmake)
    [ -n "$libdir" ] && [ -d "$libdir/cmake/ctlrpc" ] ||
        fail "$where has no lib/cmake/ctlrpc (not a ctlrpc prefix?)"
    cmake -S "$here" -B "$build" -DCMAKE_PREFIX_PATH="$where" -DCMAKE_BUILD_TYPE=Release \
        || fail "configure (find_package(ctlrpc) in $where)"
    cmake --build "$build" -j2 || fail "build"
    ;;
make)
    [ -n "$libdir" ] || fail "$where has no lib/pkgconfig/ctlrpc.pc (not a ctlrpc prefix?)"
    export PKG_CONFIG_PATH="$libdir/pkgconfig${PKG_CONFIG_PATH:+:$PKG_CONFIG_PATH}"
    export PATH="$where/bin:$PATH"
    export LD_LIBRARY_PATH="$libdir${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
    make -f "$here/Makefile" BUILD="$build" || fail "make"
    ;;
subdir)
    [ -f "$where/runtime/cmake/ctlrpc_generate.cmake" ] || fail "$where is not a ctlrpc source tree"
    python_opt=()
    [ -n "${CTLRPC_PYTHON:-}" ] && python_opt=(-DCTLRPC_PYTHON="$CTLRPC_PYTHON")
    cmake -S "$here" -B "$build" -DCONSUMER_CTLRPC_SOURCE="$where" \
        -DCMAKE_BUILD_TYPE=Release "${python_opt[@]}" || fail "configure (add_subdirectory($where))"
    cmake --build "$build" -j2 || fail "build"
    # As a subproject ctlrpc builds its library and nothing else: no tests, benchmarks,
    # fuzzers or examples, no cmocka, and its warnings are not errors (this script's own
    # CFLAGS may still say -Werror: the consumer's code must build cleanly).
    targets=$(cmake --build "$build" --target help)
    for t in test_client test_storage ctl-bench ctl-storage-unit ctl-storage fuzz_envelope; do
        ! grep -qw -- "$t" <<<"$targets" || fail "the subproject build defines target $t"
    done
    ! grep -qi cmocka "$build/CMakeCache.txt" || fail "the subproject build looked for cmocka"
    grep -qx 'CTLRPC_WERROR:BOOL=OFF' "$build/CMakeCache.txt" ||
        fail "the subproject build turns ctlrpc's warnings into errors (CTLRPC_WERROR)"
    ;;
*)
    usage
    ;;
esac
for p in jobs-unit jobs-client; do
    [ -x "$build/$p" ] || fail "the build made no $build/$p"
done

# ---- run --------------------------------------------------------------------
work=$(mktemp -d "${TMPDIR:-/tmp}/ctlrpc-consumer.XXXXXX")
unit_pid=""
cleanup() {
    if [ -n "$unit_pid" ] && kill -0 "$unit_pid" 2>/dev/null; then
        kill -KILL "$unit_pid" 2>/dev/null || true
        wait "$unit_pid" 2>/dev/null || true
    fi
    rm -rf "$work"
}
trap cleanup EXIT

"$build/jobs-unit" --bind tcp://127.0.0.1:0 > "$work/out" 2> "$work/unit.err" &
unit_pid=$!
# The first line the unit prints is its endpoint: wait for a whole line (or the unit's end).
endpoint=""
for _ in $(seq $((limit * 10))); do
    if [ "$(wc -l < "$work/out")" -ge 1 ]; then
        endpoint=$(head -n 1 "$work/out")
        break
    fi
    kill -0 "$unit_pid" 2>/dev/null || break
    sleep 0.1
done
if [ -z "$endpoint" ]; then
    cat "$work/unit.err" >&2
    fail "jobs-unit printed no endpoint within ${limit}s"
fi
case $endpoint in
tcp://*) ;;
*) fail "jobs-unit's first line is not an endpoint: '$endpoint'" ;;
esac
echo "run.sh ($mode): jobs-unit (pid $unit_pid) serves $endpoint"

set +e
timeout "$limit" "$build/jobs-client" "$endpoint"
client_rc=$?
set -e
[ $client_rc -ne 124 ] || fail "jobs-client did not finish within ${limit}s"

kill -TERM "$unit_pid"
unit_rc=""
for _ in $(seq $((limit * 10))); do
    if ! kill -0 "$unit_pid" 2>/dev/null; then
        set +e
        wait "$unit_pid"
        unit_rc=$?
        set -e
        break
    fi
    sleep 0.1
done
cat "$work/unit.err" >&2
[ -n "$unit_rc" ] || fail "jobs-unit did not exit within ${limit}s of SIGTERM"
unit_pid=""

[ $client_rc -eq 0 ] || fail "jobs-client exited $client_rc"
[ "$unit_rc" -eq 0 ] || fail "jobs-unit exited $unit_rc after SIGTERM"
echo "run.sh ($mode): OK: the client's checks passed and the unit stopped cleanly"
