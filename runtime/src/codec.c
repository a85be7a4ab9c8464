/*
 * codec.c - see ctlrpc/codec.h.
 *
 * The path is written from the end of its buffer towards the start, because
 * it is known innermost first (the failing value), outermost last. A path
 * that would not fit keeps its innermost part and starts with "...".
 */
#include "ctlrpc/codec.h"

#include <inttypes.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include "util_int.h"

static void *req_alloc(void *owner, size_t size)
{
    return ctl_req_alloc(owner, size);
}

static void *reply_alloc(void *owner, size_t size)
{
    return ctl_reply_alloc(owner, size);
}

static void dec_init(ctl_dec *d, void *(*alloc)(void *, size_t), void *owner)
{
    d->alloc = alloc;
    d->owner = owner;
    d->path_start = sizeof d->path - 1;
    d->path[d->path_start] = '\0';
    d->what[0] = '\0';
    d->cut = 0;
}

void ctl_dec_init_req(ctl_dec *d, ctl_req *req)
{
    dec_init(d, req_alloc, req);
}

void ctl_dec_init_reply(ctl_dec *d, ctl_reply *reply)
{
    dec_init(d, reply_alloc, reply);
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

int ctl_key_is(const msgpack_object *key, const char *name, size_t name_len)
{
    return key->type == MSGPACK_OBJECT_STR && key->via.str.size == name_len &&
           memcmp(key->via.str.ptr, name, name_len) == 0;
}
