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
 * Threading: a client may be shared by any number of threads; every
 * function except ctl_client_destroy is thread-safe. Destroy it only after
 * every call on it has returned.
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

/* A received reply: owns the message and the decoded result. */
typedef struct ctl_reply ctl_reply;

/* The defaults of ctl_client_options (the one place they are written). */
#define CTL_DEFAULT_TIMEOUT_MS 30000 /* the reference design's 30 s */
#define CTL_DEFAULT_LATE_GRACE_MS 1000
#define CTL_DEFAULT_MAX_IDLE_PER_ADDRESS 16u
#define CTL_DEFAULT_MAX_RETIRED 64u

typedef struct ctl_client_options {
    /* Deadline used when a call passes timeout_ms < 0, and for notify's
     * send. 0 or default: CTL_DEFAULT_TIMEOUT_MS; negative is CTL_INVALID. */
    int default_timeout_ms;
    /* How long a retired socket is kept to drain and count late replies
     * before it is closed. Default CTL_DEFAULT_LATE_GRACE_MS. 0 closes at
     * once. */
    int late_grace_ms;
    /* Most idle sockets kept per address; extra ones are closed when
     * returned. 0 or default: CTL_DEFAULT_MAX_IDLE_PER_ADDRESS. */
    unsigned max_idle_per_address;
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
     * request refused or a reply dropped for its size): one line, without
     * a newline, per event. Called on the calling thread. NULL: standard
     * error, prefixed "ctlrpc client: ". */
    void (*log)(void *log_user, const char *line);
    void *log_user;
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
 * pointer to NULL. Not thread-safe: no call may be running on the client. */
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
 * and nothing is sent (a caller's budget that has run out). A call that
 * timed out after sending may still have run on the unit.
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

/*
 * Fire-and-forget: send [op, "", args] to `address` and return as soon as
 * the message is queued, without waiting for any reply (notify ops get
 * none). Waits for queue space at most the client's default timeout.
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
    uint64_t calls;        /* requests sent expecting a reply */
    uint64_t timeouts;     /* calls that ended without a reply in time */
    uint64_t late_replies; /* replies that came after their call ended, or
                              carried another id */
    uint64_t sockets;      /* sockets open now (lent, idle or retired) */
    uint64_t retired;      /* sockets closed after a timeout, a mismatched
                              reply or a failure */
    /* Calls that ended in CTL_TRANSFER, by cause (indexed by ctl_cause;
     * errors[CTL_CAUSE_TIMEOUT] == timeouts). */
    uint64_t errors[CTL_CAUSE_COUNT];
} ctl_address_stats;

/* The counters of `address` (as the caller spells it; every spelling is its
 * own entry). All zero for an address the client has not called. */
CTL_API void ctl_client_address_stats(ctl_client *client, const char *address,
                                      ctl_address_stats *out);

/* The addresses the client has called: up to `max` pointers into `out`
 * (borrowed: valid until ctl_client_destroy). Returns how many there are,
 * which may exceed `max`. */
CTL_API size_t ctl_client_addresses(ctl_client *client, const char **out, size_t max);

#ifdef __cplusplus
}
#endif

#endif /* CTLRPC_CLIENT_H */
