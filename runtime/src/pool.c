/*
 * pool.c - see pool_int.h for the contract.
 *
 * Addresses live in a chained hash table of fixed width (a control plane
 * talks to tens or hundreds of units, not millions); each entry holds its
 * idle connections as a stack and its counters. An address is validated
 * once, when its entry is created, so a call to a known unit does not
 * re-parse its endpoint. Entries live until the pool is destroyed, so a
 * connection may point at its entry.
 *
 * Retired connections sit in a ring ordered by retirement time. The
 * client's I/O thread runs the upkeep (ctl_pool_upkeep) a few times a
 * second, whether or not calls are made: pending messages on retired
 * connections are received and counted as late replies, retired
 * connections whose grace period is over are closed, the monitors of idle
 * connections are read, and idle connections are closed once they have
 * been idle for idle_timeout_ms or as soon as their unit has gone (their
 * connection dropped: a unit that restarts elsewhere leaves nothing
 * behind). The upkeep never blocks and is bounded by what the pool holds.
 *
 * Every DEALER gets a monitor at birth (before it connects, so no event is
 * missed): an inproc PAIR that receives its connection events. A call that
 * has waited a slice without a reply reads it (ctl_conn_check); the upkeep
 * reads those of idle connections.
 *
 * Address entries are bounded too: past max_addresses, the upkeep forgets
 * the least recently used entries that hold no connection (their counters
 * go with them).
 */
#include "pool_int.h"

#include <poll.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>

#include <zmq.h>

#include "ctlrpc/net.h"
#include "transport_int.h"
#include "util_int.h"

/* The address table starts with this many buckets and doubles whenever it
 * holds more entries than buckets, so that finding an address costs the
 * same with a thousand units as with ten. */
#define BUCKETS_MIN 64
#define IDLE_LINGER_MS 100
/* How long a dropped connection must stay without a reconnect before the
 * drop is taken as this side's doing: ZeroMQ schedules the reconnect of a
 * connection the peer closed within microseconds of reporting the drop. */
#define DROP_SETTLE_MS 50
/* A handshake broken off and not retried within this has been given up. */
#define BROKEN_SETTLE_MS 300
/* Failed attempts in a row that end a call (see docs/API.md). */
#define FAILS_TO_END 2
/* Reconnect back-off: ZeroMQ retries after 100 ms (ZMQ_RECONNECT_IVL),
 * doubling up to this, so a connection that keeps failing while its
 * socket idles makes a few monitor events a second at most. */
#define RECONNECT_IVL_MAX_MS 1000
/* An entry must have gone unused this long before it may be forgotten. */
#define FORGET_AFTER_MS 1000

#define MONITOR_EVENTS                                                        \
    (ZMQ_EVENT_CONNECT_DELAYED | ZMQ_EVENT_CONNECT_RETRIED |                  \
     ZMQ_EVENT_CLOSED | ZMQ_EVENT_DISCONNECTED |                              \
     ZMQ_EVENT_HANDSHAKE_SUCCEEDED | ZMQ_EVENT_HANDSHAKE_FAILED_NO_DETAIL |   \
     ZMQ_EVENT_HANDSHAKE_FAILED_PROTOCOL | ZMQ_EVENT_HANDSHAKE_FAILED_AUTH)

struct ctl_addr {
    struct ctl_addr *next;
    char *address;
    uint32_t hash;           /* hash(address) */
    ctl_conn **idle;
    unsigned n_idle, cap_idle;
    unsigned lent;           /* connections lent out now */
    unsigned peak;           /* most lent at once, less the idle closed since */
    int64_t used_ms;         /* last lend, or creation */
    _Atomic uint64_t calls;
    _Atomic uint64_t late_replies;
    _Atomic uint64_t sockets;
    _Atomic uint64_t retired;
    _Atomic uint64_t errors[CTL_CAUSE_COUNT];
    _Atomic uint64_t attempts;
    _Atomic uint64_t retries;
    _Atomic uint64_t retries_busy;
    _Atomic uint64_t retries_by_cause[CTL_CAUSE_COUNT];
    _Atomic uint64_t retries_throttled;
    _Atomic int64_t budget_spent; /* thousandths of a token below full */
    /* Whether its sockets need ZMQ_IPV6: -1 not known yet, else 0 or 1
     * (ctl_endpoint_needs_ipv6, worked out once, by the first dial). */
    _Atomic int ipv6;
};

typedef struct retired {
    ctl_conn *conn;
    int64_t close_at_ms;
} retired;

struct ctl_pool {
    void *ctx;
    ctl_pool_options opts;
    pthread_mutex_t mu;
    ctl_addr **buckets;  /* n_buckets chains, a power of two */
    size_t n_buckets;
    retired *ring; /* opts.max_retired slots */
    unsigned ring_head, ring_len;
    size_t n_entries;
    ctl_pool_counters counters;
    _Atomic int epfd;               /* the engine's epoll set, or -1 */
    ctl_conn *_Atomic graveyard;    /* closed, to be freed by the engine */
    struct pollfd *mon_fds;         /* the upkeep's poll of idle monitors */
    size_t mon_fds_cap;
};

static uint32_t hash(const char *s)
{
    uint32_t h = 2166136261u;
    for (; *s; s++)
        h = (h ^ (unsigned char)*s) * 16777619u;
    return h;
}

ctl_pool *ctl_pool_new(void *ctx, const ctl_pool_options *opts)
{
    ctl_pool *p = calloc(1, sizeof *p);
    if (!p)
        return NULL;
    p->ctx = ctx;
    p->opts = *opts;
    if (p->opts.max_retired == 0)
        p->opts.max_retired = 1;
    p->ring = calloc(p->opts.max_retired, sizeof *p->ring);
    p->buckets = calloc(BUCKETS_MIN, sizeof *p->buckets);
    if (!p->ring || !p->buckets) {
        free(p->ring);
        free(p->buckets);
        free(p);
        return NULL;
    }
    p->n_buckets = BUCKETS_MIN;
    pthread_mutex_init(&p->mu, NULL);
    atomic_init(&p->epfd, -1);
    atomic_init(&p->graveyard, NULL);
    return p;
}

static void close_conn(ctl_pool *p, ctl_conn *c, int linger_ms)
{
    if (c->mon) {
        /* Stop the monitor while its reader is still there: ZeroMQ sends
         * monitor events blocking, under the lock that stopping takes, so a
         * monitor left without a reader would hang its I/O thread. */
        zmq_socket_monitor(c->sock, NULL, 0);
        zmq_close(c->mon); /* linger 0: its queued events go with it */
    }
    ctl_pool_unwatch(p, c);
    zmq_setsockopt(c->sock, ZMQ_LINGER, &linger_ms, sizeof linger_ms);
    zmq_close(c->sock);
    atomic_fetch_sub_explicit(&c->addr->sockets, 1, memory_order_relaxed);
    atomic_fetch_add_explicit(&p->counters.sockets_closed, 1,
                              memory_order_relaxed);
    if (!c->watched_ever) {
        free(c);
        return;
    }
    /* The engine may hold an event for it from its last epoll_wait: it is
     * freed by the engine, between two waits (ctl_pool_reap). */
    c->grave_next = atomic_load_explicit(&p->graveyard, memory_order_relaxed);
    while (!atomic_compare_exchange_weak_explicit(&p->graveyard, &c->grave_next, c,
                                                  memory_order_release,
                                                  memory_order_relaxed))
        ;
}

void ctl_pool_set_epfd(ctl_pool *p, int epfd)
{
    atomic_store_explicit(&p->epfd, epfd, memory_order_release);
}

int ctl_pool_watch(ctl_pool *p, ctl_conn *c)
{
    if (c->watched)
        return 0;
    int epfd = atomic_load_explicit(&p->epfd, memory_order_acquire);
    struct epoll_event ev = {.events = EPOLLIN | EPOLLET, .data.ptr = c};
    if (epfd < 0 || c->fd < 0 || epoll_ctl(epfd, EPOLL_CTL_ADD, c->fd, &ev) != 0)
        return -1;
    c->watched = 1;
    c->watched_ever = 1;
    return 0;
}

void ctl_pool_unwatch(ctl_pool *p, ctl_conn *c)
{
    if (!c->watched)
        return;
    int epfd = atomic_load_explicit(&p->epfd, memory_order_acquire);
    if (epfd >= 0)
        epoll_ctl(epfd, EPOLL_CTL_DEL, c->fd, NULL);
    c->watched = 0;
}

void ctl_pool_reap(ctl_pool *p)
{
    ctl_conn *c = atomic_exchange_explicit(&p->graveyard, NULL, memory_order_acquire);
    while (c) {
        ctl_conn *next = c->grave_next;
        free(c);
        c = next;
    }
}

static void drain_monitor(ctl_conn *c);

static void count_late(ctl_pool *p, ctl_addr *a)
{
    atomic_fetch_add_explicit(&p->counters.late_replies, 1,
                              memory_order_relaxed);
    atomic_fetch_add_explicit(&a->late_replies, 1, memory_order_relaxed);
}

/* Drain every retired connection and close the expired ones (or all, when
 * `all`). Called with the mutex held. */
static void sweep(ctl_pool *p, int64_t now, int all)
{
    unsigned n = p->ring_len;
    for (unsigned i = 0; i < n; i++) {
        retired r = p->ring[p->ring_head];
        zmq_msg_t m;
        zmq_msg_init(&m);
        while (zmq_msg_recv(&m, r.conn->sock, ZMQ_DONTWAIT) >= 0) {
            if (!zmq_msg_more(&m))
                count_late(p, r.conn->addr);
        }
        zmq_msg_close(&m);
        p->ring_head = (p->ring_head + 1) % p->opts.max_retired;
        p->ring_len--;
        if (all || r.close_at_ms <= now) {
            close_conn(p, r.conn, 0);
        } else {
            /* Still in its grace period: back at the tail, same order. */
            p->ring[(p->ring_head + p->ring_len) % p->opts.max_retired] = r;
            p->ring_len++;
        }
    }
}

/* Whether an idle connection is to be closed now: idle too long, or its
 * unit has gone (the connection dropped, or attempts fail). */
static int idle_expired(ctl_pool *p, ctl_conn *c, int64_t now)
{
    if (c->mon_ready)
        drain_monitor(c);
    if (p->opts.idle_timeout_ms > 0 && now - c->idle_ms >= p->opts.idle_timeout_ms)
        return 1;
    return c->st.after_drop || c->st.fails > 0 || c->st.verdict_event;
}

static void unlink_entry(ctl_pool *p, ctl_addr *e);

/* Which idle connections' monitors have something to read (mon_ready):
 * one poll(2) over their descriptors, where a receive on each monitor
 * would cost a few system calls inside libzmq even when it finds nothing
 * (a client idling with a thousand pooled sockets spent milliseconds of
 * CPU a pass on that). A monitor's ZMQ_FD is readable while commands wait
 * for its socket. Every read of a monitor goes on until it finds nothing
 * (drain_monitor); after that, the next event makes the descriptor
 * readable. So a monitor whose descriptor is not readable has no event.
 * Without the poll (no memory for it, or it failed) every monitor is read.
 * Called with the mutex held. */
static void mark_monitors(ctl_pool *p)
{
    size_t n = 0;
    for (size_t b = 0; b < p->n_buckets; b++)
        for (ctl_addr *e = p->buckets[b]; e; e = e->next)
            for (unsigned i = 0; i < e->n_idle; i++) {
                e->idle[i]->mon_ready = 1;
                n += e->idle[i]->mon_fd >= 0;
            }
    if (n == 0)
        return;
    if (n > p->mon_fds_cap) {
        struct pollfd *grown = realloc(p->mon_fds, n * sizeof *grown);
        if (!grown)
            return;
        p->mon_fds = grown;
        p->mon_fds_cap = n;
    }
    size_t k = 0;
    for (size_t b = 0; b < p->n_buckets; b++)
        for (ctl_addr *e = p->buckets[b]; e; e = e->next)
            for (unsigned i = 0; i < e->n_idle; i++)
                if (e->idle[i]->mon_fd >= 0)
                    p->mon_fds[k++] = (struct pollfd){e->idle[i]->mon_fd, POLLIN, 0};
    if (poll(p->mon_fds, (nfds_t)n, 0) < 0)
        return;
    k = 0;
    for (size_t b = 0; b < p->n_buckets; b++)
        for (ctl_addr *e = p->buckets[b]; e; e = e->next)
            for (unsigned i = 0; i < e->n_idle; i++)
                if (e->idle[i]->mon_fd >= 0)
                    e->idle[i]->mon_ready = p->mon_fds[k++].revents != 0;
}

void ctl_pool_upkeep(ctl_pool *p, int64_t now)
{
    pthread_mutex_lock(&p->mu);
    sweep(p, now, 0);
    mark_monitors(p);
    ctl_addr *lru = NULL;
    size_t forgettable = 0;
    for (size_t b = 0; b < p->n_buckets; b++) {
        for (ctl_addr *e = p->buckets[b]; e; e = e->next) {
            unsigned keep = 0;
            for (unsigned i = 0; i < e->n_idle; i++) {
                ctl_conn *c = e->idle[i];
                if (idle_expired(p, c, now))
                    close_conn(p, c, 0);
                else
                    e->idle[keep++] = c;
            }
            e->n_idle = keep;
            e->peak = e->lent + e->n_idle;
            if (!e->n_idle && !e->lent &&
                !atomic_load_explicit(&e->sockets, memory_order_relaxed) &&
                now - e->used_ms >= FORGET_AFTER_MS) {
                forgettable++;
                if (!lru || e->used_ms < lru->used_ms)
                    lru = e;
            }
        }
    }
    /* Forget the least recently used entries beyond max_addresses, a few
     * per pass (the next passes take the rest). */
    for (int k = 0; k < 64 && lru && p->n_entries > p->opts.max_addresses; k++) {
        unlink_entry(p, lru);
        if (--forgettable == 0)
            break;
        lru = NULL;
        for (size_t b = 0; b < p->n_buckets; b++)
            for (ctl_addr *e = p->buckets[b]; e; e = e->next)
                if (!e->n_idle && !e->lent &&
                    !atomic_load_explicit(&e->sockets, memory_order_relaxed) &&
                    now - e->used_ms >= FORGET_AFTER_MS &&
                    (!lru || e->used_ms < lru->used_ms))
                    lru = e;
    }
    pthread_mutex_unlock(&p->mu);
}

static ctl_addr **bucket_of(ctl_pool *p, uint32_t h)
{
    return &p->buckets[h & (p->n_buckets - 1)];
}

static ctl_addr *find_entry(ctl_pool *p, const char *address, uint32_t h)
{
    for (ctl_addr *e = *bucket_of(p, h); e; e = e->next)
        if (e->hash == h && strcmp(e->address, address) == 0)
            return e;
    return NULL;
}

/* Double the buckets once there are more entries than buckets. Out of
 * memory the table stays as it is: chains grow longer, lookups stay
 * right. Called with the mutex held. */
static void grow_buckets(ctl_pool *p)
{
    if (p->n_entries <= p->n_buckets || p->n_buckets > SIZE_MAX / 2 / sizeof *p->buckets)
        return;
    size_t n = p->n_buckets * 2;
    ctl_addr **grown = calloc(n, sizeof *grown);
    if (!grown)
        return;
    for (size_t b = 0; b < p->n_buckets; b++) {
        ctl_addr *e = p->buckets[b];
        while (e) {
            ctl_addr *next = e->next;
            ctl_addr **at = &grown[e->hash & (n - 1)];
            e->next = *at;
            *at = e;
            e = next;
        }
    }
    free(p->buckets);
    p->buckets = grown;
    p->n_buckets = n;
}

/* Find or create the entry for `address`, validating it on creation.
 * Called with the mutex held. */
static ctl_addr *get_entry(ctl_pool *p, const char *address, ctl_error *err)
{
    uint32_t h = hash(address);
    ctl_addr *e = find_entry(p, address, h);
    if (e)
        return e;
    ctl_endpoint ep;
    if (ctl_endpoint_parse(address, &ep, err) != 0)
        return NULL;
    if (ep.any_port || strcmp(ep.host, "*") == 0) {
        ctl_error_set(err, CTL_INVALID,
                      "address '%s' is not dialable: it needs a host and a "
                      "port (a unit reports its real endpoint once bound)",
                      address);
        return NULL;
    }
    e = calloc(1, sizeof *e);
    if (e) {
        e->address = ctl_strndup(address, strlen(address));
        e->hash = h;
        e->cap_idle = p->opts.max_idle_per_address ? p->opts.max_idle_per_address : 1;
        e->idle = calloc(e->cap_idle, sizeof *e->idle);
        e->used_ms = ctl_now_ms();
        atomic_init(&e->ipv6, -1);
    }
    if (!e || !e->address || !e->idle) {
        if (e) {
            free(e->address);
            free(e->idle);
        }
        free(e);
        ctl_error_transfer(err, CTL_CAUSE_NOMEM, "address %s: out of memory",
                           address);
        return NULL;
    }
    ctl_addr **at = bucket_of(p, h);
    e->next = *at;
    *at = e;
    p->n_entries++;
    grow_buckets(p);
    return e;
}

/* Remove `e` (no connection refers to it) and free it. Mutex held. */
static void unlink_entry(ctl_pool *p, ctl_addr *e)
{
    ctl_addr **at = bucket_of(p, e->hash);
    while (*at && *at != e)
        at = &(*at)->next;
    if (*at)
        *at = e->next;
    p->n_entries--;
    free(e->idle);
    free(e->address);
    free(e);
}

ctl_addr *ctl_pool_addr(ctl_pool *p, const char *address, ctl_error *err)
{
    pthread_mutex_lock(&p->mu);
    ctl_addr *e = get_entry(p, address, err);
    pthread_mutex_unlock(&p->mu);
    return e;
}

/* Give `s` a monitor, before it connects: an inproc PAIR that receives its
 * connection events. Returns the PAIR or NULL (zmq_errno() says why). */
static void *watch(ctl_pool *p, void *s)
{
    char ep[96];
    ctl_inproc_name(ep, sizeof ep, "client-monitor");
    if (zmq_socket_monitor(s, ep, MONITOR_EVENTS) != 0)
        return NULL;
    void *mon = zmq_socket(p->ctx, ZMQ_PAIR);
    int zero = 0;
    /* No high-water mark on the reader: ZeroMQ sends monitor events
     * blocking, so a full pipe would stall the I/O thread. What piles up
     * is bounded by the reconnect back-off (RECONNECT_IVL_MAX) and drained
     * by calls and by the upkeep (ctl_pool_upkeep). */
    if (mon && (zmq_setsockopt(mon, ZMQ_LINGER, &zero, sizeof zero) != 0 ||
                zmq_setsockopt(mon, ZMQ_RCVHWM, &zero, sizeof zero) != 0 ||
                zmq_connect(mon, ep) != 0)) {
        zmq_close(mon);
        mon = NULL;
    }
    if (!mon)
        zmq_socket_monitor(s, NULL, 0);
    return mon;
}

static ctl_conn *dial(ctl_pool *p, ctl_addr *a, ctl_error *err)
{
    const char *address = a->address;
    ctl_conn *c = calloc(1, sizeof *c);
    if (!c) {
        ctl_error_transfer(err, CTL_CAUSE_NOMEM, "%s: out of memory", address);
        return NULL;
    }
    c->addr = a;
    void *s = zmq_socket(p->ctx, ZMQ_DEALER);
    if (!s) {
        ctl_error_transfer(err, CTL_CAUSE_TRANSPORT,
                           "%s: cannot create a socket: %s", address,
                           zmq_strerror(zmq_errno()));
        free(c);
        return NULL;
    }
    int zero = 0, one = 1, ivl_max = RECONNECT_IVL_MAX_MS;
    int64_t maxmsg = (int64_t)p->opts.max_msg_bytes;
    zmq_setsockopt(s, ZMQ_LINGER, &zero, sizeof zero);
    /* IPv6 only where the endpoint needs it (a bracketed address, or a
     * name with IPv6 addresses only): with ZMQ_IPV6 on, libzmq dials the
     * first address a name resolves to, and `localhost` may resolve to ::1
     * first while the unit listens on 127.0.0.1. A name is looked up once
     * per address entry, on the first dial. */
    int v6 = atomic_load_explicit(&a->ipv6, memory_order_relaxed);
    if (v6 < 0) {
        ctl_endpoint ep;
        v6 = ctl_endpoint_parse(address, &ep, NULL) == 0 && ctl_endpoint_needs_ipv6(&ep);
        atomic_store_explicit(&a->ipv6, v6, memory_order_relaxed);
    }
    if (v6)
        zmq_setsockopt(s, ZMQ_IPV6, &one, sizeof one);
    /* Nothing is queued before a connection is up: a request that found
     * no connection was never sent, and can never reach a handler later
     * (a unit that comes up after the call was reported refused). */
    zmq_setsockopt(s, ZMQ_IMMEDIATE, &one, sizeof one);
    zmq_setsockopt(s, ZMQ_MAXMSGSIZE, &maxmsg, sizeof maxmsg);
    zmq_setsockopt(s, ZMQ_RECONNECT_IVL_MAX, &ivl_max, sizeof ivl_max);
    if (p->opts.curve_server[0] &&
        (zmq_setsockopt(s, ZMQ_CURVE_SERVERKEY, p->opts.curve_server, 40) != 0 ||
         zmq_setsockopt(s, ZMQ_CURVE_PUBLICKEY, p->opts.curve_public, 40) != 0 ||
         zmq_setsockopt(s, ZMQ_CURVE_SECRETKEY, p->opts.curve_secret, 40) != 0)) {
        ctl_error_transfer(err, CTL_CAUSE_TRANSPORT,
                           "%s: cannot set CURVE keys: %s", address,
                           zmq_strerror(zmq_errno()));
        zmq_close(s);
        free(c);
        return NULL;
    }
    c->mon = watch(p, s);
    if (!c->mon) {
        ctl_error_transfer(err, CTL_CAUSE_TRANSPORT,
                           "%s: cannot watch the connection (a socket "
                           "monitor): %s", address, zmq_strerror(zmq_errno()));
        zmq_close(s);
        free(c);
        return NULL;
    }
    size_t mon_fd_len = sizeof c->mon_fd;
    if (zmq_getsockopt(c->mon, ZMQ_FD, &c->mon_fd, &mon_fd_len) != 0)
        c->mon_fd = -1;
    c->mon_ready = 1;
    /* A pipe's reader starts awake: until a read finds it empty, events
     * written to it do not signal the monitor's ZMQ_FD (mark_monitors). */
    drain_monitor(c);
    if (zmq_connect(s, address) != 0) {
        ctl_error_transfer(err, CTL_CAUSE_TRANSPORT, "%s: cannot connect: %s",
                           address, zmq_strerror(zmq_errno()));
        zmq_close(c->mon);
        zmq_socket_monitor(s, NULL, 0);
        zmq_close(s);
        free(c);
        return NULL;
    }
    c->sock = s;
    size_t fdlen = sizeof c->fd;
    if (zmq_getsockopt(s, ZMQ_FD, &c->fd, &fdlen) != 0)
        c->fd = -1;
    atomic_fetch_add_explicit(&a->sockets, 1, memory_order_relaxed);
    atomic_fetch_add_explicit(&p->counters.sockets_opened, 1,
                              memory_order_relaxed);
    return c;
}

/* How lend() may get a connection. */
enum lend_how {
    LEND_ANY,   /* an idle one, else dial */
    LEND_FRESH, /* dial, never an idle one */
    LEND_IDLE   /* an idle one, or none (never dial) */
};

/* The lending of lend() under the pool's lock: an idle connection, or
 * NULL (and *entry the address's entry, or NULL with `err` set). With
 * LEND_IDLE, an address with none idle (or a bad one) is left untouched. */
static ctl_conn *lend_locked(ctl_pool *p, const char *address, enum lend_how how,
                             ctl_addr **entry, ctl_error *err)
{
    ctl_conn *conn = NULL;
    ctl_addr *e = get_entry(p, address, err);
    if (e && e->n_idle && how != LEND_FRESH)
        conn = e->idle[--e->n_idle];
    if (e && (conn || how != LEND_IDLE)) {
        if (++e->lent > e->peak)
            e->peak = e->lent;
        e->used_ms = ctl_now_ms();
    }
    *entry = e;
    return conn;
}

static ctl_conn *lend(ctl_pool *p, const char *address, enum lend_how how,
                      ctl_error *err)
{
    ctl_addr *e;
    pthread_mutex_lock(&p->mu);
    ctl_conn *conn = lend_locked(p, address, how, &e, err);
    pthread_mutex_unlock(&p->mu);
    if (!e || conn)
        return conn;
    /* Dialing needs no lock: the new socket is not in the pool yet. */
    conn = dial(p, e, err);
    if (!conn) {
        pthread_mutex_lock(&p->mu);
        e->lent--;
        pthread_mutex_unlock(&p->mu);
    }
    return conn;
}

ctl_conn *ctl_pool_lend(ctl_pool *p, const char *address, ctl_error *err)
{
    return lend(p, address, LEND_ANY, err);
}

ctl_conn *ctl_pool_lend_fresh(ctl_pool *p, const char *address, ctl_error *err)
{
    return lend(p, address, LEND_FRESH, err);
}

void ctl_pool_lock(ctl_pool *p)
{
    pthread_mutex_lock(&p->mu);
}

ctl_conn *ctl_pool_lend_idle_locked(ctl_pool *p, const char *address)
{
    ctl_addr *e;
    return lend_locked(p, address, LEND_IDLE, &e, NULL);
}

void ctl_pool_unlock(ctl_pool *p)
{
    pthread_mutex_unlock(&p->mu);
}

void ctl_pool_return(ctl_pool *p, ctl_conn *conn)
{
    ctl_addr *e = conn->addr;
    pthread_mutex_lock(&p->mu);
    e->lent--;
    /* Keep up to max_idle_per_address, or as many as the address had lent
     * at once (a burst of calls to one unit wants them back at once; the
     * upkeep closes them when the bursts stop, after idle_timeout_ms). */
    int keep = e->n_idle < p->opts.max_idle_per_address || e->n_idle + e->lent < e->peak;
    if (keep && e->n_idle >= e->cap_idle) {
        unsigned cap = e->cap_idle * 2;
        ctl_conn **idle = realloc(e->idle, cap * sizeof *idle);
        if (idle) {
            e->idle = idle;
            e->cap_idle = cap;
        }
    }
    if (keep && e->n_idle < e->cap_idle) {
        conn->idle_ms = ctl_now_ms();
        conn->reused = 1;
        e->idle[e->n_idle++] = conn;
        conn = NULL;
    }
    pthread_mutex_unlock(&p->mu);
    if (conn)
        close_conn(p, conn, IDLE_LINGER_MS);
}

void ctl_pool_retire(ctl_pool *p, ctl_conn *conn)
{
    atomic_fetch_add_explicit(&p->counters.sockets_retired, 1,
                              memory_order_relaxed);
    atomic_fetch_add_explicit(&conn->addr->retired, 1, memory_order_relaxed);
    pthread_mutex_lock(&p->mu);
    conn->addr->lent--;
    if (p->opts.late_grace_ms <= 0) {
        pthread_mutex_unlock(&p->mu);
        close_conn(p, conn, 0);
        return;
    }
    if (p->ring_len == p->opts.max_retired) {
        /* Full: the oldest leaves early. */
        retired old = p->ring[p->ring_head];
        p->ring_head = (p->ring_head + 1) % p->opts.max_retired;
        p->ring_len--;
        close_conn(p, old.conn, 0);
    }
    retired r = {conn, ctl_now_ms() + p->opts.late_grace_ms};
    p->ring[(p->ring_head + p->ring_len) % p->opts.max_retired] = r;
    p->ring_len++;
    pthread_mutex_unlock(&p->mu);
}

/* ---- what the monitor says ------------------------------------------- */

/* Fold one monitor event into the state. ZeroMQ's sequences (libzmq 4.3):
 *   refused:     CONNECT_DELAYED, CLOSED, CONNECT_RETRIED (every ~100 ms)
 *   unresolved:  CONNECT_RETRIED alone (no TCP socket was ever opened)
 *   handshake broken off by the peer (CURVE, wrong server key):
 *                CONNECTED, HANDSHAKE_FAILED_NO_DETAIL, DISCONNECTED,
 *                CONNECT_RETRIED
 *   refused by ZAP / mechanism mismatch: HANDSHAKE_FAILED_AUTH (value: the
 *                ZAP status) or _PROTOCOL (value: ZMQ_PROTOCOL_ERROR_*),
 *                DISCONNECTED, and no reconnect
 *   up:          CONNECTED, HANDSHAKE_SUCCEEDED
 *   closed by the peer: DISCONNECTED, CONNECT_RETRIED at once (reconnect)
 *   closed by this side (a message over ZMQ_MAXMSGSIZE, bad framing):
 *                DISCONNECTED, and no reconnect */
static void fold(ctl_conn_state *st, unsigned ev, uint32_t value)
{
    switch (ev) {
    case ZMQ_EVENT_CONNECT_DELAYED:
        st->closed = 0;
        break;
    case ZMQ_EVENT_CLOSED:
        st->closed = 1;
        break;
    case ZMQ_EVENT_CONNECT_RETRIED:
        if (st->after_drop) {
            /* The reconnect after a drop by the peer: not a failure. */
            st->after_drop = 0;
            st->dropped_at = 0;
        } else {
            st->fails++;
            st->fail = st->hs_no_detail || st->broken ? CTL_CONN_HANDSHAKE
                       : st->closed                   ? CTL_CONN_REFUSED
                                                      : CTL_CONN_UNRESOLVED;
        }
        st->closed = st->hs_no_detail = st->broken = 0;
        st->broken_at = 0;
        break;
    case ZMQ_EVENT_HANDSHAKE_SUCCEEDED:
        st->fails = 0;
        st->up = 1;
        st->verdict_event = 0;
        break;
    case ZMQ_EVENT_HANDSHAKE_FAILED_NO_DETAIL:
        st->hs_no_detail = 1;
        break;
    case ZMQ_EVENT_HANDSHAKE_FAILED_PROTOCOL:
    case ZMQ_EVENT_HANDSHAKE_FAILED_AUTH:
        st->verdict_event = (int)ev;
        st->verdict_value = value;
        break;
    case ZMQ_EVENT_DISCONNECTED:
        if (st->up) {
            st->up = 0;
            st->lost = 1;
            st->after_drop = 1;
            st->dropped_at = 0;
        } else {
            /* Connected, then closed before the handshake completed: the
             * peer broke it off, whether or not a handshake event said so
             * (under load the order of events varies). */
            st->broken = 1;
            st->broken_at = 0;
        }
        break;
    default:
        break;
    }
}

/* Fold every event that has arrived on c's monitor into its state. */
static void drain_monitor(ctl_conn *conn)
{
    if (!conn->mon)
        return;
    for (;;) {
        zmq_msg_t frame;
        /* [event u16 + value u32, endpoint] */
        int n = ctl_recv_message(conn->mon, &frame, 1, ZMQ_DONTWAIT, NULL);
        if (n < 0)
            break;
        if (zmq_msg_size(&frame) >= 6) {
            const unsigned char *d = zmq_msg_data(&frame);
            uint16_t ev;
            uint32_t value;
            memcpy(&ev, d, sizeof ev);
            memcpy(&value, d + 2, sizeof value);
            fold(&conn->st, ev, value);
        }
        zmq_msg_close(&frame);
    }
}

ctl_conn_verdict ctl_conn_check(ctl_conn *conn, int64_t now_ms)
{
    ctl_conn_state *st = &conn->st;
    if (!conn->mon)
        return CTL_CONN_OK;
    drain_monitor(conn);
    if (st->verdict_event == ZMQ_EVENT_HANDSHAKE_FAILED_AUTH)
        return CTL_CONN_DENIED;
    if (st->verdict_event == ZMQ_EVENT_HANDSHAKE_FAILED_PROTOCOL)
        return st->verdict_value == ZMQ_PROTOCOL_ERROR_ZMTP_MECHANISM_MISMATCH
                   ? CTL_CONN_MECHANISM
               : st->verdict_value == ZMQ_PROTOCOL_ERROR_ZMTP_CRYPTOGRAPHIC
                   ? CTL_CONN_HANDSHAKE
                   : CTL_CONN_PROTOCOL;
    if (st->fails >= FAILS_TO_END)
        return (ctl_conn_verdict)st->fail;
    if (st->broken) {
        /* No reconnect after a broken handshake: libzmq has given up on
         * the peer, and no reply can come. */
        if (!st->broken_at)
            st->broken_at = now_ms;
        else if (now_ms - st->broken_at >= BROKEN_SETTLE_MS)
            return CTL_CONN_HANDSHAKE;
    }
    if (st->after_drop) {
        if (!st->dropped_at)
            st->dropped_at = now_ms;
        else if (now_ms - st->dropped_at >= DROP_SETTLE_MS)
            return CTL_CONN_DROPPED;
    }
    if (st->lost && st->up)
        return CTL_CONN_LOST;
    return CTL_CONN_OK;
}

int ctl_pool_curve(const ctl_pool *p)
{
    return p->opts.curve_server[0] != '\0';
}

/* ---- counters ---------------------------------------------------------- */

void ctl_pool_count_late(ctl_pool *p, ctl_addr *a)
{
    count_late(p, a);
}

void ctl_pool_count_call(ctl_addr *a)
{
    atomic_fetch_add_explicit(&a->calls, 1, memory_order_relaxed);
}

void ctl_pool_count_error(ctl_addr *a, ctl_cause cause)
{
    if ((unsigned)cause < CTL_CAUSE_COUNT)
        atomic_fetch_add_explicit(&a->errors[cause], 1, memory_order_relaxed);
}

void ctl_pool_count_attempt(ctl_addr *a)
{
    atomic_fetch_add_explicit(&a->attempts, 1, memory_order_relaxed);
}

void ctl_pool_count_retry(ctl_addr *a, int busy, ctl_cause cause)
{
    atomic_fetch_add_explicit(&a->retries, 1, memory_order_relaxed);
    if (busy)
        atomic_fetch_add_explicit(&a->retries_busy, 1, memory_order_relaxed);
    else if (cause != CTL_CAUSE_NONE && (unsigned)cause < CTL_CAUSE_COUNT)
        atomic_fetch_add_explicit(&a->retries_by_cause[cause], 1,
                                  memory_order_relaxed);
}

void ctl_pool_count_throttled(ctl_addr *a)
{
    atomic_fetch_add_explicit(&a->retries_throttled, 1, memory_order_relaxed);
}

void ctl_pool_budget_fail(ctl_addr *a, int64_t cap)
{
    int64_t v = atomic_load_explicit(&a->budget_spent, memory_order_relaxed);
    int64_t next;
    do
        next = v + 1000 > cap ? cap : v + 1000;
    while (!atomic_compare_exchange_weak_explicit(&a->budget_spent, &v, next,
                                                  memory_order_relaxed,
                                                  memory_order_relaxed));
}

void ctl_pool_budget_success(ctl_addr *a, int64_t give)
{
    /* A full budget (the common case) costs one load. */
    int64_t v = atomic_load_explicit(&a->budget_spent, memory_order_relaxed);
    while (v > 0 &&
           !atomic_compare_exchange_weak_explicit(&a->budget_spent, &v,
                                                  v > give ? v - give : 0,
                                                  memory_order_relaxed,
                                                  memory_order_relaxed))
        ;
}

int ctl_pool_budget_allows(ctl_addr *a, int64_t cap)
{
    /* tokens > budget / 2, with tokens = cap - spent */
    return 2 * atomic_load_explicit(&a->budget_spent, memory_order_relaxed) < cap;
}

void ctl_pool_address_stats(ctl_pool *p, const char *address,
                            ctl_address_stats *out)
{
    memset(out, 0, sizeof *out);
    if (!address)
        return;
    pthread_mutex_lock(&p->mu);
    ctl_addr *a = find_entry(p, address, hash(address));
    pthread_mutex_unlock(&p->mu);
    if (!a)
        return;
    out->calls = atomic_load_explicit(&a->calls, memory_order_relaxed);
    out->late_replies =
        atomic_load_explicit(&a->late_replies, memory_order_relaxed);
    out->sockets = atomic_load_explicit(&a->sockets, memory_order_relaxed);
    out->retired = atomic_load_explicit(&a->retired, memory_order_relaxed);
    for (unsigned i = 0; i < CTL_CAUSE_COUNT; i++)
        out->errors[i] =
            atomic_load_explicit(&a->errors[i], memory_order_relaxed);
    out->timeouts = out->errors[CTL_CAUSE_TIMEOUT];
    out->attempts = atomic_load_explicit(&a->attempts, memory_order_relaxed);
    out->retries = atomic_load_explicit(&a->retries, memory_order_relaxed);
    out->retries_busy =
        atomic_load_explicit(&a->retries_busy, memory_order_relaxed);
    for (unsigned i = 0; i < CTL_CAUSE_COUNT; i++)
        out->retries_by_cause[i] =
            atomic_load_explicit(&a->retries_by_cause[i], memory_order_relaxed);
    out->retries_throttled =
        atomic_load_explicit(&a->retries_throttled, memory_order_relaxed);
}

size_t ctl_pool_addresses(ctl_pool *p, const char **out, size_t max)
{
    size_t n = 0;
    pthread_mutex_lock(&p->mu);
    for (size_t b = 0; b < p->n_buckets; b++)
        for (ctl_addr *e = p->buckets[b]; e; e = e->next, n++)
            if (out && n < max)
                out[n] = e->address;
    pthread_mutex_unlock(&p->mu);
    return n;
}

int ctl_pool_idle_failing(ctl_pool *p, const char *address)
{
    int failing = 0;
    pthread_mutex_lock(&p->mu);
    ctl_addr *a = find_entry(p, address, hash(address));
    for (unsigned i = 0; a && i < a->n_idle; i++) {
        drain_monitor(a->idle[i]);
        failing |= a->idle[i]->st.fails > 0;
    }
    pthread_mutex_unlock(&p->mu);
    return failing;
}

const ctl_pool_counters *ctl_pool_counters_get(const ctl_pool *p)
{
    return &p->counters;
}

void ctl_pool_destroy(ctl_pool **pool)
{
    if (!pool || !*pool)
        return;
    ctl_pool *p = *pool;
    memset(p->opts.curve_secret, 0, sizeof p->opts.curve_secret);
    sweep(p, ctl_now_ms(), 1);
    for (size_t b = 0; b < p->n_buckets; b++) {
        ctl_addr *e = p->buckets[b];
        while (e) {
            ctl_addr *next = e->next;
            for (unsigned i = 0; i < e->n_idle; i++)
                close_conn(p, e->idle[i], IDLE_LINGER_MS);
            free(e->idle);
            free(e->address);
            free(e);
            e = next;
        }
    }
    ctl_pool_reap(p); /* the engine has stopped */
    pthread_mutex_destroy(&p->mu);
    free(p->ring);
    free(p->buckets);
    free(p->mon_fds);
    free(p);
    *pool = NULL;
}
