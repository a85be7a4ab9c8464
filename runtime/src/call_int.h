/*
 * call_int.h - the client's core: ids and the judging of a received reply
 * (internal to libctlrpc; client.c, tests and fuzz targets use it).
 *
 * A call frames its request with the envelope's framer (envelope_int.h),
 * names it with an id from ctl_call_format_id, and judges every message
 * that arrives on its socket with ctl_call_accept: its own reply (a result
 * or an error), someone else's (a late reply: the socket must not be
 * reused), or a bad one. None of this needs a socket: the transport
 * (client.c) receives the bytes into a ctl_reply made here and keeps
 * whatever owns them alive in the reply's tail.
 */
#ifndef CTLRPC_CALL_INT_H
#define CTLRPC_CALL_INT_H

#include <stddef.h>
#include <stdint.h>

#include <msgpack.h>

#include "ctlrpc/client.h"
#include "envelope_int.h"

struct ctl_reply {
    const char *data; /* the received payload (set by the transport) */
    size_t len;
    /* Lets go of what keeps `data` alive (NULL: nothing to do). */
    void (*release)(ctl_reply *reply);
    msgpack_zone zone; /* the decoded result and typed arrays */
    ctl_str id;
    msgpack_object result;
};

/* A reply handle with `extra` bytes of transport storage after it
 * (ctl_reply_tail), aligned for any type. NULL when out of memory. */
ctl_reply *ctl_reply_new(size_t extra);
void *ctl_reply_tail(ctl_reply *reply);

/* A reply handle over a copy of `len` bytes (tests, fuzz targets). */
ctl_reply *ctl_reply_copy_of(const void *data, size_t len);

/* Write the id of value `v` and deadline `deadline_ms` (wall clock,
 * milliseconds since the Unix epoch): the low 48 bits of `v` as
 * CTL_ID_UNIQUE_LEN lowercase hex digits, '@', the deadline as
 * CTL_ID_DEADLINE_DIGITS decimal digits (zero-padded; clamped to what
 * they hold), and a NUL: CTL_ID_LEN characters in all. */
void ctl_call_format_id(uint64_t v, int64_t deadline_ms, char out[CTL_ID_LEN + 1]);

/* What a received message is to the call waiting on its socket. */
typedef enum ctl_match {
    CTL_MATCH_RESULT, /* its reply, ok: reply->id and reply->result set */
    CTL_MATCH_ERROR,  /* its reply, an error map: `err` set */
    CTL_MATCH_BAD,    /* not a reply: `err` set; the socket is suspect */
    CTL_MATCH_OTHER   /* a well-formed reply for another id: a late reply */
} ctl_match;

/*
 * Judge the message in `reply` (`frames` frames were received; replies
 * have one) for the call `op` to `address` whose id is `id`. A payload that
 * is not a reply within `limits` is CTL_TRANSFER / CTL_CAUSE_BAD_REPLY; an
 * error map is rebuilt with ctl_env_unpack_error. On CTL_MATCH_RESULT the
 * caller keeps the reply; otherwise it frees it.
 */
ctl_match ctl_call_accept(ctl_reply *reply, size_t frames, ctl_str id,
                          const ctl_limits *limits, const char *address,
                          const char *op, ctl_error *err);

#endif /* CTLRPC_CALL_INT_H */
