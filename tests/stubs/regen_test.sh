#!/usr/bin/env bash
# regen_test.sh - ctlrpc_generate() as a user's project meets it.
#
#   regen_test.sh <ctlrpc source dir> <cmake> <cmake generator> <C compiler> [<python>]
#
# In a temporary directory, a standalone CMake project add_subdirectory()s
# the ctlrpc source tree (as a subproject it builds only the library and the
# generator step), generates stubs from its own copy
# of tests/gen/good/everything.idl (and of the IDL that imports) with
# ctlrpc_generate(), and builds and runs a main.c that uses them. Then:
#   (a) a rebuild without changes runs neither ctlrpc-gen nor the compiler;
#   (b) touching the IDL, or an IDL it imports, reruns ctlrpc-gen, and the
#       build after that is quiet again;
#   (c) appending an op to the IDL and a call of its stub to main.c builds
#       and runs with no other step;
#   (d) a broken IDL fails the build with the generator's compiler-style
#       `path:line:col: error:` diagnostic in the build output;
#   (e) repairing the IDL builds again.
set -euo pipefail

if [ $# -lt 4 ]; then
    echo "usage: $0 <ctlrpc source dir> <cmake> <cmake generator> <C compiler> [<python>]" >&2
    exit 2
fi
root=$1 cmake=$2 generator=$3 cc=$4 python=${5:-}

work=$(mktemp -d "${TMPDIR:-/tmp}/ctlrpc-regen.XXXXXX")
trap 'rm -rf "$work"' EXIT
src=$work/src
bld=$work/build
log=$work/build.log
mkdir -p "$src/inc"
cp "$root/tests/gen/good/everything.idl" "$src/svc.idl"
cp "$root/tests/gen/good/inc/common.idl" "$src/inc/common.idl"

cat > "$src/CMakeLists.txt" <<EOF
cmake_minimum_required(VERSION 3.25)
project(regen C)
set(CMAKE_C_STANDARD 11)
set(CMAKE_C_STANDARD_REQUIRED ON)
add_subdirectory("$root" ctlrpc)
add_executable(app main.c)
target_compile_options(app PRIVATE -Wall -Wextra -Werror)
ctlrpc_generate(app IDL \${CMAKE_CURRENT_SOURCE_DIR}/svc.idl)
EOF

write_main() { # $1: extra statements in main
    cat > "$src/main.c" <<EOF
#include <stdio.h>

#include "svc.ctl.h"

int main(void)
{
    ctl_error err;
    int rc = 0;
    ctl_error_init(&err);
    printf("ops=%zu\n", everything_service.op_count);
$1
    ctl_error_fini(&err);
    return rc;
}
EOF
}

fail() {
    echo "FAIL ($generator): $*" >&2
    if [ -f "$log" ]; then
        echo "---- last build output:" >&2
        cat "$log" >&2
    fi
    exit 1
}

build() { "$cmake" --build "$bld" -j2 > "$log" 2>&1; }
ran_gen() { grep -q "ctlrpc-gen svc.idl" "$log"; }
compiled() { grep -Eq "Building C object|Linking C executable" "$log"; }
# Let the next edit get a later mtime even on coarse-grained filesystems.
tick() { sleep 1; }

write_main ""
config=(-G "$generator" -S "$src" -B "$bld" -DCMAKE_BUILD_TYPE=Release
        -DCMAKE_C_COMPILER="$cc")
[ -n "$python" ] && config+=(-DCTLRPC_PYTHON="$python")
"$cmake" "${config[@]}" > "$log" 2>&1 || fail "configure"

build || fail "first build"
ran_gen || fail "first build did not run ctlrpc-gen"
out=$("$bld/app") || fail "app failed: $out"
[ "$out" = "ops=9" ] || fail "app printed '$out', expected ops=9"

# (a)
build || fail "rebuild"
! ran_gen || fail "(a) a rebuild without changes reran ctlrpc-gen"
! compiled || fail "(a) a rebuild without changes recompiled"

# (b)
tick
touch "$src/svc.idl"
build || fail "build after touching the IDL"
ran_gen || fail "(b) touching the IDL did not rerun ctlrpc-gen"
build || fail "rebuild after touching the IDL"
! ran_gen || fail "(b) ctlrpc-gen ran again on the next build"
! compiled || fail "(b) the next build recompiled"
tick
touch "$src/inc/common.idl"
build || fail "build after touching the imported IDL"
ran_gen || fail "(b) touching the imported IDL did not rerun ctlrpc-gen"
build || fail "rebuild after touching the imported IDL"
! ran_gen || fail "(b) ctlrpc-gen ran again after the import was touched"

# (c)
tick
cp "$src/svc.idl" "$work/svc.idl.orig"
cat >> "$src/svc.idl" <<'EOF'

/// Added by the regeneration test.
op added(x: u32, y: str = "why") -> u64 raises Busy;
EOF
write_main '    {
        everything_added_args a;
        uint64_t result = 0;
        everything_added_args_init(&a);
        a.x = 7;
        /* No client: the stub refuses before sending anything. */
        rc = everything_added(NULL, "tcp://127.0.0.1:1", &a, 10, &result, &err);
        printf("added=%s\n", ctl_kind_name(rc));
        rc = rc == CTL_INVALID ? 0 : 1;
    }'
build || fail "(c) build after adding an op"
ran_gen || fail "(c) adding an op did not rerun ctlrpc-gen"
out=$("$bld/app") || fail "(c) app failed: $out"
[ "$out" = "ops=10
added=Invalid" ] || fail "(c) app printed '$out'"

# (d)
tick
cp "$src/svc.idl" "$work/svc.idl.good"
printf '\nop broken(x: strng);\n' >> "$src/svc.idl"
line=$(wc -l < "$src/svc.idl")
if build; then
    fail "(d) the build passed with a broken IDL"
fi
grep -Eq "svc\.idl:$line:[0-9]+: error: unknown type 'strng'" "$log" ||
    fail "(d) no 'svc.idl:$line:<col>: error: unknown type' diagnostic in the build output"

# (e)
tick
cp "$work/svc.idl.good" "$src/svc.idl"
build || fail "(e) build after repairing the IDL"
out=$("$bld/app") || fail "(e) app failed: $out"
[ "$out" = "ops=10
added=Invalid" ] || fail "(e) app printed '$out'"

echo "regen_test ($generator): all steps passed"
