/*
 * envelope_int.h - the messages of the wire, as bytes (internal to
 * libctlrpc; the cores, tests and fuzz targets use it).
 *
 * Requests are [op: str, id: str, args: map], replies [id: str, ok: bool,
 * result-or-error-map] (docs/PROTOCOL.md, "Messages"). This module owns both
 * directions of both: the one request framer (ctl_frame), the reply head
 * and error map packers, and the bounded decoders. Decoding reads an
 * envelope's head by hand (cheaper than unpacking it, and it tells a
 * payload that cannot be answered from one that must get a Protocol
 * error), then hands the body to ctl_wire_check before msgpack-c unpacks
 * it into a caller-owned zone; strings and bins in the result are views
 * into the payload, which must outlive them.
 *
 * Nothing here touches a socket or keeps state: every function is
 * reentrant.
 */
#ifndef CTLRPC_ENVELOPE_INT_H
#define CTLRPC_ENVELOPE_INT_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include <msgpack.h>

#include "ctlrpc/codec.h"
#include "ctlrpc/error.h"
#include "lend_int.h"

/* Request ids this runtime makes: a unique part of 12 lowercase hex
 * digits (the reference design's whole id), then '@' and the call's
 * deadline as 13 decimal digits of milliseconds since the Unix epoch
 * (docs/PROTOCOL.md, "Deadlines"): one fixed length, so a request's frame
 * is packed with room for its id before the id is known. Peers may send
 * any string. */
#define CTL_ID_UNIQUE_LEN 12
#define CTL_ID_DEADLINE_DIGITS 13
#define CTL_ID_LEN (CTL_ID_UNIQUE_LEN + 1 + CTL_ID_DEADLINE_DIGITS)
/* The longest request id a unit takes, in bytes (docs/PROTOCOL.md): every
 * reply echoes the id, so a longer one would let a peer make each small
 * error or Busy reply as large as its request. A request with a longer id
 * is dropped and counted. */
#define CTL_ID_MAX 256
/* The longest deadline a unit reads from an id (docs/PROTOCOL.md). */
#define CTL_ID_DEADLINE_MAX_DIGITS 16

/* The deadline an id carries: when its last '@' is followed by 1 to 16
 * decimal digits and nothing else, 1 with *deadline_ms set (milliseconds
 * since the Unix epoch); any other id (the reference's 12 hex digits, "")
 * carries none: 0. */
int ctl_env_id_deadline(ctl_str id, int64_t *deadline_ms);

/* ---- requests out ---------------------------------------------------- */

/*
 * One request frame, packed in place: ctl_frame_begin packs [op, and room
 * for the id, the caller packs the args map straight after it (through
 * ctl_frame_packer, or ctl_frame_args for bytes already packed), and the
 * sender fills the id in (ctl_frame_set_id) just before the frame leaves,
 * so args are never copied a second time. A packing failure (out of
 * memory) is remembered in `failed` and every later step is skipped.
 */
typedef struct ctl_frame {
    msgpack_sbuffer sb; /* the frame so far */
    ctl_seg seg;        /* a large bin carried by reference (lend_int.h) */
    size_t id_off;      /* where the id's bytes go */
    size_t id_len;      /* the id's length, fixed by begin */
    bool failed;        /* packing failed: out of memory, or `invalid` */
    char *invalid;      /* args that cannot be packed (a NULL with a
                           length), said naming the arg: heap text, or NULL */
} ctl_frame;

/* Start [op, <id_len bytes of id> ; the args map comes next. */
void ctl_frame_begin(ctl_frame *f, ctl_str op, size_t id_len);

/* A packer that appends to the frame (valid while `pk` lives; `f` must not
 * move meanwhile). Pack exactly one map with it, then ctl_frame_packed(). */
void ctl_frame_packer(ctl_frame *f, msgpack_packer *pk);
/* Record the result of packing the args (`rc` != 0: failed). */
void ctl_frame_packed(ctl_frame *f, int rc);

/* Append already packed args (NULL or length 0: an empty map). */
void ctl_frame_args(ctl_frame *f, const void *args, size_t args_len);

/* Write the id (exactly id_len bytes) into its room. */
void ctl_frame_set_id(ctl_frame *f, ctl_str id);

/* The frame's size so far, the bytes carried by reference included. */
size_t ctl_frame_size(const ctl_frame *f);

/* Take the packed bytes as one payload for ZeroMQ (ctl_payload_take: a
 * large bin from a ctl_blob is not copied). Returns 0, or -1 when out of
 * memory. Release the frame with ctl_frame_fini either way. */
int ctl_frame_take(ctl_frame *f, ctl_payload *p);

/* Release a frame that was not taken. Safe to call twice. */
void ctl_frame_fini(ctl_frame *f);

/* ---- requests in ----------------------------------------------------- */

/* Outcome of decoding a request. */
typedef enum ctl_decode {
    CTL_DECODE_OK = 0,
    CTL_DECODE_DROP, /* no usable op and id: drop and count */
    CTL_DECODE_BAD   /* op and id usable, the rest is not: answer Protocol */
} ctl_decode;

/* A decoded request. */
typedef struct ctl_env_request {
    ctl_str op;          /* view into the payload */
    ctl_str id;          /* view into the payload */
    msgpack_object args; /* the args map (when CTL_DECODE_OK) */
} ctl_env_request;

/*
 * Decode a request payload into `out`, unpacking args into `zone` (the
 * caller clears it between requests). On CTL_DECODE_BAD, `out->op` and
 * `out->id` are set and `why` (NUL-terminated, may be truncated) says what
 * is wrong; on CTL_DECODE_DROP `why` says why no answer is possible.
 */
ctl_decode ctl_env_decode_request(const void *data, size_t len,
                                  const ctl_limits *limits, msgpack_zone *zone,
                                  ctl_env_request *out, char *why,
                                  size_t why_len);

/* ---- replies --------------------------------------------------------- */

/* Pack the first two elements of a reply, [id, ok, ...: the caller packs
 * the third. Returns 0 or -1. */
int ctl_env_pack_reply_head(msgpack_packer *pk, ctl_str id, bool ok);

/* Pack the error map {kind, msg, reason, blobs} of `err`. A kind that
 * cannot cross the wire (CTL_OK, CTL_TRANSFER, CTL_INVALID) is sent as
 * Protocol; `reason` goes only with Busy and `blobs` only with Missing
 * (else nil). Returns 0 or -1. */
int ctl_env_pack_error(msgpack_packer *pk, const ctl_error *err);

/* The wire kind ctl_env_pack_error sends for `kind`. */
ctl_kind ctl_env_wire_kind(ctl_kind kind);

/* A decoded reply. */
typedef struct ctl_env_reply {
    ctl_str id;          /* view into the payload */
    bool ok;
    msgpack_object body; /* result (ok) or error map (!ok) */
} ctl_env_reply;

/* Decode a reply payload. Returns 0, or -1 with `why` filled when it is
 * not [str, bool, any] within the limits. */
int ctl_env_decode_reply(const void *data, size_t len, const ctl_limits *limits,
                         msgpack_zone *zone, ctl_env_reply *out, char *why,
                         size_t why_len);

/*
 * Rebuild the error an error map describes into `err`: UnitFull, Busy
 * (reason), Missing (blobs) keep their kind; Protocol and unknown kinds
 * become CTL_TRANSFER with cause CTL_CAUSE_REMOTE and remote_kind set. The
 * reference design's earlier two-element form [kind, msg] is read as the
 * map with no reason and no blobs. A body that is neither becomes
 * CTL_TRANSFER with cause
 * CTL_CAUSE_BAD_REPLY. Messages name `address` and `op`. Returns the kind.
 */
int ctl_env_unpack_error(ctl_error *err, const char *address, const char *op,
                         const msgpack_object *body);

#endif /* CTLRPC_ENVELOPE_INT_H */
