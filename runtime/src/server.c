/*
 * server.c - the ROUTER thread of one storage unit.
 *
 * One thread owns the ROUTER socket for the server's whole life; nothing
 * else touches it until that thread has been joined. The thread sleeps in
 * zmq_poll on two things: the ROUTER, and the read end of a pipe that
 * ctl_server_close writes one byte to, so closing wakes it at once with no
 * polling interval.
 *
 * For each message: read at most three frames (identity, optional empty
 * delimiter, payload; anything else is dropped and counted), decode the
 * envelope with the bounds of wire.c, look the op up in a name-sorted index
 * built at start, run the handler under the unit's lock, and send the reply
 * from one msgpack_sbuffer: the reply head [id, true, is packed before the
 * handler runs so the handler's result lands straight after it; on failure
 * the buffer is rewound and an error reply packed instead. Large replies
 * are handed to ZeroMQ without a copy (zmq_msg_init_data).
 *
 * Per-request memory (decoded args, handler scratch) lives in one
 * msgpack_zone that is cleared after every request, so a unit's memory
 * does not grow with the number of requests it has served.
 */
#include "ctlrpc/server.h"

#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <zmq.h>

#include "ctlrpc/curve.h"
#include "ctlrpc/net.h"
#include "util_int.h"
#include "wire_int.h"

/* Replies at least this large go to ZeroMQ without a copy. */
#define ZERO_COPY_MIN ((size_t)32 * 1024)
/* Messages handled per wake-up before the close pipe is looked at again. */
#define BATCH 256
#define ZONE_CHUNK 8192

struct ctl_req {
    ctl_server *server;
    zmq_msg_t *msg; /* the request's payload frame */
    const ctl_op *op;
    ctl_str op_name;
    ctl_str id;
    msgpack_packer pk;
    ctl_error err;
    int failed;
};

struct ctl_server {
    const ctl_service *service;
    const ctl_op **by_name; /* ops sorted by name, for bsearch */
    void *user;
    pthread_mutex_t *lock;
    pthread_mutex_t own_lock;
    ctl_limits limits;
    void *ctx;
    int own_ctx;
    void *router;
    void *zap;               /* ZAP handler (REP), with an allowlist only */
    uint8_t (*allow)[32];    /* allowed client keys, binary */
    size_t allow_count;
    int wake[2];
    pthread_t thread;
    int started;
    int closed;
    int blocking; /* serve_blocking: close() shuts the context down */
    atomic_int stopping; /* set by close before it wakes the thread */
    char endpoint[CTL_ENDPOINT_MAX];

    _Atomic uint64_t requests;
    _Atomic uint64_t replies;
    _Atomic uint64_t dropped;
    _Atomic uint64_t send_failures;
    _Atomic uint64_t auth_denied;

    /* Owned by the server thread. */
    msgpack_zone zone;
    msgpack_sbuffer out;
};

void ctl_server_options_init(ctl_server_options *opts)
{
    memset(opts, 0, sizeof *opts);
}

static int cmp_op(const void *a, const void *b)
{
    const ctl_op *x = *(const ctl_op *const *)a;
    const ctl_op *y = *(const ctl_op *const *)b;
    return strcmp(x->name, y->name);
}

static const ctl_op *find_op(const ctl_server *s, ctl_str name)
{
    size_t lo = 0, hi = s->service->op_count;
    while (lo < hi) {
        size_t mid = lo + (hi - lo) / 2;
        const char *n = s->by_name[mid]->name;
        size_t nlen = strlen(n);
        int c = memcmp(n, name.ptr, nlen < name.len ? nlen : name.len);
        if (c == 0)
            c = nlen < name.len ? -1 : nlen > name.len ? 1 : 0;
        if (c == 0)
            return s->by_name[mid];
        if (c < 0)
            lo = mid + 1;
        else
            hi = mid;
    }
    return NULL;
}

/* ---- handler API ---------------------------------------------------- */

msgpack_packer *ctl_req_packer(ctl_req *req)
{
    return &req->pk;
}

void *ctl_req_alloc(ctl_req *req, size_t size)
{
    return ctl_zone_alloc(&req->server->zone, size);
}

struct ctl_hold {
    zmq_msg_t msg; /* a reference to the request's payload */
    size_t off, len;
};

ctl_hold *ctl_req_hold(ctl_req *req, ctl_str view)
{
    const char *base = zmq_msg_data(req->msg);
    uintptr_t b = (uintptr_t)base, v = (uintptr_t)view.ptr;
    size_t size = zmq_msg_size(req->msg);
    if (view.len && (!view.ptr || v < b || v - b > size || view.len > size - (v - b)))
        return NULL;
    ctl_hold *h = malloc(sizeof *h);
    if (!h)
        return NULL;
    zmq_msg_init(&h->msg);
    /* A copy shares a large message's bytes by reference count; only a
     * message small enough to live inside zmq_msg_t is copied. */
    if (zmq_msg_copy(&h->msg, req->msg) != 0) {
        zmq_msg_close(&h->msg);
        free(h);
        return NULL;
    }
    h->off = view.len ? (size_t)(v - b) : 0;
    h->len = view.len;
    return h;
}

ctl_str ctl_hold_view(const ctl_hold *hold)
{
    ctl_str v = {(const char *)zmq_msg_data((zmq_msg_t *)&hold->msg) + hold->off,
                 hold->len};
    return v;
}

void ctl_hold_release(ctl_hold **hold)
{
    if (!hold || !*hold)
        return;
    zmq_msg_close(&(*hold)->msg);
    free(*hold);
    *hold = NULL;
}

ctl_str ctl_req_op(const ctl_req *req)
{
    return req->op_name;
}

ctl_str ctl_req_id(const ctl_req *req)
{
    return req->id;
}

int ctl_req_fail(ctl_req *req, ctl_kind kind, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    ctl_error_setv(&req->err, kind, fmt, ap);
    va_end(ap);
    req->failed = 1;
    return kind;
}

int ctl_req_busy(ctl_req *req, const char *reason, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    ctl_error_setv(&req->err, CTL_BUSY, fmt, ap);
    va_end(ap);
    if (reason)
        req->err.reason = ctl_strndup(reason, strlen(reason));
    req->failed = 1;
    return CTL_BUSY;
}

int ctl_req_missing(ctl_req *req, const ctl_str *blobs, size_t count,
                    const char *fmt, ...)
{
    va_list ap;
    char *msg;
    va_start(ap, fmt);
    msg = ctl_vasprintf(fmt, ap);
    va_end(ap);
    ctl_error_missing(&req->err, blobs, count, "%s", msg ? msg : "missing");
    free(msg);
    req->failed = 1;
    return CTL_MISSING;
}

int ctl_req_fail_error(ctl_req *req, const ctl_error *err)
{
    ctl_error_copy(&req->err, err);
    req->failed = 1;
    return req->err.kind;
}

/* ---- replying ------------------------------------------------------- */

static void free_buffer(void *data, void *hint)
{
    (void)hint;
    free(data);
}

/* Send [identity, (delimiter,) payload]; the identity frame is consumed. */
static void send_reply(ctl_server *s, zmq_msg_t *identity, int delimited)
{
    msgpack_sbuffer *out = &s->out;
    int ok = zmq_msg_send(identity, s->router, ZMQ_SNDMORE | ZMQ_DONTWAIT) >= 0;
    if (ok && delimited)
        ok = zmq_send(s->router, "", 0, ZMQ_SNDMORE | ZMQ_DONTWAIT) >= 0;
    if (ok) {
        if (out->size >= ZERO_COPY_MIN) {
            zmq_msg_t m;
            size_t size = out->size;
            char *data = msgpack_sbuffer_release(out);
            if (zmq_msg_init_data(&m, data, size, free_buffer, NULL) != 0) {
                free(data);
                ok = 0;
            } else if (zmq_msg_send(&m, s->router, ZMQ_DONTWAIT) < 0) {
                zmq_msg_close(&m);
                ok = 0;
            }
        } else {
            ok = zmq_send(s->router, out->data, out->size, ZMQ_DONTWAIT) >= 0;
        }
    }
    if (ok)
        atomic_fetch_add_explicit(&s->replies, 1, memory_order_relaxed);
    else
        atomic_fetch_add_explicit(&s->send_failures, 1, memory_order_relaxed);
}

/* Rewind the output and pack [id, false, error-map]. */
static void pack_error(ctl_server *s, ctl_str id, const ctl_error *err)
{
    msgpack_packer pk;
    ctl_kind kind = err->kind;
    if (kind != CTL_UNIT_FULL && kind != CTL_BUSY && kind != CTL_MISSING)
        kind = CTL_PROTOCOL;
    msgpack_sbuffer_clear(&s->out);
    msgpack_packer_init(&pk, &s->out, msgpack_sbuffer_write);
    if (ctl_wire_pack_reply_head(&pk, id, false) != 0 ||
        ctl_wire_pack_error_map(&pk, kind, err->msg, err->reason,
                                kind == CTL_MISSING ? err->blobs : NULL,
                                err->blob_count) != 0)
        msgpack_sbuffer_clear(&s->out);
}

/* Answer a request that never reached a handler with a Protocol error. */
static void refuse(ctl_server *s, zmq_msg_t *identity, int delimited,
                   ctl_str id, const char *fmt, ...) CTL_PRINTF(5, 6);
static void refuse(ctl_server *s, zmq_msg_t *identity, int delimited,
                   ctl_str id, const char *fmt, ...)
{
    ctl_error err;
    va_list ap;
    ctl_error_init(&err);
    va_start(ap, fmt);
    ctl_error_setv(&err, CTL_PROTOCOL, fmt, ap);
    va_end(ap);
    pack_error(s, id, &err);
    ctl_error_fini(&err);
    if (s->out.size)
        send_reply(s, identity, delimited);
}

/* ---- serving -------------------------------------------------------- */

static void serve_payload(ctl_server *s, zmq_msg_t *identity, int delimited,
                          zmq_msg_t *payload)
{
    const void *data = zmq_msg_data(payload);
    size_t len = zmq_msg_size(payload);
    char why[160];
    char shown[CTL_SHOW_BUF];
    ctl_request_view rq;
    ctl_decode d = ctl_wire_decode_request(data, len, &s->limits, &s->zone,
                                           &rq, why, sizeof why);
    if (d == CTL_DECODE_DROP) {
        atomic_fetch_add_explicit(&s->dropped, 1, memory_order_relaxed);
        return;
    }
    atomic_fetch_add_explicit(&s->requests, 1, memory_order_relaxed);
    const ctl_op *op = find_op(s, rq.op);
    if (!op) {
        refuse(s, identity, delimited, rq.id, "unknown op '%s' (service %s)",
               ctl_show(shown, sizeof shown, rq.op), s->service->name);
        return;
    }
    int noreply = (op->flags & CTL_OP_NOREPLY) != 0;
    if (d == CTL_DECODE_BAD) {
        if (!noreply)
            refuse(s, identity, delimited, rq.id, "op '%s': %s", op->name, why);
        return;
    }

    ctl_req req;
    memset(&req, 0, sizeof req);
    req.server = s;
    req.msg = payload;
    req.op = op;
    req.op_name = rq.op;
    req.id = rq.id;
    ctl_error_init(&req.err);
    msgpack_sbuffer_clear(&s->out);
    msgpack_packer_init(&req.pk, &s->out, msgpack_sbuffer_write);
    int head_ok = ctl_wire_pack_reply_head(&req.pk, rq.id, true) == 0;
    size_t head_len = s->out.size;

    pthread_mutex_lock(s->lock);
    int rc = head_ok ? op->handler(s->user, &rq.args, &req) : -1;
    pthread_mutex_unlock(s->lock);

    if (!noreply) {
        if (rc == 0 && s->out.size == head_len && msgpack_pack_nil(&req.pk))
            rc = -1;
        if (rc != 0) {
            if (!req.failed)
                ctl_error_set(&req.err, CTL_PROTOCOL,
                              "op '%s' failed (handler returned %d without "
                              "an error)", op->name, rc);
            pack_error(s, rq.id, &req.err);
        }
        if (s->out.size)
            send_reply(s, identity, delimited);
    }
    ctl_error_fini(&req.err);
}

/* Read one whole message (all its frames) and serve it; the first frame
 * is awaited with `flags` (0 blocks, ZMQ_DONTWAIT does not). Returns 0, or
 * -1 when nothing was there (EAGAIN), the context was shut down (ETERM)
 * or the socket failed. */
static int serve_one(ctl_server *s, int flags)
{
    zmq_msg_t frames[3];
    int n = 0, extra = 0, more = 1;
    while (more) {
        zmq_msg_t scratch;
        zmq_msg_t *m = n < 3 ? &frames[n] : &scratch;
        zmq_msg_init(m);
        if (zmq_msg_recv(m, s->router, n == 0 ? flags : 0) < 0) {
            zmq_msg_close(m);
            for (int i = 0; i < n; i++)
                zmq_msg_close(&frames[i]);
            return -1;
        }
        more = zmq_msg_more(m);
        if (n < 3)
            n++;
        else {
            extra = 1;
            zmq_msg_close(m);
        }
    }
    int delimited = n == 3 && zmq_msg_size(&frames[1]) == 0;
    if (extra || n < 2 || (n == 3 && !delimited)) {
        atomic_fetch_add_explicit(&s->dropped, 1, memory_order_relaxed);
    } else {
        zmq_msg_t *payload = &frames[n - 1];
        serve_payload(s, &frames[0], delimited, payload);
        msgpack_zone_clear(&s->zone);
    }
    for (int i = 0; i < n; i++)
        zmq_msg_close(&frames[i]);
    return 0;
}

/* ---- CURVE authentication (ZAP, RFC 27) ------------------------------ */

/* Answer one ZAP request: 200 for a CURVE client whose key is on the
 * allowlist, 400 for anything else. A malformed request is dropped. */
static void serve_zap(ctl_server *s)
{
    enum { MAX_FRAMES = 8 };
    zmq_msg_t f[MAX_FRAMES];
    int n = 0, more = 1;
    while (more) {
        zmq_msg_t scratch;
        zmq_msg_t *m = n < MAX_FRAMES ? &f[n] : &scratch;
        zmq_msg_init(m);
        if (zmq_msg_recv(m, s->zap, n == 0 ? ZMQ_DONTWAIT : 0) < 0) {
            zmq_msg_close(m);
            for (int i = 0; i < n; i++)
                zmq_msg_close(&f[i]);
            return;
        }
        more = zmq_msg_more(m);
        if (n < MAX_FRAMES)
            n++;
        else
            zmq_msg_close(m);
    }
    /* [version, request id, domain, address, identity, mechanism, key] */
    int allowed = 0;
    if (n >= 7 && zmq_msg_size(&f[5]) == 5 &&
        memcmp(zmq_msg_data(&f[5]), "CURVE", 5) == 0 && zmq_msg_size(&f[6]) == 32) {
        for (size_t i = 0; i < s->allow_count && !allowed; i++)
            allowed = memcmp(s->allow[i], zmq_msg_data(&f[6]), 32) == 0;
    }
    if (!allowed)
        atomic_fetch_add_explicit(&s->auth_denied, 1, memory_order_relaxed);
    if (n >= 2) {
        const char *code = allowed ? "200" : "400";
        const char *text = allowed ? "OK" : "client key not allowed";
        zmq_send(s->zap, "1.0", 3, ZMQ_SNDMORE);
        zmq_send(s->zap, zmq_msg_data(&f[1]), zmq_msg_size(&f[1]), ZMQ_SNDMORE);
        zmq_send(s->zap, code, 3, ZMQ_SNDMORE);
        zmq_send(s->zap, text, strlen(text), ZMQ_SNDMORE);
        zmq_send(s->zap, "", 0, ZMQ_SNDMORE);
        zmq_send(s->zap, "", 0, 0);
    }
    for (int i = 0; i < n; i++)
        zmq_msg_close(&f[i]);
}

/*
 * The serving loop when the server owns its ZeroMQ context and has no ZAP
 * handler: block in the ROUTER's receive. close() wakes it by shutting the
 * context down (the receive returns ETERM). One blocking receive per
 * request costs fewer system calls than zmq_poll plus a non-blocking
 * receive, which shows in every round trip's latency.
 */
static void *serve_blocking(void *arg)
{
    ctl_server *s = arg;
    while (!atomic_load_explicit(&s->stopping, memory_order_acquire)) {
        if (serve_one(s, 0) != 0 && zmq_errno() == ETERM)
            break;
    }
    return NULL;
}

/*
 * The serving loop otherwise (a borrowed context, which close() may not
 * shut down, or a ZAP handler to serve too): poll the ROUTER, the close
 * pipe and the ZAP socket.
 */
static void *serve(void *arg)
{
    ctl_server *s = arg;
    zmq_pollitem_t items[3] = {{s->router, 0, ZMQ_POLLIN, 0},
                               {NULL, s->wake[0], ZMQ_POLLIN, 0},
                               {s->zap, 0, ZMQ_POLLIN, 0}};
    int nitems = s->zap ? 3 : 2;
    for (;;) {
        /* Waits without a timeout on purpose: close() wakes it. */
        int rc = zmq_poll(items, nitems, -1);
        if (rc < 0) {
            if (errno == EINTR)
                continue;
            break; /* ETERM or a broken socket: nothing left to serve */
        }
        if (items[1].revents)
            break;
        if (nitems == 3 && items[2].revents)
            serve_zap(s);
        /* Requests still queued when close is called are not served:
         * look at the flag before each one. */
        for (int i = 0; i < BATCH; i++)
            if (atomic_load_explicit(&s->stopping, memory_order_acquire) ||
                serve_one(s, ZMQ_DONTWAIT) != 0)
                break;
        if (atomic_load_explicit(&s->stopping, memory_order_acquire))
            break;
    }
    return NULL;
}

/* ---- lifecycle ------------------------------------------------------ */

static int check_service(const ctl_service *svc, ctl_error *err)
{
    if (!svc)
        return ctl_error_set(err, CTL_INVALID, "server: service is NULL");
    const char *name = svc->name ? svc->name : "(unnamed)";
    if (svc->op_count && !svc->ops)
        return ctl_error_set(err, CTL_INVALID,
                             "service %s: %zu ops but no op table", name,
                             svc->op_count);
    for (size_t i = 0; i < svc->op_count; i++) {
        if (!svc->ops[i].name || !*svc->ops[i].name)
            return ctl_error_set(err, CTL_INVALID,
                                 "service %s: op #%zu has no name", name, i);
        if (!svc->ops[i].handler)
            return ctl_error_set(err, CTL_INVALID,
                                 "service %s: op '%s' has no handler", name,
                                 svc->ops[i].name);
    }
    return 0;
}

/* CURVE server mode, and the ZAP handler when there is an allowlist. */
static int setup_curve(ctl_server *s, const ctl_server_options *opts,
                       const char *addr, ctl_error *err)
{
    int one = 1;
    if (!ctl_curve_available())
        return ctl_error_set(err, CTL_INVALID,
                             "server %s: a CURVE key was given, but this "
                             "libzmq has no CURVE support", addr);
    if (!ctl_curve_key_valid(opts->curve_secret_key))
        return ctl_error_set(err, CTL_INVALID,
                             "server %s: the CURVE secret key is not a "
                             "40-character Z85 key", addr);
    if (opts->curve_allow_count && !opts->curve_allow)
        return ctl_error_set(err, CTL_INVALID,
                             "server %s: curve_allow_count is %zu but "
                             "curve_allow is NULL", addr,
                             opts->curve_allow_count);
    if (opts->curve_allow_count) {
        s->allow = calloc(opts->curve_allow_count, sizeof *s->allow);
        if (!s->allow)
            return ctl_error_transfer(err, CTL_CAUSE_NOMEM,
                                      "server %s: out of memory", addr);
        for (size_t i = 0; i < opts->curve_allow_count; i++) {
            const char *k = opts->curve_allow[i];
            if (!ctl_curve_key_valid(k))
                return ctl_error_set(err, CTL_INVALID,
                                     "server %s: allowed client key #%zu is "
                                     "not a 40-character Z85 key", addr, i);
            zmq_z85_decode(s->allow[i], k);
        }
        s->allow_count = opts->curve_allow_count;
        s->zap = zmq_socket(s->ctx, ZMQ_REP);
        if (!s->zap || zmq_bind(s->zap, "inproc://zeromq.zap.01") != 0)
            return ctl_error_set(err, CTL_INVALID,
                                 "server %s: cannot start the ZAP handler for "
                                 "the allowlist (%s): is another unit with an "
                                 "allowlist using this ZeroMQ context?", addr,
                                 zmq_strerror(zmq_errno()));
        int zero = 0;
        zmq_setsockopt(s->zap, ZMQ_LINGER, &zero, sizeof zero);
        zmq_setsockopt(s->router, ZMQ_ZAP_DOMAIN, "ctlrpc", 6);
    }
    if (zmq_setsockopt(s->router, ZMQ_CURVE_SERVER, &one, sizeof one) != 0 ||
        zmq_setsockopt(s->router, ZMQ_CURVE_SECRETKEY, opts->curve_secret_key,
                       CTL_CURVE_KEY_LEN) != 0)
        return ctl_error_set(err, CTL_INVALID,
                             "server %s: cannot enable CURVE: %s", addr,
                             zmq_strerror(zmq_errno()));
    return 0;
}

/* The endpoint to bind: the option, or tcp://<node_ip>:* ; port 0 is
 * written "*" for ZeroMQ. */
static int bind_address(const ctl_server_options *opts, char *buf, size_t len,
                        ctl_error *err)
{
    ctl_endpoint ep;
    if (!opts || !opts->endpoint) {
        char ip[64];
        int rc = ctl_node_ip(ip, sizeof ip, err);
        if (rc)
            return rc;
        snprintf(buf, len, "tcp://%s:*", ip);
        return 0;
    }
    int rc = ctl_endpoint_parse(opts->endpoint, &ep, err);
    if (rc)
        return rc;
    return ctl_endpoint_format(&ep, buf, len, err);
}

static void free_server(ctl_server *s)
{
    if (s->router)
        zmq_close(s->router);
    if (s->zap)
        zmq_close(s->zap);
    free(s->allow);
    if (s->own_ctx && s->ctx)
        zmq_ctx_term(s->ctx);
    if (s->wake[0] >= 0)
        close(s->wake[0]);
    if (s->wake[1] >= 0)
        close(s->wake[1]);
    if (s->lock == &s->own_lock)
        pthread_mutex_destroy(&s->own_lock);
    msgpack_zone_destroy(&s->zone);
    msgpack_sbuffer_destroy(&s->out);
    free(s->by_name);
    free(s);
}

int ctl_server_new(const ctl_service *service, void *user,
                   const ctl_server_options *opts, ctl_server **out,
                   ctl_error *err)
{
    char addr[CTL_ENDPOINT_MAX];
    int rc;
    if (!out)
        return ctl_error_set(err, CTL_INVALID, "server: out is NULL");
    *out = NULL;
    if ((rc = check_service(service, err)) != 0 ||
        (rc = bind_address(opts, addr, sizeof addr, err)) != 0)
        return rc;

    ctl_server *s = calloc(1, sizeof *s);
    if (!s)
        return ctl_error_transfer(err, CTL_CAUSE_NOMEM, "server: out of memory");
    s->wake[0] = s->wake[1] = -1;
    s->service = service;
    s->user = user;
    s->limits = ctl_limits_resolve(opts ? &opts->limits : NULL);
    msgpack_sbuffer_init(&s->out);
    if (!msgpack_zone_init(&s->zone, ZONE_CHUNK)) {
        free(s);
        return ctl_error_transfer(err, CTL_CAUSE_NOMEM, "server: out of memory");
    }
    if (opts && opts->lock) {
        s->lock = opts->lock;
    } else {
        pthread_mutex_init(&s->own_lock, NULL);
        s->lock = &s->own_lock;
    }

    s->by_name = calloc(service->op_count ? service->op_count : 1,
                        sizeof *s->by_name);
    if (!s->by_name) {
        free_server(s);
        return ctl_error_transfer(err, CTL_CAUSE_NOMEM, "server: out of memory");
    }
    for (size_t i = 0; i < service->op_count; i++)
        s->by_name[i] = &service->ops[i];
    qsort(s->by_name, service->op_count, sizeof *s->by_name, cmp_op);
    for (size_t i = 1; i < service->op_count; i++) {
        if (strcmp(s->by_name[i - 1]->name, s->by_name[i]->name) == 0) {
            rc = ctl_error_set(err, CTL_INVALID, "service %s: op '%s' is "
                               "declared twice",
                               service->name ? service->name : "(unnamed)",
                               s->by_name[i]->name);
            free_server(s);
            return rc;
        }
    }

    if (pipe2(s->wake, O_CLOEXEC | O_NONBLOCK) != 0) {
        s->wake[0] = s->wake[1] = -1;
        free_server(s);
        return ctl_error_transfer(err, CTL_CAUSE_TRANSPORT,
                                  "server %s: cannot create a pipe: %s", addr,
                                  strerror(errno));
    }
    s->ctx = opts && opts->zmq_context ? opts->zmq_context : NULL;
    if (!s->ctx) {
        s->ctx = zmq_ctx_new();
        s->own_ctx = 1;
    }
    s->router = s->ctx ? zmq_socket(s->ctx, ZMQ_ROUTER) : NULL;
    if (!s->router) {
        rc = ctl_error_transfer(err, CTL_CAUSE_TRANSPORT,
                                "server %s: cannot create a socket: %s", addr,
                                zmq_strerror(zmq_errno()));
        free_server(s);
        return rc;
    }
    int zero = 0, one = 1;
    int64_t maxmsg = s->limits.max_msg_bytes > INT64_MAX
                         ? INT64_MAX
                         : (int64_t)s->limits.max_msg_bytes;
    zmq_setsockopt(s->router, ZMQ_LINGER, &zero, sizeof zero);
    zmq_setsockopt(s->router, ZMQ_ROUTER_MANDATORY, &one, sizeof one);
    zmq_setsockopt(s->router, ZMQ_MAXMSGSIZE, &maxmsg, sizeof maxmsg);
    if (opts && opts->curve_secret_key &&
        (rc = setup_curve(s, opts, addr, err)) != 0) {
        free_server(s);
        return rc;
    }
    if (zmq_bind(s->router, addr) != 0) {
        rc = ctl_error_transfer(err, CTL_CAUSE_TRANSPORT,
                                "server: cannot bind %s: %s", addr,
                                zmq_strerror(zmq_errno()));
        free_server(s);
        return rc;
    }
    size_t elen = sizeof s->endpoint;
    if (zmq_getsockopt(s->router, ZMQ_LAST_ENDPOINT, s->endpoint, &elen) != 0)
        snprintf(s->endpoint, sizeof s->endpoint, "%s", addr);

    /* The server thread takes no signals: they belong to the program. */
    sigset_t all, old;
    sigfillset(&all);
    pthread_sigmask(SIG_SETMASK, &all, &old);
    s->blocking = s->own_ctx && !s->zap;
    rc = pthread_create(&s->thread, NULL, s->blocking ? serve_blocking : serve, s);
    pthread_sigmask(SIG_SETMASK, &old, NULL);
    if (rc != 0) {
        rc = ctl_error_transfer(err, CTL_CAUSE_TRANSPORT,
                                "server %s: cannot start its thread: %s",
                                s->endpoint, strerror(rc));
        free_server(s);
        return rc;
    }
    s->started = 1;
    *out = s;
    return 0;
}

const char *ctl_server_endpoint(const ctl_server *server)
{
    return server ? server->endpoint : "";
}

pthread_mutex_t *ctl_server_lock(ctl_server *server)
{
    return server->lock;
}

void ctl_server_stats_get(const ctl_server *server, ctl_server_stats *out)
{
    ctl_server *s = (ctl_server *)server;
    out->requests = atomic_load_explicit(&s->requests, memory_order_relaxed);
    out->replies = atomic_load_explicit(&s->replies, memory_order_relaxed);
    out->dropped = atomic_load_explicit(&s->dropped, memory_order_relaxed);
    out->send_failures =
        atomic_load_explicit(&s->send_failures, memory_order_relaxed);
    out->auth_denied =
        atomic_load_explicit(&s->auth_denied, memory_order_relaxed);
}

void ctl_server_close(ctl_server *server)
{
    if (!server || server->closed)
        return;
    server->closed = 1;
    atomic_store_explicit(&server->stopping, 1, memory_order_release);
    if (server->started) {
        ssize_t w;
        if (server->blocking)
            zmq_ctx_shutdown(server->ctx);
        do
            w = write(server->wake[1], "x", 1);
        while (w < 0 && errno == EINTR);
        pthread_join(server->thread, NULL);
        server->started = 0;
    }
    if (server->router) {
        zmq_close(server->router);
        server->router = NULL;
    }
    if (server->zap) {
        zmq_close(server->zap);
        server->zap = NULL;
    }
}

void ctl_server_destroy(ctl_server **server)
{
    if (!server || !*server)
        return;
    ctl_server_close(*server);
    free_server(*server);
    *server = NULL;
}
