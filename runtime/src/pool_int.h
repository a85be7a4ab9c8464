/*
 * pool_int.h - the per-address DEALER socket pool (internal).
 *
 * The pool is the only state a client shares between threads, and one mutex
 * guards all of it. A connection (ctl_conn: a DEALER socket and the monitor
 * that reports what happens to its connection) is always in exactly one
 * place: lent to one call, idle under its address, or retired. Lending
 * hands out the most recently returned idle connection (LIFO: warm
 * connections, and a notify followed by a call from one thread travel on one
 * connection), or dials a new one. A connection comes back with
 * ctl_pool_return only when its last request got its complete, matching
 * reply; every other ending goes through ctl_pool_retire, which parks it for
 * `late_grace_ms` so anything still arriving on it is drained and counted as
 * a late reply, then closes it. Retired connections are never lent again,
 * which is what keeps a late reply from reaching a later call.
 *
 * Each address has an entry (ctl_addr) that holds the address's own
 * counters (ctl_address_stats); it lives while a connection or a request
 * refers to it, and is forgotten by the upkeep only when it has none and
 * the pool holds more than max_addresses entries.
 *
 * Connection failures. ZeroMQ connects in the background and retries for
 * ever; it reports each step on the socket's monitor (an inproc PAIR per
 * connection). A call that has waited a while reads those events with
 * ctl_conn_check, which says whether the connection cannot carry the call:
 * refused, a host that does not resolve, a failed handshake, or a
 * connection this side dropped (a reply over the size limit). The rules,
 * and why they wait for a second failed attempt, are in docs/API.md
 * ("Failures that end a call early").
 */
#ifndef CTLRPC_POOL_INT_H
#define CTLRPC_POOL_INT_H

#include <stdatomic.h>
#include <stdint.h>

#include "ctlrpc/client.h"
#include "ctlrpc/error.h"

typedef struct ctl_pool ctl_pool;
typedef struct ctl_addr ctl_addr;

typedef struct ctl_pool_options {
    unsigned max_idle_per_address;
    unsigned max_retired;
    int late_grace_ms;
    int idle_timeout_ms;   /* an idle connection is closed after this */
    size_t max_addresses;  /* entries kept before the unused are forgotten */
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

/* What the monitor of a connection has said so far. Touched only by the
 * thread holding the connection. */
typedef struct ctl_conn_state {
    int fails;          /* failed connection attempts in a row */
    int fail;           /* the last one's ctl_conn_verdict */
    int hs_no_detail;   /* this attempt's handshake broke off */
    int closed;         /* this attempt's TCP socket closed unconnected */
    int up;             /* a handshake succeeded and no drop since */
    int after_drop;     /* a drop was seen: the next RETRIED is the reconnect */
    int lost;           /* a connection that was up dropped since the request
                           on it was sent (the sender clears it) */
    int64_t dropped_at; /* the check that first saw a drop not followed by
                           a reconnect (0: none) */
    int broken;         /* this attempt's connection closed before its
                           handshake completed */
    int64_t broken_at;  /* the check that first saw that, with no reconnect
                           after it (0: none) */
    int verdict_event;  /* a handshake failure that ends calls at once
                           (ZMQ_EVENT_HANDSHAKE_FAILED_*), or 0 */
    uint32_t verdict_value; /* its value: ZAP status or protocol error */
} ctl_conn_state;

/* A lent connection. `sock` is the DEALER; the rest is the pool's. */
typedef struct ctl_conn {
    void *sock;
    void *mon;      /* PAIR receiving the monitor's events; NULL if none */
    int mon_fd;     /* the monitor's ZMQ_FD (-1 if unknown) */
    int mon_ready;  /* the upkeep found its monitor with something to read
                       (or could not tell) */
    ctl_addr *addr; /* the address it is connected to */
    int fd;         /* the DEALER's ZMQ_FD (-1 if unknown) */
    int64_t idle_ms; /* when it last became idle */
    int reused;     /* it has served a call before (came from the idle
                       stack): a send that finds no connection on it means
                       the connection dropped since */
    ctl_conn_state st;
    /* The engine's epoll set (ctl_pool_set_epfd). A connection joins it the
     * first time the engine lends it and stays in it while it idles in the
     * pool, so an asynchronous call on a warm connection costs no epoll_ctl;
     * a blocking call takes it out (ctl_pool_unwatch), and closing it takes
     * it out for good. */
    int watched;        /* in the set now */
    int watched_ever;   /* has been: only the engine's thread frees it */
    void *engine_rq;    /* the engine's request on it now (engine only) */
    struct ctl_conn *grave_next;
} ctl_conn;

/* What ctl_conn_check found. */
typedef enum ctl_conn_verdict {
    CTL_CONN_OK,         /* nothing that ends a call */
    CTL_CONN_REFUSED,    /* two attempts in a row refused (or unreachable) */
    CTL_CONN_UNRESOLVED, /* two attempts in a row could not start: the host
                            does not resolve */
    CTL_CONN_HANDSHAKE,  /* two handshakes in a row broke off (a CURVE
                            client: the unit did not accept its keys) */
    CTL_CONN_DENIED,     /* the unit's allowlist refused this client's key */
    CTL_CONN_MECHANISM,  /* one side speaks CURVE, the other does not */
    CTL_CONN_PROTOCOL,   /* another handshake protocol error */
    CTL_CONN_DROPPED,    /* this side closed the connection after it was up:
                            a message larger than max_msg_bytes */
    CTL_CONN_LOST        /* the connection dropped and is up again (the unit
                            restarted in place): a request sent before the
                            drop gets no reply. Or, where the drop's events
                            were still unread when it was sent, it does:
                            only a call that may run twice acts on this. */
} ctl_conn_verdict;

/* A pool over ZeroMQ context `ctx` (borrowed). NULL when out of memory. */
ctl_pool *ctl_pool_new(void *ctx, const ctl_pool_options *opts);

/* Close every socket (idle ones with a short linger) and free the pool. */
void ctl_pool_destroy(ctl_pool **pool);

/* The entry of `address` (created and validated on first use; it lives as
 * long as the pool). NULL with `err` set (CTL_INVALID for a bad address,
 * CTL_TRANSFER / NOMEM). */
ctl_addr *ctl_pool_addr(ctl_pool *pool, const char *address, ctl_error *err);

/* Lend a connection to `address`. Returns NULL with `err` set (CTL_INVALID
 * for a bad address, CTL_TRANSFER otherwise). */
ctl_conn *ctl_pool_lend(ctl_pool *pool, const char *address, ctl_error *err);

/* Lend a connection dialed afresh, never an idle one (a transparent retry:
 * the idle ones of the address may have lost their connection too). */
ctl_conn *ctl_pool_lend_fresh(ctl_pool *pool, const char *address,
                              ctl_error *err);

/* Lend idle connections for many requests (a fan-out's targets) under
 * one hold of the pool's lock: ctl_pool_lock, then
 * ctl_pool_lend_idle_locked for each address, then ctl_pool_unlock, with
 * nothing else of the pool's called between. ctl_pool_lend_idle_locked
 * returns an idle connection to
 * `address`, or NULL when it has none (then nothing is dialled, nothing is
 * counted and no error is made: the caller lends it the usual way
 * elsewhere). One lock for the batch, not one a target: each lock is a
 * full fence, which kept the lookups' cache misses one after another. */
void ctl_pool_lock(ctl_pool *pool);
ctl_conn *ctl_pool_lend_idle_locked(ctl_pool *pool, const char *address);
void ctl_pool_unlock(ctl_pool *pool);

/* Give back a connection whose last request completed cleanly. */
void ctl_pool_return(ctl_pool *pool, ctl_conn *conn);

/* Take a connection out of use for good (after a timeout, a mismatched
 * reply, a failure). */
void ctl_pool_retire(ctl_pool *pool, ctl_conn *conn);

/* The upkeep, run by the client's I/O thread a few times a second: drain
 * and close retired connections, read idle connections' monitors, close
 * idle connections that have idled idle_timeout_ms or whose unit has gone,
 * forget unused address entries past max_addresses. Never blocks. */
void ctl_pool_upkeep(ctl_pool *pool, int64_t now_ms);

/* The engine's epoll set, or -1 once it is gone (set by the engine when it
 * starts and before it closes the set). */
void ctl_pool_set_epfd(ctl_pool *pool, int epfd);
/* Put a lent connection in the engine's set, if it is not there yet
 * (edge-triggered, data.ptr = conn). Returns 0, or -1 (errno set). */
int ctl_pool_watch(ctl_pool *pool, ctl_conn *conn);
/* Take a lent connection out of the engine's set (a blocking call lent it:
 * its socket's signals are none of the engine's business). */
void ctl_pool_unwatch(ctl_pool *pool, ctl_conn *conn);
/* Free the connections closed since the last call that had been in the
 * engine's set: the engine's thread calls this between two epoll_waits, so
 * an event it already holds never points at freed memory. */
void ctl_pool_reap(ctl_pool *pool);

/* Read the monitor events that have arrived for `conn` (never blocks) and
 * say whether its connection can still carry a call. `now_ms` is the
 * monotonic time of the check. */
ctl_conn_verdict ctl_conn_check(ctl_conn *conn, int64_t now_ms);

/* Whether the pool's sockets speak CURVE. */
int ctl_pool_curve(const ctl_pool *pool);

/* Per-address counting (the address's counters and the client's). */
void ctl_pool_count_late(ctl_pool *pool, ctl_addr *addr);
void ctl_pool_count_call(ctl_addr *addr);
void ctl_pool_count_error(ctl_addr *addr, ctl_cause cause);
/* An attempt begun; a retry (after Busy when `busy`, else after a
 * CTL_TRANSFER failure of `cause`, or a transparent one with
 * CTL_CAUSE_NONE); a retry the budget refused. */
void ctl_pool_count_attempt(ctl_addr *addr);
void ctl_pool_count_retry(ctl_addr *addr, int busy, ctl_cause cause);
void ctl_pool_count_throttled(ctl_addr *addr);

/* The retry budget of an address, in thousandths of a token below full
 * (an entry starts full). A failure takes 1000 (down to empty, `cap` =
 * budget_tokens * 1000); a success gives `give` back (up to full); a retry
 * is allowed while more than half of `cap` remains. */
void ctl_pool_budget_fail(ctl_addr *addr, int64_t cap);
void ctl_pool_budget_success(ctl_addr *addr, int64_t give);
int ctl_pool_budget_allows(ctl_addr *addr, int64_t cap);

/* The counters of `address`, all zero when the pool has never dialed it. */
void ctl_pool_address_stats(ctl_pool *pool, const char *address,
                            ctl_address_stats *out);
/* Up to `max` addresses the pool knows (borrowed: valid until the pool is
 * destroyed); returns how many it knows. */
size_t ctl_pool_addresses(ctl_pool *pool, const char **out, size_t max);

const ctl_pool_counters *ctl_pool_counters_get(const ctl_pool *pool);

/* Tests: whether an idle connection of `address` has seen its connection
 * drop and a reconnect fail since (reads the idle monitors). */
int ctl_pool_idle_failing(ctl_pool *pool, const char *address);

#endif /* CTLRPC_POOL_INT_H */
