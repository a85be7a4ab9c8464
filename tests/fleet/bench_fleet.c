/*
 * bench_fleet.c - ctl-fleet-bench: what a fleet costs etcd and how fast
 * membership moves (docs/PERFORMANCE.md, "A fleet in etcd").
 *
 *   ctl-fleet-bench [--units N] [--quick]
 *
 * Against a private etcd (etcdproc.h), it registers N servers of this
 * process (default 1000; --quick: 100), each with its own registration
 * (lease TTL 10 s), then measures, in the same run:
 *
 *   list      ctl_directory_new (one listing of N units, parsed) against
 *             `etcdctl get --prefix` of the same keys (a process each time)
 *   register  ctl_server_register of one more server to its appearance in
 *             a watching directory's callback
 *   sigterm   SIGTERM of a ctl-storage-unit to its draining mark, and to its
 *             removal (drained, lease revoked)
 *   sigkill   SIGKILL of a ctl-storage-unit (TTL 2 s) to its removal
 *   keepalive the lease renewals per second etcd counts
 *             (etcd_debugging_lease_renewed_total over 10 s)
 *
 * Medians of several runs; one line per figure.
 */
#include <errno.h>
#include <getopt.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>

#include <curl/curl.h>
#include <zmq.h>

#include "ctlrpc/directory.h"
#include "ctlrpc/log.h"
#include "etcdproc.h"

static int on_noop(void *user, const msgpack_object *args, ctl_req *req)
{
    (void)user;
    (void)args;
    (void)req;
    return 0;
}

static const ctl_op bench_ops[] = {{.name = "noop", .handler = on_noop}};
static const ctl_service bench_service = {.name = "bench", .ops = bench_ops, .op_count = 1};

static int cmp_ll(const void *a, const void *b)
{
    long long x = *(const long long *)a, y = *(const long long *)b;
    return x < y ? -1 : x > y;
}

static long long median(long long *v, int n)
{
    qsort(v, (size_t)n, sizeof *v, cmp_ll);
    return v[n / 2];
}

/* The watcher: the time a unit id first appeared and first vanished. */
typedef struct watch {
    pthread_mutex_t mu;
    char id[64];
    long long seen_ms, unserving_ms, gone_ms;
} watch;

static void on_change(void *user, const ctl_membership *m)
{
    watch *w = user;
    pthread_mutex_lock(&w->mu);
    bool present = false, serving = false;
    for (size_t i = 0; i < m->count; i++)
        if (strcmp(m->units[i].unit_id, w->id) == 0) {
            present = true;
            serving = m->units[i].serving;
        }
    if (serving && !w->seen_ms)
        w->seen_ms = ep_now_ms();
    if (!serving && w->seen_ms && !w->unserving_ms)
        w->unserving_ms = ep_now_ms();
    if (!present && w->seen_ms && !w->gone_ms)
        w->gone_ms = ep_now_ms();
    pthread_mutex_unlock(&w->mu);
}

static void watch_reset(watch *w, const char *id)
{
    pthread_mutex_lock(&w->mu);
    snprintf(w->id, sizeof w->id, "%s", id);
    w->seen_ms = w->unserving_ms = w->gone_ms = 0;
    pthread_mutex_unlock(&w->mu);
}

enum { SEEN, UNSERVING, GONE };

static long long watch_get(watch *w, int what, int timeout_ms)
{
    long long deadline = ep_now_ms() + timeout_ms;
    for (;;) {
        pthread_mutex_lock(&w->mu);
        long long t = what == SEEN ? w->seen_ms : what == UNSERVING ? w->unserving_ms : w->gone_ms;
        pthread_mutex_unlock(&w->mu);
        if (t || ep_now_ms() > deadline)
            return t;
        ep_sleep_ms(1);
    }
}

typedef struct grow {
    char *data;
    size_t len;
} grow;

static size_t grow_write(char *p, size_t s, size_t n, void *arg)
{
    grow *g = arg;
    char *d = realloc(g->data, g->len + s * n + 1);
    if (!d)
        return 0;
    memcpy(d + g->len, p, s * n);
    g->data = d;
    g->len += s * n;
    d[g->len] = '\0';
    return s * n;
}

/* A counter from etcd's /metrics, or -1. */
static double metric(const char *url, const char *name)
{
    char full[256];
    snprintf(full, sizeof full, "%s/metrics", url);
    CURL *h = curl_easy_init();
    grow g = {NULL, 0};
    curl_easy_setopt(h, CURLOPT_URL, full);
    curl_easy_setopt(h, CURLOPT_TIMEOUT_MS, 5000L);
    curl_easy_setopt(h, CURLOPT_WRITEFUNCTION, grow_write);
    curl_easy_setopt(h, CURLOPT_WRITEDATA, &g);
    double v = -1;
    if (curl_easy_perform(h) == CURLE_OK && g.data) {
        char pat[128];
        snprintf(pat, sizeof pat, "\n%s ", name);
        const char *p = strstr(g.data, pat);
        if (p)
            v = strtod(p + strlen(pat), NULL);
    }
    curl_easy_cleanup(h);
    free(g.data);
    return v;
}

static ctl_directory *open_dir(const char *url, watch *w)
{
    ctl_directory_options o;
    ctl_directory_options_init(&o);
    o.etcd.endpoints = url;
    if (w) {
        o.on_change = on_change;
        o.user = w;
    }
    ctl_error err;
    ctl_error_init(&err);
    ctl_directory *d = NULL;
    if (ctl_directory_new("bench", &o, &d, &err) != 0)
        fprintf(stderr, "ctl-fleet-bench: %s\n", err.msg);
    ctl_error_fini(&err);
    return d;
}

static ctl_server *serve_one(void *ctx, const char *url, const char *id, int ttl)
{
    ctl_server_options so;
    ctl_server_options_init(&so);
    so.endpoint = "tcp://127.0.0.1:0";
    so.zmq_context = ctx;
    ctl_server *s = NULL;
    ctl_error err;
    ctl_error_init(&err);
    if (ctl_server_new(&bench_service, NULL, &so, &s, &err) == 0) {
        ctl_register_options ro;
        ctl_register_options_init(&ro);
        ro.etcd.endpoints = url;
        ro.unit_id = id;
        ro.lease_ttl_s = ttl;
        if (ctl_server_register(s, &ro, &err) != 0)
            ctl_server_destroy(&s);
    }
    if (!s)
        fprintf(stderr, "ctl-fleet-bench: unit %s: %s\n", id, err.msg);
    ctl_error_fini(&err);
    return s;
}

int main(int argc, char **argv)
{
    int units = 1000;
    static const struct option opts[] = {{"units", required_argument, NULL, 'n'},
                                         {"quick", no_argument, NULL, 'q'},
                                         {NULL, 0, NULL, 0}};
    int c;
    while ((c = getopt_long(argc, argv, "", opts, NULL)) != -1) {
        if (c == 'n')
            units = atoi(optarg);
        else if (c == 'q')
            units = 100;
        else {
            fprintf(stderr, "usage: ctl-fleet-bench [--units N] [--quick]\n");
            return 2;
        }
    }
    if (units < 1 || units > 5000) {
        fprintf(stderr, "ctl-fleet-bench: --units from 1 to 5000\n");
        return 2;
    }
    signal(SIGPIPE, SIG_IGN);
    struct rlimit rl;
    if (getrlimit(RLIMIT_NOFILE, &rl) == 0) {
        rl.rlim_cur = rl.rlim_max;
        setrlimit(RLIMIT_NOFILE, &rl);
    }
    ctl_log_set_level(CTL_LOG_ERROR);
    ep_etcd e;
    if (ep_start(&e, false, 20000) != 0)
        return 1;
    void *ctx = zmq_ctx_new();
    zmq_ctx_set(ctx, ZMQ_MAX_SOCKETS, 4 * units + 64);
    ctl_server **servers = calloc((size_t)units + 16, sizeof *servers);
    int rc = 0;

    /* N units register. */
    long long t0 = ep_now_ms();
    for (int i = 0; i < units && servers; i++) {
        char id[32];
        snprintf(id, sizeof id, "u%05d", i);
        if (!(servers[i] = serve_one(ctx, e.url, id, 10))) {
            rc = 1;
            break;
        }
    }
    ctl_directory *d = rc ? NULL : open_dir(e.url, NULL);
    long long all_ms = -1;
    while (d && ep_now_ms() - t0 < 120000) {
        ctl_membership *m = ctl_directory_snapshot(d);
        bool done = m && m->serving_count == (size_t)units;
        ctl_membership_release(&m);
        if (done) {
            all_ms = ep_now_ms() - t0;
            break;
        }
        ep_sleep_ms(10);
    }
    ctl_directory_destroy(&d);
    if (all_ms < 0) {
        fprintf(stderr, "ctl-fleet-bench: the %d units did not all register\n", units);
        rc = 1;
    }
    printf("units                       %d (lease TTL 10 s), all registered in %lld ms\n",
           units, all_ms);

    /* List: a directory's first listing vs etcdctl. */
    enum { RUNS = 7 };
    long long lt[RUNS], et[RUNS];
    for (int r = 0; r < RUNS && rc == 0; r++) {
        long long a = ep_now_ms();
        ctl_directory *x = open_dir(e.url, NULL);
        lt[r] = ep_now_ms() - a;
        ctl_membership *m = x ? ctl_directory_snapshot(x) : NULL;
        if (!m || m->count != (size_t)units)
            rc = 1;
        ctl_membership_release(&m);
        ctl_directory_destroy(&x);
        static char out[4 << 20];
        a = ep_now_ms();
        if (ep_etcdctl(&e, out, sizeof out, "get", "--prefix", "/ctlrpc/v1/default/bench/",
                       NULL) != 0)
            rc = 1;
        et[r] = ep_now_ms() - a;
    }
    if (rc == 0)
        printf("list %d units               ctl_directory_new %lld ms, etcdctl get --prefix "
               "%lld ms (medians of %d)\n", units, median(lt, RUNS), median(et, RUNS), RUNS);

    /* Keepalives: renewals etcd counts over 10 s. */
    if (rc == 0) {
        const char *name = "etcd_debugging_lease_renewed_total";
        double k0 = metric(e.url, name);
        long long a = ep_now_ms();
        ep_sleep_ms(10000);
        double k1 = metric(e.url, name);
        double secs = (double)(ep_now_ms() - a) / 1000.0;
        if (k0 >= 0 && k1 >= 0)
            printf("keepalives                  %.0f per second on etcd (%d units, TTL 10 s: "
                   "expected %.0f)\n", (k1 - k0) / secs, units, units / (10.0 / 3.0));
        else
            printf("keepalives                  (etcd does not report %s)\n", name);
    }

    /* Registration and removal as a watcher sees them. */
    watch w;
    memset(&w, 0, sizeof w);
    pthread_mutex_init(&w.mu, NULL);
    ctl_directory *wd = rc ? NULL : open_dir(e.url, &w);
    if (wd) {
        long long reg[RUNS], term[3], termgone[3], kill9[3];
        for (int r = 0; r < RUNS; r++) {
            char id[32];
            snprintf(id, sizeof id, "extra%d", r);
            watch_reset(&w, id);
            long long a = ep_now_ms();
            ctl_server *s = serve_one(ctx, e.url, id, 10);
            long long seen = watch_get(&w, SEEN, 10000);
            reg[r] = seen ? seen - a : -1;
            ctl_server_destroy(&s); /* close revokes the lease */
            watch_get(&w, GONE, 10000);
        }
        const char *unit_bin = UNIT_BIN;
        for (int r = 0; r < 3; r++) {
            for (int k = 0; k < 2; k++) {
                char id[32];
                snprintf(id, sizeof id, "proc%d%c", r, k ? 'k' : 't');
                const char *av[] = {unit_bin, "--bind", "tcp://127.0.0.1:0", "--etcd", e.url,
                                    "--service", "bench", "--unit-id", id, "--lease-ttl", "2",
                                    NULL};
                watch_reset(&w, id);
                ep_unit u;
                if (ep_unit_start(&u, av, 10000) != 0 || !watch_get(&w, SEEN, 10000)) {
                    rc = 1;
                    break;
                }
                long long a = ep_now_ms();
                if (k)
                    ep_unit_kill(&u);
                else
                    ep_unit_signal(&u, SIGTERM);
                long long uns = watch_get(&w, UNSERVING, 10000);
                long long gone = watch_get(&w, GONE, 10000);
                if (k) {
                    kill9[r] = gone ? gone - a : -1;
                } else {
                    term[r] = uns ? uns - a : -1;
                    termgone[r] = gone ? gone - a : -1;
                }
                ep_unit_stop(&u, 5000);
            }
        }
        printf("register -> watcher         %lld ms (median of %d)\n", median(reg, RUNS), RUNS);
        if (rc == 0) {
            printf("SIGTERM -> draining seen    %lld ms, key gone %lld ms (drained, lease "
                   "revoked; medians of 3)\n", median(term, 3), median(termgone, 3));
            printf("SIGKILL -> watcher          %lld ms (lease TTL 2 s expires; median of 3)\n",
                   median(kill9, 3));
        }
        ctl_directory_destroy(&wd);
    }
    pthread_mutex_destroy(&w.mu);

    for (int i = 0; i < units && servers; i++)
        ctl_server_destroy(&servers[i]);
    free(servers);
    zmq_ctx_term(ctx);
    ep_destroy(&e);
    return rc;
}
