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

/* A hold on bytes of a request (see ctl_req_hold). The transport that
 * made it says how to let go. */
struct ctl_hold {
    ctl_str view;
    void (*release)(ctl_hold *hold);
};

/* One received message, as the transport lends it to the core. */
typedef struct ctl_inbound {
    size_t frames;        /* frames in the message, identity included;
                             more than 3 means "too many" */
    size_t delimiter_len; /* with 3 frames: the size of the middle one */
    const void *payload;  /* the last frame's bytes */
    size_t payload_len;
    /* Keep `len` payload bytes from `off` past the handler (ctl_req_hold).
     * NULL: the hold copies them. */
    ctl_hold *(*hold)(void *msg, size_t off, size_t len);
    void *msg; /* handed to `hold` */
} ctl_inbound;

/* What became of a message. */
typedef enum ctl_verdict {
    CTL_DISPATCH_DROPPED, /* unusable framing or no op and id: counted */
    CTL_DISPATCH_SILENT,  /* served, nothing to send (a notify op) */
    CTL_DISPATCH_REPLY    /* `out` holds the reply payload to send */
} ctl_verdict;

/* Counters of ctl_server_stats: the core counts requests and drops, the
 * transport the replies it sent and could not send. (Refused CURVE clients
 * are counted by the ZAP handler, in the server.) */
typedef struct ctl_dispatch_counters {
    _Atomic uint64_t requests;
    _Atomic uint64_t replies;
    _Atomic uint64_t dropped;
    _Atomic uint64_t send_failures;
    _Atomic uint64_t undeclared; /* handler errors outside the op's raises */
} ctl_dispatch_counters;

typedef struct ctl_dispatch {
    const ctl_service *service;
    const ctl_op **by_name; /* ops sorted by name, for bsearch */
    void *user;
    pthread_mutex_t *lock;
    pthread_mutex_t own_lock;
    ctl_limits limits;
    msgpack_zone zone;
    msgpack_sbuffer out; /* the reply payload after CTL_DISPATCH_REPLY */
    ctl_dispatch_counters counters;
    /* Shutting down: every request is answered Busy "draining" (notifies
     * are dropped) instead of being served. Set by the serving thread. */
    bool draining;
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

#endif /* CTLRPC_DISPATCH_INT_H */
