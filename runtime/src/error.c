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

#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "util_int.h"

static const char fallback_msg[] = "out of memory while reporting an error";

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

/* Take what `err` holds out of it, leaving it empty: every setter builds
 * the new error first and releases the old one last, so its arguments may
 * point into the error they replace (wrapping a message in place:
 * ctl_error_set(err, k, "ctx: %s", err->msg)). */
static ctl_error detach(ctl_error *err)
{
    ctl_error old = *err;
    memset(err, 0, sizeof *err);
    return old;
}

/* Set kind and message on an empty error. */
static void fill(ctl_error *err, ctl_kind kind, const char *fmt, va_list ap)
    CTL_PRINTF(3, 0);

static void fill(ctl_error *err, ctl_kind kind, const char *fmt, va_list ap)
{
    err->kind = kind;
    char *msg = ctl_vasprintf(fmt, ap);
    err->msg = msg ? msg : (char *)fallback_msg;
}

int ctl_error_setv(ctl_error *err, ctl_kind kind, const char *fmt, va_list ap)
{
    if (!err)
        return kind;
    ctl_error old = detach(err);
    fill(err, kind, fmt, ap);
    ctl_error_fini(&old);
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

/* Append " (details lost: out of memory)" to the message, if that much
 * memory is left; the kind stays. */
static void details_lost(ctl_error *err)
{
    static const char note[] = " (details lost: out of memory)";
    if (err->msg == fallback_msg)
        return;
    size_t n = strlen(err->msg);
    char *longer = realloc(err->msg, n + sizeof note);
    if (!longer)
        return;
    memcpy(longer + n, note, sizeof note);
    err->msg = longer;
}

/* A NUL-terminated copy of the reason; false when out of memory. */
static bool copy_reason(ctl_error *err, const char *reason)
{
    if (!reason)
        return true;
    err->reason = ctl_strndup(reason, strlen(reason));
    return err->reason != NULL;
}

/* Copy `count` ids into err->blobs; false (and none kept) when out of
 * memory. */
static bool copy_blobs(ctl_error *err, const ctl_str *blobs, size_t count)
{
    if (count == 0)
        return true;
    err->blobs = calloc(count, sizeof *err->blobs);
    if (!err->blobs)
        return false;
    for (size_t i = 0; i < count; i++) {
        char *copy = ctl_strndup(blobs[i].ptr, blobs[i].len);
        if (!copy) {
            for (size_t j = 0; j < i; j++)
                free((char *)err->blobs[j].ptr);
            free(err->blobs);
            err->blobs = NULL;
            return false;
        }
        err->blobs[i].ptr = copy;
        err->blobs[i].len = blobs[i].len;
    }
    err->blob_count = count;
    return true;
}

int ctl_error_busyv(ctl_error *err, const char *reason, const char *fmt,
                    va_list ap)
{
    if (!err)
        return CTL_BUSY;
    ctl_error old = detach(err);
    fill(err, CTL_BUSY, fmt, ap);
    if (!copy_reason(err, reason))
        details_lost(err);
    ctl_error_fini(&old);
    return CTL_BUSY;
}

int ctl_error_busy(ctl_error *err, const char *reason, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    ctl_error_busyv(err, reason, fmt, ap);
    va_end(ap);
    return CTL_BUSY;
}

int ctl_error_declaredv(ctl_error *err, const char *kind, int code,
                        const char *reason, const char *fmt, va_list ap)
{
    if (!err)
        return CTL_DECLARED;
    ctl_error old = detach(err);
    fill(err, CTL_DECLARED, fmt, ap);
    int rc = CTL_DECLARED;
    err->code = code;
    err->remote_kind = kind ? ctl_strndup(kind, strlen(kind)) : NULL;
    if (!err->remote_kind) {
        /* A declared error without its name cannot be told apart. */
        err->kind = CTL_TRANSFER;
        err->cause = CTL_CAUSE_NOMEM;
        err->code = 0;
        details_lost(err);
        rc = CTL_TRANSFER;
    } else if (!copy_reason(err, reason)) {
        details_lost(err);
    }
    ctl_error_fini(&old);
    return rc;
}

int ctl_error_declared(ctl_error *err, const char *kind, int code, const char *reason,
                       const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    int rc = ctl_error_declaredv(err, kind, code, reason, fmt, ap);
    va_end(ap);
    return rc;
}

int ctl_error_missingv(ctl_error *err, const ctl_str *blobs, size_t count,
                       const char *fmt, va_list ap)
{
    if (!err)
        return CTL_MISSING;
    ctl_error old = detach(err);
    fill(err, CTL_MISSING, fmt, ap);
    if (!copy_blobs(err, blobs, count))
        details_lost(err);
    ctl_error_fini(&old);
    return CTL_MISSING;
}

int ctl_error_missing(ctl_error *err, const ctl_str *blobs, size_t count,
                      const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    ctl_error_missingv(err, blobs, count, fmt, ap);
    va_end(ap);
    return CTL_MISSING;
}

/* A NUL-terminated copy of `s` (NULL stays NULL); false when out of
 * memory. */
static bool copy_cstr(char **dst, const char *s)
{
    *dst = s ? ctl_strndup(s, strlen(s)) : NULL;
    return !s || *dst;
}

int ctl_error_copy(ctl_error *dst, const ctl_error *src)
{
    if (!dst || !src || dst == src)
        return 0;
    ctl_error_fini(dst);
    dst->kind = src->kind;
    dst->cause = src->cause;
    dst->code = src->code;
    if (src->msg == fallback_msg)
        dst->msg = (char *)fallback_msg;
    else if (!copy_cstr(&dst->msg, src->msg))
        goto nomem;
    if (!copy_cstr(&dst->reason, src->reason) ||
        !copy_cstr(&dst->remote_kind, src->remote_kind) ||
        !copy_blobs(dst, src->blobs, src->blob_count))
        goto nomem;
    return 0;
nomem:
    return ctl_error_transfer(dst, CTL_CAUSE_NOMEM,
                              "out of memory copying an error (%s: %s)",
                              ctl_kind_name(src->kind),
                              src->msg ? src->msg : "");
}
