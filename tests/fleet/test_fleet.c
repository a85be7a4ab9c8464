/*
 * test_fleet.c - membership in etcd (ctlrpc/directory.h) against a real,
 * private etcd (etcdproc.h) and real ctl-storage-unit processes: units
 * register, directories list and watch, and both ride out etcd's faults
 * (frozen longer than the TTL, restarted on the same and on an empty data
 * directory, compaction, a cut-off stream), hostile values, https and an
 * etcd user with a password. One ctest per case (fleet_<name>).
 *
 * Every wait is on a condition with a deadline.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <pthread.h>
#include <signal.h>

#include <cmocka.h>

#include "ctlrpc/curve.h"
#include "ctlrpc/directory.h"
#include "ctlrpc/log.h"
#include "ctlrpc/version.h"
#include "etcdproc.h"
#include "testutil.h"
#include "storage.ctl.h"

#define TTL "2"
#define TTL_S 2

/* ---- helpers -------------------------------------------------------------- */

/* Every state each unit was seen in, through the change callback. */
#define SEEN_MAX 64
typedef struct seen {
    pthread_mutex_t mu;
    char log[16384]; /* "id=state;" per change of a unit, or "id=gone;" */
    size_t len;
    uint64_t calls;
    size_t n; /* the last membership's units */
    char ids[SEEN_MAX][64];
    char states[SEEN_MAX][32];
} seen;

static void seen_init(seen *s)
{
    memset(s, 0, sizeof *s);
    pthread_mutex_init(&s->mu, NULL);
}

static void seen_fini(seen *s)
{
    pthread_mutex_destroy(&s->mu);
}

static const ctl_unit *find_unit(const ctl_membership *m, const char *id)
{
    for (size_t i = 0; m && i < m->count; i++)
        if (strcmp(m->units[i].unit_id, id) == 0)
            return &m->units[i];
    return NULL;
}

static void seen_add(seen *s, const char *fmt, ...) CTL_PRINTF(2, 3);
static void seen_add(seen *s, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    if (s->len < sizeof s->log - 1) {
        int n = vsnprintf(s->log + s->len, sizeof s->log - s->len, fmt, ap);
        if (n > 0)
            s->len += (size_t)n;
        if (s->len >= sizeof s->log)
            s->len = sizeof s->log - 1;
    }
    va_end(ap);
}

static void on_change(void *user, const ctl_membership *m)
{
    seen *s = user;
    pthread_mutex_lock(&s->mu);
    s->calls++;
    for (size_t i = 0; i < m->count; i++) {
        const char *old = NULL;
        for (size_t k = 0; k < s->n; k++)
            if (strcmp(s->ids[k], m->units[i].unit_id) == 0)
                old = s->states[k];
        if (!old || strcmp(old, m->units[i].state) != 0)
            seen_add(s, "%s=%s;", m->units[i].unit_id, m->units[i].state);
    }
    for (size_t k = 0; k < s->n; k++)
        if (!find_unit(m, s->ids[k]))
            seen_add(s, "%s=gone;", s->ids[k]);
    s->n = 0;
    for (size_t i = 0; i < m->count && s->n < SEEN_MAX; i++, s->n++) {
        snprintf(s->ids[s->n], sizeof s->ids[0], "%s", m->units[i].unit_id);
        snprintf(s->states[s->n], sizeof s->states[0], "%s", m->units[i].state);
    }
    pthread_mutex_unlock(&s->mu);
}

/* A directory on `url`, checking etcd often and failing fast. */
static ctl_directory *open_dir(const char *url, const char *cacert, seen *s, ctl_error *err)
{
    ctl_directory_options o;
    ctl_directory_options_init(&o);
    o.etcd.endpoints = url;
    o.etcd.cacert = cacert;
    o.etcd.timeout_ms = 500;
    o.check_interval_ms = 250;
    o.start_timeout_ms = 3000;
    if (s) {
        o.on_change = on_change;
        o.user = s;
    }
    ctl_directory *d = NULL;
    ctl_error_clear(err);
    if (ctl_directory_new("storage", &o, &d, err) != 0)
        return NULL;
    return d;
}

/* Wait until the directory's snapshot satisfies `pred`, within ms. */
typedef bool (*pred_fn)(const ctl_membership *m, const void *arg);

static bool wait_for(ctl_directory *d, pred_fn pred, const void *arg, int ms)
{
    long long deadline = ep_now_ms() + ms;
    for (;;) {
        ctl_directory_status st;
        ctl_directory_status_get(d, &st);
        ctl_membership *m = ctl_directory_snapshot(d);
        bool ok = pred(m, arg);
        ctl_membership_release(&m);
        if (ok)
            return true;
        long long left = deadline - ep_now_ms();
        if (left <= 0)
            return false;
        ctl_directory_wait(d, st.changes, (int)(left < 200 ? left : 200));
    }
}

/* "a,b": exactly these unit ids serving (in any order); "" none. */
static bool serving_exactly(const ctl_membership *m, const void *arg)
{
    const char *want = arg;
    size_t n = 0;
    char copy[256];
    snprintf(copy, sizeof copy, "%s", want);
    for (char *save = NULL, *id = strtok_r(copy, ",", &save); id;
         id = strtok_r(NULL, ",", &save)) {
        const ctl_unit *u = find_unit(m, id);
        if (!u || !u->serving)
            return false;
        n++;
    }
    return m && m->count == n && m->serving_count == n;
}

static bool has_unit(const ctl_membership *m, const void *arg)
{
    return find_unit(m, arg) != NULL;
}

static bool lacks_unit(const ctl_membership *m, const void *arg)
{
    return m && find_unit(m, arg) == NULL;
}

/* Units a and b both serving, put again since revisions arg[0], arg[1]. */
static bool both_newer(const ctl_membership *m, const void *arg)
{
    const int64_t *revs = arg;
    const ctl_unit *a = find_unit(m, "a"), *b = find_unit(m, "b");
    return a && b && a->serving && b->serving && a->mod_revision > revs[0] &&
           b->mod_revision > revs[1];
}

static bool dir_stale(ctl_directory *d)
{
    ctl_directory_status st;
    ctl_directory_status_get(d, &st);
    return st.stale;
}

static bool wait_stale(ctl_directory *d, bool want, int ms)
{
    long long deadline = ep_now_ms() + ms;
    while (dir_stale(d) != want) {
        if (ep_now_ms() > deadline)
            return false;
        ep_sleep_ms(20);
    }
    return true;
}

static int start_unit(ep_unit *u, const char *url, const char *id, const char *const *extra)
{
    const char *argv[40] = {UNIT_BIN,   "--bind",      "tcp://127.0.0.1:0", "--etcd", url,
                            "--unit-id", id,           "--lease-ttl",       TTL,
                            "--log-level", "info",     NULL};
    int n = 11;
    for (size_t i = 0; extra && extra[i] && n < 38; i++)
        argv[n++] = extra[i];
    argv[n] = NULL;
    return ep_unit_start(u, argv, 10000);
}

typedef struct fx {
    ep_etcd etcd;
    ep_unit units[4];
    ctl_directory *dir;
    seen seen;
    ctl_error err;
} fx;

static int setup(void **state)
{
    fx *f = calloc(1, sizeof *f);
    if (!f)
        return -1;
    seen_init(&f->seen);
    ctl_error_init(&f->err);
    for (int i = 0; i < 4; i++)
        f->units[i].out_fd = -1;
    if (ep_start(&f->etcd, false, 20000) != 0) {
        free(f);
        return -1;
    }
    *state = f;
    return 0;
}

static int setup_tls(void **state)
{
    fx *f = calloc(1, sizeof *f);
    if (!f)
        return -1;
    seen_init(&f->seen);
    ctl_error_init(&f->err);
    for (int i = 0; i < 4; i++)
        f->units[i].out_fd = -1;
    if (ep_start(&f->etcd, true, 20000) != 0) {
        free(f);
        return -1;
    }
    *state = f;
    return 0;
}

static int setup_with(void **state, const ep_options *o)
{
    fx *f = calloc(1, sizeof *f);
    if (!f)
        return -1;
    seen_init(&f->seen);
    ctl_error_init(&f->err);
    for (int i = 0; i < 4; i++)
        f->units[i].out_fd = -1;
    if (ep_start_with(&f->etcd, o, 20000) != 0) {
        free(f);
        return -1;
    }
    *state = f;
    return 0;
}

static int setup_mtls(void **state)
{
    ep_options o = {.tls = true, .client_auth = true};
    return setup_with(state, &o);
}

static int setup_short_tokens(void **state)
{
    ep_options o = {.token_ttl_s = 1};
    return setup_with(state, &o);
}

static int teardown(void **state)
{
    fx *f = *state;
    ctl_directory_destroy(&f->dir);
    for (int i = 0; i < 4; i++)
        ep_unit_kill(&f->units[i]);
    ep_destroy(&f->etcd);
    seen_fini(&f->seen);
    ctl_error_fini(&f->err);
    free(f);
    return 0;
}

static const char *seen_log(seen *s, char *buf, size_t len)
{
    pthread_mutex_lock(&s->mu);
    snprintf(buf, len, "%s", s->log);
    pthread_mutex_unlock(&s->mu);
    return buf;
}

/* Wait until the change log has `first` and, after it, `then`: the
 * snapshot is published before the callback runs, so a test that saw the
 * snapshot waits for the callback too. */
static bool wait_log(seen *s, const char *first, const char *then, int ms)
{
    long long deadline = ep_now_ms() + ms;
    char log[16384];
    for (;;) {
        seen_log(s, log, sizeof log);
        const char *a = strstr(log, first);
        if (a && strstr(a, then))
            return true;
        if (ep_now_ms() > deadline) {
            print_message("changes seen: %s\n", log);
            return false;
        }
        ep_sleep_ms(10);
    }
}

/* ---- cases ------------------------------------------------------------- */

/* Two units register; the directory lists them with their values; a
 * third appears through the watch; a call to every serving unit works. */
static void test_register_list_watch(void **state)
{
    fx *f = *state;
    assert_int_equal(start_unit(&f->units[0], f->etcd.url, "a", NULL), 0);
    assert_int_equal(start_unit(&f->units[1], f->etcd.url, "b", NULL), 0);
    f->dir = open_dir(f->etcd.url, NULL, &f->seen, &f->err);
    assert_non_null(f->dir);
    assert_true(wait_for(f->dir, serving_exactly, "a,b", 5000));

    ctl_membership *m = ctl_directory_snapshot(f->dir);
    const ctl_unit *a = find_unit(m, "a");
    assert_string_equal(a->address, f->units[0].endpoint);
    assert_string_equal(a->state, "serving");
    assert_string_equal(a->service, "storage");
    assert_string_equal(a->idl_hash, storage_service.idl_sha256);
    assert_string_equal(a->version, CTLRPC_VERSION_STRING);
    assert_int_equal(a->pid, f->units[0].pid);
    assert_true(a->started > 1600000000);
    assert_true(a->host[0] != '\0');
    assert_true(m->revision > 0);

    /* Every serving unit, through the generated fan-out. */
    size_t n = 0;
    const char **addrs = ctl_membership_addresses(m, &n);
    assert_int_equal(n, 2);
    ctl_client *c = NULL;
    assert_int_equal(ctl_client_new(NULL, &c, &f->err), 0);
    storage_stats_outcome out[2];
    storage_stats_many(c, addrs, n, 5000, out);
    for (size_t i = 0; i < n; i++)
        assert_int_equal(out[i].error.kind, CTL_OK);
    storage_stats_outcomes_fini(out, n);
    ctl_client_destroy(&c);
    ctl_membership_release(&m);

    /* The value is plain JSON for etcdctl. */
    char got[8192];
    assert_int_equal(ep_etcdctl(&f->etcd, got, sizeof got, "get", "--print-value-only",
                                "/ctlrpc/v1/default/storage/a", NULL), 0);
    assert_non_null(strstr(got, "\"state\":\"serving\""));
    assert_non_null(strstr(got, f->units[0].endpoint));

    /* A third, seen through the watch (no new listing), registered through
     * a list of endpoints whose first is dead. */
    char eps[256];
    snprintf(eps, sizeof eps, "http://127.0.0.1:9,%s", f->etcd.url);
    ctl_directory_status before, after;
    ctl_directory_status_get(f->dir, &before);
    assert_int_equal(start_unit(&f->units[2], eps, "c", NULL), 0);
    assert_true(wait_for(f->dir, serving_exactly, "a,b,c", 5000));
    ctl_directory_status_get(f->dir, &after);
    assert_int_equal(after.listings, before.listings);
    assert_false(after.stale);
    assert_int_equal(after.bad_values, 0);

    /* ctl-storage --etcd: every serving unit (the first endpoint is dead:
     * the next one is tried). */
    char outbuf[8192];
    const char *cli[] = {CLI_BIN, "--etcd", eps, "--service", "storage", "--json",
                         "stats", NULL};
    assert_int_equal(ep_run(outbuf, sizeof outbuf, 20000, cli), 0);
    for (int i = 0; i < 3; i++)
        assert_non_null(strstr(outbuf, f->units[i].endpoint));
    assert_non_null(strstr(outbuf, "\"unit_id\": \"b\""));
    /* put takes one unit: three serving is a usage error. */
    const char *put[] = {CLI_BIN, "--etcd", f->etcd.url, "put", "k", "/dev/null", NULL};
    assert_int_equal(ep_run(NULL, 0, 20000, put), 2);
}

/* SIGTERM: draining is visible while the unit drains, then the key is
 * gone at once (well before the TTL). */
static void test_sigterm_draining(void **state)
{
    fx *f = *state;
    const char *extra[] = {"--lease-ttl", "30", NULL}; /* gone by revoke, not expiry */
    assert_int_equal(start_unit(&f->units[0], f->etcd.url, "t", extra), 0);
    f->dir = open_dir(f->etcd.url, NULL, &f->seen, &f->err);
    assert_non_null(f->dir);
    assert_true(wait_for(f->dir, serving_exactly, "t", 5000));
    long long t0 = ep_now_ms();
    assert_int_equal(ep_unit_stop(&f->units[0], 10000), 0);
    assert_true(wait_for(f->dir, lacks_unit, "t", 5000));
    assert_true(ep_now_ms() - t0 < 5000);
    assert_true(wait_log(&f->seen, "t=draining;", "t=gone;", 2000));
}

/* A key deleted while its lease lives (an operator's `etcdctl del`) comes
 * back at the unit's next keepalive, a third of the TTL later. */
static bool key_listed(ep_etcd *e, const char *key)
{
    char got[4096] = "";
    ep_etcdctl(e, got, sizeof got, "get", "--keys-only", key, NULL);
    return strstr(got, key) != NULL;
}

static void test_key_deleted_put_back(void **state)
{
    fx *f = *state;
    const char *key = "/ctlrpc/v1/default/storage/del";
    assert_int_equal(start_unit(&f->units[0], f->etcd.url, "del", NULL), 0);
    long long until = ep_now_ms() + 5000;
    while (!key_listed(&f->etcd, key) && ep_now_ms() < until)
        ep_sleep_ms(50);
    assert_true(key_listed(&f->etcd, key));
    assert_int_equal(ep_etcdctl(&f->etcd, NULL, 0, "del", key, NULL), 0);
    until = ep_now_ms() + TTL_S * 1000 + 5000;
    while (!key_listed(&f->etcd, key) && ep_now_ms() < until)
        ep_sleep_ms(50);
    assert_true(key_listed(&f->etcd, key));
}

/* SIGKILL: gone when the lease expires, within TTL + 1 s. */
static void test_sigkill_expires(void **state)
{
    fx *f = *state;
    assert_int_equal(start_unit(&f->units[0], f->etcd.url, "k", NULL), 0);
    assert_int_equal(start_unit(&f->units[1], f->etcd.url, "live", NULL), 0);
    f->dir = open_dir(f->etcd.url, NULL, &f->seen, &f->err);
    assert_non_null(f->dir);
    assert_true(wait_for(f->dir, serving_exactly, "k,live", 5000));
    long long t0 = ep_now_ms();
    ep_unit_kill(&f->units[0]);
    assert_true(wait_for(f->dir, serving_exactly, "live", (TTL_S + 1) * 1000 + 500));
    long long took = ep_now_ms() - t0;
    print_message("SIGKILL to removal: %lld ms (TTL %d s)\n", took, TTL_S);
    assert_true(took <= (TTL_S + 1) * 1000 + 500);
}

/* The directory's membership is the one a new listing gives: the same
 * serving units `ids` with the same mod_revisions. */
static bool agrees_with_fresh(fx *f, const char *ids, int ms)
{
    long long deadline = ep_now_ms() + ms;
    bool agree = false;
    while (!agree && ep_now_ms() < deadline) {
        ctl_error e2;
        ctl_error_init(&e2);
        ctl_directory *fresh = open_dir(f->etcd.url, f->etcd.tls ? f->etcd.cacert : NULL,
                                        NULL, &e2);
        ctl_error_fini(&e2);
        if (fresh) {
            ctl_membership *a = ctl_directory_snapshot(fresh);
            ctl_membership *b = ctl_directory_snapshot(f->dir);
            agree = serving_exactly(a, ids) && serving_exactly(b, ids);
            for (size_t i = 0; agree && i < a->count; i++) {
                const ctl_unit *u = find_unit(b, a->units[i].unit_id);
                agree = u && u->mod_revision == a->units[i].mod_revision;
            }
            ctl_membership_release(&a);
            ctl_membership_release(&b);
            ctl_directory_destroy(&fresh);
        }
        if (!agree)
            ep_sleep_ms(200);
    }
    return agree;
}

/* etcd frozen longer than the TTL: the directory keeps its membership and
 * says stale; after the thaw the units register again and the watch
 * resumes: the directory agrees with a fresh listing. */
static void test_etcd_frozen(void **state)
{
    fx *f = *state;
    assert_int_equal(start_unit(&f->units[0], f->etcd.url, "a", NULL), 0);
    assert_int_equal(start_unit(&f->units[1], f->etcd.url, "b", NULL), 0);
    f->dir = open_dir(f->etcd.url, NULL, &f->seen, &f->err);
    assert_non_null(f->dir);
    assert_true(wait_for(f->dir, serving_exactly, "a,b", 5000));

    ctl_membership *m = ctl_directory_snapshot(f->dir);
    int64_t rev_a = find_unit(m, "a")->mod_revision, rev_b = find_unit(m, "b")->mod_revision;
    ctl_membership_release(&m);
    assert_int_equal(ep_freeze(&f->etcd), 0);
    assert_true(wait_stale(f->dir, true, 3000));
    m = ctl_directory_snapshot(f->dir);
    assert_int_equal(m->serving_count, 2); /* kept */
    ctl_membership_release(&m);
    /* Calls to units go on while etcd is away. */
    ctl_client *c = NULL;
    assert_int_equal(ctl_client_new(NULL, &c, &f->err), 0);
    storage_UnitStats us;
    ctl_reply *reply = NULL;
    assert_int_equal(storage_stats(c, f->units[0].endpoint, 2000, &us, &reply, &f->err), 0);
    ctl_reply_destroy(&reply);
    ctl_client_destroy(&c);
    /* Longer than the TTL. */
    long long until = ep_now_ms() + (TTL_S + 2) * 1000;
    while (ep_now_ms() < until) {
        assert_true(dir_stale(f->dir));
        ep_sleep_ms(100);
    }
    ctl_directory_status st;
    ctl_directory_status_get(f->dir, &st);
    assert_true(st.age_ms >= (TTL_S + 2) * 1000 - 500);
    assert_int_equal(ep_thaw(&f->etcd), 0);
    assert_true(wait_stale(f->dir, false, 5000));

    /* The units registered again (their leases were lost: nothing answered
     * for longer than the TTL), and the directory says so. */
    int64_t revs[2] = {rev_a, rev_b};
    assert_true(wait_for(f->dir, both_newer, revs, 10000));
    assert_true(agrees_with_fresh(f, "a,b", 10000));
    /* And it still follows changes. */
    assert_int_equal(start_unit(&f->units[2], f->etcd.url, "c", NULL), 0);
    assert_true(wait_for(f->dir, serving_exactly, "a,b,c", 5000));
}

static void restart_case(fx *f, bool wipe)
{
    assert_int_equal(start_unit(&f->units[0], f->etcd.url, "a", NULL), 0);
    assert_int_equal(start_unit(&f->units[1], f->etcd.url, "b", NULL), 0);
    f->dir = open_dir(f->etcd.url, NULL, &f->seen, &f->err);
    assert_non_null(f->dir);
    assert_true(wait_for(f->dir, serving_exactly, "a,b", 5000));
    ctl_membership *before = ctl_directory_snapshot(f->dir);
    int64_t rev = before->revision;
    ctl_membership_release(&before);

    assert_int_equal(ep_restart(&f->etcd, wipe, 20000), 0);
    /* The units re-register (on an empty data directory etcd has never
     * heard of their leases); etcdctl sees both keys. */
    long long deadline = ep_now_ms() + (TTL_S + 8) * 1000;
    bool both = false;
    while (!both && ep_now_ms() < deadline) {
        char got[8192] = "";
        ep_etcdctl(&f->etcd, got, sizeof got, "get", "--prefix", "--keys-only",
                   "/ctlrpc/v1/default/storage/", NULL);
        both = strstr(got, "/storage/a") && strstr(got, "/storage/b");
        if (!both)
            ep_sleep_ms(100);
    }
    assert_true(both);
    assert_true(agrees_with_fresh(f, "a,b", 10000));
    assert_true(wait_stale(f->dir, false, 5000));
    /* Follows changes on the new history too. */
    ep_unit_kill(&f->units[1]);
    assert_true(wait_for(f->dir, serving_exactly, "a", (TTL_S + 2) * 1000));
    assert_int_equal(start_unit(&f->units[2], f->etcd.url, "c", NULL), 0);
    assert_true(wait_for(f->dir, serving_exactly, "a,c", 5000));
    if (wipe) {
        ctl_directory_status st;
        ctl_directory_status_get(f->dir, &st);
        print_message("revision before %lld, now %lld, %llu listings\n", (long long)rev,
                      (long long)st.revision, (unsigned long long)st.listings);
    }
}

static void test_etcd_restart_same(void **state)
{
    restart_case(*state, false);
}

static void test_etcd_restart_empty(void **state)
{
    restart_case(*state, true);
}

/* Put a raw value with etcdctl. */
static void put_raw(ep_etcd *e, const char *key, const char *value)
{
    assert_int_equal(ep_etcdctl(e, NULL, 0, "put", key, value, NULL), 0);
}

static const char good_value[] = "{\"address\":\"tcp://127.0.0.1:1\",\"state\":\"serving\","
                                 "\"service\":\"storage\"}";

/* A stream cut off, events meanwhile: the resumed watch sees every one
 * (puts and deletes made while it was away, each revision a snapshot of
 * its own), without a new listing. */
static void test_watch_resume(void **state)
{
    fx *f = *state;
    ep_proxy *p = ep_proxy_new(f->etcd.client_port);
    assert_non_null(p);
    put_raw(&f->etcd, "/ctlrpc/v1/default/storage/x", good_value);
    f->dir = open_dir(ep_proxy_url(p), NULL, &f->seen, &f->err);
    assert_non_null(f->dir);
    assert_true(wait_for(f->dir, serving_exactly, "x", 5000));
    ctl_directory_status before;
    ctl_directory_status_get(f->dir, &before);

    ep_proxy_pause(p, true);
    assert_true(wait_stale(f->dir, true, 3000));
    put_raw(&f->etcd, "/ctlrpc/v1/default/storage/brief", good_value);
    assert_int_equal(ep_etcdctl(&f->etcd, NULL, 0, "del", "/ctlrpc/v1/default/storage/brief",
                                NULL), 0);
    put_raw(&f->etcd, "/ctlrpc/v1/default/storage/y", good_value);
    put_raw(&f->etcd, "/ctlrpc/v1/default/storage/x",
            "{\"address\":\"tcp://127.0.0.1:1\",\"state\":\"draining\"}");
    assert_int_equal(ep_etcdctl(&f->etcd, NULL, 0, "del", "/ctlrpc/v1/default/storage/x",
                                NULL), 0);
    ep_proxy_pause(p, false);
    assert_true(wait_for(f->dir, serving_exactly, "y", 8000));
    assert_true(wait_stale(f->dir, false, 3000));
    ctl_directory_status after;
    ctl_directory_status_get(f->dir, &after);
    assert_int_equal(after.listings, before.listings); /* resumed, not listed */
    assert_true(after.watches > before.watches);
    /* Every revision was its own snapshot: a key put and deleted while the
     * stream was away was seen, and x's draining before its removal. */
    assert_true(wait_log(&f->seen, "brief=serving;", "brief=gone;", 2000));
    assert_true(wait_log(&f->seen, "x=draining;", "x=gone;", 2000));
    /* The delete of x came through the resumed stream, and the snapshot is
     * of etcd's latest revision (the last change, y's delete of x). */
    char out[4096];
    assert_int_equal(ep_etcdctl(&f->etcd, out, sizeof out, "get", "/nothing", "-w", "fields",
                                NULL), 0);
    const char *r = strstr(out, "\"Revision\" : ");
    assert_non_null(r);
    assert_int_equal(after.revision, atoll(r + 13));
    ctl_directory_destroy(&f->dir);
    ep_proxy_destroy(&p);
}

/* Compaction past the watcher's revision: it lists again, and says it was
 * a compaction (not a new data directory). */
static void test_compaction(void **state)
{
    fx *f = *state;
    ctl_log_level level = ctl_log_get_level();
    ctl_log_set_level(CTL_LOG_INFO);
    tu_log_keep();
    ep_proxy *p = ep_proxy_new(f->etcd.client_port);
    assert_non_null(p);
    put_raw(&f->etcd, "/ctlrpc/v1/default/storage/x", good_value);
    f->dir = open_dir(ep_proxy_url(p), NULL, &f->seen, &f->err);
    assert_non_null(f->dir);
    assert_true(wait_for(f->dir, serving_exactly, "x", 5000));
    ctl_directory_status before;
    ctl_directory_status_get(f->dir, &before);

    ep_proxy_pause(p, true);
    assert_true(wait_stale(f->dir, true, 3000));
    put_raw(&f->etcd, "/ctlrpc/v1/default/storage/y", good_value);
    assert_int_equal(ep_etcdctl(&f->etcd, NULL, 0, "del", "/ctlrpc/v1/default/storage/x",
                                NULL), 0);
    put_raw(&f->etcd, "/other/key", "z");
    char out[4096];
    assert_int_equal(ep_etcdctl(&f->etcd, out, sizeof out, "get", "/other/key", "-w",
                                "fields", NULL), 0);
    const char *r = strstr(out, "\"Revision\" : ");
    assert_non_null(r);
    char rev[32];
    snprintf(rev, sizeof rev, "%lld", atoll(r + 13));
    assert_int_equal(ep_etcdctl(&f->etcd, NULL, 0, "compaction", rev, NULL), 0);
    ep_proxy_pause(p, false);
    assert_true(wait_for(f->dir, serving_exactly, "y", 8000));
    ctl_directory_status after;
    ctl_directory_status_get(f->dir, &after);
    assert_true(after.listings > before.listings);
    assert_true(after.revision >= atoll(rev));
    ctl_directory_destroy(&f->dir);
    tu_log_stop();
    ctl_log_set_level(level);
    if (!tu_log_has("was compacted") || tu_log_has("new data directory"))
        fprintf(stderr, "the directory's log:\n%s", tu_log_text());
    assert_true(tu_log_has("was compacted"));
    assert_false(tu_log_has("new data directory"));
    ep_proxy_destroy(&p);
}

/* Hostile values under the prefix: skipped and counted; the good ones
 * stay; nothing crashes, listed or watched. */
static void test_hostile_values(void **state)
{
    fx *f = *state;
    const char *pre = "/ctlrpc/v1/default/storage/";
    char key[128], huge[6000];
    memset(huge, 'x', sizeof huge - 1);
    huge[sizeof huge - 1] = '\0';
    memcpy(huge, "{\"address\":\"tcp://127.0.0.1:2\",\"state\":\"serving\",\"pad\":\"", 57);
    const char *bad[][2] = {
        {"notjson", "this is not json"},
        {"array", "[1,2,3]"},
        {"noaddr", "{\"state\":\"serving\"}"},
        {"udp", "{\"address\":\"udp://127.0.0.1:1\",\"state\":\"serving\"}"},
        {"nostate", "{\"address\":\"tcp://127.0.0.1:1\"}"},
        {"othersvc", "{\"address\":\"tcp://127.0.0.1:1\",\"state\":\"serving\","
                     "\"service\":\"other\"}"},
        {"deep/er", good_value},
        {"huge", huge},
        /* The same as the Python reader skips (tests/python/test_fleet.py). */
        {"tcponly", "{\"address\":\"tcp://\",\"state\":\"serving\"}"},
        {"nul", "{\"address\":\"tcp://127.0.0.1:1\\u0000\",\"state\":\"serving\"}"},
        {"twice", "{\"address\":\"tcp://127.0.0.1:1\",\"state\":\"serving\","
                  "\"state\":\"draining\"}"},
        {"bigpid", "{\"address\":\"tcp://127.0.0.1:1\",\"state\":\"serving\","
                   "\"pid\":100000000000000000000000}"},
    };
    size_t nbad = sizeof bad / sizeof bad[0];
    for (size_t i = 0; i < nbad; i++) {
        snprintf(key, sizeof key, "%s%s", pre, bad[i][0]);
        put_raw(&f->etcd, key, bad[i][1]);
    }
    snprintf(key, sizeof key, "%sgood", pre);
    put_raw(&f->etcd, key, good_value);
    /* A state a later release might add: listed, not serving. */
    snprintf(key, sizeof key, "%sfuture", pre);
    put_raw(&f->etcd, key, "{\"address\":\"tcp://127.0.0.1:3\",\"state\":\"warming\"}");
    /* An empty state is a string too: listed, not serving. */
    snprintf(key, sizeof key, "%sblank", pre);
    put_raw(&f->etcd, key, "{\"address\":\"tcp://127.0.0.1:4\",\"state\":\"\"}");
    /* Another service's key beside ours. */
    put_raw(&f->etcd, "/ctlrpc/v1/default/storage2/z", good_value);

    f->dir = open_dir(f->etcd.url, NULL, &f->seen, &f->err);
    assert_non_null(f->dir);
    ctl_membership *m = ctl_directory_snapshot(f->dir);
    assert_int_equal(m->count, 3);
    assert_non_null(find_unit(m, "good"));
    const ctl_unit *blank = find_unit(m, "blank");
    assert_non_null(blank);
    assert_false(blank->serving);
    assert_string_equal(blank->state, "");
    const ctl_unit *fut = find_unit(m, "future");
    assert_non_null(fut);
    assert_false(fut->serving);
    assert_string_equal(fut->state, "warming");
    assert_int_equal(m->serving_count, 1);
    ctl_membership_release(&m);
    ctl_directory_status st;
    ctl_directory_status_get(f->dir, &st);
    assert_int_equal(st.bad_values, nbad);

    /* Watched: a good unit's value turned bad is dropped, and counted. */
    snprintf(key, sizeof key, "%sgood", pre);
    put_raw(&f->etcd, key, "{broken");
    assert_true(wait_for(f->dir, lacks_unit, "good", 5000));
    ctl_directory_status_get(f->dir, &st);
    assert_int_equal(st.bad_values, nbad + 1);
    put_raw(&f->etcd, key, good_value);
    assert_true(wait_for(f->dir, has_unit, "good", 5000));
}

/* A directory that never reaches etcd fails at once, naming the endpoint;
 * ctl-storage exits 8. */
static void test_never_reached(void **state)
{
    (void)state;
    ctl_error err;
    ctl_error_init(&err);
    ctl_directory_options o;
    ctl_directory_options_init(&o);
    o.etcd.endpoints = "http://127.0.0.1:9,http://127.0.0.1:7";
    o.start_timeout_ms = 500;
    o.etcd.timeout_ms = 200;
    ctl_directory *d = NULL;
    long long t0 = ep_now_ms();
    assert_int_equal(ctl_directory_new("storage", &o, &d, &err), CTL_TRANSFER);
    assert_null(d);
    assert_true(ep_now_ms() - t0 < 3000);
    assert_non_null(strstr(err.msg, "127.0.0.1:9"));
    assert_int_equal(err.cause, CTL_CAUSE_REFUSED);
    /* Each endpoint's failure is named, as in Python. */
    assert_non_null(strstr(err.msg, "(http://127.0.0.1:9: "));
    assert_non_null(strstr(err.msg, "; http://127.0.0.1:7: "));
    /* Bad names and endpoints are usage errors. */
    o.etcd.endpoints = "ftp://127.0.0.1:9";
    assert_int_equal(ctl_directory_new("storage", &o, &d, &err), CTL_INVALID);
    assert_non_null(strstr(err.msg, "ftp://127.0.0.1:9"));
    o.etcd.endpoints = "http://user@127.0.0.1:9";
    assert_int_equal(ctl_directory_new("storage", &o, &d, &err), CTL_INVALID);
    assert_non_null(strstr(err.msg, "user@127.0.0.1:9"));
    /* A trailing '/' or blank, on the last endpoint too, and the scheme in
     * capitals are the same endpoint (as in Python): refused, not bad. */
    static const char *const same[] = {"http://127.0.0.1:9/", "http://127.0.0.1:9 ",
                                       "http://127.0.0.1:7/, http://127.0.0.1:9/",
                                       "HTTP://127.0.0.1:9"};
    for (size_t i = 0; i < sizeof same / sizeof same[0]; i++) {
        o.etcd.endpoints = same[i];
        if (ctl_directory_new("storage", &o, &d, &err) != CTL_TRANSFER)
            fail_msg("'%s': %s", same[i], err.msg ? err.msg : "?");
        assert_int_equal(err.cause, CTL_CAUSE_REFUSED);
        assert_null(strstr(err.msg, "''"));
    }
    o.etcd.endpoints = "http://127.0.0.1:9";
    assert_int_equal(ctl_directory_new("a/b", &o, &d, &err), CTL_INVALID);
    ctl_error_fini(&err);

    char out[4096];
    const char *cli[] = {CLI_BIN, "--etcd", "http://127.0.0.1:9", "--service", "storage",
                         "stats", NULL};
    assert_int_equal(ep_run(out, sizeof out, 20000, cli), 8);
}

/* A unit started while etcd is down serves anyway and registers once
 * etcd is back. */
static void test_unit_before_etcd(void **state)
{
    fx *f = *state;
    ep_stop(&f->etcd);
    assert_int_equal(start_unit(&f->units[0], f->etcd.url, "early", NULL), 0);
    ctl_client *c = NULL;
    storage_UnitStats us;
    assert_int_equal(ctl_client_new(NULL, &c, &f->err), 0);
    ctl_reply *reply = NULL;
    assert_int_equal(storage_stats(c, f->units[0].endpoint, 2000, &us, &reply, &f->err), 0);
    ctl_reply_destroy(&reply);
    ctl_client_destroy(&c);
    assert_int_equal(ep_restart(&f->etcd, false, 20000), 0);
    f->dir = open_dir(f->etcd.url, NULL, &f->seen, &f->err);
    assert_non_null(f->dir);
    assert_true(wait_for(f->dir, serving_exactly, "early", 10000));
}

/* The lines of the file `path` (at most `len` - 1 bytes of it) into `buf`;
 * their count. */
static int read_lines(const char *path, char *buf, size_t len)
{
    buf[0] = '\0';
    FILE *fp = fopen(path, "r");
    if (!fp)
        return 0;
    size_t n = fread(buf, 1, len - 1, fp);
    fclose(fp);
    buf[n] = '\0';
    int lines = 0;
    for (size_t i = 0; i < n; i++)
        lines += buf[i] == '\n';
    return lines;
}

/* "A unit that cannot reach etcd at start serves anyway, logs it once, and
 * keeps trying": its etcd endpoints are a port nothing listens on and a
 * paused proxy (which accepts and closes each connection, counting them),
 * so every registration attempt is seen. The unit answers a call; after
 * four attempts its stderr (at the default log level) holds exactly one
 * line, saying it serves anyway; the first three attempts have run their
 * course, logging included, before the fourth connects. Once the proxy lets
 * etcd through, the unit registers and says once that etcd is reachable
 * again. */
static void test_unit_etcd_down_logged_once(void **state)
{
    fx *f = *state;
    ep_proxy *px = ep_proxy_new(f->etcd.client_port);
    assert_non_null(px);
    ep_proxy_pause(px, true);
    char eps[200], errlog[300], log[16384];
    snprintf(eps, sizeof eps, "http://127.0.0.1:%d,%s", ep_free_port(), ep_proxy_url(px));
    snprintf(errlog, sizeof errlog, "%s/unit.err", f->etcd.dir);
    const char *argv[] = {UNIT_BIN, "--bind", "tcp://127.0.0.1:0", "--etcd", eps,
                          "--unit-id", "early", "--lease-ttl", TTL, NULL};
    assert_int_equal(ep_unit_start_err(&f->units[0], argv, errlog, 10000), 0);

    ctl_client *c = NULL;
    storage_UnitStats us;
    ctl_reply *reply = NULL;
    assert_int_equal(ctl_client_new(NULL, &c, &f->err), 0);
    assert_int_equal(storage_stats(c, f->units[0].endpoint, 2000, &us, &reply, &f->err), 0);
    ctl_reply_destroy(&reply);
    ctl_client_destroy(&c);

    long long deadline = ep_now_ms() + 20000;
    while (ep_proxy_refused(px) < 4 && ep_now_ms() < deadline)
        ep_sleep_ms(10);
    assert_true(ep_proxy_refused(px) >= 4);
    int lines = read_lines(errlog, log, sizeof log);
    if (lines != 1)
        fprintf(stderr, "after %d attempts, the unit's stderr:\n%s", ep_proxy_refused(px), log);
    assert_int_equal(lines, 1);
    assert_non_null(strstr(log, "cannot reach etcd at any of"));
    assert_non_null(strstr(log, "serving anyway"));

    ep_proxy_pause(px, false);
    f->dir = open_dir(f->etcd.url, NULL, &f->seen, &f->err);
    assert_non_null(f->dir);
    assert_true(wait_for(f->dir, serving_exactly, "early", 10000));
    /* The line comes after the key is put: wait for it too. */
    deadline = ep_now_ms() + 10000;
    while ((lines = read_lines(errlog, log, sizeof log)) < 2 && ep_now_ms() < deadline)
        ep_sleep_ms(10);
    if (lines != 2)
        fprintf(stderr, "the unit's stderr:\n%s", log);
    assert_int_equal(lines, 2);
    assert_non_null(strstr(strchr(log, '\n'), "etcd reachable again"));
    ep_unit_kill(&f->units[0]);
    ep_proxy_destroy(&px);
}

/* The unit's fleet flags: usage errors, --advertise, --namespace,
 * --service, and the CURVE public key in the value. */
static void test_unit_flags(void **state)
{
    fx *f = *state;
    unsetenv("CTLRPC_ETCD");
    const char *wild[] = {UNIT_BIN, "--bind", "tcp://0.0.0.0:0", "--etcd", f->etcd.url, NULL};
    assert_int_equal(ep_run(NULL, 0, 20000, wild), 2);
    const char *noetcd[] = {UNIT_BIN, "--bind", "tcp://127.0.0.1:0", "--service", "x", NULL};
    assert_int_equal(ep_run(NULL, 0, 20000, noetcd), 2);
    const char *ttl[] = {UNIT_BIN, "--etcd", f->etcd.url, "--lease-ttl", "1", NULL};
    assert_int_equal(ep_run(NULL, 0, 20000, ttl), 2);
    const char *badid[] = {UNIT_BIN, "--bind", "tcp://127.0.0.1:0", "--etcd", f->etcd.url,
                           "--unit-id", "a/b", NULL};
    assert_int_equal(ep_run(NULL, 0, 20000, badid), 2);
    const char *badurl[] = {UNIT_BIN, "--bind", "tcp://127.0.0.1:0", "--etcd", "127.0.0.1:2379",
                            NULL};
    assert_int_equal(ep_run(NULL, 0, 20000, badurl), 2);

    /* A wildcard bind with --advertise: the advertised address is listed. */
    const char *adv[] = {"--bind", "tcp://0.0.0.0:0", "--advertise", "tcp://127.0.0.1:4999", NULL};
    const char *argv[] = {UNIT_BIN, "--etcd", f->etcd.url, "--unit-id", "adv", adv[0], adv[1],
                          adv[2], adv[3], NULL};
    assert_int_equal(ep_unit_start(&f->units[0], argv, 10000), 0);
    /* Another namespace and service name, with CURVE. */
    char prefix[300], pub[320];
    snprintf(prefix, sizeof prefix, "%s/unitkey", f->etcd.dir);
    snprintf(pub, sizeof pub, "%s.pub", prefix);
    char secret[320];
    snprintf(secret, sizeof secret, "%s.key", prefix);
    const char *gen[] = {UNIT_BIN, "--gen-keys", prefix, NULL};
    assert_int_equal(ep_run(NULL, 0, 20000, gen), 0);
    const char *extra[] = {"--namespace", "blue", "--service", "vault", "--curve-secret", secret,
                           NULL};
    assert_int_equal(start_unit(&f->units[1], f->etcd.url, "curvy", extra), 0);

    f->dir = open_dir(f->etcd.url, NULL, &f->seen, &f->err);
    assert_non_null(f->dir);
    assert_true(wait_for(f->dir, serving_exactly, "adv", 5000));
    ctl_membership *m = ctl_directory_snapshot(f->dir);
    assert_string_equal(find_unit(m, "adv")->address, "tcp://127.0.0.1:4999");
    assert_string_equal(find_unit(m, "adv")->curve_public_key, "");
    ctl_membership_release(&m);

    ctl_directory_options o;
    ctl_directory_options_init(&o);
    o.etcd.endpoints = f->etcd.url;
    o.namespace_name = "blue";
    ctl_directory *blue = NULL;
    assert_int_equal(ctl_directory_new("vault", &o, &blue, &f->err), 0);
    assert_true(wait_for(blue, serving_exactly, "curvy", 5000));
    m = ctl_directory_snapshot(blue);
    char key[CTL_CURVE_KEY_BUF];
    assert_int_equal(ctl_curve_read_key(pub, false, key, &f->err), 0);
    assert_string_equal(find_unit(m, "curvy")->curve_public_key, key);
    assert_string_equal(find_unit(m, "curvy")->service, "vault");
    ctl_membership_release(&m);
    ctl_directory_destroy(&blue);
}

/* https with a CA the test made. */
static void test_https(void **state)
{
    fx *f = *state;
    assert_non_null(strstr(f->etcd.url, "https://"));
    const char *extra[] = {"--etcd-cacert", f->etcd.cacert, NULL};
    assert_int_equal(start_unit(&f->units[0], f->etcd.url, "tls", extra), 0);
    f->dir = open_dir(f->etcd.url, f->etcd.cacert, &f->seen, &f->err);
    assert_non_null(f->dir);
    assert_true(wait_for(f->dir, serving_exactly, "tls", 5000));
    /* Without the CA the server's certificate is not trusted. */
    ctl_error err;
    ctl_error_init(&err);
    ctl_directory *d = open_dir(f->etcd.url, NULL, NULL, &err);
    assert_null(d);
    assert_non_null(strstr(err.msg, f->etcd.url));
    ctl_error_fini(&err);
    char out[4096];
    const char *cli[] = {CLI_BIN, "--etcd", f->etcd.url, "--etcd-cacert", f->etcd.cacert,
                         "stats", NULL};
    assert_int_equal(ep_run(out, sizeof out, 20000, cli), 0);
    assert_non_null(strstr(out, f->units[0].endpoint));
}

/* https with a client certificate the cluster asks for. */
static void test_https_client_cert(void **state)
{
    fx *f = *state;
    const char *extra[] = {"--etcd-cacert", f->etcd.cacert, "--etcd-cert", f->etcd.client_cert,
                           "--etcd-key", f->etcd.client_key, NULL};
    assert_int_equal(start_unit(&f->units[0], f->etcd.url, "mtls", extra), 0);
    ctl_directory_options o;
    ctl_directory_options_init(&o);
    o.etcd.endpoints = f->etcd.url;
    o.etcd.cacert = f->etcd.cacert;
    o.etcd.cert = f->etcd.client_cert;
    o.etcd.key = f->etcd.client_key;
    o.check_interval_ms = 250;
    assert_int_equal(ctl_directory_new("storage", &o, &f->dir, &f->err), 0);
    assert_true(wait_for(f->dir, serving_exactly, "mtls", 5000));
    /* Without the certificate the cluster refuses the connection. */
    ctl_error err;
    ctl_error_init(&err);
    ctl_directory *d = open_dir(f->etcd.url, f->etcd.cacert, NULL, &err);
    assert_null(d);
    assert_non_null(strstr(err.msg, f->etcd.url));
    /* Half a pair is a usage error. */
    o.etcd.key = NULL;
    assert_int_equal(ctl_directory_new("storage", &o, &d, &err), CTL_INVALID);
    ctl_error_fini(&err);
}

/* An etcd user with a password (from CTLRPC_ETCD_PASSWORD). */
static void test_auth_user(void **state)
{
    fx *f = *state;
    ep_etcd *e = &f->etcd;
    assert_int_equal(ep_etcdctl(e, NULL, 0, "user", "add", "root:rootpw", NULL), 0);
    assert_int_equal(ep_etcdctl(e, NULL, 0, "user", "grant-role", "root", "root", NULL), 0);
    assert_int_equal(ep_etcdctl(e, NULL, 0, "user", "add", "fleet:fleetpw", NULL), 0);
    assert_int_equal(ep_etcdctl(e, NULL, 0, "role", "add", "fleetrw", NULL), 0);
    assert_int_equal(ep_etcdctl(e, NULL, 0, "role", "grant-permission", "fleetrw", "--prefix=true",
                                "readwrite", "/ctlrpc/v1/default/", NULL), 0);
    assert_int_equal(ep_etcdctl(e, NULL, 0, "user", "grant-role", "fleet", "fleetrw", NULL), 0);
    assert_int_equal(ep_etcdctl(e, NULL, 0, "auth", "enable", NULL), 0);

    setenv("CTLRPC_ETCD_PASSWORD", "fleetpw", 1);
    const char *extra[] = {"--etcd-user", "fleet", NULL};
    assert_int_equal(start_unit(&f->units[0], e->url, "authed", extra), 0);

    ctl_directory_options o;
    ctl_directory_options_init(&o);
    o.etcd.endpoints = e->url;
    o.etcd.user = "fleet";
    o.check_interval_ms = 1500; /* longer than a token lives */
    assert_int_equal(ctl_directory_new("storage", &o, &f->dir, &f->err), 0);
    assert_true(wait_for(f->dir, serving_exactly, "authed", 5000));
    /* Tokens last a second here: past several of them, the unit and the
     * directory log in again and go on (a second unit joins and is seen). */
    ep_sleep_ms(4000);
    assert_int_equal(start_unit(&f->units[1], e->url, "later", extra), 0);
    assert_true(wait_for(f->dir, serving_exactly, "authed,later", 5000));
    assert_false(dir_stale(f->dir));
    ctl_directory_status st;
    ctl_directory_status_get(f->dir, &st);
    assert_int_equal(st.failures, 0); /* each expired token was renewed in its call */
    assert_true(st.listings == 1);

    /* A wrong password fails clearly, at once. */
    ctl_directory *d = NULL;
    o.etcd.password = "wrong";
    ctl_error err;
    ctl_error_init(&err);
    assert_int_equal(ctl_directory_new("storage", &o, &d, &err), CTL_TRANSFER);
    assert_int_equal(err.cause, CTL_CAUSE_AUTH);
    assert_non_null(strstr(err.msg, "authentication failed"));
    /* So does the command line: exit 9, as for a CURVE refusal; 0 with the
     * right password. */
    char out[4096];
    const char *cli[] = {CLI_BIN, "--etcd", e->url, "--service", "storage", "--etcd-user",
                         "fleet", "stats", NULL};
    setenv("CTLRPC_ETCD_PASSWORD", "wrong", 1);
    assert_int_equal(ep_run(out, sizeof out, 20000, cli), 9);
    setenv("CTLRPC_ETCD_PASSWORD", "fleetpw", 1);
    assert_int_equal(ep_run(out, sizeof out, 20000, cli), 0);
    /* No user at all: refused by etcd (auth is on). */
    o.etcd.user = NULL;
    o.etcd.password = NULL;
    o.start_timeout_ms = 500;
    assert_int_equal(ctl_directory_new("storage", &o, &d, &err), CTL_TRANSFER);
    ctl_error_fini(&err);
    unsetenv("CTLRPC_ETCD_PASSWORD");
}

int main(int argc, char **argv)
{
    signal(SIGPIPE, SIG_IGN);
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup_teardown(test_register_list_watch, setup, teardown),
        cmocka_unit_test_setup_teardown(test_sigterm_draining, setup, teardown),
        cmocka_unit_test_setup_teardown(test_sigkill_expires, setup, teardown),
        cmocka_unit_test_setup_teardown(test_key_deleted_put_back, setup, teardown),
        cmocka_unit_test_setup_teardown(test_etcd_frozen, setup, teardown),
        cmocka_unit_test_setup_teardown(test_etcd_restart_same, setup, teardown),
        cmocka_unit_test_setup_teardown(test_etcd_restart_empty, setup, teardown),
        cmocka_unit_test_setup_teardown(test_watch_resume, setup, teardown),
        cmocka_unit_test_setup_teardown(test_compaction, setup, teardown),
        cmocka_unit_test_setup_teardown(test_hostile_values, setup, teardown),
        cmocka_unit_test(test_never_reached),
        cmocka_unit_test_setup_teardown(test_unit_before_etcd, setup, teardown),
        cmocka_unit_test_setup_teardown(test_unit_etcd_down_logged_once, setup, teardown),
        cmocka_unit_test_setup_teardown(test_unit_flags, setup, teardown),
        cmocka_unit_test_setup_teardown(test_https, setup_tls, teardown),
        cmocka_unit_test_setup_teardown(test_https_client_cert, setup_mtls, teardown),
        cmocka_unit_test_setup_teardown(test_auth_user, setup_short_tokens, teardown),
    };
    if (argc > 1)
        cmocka_set_test_filter(argv[1]);
    return cmocka_run_group_tests(tests, NULL, NULL);
}
