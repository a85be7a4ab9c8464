/*
 * error.c - kinds, causes and the ctl_error object.
 *
 * Names and descriptions come from the X-macro lists in ctlrpc/error.h, so
 * they are constant strings and can never disagree with the enum. A
 * ctl_error owns every string it points to; when an allocation fails, the
 * message falls back to a constant text (tracked by `msg_static` below being
 * the fallback pointer) so that callers always have something to print.
 */
#include "ctlrpc/error.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "util_int.h"

static const char fallback_msg[] = "out of memory while reporting an error";

ctl_str ctl_str_c(const char *s)
{
    ctl_str v = {s ? s : "", s ? strlen(s) : 0};
    return v;
}

const char *ctl_kind_name(int kind)
{
    switch (kind) {
#define CTL_KIND_NAME_(name, value, wire, desc)                               \
    case CTL_##name:                                                          \
        return wire;
        CTL_KIND_MAP(CTL_KIND_NAME_)
#undef CTL_KIND_NAME_
    default:
        return "Unknown";
    }
}

const char *ctl_strerror(int kind)
{
    switch (kind) {
#define CTL_KIND_DESC_(name, value, wire, desc)                               \
    case CTL_##name:                                                          \
        return desc;
        CTL_KIND_MAP(CTL_KIND_DESC_)
#undef CTL_KIND_DESC_
    default:
        return "unknown error kind";
    }
}

ctl_kind ctl_kind_from_wire(ctl_str name)
{
    static const ctl_kind wire_kinds[] = {CTL_UNIT_FULL, CTL_BUSY, CTL_MISSING,
                                          CTL_PROTOCOL};
    for (size_t i = 0; i < sizeof wire_kinds / sizeof wire_kinds[0]; i++) {
        const char *w = ctl_kind_name(wire_kinds[i]);
        if (strlen(w) == name.len && memcmp(w, name.ptr, name.len) == 0)
            return wire_kinds[i];
    }
    return CTL_OK;
}

const char *ctl_cause_name(ctl_cause cause)
{
    switch (cause) {
#define CTL_CAUSE_NAME_(name, str, desc)                                      \
    case CTL_CAUSE_##name:                                                    \
        return str;
        CTL_CAUSE_MAP(CTL_CAUSE_NAME_)
#undef CTL_CAUSE_NAME_
    default:
        return "unknown";
    }
}

void ctl_error_init(ctl_error *err)
{
    if (err)
        memset(err, 0, sizeof *err);
}

void ctl_error_fini(ctl_error *err)
{
    if (!err)
        return;
    if (err->msg != fallback_msg)
        free(err->msg);
    free(err->reason);
    for (size_t i = 0; i < err->blob_count; i++)
        free((char *)err->blobs[i].ptr);
    free(err->blobs);
    free(err->remote_kind);
    memset(err, 0, sizeof *err);
}

void ctl_error_clear(ctl_error *err)
{
    ctl_error_fini(err);
}

int ctl_error_setv(ctl_error *err, ctl_kind kind, const char *fmt, va_list ap)
{
    if (!err)
        return kind;
    ctl_error_fini(err);
    err->kind = kind;
    char *msg = ctl_vasprintf(fmt, ap);
    err->msg = msg ? msg : (char *)fallback_msg;
    return kind;
}

int ctl_error_set(ctl_error *err, ctl_kind kind, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    ctl_error_setv(err, kind, fmt, ap);
    va_end(ap);
    return kind;
}

int ctl_error_transfer(ctl_error *err, ctl_cause cause, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    ctl_error_setv(err, CTL_TRANSFER, fmt, ap);
    va_end(ap);
    if (err)
        err->cause = cause;
    return CTL_TRANSFER;
}

int ctl_error_busy(ctl_error *err, const char *reason, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    ctl_error_setv(err, CTL_BUSY, fmt, ap);
    va_end(ap);
    if (err && reason)
        err->reason = ctl_strndup(reason, strlen(reason));
    return CTL_BUSY;
}

/* Copy `count` ids into err->blobs; on allocation failure leaves none. */
static void set_blobs(ctl_error *err, const ctl_str *blobs, size_t count)
{
    if (count == 0)
        return;
    err->blobs = calloc(count, sizeof *err->blobs);
    if (!err->blobs)
        return;
    for (size_t i = 0; i < count; i++) {
        char *copy = ctl_strndup(blobs[i].ptr, blobs[i].len);
        if (!copy) {
            err->blob_count = i;
            return;
        }
        err->blobs[i].ptr = copy;
        err->blobs[i].len = blobs[i].len;
    }
    err->blob_count = count;
}

int ctl_error_missing(ctl_error *err, const ctl_str *blobs, size_t count,
                      const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    ctl_error_setv(err, CTL_MISSING, fmt, ap);
    va_end(ap);
    if (err)
        set_blobs(err, blobs, count);
    return CTL_MISSING;
}

int ctl_error_copy(ctl_error *dst, const ctl_error *src)
{
    if (!dst || !src || dst == src)
        return 0;
    ctl_error_fini(dst);
    dst->kind = src->kind;
    dst->cause = src->cause;
    if (src->msg) {
        dst->msg = ctl_strndup(src->msg, strlen(src->msg));
        if (!dst->msg)
            dst->msg = (char *)fallback_msg;
    }
    if (src->reason)
        dst->reason = ctl_strndup(src->reason, strlen(src->reason));
    if (src->remote_kind)
        dst->remote_kind = ctl_strndup(src->remote_kind, strlen(src->remote_kind));
    set_blobs(dst, src->blobs, src->blob_count);
    return 0;
}
