/*
 * pool.c - see pool_int.h for the contract.
 *
 * Addresses live in a chained hash table of fixed width (a control plane
 * talks to tens or hundreds of units, not millions); each entry holds its
 * idle sockets as a stack. An address is validated once, when its entry is
 * created, so a call to a known unit does not re-parse its endpoint.
 *
 * Retired sockets sit in a ring ordered by retirement time. Every lend and
 * return first sweeps it: pending messages are received and counted as late
 * replies, and sockets whose grace period is over are closed. The sweep is
 * non-blocking and bounded by max_retired.
 */
#include "pool_int.h"

#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include <zmq.h>

#include "ctlrpc/net.h"
#include "util_int.h"

#define BUCKETS 256
#define IDLE_LINGER_MS 100

typedef struct entry {
    struct entry *next;
    char *address;
    void **idle;
    unsigned n_idle;
} entry;

typedef struct retired {
    void *sock;
    int64_t close_at_ms;
} retired;

struct ctl_pool {
    void *ctx;
    ctl_pool_options opts;
    pthread_mutex_t mu;
    entry *buckets[BUCKETS];
    retired *ring; /* opts.max_retired slots */
    unsigned ring_head, ring_len;
    ctl_pool_counters counters;
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
    if (!p->ring) {
        free(p);
        return NULL;
    }
    pthread_mutex_init(&p->mu, NULL);
    return p;
}

static void close_socket(ctl_pool *p, void *sock, int linger_ms)
{
    zmq_setsockopt(sock, ZMQ_LINGER, &linger_ms, sizeof linger_ms);
    zmq_close(sock);
    atomic_fetch_add_explicit(&p->counters.sockets_closed, 1,
                              memory_order_relaxed);
}

/* Drain every retired socket and close the expired ones (or all, when
 * `all`). Called with the mutex held. */
static void sweep(ctl_pool *p, int all)
{
    int64_t now = p->ring_len ? ctl_now_ms() : 0;
    unsigned n = p->ring_len;
    for (unsigned i = 0; i < n; i++) {
        retired r = p->ring[p->ring_head];
        zmq_msg_t m;
        zmq_msg_init(&m);
        while (zmq_msg_recv(&m, r.sock, ZMQ_DONTWAIT) >= 0) {
            if (!zmq_msg_more(&m))
                atomic_fetch_add_explicit(&p->counters.late_replies, 1,
                                          memory_order_relaxed);
        }
        zmq_msg_close(&m);
        p->ring_head = (p->ring_head + 1) % p->opts.max_retired;
        p->ring_len--;
        if (all || r.close_at_ms <= now) {
            close_socket(p, r.sock, 0);
        } else {
            /* Still in its grace period: back at the tail, same order. */
            p->ring[(p->ring_head + p->ring_len) % p->opts.max_retired] = r;
            p->ring_len++;
        }
    }
}

static entry *find_entry(ctl_pool *p, const char *address, uint32_t h)
{
    for (entry *e = p->buckets[h % BUCKETS]; e; e = e->next)
        if (strcmp(e->address, address) == 0)
            return e;
    return NULL;
}

/* Find or create the entry for `address`, validating it on creation. */
static entry *get_entry(ctl_pool *p, const char *address, ctl_error *err)
{
    uint32_t h = hash(address);
    entry *e = find_entry(p, address, h);
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
        e->idle = calloc(p->opts.max_idle_per_address ? p->opts.max_idle_per_address : 1,
                         sizeof *e->idle);
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
    e->next = p->buckets[h % BUCKETS];
    p->buckets[h % BUCKETS] = e;
    return e;
}

static void *dial(ctl_pool *p, const char *address, ctl_error *err)
{
    void *s = zmq_socket(p->ctx, ZMQ_DEALER);
    if (!s) {
        ctl_error_transfer(err, CTL_CAUSE_TRANSPORT,
                           "%s: cannot create a socket: %s", address,
                           zmq_strerror(zmq_errno()));
        return NULL;
    }
    int zero = 0;
    int64_t maxmsg = (int64_t)p->opts.max_msg_bytes;
    zmq_setsockopt(s, ZMQ_LINGER, &zero, sizeof zero);
    zmq_setsockopt(s, ZMQ_MAXMSGSIZE, &maxmsg, sizeof maxmsg);
    if (p->opts.curve_server[0] &&
        (zmq_setsockopt(s, ZMQ_CURVE_SERVERKEY, p->opts.curve_server, 40) != 0 ||
         zmq_setsockopt(s, ZMQ_CURVE_PUBLICKEY, p->opts.curve_public, 40) != 0 ||
         zmq_setsockopt(s, ZMQ_CURVE_SECRETKEY, p->opts.curve_secret, 40) != 0)) {
        ctl_error_transfer(err, CTL_CAUSE_TRANSPORT,
                           "%s: cannot set CURVE keys: %s", address,
                           zmq_strerror(zmq_errno()));
        zmq_close(s);
        return NULL;
    }
    if (zmq_connect(s, address) != 0) {
        ctl_error_transfer(err, CTL_CAUSE_TRANSPORT, "%s: cannot connect: %s",
                           address, zmq_strerror(zmq_errno()));
        zmq_close(s);
        return NULL;
    }
    atomic_fetch_add_explicit(&p->counters.sockets_opened, 1,
                              memory_order_relaxed);
    return s;
}

void *ctl_pool_lend(ctl_pool *p, const char *address, ctl_error *err)
{
    void *sock = NULL;
    pthread_mutex_lock(&p->mu);
    sweep(p, 0);
    entry *e = get_entry(p, address, err);
    if (e && e->n_idle)
        sock = e->idle[--e->n_idle];
    pthread_mutex_unlock(&p->mu);
    if (!e)
        return NULL;
    /* Dialing needs no lock: the new socket is not in the pool yet. */
    return sock ? sock : dial(p, address, err);
}

void ctl_pool_return(ctl_pool *p, const char *address, void *sock)
{
    pthread_mutex_lock(&p->mu);
    sweep(p, 0);
    entry *e = find_entry(p, address, hash(address));
    if (e && e->n_idle < p->opts.max_idle_per_address) {
        e->idle[e->n_idle++] = sock;
        sock = NULL;
    }
    pthread_mutex_unlock(&p->mu);
    if (sock)
        close_socket(p, sock, IDLE_LINGER_MS);
}

void ctl_pool_retire(ctl_pool *p, void *sock)
{
    atomic_fetch_add_explicit(&p->counters.sockets_retired, 1,
                              memory_order_relaxed);
    if (p->opts.late_grace_ms <= 0) {
        close_socket(p, sock, 0);
        return;
    }
    pthread_mutex_lock(&p->mu);
    if (p->ring_len == p->opts.max_retired) {
        /* Full: the oldest leaves early. */
        retired old = p->ring[p->ring_head];
        p->ring_head = (p->ring_head + 1) % p->opts.max_retired;
        p->ring_len--;
        close_socket(p, old.sock, 0);
    }
    retired r = {sock, ctl_now_ms() + p->opts.late_grace_ms};
    p->ring[(p->ring_head + p->ring_len) % p->opts.max_retired] = r;
    p->ring_len++;
    pthread_mutex_unlock(&p->mu);
}

void ctl_pool_count_late(ctl_pool *p)
{
    atomic_fetch_add_explicit(&p->counters.late_replies, 1,
                              memory_order_relaxed);
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
    sweep(p, 1);
    for (unsigned b = 0; b < BUCKETS; b++) {
        entry *e = p->buckets[b];
        while (e) {
            entry *next = e->next;
            for (unsigned i = 0; i < e->n_idle; i++)
                close_socket(p, e->idle[i], IDLE_LINGER_MS);
            free(e->idle);
            free(e->address);
            free(e);
            e = next;
        }
    }
    pthread_mutex_destroy(&p->mu);
    free(p->ring);
    free(p);
    *pool = NULL;
}
