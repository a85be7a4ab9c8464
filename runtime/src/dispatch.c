/*
 * dispatch.c - the server's core (see dispatch_int.h) and the handler API
 * of ctlrpc/server.h (ctl_req_*, ctl_hold_*).
 *
 * The protocol's rules for a received message are all here, in order:
 * framing ([identity, payload] or [identity, "", payload], anything else
 * dropped and counted), the envelope (no usable op and id: dropped and
 * counted; usable id: answered), a deadline passed (skipped), an unknown
 * op with the empty id of a notify (dropped), draining (Busy), the op
 * (unknown: a Protocol error naming it), the args (bad: a Protocol error,
 * unless the op is a notify, which is never answered: dropped), the handler
 * under the lock, and the reply. The
 * built-in ops (_describe, _health, _stats: builtin.c) are answered here
 * too, without the lock and even while draining.
 *
 * Metrics: each message is timed with two reads of the monotonic clock,
 * one when it arrives and one in ctl_dispatch_done, after its reply has
 * been handed to the transport; its op's counters (ctl_op_counters) have
 * one writer, this thread, so they are bumped with relaxed loads and
 * stores, no read-modify-write.
 */
#include "dispatch_int.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "bigbuf_int.h"
#include "ctlrpc/gen.h"
#include "ctlrpc/log.h"
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
        if (svc->ops[i].name[0] == '_')
            return ctl_error_set(err, CTL_INVALID,
                                 "service %s: op '%s': names starting with '_' are "
                                 "reserved for the built-in ops", name,
                                 svc->ops[i].name);
        if (!svc->ops[i].handler)
            return ctl_error_set(err, CTL_INVALID,
                                 "service %s: op '%s' has no handler", name,
                                 svc->ops[i].name);
    }
    return 0;
}

/* ---- metrics -------------------------------------------------------- */

static const char *const builtin_names[CTL_BUILTIN_COUNT] = {"_describe", "_health",
                                                            "_stats"};
static const char *const error_names[CTL_ERR_DECLARED] = {"UnitFull", "Busy", "Missing",
                                                          "Protocol", "_other"};

/* Add to a counter this thread alone writes. */
static inline void bump(_Atomic uint64_t *c, uint64_t n)
{
    atomic_store_explicit(c, atomic_load_explicit(c, memory_order_relaxed) + n,
                          memory_order_relaxed);
}

static size_t declared_count(const ctl_op *op)
{
    return op->desc ? op->desc->declared_count : 0;
}

/* One block of error counters for every op, sized now: the metrics never
 * allocate while serving. */
static int init_op_counters(ctl_dispatch *d, const ctl_service *svc)
{
    size_t n = svc->op_count + CTL_BUILTIN_COUNT, slots = 0;
    for (size_t i = 0; i < svc->op_count; i++)
        slots += CTL_ERR_DECLARED + declared_count(&svc->ops[i]);
    slots += CTL_BUILTIN_COUNT * CTL_ERR_DECLARED;
    d->ops = calloc(n, sizeof *d->ops);
    d->error_block = calloc(slots, sizeof *d->error_block);
    if (!d->ops || !d->error_block) {
        free(d->ops);
        free(d->error_block);
        d->ops = NULL;
        d->error_block = NULL;
        return -1;
    }
    _Atomic uint64_t *next = d->error_block;
    for (size_t i = 0; i < n; i++) {
        ctl_op_counters *c = &d->ops[i];
        if (i < svc->op_count) {
            c->name = svc->ops[i].name;
            c->desc = svc->ops[i].desc;
            c->error_slots = CTL_ERR_DECLARED + declared_count(&svc->ops[i]);
        } else {
            c->name = builtin_names[i - svc->op_count];
            c->error_slots = CTL_ERR_DECLARED;
        }
        c->errors = next;
        next += c->error_slots;
    }
    return 0;
}

size_t ctl_lat_bucket(uint64_t us)
{
    if (us < 4)
        return (size_t)us;
    unsigned e = 63u - (unsigned)__builtin_clzll(us);
    size_t i = 4 + (size_t)(e - 2) * 4 + (size_t)((us >> (e - 2)) & 3);
    return i < CTL_LAT_BUCKETS ? i : CTL_LAT_BUCKETS - 1;
}

uint64_t ctl_lat_upper(size_t i)
{
    if (i < 4)
        return (uint64_t)i + 1;
    size_t e = (i - 4) / 4 + 2, sub = (i - 4) % 4;
    return (uint64_t)(5 + sub) << (e - 2);
}

/* Count an error reply (or a notify's failure) of the op being served. */
static void count_error(ctl_dispatch *d, const ctl_error *err)
{
    ctl_op_counters *c = d->cur;
    if (!c)
        return;
    size_t slot;
    switch (ctl_env_wire_kind(err->kind)) {
    case CTL_UNIT_FULL: slot = CTL_ERR_UNIT_FULL; break;
    case CTL_BUSY: slot = CTL_ERR_BUSY; break;
    case CTL_MISSING: slot = CTL_ERR_MISSING; break;
    case CTL_DECLARED:
        slot = CTL_ERR_OTHER;
        for (size_t i = 0; c->desc && err->remote_kind && i < c->desc->declared_count; i++)
            if (strcmp(c->desc->declared[i]->name, err->remote_kind) == 0)
                slot = CTL_ERR_DECLARED + i;
        break;
    default: slot = CTL_ERR_PROTOCOL; break;
    }
    bump(&c->errors[slot], 1);
}

const char *ctl_op_error_name(const ctl_op_counters *c, size_t slot)
{
    return slot < CTL_ERR_DECLARED ? error_names[slot]
                                   : c->desc->declared[slot - CTL_ERR_DECLARED]->name;
}

size_t ctl_dispatch_op_count(const ctl_dispatch *d)
{
    return d->service->op_count + CTL_BUILTIN_COUNT;
}

static uint64_t load(const _Atomic uint64_t *c)
{
    return atomic_load_explicit(c, memory_order_relaxed);
}

void ctl_dispatch_op_stats(const ctl_dispatch *d, size_t index, ctl_op_stats *out)
{
    const ctl_op_counters *c = &d->ops[index];
    uint64_t hist[CTL_LAT_BUCKETS], total = 0;
    memset(out, 0, sizeof *out);
    out->name = c->name;
    out->calls = load(&c->calls);
    out->dropped = load(&c->dropped);
    out->bytes_in = load(&c->bytes_in);
    out->bytes_out = load(&c->bytes_out);
    out->max_us = load(&c->max_us);
    for (size_t i = 0; i < c->error_slots; i++)
        out->errors += load(&c->errors[i]);
    for (size_t i = 0; i < CTL_LAT_BUCKETS; i++)
        total += hist[i] = load(&c->latency[i]);
    /* The p-th percentile is the smallest value with at least p% of the
     * calls at or below it: report its bucket's upper edge (or the max,
     * when smaller: it bounds every call too). */
    uint64_t want50 = (total * 50 + 99) / 100, want99 = (total * 99 + 99) / 100, seen = 0;
    for (size_t i = 0; total && i < CTL_LAT_BUCKETS; i++) {
        seen += hist[i];
        uint64_t edge = i == CTL_LAT_BUCKETS - 1 || ctl_lat_upper(i) > out->max_us
                            ? out->max_us
                            : ctl_lat_upper(i);
        if (!out->p50_us && seen >= want50 && hist[i])
            out->p50_us = edge;
        if (!out->p99_us && seen >= want99 && hist[i]) {
            out->p99_us = edge;
            break;
        }
    }
}

uint64_t ctl_dispatch_op_errors(const ctl_dispatch *d, size_t index, const char *kind)
{
    const ctl_op_counters *c = &d->ops[index];
    for (size_t i = 0; kind && i < c->error_slots; i++)
        if (strcmp(ctl_op_error_name(c, i), kind) == 0)
            return load(&c->errors[i]);
    return 0;
}

double ctl_dispatch_uptime(const ctl_dispatch *d)
{
    return (double)(ctl_now_ns() - d->start_ns) / 1e9;
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
    if (init_op_counters(d, service) != 0) {
        msgpack_zone_destroy(&d->zone);
        free(d->by_name);
        return ctl_error_transfer(err, CTL_CAUSE_NOMEM, "server: out of memory");
    }
    d->start_ns = ctl_now_ns();
    d->deadline_skew_ms = CTL_DEFAULT_DEADLINE_SKEW_MS;
    msgpack_sbuffer_init(&d->out);
    d->max_reply_bytes = d->limits.max_msg_bytes;
    if (lock) {
        d->lock = lock;
    } else {
        pthread_mutex_init(&d->own_lock, NULL);
        d->lock = &d->own_lock;
    }
    d->service = service;
    return 0;
}

/* Let go of the hold a handler shared (ctl_req_share). */
static void drop_share(ctl_dispatch *d)
{
    if (d->share)
        d->share->ops->unref(d->share);
    d->share = NULL;
}

/* Rewind the reply: nothing packed, nothing carried by reference. */
static void reply_clear(ctl_dispatch *d)
{
    msgpack_sbuffer_clear(&d->out);
    ctl_seg_drop(&d->seg);
}

void ctl_dispatch_fini(ctl_dispatch *d)
{
    if (!d->service)
        return;
    if (d->lock == &d->own_lock)
        pthread_mutex_destroy(&d->own_lock);
    msgpack_zone_destroy(&d->zone);
    ctl_seg_drop(&d->seg);
    drop_share(d);
    msgpack_sbuffer_destroy(&d->out);
    free(d->by_name);
    free(d->ops);
    free(d->error_block);
    d->service = NULL;
}

/* ---- replying ------------------------------------------------------- */

/* Rewind the output and pack [id, false, error-map]; leaves it empty when
 * out of memory. */
static void pack_error_reply(ctl_dispatch *d, ctl_str id, const ctl_error *err)
{
    msgpack_packer pk;
    reply_clear(d);
    msgpack_packer_init(&pk, &d->out, ctl_sbuffer_write);
    if (ctl_env_pack_reply_head(&pk, id, false) != 0 ||
        ctl_env_pack_error(&pk, err) != 0)
        msgpack_sbuffer_clear(&d->out);
}

/* The error reply to send: pack_error_reply's, or, when that is over
 * max_reply_bytes, the Protocol error saying so. */
static void pack_error(ctl_dispatch *d, ctl_str id, const ctl_error *err)
{
    pack_error_reply(d, id, err);
    if (d->out.size > d->max_reply_bytes) {
        /* An error is bounded as a result is (a Missing that lists every
         * blob of a large request): the caller hears why instead. */
        ctl_error big;
        ctl_error_init(&big);
        ctl_error_set(&big, CTL_PROTOCOL,
                      "the %s reply is %zu bytes, larger than this unit's max_reply_bytes "
                      "(%zu bytes): ask for less in one call",
                      ctl_kind_name(err->kind), d->out.size, d->max_reply_bytes);
        pack_error_reply(d, id, &big);
        ctl_error_fini(&big);
    }
}

/* The bytes of the reply so far. */
static size_t reply_size(const ctl_dispatch *d)
{
    return d->out.size + d->seg.len;
}

/* The lender of `len` bytes at `buf` (a reference), when a reply may carry
 * them by reference: the hold the handler shared, or a ctl_blob. */
static ctl_lender *lender_of(ctl_dispatch *d, const char *buf, size_t len)
{
    if (!d->lend || len < CTL_BLOB_MIN)
        return NULL;
    if (d->share && ctl_bytes_within(buf, len, d->share_view.ptr, d->share_view.len)) {
        d->share->ops->ref(d->share);
        return d->share;
    }
    return ctl_lender_find(buf, len);
}

/* The writer of a handler's reply: into `out` (a large bin of a shared
 * hold or a blob by reference), never past max_reply_bytes (so a reply
 * over the bound costs at most that much memory before it is refused). */
static int bounded_write(void *data, const char *buf, size_t len)
{
    ctl_dispatch *d = data;
    size_t used = reply_size(d);
    if (used > d->max_reply_bytes || len > d->max_reply_bytes - used) {
        d->reply_too_big = true;
        return -1;
    }
    return ctl_seg_append(&d->out, &d->seg, lender_of(d, buf, len), buf, len);
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

static ctl_verdict verdict(ctl_dispatch *d)
{
    d->reply_len = reply_size(d);
    return d->reply_len ? CTL_DISPATCH_REPLY : CTL_DISPATCH_SILENT;
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

/* A notify of `op` whose args are bad: nothing goes back; counted in the
 * op's dropped, said at debug. */
static void drop_notify(ctl_dispatch *d, const ctl_op *op, const char *why)
{
    bump(&d->cur->dropped, 1);
    if (ctl_log_enabled(CTL_LOG_DEBUG))
        ctl_log(CTL_LOG_DEBUG, "server", "%s: dropped a notify of '%s': %s",
                d->who ? d->who : "unit", op->name, why);
}

static ctl_verdict dropped(ctl_dispatch *d, const char *why)
{
    atomic_fetch_add_explicit(&d->counters.dropped, 1, memory_order_relaxed);
    if (ctl_log_enabled(CTL_LOG_DEBUG))
        ctl_log(CTL_LOG_DEBUG, "server", "%s: dropped a message: %s",
                d->who ? d->who : "unit", why);
    return CTL_DISPATCH_DROPPED;
}

/* Whether the request with id `id` is to be skipped: its id carries a
 * deadline (docs/PROTOCOL.md, "Deadlines") that passed more than the skew
 * allowance ago. Then it is counted, and logged at most once a second
 * (at info: a frozen unit that wakes may find thousands). One read of the
 * wall clock, and only for an id that carries a deadline. */
static bool expired(ctl_dispatch *d, ctl_str id, ctl_str op)
{
    int64_t deadline;
    if (d->deadline_skew_ms < 0 || !ctl_env_id_deadline(id, &deadline))
        return false;
    int64_t late = ctl_wall_ms() - deadline;
    if (late <= d->deadline_skew_ms)
        return false;
    atomic_fetch_add_explicit(&d->counters.expired, 1, memory_order_relaxed);
    if (d->cur)
        bump(&d->cur->dropped, 1);
    uint64_t skipped = 0;
    if (ctl_log_enabled(CTL_LOG_INFO) &&
        ctl_log_limit_pass(&d->expired_limit, ctl_now_ms(), &skipped)) {
        char shown[CTL_SHOW_BUF], more[80] = "";
        if (skipped)
            snprintf(more, sizeof more, CTL_LOG_LEFT_OUT_FMT, (unsigned long long)skipped);
        ctl_log(CTL_LOG_INFO, "server",
                "%s: skipped a request for '%s' unserved: its deadline passed %lld ms "
                "ago, more than the allowance of %lld ms (deadline_skew_ms), so its "
                "caller has given up%s",
                d->who ? d->who : "unit", ctl_show(shown, sizeof shown, op),
                (long long)late, (long long)d->deadline_skew_ms, more);
    }
    return true;
}

/* The built-in op named `name`, or CTL_BUILTIN_COUNT. */
static size_t find_builtin(ctl_str name)
{
    for (size_t i = 0; name.len && name.ptr[0] == '_' && i < CTL_BUILTIN_COUNT; i++)
        if (strlen(builtin_names[i]) == name.len &&
            memcmp(builtin_names[i], name.ptr, name.len) == 0)
            return i;
    return CTL_BUILTIN_COUNT;
}

/* Answer a built-in op: no lock (it reads constants and counters), served
 * while draining too. */
static ctl_verdict serve_builtin(ctl_dispatch *d, size_t which, const ctl_env_request *rq,
                                 ctl_decode dc, const char *why)
{
    const char *name = builtin_names[which];
    ctl_verdict v;
    if (dc == CTL_DECODE_BAD) {
        v = refuse(d, rq->id, "op '%s': %s", name, why);
    } else if (rq->args.via.map.size != 0) {
        char shown[CTL_SHOW_BUF];
        const msgpack_object *k = &rq->args.via.map.ptr[0].key;
        v = refuse(d, rq->id, "op '%s' takes no arguments (got '%s')", name,
                   k->type == MSGPACK_OBJECT_STR
                       ? ctl_show(shown, sizeof shown,
                                  (ctl_str){k->via.str.ptr, k->via.str.size})
                       : "a key that is not a string");
    } else if (which == CTL_BUILTIN_DESCRIBE && d->describe_off) {
        v = refuse(d, rq->id, "describe is turned off on this unit");
    } else {
        msgpack_packer pk;
        msgpack_packer_init(&pk, &d->out, ctl_sbuffer_write);
        if (ctl_env_pack_reply_head(&pk, rq->id, true) == 0 &&
            ctl_builtin_pack(d, which, &pk) == 0)
            return verdict(d);
        v = refuse(d, rq->id, "op '%s': out of memory packing the reply", name);
    }
    bump(&d->cur->errors[CTL_ERR_PROTOCOL], 1);
    return v;
}

ctl_verdict ctl_dispatch_message(ctl_dispatch *d, const ctl_inbound *in,
                                 bool *delimited)
{
    char why[160];
    char shown[CTL_SHOW_BUF];
    ctl_env_request rq;

    d->cur_t0_ns = ctl_now_ns();
    d->cur = NULL;
    d->reply_len = 0;
    atomic_store_explicit(&d->in_flight, 1, memory_order_relaxed);
    /* Every frame after the identity, of a dropped message too. */
    bump(&d->counters.bytes_in, in->delimiter_len + in->payload_len + in->discarded_len);
    reply_clear(d);
    *delimited = in->frames == 3 && in->delimiter_len == 0;
    if (in->frames < 2 || in->frames > 3 || (in->frames == 3 && !*delimited)) {
        snprintf(why, sizeof why, "%zu frames (%s)", in->frames,
                 in->frames == 3 ? "the middle one is not empty"
                                 : "expected [identity, payload]");
        return dropped(d, why);
    }
    ctl_decode dc = ctl_env_decode_request(in->payload, in->payload_len,
                                           &d->limits, &d->zone, &rq, why,
                                           sizeof why);
    if (dc == CTL_DECODE_DROP)
        return dropped(d, why);
    atomic_fetch_add_explicit(&d->counters.requests, 1, memory_order_relaxed);
    size_t builtin = find_builtin(rq.op);
    const ctl_op *op = builtin < CTL_BUILTIN_COUNT ? NULL : find_op(d, rq.op);
    if (op || builtin < CTL_BUILTIN_COUNT) {
        d->cur = &d->ops[op ? (size_t)(op - d->service->ops)
                            : d->service->op_count + builtin];
        bump(&d->cur->calls, 1);
        bump(&d->cur->bytes_in, in->payload_len);
    } else {
        atomic_fetch_add_explicit(&d->counters.unknown_op, 1, memory_order_relaxed);
    }
    if (builtin < CTL_BUILTIN_COUNT)
        return serve_builtin(d, builtin, &rq, dc, why);
    /* Before anything else is done for it: its caller waits no more. */
    if (expired(d, rq.id, rq.op))
        return CTL_DISPATCH_SILENT;
    if (!op && rq.id.len == 0)
        /* The empty id is a notify's (PROTOCOL.md): of an op newer than
         * this unit. A notify gets nothing back, not even an error (nor
         * Busy while draining): its client reads no reply, and one would
         * come to its next call. */
        return dropped(d, "a notify of an op this unit does not know");
    if (d->draining) {
        ctl_error err;
        if (op && (op->flags & CTL_OP_NOREPLY)) {
            bump(&d->cur->dropped, 1);
            return CTL_DISPATCH_SILENT;
        }
        ctl_error_init(&err);
        ctl_error_busy(&err, "draining", "unit is shutting down: retry at another unit "
                       "or later");
        count_error(d, &err);
        pack_error(d, rq.id, &err);
        ctl_error_fini(&err);
        return verdict(d);
    }
    if (op && !(op->flags & CTL_OP_NOREPLY) && d->max_queued_reply_bytes &&
        in->unread_reply_bytes >= d->max_queued_reply_bytes) {
        /* Not run: its reply would join the ones its peer has not read. A
         * notify makes no reply and is served. */
        ctl_error err;
        ctl_error_init(&err);
        ctl_error_busy(&err, "replies_unread",
                       "op '%s': %zu bytes of replies to this connection are unread "
                       "(max_queued_reply_bytes %zu): read them, then retry",
                       op->name, in->unread_reply_bytes, d->max_queued_reply_bytes);
        count_error(d, &err);
        pack_error(d, rq.id, &err);
        ctl_error_fini(&err);
        return verdict(d);
    }
    if (!op)
        return refuse(d, rq.id, "unknown op '%s' (service %s)",
                      ctl_show(shown, sizeof shown, rq.op), d->service->name);
    bool noreply = (op->flags & CTL_OP_NOREPLY) != 0;
    if (dc == CTL_DECODE_BAD) {
        if (noreply) {
            drop_notify(d, op, why);
            return CTL_DISPATCH_SILENT;
        }
        bump(&d->cur->errors[CTL_ERR_PROTOCOL], 1);
        return refuse(d, rq.id, "op '%s': %s", op->name, why);
    }

    ctl_req req = {.d = d, .in = in, .op = op, .op_name = rq.op, .id = rq.id};
    ctl_error_init(&req.err);
    d->reply_too_big = false;
    msgpack_packer_init(&req.pk, d, bounded_write);
    bool head_ok = ctl_env_pack_reply_head(&req.pk, rq.id, true) == 0;
    size_t head_len = d->out.size;

    pthread_mutex_lock(d->lock);
    int rc = head_ok ? op->handler(d->user, &rq.args, &req) : -1;
    pthread_mutex_unlock(d->lock);

    if (noreply) {
        if (rc != 0 && req.bad_args) {
            /* Its args would not decode: dropped, as an undecodable args
             * map is above. */
            drop_notify(d, op, req.err.msg ? req.err.msg : "bad args");
        } else if (rc != 0) {
            if (!req.failed)
                ctl_error_set(&req.err, CTL_PROTOCOL, "op '%s' failed", op->name);
            count_error(d, &req.err);
        }
        ctl_error_fini(&req.err);
        reply_clear(d);
        return CTL_DISPATCH_SILENT;
    }
    if (d->reply_too_big) {
        /* Whatever the handler made of its failed packing: the reply would
         * not fit the bound, which is what the caller must hear. */
        rc = ctl_req_fail(&req, CTL_PROTOCOL,
                          "op '%s': the reply is larger than this unit's max_reply_bytes "
                          "(%zu bytes): ask for less in one call",
                          op->name, d->max_reply_bytes);
    } else if (!head_ok || (rc == 0 && d->out.size == head_len &&
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
        count_error(d, &named);
        pack_error(d, rq.id, &named);
        ctl_error_fini(&named);
    } else if (rc != 0) {
        count_error(d, &req.err);
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
    if (ok) {
        bump(&d->counters.bytes_out, d->reply_len);
        if (d->cur)
            bump(&d->cur->bytes_out, d->reply_len);
    }
}

void ctl_dispatch_done(ctl_dispatch *d)
{
    ctl_op_counters *c = d->cur;
    if (c) {
        int64_t ns = ctl_now_ns() - d->cur_t0_ns;
        uint64_t us = ns > 0 ? (uint64_t)ns / 1000 : 0;
        bump(&c->latency[ctl_lat_bucket(us)], 1);
        if (us > atomic_load_explicit(&c->max_us, memory_order_relaxed))
            atomic_store_explicit(&c->max_us, us, memory_order_relaxed);
        d->cur = NULL;
    }
    atomic_store_explicit(&d->in_flight, 0, memory_order_relaxed);
    msgpack_zone_clear(&d->zone);
    ctl_seg_drop(&d->seg);
    drop_share(d);
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

size_t ctl_req_reply_room(const ctl_req *req)
{
    const ctl_dispatch *d = req->d;
    size_t used = reply_size(d);
    return used < d->max_reply_bytes ? d->max_reply_bytes - used : 0;
}

size_t ctl_req_max_reply(const ctl_req *req)
{
    return req->d->max_reply_bytes;
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
    h->lender = NULL;
    return h;
}

ctl_hold *ctl_req_hold(ctl_req *req, ctl_str view)
{
    const ctl_inbound *in = req->in;
    if (view.len && (!view.ptr ||
                     !ctl_bytes_within(view.ptr, view.len, in->payload, in->payload_len)))
        return NULL;
    size_t off = view.len ? (size_t)(view.ptr - (const char *)in->payload) : 0;
    if (in->hold)
        return in->hold(in->msg, off, view.len);
    return copy_hold((const char *)in->payload + off, view.len);
}

void ctl_req_share(ctl_req *req, const ctl_hold *hold)
{
    ctl_dispatch *d = req->d;
    if (!hold || !hold->lender || !d->lend)
        return;
    drop_share(d);
    hold->lender->ops->ref(hold->lender);
    d->share = hold->lender;
    d->share_view = hold->view;
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
