/*
 * test_retry.c - the client's retries (docs/API.md, "Retries").
 *
 * Each rule is driven against an in-process unit whose one op, "flaky",
 * fails its first `fail` runs with the kind the test asks for and then
 * answers with the number of runs so far; the unit counts every run, so a
 * test sees exactly how often a request reached a handler. The clients'
 * jitter draws and backoffs go through the internal hooks
 * (request_int.h), so the backoffs are checked to the millisecond, and the
 * time rules are checked with margins of seconds (a backoff longer than
 * the whole deadline; never a race against the clock).
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>

#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ctlrpc/gen.h"
#include "testutil.h"
#include "request_int.h"

#define CALL_MS 10000

/* ---- the unit ---------------------------------------------------------- */

typedef struct unit {
    ctl_server *server;
    char endpoint[CTL_ENDPOINT_MAX];
    atomic_int runs;
    pthread_mutex_t mu;
    char ids[4][CTL_ID_LEN + 1]; /* the request ids of flaky's first runs */
} unit;

static int64_t get_int(const msgpack_object *args, const char *key, int64_t dflt)
{
    const msgpack_object *o = tu_obj_get(args, key);
    if (o && o->type == MSGPACK_OBJECT_POSITIVE_INTEGER)
        return (int64_t)o->via.u64;
    return dflt;
}

static void get_str(const msgpack_object *args, const char *key, char *buf,
                    size_t len)
{
    const msgpack_object *o = tu_obj_get(args, key);
    buf[0] = '\0';
    if (o && o->type == MSGPACK_OBJECT_STR && o->via.str.size < len) {
        memcpy(buf, o->via.str.ptr, o->via.str.size);
        buf[o->via.str.size] = '\0';
    }
}

/* flaky {fail: n, kind: str, reason?: str, ms?: int}: runs 1..n fail with
 * `kind` ("sleep": sleep ms, then answer), later runs answer the run's
 * number. */
static int op_flaky(void *user, const msgpack_object *args, ctl_req *req)
{
    unit *u = user;
    int run = atomic_fetch_add(&u->runs, 1) + 1;
    if (run <= 4) {
        ctl_str id = ctl_req_id(req);
        pthread_mutex_lock(&u->mu);
        snprintf(u->ids[run - 1], sizeof u->ids[0], "%.*s", (int)id.len, id.ptr);
        pthread_mutex_unlock(&u->mu);
    }
    char kind[32], reason[32];
    get_str(args, "kind", kind, sizeof kind);
    get_str(args, "reason", reason, sizeof reason);
    if (run <= get_int(args, "fail", 0)) {
        if (strcmp(kind, "Busy") == 0)
            return ctl_req_busy(req, reason, "busy, run %d", run);
        if (strcmp(kind, "UnitFull") == 0)
            return ctl_req_fail(req, CTL_UNIT_FULL, "full, run %d", run);
        if (strcmp(kind, "Missing") == 0) {
            ctl_str id = {"b1", 2};
            return ctl_req_missing(req, &id, 1, "missing, run %d", run);
        }
        if (strcmp(kind, "Protocol") == 0)
            return ctl_req_fail(req, CTL_PROTOCOL, "protocol, run %d", run);
        if (strcmp(kind, "Declared") == 0) {
            ctl_error e;
            ctl_error_init(&e);
            ctl_error_declared(&e, "NotFound", 1, NULL, "not found, run %d", run);
            int rc = ctl_req_fail_error(req, &e);
            ctl_error_fini(&e);
            return rc;
        }
        if (strcmp(kind, "sleep") == 0)
            tu_sleep_ms((int)get_int(args, "ms", 0));
    }
    msgpack_pack_int(ctl_req_packer(req), run);
    return 0;
}

/* slow_first {}: the first run sleeps 300 ms; every run answers its
 * number. */
static int op_slow_first(void *user, const msgpack_object *args, ctl_req *req)
{
    unit *u = user;
    (void)args;
    int run = atomic_fetch_add(&u->runs, 1) + 1;
    if (run == 1)
        tu_sleep_ms(300);
    msgpack_pack_int(ctl_req_packer(req), run);
    return 0;
}

static const ctl_op unit_ops[] = {
    {.name = "flaky", .handler = op_flaky},
    {.name = "slow_first", .handler = op_slow_first},
    {.name = "note", .handler = op_flaky, .flags = CTL_OP_NOREPLY},
};
static const ctl_service unit_service = {
    .name = "retry", .ops = unit_ops,
    .op_count = sizeof unit_ops / sizeof unit_ops[0]};

static void unit_start_at(unit *u, const char *endpoint)
{
    ctl_server_options o;
    ctl_error err;
    ctl_error_init(&err);
    ctl_server_options_init(&o);
    o.endpoint = endpoint ? endpoint : "tcp://127.0.0.1:*";
    atomic_init(&u->runs, 0);
    pthread_mutex_init(&u->mu, NULL);
    memset(u->ids, 0, sizeof u->ids);
    assert_int_equal(ctl_server_new(&unit_service, u, &o, &u->server, &err), 0);
    snprintf(u->endpoint, sizeof u->endpoint, "%s",
             ctl_server_endpoint(u->server));
    ctl_error_fini(&err);
}

static void unit_start(unit *u)
{
    unit_start_at(u, NULL);
}

static void unit_stop(unit *u)
{
    ctl_server_destroy(&u->server);
    pthread_mutex_destroy(&u->mu);
}

/* ---- the client -------------------------------------------------------- */

/* What the hooks saw and give. */
typedef struct hooks {
    atomic_int backoffs;  /* backoffs chosen */
    int ms[64];           /* their lengths, in order */
    unsigned retry[64];   /* their numbers */
    double draw;          /* what the jitter draws (< 0: the client's own) */
} hooks;

static double hook_random(void *user)
{
    return ((hooks *)user)->draw;
}

static void hook_backoff(void *user, const char *address, unsigned retry, int ms)
{
    hooks *h = user;
    (void)address;
    int i = atomic_load(&h->backoffs);
    if (i < 64) {
        h->ms[i] = ms;
        h->retry[i] = retry;
    }
    atomic_fetch_add(&h->backoffs, 1);
}

/* A policy with short, exact backoffs (no jitter). */
static ctl_retry_policy policy(unsigned max_attempts)
{
    ctl_client_options o;
    ctl_client_options_init(&o);
    o.retry.max_attempts = max_attempts;
    o.retry.initial_backoff_ms = 2;
    o.retry.max_backoff_ms = 10;
    o.retry.jitter = 0;
    o.retry.budget_tokens = 1000;
    return o.retry;
}

/* Retired sockets are closed at once unless a test keeps them (a request
 * still queued at the unit from a retired socket then still runs). */
static int late_grace_ms = 0;

static ctl_client *client_new(const ctl_retry_policy *r, hooks *h)
{
    ctl_client_options o;
    ctl_client *c = NULL;
    ctl_error err;
    ctl_error_init(&err);
    ctl_client_options_init(&o);
    o.late_grace_ms = late_grace_ms;
    if (r)
        o.retry = *r;
    if (ctl_client_new(&o, &c, &err) != 0)
        fail_msg("client_new: %s", err.msg ? err.msg : "?");
    ctl_error_fini(&err);
    if (h) {
        ctl_retry_hooks k = {0};
        k.random = h->draw >= 0 ? hook_random : NULL;
        k.backoff = hook_backoff;
        k.user = h;
        ctl_client_set_retry_hooks(c, &k);
    }
    return c;
}

/* Pack the args of flaky. */
static void flaky_args(tu_buf *b, int fail, const char *kind, const char *reason,
                       int ms)
{
    tu_buf_reset(b);
    msgpack_pack_map(&b->pk, 4);
    tu_pk_str(&b->pk, "fail");
    msgpack_pack_int(&b->pk, fail);
    tu_pk_str(&b->pk, "kind");
    tu_pk_str(&b->pk, kind);
    tu_pk_str(&b->pk, "reason");
    tu_pk_str(&b->pk, reason ? reason : "");
    tu_pk_str(&b->pk, "ms");
    msgpack_pack_int(&b->pk, ms);
}

/* One blocking call of flaky; returns its kind, the error in *err. */
static int call(ctl_client *c, const char *address, int fail, const char *kind,
                const char *reason, int timeout_ms, unsigned flags,
                int64_t *run, ctl_error *err)
{
    tu_buf b;
    ctl_reply *reply = NULL;
    tu_buf_init(&b);
    flaky_args(&b, fail, kind, reason, 0);
    int rc = ctl_client_call_ex(c, address, "flaky", b.sb.data, b.sb.size,
                                timeout_ms, flags, &reply, err);
    if (run)
        *run = -1;
    if (rc == 0 && run) {
        const msgpack_object *o = ctl_reply_result(reply);
        *run = (int64_t)o->via.u64;
    }
    ctl_reply_destroy(&reply);
    tu_buf_fini(&b);
    return rc;
}

static ctl_address_stats stats(ctl_client *c, const char *address)
{
    ctl_address_stats s;
    ctl_client_address_stats(c, address, &s);
    return s;
}

static void assert_contains(const char *s, const char *part)
{
    if (!s || !strstr(s, part))
        fail_msg("\"%s\" does not contain \"%s\"", s ? s : "(null)", part);
}

static void assert_lacks(const char *s, const char *part)
{
    if (s && strstr(s, part))
        fail_msg("\"%s\" contains \"%s\"", s, part);
}

/* ---- options ----------------------------------------------------------- */

static int new_with(ctl_retry_policy r, ctl_error *err)
{
    ctl_client_options o;
    ctl_client *c = NULL;
    ctl_client_options_init(&o);
    o.retry = r;
    int rc = ctl_client_new(&o, &c, err);
    ctl_client_destroy(&c);
    return rc;
}

static void test_options(void **state)
{
    (void)state;
    ctl_client_options o;
    ctl_error err;
    ctl_error_init(&err);
    ctl_client_options_init(&o);
    assert_int_equal(o.retry.max_attempts, 1);
    assert_int_equal(o.retry.initial_backoff_ms, CTL_DEFAULT_RETRY_INITIAL_BACKOFF_MS);
    assert_int_equal(o.retry.max_backoff_ms, CTL_DEFAULT_RETRY_MAX_BACKOFF_MS);
    assert_true(o.retry.multiplier == 2.0);
    assert_true(o.retry.jitter == 0.2);
    assert_int_equal(o.retry.retry_busy, 0);
    assert_int_equal(o.retry.budget_tokens, 10);
    assert_true(o.retry.budget_ratio == 0.1);
    assert_int_equal(o.retry.no_transparent, 0);
    assert_int_equal(new_with(o.retry, &err), 0);

    ctl_retry_policy zero;
    memset(&zero, 0, sizeof zero);
    assert_int_equal(new_with(zero, &err), 0); /* zeros: the defaults */

    struct {
        const char *field;
        ctl_retry_policy r;
    } bad[7];
    for (int i = 0; i < 7; i++)
        bad[i].r = o.retry;
    bad[0].field = "retry.jitter", bad[0].r.jitter = -0.1;
    bad[1].field = "retry.jitter", bad[1].r.jitter = 1.5;
    bad[2].field = "retry.multiplier", bad[2].r.multiplier = 0.5;
    bad[3].field = "retry.initial_backoff_ms", bad[3].r.initial_backoff_ms = -1;
    bad[4].field = "retry.max_backoff_ms", bad[4].r.max_backoff_ms = 10,
    bad[4].r.initial_backoff_ms = 20;
    bad[5].field = "retry.budget_ratio", bad[5].r.budget_ratio = -1;
    bad[6].field = "retry.attempt_timeout_ms", bad[6].r.attempt_timeout_ms = -5;
    for (int i = 0; i < 7; i++) {
        assert_int_equal(new_with(bad[i].r, &err), CTL_INVALID);
        assert_contains(err.msg, bad[i].field);
    }
    ctl_error_fini(&err);
}

/* ---- what is retried -------------------------------------------------- */

/* Without a policy nothing is retried, not even Busy. */
static void test_off_by_default(void **state)
{
    (void)state;
    unit u;
    unit_start(&u);
    ctl_client *c = client_new(NULL, NULL);
    ctl_error err;
    ctl_error_init(&err);
    assert_int_equal(call(c, u.endpoint, 5, "Busy", "pinned", CALL_MS, CTL_CALL_IDEMPOTENT,
                          NULL, &err), CTL_BUSY);
    assert_lacks(err.msg, "attempts");
    ctl_address_stats s = stats(c, u.endpoint);
    assert_int_equal(s.attempts, 1);
    assert_int_equal(s.retries, 0);
    assert_int_equal(atomic_load(&u.runs), 1);
    ctl_error_fini(&err);
    ctl_client_destroy(&c);
    unit_stop(&u);
}

static void test_busy(void **state)
{
    (void)state;
    unit u;
    unit_start(&u);
    ctl_error err;
    ctl_error_init(&err);
    int64_t run;

    /* A policy without retry_busy leaves Busy alone. */
    ctl_retry_policy r = policy(3);
    ctl_client *c = client_new(&r, NULL);
    assert_int_equal(call(c, u.endpoint, 2, "Busy", "pinned", CALL_MS, 0, NULL, &err),
                     CTL_BUSY);
    assert_int_equal(atomic_load(&u.runs), 1);
    assert_int_equal(stats(c, u.endpoint).retries, 0);
    ctl_client_destroy(&c);

    /* With it, two Busy answers, then the reply of the third run. */
    atomic_store(&u.runs, 0);
    r.retry_busy = 1;
    c = client_new(&r, NULL);
    assert_int_equal(call(c, u.endpoint, 2, "Busy", "pinned", CALL_MS, 0, &run, &err), 0);
    assert_int_equal(run, 3);
    ctl_address_stats s = stats(c, u.endpoint);
    assert_int_equal(s.attempts, 3);
    assert_int_equal(s.retries, 2);
    assert_int_equal(s.retries_busy, 2);
    assert_int_equal(s.calls, 3);
    /* Every attempt carried the call's one request id. */
    pthread_mutex_lock(&u.mu);
    assert_int_equal(strlen(u.ids[0]), CTL_ID_LEN);
    assert_string_equal(u.ids[1], u.ids[0]);
    assert_string_equal(u.ids[2], u.ids[0]);
    pthread_mutex_unlock(&u.mu);

    /* Out of attempts: the last Busy, its reason, and the count. */
    atomic_store(&u.runs, 0);
    assert_int_equal(call(c, u.endpoint, 9, "Busy", "pinned", CALL_MS, 0, NULL, &err),
                     CTL_BUSY);
    assert_string_equal(err.reason, "pinned");
    assert_contains(err.msg, "busy, run 3");
    assert_contains(err.msg, "(after 3 attempts)");
    assert_int_equal(atomic_load(&u.runs), 3);

    /* "draining": that unit is going away; never retried. */
    atomic_store(&u.runs, 0);
    assert_int_equal(call(c, u.endpoint, 9, "Busy", "draining", CALL_MS, 0, NULL, &err),
                     CTL_BUSY);
    assert_string_equal(err.reason, "draining");
    assert_lacks(err.msg, "attempts");
    assert_int_equal(atomic_load(&u.runs), 1);
    ctl_error_fini(&err);
    ctl_client_destroy(&c);
    unit_stop(&u);
}

/* The unit's answers are final, whatever the flags. */
static void test_never_retried(void **state)
{
    (void)state;
    unit u;
    unit_start(&u);
    ctl_error err;
    ctl_error_init(&err);
    ctl_retry_policy r = policy(5);
    r.retry_busy = 1;
    ctl_client *c = client_new(&r, NULL);
    const char *kinds[] = {"UnitFull", "Missing", "Protocol", "Declared"};
    const int want[] = {CTL_UNIT_FULL, CTL_MISSING, CTL_TRANSFER, CTL_TRANSFER};
    for (int i = 0; i < 4; i++) {
        atomic_store(&u.runs, 0);
        assert_int_equal(call(c, u.endpoint, 9, kinds[i], NULL, CALL_MS,
                              CTL_CALL_IDEMPOTENT, NULL, &err), want[i]);
        if (want[i] == CTL_TRANSFER)
            assert_int_equal(err.cause, CTL_CAUSE_REMOTE);
        assert_lacks(err.msg, "attempts");
        assert_int_equal(atomic_load(&u.runs), 1);
    }
    ctl_address_stats s = stats(c, u.endpoint);
    assert_int_equal(s.attempts, 4);
    assert_int_equal(s.retries, 0);
    ctl_error_fini(&err);
    ctl_client_destroy(&c);
    unit_stop(&u);
}

/* Refused: nothing was sent, so any op may go again, but only when the
 * policy asks for more attempts. */
static void test_refused(void **state)
{
    (void)state;
    char dead[64];
    tu_dead_address(dead, sizeof dead);
    ctl_error err;
    ctl_error_init(&err);
    ctl_client *c = client_new(NULL, NULL);
    assert_int_equal(call(c, dead, 0, "", NULL, CALL_MS, 0, NULL, &err), CTL_TRANSFER);
    assert_int_equal(err.cause, CTL_CAUSE_REFUSED);
    assert_contains(err.msg, "nothing was sent");
    assert_lacks(err.msg, "attempts");
    ctl_address_stats s = stats(c, dead);
    assert_int_equal(s.attempts, 1);
    assert_int_equal(s.retries, 0);
    ctl_client_destroy(&c);

    ctl_retry_policy r = policy(3);
    c = client_new(&r, NULL);
    assert_int_equal(call(c, dead, 0, "", NULL, CALL_MS, 0, NULL, &err), CTL_TRANSFER);
    assert_int_equal(err.cause, CTL_CAUSE_REFUSED);
    assert_contains(err.msg, "nothing was sent");
    assert_contains(err.msg, "(after 3 attempts)");
    s = stats(c, dead);
    assert_int_equal(s.attempts, 3);
    assert_int_equal(s.retries, 2);
    assert_int_equal(s.retries_by_cause[CTL_CAUSE_REFUSED], 2);
    assert_int_equal(s.calls, 0);
    assert_int_equal(s.errors[CTL_CAUSE_REFUSED], 1); /* one call failed */

    /* A notify is never retried. */
    assert_int_equal(ctl_client_notify(c, dead, "note", NULL, 0, &err), CTL_TRANSFER);
    assert_int_equal(stats(c, dead).attempts, 4);
    ctl_error_fini(&err);
    ctl_client_destroy(&c);
}

/* A timeout (after the request left: it may have run) is retried for an
 * idempotent call only. The first attempt is cut short by the hook, so
 * time is left for another. */
static void test_timeout_idempotent_only(void **state)
{
    (void)state;
    unit u;
    unit_start(&u);
    ctl_error err;
    ctl_error_init(&err);
    ctl_retry_policy r = policy(3);
    ctl_retry_hooks k = {0};
    k.attempt_ms = 100;
    tu_buf b;
    tu_buf_init(&b);
    flaky_args(&b, 1, "sleep", NULL, 300);

    ctl_client *c = client_new(&r, NULL);
    ctl_client_set_retry_hooks(c, &k);
    ctl_reply *reply = NULL;
    assert_int_equal(ctl_client_call_ex(c, u.endpoint, "flaky", b.sb.data, b.sb.size,
                                        CALL_MS, 0, &reply, &err), CTL_TRANSFER);
    assert_int_equal(err.cause, CTL_CAUSE_TIMEOUT);
    assert_lacks(err.msg, "attempts");
    assert_int_equal(stats(c, u.endpoint).attempts, 1);
    ctl_client_destroy(&c);

    /* On a unit of its own, idle: both attempts' requests run (the first's
     * socket, retired, is kept while it drains); the unit reads them in
     * either order when it is slow to read the first, so the reply is
     * that of the second run, or of the first (which sleeps). */
    unit v;
    unit_start(&v);
    late_grace_ms = 5000;
    c = client_new(&r, NULL);
    late_grace_ms = 0;
    ctl_client_set_retry_hooks(c, &k);
    assert_int_equal(ctl_client_call_ex(c, v.endpoint, "flaky", b.sb.data, b.sb.size,
                                        CALL_MS, CTL_CALL_IDEMPOTENT, &reply, &err), 0);
    assert_in_range(ctl_reply_result(reply)->via.u64, 1, 2);
    ctl_reply_destroy(&reply);
    ctl_address_stats s = stats(c, v.endpoint);
    assert_int_equal(s.attempts, 2);
    assert_int_equal(s.retries_by_cause[CTL_CAUSE_TIMEOUT], 1);
    tu_buf_fini(&b);
    ctl_error_fini(&err);
    ctl_client_destroy(&c);
    unit_stop(&v);
    unit_stop(&u);
}

/* The generated stubs take idempotency from the op's descriptor. */
static void test_stub_idempotent_flag(void **state)
{
    (void)state;
    ctl_retry_policy r = policy(3);
    ctl_retry_hooks k = {0};
    k.attempt_ms = 100;
    ctl_error err;
    ctl_error_init(&err);
    for (int idem = 0; idem < 2; idem++) {
        unit u;
        unit_start(&u);
        ctl_op_desc desc;
        memset(&desc, 0, sizeof desc);
        desc.name = "slow_first";
        desc.flags = idem ? CTL_OP_IDEMPOTENT : 0;
        late_grace_ms = 5000;
        ctl_client *c = client_new(&r, NULL);
        late_grace_ms = 0;
        ctl_client_set_retry_hooks(c, &k);
        int rc = ctl_stub_call(c, u.endpoint, &desc, NULL, CALL_MS, NULL, NULL, &err);
        ctl_address_stats s = stats(c, u.endpoint);
        if (idem) {
            assert_int_equal(rc, 0);
            assert_int_equal(s.attempts, 2);
            assert_int_equal(s.retries_by_cause[CTL_CAUSE_TIMEOUT], 1);
        } else {
            assert_int_equal(rc, CTL_TRANSFER);
            assert_int_equal(err.cause, CTL_CAUSE_TIMEOUT);
            assert_int_equal(s.attempts, 1);
        }
        ctl_client_destroy(&c);
        unit_stop(&u);
    }
    ctl_error_fini(&err);
}

/* retry.attempt_timeout_ms, through the public API: an idempotent call's
 * attempt that gets no reply within it ends as a timeout and is retried
 * within the call's one deadline; any other call waits out its deadline
 * (its first attempt's slow reply is its answer). Blocking and on the
 * engine alike. */
static void test_attempt_timeout(void **state)
{
    (void)state;
    /* Two attempts: the first is cut short 250 ms before the unit's first
     * run (300 ms) answers; the second, the last, waits for the time left. */
    ctl_retry_policy r = policy(2);
    r.attempt_timeout_ms = 50;
    ctl_error err;
    ctl_error_init(&err);
    for (int async = 0; async < 2; async++)
        for (int idem = 0; idem < 2; idem++) {
            unit u;
            unit_start(&u);
            late_grace_ms = 5000; /* the first attempt's reply is drained, late */
            ctl_client *c = client_new(&r, NULL);
            late_grace_ms = 0;
            unsigned flags = idem ? CTL_CALL_IDEMPOTENT : 0;
            ctl_reply *reply = NULL;
            ctl_call *call = NULL;
            int rc;
            if (!async) {
                rc = ctl_client_call_ex(c, u.endpoint, "slow_first", NULL, 0, CALL_MS, flags,
                                        &reply, &err);
            } else {
                assert_int_equal(ctl_client_call_start_ex(c, u.endpoint, "slow_first", NULL, 0,
                                                          CALL_MS, flags, NULL, NULL, &call,
                                                          &err),
                                 0);
                assert_int_equal(ctl_call_wait(call, CALL_MS * 2), 0);
                size_t n = 0;
                const ctl_outcome *o = ctl_call_outcomes(call, &n);
                assert_int_equal(n, 1);
                rc = o[0].error.kind;
                reply = o[0].reply;
            }
            if (rc != 0)
                fail_msg("%s %s: %s", async ? "async" : "blocking", idem ? "idempotent" : "plain",
                         async ? "failed" : err.msg);
            /* The unit runs the requests one at a time: the retry's request
             * waits behind the first's sleep, and is the second run. */
            assert_int_equal(ctl_reply_result(reply)->via.u64, idem ? 2 : 1);
            ctl_address_stats s = stats(c, u.endpoint);
            assert_int_equal(s.attempts, idem ? 2 : 1);
            assert_int_equal(s.retries_by_cause[CTL_CAUSE_TIMEOUT], idem ? 1 : 0);
            /* The call did not time out: an attempt did. timeouts count
             * calls, as errors[timeout] does, for the address and the
             * client. */
            assert_int_equal(s.timeouts, 0);
            assert_int_equal(s.errors[CTL_CAUSE_TIMEOUT], 0);
            ctl_client_stats cs;
            ctl_client_stats_get(c, &cs);
            assert_int_equal(cs.timeouts, 0);
            if (async)
                ctl_call_release(call);
            else
                ctl_reply_destroy(&reply);
            ctl_client_destroy(&c);
            unit_stop(&u);
        }

    /* No attempt left: the last attempt waits for the time left, so a
     * single-attempt policy never cuts a call short. */
    r.max_attempts = 1;
    unit u;
    unit_start(&u);
    ctl_client *c = client_new(&r, NULL);
    ctl_reply *reply = NULL;
    assert_int_equal(ctl_client_call_ex(c, u.endpoint, "slow_first", NULL, 0, CALL_MS,
                                        CTL_CALL_IDEMPOTENT, &reply, &err), 0);
    assert_int_equal(ctl_reply_result(reply)->via.u64, 1);
    ctl_reply_destroy(&reply);
    ctl_client_destroy(&c);
    unit_stop(&u);

    /* No time for a retry's backoff after the attempt's limit: the attempt
     * is not cut short (it would only end the call early). */
    r.max_attempts = 2;
    r.initial_backoff_ms = r.max_backoff_ms = 5000;
    unit_start(&u);
    c = client_new(&r, NULL);
    assert_int_equal(ctl_client_call_ex(c, u.endpoint, "slow_first", NULL, 0, 1000,
                                        CTL_CALL_IDEMPOTENT, &reply, &err), 0);
    assert_int_equal(ctl_reply_result(reply)->via.u64, 1);
    assert_int_equal(stats(c, u.endpoint).attempts, 1);
    ctl_reply_destroy(&reply);
    ctl_client_destroy(&c);
    unit_stop(&u);
    ctl_error_fini(&err);
}

/* ---- backoff, deadline, budget ---------------------------------------- */

static void test_backoff_growth_and_jitter(void **state)
{
    (void)state;
    unit u;
    unit_start(&u);
    ctl_error err;
    ctl_error_init(&err);
    ctl_retry_policy r = policy(6);
    r.retry_busy = 1;
    r.initial_backoff_ms = 4;
    r.multiplier = 2;
    r.max_backoff_ms = 16;
    r.jitter = 0.5;
    /* draw 0.5: no jitter; 0: d*(1-j); 1: d*(1+j). */
    const double draws[] = {0.5, 0.0, 1.0};
    const int want[3][5] = {{4, 8, 16, 16, 16}, {2, 4, 8, 8, 8}, {6, 12, 24, 24, 24}};
    for (int t = 0; t < 3; t++) {
        hooks h;
        memset(&h, 0, sizeof h);
        h.draw = draws[t];
        ctl_client *c = client_new(&r, &h);
        atomic_store(&u.runs, 0);
        assert_int_equal(call(c, u.endpoint, 99, "Busy", "x", CALL_MS, 0, NULL, &err),
                         CTL_BUSY);
        assert_contains(err.msg, "(after 6 attempts)");
        assert_int_equal(atomic_load(&h.backoffs), 5);
        for (int i = 0; i < 5; i++) {
            assert_int_equal(h.retry[i], (unsigned)i + 1);
            assert_int_equal(h.ms[i], want[t][i]);
        }
        ctl_client_destroy(&c);
    }

    /* The client's own draws stay within [d*(1-j), d*(1+j)]. */
    hooks h;
    memset(&h, 0, sizeof h);
    h.draw = -1;
    r.max_attempts = 2;
    r.initial_backoff_ms = 20;
    r.max_backoff_ms = 20;
    r.jitter = 0.25;
    ctl_client *c = client_new(&r, &h);
    for (int i = 0; i < 20; i++) {
        atomic_store(&u.runs, 0);
        assert_int_equal(call(c, u.endpoint, 99, "Busy", "x", CALL_MS, 0, NULL, &err),
                         CTL_BUSY);
    }
    assert_int_equal(atomic_load(&h.backoffs), 20);
    int lo = 1000, hi = 0;
    for (int i = 0; i < 20; i++) {
        assert_in_range(h.ms[i], 15, 25);
        lo = h.ms[i] < lo ? h.ms[i] : lo;
        hi = h.ms[i] > hi ? h.ms[i] : hi;
    }
    assert_true(hi > lo); /* drawn, not fixed (20 equal draws: ~1e-20) */
    ctl_error_fini(&err);
    ctl_client_destroy(&c);
    unit_stop(&u);
}

/* No attempt starts when its backoff would end at or after the deadline:
 * the call ends with the last attempt's error, in time. */
static void test_deadline(void **state)
{
    (void)state;
    unit u;
    unit_start(&u);
    ctl_error err;
    ctl_error_init(&err);
    ctl_retry_policy r = policy(5);
    r.retry_busy = 1;
    r.initial_backoff_ms = 5000;
    r.max_backoff_ms = 5000;
    hooks h;
    memset(&h, 0, sizeof h);
    h.draw = -1;
    ctl_client *c = client_new(&r, &h);
    assert_int_equal(call(c, u.endpoint, 9, "Busy", "x", 3000, 0, NULL, &err), CTL_BUSY);
    assert_lacks(err.msg, "attempts");
    assert_int_equal(atomic_load(&u.runs), 1);
    assert_int_equal(atomic_load(&h.backoffs), 0);
    ctl_address_stats s = stats(c, u.endpoint);
    assert_int_equal(s.attempts, 1);
    assert_int_equal(s.retries, 0);
    assert_int_equal(s.retries_throttled, 0);
    ctl_error_fini(&err);
    ctl_client_destroy(&c);
    unit_stop(&u);
}

/* The budget: tokens start at budget_tokens, every retryable failure
 * takes one, a retry needs more than half left; successes give back
 * budget_ratio. */
static void test_budget(void **state)
{
    (void)state;
    unit u;
    unit_start(&u);
    ctl_error err;
    ctl_error_init(&err);
    ctl_retry_policy r = policy(10);
    r.retry_busy = 1;
    r.budget_tokens = 4;
    r.budget_ratio = 1;
    ctl_client *c = client_new(&r, NULL);

    /* 4 -> 3 (> 2: retry) -> 2 (not > 2: throttled). */
    assert_int_equal(call(c, u.endpoint, 99, "Busy", "x", CALL_MS, 0, NULL, &err), CTL_BUSY);
    assert_contains(err.msg, "(after 2 attempts)");
    ctl_address_stats s = stats(c, u.endpoint);
    assert_int_equal(s.attempts, 2);
    assert_int_equal(s.retries, 1);
    assert_int_equal(s.retries_throttled, 1);
    /* 2 -> 1: throttled at once. */
    assert_int_equal(call(c, u.endpoint, 99, "Busy", "x", CALL_MS, 0, NULL, &err), CTL_BUSY);
    assert_lacks(err.msg, "attempts");
    s = stats(c, u.endpoint);
    assert_int_equal(s.attempts, 3);
    assert_int_equal(s.retries_throttled, 2);
    /* Three successes: 1 -> 4 (capped). Then 4 -> 3 retry, 3 -> 2 throttled. */
    int64_t run;
    for (int i = 0; i < 3; i++)
        assert_int_equal(call(c, u.endpoint, 0, "", NULL, CALL_MS, 0, &run, &err), 0);
    atomic_store(&u.runs, 0);
    assert_int_equal(call(c, u.endpoint, 99, "Busy", "x", CALL_MS, 0, NULL, &err), CTL_BUSY);
    assert_int_equal(atomic_load(&u.runs), 2);
    assert_int_equal(stats(c, u.endpoint).retries_throttled, 3);

    /* Another address has a budget of its own. */
    unit v;
    unit_start(&v);
    assert_int_equal(call(c, v.endpoint, 1, "Busy", "x", CALL_MS, 0, &run, &err), 0);
    assert_int_equal(run, 2);
    ctl_error_fini(&err);
    ctl_client_destroy(&c);
    unit_stop(&v);
    unit_stop(&u);
}

/* ---- fan-out and asynchronous calls ----------------------------------- */

static void test_call_many_per_target(void **state)
{
    (void)state;
    unit a, b;
    unit_start(&a);
    unit_start(&b);
    char dead[64];
    tu_dead_address(dead, sizeof dead);
    ctl_retry_policy r = policy(3);
    r.retry_busy = 1;
    ctl_client *c = client_new(&r, NULL);
    tu_buf ab, bb;
    tu_buf_init(&ab);
    tu_buf_init(&bb);
    flaky_args(&ab, 2, "Busy", "x", 0);
    flaky_args(&bb, 9, "UnitFull", NULL, 0);
    ctl_target t[3] = {{a.endpoint, ab.sb.data, ab.sb.size},
                       {b.endpoint, bb.sb.data, bb.sb.size},
                       {dead, NULL, 0}};
    ctl_outcome out[3];
    assert_int_equal(ctl_client_call_many_ex(c, "flaky", t, 3, CALL_MS, 0, out), 2);
    assert_int_equal(out[0].error.kind, CTL_OK);
    assert_int_equal(ctl_reply_result(out[0].reply)->via.u64, 3);
    assert_int_equal(out[1].error.kind, CTL_UNIT_FULL);
    assert_lacks(out[1].error.msg, "attempts");
    assert_int_equal(out[2].error.kind, CTL_TRANSFER);
    assert_int_equal(out[2].error.cause, CTL_CAUSE_REFUSED);
    assert_contains(out[2].error.msg, "(after 3 attempts)");
    assert_int_equal(atomic_load(&a.runs), 3);
    assert_int_equal(atomic_load(&b.runs), 1);
    assert_int_equal(stats(c, a.endpoint).retries_busy, 2);
    assert_int_equal(stats(c, b.endpoint).attempts, 1);
    assert_int_equal(stats(c, dead).retries_by_cause[CTL_CAUSE_REFUSED], 2);
    ctl_outcomes_fini(out, 3);
    tu_buf_fini(&ab);
    tu_buf_fini(&bb);
    ctl_client_destroy(&c);
    unit_stop(&a);
    unit_stop(&b);
}

typedef struct seen {
    atomic_int completions;
    int kind;
    int cause;
    int64_t run;
    char msg[256];
} seen;

static void on_done(void *user, const ctl_error *err, ctl_reply *reply)
{
    seen *s = user;
    s->kind = err->kind;
    s->cause = err->cause;
    s->run = reply ? (int64_t)ctl_reply_result(reply)->via.u64 : -1;
    snprintf(s->msg, sizeof s->msg, "%s", err->msg ? err->msg : "");
    atomic_fetch_add(&s->completions, 1);
}

static void test_async_retries_on_engine(void **state)
{
    (void)state;
    unit u;
    unit_start(&u);
    ctl_error err;
    ctl_error_init(&err);
    ctl_retry_policy r = policy(4);
    r.retry_busy = 1;
    hooks h;
    memset(&h, 0, sizeof h);
    h.draw = -1;
    ctl_client *c = client_new(&r, &h);
    tu_buf b;
    tu_buf_init(&b);
    flaky_args(&b, 3, "Busy", "x", 0);
    seen s;
    memset(&s, 0, sizeof s);
    ctl_call *call = NULL;
    assert_int_equal(ctl_client_call_start_ex(c, u.endpoint, "flaky", b.sb.data,
                                              b.sb.size, CALL_MS, 0, on_done, &s,
                                              &call, &err), 0);
    assert_int_equal(ctl_call_wait(call, CALL_MS + 5000), 0);
    ctl_client_process(c, 0);
    assert_int_equal(atomic_load(&s.completions), 1);
    assert_int_equal(s.kind, CTL_OK);
    assert_int_equal(s.run, 4);
    assert_int_equal(atomic_load(&h.backoffs), 3);
    assert_int_equal(stats(c, u.endpoint).retries_busy, 3);
    ctl_call_release(call);

    /* A fan-out started asynchronously: each target on its own. */
    atomic_store(&u.runs, 0);
    flaky_args(&b, 1, "Busy", "x", 0);
    ctl_target t[2] = {{u.endpoint, b.sb.data, b.sb.size},
                       {u.endpoint, b.sb.data, b.sb.size}};
    assert_int_equal(ctl_client_call_many_start_ex(c, "flaky", t, 2, CALL_MS, 0,
                                                   NULL, NULL, &call, &err), 0);
    assert_int_equal(ctl_call_wait(call, CALL_MS + 5000), 0);
    size_t n = 0;
    const ctl_outcome *o = ctl_call_outcomes(call, &n);
    assert_int_equal(n, 2);
    assert_int_equal(o[0].error.kind, CTL_OK);
    assert_int_equal(o[1].error.kind, CTL_OK);
    /* One of the two met the one failing run and went again. */
    assert_int_equal(atomic_load(&u.runs), 3);
    ctl_call_release(call);
    tu_buf_fini(&b);
    ctl_error_fini(&err);
    ctl_client_destroy(&c);
    unit_stop(&u);
}

static void test_cancel_during_backoff(void **state)
{
    (void)state;
    unit u;
    unit_start(&u);
    ctl_error err;
    ctl_error_init(&err);
    ctl_retry_policy r = policy(4);
    r.retry_busy = 1;
    r.initial_backoff_ms = 20000;
    r.max_backoff_ms = 20000;
    hooks h;
    memset(&h, 0, sizeof h);
    h.draw = -1;
    ctl_client *c = client_new(&r, &h);
    tu_buf b;
    tu_buf_init(&b);
    flaky_args(&b, 9, "Busy", "x", 0);
    for (int destroy = 0; destroy < 2; destroy++) {
        seen s;
        memset(&s, 0, sizeof s);
        ctl_call *call = NULL;
        atomic_store(&h.backoffs, 0);
        assert_int_equal(ctl_client_call_start_ex(c, u.endpoint, "flaky", b.sb.data,
                                                  b.sb.size, 60000, 0, on_done, &s,
                                                  &call, &err), 0);
        /* Wait (with a deadline) for the backoff to begin. */
        int64_t end = tu_now_ms() + CALL_MS;
        while (atomic_load(&h.backoffs) == 0 && tu_now_ms() < end)
            tu_sleep_ms(2);
        assert_int_equal(atomic_load(&h.backoffs), 1);
        if (destroy) {
            ctl_client_destroy(&c);
        } else {
            ctl_call_cancel(call);
            assert_int_equal(ctl_call_wait(call, CALL_MS), 0);
            ctl_client_process(c, 0);
        }
        assert_int_equal(atomic_load(&s.completions), 1);
        assert_int_equal(s.kind, CTL_TRANSFER);
        assert_int_equal(s.cause, CTL_CAUSE_CANCELLED);
        assert_contains(s.msg, destroy ? "the client was destroyed while the call "
                                         "waited to retry"
                                       : "cancelled by the caller while waiting "
                                         "to retry");
        assert_int_equal(atomic_load(&u.runs), destroy ? 2 : 1);
        ctl_call_release(call);
        if (c)
            assert_int_equal(ctl_client_process(c, 0), 0); /* once only */
    }
    tu_buf_fini(&b);
    ctl_error_fini(&err);
    unit_stop(&u);
}

/* A unit that dies after the request left: the reconnect is refused.
 * Only an idempotent call goes again (it may have run). */
static void silent(tu_fake *fake, const tu_fake_req *req, void *user)
{
    (void)fake;
    (void)req;
    (void)user;
}

/* Start a call of flaky (idempotent or not) to a fake unit that never
 * answers, its endpoint in `at`, and wait until the fake has the request. */
static ctl_call *call_silent_fake(ctl_client *c, tu_fake **fake, char at[CTL_ENDPOINT_MAX],
                                  int timeout_ms, int idem, seen *s, ctl_error *err)
{
    assert_int_equal(tu_fake_start(fake, silent, NULL), 0);
    snprintf(at, CTL_ENDPOINT_MAX, "%s", tu_fake_endpoint(*fake));
    memset(s, 0, sizeof *s);
    ctl_call *call = NULL;
    assert_int_equal(ctl_client_call_start_ex(c, at, "flaky", NULL, 0, timeout_ms,
                                              idem ? CTL_CALL_IDEMPOTENT : 0, on_done, s,
                                              &call, err),
                     0);
    int64_t end = tu_now_ms() + CALL_MS;
    while (tu_fake_seen(*fake) < 1 && tu_now_ms() < end)
        tu_sleep_ms(2);
    assert_int_equal(tu_fake_seen(*fake), 1);
    return call;
}

static void test_dropped_mid_call(void **state)
{
    (void)state;
    ctl_retry_policy r = policy(3);
    ctl_error err;
    ctl_error_init(&err);
    for (int idem = 0; idem < 2; idem++) {
        tu_fake *fake = NULL;
        char at[CTL_ENDPOINT_MAX];
        ctl_client *c = client_new(&r, NULL);
        seen s;
        ctl_call *call = call_silent_fake(c, &fake, at, CALL_MS, idem, &s, &err);
        tu_fake_stop(&fake);
        assert_int_equal(ctl_call_wait(call, CALL_MS + 5000), 0);
        ctl_client_process(c, 0);
        assert_int_equal(atomic_load(&s.completions), 1);
        assert_int_equal(s.kind, CTL_TRANSFER);
        assert_int_equal(s.cause, CTL_CAUSE_REFUSED);
        ctl_address_stats st = stats(c, at);
        if (idem) {
            /* Then refused before anything was sent, twice. */
            assert_int_equal(st.attempts, 3);
            assert_int_equal(st.retries_by_cause[CTL_CAUSE_REFUSED], 2);
            /* The first did reach the unit: the call may have run, and
             * its message does not say that nothing was sent. */
            assert_contains(s.msg, "the last attempt was not sent (after 3 attempts; an "
                                   "earlier one was sent: the unit may have run it)");
            assert_lacks(s.msg, "nothing was sent");
        } else {
            assert_int_equal(st.attempts, 1);
            assert_contains(s.msg, "the request was sent before the connection was lost: "
                                   "it may have run");
            assert_lacks(s.msg, "nothing was sent");
            assert_lacks(s.msg, "attempts");
        }
        assert_int_equal(st.calls, 1);
        ctl_call_release(call);
        ctl_client_destroy(&c);
    }
    ctl_error_fini(&err);
}

/* A unit restarted in place under a call: the request died with the old
 * unit, and the new one takes its connection over (the reconnect is not
 * refused). An idempotent call with an attempt left goes again to the new
 * unit at once, instead of waiting for its deadline; any other call waits,
 * as the reply could still come (API.md). */
static void test_restarted_in_place(void **state)
{
    (void)state;
    ctl_retry_policy r = policy(3);
    ctl_error err;
    ctl_error_init(&err);
    for (int idem = 1; idem >= 0; idem--) {
        tu_fake *fake = NULL;
        char at[CTL_ENDPOINT_MAX];
        ctl_client *c = client_new(&r, NULL);
        seen s;
        int64_t t0 = tu_now_ms();
        ctl_call *call = call_silent_fake(c, &fake, at, idem ? CALL_MS : 1500, idem, &s, &err);
        tu_fake_stop(&fake);
        unit u;
        unit_start_at(&u, at); /* at once: before the client's first reconnect */
        assert_int_equal(ctl_call_wait(call, CALL_MS + 5000), 0);
        ctl_client_process(c, 0);
        int64_t took = tu_now_ms() - t0;
        assert_int_equal(atomic_load(&s.completions), 1);
        ctl_address_stats st = stats(c, at);
        if (idem) {
            assert_int_equal(s.kind, CTL_OK);
            assert_int_equal(s.run, 1); /* the new unit's first run */
            assert_true(took < CALL_MS / 2);
            assert_int_equal(st.retries_by_cause[CTL_CAUSE_TRANSPORT], 1);
        } else {
            assert_int_equal(s.kind, CTL_TRANSFER);
            assert_int_equal(s.cause, CTL_CAUSE_TIMEOUT);
            assert_int_equal(st.retries, 0);
            assert_int_equal(atomic_load(&u.runs), 0);
        }
        ctl_call_release(call);
        ctl_client_destroy(&c);
        unit_stop(&u);
    }
    ctl_error_fini(&err);
}

/* ---- the transparent retry -------------------------------------------- */

/* Call once so a socket is pooled, stop the unit, and wait until that
 * socket has seen its connection drop and a reconnect refused. */
static void pool_then_drop(ctl_client *c, unit *u)
{
    ctl_error err;
    ctl_error_init(&err);
    assert_int_equal(call(c, u->endpoint, 0, "", NULL, CALL_MS, 0, NULL, &err), 0);
    unit_stop(u);
    int64_t end = tu_now_ms() + CALL_MS;
    while (!ctl_client_idle_failing(c, u->endpoint) && tu_now_ms() < end)
        tu_sleep_ms(5);
    assert_true(ctl_client_idle_failing(c, u->endpoint));
    ctl_error_fini(&err);
}

static ctl_client *client_no_upkeep(int no_transparent)
{
    ctl_retry_policy r = policy(1);
    r.no_transparent = no_transparent;
    ctl_client *c = client_new(&r, NULL);
    ctl_retry_hooks k = {0};
    k.no_upkeep = 1; /* the dropped socket stays pooled */
    ctl_client_set_retry_hooks(c, &k);
    return c;
}

static void test_transparent(void **state)
{
    (void)state;
    ctl_error err;
    ctl_error_init(&err);
    int64_t run;

    /* The unit is back on its port: the request goes on a fresh socket at
     * once, costing one transparent retry (no policy needed). */
    unit u;
    unit_start(&u);
    char at[CTL_ENDPOINT_MAX];
    snprintf(at, sizeof at, "%s", u.endpoint);
    ctl_client *c = client_no_upkeep(0);
    pool_then_drop(c, &u);
    unit_start_at(&u, at);
    assert_int_equal(call(c, at, 0, "", NULL, CALL_MS, 0, &run, &err), 0);
    assert_int_equal(run, 1);
    /* Unless the old socket's own reconnect won the race (it retries every
     * 100 ms to 1 s): then it carried the request, as without the retry. */
    ctl_address_stats s = stats(c, at);
    assert_in_range(s.retries, 0, 1);
    assert_int_equal(s.attempts, 2 + s.retries);
    for (int i = 0; i < CTL_CAUSE_COUNT; i++)
        assert_int_equal(s.retries_by_cause[i], 0);
    assert_int_equal(s.calls, 2);
    unit_stop(&u);
    ctl_client_destroy(&c);

    /* Nothing listens: the fresh socket is refused, fast, as ever. */
    unit_start_at(&u, at);
    c = client_no_upkeep(0);
    pool_then_drop(c, &u);
    assert_int_equal(call(c, at, 0, "", NULL, CALL_MS, 0, NULL, &err), CTL_TRANSFER);
    assert_int_equal(err.cause, CTL_CAUSE_REFUSED);
    assert_contains(err.msg, "nothing was sent");
    assert_contains(err.msg, "(after 2 attempts)");
    assert_int_equal(stats(c, at).retries, 1);
    ctl_client_destroy(&c);

    /* Turned off: the old socket is used, and refused. */
    unit_start_at(&u, at);
    c = client_no_upkeep(1);
    pool_then_drop(c, &u);
    assert_int_equal(call(c, at, 0, "", NULL, CALL_MS, 0, NULL, &err), CTL_TRANSFER);
    assert_int_equal(err.cause, CTL_CAUSE_REFUSED);
    assert_contains(err.msg, "nothing was sent");
    assert_lacks(err.msg, "attempts");
    assert_int_equal(stats(c, at).retries, 0);
    ctl_client_destroy(&c);
    ctl_error_fini(&err);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_options),
        cmocka_unit_test(test_off_by_default),
        cmocka_unit_test(test_busy),
        cmocka_unit_test(test_never_retried),
        cmocka_unit_test(test_refused),
        cmocka_unit_test(test_timeout_idempotent_only),
        cmocka_unit_test(test_stub_idempotent_flag),
        cmocka_unit_test(test_attempt_timeout),
        cmocka_unit_test(test_backoff_growth_and_jitter),
        cmocka_unit_test(test_deadline),
        cmocka_unit_test(test_budget),
        cmocka_unit_test(test_call_many_per_target),
        cmocka_unit_test(test_async_retries_on_engine),
        cmocka_unit_test(test_cancel_during_backoff),
        cmocka_unit_test(test_dropped_mid_call),
        cmocka_unit_test(test_restarted_in_place),
        cmocka_unit_test(test_transparent),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
