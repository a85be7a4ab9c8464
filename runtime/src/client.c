/*
 * client.c - the client's entry points: blocking calls, fan-out, notify,
 * asynchronous calls and the client's life.
 *
 * Everything here is thin. A single blocking call drives its one request
 * (request.c) on its caller's thread, waiting in one blocking receive
 * bounded by its deadline, a slice at a time, reading its connection's
 * monitor between slices: the fewest system calls and no thread hand-off
 * per round trip. Every other call is started on the client's engine
 * (engine.c): asynchronous calls return at once, the blocking fan-out
 * starts one and waits for it.
 */
#include "ctlrpc/client.h"

#include <arpa/inet.h>
#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <time.h>
#include <unistd.h>

#include <zmq.h>

#include "ctlrpc/curve.h"
#include "ctlrpc/net.h"
#include "call_int.h"
#include "client_int.h"
#include "engine_int.h"
#include "request_int.h"
#include "pool_int.h"
#include "transport_int.h"
#include "util_int.h"

#define CHECK_SLICE_MS CTL_CHECK_SLICE_MS

/* The private ZeroMQ context's socket limit: each pooled connection takes
 * three sockets (the DEALER, its monitor and the PAIR that reads it), so
 * three times libzmq's default of 1023. */
#define OWN_CTX_MAX_SOCKETS 3072

void ctl_client_options_init(ctl_client_options *opts)
{
    memset(opts, 0, sizeof *opts);
    opts->default_timeout_ms = CTL_DEFAULT_TIMEOUT_MS;
    opts->late_grace_ms = CTL_DEFAULT_LATE_GRACE_MS;
    opts->max_idle_per_address = CTL_DEFAULT_MAX_IDLE_PER_ADDRESS;
    opts->max_retired = CTL_DEFAULT_MAX_RETIRED;
    opts->idle_timeout_ms = CTL_DEFAULT_IDLE_TIMEOUT_MS;
    opts->max_in_flight = CTL_DEFAULT_MAX_IN_FLIGHT;
    opts->max_addresses = CTL_DEFAULT_MAX_ADDRESSES;
    opts->retry.max_attempts = 1;
    opts->retry.initial_backoff_ms = CTL_DEFAULT_RETRY_INITIAL_BACKOFF_MS;
    opts->retry.max_backoff_ms = CTL_DEFAULT_RETRY_MAX_BACKOFF_MS;
    opts->retry.multiplier = CTL_DEFAULT_RETRY_MULTIPLIER;
    opts->retry.jitter = CTL_DEFAULT_RETRY_JITTER;
    opts->retry.budget_tokens = CTL_DEFAULT_RETRY_BUDGET_TOKENS;
    opts->retry.budget_ratio = CTL_DEFAULT_RETRY_BUDGET_RATIO;
}

/* Check the retry policy and give its zero fields their defaults. */
static int retry_policy(ctl_retry_policy *r, ctl_error *err)
{
    if (r->attempt_timeout_ms < 0)
        return ctl_error_set(err, CTL_INVALID,
                             "client: retry.attempt_timeout_ms %d is negative",
                             r->attempt_timeout_ms);
    if (r->initial_backoff_ms < 0)
        return ctl_error_set(err, CTL_INVALID,
                             "client: retry.initial_backoff_ms %d is negative",
                             r->initial_backoff_ms);
    if (r->max_backoff_ms < 0)
        return ctl_error_set(err, CTL_INVALID,
                             "client: retry.max_backoff_ms %d is negative",
                             r->max_backoff_ms);
    if (r->initial_backoff_ms == 0)
        r->initial_backoff_ms = CTL_DEFAULT_RETRY_INITIAL_BACKOFF_MS;
    if (r->max_backoff_ms == 0)
        r->max_backoff_ms = CTL_DEFAULT_RETRY_MAX_BACKOFF_MS > r->initial_backoff_ms
                                ? CTL_DEFAULT_RETRY_MAX_BACKOFF_MS
                                : r->initial_backoff_ms;
    if (r->max_backoff_ms < r->initial_backoff_ms)
        return ctl_error_set(err, CTL_INVALID,
                             "client: retry.max_backoff_ms %d is below "
                             "retry.initial_backoff_ms %d", r->max_backoff_ms,
                             r->initial_backoff_ms);
    if (r->multiplier == 0)
        r->multiplier = CTL_DEFAULT_RETRY_MULTIPLIER;
    if (!(r->multiplier >= 1 && r->multiplier <= 1e6)) /* NaN too */
        return ctl_error_set(err, CTL_INVALID,
                             "client: retry.multiplier %g is not between 1 and "
                             "1e6 (0 for the default, %g)", r->multiplier,
                             CTL_DEFAULT_RETRY_MULTIPLIER);
    if (!(r->jitter >= 0 && r->jitter <= 1))
        return ctl_error_set(err, CTL_INVALID,
                             "client: retry.jitter %g is not between 0 and 1",
                             r->jitter);
    if (r->budget_tokens == 0)
        r->budget_tokens = CTL_DEFAULT_RETRY_BUDGET_TOKENS;
    if (r->budget_tokens > 1000000u)
        return ctl_error_set(err, CTL_INVALID,
                             "client: retry.budget_tokens %u is more than "
                             "1000000", r->budget_tokens);
    if (r->budget_ratio == 0)
        r->budget_ratio = CTL_DEFAULT_RETRY_BUDGET_RATIO;
    if (!(r->budget_ratio > 0 && r->budget_ratio <= 1e6))
        return ctl_error_set(err, CTL_INVALID,
                             "client: retry.budget_ratio %g is not between 0 "
                             "and 1000000", r->budget_ratio);
    if (r->max_attempts == 0)
        r->max_attempts = 1;
    return 0;
}

/* Check the client's CURVE keys and copy them into the pool options. */
static int curve_keys(const ctl_client_options *o, ctl_pool_options *po,
                      ctl_error *err)
{
    if (!o->curve_server_key) {
        if (o->curve_secret_key)
            return ctl_error_set(err, CTL_INVALID,
                                 "client: a CURVE secret key needs the units' "
                                 "public key (curve_server_key)");
        return 0;
    }
    if (!ctl_curve_available())
        return ctl_error_set(err, CTL_INVALID,
                             "client: a CURVE key was given, but this libzmq "
                             "has no CURVE support");
    if (!ctl_curve_key_valid(o->curve_server_key))
        return ctl_error_set(err, CTL_INVALID,
                             "client: the units' CURVE public key is not a "
                             "40-character Z85 key");
    memcpy(po->curve_server, o->curve_server_key, CTL_CURVE_KEY_BUF);
    if (o->curve_secret_key) {
        if (!ctl_curve_key_valid(o->curve_secret_key))
            return ctl_error_set(err, CTL_INVALID,
                                 "client: its CURVE secret key is not a "
                                 "40-character Z85 key");
        memcpy(po->curve_secret, o->curve_secret_key, CTL_CURVE_KEY_BUF);
        return ctl_curve_public_of(po->curve_secret, po->curve_public, err);
    }
    return ctl_curve_keypair(po->curve_public, po->curve_secret, err);
}

int ctl_client_new(const ctl_client_options *opts, ctl_client **out,
                   ctl_error *err)
{
    if (!out)
        return ctl_error_set(err, CTL_INVALID, "client: out is NULL");
    *out = NULL;
    ctl_error_clear(err); /* success leaves nothing behind */
    ctl_client *c = calloc(1, sizeof *c);
    if (!c)
        return ctl_error_transfer(err, CTL_CAUSE_NOMEM, "client: out of memory");
    if (opts)
        c->opts = *opts;
    else
        ctl_client_options_init(&c->opts);
    if (c->opts.default_timeout_ms == 0)
        c->opts.default_timeout_ms = CTL_DEFAULT_TIMEOUT_MS;
    if (c->opts.default_timeout_ms < 0) {
        int bad = c->opts.default_timeout_ms;
        free(c);
        return ctl_error_set(err, CTL_INVALID,
                             "client: default_timeout_ms %d is negative", bad);
    }
    if (c->opts.idle_timeout_ms < 0) {
        int bad = c->opts.idle_timeout_ms;
        free(c);
        return ctl_error_set(err, CTL_INVALID,
                             "client: idle_timeout_ms %d is negative", bad);
    }
    if (c->opts.idle_timeout_ms == 0)
        c->opts.idle_timeout_ms = CTL_DEFAULT_IDLE_TIMEOUT_MS;
    if (c->opts.late_grace_ms < 0) {
        int bad = c->opts.late_grace_ms;
        free(c);
        return ctl_error_set(err, CTL_INVALID,
                             "client: late_grace_ms %d is negative", bad);
    }
    int bad_retry = retry_policy(&c->opts.retry, err);
    if (bad_retry != 0) {
        free(c);
        return bad_retry;
    }
        if (c->opts.max_in_flight == 0)
        c->opts.max_in_flight = CTL_DEFAULT_MAX_IN_FLIGHT;
    if (c->opts.max_addresses == 0)
        c->opts.max_addresses = CTL_DEFAULT_MAX_ADDRESSES;
    if (c->opts.max_idle_per_address == 0)
        c->opts.max_idle_per_address = CTL_DEFAULT_MAX_IDLE_PER_ADDRESS;
    if (c->opts.max_retired == 0)
        c->opts.max_retired = CTL_DEFAULT_MAX_RETIRED;
    c->opts.limits = ctl_limits_resolve(&c->opts.limits);

    c->ctx = c->opts.zmq_context;
    if (!c->ctx) {
        c->ctx = zmq_ctx_new();
        c->own_ctx = 1;
        if (c->ctx)
            zmq_ctx_set(c->ctx, ZMQ_MAX_SOCKETS, OWN_CTX_MAX_SOCKETS);
        if (!c->ctx) {
            free(c);
            return ctl_error_transfer(err, CTL_CAUSE_TRANSPORT,
                                      "client: cannot create a ZeroMQ "
                                      "context: %s",
                                      zmq_strerror(zmq_errno()));
        }
    }
    ctl_zmq_threads_start(c->ctx);
    ctl_pool_options po = {c->opts.max_idle_per_address, c->opts.max_retired,
                           c->opts.late_grace_ms, c->opts.idle_timeout_ms,
                           c->opts.max_addresses, c->opts.limits.max_msg_bytes,
                           "", "", ""};
    int rc = curve_keys(&c->opts, &po, err);
    /* The caller's key strings are not kept past this call. */
    c->opts.curve_server_key = c->opts.curve_secret_key = NULL;
    c->pool = rc == 0 ? ctl_pool_new(c->ctx, &po) : NULL;
    memset(po.curve_secret, 0, sizeof po.curve_secret);
    if (rc != 0) {
        if (c->own_ctx)
            zmq_ctx_term(c->ctx);
        free(c);
        return rc;
    }
    if (!c->pool) {
        if (c->own_ctx)
            zmq_ctx_term(c->ctx);
        free(c);
        return ctl_error_transfer(err, CTL_CAUSE_NOMEM, "client: out of memory");
    }
    rc = ctl_engine_new(c, &c->engine, err);
    if (rc != 0) {
        ctl_pool_destroy(&c->pool);
        if (c->own_ctx)
            zmq_ctx_term(c->ctx);
        free(c);
        return rc;
    }
    uint64_t seed = 0;
    if (getrandom(&seed, sizeof seed, GRND_NONBLOCK) != sizeof seed)
        seed = (uint64_t)time(NULL) ^ ((uint64_t)getpid() << 32) ^
               (uint64_t)(uintptr_t)c;
    atomic_init(&c->next_id, seed);
    atomic_init(&c->rng, seed * 0xd6e8feb86659fd93ull + 1);
    pthread_mutex_init(&c->log_lock, NULL);
    *out = c;
    return 0;
}

void ctl_client_destroy(ctl_client **client)
{
    if (!client || !*client)
        return;
    ctl_client *c = *client;
    ctl_engine_destroy(&c->engine);
    ctl_pool_destroy(&c->pool);
    if (c->own_ctx)
        zmq_ctx_term(c->ctx);
    pthread_mutex_destroy(&c->log_lock);
    free(c);
    *client = NULL;
}

/* The reply of a single call: a blocking receive bounded by the time
 * left (ZMQ_RCVTIMEO) costs fewer system calls than zmq_poll followed by
 * a receive, which is what a round trip's latency is made of. The
 * receive waits a slice at a time; between slices the call reads its
 * connection's monitor. */
static void collect_one(ctl_client *c, ctl_rq *p, int64_t deadline_ms)
{
    ctl_rq_send_wait(c, p, deadline_ms);
    while (!p->done) {
        int left = ctl_ms_left(deadline_ms);
        if (left <= 0) {
            ctl_rq_time_out(c, p);
            break;
        }
        int slice = left < CHECK_SLICE_MS ? left : CHECK_SLICE_MS;
        zmq_setsockopt(p->conn->sock, ZMQ_RCVTIMEO, &slice, sizeof slice);
        if (ctl_rq_recv(c, p, 0) == 1 && !p->done)
            ctl_rq_check_conn(c, p, ctl_now_ms());
    }
}

int ctl_client_timeout(const ctl_client *c, int timeout_ms)
{
    return timeout_ms < 0 ? c->opts.default_timeout_ms : timeout_ms;
}

/* Wait out a backoff on the calling thread, until `at_ms` (which
 * ctl_rq_retry puts before the call's deadline). */
static void backoff_wait(int64_t at_ms)
{
    int left;
    while ((left = ctl_ms_left(at_ms)) > 0) {
        struct timespec ts = {left / 1000, (long)(left % 1000) * 1000000L};
        nanosleep(&ts, NULL); /* EINTR: the loop sleeps what is left */
    }
}

/* The attempts of a single blocking call, each given the time left or
 * its own limit (retry.attempt_timeout_ms). */
static void drive_one(ctl_client *c, ctl_rq *p)
{
    int rc = ctl_rq_send(c, p);
    for (;;) {
        if (rc == 0)
            collect_one(c, p, ctl_rq_attempt_until(c, p, ctl_now_ms()));
        int64_t at;
        if (*p->reply || !ctl_rq_retry(c, p, ctl_now_ms(), &at))
            return;
        backoff_wait(at);
        rc = ctl_rq_resend(c, p);
    }
}

int ctl_client_call_req(ctl_client *client, const char *address,
                        const char *op, ctl_frame *req, int timeout_ms,
                        unsigned flags, ctl_reply **reply, ctl_error *err)
{
    if (reply)
        *reply = NULL;
    if (!client || !address || !op || !reply) {
        ctl_frame_fini(req);
        return ctl_error_set(err, CTL_INVALID, "call %s at %s: %s is NULL",
                             op ? op : "(null op)",
                             address ? address : "(null address)",
                             !client ? "client" : !address ? "address"
                                                : !op     ? "op"
                                                          : "reply");
    }
    ctl_error_clear(err);
    ctl_error local;
    ctl_error_init(&local);
    ctl_error *e = err ? err : &local;
    int rc = ctl_client_reserve(client, op, &address, 1, 0, e);
    if (rc != 0) {
        ctl_frame_fini(req);
        ctl_error_fini(&local);
        return rc;
    }
    int tmo = ctl_client_timeout(client, timeout_ms);
    int64_t deadline = ctl_now_ms() + tmo;
    ctl_rq p;
    ctl_rq_init(&p, address, op, tmo, req, reply, e);
    p.flags = flags;
    p.deadline_ms = deadline;
    /* The same instant on the wall clock, for the unit (docs/PROTOCOL.md,
     * "Deadlines"): one clock read a call. Every attempt carries it. */
    p.deadline_wall_ms = ctl_wall_ms() + tmo;
    drive_one(client, &p);
    ctl_client_unreserve(client, 1);
    ctl_rq_end(client, &p);
    rc = *reply ? 0 : (e->kind ? (int)e->kind : CTL_TRANSFER);
    ctl_error_fini(&local);
    return rc;
}

int ctl_client_call(ctl_client *client, const char *address, const char *op,
                    const void *args, size_t args_len, int timeout_ms,
                    ctl_reply **reply, ctl_error *err)
{
    return ctl_client_call_ex(client, address, op, args, args_len, timeout_ms,
                              0, reply, err);
}

int ctl_client_call_ex(ctl_client *client, const char *address, const char *op,
                       const void *args, size_t args_len, int timeout_ms,
                       unsigned flags, ctl_reply **reply, ctl_error *err)
{
    ctl_frame req;
    if (!args && args_len) {
        if (reply)
            *reply = NULL;
        return ctl_error_set(err, CTL_INVALID,
                             "call %s at %s: args is NULL but args_len is %zu",
                             op ? op : "(null op)",
                             address ? address : "(null address)", args_len);
    }
    ctl_frame_begin(&req, ctl_str_c(op), CTL_ID_LEN);
    ctl_frame_args(&req, args, args_len);
    return ctl_client_call_req(client, address, op, &req, timeout_ms, flags,
                               reply, err);
}

/* Check the arguments of a fan-out; fills every outcome with the refusal. */
static int many_refused(ctl_client *client, const char *op,
                        const char *const *addresses, const void *reqs,
                        size_t count, ctl_outcome *outcomes)
{
    if (outcomes && client && op && (!count || (addresses && reqs)))
        return 0;
    for (size_t i = 0; i < count && outcomes; i++)
        ctl_error_set(&outcomes[i].error, CTL_INVALID,
                      "call_many %s: %s is NULL", op ? op : "(null op)",
                      !client ? "client" : !op ? "op" : "targets");
    return CTL_INVALID;
}

int ctl_client_call_many_req(ctl_client *client, const char *op,
                             const char *const *addresses, ctl_frame *reqs,
                             size_t count, int timeout_ms, unsigned flags,
                             ctl_outcome *outcomes)
{
    for (size_t i = 0; i < count && outcomes; i++) {
        outcomes[i].reply = NULL;
        ctl_error_init(&outcomes[i].error);
    }
    if (many_refused(client, op, addresses, reqs, count, outcomes) != 0) {
        for (size_t i = 0; i < count && reqs; i++)
            ctl_frame_fini(&reqs[i]);
        return CTL_INVALID;
    }
    if (count == 0)
        return 0;
    ctl_call *call = ctl_call_alloc(client, op, addresses, count, 1,
                                    ctl_client_timeout(client, timeout_ms));
    ctl_error err;
    ctl_error_init(&err);
    int rc;
    if (!call) {
        rc = ctl_error_transfer(&err, CTL_CAUSE_NOMEM,
                                "call_many %s: out of memory", op);
    } else {
        for (size_t i = 0; i < count; i++) {
            call->reqs[i] = reqs[i]; /* moved */
            memset(&reqs[i], 0, sizeof reqs[i]);
        }
        rc = ctl_client_many_run(call, flags, &err);
    }
    if (rc != 0) {
        for (size_t i = 0; i < count; i++) {
            ctl_frame_fini(&reqs[i]);
            ctl_error_copy(&outcomes[i].error, &err);
        }
        ctl_error_fini(&err);
        return count > INT32_MAX ? INT32_MAX : (int)count;
    }
    size_t failed = 0;
    for (size_t i = 0; i < count; i++) {
        outcomes[i] = call->outcomes[i]; /* moved */
        call->outcomes[i].reply = NULL;
        ctl_error_init(&call->outcomes[i].error);
        if (outcomes[i].error.kind != CTL_OK)
            failed++;
    }
    call->held = 0; /* all moved to the caller's */
    ctl_call_release(call);
    return failed > INT32_MAX ? INT32_MAX : (int)failed;
}

int ctl_client_many_run(ctl_call *call, unsigned flags, ctl_error *err)
{
    /* The engine drives it; this thread sends on the idle sockets (as an
     * asynchronous fan-out does, engine_int.h) and waits. */
    call->flags = flags;
    call->send_on_submit = CTL_SEND_IDLE;
    call->waited = 1;
    int rc = ctl_call_submit(call, &call, err);
    if (rc == 0)
        ctl_call_wait(call, -1);
    return rc;
}

int ctl_client_call_many(ctl_client *client, const char *op,
                         const ctl_target *targets, size_t count,
                         int timeout_ms, ctl_outcome *outcomes)
{
    return ctl_client_call_many_ex(client, op, targets, count, timeout_ms, 0,
                                   outcomes);
}

int ctl_client_call_many_ex(ctl_client *client, const char *op,
                            const ctl_target *targets, size_t count,
                            int timeout_ms, unsigned flags,
                            ctl_outcome *outcomes)
{
    if (!targets && count) {
        return ctl_client_call_many_req(client, op, NULL, NULL, count,
                                        timeout_ms, flags, outcomes);
    }
    ctl_frame *reqs = calloc(count ? count : 1, sizeof *reqs);
    const char **addresses = calloc(count ? count : 1, sizeof *addresses);
    if (!reqs || !addresses) {
        free(reqs);
        free(addresses);
        for (size_t i = 0; i < count && outcomes; i++) {
            outcomes[i].reply = NULL;
            ctl_error_init(&outcomes[i].error);
            ctl_error_transfer(&outcomes[i].error, CTL_CAUSE_NOMEM,
                               "call_many %s: out of memory", op ? op : "");
        }
        return outcomes ? (int)(count > INT32_MAX ? INT32_MAX : count)
                        : CTL_INVALID;
    }
    for (size_t i = 0; i < count; i++) {
        addresses[i] = targets[i].address;
        ctl_frame_begin(&reqs[i], ctl_str_c(op), CTL_ID_LEN);
        /* NULL args with a length: an unusable target, refused below. */
        if (!targets[i].args && targets[i].args_len)
            addresses[i] = NULL;
        else
            ctl_frame_args(&reqs[i], targets[i].args, targets[i].args_len);
    }
    int rc = ctl_client_call_many_req(client, op, addresses, reqs, count,
                                      timeout_ms, flags, outcomes);
    for (size_t i = 0; i < count && outcomes && rc >= 0; i++)
        if (!targets[i].args && targets[i].args_len)
            ctl_error_set(&outcomes[i].error, CTL_INVALID,
                          "call_many %s: target #%zu has NULL args but a "
                          "length", op, i);
    free(reqs);
    free(addresses);
    return rc;
}

void ctl_outcomes_fini(ctl_outcome *outcomes, size_t count)
{
    if (!outcomes)
        return;
    for (size_t i = 0; i < count; i++) {
        ctl_reply_destroy(&outcomes[i].reply);
        ctl_error_fini(&outcomes[i].error);
    }
}

int ctl_client_notify_req(ctl_client *client, const char *address,
                          const char *op, ctl_frame *req, ctl_error *err)
{
    if (!client || !address || !op) {
        ctl_frame_fini(req);
        return ctl_error_set(err, CTL_INVALID, "notify %s at %s: %s is NULL",
                             op ? op : "(null op)",
                             address ? address : "(null address)",
                             !client ? "client" : !address ? "address" : "op");
    }
    ctl_error_clear(err);
    int64_t deadline = ctl_now_ms() + client->opts.default_timeout_ms;
    ctl_error local;
    ctl_error_init(&local);
    ctl_error *e = err ? err : &local;
    ctl_rq rq;
    ctl_rq_init(&rq, address, op, client->opts.default_timeout_ms, req, NULL, e);
    rq.notify = 1;
    int rc = ctl_rq_send(client, &rq);
    if (rc == 0) {
        /* Until it has gone: a notify to a unit that refuses fails fast,
         * and says nothing was sent. */
        ctl_rq_send_wait(client, &rq, deadline);
        if (!rq.done)
            ctl_rq_finish_clean(client, &rq);
        rc = e->kind ? (int)e->kind : 0;
    }
    ctl_rq_count_outcome(client, &rq);
    ctl_frame_fini(req);
    ctl_error_fini(&local);
    return rc;
}

int ctl_client_notify(ctl_client *client, const char *address, const char *op,
                      const void *args, size_t args_len, ctl_error *err)
{
    ctl_frame req;
    if (!args && args_len)
        return ctl_error_set(err, CTL_INVALID,
                             "notify %s at %s: args is NULL but args_len is %zu",
                             op ? op : "(null op)",
                             address ? address : "(null address)", args_len);
    if (args_len) {
        /* A unit drops a notify whose args are no map, and says nothing:
         * said here instead. */
        unsigned char b = *(const unsigned char *)args;
        if (!(b >= 0x80 && b <= 0x8f) && b != 0xde && b != 0xdf)
            return ctl_error_set(err, CTL_INVALID,
                                 "notify %s at %s: args are not a msgpack map (their "
                                 "first byte is 0x%02x); nothing was sent",
                                 op ? op : "(null op)",
                                 address ? address : "(null address)", b);
    }
    ctl_frame_begin(&req, ctl_str_c(op), 0);
    ctl_frame_args(&req, args, args_len);
    return ctl_client_notify_req(client, address, op, &req, err);
}

void ctl_client_stats_get(const ctl_client *client, ctl_client_stats *out)
{
    const ctl_pool_counters *pc = ctl_pool_counters_get(client->pool);
    out->calls = atomic_load_explicit(&client->calls, memory_order_relaxed);
    out->notifies = atomic_load_explicit(&client->notifies, memory_order_relaxed);
    out->timeouts = atomic_load_explicit(&client->timeouts, memory_order_relaxed);
    out->late_replies = atomic_load_explicit(&pc->late_replies, memory_order_relaxed);
    out->sockets_opened =
        atomic_load_explicit(&pc->sockets_opened, memory_order_relaxed);
    out->sockets_retired =
        atomic_load_explicit(&pc->sockets_retired, memory_order_relaxed);
    out->sockets_closed =
        atomic_load_explicit(&pc->sockets_closed, memory_order_relaxed);
}

void ctl_client_address_stats(ctl_client *client, const char *address,
                              ctl_address_stats *out)
{
    if (!out)
        return;
    if (!client) {
        memset(out, 0, sizeof *out);
        return;
    }
    ctl_pool_address_stats(client->pool, address, out);
}

size_t ctl_client_addresses(ctl_client *client, const char **out, size_t max)
{
    return client ? ctl_pool_addresses(client->pool, out, max) : 0;
}

/* ---- asynchronous calls ------------------------------------------------ */

int ctl_client_call_start(ctl_client *client, const char *address,
                          const char *op, const void *args, size_t args_len,
                          int timeout_ms, ctl_call_done *done, void *user,
                          ctl_call **call, ctl_error *err)
{
    return ctl_client_call_start_ex(client, address, op, args, args_len,
                                    timeout_ms, 0, done, user, call, err);
}

int ctl_client_call_start_ex(ctl_client *client, const char *address,
                             const char *op, const void *args, size_t args_len,
                             int timeout_ms, unsigned flags,
                             ctl_call_done *done, void *user, ctl_call **call,
                             ctl_error *err)
{
    if (call)
        *call = NULL;
    if (!client || !address || !op || (!args && args_len))
        return ctl_error_set(err, CTL_INVALID, "call %s at %s: %s",
                             op ? op : "(null op)",
                             address ? address : "(null address)",
                             !client    ? "client is NULL"
                             : !address ? "address is NULL"
                             : !op      ? "op is NULL"
                                        : "args is NULL but args_len is not 0");
    ctl_error_clear(err);
    ctl_call *c = ctl_call_alloc(client, op, &address, 1, 0,
                                 ctl_client_timeout(client, timeout_ms));
    if (!c)
        return ctl_error_transfer(err, CTL_CAUSE_NOMEM,
                                  "call %s at %s: out of memory", op, address);
    ctl_frame_begin(&c->reqs[0], ctl_str_c(op), CTL_ID_LEN);
    ctl_frame_args(&c->reqs[0], args, args_len);
    c->done_one = done;
    c->user = user;
    c->flags = flags;
    return ctl_call_submit(c, call, err);
}

int ctl_client_call_many_start(ctl_client *client, const char *op,
                               const ctl_target *targets, size_t count,
                               int timeout_ms, ctl_call_many_done *done,
                               void *user, ctl_call **call, ctl_error *err)
{
    return ctl_client_call_many_start_ex(client, op, targets, count,
                                         timeout_ms, 0, done, user, call, err);
}

int ctl_client_call_many_start_ex(ctl_client *client, const char *op,
                                  const ctl_target *targets, size_t count,
                                  int timeout_ms, unsigned flags,
                                  ctl_call_many_done *done, void *user,
                                  ctl_call **call, ctl_error *err)
{
    if (call)
        *call = NULL;
    if (!client || !op || (count && !targets))
        return ctl_error_set(err, CTL_INVALID, "call_many %s: %s is NULL",
                             op ? op : "(null op)",
                             !client ? "client" : !op ? "op" : "targets");
    ctl_error_clear(err);
    const char **addresses = calloc(count ? count : 1, sizeof *addresses);
    if (!addresses)
        return ctl_error_transfer(err, CTL_CAUSE_NOMEM,
                                  "call_many %s: out of memory", op);
    for (size_t i = 0; i < count; i++)
        addresses[i] = targets[i].args || !targets[i].args_len
                           ? targets[i].address : NULL;
    ctl_call *c = ctl_call_alloc(client, op, addresses, count, 1,
                                 ctl_client_timeout(client, timeout_ms));
    free(addresses);
    if (!c)
        return ctl_error_transfer(err, CTL_CAUSE_NOMEM,
                                  "call_many %s: out of memory", op);
    for (size_t i = 0; i < count; i++) {
        ctl_frame_begin(&c->reqs[i], ctl_str_c(op), CTL_ID_LEN);
        if (c->addresses[i])
            ctl_frame_args(&c->reqs[i], targets[i].args, targets[i].args_len);
        else if (targets[i].address)
            /* NULL args with a length: the target fails as the blocking
             * fan-out's does (the engine keeps an error set here). */
            ctl_error_set(&c->outcomes[i].error, CTL_INVALID,
                          "call_many %s: target #%zu has NULL args but a length",
                          op, i);
    }
    c->done_many = done;
    c->user = user;
    c->flags = flags;
    c->send_on_submit = CTL_SEND_IDLE;
    return ctl_call_submit(c, call, err);
}

int ctl_client_process(ctl_client *client, int max)
{
    return client ? ctl_engine_process(client->engine, max) : 0;
}

int ctl_client_event_fd(const ctl_client *client)
{
    return client ? ctl_engine_event_fd(client->engine) : -1;
}
