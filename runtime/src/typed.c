/*
 * typed.c - the decoding context and the type descriptors' interpreter of
 * ctlrpc/gen.h: every value of every generated type is packed and decoded
 * here, by its ctl_type.
 *
 * The path of a decoding failure is written from the end of its buffer
 * towards the start, because it is known innermost first (the failing
 * value), outermost last. A path that would not fit keeps its innermost
 * part and starts with "...".
 *
 * Pointers inside generated structs (a list's `items`, an optional
 * record's `const R *`) have the generated element type; they are read and
 * written here with memcpy as `const void *`, which has the same
 * representation on every platform ctlrpc supports.
 */
#include "typed_int.h"

#include <inttypes.h>
#include <stdbool.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "util_int.h"

void ctl_dec_init(ctl_dec *d, ctl_alloc_fn alloc, void *owner)
{
    d->alloc = alloc;
    d->owner = owner;
    d->path_start = sizeof d->path - 1;
    d->path[d->path_start] = '\0';
    d->what[0] = '\0';
    d->cut = 0;
}

void *ctl_dec_alloc(ctl_dec *d, size_t n, size_t size)
{
    if (size && n > SIZE_MAX / size) {
        ctl_dec_fail(d, "%zu elements are too many", n);
        return NULL;
    }
    size_t bytes = n * size;
    void *p = d->alloc(d->owner, bytes ? bytes : 1);
    if (!p) {
        ctl_dec_fail(d, "out of memory for %zu elements", n);
        return NULL;
    }
    memset(p, 0, bytes ? bytes : 1);
    return p;
}

/* The IDL's integer types: for them an integer that does not fit is named
 * with its value, since "expected u32, got int" would not say what is
 * wrong with it. */
static int is_int_type(const char *name)
{
    return strcmp(name, "i32") == 0 || strcmp(name, "i64") == 0 ||
           strcmp(name, "u32") == 0 || strcmp(name, "u64") == 0;
}

int ctl_dec_mismatch(ctl_dec *d, const char *expected, const msgpack_object *got)
{
    if (got && is_int_type(expected)) {
        if (got->type == MSGPACK_OBJECT_POSITIVE_INTEGER)
            return ctl_dec_fail(d, "expected %s, got %" PRIu64 " (out of range)",
                                expected, got->via.u64);
        if (got->type == MSGPACK_OBJECT_NEGATIVE_INTEGER)
            return ctl_dec_fail(d, "expected %s, got %" PRId64 " (out of range)",
                                expected, got->via.i64);
    }
    return ctl_dec_fail(d, "expected %s, got %s", expected,
                        ctl_obj_type_name(got));
}

int ctl_dec_fail(ctl_dec *d, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(d->what, sizeof d->what, fmt, ap);
    va_end(ap);
    return -1;
}

static void prepend(ctl_dec *d, const char *text, size_t len)
{
    if (d->cut)
        return;
    if (len + 3 > d->path_start) {
        /* No room: mark the cut; the innermost part is what matters. A
         * kept part that starts with the "." of a key shares it with the
         * mark ("...key.label", not "....key.label"). */
        size_t mark = d->path[d->path_start] == '.' ? 2 : 3;
        d->path_start -= mark;
        memcpy(d->path + d->path_start, "...", mark);
        d->cut = 1;
        return;
    }
    d->path_start -= len;
    memcpy(d->path + d->path_start, text, len);
}

int ctl_dec_at_index(ctl_dec *d, size_t index)
{
    char buf[32];
    int n = snprintf(buf, sizeof buf, "[%zu]", index);
    prepend(d, buf, (size_t)n);
    return -1;
}

int ctl_dec_at_key(ctl_dec *d, ctl_str key)
{
    char shown[CTL_SHOW_BUF];
    char buf[CTL_SHOW_BUF + 2];
    int n = snprintf(buf, sizeof buf, ".%s", ctl_show(shown, sizeof shown, key));
    prepend(d, buf, (size_t)n);
    return -1;
}

const char *ctl_dec_where(const ctl_dec *d)
{
    return d->path + d->path_start;
}

const char *ctl_dec_what(const ctl_dec *d)
{
    return d->what;
}


/* ---- the scalars ----------------------------------------------------- */

#define CTL_SCALAR_(name, kind_, ctype)                                       \
    const ctl_type ctl_type_##name = {                                        \
        .kind = kind_, .idl = #name, .size = sizeof(ctype)};
CTL_SCALAR_(bool, CTL_TYPE_BOOL, bool)
CTL_SCALAR_(i32, CTL_TYPE_I32, int32_t)
CTL_SCALAR_(i64, CTL_TYPE_I64, int64_t)
CTL_SCALAR_(u32, CTL_TYPE_U32, uint32_t)
CTL_SCALAR_(u64, CTL_TYPE_U64, uint64_t)
CTL_SCALAR_(f64, CTL_TYPE_F64, double)
CTL_SCALAR_(str, CTL_TYPE_STR, ctl_str)
CTL_SCALAR_(bin, CTL_TYPE_BIN, ctl_str)
#undef CTL_SCALAR_

/* A list's or a map's C value, as laid out by the generator. */
typedef struct seq {
    const void *items;
    size_t count;
} seq;

static const void *load_ptr(const void *at)
{
    const void *p;
    memcpy(&p, at, sizeof p);
    return p;
}

static void store_ptr(void *at, const void *p)
{
    memcpy(at, &p, sizeof p);
}

static seq load_seq(const void *at)
{
    seq s;
    memcpy(&s, at, sizeof s);
    return s;
}

static const char *at(const void *base, size_t offset)
{
    return (const char *)base + offset;
}

/* ---- packing --------------------------------------------------------- */

/* Whether the value at `v` equals the default at `def` (both of type `t`):
 * then an arg is left out of the request. Numbers compare bit for bit, so
 * -0.0 and NaN payloads are sent as given. */
static bool is_default(const ctl_type *t, const void *v, const void *def)
{
    switch (t->kind) {
    case CTL_TYPE_STR:
    case CTL_TYPE_BIN: {
        const ctl_str *a = v, *b = def;
        return a->len == b->len && (a->len == 0 || memcmp(a->ptr, b->ptr, a->len) == 0);
    }
    case CTL_TYPE_LIST:
    case CTL_TYPE_MAP: /* only an empty one is ever a default */
        return load_seq(v).count == 0 && load_seq(def).count == 0;
    case CTL_TYPE_OPTIONAL: {
        if (t->by_pointer)
            return load_ptr(v) == NULL && load_ptr(def) == NULL;
        bool pv = *(const bool *)v, pd = *(const bool *)def;
        if (pv != pd)
            return false;
        return !pv || is_default(t->elem, at(v, t->value_offset),
                                 at(def, t->value_offset));
    }
    case CTL_TYPE_RECORD: /* records have no literal defaults */
        return false;
    case CTL_TYPE_BOOL:
        return *(const bool *)v == *(const bool *)def;
    default:
        return memcmp(v, def, t->size) == 0;
    }
}

/* Whether field `f` of the args record `t` at `v` goes on the wire. */
static bool sent(const ctl_type *t, const ctl_field *f, const void *v)
{
    if (f->required || !(t->flags & CTL_RECORD_ARGS))
        return true;
    if (!t->defaults)
        return true;
    return !is_default(f->type, at(v, f->offset), at(t->defaults, f->offset));
}

/* Pack a field's name as a msgpack str in one write: the names of a
 * service are short, so header and bytes usually fit one small buffer. */
static int pack_name(msgpack_packer *pk, const ctl_field *f)
{
    char buf[32];
    if (f->name_len >= sizeof buf)
        return msgpack_pack_str_with_body(pk, f->name, f->name_len);
    buf[0] = (char)(0xa0 | f->name_len); /* fixstr: up to 31 bytes */
    memcpy(buf + 1, f->name, f->name_len);
    return pk->callback(pk->data, buf, f->name_len + 1);
}

static int pack_record(msgpack_packer *pk, const ctl_type *t, const void *v)
{
    size_t n = t->field_count;
    if (t->flags & CTL_RECORD_ARGS) {
        n = 0;
        for (size_t i = 0; i < t->field_count; i++)
            n += sent(t, &t->fields[i], v);
    }
    if (msgpack_pack_map(pk, n))
        return -1;
    for (size_t i = 0; i < t->field_count; i++) {
        const ctl_field *f = &t->fields[i];
        if (sent(t, f, v) &&
            (pack_name(pk, f) || ctl_type_pack(pk, f->type, at(v, f->offset))))
            return -1;
    }
    return 0;
}

/* Write the formatted step at path[n..] (of `cap` bytes, cut when longer);
 * the path's new length. */
static size_t path_step(char *path, size_t cap, size_t n, const char *fmt, ...)
    CTL_PRINTF(4, 5);
static size_t path_step(char *path, size_t cap, size_t n, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    int w = vsnprintf(path + n, cap - n, fmt, ap);
    va_end(ap);
    return w < 0 ? n : n + ((size_t)w < cap - n ? (size_t)w : cap - n - 1);
}

/* What in value `v` of type `t` cannot be packed, or NULL; its path from
 * `v` in path[0..] ("keys[2]", "tree.label"), path[n..] being where this
 * level's goes (of `cap` bytes, cut when longer). */
static const char *invalid_in(const ctl_type *t, const void *v, char *path, size_t cap,
                              size_t n)
{
    switch (t->kind) {
    case CTL_TYPE_STR:
    case CTL_TYPE_BIN: {
        ctl_str s;
        memcpy(&s, v, sizeof s);
        return !s.ptr && s.len ? "its ptr is NULL but its len is not 0" : NULL;
    }
    case CTL_TYPE_LIST:
    case CTL_TYPE_MAP: {
        seq s = load_seq(v);
        bool map = t->kind == CTL_TYPE_MAP;
        if (s.count && !s.items)
            return "its items are NULL but its count is not 0";
        if (s.count > UINT32_MAX)
            return "it has more than 4294967295 items";
        for (size_t i = 0; i < s.count; i++) {
            const char *item = at(s.items, i * t->elem_size);
            size_t m = path_step(path, cap, n, "[%zu]", i);
            if (map) {
                ctl_str key;
                memcpy(&key, item, sizeof key);
                if (!key.ptr && key.len)
                    return "its key's ptr is NULL but its len is not 0";
            }
            const char *why = invalid_in(t->elem, map ? item + t->value_offset : item, path,
                                         cap, m);
            if (why)
                return why;
        }
        path[n] = '\0';
        return NULL;
    }
    case CTL_TYPE_OPTIONAL:
        if (t->by_pointer) {
            const void *p = load_ptr(v);
            return p ? invalid_in(t->elem, p, path, cap, n) : NULL;
        }
        return *(const bool *)v ? invalid_in(t->elem, at(v, t->value_offset), path, cap, n)
                                : NULL;
    case CTL_TYPE_RECORD:
        for (size_t i = 0; i < t->field_count; i++) {
            const ctl_field *f = &t->fields[i];
            size_t m = path_step(path, cap, n, "%s%.*s", n ? "." : "", (int)f->name_len,
                                 f->name);
            const char *why = invalid_in(f->type, at(v, f->offset), path, cap, m);
            if (why)
                return why;
        }
        path[n] = '\0';
        return NULL;
    default:
        return NULL;
    }
}

char *ctl_type_invalid(const ctl_type *t, const void *v)
{
    char path[160] = "";
    const char *why = t && v ? invalid_in(t, v, path, sizeof path, 0) : NULL;
    if (!why)
        return NULL;
    size_t len = strlen(path) + strlen(why) + 16;
    char *text = malloc(len);
    if (text)
        snprintf(text, len, "arg %s: %s", *path ? path : "?", why);
    return text;
}

int ctl_type_pack(msgpack_packer *pk, const ctl_type *t, const void *v)
{
    switch (t->kind) {
    case CTL_TYPE_BOOL:
        return *(const bool *)v ? msgpack_pack_true(pk) : msgpack_pack_false(pk);
    case CTL_TYPE_I32:
        return msgpack_pack_int64(pk, *(const int32_t *)v);
    case CTL_TYPE_I64:
        return msgpack_pack_int64(pk, *(const int64_t *)v);
    case CTL_TYPE_U32:
        return msgpack_pack_uint64(pk, *(const uint32_t *)v);
    case CTL_TYPE_U64:
        return msgpack_pack_uint64(pk, *(const uint64_t *)v);
    case CTL_TYPE_F64:
        return msgpack_pack_double(pk, *(const double *)v);
    case CTL_TYPE_STR:
        return ctl_pack_str(pk, *(const ctl_str *)v);
    case CTL_TYPE_BIN:
        return ctl_pack_bin(pk, *(const ctl_str *)v);
    case CTL_TYPE_LIST:
    case CTL_TYPE_MAP: {
        seq s = load_seq(v);
        bool map = t->kind == CTL_TYPE_MAP;
        if (s.count > UINT32_MAX || (s.count && !s.items) ||
            (map ? msgpack_pack_map(pk, s.count) : msgpack_pack_array(pk, s.count)))
            return -1;
        for (size_t i = 0; i < s.count; i++) {
            const char *item = at(s.items, i * t->elem_size);
            if (map && ctl_pack_str(pk, *(const ctl_str *)item))
                return -1;
            if (ctl_type_pack(pk, t->elem, map ? item + t->value_offset : item))
                return -1;
        }
        return 0;
    }
    case CTL_TYPE_OPTIONAL:
        if (t->by_pointer) {
            const void *p = load_ptr(v);
            return p ? ctl_type_pack(pk, t->elem, p) : msgpack_pack_nil(pk);
        }
        return *(const bool *)v ? ctl_type_pack(pk, t->elem, at(v, t->value_offset))
                                : msgpack_pack_nil(pk);
    case CTL_TYPE_RECORD:
        return pack_record(pk, t, v);
    }
    return -1;
}

/* ---- the packed size ------------------------------------------------- */

/* msgpack's encodings as msgpack-c picks them: the smallest that holds the
 * value. Sums saturate at SIZE_MAX (a size no bound admits). */
static size_t sat_add(size_t a, size_t b)
{
    return a > SIZE_MAX - b ? SIZE_MAX : a + b;
}

static size_t uint_size(uint64_t v)
{
    return v < 128 ? 1 : v <= UINT8_MAX ? 2 : v <= UINT16_MAX ? 3 : v <= UINT32_MAX ? 5 : 9;
}

static size_t int_size(int64_t v)
{
    if (v >= 0)
        return uint_size((uint64_t)v);
    return v >= -32 ? 1 : v >= INT8_MIN ? 2 : v >= INT16_MIN ? 3 : v >= INT32_MIN ? 5 : 9;
}

/* A str, bin, array or map header for `n` (str: fixstr up to 31). */
static size_t str_head(size_t n)
{
    return n < 32 ? 1 : n <= UINT8_MAX ? 2 : n <= UINT16_MAX ? 3 : 5;
}

static size_t bin_head(size_t n)
{
    return n <= UINT8_MAX ? 2 : n <= UINT16_MAX ? 3 : 5;
}

static size_t container_head(size_t n)
{
    return n < 16 ? 1 : n <= UINT16_MAX ? 3 : 5;
}

static size_t record_size(const ctl_type *t, const void *v)
{
    size_t n = 0, size = 0;
    for (size_t i = 0; i < t->field_count; i++) {
        const ctl_field *f = &t->fields[i];
        if (!sent(t, f, v))
            continue;
        n++;
        size = sat_add(size, sat_add(str_head(f->name_len), f->name_len));
        size = sat_add(size, ctl_type_packed_size(f->type, at(v, f->offset)));
    }
    return sat_add(size, container_head(n));
}

size_t ctl_type_packed_size(const ctl_type *t, const void *v)
{
    switch (t->kind) {
    case CTL_TYPE_BOOL:
        return 1;
    case CTL_TYPE_I32:
        return int_size(*(const int32_t *)v);
    case CTL_TYPE_I64:
        return int_size(*(const int64_t *)v);
    case CTL_TYPE_U32:
        return uint_size(*(const uint32_t *)v);
    case CTL_TYPE_U64:
        return uint_size(*(const uint64_t *)v);
    case CTL_TYPE_F64:
        return 9;
    case CTL_TYPE_STR: {
        size_t n = ((const ctl_str *)v)->len;
        return sat_add(str_head(n), n);
    }
    case CTL_TYPE_BIN: {
        size_t n = ((const ctl_str *)v)->len;
        return sat_add(bin_head(n), n);
    }
    case CTL_TYPE_LIST:
    case CTL_TYPE_MAP: {
        seq s = load_seq(v);
        bool map = t->kind == CTL_TYPE_MAP;
        size_t size = container_head(s.count);
        if (s.count && !s.items)
            return size;
        for (size_t i = 0; i < s.count && size < SIZE_MAX; i++) {
            const char *item = at(s.items, i * t->elem_size);
            if (map) {
                size_t k = ((const ctl_str *)item)->len;
                size = sat_add(size, sat_add(str_head(k), k));
            }
            size = sat_add(size, ctl_type_packed_size(t->elem, map ? item + t->value_offset : item));
        }
        return size;
    }
    case CTL_TYPE_OPTIONAL:
        if (t->by_pointer) {
            const void *p = load_ptr(v);
            return p ? ctl_type_packed_size(t->elem, p) : 1;
        }
        return *(const bool *)v ? ctl_type_packed_size(t->elem, at(v, t->value_offset)) : 1;
    case CTL_TYPE_RECORD:
        return record_size(t, v);
    }
    return SIZE_MAX;
}

/* ---- decoding -------------------------------------------------------- */

/* A record or args struct at its defaults. */
static void init_record(const ctl_type *t, void *out)
{
    if (t->defaults)
        memcpy(out, t->defaults, t->size);
    else
        memset(out, 0, t->size);
}

static bool name_is(const ctl_field *f, const msgpack_object *key)
{
    return key->via.str.size == f->name_len &&
           memcmp(key->via.str.ptr, f->name, f->name_len) == 0;
}

/* The field named by the `pos`-th key of a map. Peers (ours among them)
 * send fields in declaration order, so the field at `pos` is tried first;
 * any order is found. */
static const ctl_field *find_field(const ctl_type *t, const msgpack_object *key,
                                   size_t pos, size_t *index)
{
    if (key->type != MSGPACK_OBJECT_STR)
        return NULL;
    if (pos < t->field_count && name_is(&t->fields[pos], key)) {
        *index = pos;
        return &t->fields[pos];
    }
    for (size_t i = 0; i < t->field_count; i++) {
        if (name_is(&t->fields[i], key)) {
            *index = i;
            return &t->fields[i];
        }
    }
    return NULL;
}

/*
 * A record is a map keyed by field name: unknown fields are ignored (a peer
 * may add optional ones), repeated ones refused, required ones must come.
 * An op's args are stricter: keys must be strings and unknown ones are
 * refused, naming the arg.
 */
static int decode_record(const msgpack_object *o, const ctl_type *t, void *out,
                         ctl_dec *d)
{
    bool args = (t->flags & CTL_RECORD_ARGS) != 0;
    /* One bit per field: a word on the stack for up to 64 fields. */
    uint64_t seen_word = 0;
    uint64_t *seen = &seen_word;
    if (o->type != MSGPACK_OBJECT_MAP)
        return ctl_dec_mismatch(d, t->idl, o);
    init_record(t, out);
    if (t->field_count > 64 &&
        !(seen = ctl_dec_alloc(d, (t->field_count + 63) / 64, sizeof *seen)))
        return -1;
    for (uint32_t i = 0; i < o->via.map.size; i++) {
        const msgpack_object_kv *kv = &o->via.map.ptr[i];
        size_t k = 0;
        int rc;
        if (args && kv->key.type != MSGPACK_OBJECT_STR)
            return ctl_dec_fail(d, "arg names must be strings, not %s",
                                ctl_obj_type_name(&kv->key));
        const ctl_field *f = find_field(t, &kv->key, i, &k);
        if (!f) {
            if (!args)
                continue; /* a field this side does not know */
            rc = ctl_dec_fail(d, "not an arg of %s", t->name);
        } else if (seen[k / 64] & (UINT64_C(1) << (k % 64))) {
            rc = ctl_dec_fail(d, args ? "given twice" : "field given twice");
        } else {
            seen[k / 64] |= UINT64_C(1) << (k % 64);
            rc = ctl_type_decode(&kv->val, f->type, (char *)out + f->offset, d);
        }
        if (rc)
            return ctl_dec_at_key(d, (ctl_str){kv->key.via.str.ptr,
                                               kv->key.via.str.size});
    }
    for (size_t k = 0; k < t->field_count; k++) {
        const ctl_field *f = &t->fields[k];
        if (!f->required || (seen[k / 64] & (UINT64_C(1) << (k % 64))))
            continue;
        if (args)
            return ctl_dec_fail(d, "missing required arg '%s'", f->name);
        return ctl_dec_fail(d, "record %s: missing field '%s'", t->name, f->name);
    }
    return 0;
}

static int decode_seq(const msgpack_object *o, const ctl_type *t, void *out,
                      ctl_dec *d)
{
    bool map = t->kind == CTL_TYPE_MAP;
    if (o->type != (map ? MSGPACK_OBJECT_MAP : MSGPACK_OBJECT_ARRAY))
        return ctl_dec_mismatch(d, t->idl, o);
    uint32_t n = map ? o->via.map.size : o->via.array.size;
    char *items = ctl_dec_alloc(d, n, t->elem_size);
    if (!items)
        return -1;
    for (uint32_t i = 0; i < n; i++) {
        char *item = items + (size_t)i * t->elem_size;
        if (!map) {
            if (ctl_type_decode(&o->via.array.ptr[i], t->elem, item, d))
                return ctl_dec_at_index(d, i);
            continue;
        }
        const msgpack_object_kv *kv = &o->via.map.ptr[i];
        ctl_str *key = (ctl_str *)item;
        if (!ctl_obj_str(&kv->key, key)) {
            ctl_dec_mismatch(d, "a str key", &kv->key);
            return ctl_dec_at_index(d, i);
        }
        if (ctl_type_decode(&kv->val, t->elem, item + t->value_offset, d))
            return ctl_dec_at_key(d, *key);
    }
    seq s = {items, n};
    memcpy(out, &s, sizeof s);
    return 0;
}

static int decode_optional(const msgpack_object *o, const ctl_type *t,
                           void *out, ctl_dec *d)
{
    bool present = o->type != MSGPACK_OBJECT_NIL;
    if (!t->by_pointer) {
        *(bool *)out = present;
        return present ? ctl_type_decode(o, t->elem, (char *)out + t->value_offset, d)
                       : 0;
    }
    void *value = NULL;
    if (present) {
        value = ctl_dec_alloc(d, 1, t->elem->size);
        if (!value || ctl_type_decode(o, t->elem, value, d))
            return -1;
    }
    store_ptr(out, value);
    return 0;
}

int ctl_type_decode(const msgpack_object *o, const ctl_type *t, void *out,
                    ctl_dec *d)
{
    bool ok;
    switch (t->kind) {
    case CTL_TYPE_BOOL:
        ok = ctl_obj_bool(o, out);
        break;
    case CTL_TYPE_I32:
        ok = ctl_obj_i32(o, out);
        break;
    case CTL_TYPE_I64:
        ok = ctl_obj_i64(o, out);
        break;
    case CTL_TYPE_U32:
        ok = ctl_obj_u32(o, out);
        break;
    case CTL_TYPE_U64:
        ok = ctl_obj_u64(o, out);
        break;
    case CTL_TYPE_F64:
        ok = ctl_obj_f64(o, out);
        break;
    case CTL_TYPE_STR:
        ok = ctl_obj_str(o, out);
        break;
    case CTL_TYPE_BIN:
        ok = ctl_obj_bin(o, out);
        break;
    case CTL_TYPE_LIST:
    case CTL_TYPE_MAP:
        return decode_seq(o, t, out, d);
    case CTL_TYPE_OPTIONAL:
        return decode_optional(o, t, out, d);
    case CTL_TYPE_RECORD:
        return decode_record(o, t, out, d);
    default:
        return ctl_dec_fail(d, "unknown type kind %d", (int)t->kind);
    }
    return ok ? 0 : ctl_dec_mismatch(d, t->idl, o);
}
