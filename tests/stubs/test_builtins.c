/*
 * test_builtins.c - the built-in ops every unit answers (docs/PROTOCOL.md,
 * "Built-in ops"), its per-op metrics and its log (ctlrpc/log.h).
 *
 *   - _describe on a generated unit (errors.idl): the service, the version,
 *     its ops, the exact text of the IDL file and its SHA-256 (computed by
 *     the build from the file: ERRORS_IDL_SHA256); turned off, it is a
 *     Protocol error; with args, a Protocol error; on a hand-written table
 *     (the test unit of testutil), no IDL;
 *   - _health: serving, then draining while ctl_server_drain runs (a
 *     built-in is answered while the unit drains);
 *   - _stats and the C API: calls, errors by kind (declared kinds, an
 *     undeclared one sent as Protocol, bad args), unknown ops, latencies,
 *     and bytes in and out exact for a request sent raw;
 *   - a unit that does not know an op starting with '_' answers Protocol,
 *     as a peer that predates the built-ins does; a table may not name an
 *     op with '_';
 *   - CURVE: a client not on the allowlist cannot call _stats, and its
 *     refusal is logged; one on it can; the handshake of a client that
 *     does not hold the unit's key is refused, counted and logged;
 *   - the log: line format, levels, a sink.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>

#include <pthread.h>
#include <regex.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <zmq.h>

#include "dispatch_int.h"
#include "errors.ctl.h"
#include "testutil.h"

#define CALL_MS 10000

/* ---- the generated unit (jobs, errors.idl) ------------------------------ */

static bool how_is(ctl_str how, const char *s)
{
    return how.len == strlen(s) && memcmp(how.ptr, s, how.len) == 0;
}

static jobs_get_handler on_get;
static jobs_touch_handler on_touch;
static jobs_plain_handler on_plain;

static int on_get(void *ctx, const jobs_get_args *a, jobs_Job *result, ctl_req *req)
{
    (void)ctx;
    if (how_is(a->how, "NoSuchJob"))
        return jobs_get_raise_NoSuchJob(req, NULL, "no job");
    result->id = a->id;
    result->name = ctl_str_c("job");
    return 0;
}

static int on_touch(void *ctx, const jobs_touch_args *a, uint64_t *result, ctl_req *req)
{
    (void)ctx;
    if (how_is(a->how, "Stale"))
        return jobs_touch_raise_Stale(req, "v7", "changed");
    if (how_is(a->how, "Busy"))
        return ctl_req_busy(req, "later", "busy");
    if (how_is(a->how, "UnitFull")) /* not in touch's raises */
        return ctl_req_fail(req, CTL_UNIT_FULL, "full");
    *result = a->id + 1;
    return 0;
}

static int on_plain(void *ctx, const jobs_plain_args *a, uint64_t *result, ctl_req *req)
{
    (void)ctx;
    (void)a;
    (void)req;
    *result = 42;
    return 0;
}

static const jobs_handlers handlers = {.on_get = on_get, .on_touch = on_touch,
                                       .on_plain = on_plain};

typedef struct fx {
    ctl_server *server;
    ctl_client *client;
    char address[CTL_ENDPOINT_MAX];
    ctl_error err;
    ctl_reply *reply;
} fx;

static int start(fx *f, bool describe_off)
{
    ctl_server_options o;
    ctl_server_options_init(&o);
    o.endpoint = "tcp://127.0.0.1:*";
    o.describe_off = describe_off;
    if (jobs_serve(&handlers, &o, &f->server, &f->err) != 0 ||
        ctl_client_new(NULL, &f->client, &f->err) != 0) {
        fprintf(stderr, "setup: %s\n", f->err.msg ? f->err.msg : "?");
        return -1;
    }
    snprintf(f->address, sizeof f->address, "%s", ctl_server_endpoint(f->server));
    return 0;
}

static int setup(void **state)
{
    fx *f = calloc(1, sizeof *f);
    if (!f)
        return -1;
    ctl_error_init(&f->err);
    *state = f;
    return start(f, false);
}

static int teardown(void **state)
{
    fx *f = *state;
    ctl_reply_destroy(&f->reply);
    ctl_client_destroy(&f->client);
    ctl_server_destroy(&f->server);
    ctl_error_fini(&f->err);
    free(f);
    return 0;
}

/* Call `op` with no args; the result (owned by f->reply) or NULL. */
static const msgpack_object *call(fx *f, const char *address, const char *op)
{
    ctl_reply_destroy(&f->reply);
    if (ctl_client_call(f->client, address, op, "\x80", 1, CALL_MS, &f->reply, &f->err) != 0)
        return NULL;
    return ctl_reply_result(f->reply);
}

static bool is_str(const msgpack_object *o, const char *s)
{
    return o && tu_obj_is_str(o, s);
}

static uint64_t u64_at(const msgpack_object *map, const char *key)
{
    const msgpack_object *o = tu_obj_get(map, key);
    assert_non_null(o);
    assert_int_equal(o->type, MSGPACK_OBJECT_POSITIVE_INTEGER);
    return o->via.u64;
}

static char *read_file(const char *path, size_t *len)
{
    FILE *fp = fopen(path, "rb");
    assert_non_null(fp);
    char *buf = malloc(1 << 16);
    assert_non_null(buf);
    *len = fread(buf, 1, 1 << 16, fp);
    fclose(fp);
    return buf;
}

/* ---- _describe --------------------------------------------------------- */

static void test_describe_generated(void **state)
{
    fx *f = *state;
    const msgpack_object *r = call(f, f->address, "_describe");
    assert_non_null(r);
    assert_int_equal(r->type, MSGPACK_OBJECT_MAP);
    assert_int_equal(r->via.map.size, 5);
    assert_true(is_str(tu_obj_get(r, "service"), "jobs"));
    assert_true(is_str(tu_obj_get(r, "version"), ctl_version()));
    const msgpack_object *ops = tu_obj_get(r, "ops");
    assert_int_equal(ops->type, MSGPACK_OBJECT_ARRAY);
    assert_int_equal(ops->via.array.size, 3);
    assert_true(is_str(&ops->via.array.ptr[0], "get"));
    assert_true(is_str(&ops->via.array.ptr[1], "touch"));
    assert_true(is_str(&ops->via.array.ptr[2], "plain"));

    const msgpack_object *idl = tu_obj_get(r, "idl");
    assert_int_equal(idl->type, MSGPACK_OBJECT_ARRAY);
    assert_int_equal(idl->via.array.size, 1);
    const msgpack_object *file = &idl->via.array.ptr[0];
    assert_int_equal(file->via.map.size, 2);
    const msgpack_object *path = tu_obj_get(file, "path");
    assert_int_equal(path->type, MSGPACK_OBJECT_STR);
    assert_true(path->via.str.size >= 10);
    assert_memory_equal(path->via.str.ptr + path->via.str.size - 10, "errors.idl", 10);
    size_t len;
    char *text = read_file(ERRORS_IDL, &len);
    const msgpack_object *t = tu_obj_get(file, "text");
    assert_int_equal(t->type, MSGPACK_OBJECT_STR);
    assert_int_equal(t->via.str.size, len);
    assert_memory_equal(t->via.str.ptr, text, len);
    free(text);
    assert_true(is_str(tu_obj_get(r, "idl_sha256"), ERRORS_IDL_SHA256));
    /* The generated table holds the same. */
    assert_string_equal(jobs_service.idl_sha256, ERRORS_IDL_SHA256);
}

static void test_describe_off_and_args(void **state)
{
    fx *f = *state;
    ctl_server_destroy(&f->server);
    ctl_client_destroy(&f->client);
    assert_int_equal(start(f, true), 0);
    assert_null(call(f, f->address, "_describe"));
    assert_int_equal(f->err.kind, CTL_TRANSFER);
    assert_int_equal(f->err.cause, CTL_CAUSE_REMOTE);
    assert_string_equal(f->err.remote_kind, "Protocol");
    assert_non_null(strstr(f->err.msg, "describe is turned off on this unit"));
    /* The others still answer. */
    assert_non_null(call(f, f->address, "_health"));
    /* Built-ins take no args. */
    ctl_reply_destroy(&f->reply);
    assert_int_equal(ctl_client_call(f->client, f->address, "_stats", "\x81\xa1x\x01", 4,
                                     CALL_MS, &f->reply, &f->err),
                     CTL_TRANSFER);
    assert_non_null(strstr(f->err.msg, "op '_stats' takes no arguments (got 'x')"));
    ctl_reply_destroy(&f->reply);
    assert_int_equal(ctl_client_call(f->client, f->address, "_health", "\x90", 1, CALL_MS,
                                     &f->reply, &f->err),
                     CTL_TRANSFER);
    assert_non_null(strstr(f->err.msg, "op '_health'"));
    /* Refusals are Protocol errors of the built-in. */
    size_t describe = ctl_server_op_count(f->server) - 3;
    assert_int_equal(ctl_server_op_errors(f->server, describe, "Protocol"), 1);
    assert_int_equal(ctl_server_op_errors(f->server, describe + 2, "Protocol"), 1);
}

/* A hand-written table: no IDL; ops listed. A name starting with '_' is
 * refused, and a unit asked for an op it does not know, built-in-looking
 * or not, answers Protocol (so does any peer that predates them). */
static void test_describe_hand_written(void **state)
{
    fx *f = *state;
    tu_unit u;
    assert_int_equal(tu_unit_start(&u, NULL, &f->err), 0);
    const msgpack_object *r = call(f, u.endpoint, "_describe");
    assert_non_null(r);
    assert_true(is_str(tu_obj_get(r, "service"), tu_service.name));
    assert_int_equal(tu_obj_get(r, "ops")->via.array.size, tu_service.op_count);
    assert_int_equal(tu_obj_get(r, "idl")->via.array.size, 0);
    assert_int_equal(tu_obj_get(r, "idl_sha256")->type, MSGPACK_OBJECT_NIL);

    assert_null(call(f, u.endpoint, "_nosuch"));
    assert_string_equal(f->err.remote_kind, "Protocol");
    assert_non_null(strstr(f->err.msg, "unknown op '_nosuch'"));
    ctl_server_stats st;
    ctl_server_stats_get(u.server, &st);
    assert_int_equal(st.unknown_op, 1);
    tu_unit_stop(&u);

    static const ctl_op bad_ops[] = {{.name = "_mine", .handler = NULL}};
    ctl_service bad = {.name = "bad", .ops = bad_ops, .op_count = 1};
    ctl_server *s = NULL;
    assert_int_equal(ctl_server_new(&bad, NULL, NULL, &s, &f->err), CTL_INVALID);
    assert_non_null(strstr(f->err.msg, "reserved for the built-in ops"));
}

/* ---- _health ----------------------------------------------------------- */

typedef struct drainer {
    ctl_server *server;
    pthread_t thread;
} drainer;

static void *drain_main(void *arg)
{
    drainer *d = arg;
    ctl_server_drain(d->server, 5000);
    return NULL;
}

typedef struct sleeper {
    const char *address;
    pthread_t thread;
    int rc;
} sleeper;

static void *sleep_main(void *arg)
{
    sleeper *s = arg;
    ctl_client *c = NULL;
    ctl_reply *reply = NULL;
    ctl_error err;
    ctl_error_init(&err);
    s->rc = ctl_client_new(NULL, &c, &err);
    if (s->rc == 0)
        s->rc = ctl_client_call(c, s->address, "sleep", "\x81\xa2ms\xcd\x01\x90", 7, CALL_MS,
                                &reply, &err); /* {ms: 400} */
    ctl_reply_destroy(&reply);
    ctl_client_destroy(&c);
    ctl_error_fini(&err);
    return NULL;
}

static void test_health(void **state)
{
    fx *f = *state;
    const msgpack_object *r = call(f, f->address, "_health");
    assert_non_null(r);
    assert_int_equal(r->via.map.size, 5);
    assert_true(is_str(tu_obj_get(r, "status"), "serving"));
    assert_true(is_str(tu_obj_get(r, "service"), "jobs"));
    assert_true(is_str(tu_obj_get(r, "version"), ctl_version()));
    assert_int_equal(u64_at(r, "in_flight"), 0);
    const msgpack_object *up = tu_obj_get(r, "uptime_s");
    assert_int_equal(up->type, MSGPACK_OBJECT_FLOAT64);
    assert_true(up->via.f64 > 0 && up->via.f64 < 60);

    /* While a drain runs (a handler keeps it from ending), the unit says
     * so: built-ins are answered while ops are refused Busy "draining". */
    tu_unit u;
    assert_int_equal(tu_unit_start(&u, NULL, &f->err), 0);
    sleeper sl = {.address = u.endpoint};
    assert_int_equal(pthread_create(&sl.thread, NULL, sleep_main, &sl), 0);
    assert_int_equal(tu_wait_atleast(&u.sleeps_started, 1, CALL_MS), 1);
    ctl_server_health h;
    ctl_server_health_get(u.server, &h);
    assert_false(h.draining);
    assert_int_equal(h.in_flight, 1); /* the sleep */
    drainer dr = {.server = u.server};
    assert_int_equal(pthread_create(&dr.thread, NULL, drain_main, &dr), 0);
    for (int i = 0; i < 500 && (ctl_server_health_get(u.server, &h), !h.draining); i++)
        tu_sleep_ms(2);
    assert_true(h.draining);
    r = call(f, u.endpoint, "_health");
    assert_non_null(r);
    assert_true(is_str(tu_obj_get(r, "status"), "draining"));
    pthread_join(sl.thread, NULL);
    assert_int_equal(sl.rc, 0);
    pthread_join(dr.thread, NULL);
    tu_unit_stop(&u);
}

/* ---- _stats ------------------------------------------------------------ */

static int touch(fx *f, const char *how)
{
    jobs_touch_args a = JOBS_TOUCH_ARGS_INIT;
    uint64_t out;
    a.id = 5;
    a.how = ctl_str_c(how);
    return jobs_touch(f->client, f->address, &a, CALL_MS, &out, &f->err);
}

static const msgpack_object *op_of(const msgpack_object *stats, const char *name)
{
    const msgpack_object *o = tu_obj_get(tu_obj_get(stats, "ops"), name);
    assert_non_null(o);
    assert_int_equal(o->via.map.size, 8);
    return o;
}

/* Wait (bounded) until the unit's monitor thread has counted at least
 * `want` open connections: the counters it writes (connections,
 * disconnects, accept and handshake failures) move a moment after the
 * event, on its thread. */
static void wait_connections(const ctl_server *s, uint64_t want)
{
    ctl_server_stats st;
    int64_t until = tu_now_ms() + CALL_MS;
    while (ctl_server_stats_get(s, &st), st.connections < want && tu_now_ms() < until)
        tu_sleep_ms(2);
    assert_true(st.connections >= want);
}

static void test_stats(void **state)
{
    fx *f = *state;
    assert_int_equal(touch(f, "ok"), 0);
    assert_int_equal(touch(f, "ok"), 0);
    assert_int_equal(touch(f, "Stale"), CTL_DECLARED);
    assert_int_equal(touch(f, "Busy"), CTL_BUSY);
    assert_int_equal(touch(f, "UnitFull"), CTL_TRANSFER); /* undeclared: Protocol */
    jobs_get_args g = JOBS_GET_ARGS_INIT;
    jobs_Job job;
    g.how = ctl_str_c("NoSuchJob");
    assert_int_equal(jobs_get(f->client, f->address, &g, CALL_MS, &job, &f->reply, &f->err),
                     CTL_DECLARED);
    ctl_reply_destroy(&f->reply);
    assert_int_equal(ctl_client_call(f->client, f->address, "get", "\x81\xa2id\xa1x", 6,
                                     CALL_MS, &f->reply, &f->err),
                     CTL_TRANSFER); /* bad args: Protocol */
    assert_null(call(f, f->address, "nope"));

    /* One request sent raw, so its bytes and its reply's are known. */
    void *ctx = zmq_ctx_new();
    void *dealer = tu_raw_connect(ctx, ZMQ_DEALER, f->address);
    tu_buf req;
    tu_rx rx;
    tu_buf_init(&req);
    tu_pack_request(&req, "plain", "raw-1", 5, NULL, 0);
    assert_int_equal(tu_raw_send(dealer, req.sb.data, req.sb.size), 0);
    assert_int_equal(tu_raw_recv(dealer, CALL_MS, &rx), 0);
    size_t in = req.sb.size, out = TU_RX_PAYLOAD_LEN(&rx);
    tu_rx_free(&rx);
    tu_buf_fini(&req);
    zmq_close(dealer);
    zmq_ctx_term(ctx);

    /* "connections" is written by the unit's monitor thread, a moment after
     * the connection: wait for it (the client's connection stays open). */
    wait_connections(f->server, 1);
    const msgpack_object *s = call(f, f->address, "_stats");
    assert_non_null(s);
    assert_int_equal(s->via.map.size, 4);
    assert_true(is_str(tu_obj_get(s, "service"), "jobs"));
    assert_int_equal(tu_obj_get(s, "uptime_s")->type, MSGPACK_OBJECT_FLOAT64);

    const msgpack_object *t = op_of(s, "touch"), *e = tu_obj_get(t, "errors");
    assert_int_equal(u64_at(t, "calls"), 5);
    assert_int_equal(e->via.map.size, 6); /* 4 wire kinds + Stale, NoSuchJob */
    assert_int_equal(u64_at(e, "Stale"), 1);
    assert_int_equal(u64_at(e, "NoSuchJob"), 0);
    assert_int_equal(u64_at(e, "Busy"), 1);
    assert_int_equal(u64_at(e, "Protocol"), 1);
    assert_int_equal(u64_at(e, "UnitFull"), 0);
    assert_int_equal(u64_at(e, "Missing"), 0);
    assert_int_equal(u64_at(t, "dropped"), 0);
    uint64_t p50 = u64_at(t, "p50_us"), p99 = u64_at(t, "p99_us"), max = u64_at(t, "max_us");
    assert_true(p50 <= p99 && p99 <= max && max < 5000000);
    assert_true(u64_at(t, "bytes_in") > 5 * 10);
    assert_true(u64_at(t, "bytes_out") > 5 * 5);

    const msgpack_object *g2 = op_of(s, "get");
    assert_int_equal(u64_at(g2, "calls"), 2);
    assert_int_equal(u64_at(tu_obj_get(g2, "errors"), "NoSuchJob"), 1);
    assert_int_equal(u64_at(tu_obj_get(g2, "errors"), "Protocol"), 1);
    assert_null(tu_obj_get(tu_obj_get(g2, "errors"), "Stale")); /* not in get's raises */

    const msgpack_object *p = op_of(s, "plain");
    assert_int_equal(u64_at(p, "calls"), 1);
    assert_int_equal(u64_at(p, "bytes_in"), in);
    assert_int_equal(u64_at(p, "bytes_out"), out);
    assert_int_equal(u64_at(tu_obj_get(p, "errors"), "Protocol"), 0);

    /* The built-ins have entries too; this _stats is counted as it goes. */
    assert_int_equal(u64_at(op_of(s, "_stats"), "calls"), 1);
    assert_int_equal(u64_at(op_of(s, "_describe"), "calls"), 0);

    const msgpack_object *tot = tu_obj_get(s, "totals");
    assert_int_equal(tot->via.map.size, 16);
    assert_int_equal(u64_at(tot, "requests"), 10);
    assert_int_equal(u64_at(tot, "replies"), 9);
    assert_int_equal(u64_at(tot, "unknown_op"), 1);
    assert_int_equal(u64_at(tot, "undeclared"), 1);
    assert_int_equal(u64_at(tot, "dropped"), 0);
    assert_int_equal(u64_at(tot, "send_failures"), 0);
    assert_int_equal(u64_at(tot, "auth_denied"), 0);
    assert_int_equal(u64_at(tot, "accept_failures"), 0);
    assert_int_equal(u64_at(tot, "handshake_failures"), 0);
    assert_int_equal(u64_at(tot, "conn_refused"), 0);
    assert_int_equal(u64_at(tot, "expired"), 0); /* every id here carries a live deadline */
    assert_true(u64_at(tot, "connections") >= 1);
    const msgpack_object *te = tu_obj_get(tot, "errors");
    assert_int_equal(u64_at(te, "Protocol"), 2);
    assert_int_equal(u64_at(te, "Stale"), 1);
    assert_int_equal(u64_at(te, "NoSuchJob"), 1);
    assert_int_equal(u64_at(te, "Busy"), 1);
    assert_null(tu_obj_get(te, "_other"));

    /* The C API reads the same counters. */
    ctl_server_stats st;
    ctl_op_stats os;
    tu_server_stats_wait(f->server, &st, 10, CALL_MS);
    assert_int_equal(st.unknown_op, 1);
    assert_true(st.bytes_in > in && st.bytes_out > out);
    assert_int_equal(ctl_server_op_count(f->server), 3 + 3);
    assert_int_equal(ctl_server_op_stats(f->server, 1, &os), 0);
    assert_string_equal(os.name, "touch");
    assert_int_equal(os.calls, 5);
    assert_int_equal(os.errors, 3);
    assert_int_equal(ctl_server_op_errors(f->server, 1, "Stale"), 1);
    assert_int_equal(ctl_server_op_errors(f->server, 1, "Nope"), 0);
    assert_int_equal(ctl_server_op_stats(f->server, 2, &os), 0);
    assert_int_equal(os.bytes_in, in);
    assert_int_equal(os.bytes_out, out);
    assert_int_equal(ctl_server_op_stats(f->server, 5, &os), 0);
    assert_string_equal(os.name, "_stats");
    assert_int_equal(ctl_server_op_stats(f->server, 6, &os), CTL_INVALID);
}

/* The buckets' upper edges: 1, 2, 3, 4, then four per octave; every value
 * lands in the bucket whose edges hold it. */
static void test_latency_buckets(void **state)
{
    (void)state;
    static const uint64_t edges[] = {1, 2, 3, 4, 5, 6, 7, 8, 10, 12, 14, 16, 20, 24, 28, 32, 40};
    for (size_t i = 0; i < sizeof edges / sizeof edges[0]; i++)
        assert_int_equal(ctl_lat_upper(i), edges[i]);
    for (uint64_t us = 0; us < 100000; us += 1 + us / 7) {
        size_t i = ctl_lat_bucket(us);
        assert_true(us < ctl_lat_upper(i));
        assert_true(i == 0 || us >= ctl_lat_upper(i - 1));
    }
    assert_int_equal(ctl_lat_bucket(UINT64_MAX), CTL_LAT_BUCKETS - 1);
    assert_int_equal(ctl_lat_upper(CTL_LAT_BUCKETS - 1), (uint64_t)1 << 33);
}

/* ---- CURVE ------------------------------------------------------------- */

typedef struct lines {
    pthread_mutex_t mu;
    char text[8192];
} lines;

static void collect(void *ctx, ctl_log_level level, const char *line)
{
    lines *l = ctx;
    (void)level;
    pthread_mutex_lock(&l->mu);
    size_t n = strlen(l->text);
    snprintf(l->text + n, sizeof l->text - n, "%s\n", line);
    pthread_mutex_unlock(&l->mu);
}

static void test_curve_allowlist_governs_builtins(void **state)
{
    fx *f = *state;
    char upub[CTL_CURVE_KEY_BUF], usec[CTL_CURVE_KEY_BUF];
    char cpub[CTL_CURVE_KEY_BUF], csec[CTL_CURVE_KEY_BUF];
    if (!ctl_curve_available())
        skip();
    assert_int_equal(ctl_curve_keypair(upub, usec, &f->err), 0);
    assert_int_equal(ctl_curve_keypair(cpub, csec, &f->err), 0);
    static lines got = {PTHREAD_MUTEX_INITIALIZER, ""};
    ctl_log_set_sink(collect, &got);

    const char *allow[] = {cpub};
    ctl_server_options o;
    ctl_server_options_init(&o);
    o.endpoint = "tcp://127.0.0.1:*";
    o.curve_secret_key = usec;
    o.curve_allow = allow;
    o.curve_allow_count = 1;
    ctl_server *s = NULL;
    assert_int_equal(jobs_serve(&handlers, &o, &s, &f->err), 0);

    ctl_client_options co;
    ctl_client *listed = NULL, *stranger = NULL;
    ctl_client_options_init(&co);
    co.curve_server_key = upub;
    co.curve_secret_key = csec;
    assert_int_equal(ctl_client_new(&co, &listed, &f->err), 0);
    co.curve_secret_key = NULL; /* a key pair of its own: not listed */
    assert_int_equal(ctl_client_new(&co, &stranger, &f->err), 0);

    ctl_reply *reply = NULL;
    /* Refused like any op: the client learns it as an authentication failure. */
    assert_int_equal(ctl_client_call(stranger, ctl_server_endpoint(s), "_stats", "\x80", 1,
                                     CALL_MS, &reply, &f->err),
                     CTL_TRANSFER);
    assert_int_equal(f->err.cause, CTL_CAUSE_AUTH);
    assert_int_equal(ctl_client_call(listed, ctl_server_endpoint(s), "_stats", "\x80", 1,
                                     CALL_MS, &reply, &f->err),
                     0);
    /* auth_denied is written by the ZAP handler's thread before it answers
     * the handshake, so the refusal above is counted by now. */
    const msgpack_object *tot = tu_obj_get(ctl_reply_result(reply), "totals");
    assert_true(u64_at(tot, "auth_denied") >= 1);
    ctl_reply_destroy(&reply);

    /* A client that does not hold the unit's key: the unit cannot read its
     * HELLO, so it refuses the handshake, counts it and logs it. */
    char opub[CTL_CURVE_KEY_BUF], osec[CTL_CURVE_KEY_BUF];
    ctl_client *wrong = NULL;
    ctl_server_stats st;
    assert_int_equal(ctl_curve_keypair(opub, osec, &f->err), 0);
    co.curve_server_key = opub;
    co.curve_secret_key = csec;
    assert_int_equal(ctl_client_new(&co, &wrong, &f->err), 0);
    assert_int_equal(ctl_client_call(wrong, ctl_server_endpoint(s), "_stats", "\x80", 1, 300,
                                     &reply, &f->err),
                     CTL_TRANSFER);
    for (int i = 0; i < 1000 && (ctl_server_stats_get(s, &st), !st.handshake_failures); i++)
        tu_sleep_ms(10);
    assert_true(st.handshake_failures >= 1);
    ctl_client_destroy(&wrong);

    ctl_client_destroy(&stranger);
    ctl_client_destroy(&listed);
    ctl_server_destroy(&s);
    ctl_log_set_sink(NULL, NULL);
    pthread_mutex_lock(&got.mu);
    assert_non_null(strstr(got.text, " warn server: tcp://127.0.0.1:"));
    assert_non_null(strstr(got.text, "refused a CURVE handshake from 127.0.0.1: client key "));
    assert_non_null(strstr(got.text, "is not on the allowlist"));
    assert_non_null(strstr(got.text, "refused a connection's handshake: CURVE authentication "
                                     "failed (the client does not hold this unit's public key?)"));
    pthread_mutex_unlock(&got.mu);
}

/* ---- the log ----------------------------------------------------------- */

static void test_log_lines_and_levels(void **state)
{
    (void)state;
    static lines got = {PTHREAD_MUTEX_INITIALIZER, ""};
    ctl_log_level level;
    assert_int_equal(ctl_log_get_level(), CTL_LOG_WARN); /* quiet by default */
    assert_int_equal(ctl_log_level_parse("DEBUG", &level), 0);
    assert_int_equal(level, CTL_LOG_DEBUG);
    assert_int_equal(ctl_log_level_parse("warning", &level), 0);
    assert_int_equal(level, CTL_LOG_WARN);
    assert_int_equal(ctl_log_level_parse("loud", &level), CTL_INVALID);
    assert_string_equal(ctl_log_level_name(CTL_LOG_INFO), "info");

    ctl_log_set_sink(collect, &got);
    ctl_log(CTL_LOG_INFO, "test", "hidden at warn");
    ctl_log(CTL_LOG_WARN, "test", "two\nlines become one %d", 1);
    ctl_log_set_level(CTL_LOG_DEBUG);
    assert_true(ctl_log_enabled(CTL_LOG_DEBUG));
    ctl_log(CTL_LOG_DEBUG, "test", "shown at debug");
    ctl_log_set_level(CTL_LOG_ERROR);
    ctl_log(CTL_LOG_WARN, "test", "hidden at error");
    ctl_log_set_level(CTL_LOG_DEFAULT);
    ctl_log_set_sink(NULL, NULL);

    regex_t re;
    assert_int_equal(regcomp(&re,
                             "^[0-9]{4}-[0-9]{2}-[0-9]{2}T[0-9]{2}:[0-9]{2}:[0-9]{2}\\.[0-9]{3}Z "
                             "warn test: two lines become one 1\n"
                             "[0-9]{4}-[0-9]{2}-[0-9]{2}T[0-9]{2}:[0-9]{2}:[0-9]{2}\\.[0-9]{3}Z "
                             "debug test: shown at debug\n$",
                             REG_EXTENDED),
                     0);
    assert_int_equal(regexec(&re, got.text, 0, NULL, 0), 0);
    regfree(&re);
}

/* A sink that logs through ctl_log itself, and replaces itself: neither
 * deadlocks (the nested line goes to stderr), bounded by a deadline. */
static atomic_int reentrant_calls;

static void reentrant_sink(void *ctx, ctl_log_level level, const char *line)
{
    (void)level;
    (void)line;
    atomic_fetch_add(&reentrant_calls, 1);
    ctl_log(CTL_LOG_WARN, "test", "logged from inside the sink (goes to stderr)");
    ctl_log_set_sink(collect, ctx);
}

static void *log_twice(void *arg)
{
    atomic_int *done = arg;
    ctl_log(CTL_LOG_WARN, "test", "first");
    ctl_log(CTL_LOG_WARN, "test", "second");
    atomic_store(done, 1);
    return NULL;
}

static void test_log_sink_may_log(void **state)
{
    (void)state;
    static lines got = {PTHREAD_MUTEX_INITIALIZER, ""};
    static atomic_int done;
    atomic_store(&done, 0);
    ctl_log_set_sink(reentrant_sink, &got);
    pthread_t th;
    assert_int_equal(pthread_create(&th, NULL, log_twice, &done), 0);
    int64_t until = tu_now_ms() + 5000;
    while (!atomic_load(&done) && tu_now_ms() < until)
        tu_sleep_ms(5);
    if (!atomic_load(&done))
        fail_msg("a sink that logs deadlocked ctl_log");
    pthread_join(th, NULL);
    ctl_log_set_sink(NULL, NULL);
    assert_int_equal(atomic_load(&reentrant_calls), 1);
    pthread_mutex_lock(&got.mu);
    assert_non_null(strstr(got.text, "warn test: second"));
    assert_null(strstr(got.text, "first"));
    assert_null(strstr(got.text, "inside the sink"));
    pthread_mutex_unlock(&got.mu);
}

int main(void)
{
#define T(fn) cmocka_unit_test_setup_teardown(fn, setup, teardown)
    const struct CMUnitTest tests[] = {
        T(test_describe_generated),
        T(test_describe_off_and_args),
        T(test_describe_hand_written),
        T(test_health),
        T(test_stats),
        cmocka_unit_test(test_latency_buckets),
        T(test_curve_allowlist_governs_builtins),
        cmocka_unit_test(test_log_lines_and_levels),
        cmocka_unit_test(test_log_sink_may_log),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
