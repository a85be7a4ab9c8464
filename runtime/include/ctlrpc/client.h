/*
 * ctlrpc/client.h - calling storage units: call, call_many and notify.
 *
 * A ctl_client talks to units over DEALER sockets lent by a per-address pool
 * (docs/PROTOCOL.md, "Transport"). One request is in flight per socket. A socket
 * goes back to the pool only after a complete reply carrying its request's
 * own id; after a timeout, a reply for another id, or a transport or decode
 * failure it is retired and never lent again, so a late reply can never
 * reach a later call. Retired sockets are kept a short grace period
 * (ctl_client_options.late_grace_ms) during which anything arriving on them
 * is drained and counted as a late reply, then closed.
 *
 * Args and results at this level are untyped msgpack: args go in as the
 * packed bytes of a map (the caller keeps them), results come out as a
 * decoded msgpack_object inside a ctl_reply handle, whose strings and bins
 * are views into the received message. The typed stubs of ctlrpc-gen sit on
 * top of this API.
 *
 * Errors (ctl_error): CTL_UNIT_FULL, CTL_BUSY (reason), CTL_MISSING (blobs)
 * as the unit raised them; CTL_TRANSFER for a remote Protocol error or an
 * unknown kind (cause CTL_CAUSE_REMOTE), a timeout, a transport failure, an
 * undecodable reply, and the failures a call sees before its deadline:
 * connection refused, a host that does not resolve, a CURVE handshake
 * the unit did not accept, a message over the size limit (causes REFUSED,
 * UNRESOLVED, AUTH, TOO_LARGE; docs/API.md, "Failures that end a call
 * early"); CTL_INVALID for unusable arguments. Every message names the
 * address and the op.
 *
 * Asynchronous calls (ctl_client_call_start, ctl_client_call_many_start,
 * and the generated <op>_start / <op>_many_start) return at once with a
 * handle (ctl_call) and complete later, exactly once, through a callback.
 * They run on the client's engine: one I/O thread per client that drives
 * every call in flight but the single blocking ones, and keeps the
 * client's sockets (closing idle and retired ones on its own, see
 * idle_timeout_ms). Blocking calls, fan-out and asynchronous calls share
 * one pool, one set of counters and one judge of what arrives, so they
 * reach the same outcome for the same replies.
 *
 * Threading: a client may be shared by any number of threads; every
 * function except ctl_client_destroy is thread-safe. Destroy it only after
 * every blocking call on it has returned; asynchronous calls still in
 * flight then complete with CTL_TRANSFER / CTL_CAUSE_CANCELLED before
 * destroy returns.
 */
#ifndef CTLRPC_CLIENT_H
#define CTLRPC_CLIENT_H

#include <stddef.h>
#include <stdint.h>

#include <msgpack.h>

#include "ctlrpc/error.h"
#include "ctlrpc/codec.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct ctl_client ctl_client;

/* One asynchronous call (see "Asynchronous calls" below). */
typedef struct ctl_call ctl_call;

/* A received reply: owns the message and the decoded result. */
typedef struct ctl_reply ctl_reply;

/* The defaults of ctl_client_options (the one place they are written). */
#define CTL_DEFAULT_TIMEOUT_MS 30000 /* the reference design's 30 s */
#define CTL_DEFAULT_LATE_GRACE_MS 1000
#define CTL_DEFAULT_MAX_IDLE_PER_ADDRESS 16u
#define CTL_DEFAULT_MAX_RETIRED 64u
#define CTL_DEFAULT_IDLE_TIMEOUT_MS 30000
#define CTL_DEFAULT_MAX_IN_FLIGHT 4096u
#define CTL_DEFAULT_MAX_ADDRESSES 4096u
#define CTL_DEFAULT_RETRY_INITIAL_BACKOFF_MS 50
#define CTL_DEFAULT_RETRY_MAX_BACKOFF_MS 1000
#define CTL_DEFAULT_RETRY_MULTIPLIER 2.0
#define CTL_DEFAULT_RETRY_JITTER 0.2
#define CTL_DEFAULT_RETRY_BUDGET_TOKENS 10u
#define CTL_DEFAULT_RETRY_BUDGET_RATIO 0.1

/* The flags of the _ex calls. CTL_CALL_IDEMPOTENT: running the op twice
 * does what running it once does, so a retry policy may try it again after
 * a timeout or a failure of the transport after the request left (the
 * generated stubs pass it for ops declared `idempotent`). */
#define CTL_CALL_IDEMPOTENT 1u

/*
 * Retries (docs/API.md, "Retries"). Two kinds:
 *
 * Transparent, on unless no_transparent: a request that provably never
 * left (the pooled socket it was given had lost its connection: nothing
 * was handed to one) is sent again at once on a fresh connection. It costs
 * no budget; a fresh connection that is refused fails as ever.
 *
 * By policy, off unless max_attempts > 1: a failed attempt is tried again,
 * after a backoff, within the call's one deadline (every attempt gets the
 * time left; none is started when its backoff would end at or after the
 * deadline), when it failed with:
 *   - a connection refused before anything was sent (a unit's connection
 *     cap included): any op;
 *   - Busy, with retry_busy, unless its reason is "draining";
 *   - a timeout, or a failure of the transport after the request left
 *     (its connection dropped mid-call), only for CTL_CALL_IDEMPOTENT.
 * Never: UnitFull, Missing, remote Protocol errors, declared kinds, auth,
 * unresolved, too-large, limit, cancelled, invalid, bad replies; notify is
 * never retried. The error of a call that took more than one attempt is
 * its last attempt's, its message ending "(after N attempts)".
 *
 * The budget (gRPC's retry throttling), per address: it holds
 * budget_tokens; each failed attempt of a kind the policy retries takes
 * one, each success gives budget_ratio back (up to budget_tokens); a retry
 * is allowed only while more than half remain (else counted in
 * retries_throttled, and the call ends with its last error).
 */
typedef struct ctl_retry_policy {
    /* Attempts in all, the first included; 0 or 1: no retries (the
     * transparent one aside). */
    unsigned max_attempts;
    /* The backoff before retry n (1, 2, ...) is min(initial_backoff_ms *
     * multiplier^(n-1), max_backoff_ms), jittered. 0:
     * CTL_DEFAULT_RETRY_INITIAL_BACKOFF_MS / CTL_DEFAULT_RETRY_MAX_BACKOFF_MS;
     * negative, or a max below the initial, is CTL_INVALID. */
    int initial_backoff_ms;
    int max_backoff_ms;
    /* 0: CTL_DEFAULT_RETRY_MULTIPLIER; below 1 (but 0) is CTL_INVALID. */
    double multiplier;
    /* 0..1: each backoff d is drawn uniformly from [d*(1-j), d*(1+j)].
     * 0 means none; ctl_client_options_init sets
     * CTL_DEFAULT_RETRY_JITTER. Outside 0..1 is CTL_INVALID. */
    double jitter;
    /* Retry Busy, except Busy with reason "draining" (that unit is going
     * away: try another). */
    int retry_busy;
    /* The per-address budget. 0: CTL_DEFAULT_RETRY_BUDGET_TOKENS. */
    unsigned budget_tokens;
    /* Tokens a success gives back. 0: CTL_DEFAULT_RETRY_BUDGET_RATIO;
     * negative is CTL_INVALID. */
    double budget_ratio;
    /* 1: no transparent retry either. */
    int no_transparent;
    /* How long one attempt of a call that may be retried after a timeout
     * waits for its reply: past it, the attempt ends as a timeout (its
     * socket retired, so its reply can never reach another attempt) and
     * the call is retried within its one deadline. It applies only where
     * a timeout can be retried: a call flagged CTL_CALL_IDEMPOTENT (or an
     * op declared idempotent) with an attempt left of max_attempts; the
     * last attempt, and every other call, waits for the time left. 0: no
     * limit of its own (each attempt waits for the time left, so a timeout
     * ends the call). Negative is CTL_INVALID. */
    int attempt_timeout_ms;
} ctl_retry_policy;

typedef struct ctl_client_options {
    /* Deadline used when a call passes timeout_ms < 0, and for notify's
     * send. 0 or default: CTL_DEFAULT_TIMEOUT_MS; negative is CTL_INVALID. */
    int default_timeout_ms;
    /* How long a retired socket is kept to drain and count late replies
     * before it is closed. Default CTL_DEFAULT_LATE_GRACE_MS. 0 closes at
     * once; negative is CTL_INVALID. */
    int late_grace_ms;
    /* Most idle sockets kept per address; extra ones are closed when
     * returned, except that as many as are in use at the time are kept (a
     * burst of calls to one unit wants them back). 0 or default:
     * CTL_DEFAULT_MAX_IDLE_PER_ADDRESS. */
    unsigned max_idle_per_address;
    /* An idle socket is closed after this long unused, and at once (within
     * a second) when its connection drops: the unit went away. A later
     * call dials afresh. 0 or default: CTL_DEFAULT_IDLE_TIMEOUT_MS;
     * negative is CTL_INVALID. */
    int idle_timeout_ms;
    /* Most requests in flight at once, blocking and asynchronous (a fan-out
     * to n units is n). One more fails at once: CTL_TRANSFER /
     * CTL_CAUSE_LIMIT, nothing sent. Each request in flight holds a socket
     * (about four file descriptors with its monitor). 0 or default:
     * CTL_DEFAULT_MAX_IN_FLIGHT. */
    unsigned max_in_flight;
    /* Most addresses whose counters the client remembers: past it, those
     * with no open socket, least recently called first, are forgotten
     * (ctl_client_address_stats then reads zeros for them). 0 or default:
     * CTL_DEFAULT_MAX_ADDRESSES. */
    unsigned max_addresses;
    /* Run the callbacks of asynchronous calls on the client's I/O thread,
     * as they complete, instead of queuing them for ctl_client_process.
     * Such callbacks must not block (no ctl_call_wait, no blocking call). */
    int callbacks_on_io_thread;
    /* Most retired sockets kept draining at once; beyond it the oldest is
     * closed early. 0 or default: CTL_DEFAULT_MAX_RETIRED. */
    unsigned max_retired;
    /* Bounds for decoding replies; zero fields take the defaults. */
    ctl_limits limits;
    /* A ZeroMQ context to create sockets in (borrowed), or NULL for a
     * private one. */
    void *zmq_context;
    /* CURVE (see ctlrpc/curve.h): the units' public key, Z85 (copied).
     * NULL: no encryption. One client speaks to units sharing one key
     * pair; use one client per key otherwise. */
    const char *curve_server_key;
    /* This client's secret key, Z85 (copied), for units that check an
     * allowlist. NULL with a server key: a fresh key pair is made for the
     * client's life. */
    const char *curve_secret_key;
    /* Where the client logs the rare events it must not keep to itself (a
     * request refused or a reply dropped for its size; why a typed _start
     * could not start, at most a line a second for each cause): one line,
     * without a newline, per event. Called on the calling thread. NULL:
     * standard error, prefixed "ctlrpc client: ". */
    void (*log)(void *log_user, const char *line);
    void *log_user;
    /* Retries (above). Zeroed, or set by ctl_client_options_init: the
     * transparent retry alone. */
    ctl_retry_policy retry;
} ctl_client_options;

/* Set `opts` to the defaults. */
CTL_API void ctl_client_options_init(ctl_client_options *opts);

/* Create a client. `opts` may be NULL for the defaults; it is not kept.
 * Returns 0 and stores the client in *out, or CTL_INVALID / CTL_TRANSFER
 * (cause NOMEM or TRANSPORT) with *out left NULL. */
CTL_API int ctl_client_new(const ctl_client_options *opts, ctl_client **out,
                   ctl_error *err);

/* Close every socket (idle ones linger up to 100 ms so queued notifies can
 * leave) and free the client; sets *client to NULL. Accepts NULL and a
 * pointer to NULL. Not thread-safe: no blocking call may be running on the
 * client, and no other thread may start, cancel or wait for its calls.
 * Asynchronous calls still in flight end with CTL_TRANSFER /
 * CTL_CAUSE_CANCELLED ("the client was destroyed ...") and their callbacks
 * run before this returns: on the I/O thread with callbacks_on_io_thread,
 * otherwise on the calling thread. Their handles stay valid until
 * released. */
CTL_API void ctl_client_destroy(ctl_client **client);

/*
 * Request/reply: send [op, id, args] to `address` ("tcp://host:port") and
 * wait up to `timeout_ms` for the reply with that id. `args`/`args_len` are
 * the packed bytes of one msgpack map (copied; the caller keeps them); NULL
 * with length 0 sends an empty map; NULL with a non-zero length is
 * CTL_INVALID.
 *
 * timeout_ms: > 0 the deadline; < 0 the client's default_timeout_ms; 0 no
 * time at all: the call fails at once with CTL_TRANSFER / CTL_CAUSE_TIMEOUT
 * and nothing is sent (a caller's budget that has run out). The request's
 * id carries the deadline on the wall clock ("<12 hex digits>@<ms since
 * the Unix epoch>", docs/PROTOCOL.md "Deadlines"), and a unit skips a
 * request whose deadline passed more than its skew allowance before its
 * turn came. A call that timed out after sending may still have run on
 * the unit (within that allowance); one whose message says "nothing was
 * sent" never reached a unit and never will (requests are handed only to
 * connections that are up).
 *
 * A request larger than the client's limits.max_msg_bytes is not sent:
 * CTL_TRANSFER / CTL_CAUSE_TOO_LARGE. While waiting, the call watches its
 * connection and ends before its deadline when it cannot be answered:
 * connection refused (CTL_CAUSE_REFUSED), host that does not resolve
 * (CTL_CAUSE_UNRESOLVED), CURVE handshake not accepted (CTL_CAUSE_AUTH), a
 * reply over the size limit (CTL_CAUSE_TOO_LARGE); see docs/API.md.
 *
 * On success returns 0 and stores the reply in *reply (caller owns: free it
 * with ctl_reply_destroy). On failure returns the negative kind, fills `err`
 * and leaves *reply NULL. Blocking: at most `timeout_ms`.
 */
CTL_API int ctl_client_call(ctl_client *client, const char *address, const char *op,
                    const void *args, size_t args_len, int timeout_ms,
                    ctl_reply **reply, ctl_error *err);

/* ctl_client_call with `flags` (CTL_CALL_IDEMPOTENT or 0): what the retry
 * policy may retry (see ctl_retry_policy). The retries live within
 * `timeout_ms`; a backoff waits on the calling thread. */
CTL_API int ctl_client_call_ex(ctl_client *client, const char *address,
                               const char *op, const void *args,
                               size_t args_len, int timeout_ms, unsigned flags,
                               ctl_reply **reply, ctl_error *err);

/*
 * Fire-and-forget: send [op, "", args] to `address` and return as soon as
 * the message is handed to a connection that is up, without waiting for
 * any reply (notify ops get none). Waits for a connection (and queue
 * space) at most the client's default timeout, and ends early, with
 * "nothing was sent", when the connection is refused, the host does not
 * resolve or the handshake fails.
 * Never retried (ctl_retry_policy).
 * Returns 0 or a negative kind (CTL_INVALID, CTL_TRANSFER). A notify and a
 * later call from the same thread to the same address reach the unit in
 * order when no other thread uses that address meanwhile (they share the
 * pool's most recently returned socket); otherwise order is not promised.
 */
CTL_API int ctl_client_notify(ctl_client *client, const char *address, const char *op,
                      const void *args, size_t args_len, ctl_error *err);

/* One target of a fan-out: the address and its args (packed map bytes,
 * borrowed for the duration of the call; NULL/0 for an empty map). The same
 * address may appear more than once; each entry is a separate request. */
typedef struct ctl_target {
    const char *address;
    const void *args;
    size_t args_len;
} ctl_target;

/* The outcome of one target: on success `reply` is set (caller owns it) and
 * `error.kind` is CTL_OK; on failure `reply` is NULL and `error` says why. */
typedef struct ctl_outcome {
    ctl_reply *reply;
    ctl_error error;
} ctl_outcome;

/*
 * Fan-out: send `op` to every target before reading any reply, then collect
 * replies until they are all in or the one deadline for the whole batch
 * (`timeout_ms`, < 0: the client's default) passes; with 0, every target
 * fails at once with a timeout and nothing is sent. A target whose
 * connection is refused, whose host does not resolve or whose handshake
 * fails ends early (as ctl_client_call). `outcomes` has
 * `count` entries, which this function initialises (their previous contents
 * are ignored); release them with ctl_outcomes_fini. One target's failure
 * does not affect the others.
 *
 * Returns the number of failed targets (0 when all succeeded), or a
 * negative kind when the batch could not be attempted at all (NULL
 * arguments: CTL_INVALID, with every outcome holding that error).
 * Blocking: at most `timeout_ms`.
 */
CTL_API int ctl_client_call_many(ctl_client *client, const char *op,
                         const ctl_target *targets, size_t count,
                         int timeout_ms, ctl_outcome *outcomes);

/* ctl_client_call_many with `flags` (CTL_CALL_IDEMPOTENT or 0): each target
 * retries on its own, as the policy says, within the batch's one deadline. */
CTL_API int ctl_client_call_many_ex(ctl_client *client, const char *op,
                                    const ctl_target *targets, size_t count,
                                    int timeout_ms, unsigned flags,
                                    ctl_outcome *outcomes);

/* Release `count` outcomes (replies and errors). Accepts NULL. */
CTL_API void ctl_outcomes_fini(ctl_outcome *outcomes, size_t count);

/* The decoded result (nil for ops without one). Borrowed from the reply:
 * it and every string/bin inside are valid until ctl_reply_destroy. */
CTL_API const msgpack_object *ctl_reply_result(const ctl_reply *reply);

/* Memory that lives as long as the reply: typed stubs decode arrays of a
 * result into it. Aligned for any type; NULL when out of memory. Never
 * free it; ctl_reply_destroy does. */
CTL_API void *ctl_reply_alloc(ctl_reply *reply, size_t size);

/* The request id the reply carried (view into the reply). */
CTL_API ctl_str ctl_reply_id(const ctl_reply *reply);

/* Free a reply; sets *reply to NULL. Accepts NULL and a pointer to NULL. */
CTL_API void ctl_reply_destroy(ctl_reply **reply);

/* Counters since creation (each exact; the set is not a snapshot). */
typedef struct ctl_client_stats {
    uint64_t calls;           /* requests sent expecting a reply */
    uint64_t notifies;        /* notifies sent */
    uint64_t timeouts;        /* calls that ended without a reply in time */
    uint64_t late_replies;    /* replies that reached a socket whose call
                                 had ended or that carried another id */
    uint64_t sockets_opened;  /* DEALER sockets created */
    uint64_t sockets_retired; /* sockets taken out of use after a timeout,
                                 a mismatched id or a failure */
    uint64_t sockets_closed;  /* sockets closed, for any reason */
} ctl_client_stats;

CTL_API void ctl_client_stats_get(const ctl_client *client, ctl_client_stats *out);

/* The counters of one address (each exact; the set is not a snapshot).
 * Named as the Python client names them (docs/API.md, "Counters"). */
typedef struct ctl_address_stats {
    uint64_t calls;        /* requests sent expecting a reply (each attempt
                              that left counts) */
    uint64_t timeouts;     /* calls that ended without a reply in time */
    uint64_t late_replies; /* replies that came after their call ended, or
                              carried another id */
    uint64_t sockets;      /* sockets open now (lent, idle or retired) */
    uint64_t retired;      /* sockets closed after a timeout, a mismatched
                              reply or a failure */
    /* Calls that ended in CTL_TRANSFER, by cause (indexed by ctl_cause;
     * errors[CTL_CAUSE_TIMEOUT] == timeouts). */
    uint64_t errors[CTL_CAUSE_COUNT];
    /* Retries (ctl_retry_policy). attempts: tries at sending, every
     * attempt included, sent or not; retries: attempts after the first,
     * transparent ones included; retries_busy: retries after Busy;
     * retries_by_cause: retries after a CTL_TRANSFER failure of that cause
     * (the transparent ones are counted in `retries` alone);
     * retries_throttled: retries the budget refused. */
    uint64_t attempts;
    uint64_t retries;
    uint64_t retries_busy;
    uint64_t retries_by_cause[CTL_CAUSE_COUNT];
    uint64_t retries_throttled;
} ctl_address_stats;

/* The counters of `address` (as the caller spells it; every spelling is its
 * own entry). All zero for an address the client has not called. */
CTL_API void ctl_client_address_stats(ctl_client *client, const char *address,
                                      ctl_address_stats *out);

/* The addresses the client remembers (max_addresses): up to `max` pointers
 * into `out` (borrowed: valid until the client forgets the address, which
 * it does only for addresses with no socket open, unused for a second or
 * more, past max_addresses; copy them to keep them). Returns how many
 * there are, which may exceed `max`. */
CTL_API size_t ctl_client_addresses(ctl_client *client, const char **out, size_t max);

/*
 * Asynchronous calls.
 *
 * ctl_client_call_start sends `op` to `address` as ctl_client_call does
 * and returns at once; ctl_client_call_many_start does the same for a
 * fan-out. The args are copied before they return: the caller may free
 * them at once. Every call that started (returned 0) completes exactly
 * once, whatever happens: its reply, an error, its deadline, a cancel
 * (before or after it was sent, racing its reply or not), its unit dying,
 * or the client being destroyed. Its outcome is the one the blocking call
 * would have had for the same events.
 *
 * Completion. `done` is called with `user`, the error (kind CTL_OK on
 * success) and the reply (NULL on failure), or for a fan-out with the
 * outcomes, one per target in order. By default completions are queued and
 * the callbacks run on whichever thread calls ctl_client_process; with
 * callbacks_on_io_thread they run on the client's I/O thread. A callback
 * may start new calls, cancel calls and release handles (its own
 * included); it must not destroy the client.
 *
 * Lifetimes. The reply, the outcomes and every view into them (strings,
 * bins) belong to the call: they stay valid until the callback has
 * returned and the handle has been released, whichever is later. To keep
 * a large result without copying it, keep the handle and release it when
 * done. A call started with `call` NULL has no handle: its results live
 * until its callback returns.
 *
 * A call that cannot start fails at once: CTL_INVALID for unusable
 * arguments (NULL client, op, address or targets), CTL_TRANSFER /
 * CTL_CAUSE_LIMIT when max_in_flight requests are in flight, CTL_INVALID
 * while the client is being destroyed; `err` says why, nothing was sent,
 * nothing will complete, and *call is NULL. Everything else (a bad
 * address, a request over the size limit, a timeout of 0, ...) completes
 * through the callback, with the error the blocking call returns.
 */

/* The callback of one call: `err` (never NULL) and the reply (NULL unless
 * err->kind is CTL_OK); both borrowed, see "Lifetimes" above. */
typedef void ctl_call_done(void *user, const ctl_error *err, ctl_reply *reply);

/* The callback of a fan-out: one outcome per target, in target order
 * (borrowed: owned by the call). */
typedef void ctl_call_many_done(void *user, ctl_outcome *outcomes, size_t count);

/* Start a call (see above). `args`/`args_len` as for ctl_client_call
 * (copied). `done` may be NULL (then wait for the call and read its outcome
 * with ctl_call_outcomes). On success returns 0 and, when `call` is not
 * NULL, stores the handle there (caller owns it: ctl_call_release). Never
 * blocks. */
CTL_API int ctl_client_call_start(ctl_client *client, const char *address,
                                  const char *op, const void *args,
                                  size_t args_len, int timeout_ms,
                                  ctl_call_done *done, void *user,
                                  ctl_call **call, ctl_error *err);

/* ctl_client_call_start with `flags` (CTL_CALL_IDEMPOTENT or 0). A backoff
 * is a timer on the client's I/O thread; nothing blocks. A cancel during a
 * backoff ends the call at once (cancelled). */
CTL_API int ctl_client_call_start_ex(ctl_client *client, const char *address,
                                     const char *op, const void *args,
                                     size_t args_len, int timeout_ms,
                                     unsigned flags, ctl_call_done *done,
                                     void *user, ctl_call **call,
                                     ctl_error *err);

/* Start a fan-out of `op` to `count` targets (their addresses and args are
 * copied) under one deadline, as ctl_client_call_many. Never blocks. */
CTL_API int ctl_client_call_many_start(ctl_client *client, const char *op,
                                       const ctl_target *targets, size_t count,
                                       int timeout_ms, ctl_call_many_done *done,
                                       void *user, ctl_call **call,
                                       ctl_error *err);

/* ctl_client_call_many_start with `flags` (CTL_CALL_IDEMPOTENT or 0). */
CTL_API int ctl_client_call_many_start_ex(ctl_client *client, const char *op,
                                          const ctl_target *targets,
                                          size_t count, int timeout_ms,
                                          unsigned flags,
                                          ctl_call_many_done *done, void *user,
                                          ctl_call **call, ctl_error *err);

/* Ask the call to end now: a request not sent yet is not sent; one in
 * flight ends, its socket retired as after a timeout (a late reply can
 * never reach another call). The call completes (once, as always) with
 * CTL_TRANSFER / CTL_CAUSE_CANCELLED, unless its outcome was already
 * settled: cancel never changes an outcome already reached. Returns at
 * once; the completion comes through the usual path. Accepts NULL and an
 * ended call. Must not race ctl_client_destroy. */
CTL_API void ctl_call_cancel(ctl_call *call);

/* Wait until the call has completed (its outcome is final), at most
 * `timeout_ms` (< 0: as long as it takes, which the call's own deadline
 * bounds). Returns 0 when it has, CTL_TRANSFER when the time ran out first.
 * With callbacks_on_io_thread the callback has run by then; with queued
 * completions it runs at the next ctl_client_process. Must not be called
 * from a callback on the I/O thread. With queued completions a waiting
 * thread may drive the client's engine itself meanwhile (docs/API.md,
 * "Wait"): no callback runs on it. */
CTL_API int ctl_call_wait(ctl_call *call, int timeout_ms);

/* The outcomes of a completed call: `*count` of them (1 for a single call),
 * borrowed from the call. NULL (and *count 0) while it has not completed;
 * from its own callback they are there, whichever thread runs it.
 * For a call of a generated <op>_start or <op>_many_start the typed
 * callback owns the decoded results instead: NULL and *count 0 always. */
CTL_API const ctl_outcome *ctl_call_outcomes(const ctl_call *call, size_t *count);

/* Release the caller's handle: its last act on the call. The call itself
 * goes on if it has not completed (release is not cancel); its callback
 * still runs, once. Accepts NULL. */
CTL_API void ctl_call_release(ctl_call *call);

/* Run the completions queued when it is called, up to `max` of them (all,
 * when max <= 0), on the calling thread; returns how many ran. Never
 * blocks. Completions that come while it runs wait for a later call (the
 * event descriptor stays readable), those of the calls its callbacks
 * start included: one call runs a bounded batch, however long a chain of
 * callbacks starting calls goes on. With callbacks_on_io_thread nothing
 * is ever queued. */
CTL_API int ctl_client_process(ctl_client *client, int max);

/* A descriptor that is readable while completions are queued, and only
 * then (level-triggered: safe in epoll, poll, select, libuv's uv_poll_t or
 * any loop). Read nothing from it: call ctl_client_process. Owned by the
 * client (closed by ctl_client_destroy). */
CTL_API int ctl_client_event_fd(const ctl_client *client);

#ifdef __cplusplus
}
#endif

#endif /* CTLRPC_CLIENT_H */
