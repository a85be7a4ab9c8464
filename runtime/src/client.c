/*
 * client.c - call, call_many and notify over the socket pool.
 *
 * A single call and a fan-out share every step that matters: send_request
 * sends, recv_one deals with each message that arrives (ids, late replies,
 * errors), time_out ends a request at its deadline; so they cannot drift
 * apart. They differ only in how they wait: a single call blocks in one
 * receive bounded by its deadline (the fewest system calls per round
 * trip), a fan-out polls all its sockets until its one deadline.
 *
 * What a message means is decided by the call core (call.c): this file
 * lends sockets, sends, waits and retires. A request is framed in place
 * (ctl_frame) into a buffer that ZeroMQ takes over without a copy. A reply
 * is received into a zmq_msg_t kept in the ctl_reply handle's tail and
 * decoded into the handle's own zone; the result's strings and bins point
 * into that message.
 *
 * Request ids are 12 lowercase hex digits, as the reference design uses,
 * drawn from a per-client counter that starts at a random point: unique
 * among a client's requests in flight, and unlikely to collide with another
 * client's ids (which does not matter for correctness: ids are only ever
 * compared on the socket that sent them).
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
#include "pool_int.h"
#include "transport_int.h"
#include "util_int.h"

struct ctl_client {
    void *ctx;
    int own_ctx;
    ctl_client_options opts;
    ctl_pool *pool;
    _Atomic uint64_t next_id;
    _Atomic uint64_t calls;
    _Atomic uint64_t notifies;
    _Atomic uint64_t timeouts;
};

/* A call that has waited this long without its reply reads its
 * connection's monitor (and again every slice after). A reply that comes
 * sooner costs nothing more than before: one blocking receive. */
#define CHECK_SLICE_MS 100

/* The private ZeroMQ context's socket limit: each pooled connection takes
 * three sockets (the DEALER, its monitor and the PAIR that reads it), so
 * three times libzmq's default of 1023. */
#define OWN_CTX_MAX_SOCKETS 3072

/* One request of a call or a fan-out. */
typedef struct pending {
    const char *address;
    ctl_conn *conn;
    ctl_addr *addr; /* the address's entry, once known (for its counters) */
    char id[CTL_ID_LEN + 1];
    int dirty; /* saw a message for another id: never return to the pool */
    int done;
    ctl_reply **reply; /* where the reply goes on success */
    ctl_error *err;    /* where the failure goes */
    ctl_frame *req;    /* the packed request, consumed by send_request */
} pending;

/* Log one line through the client's log function (or to standard error). */
static void client_log(const ctl_client *c, const char *fmt, ...) CTL_PRINTF(2, 3);
static void client_log(const ctl_client *c, const char *fmt, ...)
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

void ctl_client_options_init(ctl_client_options *opts)
{
    memset(opts, 0, sizeof *opts);
    opts->default_timeout_ms = CTL_DEFAULT_TIMEOUT_MS;
    opts->late_grace_ms = CTL_DEFAULT_LATE_GRACE_MS;
    opts->max_idle_per_address = CTL_DEFAULT_MAX_IDLE_PER_ADDRESS;
    opts->max_retired = CTL_DEFAULT_MAX_RETIRED;
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
    ctl_pool_options po = {c->opts.max_idle_per_address, c->opts.max_retired,
                           c->opts.late_grace_ms, c->opts.limits.max_msg_bytes,
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
    uint64_t seed = 0;
    if (getrandom(&seed, sizeof seed, GRND_NONBLOCK) != sizeof seed)
        seed = (uint64_t)time(NULL) ^ ((uint64_t)getpid() << 32) ^
               (uint64_t)(uintptr_t)c;
    atomic_init(&c->next_id, seed);
    *out = c;
    return 0;
}

void ctl_client_destroy(ctl_client **client)
{
    if (!client || !*client)
        return;
    ctl_client *c = *client;
    ctl_pool_destroy(&c->pool);
    if (c->own_ctx)
        zmq_ctx_term(c->ctx);
    free(c);
    *client = NULL;
}

static void new_id(ctl_client *c, char out[CTL_ID_LEN + 1])
{
    ctl_call_format_id(
        atomic_fetch_add_explicit(&c->next_id, 1, memory_order_relaxed), out);
}

/* Send the frame `data` (malloc'd; taken over in every case) on `sock`,
 * waiting for queue space until `deadline_ms`. */
static int send_until(void *sock, char *data, size_t size, int64_t deadline_ms,
                      const char *address, const char *op, ctl_error *err)
{
    zmq_msg_t m;
    if (ctl_send_prepare(&m, data, size) != 0)
        return ctl_error_transfer(err, CTL_CAUSE_NOMEM,
                                  "%s at %s: out of memory", op, address);
    for (;;) {
        if (zmq_msg_send(&m, sock, ZMQ_DONTWAIT) >= 0)
            return 0;
        int e = zmq_errno();
        if (e == EINTR)
            continue;
        if (e == EAGAIN) {
            zmq_pollitem_t it = {sock, 0, ZMQ_POLLOUT, 0};
            int left = ctl_ms_left(deadline_ms);
            if (left > 0 && zmq_poll(&it, 1, left) >= 0)
                continue;
            if (left > 0 && zmq_errno() == EINTR)
                continue;
            zmq_msg_close(&m);
            return ctl_error_transfer(err, CTL_CAUSE_TIMEOUT,
                                      "%s at %s: timed out waiting to send",
                                      op, address);
        }
        zmq_msg_close(&m);
        return ctl_error_transfer(err, CTL_CAUSE_TRANSPORT,
                                  "%s at %s: send failed: %s", op, address,
                                  zmq_strerror(e));
    }
}

/* Send the frame `req` (consumed) on `sock`. */
static int send_frame(void *sock, ctl_frame *req, int64_t deadline_ms,
                      const char *address, const char *op, ctl_error *err)
{
    size_t size;
    char *data = ctl_frame_take(req, &size);
    return send_until(sock, data, size, deadline_ms, address, op, err);
}

/* Refuse a request that is not to be sent: one packed out of memory, one
 * larger than the client's limit (logged), or any request when the caller
 * gave no time at all (`timeout_ms` 0). Returns 0 when it may go, else the
 * kind with `err` set and *addr the address's entry when it is known. */
static int refuse_request(ctl_client *c, const ctl_frame *req,
                          const char *address, const char *op, int timeout_ms,
                          ctl_addr **addr, ctl_error *err)
{
    if (req->failed)
        return ctl_error_transfer(err, CTL_CAUSE_NOMEM,
                                  "%s at %s: out of memory packing the "
                                  "request", op, address);
    size_t limit = c->opts.limits.max_msg_bytes;
    if (req->sb.size <= limit && timeout_ms != 0)
        return 0;
    /* The address must be usable before anything else is said of it. */
    if (!(*addr = ctl_pool_addr(c->pool, address, err)))
        return err ? (int)err->kind : CTL_INVALID;
    if (timeout_ms == 0) {
        atomic_fetch_add_explicit(&c->timeouts, 1, memory_order_relaxed);
        return ctl_error_transfer(err, CTL_CAUSE_TIMEOUT,
                                  "%s at %s: a timeout of 0 ms leaves no time "
                                  "for a reply; nothing was sent", op, address);
    }
    ctl_error_transfer(err, CTL_CAUSE_TOO_LARGE,
                       "%s at %s: the request is %zu bytes, larger than this "
                       "client's limit of %zu bytes (limits.max_msg_bytes); "
                       "not sent", op, address, req->sb.size, limit);
    client_log(c, "%s", err && err->msg ? err->msg : "a request over the size limit was not sent");
    return CTL_TRANSFER;
}

/* Lend a socket and send the request of `p`, which it consumes. On failure
 * the socket (if any) is retired and `err` says why. */
static int send_request(ctl_client *c, pending *p, const char *op,
                        int timeout_ms, int64_t deadline_ms, ctl_error *err)
{
    ctl_frame *req = p->req;
    int rc;
    p->req = NULL;
    rc = refuse_request(c, req, p->address, op, timeout_ms, &p->addr, err);
    if (rc != 0) {
        ctl_frame_fini(req);
        return rc;
    }
    p->conn = ctl_pool_lend(c->pool, p->address, err);
    if (!p->conn) {
        ctl_frame_fini(req);
        return err ? err->kind : CTL_TRANSFER;
    }
    p->addr = p->conn->addr;
    new_id(c, p->id);
    ctl_frame_set_id(req, (ctl_str){p->id, CTL_ID_LEN});
    rc = send_frame(p->conn->sock, req, deadline_ms, p->address, op, err);
    if (rc != 0) {
        ctl_pool_retire(c->pool, p->conn);
        p->conn = NULL;
        return rc;
    }
    atomic_fetch_add_explicit(&c->calls, 1, memory_order_relaxed);
    ctl_pool_count_call(p->addr);
    return 0;
}

/* Count a call's failure against its address, by cause. */
static void count_outcome(const pending *p, const ctl_error *err)
{
    if (p->addr && err && err->kind == CTL_TRANSFER)
        ctl_pool_count_error(p->addr, err->cause);
}

/* A reply's bytes are a zmq_msg_t kept in the handle's tail. */
static void release_msg(ctl_reply *r)
{
    zmq_msg_close(ctl_reply_tail(r));
}

/* Finish `p`: its socket goes back to the pool only after a clean, matching
 * reply; otherwise it is retired. */
static void finish(ctl_client *c, pending *p, int clean)
{
    if (p->conn) {
        if (clean && !p->dirty)
            ctl_pool_return(c->pool, p->conn);
        else
            ctl_pool_retire(c->pool, p->conn);
        p->conn = NULL;
    }
    p->done = 1;
}

/*
 * Receive one message on p->sock (`flags`: 0 to block up to the socket's
 * ZMQ_RCVTIMEO, ZMQ_DONTWAIT not to) and judge it (ctl_call_accept). Ends
 * `p` (done) when its own reply has come, successfully (*p->reply set) or
 * not (p->err set), or when the socket failed; a reply for another id is
 * counted and skipped. Returns 1 when nothing arrived, 0 otherwise.
 */
static int recv_one(ctl_client *c, pending *p, const char *op, int flags)
{
    ctl_error *err = p->err;
    zmq_msg_t msg;
    int frames = ctl_recv_message(p->conn->sock, &msg, 1, flags);
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

/* End `p` with a timeout. */
static void time_out(ctl_client *c, pending *p, const char *op, int timeout_ms)
{
    ctl_error_transfer(p->err, CTL_CAUSE_TIMEOUT, "%s at %s: no reply within %d ms",
                       op, p->address, timeout_ms);
    atomic_fetch_add_explicit(&c->timeouts, 1, memory_order_relaxed);
    finish(c, p, 0);
}

/* Whether the host of `address` is an IP address (it cannot fail to
 * resolve) rather than a name. */
static int host_is_literal(const char *host)
{
    unsigned char buf[16];
    return inet_pton(AF_INET, host, buf) == 1 ||
           inet_pton(AF_INET6, host, buf) == 1;
}

/* Read what the monitor of p's connection says; when the connection cannot
 * carry the call (docs/API.md, "Failures that end a call early"), end `p`
 * with an error that says why. */
static void check_conn(ctl_client *c, pending *p, const char *op)
{
    ctl_error *err = p->err;
    const char *a = p->address;
    int curve = ctl_pool_curve(c->pool);
    ctl_conn_verdict v = ctl_conn_check(p->conn, ctl_now_ms());
    switch (v) {
    case CTL_CONN_OK:
        return;
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
        client_log(c, "%s", err->msg);
        break;
    }
    finish(c, p, 0);
}

/* The reply of a single call: a blocking receive bounded by the time
 * left (ZMQ_RCVTIMEO) costs fewer system calls than zmq_poll followed by
 * a receive, which is what a round trip's latency is made of. The
 * receive waits a slice at a time; between slices the call reads its
 * connection's monitor. */
static void collect_one(ctl_client *c, pending *p, const char *op,
                        int64_t deadline_ms, int timeout_ms)
{
    while (!p->done) {
        int left = ctl_ms_left(deadline_ms);
        if (left <= 0) {
            time_out(c, p, op, timeout_ms);
            break;
        }
        int slice = left < CHECK_SLICE_MS ? left : CHECK_SLICE_MS;
        zmq_setsockopt(p->conn->sock, ZMQ_RCVTIMEO, &slice, sizeof slice);
        if (recv_one(c, p, op, 0) == 1 && !p->done)
            check_conn(c, p, op);
    }
}

static int resolve_timeout(const ctl_client *c, int timeout_ms)
{
    return timeout_ms < 0 ? c->opts.default_timeout_ms : timeout_ms;
}

/* Wait for the replies of `n` pending requests until `deadline_ms`; those
 * still pending then end with a timeout. */
static void collect(ctl_client *c, pending *ps, size_t n, const char *op,
                    int64_t deadline_ms, int timeout_ms)
{
    enum { SMALL = 16 };
    zmq_pollitem_t small_items[SMALL];
    size_t small_which[SMALL];
    zmq_pollitem_t *items = small_items;
    size_t *which = small_which;
    if (n > SMALL) {
        items = calloc(n, sizeof *items);
        which = calloc(n, sizeof *which);
    }
    int64_t next_check = ctl_now_ms() + CHECK_SLICE_MS;
    for (;;) {
        size_t k = 0;
        for (size_t i = 0; i < n && items && which; i++) {
            if (ps[i].done)
                continue;
            items[k] = (zmq_pollitem_t){ps[i].conn->sock, 0, ZMQ_POLLIN, 0};
            which[k++] = i;
        }
        if (!items || !which) {
            /* Out of memory: fail the rest rather than wait blind. */
            for (size_t i = 0; i < n; i++) {
                if (ps[i].done)
                    continue;
                ctl_error_transfer(ps[i].err, CTL_CAUSE_NOMEM,
                                   "%s at %s: out of memory", op,
                                   ps[i].address);
                finish(c, &ps[i], 0);
            }
            break;
        }
        if (k == 0)
            break;
        int left = ctl_ms_left(deadline_ms);
        int until_check = ctl_ms_left(next_check);
        int wait = left < until_check ? left : until_check;
        int rc = left > 0 ? zmq_poll(items, (int)k, wait) : 0;
        if (rc < 0 && zmq_errno() == EINTR)
            continue;
        if (left <= 0 || rc < 0) {
            /* The deadline (or a broken poll): whoever is left times out. */
            for (size_t j = 0; j < k; j++)
                time_out(c, &ps[which[j]], op, timeout_ms);
            break;
        }
        for (size_t j = 0; j < k && rc > 0; j++) {
            pending *p = &ps[which[j]];
            if (items[j].revents & ZMQ_POLLIN)
                while (!p->done && recv_one(c, p, op, ZMQ_DONTWAIT) == 0)
                    ;
        }
        int64_t now = ctl_now_ms();
        if (now >= next_check) {
            /* A slice has passed: read the monitors of those still waiting. */
            for (size_t j = 0; j < k; j++)
                if (!ps[which[j]].done)
                    check_conn(c, &ps[which[j]], op);
            next_check = now + CHECK_SLICE_MS;
        }
    }
    if (items != small_items)
        free(items);
    if (which != small_which)
        free(which);
}

int ctl_client_call_req(ctl_client *client, const char *address,
                        const char *op, ctl_frame *req, int timeout_ms,
                        ctl_reply **reply, ctl_error *err)
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
    int tmo = resolve_timeout(client, timeout_ms);
    int64_t deadline = ctl_now_ms() + tmo;
    ctl_error local;
    ctl_error_init(&local);
    ctl_error *e = err ? err : &local;
    pending p = {address, NULL, NULL, {0}, 0, 0, reply, e, req};
    int rc = send_request(client, &p, op, tmo, deadline, e);
    if (rc == 0)
        collect_one(client, &p, op, deadline, tmo);
    rc = *reply ? 0 : (e->kind ? (int)e->kind : CTL_TRANSFER);
    count_outcome(&p, e);
    ctl_error_fini(&local);
    return rc;
}

int ctl_client_call(ctl_client *client, const char *address, const char *op,
                    const void *args, size_t args_len, int timeout_ms,
                    ctl_reply **reply, ctl_error *err)
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
    return ctl_client_call_req(client, address, op, &req, timeout_ms, reply,
                               err);
}

int ctl_client_call_many_req(ctl_client *client, const char *op,
                             const char *const *addresses, ctl_frame *reqs,
                             size_t count, int timeout_ms,
                             ctl_outcome *outcomes)
{
    size_t failed = 0;
    pending *ps = NULL;
    ctl_reply **replies = NULL;
    for (size_t i = 0; i < count && outcomes; i++) {
        outcomes[i].reply = NULL;
        ctl_error_init(&outcomes[i].error);
    }
    if (!outcomes || !client || !op || (count && (!addresses || !reqs))) {
        for (size_t i = 0; i < count && outcomes; i++)
            ctl_error_set(&outcomes[i].error, CTL_INVALID,
                          "call_many %s: %s is NULL", op ? op : "(null op)",
                          !client ? "client" : !op ? "op" : "targets");
        failed = count;
        goto out;
    }
    int tmo = resolve_timeout(client, timeout_ms);
    int64_t deadline = ctl_now_ms() + tmo;
    ps = calloc(count ? count : 1, sizeof *ps);
    replies = calloc(count ? count : 1, sizeof *replies);
    if (!ps || !replies) {
        for (size_t i = 0; i < count; i++)
            ctl_error_transfer(&outcomes[i].error, CTL_CAUSE_NOMEM,
                               "call_many %s: out of memory", op);
        failed = count;
        goto out;
    }
    /* Every request goes out before any reply is read. */
    for (size_t i = 0; i < count; i++) {
        ps[i] = (pending){addresses[i], NULL, NULL, {0}, 0, 0, &replies[i],
                          &outcomes[i].error, &reqs[i]};
        if (!ps[i].address) {
            ctl_error_set(&outcomes[i].error, CTL_INVALID,
                          "call_many %s: target #%zu has no address", op, i);
            ps[i].done = 1;
            continue;
        }
        if (send_request(client, &ps[i], op, tmo, deadline,
                         &outcomes[i].error) != 0)
            ps[i].done = 1;
    }
    collect(client, ps, count, op, deadline, tmo);
    for (size_t i = 0; i < count; i++) {
        outcomes[i].reply = replies[i];
        if (!replies[i]) {
            failed++;
            if (outcomes[i].error.kind == CTL_OK)
                ctl_error_transfer(&outcomes[i].error, CTL_CAUSE_TRANSPORT,
                                   "%s at %s: no reply", op, ps[i].address);
            count_outcome(&ps[i], &outcomes[i].error);
        }
    }
out:
    for (size_t i = 0; i < count && reqs; i++)
        ctl_frame_fini(&reqs[i]); /* those not sent */
    free(ps);
    free(replies);
    if (!outcomes || !client || !op || (count && (!addresses || !reqs)))
        return CTL_INVALID;
    return failed > INT32_MAX ? INT32_MAX : (int)failed;
}

int ctl_client_call_many(ctl_client *client, const char *op,
                         const ctl_target *targets, size_t count,
                         int timeout_ms, ctl_outcome *outcomes)
{
    if (!targets && count) {
        return ctl_client_call_many_req(client, op, NULL, NULL, count,
                                        timeout_ms, outcomes);
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
                                      timeout_ms, outcomes);
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
    int rc;
    ctl_conn *conn = NULL;
    ctl_addr *addr = NULL;
    if ((rc = refuse_request(client, req, address, op, -1, &addr, e)) != 0) {
        if (addr)
            ctl_pool_count_error(addr, e->cause);
    } else if (!(conn = ctl_pool_lend(client->pool, address, e))) {
        rc = e->kind;
    } else {
        rc = send_frame(conn->sock, req, deadline, address, op, e);
        if (rc != 0) {
            ctl_pool_count_error(conn->addr, e->cause);
            ctl_pool_retire(client->pool, conn);
        } else {
            atomic_fetch_add_explicit(&client->notifies, 1,
                                      memory_order_relaxed);
            ctl_pool_return(client->pool, conn);
        }
    }
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
