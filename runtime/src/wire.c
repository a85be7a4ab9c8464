/*
 * wire.c - bounded msgpack scanning, envelopes and error maps.
 *
 * The one rule of this file: nothing a peer sends is handed to msgpack-c's
 * unpacker before ctl_wire_check has walked it. The scan is iterative (a
 * fixed stack of at most CTL_DEFAULT_MAX_DEPTH open containers), allocates
 * nothing, and refuses any container whose element count exceeds the bytes
 * left in the message, so the unpacker that runs after it allocates at most
 * one msgpack_object per object actually present (bounded by max_items).
 *
 * Envelope heads ([op, id, ...] and [id, ok, ...]) are read here by hand:
 * that is cheaper than unpacking them, and it lets the server tell a payload
 * it cannot answer (no usable id: drop) from one it must answer with a
 * Protocol error (usable id, bad rest).
 */
#include "ctlrpc/wire.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "util_int.h"
#include "wire_int.h"

ctl_limits ctl_limits_resolve(const ctl_limits *in)
{
    ctl_limits out = {CTL_DEFAULT_MAX_MSG_BYTES, CTL_DEFAULT_MAX_DEPTH,
                      CTL_DEFAULT_MAX_ITEMS};
    if (in) {
        if (in->max_msg_bytes)
            out.max_msg_bytes = in->max_msg_bytes;
        /* msgpack-c's unpacker nests at most 32 containers: a deeper limit
         * would only turn into unpack failures later. */
        if (in->max_depth && in->max_depth < CTL_DEFAULT_MAX_DEPTH)
            out.max_depth = in->max_depth;
        if (in->max_items)
            out.max_items = in->max_items;
    }
    return out;
}

const char *ctl_wire_status_name(ctl_wire_status status)
{
    switch (status) {
    case CTL_WIRE_OK:
        return "ok";
    case CTL_WIRE_TRUNCATED:
        return "truncated";
    case CTL_WIRE_BAD_BYTE:
        return "invalid byte 0xc1";
    case CTL_WIRE_TOO_DEEP:
        return "nested too deeply";
    case CTL_WIRE_TOO_MANY:
        return "too many objects";
    case CTL_WIRE_BAD_COUNT:
        return "container count exceeds the message size";
    }
    return "unknown";
}

static uint64_t load_be(const unsigned char *p, unsigned n)
{
    uint64_t v = 0;
    for (unsigned i = 0; i < n; i++)
        v = (v << 8) | p[i];
    return v;
}

/*
 * Read one object's head at p[0..left): its size as far as the head tells
 * (`skip`: head plus any inline body) and, for containers, the number of
 * child objects that follow (`children`; maps count keys and values).
 */
static ctl_wire_status read_head(const unsigned char *p, size_t left,
                                 size_t *skip, uint64_t *children,
                                 bool *container)
{
    unsigned char b = p[0];
    size_t head = 1;  /* bytes of the head itself */
    uint64_t body = 0; /* bytes of inline body (str, bin, ext, numbers) */
    *children = 0;
    *container = (b >= 0x80 && b <= 0x9f) || (b >= 0xdc && b <= 0xdf);

    if (b <= 0x7f || b >= 0xe0 || b == 0xc0 || b == 0xc2 || b == 0xc3) {
        /* fixint, nil, bool */
    } else if (b >= 0x80 && b <= 0x8f) {
        *children = 2u * (b & 0x0fu);
    } else if (b >= 0x90 && b <= 0x9f) {
        *children = b & 0x0fu;
    } else if (b >= 0xa0 && b <= 0xbf) {
        body = b & 0x1fu;
    } else {
        /* Length-prefixed and fixed-size forms: (head extra bytes, kind). */
        unsigned lenbytes = 0; /* bytes of a length/count field */
        enum { FIXED, BYTES, EXT, ARRAY, MAP } form = FIXED;
        switch (b) {
        case 0xc1:
            return CTL_WIRE_BAD_BYTE;
        case 0xc4: lenbytes = 1; form = BYTES; break;
        case 0xc5: lenbytes = 2; form = BYTES; break;
        case 0xc6: lenbytes = 4; form = BYTES; break;
        case 0xc7: lenbytes = 1; form = EXT; break;
        case 0xc8: lenbytes = 2; form = EXT; break;
        case 0xc9: lenbytes = 4; form = EXT; break;
        case 0xca: body = 4; break;
        case 0xcb: body = 8; break;
        case 0xcc: body = 1; break;
        case 0xcd: body = 2; break;
        case 0xce: body = 4; break;
        case 0xcf: body = 8; break;
        case 0xd0: body = 1; break;
        case 0xd1: body = 2; break;
        case 0xd2: body = 4; break;
        case 0xd3: body = 8; break;
        case 0xd4: body = 2; break;
        case 0xd5: body = 3; break;
        case 0xd6: body = 5; break;
        case 0xd7: body = 9; break;
        case 0xd8: body = 17; break;
        case 0xd9: lenbytes = 1; form = BYTES; break;
        case 0xda: lenbytes = 2; form = BYTES; break;
        case 0xdb: lenbytes = 4; form = BYTES; break;
        case 0xdc: lenbytes = 2; form = ARRAY; break;
        case 0xdd: lenbytes = 4; form = ARRAY; break;
        case 0xde: lenbytes = 2; form = MAP; break;
        case 0xdf: lenbytes = 4; form = MAP; break;
        default:
            return CTL_WIRE_BAD_BYTE; /* unreachable: every byte is covered */
        }
        if (left < 1 + (size_t)lenbytes)
            return CTL_WIRE_TRUNCATED;
        uint64_t n = lenbytes ? load_be(p + 1, lenbytes) : 0;
        head += lenbytes;
        switch (form) {
        case FIXED:
            break;
        case BYTES:
            body = n;
            break;
        case EXT:
            body = n + 1; /* the type byte */
            break;
        case ARRAY:
            *children = n;
            break;
        case MAP:
            *children = 2 * n;
            break;
        }
    }
    if (left < head || body > left - head)
        return CTL_WIRE_TRUNCATED;
    *skip = head + (size_t)body;
    return CTL_WIRE_OK;
}

ctl_wire_status ctl_wire_check(const void *data, size_t len,
                               const ctl_limits *limits, unsigned depth0,
                               size_t *items, size_t *used)
{
    ctl_limits lim = ctl_limits_resolve(limits);
    const unsigned char *p = data;
    size_t pos = 0;
    size_t count = items ? *items : 0;
    uint64_t open[CTL_DEFAULT_MAX_DEPTH]; /* children left per open container */
    unsigned depth = 0;                   /* open containers */
    ctl_wire_status st = CTL_WIRE_OK;

    for (;;) {
        if (pos >= len) {
            st = CTL_WIRE_TRUNCATED;
            break;
        }
        if (++count > lim.max_items) {
            st = CTL_WIRE_TOO_MANY;
            break;
        }
        size_t skip = 0;
        uint64_t children = 0;
        bool container = false;
        st = read_head(p + pos, len - pos, &skip, &children, &container);
        if (st != CTL_WIRE_OK)
            break;
        pos += skip;
        if (container && depth0 + depth + 1 > lim.max_depth) {
            st = CTL_WIRE_TOO_DEEP; /* even an empty one opens a level */
            break;
        }
        if (children > 0) {
            /* Each child takes at least one byte. */
            if (children > len - pos) {
                st = CTL_WIRE_BAD_COUNT;
                break;
            }
            open[depth++] = children;
            continue;
        }
        /* One object complete: close every container it completes. */
        while (depth > 0 && --open[depth - 1] == 0)
            depth--;
        if (depth == 0)
            break;
    }
    if (items)
        *items = count;
    if (st == CTL_WIRE_OK && used)
        *used = pos;
    return st;
}

/* ---- reading decoded values ----------------------------------------- */

bool ctl_obj_bool(const msgpack_object *o, bool *out)
{
    if (!o || o->type != MSGPACK_OBJECT_BOOLEAN)
        return false;
    *out = o->via.boolean;
    return true;
}

bool ctl_obj_i64(const msgpack_object *o, int64_t *out)
{
    if (!o)
        return false;
    if (o->type == MSGPACK_OBJECT_NEGATIVE_INTEGER) {
        *out = o->via.i64;
        return true;
    }
    if (o->type == MSGPACK_OBJECT_POSITIVE_INTEGER && o->via.u64 <= INT64_MAX) {
        *out = (int64_t)o->via.u64;
        return true;
    }
    return false;
}

bool ctl_obj_i32(const msgpack_object *o, int32_t *out)
{
    int64_t v;
    if (!ctl_obj_i64(o, &v) || v < INT32_MIN || v > INT32_MAX)
        return false;
    *out = (int32_t)v;
    return true;
}

bool ctl_obj_u64(const msgpack_object *o, uint64_t *out)
{
    if (!o || o->type != MSGPACK_OBJECT_POSITIVE_INTEGER)
        return false;
    *out = o->via.u64;
    return true;
}

bool ctl_obj_u32(const msgpack_object *o, uint32_t *out)
{
    uint64_t v;
    if (!ctl_obj_u64(o, &v) || v > UINT32_MAX)
        return false;
    *out = (uint32_t)v;
    return true;
}

bool ctl_obj_f64(const msgpack_object *o, double *out)
{
    if (!o)
        return false;
    switch (o->type) {
    case MSGPACK_OBJECT_FLOAT32:
    case MSGPACK_OBJECT_FLOAT64:
        *out = o->via.f64;
        return true;
    case MSGPACK_OBJECT_POSITIVE_INTEGER:
        *out = (double)o->via.u64;
        return true;
    case MSGPACK_OBJECT_NEGATIVE_INTEGER:
        *out = (double)o->via.i64;
        return true;
    default:
        return false;
    }
}

bool ctl_obj_str(const msgpack_object *o, ctl_str *out)
{
    if (!o || o->type != MSGPACK_OBJECT_STR)
        return false;
    out->ptr = o->via.str.ptr;
    out->len = o->via.str.size;
    return true;
}

bool ctl_obj_bin(const msgpack_object *o, ctl_str *out)
{
    if (!o || o->type != MSGPACK_OBJECT_BIN)
        return false;
    out->ptr = o->via.bin.ptr;
    out->len = o->via.bin.size;
    return true;
}

const msgpack_object *ctl_obj_get(const msgpack_object *o, const char *key)
{
    if (!o || o->type != MSGPACK_OBJECT_MAP || !key)
        return NULL;
    size_t klen = strlen(key);
    for (uint32_t i = 0; i < o->via.map.size; i++) {
        const msgpack_object *k = &o->via.map.ptr[i].key;
        if (k->type == MSGPACK_OBJECT_STR && k->via.str.size == klen &&
            memcmp(k->via.str.ptr, key, klen) == 0)
            return &o->via.map.ptr[i].val;
    }
    return NULL;
}

const char *ctl_obj_type_name(const msgpack_object *o)
{
    if (!o)
        return "nothing";
    switch (o->type) {
    case MSGPACK_OBJECT_NIL:
        return "nil";
    case MSGPACK_OBJECT_BOOLEAN:
        return "bool";
    case MSGPACK_OBJECT_POSITIVE_INTEGER:
    case MSGPACK_OBJECT_NEGATIVE_INTEGER:
        return "int";
    case MSGPACK_OBJECT_FLOAT32:
    case MSGPACK_OBJECT_FLOAT64:
        return "float";
    case MSGPACK_OBJECT_STR:
        return "str";
    case MSGPACK_OBJECT_BIN:
        return "bin";
    case MSGPACK_OBJECT_ARRAY:
        return "array";
    case MSGPACK_OBJECT_MAP:
        return "map";
    case MSGPACK_OBJECT_EXT:
        return "ext";
    }
    return "unknown";
}

/* ---- writing -------------------------------------------------------- */

int ctl_pack_str(msgpack_packer *pk, ctl_str s)
{
    return msgpack_pack_str_with_body(pk, s.ptr, s.len) == 0 ? 0 : -1;
}

int ctl_pack_bin(msgpack_packer *pk, ctl_str b)
{
    return msgpack_pack_bin_with_body(pk, b.ptr, b.len) == 0 ? 0 : -1;
}

int ctl_pack_cstr(msgpack_packer *pk, const char *s)
{
    return ctl_pack_str(pk, ctl_str_c(s));
}

/* ---- envelopes ------------------------------------------------------ */

int ctl_wire_pack_request(msgpack_sbuffer *sb, ctl_str op, ctl_str id,
                          const void *args, size_t args_len)
{
    msgpack_packer pk;
    msgpack_packer_init(&pk, sb, msgpack_sbuffer_write);
    if (msgpack_pack_array(&pk, 3) || ctl_pack_str(&pk, op) ||
        ctl_pack_str(&pk, id))
        return -1;
    if (!args || args_len == 0)
        return msgpack_pack_map(&pk, 0) ? -1 : 0;
    return msgpack_sbuffer_write(sb, args, args_len) ? -1 : 0;
}

int ctl_wire_pack_reply_head(msgpack_packer *pk, ctl_str id, bool ok)
{
    if (msgpack_pack_array(pk, 3) || ctl_pack_str(pk, id))
        return -1;
    return (ok ? msgpack_pack_true(pk) : msgpack_pack_false(pk)) ? -1 : 0;
}

int ctl_wire_pack_error_map(msgpack_packer *pk, ctl_kind kind, const char *msg,
                            const char *reason, const ctl_str *blobs,
                            size_t blob_count)
{
    if (msgpack_pack_map(pk, 4) || ctl_pack_cstr(pk, "kind") ||
        ctl_pack_cstr(pk, ctl_kind_name(kind)) || ctl_pack_cstr(pk, "msg") ||
        ctl_pack_cstr(pk, msg ? msg : "") || ctl_pack_cstr(pk, "reason"))
        return -1;
    if ((reason ? ctl_pack_cstr(pk, reason) : msgpack_pack_nil(pk)) ||
        ctl_pack_cstr(pk, "blobs"))
        return -1;
    if (!blobs)
        return msgpack_pack_nil(pk) ? -1 : 0;
    if (msgpack_pack_array(pk, blob_count))
        return -1;
    for (size_t i = 0; i < blob_count; i++)
        if (ctl_pack_str(pk, blobs[i]))
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
        n = load_be(c->p + c->pos + 1, 2);
        head = 3;
    } else if (b == 0xdd && c->len - c->pos >= 5) {
        n = load_be(c->p + c->pos + 1, 4);
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
        n = load_be(c->p + c->pos + 1, 2);
        head = 3;
    } else if (b == 0xdb && left >= 5) {
        n = load_be(c->p + c->pos + 1, 4);
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

ctl_decode ctl_wire_decode_request(const void *data, size_t len,
                                   const ctl_limits *limits,
                                   msgpack_zone *zone, ctl_request_view *out,
                                   char *why, size_t why_len)
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
    if (read_body(&c, limits, zone, &out->args, "args", why, why_len) != 0)
        return CTL_DECODE_BAD;
    if (out->args.type != MSGPACK_OBJECT_MAP) {
        snprintf(why, why_len, "args must be a map, not %s",
                 ctl_obj_type_name(&out->args));
        return CTL_DECODE_BAD;
    }
    return CTL_DECODE_OK;
}

int ctl_wire_decode_reply(const void *data, size_t len,
                          const ctl_limits *limits, msgpack_zone *zone,
                          ctl_reply_view *out, char *why, size_t why_len)
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

/* ---- rebuilding errors ---------------------------------------------- */

int ctl_error_from_reply(ctl_error *err, const char *address, const char *op,
                         const msgpack_object *body)
{
    char shown[CTL_SHOW_BUF];
    ctl_str kind, msg = {"", 0}, reason = {NULL, 0};
    const msgpack_object *o_kind = ctl_obj_get(body, "kind");
    const msgpack_object *o_msg = ctl_obj_get(body, "msg");
    const msgpack_object *o_reason = ctl_obj_get(body, "reason");
    const msgpack_object *o_blobs = ctl_obj_get(body, "blobs");

    if (!body || body->type != MSGPACK_OBJECT_MAP)
        return ctl_error_transfer(err, CTL_CAUSE_BAD_REPLY,
                                  "%s at %s: error reply is a %s, not a map",
                                  op, address, ctl_obj_type_name(body));
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
         * unit's way of saying the call failed. */
        ctl_error_transfer(err, CTL_CAUSE_REMOTE, "%s at %s: %s error: %.*s",
                           op, address, ctl_show(shown, sizeof shown, kind),
                           msg_len, msg.ptr);
        if (err)
            err->remote_kind = ctl_strndup(kind.ptr, kind.len);
        return CTL_TRANSFER;
    }
    }
}
