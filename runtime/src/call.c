/*
 * call.c - the client's core (see call_int.h) and the reply handle of
 * ctlrpc/client.h.
 */
#include "call_int.h"

#include <stdlib.h>
#include <string.h>

#include "util_int.h"

/* A reply's zone starts with one chunk of this many bytes (more as its
 * decoding needs them). With msgpack's header of the chunk, a pointer,
 * its allocation stays below the 1 KiB chunks that glibc serves from its
 * large bins: each of those not found in the thread's cache first merges
 * every free chunk of the fast bins, which a fan-out, holding a reply a
 * target, paid once a reply. */
#define REPLY_ZONE_CHUNK 960

/* The reply handle, padded so that its tail is aligned for any type. */
#define HEAD_SIZE                                                             \
    ((sizeof(ctl_reply) + _Alignof(max_align_t) - 1) /                        \
     _Alignof(max_align_t) * _Alignof(max_align_t))

ctl_reply *ctl_reply_new(size_t extra)
{
    if (extra > SIZE_MAX - HEAD_SIZE)
        return NULL;
    ctl_reply *r = calloc(1, HEAD_SIZE + extra);
    if (!r)
        return NULL;
    if (!msgpack_zone_init(&r->zone, REPLY_ZONE_CHUNK)) {
        free(r);
        return NULL;
    }
    r->data = "";
    return r;
}

void *ctl_reply_tail(ctl_reply *reply)
{
    return (char *)reply + HEAD_SIZE;
}

ctl_reply *ctl_reply_copy_of(const void *data, size_t len)
{
    ctl_reply *r = ctl_reply_new(len);
    if (!r)
        return NULL;
    if (len)
        memcpy(ctl_reply_tail(r), data, len);
    r->data = ctl_reply_tail(r);
    r->len = len;
    return r;
}

void ctl_call_format_id(uint64_t v, int64_t deadline_ms, char out[CTL_ID_LEN + 1])
{
    static const char hex[] = "0123456789abcdef";
    for (int i = CTL_ID_UNIQUE_LEN - 1; i >= 0; i--, v >>= 4)
        out[i] = hex[v & 15];
    out[CTL_ID_UNIQUE_LEN] = '@';
    /* A wall clock before 1970 or past the year 2286 is wrong anyway; the
     * id keeps its length. */
    uint64_t d = deadline_ms < 0 ? 0 : (uint64_t)deadline_ms;
    if (d > UINT64_C(9999999999999))
        d = UINT64_C(9999999999999);
    for (int i = CTL_ID_LEN - 1; i > CTL_ID_UNIQUE_LEN; i--, d /= 10)
        out[i] = (char)('0' + d % 10);
    out[CTL_ID_LEN] = '\0';
}

ctl_match ctl_call_accept(ctl_reply *reply, size_t frames, ctl_str id,
                          const ctl_limits *limits, const char *address,
                          const char *op, ctl_error *err)
{
    char why[160];
    ctl_env_reply v;
    if (frames != 1) {
        /* Replies are one frame; a multi-frame message is not a reply. */
        ctl_error_transfer(err, CTL_CAUSE_BAD_REPLY,
                           "%s at %s: reply has more than one frame", op,
                           address);
        return CTL_MATCH_BAD;
    }
    if (ctl_env_decode_reply(reply->data, reply->len, limits, &reply->zone, &v,
                             why, sizeof why) != 0) {
        ctl_error_transfer(err, CTL_CAUSE_BAD_REPLY, "%s at %s: bad reply: %s",
                           op, address, why);
        return CTL_MATCH_BAD;
    }
    if (v.id.len != id.len || memcmp(v.id.ptr, id.ptr, id.len) != 0)
        /* A reply to something else: an earlier notify the unit
         * answered, or a peer that mixes ids up. */
        return CTL_MATCH_OTHER;
    if (!v.ok) {
        ctl_env_unpack_error(err, address, op, &v.body);
        return CTL_MATCH_ERROR;
    }
    reply->id = v.id;
    reply->result = v.body;
    return CTL_MATCH_RESULT;
}

/* ---- the public reply handle ----------------------------------------- */

const msgpack_object *ctl_reply_result(const ctl_reply *reply)
{
    return reply ? &reply->result : NULL;
}

void *ctl_reply_alloc(ctl_reply *reply, size_t size)
{
    return ctl_zone_alloc(&reply->zone, size);
}

ctl_str ctl_reply_id(const ctl_reply *reply)
{
    ctl_str none = {"", 0};
    return reply ? reply->id : none;
}

void ctl_reply_destroy(ctl_reply **reply)
{
    if (!reply || !*reply)
        return;
    ctl_reply *r = *reply;
    if (r->release)
        r->release(r);
    msgpack_zone_destroy(&r->zone);
    free(r);
    *reply = NULL;
}
