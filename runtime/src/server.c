/*
 * server.c - the transport of one storage unit: its ROUTER socket, its
 * thread and its lifecycle.
 *
 * What a request means is decided by the dispatch core (dispatch.c); this
 * file only moves frames. One thread owns the ROUTER for the server's whole
 * life; nothing else touches it until that thread has been joined. For
 * each message it reads the frames (at most three kept: identity, optional
 * empty delimiter, payload), hands them to the core, and sends the reply
 * the core packed, if any; large replies go to ZeroMQ without a copy
 * (zmq_msg_init_data).
 *
 * A second thread reads the ROUTER's socket monitor: connections accepted
 * and lost, accepts that failed (out of file descriptors) and handshakes
 * refused, which it counts and logs (ctlrpc/log.h).
 *
 * Waking up for close: a server that owns its context and has no ZAP
 * handler blocks in the ROUTER's receive and is woken by shutting the
 * context down; otherwise the thread sleeps in zmq_poll on the ROUTER, the
 * ZAP socket and the read end of a pipe that ctl_server_close writes one
 * byte to. Either way closing wakes it at once, with no polling interval.
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
#include "ctlrpc/log.h"
#include "ctlrpc/net.h"
#include "curve_int.h"
#include "dispatch_int.h"
#include "log_int.h"
#include "transport_int.h"
#include "util_int.h"

/* The ROUTER's listen backlog: connections the kernel queues for the I/O
 * thread to accept. libzmq's default of 100 makes clients that connect all
 * at once beyond it wait for SYN retransmissions (1 s, 3 s, 7 s, ...); the
 * kernel caps this at net.core.somaxconn. */
#define LISTEN_BACKLOG 4096
/* Replies at least this large go to ZeroMQ without a copy. */
#define ZERO_COPY_MIN ((size_t)32 * 1024)
/* Messages handled per wake-up before the close pipe is looked at again. */
#define BATCH 256
/* How often a blocked serving thread looks at the drain flag, and how long
 * a draining one waits for more requests before it stops. */
#define DRAIN_CHECK_MS 100
#define DRAIN_QUIET_MS 50

struct ctl_server {
    ctl_dispatch core;
    void *ctx;
    int own_ctx;
    void *router;
    ctl_zap *zap; /* with an allowlist only */
    int wake[2];
    pthread_t thread;
    int started;
    int closed;
    int blocking; /* serve_blocking: close() shuts the context down */
    atomic_int stopping; /* set by close before it wakes the thread */
    atomic_int draining; /* set by drain before it wakes the thread */
    _Atomic int64_t drain_deadline_ms;
    char endpoint[CTL_ENDPOINT_MAX];
    void *monitor;       /* PAIR on the ROUTER's monitor; the monitor thread's */
    pthread_t monitor_thread;
    int monitor_started;
    ctl_log_limit send_limit; /* send failures (serving thread) */
};

/* The monitor events the server counts and logs. */
#define MONITOR_EVENTS                                                          \
    (ZMQ_EVENT_ACCEPTED | ZMQ_EVENT_ACCEPT_FAILED | ZMQ_EVENT_DISCONNECTED |    \
     ZMQ_EVENT_HANDSHAKE_FAILED_NO_DETAIL | ZMQ_EVENT_HANDSHAKE_FAILED_PROTOCOL | \
     ZMQ_EVENT_MONITOR_STOPPED)

void ctl_server_options_init(ctl_server_options *opts)
{
    memset(opts, 0, sizeof *opts);
}

/* ---- holds on received messages -------------------------------------- */

typedef struct msg_hold {
    ctl_hold base;
    zmq_msg_t msg; /* a reference to the request's payload */
} msg_hold;

static void release_msg_hold(ctl_hold *h)
{
    msg_hold *m = (msg_hold *)h;
    zmq_msg_close(&m->msg);
    free(m);
}

/* A copy of a zmq_msg_t shares a large message's bytes by reference count;
 * only a message small enough to live inside zmq_msg_t is copied. */
static ctl_hold *hold_msg(void *msg, size_t off, size_t len)
{
    msg_hold *h = malloc(sizeof *h);
    if (!h)
        return NULL;
    zmq_msg_init(&h->msg);
    if (zmq_msg_copy(&h->msg, msg) != 0) {
        zmq_msg_close(&h->msg);
        free(h);
        return NULL;
    }
    h->base.view = (ctl_str){(const char *)zmq_msg_data(&h->msg) + off, len};
    h->base.release = release_msg_hold;
    return &h->base;
}

/* ---- serving -------------------------------------------------------- */

/* Send [identity, (delimiter,) the core's reply]; the identity frame is
 * consumed. */
static void send_reply(ctl_server *s, zmq_msg_t *identity, bool delimited)
{
    msgpack_sbuffer *out = &s->core.out;
    bool ok = zmq_msg_send(identity, s->router, ZMQ_SNDMORE | ZMQ_DONTWAIT) >= 0;
    if (ok && delimited)
        ok = zmq_send(s->router, "", 0, ZMQ_SNDMORE | ZMQ_DONTWAIT) >= 0;
    if (ok) {
        if (out->size >= ZERO_COPY_MIN) {
            size_t size = out->size;
            ok = ctl_send_owned(s->router, msgpack_sbuffer_release(out), size,
                                ZMQ_DONTWAIT) == 0;
        } else {
            ok = zmq_send(s->router, out->data, out->size, ZMQ_DONTWAIT) >= 0;
        }
    }
    ctl_dispatch_sent(&s->core, ok);
    uint64_t skipped = 0;
    if (!ok && ctl_log_enabled(CTL_LOG_INFO) &&
        ctl_log_limit_pass(&s->send_limit, ctl_now_ms(), &skipped)) {
        int e = zmq_errno();
        ctl_log(CTL_LOG_INFO, "server", "%s: cannot send a reply of %zu bytes: %s%s "
                "(%llu more since the last line)", s->endpoint, s->core.reply_len,
                zmq_strerror(e), e == EHOSTUNREACH ? " (the client is gone)" : "",
                (unsigned long long)skipped);
    }
}

/* Read one whole message and serve it; the first frame is awaited with
 * `flags` (0 blocks, ZMQ_DONTWAIT does not). Returns 0, or -1 when nothing
 * was there (EAGAIN), the context was shut down (ETERM) or the socket
 * failed. */
static int serve_one(ctl_server *s, int flags)
{
    zmq_msg_t frames[3];
    int n = ctl_recv_message(s->router, frames, 3, flags);
    if (n < 0)
        return -1;
    int kept = n < 3 ? n : 3;
    ctl_inbound in = {
        .frames = (size_t)n,
        .delimiter_len = n == 3 ? zmq_msg_size(&frames[1]) : 0,
        .payload = n >= 2 ? zmq_msg_data(&frames[kept - 1]) : NULL,
        .payload_len = n >= 2 ? zmq_msg_size(&frames[kept - 1]) : 0,
        .hold = hold_msg,
        .msg = &frames[kept - 1],
    };
    bool delimited;
    if (ctl_dispatch_message(&s->core, &in, &delimited) == CTL_DISPATCH_REPLY)
        send_reply(s, &frames[0], delimited);
    ctl_dispatch_done(&s->core);
    ctl_frames_close(frames, kept);
    return 0;
}

/*
 * The serving loop when the server owns its ZeroMQ context and has no ZAP
 * handler: block in the ROUTER's receive. close() wakes it by shutting the
 * context down (the receive returns ETERM). One blocking receive per
 * request costs fewer system calls than zmq_poll plus a non-blocking
 * receive, which shows in every round trip's latency.
 */
static void drain(ctl_server *s);

static void *serve_blocking(void *arg)
{
    ctl_server *s = arg;
    while (!atomic_load_explicit(&s->stopping, memory_order_acquire)) {
        /* The receive gives up every DRAIN_CHECK_MS (ZMQ_RCVTIMEO), so a
         * drain is seen without a wake-up call; a request arriving is
         * served at once. */
        if (atomic_load_explicit(&s->draining, memory_order_acquire)) {
            drain(s);
            break;
        }
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
                               {s->zap ? ctl_zap_socket(s->zap) : NULL, 0,
                                ZMQ_POLLIN, 0}};
    int nitems = s->zap ? 3 : 2;
    for (;;) {
        /* Waits without a timeout on purpose: close() wakes it. */
        int rc = zmq_poll(items, nitems, -1);
        if (rc < 0) {
            if (errno == EINTR)
                continue;
            break; /* ETERM or a broken socket: nothing left to serve */
        }
        if (items[1].revents) {
            if (!atomic_load_explicit(&s->stopping, memory_order_acquire) &&
                atomic_load_explicit(&s->draining, memory_order_acquire))
                drain(s);
            break;
        }
        if (nitems == 3 && items[2].revents)
            ctl_zap_serve(s->zap);
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

/*
 * Answer what has arrived, and what arrives while that goes on, with Busy
 * "draining" (the core refuses to serve it), until the socket has been
 * quiet for DRAIN_QUIET_MS or the drain's deadline passes; then let the
 * last replies leave, waiting at most the time left. So no caller waits
 * out its deadline on a unit that is going away.
 */
static void drain(ctl_server *s)
{
    int64_t deadline = atomic_load_explicit(&s->drain_deadline_ms, memory_order_acquire);
    zmq_pollitem_t item = {s->router, 0, ZMQ_POLLIN, 0};
    s->core.draining = true;
    for (;;) {
        while (!atomic_load_explicit(&s->stopping, memory_order_acquire) &&
               ctl_ms_left(deadline) > 0 && serve_one(s, ZMQ_DONTWAIT) == 0)
            ;
        int left = ctl_ms_left(deadline);
        if (left <= 0 || atomic_load_explicit(&s->stopping, memory_order_acquire))
            break;
        int rc = zmq_poll(&item, 1, left < DRAIN_QUIET_MS ? left : DRAIN_QUIET_MS);
        if (rc < 0 && zmq_errno() == EINTR)
            continue;
        if (rc <= 0)
            break; /* quiet: every request that came has its reply */
    }
    int linger = ctl_ms_left(deadline);
    zmq_setsockopt(s->router, ZMQ_LINGER, &linger, sizeof linger);
}

/* ---- the socket monitor -------------------------------------------- */

static void bump(_Atomic uint64_t *c)
{
    atomic_store_explicit(c, atomic_load_explicit(c, memory_order_relaxed) + 1,
                          memory_order_relaxed);
}

static const char *handshake_why(uint32_t code)
{
    switch (code) {
    case ZMQ_PROTOCOL_ERROR_ZMTP_MECHANISM_MISMATCH:
        return "the client's security mechanism is not the unit's (CURVE on one "
               "side only?)";
    case ZMQ_PROTOCOL_ERROR_ZMTP_CRYPTOGRAPHIC:
        return "CURVE authentication failed (the client does not hold this "
               "unit's public key?)";
    default:
        return "a ZeroMQ protocol error";
    }
}

/* Count and log one event; returns 1 once the monitor has stopped. */
static int monitor_event(ctl_server *s, uint16_t event, uint32_t value,
                         ctl_log_limit *accept_limit, ctl_log_limit *handshake_limit)
{
    ctl_dispatch_counters *c = &s->core.counters;
    uint64_t skipped = 0;
    char more[80] = "";
    switch (event) {
    case ZMQ_EVENT_ACCEPTED:
        bump(&c->accepted);
        return 0;
    case ZMQ_EVENT_DISCONNECTED:
        bump(&c->disconnects);
        if (ctl_log_enabled(CTL_LOG_DEBUG))
            ctl_log(CTL_LOG_DEBUG, "server", "%s: a connection closed (by the client, "
                    "or by ZeroMQ for a message over max_msg_bytes)", s->endpoint);
        return 0;
    case ZMQ_EVENT_ACCEPT_FAILED:
        bump(&c->accept_failures);
        if (!ctl_log_enabled(CTL_LOG_WARN) ||
            !ctl_log_limit_pass(accept_limit, ctl_now_ms(), &skipped))
            return 0;
        if (skipped)
            snprintf(more, sizeof more, " (%llu more since the last line)",
                     (unsigned long long)skipped);
        ctl_log(CTL_LOG_WARN, "server", "%s: cannot accept a connection: %s (errno %u)%s%s",
                s->endpoint, strerror((int)value), (unsigned)value,
                value == EMFILE || value == ENFILE
                    ? "; out of file descriptors: raise the open-file limit (ulimit -n)"
                    : "",
                more);
        return 0;
    case ZMQ_EVENT_HANDSHAKE_FAILED_NO_DETAIL:
        /* The connection broke during the handshake (the client went away:
         * value is an errno); a disconnect follows, and is counted. */
        if (ctl_log_enabled(CTL_LOG_DEBUG))
            ctl_log(CTL_LOG_DEBUG, "server", "%s: a connection broke during its "
                    "handshake: %s", s->endpoint, strerror((int)value));
        return 0;
    case ZMQ_EVENT_HANDSHAKE_FAILED_PROTOCOL:
        bump(&c->handshake_failures);
        if (!ctl_log_enabled(CTL_LOG_WARN) ||
            !ctl_log_limit_pass(handshake_limit, ctl_now_ms(), &skipped))
            return 0;
        if (skipped)
            snprintf(more, sizeof more, " (%llu more since the last line)",
                     (unsigned long long)skipped);
        ctl_log(CTL_LOG_WARN, "server", "%s: refused a connection's handshake: %s "
                "(ZeroMQ protocol error 0x%08x)%s", s->endpoint, handshake_why(value),
                (unsigned)value, more);
        return 0;
    case ZMQ_EVENT_MONITOR_STOPPED:
        return 1;
    default:
        return 0;
    }
}

/* The monitor thread: until the monitor stops (close) or the context is
 * shut down. */
static void *monitor_main(void *arg)
{
    ctl_server *s = arg;
    ctl_log_limit accept_limit = {0}, handshake_limit = {0};
    for (;;) {
        zmq_msg_t f[2];
        int n = ctl_recv_message(s->monitor, f, 2, 0);
        if (n < 0) {
            if (zmq_errno() == EINTR || zmq_errno() == EAGAIN)
                continue;
            break;
        }
        int stop = 0;
        if (zmq_msg_size(&f[0]) >= 6) {
            const unsigned char *b = zmq_msg_data(&f[0]);
            uint16_t event;
            uint32_t value;
            memcpy(&event, b, sizeof event);
            memcpy(&value, b + 2, sizeof value);
            stop = monitor_event(s, event, value, &accept_limit, &handshake_limit);
        }
        ctl_frames_close(f, n < 2 ? n : 2);
        if (stop)
            break;
    }
    zmq_close(s->monitor);
    return NULL;
}

/* Start monitoring the ROUTER (before it binds, so no event is missed). */
static int start_monitor(ctl_server *s, const char *addr, ctl_error *err)
{
    char name[64];
    int zero = 0;
    snprintf(name, sizeof name, "inproc://ctlrpc-monitor-%p", (void *)s);
    if (zmq_socket_monitor(s->router, name, MONITOR_EVENTS) != 0 ||
        !(s->monitor = zmq_socket(s->ctx, ZMQ_PAIR)) ||
        zmq_setsockopt(s->monitor, ZMQ_LINGER, &zero, sizeof zero) != 0 ||
        zmq_connect(s->monitor, name) != 0) {
        int rc = ctl_error_transfer(err, CTL_CAUSE_TRANSPORT,
                                    "server %s: cannot monitor its socket: %s", addr,
                                    zmq_strerror(zmq_errno()));
        if (s->monitor)
            zmq_close(s->monitor);
        s->monitor = NULL;
        return rc;
    }
    return 0;
}

/* Stop the monitor (the ROUTER's owner calls this, after the serving thread
 * has ended) and wait for its thread. */
static void stop_monitor(ctl_server *s)
{
    if (!s->monitor_started)
        return;
    if (s->router)
        zmq_socket_monitor(s->router, NULL, 0); /* sends MONITOR_STOPPED */
    pthread_join(s->monitor_thread, NULL);
    s->monitor_started = 0;
    s->monitor = NULL;
}

/* ---- lifecycle ------------------------------------------------------ */

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
        int rc = ctl_zap_new(s->ctx, opts->curve_allow, opts->curve_allow_count,
                             &s->core.counters.auth_denied, addr, &s->zap, err);
        if (rc)
            return rc;
        ctl_zap_set_endpoint(s->zap, s->endpoint);
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
    if (!s->monitor_started && s->monitor)
        zmq_close(s->monitor);
    if (s->router)
        zmq_close(s->router);
    ctl_zap_destroy(&s->zap);
    if (s->own_ctx && s->ctx)
        zmq_ctx_term(s->ctx);
    if (s->wake[0] >= 0)
        close(s->wake[0]);
    if (s->wake[1] >= 0)
        close(s->wake[1]);
    ctl_dispatch_fini(&s->core);
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
    if ((rc = bind_address(opts, addr, sizeof addr, err)) != 0)
        return rc;

    ctl_server *s = calloc(1, sizeof *s);
    if (!s)
        return ctl_error_transfer(err, CTL_CAUSE_NOMEM, "server: out of memory");
    s->wake[0] = s->wake[1] = -1;
    if ((rc = ctl_dispatch_init(&s->core, service, user, opts ? opts->lock : NULL,
                                opts ? &opts->limits : NULL, err)) != 0) {
        free_server(s);
        return rc;
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
    int zero = 0, one = 1, backlog = LISTEN_BACKLOG;
    int64_t maxmsg = s->core.limits.max_msg_bytes > INT64_MAX
                         ? INT64_MAX
                         : (int64_t)s->core.limits.max_msg_bytes;
    zmq_setsockopt(s->router, ZMQ_LINGER, &zero, sizeof zero);
    zmq_setsockopt(s->router, ZMQ_ROUTER_MANDATORY, &one, sizeof one);
    zmq_setsockopt(s->router, ZMQ_MAXMSGSIZE, &maxmsg, sizeof maxmsg);
    zmq_setsockopt(s->router, ZMQ_BACKLOG, &backlog, sizeof backlog);
    if (opts && opts->curve_secret_key &&
        (rc = setup_curve(s, opts, addr, err)) != 0) {
        free_server(s);
        return rc;
    }
    if ((rc = start_monitor(s, addr, err)) != 0) {
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
    s->core.who = s->endpoint;
    s->core.describe_off = opts && opts->describe_off;

    /* The server thread takes no signals: they belong to the program. */
    sigset_t all, old;
    sigfillset(&all);
    pthread_sigmask(SIG_SETMASK, &all, &old);
    s->blocking = s->own_ctx && !s->zap;
    if (s->blocking) {
        int check = DRAIN_CHECK_MS;
        zmq_setsockopt(s->router, ZMQ_RCVTIMEO, &check, sizeof check);
    }
    rc = pthread_create(&s->monitor_thread, NULL, monitor_main, s);
    s->monitor_started = rc == 0;
    if (rc == 0)
        rc = pthread_create(&s->thread, NULL, s->blocking ? serve_blocking : serve, s);
    pthread_sigmask(SIG_SETMASK, &old, NULL);
    if (rc != 0) {
        stop_monitor(s);
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
    return server->core.lock;
}

void ctl_server_stats_get(const ctl_server *server, ctl_server_stats *out)
{
    const ctl_dispatch_counters *c = &server->core.counters;
    out->requests = atomic_load_explicit(&c->requests, memory_order_relaxed);
    out->replies = atomic_load_explicit(&c->replies, memory_order_relaxed);
    out->dropped = atomic_load_explicit(&c->dropped, memory_order_relaxed);
    out->send_failures =
        atomic_load_explicit(&c->send_failures, memory_order_relaxed);
    out->auth_denied = atomic_load_explicit(&c->auth_denied, memory_order_relaxed);
    out->undeclared = atomic_load_explicit(&c->undeclared, memory_order_relaxed);
    out->unknown_op = atomic_load_explicit(&c->unknown_op, memory_order_relaxed);
    out->bytes_in = atomic_load_explicit(&c->bytes_in, memory_order_relaxed);
    out->bytes_out = atomic_load_explicit(&c->bytes_out, memory_order_relaxed);
    out->accept_failures =
        atomic_load_explicit(&c->accept_failures, memory_order_relaxed);
    out->handshake_failures =
        atomic_load_explicit(&c->handshake_failures, memory_order_relaxed);
    uint64_t accepted = atomic_load_explicit(&c->accepted, memory_order_relaxed);
    out->disconnects = atomic_load_explicit(&c->disconnects, memory_order_relaxed);
    out->connections = accepted > out->disconnects ? accepted - out->disconnects : 0;
}

size_t ctl_server_op_count(const ctl_server *server)
{
    return ctl_dispatch_op_count(&server->core);
}

int ctl_server_op_stats(const ctl_server *server, size_t index, ctl_op_stats *out)
{
    if (!server || !out || index >= ctl_dispatch_op_count(&server->core))
        return CTL_INVALID;
    ctl_dispatch_op_stats(&server->core, index, out);
    return 0;
}

uint64_t ctl_server_op_errors(const ctl_server *server, size_t index, const char *kind)
{
    if (!server || index >= ctl_dispatch_op_count(&server->core))
        return 0;
    return ctl_dispatch_op_errors(&server->core, index, kind);
}

void ctl_server_health_get(const ctl_server *server, ctl_server_health *out)
{
    out->draining = atomic_load_explicit(&server->draining, memory_order_relaxed) != 0;
    out->uptime_s = ctl_dispatch_uptime(&server->core);
    out->in_flight = atomic_load_explicit(&server->core.in_flight, memory_order_relaxed);
}

/* Wake the serving thread through the close pipe (a blocked receive sees
 * the stop or drain flag by itself) and wait for it to end. */
static void join_thread(ctl_server *s)
{
    ssize_t w;
    do
        w = write(s->wake[1], "x", 1);
    while (w < 0 && errno == EINTR);
    pthread_join(s->thread, NULL);
    s->started = 0;
}

void ctl_server_close(ctl_server *server)
{
    if (!server || server->closed)
        return;
    server->closed = 1;
    atomic_store_explicit(&server->stopping, 1, memory_order_release);
    if (server->started) {
        if (server->blocking)
            zmq_ctx_shutdown(server->ctx); /* ends its receive at once */
        join_thread(server);
    }
    stop_monitor(server);
    if (server->router) {
        zmq_close(server->router);
        server->router = NULL;
    }
    ctl_zap_destroy(&server->zap);
}

void ctl_server_drain(ctl_server *server, int timeout_ms)
{
    if (!server || server->closed)
        return;
    if (server->started) {
        atomic_store_explicit(&server->drain_deadline_ms,
                              ctl_now_ms() + (timeout_ms > 0 ? timeout_ms : 0),
                              memory_order_release);
        atomic_store_explicit(&server->draining, 1, memory_order_release);
        join_thread(server); /* it drains, then ends */
    }
    ctl_server_close(server);
}

void ctl_server_destroy(ctl_server **server)
{
    if (!server || !*server)
        return;
    ctl_server_close(*server);
    free_server(*server);
    *server = NULL;
}
