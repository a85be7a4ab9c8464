/*
 * pool_int.h - the per-address DEALER socket pool (internal).
 *
 * The pool is the only state a client shares between threads, and one mutex
 * guards all of it. A socket is always in exactly one place: lent to one
 * call, idle under its address, or retired. Lending hands out the most
 * recently returned idle socket (LIFO: warm connections, and a notify
 * followed by a call from one thread travel on one connection), or dials a
 * new one. A socket comes back with ctl_pool_return only when its last
 * request got its complete, matching reply; every other ending goes through
 * ctl_pool_retire, which parks the socket for `late_grace_ms` so anything
 * still arriving on it is drained and counted as a late reply, then closes
 * it. Retired sockets are never lent again, which is what keeps a late
 * reply from reaching a later call.
 */
#ifndef CTLRPC_POOL_INT_H
#define CTLRPC_POOL_INT_H

#include <stdatomic.h>
#include <stdint.h>

#include "ctlrpc/client.h"
#include "ctlrpc/error.h"

typedef struct ctl_pool ctl_pool;

typedef struct ctl_pool_options {
    unsigned max_idle_per_address;
    unsigned max_retired;
    int late_grace_ms;
    size_t max_msg_bytes; /* ZMQ_MAXMSGSIZE on every socket */
    /* CURVE keys (Z85, NUL-terminated) or empty strings for none. */
    char curve_server[41];
    char curve_public[41];
    char curve_secret[41];
} ctl_pool_options;

/* Counters kept by the pool (see ctl_client_stats). */
typedef struct ctl_pool_counters {
    _Atomic uint64_t late_replies;
    _Atomic uint64_t sockets_opened;
    _Atomic uint64_t sockets_retired;
    _Atomic uint64_t sockets_closed;
} ctl_pool_counters;

/* A pool over ZeroMQ context `ctx` (borrowed). NULL when out of memory. */
ctl_pool *ctl_pool_new(void *ctx, const ctl_pool_options *opts);

/* Close every socket (idle ones with a short linger) and free the pool. */
void ctl_pool_destroy(ctl_pool **pool);

/* Lend a DEALER socket connected to `address`. Returns NULL with `err` set
 * (CTL_INVALID for a bad address, CTL_TRANSFER otherwise). */
void *ctl_pool_lend(ctl_pool *pool, const char *address, ctl_error *err);

/* Give back a socket whose last request completed cleanly. */
void ctl_pool_return(ctl_pool *pool, const char *address, void *sock);

/* Take a socket out of use for good (after a timeout, a mismatched reply, a
 * failure). */
void ctl_pool_retire(ctl_pool *pool, void *sock);

/* Count one late or mismatched reply seen by a call. */
void ctl_pool_count_late(ctl_pool *pool);

const ctl_pool_counters *ctl_pool_counters_get(const ctl_pool *pool);

#endif /* CTLRPC_POOL_INT_H */
