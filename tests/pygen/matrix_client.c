/*
 * matrix_client.c - the C driver of the cross-language matrix: calls every
 * op of matrix.idl on the unit at ADDRESS through the generated C stubs and
 * checks what comes back. matrix_client.py makes the same assertions with
 * the generated Python client; run against matrix_unit (C) and
 * matrix_unit.py (Python), they prove the wire both ways.
 *
 *   matrix_client ADDRESS
 *
 * Prints one line per failed check and exits 1 if any failed.
 */
#define _POSIX_C_SOURCE 200809L
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "matrix_values.h"

#define MS 10000

static int failures;
static int checks;

#define CHECK(cond, ...)                                                       \
    do {                                                                       \
        checks++;                                                              \
        if (!(cond)) {                                                         \
            failures++;                                                        \
            fprintf(stderr, "matrix_client:%d: FAILED %s: ", __LINE__, #cond); \
            fprintf(stderr, __VA_ARGS__);                                      \
            fprintf(stderr, "\n");                                             \
        }                                                                      \
    } while (0)

static bool str_is(ctl_str s, const char *c)
{
    return s.len == strlen(c) && memcmp(s.ptr, c, s.len) == 0;
}

static bool str_eq(ctl_str a, ctl_str b)
{
    return a.len == b.len && (a.len == 0 || memcmp(a.ptr, b.ptr, a.len) == 0);
}

static bool strs_eq(matrix_list_str a, matrix_list_str b)
{
    if (a.count != b.count)
        return false;
    for (size_t i = 0; i < a.count; i++)
        if (!str_eq(a.items[i], b.items[i]))
            return false;
    return true;
}

static bool inner_eq(const matrix_Inner *a, const matrix_Inner *b)
{
    if (!a || !b)
        return a == b;
    return str_eq(a->label, b->label) && a->weight == b->weight && strs_eq(a->tags, b->tags);
}

static bool opt_str_eq(matrix_opt_str a, matrix_opt_str b)
{
    return a.present == b.present && (!a.present || str_eq(a.value, b.value));
}

/* Field by field; says which field differs. */
static const char *everything_diff(const matrix_Everything *a, const matrix_Everything *b)
{
    if (a->flag != b->flag) return "flag";
    if (a->small != b->small) return "small";
    if (a->big != b->big) return "big";
    if (a->count != b->count) return "count";
    if (a->total != b->total) return "total";
    if (a->ratio != b->ratio) return "ratio";
    if (!str_eq(a->name, b->name)) return "name";
    if (!str_eq(a->bytes, b->bytes)) return "bytes";
    if (!str_eq(a->pass, b->pass)) return "pass";
    if (a->ints.count != b->ints.count) return "ints";
    for (size_t i = 0; i < a->ints.count; i++)
        if (a->ints.items[i] != b->ints.items[i]) return "ints[i]";
    if (a->names.count != b->names.count) return "names";
    for (size_t i = 0; i < a->names.count; i++)
        if (!str_eq(a->names.items[i].key, b->names.items[i].key) ||
            !str_eq(a->names.items[i].value, b->names.items[i].value)) return "names[i]";
    if (!opt_str_eq(a->maybe, b->maybe)) return "maybe";
    if (a->grid.count != b->grid.count) return "grid";
    for (size_t i = 0; i < a->grid.count; i++) {
        if (a->grid.items[i].count != b->grid.items[i].count) return "grid[i]";
        for (size_t j = 0; j < a->grid.items[i].count; j++)
            if (a->grid.items[i].items[j] != b->grid.items[i].items[j]) return "grid[i][j]";
    }
    if (a->holes.count != b->holes.count) return "holes";
    for (size_t i = 0; i < a->holes.count; i++)
        if (a->holes.items[i].present != b->holes.items[i].present ||
            (a->holes.items[i].present &&
             a->holes.items[i].value != b->holes.items[i].value)) return "holes[i]";
    if (a->index.count != b->index.count) return "index";
    for (size_t i = 0; i < a->index.count; i++) {
        const matrix_map_list_Inner_entry *x = &a->index.items[i], *y = &b->index.items[i];
        if (!str_eq(x->key, y->key) || x->value.count != y->value.count) return "index[i]";
        for (size_t j = 0; j < x->value.count; j++)
            if (!inner_eq(&x->value.items[j], &y->value.items[j])) return "index[i][j]";
    }
    if (!inner_eq(&a->inner, &b->inner)) return "inner";
    if (!inner_eq(a->inner_maybe, b->inner_maybe)) return "inner_maybe";
    if (a->maybe_list.present != b->maybe_list.present) return "maybe_list";
    if (a->maybe_list.present) {
        if (a->maybe_list.value.count != b->maybe_list.value.count) return "maybe_list.count";
        for (size_t i = 0; i < a->maybe_list.value.count; i++)
            if (a->maybe_list.value.items[i] != b->maybe_list.value.items[i])
                return "maybe_list[i]";
    }
    if (a->flag_d != b->flag_d) return "flag_d";
    if (a->count_d != b->count_d) return "count_d";
    if (!str_eq(a->name_d, b->name_d)) return "name_d";
    if (!str_eq(a->blob_d, b->blob_d)) return "blob_d";
    if (a->ratio_d != b->ratio_d) return "ratio_d";
    if (!opt_str_eq(a->maybe_d, b->maybe_d)) return "maybe_d";
    return NULL;
}

static const char *DEFAULT_LINE =
    "flag=false small=-1 big=0 count=7 total=0 ratio=0.5 name=n blob=62 note=nil tags=[] "
    "opts={} inner=nil from=0 pass=nil lambda=false address= timeout=0 self=0";
static const char *ALL_LINE =
    "flag=true small=-100000 big=-9223372036854775808 count=4294967295 "
    "total=18446744073709551615 ratio=-0.25 name=\xc3\xbcn\xc3\xaf blob=00ff note='n' "
    "tags=[a,] opts={z:0,a:300} inner={in|0.5|[]} from=1 pass='k' lambda=true "
    "address=tcp://x timeout=65536 self=-32";
static const char *FLAG_LINE =
    "flag=true small=-1 big=0 count=7 total=0 ratio=0.5 name=n blob=62 note=nil tags=[] "
    "opts={} inner=nil from=0 pass=nil lambda=false address= timeout=0 self=0";

static void sleep_ms(long ms)
{
    struct timespec ts = {ms / 1000, (ms % 1000) * 1000000L};
    nanosleep(&ts, NULL);
}

/* ---- the same calls, asynchronously: the outcomes must be the blocking ones ---- */

typedef struct async_got {
    int done;
    ctl_error err;
    int has_result;
    uint64_t value;                 /* fail's result */
    const matrix_Everything *want;  /* echo: compared in the callback */
    const char *diff;
} async_got;

static void on_fail_done(void *user, const ctl_error *err, const uint64_t *result)
{
    async_got *g = user;
    ctl_error_copy(&g->err, err);
    g->has_result = result != NULL;
    g->value = result ? *result : 0;
    g->done = 1;
}

/* The result's views live until the callback returns: compare here. */
static void on_echo_done(void *user, const ctl_error *err, const matrix_Everything *result)
{
    async_got *g = user;
    ctl_error_copy(&g->err, err);
    g->has_result = result != NULL;
    g->diff = result ? everything_diff(result, g->want) : "no result";
    g->done = 1;
}

/* Run the client's queued completions until `g` is done (bounded). */
static void async_wait(ctl_client *c, async_got *g)
{
    struct timespec t0, t;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    while (!g->done) {
        ctl_client_process(c, 0);
        clock_gettime(CLOCK_MONOTONIC, &t);
        if ((t.tv_sec - t0.tv_sec) * 1000 + (t.tv_nsec - t0.tv_nsec) / 1000000 > 2 * MS)
            break;
        struct timespec nap = {0, 1000000};
        nanosleep(&nap, NULL);
    }
}

static bool same_error(const ctl_error *a, const ctl_error *b)
{
    if (a->kind != b->kind || a->cause != b->cause || a->code != b->code ||
        a->blob_count != b->blob_count)
        return false;
    if ((a->msg == NULL) != (b->msg == NULL) || (a->msg && strcmp(a->msg, b->msg) != 0))
        return false;
    if ((a->reason == NULL) != (b->reason == NULL) ||
        (a->reason && strcmp(a->reason, b->reason) != 0))
        return false;
    for (size_t i = 0; i < a->blob_count; i++)
        if (a->blobs[i].len != b->blobs[i].len ||
            memcmp(a->blobs[i].ptr, b->blobs[i].ptr, a->blobs[i].len) != 0)
            return false;
    return true;
}

static void async_matches_blocking(ctl_client *c, const char *addr)
{
    static const char *const kinds[] = {"ok", "UnitFull", "Busy", "Missing", "NoSuchThing",
                                        "Stale", "Stray", "Protocol"};
    for (size_t k = 0; k < sizeof kinds / sizeof kinds[0]; k++) {
        matrix_fail_args fa = MATRIX_FAIL_ARGS_INIT;
        fa.kind = ctl_str_c(kinds[k]);
        fa.reason = k % 2 ? (matrix_opt_str){true, S("why")} : (matrix_opt_str){false, {0}};
        ctl_error berr;
        ctl_error_init(&berr);
        uint64_t bv = 0;
        int brc = matrix_fail(c, addr, &fa, MS, &bv, &berr);
        async_got g = {0};
        ctl_error_init(&g.err);
        CHECK(matrix_fail_start(c, addr, &fa, MS, on_fail_done, &g, NULL) == 0,
              "fail_start %s", kinds[k]);
        async_wait(c, &g);
        CHECK(g.done, "fail_start %s: no completion", kinds[k]);
        CHECK(g.err.kind == brc && same_error(&g.err, &berr) &&
                  g.has_result == (brc == 0) && g.value == bv,
              "fail %s: async (%d: %s) differs from blocking (%d: %s)", kinds[k], g.err.kind,
              g.err.msg ? g.err.msg : "", brc, berr.msg ? berr.msg : "");
        ctl_error_fini(&g.err);
        ctl_error_fini(&berr);
    }
    matrix_Everything sent[2] = {mv_full(), mv_sparse()};
    for (int i = 0; i < 2; i++) {
        matrix_echo_args ea = {.value = sent[i]};
        async_got g = {0};
        ctl_error_init(&g.err);
        g.want = &sent[i];
        CHECK(matrix_echo_start(c, addr, &ea, MS, on_echo_done, &g, NULL) == 0, "echo_start");
        async_wait(c, &g);
        CHECK(g.done && g.err.kind == CTL_OK && g.diff == NULL, "echo_start %d: %s %s", i,
              g.diff ? g.diff : "", g.err.msg ? g.err.msg : "");
        ctl_error_fini(&g.err);
    }
}

int main(int argc, char **argv)
{
    if (argc != 2) {
        fprintf(stderr, "usage: matrix_client ADDRESS\n");
        return 2;
    }
    const char *addr = argv[1];
    ctl_client *c = NULL;
    ctl_error err;
    ctl_reply *reply = NULL;
    ctl_error_init(&err);
    if (ctl_client_new(NULL, &c, &err) != 0) {
        fprintf(stderr, "matrix_client: %s\n", err.msg);
        return 1;
    }

    /* ping */
    CHECK(matrix_ping(c, addr, MS, &err) == 0, "%s", err.msg);

    /* echo: every type, there and back */
    matrix_Everything sent[2] = {mv_full(), mv_sparse()};
    for (int i = 0; i < 2; i++) {
        matrix_echo_args ea = {.value = sent[i]};
        matrix_Everything got;
        int rc = matrix_echo(c, addr, &ea, MS, &got, &reply, &err);
        CHECK(rc == 0, "echo %d: %s", i, err.msg);
        if (rc == 0) {
            const char *diff = everything_diff(&got, &sent[i]);
            CHECK(diff == NULL, "echo %d: %s differs", i, diff);
        }
        ctl_reply_destroy(&reply);
    }

    /* grow: a recursive record */
    {
        matrix_grow_args ga = MATRIX_GROW_ARGS_INIT;
        ga.depth = 2;
        matrix_Tree t;
        int rc = matrix_grow(c, addr, &ga, MS, &t, &reply, &err);
        CHECK(rc == 0, "grow: %s", err.msg);
        if (rc == 0) {
            CHECK(str_is(t.label, "t") && t.children.count == 2 && t.next == NULL, "root");
            const matrix_Tree *k = &t.children.items[1];
            CHECK(str_is(k->label, "t.1") && k->children.count == 2, "t.1");
            const matrix_Tree *leaf = &k->children.items[0];
            CHECK(str_is(leaf->label, "t.1.0") && leaf->children.count == 0 && leaf->next &&
                  str_is(leaf->next->label, "t.1.0+") && leaf->next->next == NULL, "leaf");
        }
        ctl_reply_destroy(&reply);
        ga.depth = 0;
        ga.fanout = 5;
        ga.label = S("x");
        rc = matrix_grow(c, addr, &ga, MS, &t, &reply, &err);
        CHECK(rc == 0 && str_is(t.label, "x") && t.children.count == 0 && t.next &&
              str_is(t.next->label, "x+"), "grow depth 0: %s", rc ? err.msg : "wrong tree");
        ctl_reply_destroy(&reply);
    }

    /* describe: defaults applied by the unit, keyword-named args */
    {
        static const ctl_str tags_a[] = {SI("a"), SI("")};
        static const matrix_map_u64_entry opts[] = {{SI("z"), 0}, {SI("a"), 300}};
        static const matrix_Inner inner_in = {.label = SI("in"), .weight = 0.5};
        matrix_describe_args d = MATRIX_DESCRIBE_ARGS_INIT;
        ctl_str line;
        int rc = matrix_describe(c, addr, &d, MS, &line, &reply, &err);
        CHECK(rc == 0 && str_is(line, DEFAULT_LINE), "describe(): %s",
              rc ? err.msg : "another line");
        if (rc == 0 && !str_is(line, DEFAULT_LINE))
            fprintf(stderr, "  got  %.*s\n  want %s\n", (int)line.len, line.ptr, DEFAULT_LINE);
        ctl_reply_destroy(&reply);
        d.flag = true;
        d.small = -100000;
        d.big = INT64_MIN;
        d.count = UINT32_MAX;
        d.total = UINT64_MAX;
        d.ratio = -0.25;
        d.name = S("\xc3\xbcn\xc3\xaf");
        d.blob = S("\x00\xff");
        d.note = (matrix_opt_str){true, S("n")};
        d.tags = (matrix_list_str){.items = tags_a, .count = 2};
        d.opts = (matrix_map_u64){.items = opts, .count = 2};
        d.inner = &inner_in;
        d.from = 1;
        d.pass = (matrix_opt_str){true, S("k")};
        d.lambda = true;
        d.address = S("tcp://x");
        d.timeout = 65536;
        d.self = -32;
        rc = matrix_describe(c, addr, &d, MS, &line, &reply, &err);
        CHECK(rc == 0 && str_is(line, ALL_LINE), "describe(all): %s",
              rc ? err.msg : "another line");
        if (rc == 0 && !str_is(line, ALL_LINE))
            fprintf(stderr, "  got  %.*s\n  want %s\n", (int)line.len, line.ptr, ALL_LINE);
        ctl_reply_destroy(&reply);
    }

    /* sum: maps of f64, optionals in a list, f64 results */
    {
        static const int64_t ints[] = {1, 2, -3};
        static const matrix_map_f64_entry w[] = {{SI("a"), 0.25}, {SI("b"), 1}};
        static const matrix_opt_f64 extra[] = {{true, 0.5}, {false, 0}};
        matrix_sum_args s = MATRIX_SUM_ARGS_INIT;
        s.ints = (matrix_list_i64){.items = ints, .count = 3};
        s.weights = (matrix_map_f64){.items = w, .count = 2};
        s.scale = 2;
        s.extra = (matrix_list_opt_f64){.items = extra, .count = 2};
        double r = -1;
        CHECK(matrix_sum(c, addr, &s, MS, &r, &err) == 0 && r == 3.5, "sum: %g %s", r,
              err.msg ? err.msg : "");
        matrix_sum_args empty = MATRIX_SUM_ARGS_INIT;
        CHECK(matrix_sum(c, addr, &empty, MS, &r, &err) == 0 && r == 0, "sum(): %g", r);
    }

    /* repeat: bin and an optional bin result */
    {
        matrix_repeat_args ra = MATRIX_REPEAT_ARGS_INIT;
        matrix_opt_bin out;
        ra.data = S("ab");
        ra.times = 3;
        int rc = matrix_repeat(c, addr, &ra, MS, &out, &reply, &err);
        CHECK(rc == 0 && out.present && str_is(out.value, "ababab"), "repeat ab*3");
        ctl_reply_destroy(&reply);
        ra = (matrix_repeat_args)MATRIX_REPEAT_ARGS_INIT;
        rc = matrix_repeat(c, addr, &ra, MS, &out, &reply, &err);
        CHECK(rc == 0 && !out.present, "repeat empty");
        ctl_reply_destroy(&reply);
    }

    /* find: an optional record result */
    {
        static const matrix_Inner sentinel = MATRIX_INNER_INIT;
        matrix_find_args fa = MATRIX_FIND_ARGS_INIT;
        const matrix_Inner *in = &sentinel;
        int rc = matrix_find(c, addr, &fa, MS, &in, &reply, &err);
        CHECK(rc == 0 && in == NULL, "find(null)");
        ctl_reply_destroy(&reply);
        fa.name = (matrix_opt_str){true, S("q")};
        rc = matrix_find(c, addr, &fa, MS, &in, &reply, &err);
        CHECK(rc == 0 && in && str_is(in->label, "q") && in->weight == 0.5 &&
              in->tags.count == 0, "find(q)");
        ctl_reply_destroy(&reply);
    }

    /* fail: every error kind */
    {
        matrix_fail_args fa = MATRIX_FAIL_ARGS_INIT;
        uint64_t v = 0;
        fa.kind = S("ok");
        CHECK(matrix_fail(c, addr, &fa, MS, &v, &err) == 0 && v == 42, "fail(ok)");
        fa.kind = S("UnitFull");
        CHECK(matrix_fail(c, addr, &fa, MS, &v, &err) == CTL_UNIT_FULL &&
              strstr(err.msg, "asked for UnitFull"), "UnitFull: %s", err.msg);
        fa.kind = S("Busy");
        fa.reason = (matrix_opt_str){true, S("why")};
        CHECK(matrix_fail(c, addr, &fa, MS, &v, &err) == CTL_BUSY && err.reason &&
              strcmp(err.reason, "why") == 0, "Busy: %s", err.msg);
        fa.kind = S("Missing");
        fa.reason.present = false;
        CHECK(matrix_fail(c, addr, &fa, MS, &v, &err) == CTL_MISSING && err.blob_count == 2 &&
              str_is(err.blobs[0], "a") && str_is(err.blobs[1], "b"), "Missing: %s", err.msg);
        fa.kind = S("NoSuchThing");
        CHECK(matrix_fail(c, addr, &fa, MS, &v, &err) == CTL_DECLARED &&
              err.code == MATRIX_ERR_NoSuchThing && err.reason == NULL &&
              strstr(err.msg, "asked for NoSuchThing"), "NoSuchThing: %s", err.msg);
        fa.kind = S("Stale");
        fa.reason = (matrix_opt_str){true, S("v2")};
        CHECK(matrix_fail(c, addr, &fa, MS, &v, &err) == CTL_DECLARED &&
              err.code == MATRIX_ERR_Stale && err.reason && strcmp(err.reason, "v2") == 0,
              "Stale: %s", err.msg);
        fa.kind = S("Stray");
        CHECK(matrix_fail(c, addr, &fa, MS, &v, &err) == CTL_TRANSFER &&
              err.cause == CTL_CAUSE_REMOTE && strcmp(err.remote_kind, "Protocol") == 0 &&
              strstr(err.msg, "op 'fail' failed with Stray, which it does not declare in "
                              "'raises'"), "Stray: %s", err.msg);
        fa.kind = S("Protocol");
        fa.reason.present = false;
        CHECK(matrix_fail(c, addr, &fa, MS, &v, &err) == CTL_TRANSFER &&
              err.cause == CTL_CAUSE_REMOTE && strcmp(err.remote_kind, "Protocol") == 0 &&
              strstr(err.msg, "asked for Protocol"), "Protocol: %s", err.msg);
    }

    /* the same through the asynchronous stubs */
    async_matches_blocking(c, addr);

    /* notify: remember, then read back what arrived */
    {
        matrix_remember_args m = MATRIX_REMEMBER_ARGS_INIT;
        m.key = S("k1");
        m.value = 5;
        CHECK(matrix_remember(c, addr, &m, &err) == 0, "remember k1: %s", err.msg);
        m = (matrix_remember_args)MATRIX_REMEMBER_ARGS_INIT;
        m.key = S("k2");
        CHECK(matrix_remember(c, addr, &m, &err) == 0, "remember k2: %s", err.msg);
        bool seen = false;
        for (int tries = 0; tries < 500 && !seen; tries++) {
            matrix_map_i64 got;
            if (matrix_remembered(c, addr, MS, &got, &reply, &err) != 0)
                break;
            seen = got.count == 2 && str_is(got.items[0].key, "k1") &&
                   got.items[0].value == 5 && str_is(got.items[1].key, "k2") &&
                   got.items[1].value == 1;
            ctl_reply_destroy(&reply);
            if (!seen)
                sleep_ms(10);
        }
        CHECK(seen, "remembered: k1=5 then k2=1");
    }

    /* _many: the same args to several units, one outcome per address */
    {
        const char *addrs[2] = {addr, addr};
        /* The C stubs take args per address; both get the same here. */
        matrix_describe_args d[2] = {MATRIX_DESCRIBE_ARGS_INIT, MATRIX_DESCRIBE_ARGS_INIT};
        d[0].flag = d[1].flag = true;
        matrix_describe_outcome out[2];
        CHECK(matrix_describe_many(c, addrs, d, 2, MS, out) == 0, "describe_many");
        for (int i = 0; i < 2; i++)
            CHECK(out[i].error.kind == CTL_OK && str_is(out[i].result, FLAG_LINE),
                  "describe_many[%d]: %s", i, out[i].error.msg ? out[i].error.msg : "");
        matrix_describe_outcomes_fini(out, 2);
        matrix_fail_args fa[2];
        for (int i = 0; i < 2; i++) {
            matrix_fail_args_init(&fa[i]);
            fa[i].kind = S("Stale");
            fa[i].reason = (matrix_opt_str){true, S("r")};
        }
        matrix_fail_outcome fo[2];
        CHECK(matrix_fail_many(c, addrs, fa, 2, MS, fo) == 2, "fail_many");
        for (int i = 0; i < 2; i++)
            CHECK(fo[i].error.kind == CTL_DECLARED && fo[i].error.code == MATRIX_ERR_Stale &&
                  fo[i].error.reason && strcmp(fo[i].error.reason, "r") == 0,
                  "fail_many[%d]", i);
        matrix_fail_outcomes_fini(fo, 2);
    }

    ctl_client_destroy(&c);
    ctl_error_fini(&err);
    printf("matrix_client: %d checks, %d failed (unit %s)\n", checks, failures, addr);
    return failures ? 1 : 0;
}
