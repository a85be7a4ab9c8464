/*
 * test_store.c - the storage unit's store through its own API (store.h),
 * without a unit or a socket: its key-ordered index against a reference.
 *
 * Random puts (new keys, overwrites, puts refused as pinned, as too large
 * for memory or for the index), removes, aborts of pinned blobs and
 * spills, over keys that are prefixes of each other, hold NUL bytes and
 * bytes above 0x7f, the empty key among them. After every change the
 * store's own check (store_check: the tree's order, colours, parent links
 * and black heights, and that it holds exactly the table's keys) must
 * pass, and store_list with random prefixes, `after` keys and maxima must
 * give what a sorted reference array gives.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>

#include <ftw.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "store.h"

#define N_OF(a) (sizeof(a) / sizeof((a)[0]))
#define S(lit) ((ctl_str){(lit), sizeof(lit) - 1})

/* ---- the reference: a sorted array of keys ----------------------------- */

#define KEY_MAX 5

typedef struct ref_key {
    char bytes[KEY_MAX];
    size_t len;
    bool pinned;
} ref_key;

typedef struct ref {
    ref_key *keys;
    size_t n, cap;
} ref;

static int cmp_bytes(const char *a, size_t alen, const char *b, size_t blen)
{
    size_t n = alen < blen ? alen : blen;
    int c = n ? memcmp(a, b, n) : 0;
    return c ? c : (alen > blen) - (alen < blen);
}

/* Where `k` is in the reference, or where it would go; *found says which. */
static size_t ref_place(const ref *r, ctl_str k, bool *found)
{
    size_t lo = 0, hi = r->n;
    while (lo < hi) {
        size_t mid = lo + (hi - lo) / 2;
        int c = cmp_bytes(r->keys[mid].bytes, r->keys[mid].len, k.ptr, k.len);
        if (c == 0) {
            *found = true;
            return mid;
        }
        if (c < 0)
            lo = mid + 1;
        else
            hi = mid;
    }
    *found = false;
    return lo;
}

static void ref_put(ref *r, ctl_str k, bool pin)
{
    bool found;
    size_t i = ref_place(r, k, &found);
    if (!found) {
        if (r->n == r->cap) {
            r->cap = r->cap ? 2 * r->cap : 64;
            r->keys = realloc(r->keys, r->cap * sizeof *r->keys);
            assert_non_null(r->keys);
        }
        memmove(&r->keys[i + 1], &r->keys[i], (r->n - i) * sizeof *r->keys);
        memcpy(r->keys[i].bytes, k.ptr, k.len);
        r->keys[i].len = k.len;
        r->keys[i].pinned = false;
        r->n++;
    }
    if (pin)
        r->keys[i].pinned = true;
}

static void ref_remove(ref *r, ctl_str k)
{
    bool found;
    size_t i = ref_place(r, k, &found);
    if (!found)
        return;
    memmove(&r->keys[i], &r->keys[i + 1], (r->n - i - 1) * sizeof *r->keys);
    r->n--;
}

/* ---- random keys --------------------------------------------------------- */

static uint64_t next_rand(uint64_t *x)
{
    *x ^= *x << 13;
    *x ^= *x >> 7;
    *x ^= *x << 17;
    return *x;
}

/* A key of 0 to `most` bytes over an alphabet of four, NUL and a byte
 * above 0x7f among them: many keys are prefixes of others. */
static ctl_str random_key(uint64_t *x, char buf[KEY_MAX], size_t most)
{
    static const char alphabet[] = {'a', 'b', '\0', (char)0xe9};
    size_t len = next_rand(x) % (most + 1);
    for (size_t i = 0; i < len; i++)
        buf[i] = alphabet[next_rand(x) % 4];
    return (ctl_str){buf, len};
}

/* ---- comparing a listing with the reference ------------------------------ */

typedef struct listing {
    ctl_str got[64];
    size_t n;
} listing;

static void collect(const store_blob *b, void *arg)
{
    listing *l = arg;
    assert_true(l->n < N_OF(l->got));
    l->got[l->n++] = b->key;
}

static bool ref_has_prefix(const ref_key *k, ctl_str prefix)
{
    return k->len >= prefix.len && (prefix.len == 0 || memcmp(k->bytes, prefix.ptr,
                                                              prefix.len) == 0);
}

static void list_matches_ref(store *s, const ref *r, ctl_str prefix, ctl_str after,
                             size_t max)
{
    listing l = {.n = 0};
    size_t n = store_list(s, prefix, after, max, collect, &l);
    assert_int_equal(n, l.n);
    size_t want = 0;
    for (size_t i = 0; i < r->n && want < max; i++) {
        const ref_key *k = &r->keys[i];
        if (!ref_has_prefix(k, prefix) ||
            (after.len && cmp_bytes(k->bytes, k->len, after.ptr, after.len) <= 0))
            continue;
        if (want >= l.n)
            fail_msg("list (prefix of %zu bytes, after %zu bytes, max %zu) gave %zu keys, "
                     "fewer than the reference", prefix.len, after.len, max, l.n);
        assert_int_equal(l.got[want].len, k->len);
        if (k->len)
            assert_memory_equal(l.got[want].ptr, k->bytes, k->len);
        want++;
    }
    assert_int_equal(l.n, want);
}

static void check_sound(store *s)
{
    const char *why = store_check(s);
    if (why)
        fail_msg("store_check: %s", why);
}

/* ---- tests --------------------------------------------------------------- */

static char spill_dir[64];

static int rm_entry(const char *path, const struct stat *st, int flag, struct FTW *ftw)
{
    (void)st, (void)flag, (void)ftw;
    return remove(path);
}

/* What a run of random changes met. */
typedef struct outcome {
    size_t left;         /* keys held at the end */
    size_t no_room;      /* puts refused: the bytes do not fit */
    size_t no_key_room;  /* puts refused: the index is full */
    size_t busy;         /* puts refused: the blob is pinned */
    size_t spilled;      /* puts that went to a file */
} outcome;

/* `ops` random changes to a store of `capacity` bytes in memory and room
 * in its index for `keys` keys, spilling when `spill`, each followed by a
 * check and every few by random listings. */
static outcome random_ops(uint64_t seed, int ops, uint64_t capacity, size_t keys, bool spill)
{
    store *s = NULL;
    ctl_error err;
    ctl_error_init(&err);
    if (spill) {
        snprintf(spill_dir, sizeof spill_dir, "/tmp/ctl-test-store-XXXXXX");
        assert_non_null(mkdtemp(spill_dir));
    }
    assert_int_equal(store_new(capacity, spill ? spill_dir : NULL, &s, &err), 0);
    store_set_limits(s, KEY_MAX, (uint64_t)keys * (KEY_MAX + STORE_BLOB_OVERHEAD), 0);
    ref r = {NULL, 0, 0};
    uint64_t x = seed;
    outcome o = {0, 0, 0, 0, 0};
    static const char data[] = "0123456789012345678901234567890123456789";
    for (int i = 0; i < ops; i++) {
        char kb[KEY_MAX];
        ctl_str k = random_key(&x, kb, KEY_MAX);
        bool found;
        size_t at = ref_place(&r, k, &found);
        unsigned what = next_rand(&x) % 10;
        if (what < 6) {
            bool pin = next_rand(&x) % 8 == 0;
            ctl_str d = {data, next_rand(&x) % (sizeof data - 1)};
            int rc = store_put(s, k, d, NULL, pin, NULL, &err);
            if (found && r.keys[at].pinned) {
                assert_int_equal(rc, CTL_BUSY);
                o.busy++;
            } else if (rc == CTL_UNIT_FULL) {
                if (strstr(err.msg, "no room for another key"))
                    o.no_key_room++;
                else
                    o.no_room++;
            } else {
                assert_int_equal(rc, 0);
                ref_put(&r, k, pin);
                o.spilled += store_find(s, k)->spilled;
            }
        } else if (what < 8) {
            store_remove(s, k); /* pinned or not, as delete does */
            ref_remove(&r, k);
        } else if (what < 9) {
            store_blob *b = store_find(s, k); /* abort: the unpinned only */
            assert_true((b != NULL) == found);
            if (b && !b->pinned) {
                store_remove(s, k);
                ref_remove(&r, k);
            }
        } else if (found) {
            store_set_pinned(s, store_find(s, k), false);
            r.keys[at].pinned = false;
        }
        check_sound(s);
        store_totals t;
        store_totals_get(s, &t);
        assert_int_equal(t.blobs, r.n);
        if (i % 7 == 0) {
            char pb[KEY_MAX], ab[KEY_MAX];
            ctl_str prefix = random_key(&x, pb, 3);
            ctl_str after = next_rand(&x) % 3 ? random_key(&x, ab, KEY_MAX) : S("");
            size_t max = next_rand(&x) % 4 == 0 ? 64 : next_rand(&x) % 20;
            list_matches_ref(s, &r, prefix, after, max);
            list_matches_ref(s, &r, S(""), after, max);
        }
    }
    o.left = r.n;
    print_message("seed %" PRIu64 ": %d changes, %zu keys left; puts refused: %zu for "
                  "memory, %zu for the index, %zu pinned; %zu spilled\n", seed, ops, o.left,
                  o.no_room, o.no_key_room, o.busy, o.spilled);
    store_destroy(&s);
    free(r.keys);
    ctl_error_fini(&err);
    if (spill)
        nftw(spill_dir, rm_entry, 8, FTW_DEPTH | FTW_PHYS);
    /* Each run must meet what it is for, or it tested less than it says. */
    assert_true(o.left > 0);
    assert_true(o.busy > 0);
    return o;
}

/* Memory full (no spilling) and the index full: refusals leave no trace. */
static void test_random_refusals(void **state)
{
    (void)state;
    outcome o = random_ops(0x9e3779b97f4a7c15ull, 20000, 4000, 400, false);
    assert_true(o.no_room > 0);
    assert_true(o.no_key_room > 0);
}

/* Plenty of room: the store holds most of the 1365 possible keys. */
static void test_random_roomy(void **state)
{
    (void)state;
    outcome o = random_ops(0x2545f4914f6cdd1dull, 20000, 1 << 20, 2000, false);
    assert_int_equal(o.no_room + o.no_key_room, 0);
    assert_true(o.left > 500);
}

/* Spilling: most blobs go to files, and their nodes are indexed the same. */
static void test_random_spill(void **state)
{
    (void)state;
    outcome o = random_ops(0xd1b54a32d192ed03ull, 4000, 64, 2000, true);
    assert_true(o.spilled > o.left);
}

static void put_ok(store *s, ctl_str k)
{
    ctl_error err;
    ctl_error_init(&err);
    if (store_put(s, k, S("v"), NULL, false, NULL, &err) != 0)
        fail_msg("put: %s", err.msg);
    ctl_error_fini(&err);
}

/* Keys in ascending and then descending order (what unbalances a plain
 * search tree) keep the tree sound, and removing every other one too;
 * paging through them with `after` yields each once, in order. */
static void test_sorted_inserts(void **state)
{
    (void)state;
    enum { N = 100000 };
    store *s = NULL;
    ctl_error err;
    ctl_error_init(&err);
    assert_int_equal(store_new((uint64_t)1 << 30, NULL, &s, &err), 0);
    store_set_limits(s, 0, (uint64_t)1 << 30, 0);
    char key[16];
    for (int i = 0; i < N; i += 2)
        put_ok(s, (ctl_str){key, (size_t)snprintf(key, sizeof key, "%08d", i)});
    for (int i = N - 1; i > 0; i -= 2)
        put_ok(s, (ctl_str){key, (size_t)snprintf(key, sizeof key, "%08d", i)});
    check_sound(s);
    for (int i = 0; i < N; i += 2)
        store_remove(s, (ctl_str){key, (size_t)snprintf(key, sizeof key, "%08d", i)});
    check_sound(s);
    char last[16] = "";
    size_t last_len = 0;
    int seen = 0;
    for (;;) {
        listing l = {.n = 0};
        size_t n = store_list(s, S(""), (ctl_str){last, last_len}, N_OF(l.got), collect, &l);
        for (size_t k = 0; k < n; k++, seen++) {
            int len = snprintf(key, sizeof key, "%08d", 2 * seen + 1);
            assert_int_equal(l.got[k].len, (size_t)len);
            assert_memory_equal(l.got[k].ptr, key, (size_t)len);
        }
        if (n < N_OF(l.got))
            break;
        last_len = l.got[n - 1].len;
        memcpy(last, l.got[n - 1].ptr, last_len);
    }
    assert_int_equal(seen, N / 2);
    store_destroy(&s);
    ctl_error_fini(&err);
}

/* The seeks at the edges: the empty key, `after` before, inside and past
 * the prefix's run, an `after` that is not a key, and a maximum of 0. */
static void test_list_edges(void **state)
{
    (void)state;
    store *s = NULL;
    ctl_error err;
    ctl_error_init(&err);
    assert_int_equal(store_new(1 << 20, NULL, &s, &err), 0);
    const ctl_str keys[] = {S(""), S("a"), S("b"), S("b\0"), S("b/1"), S("b/2"), S("ba"),
                            S("c")};
    for (size_t i = N_OF(keys); i-- > 0;)
        put_ok(s, keys[i]);
    ref r = {NULL, 0, 0};
    for (size_t i = 0; i < N_OF(keys); i++)
        ref_put(&r, keys[i], false);
    const ctl_str probes[] = {S(""), S("\0"), S("a"), S("az"), S("b"), S("b\0"), S("b/"),
                              S("b/1"), S("b/15"), S("b/2"), S("b/3"), S("bb"), S("c"),
                              S("d"), S("\xff")};
    for (size_t p = 0; p < N_OF(probes); p++)
        for (size_t a = 0; a < N_OF(probes); a++)
            for (size_t max = 0; max < 4; max++) {
                list_matches_ref(s, &r, probes[p], probes[a], max);
                list_matches_ref(s, &r, probes[p], probes[a], 64);
            }
    listing l = {.n = 0};
    assert_int_equal(store_list(s, S(""), S(""), 64, collect, &l), N_OF(keys));
    assert_int_equal(l.got[0].len, 0); /* the empty key comes first */
    free(r.keys);
    store_destroy(&s);
    ctl_error_fini(&err);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_list_edges),
        cmocka_unit_test(test_random_refusals),
        cmocka_unit_test(test_random_roomy),
        cmocka_unit_test(test_random_spill),
        cmocka_unit_test(test_sorted_inserts),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
