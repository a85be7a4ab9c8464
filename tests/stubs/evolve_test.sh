#!/usr/bin/env bash
# evolve_test.sh - the storage examples against an evolved idl/storage.idl.
#
#   evolve_test.sh <ctlrpc source dir> <cmake> <cmake generator> <C compiler>
#                  <warning flags> <extra C flags> [<python>]
#
# docs/IDL.md promises that adding an op, a defaulted argument or a defaulted
# record field is safe on the wire. This checks the C side of that promise
# for real programs: a copy of idl/storage.idl gets
#   - a new defaulted argument of an existing op:  put(..., ttl_s: u32 = 0)
#   - a new defaulted field at the end of a record: BlobInfo.created_ms
#   - a new defaulted field at the start of one:    UnitStats.uptime_s
#   - a new op:                                      touch(...)
# and the storage examples (examples/storage: store.c, handlers.c, unit.c,
# cli.c, the real program sources, unmodified) are built against stubs
# generated from the copy, in a scratch CMake project, as the project builds
# them (C11, <warning flags> plus -Werror). Then:
#   (a) the build passes: code that fills generated structs with positional
#       initializers does not (a shifted or missing member is an error under
#       -Wextra -Werror), code that uses designated initializers, the
#       <SVC>_<NAME>_INIT macros or the _init() functions does;
#   (b) no positional initializer of a generated type is left in the
#       sources, even one the compiler accepts today (a list's {items,
#       count}): each is named with its file and line;
#   (c) the unit, whose handler table has no handler for the new op, refuses
#       to start and names it ("storage_serve: handlers->on_touch is NULL").
#
# CTL_EVOLVE_EXAMPLES=<dir> builds the sources in <dir> instead of the
# tree's examples/storage (to check an older revision, say).
set -euo pipefail

if [ $# -lt 6 ]; then
    echo "usage: $0 <ctlrpc source dir> <cmake> <cmake generator> <C compiler>" \
         "<warning flags> <extra C flags> [<python>]" >&2
    exit 2
fi
root=$1 cmake=$2 generator=$3 cc=$4 warnings=$5 cflags=$6 python=${7:-}
examples=${CTL_EVOLVE_EXAMPLES:-$root/examples/storage}
examples=$(cd "$examples" && pwd)

work=$(mktemp -d "${TMPDIR:-/tmp}/ctlrpc-evolve.XXXXXX")
trap 'rm -rf "$work"' EXIT
src=$work/src
bld=$work/build
log=$work/build.log
mkdir -p "$src"

fail() {
    echo "FAIL: $*" >&2
    exit 1
}

# ---- the evolved IDL --------------------------------------------------------
idl=$src/storage.idl
cp "$root/idl/storage.idl" "$idl"

# Insert the lines of $2 after the first line matching the ERE $1.
insert_after() {
    local pattern=$1 text=$2 out=$work/idl.tmp
    awk -v pat="$pattern" -v text="$text" '
        { print }
        !done && $0 ~ pat { print text; done = 1 }
        END { if (!done) exit 3 }' "$idl" > "$out" ||
        fail "idl/storage.idl changed: no line matches /$pattern/ to add to"
    mv "$out" "$idl"
}

insert_after '^[[:space:]]*pin: bool = false,[[:space:]]*$' \
'    /// Added by evolve_test.sh: seconds to keep the blob (0: for ever).
    ttl_s: u32 = 0,'
insert_after '^[[:space:]]*spilled: bool;[[:space:]]*$' \
'    /// Added by evolve_test.sh: when the blob was stored.
    created_ms: u64 = 0;'
insert_after '^record UnitStats[[:space:]]*\{' \
'    /// Added by evolve_test.sh, first: every other field moves.
    uptime_s: u64 = 0;'
cat >> "$idl" <<'EOF'

/// Added by evolve_test.sh: mark the blobs under `keys` as used at `at_ms`; returns how many.
op touch(keys: list<str>, at_ms: u64 = 0) -> u64 raises Missing;
EOF

# ---- the scratch project ------------------------------------------------------
cat > "$src/CMakeLists.txt" <<EOF
cmake_minimum_required(VERSION 3.25)
project(evolve C)
set(CMAKE_C_STANDARD 11)
set(CMAKE_C_STANDARD_REQUIRED ON)
set(CMAKE_C_EXTENSIONS OFF)
add_subdirectory("$root" ctlrpc)
separate_arguments(W UNIX_COMMAND "$warnings -Werror")
set(EX "$examples")

# As examples/CMakeLists.txt builds them, against the evolved IDL's stubs.
add_library(storage_stubs STATIC)
ctlrpc_generate(storage_stubs IDL \${CMAKE_CURRENT_SOURCE_DIR}/storage.idl)
target_compile_options(storage_stubs PRIVATE \${W})
add_library(storage_service STATIC \${EX}/store.c \${EX}/handlers.c)
target_include_directories(storage_service PUBLIC \${EX})
target_link_libraries(storage_service PUBLIC storage_stubs)
target_compile_options(storage_service PRIVATE \${W})
# fleet.c: the etcd flags both programs share (absent from older trees).
file(GLOB FLEET \${EX}/fleet.c)
add_executable(ctl-storage-unit \${EX}/unit.c \${FLEET})
target_link_libraries(ctl-storage-unit PRIVATE storage_service)
target_compile_options(ctl-storage-unit PRIVATE \${W})
add_executable(ctl-storage \${EX}/cli.c \${FLEET})
target_link_libraries(ctl-storage PRIVATE storage_stubs)
target_compile_options(ctl-storage PRIVATE \${W})
EOF

config=(-G "$generator" -S "$src" -B "$bld" -DCMAKE_BUILD_TYPE=Release
        -DCMAKE_C_COMPILER="$cc")
if [ -n "$cflags" ]; then
    config+=(-DCMAKE_C_FLAGS="$cflags" -DCMAKE_EXE_LINKER_FLAGS="$cflags")
fi
[ -n "$python" ] && config+=(-DCTLRPC_PYTHON="$python")
if ! "$cmake" "${config[@]}" > "$log" 2>&1; then
    cat "$log" >&2
    fail "configure"
fi

# ---- (a) it builds -------------------------------------------------------
if ! "$cmake" --build "$bld" -j2 > "$log" 2>&1; then
    echo "---- build output:" >&2
    cat "$log" >&2
    echo "----" >&2
    grep -E "error:" "$log" | grep -F "$examples/" | sort -u >&2 || true
    fail "the storage examples ($examples) do not build against stubs from an evolved" \
         "idl/storage.idl (a defaulted arg, two defaulted record fields, a new op):" \
         "use designated initializers or the <SVC>_<NAME>_INIT macros for generated types"
fi

header=$(find "$bld" -path '*ctlrpc-gen/storage/storage.ctl.h' | head -n 1)
[ -n "$header" ] || fail "no generated storage.ctl.h in $bld"
# The stubs did evolve.
for want in 'uint32_t ttl_s;' 'uint64_t created_ms;' 'uint64_t uptime_s;' \
            'storage_touch_handler *on_touch;' 'int storage_touch('; do
    grep -qF "$want" "$header" || fail "the generated header lacks '$want'"
done

# ---- (b) no positional initializers of generated types ------------------------
cat > "$work/positional.pl" <<'PERL'
# positional.pl <generated header> <source files...>: print each positional
# initializer of a type the header declares as "file:line: ..."; exit 1 if
# there is any.
use strict;
use warnings;

my $header = shift @ARGV;
my %generated;
open my $h, "<", $header or die "$header: $!";
while (<$h>) {
    $generated{$1} = 1 while /\btypedef\s+struct\s+\w+\s+(\w+)\s*;/g;
    $generated{$1} = 1 if /^\}\s*(\w+)\s*;/;
}
close $h;
die "no type names in $header\n" unless %generated;

my $bad = 0;
for my $file (@ARGV) {
    open my $fh, "<", $file or die "$file: $!";
    my $text = do { local $/; <$fh> };
    close $fh;
    # Blank out comments and string and character literals (lines kept).
    $text =~ s{(/\*.*?\*/|//[^\n]*|"(?:\\.|[^"\\\n])*"|'(?:\\.|[^'\\\n])*')}
              { (my $k = $1) =~ s/[^\n]/ /g; $k }gse;
    # "(T){" and "T name[...] = {" whose first element is not designated
    # (".m =", "[i] =", "{ .m =") nor the universal "{0}" or "{}".
    while ($text =~ /(?:\(\s*(?:const\s+)?(\w+)\s*\)|\b(\w+)\s+\**\s*\w+\s*(?:\[[^\]]*\]\s*)*=)
                     \s*\{(?!\s*[.\[}])(?!\s*0\s*\})(?!\s*\{\s*[.\[])/gx) {
        my $type = defined $1 ? $1 : $2;
        next unless $generated{$type};
        my $line = 1 + (substr($text, 0, $-[0]) =~ tr/\n//);
        print "$file:$line: positional initializer of $type\n";
        $bad = 1;
    }
}
exit $bad;
PERL
if ! positional=$(perl "$work/positional.pl" "$header" "$examples"/*.c "$examples"/*.h); then
    fail "positional initializers of generated types in the storage examples (name" \
         "each member: .items = ..., .count = ...; or start from <SVC>_<NAME>_INIT):
$positional"
fi

# ---- (c) the unit names the handler it lacks -------------------------------------
set +e
out=$(timeout 20 "$bld/ctl-storage-unit" --bind tcp://127.0.0.1:0 2>&1 < /dev/null)
rc=$?
set -e
[ $rc -eq 1 ] || fail "(c) ctl-storage-unit without a handler for the new op exited $rc, not 1: $out"
case $out in
*"storage_serve: handlers->on_touch is NULL"*) ;;
*) fail "(c) ctl-storage-unit did not name the missing handler: $out" ;;
esac

echo "evolve_test: the storage examples build and refuse to serve an op they lack ($examples)"
