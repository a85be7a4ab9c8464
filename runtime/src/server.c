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
 * One serving loop (serve()), two ways of waiting: a server that owns its
 * context blocks in the ROUTER's receive and is woken by shutting the
 * context down; one on a borrowed context sleeps in zmq_poll on the ROUTER
 * and the read end of a pipe that ctl_server_close writes one byte to.
 * Either way closing wakes it at once, with no polling interval, and the
 * stop and drain flags are looked at before every request. An allowlist's
 * ZAP requests are answered on the ZAP handler's thread (curve_int.h),
 * shared by the units of one context.
 *
 * Inproc names (the monitor's) come from ctl_inproc_name: unique for the
 * process's life, so units created and destroyed on one shared context
 * never meet a name libzmq has not let go of yet.
 */
#include "ctlrpc/server.h"

#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#ifdef __GLIBC__
#include <malloc.h>
#endif
#include <stdatomic.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <poll.h>
#include <pthread.h>

#include <arpa/inet.h>
#include <linux/tcp.h>
#include <netinet/in.h>
#include <sys/socket.h>

#include <zmq.h>

#include "ctlrpc/curve.h"
#include "ctlrpc/log.h"
#include "ctlrpc/net.h"
#include "curve_int.h"
#include "dispatch_int.h"
#include "ledger_int.h"
#include "log_int.h"
#include "server_int.h"
#include "transport_int.h"
#include "util_int.h"

/* The ROUTER's listen backlog: connections the kernel queues for the I/O
 * thread to accept. libzmq's default of 100 makes clients that connect all
 * at once beyond it wait for SYN retransmissions (1 s, 3 s, 7 s, ...); the
 * kernel caps this at net.core.somaxconn. */
#define LISTEN_BACKLOG 4096
/* Replies queued per connection by default (ZMQ_SNDHWM; ZeroMQ's own). */
#define DEFAULT_QUEUED_REPLIES 1000
/* Bytes of unread replies one connection may hold by default before its
 * requests get Busy (max_queued_reply_bytes). */
#define DEFAULT_QUEUED_REPLY_BYTES ((size_t)256 << 20)
/* Replies at least this large go to ZeroMQ without a copy, charged to their
 * connection in the ledger until ZeroMQ frees them. */
#define ZERO_COPY_MIN ((size_t)32 * 1024)
/* Monitor events read per hold of the reader's lock by the monitor thread,
 * and at most by one catch-up of the ZAP handler. Out of file descriptors,
 * libzmq's I/O thread retries its accept without pause and reports each
 * failure: read without a bound, that flood would keep the ZAP handler,
 * whose refusals over the caps free descriptors, from the lock. */
#define MONITOR_BATCH 1024
#define CATCH_UP_MOST 4096
/* The longest the monitor thread waits before it looks at its socket
 * again, should its descriptor miss a change. */
#define MONITOR_POLL_MS 100
/* Memory back to the system after a burst of connections: once at least
 * TRIM_AFTER_CLOSED of them have closed since the last time and none has
 * for TRIM_QUIET_MS, the monitor thread returns the heap's free pages
 * (malloc_trim). glibc keeps freed memory in its arenas: without it a
 * unit's RSS after rounds of thousands of short connections stayed where
 * the largest round left it, and crept up from round to round. */
#define TRIM_AFTER_CLOSED 64
#define TRIM_QUIET_MS 1000
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
    void *monitor;       /* PAIR on the ROUTER's monitor, read under reader->mu */
    struct monitor_reader *reader; /* what reading it keeps */
    pthread_t monitor_thread;
    int monitor_started;
    ctl_log_limit send_limit; /* send failures (serving thread) */
    ctl_ledger *ledger; /* unread large replies, by connection */
    char curve_public[CTL_CURVE_KEY_BUF]; /* "" without CURVE */
    ctl_server_hooks hooks; /* server_int.h; zero when none */
    int hooked;
};

/* The monitor events the server counts and logs. */
#define MONITOR_EVENTS                                                          \
    (ZMQ_EVENT_ACCEPTED | ZMQ_EVENT_ACCEPT_FAILED | ZMQ_EVENT_DISCONNECTED |    \
     ZMQ_EVENT_HANDSHAKE_FAILED_NO_DETAIL | ZMQ_EVENT_HANDSHAKE_FAILED_PROTOCOL | \
     ZMQ_EVENT_HANDSHAKE_FAILED_AUTH | ZMQ_EVENT_HANDSHAKE_SUCCEEDED |        \
     ZMQ_EVENT_MONITOR_STOPPED)

void ctl_server_options_init(ctl_server_options *opts)
{
    memset(opts, 0, sizeof *opts);
}

/* ---- holds on received messages -------------------------------------- */

typedef struct msg_hold {
    ctl_hold base;
    ctl_lender lender;  /* a reply may carry the held bytes (ctl_req_share) */
    atomic_size_t refs; /* the holder's, replies', the serving thread's */
    /* The hold is the only one made on its message, whose other bytes
     * (the request's head) nobody reads any more once it is served: a
     * reply may use them as room. Set by the serving thread after. */
    atomic_bool sole;
    zmq_msg_t msg; /* a reference to the request's payload */
} msg_hold;

/* The message being served, as ctl_inbound.msg: the holds made on it. */
typedef struct held_msg {
    zmq_msg_t *msg;
    msg_hold *last; /* the last hold made (a reference), or NULL */
    size_t holds;
} held_msg;

static msg_hold *hold_of(ctl_lender *l)
{
    return (msg_hold *)((char *)l - offsetof(msg_hold, lender));
}

static void hold_ref(ctl_lender *l)
{
    atomic_fetch_add_explicit(&hold_of(l)->refs, 1, memory_order_relaxed);
}

static void hold_unref(ctl_lender *l)
{
    msg_hold *m = hold_of(l);
    if (atomic_fetch_sub_explicit(&m->refs, 1, memory_order_acq_rel) == 1) {
        zmq_msg_close(&m->msg);
        free(m);
    }
}

static void hold_room(const ctl_lender *l, const char *ptr, size_t len, size_t *head,
                      size_t *tail)
{
    msg_hold *m = hold_of((ctl_lender *)l);
    *head = *tail = 0;
    if (!atomic_load_explicit(&m->sole, memory_order_acquire))
        return;
    const char *start = zmq_msg_data(&m->msg);
    *head = (size_t)(ptr - start);
    *tail = (size_t)(start + zmq_msg_size(&m->msg) - (ptr + len));
}

static const ctl_lender_ops hold_ops = {hold_ref, hold_unref, hold_room};

static void release_msg_hold(ctl_hold *h)
{
    hold_unref(((msg_hold *)h)->base.lender);
}

/* A copy of a zmq_msg_t shares a large message's bytes by reference count;
 * only a message small enough to live inside zmq_msg_t is copied. */
static ctl_hold *hold_msg(void *arg, size_t off, size_t len)
{
    held_msg *hm = arg;
    msg_hold *h = malloc(sizeof *h);
    if (!h)
        return NULL;
    zmq_msg_init(&h->msg);
    if (zmq_msg_copy(&h->msg, hm->msg) != 0) {
        zmq_msg_close(&h->msg);
        free(h);
        return NULL;
    }
    ctl_lender_init(&h->lender, &hold_ops);
    atomic_init(&h->refs, 2); /* the holder's and the serving thread's */
    atomic_init(&h->sole, false);
    h->base.view = (ctl_str){(const char *)zmq_msg_data(&h->msg) + off, len};
    h->base.release = release_msg_hold;
    h->base.lender = &h->lender;
    if (hm->last)
        hold_unref(&hm->last->lender);
    hm->last = h;
    hm->holds++;
    return &h->base;
}

/* The message has been served: a hold alone on it may lend its room. */
static void held_msg_done(held_msg *hm)
{
    if (!hm->last)
        return;
    if (hm->holds == 1)
        atomic_store_explicit(&hm->last->sole, true, memory_order_release);
    hold_unref(&hm->last->lender);
    hm->last = NULL;
}

/* ---- serving -------------------------------------------------------- */

/* Send [identity, (delimiter,) the core's reply]; the identity frame is
 * consumed. */
static void send_reply(ctl_server *s, zmq_msg_t *identity, bool delimited)
{
    msgpack_sbuffer *out = &s->core.out;
    /* The routing id outlives the identity frame's send: copied (at most
     * 255 bytes, ZMTP's limit). */
    unsigned char id[256];
    size_t id_len = zmq_msg_size(identity) < sizeof id ? zmq_msg_size(identity) : sizeof id;
    memcpy(id, zmq_msg_data(identity), id_len);
    bool ok = zmq_msg_send(identity, s->router, ZMQ_SNDMORE | ZMQ_DONTWAIT) >= 0;
    if (ok && delimited)
        ok = zmq_send(s->router, "", 0, ZMQ_SNDMORE | ZMQ_DONTWAIT) >= 0;
    if (ok) {
        if (s->core.reply_len >= ZERO_COPY_MIN) {
            ctl_payload p;
            ok = ctl_payload_take(&p, out, &s->core.seg) == 0 &&
                 ctl_ledger_send(s->ledger, id, id_len, s->router, &p, ZMQ_DONTWAIT) == 0;
        } else {
            ok = zmq_send(s->router, out->data, out->size, ZMQ_DONTWAIT) >= 0;
        }
    }
    ctl_dispatch_sent(&s->core, ok);
    uint64_t skipped = 0;
    if (!ok && ctl_log_enabled(CTL_LOG_INFO) &&
        ctl_log_limit_pass(&s->send_limit, ctl_now_ms(), &skipped)) {
        int e = zmq_errno();
        char more[80] = "";
        if (skipped)
            snprintf(more, sizeof more, CTL_LOG_LEFT_OUT_FMT, (unsigned long long)skipped);
        ctl_log(CTL_LOG_INFO, "server", "%s: cannot send a reply of %zu bytes: %s%s%s",
                s->endpoint, s->core.reply_len, zmq_strerror(e),
                e == EHOSTUNREACH ? " (the client is gone)" : "", more);
    }
}

/* Read one whole message and serve it; the first frame is awaited with
 * `flags` (0 blocks, ZMQ_DONTWAIT does not). Returns 0, or -1 when nothing
 * was there (EAGAIN), the context was shut down (ETERM) or the socket
 * failed. */
static int serve_one(ctl_server *s, int flags)
{
    zmq_msg_t frames[3];
    size_t discarded;
    int n = ctl_recv_message(s->router, frames, 3, flags, &discarded);
    if (n < 0)
        return -1;
    int kept = n < 3 ? n : 3;
    held_msg hm = {.msg = &frames[kept - 1]};
    ctl_inbound in = {
        .frames = (size_t)n,
        .delimiter_len = n >= 3 ? zmq_msg_size(&frames[1]) : 0,
        .discarded_len = discarded,
        .payload = n >= 2 ? zmq_msg_data(&frames[kept - 1]) : NULL,
        .payload_len = n >= 2 ? zmq_msg_size(&frames[kept - 1]) : 0,
        .hold = hold_msg,
        .msg = &hm,
    };
    if (n >= 2)
        in.unread_reply_bytes = ctl_ledger_unread(s->ledger, zmq_msg_data(&frames[0]),
                                                  zmq_msg_size(&frames[0]));
    bool delimited;
    if (ctl_dispatch_message(&s->core, &in, &delimited) == CTL_DISPATCH_REPLY)
        send_reply(s, &frames[0], delimited);
    ctl_dispatch_done(&s->core);
    ctl_frames_close(frames, kept);
    held_msg_done(&hm);
    return 0;
}

static void drain(ctl_server *s);

/* Whether close or drain has been asked for. */
static bool stop_asked(ctl_server *s)
{
    return atomic_load_explicit(&s->stopping, memory_order_acquire) ||
           atomic_load_explicit(&s->draining, memory_order_acquire);
}

/*
 * The serving loop. It looks at the stop and drain flags before every
 * request it reads, so a request still queued when close is called is not
 * served, and one queued when a drain begins gets Busy "draining" (drain()
 * answers it), whichever way the thread waits:
 *
 *   - blocking (the server owns its context): in the ROUTER's receive.
 *     close() wakes it by shutting the context down (the receive returns
 *     ETERM); the receive gives up every DRAIN_CHECK_MS (ZMQ_RCVTIMEO) so
 *     that an idle thread sees a drain begin without a wake-up. One
 *     blocking receive per request costs fewer system calls than zmq_poll
 *     plus a non-blocking receive, which shows in every round trip.
 *   - polling (a borrowed context, which close() may not shut down): in
 *     zmq_poll on the ROUTER and the close pipe, which close() and drain()
 *     write a byte to; then up to BATCH requests without waiting.
 *
 * ZAP requests (allowlists) are answered by the ZAP handler's own thread
 * (curve.c), so handshakes go on during a drain or a long handler.
 */
static void *serve(void *arg)
{
    ctl_server *s = arg;
    zmq_pollitem_t items[2] = {{s->router, 0, ZMQ_POLLIN, 0},
                               {NULL, s->wake[0], ZMQ_POLLIN, 0}};
    while (!atomic_load_explicit(&s->stopping, memory_order_acquire)) {
        if (atomic_load_explicit(&s->draining, memory_order_acquire)) {
            drain(s);
            break;
        }
        if (s->blocking) {
            if (serve_one(s, 0) != 0 && zmq_errno() == ETERM)
                break;
            continue;
        }
        /* Waits without a timeout on purpose: close() and drain() wake it. */
        int rc = zmq_poll(items, 2, -1);
        if (rc < 0) {
            if (zmq_errno() == EINTR)
                continue;
            break; /* ETERM or a broken socket: nothing left to serve */
        }
        if (items[1].revents)
            continue; /* the flags say what to do */
        for (int i = 0; i < BATCH && !stop_asked(s); i++)
            if (serve_one(s, ZMQ_DONTWAIT) != 0)
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

/* The kinds of refused handshake, each logged with its own limiter. */
enum { HS_MECHANISM, HS_CURVE, HS_OTHER, HS_SOCKTYPE, HS_KINDS };

/* The connections whose handshake has had no outcome yet, to tell a peer
 * of a wrong ZMTP socket type (a PUSH, PUB, SUB, PAIR...): libzmq closes
 * it with no handshake event at all. A failed handshake's event names no
 * connection either, but its disconnect follows at once (`failed` counts
 * those awaited). A success names none: it is taken as the oldest
 * connection under way that has received a whole greeting and a command
 * (a silent or half-done peer has not), which is exact unless two peers
 * finish their greetings at the same moment. A success that finds none
 * (the peer called and left before the monitor read the event: its
 * descriptor is closed) is kept in `unmatched`, and the next close of a
 * connection under way is taken as its own, not as a wrong socket type:
 * a refusal may go uncounted then, an honest peer is never logged as
 * refused. The monitor thread's own: a
 * FIFO of descriptors (pruned lazily of those no longer under way) and,
 * per descriptor, whether its handshake is under way and the peer's
 * address (for the log line). */
typedef struct hs_pending {
    int *fifo;
    size_t head, tail, cap;
    unsigned failed;
    size_t unmatched;
    struct hs_fd {
        bool open;
        char addr[INET6_ADDRSTRLEN];
    } *fd;
    size_t fd_cap;
} hs_pending;

/* What reading the monitor keeps; all under `mu`, taken by the monitor
 * thread and by the ZAP handler's catch-up (catch_up_monitor), which read
 * the monitor socket in turn. */
typedef struct monitor_reader {
    pthread_mutex_t mu;
    bool done; /* the monitor has stopped: its socket is not read again */
    ctl_log_limit accept_limit, handshake_limit[HS_KINDS];
    hs_pending hs;
} monitor_reader;

static void peer_address(int fd, char *out, size_t len)
{
    struct sockaddr_storage ss;
    socklen_t sl = sizeof ss;
    snprintf(out, len, "an unknown address");
    if (getpeername(fd, (struct sockaddr *)&ss, &sl) != 0)
        return;
    if (ss.ss_family == AF_INET)
        inet_ntop(AF_INET, &((struct sockaddr_in *)&ss)->sin_addr, out, (socklen_t)len);
    else if (ss.ss_family == AF_INET6)
        inet_ntop(AF_INET6, &((struct sockaddr_in6 *)&ss)->sin6_addr, out, (socklen_t)len);
}

/* A connection accepted: its handshake is under way. Out of memory, it is
 * not tracked (its close is then never taken for a wrong socket type). */
static void hs_opened(hs_pending *p, int fd)
{
    if (fd < 0)
        return;
    if ((size_t)fd >= p->fd_cap) {
        size_t cap = p->fd_cap ? p->fd_cap : 64;
        while (cap <= (size_t)fd)
            cap *= 2;
        struct hs_fd *bigger = realloc(p->fd, cap * sizeof *bigger);
        if (!bigger)
            return;
        memset(bigger + p->fd_cap, 0, (cap - p->fd_cap) * sizeof *bigger);
        p->fd = bigger;
        p->fd_cap = cap;
    }
    if (p->tail == p->cap) { /* keep only those still under way, then grow */
        size_t n = 0;
        for (size_t i = p->head; i < p->tail; i++)
            if (p->fd[p->fifo[i]].open)
                p->fifo[n++] = p->fifo[i];
        p->head = 0;
        p->tail = n;
        if (n * 2 >= p->cap) {
            size_t cap = p->cap ? p->cap * 2 : 64;
            int *bigger = realloc(p->fifo, cap * sizeof *bigger);
            if (!bigger)
                return;
            p->fifo = bigger;
            p->cap = cap;
        }
    }
    p->fifo[p->tail++] = fd;
    p->fd[fd].open = true;
    peer_address(fd, p->fd[fd].addr, sizeof p->fd[fd].addr);
}

/* The bytes a connection has received: a ZMTP greeting is 64, a command
 * at least 2 more. */
#define HS_GREETED 66
static bool hs_greeted(int fd)
{
    struct tcp_info ti;
    socklen_t len = sizeof ti;
    memset(&ti, 0, sizeof ti);
    return getsockopt(fd, IPPROTO_TCP, TCP_INFO, &ti, &len) == 0 &&
           len > offsetof(struct tcp_info, tcpi_bytes_received) &&
           ti.tcpi_bytes_received >= HS_GREETED;
}

/* A handshake succeeded: see hs_pending for which one is taken. */
static void hs_succeeded(hs_pending *p)
{
    size_t under_way = 0;
    for (size_t i = p->head; i < p->tail; i++) {
        int fd = p->fifo[i];
        if (!p->fd[fd].open)
            continue;
        under_way++;
        if (!hs_greeted(fd))
            continue;
        p->fd[fd].open = false;
        while (p->head < p->tail && !p->fd[p->fifo[p->head]].open)
            p->head++;
        return;
    }
    if (p->unmatched < under_way)
        p->unmatched++;
}

/* A connection closed: true when its handshake was still under way with no
 * handshake event for it, with the peer's address in *addr. */
static bool hs_closed(hs_pending *p, int fd, const char **addr)
{
    bool open = fd >= 0 && (size_t)fd < p->fd_cap && p->fd[fd].open;
    if (open)
        p->fd[fd].open = false;
    if (p->failed) { /* the connection whose failure was just reported */
        p->failed--;
        return false;
    }
    if (open && p->unmatched) { /* a success that found no descriptor: its own */
        p->unmatched--;
        return false;
    }
    if (open)
        *addr = p->fd[fd].addr;
    return open;
}

static int handshake_kind(uint32_t code)
{
    return code == ZMQ_PROTOCOL_ERROR_ZMTP_MECHANISM_MISMATCH ? HS_MECHANISM
           : code == ZMQ_PROTOCOL_ERROR_ZMTP_CRYPTOGRAPHIC    ? HS_CURVE
                                                               : HS_OTHER;
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
                         ctl_log_limit *accept_limit,
                         ctl_log_limit handshake_limit[HS_KINDS], hs_pending *hs)
{
    ctl_dispatch_counters *c = &s->core.counters;
    uint64_t skipped = 0;
    char more[80] = "";
    const char *addr = NULL;
    switch (event) {
    case ZMQ_EVENT_ACCEPTED:
        if (ctl_zap_counts(s->zap))
            ctl_zap_conn_opened(s->zap, (int)value);
        hs_opened(hs, (int)value);
        bump(&c->accepted);
        return 0;
    case ZMQ_EVENT_HANDSHAKE_SUCCEEDED:
        hs_succeeded(hs);
        return 0;
    case ZMQ_EVENT_HANDSHAKE_FAILED_AUTH: /* the ZAP handler counted and logged it */
        hs->failed++;
        return 0;
    case ZMQ_EVENT_DISCONNECTED:
        if (ctl_zap_counts(s->zap))
            ctl_zap_conn_closed(s->zap, (int)value);
        bump(&c->disconnects);
        if (hs_closed(hs, (int)value, &addr)) {
            bump(&c->handshake_failures);
            if (ctl_log_enabled(CTL_LOG_WARN) &&
                ctl_log_limit_pass(&handshake_limit[HS_SOCKTYPE], ctl_now_ms(), &skipped)) {
                if (skipped)
                    snprintf(more, sizeof more, CTL_LOG_LEFT_OUT_FMT, (unsigned long long)skipped);
                ctl_log(CTL_LOG_WARN, "server", "%s: refused a connection from %s: its "
                        "ZeroMQ socket type is not one a unit talks to (a DEALER or REQ)%s",
                        s->endpoint, addr, more);
            }
            return 0;
        }
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
            snprintf(more, sizeof more, CTL_LOG_LEFT_OUT_FMT, (unsigned long long)skipped);
        ctl_log(CTL_LOG_WARN, "server", "%s: cannot accept a connection: %s (errno %u)%s%s",
                s->endpoint, strerror((int)value), (unsigned)value,
                value == EMFILE || value == ENFILE
                    ? "; out of file descriptors: raise the open-file limit (ulimit -n)"
                    : "",
                more);
        return 0;
    case ZMQ_EVENT_HANDSHAKE_FAILED_NO_DETAIL:
        /* The connection broke during the handshake (the client went away,
         * or the handshake timed out: value is an errno); a disconnect
         * follows, and is counted. A failed handshake all the same, as the
         * Python unit counts it. */
        hs->failed++;
        bump(&c->handshake_failures);
        if (ctl_log_enabled(CTL_LOG_DEBUG))
            ctl_log(CTL_LOG_DEBUG, "server", "%s: a connection broke during its "
                    "handshake: %s", s->endpoint,
                    value == EAGAIN ? "not finished within the handshake timeout"
                                    : strerror((int)value));
        return 0;
    case ZMQ_EVENT_HANDSHAKE_FAILED_PROTOCOL:
        hs->failed++;
        bump(&c->handshake_failures);
        if (!ctl_log_enabled(CTL_LOG_WARN) ||
            !ctl_log_limit_pass(&handshake_limit[handshake_kind(value)], ctl_now_ms(),
                                &skipped))
            return 0;
        if (skipped)
            snprintf(more, sizeof more, CTL_LOG_LEFT_OUT_FMT, (unsigned long long)skipped);
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

/* Read at most `most` waiting monitor events, without blocking, under
 * r->mu; sets r->done once the monitor has stopped (or the context is shut
 * down). Returns whether more may be waiting. */
static bool read_events(ctl_server *s, int most)
{
    monitor_reader *r = s->reader;
    for (int i = 0; i < most; i++) {
        int events = 0;
        size_t len = sizeof events;
        if (zmq_getsockopt(s->monitor, ZMQ_EVENTS, &events, &len) != 0) {
            if (zmq_errno() != EINTR)
                r->done = true; /* ETERM: the context is shut down */
            return false;
        }
        if (!(events & ZMQ_POLLIN))
            return false;
        zmq_msg_t f[2];
        int n = ctl_recv_message(s->monitor, f, 2, ZMQ_DONTWAIT, NULL);
        if (n < 0) {
            if (zmq_errno() != EAGAIN && zmq_errno() != EINTR)
                r->done = true;
            return false;
        }
        if (zmq_msg_size(&f[0]) >= 6) {
            const unsigned char *b = zmq_msg_data(&f[0]);
            uint16_t event;
            uint32_t value;
            memcpy(&event, b, sizeof event);
            memcpy(&value, b + 2, sizeof value);
            if (monitor_event(s, event, value, &r->accept_limit, r->handshake_limit, &r->hs))
                r->done = true;
        }
        ctl_frames_close(f, n < 2 ? n : 2);
        if (r->done)
            return false;
    }
    return true;
}

/* The monitor thread's upkeep of the heap (TRIM_AFTER_CLOSED). */
typedef struct heap_upkeep {
    uint64_t closed;     /* disconnects seen at the last look */
    uint64_t trimmed_at; /* disconnects at the last trim */
    int64_t quiet_since; /* when `closed` last changed */
} heap_upkeep;

static void heap_upkeep_pass(ctl_server *s, heap_upkeep *h)
{
#ifdef __GLIBC__
    uint64_t closed = atomic_load_explicit(&s->core.counters.disconnects, memory_order_relaxed);
    int64_t now = ctl_now_ms();
    if (closed != h->closed) {
        h->closed = closed;
        h->quiet_since = now;
        return;
    }
    if (closed - h->trimmed_at >= TRIM_AFTER_CLOSED && now - h->quiet_since >= TRIM_QUIET_MS) {
        h->trimmed_at = closed;
        malloc_trim(0);
    }
#else
    (void)s;
    (void)h;
#endif
}

/* The monitor thread: reads the events as they come, a batch per hold of
 * the reader's lock (the ZAP handler's catch-up takes it too), until the
 * monitor stops (close) or the context is shut down; then closes the
 * reader. It waits on the socket's descriptor, which tells only that its
 * state may have changed (the reads rearm it), with a timeout as a floor. */
static void *monitor_main(void *arg)
{
    ctl_server *s = arg;
    monitor_reader *r = s->reader;
    heap_upkeep heap = {0, 0, 0};
    int fd = -1;
    size_t len = sizeof fd;
    pthread_mutex_lock(&r->mu);
    if (zmq_getsockopt(s->monitor, ZMQ_FD, &fd, &len) != 0)
        fd = -1;
    pthread_mutex_unlock(&r->mu);
    for (;;) {
        pthread_mutex_lock(&r->mu);
        bool more = !r->done && read_events(s, MONITOR_BATCH);
        bool done = r->done;
        pthread_mutex_unlock(&r->mu);
        if (done)
            break;
        if (more)
            continue;
        heap_upkeep_pass(s, &heap);
        struct pollfd p = {.fd = fd, .events = POLLIN};
        poll(fd >= 0 ? &p : NULL, fd >= 0 ? 1 : 0, MONITOR_POLL_MS); /* EINTR: look again */
    }
    pthread_mutex_lock(&r->mu);
    zmq_close(s->monitor);
    pthread_mutex_unlock(&r->mu);
    return NULL;
}

/* Start monitoring the ROUTER (before it binds, so no event is missed). */
static int start_monitor(ctl_server *s, const char *addr, ctl_error *err)
{
    char name[CTL_INPROC_NAME_MAX];
    int zero = 0;
    if (!(s->reader = calloc(1, sizeof *s->reader)))
        return ctl_error_transfer(err, CTL_CAUSE_NOMEM, "server %s: out of memory", addr);
    pthread_mutex_init(&s->reader->mu, NULL);
    ctl_inproc_name(name, sizeof name, "srvmon");
    /* No high-water mark on the reader: ZeroMQ sends monitor events
     * blocking, under a lock of the ROUTER's, so a full pipe would stall
     * the I/O thread and with it every connection of the context. The
     * monitor thread reads all the time; what can pile up is bounded by
     * the connections accepted while it waits (a log sink that blocks). */
    if (zmq_socket_monitor(s->router, name, MONITOR_EVENTS) != 0 ||
        !(s->monitor = zmq_socket(s->ctx, ZMQ_PAIR)) ||
        zmq_setsockopt(s->monitor, ZMQ_LINGER, &zero, sizeof zero) != 0 ||
        zmq_setsockopt(s->monitor, ZMQ_RCVHWM, &zero, sizeof zero) != 0 ||
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

/* The ZAP handler's catch-up before it judges a handshake by the caps
 * (ctl_zap_set_catch_up): the events its monitor thread has not read yet. */
static void catch_up_monitor(void *arg)
{
    ctl_server *s = arg;
    monitor_reader *r = s->reader;
    pthread_mutex_lock(&r->mu);
    if (!r->done)
        read_events(s, CATCH_UP_MOST);
    pthread_mutex_unlock(&r->mu);
}

/* Register with the ZAP handler of the context (an allowlist, caps) and
 * have the ROUTER ask it, under the unit's own domain. */
static int setup_zap(ctl_server *s, const ctl_server_options *opts, const char *addr,
                     ctl_error *err)
{
    ctl_zap_caps caps = {opts->max_connections, opts->max_connections_per_address,
                         &s->core.counters.conn_refused};
    int rc = ctl_zap_new(s->ctx, opts->curve_secret_key ? opts->curve_allow : NULL,
                         opts->curve_secret_key ? opts->curve_allow_count : 0,
                         &s->core.counters.auth_denied, &caps, addr, &s->zap, err);
    if (rc)
        return rc;
    const char *domain = ctl_zap_domain(s->zap);
    zmq_setsockopt(s->router, ZMQ_ZAP_DOMAIN, domain, strlen(domain));
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
    for (size_t i = 0; i < opts->curve_allow_count; i++)
        if (opts->curve_allow[i] &&
            strcmp(opts->curve_allow[i], opts->curve_secret_key) == 0)
            return ctl_error_set(err, CTL_INVALID,
                                 "server %s: allowed client key #%zu is the "
                                 "unit's own secret key: an allowlist holds "
                                 "client public keys (make a new key pair for "
                                 "the unit, this secret is exposed)", addr, i);
    if (opts->curve_allow_count) {
        int rc = setup_zap(s, opts, addr, err);
        if (rc)
            return rc;
    }
    if (zmq_setsockopt(s->router, ZMQ_CURVE_SERVER, &one, sizeof one) != 0 ||
        zmq_setsockopt(s->router, ZMQ_CURVE_SECRETKEY, opts->curve_secret_key,
                       CTL_CURVE_KEY_LEN) != 0)
        return ctl_error_set(err, CTL_INVALID,
                             "server %s: cannot enable CURVE: %s", addr,
                             zmq_strerror(zmq_errno()));
    if (ctl_curve_public_of(opts->curve_secret_key, s->curve_public, err) != 0)
        return err ? err->kind : CTL_INVALID;
    return 0;
}

/* The handshake limit and the heartbeats that reap dead and silent peers
 * (server.h, ctl_server_options). */
static void set_reaping(void *router, const ctl_server_options *opts)
{
    int handshake = opts && opts->handshake_timeout_ms ? opts->handshake_timeout_ms
                                                       : CTL_DEFAULT_HANDSHAKE_MS;
    int beat = opts && opts->heartbeat_ms ? opts->heartbeat_ms : CTL_DEFAULT_HEARTBEAT_MS;
    int timeout = opts && opts->heartbeat_timeout_ms > 0 ? opts->heartbeat_timeout_ms
                  : beat > INT_MAX / 3                  ? INT_MAX
                                                        : 3 * beat;
    if (handshake < 0)
        handshake = 0; /* ZeroMQ's "no limit" */
    zmq_setsockopt(router, ZMQ_HANDSHAKE_IVL, &handshake, sizeof handshake);
    if (beat > 0) {
        zmq_setsockopt(router, ZMQ_HEARTBEAT_IVL, &beat, sizeof beat);
        zmq_setsockopt(router, ZMQ_HEARTBEAT_TIMEOUT, &timeout, sizeof timeout);
    }
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
    if (s->hooked && s->hooks.on_destroy)
        s->hooks.on_destroy(s->hooks.arg);
    if (!s->monitor_started && s->monitor) {
        /* No thread ever read it; the ZAP handler's catch-up may still. */
        pthread_mutex_lock(&s->reader->mu);
        s->reader->done = true;
        zmq_close(s->monitor);
        pthread_mutex_unlock(&s->reader->mu);
    }
    if (s->router)
        zmq_close(s->router);
    ctl_zap_destroy(&s->zap); /* waits for a catch-up under way */
    if (s->reader) {
        free(s->reader->hs.fifo);
        free(s->reader->hs.fd);
        pthread_mutex_destroy(&s->reader->mu);
        free(s->reader);
    }
    if (s->own_ctx && s->ctx)
        zmq_ctx_term(s->ctx);
    if (s->wake[0] >= 0)
        close(s->wake[0]);
    if (s->wake[1] >= 0)
        close(s->wake[1]);
    ctl_dispatch_fini(&s->core);
    ctl_ledger_release(s->ledger);
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
    ctl_error_clear(err); /* success leaves nothing behind */
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
    s->core.lend = true; /* send_reply sends the reply with ctl_payload_take */
    if (pipe2(s->wake, O_CLOEXEC | O_NONBLOCK) != 0) {
        s->wake[0] = s->wake[1] = -1;
        free_server(s);
        return ctl_error_transfer(err, CTL_CAUSE_TRANSPORT,
                                  "server %s: cannot create a pipe: %s", addr,
                                  strerror(errno));
    }
    if (!(s->ledger = ctl_ledger_new())) {
        free_server(s);
        return ctl_error_transfer(err, CTL_CAUSE_NOMEM, "server %s: out of memory", addr);
    }
    s->ctx = opts && opts->zmq_context ? opts->zmq_context : NULL;
    if (!s->ctx) {
        s->ctx = zmq_ctx_new();
        s->own_ctx = 1;
    }
    if (s->ctx)
        ctl_zmq_threads_start(s->ctx);
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
    int queued = opts && opts->max_queued_replies && opts->max_queued_replies <= INT_MAX
                     ? (int)opts->max_queued_replies
                     : DEFAULT_QUEUED_REPLIES;
    zmq_setsockopt(s->router, ZMQ_SNDHWM, &queued, sizeof queued);
    if (opts && opts->max_reply_bytes)
        s->core.max_reply_bytes = opts->max_reply_bytes;
    s->core.max_queued_reply_bytes = opts && opts->max_queued_reply_bytes
                                         ? opts->max_queued_reply_bytes
                                         : DEFAULT_QUEUED_REPLY_BYTES;
    if (opts && opts->deadline_skew_ms)
        s->core.deadline_skew_ms = opts->deadline_skew_ms;
    set_reaping(s->router, opts);
    /* IPv6 where the endpoint needs it: without ZMQ_IPV6 ZeroMQ cannot
     * bind tcp://[::1]:port, nor an interface with IPv6 addresses only. Not for
     * IPv4 endpoints, which it would bind as IPv4-mapped IPv6. */
    ctl_endpoint bep;
    int v6 = ctl_endpoint_parse(addr, &bep, NULL) == 0 && ctl_endpoint_needs_ipv6(&bep);
    zmq_setsockopt(s->router, ZMQ_IPV6, &v6, sizeof v6);
    if (opts && !opts->curve_secret_key && opts->curve_allow_count) {
        /* An allowlist without CURVE would admit every peer. */
        free_server(s);
        return ctl_error_set(err, CTL_INVALID,
                             "server %s: curve_allow needs curve_secret_key (an allowlist "
                             "is of CURVE clients)", addr);
    }
    if (opts && opts->curve_secret_key &&
        (rc = setup_curve(s, opts, addr, err)) != 0) {
        free_server(s);
        return rc;
    }
    /* Caps without an allowlist: the ZAP handler judges every handshake,
     * CURVE or not, by them alone. */
    if (opts && !s->zap && (opts->max_connections || opts->max_connections_per_address) &&
        (rc = setup_zap(s, opts, addr, err)) != 0) {
        free_server(s);
        return rc;
    }
    if ((rc = start_monitor(s, addr, err)) != 0) {
        free_server(s);
        return rc;
    }
    if (ctl_zap_counts(s->zap))
        ctl_zap_set_catch_up(s->zap, catch_up_monitor, s);
    if (zmq_bind(s->router, addr) != 0) {
        /* For a name it cannot resolve, libzmq says ENODEV ("No such
         * device"): it also tries the name as an interface's. */
        ctl_endpoint ep;
        if (zmq_errno() == ENODEV && ctl_endpoint_parse(addr, &ep, NULL) == 0)
            rc = ctl_error_transfer(err, CTL_CAUSE_UNRESOLVED,
                                    "server: cannot bind %s: host '%s' does not "
                                    "resolve (nor name a network interface)",
                                    addr, ep.host);
        else
            rc = ctl_error_transfer(err, CTL_CAUSE_TRANSPORT,
                                    "server: cannot bind %s: %s", addr,
                                    zmq_strerror(zmq_errno()));
        free_server(s);
        return rc;
    }
    size_t elen = sizeof s->endpoint;
    if (zmq_getsockopt(s->router, ZMQ_LAST_ENDPOINT, s->endpoint, &elen) != 0)
        snprintf(s->endpoint, sizeof s->endpoint, "%s", addr);
    if (s->zap)
        ctl_zap_set_endpoint(s->zap, s->endpoint);
    s->core.who = s->endpoint;
    s->core.describe_off = opts && opts->describe_off;

    s->blocking = s->own_ctx;
    if (s->blocking) {
        int check = DRAIN_CHECK_MS;
        zmq_setsockopt(s->router, ZMQ_RCVTIMEO, &check, sizeof check);
    }
    rc = ctl_thread_start(&s->monitor_thread, monitor_main, s);
    s->monitor_started = rc == 0;
    if (rc == 0)
        rc = ctl_thread_start(&s->thread, serve, s);
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

int ctl_server_set_allowlist(ctl_server *server, const char *const *keys, size_t count,
                             ctl_error *err)
{
    /* The unit's own secret key is told by its public key: the server keeps
     * no copy of the secret. */
    char pub[CTL_CURVE_KEY_BUF];
    ctl_error_clear(err); /* success leaves nothing behind */
    for (size_t i = 0; server->curve_public[0] && keys && i < count; i++)
        if (keys[i] && ctl_curve_key_valid(keys[i]) &&
            ctl_curve_public_of(keys[i], pub, NULL) == 0 &&
            strcmp(pub, server->curve_public) == 0)
            return ctl_error_set(err, CTL_INVALID,
                                 "server %s: allowed client key #%zu is the unit's own "
                                 "secret key: an allowlist holds client public keys (make "
                                 "a new key pair for the unit, this secret is exposed)",
                                 server->endpoint, i);
    return ctl_zap_set_keys(server->zap, keys, count, server->endpoint, err);
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
    out->conn_refused = atomic_load_explicit(&c->conn_refused, memory_order_relaxed);
    out->expired = atomic_load_explicit(&c->expired, memory_order_relaxed);
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
    if (server->hooked && server->hooks.on_closed)
        server->hooks.on_closed(server->hooks.arg);
}

void ctl_server_drain(ctl_server *server, int timeout_ms)
{
    if (!server || server->closed)
        return;
    if (server->hooked && server->hooks.on_drain)
        server->hooks.on_drain(server->hooks.arg);
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

/* ---- server_int.h ---------------------------------------------------- */

int ctl_server_set_hooks(ctl_server *server, const ctl_server_hooks *hooks)
{
    if (!server || server->closed || server->hooked)
        return -1;
    server->hooks = *hooks;
    server->hooked = 1;
    return 0;
}

void *ctl_server_hooks_arg(const ctl_server *server)
{
    return server && server->hooked ? server->hooks.arg : NULL;
}

const ctl_service *ctl_server_service(const ctl_server *server)
{
    return server->core.service;
}

const char *ctl_server_curve_public(const ctl_server *server)
{
    return server->curve_public;
}
