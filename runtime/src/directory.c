/*
 * directory.c - ctl_directory: a service's units as etcd has them, kept up
 * to date by a watch (docs/PROTOCOL.md, "Directories (readers)").
 *
 * The directory lists the prefix /ctlrpc/v1/<ns>/<service>/ once, then
 * watches it from the listing's revision + 1 on a streaming request. The
 * stream is resumed from the last event's revision + 1 when it drops, so
 * no event is missed; the directory lists again when etcd says that
 * revision was compacted, or when etcd seems to have lost its history
 * (its revision or raft term went back: a new data directory). While the
 * watch is quiet, a cheap range request every check interval tells
 * whether etcd still answers: when it does not, the membership is kept
 * and marked stale, and the watch is started again (a stream to a host
 * that vanished could otherwise hang for ever).
 *
 * Membership is an array of unit records sorted by unit id, owned by the
 * directory's thread. Each change publishes an immutable snapshot (the
 * records are reference counted, so a snapshot copies pointers, not
 * strings) under `mu`; readers take a reference.
 *
 * Threading: one thread of the directory's own does every etcd call and
 * runs the change callback; `mu` guards the current snapshot and the
 * status; ctl_directory_destroy stops the thread through an atomic flag,
 * the etcd abort flag and curl_multi_wakeup.
 */
#include <errno.h>
#include <inttypes.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "ctlrpc/log.h"
#include "ctlrpc/net.h"
#include "directory_int.h"
#include "util_int.h"

#define LOG_WHO "directory"
#define DEFAULT_START_MS 5000
#define DEFAULT_CHECK_MS 2000
#define DEFAULT_MAX_UNITS 100000

/* One unit as a value described it: immutable, shared by snapshots. */
typedef struct urec {
    atomic_int ref;
    uint64_t vhash; /* of the value's bytes (verify_history) */
    ctl_unit u;
    char strings[]; /* every string of u */
} urec;

typedef struct memb {
    ctl_membership pub;
    atomic_int ref;
    urec **recs;
    ctl_unit *units;
    const char **serving;
} memb;

typedef struct linebuf {
    char *data;
    size_t len, cap;
} linebuf;

struct ctl_directory {
    char *service, *prefix, *range_end;
    char *prefix_b64, *range_end_b64;
    ctl_etcd *etcd;
    size_t max_units;
    int check_ms;
    ctl_directory_fn on_change;
    void *user;

    pthread_mutex_t mu;
    pthread_cond_t cv; /* CLOCK_MONOTONIC; signalled on each publish */
    memb *current;
    bool stale;
    int64_t last_contact_ms;
    uint64_t changes, listings, watches, bad, failures;
    uint64_t watches_at_list; /* watches when the last listing was made */

    atomic_int stop;
    CURLM *multi;
    pthread_t thread;
    int thread_started;

    /* The thread's own (and ctl_directory_new's before it starts). */
    urec **units;
    size_t n, cap;
    int64_t rev;        /* of the membership */
    int64_t watch_from; /* the next revision the watch must deliver */
    int64_t raft_term;  /* the highest seen */
    CURL *watch;
    struct curl_slist *watch_headers;
    linebuf line;
    bool watch_created, watch_drop, need_list;
    bool resumed;       /* the watch started is a resumption, not after a listing */
    bool verify;        /* check etcd's history at verify_rev (below) */
    int64_t verify_rev;
    int64_t watch_started_ms;
    unsigned attempt;
    int64_t next_try_ms, next_check_ms;
    bool bad_logged, more_logged, stale_logged;
    bool dirty; /* membership changed since the last publish */
};

void ctl_directory_options_init(ctl_directory_options *opts)
{
    memset(opts, 0, sizeof *opts);
}

/* ---- records and snapshots ---------------------------------------------- */

static void urec_unref(urec *r)
{
    if (r && atomic_fetch_sub(&r->ref, 1) == 1)
        free(r);
}

static void memb_free(memb *m)
{
    for (size_t i = 0; i < m->pub.count; i++)
        urec_unref(m->recs[i]);
    free(m->recs);
    free(m->units);
    free(m->serving);
    free(m);
}

void ctl_membership_release(ctl_membership **m)
{
    if (!m || !*m)
        return;
    memb *im = (memb *)*m;
    if (atomic_fetch_sub(&im->ref, 1) == 1)
        memb_free(im);
    *m = NULL;
}

const char **ctl_membership_addresses(const ctl_membership *m, size_t *count)
{
    if (count)
        *count = m ? m->serving_count : 0;
    return m ? (const char **)((const memb *)m)->serving : NULL;
}

static const char *jstr(const json_t *v, const char *key)
{
    const char *s = json_string_value(json_object_get(v, key));
    return s ? s : "";
}

static uint64_t fnv1a(const char *p, size_t len)
{
    uint64_t h = 0xcbf29ce484222325ULL;
    for (size_t i = 0; i < len; i++)
        h = (h ^ (unsigned char)p[i]) * 0x100000001b3ULL;
    return h;
}

/* The record for a value, or NULL with *why saying what is wrong with it
 * (or "out of memory"). */
static urec *urec_parse(const ctl_directory *d, const char *unit_id, const char *val,
                        size_t len, int64_t mod_rev, const char **why)
{
    if (len > CTL_DIRECTORY_VALUE_MAX) {
        *why = "value larger than 4096 bytes";
        return NULL;
    }
    json_error_t jerr;
    json_t *v = json_loadb(val, len, JSON_REJECT_DUPLICATES, &jerr);
    if (!v || !json_is_object(v)) {
        *why = v ? "value is not a JSON object" : "value is not JSON";
        json_decref(v);
        return NULL;
    }
    const char *address = json_string_value(json_object_get(v, "address"));
    const json_t *state = json_object_get(v, "state");
    const json_t *service = json_object_get(v, "service");
    if (!address) {
        *why = "value has no address";
    } else if (strncmp(address, "tcp://", 6) != 0 || !address[6] ||
               strlen(address) >= CTL_ENDPOINT_MAX) {
        *why = "address is not tcp://host:port";
    } else if (!json_is_string(state)) {
        *why = "value has no state";
    } else if (service && (!json_is_string(service) ||
                           strcmp(json_string_value(service), d->service) != 0)) {
        *why = "value names another service";
    } else {
        *why = NULL;
    }
    if (*why) {
        json_decref(v);
        return NULL;
    }
    const char *fields[] = {unit_id,
                            address,
                            json_string_value(state),
                            jstr(v, "service"),
                            jstr(v, "idl_hash"),
                            jstr(v, "version"),
                            jstr(v, "host"),
                            jstr(v, "curve_public_key")};
    size_t nf = sizeof fields / sizeof fields[0], total = 0;
    for (size_t i = 0; i < nf; i++)
        total += strlen(fields[i]) + 1;
    urec *r = malloc(sizeof *r + total);
    if (!r) {
        *why = "out of memory";
        json_decref(v);
        return NULL;
    }
    atomic_init(&r->ref, 1);
    r->vhash = fnv1a(val, len);
    const char *out[8];
    char *p = r->strings;
    for (size_t i = 0; i < nf; i++) {
        size_t l = strlen(fields[i]) + 1;
        memcpy(p, fields[i], l);
        out[i] = p;
        p += l;
    }
    r->u = (ctl_unit){.unit_id = out[0],
                      .address = out[1],
                      .state = out[2],
                      .serving = strcmp(out[2], "serving") == 0,
                      .service = out[3],
                      .idl_hash = out[4],
                      .version = out[5],
                      .host = out[6],
                      .pid = ctl_json_int64(v, "pid", 0),
                      .started = ctl_json_int64(v, "started", 0),
                      .curve_public_key = out[7],
                      .mod_revision = mod_rev};
    json_decref(v);
    return r;
}

/* A bad value or key: counted, the first one logged. */
static void bad_value(ctl_directory *d, const char *key, const char *why)
{
    pthread_mutex_lock(&d->mu);
    d->bad++;
    pthread_mutex_unlock(&d->mu);
    if (!d->bad_logged) {
        char shown[CTL_SHOW_BUF];
        ctl_log(CTL_LOG_WARN, LOG_WHO,
                "%s: skipping '%s' under %s: %s (counted in bad_values; logged once)",
                d->service, ctl_show(shown, sizeof shown, ctl_str_c(key)), d->prefix, why);
        d->bad_logged = true;
    }
}

/* The position of `unit_id` in the sorted array (or where it goes). */
static size_t find(const ctl_directory *d, const char *unit_id, bool *found)
{
    size_t lo = 0, hi = d->n;
    while (lo < hi) {
        size_t mid = lo + (hi - lo) / 2;
        int c = strcmp(d->units[mid]->u.unit_id, unit_id);
        if (c == 0) {
            *found = true;
            return mid;
        }
        if (c < 0)
            lo = mid + 1;
        else
            hi = mid;
    }
    *found = false;
    return lo;
}

static void remove_unit(ctl_directory *d, const char *unit_id)
{
    bool found;
    size_t i = find(d, unit_id, &found);
    if (!found)
        return;
    urec_unref(d->units[i]);
    memmove(&d->units[i], &d->units[i + 1], (d->n - i - 1) * sizeof *d->units);
    d->n--;
    d->dirty = true;
}

/* Put `r` in (taking its reference), replacing a record of the same id. */
static void upsert(ctl_directory *d, urec *r)
{
    bool found;
    size_t i = find(d, r->u.unit_id, &found);
    if (found) {
        urec_unref(d->units[i]);
        d->units[i] = r;
        d->dirty = true;
        return;
    }
    if (d->n >= d->max_units) {
        bad_value(d, r->u.unit_id, "more units than max_units");
        urec_unref(r);
        return;
    }
    if (d->n == d->cap) {
        size_t cap = d->cap ? d->cap * 2 : 16;
        urec **more = realloc(d->units, cap * sizeof *more);
        if (!more) {
            urec_unref(r);
            return;
        }
        d->units = more;
        d->cap = cap;
    }
    memmove(&d->units[i + 1], &d->units[i], (d->n - i) * sizeof *d->units);
    d->units[i] = r;
    d->n++;
    d->dirty = true;
}

/* The unit id of a key under the prefix, or NULL (bad key, logged). */
static const char *unit_of_key(ctl_directory *d, const char *key, size_t klen)
{
    size_t plen = strlen(d->prefix);
    if (klen <= plen || memcmp(key, d->prefix, plen) != 0 || memchr(key, '\0', klen)) {
        bad_value(d, key, "key is not under the prefix");
        return NULL;
    }
    const char *id = key + plen;
    if (!ctl_directory_name_ok(id, klen - plen)) {
        bad_value(d, key, strchr(id, '/') ? "key has more parts than a unit id"
                                          : "key's unit id is not a valid name");
        return NULL;
    }
    return id;
}

/* Apply one kv (a listing's, or a PUT event's). */
static void apply_put(ctl_directory *d, const json_t *kv)
{
    const char *k64 = json_string_value(json_object_get(kv, "key"));
    const char *v64 = json_string_value(json_object_get(kv, "value"));
    char *key = NULL, *val = NULL;
    size_t klen = 0, vlen = 0;
    if (!k64 || ctl_b64_decode(k64, &key, &klen) != 0) {
        bad_value(d, "?", "key is not base64");
        return;
    }
    const char *id = unit_of_key(d, key, klen);
    if (!id) {
        free(key);
        return;
    }
    if (ctl_b64_decode(v64 ? v64 : "", &val, &vlen) != 0) {
        bad_value(d, key, "value is not base64");
        remove_unit(d, id);
        free(key);
        return;
    }
    const char *why = NULL;
    urec *r = urec_parse(d, id, val, vlen, ctl_json_int64(kv, "mod_revision", 0), &why);
    if (r) {
        upsert(d, r);
    } else {
        bad_value(d, key, why);
        remove_unit(d, id); /* its key no longer says it is a unit */
    }
    free(key);
    free(val);
}

static void apply_delete(ctl_directory *d, const json_t *kv)
{
    const char *k64 = json_string_value(json_object_get(kv, "key"));
    char *key = NULL;
    size_t klen = 0;
    if (!k64 || ctl_b64_decode(k64, &key, &klen) != 0)
        return;
    size_t plen = strlen(d->prefix);
    if (klen > plen && memcmp(key, d->prefix, plen) == 0)
        remove_unit(d, key + plen);
    free(key);
}

/* Publish the membership as a new snapshot and call back. */
static void publish(ctl_directory *d)
{
    memb *m = calloc(1, sizeof *m);
    if (m) {
        m->recs = calloc(d->n ? d->n : 1, sizeof *m->recs);
        m->units = calloc(d->n ? d->n : 1, sizeof *m->units);
        m->serving = calloc(d->n ? d->n : 1, sizeof *m->serving);
    }
    if (!m || !m->recs || !m->units || !m->serving) {
        if (m) {
            free(m->recs);
            free(m->units);
            free(m->serving);
            free(m);
        }
        return; /* out of memory: the old snapshot stays */
    }
    atomic_init(&m->ref, 2); /* the directory's and the callback's */
    size_t s = 0;
    for (size_t i = 0; i < d->n; i++) {
        atomic_fetch_add(&d->units[i]->ref, 1);
        m->recs[i] = d->units[i];
        m->units[i] = d->units[i]->u;
        if (m->units[i].serving)
            m->serving[s++] = m->units[i].address;
    }
    m->pub = (ctl_membership){.units = m->units,
                              .count = d->n,
                              .serving = m->serving,
                              .serving_count = s,
                              .revision = d->rev};
    pthread_mutex_lock(&d->mu);
    memb *old = d->current;
    d->current = m;
    d->changes++;
    pthread_cond_broadcast(&d->cv);
    pthread_mutex_unlock(&d->mu);
    d->dirty = false;
    ctl_membership *mine = &m->pub;
    if (old) {
        ctl_membership *o = &old->pub;
        ctl_membership_release(&o);
    }
    if (d->on_change)
        d->on_change(d->user, mine);
    ctl_membership_release(&mine);
}

/* ---- contact ------------------------------------------------------------ */

static void contact(ctl_directory *d)
{
    pthread_mutex_lock(&d->mu);
    d->last_contact_ms = ctl_now_ms();
    bool was = d->stale;
    d->stale = false;
    pthread_mutex_unlock(&d->mu);
    if (was && d->stale_logged) {
        ctl_log(CTL_LOG_WARN, LOG_WHO, "%s: etcd %s answers again", d->service,
                ctl_etcd_endpoints(d->etcd));
        d->stale_logged = false;
    }
}

static void failed(ctl_directory *d, const ctl_error *err)
{
    pthread_mutex_lock(&d->mu);
    d->failures++;
    d->stale = true;
    int64_t age = ctl_now_ms() - d->last_contact_ms;
    pthread_mutex_unlock(&d->mu);
    if (!d->stale_logged && !atomic_load(&d->stop)) {
        ctl_log(CTL_LOG_WARN, LOG_WHO,
                "%s: %s; keeping the membership of revision %" PRId64
                " (stale, last contact %" PRId64 " ms ago), retrying",
                d->service, err ? err->msg : "the watch stream ended", d->rev, age);
        d->stale_logged = true;
    }
}

/* A header's revision and raft term: false when etcd went back in time
 * (lost its data), which calls for a new listing. */
static bool header_ok(ctl_directory *d, const json_t *hdr, int64_t want_rev)
{
    int64_t rev = ctl_json_int64(hdr, "revision", -1);
    int64_t term = ctl_json_int64(hdr, "raft_term", 0);
    bool ok = true;
    if (rev >= 0 && rev < want_rev)
        ok = false;
    if (term && term < d->raft_term)
        ok = false;
    if (term > d->raft_term)
        d->raft_term = term;
    return ok;
}

/* ---- listing -------------------------------------------------------------- */

static int list(ctl_directory *d, ctl_error *err)
{
    json_t *body = json_pack("{s:s, s:s, s:I}", "key", d->prefix_b64, "range_end",
                             d->range_end_b64, "limit", (json_int_t)d->max_units);
    json_t *resp = NULL;
    int rc = body ? ctl_etcd_call(d->etcd, "/v3/kv/range", body, &resp, NULL, err)
                  : ctl_error_transfer(err, CTL_CAUSE_NOMEM, "out of memory");
    json_decref(body);
    if (rc)
        return rc;
    json_t *hdr = json_object_get(resp, "header");
    d->raft_term = 0; /* a listing starts the history afresh */
    header_ok(d, hdr, 0);
    int64_t rev = ctl_json_int64(hdr, "revision", 0);
    /* Replace the membership with the listing. */
    for (size_t i = 0; i < d->n; i++)
        urec_unref(d->units[i]);
    d->n = 0;
    d->dirty = true;
    size_t idx;
    json_t *kv;
    json_array_foreach(json_object_get(resp, "kvs"), idx, kv)
        apply_put(d, kv);
    if (json_is_true(json_object_get(resp, "more")) && !d->more_logged) {
        ctl_log(CTL_LOG_WARN, LOG_WHO, "%s: more than %zu keys under %s; the rest are left out",
                d->service, d->max_units, d->prefix);
        d->more_logged = true;
    }
    json_decref(resp);
    d->rev = rev;
    d->watch_from = rev + 1;
    d->need_list = false;
    d->resumed = false;
    d->verify = false;
    pthread_mutex_lock(&d->mu);
    d->listings++;
    d->watches_at_list = d->watches;
    pthread_mutex_unlock(&d->mu);
    contact(d);
    publish(d);
    return 0;
}

/* The cheap question "does etcd answer?": a count of the prefix. */
static void check(ctl_directory *d)
{
    json_t *body = json_pack("{s:s, s:s, s:b}", "key", d->prefix_b64, "range_end",
                             d->range_end_b64, "count_only", 1);
    json_t *resp = NULL;
    ctl_error err;
    ctl_error_init(&err);
    int rc = body ? ctl_etcd_call(d->etcd, "/v3/kv/range", body, &resp, NULL, &err)
                  : ctl_error_transfer(&err, CTL_CAUSE_NOMEM, "out of memory");
    json_decref(body);
    if (rc == 0) {
        contact(d);
        if (!header_ok(d, json_object_get(resp, "header"), d->rev)) {
            ctl_log(CTL_LOG_WARN, LOG_WHO, "%s: etcd's revision went back (a new data "
                    "directory?): listing again", d->service);
            d->need_list = true;
        }
    } else {
        failed(d, &err);
        d->watch_drop = true; /* the stream may hang on a vanished host */
        d->next_try_ms = ctl_now_ms() + ctl_backoff_ms(d->attempt < 20 ? d->attempt++ : d->attempt);
    }
    json_decref(resp);
    ctl_error_fini(&err);
}

/*
 * A resumed watch trusts that etcd's history up to verify_rev is the one
 * the directory saw. An etcd that lost its data (a new data directory)
 * may have reached that revision again with other changes: read the
 * prefix as of that revision and compare it with the membership (each
 * unit's key, mod_revision and value). Any difference, or a revision etcd does
 * not have, calls for a new listing.
 */
static void verify_history(ctl_directory *d)
{
    char rev[32];
    snprintf(rev, sizeof rev, "%" PRId64, d->verify_rev);
    json_t *body = json_pack("{s:s, s:s, s:s, s:I}", "key", d->prefix_b64, "range_end",
                             d->range_end_b64, "revision", rev, "limit",
                             (json_int_t)d->max_units);
    json_t *resp = NULL;
    ctl_error err;
    ctl_error_init(&err);
    int code = 0;
    int rc = body ? ctl_etcd_call(d->etcd, "/v3/kv/range", body, &resp, &code, &err)
                  : ctl_error_transfer(&err, CTL_CAUSE_NOMEM, "out of memory");
    json_decref(body);
    d->verify = false;
    bool same = rc == 0;
    size_t matched = 0, idx;
    json_t *kv;
    if (rc == 0) {
        json_array_foreach(json_object_get(resp, "kvs"), idx, kv) {
            const char *k64 = json_string_value(json_object_get(kv, "key"));
            char *key = NULL;
            size_t klen = 0, plen = strlen(d->prefix);
            if (!k64 || ctl_b64_decode(k64, &key, &klen) != 0)
                continue;
            bool found = false;
            size_t i = klen > plen ? find(d, key + plen, &found) : 0;
            if (found) {
                const char *v64 = json_string_value(json_object_get(kv, "value"));
                char *val = NULL;
                size_t vlen = 0;
                if (d->units[i]->u.mod_revision != ctl_json_int64(kv, "mod_revision", -1) ||
                    ctl_b64_decode(v64 ? v64 : "", &val, &vlen) != 0 ||
                    fnv1a(val, vlen) != d->units[i]->vhash)
                    same = false;
                free(val);
                matched++;
            }
            free(key);
        }
        if (matched != d->n)
            same = false;
    } else if (err.cause == CTL_CAUSE_REMOTE) {
        same = false; /* a future or compacted revision: not our history */
    } else {
        failed(d, &err); /* unreachable: the loop retries */
        d->watch_drop = true;
    }
    if (!same && rc != 0 && err.cause == CTL_CAUSE_REMOTE && err.msg &&
        strstr(err.msg, "compacted")) {
        /* etcd no longer keeps that revision: nothing to compare with. */
        ctl_log(CTL_LOG_INFO, LOG_WHO, "%s: revision %" PRId64 " was compacted: listing "
                "again", d->service, d->verify_rev);
        d->need_list = true;
    } else if (!same && (rc == 0 || err.cause == CTL_CAUSE_REMOTE)) {
        ctl_log(CTL_LOG_WARN, LOG_WHO, "%s: etcd's history at revision %" PRId64 " is not "
                "the one this directory saw (a new data directory?): listing again",
                d->service, d->verify_rev);
        d->need_list = true;
    }
    json_decref(resp);
    ctl_error_fini(&err);
}

/* ---- the watch ------------------------------------------------------------ */

static void watch_message(ctl_directory *d, const char *text, size_t len)
{
    json_error_t jerr;
    json_t *msg = json_loadb(text, len, 0, &jerr);
    json_t *res = json_object_get(msg, "result");
    if (!msg || !res) {
        /* {"error": ...}: the stream failed. */
        d->watch_drop = true;
        json_decref(msg);
        return;
    }
    json_t *hdr = json_object_get(res, "header");
    if (json_is_true(json_object_get(res, "created"))) {
        d->watch_created = true;
        d->attempt = 0;
        contact(d);
        if (!header_ok(d, hdr, d->watch_from - 1)) {
            ctl_log(CTL_LOG_WARN, LOG_WHO, "%s: etcd's revision went back (a new data "
                    "directory?): listing again", d->service);
            d->need_list = true;
            d->watch_drop = true;
        } else if (d->resumed) {
            d->verify = true;
            d->verify_rev = d->watch_from - 1;
        }
    }
    if (json_is_true(json_object_get(res, "canceled"))) {
        int64_t compact = ctl_json_int64(res, "compact_revision", 0);
        if (compact > 0) {
            ctl_log(CTL_LOG_INFO, LOG_WHO, "%s: revision %" PRId64 " was compacted "
                    "(etcd keeps from %" PRId64 "): listing again", d->service,
                    d->watch_from, compact);
            d->need_list = true;
        }
        d->watch_drop = true;
        json_decref(msg);
        return;
    }
    size_t i;
    json_t *ev;
    int64_t last = 0;
    /* One snapshot per etcd revision: a response may carry many (after a
     * resumed watch), and a unit's draining must not merge into its
     * removal for whoever follows the changes. */
    json_t *events = json_object_get(res, "events");
    size_t n = json_array_size(events);
    if (n)
        contact(d);
    for (i = 0; i < n; i++) {
        ev = json_array_get(events, i);
        json_t *kv = json_object_get(ev, "kv");
        const char *type = json_string_value(json_object_get(ev, "type"));
        if (type && strcmp(type, "DELETE") == 0)
            apply_delete(d, kv);
        else
            apply_put(d, kv);
        int64_t r = ctl_json_int64(kv, "mod_revision", 0);
        if (r > last)
            last = r;
        json_t *next = i + 1 < n ? json_object_get(json_array_get(events, i + 1), "kv") : NULL;
        if (next && ctl_json_int64(next, "mod_revision", 0) == r)
            continue; /* the rest of this revision first */
        if (last > 0) {
            d->rev = last;
            d->watch_from = last + 1;
        }
        if (d->dirty)
            publish(d);
    }
    json_decref(msg);
}

static size_t watch_write(char *ptr, size_t size, size_t n, void *arg)
{
    ctl_directory *d = arg;
    size_t add = size * n;
    linebuf *b = &d->line;
    if (b->len + add + 1 > CTL_ETCD_RESPONSE_MAX) {
        ctl_log(CTL_LOG_WARN, LOG_WHO, "%s: a watch message over %zu bytes: listing again",
                d->service, CTL_ETCD_RESPONSE_MAX);
        d->need_list = true;
        return 0;
    }
    if (b->len + add + 1 > b->cap) {
        size_t cap = b->cap ? b->cap : 4096;
        while (cap < b->len + add + 1)
            cap *= 2;
        char *more = realloc(b->data, cap);
        if (!more)
            return 0;
        b->data = more;
        b->cap = cap;
    }
    memcpy(b->data + b->len, ptr, add);
    b->len += add;
    /* One JSON message per line. */
    size_t start = 0;
    for (size_t i = 0; i < b->len; i++) {
        if (b->data[i] != '\n')
            continue;
        if (i > start)
            watch_message(d, b->data + start, i - start);
        start = i + 1;
        if (d->watch_drop)
            break;
    }
    memmove(b->data, b->data + start, b->len - start);
    b->len -= start;
    if (d->watch_drop)
        return 0; /* ends the transfer; the loop starts what comes next */
    return add;
}

static void watch_stop(ctl_directory *d)
{
    if (d->watch) {
        curl_multi_remove_handle(d->multi, d->watch);
        curl_easy_cleanup(d->watch);
        d->watch = NULL;
    }
    curl_slist_free_all(d->watch_headers);
    d->watch_headers = NULL;
    d->line.len = 0;
    d->watch_created = false;
    d->watch_drop = false;
}

static void watch_start(ctl_directory *d, bool rotate)
{
    char from[32];
    snprintf(from, sizeof from, "%" PRId64, d->watch_from);
    json_t *body = json_pack("{s:{s:s, s:s, s:s}}", "create_request", "key", d->prefix_b64,
                             "range_end", d->range_end_b64, "start_revision", from);
    char *text = body ? json_dumps(body, JSON_COMPACT) : NULL;
    json_decref(body);
    ctl_error err;
    ctl_error_init(&err);
    if (text)
        d->watch = ctl_etcd_stream(d->etcd, "/v3/watch", text, rotate, watch_write, d,
                                   &d->watch_headers, &err);
    free(text);
    if (!d->watch || curl_multi_add_handle(d->multi, d->watch) != CURLM_OK) {
        if (d->watch) {
            curl_easy_cleanup(d->watch);
            d->watch = NULL;
        }
        curl_slist_free_all(d->watch_headers);
        d->watch_headers = NULL;
        failed(d, err.msg[0] ? &err : NULL);
        d->next_try_ms = ctl_now_ms() + ctl_backoff_ms(d->attempt < 20 ? d->attempt++ : d->attempt);
    } else {
        d->watch_started_ms = ctl_now_ms();
        pthread_mutex_lock(&d->mu);
        d->resumed = d->watches > d->watches_at_list;
        d->watches++;
        pthread_mutex_unlock(&d->mu);
    }
    ctl_error_fini(&err);
}

static void *dir_main(void *arg)
{
    ctl_directory *d = arg;
    int timeout = ctl_etcd_timeout_ms(d->etcd);
    d->next_check_ms = ctl_now_ms() + d->check_ms;
    bool rotate = false;
    while (!atomic_load(&d->stop)) {
        int64_t now = ctl_now_ms();
        if (d->need_list && now >= d->next_try_ms) {
            watch_stop(d);
            ctl_error err;
            ctl_error_init(&err);
            if (list(d, &err) == 0) {
                d->attempt = 0;
            } else {
                failed(d, &err);
                d->next_try_ms = ctl_now_ms() + ctl_backoff_ms(d->attempt < 20 ? d->attempt++ : d->attempt);
            }
            ctl_error_fini(&err);
            now = ctl_now_ms();
            d->next_check_ms = now + d->check_ms;
        }
        if (d->watch_drop || (d->need_list && d->watch))
            watch_stop(d);
        if (!d->need_list && !d->watch && now >= d->next_try_ms) {
            watch_start(d, rotate);
            rotate = false;
        }
        if (d->watch && !d->watch_created && now - d->watch_started_ms > timeout) {
            ctl_error err;
            ctl_error_init(&err);
            ctl_error_transfer(&err, CTL_CAUSE_TIMEOUT,
                               "directory %s: etcd %s did not start the watch in %d ms",
                               d->service, ctl_etcd_endpoints(d->etcd), timeout);
            failed(d, &err);
            ctl_error_fini(&err);
            watch_stop(d);
            rotate = true;
            d->next_try_ms = now + ctl_backoff_ms(d->attempt < 20 ? d->attempt++ : d->attempt);
        }
        if (!d->need_list && now >= d->next_check_ms) {
            check(d);
            now = ctl_now_ms();
            d->next_check_ms = now + d->check_ms;
            if (d->watch_drop)
                continue;
        }
        int64_t until = d->next_check_ms;
        if ((!d->watch || d->need_list) && d->next_try_ms < until)
            until = d->next_try_ms;
        if (d->watch && !d->watch_created && d->watch_started_ms + timeout + 1 < until)
            until = d->watch_started_ms + timeout + 1;
        int wait = (int)(until > now ? until - now : 0);
        curl_multi_poll(d->multi, NULL, 0, wait, NULL);
        int running = 0;
        curl_multi_perform(d->multi, &running);
        if (d->verify && !d->need_list)
            verify_history(d);
        CURLMsg *m;
        int left;
        while ((m = curl_multi_info_read(d->multi, &left)) != NULL) {
            if (m->msg != CURLMSG_DONE || m->easy_handle != d->watch)
                continue;
            /* The stream ended: etcd closed it, or it failed, or we ended
             * it (watch_drop, need_list). Resume from watch_from. */
            bool ours = d->watch_drop || d->need_list;
            CURLcode cc = m->data.result;
            watch_stop(d);
            if (!ours && !atomic_load(&d->stop)) {
                ctl_error err;
                ctl_error_init(&err);
                ctl_error_transfer(&err, CTL_CAUSE_TRANSPORT,
                                   "directory %s: the watch stream from etcd %s ended: %s",
                                   d->service, ctl_etcd_endpoints(d->etcd),
                                   cc == CURLE_OK ? "closed by etcd"
                                   : cc == CURLE_PARTIAL_FILE
                                       ? "the connection closed mid-stream (etcd stopped?)"
                                       : curl_easy_strerror(cc));
                failed(d, &err);
                ctl_error_fini(&err);
                rotate = true;
                d->next_try_ms = ctl_now_ms() + ctl_backoff_ms(d->attempt < 20 ? d->attempt++ : d->attempt);
            }
            break;
        }
    }
    watch_stop(d);
    return NULL;
}

/* ---- the public object -------------------------------------------------- */

static void free_dir(ctl_directory *d)
{
    watch_stop(d);
    if (d->multi)
        curl_multi_cleanup(d->multi);
    ctl_etcd_destroy(&d->etcd);
    for (size_t i = 0; i < d->n; i++)
        urec_unref(d->units[i]);
    free(d->units);
    free(d->line.data);
    if (d->current) {
        ctl_membership *m = &d->current->pub;
        ctl_membership_release(&m);
    }
    free(d->service);
    free(d->prefix);
    free(d->range_end);
    free(d->prefix_b64);
    free(d->range_end_b64);
    pthread_mutex_destroy(&d->mu);
    pthread_cond_destroy(&d->cv);
    free(d);
}

int ctl_directory_new(const char *service, const ctl_directory_options *opts,
                      ctl_directory **out, ctl_error *err)
{
    if (!out)
        return ctl_error_set(err, CTL_INVALID, "directory: out is NULL");
    *out = NULL;
    ctl_directory_options defaults;
    if (!opts) {
        ctl_directory_options_init(&defaults);
        opts = &defaults;
    }
    const char *ns = opts->namespace_name ? opts->namespace_name : CTL_NAMESPACE_DEFAULT;
    if (!service || !ctl_directory_name_ok(service, strlen(service)))
        return ctl_error_set(err, CTL_INVALID,
                             "directory: service '%s' is not 1 to %d characters of "
                             "A-Z a-z 0-9 . _ - (not starting with '.')",
                             service ? service : "", CTL_DIRECTORY_NAME_MAX);
    if (!ctl_directory_name_ok(ns, strlen(ns)))
        return ctl_error_set(err, CTL_INVALID,
                             "directory: namespace '%s' is not 1 to %d characters of "
                             "A-Z a-z 0-9 . _ - (not starting with '.')", ns,
                             CTL_DIRECTORY_NAME_MAX);
    if (opts->start_timeout_ms < 0 || opts->check_interval_ms < 0)
        return ctl_error_set(err, CTL_INVALID, "directory %s: %s %d is negative", service,
                             opts->start_timeout_ms < 0 ? "start_timeout_ms"
                                                        : "check_interval_ms",
                             opts->start_timeout_ms < 0 ? opts->start_timeout_ms
                                                        : opts->check_interval_ms);
    ctl_directory *d = calloc(1, sizeof *d);
    if (!d)
        return ctl_error_transfer(err, CTL_CAUSE_NOMEM, "directory: out of memory");
    pthread_mutex_init(&d->mu, NULL);
    pthread_condattr_t ca;
    pthread_condattr_init(&ca);
    pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
    pthread_cond_init(&d->cv, &ca);
    pthread_condattr_destroy(&ca);
    d->max_units = opts->max_units ? opts->max_units : DEFAULT_MAX_UNITS;
    d->check_ms = opts->check_interval_ms ? opts->check_interval_ms : DEFAULT_CHECK_MS;
    d->on_change = opts->on_change;
    d->user = opts->user;
    d->service = strdup(service);
    d->prefix = ctl_directory_prefix(ns, service);
    d->range_end = d->prefix ? strdup(d->prefix) : NULL;
    if (d->range_end)
        d->range_end[strlen(d->range_end) - 1]++; /* '/' + 1: the prefix's end */
    d->prefix_b64 = d->prefix ? ctl_b64_encode(d->prefix, strlen(d->prefix)) : NULL;
    d->range_end_b64 = d->range_end ? ctl_b64_encode(d->range_end, strlen(d->range_end)) : NULL;
    d->multi = curl_multi_init();
    if (!d->service || !d->prefix_b64 || !d->range_end_b64 || !d->multi) {
        free_dir(d);
        return ctl_error_transfer(err, CTL_CAUSE_NOMEM, "directory: out of memory");
    }
    char who[CTL_DIRECTORY_NAME_MAX + 32];
    snprintf(who, sizeof who, "directory %s", service);
    int rc = ctl_etcd_new(&opts->etcd, who, &d->etcd, err);
    if (rc) {
        free_dir(d);
        return rc;
    }
    /* The first listing, retried until the start deadline. */
    int64_t deadline = ctl_now_ms() + (opts->start_timeout_ms ? opts->start_timeout_ms
                                                              : DEFAULT_START_MS);
    for (unsigned attempt = 0;; attempt++) {
        ctl_error_clear(err);
        ctl_error tmp;
        ctl_error_init(&tmp);
        rc = list(d, &tmp);
        if (rc == 0) {
            ctl_error_fini(&tmp);
            break;
        }
        int64_t left = deadline - ctl_now_ms();
        if (tmp.cause == CTL_CAUSE_AUTH || left <= 0) {
            ctl_error_transfer(err, tmp.cause == CTL_CAUSE_REMOTE ? CTL_CAUSE_REMOTE : tmp.cause,
                               "%s (gave up after %u attempt%s)", tmp.msg, attempt + 1,
                               attempt ? "s" : "");
            ctl_error_fini(&tmp);
            free_dir(d);
            return CTL_TRANSFER;
        }
        ctl_error_fini(&tmp);
        int wait = ctl_backoff_ms(attempt < 20 ? attempt : 20);
        if (wait > left)
            wait = (int)left;
        struct timespec ts = {wait / 1000, (long)(wait % 1000) * 1000000L};
        while (nanosleep(&ts, &ts) != 0 && errno == EINTR)
            ;
    }
    rc = ctl_thread_start(&d->thread, dir_main, d);
    if (rc != 0) {
        free_dir(d);
        return ctl_error_transfer(err, CTL_CAUSE_TRANSPORT,
                                  "directory %s: cannot start its thread: %s", service,
                                  strerror(rc));
    }
    d->thread_started = 1;
    *out = d;
    return 0;
}

ctl_membership *ctl_directory_snapshot(ctl_directory *dir)
{
    if (!dir)
        return NULL;
    pthread_mutex_lock(&dir->mu);
    memb *m = dir->current;
    if (m)
        atomic_fetch_add(&m->ref, 1);
    pthread_mutex_unlock(&dir->mu);
    return m ? &m->pub : NULL;
}

void ctl_directory_status_get(ctl_directory *dir, ctl_directory_status *out)
{
    pthread_mutex_lock(&dir->mu);
    out->stale = dir->stale;
    out->age_ms = ctl_now_ms() - dir->last_contact_ms;
    out->revision = dir->current ? dir->current->pub.revision : 0;
    out->changes = dir->changes;
    out->listings = dir->listings;
    out->watches = dir->watches;
    out->bad_values = dir->bad;
    out->failures = dir->failures;
    pthread_mutex_unlock(&dir->mu);
}

bool ctl_directory_wait(ctl_directory *dir, uint64_t changes, int timeout_ms)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    int64_t ms = timeout_ms > 0 ? timeout_ms : 0;
    ts.tv_sec += (time_t)(ms / 1000);
    ts.tv_nsec += (long)(ms % 1000) * 1000000L;
    if (ts.tv_nsec >= 1000000000L) {
        ts.tv_sec++;
        ts.tv_nsec -= 1000000000L;
    }
    pthread_mutex_lock(&dir->mu);
    while (dir->changes <= changes)
        if (pthread_cond_timedwait(&dir->cv, &dir->mu, &ts) == ETIMEDOUT)
            break;
    bool newer = dir->changes > changes;
    pthread_mutex_unlock(&dir->mu);
    return newer;
}

void ctl_directory_destroy(ctl_directory **dir)
{
    if (!dir || !*dir)
        return;
    ctl_directory *d = *dir;
    atomic_store(&d->stop, 1);
    ctl_etcd_abort(d->etcd);
    curl_multi_wakeup(d->multi);
    if (d->thread_started)
        pthread_join(d->thread, NULL);
    free_dir(d);
    *dir = NULL;
}
