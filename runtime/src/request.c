/*
 * request.c - one request's life on the client: see request_int.h.
 *
 * What a received message means is decided by the call core (call.c); this
 * file lends sockets, sends, judges what arrives, reads the connection's
 * monitor, and retires. A request is framed in place (ctl_frame) into a
 * buffer that ZeroMQ takes over without a copy. A reply is received into a
 * zmq_msg_t kept in the ctl_reply handle's tail and decoded into the
 * handle's own zone; the result's strings and bins point into that message.
 *
 * Request ids are 12 lowercase hex digits, as the reference design uses,
 * drawn from a per-client counter that starts at a random point: unique
 * among a client's requests in flight, and unlikely to collide with another
 * client's ids (which does not matter for correctness: ids are only ever
 * compared on the socket that sent them); then '@' and the call's deadline
 * on the wall clock, which a unit honours (docs/PROTOCOL.md, "Deadlines").
 */
#include "request_int.h"

#include <arpa/inet.h>
#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>

#include <zmq.h>

#include "ctlrpc/net.h"
#include "call_int.h"
#include "client_int.h"
#include "transport_int.h"

void ctl_client_log(const ctl_client *c, const char *fmt, ...)
{
    char line[512];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(line, sizeof line, fmt, ap);
    va_end(ap);
    if (c->opts.log)
        c->opts.log(c->opts.log_user, line);
    else
        fprintf(stderr, "ctlrpc client: %s\n", line);
}

void ctl_client_log_limited(ctl_client *c, ctl_cause kind, const char *line)
{
    if ((unsigned)kind >= CTL_CAUSE_COUNT)
        kind = CTL_CAUSE_NONE;
    uint64_t skipped = 0;
    pthread_mutex_lock(&c->log_lock);
    bool pass = ctl_log_limit_pass(&c->log_limit[kind], ctl_now_ms(), &skipped);
    pthread_mutex_unlock(&c->log_lock);
    /* Logged after the lock is let go: the caller's log function may take
     * its time, and other threads' failures need not wait for it. */
    if (!pass)
        return;
    char more[80] = "";
    if (skipped)
        snprintf(more, sizeof more, CTL_LOG_LEFT_OUT_FMT, (unsigned long long)skipped);
    ctl_client_log(c, "%s%s", line, more);
}

void ctl_client_new_id(ctl_client *c, int64_t deadline_wall_ms,
                       char out[CTL_ID_LEN + 1])
{
    ctl_call_format_id(
        atomic_fetch_add_explicit(&c->next_id, 1, memory_order_relaxed),
        deadline_wall_ms, out);
}

int ctl_client_reserve(ctl_client *c, const char *op, const char *const *addresses,
                       size_t n, int many, ctl_error *err)
{
    uint64_t max = c->opts.max_in_flight;
    uint64_t now = atomic_fetch_add_explicit(&c->in_flight, n,
                                             memory_order_relaxed);
    if (now + n <= max)
        return 0;
    atomic_fetch_sub_explicit(&c->in_flight, n, memory_order_relaxed);
    for (size_t i = 0; i < n; i++) { /* each target's, in its address's errors */
        ctl_addr *a = addresses[i] ? ctl_pool_addr(c->pool, addresses[i], NULL) : NULL;
        if (a)
            ctl_pool_count_error(a, CTL_CAUSE_LIMIT);
    }
    const char *at = !many && n == 1 ? addresses[0] : NULL;
    return ctl_error_transfer(err, CTL_CAUSE_LIMIT,
                              "%s%s%s: %llu requests already in flight, and %zu "
                              "more would pass this client's max_in_flight "
                              "of %llu; nothing was sent", op,
                              at ? " at " : "_many", at ? at : "",
                              (unsigned long long)now, n,
                              (unsigned long long)max);
}

void ctl_client_unreserve(ctl_client *c, size_t n)
{
    atomic_fetch_sub_explicit(&c->in_flight, n, memory_order_relaxed);
}

/* Refuse a request that is not to be sent: one packed out of memory, one
 * larger than the client's limit (logged), or any request when the caller
 * gave no time at all (`timeout_ms` 0). Returns 0 when it may go, else the
 * kind with `err` set and *addr the address's entry when it is known. */
int ctl_client_refuse(ctl_client *c, const ctl_frame *req,
                          const char *address, const char *op, int timeout_ms,
                          ctl_addr **addr, ctl_error *err)
{
    if (req->invalid)
        return ctl_error_set(err, CTL_INVALID, "%s at %s: %s; nothing was sent", op,
                             address, req->invalid);
    if (!*op)
        return ctl_error_set(err, CTL_INVALID, "a call at %s names no op (an empty op "
                             "name); nothing was sent", address);
    if (req->failed)
        return ctl_error_transfer(err, CTL_CAUSE_NOMEM,
                                  "%s at %s: out of memory packing the "
                                  "request", op, address);
    size_t limit = c->opts.limits.max_msg_bytes;
    size_t size = ctl_frame_size(req);
    if (size <= limit && timeout_ms != 0)
        return 0;
    /* The address must be usable before anything else is said of it. */
    if (!(*addr = ctl_pool_addr(c->pool, address, err)))
        return err ? (int)err->kind : CTL_INVALID;
    if (timeout_ms == 0) {
        return ctl_error_transfer(err, CTL_CAUSE_TIMEOUT,
                                  "%s at %s: a timeout of 0 ms leaves no time "
                                  "for a reply; nothing was sent", op, address);
    }
    ctl_error_transfer(err, CTL_CAUSE_TOO_LARGE,
                       "%s at %s: the request is %zu bytes, larger than this "
                       "client's limit of %zu bytes (limits.max_msg_bytes); "
                       "not sent", op, address, size, limit);
    ctl_client_log_limited(c, CTL_CAUSE_TOO_LARGE,
                           err && err->msg ? err->msg
                                           : "a request over the size limit was not sent");
    return CTL_TRANSFER;
}

void ctl_rq_init(ctl_rq *rq, const char *address, const char *op,
                 int timeout_ms, ctl_frame *req, ctl_reply **reply,
                 ctl_error *err)
{
    memset(rq, 0, sizeof *rq);
    rq->address = address;
    rq->op = op;
    rq->timeout_ms = timeout_ms;
    rq->reply = reply;
    rq->err = err;
    rq->req = req;
}

/* Hand the request's message (p->out, p->conn lent) to its socket: at once
 * on a connection that is up, or it stays unsent until one is. A pooled
 * socket that finds no connection has lost it since its last call (it was
 * up then, and one request at a time never fills its queue): nothing left,
 * so the request goes at once on a socket dialed afresh instead of waiting
 * for the old one's reconnect (the transparent retry). */
static int launch(ctl_client *c, ctl_rq *p)
{
    if (!p->owner) /* a blocking call: the engine has no business with it */
        ctl_pool_unwatch(c->pool, p->conn);
    p->attempts++;
    p->left = 0;
    p->conn->st.lost = 0; /* a drop from now on is this attempt's */
    ctl_pool_count_attempt(p->addr);
    p->sent_ms = ctl_now_ms();
    p->unsent = 1;
    if (!ctl_rq_try_send(c, p) && p->conn->reused && !p->notify &&
        !c->opts.retry.no_transparent) {
        ctl_conn *fresh = ctl_pool_lend_fresh(c->pool, p->address, NULL);
        if (fresh) {
            ctl_pool_retire(c->pool, p->conn);
            p->conn = fresh;
            p->attempts++;
            p->transparent++;
            ctl_pool_count_attempt(p->addr);
            ctl_pool_count_retry(p->addr, 0, CTL_CAUSE_NONE);
            p->sent_ms = ctl_now_ms();
            ctl_rq_try_send(c, p);
        }
    }
    return p->done ? (int)(p->err->kind ? p->err->kind : CTL_TRANSFER) : 0;
}

/* Whether a failed attempt may be followed by another (the policy's
 * max_attempts permitting). */
static int policy_on(const ctl_client *c, const ctl_rq *p)
{
    return c->opts.retry.max_attempts > 1 && !p->notify;
}

int ctl_rq_send(ctl_client *c, ctl_rq *p)
{
    ctl_frame *req = p->req;
    ctl_error *err = p->err;
    int rc;
    p->req = NULL;
    rc = ctl_client_refuse(c, req, p->address, p->op, p->timeout_ms, &p->addr,
                           err);
    if (rc == 0 && p->idle_only && !p->conn) {
        p->req = req; /* for the thread that may dial */
        return 0;
    }
    if (rc == 0 && !p->conn && !(p->conn = ctl_pool_lend(c->pool, p->address, err)))
        rc = err->kind ? (int)err->kind : CTL_TRANSFER;
    if (rc != 0) {
        if (p->conn) { /* lent beforehand (idle_only), unused */
            ctl_pool_return(c->pool, p->conn);
            p->conn = NULL;
        }
        ctl_frame_fini(req);
        p->done = 1;
        return rc;
    }
    p->addr = p->conn->addr;
    if (!p->notify) {
        if (!p->deadline_wall_ms)
            p->deadline_wall_ms = ctl_wall_ms() + p->timeout_ms;
        ctl_client_new_id(c, p->deadline_wall_ms, p->id);
        ctl_frame_set_id(req, (ctl_str){p->id, CTL_ID_LEN});
    }
    ctl_payload payload;
    rc = ctl_frame_take(req, &payload);
    ctl_frame_fini(req);
    if (rc != 0 || ctl_send_prepare(&p->out, &payload) != 0) {
        ctl_error_transfer(err, CTL_CAUSE_NOMEM, "%s at %s: out of memory",
                           p->op, p->address);
        ctl_pool_retire(c->pool, p->conn);
        p->conn = NULL;
        p->done = 1;
        return CTL_TRANSFER;
    }
    /* A reference, not a copy of the bytes: no allocation either. */
    if (policy_on(c, p) && zmq_msg_init(&p->keep) == 0) {
        if (zmq_msg_copy(&p->keep, &p->out) == 0)
            p->kept = 1;
        else
            zmq_msg_close(&p->keep);
    }
    return launch(c, p);
}

int ctl_rq_resend(ctl_client *c, ctl_rq *p)
{
    ctl_error *err = p->err;
    int left = ctl_ms_left(p->deadline_ms);
    p->backoff = 0;
    if (!p->kept || left <= 0) {
        /* The backoff ended on time, but its timer fired late: the last
         * attempt's error stands, and nothing more is tried. */
        if (p->kept)
            zmq_msg_close(&p->keep);
        p->kept = 0;
        p->done = 1;
        return err->kind ? (int)err->kind : CTL_TRANSFER;
    }
    p->done = 0;
    p->dirty = 0;
    p->timeout_ms = left;
    ctl_error_clear(err);
    if (!(p->conn = ctl_pool_lend(c->pool, p->address, err))) {
        p->done = 1;
        return err->kind ? (int)err->kind : CTL_TRANSFER;
    }
    if (zmq_msg_init(&p->out) != 0 || zmq_msg_copy(&p->out, &p->keep) != 0) {
        zmq_msg_close(&p->out);
        ctl_rq_fail(c, p, CTL_CAUSE_NOMEM, "out of memory");
        return CTL_TRANSFER;
    }
    return launch(c, p);
}

int ctl_rq_try_send(ctl_client *c, ctl_rq *p)
{
    if (p->done || !p->unsent)
        return 1;
    for (;;) {
        if (zmq_msg_send(&p->out, p->conn->sock, ZMQ_DONTWAIT) >= 0)
            break;
        int e = zmq_errno();
        if (e == EINTR)
            continue;
        if (e == EAGAIN)
            return 0; /* no connection yet: nothing is queued */
        ctl_rq_fail(c, p, CTL_CAUSE_TRANSPORT, "send failed; nothing was sent");
        return 1;
    }
    p->unsent = 0;
    p->left = p->ever_left = 1;
    if (p->notify) {
        atomic_fetch_add_explicit(&c->notifies, 1, memory_order_relaxed);
    } else {
        atomic_fetch_add_explicit(&c->calls, 1, memory_order_relaxed);
        ctl_pool_count_call(p->addr);
    }
    return 1;
}

void ctl_rq_send_wait(ctl_client *c, ctl_rq *p, int64_t deadline_ms)
{
    while (!p->done && p->unsent) {
        int left = ctl_ms_left(deadline_ms);
        if (left <= 0) {
            ctl_rq_time_out(c, p);
            return;
        }
        int slice = left < CTL_CHECK_SLICE_MS ? left : CTL_CHECK_SLICE_MS;
        zmq_pollitem_t it = {p->conn->sock, 0, ZMQ_POLLOUT, 0};
        if (zmq_poll(&it, 1, slice) < 0 && zmq_errno() != EINTR) {
            ctl_rq_fail(c, p, CTL_CAUSE_TRANSPORT, "poll failed; nothing was sent");
            return;
        }
        if (!ctl_rq_try_send(c, p))
            ctl_rq_check_conn(c, p, ctl_now_ms());
    }
}

void ctl_rq_count_outcome(ctl_client *c, const ctl_rq *p)
{
    if (!p->err || p->err->kind != CTL_TRANSFER)
        return;
    if (p->addr)
        ctl_pool_count_error(p->addr, p->err->cause);
    /* Calls that ended as timeouts, not attempts (a retried attempt that
     * timed out is counted in retries_by_cause). */
    if (p->err->cause == CTL_CAUSE_TIMEOUT)
        atomic_fetch_add_explicit(&c->timeouts, 1, memory_order_relaxed);
}

/* ---- retries (docs/API.md, "Retries") --------------------------------- */

void ctl_client_set_retry_hooks(ctl_client *c, const ctl_retry_hooks *hooks)
{
    c->hooks = *hooks;
    atomic_store_explicit(&c->no_upkeep, hooks->no_upkeep, memory_order_relaxed);
}

int ctl_client_idle_failing(ctl_client *c, const char *address)
{
    return ctl_pool_idle_failing(c->pool, address);
}

/* A draw uniform in [0, 1): splitmix64 over a Weyl sequence, so threads
 * share the state with one atomic add and no lock. */
static double draw(ctl_client *c)
{
    if (c->hooks.random)
        return c->hooks.random(c->hooks.user);
    uint64_t z = atomic_fetch_add_explicit(&c->rng, 0x9e3779b97f4a7c15ull,
                                           memory_order_relaxed);
    z += 0x9e3779b97f4a7c15ull;
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    z ^= z >> 31;
    return (double)(z >> 11) / 9007199254740992.0; /* 2^53 */
}

/* The backoff before retry `n` (1, 2, ...) before its jitter:
 * min(initial * multiplier^(n-1), max). */
static double backoff_base(const ctl_client *c, unsigned n)
{
    const ctl_retry_policy *r = &c->opts.retry;
    double d = r->initial_backoff_ms;
    for (unsigned i = 1; i < n && d < r->max_backoff_ms; i++)
        d *= r->multiplier;
    return d > r->max_backoff_ms ? r->max_backoff_ms : d;
}

/* The backoff before retry `n`, drawn from [d*(1-j), d*(1+j)]. */
static int backoff_ms(ctl_client *c, unsigned n)
{
    const ctl_retry_policy *r = &c->opts.retry;
    double d = backoff_base(c, n);
    if (r->jitter > 0) {
        double u = draw(c);
        if (u < 0)
            u = 0;
        if (u > 1)
            u = 1;
        d *= 1 - r->jitter + 2 * r->jitter * u;
    }
    return d >= INT32_MAX ? INT32_MAX : (int)(d + 0.5);
}

/* Whether the policy would retry what the last attempt of `p` failed with:
 * 0 no, else 1 (Busy: 2). */
static int retryable(const ctl_client *c, const ctl_rq *p)
{
    const ctl_error *e = p->err;
    int idempotent = (p->flags & CTL_CALL_IDEMPOTENT) != 0;
    switch (e->kind) {
    case CTL_BUSY:
        return c->opts.retry.retry_busy &&
               !(e->reason && strcmp(e->reason, "draining") == 0) ? 2 : 0;
    case CTL_TRANSFER:
        switch (e->cause) {
        case CTL_CAUSE_REFUSED:
            /* Refused before it left: nothing reached a unit. A refused
             * reconnect after it left is a connection dropped mid-call. */
            return !p->left || idempotent;
        case CTL_CAUSE_TIMEOUT:
            return idempotent;
        case CTL_CAUSE_TRANSPORT:
            return p->left && idempotent;
        default:
            return 0;
        }
    default:
        return 0;
    }
}

int ctl_rq_retry(ctl_client *c, ctl_rq *p, int64_t now, int64_t *at_ms)
{
    const ctl_retry_policy *r = &c->opts.retry;
    if (!policy_on(c, p) || !p->kept || !p->addr || *p->reply)
        return 0;
    int kind = retryable(c, p);
    if (!kind)
        return 0;
    int64_t cap = (int64_t)r->budget_tokens * 1000;
    ctl_pool_budget_fail(p->addr, cap);
    /* The transparent retries are not the policy's. */
    unsigned n = p->attempts - p->transparent;
    if (n >= r->max_attempts)
        return 0;
    int d = backoff_ms(c, n);
    if (now + d >= p->deadline_ms)
        return 0; /* the backoff would use up the deadline */
    if (!ctl_pool_budget_allows(p->addr, cap)) {
        ctl_pool_count_throttled(p->addr);
        return 0;
    }
    ctl_pool_count_retry(p->addr, kind == 2, p->err->cause);
    if (c->hooks.backoff)
        c->hooks.backoff(c->hooks.user, p->address, n, d);
    p->backoff = 1;
    *at_ms = now + d;
    return 1;
}

/* Replace the message of `e`, keeping everything else it holds: the last
 * attempt's, with how many there were. When that attempt was not sent
 * but an earlier one was (`earlier_left`), the call as a whole may have
 * run: its message must not say "nothing was sent" (API.md), so it says
 * which attempt that was true of. */
static void note_attempts(ctl_error *e, unsigned n, int earlier_left)
{
    static const char unsent[] = "nothing was sent";
    ctl_error old = *e;
    const char *msg = old.msg ? old.msg : ctl_strerror(old.kind);
    const char *at = earlier_left ? strstr(msg, unsent) : NULL;
    ctl_error_init(e);
    if (at)
        ctl_error_set(e, old.kind,
                      "%.*sthe last attempt was not sent%s (after %u attempts; an "
                      "earlier one was sent: the unit may have run it)",
                      (int)(at - msg), msg, at + sizeof unsent - 1, n);
    else
        ctl_error_set(e, old.kind, "%s (after %u attempts)", msg, n);
    e->cause = old.cause;
    e->code = old.code;
    e->reason = old.reason;
    e->blobs = old.blobs;
    e->blob_count = old.blob_count;
    e->remote_kind = old.remote_kind;
    old.reason = NULL;
    old.blobs = NULL;
    old.blob_count = 0;
    old.remote_kind = NULL;
    ctl_error_fini(&old);
}

void ctl_rq_end(ctl_client *c, ctl_rq *p)
{
    if (p->kept) {
        zmq_msg_close(&p->keep);
        p->kept = 0;
    }
    p->backoff = 0;
    int ok = p->reply && *p->reply;
    if (!ok && p->attempts > 1 && p->err && p->err->kind != CTL_OK)
        note_attempts(p->err, p->attempts, p->ever_left && !p->left);
    if (ok && p->addr && policy_on(c, p))
        ctl_pool_budget_success(p->addr,
                                (int64_t)(c->opts.retry.budget_ratio * 1000 + 0.5));
    ctl_rq_count_outcome(c, p);
}

/* A reply's bytes are a zmq_msg_t kept in the handle's tail. */
static void release_msg(ctl_reply *r)
{
    zmq_msg_close(ctl_reply_tail(r));
}

/* Finish `p`: its socket goes back to the pool only after a clean, matching
 * reply; otherwise it is retired. */
static void finish(ctl_client *c, ctl_rq *p, int clean)
{
    if (p->unsent) {
        zmq_msg_close(&p->out); /* never handed to a connection */
        p->unsent = 0;
    }
    if (p->conn) {
        /* A socket the engine watched for `p` stays in its epoll set
         * (pool_int.h); its signals are no longer this request's. */
        if (p->conn->engine_rq == p)
            p->conn->engine_rq = NULL;
        if (clean && !p->dirty)
            ctl_pool_return(c->pool, p->conn);
        else
            ctl_pool_retire(c->pool, p->conn);
        p->conn = NULL;
    }
    p->done = 1;
}

/* A message for `p`: judged by ctl_call_accept. Ends `p` (done) when its own
 * reply has come, successfully (*p->reply set) or not (p->err set), or when
 * the socket failed; a reply for another id is counted and skipped. */
int ctl_rq_recv(ctl_client *c, ctl_rq *p, int flags)
{
    const char *op = p->op;
    ctl_error *err = p->err;
    zmq_msg_t msg;
    int frames = ctl_recv_message(p->conn->sock, &msg, 1, flags, NULL);
    if (frames < 0) {
        int e = zmq_errno();
        if (e == EAGAIN || e == EINTR)
            return 1;
        ctl_error_transfer(err, CTL_CAUSE_TRANSPORT,
                           "%s at %s: receive failed: %s", op, p->address,
                           zmq_strerror(e));
        finish(c, p, 0);
        return 0;
    }
    ctl_reply *r = ctl_reply_new(sizeof(zmq_msg_t));
    if (!r) {
        zmq_msg_close(&msg);
        ctl_error_transfer(err, CTL_CAUSE_NOMEM,
                           "%s at %s: out of memory for the reply", op,
                           p->address);
        finish(c, p, 0);
        return 0;
    }
    /* The reply owns the message from here. */
    zmq_msg_t *kept = ctl_reply_tail(r);
    *kept = msg;
    r->data = zmq_msg_data(kept);
    r->len = zmq_msg_size(kept);
    r->release = release_msg;
    switch (ctl_call_accept(r, (size_t)frames, (ctl_str){p->id, CTL_ID_LEN},
                            &c->opts.limits, p->address, op, err)) {
    case CTL_MATCH_RESULT:
        *p->reply = r;
        finish(c, p, 1);
        return 0;
    case CTL_MATCH_OTHER:
        ctl_pool_count_late(c->pool, p->addr);
        p->dirty = 1;
        ctl_reply_destroy(&r);
        return 0;
    case CTL_MATCH_ERROR: /* its own reply: the socket is clean */
        ctl_reply_destroy(&r);
        finish(c, p, 1);
        return 0;
    case CTL_MATCH_BAD:
        break;
    }
    ctl_reply_destroy(&r);
    finish(c, p, 0);
    return 0;
}

void ctl_rq_finish_clean(ctl_client *c, ctl_rq *p)
{
    finish(c, p, 1);
}

int64_t ctl_rq_attempt_until(const ctl_client *c, const ctl_rq *p, int64_t now)
{
    const ctl_retry_policy *r = &c->opts.retry;
    int64_t until = p->deadline_ms;
    int ms = 0;
    if (c->hooks.attempt_ms > 0 && p->attempts == 1)
        ms = c->hooks.attempt_ms;
    else if (r->attempt_timeout_ms > 0 && (p->flags & CTL_CALL_IDEMPOTENT) && !p->notify &&
             p->attempts - p->transparent < r->max_attempts) {
        /* Cut short only where the retry's shortest backoff still ends
         * before the deadline: an attempt with no retry after it waits for
         * the time left. */
        double shortest = backoff_base(c, p->attempts - p->transparent) * (1 - r->jitter);
        if ((double)(now + r->attempt_timeout_ms) + shortest < (double)until)
            ms = r->attempt_timeout_ms;
    }
    if (ms > 0 && now + ms < until)
        until = now + ms;
    return until;
}

void ctl_rq_time_out(ctl_client *c, ctl_rq *p)
{
    /* Before the call's deadline: the attempt's own limit ended it. */
    int64_t early = p->deadline_ms - ctl_now_ms();
    int ms = c->hooks.attempt_ms > 0 && p->attempts == 1 ? c->hooks.attempt_ms
                                                        : c->opts.retry.attempt_timeout_ms;
    if (p->deadline_ms && early > 0 && ms > 0 && p->unsent)
        ctl_error_transfer(p->err, CTL_CAUSE_TIMEOUT,
                           "%s at %s: no connection to the unit within this "
                           "attempt's %d ms (retry.attempt_timeout_ms); nothing "
                           "was sent", p->op, p->address, ms);
    else if (p->deadline_ms && early > 0 && ms > 0)
        ctl_error_transfer(p->err, CTL_CAUSE_TIMEOUT,
                           "%s at %s: no reply within this attempt's %d ms "
                           "(retry.attempt_timeout_ms)", p->op, p->address, ms);
    else if (p->unsent)
        ctl_error_transfer(p->err, CTL_CAUSE_TIMEOUT,
                           "%s at %s: no connection to the unit within %d ms; "
                           "nothing was sent", p->op, p->address, p->timeout_ms);
    else
        ctl_error_transfer(p->err, CTL_CAUSE_TIMEOUT,
                           "%s at %s: no reply within %d ms", p->op, p->address,
                           p->timeout_ms);
    finish(c, p, 0);
}

/* Whether the host of `address` is an IP address (it cannot fail to
 * resolve) rather than a name. */
static int host_is_literal(const char *host)
{
    return ctl_endpoint_host_literal(host); /* "[::1]" too (net.h) */
}

static void check_conn(ctl_client *c, ctl_rq *p, int64_t now_ms);

void ctl_rq_check_conn(ctl_client *c, ctl_rq *p, int64_t now_ms)
{
    int unsent = p->unsent;
    check_conn(c, p, now_ms);
    if (!p->done || !p->err || !p->err->msg || p->err->cause == CTL_CAUSE_TOO_LARGE)
        return; /* (a reply dropped for its size: the request ran) */
    char was[512];
    snprintf(was, sizeof was, "%s", p->err->msg);
    if (unsent)
        /* Sockets are ZMQ_IMMEDIATE: an unsent request was never queued on
         * any connection, so it can never reach a handler. Say so. */
        ctl_error_transfer(p->err, p->err->cause, "%s; nothing was sent", was);
    else
        /* It left on a connection that was up, which is gone: what the
         * reconnects meet is the cause, but the unit may have run it. */
        ctl_error_transfer(p->err, p->err->cause,
                           "%s; the request was sent before the connection "
                           "was lost: it may have run", was);
}

static void check_conn(ctl_client *c, ctl_rq *p, int64_t now_ms)
{
    const char *op = p->op;
    ctl_error *err = p->err;
    const char *a = p->address;
    int curve = ctl_pool_curve(c->pool);
    ctl_conn_verdict v = ctl_conn_check(p->conn, now_ms);
    switch (v) {
    case CTL_CONN_OK:
        return;
    case CTL_CONN_LOST:
        /* The unit restarted in place under the request: no reply will
         * come, unless the drop came before the send (its events unread
         * then). A call that may run twice and has an attempt left goes
         * again at once; any other waits, as it always did. */
        if (!(p->flags & CTL_CALL_IDEMPOTENT) || !policy_on(c, p) ||
            p->attempts - p->transparent >= c->opts.retry.max_attempts)
            return;
        ctl_error_transfer(err, CTL_CAUSE_TRANSPORT,
                           "%s at %s: the connection dropped and came back (the unit "
                           "restarted?)", op, a);
        break;
    case CTL_CONN_REFUSED:
        ctl_error_transfer(err, CTL_CAUSE_REFUSED,
                           "%s at %s: connection refused (nothing listens "
                           "there?)", op, a);
        break;
    case CTL_CONN_UNRESOLVED: {
        ctl_endpoint ep;
        if (ctl_endpoint_parse(a, &ep, NULL) == 0 && !host_is_literal(ep.host))
            ctl_error_transfer(err, CTL_CAUSE_UNRESOLVED,
                               "%s at %s: host '%s' does not resolve", op, a,
                               ep.host);
        else
            ctl_error_transfer(err, CTL_CAUSE_TRANSPORT,
                               "%s at %s: cannot open a connection (out of "
                               "file descriptors?)", op, a);
        break;
    }
    case CTL_CONN_HANDSHAKE:
        if (curve)
            ctl_error_transfer(err, CTL_CAUSE_AUTH,
                               "%s at %s: authentication failed: the unit did "
                               "not accept this client's CURVE handshake "
                               "(wrong server key, or this client is not on "
                               "its allowlist; or the unit does not speak "
                               "CURVE)", op, a);
        else
            /* A CURVE unit drops a plaintext client this way as often as
             * it reports the mismatch. */
            ctl_error_transfer(err, CTL_CAUSE_AUTH,
                               "%s at %s: authentication failed: the unit "
                               "broke off the handshake (it speaks CURVE? "
                               "this client has no server key, "
                               "curve_server_key)", op, a);
        break;
    case CTL_CONN_DENIED:
        if (p->conn->st.verdict_value == 500) /* a cap of the unit's (server.h) */
            ctl_error_transfer(err, CTL_CAUSE_REFUSED,
                               "%s at %s: the unit refused the connection: it holds as "
                               "many as it allows (max_connections or "
                               "max_connections_per_address; ZAP status 500): retry "
                               "later or elsewhere", op, a);
        else
            ctl_error_transfer(err, CTL_CAUSE_AUTH,
                           "%s at %s: authentication failed: the unit refused "
                           "this client's CURVE key (not on its allowlist; "
                           "ZAP status %u)", op, a,
                           (unsigned)p->conn->st.verdict_value);
        break;
    case CTL_CONN_MECHANISM:
        if (curve)
            ctl_error_transfer(err, CTL_CAUSE_AUTH,
                               "%s at %s: authentication failed: this client "
                               "speaks CURVE (curve_server_key is set) and the "
                               "unit does not speak CURVE", op, a);
        else
            ctl_error_transfer(err, CTL_CAUSE_AUTH,
                               "%s at %s: authentication failed: the unit "
                               "speaks CURVE and this client has no server "
                               "key (curve_server_key)", op, a);
        break;
    case CTL_CONN_PROTOCOL:
        ctl_error_transfer(err, CTL_CAUSE_TRANSPORT,
                           "%s at %s: the ZeroMQ handshake failed (protocol "
                           "error 0x%08x)", op, a,
                           (unsigned)p->conn->st.verdict_value);
        break;
    case CTL_CONN_DROPPED:
        ctl_error_transfer(err, CTL_CAUSE_TOO_LARGE,
                           "%s at %s: reply dropped: larger than this "
                           "client's limit of %zu bytes (limits.max_msg_bytes),"
                           " so ZeroMQ closed the connection", op, a,
                           c->opts.limits.max_msg_bytes);
        ctl_client_log_limited(c, CTL_CAUSE_TOO_LARGE, err->msg);
        break;
    }
    finish(c, p, 0);
}


void ctl_rq_fail(ctl_client *c, ctl_rq *p, ctl_cause cause, const char *why)
{
    ctl_error_transfer(p->err, cause, "%s at %s: %s", p->op, p->address, why);
    finish(c, p, 0);
}
