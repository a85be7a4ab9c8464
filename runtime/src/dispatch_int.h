/*
 * dispatch_int.h - the server's core: request bytes in, reply bytes out
 * (internal to libctlrpc; server.c, tests and fuzz targets use it).
 *
 * A ctl_dispatch is everything a unit does with one received message that
 * does not need a socket: the frame checks (docs/PROTOCOL.md, "Transport"), the
 * bounded envelope decode, the op lookup in a name-sorted index, the
 * handler call under the unit's lock, and the packing of the result or of
 * the error map. It imports no libzmq: the transport (server.c) reads the
 * frames, hands them over as a ctl_inbound, and sends `out` when the
 * verdict is CTL_DISPATCH_REPLY. A test or a fuzz target does the same
 * with plain buffers.
 *
 * Memory: per-request memory (decoded args, handler scratch) lives in one
 * msgpack_zone that ctl_dispatch_done clears, so a unit's memory does not
 * grow with the number of requests it has served. The reply is built in
 * one msgpack_sbuffer: the head [id, true, is packed before the handler
 * runs so that its result lands straight after it; on failure the buffer
 * is rewound and an error reply packed instead.
 *
 * Threading: one thread drives a ctl_dispatch (the server thread); the
 * counters may be read from any thread.
 */
#ifndef CTLRPC_DISPATCH_INT_H
#define CTLRPC_DISPATCH_INT_H

#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include <msgpack.h>

#include "ctlrpc/server.h"
#include "lend_int.h"
#include "log_int.h"

/* A hold on bytes of a request (see ctl_req_hold). The transport that
 * made it says how to let go. */
struct ctl_hold {
    ctl_str view;
    void (*release)(ctl_hold *hold);
    ctl_lender *lender; /* a reply may carry the bytes by reference; or NULL */
};

/* One received message, as the transport lends it to the core. */
typedef struct ctl_inbound {
    size_t frames;        /* frames in the message, identity included;
                             more than 3 means "too many" */
    size_t delimiter_len; /* with 3 frames or more: the size of the second */
    const void *payload;  /* the last frame's bytes (of the first 3) */
    size_t payload_len;
    size_t discarded_len; /* the bytes of frames after the first 3 */
    /* Keep `len` payload bytes from `off` past the handler (ctl_req_hold).
     * NULL: the hold copies them. */
    ctl_hold *(*hold)(void *msg, size_t off, size_t len);
    void *msg; /* handed to `hold` */
    /* Bytes of replies queued for this message's connection that its peer
     * has not read yet (the transport's ledger; 0 where it keeps none). */
    size_t unread_reply_bytes;
} ctl_inbound;

/* What became of a message. */
typedef enum ctl_verdict {
    CTL_DISPATCH_DROPPED, /* unusable framing or no op and id: counted */
    CTL_DISPATCH_SILENT,  /* served, nothing to send (a notify op) */
    CTL_DISPATCH_REPLY    /* `out` holds the reply payload to send */
} ctl_verdict;

/* Counters of ctl_server_stats: the core counts requests and drops, the
 * transport the replies it sent and could not send, refused CURVE clients
 * (the ZAP handler) and what the ROUTER's monitor sees. Each has one
 * writer: the serving thread, or the monitor thread for the last four. */
typedef struct ctl_dispatch_counters {
    _Atomic uint64_t requests;
    _Atomic uint64_t replies;
    _Atomic uint64_t dropped;
    _Atomic uint64_t send_failures;
    _Atomic uint64_t undeclared; /* handler errors outside the op's raises */
    _Atomic uint64_t unknown_op;
    _Atomic uint64_t bytes_in;
    _Atomic uint64_t bytes_out;
    _Atomic uint64_t auth_denied;
    _Atomic uint64_t conn_refused; /* by a connection cap (ZAP handler) */
    _Atomic uint64_t accept_failures;
    _Atomic uint64_t handshake_failures;
    _Atomic uint64_t accepted;
    _Atomic uint64_t disconnects;
    _Atomic uint64_t expired; /* skipped: past their deadline and the skew */
} ctl_dispatch_counters;

/* The built-in ops every unit answers (docs/PROTOCOL.md, "Built-in ops"):
 * their per-op counters follow the service's ops. */
enum { CTL_BUILTIN_DESCRIBE, CTL_BUILTIN_HEALTH, CTL_BUILTIN_STATS, CTL_BUILTIN_COUNT };

/* Latency buckets, in microseconds: [0,1) [1,2) [2,3) [3,4), then each
 * octave [2^e, 2^(e+1)) in four equal parts, up to 2^33 us; the last
 * bucket also takes anything longer. */
#define CTL_LAT_BUCKETS 128

/* The error kinds an op's errors are counted by: the four kinds of the
 * wire, a declared kind the op does not list (only a hand-written op can
 * send one), then the op's declared kinds in `raises` order. */
enum {
    CTL_ERR_UNIT_FULL,
    CTL_ERR_BUSY,
    CTL_ERR_MISSING,
    CTL_ERR_PROTOCOL,
    CTL_ERR_OTHER,
    CTL_ERR_DECLARED /* the first declared kind */
};

/* Per-op counters; written by the serving thread only. */
typedef struct ctl_op_counters {
    const char *name;
    const struct ctl_op_desc *desc; /* NULL: hand-written or built-in */
    _Atomic uint64_t calls;
    _Atomic uint64_t dropped;
    _Atomic uint64_t bytes_in;
    _Atomic uint64_t bytes_out;
    _Atomic uint64_t max_us;
    _Atomic uint64_t *errors; /* CTL_ERR_DECLARED + the declared kinds */
    size_t error_slots;
    _Atomic uint64_t latency[CTL_LAT_BUCKETS];
} ctl_op_counters;

typedef struct ctl_dispatch {
    const ctl_service *service;
    const ctl_op **by_name; /* ops sorted by name, for bsearch */
    void *user;
    pthread_mutex_t *lock;
    pthread_mutex_t own_lock;
    ctl_limits limits;
    msgpack_zone zone;
    msgpack_sbuffer out; /* the reply payload after CTL_DISPATCH_REPLY */
    /* A large bin of the reply carried by reference (lend_int.h): only
     * when the transport sends payloads with ctl_payload_take, which sets
     * `lend` (else every byte is in `out`). `share` is the lender of the
     * hold a handler named with ctl_req_share (a reference), `share_view`
     * its bytes. */
    bool lend;
    ctl_seg seg;
    ctl_lender *share;
    ctl_str share_view;
    /* The largest reply payload (bytes) the unit packs; a handler's reply
     * that would be larger is refused with a Protocol error saying so, and
     * the buffer never grows past it. Set after init (default: the
     * message limit). */
    size_t max_reply_bytes;
    bool reply_too_big; /* the handler's packing hit max_reply_bytes */
    /* A request whose connection holds at least this many bytes of unread
     * replies (ctl_inbound.unread_reply_bytes) is answered Busy
     * "replies_unread" without running; 0: no bound. Set after init. */
    size_t max_queued_reply_bytes;
    ctl_dispatch_counters counters;
    /* The service's ops in table order, then the built-ins (op_count +
     * CTL_BUILTIN_COUNT entries, made at init: no growth). */
    ctl_op_counters *ops;
    _Atomic uint64_t *error_block; /* every op's `errors` */
    /* Shutting down: every request but a built-in is answered Busy
     * "draining" (notifies are dropped) instead of being served. Set by the
     * serving thread. */
    bool draining;
    bool describe_off;   /* _describe answers a Protocol error */
    /* A request whose id's deadline (docs/PROTOCOL.md, "Deadlines") has
     * passed by more than this many ms is skipped and counted in
     * `expired`; negative: no check. Set after init (default
     * CTL_DEFAULT_DEADLINE_SKEW_MS). */
    int64_t deadline_skew_ms;
    ctl_log_limit expired_limit; /* the expired requests' log line */
    const char *who;     /* for log lines: the unit's endpoint */
    int64_t start_ns;    /* monotonic, at init: uptime */
    _Atomic uint64_t in_flight; /* a message is being served */
    /* The message being served: its op's counters (NULL: none), when it
     * arrived, and the size of its reply. */
    ctl_op_counters *cur;
    int64_t cur_t0_ns;
    size_t reply_len;
} ctl_dispatch;

/* The context of one request while its handler runs. */
struct ctl_req {
    ctl_dispatch *d;
    const ctl_inbound *in;
    const ctl_op *op;
    ctl_str op_name;
    ctl_str id;
    msgpack_packer pk;
    ctl_error err;
    bool failed;
    bool bad_args; /* the failure is the args' (a notify's is dropped) */
};

/*
 * Check `service` (names, handlers, duplicates) and get ready to serve it.
 * `lock` NULL: a lock of the dispatch's own. `limits` NULL: the defaults.
 * Returns 0, or CTL_INVALID naming what is wrong with the service, or
 * CTL_TRANSFER (out of memory); `d` needs no fini after a failure.
 */
int ctl_dispatch_init(ctl_dispatch *d, const ctl_service *service, void *user,
                      pthread_mutex_t *lock, const ctl_limits *limits,
                      ctl_error *err);
void ctl_dispatch_fini(ctl_dispatch *d);

/* Serve one message. On CTL_DISPATCH_REPLY, send [identity, (an empty
 * delimiter when *delimited,) out] and count the send with
 * ctl_dispatch_sent. Call ctl_dispatch_done after every message. */
ctl_verdict ctl_dispatch_message(ctl_dispatch *d, const ctl_inbound *in,
                                 bool *delimited);

/* Count a reply the transport sent (or could not send). */
void ctl_dispatch_sent(ctl_dispatch *d, bool ok);

/* Release the request's memory (args, scratch). */
void ctl_dispatch_done(ctl_dispatch *d);

/* The op table entry of the request being served. */
const ctl_op *ctl_req_entry(const ctl_req *req);

/* Bytes the request's reply may still take under max_reply_bytes. */
size_t ctl_req_reply_room(const ctl_req *req);

/* The unit's max_reply_bytes. */
size_t ctl_req_max_reply(const ctl_req *req);

/* Entries of the per-op counters: the service's ops, then the built-ins. */
size_t ctl_dispatch_op_count(const ctl_dispatch *d);
/* Read entry `index` (< ctl_dispatch_op_count), from any thread. */
void ctl_dispatch_op_stats(const ctl_dispatch *d, size_t index, ctl_op_stats *out);
uint64_t ctl_dispatch_op_errors(const ctl_dispatch *d, size_t index, const char *kind);

/* Latency buckets: the bucket of `us`, and the upper edge of bucket `i`. */
size_t ctl_lat_bucket(uint64_t us);
uint64_t ctl_lat_upper(size_t i);

/* The wire name of error slot `slot` of `c` (CTL_ERR_*). */
const char *ctl_op_error_name(const ctl_op_counters *c, size_t slot);

/* Pack the result of built-in op `which` (CTL_BUILTIN_*), builtin.c.
 * Returns 0, or -1 when out of memory. */
int ctl_builtin_pack(ctl_dispatch *d, size_t which, msgpack_packer *pk);

/* Seconds since ctl_dispatch_init. */
double ctl_dispatch_uptime(const ctl_dispatch *d);

#endif /* CTLRPC_DISPATCH_INT_H */
