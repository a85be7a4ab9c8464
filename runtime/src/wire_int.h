/*
 * wire_int.h - envelopes and error maps (internal to libctlrpc; tests and
 * fuzz targets include it too).
 *
 * Requests are [op: str, id: str, args: map], replies [id: str, ok: bool,
 * result-or-error-map]. Decoding reads the envelope's head with a few bounds
 * checks of its own, then hands the body to ctl_wire_check before msgpack-c
 * unpacks it into a caller-owned zone; strings and bins in the result are
 * views into the payload, so the payload must outlive the decoded objects.
 */
#ifndef CTLRPC_WIRE_INT_H
#define CTLRPC_WIRE_INT_H

#include <stdbool.h>
#include <stddef.h>

#include <msgpack.h>

#include "ctlrpc/error.h"
#include "ctlrpc/wire.h"

/* Append [op, id, args] to `sb`. `args` are the packed bytes of one map
 * (NULL/0: an empty map), copied as they are. Returns 0 or -1 (no memory). */
int ctl_wire_pack_request(msgpack_sbuffer *sb, ctl_str op, ctl_str id,
                          const void *args, size_t args_len);

/* Pack the first two elements of a reply, [id, ok, ...: the caller packs
 * the third. Returns 0 or -1. */
int ctl_wire_pack_reply_head(msgpack_packer *pk, ctl_str id, bool ok);

/* Pack an error map {kind, msg, reason, blobs}. `kind` must be one of the
 * four wire kinds; `reason` and `blobs` may be NULL (packed as nil).
 * Returns 0 or -1. */
int ctl_wire_pack_error_map(msgpack_packer *pk, ctl_kind kind, const char *msg,
                            const char *reason, const ctl_str *blobs,
                            size_t blob_count);

/* Outcome of decoding a request. */
typedef enum ctl_decode {
    CTL_DECODE_OK = 0,
    CTL_DECODE_DROP, /* no usable op and id: drop and count */
    CTL_DECODE_BAD   /* op and id usable, the rest is not: answer Protocol */
} ctl_decode;

typedef struct ctl_request_view {
    ctl_str op;           /* view into the payload */
    ctl_str id;           /* view into the payload */
    msgpack_object args;  /* the args map (when CTL_DECODE_OK) */
} ctl_request_view;

/*
 * Decode a request payload into `out`, unpacking args into `zone` (the
 * caller clears it between requests). On CTL_DECODE_BAD, `out->op` and
 * `out->id` are set and `why` (NUL-terminated, may be truncated) says what
 * is wrong; on CTL_DECODE_DROP `why` says why no answer is possible.
 */
ctl_decode ctl_wire_decode_request(const void *data, size_t len,
                                   const ctl_limits *limits,
                                   msgpack_zone *zone, ctl_request_view *out,
                                   char *why, size_t why_len);

typedef struct ctl_reply_view {
    ctl_str id;          /* view into the payload */
    bool ok;
    msgpack_object body; /* result (ok) or error map (!ok) */
} ctl_reply_view;

/* Decode a reply payload. Returns 0, or -1 with `why` filled when it is
 * not [str, bool, any] within the limits. */
int ctl_wire_decode_reply(const void *data, size_t len,
                          const ctl_limits *limits, msgpack_zone *zone,
                          ctl_reply_view *out, char *why, size_t why_len);

/*
 * Rebuild the error behind an error reply's map into `err`: UnitFull, Busy
 * (reason), Missing (blobs) keep their kind; Protocol and unknown kinds
 * become CTL_TRANSFER with cause CTL_CAUSE_REMOTE and remote_kind set; a
 * body that is not a well-formed error map becomes CTL_TRANSFER with cause
 * CTL_CAUSE_BAD_REPLY. Messages name `address` and `op`. Returns the kind.
 */
int ctl_error_from_reply(ctl_error *err, const char *address, const char *op,
                         const msgpack_object *body);

#endif /* CTLRPC_WIRE_INT_H */
