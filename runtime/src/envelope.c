/*
 * envelope.c - requests and replies as bytes (see envelope_int.h): the
 * request framer, reply heads, error maps, and the bounded decoders.
 */
#include "envelope_int.h"

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "bigbuf_int.h"
#include "util_int.h"

/* ---- requests out ------------------------------------------------------ */

/* A request's first buffer: room for its head and small args, grown (by
 * doubling) for larger ones. msgpack's sbuffer would start at 8 KiB, for
 * every request: a fan-out to 1024 units took 8 MiB of buffers, and each
 * one, sent without a copy, is freed by ZeroMQ's I/O thread. */
#define FRAME_FIRST_ALLOC 256

void ctl_frame_begin(ctl_frame *f, ctl_str op, size_t id_len)
{
    msgpack_packer pk;
    msgpack_sbuffer_init(&f->sb);
    f->seg = (ctl_seg){0};
    f->invalid = NULL;
    /* Without it, the first write tries msgpack's own first buffer. */
    if ((f->sb.data = malloc(FRAME_FIRST_ALLOC)) != NULL)
        f->sb.alloc = FRAME_FIRST_ALLOC;
    msgpack_packer_init(&pk, &f->sb, ctl_sbuffer_write);
    f->id_len = id_len;
    f->failed = msgpack_pack_array(&pk, 3) || ctl_pack_str(&pk, op) ||
                msgpack_pack_str(&pk, id_len);
    f->id_off = f->sb.size;
    /* Room for the id's bytes, filled in when the request is sent. */
    static const char room[64];
    for (size_t left = id_len; left && !f->failed;) {
        size_t n = left < sizeof room ? left : sizeof room;
        f->failed = ctl_sbuffer_write(&f->sb, room, n) != 0;
        left -= n;
    }
}

/* The args' writer: a large bin inside a ctl_blob is carried by
 * reference, everything else is appended. */
static int frame_write(void *data, const char *buf, size_t len)
{
    ctl_frame *f = data;
    ctl_lender *cand = len >= CTL_BLOB_MIN ? ctl_lender_find(buf, len) : NULL;
    return ctl_seg_append(&f->sb, &f->seg, cand, buf, len);
}

void ctl_frame_packer(ctl_frame *f, msgpack_packer *pk)
{
    msgpack_packer_init(pk, f, frame_write);
}

void ctl_frame_packed(ctl_frame *f, int rc)
{
    if (rc != 0)
        f->failed = true;
}

void ctl_frame_args(ctl_frame *f, const void *args, size_t args_len)
{
    static const char empty_map = (char)0x80;
    if (!args || args_len == 0) {
        args = &empty_map;
        args_len = 1;
    }
    if (!f->failed)
        f->failed = ctl_sbuffer_write(&f->sb, args, args_len) != 0;
}

void ctl_frame_set_id(ctl_frame *f, ctl_str id)
{
    if (!f->failed && id.len == f->id_len && id.len)
        memcpy(f->sb.data + f->id_off, id.ptr, id.len);
}

int ctl_env_id_deadline(ctl_str id, int64_t *deadline_ms)
{
    /* The digits run back from the end to the last '@': any other byte
     * first, or no '@' within 16 digits, is no deadline. Sixteen digits
     * fit an int64_t (9.2e18) with room to spare. */
    size_t n = 0;
    while (n < id.len && n <= CTL_ID_DEADLINE_MAX_DIGITS) {
        char ch = id.ptr[id.len - 1 - n];
        if (ch == '@')
            break;
        if (ch < '0' || ch > '9')
            return 0;
        n++;
    }
    if (n == 0 || n > CTL_ID_DEADLINE_MAX_DIGITS || n == id.len)
        return 0;
    int64_t v = 0;
    for (size_t i = id.len - n; i < id.len; i++)
        v = v * 10 + (id.ptr[i] - '0');
    *deadline_ms = v;
    return 1;
}

size_t ctl_frame_size(const ctl_frame *f)
{
    return f->sb.size + f->seg.len;
}

int ctl_frame_take(ctl_frame *f, ctl_payload *p)
{
    return f->failed ? -1 : ctl_payload_take(p, &f->sb, &f->seg);
}

void ctl_frame_fini(ctl_frame *f)
{
    free(f->invalid);
    f->invalid = NULL;
    ctl_seg_drop(&f->seg);
    ctl_bigbuf_give(f->sb.data, f->sb.alloc);
    msgpack_sbuffer_init(&f->sb);
}

int ctl_env_pack_reply_head(msgpack_packer *pk, ctl_str id, bool ok)
{
    if (msgpack_pack_array(pk, 3) || ctl_pack_str(pk, id))
        return -1;
    return (ok ? msgpack_pack_true(pk) : msgpack_pack_false(pk)) ? -1 : 0;
}

ctl_kind ctl_env_wire_kind(ctl_kind kind)
{
    switch (kind) {
    case CTL_UNIT_FULL:
    case CTL_BUSY:
    case CTL_MISSING:
    case CTL_PROTOCOL:
    case CTL_DECLARED:
        return kind;
    default:
        return CTL_PROTOCOL;
    }
}

int ctl_env_pack_error(msgpack_packer *pk, const ctl_error *err)
{
    ctl_kind kind = ctl_env_wire_kind(err->kind);
    const char *name = ctl_kind_name(kind);
    if (kind == CTL_DECLARED) {
        /* A declared kind travels under its own name. */
        if (err->remote_kind && err->remote_kind[0])
            name = err->remote_kind;
        else
            name = ctl_kind_name(kind = CTL_PROTOCOL);
    }
    const char *reason = kind == CTL_BUSY || kind == CTL_DECLARED ? err->reason : NULL;
    if (msgpack_pack_map(pk, 4) || ctl_pack_cstr(pk, "kind") ||
        ctl_pack_cstr(pk, name) || ctl_pack_cstr(pk, "msg") ||
        ctl_pack_cstr(pk, err->msg ? err->msg : "") ||
        ctl_pack_cstr(pk, "reason"))
        return -1;
    if ((reason ? ctl_pack_cstr(pk, reason) : msgpack_pack_nil(pk)) ||
        ctl_pack_cstr(pk, "blobs"))
        return -1;
    if (kind != CTL_MISSING)
        return msgpack_pack_nil(pk) ? -1 : 0;
    if (msgpack_pack_array(pk, err->blob_count))
        return -1;
    for (size_t i = 0; i < err->blob_count; i++)
        if (ctl_pack_str(pk, err->blobs[i]))
            return -1;
    return 0;
}

/* A tiny cursor over a payload for reading envelope heads by hand. */
typedef struct cursor {
    const unsigned char *p;
    size_t len;
    size_t pos;
} cursor;

/* Read an array head; true when it is an array of exactly `want`. */
static bool read_array_of(cursor *c, uint32_t want)
{
    if (c->pos >= c->len)
        return false;
    unsigned char b = c->p[c->pos];
    uint64_t n;
    size_t head;
    if (b >= 0x90 && b <= 0x9f) {
        n = b & 0x0f;
        head = 1;
    } else if (b == 0xdc && c->len - c->pos >= 3) {
        n = ctl_load_be(c->p + c->pos + 1, 2);
        head = 3;
    } else if (b == 0xdd && c->len - c->pos >= 5) {
        n = ctl_load_be(c->p + c->pos + 1, 4);
        head = 5;
    } else {
        return false;
    }
    if (n != want)
        return false;
    c->pos += head;
    return true;
}

/* Read a str; true and a view into the payload on success. */
static bool read_str(cursor *c, ctl_str *out)
{
    if (c->pos >= c->len)
        return false;
    unsigned char b = c->p[c->pos];
    size_t left = c->len - c->pos;
    uint64_t n;
    size_t head;
    if (b >= 0xa0 && b <= 0xbf) {
        n = b & 0x1f;
        head = 1;
    } else if (b == 0xd9 && left >= 2) {
        n = c->p[c->pos + 1];
        head = 2;
    } else if (b == 0xda && left >= 3) {
        n = ctl_load_be(c->p + c->pos + 1, 2);
        head = 3;
    } else if (b == 0xdb && left >= 5) {
        n = ctl_load_be(c->p + c->pos + 1, 4);
        head = 5;
    } else {
        return false;
    }
    if (n > left - head)
        return false;
    out->ptr = (const char *)c->p + c->pos + head;
    out->len = (size_t)n;
    c->pos += head + (size_t)n;
    return true;
}

/* Scan and unpack the last element of an envelope, which must end the
 * payload. Returns 0, or -1 with `why` set. */
static int read_body(cursor *c, const ctl_limits *limits, msgpack_zone *zone,
                     msgpack_object *out, const char *what, char *why,
                     size_t why_len)
{
    size_t items = 3; /* the envelope and its two head elements */
    size_t used = 0;
    ctl_wire_status st = ctl_wire_check(c->p + c->pos, c->len - c->pos, limits,
                                        1, &items, &used);
    if (st != CTL_WIRE_OK) {
        snprintf(why, why_len, "%s: %s", what, ctl_wire_status_name(st));
        return -1;
    }
    if (c->pos + used != c->len) {
        snprintf(why, why_len, "%zu trailing bytes after the message",
                 c->len - c->pos - used);
        return -1;
    }
    size_t off = 0;
    msgpack_unpack_return r = msgpack_unpack((const char *)c->p + c->pos, used,
                                             &off, zone, out);
    if (r != MSGPACK_UNPACK_SUCCESS) {
        snprintf(why, why_len, "%s: %s", what,
                 r == MSGPACK_UNPACK_NOMEM_ERROR ? "out of memory"
                                                 : "cannot be decoded");
        return -1;
    }
    c->pos += used;
    return 0;
}

ctl_decode ctl_env_decode_request(const void *data, size_t len,
                                  const ctl_limits *limits, msgpack_zone *zone,
                                  ctl_env_request *out, char *why,
                                  size_t why_len)
{
    cursor c = {data, len, 0};
    memset(out, 0, sizeof *out);
    if (!read_array_of(&c, 3)) {
        snprintf(why, why_len, "not a msgpack array of 3");
        return CTL_DECODE_DROP;
    }
    if (!read_str(&c, &out->op)) {
        snprintf(why, why_len, "the op is not a string");
        return CTL_DECODE_DROP;
    }
    if (!read_str(&c, &out->id)) {
        snprintf(why, why_len, "the request id is not a string");
        return CTL_DECODE_DROP;
    }
    if (out->id.len > CTL_ID_MAX) {
        snprintf(why, why_len, "the request id is %zu bytes, more than %d", out->id.len,
                 CTL_ID_MAX);
        return CTL_DECODE_DROP;
    }
    if (read_body(&c, limits, zone, &out->args, "args", why, why_len) != 0)
        return CTL_DECODE_BAD;
    if (out->args.type != MSGPACK_OBJECT_MAP) {
        snprintf(why, why_len, "args must be a map, not %s",
                 ctl_obj_type_name(&out->args));
        return CTL_DECODE_BAD;
    }
    return CTL_DECODE_OK;
}

int ctl_env_decode_reply(const void *data, size_t len, const ctl_limits *limits,
                         msgpack_zone *zone, ctl_env_reply *out, char *why,
                         size_t why_len)
{
    cursor c = {data, len, 0};
    memset(out, 0, sizeof *out);
    if (!read_array_of(&c, 3)) {
        snprintf(why, why_len, "not a msgpack array of 3");
        return -1;
    }
    if (!read_str(&c, &out->id)) {
        snprintf(why, why_len, "the request id is not a string");
        return -1;
    }
    if (c.pos >= c.len || (c.p[c.pos] != 0xc2 && c.p[c.pos] != 0xc3)) {
        snprintf(why, why_len, "the ok flag is not a bool");
        return -1;
    }
    out->ok = c.p[c.pos++] == 0xc3;
    return read_body(&c, limits, zone, &out->body,
                     out->ok ? "result" : "error", why, why_len);
}

/* ---- errors from maps ---------------------------------------------- */

int ctl_env_unpack_error(ctl_error *err, const char *address, const char *op,
                         const msgpack_object *body)
{
    char shown[CTL_SHOW_BUF];
    ctl_str kind, msg = {"", 0}, reason = {NULL, 0};
    const msgpack_object *o_kind = ctl_obj_get(body, "kind");
    const msgpack_object *o_msg = ctl_obj_get(body, "msg");
    const msgpack_object *o_reason = ctl_obj_get(body, "reason");
    const msgpack_object *o_blobs = ctl_obj_get(body, "blobs");

    /* The reference design's earlier release answers [kind, msg]: read it
     * as the map with no reason and no blobs. */
    if (body && body->type == MSGPACK_OBJECT_ARRAY && body->via.array.size == 2 &&
        body->via.array.ptr[0].type == MSGPACK_OBJECT_STR &&
        (body->via.array.ptr[1].type == MSGPACK_OBJECT_STR ||
         body->via.array.ptr[1].type == MSGPACK_OBJECT_NIL)) {
        o_kind = &body->via.array.ptr[0];
        o_msg = &body->via.array.ptr[1];
    } else if (!body || body->type != MSGPACK_OBJECT_MAP) {
        return ctl_error_transfer(err, CTL_CAUSE_BAD_REPLY,
                                  "%s at %s: error reply is a %s, not a map",
                                  op, address, ctl_obj_type_name(body));
    }
    if (!ctl_obj_str(o_kind, &kind))
        return ctl_error_transfer(err, CTL_CAUSE_BAD_REPLY,
                                  "%s at %s: error reply has no string 'kind'",
                                  op, address);
    if (o_msg && !ctl_obj_str(o_msg, &msg) && o_msg->type != MSGPACK_OBJECT_NIL)
        return ctl_error_transfer(err, CTL_CAUSE_BAD_REPLY,
                                  "%s at %s: error reply's 'msg' is a %s",
                                  op, address, ctl_obj_type_name(o_msg));
    if (o_reason && !ctl_obj_str(o_reason, &reason) &&
        o_reason->type != MSGPACK_OBJECT_NIL)
        return ctl_error_transfer(err, CTL_CAUSE_BAD_REPLY,
                                  "%s at %s: error reply's 'reason' is a %s",
                                  op, address, ctl_obj_type_name(o_reason));
    if (o_blobs && o_blobs->type != MSGPACK_OBJECT_NIL) {
        bool ok = o_blobs->type == MSGPACK_OBJECT_ARRAY;
        for (uint32_t i = 0; ok && i < o_blobs->via.array.size; i++)
            ok = o_blobs->via.array.ptr[i].type == MSGPACK_OBJECT_STR;
        if (!ok)
            return ctl_error_transfer(
                err, CTL_CAUSE_BAD_REPLY,
                "%s at %s: error reply's 'blobs' is not a list of strings", op,
                address);
    }

    int msg_len = msg.len > 4096 ? 4096 : (int)msg.len;
    switch (ctl_kind_from_wire(kind)) {
    case CTL_UNIT_FULL:
        return ctl_error_set(err, CTL_UNIT_FULL, "%s at %s: unit full: %.*s",
                             op, address, msg_len, msg.ptr);
    case CTL_BUSY: {
        char *r = reason.ptr ? ctl_strndup(reason.ptr, reason.len) : NULL;
        if (reason.ptr && !r)
            return ctl_error_transfer(err, CTL_CAUSE_NOMEM,
                                      "%s at %s: out of memory reading a Busy "
                                      "error", op, address);
        ctl_error_busy(err, r, "%s at %s: busy (%s): %.*s", op, address,
                       r ? ctl_show(shown, sizeof shown, reason) : "no reason",
                       msg_len, msg.ptr);
        free(r);
        return CTL_BUSY;
    }
    case CTL_MISSING: {
        size_t n = o_blobs && o_blobs->type == MSGPACK_OBJECT_ARRAY
                       ? o_blobs->via.array.size
                       : 0;
        ctl_str *ids = n ? calloc(n, sizeof *ids) : NULL;
        if (n && !ids)
            return ctl_error_transfer(err, CTL_CAUSE_NOMEM,
                                      "%s at %s: out of memory reading a "
                                      "Missing error", op, address);
        for (size_t i = 0; i < n; i++)
            ctl_obj_str(&o_blobs->via.array.ptr[i], &ids[i]);
        ctl_error_missing(err, ids, n, "%s at %s: %zu blob(s) missing: %.*s",
                          op, address, n, msg_len, msg.ptr);
        free(ids);
        return CTL_MISSING;
    }
    default: {
        /* Protocol, or a kind this client does not know: both are the
         * unit's way of saying the call failed. (A generated stub turns a
         * kind its op declares into CTL_DECLARED; see stub.c.) The kind
         * and the reason, if any, are kept. */
        ctl_error_transfer(err, CTL_CAUSE_REMOTE, "%s at %s: %s error: %.*s",
                           op, address,
                           kind.len ? ctl_show(shown, sizeof shown, kind)
                                    : "(empty kind)",
                           msg_len, msg.ptr);
        if (err && (!(err->remote_kind = ctl_strndup(kind.ptr, kind.len)) ||
                    (reason.ptr && !(err->reason = ctl_strndup(reason.ptr, reason.len)))))
            return ctl_error_transfer(err, CTL_CAUSE_NOMEM,
                                      "%s at %s: out of memory reading an "
                                      "error reply", op, address);
        return CTL_TRANSFER;
    }
    }
}
