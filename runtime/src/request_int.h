/*
 * request_int.h - the life of one request on the client (internal).
 *
 * Every kind of call (a blocking call, a fan-out, an asynchronous call) is
 * made of requests, and every request lives the same life, written once
 * here: it is refused before it is sent (out of memory, over the size
 * limit, no time left), or it borrows a connection from the pool, gets its
 * id and leaves; then each message that arrives on its socket is judged by
 * the call core (call.c); its connection's monitor is read when it has
 * waited a while (fail-fast causes); it ends with its reply, an error, its
 * deadline or a cancel. It ends exactly once (`done`), and its connection
 * goes back to the pool only after a clean, matching reply; every other
 * ending retires it, so a late reply can never reach a later request.
 *
 * What differs between the kinds of call is only who waits and how: a
 * blocking call waits on its own thread (client.c), everything else on the
 * client's I/O thread (engine.c). Neither knows anything the other does not.
 *
 * Threading: a request is touched by one thread at a time (the one driving
 * it); the pool it borrows from is thread-safe.
 */
#ifndef CTLRPC_REQUEST_INT_H
#define CTLRPC_REQUEST_INT_H

#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>

#include <zmq.h>

#include "ctlrpc/client.h"
#include "envelope_int.h"
#include "log_int.h"
#include "pool_int.h"
#include "util_int.h"

typedef struct ctl_engine ctl_engine;

/* A request that has waited this long without its reply reads its
 * connection's monitor, and again every slice after. */
#define CTL_CHECK_SLICE_MS 100

/* Hooks for tests of the retry rules (never set by the library itself):
 * every field may be left zero. */
typedef struct ctl_retry_hooks {
    /* A draw uniform in [0, 1] for the jitter (NULL: the client's own). */
    double (*random)(void *user);
    /* Told every backoff chosen: the retry's number (1 for the first) and
     * its length after the jitter. Called on the thread driving the call. */
    void (*backoff)(void *user, const char *address, unsigned retry, int ms);
    /* The blocking single call: its first attempt ends after at most
     * this long (0: the time left), so a timeout can leave time for a
     * retry. */
    int attempt_ms;
    /* Skip the I/O thread's upkeep of the pool (idle sockets whose
     * connection dropped stay pooled, as between two upkeeps). */
    int no_upkeep;
    void *user;
} ctl_retry_hooks;

/* Set the client's hooks (before any call). */
void ctl_client_set_retry_hooks(ctl_client *c, const ctl_retry_hooks *hooks);
/* Tests: whether an idle socket of `address` saw its connection drop and
 * a reconnect fail (ctl_pool_idle_failing). */
int ctl_client_idle_failing(ctl_client *c, const char *address);

/* A timer in the engine's heap: a call's deadline, the end of a
 * request's backoff, or the end of an attempt that has its own limit
 * (retry.attempt_timeout_ms). */
typedef struct ctl_timer {
    int64_t at;
    size_t heap_at; /* 1 + its index in the heap; 0: not in it */
    int is_rq;      /* a request's backoff or attempt limit (else a call's
                       deadline) */
} ctl_timer;

/* The client (its fields are the runtime's; users see it opaque). */
struct ctl_client {
    void *ctx;
    int own_ctx;
    ctl_client_options opts;
    ctl_pool *pool;
    ctl_engine *engine;
    _Atomic uint64_t next_id;
    _Atomic uint64_t calls;
    _Atomic uint64_t notifies;
    _Atomic uint64_t timeouts;
    /* Requests in flight now, blocking and asynchronous (max_in_flight). */
    _Atomic uint64_t in_flight;
    /* ctl_client_log_limited: a limiter per kind of line, under a lock
     * (calls start on any thread). */
    pthread_mutex_t log_lock;
    ctl_log_limit log_limit[CTL_CAUSE_COUNT];
    /* The jitter's draws: a Weyl sequence, mixed (lock-free). */
    _Atomic uint64_t rng;
    ctl_retry_hooks hooks;
    _Atomic int no_upkeep; /* hooks.no_upkeep, read by the I/O thread */
};

/* One request. */
typedef struct ctl_rq {
    const char *address;
    const char *op;
    int timeout_ms;    /* as the caller gave it, resolved (for messages) */
    ctl_conn *conn;    /* while it is in flight */
    ctl_addr *addr;    /* the address's entry, once known (its counters) */
    /* The call's deadline on the wall clock (ms since the Unix epoch),
     * which its id carries to the unit (docs/PROTOCOL.md, "Deadlines"):
     * set by the caller after ctl_rq_init, the same for every attempt of
     * the call; 0 takes now + timeout_ms when the request is sent. */
    int64_t deadline_wall_ms;
    char id[CTL_ID_LEN + 1];
    int dirty;         /* saw a reply for another id: never reuse the socket */
    int done;
    int64_t sent_ms;   /* when it was handed to its socket (monitor checks) */
    int unsent;        /* its socket has no connection yet: `out` waits */
    int notify;        /* a notify: counted as one, no reply awaited */
    /* The caller lent `conn` an idle socket beforehand, or found none:
     * ctl_rq_send then lends nothing, and with no socket leaves the
     * request as it was (not sent, not done, its frame kept) for a thread
     * that may dial (engine.c: an asynchronous fan-out's caller). */
    int idle_only;
    zmq_msg_t out;     /* the message, while unsent */
    ctl_reply **reply; /* where the reply goes on success */
    ctl_error *err;    /* where the failure goes */
    ctl_frame *req;    /* the packed request, consumed by ctl_rq_send */
    void *owner;       /* the asynchronous call it belongs to (engine.c) */
    /* Retries. A request is one logical call to one address: attempts
     * share its id and its bytes (`keep`, a reference to the message that
     * copies nothing, held only when the policy may retry). */
    unsigned flags;    /* CTL_CALL_IDEMPOTENT */
    int64_t deadline_ms; /* the call's one deadline */
    unsigned attempts; /* attempts begun */
    unsigned transparent; /* of which transparent retries */
    int left;          /* this attempt was handed to a connection */
    int ever_left;     /* some attempt was (the unit may have run it) */
    int kept;          /* `keep` holds the message */
    int backoff;       /* waiting out a backoff (no socket, not done) */
    int attempt_timer; /* `timer` holds this attempt's own end (engine.c) */
    int final;         /* its outcome was made final (engine.c) */
    zmq_msg_t keep;
    ctl_timer timer;   /* the backoff's end (engine.c) */
} ctl_rq;

/* A request to `address` for `op`, its frame `req` (consumed by
 * ctl_rq_send), its outcome going to *reply / *err. */
void ctl_rq_init(ctl_rq *rq, const char *address, const char *op,
                 int timeout_ms, ctl_frame *req, ctl_reply **reply,
                 ctl_error *err);

/* Refuse, or borrow a connection, name the request and hand it to its
 * socket: it leaves at once on a connection that is up, or stays unsent
 * until one is (ctl_rq_try_send, ctl_rq_send_wait). 0 when it is on its
 * way (or, with idle_only and no idle socket, left untouched: conn NULL);
 * otherwise the negative kind, with the request done and its error set.
 * Never blocks. */
int ctl_rq_send(ctl_client *c, ctl_rq *rq);

/* While the request is unsent (its socket has no connection yet: sockets
 * are ZMQ_IMMEDIATE, so nothing is queued before a connection is up and
 * "not sent" is exact), try to send it. 1 when it went or the request is
 * done, 0 when it still waits. */
int ctl_rq_try_send(ctl_client *c, ctl_rq *rq);

/* After an attempt of `rq` ended without a reply: whether the request is
 * to be tried again (docs/API.md, "Retries"). 1 with *at_ms the end of its
 * backoff (before its deadline; counted as a retry), or 0: the failure is
 * final (counted, when the budget refused it). Never blocks. */
int ctl_rq_retry(ctl_client *c, ctl_rq *rq, int64_t now_ms, int64_t *at_ms);

/* When the attempt of `rq` that starts at `now_ms` ends without a reply:
 * its deadline, or sooner for a call that a timeout may retry
 * (retry.attempt_timeout_ms; the tests' attempt_ms hook for a first
 * attempt). */
int64_t ctl_rq_attempt_until(const ctl_client *c, const ctl_rq *rq, int64_t now_ms);

/* Start the next attempt of a request that ctl_rq_retry sent to a backoff:
 * as ctl_rq_send, with the same id and bytes. */
int ctl_rq_resend(ctl_client *c, ctl_rq *rq);

/* The end of a request's life, once, after its last attempt: lets go of
 * its kept bytes, notes "(after N attempts)" in a failure's message,
 * gives the budget back its share on success and counts the outcome
 * (ctl_rq_count_outcome). */
void ctl_rq_end(ctl_client *c, ctl_rq *rq);

/* Wait on the calling thread until an unsent request has gone, reading its
 * connection's monitor every slice (a refused connection ends it: nothing
 * was sent), or until `deadline_ms` (a timeout: nothing was sent). */
void ctl_rq_send_wait(ctl_client *c, ctl_rq *rq, int64_t deadline_ms);

/* End a request whose work is complete (a notify that left): its socket
 * goes back to the pool. */
void ctl_rq_finish_clean(ctl_client *c, ctl_rq *rq);

/* Receive one message on the request's socket (`flags`: 0 to block up to
 * the socket's ZMQ_RCVTIMEO, ZMQ_DONTWAIT not to) and judge it. Returns 1
 * when nothing arrived, 0 otherwise (the request may then be done). */
int ctl_rq_recv(ctl_client *c, ctl_rq *rq, int flags);

/* Read what the monitor of the request's connection says, and end the
 * request when the connection cannot carry it (docs/API.md, "Failures
 * that end a call early"). */
void ctl_rq_check_conn(ctl_client *c, ctl_rq *rq, int64_t now_ms);

/* End the request's attempt as a timeout: at the call's deadline, or
 * before it at the attempt's own limit (ctl_rq_attempt_until; the message
 * says which, and ctl_rq_retry may retry an attempt cut short). */
void ctl_rq_time_out(ctl_client *c, ctl_rq *rq);

/* End the request with CTL_TRANSFER / `cause` and the message that
 * follows "<op> at <address>: ". Its socket, if any, is retired. */
void ctl_rq_fail(ctl_client *c, ctl_rq *rq, ctl_cause cause, const char *why);

/* Count the request's failure against its address, by cause, and a
 * timeout in the client's own count (once, after it is done). */
void ctl_rq_count_outcome(ctl_client *c, const ctl_rq *rq);

/* Refuse a request that is not to be sent: one packed out of memory, one
 * larger than the client's limit (logged), or any request when the caller
 * gave no time at all (`timeout_ms` 0). 0 when it may go, else the kind
 * with `err` set and *addr the address's entry when it is known. */
int ctl_client_refuse(ctl_client *c, const ctl_frame *req, const char *address,
                      const char *op, int timeout_ms, ctl_addr **addr,
                      ctl_error *err);

/* A fresh id carrying the deadline `deadline_wall_ms` (ctl_call_format_id). */
void ctl_client_new_id(ctl_client *c, int64_t deadline_wall_ms,
                       char out[CTL_ID_LEN + 1]);

/* Log one line through the client's log function (or to standard error). */
void ctl_client_log(const ctl_client *c, const char *fmt, ...) CTL_PRINTF(2, 3);

/* As ctl_client_log, at most one line a second per client and kind of
 * line: the cause of the failure the line reports (CTL_CAUSE_NONE: one
 * that is not CTL_TRANSFER), so a burst of one failure cannot hide
 * another. The next line of a kind says how many of that kind were not
 * logged (CTL_LOG_LEFT_OUT_FMT). */
void ctl_client_log_limited(ctl_client *c, ctl_cause kind, const char *line);

/* Reserve room for the `n` requests of a call of `op` to addresses[0..n)
 * (`many`: a fan-out, <op>_many) in flight (max_in_flight). 0, or
 * CTL_TRANSFER / CTL_CAUSE_LIMIT with `err` set, naming the op and (one
 * call) its address, and the refusal counted in each address's errors. */
int ctl_client_reserve(ctl_client *c, const char *op, const char *const *addresses,
                       size_t n, int many, ctl_error *err);
void ctl_client_unreserve(ctl_client *c, size_t n);

#endif /* CTLRPC_REQUEST_INT_H */
