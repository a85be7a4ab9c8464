/*
 * builtin.c - the results of the built-in ops every unit answers
 * (docs/PROTOCOL.md, "Built-in ops"): _describe, _health and _stats.
 *
 * dispatch.c decides whether one is answered (its args, describe_off) and
 * packs the reply's head; this file packs the result map, from the
 * service's constant tables and the counters, which it reads with relaxed
 * atomic loads: nothing here takes the unit's lock.
 */
#include "dispatch_int.h"

#include <string.h>

#include "ctlrpc/gen.h"
#include "ctlrpc/version.h"
#include "util_int.h"

/* Packing stops at the first failure (out of memory): `rc` collects it. */
typedef struct packing {
    msgpack_packer *pk;
    int rc;
} packing;

static void key(packing *p, const char *k)
{
    if (p->rc == 0)
        p->rc = ctl_pack_cstr(p->pk, k);
}

static void str(packing *p, const char *k, const char *v)
{
    key(p, k);
    if (p->rc == 0)
        p->rc = v ? ctl_pack_cstr(p->pk, v) : msgpack_pack_nil(p->pk);
}

static void u64(packing *p, const char *k, uint64_t v)
{
    key(p, k);
    if (p->rc == 0)
        p->rc = msgpack_pack_uint64(p->pk, v);
}

static void f64(packing *p, const char *k, double v)
{
    key(p, k);
    if (p->rc == 0)
        p->rc = msgpack_pack_double(p->pk, v);
}

static void map(packing *p, size_t n)
{
    if (p->rc == 0)
        p->rc = msgpack_pack_map(p->pk, n);
}

static void array(packing *p, size_t n)
{
    if (p->rc == 0)
        p->rc = msgpack_pack_array(p->pk, n);
}

static uint64_t load(const _Atomic uint64_t *c)
{
    return atomic_load_explicit(c, memory_order_relaxed);
}

static const char *service_name(const ctl_dispatch *d)
{
    return d->service->name ? d->service->name : "";
}

/* {service, version, ops, idl: [{path, text}], idl_sha256} */
static void pack_describe(const ctl_dispatch *d, packing *p)
{
    const ctl_service *svc = d->service;
    map(p, 5);
    str(p, "service", service_name(d));
    str(p, "version", ctl_version());
    key(p, "ops");
    array(p, svc->op_count);
    for (size_t i = 0; i < svc->op_count && p->rc == 0; i++)
        p->rc = ctl_pack_cstr(p->pk, svc->ops[i].name);
    key(p, "idl");
    array(p, svc->idl_files ? svc->idl_file_count : 0);
    for (size_t i = 0; svc->idl_files && i < svc->idl_file_count; i++) {
        const ctl_idl_file *f = &svc->idl_files[i];
        map(p, 2);
        str(p, "path", f->path ? f->path : "");
        key(p, "text");
        if (p->rc == 0)
            p->rc = msgpack_pack_str(p->pk, f->len);
        for (size_t c = 0; c < f->chunk_count && p->rc == 0; c++)
            p->rc = msgpack_pack_str_body(p->pk, f->chunks[c].ptr, f->chunks[c].len);
    }
    str(p, "idl_sha256", svc->idl_files && svc->idl_file_count ? svc->idl_sha256 : NULL);
}

/* {status, uptime_s, in_flight, service, version} */
static void pack_health(const ctl_dispatch *d, packing *p)
{
    /* This request is in flight itself: the others are what counts. */
    uint64_t busy = atomic_load_explicit(&d->in_flight, memory_order_relaxed);
    map(p, 5);
    str(p, "status", d->draining ? "draining" : "serving");
    f64(p, "uptime_s", ctl_dispatch_uptime(d));
    u64(p, "in_flight", busy ? busy - 1 : 0);
    str(p, "service", service_name(d));
    str(p, "version", ctl_version());
}

/* The errors map of one op: the four kinds of the wire and the op's
 * declared kinds, zero or not, and _other when not zero. */
static void pack_op_errors(const ctl_op_counters *c, packing *p)
{
    uint64_t other = load(&c->errors[CTL_ERR_OTHER]);
    map(p, c->error_slots - (other ? 0 : 1));
    for (size_t i = 0; i < c->error_slots; i++)
        if (i != CTL_ERR_OTHER || other)
            u64(p, ctl_op_error_name(c, i), load(&c->errors[i]));
}

/* The unit's errors map: every op's, added up by kind name. Declared kinds
 * may be listed by several ops; they are few, so a quadratic merge into
 * the request's scratch memory will do. */
static void pack_total_errors(ctl_dispatch *d, packing *p)
{
    size_t n = ctl_dispatch_op_count(d), slots = 0, used = 0;
    for (size_t i = 0; i < n; i++)
        slots += d->ops[i].error_slots;
    uint64_t *sums = ctl_zone_alloc(&d->zone, slots * (sizeof *sums + sizeof(char *)));
    const char **names = sums ? (const char **)(sums + slots) : NULL;
    if (!sums) {
        p->rc = -1;
        return;
    }
    for (size_t i = 0; i < CTL_ERR_DECLARED; i++) {
        names[used] = ctl_op_error_name(&d->ops[0], i);
        sums[used++] = 0;
    }
    for (size_t i = 0; i < n; i++) {
        const ctl_op_counters *c = &d->ops[i];
        for (size_t s = 0; s < c->error_slots; s++) {
            const char *name = ctl_op_error_name(c, s);
            size_t k = 0;
            while (k < used && strcmp(names[k], name) != 0)
                k++;
            if (k == used) {
                names[used] = name;
                sums[used++] = 0;
            }
            sums[k] += load(&c->errors[s]);
        }
    }
    map(p, used - (sums[CTL_ERR_OTHER] ? 0 : 1));
    for (size_t k = 0; k < used; k++)
        if (k != CTL_ERR_OTHER || sums[k])
            u64(p, names[k], sums[k]);
}

/* {service, uptime_s, totals: {...}, ops: {name: {...}}} */
static void pack_stats(ctl_dispatch *d, packing *p)
{
    const ctl_dispatch_counters *t = &d->counters;
    size_t n = ctl_dispatch_op_count(d);
    uint64_t accepted = load(&t->accepted), gone = load(&t->disconnects);
    map(p, 4);
    str(p, "service", service_name(d));
    f64(p, "uptime_s", ctl_dispatch_uptime(d));
    key(p, "totals");
    map(p, 16);
    u64(p, "requests", load(&t->requests));
    u64(p, "replies", load(&t->replies));
    u64(p, "dropped", load(&t->dropped));
    u64(p, "send_failures", load(&t->send_failures));
    u64(p, "unknown_op", load(&t->unknown_op));
    u64(p, "undeclared", load(&t->undeclared));
    key(p, "errors");
    pack_total_errors(d, p);
    u64(p, "bytes_in", load(&t->bytes_in));
    u64(p, "bytes_out", load(&t->bytes_out));
    u64(p, "auth_denied", load(&t->auth_denied));
    u64(p, "handshake_failures", load(&t->handshake_failures));
    u64(p, "accept_failures", load(&t->accept_failures));
    u64(p, "conn_refused", load(&t->conn_refused));
    u64(p, "connections", accepted > gone ? accepted - gone : 0);
    u64(p, "disconnects", gone);
    u64(p, "expired", load(&t->expired));
    key(p, "ops");
    map(p, n);
    for (size_t i = 0; i < n; i++) {
        ctl_op_stats s;
        ctl_dispatch_op_stats(d, i, &s);
        key(p, s.name);
        map(p, 8);
        u64(p, "calls", s.calls);
        key(p, "errors");
        pack_op_errors(&d->ops[i], p);
        u64(p, "dropped", s.dropped);
        u64(p, "p50_us", s.p50_us);
        u64(p, "p99_us", s.p99_us);
        u64(p, "max_us", s.max_us);
        u64(p, "bytes_in", s.bytes_in);
        u64(p, "bytes_out", s.bytes_out);
    }
}

int ctl_builtin_pack(ctl_dispatch *d, size_t which, msgpack_packer *pk)
{
    packing p = {pk, 0};
    switch (which) {
    case CTL_BUILTIN_DESCRIBE: pack_describe(d, &p); break;
    case CTL_BUILTIN_HEALTH: pack_health(d, &p); break;
    default: pack_stats(d, &p); break;
    }
    return p.rc ? -1 : 0;
}
