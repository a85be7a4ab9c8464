/*
 * test_churn.c - units in a churning process (server.h, curve.h): drain on
 * every serving path, many units created and destroyed on one shared
 * ZeroMQ context, IPv6 endpoints.
 *
 *   - drain: the same test on each way a unit can serve (its own context,
 *     a borrowed one, a CURVE allowlist on either): callers queued behind
 *     a slow handler each end with their reply or Busy "draining", and
 *     ctl_server_drain returns within its timeout. A CURVE client that
 *     connects during the drain has its handshake answered (the ZAP
 *     handler is served throughout) and gets Busy "draining".
 *   - shared context: 1,000 units, a third with allowlists, created and
 *     destroyed one after another on one context, each answering a call
 *     (from raw sockets of another context, so only the unit side is
 *     judged); then the same with 10 runtime clients per unit made on that
 *     context too (10,000 clients, each making one call).
 *   - IPv6: a unit binds tcp://[::1]:0 and the runtime's client and a raw
 *     socket call it; the client calls it by a name with IPv6 addresses
 *     only too (ip6-localhost, where /etc/hosts has it).
 *     Skipped ("skipped: no ::1") where the machine has no IPv6 loopback.
 *
 * `test_churn clients` runs only the part with runtime clients (ctest
 * test_churn_clients). Counts can be lowered for a quick run: CTLRPC_CHURN_UNITS (default 1000)
 * and CTLRPC_CHURN_CLIENTS_PER_UNIT (default 10).
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>

#include <arpa/inet.h>
#include <netdb.h>
#include <netinet/in.h>
#include <poll.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include <zmq.h>

#include "testutil.h"

#define CALL_MS 10000 /* a reply that must come; far beyond any drain */

typedef struct fx {
    char unit_pub[CTL_CURVE_KEY_BUF], unit_sec[CTL_CURVE_KEY_BUF];
    char cli_pub[CTL_CURVE_KEY_BUF], cli_sec[CTL_CURVE_KEY_BUF];
    ctl_error err;
    tu_unit counters; /* the user of units made with ctl_server_new here */
} fx;

static int setup(void **state)
{
    fx *f = calloc(1, sizeof *f);
    if (!f)
        return -1;
    ctl_error_init(&f->err);
    if (ctl_curve_available() && (ctl_curve_keypair(f->unit_pub, f->unit_sec, &f->err) ||
                                  ctl_curve_keypair(f->cli_pub, f->cli_sec, &f->err)))
        return -1;
    *state = f;
    return 0;
}

static int teardown(void **state)
{
    fx *f = *state;
    ctl_error_fini(&f->err);
    free(f);
    return 0;
}

static int env_count(const char *name, int def)
{
    const char *v = getenv(name);
    int n = v && *v ? atoi(v) : def;
    return n > 0 ? n : def;
}

/* ---- drain on every serving path ------------------------------------------ */

enum { DRAIN_CALLERS = 12, SLOW_MS = 600, DRAIN_TIMEOUT_MS = 1500 };

typedef struct caller {
    const char *endpoint;
    const fx *f;
    bool curve;
    const char *op;
    int rc;
    char reason[32];
    char msg[256];
} caller;

/* One call with a client of its own (so callers queue in parallel). */
static void *call_main(void *arg)
{
    caller *c = arg;
    ctl_client_options co;
    ctl_client_options_init(&co);
    if (c->curve) {
        co.curve_server_key = c->f->unit_pub;
        co.curve_secret_key = c->f->cli_sec;
    }
    ctl_client *cl = NULL;
    ctl_error err;
    ctl_error_init(&err);
    c->rc = ctl_client_new(&co, &cl, &err);
    if (c->rc == 0) {
        tu_buf args;
        tu_buf_init(&args);
        msgpack_pack_map(&args.pk, 1);
        tu_pk_str(&args.pk, "ms");
        msgpack_pack_int(&args.pk, SLOW_MS);
        ctl_reply *reply = NULL;
        c->rc = ctl_client_call(cl, c->endpoint, c->op, args.sb.data, args.sb.size, CALL_MS,
                                &reply, &err);
        ctl_reply_destroy(&reply);
        tu_buf_fini(&args);
    }
    snprintf(c->reason, sizeof c->reason, "%s", err.reason ? err.reason : "");
    snprintf(c->msg, sizeof c->msg, "%s", err.msg ? err.msg : "");
    ctl_error_fini(&err);
    ctl_client_destroy(&cl);
    return NULL;
}

/* The outcome every caller of a draining unit may have. */
static void assert_reply_or_draining(const caller *c, int i)
{
    if (c->rc == 0)
        return;
    if (c->rc != CTL_BUSY || strcmp(c->reason, "draining") != 0)
        fail_msg("caller %d ended with %s (%d) \"%s\": neither its reply nor Busy "
                 "\"draining\"", i, ctl_kind_name(c->rc), c->rc, c->msg);
}

typedef struct drain_case {
    bool shared_ctx;
    bool curve;
} drain_case;

static void run_drain(fx *f, drain_case dc)
{
    if (dc.curve && !ctl_curve_available())
        skip();
    void *ctx = dc.shared_ctx ? zmq_ctx_new() : NULL;
    const char *allow[] = {f->cli_pub};
    ctl_server_options so;
    ctl_server_options_init(&so);
    so.zmq_context = ctx;
    if (dc.curve) {
        so.curve_secret_key = f->unit_sec;
        so.curve_allow = allow;
        so.curve_allow_count = 1;
    }
    tu_unit u;
    assert_int_equal(tu_unit_start(&u, &so, &f->err), 0);

    caller c[DRAIN_CALLERS];
    pthread_t th[DRAIN_CALLERS];
    for (int i = 0; i < DRAIN_CALLERS; i++) {
        c[i] = (caller){.endpoint = u.endpoint, .f = f, .curve = dc.curve, .op = "sleep"};
        assert_int_equal(pthread_create(&th[i], NULL, call_main, &c[i]), 0);
    }
    /* The first call runs; the others connect and queue behind it (each
     * sends its request as soon as it is connected). */
    assert_true(tu_wait_atleast(&u.sleeps_started, 1, CALL_MS) >= 1);
    int64_t until = tu_now_ms() + CALL_MS;
    ctl_server_stats st;
    do {
        tu_sleep_ms(5);
        ctl_server_stats_get(u.server, &st);
    } while (st.connections < DRAIN_CALLERS && tu_now_ms() < until);
    assert_true(st.connections >= DRAIN_CALLERS);

    int64_t t0 = tu_now_ms();
    ctl_server_drain(u.server, DRAIN_TIMEOUT_MS);
    int64_t took = tu_now_ms() - t0;
    int served = atomic_load(&u.sleeps_done);
    for (int i = 0; i < DRAIN_CALLERS; i++)
        pthread_join(th[i], NULL);
    int busy = 0;
    for (int i = 0; i < DRAIN_CALLERS; i++) {
        assert_reply_or_draining(&c[i], i);
        busy += c[i].rc == CTL_BUSY;
    }
    print_message("drain (%s context%s): %d ms, %d served, %d Busy \"draining\"\n",
                  dc.shared_ctx ? "shared" : "own", dc.curve ? ", CURVE allowlist" : "",
                  (int)took, served, busy);
    /* Within its timeout (the running handler's rest included). */
    if (took > DRAIN_TIMEOUT_MS)
        fail_msg("drain took %d ms, more than its timeout of %d ms", (int)took,
                 DRAIN_TIMEOUT_MS);
    /* The queued requests were refused, not served one by one. */
    assert_true(served <= 2);
    assert_true(busy >= 1);
    tu_unit_stop(&u);
    if (ctx)
        zmq_ctx_term(ctx);
}

static void test_drain_own_context(void **state)
{
    run_drain(*state, (drain_case){false, false});
}

static void test_drain_shared_context(void **state)
{
    run_drain(*state, (drain_case){true, false});
}

static void test_drain_curve_allowlist(void **state)
{
    run_drain(*state, (drain_case){false, true});
}

static void test_drain_curve_allowlist_shared_context(void **state)
{
    run_drain(*state, (drain_case){true, true});
}

/* A CURVE client connecting while the unit drains: its handshake is
 * answered (the ZAP handler keeps serving) and its call gets Busy
 * "draining", not a timeout. */
typedef struct drainer {
    ctl_server *server;
    int timeout_ms;
} drainer;

static void *drain_main(void *arg)
{
    drainer *d = arg;
    ctl_server_drain(d->server, d->timeout_ms);
    return NULL;
}

static void test_drain_answers_new_curve_clients(void **state)
{
    fx *f = *state;
    if (!ctl_curve_available())
        skip();
    const char *allow[] = {f->cli_pub};
    ctl_server_options so;
    ctl_server_options_init(&so);
    so.curve_secret_key = f->unit_sec;
    so.curve_allow = allow;
    so.curve_allow_count = 1;
    tu_unit u;
    assert_int_equal(tu_unit_start(&u, &so, &f->err), 0);
    /* A slow call keeps the unit's thread busy; then the drain begins,
     * and a stream of new clients keeps it going. */
    caller slow = {.endpoint = u.endpoint, .f = f, .curve = true, .op = "sleep"};
    pthread_t slow_th, drain_th;
    assert_int_equal(pthread_create(&slow_th, NULL, call_main, &slow), 0);
    assert_true(tu_wait_atleast(&u.sleeps_started, 1, CALL_MS) >= 1);
    drainer d = {u.server, 3000};
    assert_int_equal(pthread_create(&drain_th, NULL, drain_main, &d), 0);
    ctl_server_health h;
    int64_t until = tu_now_ms() + CALL_MS;
    do
        ctl_server_health_get(u.server, &h);
    while (!h.draining && tu_now_ms() < until);
    assert_true(h.draining);
    caller late = {.endpoint = u.endpoint, .f = f, .curve = true, .op = "echo"};
    call_main(&late); /* while the slow handler runs, or the drain answers */
    pthread_join(slow_th, NULL);
    pthread_join(drain_th, NULL);
    assert_reply_or_draining(&slow, 0);
    assert_int_equal(slow.rc, 0);
    if (late.rc != CTL_BUSY || strcmp(late.reason, "draining") != 0)
        fail_msg("a client connecting during the drain got %s \"%s\", not Busy "
                 "\"draining\"", ctl_kind_name(late.rc), late.msg);
    tu_unit_stop(&u);
}

/* ---- many units on one shared context -------------------------------------- */

/* One call [op "echo"] over a raw DEALER of `ctx` (CURVE when `unit_pub`
 * is set); true when a success reply came. */
static bool raw_call(void *ctx, const char *endpoint, const fx *f, bool curve)
{
    void *d = zmq_socket(ctx, ZMQ_DEALER);
    if (!d)
        return false;
    int zero = 0;
    zmq_setsockopt(d, ZMQ_LINGER, &zero, sizeof zero);
    if (curve) {
        zmq_setsockopt(d, ZMQ_CURVE_SERVERKEY, f->unit_pub, 40);
        zmq_setsockopt(d, ZMQ_CURVE_PUBLICKEY, f->cli_pub, 40);
        zmq_setsockopt(d, ZMQ_CURVE_SECRETKEY, f->cli_sec, 40);
    }
    bool ok = false;
    if (zmq_connect(d, endpoint) == 0) {
        tu_buf req;
        tu_buf_init(&req);
        tu_pack_request(&req, "echo", "r1", 2, NULL, 0);
        tu_rx rx = {0};
        if (tu_raw_send(d, req.sb.data, req.sb.size) == 0 && tu_raw_recv(d, CALL_MS, &rx) == 0) {
            msgpack_zone zone;
            tu_reply rep;
            msgpack_zone_init(&zone, 1024);
            ok = tu_parse_reply(TU_RX_PAYLOAD(&rx), TU_RX_PAYLOAD_LEN(&rx), &zone, &rep) == 0 &&
                 rep.ok;
            msgpack_zone_destroy(&zone);
        }
        tu_rx_free(&rx);
        tu_buf_fini(&req);
    }
    zmq_close(d);
    return ok;
}

/* Start unit `i` on `ctx`: every third one with an allowlist. */
static ctl_server *start_on(fx *f, void *ctx, int i, bool *curve)
{
    const char *allow[] = {f->cli_pub};
    ctl_server_options so;
    ctl_server_options_init(&so);
    so.endpoint = "tcp://127.0.0.1:0";
    so.zmq_context = ctx;
    *curve = ctl_curve_available() && i % 3 == 0;
    if (*curve) {
        so.curve_secret_key = f->unit_sec;
        so.curve_allow = allow;
        so.curve_allow_count = 1;
    }
    ctl_server *s = NULL;
    if (ctl_server_new(&tu_service, &f->counters, &so, &s, &f->err) != 0)
        fail_msg("unit %d on the shared context: %s", i, f->err.msg);
    return s;
}

static void test_shared_context_units(void **state)
{
    fx *f = *state;
    int units = env_count("CTLRPC_CHURN_UNITS", 1000);
    void *ctx = zmq_ctx_new();
    void *peers = zmq_ctx_new(); /* the callers': only the units are judged */
    int failed = 0;
    for (int i = 0; i < units; i++) {
        bool curve;
        ctl_server *s = start_on(f, ctx, i, &curve);
        if (!raw_call(peers, ctl_server_endpoint(s), f, curve))
            failed++;
        ctl_server_destroy(&s);
    }
    zmq_ctx_term(peers);
    zmq_ctx_term(ctx);
    print_message("%d units on one context: %d calls failed\n", units, failed);
    assert_int_equal(failed, 0);
}

/* The same, with the callers runtime clients on that context too, each
 * made for one call and destroyed. */
static void test_shared_context_units_and_clients(void **state)
{
    fx *f = *state;
    int units = env_count("CTLRPC_CHURN_UNITS", 1000);
    int per = env_count("CTLRPC_CHURN_CLIENTS_PER_UNIT", 10);
    void *ctx = zmq_ctx_new();
    int failed = 0, calls = 0;
    char first[512] = "";
    for (int i = 0; i < units; i++) {
        bool curve;
        ctl_server *s = start_on(f, ctx, i, &curve);
        for (int k = 0; k < per; k++) {
            ctl_client_options co;
            ctl_client_options_init(&co);
            co.zmq_context = ctx;
            if (curve) {
                co.curve_server_key = f->unit_pub;
                co.curve_secret_key = f->cli_sec;
            }
            ctl_client *c = NULL;
            ctl_reply *reply = NULL;
            calls++;
            int rc = ctl_client_new(&co, &c, &f->err);
            if (rc == 0)
                rc = ctl_client_call(c, ctl_server_endpoint(s), "echo", "\x80", 1, CALL_MS,
                                     &reply, &f->err);
            if (rc != 0 && failed++ == 0)
                snprintf(first, sizeof first, "unit %d, client %d: %s", i, k,
                         f->err.msg ? f->err.msg : "?");
            ctl_reply_destroy(&reply);
            ctl_client_destroy(&c);
        }
        ctl_server_destroy(&s);
    }
    zmq_ctx_term(ctx);
    print_message("%d units and %d clients on one context: %d calls failed%s%s\n", units,
                  calls, failed, failed ? "; the first: " : "", first);
    assert_int_equal(failed, 0);
}

/* Two units with allowlists on one context at once, each judging by its
 * own list: the client allowed by one is refused by the other. */
static void test_shared_context_allowlists_apart(void **state)
{
    fx *f = *state;
    if (!ctl_curve_available())
        skip();
    char other_pub[CTL_CURVE_KEY_BUF], other_sec[CTL_CURVE_KEY_BUF];
    assert_int_equal(ctl_curve_keypair(other_pub, other_sec, &f->err), 0);
    void *ctx = zmq_ctx_new(), *peers = zmq_ctx_new();
    const char *allow_a[] = {f->cli_pub}, *allow_b[] = {other_pub};
    ctl_server_options so;
    ctl_server_options_init(&so);
    so.endpoint = "tcp://127.0.0.1:0";
    so.zmq_context = ctx;
    so.curve_secret_key = f->unit_sec;
    so.curve_allow = allow_a;
    so.curve_allow_count = 1;
    ctl_server *a = NULL, *b = NULL;
    assert_int_equal(ctl_server_new(&tu_service, &f->counters, &so, &a, &f->err), 0);
    so.curve_allow = allow_b;
    assert_int_equal(ctl_server_new(&tu_service, &f->counters, &so, &b, &f->err), 0);
    assert_true(raw_call(peers, ctl_server_endpoint(a), f, true));
    ctl_server_stats st;
    int64_t until = tu_now_ms() + CALL_MS;
    /* b refuses f's client: its call gets no answer; b counts it. */
    void *d = zmq_socket(peers, ZMQ_DEALER);
    int zero = 0;
    zmq_setsockopt(d, ZMQ_LINGER, &zero, sizeof zero);
    zmq_setsockopt(d, ZMQ_CURVE_SERVERKEY, f->unit_pub, 40);
    zmq_setsockopt(d, ZMQ_CURVE_PUBLICKEY, f->cli_pub, 40);
    zmq_setsockopt(d, ZMQ_CURVE_SECRETKEY, f->cli_sec, 40);
    assert_int_equal(zmq_connect(d, ctl_server_endpoint(b)), 0);
    do {
        tu_sleep_ms(10);
        ctl_server_stats_get(b, &st);
    } while (st.auth_denied == 0 && tu_now_ms() < until);
    zmq_close(d);
    assert_true(st.auth_denied >= 1);
    ctl_server_stats_get(a, &st);
    assert_int_equal(st.auth_denied, 0);
    /* Once a is gone, b's handler goes on. */
    ctl_server_destroy(&a);
    ctl_server_stats_get(b, &st);
    uint64_t denied = st.auth_denied;
    d = zmq_socket(peers, ZMQ_DEALER);
    zmq_setsockopt(d, ZMQ_LINGER, &zero, sizeof zero);
    zmq_setsockopt(d, ZMQ_CURVE_SERVERKEY, f->unit_pub, 40);
    zmq_setsockopt(d, ZMQ_CURVE_PUBLICKEY, f->cli_pub, 40);
    zmq_setsockopt(d, ZMQ_CURVE_SECRETKEY, f->cli_sec, 40);
    assert_int_equal(zmq_connect(d, ctl_server_endpoint(b)), 0);
    until = tu_now_ms() + CALL_MS;
    do {
        tu_sleep_ms(10);
        ctl_server_stats_get(b, &st);
    } while (st.auth_denied == denied && tu_now_ms() < until);
    zmq_close(d);
    assert_true(st.auth_denied > denied);
    ctl_server_destroy(&b);
    zmq_ctx_term(peers);
    zmq_ctx_term(ctx);
}

/* A ZAP handler that is not the runtime's holds the context's endpoint:
 * the unit with an allowlist says so, without blaming another unit. */
static void test_foreign_zap_handler_named(void **state)
{
    fx *f = *state;
    if (!ctl_curve_available())
        skip();
    void *ctx = zmq_ctx_new();
    void *zap = zmq_socket(ctx, ZMQ_REP);
    assert_int_equal(zmq_bind(zap, "inproc://zeromq.zap.01"), 0);
    const char *allow[] = {f->cli_pub};
    ctl_server_options so;
    ctl_server_options_init(&so);
    so.endpoint = "tcp://127.0.0.1:0";
    so.zmq_context = ctx;
    so.curve_secret_key = f->unit_sec;
    so.curve_allow = allow;
    so.curve_allow_count = 1;
    ctl_server *s = NULL;
    assert_int_equal(ctl_server_new(&tu_service, &f->counters, &so, &s, &f->err), CTL_INVALID);
    assert_null(s);
    assert_non_null(strstr(f->err.msg, "inproc://zeromq.zap.01"));
    assert_non_null(strstr(f->err.msg, "not ctlrpc's"));
    assert_null(strstr(f->err.msg, "another unit"));
    zmq_close(zap);
    zmq_ctx_term(ctx);
}

/* ---- the unit's socket monitor under a churn of connections -------------- */

/* A log sink that holds up the first line about a closed connection until
 * released: the unit's monitor thread, which logs it, stops reading. */
static pthread_mutex_t hold_mu = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t hold_cv = PTHREAD_COND_INITIALIZER;
static bool hold_on, held_once;

static void holding_sink(void *ctx, ctl_log_level level, const char *line)
{
    (void)ctx;
    (void)level;
    if (!strstr(line, "a connection closed"))
        return;
    pthread_mutex_lock(&hold_mu);
    if (!held_once) {
        held_once = true;
        /* Bounded: the test releases it, at the latest after its loop. */
        struct timespec until;
        clock_gettime(CLOCK_REALTIME, &until);
        until.tv_sec += 60;
        while (hold_on)
            if (pthread_cond_timedwait(&hold_cv, &hold_mu, &until) != 0)
                break;
    }
    pthread_mutex_unlock(&hold_mu);
}

/* ZeroMQ sends monitor events blocking: were the monitor's pipe bounded
 * (a receive high-water mark on the reader), a monitor thread held up
 * while connections come and go would stall the unit's I/O thread, and
 * with it every connection. 1,200 connections (2,400 events, more than
 * ZeroMQ's default bounds of 1,000 + 1,000) come and go while the monitor
 * thread is held; each gets its reply. */
static void test_monitor_never_stalls_the_unit(void **state)
{
    fx *f = *state;
    enum { CONNS = 1200 };
    tu_unit u;
    assert_int_equal(tu_unit_start(&u, NULL, &f->err), 0);
    hold_on = true;
    held_once = false;
    ctl_log_set_level(CTL_LOG_DEBUG);
    ctl_log_set_sink(holding_sink, NULL);
    void *peers = zmq_ctx_new();
    int answered = 0;
    for (int i = 0; i < CONNS; i++) {
        if (!raw_call(peers, u.endpoint, f, false))
            break;
        answered++;
    }
    pthread_mutex_lock(&hold_mu);
    bool was_held = held_once;
    hold_on = false;
    pthread_cond_broadcast(&hold_cv);
    pthread_mutex_unlock(&hold_mu);
    zmq_ctx_term(peers);
    tu_unit_stop(&u);
    ctl_log_set_sink(NULL, NULL);
    ctl_log_set_level(CTL_LOG_DEFAULT);
    print_message("%d of %d connections answered while the monitor thread was held\n",
                  answered, CONNS);
    assert_true(was_held);
    assert_int_equal(answered, CONNS);
}

/* ---- dead and silent peers are reaped ------------------------------------- */

/* A TCP connection to `endpoint` (tcp://127.0.0.1:port); -1 on failure. */
static int tcp_connect(const char *endpoint)
{
    ctl_endpoint ep;
    if (ctl_endpoint_parse(endpoint, &ep, NULL) != 0)
        return -1;
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in a = {0};
    a.sin_family = AF_INET;
    a.sin_port = htons((uint16_t)ep.port);
    inet_pton(AF_INET, "127.0.0.1", &a.sin_addr);
    if (fd >= 0 && connect(fd, (struct sockaddr *)&a, sizeof a) != 0) {
        close(fd);
        fd = -1;
    }
    return fd;
}

/* Read and discard until the peer closes (0 ms after it did: the time it
 * took), or -1 when `timeout_ms` passes first. */
static int until_closed(int fd, int timeout_ms)
{
    int64_t t0 = tu_now_ms(), end = t0 + timeout_ms;
    char buf[512];
    for (;;) {
        int left = (int)(end - tu_now_ms());
        if (left <= 0)
            return -1;
        struct pollfd p = {fd, POLLIN, 0};
        if (poll(&p, 1, left) <= 0)
            continue;
        ssize_t n = recv(fd, buf, sizeof buf, 0);
        if (n <= 0)
            return (int)(tu_now_ms() - t0);
    }
}

/* The ZMTP 3.0 greeting (NULL mechanism, as a client) and a READY command
 * for a DEALER: what a peer sends to complete the handshake. */
static void send_zmtp_hello(int fd)
{
    unsigned char g[64] = {0xff, 0, 0, 0, 0, 0, 0, 0, 1, 0x7f, 3, 0, 'N', 'U', 'L', 'L'};
    static const unsigned char ready[] = {
        0x04, 28, 5, 'R', 'E', 'A', 'D', 'Y', 11, 'S', 'o', 'c', 'k', 'e', 't', '-', 'T', 'y',
        'p', 'e', 0, 0, 0, 6, 'D', 'E', 'A', 'L', 'E', 'R'};
    assert_int_equal(send(fd, g, sizeof g, MSG_NOSIGNAL), (ssize_t)sizeof g);
    assert_int_equal(send(fd, ready, sizeof ready, MSG_NOSIGNAL), (ssize_t)sizeof ready);
}

static void test_silent_peers_reaped(void **state)
{
    fx *f = *state;
    /* The timeout leaves the honest client's I/O thread a second to answer
     * a heartbeat: a loaded machine may not schedule it for a few hundred
     * milliseconds. */
    enum { HANDSHAKE_MS = 300, BEAT_MS = 200, BEAT_TIMEOUT_MS = 1000 };
    ctl_server_options so;
    ctl_server_options_init(&so);
    so.handshake_timeout_ms = HANDSHAKE_MS;
    so.heartbeat_ms = BEAT_MS;
    so.heartbeat_timeout_ms = BEAT_TIMEOUT_MS;
    tu_unit u;
    assert_int_equal(tu_unit_start(&u, &so, &f->err), 0);

    /* An honest client's connection, made first: it must live through
     * everything below, idle. */
    ctl_client *c = NULL;
    ctl_reply *reply = NULL;
    assert_int_equal(ctl_client_new(NULL, &c, &f->err), 0);
    assert_int_equal(ctl_client_call(c, u.endpoint, "echo", "\x80", 1, CALL_MS, &reply, &f->err),
                     0);
    ctl_reply_destroy(&reply);

    /* A peer that connects and never sends: closed after the handshake
     * limit, not ZeroMQ's 30 s. */
    int quiet = tcp_connect(u.endpoint);
    assert_true(quiet >= 0);
    int took = until_closed(quiet, 10000);
    close(quiet);
    print_message("a peer that never sent was closed after %d ms\n", took);
    assert_true(took >= 0);

    /* A peer that completes the handshake, then neither sends nor answers
     * the unit's heartbeats: closed after the heartbeat timeout. */
    int silent = tcp_connect(u.endpoint);
    assert_true(silent >= 0);
    send_zmtp_hello(silent);
    took = until_closed(silent, 10000);
    close(silent);
    print_message("a connected peer gone silent was closed after %d ms\n", took);
    assert_true(took >= 0);

    /* The honest client's idle connection answered every heartbeat: the
     * next call goes over it (no reconnection: the unit counted no other
     * disconnects than the two peers'). */
    ctl_server_stats st;
    int64_t until = tu_now_ms() + CALL_MS;
    do /* the monitor thread counts the two peers' ends a moment later */
        ctl_server_stats_get(u.server, &st);
    while (st.disconnects < 2 && tu_now_ms() < until && (tu_sleep_ms(5), 1));
    assert_int_equal(st.disconnects, 2);
    /* The peer that never finished its handshake is a failed handshake,
     * as the Python unit counts it; the one that went silent after it is
     * not. */
    assert_int_equal(st.handshake_failures, 1);
    uint64_t gone = st.disconnects;
    assert_int_equal(ctl_client_call(c, u.endpoint, "echo", "\x80", 1, CALL_MS, &reply, &f->err),
                     0);
    ctl_reply_destroy(&reply);
    ctl_server_stats_get(u.server, &st);
    assert_int_equal(st.disconnects, gone);
    assert_true(st.connections >= 1);
    ctl_client_destroy(&c);
    tu_unit_stop(&u);
}

/* ---- connection caps ------------------------------------------------------ */

/* A raw DEALER of `ctx` that has had one reply from `endpoint`, or NULL. */
static void *connected_dealer(void *ctx, const char *endpoint, int timeout_ms)
{
    void *d = tu_raw_connect(ctx, ZMQ_DEALER, endpoint);
    tu_buf req;
    tu_rx rx = {0};
    tu_buf_init(&req);
    tu_pack_request(&req, "echo", "c1", 2, NULL, 0);
    int rc = d ? tu_raw_send(d, req.sb.data, req.sb.size) : -1;
    if (rc == 0)
        rc = tu_raw_recv(d, timeout_ms, &rx);
    tu_rx_free(&rx);
    tu_buf_fini(&req);
    if (rc != 0 && d) {
        zmq_close(d);
        d = NULL;
    }
    return d;
}

/* Waits until a counter of the unit's stats reaches `want` (down: a gauge
 * falls to `want` or below), or the time runs out; returns its value. */
static uint64_t wait_stat_dir(const ctl_server *s, size_t offset, uint64_t want,
                              int timeout_ms, bool down)
{
    ctl_server_stats st;
    int64_t until = tu_now_ms() + timeout_ms;
    uint64_t v;
    for (;;) {
        ctl_server_stats_get(s, &st);
        memcpy(&v, (const char *)&st + offset, sizeof v);
        if ((down ? v <= want : v >= want) || tu_now_ms() >= until)
            return v;
        tu_sleep_ms(5);
    }
}

static uint64_t wait_stat(const ctl_server *s, size_t offset, uint64_t want, int timeout_ms)
{
    return wait_stat_dir(s, offset, want, timeout_ms, false);
}

static uint64_t wait_stat_down(const ctl_server *s, size_t offset, uint64_t want,
                               int timeout_ms)
{
    return wait_stat_dir(s, offset, want, timeout_ms, true);
}

/* Peers that connect, call once and close, one after another: however far
 * behind the unit's monitor thread reads their events (a handshake's
 * success read after its connection closed finds no descriptor), none is
 * counted or logged as a refused handshake. */
static void test_callers_that_leave_at_once_are_not_refusals(void **state)
{
    fx *f = *state;
    enum { N = 300 };
    void *ctx = zmq_ctx_new();
    assert_non_null(ctx);
    bool curve = false;
    ctl_server *s = start_on(f, ctx, 1, &curve); /* 1: no allowlist */
    for (int i = 0; i < N; i++)
        assert_true(raw_call(ctx, ctl_server_endpoint(s), f, false));
    assert_true(wait_stat(s, offsetof(ctl_server_stats, disconnects), N, CALL_MS) >= N);
    ctl_server_stats st;
    ctl_server_stats_get(s, &st);
    assert_int_equal(st.connections, 0);
    assert_int_equal(st.handshake_failures, 0);
    ctl_server_destroy(&s);
    zmq_ctx_term(ctx);
}

/* max_connections_per_address 3 (plaintext, so the caps alone bring the
 * ZAP handler in): three peers from 127.0.0.1 are served, a fourth is
 * refused during its handshake, counted and logged, and a runtime client
 * fails at once with cause "refused"; once one of the three leaves, that
 * client's next call is served. */
static void test_connection_cap_per_address(void **state)
{
    fx *f = *state;
    ctl_server_options so;
    ctl_server_options_init(&so);
    so.max_connections_per_address = 3;
    tu_unit u;
    assert_int_equal(tu_unit_start(&u, &so, &f->err), 0);
    tu_log_keep();
    void *peers = zmq_ctx_new();
    void *d[3];
    for (int i = 0; i < 3; i++) {
        d[i] = connected_dealer(peers, u.endpoint, CALL_MS);
        assert_non_null(d[i]);
        /* The monitor counts each before the next one's handshake. */
        assert_true(wait_stat(u.server, offsetof(ctl_server_stats, connections),
                              (uint64_t)i + 1, CALL_MS) >= (uint64_t)i + 1);
    }
    /* The fourth is refused, at its first try: before judging it the ZAP
     * handler reads the accepts the unit's monitor thread has not read yet,
     * however far behind that thread is. */
    tu_buf req;
    tu_buf_init(&req);
    tu_pack_request(&req, "echo", "c4", 2, NULL, 0);
    tu_rx rx = {0};
    ctl_server_stats before;
    ctl_server_stats_get(u.server, &before);
    void *fourth = tu_raw_connect(peers, ZMQ_DEALER, u.endpoint);
    assert_non_null(fourth);
    assert_int_equal(tu_raw_send(fourth, req.sb.data, req.sb.size), 0);
    assert_true(wait_stat(u.server, offsetof(ctl_server_stats, conn_refused),
                          before.conn_refused + 1, CALL_MS) > before.conn_refused);
    assert_int_equal(tu_raw_recv(fourth, 200, &rx), -1); /* refused: no answer */

    /* The runtime's client is refused at once, as a failed handshake. */
    ctl_client *c = NULL;
    ctl_reply *reply = NULL;
    assert_int_equal(ctl_client_new(NULL, &c, &f->err), 0);
    int64_t t0 = tu_now_ms();
    assert_int_equal(ctl_client_call(c, u.endpoint, "echo", "\x80", 1, CALL_MS, &reply,
                                     &f->err),
                     CTL_TRANSFER);
    assert_true(tu_now_ms() - t0 < CALL_MS / 2);
    print_message("a client over the cap: %s\n", f->err.msg);

    assert_int_equal(f->err.cause, CTL_CAUSE_REFUSED);
    assert_non_null(strstr(f->err.msg, "ZAP status 500"));

    /* One leaves: the same client's calls get through again (its pool
     * retired the refused connection and dials a new one). The raw fourth
     * peer goes first: libzmq may redial it after each refusal, and each
     * try holds a slot while its handshake runs. Wait until only the two
     * remaining peers are open (a count of disconnects could be reached by
     * the fourth's refused retries alone, before d[0] has gone). */
    zmq_close(fourth);
    fourth = NULL;
    zmq_close(d[0]);
    assert_true(wait_stat_down(u.server, offsetof(ctl_server_stats, connections), 2,
                               CALL_MS) <= 2);
    /* The unit handles a closed peer's end in its own time: a call that
     * dials while it still counts one is refused, at once, and the next
     * gets through (each refused call's socket is retired, so every try
     * dials afresh). Tried until the deadline; any other failure fails. */
    int64_t until = tu_now_ms() + CALL_MS;
    int rc;
    while ((rc = ctl_client_call(c, u.endpoint, "echo", "\x80", 1, CALL_MS, &reply,
                                 &f->err)) != 0 &&
           f->err.cause == CTL_CAUSE_REFUSED && tu_now_ms() < until)
        tu_sleep_ms(5);
    if (rc != 0)
        fail_msg("a call after a peer left: %s", f->err.msg);
    ctl_reply_destroy(&reply);
    tu_rx_free(&rx);
    tu_buf_fini(&req);
    zmq_close(d[1]);
    zmq_close(d[2]);
    ctl_client_destroy(&c);
    zmq_ctx_term(peers);
    tu_unit_stop(&u);
    tu_log_stop();
    bool logged = tu_log_has("refused a connection from 127.0.0.1: ") &&
                  tu_log_has("connections from that address are open "
                             "(max_connections_per_address 3)");
    if (!logged)
        fail_msg("no refusal logged:\n%s", tu_log_text());
}

/* max_connections 2 with a CURVE allowlist: the caps and the list judge
 * together; the listed client beyond the cap is refused, and counted. */
static void test_connection_cap_total_with_allowlist(void **state)
{
    fx *f = *state;
    if (!ctl_curve_available())
        skip();
    const char *allow[] = {f->cli_pub};
    ctl_server_options so;
    ctl_server_options_init(&so);
    so.curve_secret_key = f->unit_sec;
    so.curve_allow = allow;
    so.curve_allow_count = 1;
    so.max_connections = 2;
    tu_unit u;
    assert_int_equal(tu_unit_start(&u, &so, &f->err), 0);
    tu_log_keep();
    void *peers = zmq_ctx_new();
    assert_true(raw_call(peers, u.endpoint, f, true));
    ctl_client_options co;
    ctl_client_options_init(&co);
    co.curve_server_key = f->unit_pub;
    co.curve_secret_key = f->cli_sec;
    ctl_client *c1 = NULL, *c2 = NULL, *c3 = NULL;
    ctl_reply *reply = NULL;
    assert_int_equal(ctl_client_new(&co, &c1, &f->err), 0);
    assert_int_equal(ctl_client_new(&co, &c2, &f->err), 0);
    assert_int_equal(ctl_client_new(&co, &c3, &f->err), 0);
    assert_int_equal(ctl_client_call(c1, u.endpoint, "echo", "\x80", 1, CALL_MS, &reply,
                                     &f->err), 0);
    ctl_reply_destroy(&reply);
    assert_true(wait_stat(u.server, offsetof(ctl_server_stats, connections), 1, CALL_MS) >= 1);
    assert_int_equal(ctl_client_call(c2, u.endpoint, "echo", "\x80", 1, CALL_MS, &reply,
                                     &f->err), 0);
    ctl_reply_destroy(&reply);
    assert_true(wait_stat(u.server, offsetof(ctl_server_stats, connections), 2, CALL_MS) >= 2);
    /* Over the cap: refused at the first try (see the per-address case). */
    assert_int_equal(ctl_client_call(c3, u.endpoint, "echo", "\x80", 1, CALL_MS, &reply,
                                     &f->err),
                     CTL_TRANSFER);
    assert_true(wait_stat(u.server, offsetof(ctl_server_stats, conn_refused), 1, CALL_MS) >= 1);
    ctl_server_stats st;
    ctl_server_stats_get(u.server, &st);
    assert_int_equal(st.auth_denied, 0); /* a cap, not the list */
    ctl_client_destroy(&c1);
    ctl_client_destroy(&c2);
    ctl_client_destroy(&c3);
    zmq_ctx_term(peers);
    tu_unit_stop(&u);
    tu_log_stop();
}

/* ---- IPv6 ------------------------------------------------------------------ */

static bool have_ipv6_loopback(void)
{
    int fd = socket(AF_INET6, SOCK_STREAM, 0);
    if (fd < 0)
        return false;
    struct sockaddr_in6 a = {0};
    a.sin6_family = AF_INET6;
    a.sin6_addr = in6addr_loopback;
    bool ok = bind(fd, (struct sockaddr *)&a, sizeof a) == 0;
    close(fd);
    return ok;
}

static void call_unit(fx *f, const char *endpoint)
{
    ctl_client *c = NULL;
    ctl_reply *reply = NULL;
    assert_int_equal(ctl_client_new(NULL, &c, &f->err), 0);
    int rc = ctl_client_call(c, endpoint, "echo", "\x80", 1, CALL_MS, &reply, &f->err);
    if (rc != 0)
        fail_msg("call to %s: %s", endpoint, f->err.msg);
    ctl_reply_destroy(&reply);
    ctl_client_destroy(&c);
}

static void test_ipv6_loopback(void **state)
{
    fx *f = *state;
    if (!have_ipv6_loopback()) {
        print_message("skipped: no ::1\n");
        skip();
    }
    ctl_server_options so;
    ctl_server_options_init(&so);
    so.endpoint = "tcp://[::1]:0";
    ctl_server *s = NULL;
    if (ctl_server_new(&tu_service, &f->counters, &so, &s, &f->err) != 0)
        fail_msg("bind tcp://[::1]:0: %s", f->err.msg);
    const char *ep = ctl_server_endpoint(s);
    assert_true(strncmp(ep, "tcp://[::1]:", 12) == 0);
    ctl_endpoint parsed;
    assert_int_equal(ctl_endpoint_parse(ep, &parsed, &f->err), 0);
    assert_true(parsed.port > 0);
    assert_true(ctl_endpoint_host_literal(parsed.host));
    call_unit(f, ep);
    /* A raw IPv6 peer too. */
    void *peers = zmq_ctx_new();
    void *d = zmq_socket(peers, ZMQ_DEALER);
    int one = 1, zero = 0;
    zmq_setsockopt(d, ZMQ_IPV6, &one, sizeof one);
    zmq_setsockopt(d, ZMQ_LINGER, &zero, sizeof zero);
    assert_int_equal(zmq_connect(d, ep), 0);
    tu_buf req;
    tu_buf_init(&req);
    tu_pack_request(&req, "echo", "v6", 2, NULL, 0);
    tu_rx rx = {0};
    assert_int_equal(tu_raw_send(d, req.sb.data, req.sb.size), 0);
    assert_int_equal(tu_raw_recv(d, CALL_MS, &rx), 0);
    tu_rx_free(&rx);
    tu_buf_fini(&req);
    zmq_close(d);
    zmq_ctx_term(peers);
    ctl_server_destroy(&s);
}

/* An IPv4 unit keeps its IPv4 endpoint (IPv6 is enabled only where the
 * endpoint needs it). */
static void test_ipv4_endpoint_unchanged(void **state)
{
    fx *f = *state;
    ctl_server_options so;
    ctl_server_options_init(&so);
    so.endpoint = "tcp://127.0.0.1:0";
    ctl_server *s = NULL;
    assert_int_equal(ctl_server_new(&tu_service, &f->counters, &so, &s, &f->err), 0);
    assert_true(strncmp(ctl_server_endpoint(s), "tcp://127.0.0.1:", 16) == 0);
    ctl_server_destroy(&s);
}

/* A name of this machine with IPv6 addresses only (Debian's /etc/hosts
 * has ip6-localhost), or NULL. */
static const char *ipv6_only_name(void)
{
    static const char *const names[] = {"ip6-localhost", "ip6-loopback", "localhost6"};
    for (size_t i = 0; i < sizeof names / sizeof names[0]; i++) {
        ctl_endpoint ep;
        char text[64];
        snprintf(text, sizeof text, "tcp://%s:1", names[i]);
        if (ctl_endpoint_parse(text, &ep, NULL) == 0 && ctl_endpoint_needs_ipv6(&ep))
            return names[i];
    }
    return NULL;
}

/* A name with IPv6 addresses only is dialled over IPv6. The unit binds
 * [::1]: ZeroMQ binds addresses, interface names and "*", never a host
 * name (it does not look names up for a bind). */
static void test_ipv6_only_name(void **state)
{
    fx *f = *state;
    const char *name = have_ipv6_loopback() ? ipv6_only_name() : NULL;
    if (!name) {
        print_message("skipped: no ::1, or no host name with IPv6 addresses only\n");
        skip();
    }
    char call_at[CTL_ENDPOINT_MAX];
    ctl_server_options so;
    ctl_server_options_init(&so);
    so.endpoint = "tcp://[::1]:0";
    ctl_server *s = NULL;
    if (ctl_server_new(&tu_service, &f->counters, &so, &s, &f->err) != 0)
        fail_msg("bind tcp://[::1]:0: %s", f->err.msg);
    ctl_endpoint ep;
    assert_int_equal(ctl_endpoint_parse(ctl_server_endpoint(s), &ep, &f->err), 0);
    snprintf(call_at, sizeof call_at, "tcp://%s:%u", name, ep.port);
    call_unit(f, call_at);
    ctl_server_destroy(&s);
}

static void test_literal_hosts(void **state)
{
    (void)state;
    assert_true(ctl_endpoint_host_literal("127.0.0.1"));
    assert_true(ctl_endpoint_host_literal("[::1]"));
    assert_true(ctl_endpoint_host_literal("::1"));
    assert_true(ctl_endpoint_host_literal("[fd00::2]"));
    assert_false(ctl_endpoint_host_literal("[::1"));
    assert_false(ctl_endpoint_host_literal("[nothost]"));
    assert_false(ctl_endpoint_host_literal("localhost"));
    assert_false(ctl_endpoint_host_literal("*"));
    assert_false(ctl_endpoint_host_literal(""));
    ctl_endpoint ep;
    assert_int_equal(ctl_endpoint_parse("tcp://[::1]:4100", &ep, NULL), 0);
    assert_true(ctl_endpoint_needs_ipv6(&ep));
    assert_int_equal(ctl_endpoint_parse("tcp://127.0.0.1:4100", &ep, NULL), 0);
    assert_false(ctl_endpoint_needs_ipv6(&ep));
    assert_int_equal(ctl_endpoint_parse("tcp://*:4100", &ep, NULL), 0);
    assert_false(ctl_endpoint_needs_ipv6(&ep));
    assert_int_equal(ctl_endpoint_parse("tcp://localhost:4100", &ep, NULL), 0);
    assert_false(ctl_endpoint_needs_ipv6(&ep)); /* it has 127.0.0.1 */
}

int main(int argc, char **argv)
{
#define T(fn) cmocka_unit_test_setup_teardown(fn, setup, teardown)
    /* "test_churn clients": the half of the torture where runtime clients
     * live on the shared context too (its own ctest entry). */
    const struct CMUnitTest clients[] = {
        T(test_shared_context_units_and_clients),
    };
    if (argc > 1 && strcmp(argv[1], "clients") == 0)
        return cmocka_run_group_tests(clients, NULL, NULL);
    const struct CMUnitTest tests[] = {
        T(test_drain_own_context),
        T(test_drain_shared_context),
        T(test_drain_curve_allowlist),
        T(test_drain_curve_allowlist_shared_context),
        T(test_drain_answers_new_curve_clients),
        T(test_shared_context_allowlists_apart),
        T(test_foreign_zap_handler_named),
        T(test_shared_context_units),
        T(test_monitor_never_stalls_the_unit),
        T(test_silent_peers_reaped),
        T(test_callers_that_leave_at_once_are_not_refusals),
        T(test_connection_cap_per_address),
        T(test_connection_cap_total_with_allowlist),
        T(test_literal_hosts),
        T(test_ipv4_endpoint_unchanged),
        T(test_ipv6_loopback),
        T(test_ipv6_only_name),
    };
#undef T
    return cmocka_run_group_tests(tests, NULL, NULL);
}
