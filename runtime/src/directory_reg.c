/*
 * directory_reg.c - a server's registration in etcd (ctl_server_register;
 * docs/PROTOCOL.md, "Membership in etcd").
 *
 * One thread per registration owns its ctl_etcd and does every call:
 * grant a lease and put the key under it, keep the lease alive every
 * TTL/3, put the key again as draining when asked, and revoke the lease
 * when the server has closed. A failed call is retried with backoff and
 * jitter; a lease etcd no longer knows (it expired while etcd was away, or
 * etcd lost its data) is replaced by a new one and the key put again. The
 * server never waits on etcd except for the two bounded steps of its
 * shutdown (the draining mark, at most 2 s, and the revoke, at most the
 * request deadline).
 *
 * The server's hooks (server_int.h) drive it: on_drain marks draining,
 * on_closed stops the thread (which revokes), on_destroy frees. `mu`
 * guards the commands and the figures; etcd calls run without it.
 */
#include <errno.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "ctlrpc/log.h"
#include "ctlrpc/net.h"
#include "ctlrpc/version.h"
#include "directory_int.h"
#include "server_int.h"
#include "util_int.h"

#define LOG_WHO "registration"
/* How long a drain waits for etcd to take the draining mark. */
#define DRAIN_MARK_MS 2000

typedef struct reg {
    ctl_server *server;
    ctl_etcd *etcd;
    char *key;
    char unit_id[CTL_DIRECTORY_NAME_MAX + 1];
    char *service, *address, *version, *host, *idl_hash, *curve_public;
    int64_t pid, started;
    int ttl_s;

    pthread_t thread;
    int thread_started;
    pthread_mutex_t mu;
    pthread_cond_t cv; /* CLOCK_MONOTONIC */
    /* Commands, under mu. */
    bool stop;
    bool draining;    /* wanted state */
    bool put_wanted;  /* the value changed: put it again */
    uint64_t drain_seq, drain_done;
    bool finished;    /* the thread has done its last call to etcd */
    /* Figures, under mu. */
    int64_t lease;
    bool live, live_draining;
    uint64_t registrations, keepalives, failures;
} reg;

void ctl_register_options_init(ctl_register_options *opts)
{
    memset(opts, 0, sizeof *opts);
}

static void free_reg(reg *r)
{
    ctl_etcd_destroy(&r->etcd);
    free(r->key);
    free(r->service);
    free(r->address);
    free(r->version);
    free(r->host);
    free(r->idl_hash);
    free(r->curve_public);
    pthread_mutex_destroy(&r->mu);
    pthread_cond_destroy(&r->cv);
    free(r);
}

/* The value of the key (docs/PROTOCOL.md, "Value"), base64 for the gateway. */
static char *value_b64(const reg *r, bool draining)
{
    json_t *v = json_pack("{s:s, s:s, s:s, s:s, s:s, s:s, s:I, s:I}", "address", r->address,
                          "state", draining ? "draining" : "serving", "service",
                          r->service, "idl_hash", r->idl_hash, "version", r->version, "host",
                          r->host, "pid", (json_int_t)r->pid, "started",
                          (json_int_t)r->started);
    if (!v)
        return NULL;
    if (r->curve_public && *r->curve_public)
        json_object_set_new(v, "curve_public_key", json_string(r->curve_public));
    char *text = json_dumps(v, JSON_COMPACT);
    json_decref(v);
    if (!text)
        return NULL;
    char *b = ctl_b64_encode(text, strlen(text));
    free(text);
    return b;
}

static int64_t grant(reg *r, ctl_error *err)
{
    json_t *body = json_pack("{s:I}", "TTL", (json_int_t)r->ttl_s), *resp = NULL;
    int rc = body ? ctl_etcd_call(r->etcd, "/v3/lease/grant", body, &resp, NULL, err)
                  : ctl_error_transfer(err, CTL_CAUSE_NOMEM, "out of memory");
    json_decref(body);
    if (rc)
        return 0;
    int64_t id = ctl_json_int64(resp, "ID", 0);
    json_decref(resp);
    if (id == 0)
        ctl_error_transfer(err, CTL_CAUSE_BAD_REPLY, "registration %s: etcd %s granted no lease",
                           r->unit_id, ctl_etcd_endpoints(r->etcd));
    return id;
}

static int put(reg *r, int64_t lease, bool draining, ctl_error *err)
{
    char *k = ctl_b64_encode(r->key, strlen(r->key));
    char *v = value_b64(r, draining);
    char lease_s[32];
    snprintf(lease_s, sizeof lease_s, "%lld", (long long)lease);
    json_t *body = k && v ? json_pack("{s:s, s:s, s:s}", "key", k, "value", v, "lease", lease_s)
                          : NULL;
    free(k);
    free(v);
    json_t *resp = NULL;
    int rc = body ? ctl_etcd_call(r->etcd, "/v3/kv/put", body, &resp, NULL, err)
                  : ctl_error_transfer(err, CTL_CAUSE_NOMEM, "out of memory");
    json_decref(body);
    json_decref(resp);
    return rc;
}

/* 1: the key is in etcd, 0: it is not, -1: the call failed. */
static int key_present(reg *r, ctl_error *err)
{
    char *k = ctl_b64_encode(r->key, strlen(r->key));
    json_t *body = k ? json_pack("{s:s, s:b}", "key", k, "count_only", 1) : NULL, *resp = NULL;
    free(k);
    int rc = body ? ctl_etcd_call(r->etcd, "/v3/kv/range", body, &resp, NULL, err)
                  : ctl_error_transfer(err, CTL_CAUSE_NOMEM, "out of memory");
    json_decref(body);
    if (rc)
        return -1;
    int64_t count = ctl_json_int64(resp, "count", 0);
    json_decref(resp);
    return count > 0;
}

/* 1: alive, 0: etcd no longer knows the lease, -1: the call failed. */
static int keepalive(reg *r, int64_t lease, ctl_error *err)
{
    char lease_s[32];
    snprintf(lease_s, sizeof lease_s, "%lld", (long long)lease);
    json_t *body = json_pack("{s:s}", "ID", lease_s), *resp = NULL;
    int code = 0;
    int rc = body ? ctl_etcd_call(r->etcd, "/v3/lease/keepalive", body, &resp, &code, err)
                  : ctl_error_transfer(err, CTL_CAUSE_NOMEM, "out of memory");
    json_decref(body);
    if (rc) {
        /* 5 NotFound: "requested lease not found". */
        return code == 5 ? 0 : -1;
    }
    json_t *res = json_object_get(resp, "result");
    int64_t ttl = ctl_json_int64(res ? res : resp, "TTL", 0);
    json_t *e = json_object_get(resp, "error");
    json_decref(resp);
    if (e)
        return -1;
    return ttl > 0 ? 1 : 0;
}

static void lease_revoke(reg *r, int64_t lease)
{
    char lease_s[32];
    snprintf(lease_s, sizeof lease_s, "%lld", (long long)lease);
    json_t *body = json_pack("{s:s}", "ID", lease_s), *resp = NULL;
    ctl_error err;
    ctl_error_init(&err);
    if (body && ctl_etcd_call(r->etcd, "/v3/lease/revoke", body, &resp, NULL, &err) != 0)
        ctl_log(CTL_LOG_WARN, LOG_WHO,
                "%s: cannot revoke its lease (the key goes when the lease expires, "
                "in %d s at most): %s", r->key, r->ttl_s, err.msg);
    else
        ctl_log(CTL_LOG_INFO, LOG_WHO, "%s: lease revoked, key deleted", r->key);
    json_decref(body);
    json_decref(resp);
    ctl_error_fini(&err);
}

static void deadline_in(struct timespec *ts, int64_t ms)
{
    clock_gettime(CLOCK_MONOTONIC, ts);
    ts->tv_sec += (time_t)(ms / 1000);
    ts->tv_nsec += (long)(ms % 1000) * 1000000L;
    if (ts->tv_nsec >= 1000000000L) {
        ts->tv_sec++;
        ts->tv_nsec -= 1000000000L;
    }
}

/* Wait (under mu) until `ms` have passed or a command came. */
static void wait_ms(reg *r, int64_t ms)
{
    if (ms <= 0)
        return;
    struct timespec ts;
    deadline_in(&ts, ms);
    while (!r->stop && !r->put_wanted)
        if (pthread_cond_timedwait(&r->cv, &r->mu, &ts) == ETIMEDOUT)
            break;
}

static void *reg_main(void *arg)
{
    reg *r = arg;
    ctl_error err;
    ctl_error_init(&err);
    int64_t lease = 0, last_ok = 0, next_ka = 0;
    unsigned attempt = 0, put_attempt = 0;
    bool put_again = false; /* a put failed: again after its backoff */
    bool reported = false; /* the unreachable etcd was logged */
    int period = r->ttl_s * 1000 / 3;
    pthread_mutex_lock(&r->mu);
    for (;;) {
        if (r->stop)
            break;
        bool draining = r->draining;
        bool put_wanted = r->put_wanted || put_again;
        uint64_t seq = r->drain_seq;
        r->put_wanted = false;
        pthread_mutex_unlock(&r->mu);

        int64_t now = ctl_now_ms();
        int64_t wait = 0;
        ctl_error_clear(&err);
        if (lease == 0 && draining) {
            /* A unit that drains does not join the fleet again. */
            pthread_mutex_lock(&r->mu);
            pthread_cond_broadcast(&r->cv);
            pthread_mutex_unlock(&r->mu);
            wait = 60000;
        } else if (lease == 0) {
            int64_t id = grant(r, &err);
            int rc = id ? put(r, id, draining, &err) : -1;
            pthread_mutex_lock(&r->mu);
            if (rc == 0) {
                lease = id;
                put_again = false; /* the value just put is the latest */
                r->lease = id;
                r->live = true;
                r->live_draining = draining;
                r->registrations++;
                if (draining)
                    r->drain_done = seq;
                pthread_cond_broadcast(&r->cv);
                pthread_mutex_unlock(&r->mu);
                ctl_log(reported ? CTL_LOG_WARN : CTL_LOG_INFO, LOG_WHO,
                        "%s registered at etcd %s (lease %lld, TTL %d s)%s", r->key,
                        ctl_etcd_endpoints(r->etcd), (long long)id, r->ttl_s,
                        reported ? ", etcd reachable again" : "");
                reported = false;
                attempt = 0;
                last_ok = ctl_now_ms();
                next_ka = last_ok + period;
            } else {
                r->failures++;
                pthread_mutex_unlock(&r->mu);
                if (!reported)
                    ctl_log(CTL_LOG_WARN, LOG_WHO,
                            "%s: %s; serving anyway, registering when etcd answers",
                            r->key, err.msg);
                reported = true;
                wait = ctl_backoff_ms(attempt < 20 ? attempt++ : attempt);
            }
        } else if (put_wanted) {
            int rc = put(r, lease, draining, &err);
            pthread_mutex_lock(&r->mu);
            if (rc == 0) {
                r->live_draining = draining;
                if (draining)
                    r->drain_done = seq;
                pthread_cond_broadcast(&r->cv);
                last_ok = ctl_now_ms();
                put_again = false;
                put_attempt = 0;
            } else {
                r->failures++;
                /* Again, after a pause (r->put_wanted is a new command's:
                 * it would end the pause at once). */
                put_again = true;
                ctl_log(CTL_LOG_WARN, LOG_WHO, "%s: cannot update the key: %s", r->key,
                        err.msg);
            }
            pthread_mutex_unlock(&r->mu);
            wait = rc == 0 ? 0 : ctl_backoff_ms(put_attempt < 20 ? put_attempt++ : put_attempt);
        } else if (now >= next_ka) {
            int alive = keepalive(r, lease, &err);
            /* A key deleted while its lease lives (an operator's `etcdctl
             * del`, say) goes back: the unit still serves. */
            bool gone = alive == 1 && !put_again && key_present(r, &err) == 0;
            if (gone) {
                ctl_log(CTL_LOG_WARN, LOG_WHO,
                        "%s: the key was deleted while its lease lives; putting it again",
                        r->key);
                put_again = true; /* at once: no wait for it (below) */
            }
            pthread_mutex_lock(&r->mu);
            if (alive == 1) {
                r->keepalives++;
                last_ok = ctl_now_ms();
                next_ka = last_ok + period;
                attempt = 0;
                if (reported)
                    ctl_log(CTL_LOG_WARN, LOG_WHO, "%s: etcd reachable again", r->key);
                reported = false;
            } else {
                if (alive < 0)
                    r->failures++;
                /* Lost: etcd said so, or nothing answered for a whole TTL
                 * (the lease has expired by now, or soon will). */
                if (alive == 0 || ctl_now_ms() - last_ok >= (int64_t)r->ttl_s * 1000) {
                    ctl_log(CTL_LOG_WARN, LOG_WHO, "%s: lease %lld lost (%s); registering again",
                            r->key, (long long)lease,
                            alive == 0 ? "etcd no longer knows it" : err.msg);
                    lease = 0;
                    r->lease = 0;
                    r->live = false;
                } else {
                    if (!reported)
                        ctl_log(CTL_LOG_WARN, LOG_WHO, "%s: keepalive failed: %s", r->key,
                                err.msg);
                    reported = true;
                    int b = ctl_backoff_ms(attempt < 20 ? attempt++ : attempt);
                    if (b > period / 2)
                        b = period / 2;
                    next_ka = ctl_now_ms() + b;
                }
            }
            pthread_mutex_unlock(&r->mu);
        }
        pthread_mutex_lock(&r->mu);
        if (lease && !wait && !r->put_wanted && !put_again) {
            int64_t left = next_ka - ctl_now_ms();
            wait = left > 0 ? left : 0;
        }
        wait_ms(r, wait);
    }
    bool had = lease != 0;
    r->live = false;
    r->lease = 0;
    pthread_mutex_unlock(&r->mu);
    if (had)
        lease_revoke(r, lease);
    ctl_error_fini(&err);
    pthread_mutex_lock(&r->mu);
    r->finished = true;
    pthread_cond_broadcast(&r->cv);
    pthread_mutex_unlock(&r->mu);
    return NULL;
}

static void on_drain(void *arg)
{
    reg *r = arg;
    pthread_mutex_lock(&r->mu);
    if (!r->draining) {
        r->draining = true;
        r->put_wanted = true;
        uint64_t seq = ++r->drain_seq;
        pthread_cond_broadcast(&r->cv);
        /* Wait, bounded, until etcd has the mark: draining is visible
         * while the server drains. */
        struct timespec ts;
        deadline_in(&ts, DRAIN_MARK_MS);
        while (r->drain_done < seq && r->live)
            if (pthread_cond_timedwait(&r->cv, &r->mu, &ts) == ETIMEDOUT)
                break;
        if (r->drain_done < seq && r->live) {
            pthread_mutex_unlock(&r->mu);
            /* etcd does not answer in time: nothing more is waited for,
             * the revoke included (the key goes when its lease expires). */
            ctl_log(CTL_LOG_WARN, LOG_WHO, "%s: etcd did not take the draining mark in %d ms; "
                    "its key goes when its lease expires, in %d s at most", r->key,
                    DRAIN_MARK_MS, r->ttl_s);
            ctl_etcd_abort(r->etcd);
            return;
        }
    }
    pthread_mutex_unlock(&r->mu);
}

static void on_closed(void *arg)
{
    reg *r = arg;
    pthread_mutex_lock(&r->mu);
    r->stop = true;
    pthread_cond_broadcast(&r->cv);
    /* The revoke (and a call in flight before it) gets DRAIN_MARK_MS; then
     * it is cut short, so that a hung etcd does not hold the unit's end. */
    struct timespec ts;
    deadline_in(&ts, DRAIN_MARK_MS);
    bool late = false;
    while (r->thread_started && !r->finished && !late)
        late = pthread_cond_timedwait(&r->cv, &r->mu, &ts) == ETIMEDOUT;
    pthread_mutex_unlock(&r->mu);
    if (late)
        ctl_etcd_abort(r->etcd);
    if (r->thread_started) {
        pthread_join(r->thread, NULL);
        r->thread_started = 0;
    }
}

static void on_destroy(void *arg)
{
    reg *r = arg;
    on_closed(r);
    free_reg(r);
}

/* The host name as a unit id part: characters outside [A-Za-z0-9._-]
 * become '-'. */
static void host_part(const char *host, char *out, size_t len)
{
    size_t i = 0;
    for (; host[i] && i + 1 < len; i++) {
        unsigned char c = (unsigned char)host[i];
        bool ok = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') ||
                  (c >= '0' && c <= '9') || c == '.' || c == '_' || c == '-';
        out[i] = ok ? (char)c : '-';
    }
    out[i] = '\0';
    if (out[0] == '.' || out[0] == '\0')
        out[0] = 'h';
}

static bool wildcard_host(const char *host)
{
    return strcmp(host, "*") == 0 || strcmp(host, "0.0.0.0") == 0 || strcmp(host, "[::]") == 0 ||
           strcmp(host, "[::0]") == 0 || strcmp(host, "::") == 0;
}

int ctl_server_register(ctl_server *server, const ctl_register_options *opts,
                        ctl_error *err)
{
    if (!server)
        return ctl_error_set(err, CTL_INVALID, "registration: server is NULL");
    ctl_register_options defaults;
    if (!opts) {
        ctl_register_options_init(&defaults);
        opts = &defaults;
    }
    if (ctl_server_hooks_arg(server))
        return ctl_error_set(err, CTL_INVALID, "registration: server %s is registered already",
                             ctl_server_endpoint(server));
    const ctl_service *svc = ctl_server_service(server);
    const char *ns = opts->namespace_name ? opts->namespace_name : CTL_NAMESPACE_DEFAULT;
    const char *service = opts->service ? opts->service : svc->name;
    if (!ctl_directory_name_ok(ns, strlen(ns)))
        return ctl_error_set(err, CTL_INVALID,
                             "registration: namespace '%s' is not 1 to %d characters of "
                             "A-Z a-z 0-9 . _ - (not starting with '.')", ns,
                             CTL_DIRECTORY_NAME_MAX);
    if (!service || !ctl_directory_name_ok(service, strlen(service)))
        return ctl_error_set(err, CTL_INVALID,
                             "registration: service '%s' is not 1 to %d characters of "
                             "A-Z a-z 0-9 . _ - (not starting with '.')",
                             service ? service : "", CTL_DIRECTORY_NAME_MAX);
    if (opts->unit_id && !ctl_directory_name_ok(opts->unit_id, strlen(opts->unit_id)))
        return ctl_error_set(err, CTL_INVALID,
                             "registration: unit id '%s' is not 1 to %d characters of "
                             "A-Z a-z 0-9 . _ - (not starting with '.')", opts->unit_id,
                             CTL_DIRECTORY_NAME_MAX);
    int ttl = opts->lease_ttl_s ? opts->lease_ttl_s : CTL_LEASE_TTL_DEFAULT_S;
    if (ttl < CTL_LEASE_TTL_MIN_S || ttl > 86400)
        return ctl_error_set(err, CTL_INVALID,
                             "registration: lease TTL %d s is out of range (%d to 86400)",
                             ttl, CTL_LEASE_TTL_MIN_S);
    const char *address = opts->advertise ? opts->advertise : ctl_server_endpoint(server);
    ctl_endpoint ep;
    int rc = ctl_endpoint_parse(address, &ep, err);
    if (rc) {
        if (err) /* (a setter may take its own message) */
            ctl_error_set(err, CTL_INVALID, "registration: advertise: %s", err->msg);
        return rc;
    }
    if (wildcard_host(ep.host) || ep.any_port)
        return ctl_error_set(err, CTL_INVALID,
                             "registration: '%s' is not an address other hosts can dial: "
                             "give the address to advertise (--advertise tcp://host:port)",
                             address);

    reg *r = calloc(1, sizeof *r);
    if (!r)
        return ctl_error_transfer(err, CTL_CAUSE_NOMEM, "registration: out of memory");
    pthread_mutex_init(&r->mu, NULL);
    pthread_condattr_t ca;
    pthread_condattr_init(&ca);
    pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
    pthread_cond_init(&r->cv, &ca);
    pthread_condattr_destroy(&ca);
    r->server = server;
    r->ttl_s = ttl;
    r->pid = (int64_t)getpid();
    r->started = (int64_t)time(NULL);
    char host[256] = "";
    if (gethostname(host, sizeof host - 1) != 0 || !*host)
        snprintf(host, sizeof host, "localhost");
    if (opts->unit_id) {
        snprintf(r->unit_id, sizeof r->unit_id, "%s", opts->unit_id);
    } else {
        char hp[64];
        host_part(host, hp, sizeof hp);
        snprintf(r->unit_id, sizeof r->unit_id, "%s-%lld-%08x", hp, (long long)r->pid,
                 (unsigned)(ctl_directory_random() & 0xffffffffu));
    }
    char who[sizeof r->unit_id + 32];
    snprintf(who, sizeof who, "registration %s", r->unit_id);
    /* Each request must end well within a keepalive period, so that a
     * slow etcd cannot eat the lease's whole TTL in one call. */
    ctl_etcd_options eo = opts->etcd;
    int period_ms = ttl * 1000 / 3;
    if (eo.timeout_ms == 0)
        eo.timeout_ms = CTL_ETCD_TIMEOUT_DEFAULT_MS < period_ms ? CTL_ETCD_TIMEOUT_DEFAULT_MS
                                                                : period_ms;
    if ((rc = ctl_etcd_new(&eo, who, &r->etcd, err)) != 0) {
        free_reg(r);
        return rc;
    }
    r->key = ctl_directory_prefix(ns, service);
    char *full = NULL;
    if (r->key && asprintf(&full, "%s%s", r->key, r->unit_id) < 0)
        full = NULL;
    free(r->key);
    r->key = full;
    r->service = strdup(service);
    r->address = strdup(address);
    r->version = strdup(opts->version ? opts->version : CTLRPC_VERSION_STRING);
    r->host = strdup(host);
    r->idl_hash = strdup(svc->idl_sha256 ? svc->idl_sha256 : "");
    r->curve_public = strdup(ctl_server_curve_public(server));
    if (!r->key || !r->service || !r->address || !r->version || !r->host || !r->idl_hash ||
        !r->curve_public) {
        free_reg(r);
        return ctl_error_transfer(err, CTL_CAUSE_NOMEM, "registration: out of memory");
    }
    ctl_server_hooks hooks = {on_drain, on_closed, on_destroy, r};
    if (ctl_server_set_hooks(server, &hooks) != 0) {
        free_reg(r);
        return ctl_error_set(err, CTL_INVALID, "registration: server %s is closed",
                             ctl_server_endpoint(server));
    }
    rc = ctl_thread_start(&r->thread, reg_main, r);
    if (rc != 0)
        return ctl_error_transfer(err, CTL_CAUSE_TRANSPORT,
                                  "registration %s: cannot start its thread: %s", r->key,
                                  strerror(rc));
    /* (The hooks stay: destroy frees the registration.) */
    r->thread_started = 1;
    return 0;
}

void ctl_server_registration(const ctl_server *server, ctl_registration_info *out)
{
    memset(out, 0, sizeof *out);
    reg *r = ctl_server_hooks_arg(server);
    if (!r)
        return;
    pthread_mutex_lock(&r->mu);
    out->registered = true;
    out->live = r->live;
    out->draining = r->live && r->live_draining;
    out->lease_id = r->lease;
    out->registrations = r->registrations;
    out->keepalives = r->keepalives;
    out->failures = r->failures;
    snprintf(out->key, sizeof out->key, "%s", r->key);
    snprintf(out->unit_id, sizeof out->unit_id, "%s", r->unit_id);
    pthread_mutex_unlock(&r->mu);
}
