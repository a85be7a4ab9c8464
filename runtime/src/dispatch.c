/*
 * dispatch.c - the server's core (see dispatch_int.h) and the handler API
 * of ctlrpc/server.h (ctl_req_*, ctl_hold_*).
 *
 * The protocol's rules for a received message are all here, in order:
 * framing ([identity, payload] or [identity, "", payload], anything else
 * dropped and counted), the envelope (no usable op and id: dropped and
 * counted; usable id: answered), the op (unknown: a Protocol error naming
 * it), the args (bad: a Protocol error, unless the op is a notify, which is
 * never answered), the handler under the lock, and the reply.
 */
#include "dispatch_int.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ctlrpc/gen.h"
#include "envelope_int.h"
#include "util_int.h"

#define ZONE_CHUNK 8192

/* ---- the op index --------------------------------------------------- */

static int cmp_op(const void *a, const void *b)
{
    const ctl_op *x = *(const ctl_op *const *)a;
    const ctl_op *y = *(const ctl_op *const *)b;
    return strcmp(x->name, y->name);
}

static const ctl_op *find_op(const ctl_dispatch *d, ctl_str name)
{
    size_t lo = 0, hi = d->service->op_count;
    while (lo < hi) {
        size_t mid = lo + (hi - lo) / 2;
        const char *n = d->by_name[mid]->name;
        size_t nlen = strlen(n);
        int c = memcmp(n, name.ptr, nlen < name.len ? nlen : name.len);
        if (c == 0)
            c = nlen < name.len ? -1 : nlen > name.len ? 1 : 0;
        if (c == 0)
            return d->by_name[mid];
        if (c < 0)
            lo = mid + 1;
        else
            hi = mid;
    }
    return NULL;
}

static int check_service(const ctl_service *svc, ctl_error *err)
{
    if (!svc)
        return ctl_error_set(err, CTL_INVALID, "server: service is NULL");
    const char *name = svc->name ? svc->name : "(unnamed)";
    if (svc->op_count && !svc->ops)
        return ctl_error_set(err, CTL_INVALID,
                             "service %s: %zu ops but no op table", name,
                             svc->op_count);
    for (size_t i = 0; i < svc->op_count; i++) {
        if (!svc->ops[i].name || !*svc->ops[i].name)
            return ctl_error_set(err, CTL_INVALID,
                                 "service %s: op #%zu has no name", name, i);
        if (!svc->ops[i].handler)
            return ctl_error_set(err, CTL_INVALID,
                                 "service %s: op '%s' has no handler", name,
                                 svc->ops[i].name);
    }
    return 0;
}

int ctl_dispatch_init(ctl_dispatch *d, const ctl_service *service, void *user,
                      pthread_mutex_t *lock, const ctl_limits *limits,
                      ctl_error *err)
{
    int rc = check_service(service, err);
    memset(d, 0, sizeof *d);
    if (rc)
        return rc;
    /* `service` is set last: a dispatch without one needs no fini. */
    d->user = user;
    d->limits = ctl_limits_resolve(limits);
    d->by_name = calloc(service->op_count ? service->op_count : 1,
                        sizeof *d->by_name);
    if (!d->by_name || !msgpack_zone_init(&d->zone, ZONE_CHUNK)) {
        free(d->by_name);
        return ctl_error_transfer(err, CTL_CAUSE_NOMEM, "server: out of memory");
    }
    for (size_t i = 0; i < service->op_count; i++)
        d->by_name[i] = &service->ops[i];
    qsort(d->by_name, service->op_count, sizeof *d->by_name, cmp_op);
    for (size_t i = 1; i < service->op_count; i++) {
        if (strcmp(d->by_name[i - 1]->name, d->by_name[i]->name) == 0) {
            rc = ctl_error_set(err, CTL_INVALID,
                               "service %s: op '%s' is declared twice",
                               service->name ? service->name : "(unnamed)",
                               d->by_name[i]->name);
            msgpack_zone_destroy(&d->zone);
            free(d->by_name);
            return rc;
        }
    }
    msgpack_sbuffer_init(&d->out);
    if (lock) {
        d->lock = lock;
    } else {
        pthread_mutex_init(&d->own_lock, NULL);
        d->lock = &d->own_lock;
    }
    d->service = service;
    return 0;
}

void ctl_dispatch_fini(ctl_dispatch *d)
{
    if (!d->service)
        return;
    if (d->lock == &d->own_lock)
        pthread_mutex_destroy(&d->own_lock);
    msgpack_zone_destroy(&d->zone);
    msgpack_sbuffer_destroy(&d->out);
    free(d->by_name);
    d->service = NULL;
}

/* ---- replying ------------------------------------------------------- */

/* Rewind the output and pack [id, false, error-map]; leaves it empty when
 * out of memory. */
static void pack_error(ctl_dispatch *d, ctl_str id, const ctl_error *err)
{
    msgpack_packer pk;
    msgpack_sbuffer_clear(&d->out);
    msgpack_packer_init(&pk, &d->out, msgpack_sbuffer_write);
    if (ctl_env_pack_reply_head(&pk, id, false) != 0 ||
        ctl_env_pack_error(&pk, err) != 0)
        msgpack_sbuffer_clear(&d->out);
}

/* The name of the kind `err` holds if the op's descriptor does not list
 * it in `raises`, else NULL. Protocol (and what is sent as Protocol) is
 * implicit on every op; an op without a descriptor (a hand-written table)
 * declares nothing and is not judged. */
static const char *undeclared_kind(const ctl_op *op, const ctl_error *err)
{
    const ctl_op_desc *desc = op->desc;
    if (!desc)
        return NULL;
    switch (ctl_env_wire_kind(err->kind)) {
    case CTL_UNIT_FULL:
        return desc->raises & CTL_RAISES_UNIT_FULL ? NULL : "UnitFull";
    case CTL_BUSY:
        return desc->raises & CTL_RAISES_BUSY ? NULL : "Busy";
    case CTL_MISSING:
        return desc->raises & CTL_RAISES_MISSING ? NULL : "Missing";
    case CTL_DECLARED:
        for (size_t i = 0; err->remote_kind && i < desc->declared_count; i++)
            if (strcmp(desc->declared[i]->name, err->remote_kind) == 0)
                return NULL;
        return err->remote_kind ? err->remote_kind : "(unnamed)";
    default:
        return NULL;
    }
}

static ctl_verdict verdict(const ctl_dispatch *d)
{
    return d->out.size ? CTL_DISPATCH_REPLY : CTL_DISPATCH_SILENT;
}

/* Answer a request that never reached a handler with a Protocol error. */
static ctl_verdict refuse(ctl_dispatch *d, ctl_str id, const char *fmt, ...)
    CTL_PRINTF(3, 4);
static ctl_verdict refuse(ctl_dispatch *d, ctl_str id, const char *fmt, ...)
{
    ctl_error err;
    va_list ap;
    ctl_error_init(&err);
    va_start(ap, fmt);
    ctl_error_setv(&err, CTL_PROTOCOL, fmt, ap);
    va_end(ap);
    pack_error(d, id, &err);
    ctl_error_fini(&err);
    return verdict(d);
}

/* ---- serving -------------------------------------------------------- */

static ctl_verdict dropped(ctl_dispatch *d)
{
    atomic_fetch_add_explicit(&d->counters.dropped, 1, memory_order_relaxed);
    return CTL_DISPATCH_DROPPED;
}

ctl_verdict ctl_dispatch_message(ctl_dispatch *d, const ctl_inbound *in,
                                 bool *delimited)
{
    char why[160];
    char shown[CTL_SHOW_BUF];
    ctl_env_request rq;

    msgpack_sbuffer_clear(&d->out);
    *delimited = in->frames == 3 && in->delimiter_len == 0;
    if (in->frames < 2 || in->frames > 3 || (in->frames == 3 && !*delimited))
        return dropped(d);
    ctl_decode dc = ctl_env_decode_request(in->payload, in->payload_len,
                                           &d->limits, &d->zone, &rq, why,
                                           sizeof why);
    if (dc == CTL_DECODE_DROP)
        return dropped(d);
    atomic_fetch_add_explicit(&d->counters.requests, 1, memory_order_relaxed);
    const ctl_op *op = find_op(d, rq.op);
    if (d->draining) {
        ctl_error err;
        if (op && (op->flags & CTL_OP_NOREPLY))
            return CTL_DISPATCH_SILENT;
        ctl_error_init(&err);
        ctl_error_busy(&err, "draining", "unit is shutting down: retry at another unit "
                       "or later");
        pack_error(d, rq.id, &err);
        ctl_error_fini(&err);
        return verdict(d);
    }
    if (!op)
        return refuse(d, rq.id, "unknown op '%s' (service %s)",
                      ctl_show(shown, sizeof shown, rq.op), d->service->name);
    bool noreply = (op->flags & CTL_OP_NOREPLY) != 0;
    if (dc == CTL_DECODE_BAD)
        return noreply ? CTL_DISPATCH_SILENT
                       : refuse(d, rq.id, "op '%s': %s", op->name, why);

    ctl_req req = {.d = d, .in = in, .op = op, .op_name = rq.op, .id = rq.id};
    ctl_error_init(&req.err);
    msgpack_packer_init(&req.pk, &d->out, msgpack_sbuffer_write);
    bool head_ok = ctl_env_pack_reply_head(&req.pk, rq.id, true) == 0;
    size_t head_len = d->out.size;

    pthread_mutex_lock(d->lock);
    int rc = head_ok ? op->handler(d->user, &rq.args, &req) : -1;
    pthread_mutex_unlock(d->lock);

    if (noreply) {
        ctl_error_fini(&req.err);
        msgpack_sbuffer_clear(&d->out);
        return CTL_DISPATCH_SILENT;
    }
    if (!head_ok || (rc == 0 && d->out.size == head_len &&
                     msgpack_pack_nil(&req.pk))) {
        rc = ctl_req_fail(&req, CTL_PROTOCOL,
                          "op '%s': out of memory packing the reply", op->name);
    } else if (rc != 0 && !req.failed) {
        ctl_error_set(&req.err, CTL_PROTOCOL,
                      "op '%s' failed (handler returned %d without an error)",
                      op->name, rc);
    }
    const char *undeclared = rc != 0 ? undeclared_kind(op, &req.err) : NULL;
    if (undeclared) {
        /* The IDL is the contract: an error kind the op does not list
         * would surprise its callers, so it goes out as a Protocol error
         * that names it, and is counted. */
        ctl_error named;
        ctl_error_init(&named);
        ctl_error_set(&named, CTL_PROTOCOL,
                      "op '%s' failed with %s, which it does not declare in 'raises' "
                      "(a bug in the unit): %s",
                      op->name, undeclared, req.err.msg ? req.err.msg : "");
        atomic_fetch_add_explicit(&d->counters.undeclared, 1, memory_order_relaxed);
        pack_error(d, rq.id, &named);
        ctl_error_fini(&named);
    } else if (rc != 0) {
        pack_error(d, rq.id, &req.err);
    }
    ctl_error_fini(&req.err);
    return verdict(d);
}

void ctl_dispatch_sent(ctl_dispatch *d, bool ok)
{
    atomic_fetch_add_explicit(ok ? &d->counters.replies
                                 : &d->counters.send_failures,
                              1, memory_order_relaxed);
}

void ctl_dispatch_done(ctl_dispatch *d)
{
    msgpack_zone_clear(&d->zone);
}

/* ---- the handler API ------------------------------------------------- */

const ctl_op *ctl_req_entry(const ctl_req *req)
{
    return req->op;
}

msgpack_packer *ctl_req_packer(ctl_req *req)
{
    return &req->pk;
}

void *ctl_req_alloc(ctl_req *req, size_t size)
{
    return ctl_zone_alloc(&req->d->zone, size);
}

ctl_str ctl_req_op(const ctl_req *req)
{
    return req->op_name;
}

ctl_str ctl_req_id(const ctl_req *req)
{
    return req->id;
}

int ctl_req_fail(ctl_req *req, ctl_kind kind, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    ctl_error_setv(&req->err, kind, fmt, ap);
    va_end(ap);
    req->failed = true;
    return kind;
}

int ctl_req_busy(ctl_req *req, const char *reason, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    ctl_error_busyv(&req->err, reason, fmt, ap);
    va_end(ap);
    req->failed = true;
    return CTL_BUSY;
}

int ctl_req_missing(ctl_req *req, const ctl_str *blobs, size_t count,
                    const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    ctl_error_missingv(&req->err, blobs, count, fmt, ap);
    va_end(ap);
    req->failed = true;
    return CTL_MISSING;
}

int ctl_req_raisev(ctl_req *req, const ctl_error_kind *kind, const char *reason,
                   const char *fmt, va_list ap)
{
    ctl_error_declaredv(&req->err, kind->name, kind->code, reason, fmt, ap);
    req->failed = true;
    return CTL_DECLARED;
}

int ctl_req_raise(ctl_req *req, const char *kind, const char *reason, const char *fmt, ...)
{
    va_list ap;
    req->failed = true;
    if (!kind || !kind[0] || ctl_kind_from_wire(ctl_str_c(kind)) != CTL_OK)
        return ctl_error_set(&req->err, CTL_PROTOCOL,
                             "op '%s': ctl_req_raise: '%s' is not a declared error kind",
                             req->op->name, kind ? kind : "(null)");
    va_start(ap, fmt);
    ctl_error_declaredv(&req->err, kind, 0, reason, fmt, ap);
    va_end(ap);
    return CTL_DECLARED;
}

int ctl_req_fail_error(ctl_req *req, const ctl_error *err)
{
    ctl_error_copy(&req->err, err);
    req->failed = true;
    return ctl_env_wire_kind(req->err.kind);
}

/* A hold that owns a copy of the bytes (the view points just after it). */
static void free_copy_hold(ctl_hold *h)
{
    free(h);
}

static ctl_hold *copy_hold(const char *bytes, size_t len)
{
    if (len > SIZE_MAX - sizeof(ctl_hold))
        return NULL;
    ctl_hold *h = malloc(sizeof *h + len);
    if (!h)
        return NULL;
    char *copy = (char *)(h + 1);
    if (len)
        memcpy(copy, bytes, len);
    h->view = (ctl_str){copy, len};
    h->release = free_copy_hold;
    return h;
}

ctl_hold *ctl_req_hold(ctl_req *req, ctl_str view)
{
    const ctl_inbound *in = req->in;
    uintptr_t b = (uintptr_t)in->payload, v = (uintptr_t)view.ptr;
    size_t size = in->payload_len;
    if (view.len && (!view.ptr || v < b || v - b > size ||
                     view.len > size - (v - b)))
        return NULL;
    size_t off = view.len ? (size_t)(v - b) : 0;
    if (in->hold)
        return in->hold(in->msg, off, view.len);
    return copy_hold((const char *)in->payload + off, view.len);
}

ctl_str ctl_hold_view(const ctl_hold *hold)
{
    return hold->view;
}

void ctl_hold_release(ctl_hold **hold)
{
    if (!hold || !*hold)
        return;
    (*hold)->release(*hold);
    *hold = NULL;
}
