#!/usr/bin/env bash
# walkthrough_test.sh - docs/USING.md's "Adding an op, step by step", followed to the letter.
#
#   walkthrough_test.sh <ctlrpc source dir> <cmake> <cmake generator> <C compiler> <python>
#                       [<sanitize: ON|OFF>]
#
# The walk-through's code blocks are marked in docs/USING.md with an HTML comment on the line
# before each one (<!-- walkthrough:NAME -->). This script takes those blocks, not copies of
# them, and applies them where the page says, to a copy of this tree in a temporary directory:
#   idl        appended to idl/storage.idl
#   handler    into examples/storage/handlers.c, above storage_unit_handlers()
#   table      into the table storage_unit_handlers() fills, after .on_stats
#   client     the start of a small program whose main() (written here) calls print_count()
#   test       into tests/storage/test_storage.c, above main()
#   test-list  into the list of tests in main()
# Then it builds the copy as the project builds itself (its warnings, -Werror), and
#   (a) starts the copy's ctl-storage-unit, puts three keys with its ctl-storage, and checks
#       the counts the client block prints;
#   (b) runs the copy's test_storage, filtered to the walk-through's test_count.
# A block that is missing, or a place in the sources that moved, fails the test naming it.
set -euo pipefail

if [ $# -lt 5 ]; then
    echo "usage: $0 <ctlrpc source dir> <cmake> <cmake generator> <C compiler> <python>" \
         "[<sanitize>]" >&2
    exit 2
fi
root=$1 cmake=$2 generator=$3 cc=$4 python=$5 sanitize=${6:-OFF}
doc=$root/docs/USING.md
limit=60 # seconds for each wait on a process

work=$(mktemp -d "${TMPDIR:-/tmp}/ctlrpc-walkthrough.XXXXXX")
unit_pid=""
cleanup() {
    if [ -n "$unit_pid" ] && kill -0 "$unit_pid" 2>/dev/null; then
        kill -KILL "$unit_pid" 2>/dev/null || true
        wait "$unit_pid" 2>/dev/null || true
    fi
    rm -rf "$work"
}
trap cleanup EXIT
src=$work/src
bld=$work/build
log=$work/log

fail() {
    echo "FAIL: $*" >&2
    exit 1
}

# ---- the blocks ---------------------------------------------------------------
mkdir -p "$work/blocks"
awk -v out="$work/blocks" '
    /^<!-- walkthrough:[a-z-]+ -->$/ {
        name = $0; sub(/^<!-- walkthrough:/, "", name); sub(/ -->$/, "", name)
        want = 1; next
    }
    want && /^```/ { want = 0; inside = 1; file = out "/" name; printf "" > file; next }
    want && !/^[[:space:]]*$/ { print "walkthrough marker " name " is not followed by a code block" > "/dev/stderr"; exit 3 }
    inside && /^```[[:space:]]*$/ { inside = 0; close(file); next }
    inside { print >> file }
' "$doc" || fail "$doc: malformed walkthrough block"
for name in idl handler table client test test-list; do
    [ -s "$work/blocks/$name" ] || fail "$doc has no <!-- walkthrough:$name --> code block"
done

# ---- the copy, changed as the page says ---------------------------------------------
mkdir -p "$src"
for d in CMakeLists.txt cmake man README.md docs runtime gen idl examples tests; do
    cp -R "$root/$d" "$src/"
done

# insert <where: before|after> <ERE> <block file> <file>: at the first matching line.
insert() {
    local where=$1 pattern=$2 block=$3 file=$4
    awk -v where="$where" -v pat="$pattern" -v block="$block" '
        function put(   line) { while ((getline line < block) > 0) print line; close(block) }
        !done && $0 ~ pat { if (where == "after") print; put(); if (where == "before") print; done = 1; next }
        { print }
        END { if (!done) exit 3 }' "$file" > "$file.new" ||
        fail "${file#"$src"/} changed: no line matches /$pattern/ to put the block $(basename "$block") $where"
    mv "$file.new" "$file"
}

{ echo; cat "$work/blocks/idl"; } >> "$src/idl/storage.idl"
insert before '^void storage_unit_handlers\(' "$work/blocks/handler" "$src/examples/storage/handlers.c"
insert after '\.on_stats = on_stats,' "$work/blocks/table" "$src/examples/storage/handlers.c"
insert before '^int main\(void\)' "$work/blocks/test" "$src/tests/storage/test_storage.c"
insert after 'const struct CMUnitTest tests\[\] = \{' "$work/blocks/test-list" \
    "$src/tests/storage/test_storage.c"
# Run only the walk-through's test (the file's others run in the project's own suite).
echo '    cmocka_set_test_filter("test_count");' > "$work/filter"
insert before 'return cmocka_run_group_tests' "$work/filter" "$src/tests/storage/test_storage.c"

# The client block, in a program of its own: count-client ADDRESS PREFIX.
{
    cat "$work/blocks/client"
    cat <<'EOF'

int main(int argc, char **argv)
{
    if (argc != 3)
        return 2;
    ctl_client *client = NULL;
    if (ctl_client_new(NULL, &client, NULL) != 0)
        return 1;
    int rc = print_count(client, argv[1], argv[2]);
    ctl_client_destroy(&client);
    return rc == 0 ? 0 : 1;
}
EOF
} > "$src/examples/storage/count_client.c"
cat >> "$src/examples/CMakeLists.txt" <<'EOF'

add_executable(count-client storage/count_client.c)
target_link_libraries(count-client PRIVATE storage_stubs)
target_compile_options(count-client PRIVATE ${CTLRPC_WARNINGS})
EOF

# The handler is declared with its generated type: the page must name it as the generator does.
"$python" "$src/gen/ctlrpc-gen" "$src/idl/storage.idl" -o "$work/probe" > "$log" 2>&1 ||
    { cat "$log" >&2; fail "ctlrpc-gen rejects idl/storage.idl with the walk-through's op"; }
grep -q 'typedef int storage_count_handler(' "$work/probe/storage.ctl.h" ||
    fail "the generated header declares no storage_count_handler: docs/USING.md names the type wrong"

# ---- build -------------------------------------------------------------------------
config=(-G "$generator" -S "$src" -B "$bld" -DCMAKE_BUILD_TYPE=RelWithDebInfo
        -DCMAKE_C_COMPILER="$cc" -DCTLRPC_PYTHON="$python" -DCTLRPC_TESTS=ON
        -DCTLRPC_SANITIZE="$sanitize")
"$cmake" "${config[@]}" > "$log" 2>&1 || { cat "$log" >&2; fail "configure"; }
if ! "$cmake" --build "$bld" -j2 --target ctl-storage-unit ctl-storage count-client test_storage \
        > "$log" 2>&1; then
    cat "$log" >&2
    fail "the walk-through's changes do not build"
fi
exe() { find "$bld" -type f -name "$1" -perm -u+x | head -n 1; }
unit=$(exe ctl-storage-unit) cli=$(exe ctl-storage) client=$(exe count-client)
tests=$(exe test_storage)
[ -n "$unit" ] && [ -n "$cli" ] && [ -n "$client" ] && [ -n "$tests" ] ||
    fail "the build made no ctl-storage-unit, ctl-storage, count-client or test_storage"

# ---- (a) a unit, the new op, the client block ---------------------------------------------
"$unit" --bind tcp://127.0.0.1:0 > "$work/unit.out" 2> "$work/unit.err" &
unit_pid=$!
endpoint=""
for _ in $(seq $((limit * 10))); do
    if [ "$(wc -l < "$work/unit.out")" -ge 1 ]; then
        endpoint=$(head -n 1 "$work/unit.out")
        break
    fi
    kill -0 "$unit_pid" 2>/dev/null || break
    sleep 0.1
done
[ -n "$endpoint" ] || { cat "$work/unit.err" >&2; fail "ctl-storage-unit printed no endpoint"; }
for key in logs/1 logs/2 data; do
    echo "$key" | timeout "$limit" "$cli" --address "$endpoint" put "$key" - > /dev/null ||
        fail "ctl-storage put $key"
done
expect_count() { # <prefix> <expected line>
    local got
    got=$(timeout "$limit" "$client" "$endpoint" "$1") || fail "count-client '$1' failed: $got"
    [ "$got" = "$2" ] || fail "count-client '$1' printed '$got', not '$2'"
}
expect_count "logs/" "2 keys under 'logs/'"
expect_count "" "3 keys under ''"
expect_count "nothing/" "0 keys under 'nothing/'"
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
[ -n "$unit_rc" ] || fail "ctl-storage-unit did not exit after SIGTERM"
unit_pid=""
[ "$unit_rc" -eq 0 ] || { cat "$work/unit.err" >&2; fail "ctl-storage-unit exited $unit_rc"; }

# ---- (b) the test block -------------------------------------------------------------------
if ! timeout 120 "$tests" > "$log" 2>&1; then
    cat "$log" >&2
    fail "test_storage (test_count) failed"
fi
grep -q 'test_count' "$log" && grep -qE 'PASSED.*\b1 test' "$log" ||
    { cat "$log" >&2; fail "test_storage did not run test_count alone"; }

echo "walkthrough_test: docs/USING.md's new op builds, serves and passes its test"
