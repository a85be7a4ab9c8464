/*
 * client.c - skew-client-v1 and skew-client-today: one storage session
 * through generated C stubs, for the skew tests.
 *
 *   skew-client-{v1,today} --address ADDR [--old-unit]
 *
 * The same source is built twice: against the stubs of
 * tests/skew/storage_v1.idl (the first release) and against those of
 * idl/storage.idl (today; SKEW_TODAY defined). Each runs the session below
 * against one unit, which holds no blobs when it starts, and checks every
 * outcome: put, get (and Missing), describe, pin, delete (Busy while
 * pinned), unpin (a notify), list, stats and stats_many. It prints one
 * line "ok STEP" per step and exits 0, or prints "FAIL STEP: why" and
 * exits 1 at the first outcome that is not what it should be.
 *
 * Built from today's IDL, it also checks what differs with the unit's
 * release (--old-unit: one built from the first release's IDL): the index
 * fields of stats (0 from an old unit, which does not send them; above 0
 * from today's), and list with a `limit` (an old unit refuses the argument
 * with a Protocol error naming it; today's returns one page).
 */
#define _GNU_SOURCE
#include <getopt.h>
#include <inttypes.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#ifdef SKEW_TODAY
#include "storage.ctl.h"
#else
#include "storage_v1.ctl.h"
#endif

#define TIMEOUT_MS 10000

static ctl_client *client;
static const char *address;
static ctl_error err;

static bool same(ctl_str s, const char *want)
{
    return s.len == strlen(want) && memcmp(s.ptr, want, s.len) == 0;
}

#define FAIL(step, ...)                                                        \
    do {                                                                       \
        printf("FAIL %s: ", step);                                             \
        printf(__VA_ARGS__);                                                   \
        printf("\n");                                                          \
        exit(1);                                                               \
    } while (0)

/* A call that must succeed: its error ends the session. */
#define MUST(step, call)                                                       \
    do {                                                                       \
        if ((call) != 0)                                                       \
            FAIL(step, "%s: %s", ctl_kind_name(err.kind), err.msg);            \
    } while (0)

static void ok(const char *step)
{
    printf("ok %s\n", step);
    fflush(stdout);
}

static storage_list_str keys_of(const ctl_str *items, size_t n)
{
    return (storage_list_str){items, n};
}

static void put(const char *step, const char *key, const char *data, bool pin)
{
    storage_put_args a = STORAGE_PUT_ARGS_INIT;
    a.key = ctl_str_c(key);
    a.data = ctl_str_c(data);
    a.pin = pin;
    uint64_t stored = 0;
    MUST(step, storage_put(client, address, &a, TIMEOUT_MS, &stored, &err));
    if (stored != strlen(data))
        FAIL(step, "stored %" PRIu64 " bytes, not %zu", stored, strlen(data));
    ok(step);
}

static void get_and_missing(void)
{
    const ctl_str keys[] = {ctl_str_c("skew/p"), ctl_str_c("skew/a")};
    storage_get_args a = STORAGE_GET_ARGS_INIT;
    a.keys = keys_of(keys, 2);
    storage_list_bin blobs;
    ctl_reply *reply = NULL;
    MUST("get", storage_get(client, address, &a, TIMEOUT_MS, &blobs, &reply, &err));
    if (blobs.count != 2 || !same(blobs.items[0], "pinned!") || !same(blobs.items[1], "alpha"))
        FAIL("get", "got %zu blobs, not 'pinned!' and 'alpha'", blobs.count);
    ctl_reply_destroy(&reply);
    ok("get");

    const ctl_str absent[] = {ctl_str_c("skew/a"), ctl_str_c("skew/none")};
    a.keys = keys_of(absent, 2);
    if (storage_get(client, address, &a, TIMEOUT_MS, &blobs, &reply, &err) != CTL_MISSING)
        FAIL("get-missing", "expected Missing, got %s", ctl_kind_name(err.kind));
    if (err.blob_count != 1 || !same(err.blobs[0], "skew/none"))
        FAIL("get-missing", "Missing names %zu blobs, not skew/none", err.blob_count);
    ok("get-missing");
}

static void describe(const char *step, bool a_pinned)
{
    const ctl_str keys[] = {ctl_str_c("skew/a"), ctl_str_c("skew/p")};
    storage_describe_args a = STORAGE_DESCRIBE_ARGS_INIT;
    a.keys = keys_of(keys, 2);
    storage_list_BlobInfo info;
    ctl_reply *reply = NULL;
    MUST(step, storage_describe(client, address, &a, TIMEOUT_MS, &info, &reply, &err));
    if (info.count != 2 || !same(info.items[0].key, "skew/a") || info.items[0].size != 5 ||
        info.items[0].pinned != a_pinned || info.items[0].spilled ||
        !same(info.items[1].key, "skew/p") || info.items[1].size != 7 ||
        !info.items[1].pinned)
        FAIL(step, "not skew/a (5 bytes%s) and skew/p (7 bytes, pinned)",
             a_pinned ? ", pinned" : "");
    ctl_reply_destroy(&reply);
    ok(step);
}

static void pin_delete_unpin(void)
{
    const ctl_str a_key[] = {ctl_str_c("skew/a")};
    storage_pin_args pa = STORAGE_PIN_ARGS_INIT;
    pa.keys = keys_of(a_key, 1);
    uint64_t n = 0;
    MUST("pin", storage_pin(client, address, &pa, TIMEOUT_MS, &n, &err));
    if (n != 1)
        FAIL("pin", "%" PRIu64 " blobs pinned, not 1", n);
    ok("pin");
    describe("describe-pinned", true);

    storage_delete_args da = STORAGE_DELETE_ARGS_INIT;
    da.keys = keys_of(a_key, 1);
    if (storage_delete(client, address, &da, TIMEOUT_MS, &n, &err) != CTL_BUSY ||
        !err.reason || strcmp(err.reason, "pinned") != 0)
        FAIL("delete-pinned", "expected Busy \"pinned\", got %s", ctl_kind_name(err.kind));
    ok("delete-pinned");

    storage_unpin_args ua = STORAGE_UNPIN_ARGS_INIT;
    ua.keys = keys_of(a_key, 1);
    MUST("unpin", storage_unpin(client, address, &ua, &err));
    /* A notify gets no reply: wait, within a deadline, until the unit has
     * served it (a delete succeeds once skew/a is unpinned). */
    struct timespec t0, now;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    for (;;) {
        int rc = storage_delete(client, address, &da, TIMEOUT_MS, &n, &err);
        if (rc == 0 && n == 1)
            break;
        if (rc != CTL_BUSY)
            FAIL("unpin", "delete after unpin: %s: %s", ctl_kind_name(err.kind),
                 rc ? err.msg : "deleted nothing");
        clock_gettime(CLOCK_MONOTONIC, &now);
        if (now.tv_sec - t0.tv_sec > TIMEOUT_MS / 1000)
            FAIL("unpin", "skew/a still pinned after %d ms", TIMEOUT_MS);
    }
    ok("unpin");
}

static void list(const char *step, const char *prefix, const char *const *want, size_t n)
{
    storage_list_args a = STORAGE_LIST_ARGS_INIT; /* paging args at their defaults */
    a.prefix = ctl_str_c(prefix);
    storage_list_str keys;
    ctl_reply *reply = NULL;
    MUST(step, storage_list(client, address, &a, TIMEOUT_MS, &keys, &reply, &err));
    if (keys.count != n)
        FAIL(step, "%zu keys, not %zu", keys.count, n);
    for (size_t i = 0; i < n; i++)
        if (!same(keys.items[i], want[i]))
            FAIL(step, "key %zu is '%.*s', not '%s'", i, (int)keys.items[i].len,
                 keys.items[i].ptr, want[i]);
    ctl_reply_destroy(&reply);
    ok(step);
}

#ifdef SKEW_TODAY
/* list with a limit: the paging an old unit does not have. */
static void list_limit(bool old_unit)
{
    storage_list_args a = STORAGE_LIST_ARGS_INIT;
    a.limit = 1;
    storage_list_str keys;
    ctl_reply *reply = NULL;
    int rc = storage_list(client, address, &a, TIMEOUT_MS, &keys, &reply, &err);
    if (old_unit) {
        if (rc != CTL_TRANSFER || err.cause != CTL_CAUSE_REMOTE || !strstr(err.msg, "limit"))
            FAIL("list-limit", "expected a Protocol error naming 'limit', got %s: %s",
                 ctl_kind_name(err.kind), rc ? err.msg : "a page");
    } else {
        if (rc != 0)
            FAIL("list-limit", "%s: %s", ctl_kind_name(err.kind), err.msg);
        if (keys.count != 1 || !same(keys.items[0], "other"))
            FAIL("list-limit", "%zu keys, not the one key 'other'", keys.count);
        ctl_reply_destroy(&reply);
    }
    ok("list-limit");
}
#endif

static void check_stats(const char *step, const storage_UnitStats *s, bool old_unit)
{
    if (s->blobs != 3 || s->bytes != 12 || s->pinned != 1 || s->spilled != 0 ||
        s->capacity == 0 || s->requests == 0)
        FAIL(step, "blobs %" PRIu64 ", bytes %" PRIu64 ", pinned %" PRIu64 ", spilled %" PRIu64
             ", capacity %" PRIu64 ", requests %" PRIu64
             ": not 3 blobs of 12 bytes, one pinned, none spilled",
             s->blobs, s->bytes, s->pinned, s->spilled, s->capacity, s->requests);
#ifdef SKEW_TODAY
    /* An old unit does not send the index fields: they take their default. */
    if (old_unit ? s->index_bytes != 0 || s->index_capacity != 0
                 : s->index_bytes == 0 || s->index_capacity == 0)
        FAIL(step, "index_bytes %" PRIu64 ", index_capacity %" PRIu64 " from %s unit",
             s->index_bytes, s->index_capacity, old_unit ? "an old" : "today's");
#else
    (void)old_unit;
#endif
    ok(step);
}

static void stats(bool old_unit)
{
    storage_UnitStats s;
    ctl_reply *reply = NULL;
    MUST("stats", storage_stats(client, address, TIMEOUT_MS, &s, &reply, &err));
    check_stats("stats", &s, old_unit);
    ctl_reply_destroy(&reply);

    storage_stats_outcome out[2];
    const char *addrs[2] = {address, address};
    if (storage_stats_many(client, addrs, 2, TIMEOUT_MS, out) != 0)
        FAIL("stats-many", "%s: %s", ctl_kind_name(out[0].error.kind),
             out[0].error.kind ? out[0].error.msg : out[1].error.msg);
    check_stats("stats-many", &out[0].result, old_unit);
    check_stats("stats-many", &out[1].result, old_unit);
    storage_stats_outcomes_fini(out, 2);
}

int main(int argc, char **argv)
{
    static const struct option opts[] = {{"address", required_argument, NULL, 'a'},
                                         {"old-unit", no_argument, NULL, 'o'},
                                         {NULL, 0, NULL, 0}};
    bool old_unit = false;
    int o;
    while ((o = getopt_long(argc, argv, "", opts, NULL)) != -1) {
        if (o == 'a')
            address = optarg;
        else if (o == 'o')
            old_unit = true;
        else
            return 2;
    }
    if (!address) {
        fprintf(stderr, "usage: %s --address ADDR [--old-unit]\n", argv[0]);
        return 2;
    }
    ctl_error_init(&err);
    if (ctl_client_new(NULL, &client, &err) != 0)
        FAIL("client", "%s", err.msg);

    put("put", "skew/a", "alpha", false);
    put("put-pinned", "skew/p", "pinned!", true);
    get_and_missing();
    describe("describe", false);
    pin_delete_unpin();
    put("put-again", "skew/a", "alpha", false);
    put("put-other", "other", "", false);
    static const char *const all[] = {"other", "skew/a", "skew/p"};
    list("list", "", all, 3);
    list("list-prefix", "skew/", all + 1, 2);
#ifdef SKEW_TODAY
    list_limit(old_unit);
#endif
    stats(old_unit);

    ctl_client_destroy(&client);
    ctl_error_fini(&err);
    printf("done\n");
    return 0;
}
