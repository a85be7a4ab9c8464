/*
 * codec.c - values: string views, bounded msgpack scanning, readers and
 * packers (see ctlrpc/codec.h).
 *
 * The one rule of this file: nothing a peer sends is handed to msgpack-c's
 * unpacker before ctl_wire_check has walked it. The scan is iterative (a
 * fixed stack of at most CTL_DEFAULT_MAX_DEPTH open containers), allocates
 * nothing, and refuses any container whose element count exceeds the bytes
 * left in the message, so the unpacker that runs after it allocates at most
 * one msgpack_object per object actually present (bounded by max_items).
 */
#include "ctlrpc/codec.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "util_int.h"

ctl_str ctl_str_c(const char *s)
{
    ctl_str v = {s ? s : "", s ? strlen(s) : 0};
    return v;
}

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
        uint64_t n = lenbytes ? ctl_load_be(p + 1, lenbytes) : 0;
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
        /* Written so that no sum can wrap: depth0 may be anything. */
        if (container && (depth0 >= lim.max_depth || depth + 1 > lim.max_depth - depth0)) {
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
    if (!s.ptr && s.len)
        return -1; /* nothing to copy from */
    return msgpack_pack_str_with_body(pk, s.ptr, s.len) == 0 ? 0 : -1;
}

int ctl_pack_bin(msgpack_packer *pk, ctl_str b)
{
    if (!b.ptr && b.len)
        return -1;
    return msgpack_pack_bin_with_body(pk, b.ptr, b.len) == 0 ? 0 : -1;
}

int ctl_pack_cstr(msgpack_packer *pk, const char *s)
{
    return ctl_pack_str(pk, ctl_str_c(s));
}

