/*
 * test_stress.c - many threads on one client, a storm of malformed payloads
 * against one unit, and churn of clients and sockets.
 *
 * These are the tests that find races and leaks rather than wrong values:
 * every reply is still checked against what its own thread sent, and the
 * storm counts exactly which payloads must be dropped and which answered.
 * Sizes are chosen to finish in a few seconds under ASan on 2 cores.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>

#include <dirent.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <zmq.h>

#include "testutil.h"

#define CALL_MS 20000
#define REPLY_MS 5000

typedef struct fx {
    tu_unit unit;
    tu_unit unit2;
    bool unit2_up;
    ctl_client *client;
    ctl_error err;
    void *ctx;
    void *dealer;
} fx;

static int setup(void **state)
{
    fx *f = calloc(1, sizeof *f);
    if (f == NULL)
        return -1;
    ctl_error_init(&f->err);
    if (tu_unit_start(&f->unit, NULL, &f->err) != 0)
        return -1;
    if (ctl_client_new(NULL, &f->client, &f->err) != 0)
        return -1;
    f->ctx = zmq_ctx_new();
    f->dealer = tu_raw_connect(f->ctx, ZMQ_DEALER, f->unit.endpoint);
    if (f->dealer == NULL)
        return -1;
    *state = f;
    return 0;
}

static int teardown(void **state)
{
    fx *f = *state;
    zmq_close(f->dealer);
    zmq_ctx_term(f->ctx);
    ctl_client_destroy(&f->client);
    if (f->unit2_up)
        tu_unit_stop(&f->unit2);
    tu_unit_stop(&f->unit);
    ctl_error_fini(&f->err);
    free(f);
    return 0;
}

static int count_fds(void)
{
    DIR *d = opendir("/proc/self/fd");
    int n = 0;
    if (d == NULL)
        return -1;
    while (readdir(d) != NULL)
        n++;
    closedir(d);
    return n;
}

/* ---- 16 threads, one client ------------------------------------------------ */

enum { THREADS = 16, CALLS_PER_THREAD = 300 };

typedef struct worker {
    ctl_client *client;
    const char *address;
    int index;
    int ok;
    int errors;
    int mismatches;
    char first_problem[256];
} worker;

static void *worker_main(void *arg)
{
    worker *w = arg;
    tu_buf a;
    ctl_error err;
    tu_buf_init(&a);
    ctl_error_init(&err);
    for (int i = 0; i < CALLS_PER_THREAD; i++) {
        char s[64];
        ctl_reply *r = NULL;
        /* A payload no other thread or call sends: thread, call, and a
         * string whose length varies too. */
        int len = snprintf(s, sizeof s, "t%02d-i%04d-%.*s", w->index, i, i % 23,
                           "abcdefghijklmnopqrstuvwxyz");
        tu_buf_reset(&a);
        msgpack_pack_map(&a.pk, 3);
        tu_pk_str(&a.pk, "t");
        msgpack_pack_int(&a.pk, w->index);
        tu_pk_str(&a.pk, "i");
        msgpack_pack_int(&a.pk, i);
        tu_pk_str(&a.pk, "s");
        tu_pk_strn(&a.pk, s, (size_t)len);
        int rc = ctl_client_call(w->client, w->address, "echo", a.sb.data, a.sb.size,
                                 CALL_MS, &r, &err);
        if (rc != 0) {
            if (w->errors++ == 0)
                snprintf(w->first_problem, sizeof w->first_problem, "call %d: %s", i,
                         err.msg ? err.msg : "?");
        } else if (!tu_obj_packs_to(ctl_reply_result(r), a.sb.data, a.sb.size)) {
            if (w->mismatches++ == 0)
                snprintf(w->first_problem, sizeof w->first_problem,
                         "call %d: reply is not this thread's", i);
        } else {
            w->ok++;
        }
        ctl_reply_destroy(&r);
    }
    ctl_error_fini(&err);
    tu_buf_fini(&a);
    return NULL;
}

static void test_16_threads_share_one_client(void **state)
{
    fx *f = *state;
    worker w[THREADS];
    pthread_t t[THREADS];
    assert_int_equal(tu_unit_start(&f->unit2, NULL, &f->err), 0);
    f->unit2_up = true;
    for (int i = 0; i < THREADS; i++) {
        memset(&w[i], 0, sizeof w[i]);
        w[i].client = f->client;
        w[i].address = i % 2 ? f->unit2.endpoint : f->unit.endpoint;
        w[i].index = i;
        assert_int_equal(pthread_create(&t[i], NULL, worker_main, &w[i]), 0);
    }
    int ok = 0, errors = 0, mismatches = 0;
    const char *problem = NULL;
    for (int i = 0; i < THREADS; i++) {
        pthread_join(t[i], NULL);
        ok += w[i].ok;
        errors += w[i].errors;
        mismatches += w[i].mismatches;
        if (problem == NULL && w[i].first_problem[0])
            problem = w[i].first_problem;
    }
    if (errors || mismatches)
        fail_msg("%d errors, %d mismatches; first: %s", errors, mismatches, problem);
    assert_int_equal(ok, THREADS * CALLS_PER_THREAD);

    ctl_client_stats st;
    ctl_client_stats_get(f->client, &st);
    assert_int_equal(st.calls, THREADS * CALLS_PER_THREAD);
    assert_int_equal(st.timeouts, 0);
    assert_int_equal(st.late_replies, 0);
    assert_int_equal(st.sockets_retired, 0);
    /* The pool reuses sockets: at most one per thread in flight. */
    assert_true(st.sockets_opened >= 2);
    assert_true(st.sockets_opened <= THREADS);
    ctl_server_stats s1, s2;
    tu_server_stats_wait(f->unit.server, &s1, THREADS * CALLS_PER_THREAD / 2, REPLY_MS);
    tu_server_stats_wait(f->unit2.server, &s2, THREADS * CALLS_PER_THREAD / 2, REPLY_MS);
    assert_int_equal(s1.replies + s2.replies, THREADS * CALLS_PER_THREAD);
}

/* ---- the malformed storm ------------------------------------------------------- */

typedef struct storm {
    tu_buf b;
    size_t dropped;  /* payloads the unit must drop (and count) */
    size_t answered; /* payloads the unit must answer with Protocol */
    char answered_ids[16][16];
} storm;

static void send_raw(void *s, const void *data, size_t len)
{
    assert_int_equal(tu_raw_send(s, data, len), 0);
}

static void send_buf(void *s, tu_buf *b)
{
    send_raw(s, b->sb.data, b->sb.size);
    tu_buf_reset(b);
}

/* Payloads with no usable request id: each must be dropped. */
static void storm_drops(storm *st, void *s)
{
    tu_buf *b = &st->b;
    unsigned seed = 4242;

    send_raw(s, "", 0);
    send_raw(s, "\xc1", 1);
    send_raw(s, "\x2a", 1);
    send_raw(s, "\xa4" "echo", 5);
    send_raw(s, "\xc0", 1);
    st->dropped += 5;
    /* Truncations that cut before the id is complete. */
    tu_pack_request(b, "echo", "abcdef", 6, NULL, 0);
    for (size_t k = 1; k < 13; k++)
        send_raw(s, b->sb.data, k);
    st->dropped += 12;
    tu_buf_reset(b);
    /* Arrays of 2 and 4. */
    msgpack_pack_array(&b->pk, 2);
    tu_pk_str(&b->pk, "echo");
    tu_pk_str(&b->pk, "id");
    send_buf(s, b);
    msgpack_pack_array(&b->pk, 4);
    tu_pk_str(&b->pk, "echo");
    tu_pk_str(&b->pk, "id");
    msgpack_pack_map(&b->pk, 0);
    msgpack_pack_nil(&b->pk);
    send_buf(s, b);
    /* Non-string op, non-string id. */
    msgpack_pack_array(&b->pk, 3);
    msgpack_pack_int(&b->pk, 1);
    tu_pk_str(&b->pk, "id");
    msgpack_pack_map(&b->pk, 0);
    send_buf(s, b);
    msgpack_pack_array(&b->pk, 3);
    tu_pk_str(&b->pk, "echo");
    msgpack_pack_int(&b->pk, 5);
    msgpack_pack_map(&b->pk, 0);
    send_buf(s, b);
    msgpack_pack_array(&b->pk, 3);
    msgpack_pack_bin(&b->pk, 4);
    msgpack_pack_bin_body(&b->pk, "echo", 4);
    msgpack_pack_bin(&b->pk, 2);
    msgpack_pack_bin_body(&b->pk, "id", 2);
    msgpack_pack_map(&b->pk, 0);
    send_buf(s, b);
    st->dropped += 5;
    /* 5-byte headers claiming 4 GiB. */
    send_raw(s, "\xdd\xff\xff\xff\xff", 5);
    send_raw(s, "\xdf\xff\xff\xff\xff", 5);
    send_raw(s, "\xdb\xff\xff\xff\xff", 5);
    send_raw(s, "\xc6\xff\xff\xff\xff", 5);
    st->dropped += 4;
    /* 100k levels of nesting. */
    {
        size_t n = 100000;
        unsigned char *p = malloc(n + 1);
        memset(p, 0x91, n);
        p[n] = 0xc0;
        send_raw(s, p, n + 1);
        memset(p, 0xdc, n); /* array16 headers cut short */
        send_raw(s, p, n);
        free(p);
        st->dropped += 2;
    }
    /* Random bytes (fixed seed), never starting with an array-of-3 header. */
    for (int i = 0; i < 200; i++) {
        unsigned char m[64];
        size_t len = 1 + (size_t)(rand_r(&seed) % 63);
        for (size_t j = 0; j < len; j++)
            m[j] = (unsigned char)rand_r(&seed);
        if (m[0] == 0x93 || m[0] == 0xdc || m[0] == 0xdd)
            m[0] = 0xc1;
        send_raw(s, m, len);
    }
    st->dropped += 200;
    /* Multi-frame messages: one request is one frame. */
    {
        tu_pack_request(b, "echo", "mf", 2, NULL, 0);
        const void *fr[3] = {b->sb.data, b->sb.data, b->sb.data};
        size_t ln[3] = {b->sb.size, b->sb.size, b->sb.size};
        assert_int_equal(tu_raw_send_frames(s, fr, ln, 2), 0);
        const void *fr2[3] = {"", b->sb.data, b->sb.data};
        size_t ln2[3] = {0, b->sb.size, b->sb.size};
        assert_int_equal(tu_raw_send_frames(s, fr2, ln2, 3), 0);
        tu_buf_reset(b);
        st->dropped += 2;
    }
}

/* Payloads with a usable id but otherwise wrong: each answered Protocol. */
static void storm_answers(storm *st, void *s)
{
    tu_buf *b = &st->b;
    size_t n = 0;
#define NEXT_ID() (snprintf(st->answered_ids[n], 16, "bad-%zu", n), st->answered_ids[n++])
    tu_pack_request(b, "no_such_op", NEXT_ID(), 5, NULL, 0);
    send_buf(s, b);
    const char *id = NEXT_ID();
    msgpack_pack_array(&b->pk, 3);
    tu_pk_str(&b->pk, "echo");
    tu_pk_str(&b->pk, id);
    msgpack_pack_int(&b->pk, 5);
    send_buf(s, b);
    id = NEXT_ID();
    msgpack_pack_array(&b->pk, 3);
    tu_pk_str(&b->pk, "echo");
    tu_pk_str(&b->pk, id);
    msgpack_pack_array(&b->pk, 2);
    msgpack_pack_int(&b->pk, 1);
    msgpack_pack_int(&b->pk, 2);
    send_buf(s, b);
    /* Args map claiming 4 Gi pairs. */
    id = NEXT_ID();
    msgpack_pack_array(&b->pk, 3);
    tu_pk_str(&b->pk, "echo");
    tu_pk_str(&b->pk, id);
    msgpack_sbuffer_write(&b->sb, "\xdf\xff\xff\xff\xff", 5);
    send_buf(s, b);
    /* Args nested 100 deep (over the default 32). */
    id = NEXT_ID();
    msgpack_pack_array(&b->pk, 3);
    tu_pk_str(&b->pk, "echo");
    tu_pk_str(&b->pk, id);
    msgpack_pack_map(&b->pk, 1);
    tu_pk_str(&b->pk, "x");
    for (int i = 0; i < 100; i++)
        msgpack_pack_array(&b->pk, 1);
    msgpack_pack_nil(&b->pk);
    send_buf(s, b);
    /* More objects than the default item cap (2^20 + 1 in the args). */
    id = NEXT_ID();
    msgpack_pack_array(&b->pk, 3);
    tu_pk_str(&b->pk, "echo");
    tu_pk_str(&b->pk, id);
    msgpack_pack_map(&b->pk, 1);
    tu_pk_str(&b->pk, "x");
    {
        size_t cnt = CTL_DEFAULT_MAX_ITEMS + 1;
        unsigned char hdr[5] = {0xdd, (unsigned char)(cnt >> 24), (unsigned char)(cnt >> 16),
                                (unsigned char)(cnt >> 8), (unsigned char)cnt};
        unsigned char *nils = malloc(cnt);
        memset(nils, 0xc0, cnt);
        msgpack_sbuffer_write(&b->sb, (const char *)hdr, 5);
        msgpack_sbuffer_write(&b->sb, (const char *)nils, cnt);
        free(nils);
    }
    send_buf(s, b);
    /* 0xc1 inside the args. */
    id = NEXT_ID();
    msgpack_pack_array(&b->pk, 3);
    tu_pk_str(&b->pk, "echo");
    tu_pk_str(&b->pk, id);
    msgpack_sbuffer_write(&b->sb, "\x81\xa1k\xc1", 4);
    send_buf(s, b);
#undef NEXT_ID
    st->answered = n;
}

static void run_storm(fx *f, storm *st, bool check_replies)
{
    msgpack_zone zone;
    msgpack_zone_init(&zone, 4096);
    st->dropped = 0;
    storm_drops(st, f->dealer);
    storm_answers(st, f->dealer);
    /* Every answered payload gets its own Protocol error, in order. */
    for (size_t i = 0; i < st->answered; i++) {
        tu_rx rx;
        tu_reply rep;
        if (tu_raw_recv(f->dealer, REPLY_MS, &rx) != 0) {
            msgpack_zone_destroy(&zone);
            fail_msg("no answer for %s", st->answered_ids[i]);
        }
        msgpack_zone_clear(&zone);
        int parsed = rx.nframes == 1 &&
                     tu_parse_reply(rx.frame[0], rx.len[0], &zone, &rep) == 0;
        bool good = parsed && !rep.ok &&
                    rep.id_len == strlen(st->answered_ids[i]) &&
                    memcmp(rep.id, st->answered_ids[i], rep.id_len) == 0 &&
                    tu_obj_is_str(tu_obj_get(&rep.body, "kind"), "Protocol");
        tu_rx_free(&rx);
        if (check_replies && !good) {
            msgpack_zone_destroy(&zone);
            fail_msg("answer %zu is not a Protocol error for %s", i, st->answered_ids[i]);
        }
    }
    /* Nothing else comes back. */
    tu_rx rx;
    int extra = tu_raw_recv(f->dealer, 100, &rx);
    if (extra == 0)
        tu_rx_free(&rx);
    msgpack_zone_destroy(&zone);
    assert_int_equal(extra, -1);
}

static void test_malformed_storm(void **state)
{
    fx *f = *state;
    storm st;
    memset(&st, 0, sizeof st);
    tu_buf_init(&st.b);
    ctl_server_stats s0, s1;
    ctl_server_stats_get(f->unit.server, &s0);

    run_storm(f, &st, true);

    /* The unit still serves a normal call. */
    ctl_reply *r = NULL;
    int rc = ctl_client_call(f->client, f->unit.endpoint, "echo", NULL, 0, CALL_MS, &r,
                             &f->err);
    ctl_reply_destroy(&r);
    tu_server_stats_wait(f->unit.server, &s1, s0.replies + st.answered + 1, REPLY_MS);
    tu_buf_fini(&st.b);
    assert_int_equal(rc, 0);
    assert_int_equal(s1.dropped - s0.dropped, st.dropped);
    assert_int_equal(s1.requests - s0.requests, st.answered + 1);
    assert_int_equal(s1.replies - s0.replies, st.answered + 1);
    assert_int_equal(atomic_load(&f->unit.calls), 1);
}

static void test_storm_memory_bounded(void **state)
{
    fx *f = *state;
    storm st;
    memset(&st, 0, sizeof st);
    tu_buf_init(&st.b);
    /* Warm up once, then measure over repeated storms. */
    run_storm(f, &st, false);
    size_t rss0 = tu_rss_bytes();
    for (int round = 0; round < 8; round++)
        run_storm(f, &st, false);
    size_t rss1 = tu_rss_bytes();
    tu_buf_fini(&st.b);
    ctl_reply *r = NULL;
    assert_int_equal(ctl_client_call(f->client, f->unit.endpoint, "echo", NULL, 0, CALL_MS,
                                     &r, &f->err),
                     0);
    ctl_reply_destroy(&r);
    assert_true(rss0 > 0);
    size_t growth = rss1 > rss0 ? rss1 - rss0 : 0;
    if (growth > (size_t)48 << 20)
        fail_msg("RSS grew by %zu MiB over 8 storms", growth >> 20);
}

/* ---- churn ------------------------------------------------------------------------- */

static void test_client_churn_releases_sockets(void **state)
{
    fx *f = *state;
    /* Warm up one round so libzmq's own lazily created fds are counted. */
    for (int round = 0; round < 2; round++) {
        int fds0 = count_fds();
        for (int i = 0; i < 25; i++) {
            ctl_client *c = NULL;
            ctl_reply *r = NULL;
            assert_int_equal(ctl_client_new(NULL, &c, &f->err), 0);
            assert_int_equal(ctl_client_call(c, f->unit.endpoint, "echo", NULL, 0, CALL_MS,
                                             &r, &f->err),
                             0);
            assert_int_equal(ctl_client_notify(c, f->unit.endpoint, "note", NULL, 0, &f->err),
                             0);
            ctl_reply_destroy(&r);
            ctl_client_destroy(&c);
        }
        int fds1 = count_fds();
        if (round == 1 && fds1 > fds0 + 8)
            fail_msg("fds grew from %d to %d over 25 clients", fds0, fds1);
    }
    assert_int_equal(tu_wait_atleast(&f->unit.notes, 50, REPLY_MS), 50);
}

static void test_unit_restart_between_calls(void **state)
{
    fx *f = *state;
    /* Calls to a unit that went away fail by deadline; a new unit on
     * another port is reached by the same client at once. */
    char old[CTL_ENDPOINT_MAX];
    ctl_reply *r = NULL;
    snprintf(old, sizeof old, "%s", f->unit.endpoint);
    assert_int_equal(ctl_client_call(f->client, old, "echo", NULL, 0, CALL_MS, &r, &f->err), 0);
    ctl_reply_destroy(&r);
    tu_unit_stop(&f->unit);
    assert_int_equal(ctl_client_call(f->client, old, "echo", NULL, 0, 300, &r, &f->err),
                     CTL_TRANSFER);
    assert_int_equal(tu_unit_start(&f->unit, NULL, &f->err), 0);
    assert_int_equal(ctl_client_call(f->client, f->unit.endpoint, "echo", NULL, 0, CALL_MS,
                                     &r, &f->err),
                     0);
    ctl_reply_destroy(&r);
}

static void test_fanout_many_targets(void **state)
{
    fx *f = *state;
    enum { N = 64 };
    ctl_target t[N];
    ctl_outcome out[N];
    tu_buf a[N];
    assert_int_equal(tu_unit_start(&f->unit2, NULL, &f->err), 0);
    f->unit2_up = true;
    for (int i = 0; i < N; i++) {
        tu_buf_init(&a[i]);
        msgpack_pack_map(&a[i].pk, 1);
        tu_pk_str(&a[i].pk, "i");
        msgpack_pack_int(&a[i].pk, i);
        t[i].address = i % 2 ? f->unit2.endpoint : f->unit.endpoint;
        t[i].args = a[i].sb.data;
        t[i].args_len = a[i].sb.size;
    }
    int failed = ctl_client_call_many(f->client, "echo", t, N, CALL_MS, out);
    int matched = 0;
    for (int i = 0; i < N; i++)
        if (out[i].reply &&
            tu_obj_packs_to(ctl_reply_result(out[i].reply), a[i].sb.data, a[i].sb.size))
            matched++;
    ctl_outcomes_fini(out, N);
    for (int i = 0; i < N; i++)
        tu_buf_fini(&a[i]);
    assert_int_equal(failed, 0);
    assert_int_equal(matched, N);
}

int main(void)
{
#define T(fn) cmocka_unit_test_setup_teardown(fn, setup, teardown)
    const struct CMUnitTest tests[] = {
        T(test_16_threads_share_one_client),
        T(test_malformed_storm),
        T(test_storm_memory_bounded),
        T(test_client_churn_releases_sockets),
        T(test_unit_restart_between_calls),
        T(test_fanout_many_targets),
    };
#undef T
    return cmocka_run_group_tests(tests, NULL, NULL);
}
