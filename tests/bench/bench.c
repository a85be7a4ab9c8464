/*
 * bench.c - ctl-bench: ctlrpc measured against the bare ZeroMQ transport it
 * runs on.
 *
 * Every case runs against its baseline in the same process invocation,
 * side by side: round after round, the case and its baseline take turns
 * (the one that goes first alternates), and the table quotes the median
 * over the rounds of each figure. The ratio column is the median of the
 * per-round ratios ctlrpc/baseline, so a burst of noise from the machine
 * (these are shared 2-core boxes) hits both sides of a pair and cancels.
 *
 * Cases (--case):
 *   small       one client thread, one small call at a time: the generated
 *               stubs storage_describe (one key) and storage_stats vs a bare
 *               DEALER->ROUTER echo of the very bytes the stub sends
 *               (captured from the stub at start): p50/p99, calls/s.
 *   throughput  one unit, T = 1, 4, 16 client threads calling describe
 *               through one shared ctl_client vs T DEALER threads on the
 *               echo server: calls/s, and the server's CPU seconds per 10k
 *               calls (see bench.h for how server CPU is read).
 *   fanout      storage_stats_many over 1, 4, 16 units vs the same fan-out
 *               (send all, then collect) to as many echo servers: batch
 *               p50/p99.
 *   blobs       put then get of 64 KiB, 1 MiB, 8 MiB (or the sizes of
 *               --blob-sizes; ctl-scale runs it up to 64 MiB) through the stubs,
 *               the put sent from a ctl_blob (and, for information, the same
 *               from a plain buffer, which the request copies), vs
 *               one echo round trip of a message that size (both move the
 *               payload once each way): MB/s of payload moved; and vs the
 *               same two round trips over bare ZeroMQ with no copy (a
 *               "keeper" ROUTER); the process's CPU and page faults per op. Then the copies of each payload byte, counted
 *               (not estimated) by a child run of this program under the
 *               copy-counting shim (copycount.c).
 *   async       one thread keeping 64 calls in flight to one unit
 *               (storage_describe_start, completions run by
 *               ctl_client_process when the client's event descriptor is
 *               readable, each callback starting the next call) vs a bare
 *               DEALER keeping 64 of the stub's request bytes pipelined to
 *               the echo server: calls/s. Then the memory per call in
 *               flight: RSS before and with 1000 calls in flight to a
 *               ROUTER that never answers, per call (its socket included).
 *   gen         ctlrpc-gen on a 200-op IDL, then `cc -c` of its output, vs
 *               the same for idl/storage.idl (9 ops): seconds.
 *   python      the small and throughput cases against the Python storage
 *               unit of the interop tests (tests/interop/pyunit.py), with
 *               the echo server as baseline, for context.
 *
 * Servers run in this process (bench.h), except the Python unit. Every
 * socket binds and dials 127.0.0.1.
 *
 * Exit status: 0 when every case ran (whatever the figures: there are no
 * thresholds), 1 when a call failed or a case could not be set up, 2 for a
 * bad command line.
 */
#define _GNU_SOURCE
#include <malloc.h>
#include <poll.h>
#include "bench.h"

#include <errno.h>
#include <ftw.h>
#include <getopt.h>
#include <inttypes.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include <zmq.h>

#include "store.h"
#include "vsgrpc.h"

#define CALL_TIMEOUT_MS 30000
#define MAX_UNITS 16
#define MAX_THREADS_T 16
#define BLOB_KEY "bench-blob"
#define SMALL_KEY "bench-key"

extern char **environ;

/* ---- configuration ------------------------------------------------------ */

enum {
    CASE_SMALL = 1 << 0,
    CASE_THROUGHPUT = 1 << 1,
    CASE_FANOUT = 1 << 2,
    CASE_BLOBS = 1 << 3,
    CASE_GEN = 1 << 4,
    CASE_PYTHON = 1 << 5,
    CASE_ASYNC = 1 << 6,
    CASE_ALL = (1 << 7) - 1
};

static const bench_case_name case_names[] = {
    {"small", CASE_SMALL},   {"throughput", CASE_THROUGHPUT},
    {"fanout", CASE_FANOUT}, {"blobs", CASE_BLOBS},
    {"gen", CASE_GEN},       {"python", CASE_PYTHON},
    {"async", CASE_ASYNC},
    {"all", CASE_ALL},
};

typedef struct config {
    int quick;
    int rounds;
    double seconds;      /* one throughput trial */
    size_t small_calls;  /* calls per round, small case */
    size_t py_calls;     /* calls per round, Python small case */
    size_t batches;      /* batches per round, fan-out */
    size_t blob_budget;  /* payload bytes per round and side, blobs */
    char blob_sizes_arg[128]; /* --blob-sizes as given (for the copy count) */
    unsigned cases;
    char tmpdir[256];
} config;

static config cfg;

/* ---- messages ----------------------------------------------------------- */



/* ---- the table ---------------------------------------------------------- */

enum target { T_NONE, T_LE, T_GE, T_ZERO };

typedef struct row {
    char group[96];
    char label[40];
    char metric[20];
    int decimals;
    double ours, base, ratio;
    int has_ratio;
    enum target target;
    double limit;
} row;

#define MAX_ROWS 128
static row rows[MAX_ROWS];
static size_t n_rows;
static char current_group[96];

#define MAX_NOTES 64
static char *notes[MAX_NOTES];
static size_t n_notes;

static void note(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
static void note(const char *fmt, ...)
{
    va_list ap;
    char *s = NULL;
    va_start(ap, fmt);
    if (vasprintf(&s, fmt, ap) < 0)
        s = NULL;
    va_end(ap);
    if (s && n_notes < MAX_NOTES)
        notes[n_notes++] = s;
    else
        free(s);
}

static void group(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
static void group(const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(current_group, sizeof current_group, fmt, ap);
    va_end(ap);
}



/* A row from per-round figures: medians of each side and the median of
 * the per-round ratios ours/base. */
static void add_row(const char *label, const char *metric, int decimals,
                    const double *ours, const double *base, int n,
                    enum target target, double limit)
{
    if (n_rows >= MAX_ROWS)
        return;
    row *r = &rows[n_rows++];
    double ratios[BENCH_MAX_ROUNDS];
    int k = 0;
    memset(r, 0, sizeof *r);
    snprintf(r->group, sizeof r->group, "%s", current_group);
    snprintf(r->label, sizeof r->label, "%s", label);
    snprintf(r->metric, sizeof r->metric, "%s", metric);
    r->decimals = decimals;
    r->ours = bench_median(ours, n);
    r->base = bench_median(base, n);
    for (int i = 0; i < n; i++)
        if (base[i] > 0)
            ratios[k++] = ours[i] / base[i];
    r->has_ratio = k > 0;
    r->ratio = bench_median(ratios, k);
    r->target = target;
    r->limit = limit;
}

#ifdef CTL_BENCH_COPYCOUNT_SO
/* A row of two plain figures (no rounds, no ratio). */
static void add_plain_row(const char *label, const char *metric, int decimals,
                          double ours, double base, enum target target)
{
    add_row(label, metric, decimals, &ours, &base, 1, target, 0);
    rows[n_rows - 1].has_ratio = 0;
}
#endif

static const char *verdict(const row *r)
{
    switch (r->target) {
    case T_LE:
        return r->has_ratio ? (r->ratio <= r->limit ? "ok" : "MISS") : "";
    case T_GE:
        return r->has_ratio ? (r->ratio >= r->limit ? "ok" : "MISS") : "";
    case T_ZERO:
        return r->ours == 0 ? "ok" : "MISS";
    case T_NONE:
        break;
    }
    return "";
}

static void print_table(void)
{
    const char *last = "";
    printf("%-26s %-15s %12s %12s %8s  %-8s %s\n", "case", "metric", "ctlrpc",
           "baseline", "ratio", "target", "");
    for (size_t i = 0; i < n_rows; i++) {
        const row *r = &rows[i];
        char target[16] = "", ratio[16] = "-";
        if (strcmp(r->group, last) != 0) {
            printf("-- %s\n", r->group);
            last = r->group;
        }
        if (r->target == T_LE)
            snprintf(target, sizeof target, "<= %.2f", r->limit);
        else if (r->target == T_GE)
            snprintf(target, sizeof target, ">= %.2f", r->limit);
        else if (r->target == T_ZERO)
            snprintf(target, sizeof target, "0");
        if (r->has_ratio)
            snprintf(ratio, sizeof ratio, "%.3fx", r->ratio);
        printf("%-26s %-15s %12.*f %12.*f %8s  %-8s %s\n", r->label, r->metric,
               r->decimals, r->ours, r->decimals, r->base, ratio, target,
               verdict(r));
    }
    for (size_t i = 0; i < n_notes; i++)
        printf("%s\n", notes[i]);
}

/* ---- latency and rounds ------------------------------------------------- */

typedef int (*call_fn)(void *arg);

typedef struct lat_result {
    double p50_us, p99_us, per_s;
} lat_result;


/* `n` calls of fn(arg) back to back, each timed. */
static int time_calls(call_fn fn, void *arg, size_t n, lat_result *out)
{
    uint64_t *lat = malloc(n * sizeof *lat);
    if (!lat) {
        bench_fail("out of memory");
        return -1;
    }
    uint64_t t0 = now_ns();
    for (size_t i = 0; i < n; i++) {
        uint64_t a = now_ns();
        if (fn(arg) != 0) {
            free(lat);
            return -1;
        }
        lat[i] = now_ns() - a;
    }
    double elapsed = (double)(now_ns() - t0) / 1e9;
    qsort(lat, n, sizeof *lat, bench_cmp_u64);
    out->p50_us = (double)lat[(n - 1) * 50 / 100] / 1e3;
    out->p99_us = (double)lat[(n - 1) * 99 / 100] / 1e3;
    out->per_s = elapsed > 0 ? (double)n / elapsed : 0;
    free(lat);
    return 0;
}

static int warm(call_fn fn, void *arg, size_t n)
{
    for (size_t i = 0; i < n; i++)
        if (fn(arg) != 0)
            return -1;
    return 0;
}

/* Per-round latency figures of one case against its baseline. */
typedef struct lat_pair {
    double p50[2][BENCH_MAX_ROUNDS], p99[2][BENCH_MAX_ROUNDS], per_s[2][BENCH_MAX_ROUNDS];
} lat_pair;

/* cfg.rounds rounds of `n` calls of each side, alternating which goes
 * first. Side 0 is ctlrpc, side 1 the baseline. */
static int run_pair(const char *what, call_fn fn0, void *arg0, call_fn fn1,
                    void *arg1, size_t n, lat_pair *out)
{
    call_fn fns[2] = {fn0, fn1};
    void *args[2] = {arg0, arg1};
    size_t w = n / 10 < 50 ? 50 : n / 10;
    if (warm(fn0, arg0, w) != 0 || warm(fn1, arg1, w) != 0)
        return -1;
    for (int r = 0; r < cfg.rounds; r++) {
        for (int k = 0; k < 2; k++) {
            int side = (r % 2) ? 1 - k : k;
            lat_result lr;
            if (time_calls(fns[side], args[side], n, &lr) != 0)
                return -1;
            out->p50[side][r] = lr.p50_us;
            out->p99[side][r] = lr.p99_us;
            out->per_s[side][r] = lr.per_s;
        }
        bench_progress("%s: round %d/%d: p50 %.1f vs %.1f us", what, r + 1, cfg.rounds,
                 out->p50[0][r], out->p50[1][r]);
    }
    return 0;
}

/* ---- the calls ---------------------------------------------------------- */

static void *echo_dial(void *ctx, const char *endpoint)
{
    void *s = zmq_socket(ctx, ZMQ_DEALER);
    int zero = 0, tmo = CALL_TIMEOUT_MS;
    if (!s)
        return NULL;
    zmq_setsockopt(s, ZMQ_LINGER, &zero, sizeof zero);
    zmq_setsockopt(s, ZMQ_RCVTIMEO, &tmo, sizeof tmo);
    zmq_setsockopt(s, ZMQ_SNDTIMEO, &tmo, sizeof tmo);
    if (zmq_connect(s, endpoint) != 0) {
        zmq_close(s);
        return NULL;
    }
    return s;
}

/* One bare round trip: send `len` bytes, wait for as many back. `zero_copy`
 * hands the buffer to ZeroMQ without a copy (it stays ours: the reply
 * cannot come before ZeroMQ is done sending it). */
static int echo_round_trip(void *sock, const void *buf, size_t len, int zero_copy)
{
    zmq_msg_t m;
    int rc;
    if (zero_copy) {
        zmq_msg_init_data(&m, (void *)buf, len, NULL, NULL);
        rc = zmq_msg_send(&m, sock, 0);
        if (rc < 0)
            zmq_msg_close(&m);
    } else {
        rc = zmq_send(sock, buf, len, 0);
    }
    if (rc < 0) {
        bench_fail("echo: send: %s", zmq_strerror(zmq_errno()));
        return -1;
    }
    zmq_msg_init(&m);
    rc = zmq_msg_recv(&m, sock, 0);
    size_t got = zmq_msg_size(&m);
    zmq_msg_close(&m);
    if (rc < 0 || got != len) {
        bench_fail("echo: receive: %s", rc < 0 ? zmq_strerror(zmq_errno()) : "wrong size");
        return -1;
    }
    return 0;
}

typedef struct echo_call {
    void *sock;
    const void *buf;
    size_t len;
    int zero_copy;
} echo_call;

static int call_echo(void *arg)
{
    echo_call *e = arg;
    return echo_round_trip(e->sock, e->buf, e->len, e->zero_copy);
}

typedef struct stub_call {
    ctl_client *client;
    const char *address;
    storage_describe_args describe;
} stub_call;

static const ctl_str small_keys[1] = {{SMALL_KEY, sizeof SMALL_KEY - 1}};

static void stub_call_init(stub_call *s, ctl_client *client, const char *address)
{
    s->client = client;
    s->address = address;
    storage_describe_args_init(&s->describe);
    s->describe.keys = (storage_list_str){.items = small_keys, .count = 1};
}

static int call_describe(void *arg)
{
    stub_call *s = arg;
    storage_list_BlobInfo res;
    ctl_reply *reply = NULL;
    ctl_error err;
    ctl_error_init(&err);
    int rc = storage_describe(s->client, s->address, &s->describe,
                              CALL_TIMEOUT_MS, &res, &reply, &err);
    if (rc == 0 && res.count != 1)
        rc = -1;
    if (rc != 0)
        bench_fail("describe at %s: %s", s->address, err.msg ? err.msg : "bad result");
    ctl_reply_destroy(&reply);
    ctl_error_fini(&err);
    return rc ? -1 : 0;
}

static int call_stats(void *arg)
{
    stub_call *s = arg;
    storage_UnitStats res;
    ctl_reply *reply = NULL;
    ctl_error err;
    ctl_error_init(&err);
    int rc = storage_stats(s->client, s->address, CALL_TIMEOUT_MS, &res,
                           &reply, &err);
    if (rc != 0)
        bench_fail("stats at %s: %s", s->address, err.msg ? err.msg : "failed");
    ctl_reply_destroy(&reply);
    ctl_error_fini(&err);
    return rc ? -1 : 0;
}

static int put_blob(ctl_client *client, const char *address, const char *key,
                    const void *data, size_t size)
{
    storage_put_args a;
    uint64_t stored = 0;
    ctl_error err;
    storage_put_args_init(&a);
    a.key = ctl_str_c(key);
    a.data = (ctl_str){data, size};
    ctl_error_init(&err);
    int rc = storage_put(client, address, &a, CALL_TIMEOUT_MS, &stored, &err);
    if (rc == 0 && stored != size)
        rc = -1;
    if (rc != 0)
        bench_fail("put of %zu bytes at %s: %s", size, address,
             err.msg ? err.msg : "wrong size stored");
    ctl_error_fini(&err);
    return rc ? -1 : 0;
}

static int get_blob(ctl_client *client, const char *address, const char *key,
                    size_t size)
{
    storage_get_args a;
    storage_list_bin res;
    ctl_reply *reply = NULL;
    ctl_error err;
    ctl_str k = ctl_str_c(key);
    storage_get_args_init(&a);
    a.keys = (storage_list_str){.items = &k, .count = 1};
    ctl_error_init(&err);
    int rc = storage_get(client, address, &a, CALL_TIMEOUT_MS, &res, &reply, &err);
    if (rc == 0 && (res.count != 1 || res.items[0].len != size))
        rc = -1;
    if (rc != 0)
        bench_fail("get of %zu bytes at %s: %s", size, address,
             err.msg ? err.msg : "wrong size");
    ctl_reply_destroy(&reply);
    ctl_error_fini(&err);
    return rc ? -1 : 0;
}

/*
 * The bytes a stub sends for one call: the stub starts a call to a ROUTER
 * that never answers, the request is read off it, and the call is
 * cancelled. The echo baselines send exactly these bytes, envelope and all
 * (only the request id differs from call to call). The call is given an
 * hour: a request id carries its call's deadline, and the async case sends
 * these bytes to a unit, which skips a request whose deadline has passed.
 */
#define CAPTURE_DEADLINE_MS (3600 * 1000)

/* The captured calls end cancelled; nothing waits for their outcome. */
static void capture_describe_done(void *user, const ctl_error *err,
                                  const storage_list_BlobInfo *result)
{
    (void)user, (void)err, (void)result;
}

static void capture_stats_done(void *user, const ctl_error *err, const storage_UnitStats *result)
{
    (void)user, (void)err, (void)result;
}

static int capture_request(void *ectx, int stats, unsigned char **out,
                           size_t *len)
{
    char ep[BENCH_ENDPOINT_MAX];
    size_t eplen = sizeof ep;
    int zero = 0, rc = -1;
    ctl_client *c = NULL;
    ctl_call *call = NULL;
    ctl_client_options o;
    ctl_error err;
    *out = NULL;
    void *tap = zmq_socket(ectx, ZMQ_ROUTER);
    ctl_error_init(&err);
    if (!tap || zmq_setsockopt(tap, ZMQ_LINGER, &zero, sizeof zero) != 0 ||
        zmq_bind(tap, "tcp://127.0.0.1:*") != 0 ||
        zmq_getsockopt(tap, ZMQ_LAST_ENDPOINT, ep, &eplen) != 0) {
        bench_fail("capture: %s", zmq_strerror(zmq_errno()));
        goto out;
    }
    ctl_client_options_init(&o);
    o.late_grace_ms = 0;
    if (ctl_client_new(&o, &c, &err) != 0) {
        bench_fail("capture: %s", err.msg);
        goto out;
    }
    stub_call s;
    stub_call_init(&s, c, ep);
    int started = stats ? storage_stats_start(c, ep, CAPTURE_DEADLINE_MS, capture_stats_done,
                                              NULL, &call)
                        : storage_describe_start(c, ep, &s.describe, CAPTURE_DEADLINE_MS,
                                                 capture_describe_done, NULL, &call);
    if (started != 0) {
        bench_fail("capture: the stub's call did not start");
        goto out;
    }
    /* A busy machine may take a while to connect. */
    zmq_pollitem_t it = {tap, 0, ZMQ_POLLIN, 0};
    zmq_msg_t id, payload;
    zmq_msg_init(&id);
    zmq_msg_init(&payload);
    if (zmq_poll(&it, 1, 10000) == 1 && zmq_msg_recv(&id, tap, 0) >= 0 &&
        zmq_msg_more(&id) && zmq_msg_recv(&payload, tap, 0) >= 0) {
        *len = zmq_msg_size(&payload);
        *out = malloc(*len);
        if (*out) {
            memcpy(*out, zmq_msg_data(&payload), *len);
            rc = 0;
        }
    }
    zmq_msg_close(&id);
    zmq_msg_close(&payload);
    if (rc != 0)
        bench_fail("capture: the stub's request did not arrive within 10 s");
out:
    if (call) {
        ctl_call_cancel(call);
        ctl_call_wait(call, 5000);
        ctl_call_release(call);
    }
    ctl_client_destroy(&c);
    ctl_error_fini(&err);
    if (tap)
        zmq_close(tap);
    return rc;
}

/* ---- case: small calls -------------------------------------------------- */

typedef struct small_setup {
    void *ectx;
    unsigned char *describe_req, *stats_req;
    size_t describe_len, stats_len;
} small_setup;

static int small_setup_init(small_setup *s)
{
    memset(s, 0, sizeof *s);
    s->ectx = zmq_ctx_new();
    if (!s->ectx) {
        bench_fail("zmq_ctx_new failed");
        return -1;
    }
    if (capture_request(s->ectx, 0, &s->describe_req, &s->describe_len) != 0 ||
        capture_request(s->ectx, 1, &s->stats_req, &s->stats_len) != 0)
        return -1;
    return 0;
}

static void small_setup_fini(small_setup *s)
{
    free(s->describe_req);
    free(s->stats_req);
    if (s->ectx)
        zmq_ctx_term(s->ectx);
}

/* The small-call rows of one server (the C unit or the Python one). */
static int small_rows(const char *who, int python, const char *address,
                      const char *echo_ep, ctl_client *client, small_setup *ss,
                      size_t n, enum target target)
{
    stub_call sc;
    echo_call ec = {NULL, NULL, 0, 0};
    lat_pair d, s;
    char label[40], what[64];
    int rc = -1;
    stub_call_init(&sc, client, address);
    ec.sock = echo_dial(ss->ectx, echo_ep);
    if (!ec.sock) {
        bench_fail("echo: cannot connect to %s", echo_ep);
        return -1;
    }
    ec.buf = ss->describe_req;
    ec.len = ss->describe_len;
    snprintf(what, sizeof what, "%s describe", who);
    if (run_pair(what, call_describe, &sc, call_echo, &ec, n, &d) != 0)
        goto out;
    ec.buf = ss->stats_req;
    ec.len = ss->stats_len;
    snprintf(what, sizeof what, "%s stats", who);
    if (run_pair(what, call_stats, &sc, call_echo, &ec, n, &s) != 0)
        goto out;
    snprintf(label, sizeof label, "%sdescribe(1 key) %zuB", python ? "py " : "",
             ss->describe_len);
    add_row(label, "p50 us", 1, d.p50[0], d.p50[1], cfg.rounds, target, 1.10);
    add_row(label, "p99 us", 1, d.p99[0], d.p99[1], cfg.rounds, T_NONE, 0);
    add_row(label, "calls/s", 0, d.per_s[0], d.per_s[1], cfg.rounds, T_NONE, 0);
    snprintf(label, sizeof label, "%sstats %zuB", python ? "py " : "",
             ss->stats_len);
    add_row(label, "p50 us", 1, s.p50[0], s.p50[1], cfg.rounds, target, 1.10);
    add_row(label, "p99 us", 1, s.p99[0], s.p99[1], cfg.rounds, T_NONE, 0);
    add_row(label, "calls/s", 0, s.per_s[0], s.per_s[1], cfg.rounds, T_NONE, 0);
    rc = 0;
out:
    zmq_close(ec.sock);
    return rc;
}

/* ---- case: throughput --------------------------------------------------- */

typedef struct cpu_src {
    const tidset *threads; /* in-process server */
    pid_t pid;             /* or a server process */
} cpu_src;

static uint64_t cpu_read(const cpu_src *s)
{
    return s->pid > 0 ? pid_cpu_ticks(s->pid) : tidset_cpu_ticks(s->threads);
}

typedef struct trial {
    int echo;              /* T DEALERs on the echo server, else stubs */
    const char *address;
    ctl_client *client;    /* stubs: shared by every thread */
    void *ectx;            /* echo: the context of the DEALERs */
    const void *req;       /* echo: the bytes to send */
    size_t req_len;
    /* The start gate: workers count themselves ready, then wait for go. */
    pthread_mutex_t mu;
    pthread_cond_t cond;
    int ready, go;
    atomic_int stop;
    atomic_int failed;
    uint64_t calls[MAX_THREADS_T];
} trial;

typedef struct worker {
    trial *t;
    int index;
} worker;

static void *worker_main(void *arg)
{
    worker *w = arg;
    trial *t = w->t;
    stub_call sc;
    echo_call ec = {NULL, t->req, t->req_len, 0};
    call_fn fn = call_describe;
    void *fa = &sc;
    uint64_t n = 0;
    stub_call_init(&sc, t->client, t->address);
    if (t->echo) {
        ec.sock = echo_dial(t->ectx, t->address);
        fn = call_echo;
        fa = &ec;
        if (!ec.sock)
            atomic_store(&t->failed, 1);
    }
    /* Connected and warm before the clock starts. */
    if (!atomic_load(&t->failed) && warm(fn, fa, 10) != 0)
        atomic_store(&t->failed, 1);
    pthread_mutex_lock(&t->mu);
    t->ready++;
    pthread_cond_broadcast(&t->cond);
    while (!t->go)
        pthread_cond_wait(&t->cond, &t->mu);
    pthread_mutex_unlock(&t->mu);
    while (!atomic_load_explicit(&t->stop, memory_order_relaxed) &&
           !atomic_load_explicit(&t->failed, memory_order_relaxed)) {
        if (fn(fa) != 0) {
            atomic_store(&t->failed, 1);
            break;
        }
        n++;
    }
    t->calls[w->index] = n;
    if (ec.sock)
        zmq_close(ec.sock);
    return NULL;
}

typedef struct trial_result {
    double per_s;
    double cpu_per_10k; /* server CPU seconds per 10k calls */
} trial_result;

/* `threads` threads calling for `seconds` while the server's CPU is read
 * before and after. */
static int run_trial(trial *t, int threads, double seconds, const cpu_src *cpu,
                     trial_result *out)
{
    pthread_t th[MAX_THREADS_T];
    worker w[MAX_THREADS_T];
    int started = 0;
    atomic_store(&t->stop, 0);
    atomic_store(&t->failed, 0);
    pthread_mutex_init(&t->mu, NULL);
    pthread_cond_init(&t->cond, NULL);
    t->ready = t->go = 0;
    for (int i = 0; i < threads; i++) {
        w[i] = (worker){t, i};
        t->calls[i] = 0;
        if (pthread_create(&th[i], NULL, worker_main, &w[i]) != 0) {
            bench_fail("cannot start a client thread");
            atomic_store(&t->failed, 1);
            break;
        }
        started++;
    }
    /* Every worker connected and warm (or the trial failed): go. */
    pthread_mutex_lock(&t->mu);
    while (t->ready < started)
        pthread_cond_wait(&t->cond, &t->mu);
    t->go = 1;
    pthread_cond_broadcast(&t->cond);
    pthread_mutex_unlock(&t->mu);
    uint64_t c0 = cpu_read(cpu);
    double t0 = now_s();
    struct timespec ts = {(time_t)seconds,
                          (long)((seconds - (double)(time_t)seconds) * 1e9)};
    while (nanosleep(&ts, &ts) != 0 && errno == EINTR)
        ;
    atomic_store(&t->stop, 1);
    double elapsed = now_s() - t0;
    uint64_t total = 0;
    for (int i = 0; i < started; i++) {
        pthread_join(th[i], NULL);
        total += t->calls[i];
    }
    uint64_t c1 = cpu_read(cpu);
    pthread_cond_destroy(&t->cond);
    pthread_mutex_destroy(&t->mu);
    if (atomic_load(&t->failed)) {
        bench_fail("a client thread failed (see above)");
        return -1;
    }
    out->per_s = elapsed > 0 ? (double)total / elapsed : 0;
    out->cpu_per_10k = total ? (double)(c1 - c0) * cpu_tick_seconds() /
                                   (double)total * 1e4
                             : 0;
    return 0;
}

/* The throughput rows for T = 1, 4, 16 of one server against the echo. */
static int throughput_rows(const char *who, trial *ours, const cpu_src *ours_cpu,
                           trial *echo, const cpu_src *echo_cpu, int python)
{
    static const int ts[] = {1, 4, 16};
    for (size_t k = 0; k < sizeof ts / sizeof ts[0]; k++) {
        int threads = ts[k];
        double per_s[2][BENCH_MAX_ROUNDS], cpu[2][BENCH_MAX_ROUNDS];
        trial *sides[2] = {ours, echo};
        const cpu_src *cpus[2] = {ours_cpu, echo_cpu};
        trial_result tr;
        char label[40];
        /* A short untimed trial each: sockets dialed, pools filled. */
        if (run_trial(ours, threads, 0.2, ours_cpu, &tr) != 0 ||
            run_trial(echo, threads, 0.2, echo_cpu, &tr) != 0)
            return -1;
        for (int r = 0; r < cfg.rounds; r++) {
            for (int i = 0; i < 2; i++) {
                int side = (r % 2) ? 1 - i : i;
                if (run_trial(sides[side], threads, cfg.seconds, cpus[side], &tr) != 0)
                    return -1;
                per_s[side][r] = tr.per_s;
                cpu[side][r] = tr.cpu_per_10k;
            }
            bench_progress("%s throughput, %d thread%s: round %d/%d: %.0f vs %.0f calls/s",
                     who, threads, threads > 1 ? "s" : "", r + 1, cfg.rounds,
                     per_s[0][r], per_s[1][r]);
        }
        int targeted = !python && threads >= 4;
        snprintf(label, sizeof label, "%s%d client thread%s", python ? "py " : "",
                 threads, threads > 1 ? "s" : "");
        add_row(label, "calls/s", 0, per_s[0], per_s[1], cfg.rounds,
                targeted ? T_GE : T_NONE, 0.90);
        add_row(label, "srv CPU s/10k", 3, cpu[0], cpu[1], cfg.rounds,
                targeted ? T_LE : T_NONE, 1.2);
    }
    return 0;
}

static int case_small_and_throughput(unsigned which)
{
    bench_unit *unit = NULL;
    bench_echo *echo = NULL;
    ctl_client *client = NULL;
    small_setup ss;
    ctl_error err;
    char why[256];
    int rc = -1;
    ctl_error_init(&err);
    if (small_setup_init(&ss) != 0)
        goto out;
    if (bench_unit_start((uint64_t)1 << 30, &unit, why, sizeof why) != 0 ||
        bench_echo_start(&echo, why, sizeof why) != 0) {
        bench_fail("%s", why);
        goto out;
    }
    if (ctl_client_new(NULL, &client, &err) != 0) {
        bench_fail("client: %s", err.msg);
        goto out;
    }
    if (put_blob(client, bench_unit_endpoint(unit), SMALL_KEY, "0123456789", 10) != 0)
        goto out;
    if (which & CASE_SMALL) {
        group("small call, 1 client thread (baseline: echo of the stub's request bytes)");
        if (small_rows("C unit", 0, bench_unit_endpoint(unit), bench_echo_endpoint(echo),
                       client, &ss, cfg.small_calls, T_LE) != 0)
            goto out;
    }
    if (which & CASE_THROUGHPUT) {
        group("one unit under load: describe(1 key) (baseline: echo server, T DEALERs)");
        trial ours = {.echo = 0, .address = bench_unit_endpoint(unit), .client = client};
        trial base = {.echo = 1, .address = bench_echo_endpoint(echo), .ectx = ss.ectx,
                      .req = ss.describe_req, .req_len = ss.describe_len};
        cpu_src oc = {bench_unit_threads(unit), 0};
        cpu_src ec = {bench_echo_threads(echo), 0};
        if (throughput_rows("C unit", &ours, &oc, &base, &ec, 0) != 0)
            goto out;
    }
    rc = 0;
out:
    ctl_client_destroy(&client);
    bench_unit_stop(&unit);
    bench_echo_stop(&echo);
    small_setup_fini(&ss);
    ctl_error_fini(&err);
    return rc;
}

/* ---- case: fan-out ------------------------------------------------------ */

typedef struct fan_stub {
    ctl_client *client;
    const char *addresses[MAX_UNITS];
    size_t n;
    storage_stats_outcome outcomes[MAX_UNITS];
} fan_stub;

static int call_fan_stub(void *arg)
{
    fan_stub *f = arg;
    int failed = storage_stats_many(f->client, f->addresses, f->n,
                                    CALL_TIMEOUT_MS, f->outcomes);
    if (failed != 0) {
        for (size_t i = 0; i < f->n; i++)
            if (f->outcomes[i].error.kind != CTL_OK) {
                bench_fail("stats_many: %s", f->outcomes[i].error.msg);
                break;
            }
    }
    storage_stats_outcomes_fini(f->outcomes, f->n);
    return failed ? -1 : 0;
}

typedef struct fan_echo {
    void *socks[MAX_UNITS];
    size_t n;
    const void *buf;
    size_t len;
} fan_echo;

/* Send to every echo server, then collect every reply. */
static int call_fan_echo(void *arg)
{
    fan_echo *f = arg;
    zmq_pollitem_t items[MAX_UNITS];
    int got[MAX_UNITS] = {0};
    size_t left = f->n;
    for (size_t i = 0; i < f->n; i++) {
        if (zmq_send(f->socks[i], f->buf, f->len, 0) < 0) {
            bench_fail("fan-out echo: send: %s", zmq_strerror(zmq_errno()));
            return -1;
        }
    }
    while (left) {
        for (size_t i = 0; i < f->n; i++)
            items[i] = (zmq_pollitem_t){f->socks[i], 0, got[i] ? 0 : ZMQ_POLLIN, 0};
        int rc = zmq_poll(items, (int)f->n, CALL_TIMEOUT_MS);
        if (rc <= 0) {
            bench_fail("fan-out echo: %s", rc == 0 ? "timed out" : zmq_strerror(zmq_errno()));
            return -1;
        }
        for (size_t i = 0; i < f->n; i++) {
            if (got[i] || !(items[i].revents & ZMQ_POLLIN))
                continue;
            zmq_msg_t m;
            zmq_msg_init(&m);
            if (zmq_msg_recv(&m, f->socks[i], ZMQ_DONTWAIT) >= 0) {
                got[i] = 1;
                left--;
            }
            zmq_msg_close(&m);
        }
    }
    return 0;
}

/* ---- case: asynchronous calls in flight -------------------------------- */

#define ASYNC_WINDOW 64

typedef struct async_run {
    ctl_client *client;
    const char *address;
    uint64_t done;
    int failed;
    int stopping;
    int in_flight;
} async_run;

static storage_describe_done async_on_done;

static int async_start(async_run *a)
{
    storage_describe_args args = STORAGE_DESCRIBE_ARGS_INIT;
    args.keys = (storage_list_str){small_keys, 1};
    if (storage_describe_start(a->client, a->address, &args, CALL_TIMEOUT_MS, async_on_done, a,
                               NULL) != 0)
        return -1;
    a->in_flight++;
    return 0;
}

static void async_on_done(void *user, const ctl_error *err, const storage_list_BlobInfo *r)
{
    async_run *a = user;
    a->in_flight--;
    if (!r) {
        if (a->failed++ == 0)
            bench_fail("describe_start: %s", err->msg);
        return;
    }
    a->done++;
    if (!a->stopping && async_start(a) != 0 && a->failed++ == 0)
        bench_fail("describe_start: could not start");
}

/* `seconds` of 64 calls in flight from this thread; calls/s. */
static double async_ours(ctl_client *client, const char *address, double seconds)
{
    async_run a = {client, address, 0, 0, 0, 0};
    struct pollfd pfd = {ctl_client_event_fd(client), POLLIN, 0};
    for (int i = 0; i < ASYNC_WINDOW; i++)
        if (async_start(&a) != 0)
            return -1;
    double t0 = now_s(), t1 = t0;
    uint64_t done0 = 0;
    while (!a.failed) {
        if (poll(&pfd, 1, 1000) > 0)
            ctl_client_process(client, 0);
        t1 = now_s();
        if (t1 - t0 >= seconds)
            break;
    }
    done0 = a.done;
    a.stopping = 1;
    double until = now_s() + 30;
    while (a.in_flight > 0 && now_s() < until)
        if (poll(&pfd, 1, 100) > 0)
            ctl_client_process(client, 0);
    return a.failed ? -1 : (double)done0 / (t1 - t0);
}

/* 64 bare DEALERs, one request in flight on each (what the wire protocol
 * allows a client), polled from this thread; the same request bytes. */
static double async_bare_sockets(void **socks, const void *req, size_t len, double seconds)
{
    zmq_pollitem_t items[ASYNC_WINDOW];
    for (int i = 0; i < ASYNC_WINDOW; i++) {
        if (zmq_send(socks[i], req, len, 0) < 0)
            return -1;
        items[i] = (zmq_pollitem_t){socks[i], 0, ZMQ_POLLIN, 0};
    }
    uint64_t done = 0;
    double t0 = now_s(), t1 = t0;
    int stop = 0, left = ASYNC_WINDOW;
    while (left > 0) {
        if (zmq_poll(items, ASYNC_WINDOW, CALL_TIMEOUT_MS) <= 0)
            return -1;
        for (int i = 0; i < ASYNC_WINDOW; i++) {
            if (!(items[i].revents & ZMQ_POLLIN))
                continue;
            zmq_msg_t m;
            zmq_msg_init(&m);
            int got = zmq_msg_recv(&m, socks[i], ZMQ_DONTWAIT);
            zmq_msg_close(&m);
            if (got < 0)
                continue;
            if (stop) {
                items[i].events = 0;
                left--;
                continue;
            }
            done++;
            if (zmq_send(socks[i], req, len, 0) < 0)
                return -1;
        }
        t1 = now_s();
        if (!stop && t1 - t0 >= seconds)
            stop = 1;
    }
    return (double)done / (t1 - t0);
}

/* A bare DEALER keeping 64 requests pipelined to the echo server. */
static double async_bare(void *sock, const void *req, size_t len, double seconds)
{
    for (int i = 0; i < ASYNC_WINDOW; i++)
        if (zmq_send(sock, req, len, 0) < 0)
            return -1;
    uint64_t done = 0;
    double t0 = now_s(), t1 = t0;
    for (;;) {
        zmq_msg_t m;
        zmq_msg_init(&m);
        int got = zmq_msg_recv(&m, sock, 0);
        zmq_msg_close(&m);
        if (got < 0)
            return -1;
        done++;
        if ((done & 63) == 0) {
            t1 = now_s();
            if (t1 - t0 >= seconds)
                break;
        }
        if (zmq_send(sock, req, len, 0) < 0)
            return -1;
    }
    double rate = (double)done / (t1 - t0);
    for (int i = 0; i < ASYNC_WINDOW - 1; i++) {
        zmq_msg_t m;
        zmq_msg_init(&m);
        zmq_msg_recv(&m, sock, 0);
        zmq_msg_close(&m);
    }
    return rate;
}

static void async_count(void *user, const ctl_error *err, ctl_reply *reply)
{
    (void)err;
    (void)reply;
    (*(int *)user)++;
}

static size_t self_rss_kib(void)
{
    FILE *f = fopen("/proc/self/statm", "r");
    unsigned long size = 0, res = 0;
    if (!f)
        return 0;
    if (fscanf(f, "%lu %lu", &size, &res) != 2)
        res = 0;
    fclose(f);
    return (size_t)res * ((size_t)sysconf(_SC_PAGESIZE) / 1024);
}

/* RSS per call in flight: 1000 calls to a ROUTER that never answers. */
static double async_bytes_per_call(void *ctx)
{
    enum { N = 1000 };
    void *silent = zmq_socket(ctx, ZMQ_ROUTER);
    char ep[128];
    size_t len = sizeof ep;
    int zero = 0, done = 0;
    ctl_client *c = NULL;
    ctl_error err;
    ctl_error_init(&err);
    double per = -1;
    if (!silent || zmq_setsockopt(silent, ZMQ_LINGER, &zero, sizeof zero) != 0 ||
        zmq_bind(silent, "tcp://127.0.0.1:*") != 0 ||
        zmq_getsockopt(silent, ZMQ_LAST_ENDPOINT, ep, &len) != 0 ||
        ctl_client_new(NULL, &c, &err) != 0)
        goto out;
    /* One call first, so the client's one-off allocations are not booked. */
    ctl_call *first = NULL;
    if (ctl_client_call_start(c, ep, "stats", NULL, 0, 60000, async_count, &done, &first,
                              &err) != 0)
        goto out;
    ctl_call_wait(first, 100);
    malloc_trim(0);
    size_t rss0 = self_rss_kib();
    for (int i = 0; i < N; i++)
        if (ctl_client_call_start(c, ep, "stats", NULL, 0, 60000, async_count, &done, NULL,
                                  &err) != 0)
            goto out;
    /* Wait until every request has left (the silent ROUTER has them). */
    int seen = 0;
    double until = now_s() + 30;
    while (seen < N && now_s() < until) {
        zmq_msg_t m;
        zmq_msg_init(&m);
        int more = 0;
        if (zmq_msg_recv(&m, silent, ZMQ_DONTWAIT) >= 0)
            more = zmq_msg_more(&m), seen += !more;
        else
            usleep(1000);
        zmq_msg_close(&m);
    }
    size_t rss1 = self_rss_kib();
    per = ((double)rss1 - (double)rss0) * 1024.0 / N;
    ctl_call_cancel(first);
    ctl_call_release(first);
out:
    ctl_client_destroy(&c);
    if (silent)
        zmq_close(silent);
    ctl_error_fini(&err);
    return per;
}

static int case_async(void)
{
    bench_unit *unit = NULL;
    bench_echo *echo = NULL;
    ctl_client *client = NULL;
    small_setup ss;
    ctl_error err;
    char why[256];
    int rc = -1, R = cfg.rounds;
    double ours[BENCH_MAX_ROUNDS], base[BENCH_MAX_ROUNDS], unit_base[BENCH_MAX_ROUNDS],
        piped[BENCH_MAX_ROUNDS];
    void *sock = NULL, *socks[ASYNC_WINDOW] = {0}, *usocks[ASYNC_WINDOW] = {0};
    ctl_error_init(&err);
    if (small_setup_init(&ss) != 0)
        goto out;
    if (bench_unit_start((uint64_t)1 << 30, &unit, why, sizeof why) != 0 ||
        bench_echo_start(&echo, why, sizeof why) != 0) {
        bench_fail("%s", why);
        goto out;
    }
    if (ctl_client_new(NULL, &client, &err) != 0) {
        bench_fail("client: %s", err.msg);
        goto out;
    }
    if (put_blob(client, bench_unit_endpoint(unit), SMALL_KEY, "0123456789", 10) != 0)
        goto out;
    sock = echo_dial(ss.ectx, bench_echo_endpoint(echo));
    for (int i = 0; i < ASYNC_WINDOW; i++) {
        socks[i] = echo_dial(ss.ectx, bench_echo_endpoint(echo));
        usocks[i] = echo_dial(ss.ectx, bench_unit_endpoint(unit));
        if (!socks[i] || !usocks[i])
            sock = NULL;
    }
    if (!sock) {
        bench_fail("echo: cannot connect");
        goto out;
    }
    double secs = cfg.quick ? 0.3 : cfg.seconds;
    /* Warm both. */
    if (async_ours(client, bench_unit_endpoint(unit), 0.1) < 0 ||
        async_bare(sock, ss.describe_req, ss.describe_len, 0.1) < 0)
        goto out;
    for (int r = 0; r < R; r++) {
        for (int k = 0; k < 4; k++) {
            int side = (r + k) % 4;
            double v = side == 0 ? async_ours(client, bench_unit_endpoint(unit), secs)
                       : side == 1 ? async_bare_sockets(socks, ss.describe_req,
                                                        ss.describe_len, secs)
                       : side == 2 ? async_bare_sockets(usocks, ss.describe_req,
                                                        ss.describe_len, secs)
                                   : async_bare(sock, ss.describe_req, ss.describe_len, secs);
            if (v < 0) {
                bench_fail("async: a round failed");
                goto out;
            }
            (side == 0 ? ours : side == 1 ? base : side == 2 ? unit_base : piped)[r] = v;
        }
        bench_progress("async: round %d/%d: %.0f calls/s vs %.0f (64 DEALERs, echo), %.0f "
                       "(64 DEALERs, the same unit), %.0f (one pipelined DEALER, echo)",
                       r + 1, R, ours[r], base[r], unit_base[r], piped[r]);
    }
    group("64 calls in flight from one thread (baseline: 64 bare DEALERs, one request each, "
          "polled from one thread)");
    add_row("describe_start x64 vs echo", "calls/s", 0, ours, base, R, T_GE, 0.90);
    add_row("describe_start x64 vs same unit", "calls/s", 0, ours, unit_base, R, T_GE, 0.90);
    add_row("vs 1 DEALER pipelining 64 (echo)", "calls/s", 0, ours, piped, R, T_NONE, 0);
    double per = async_bytes_per_call(ss.ectx);
    if (per >= 0)
        note("async: %.0f bytes of RSS per call in flight (1000 calls to a ROUTER that never "
             "answers; each holds its own socket and connection)", per);
    rc = 0;
out:
    if (sock)
        zmq_close(sock);
    for (int i = 0; i < ASYNC_WINDOW; i++) {
        if (socks[i])
            zmq_close(socks[i]);
        if (usocks[i])
            zmq_close(usocks[i]);
    }
    ctl_client_destroy(&client);
    bench_unit_stop(&unit);
    bench_echo_stop(&echo);
    small_setup_fini(&ss);
    ctl_error_fini(&err);
    return rc;
}

static int case_fanout(void)
{
    static const size_t ns[] = {1, 4, 16};
    bench_unit *units[MAX_UNITS] = {0};
    bench_echo *echos[MAX_UNITS] = {0};
    ctl_client *client = NULL;
    small_setup ss;
    fan_stub fs;
    fan_echo fe;
    ctl_error err;
    char why[256];
    int rc = -1;
    memset(&fe, 0, sizeof fe);
    ctl_error_init(&err);
    group("call_many fan-out: stats_many (baseline: send all, collect all, to echo servers)");
    if (small_setup_init(&ss) != 0)
        goto out;
    for (size_t i = 0; i < MAX_UNITS; i++) {
        if (bench_unit_start((uint64_t)1 << 20, &units[i], why, sizeof why) != 0 ||
            bench_echo_start(&echos[i], why, sizeof why) != 0) {
            bench_fail("%s", why);
            goto out;
        }
    }
    if (ctl_client_new(NULL, &client, &err) != 0) {
        bench_fail("client: %s", err.msg);
        goto out;
    }
    fs.client = client;
    for (size_t i = 0; i < MAX_UNITS; i++) {
        fs.addresses[i] = bench_unit_endpoint(units[i]);
        fe.socks[i] = echo_dial(ss.ectx, bench_echo_endpoint(echos[i]));
        if (!fe.socks[i]) {
            bench_fail("echo: cannot connect");
            goto out;
        }
    }
    fe.buf = ss.stats_req;
    fe.len = ss.stats_len;
    for (size_t k = 0; k < sizeof ns / sizeof ns[0]; k++) {
        lat_pair lp;
        char label[40], what[40];
        fs.n = fe.n = ns[k];
        snprintf(what, sizeof what, "fan-out to %zu", ns[k]);
        if (run_pair(what, call_fan_stub, &fs, call_fan_echo, &fe, cfg.batches, &lp) != 0)
            goto out;
        snprintf(label, sizeof label, "%zu unit%s", ns[k], ns[k] > 1 ? "s" : "");
        add_row(label, "batch p50 us", 1, lp.p50[0], lp.p50[1], cfg.rounds,
                ns[k] == 16 ? T_LE : T_NONE, 1.10);
        add_row(label, "batch p99 us", 1, lp.p99[0], lp.p99[1], cfg.rounds, T_NONE, 0);
    }
    rc = 0;
out:
    for (size_t i = 0; i < MAX_UNITS; i++)
        if (fe.socks[i])
            zmq_close(fe.socks[i]);
    ctl_client_destroy(&client);
    for (size_t i = 0; i < MAX_UNITS; i++) {
        bench_unit_stop(&units[i]);
        bench_echo_stop(&echos[i]);
    }
    small_setup_fini(&ss);
    ctl_error_fini(&err);
    return rc;
}

/* ---- case: blobs -------------------------------------------------------- */

/* The blob sizes, ascending (--blob-sizes; default 64 KiB, 1 MiB, 8 MiB). */
#define MAX_BLOB_SIZES 8
static size_t blob_sizes[MAX_BLOB_SIZES] = {64u << 10, 1u << 20, 8u << 20};
static size_t n_blob_sizes = 3;

static const char *size_name(size_t size, char *buf, size_t len)
{
    if (size >= (1u << 20))
        snprintf(buf, len, "%zu MiB", size >> 20);
    else
        snprintf(buf, len, "%zu KiB", size >> 10);
    return buf;
}

typedef struct blob_call {
    ctl_client *client;
    const char *address;
    const unsigned char *data;
    size_t size;
} blob_call;

static int call_put_get(void *arg)
{
    blob_call *b = arg;
    if (put_blob(b->client, b->address, BLOB_KEY, b->data, b->size) != 0 ||
        get_blob(b->client, b->address, BLOB_KEY, b->size) != 0)
        return -1;
    return 0;
}

static unsigned char *blob_data(size_t size)
{
    unsigned char *d = malloc(size);
    uint64_t x = 0x9e3779b97f4a7c15u;
    if (!d)
        return NULL;
    for (size_t i = 0; i < size; i++) {
        x ^= x << 13, x ^= x >> 7, x ^= x << 17;
        d[i] = (unsigned char)x;
    }
    return d;
}

/* The ops the copy-count child reports, in the order it reports them. */
static const char *const cc_ops[3] = {"put", "get", "echo"};

/* In the child under the shim: count one put, one get and one echo of
 * each size, after a warm-up of each. Prints one line per (size, op):
 * "cc <size> <op> <bytes[side][origin]...>". */
static int copy_count_child(void)
{
    bench_unit *unit = NULL;
    bench_echo *echo = NULL;
    ctl_client *client = NULL;
    void *ectx = NULL, *sock = NULL;
    ctl_error err;
    char why[256];
    int rc = 1;
    size_t max = blob_sizes[n_blob_sizes - 1];
    unsigned char *data = blob_data(max);
    /* The put sends from a ctl_blob, as the blobs case's stubs do. */
    ctl_blob *blob = data ? ctl_blob_new(max) : NULL;
    ctl_error_init(&err);
    bench_cc_init();
    if (!bench_cc.begin) {
        fprintf(stderr, "ctl-bench: the copy-counting shim is not loaded\n");
        goto out;
    }
    if (!blob || bench_unit_start((uint64_t)1 << 30, &unit, why, sizeof why) != 0 ||
        bench_echo_start(&echo, why, sizeof why) != 0) {
        fprintf(stderr, "ctl-bench: %s\n", blob ? why : "out of memory");
        goto out;
    }
    memcpy(ctl_blob_data(blob), data, max);
    if (ctl_client_new(NULL, &client, &err) != 0 || !(ectx = zmq_ctx_new()) ||
        !(sock = echo_dial(ectx, bench_echo_endpoint(echo))))
        goto out;
    for (size_t k = 0; k < n_blob_sizes; k++) {
        size_t size = blob_sizes[k];
        const char *address = bench_unit_endpoint(unit);
        cc_result res[3];
        if (put_blob(client, address, BLOB_KEY, ctl_blob_data(blob), size) != 0 ||
            get_blob(client, address, BLOB_KEY, size) != 0 ||
            echo_round_trip(sock, data, size, 1) != 0)
            goto out;
        bench_cc.begin(size / 2, &cfg);
        int bad = put_blob(client, address, BLOB_KEY, ctl_blob_data(blob), size);
        bench_cc.end(&res[0]);
        bench_cc.begin(size / 2, &cfg);
        bad |= get_blob(client, address, BLOB_KEY, size);
        bench_cc.end(&res[1]);
        bench_cc.begin(size / 2, &cfg);
        bad |= echo_round_trip(sock, data, size, 1);
        bench_cc.end(&res[2]);
        if (bad)
            goto out;
        for (int op = 0; op < 3; op++) {
            printf("cc %zu %s", size, cc_ops[op]);
            for (int s = 0; s < CC_SIDES; s++)
                for (int o = 0; o < CC_ORIGINS; o++)
                    printf(" %" PRIu64, res[op].bytes[s][o]);
            printf("\n");
        }
    }
    rc = 0;
out:
    if (sock)
        zmq_close(sock);
    if (ectx)
        zmq_ctx_term(ectx);
    ctl_client_destroy(&client);
    bench_unit_stop(&unit);
    bench_echo_stop(&echo);
    ctl_error_fini(&err);
    ctl_blob_release(&blob);
    free(data);
    fflush(stdout);
    return rc;
}

#ifdef CTL_BENCH_COPYCOUNT_SO
/* Run the copy count in a child under the shim and put its figures in the
 * table and the notes. */
static void copy_counts(void)
{
    char self[512], log_path[300], why[512];
    char *envp[512];
    size_t n = 0;
    char *preload = NULL;
    double secs;
    ssize_t sl = readlink("/proc/self/exe", self, sizeof self - 1);
    if (sl <= 0) {
        bench_fail("cannot find this program (/proc/self/exe)");
        return;
    }
    self[sl] = '\0';
    const char *old = getenv("LD_PRELOAD");
    if (asprintf(&preload, "LD_PRELOAD=%s%s%s", CTL_BENCH_COPYCOUNT_SO,
                 old && *old ? ":" : "", old && *old ? old : "") < 0) {
        bench_fail("out of memory");
        return;
    }
    for (char **e = environ; *e && n < sizeof envp / sizeof envp[0] - 2; e++)
        if (strncmp(*e, "LD_PRELOAD=", 11) != 0)
            envp[n++] = *e;
    envp[n++] = preload;
    envp[n] = NULL;
    snprintf(log_path, sizeof log_path, "%s/copycount.out", cfg.tmpdir);
    /* The child counts the sizes this run measures. */
    char *argv[] = {self, (char *)"--blob-sizes", cfg.blob_sizes_arg,
                    (char *)"--copy-count-child", NULL};
    bench_progress("blobs: counting copies (child run under %s)", CTL_BENCH_COPYCOUNT_SO);
    if (bench_run(argv, envp, log_path, &secs, why, sizeof why) != 0) {
        bench_fail("copy count: %s", why);
        free(preload);
        return;
    }
    free(preload);
    FILE *f = fopen(log_path, "r");
    if (!f) {
        bench_fail("copy count: cannot read %s", log_path);
        return;
    }
    /* per size: put, get, echo x side x origin, in payload copies */
    double c[MAX_BLOB_SIZES][3][CC_SIDES][CC_ORIGINS] = {{{{0}}}};
    int seen = 0;
    char line[512];
    while (fgets(line, sizeof line, f)) {
        size_t size;
        char op[8];
        unsigned long long v[CC_SIDES * CC_ORIGINS];
        int pos = 0;
        if (sscanf(line, "cc %zu %7s%n", &size, op, &pos) != 2)
            continue;
        char *p = line + pos;
        int ok = 1;
        for (int i = 0; i < CC_SIDES * CC_ORIGINS && ok; i++) {
            char *end;
            v[i] = strtoull(p, &end, 10);
            ok = end != p;
            p = end;
        }
        int k = -1, o = -1;
        for (size_t i = 0; i < n_blob_sizes; i++)
            if (size == blob_sizes[i])
                k = (int)i;
        for (int i = 0; i < 3; i++)
            if (strcmp(op, cc_ops[i]) == 0)
                o = i;
        if (!ok || k < 0 || o < 0)
            continue;
        for (int s = 0; s < CC_SIDES; s++)
            for (int g = 0; g < CC_ORIGINS; g++)
                c[k][o][s][g] = (double)v[s * CC_ORIGINS + g] / (double)size;
        seen++;
    }
    fclose(f);
    if (seen != 3 * (int)n_blob_sizes) {
        bench_fail("copy count: the child printed %d of %d lines (see %s)", seen,
             3 * (int)n_blob_sizes, log_path);
        return;
    }
    group("payload copies per byte, put+get vs echo, counted (rpc = runtime+stubs, zmq = libzmq)");
    for (int k = 0; k < (int)n_blob_sizes; k++) {
        char label[40], sz[24];
        size_name(blob_sizes[k], sz, sizeof sz);
        for (int s = 0; s < CC_SIDES; s++) {
            double rpc = c[k][0][s][CC_RPC] + c[k][1][s][CC_RPC] +
                         c[k][0][s][CC_MSGPACK] + c[k][1][s][CC_MSGPACK];
            double zmq = c[k][0][s][CC_ZMQ] + c[k][1][s][CC_ZMQ];
            double erpc = c[k][2][s][CC_RPC] + c[k][2][s][CC_MSGPACK];
            double ezmq = c[k][2][s][CC_ZMQ];
            snprintf(label, sizeof label, "%s %s", sz, s == CC_CLIENT ? "client" : "server");
            add_plain_row(label, "rpc copies", 2, rpc, erpc, k > 0 ? T_ZERO : T_NONE);
            add_plain_row(label, "zmq copies", 2, zmq, ezmq, T_NONE);
        }
    }
    note("copies: counted by a child run (ctl-bench --copy-count-child) under the LD_PRELOAD shim "
         "ctl-bench-copycount.so, which wraps memcpy/memmove/mempcpy (and _chk), and realloc moves, "
         "and books each call of >= payload/2 bytes by thread (client or server side) and by "
         "the object that called it (dladdr of the return address). One put, one get, one echo "
         "per size, after a warm-up. Kernel copies (send/recv) are not counted; both sides pay them.");
    for (int k = 0; k < (int)n_blob_sizes; k++) {
        char sz[24];
        size_name(blob_sizes[k], sz, sizeof sz);
        note("copies %-7s put: client rpc %.2f zmq %.2f other %.2f | server rpc %.2f zmq %.2f "
             "store %.2f other %.2f", sz,
             c[k][0][0][CC_RPC] + c[k][0][0][CC_MSGPACK], c[k][0][0][CC_ZMQ], c[k][0][0][CC_OTHER],
             c[k][0][1][CC_RPC] + c[k][0][1][CC_MSGPACK], c[k][0][1][CC_ZMQ], c[k][0][1][CC_APP],
             c[k][0][1][CC_OTHER]);
        note("copies %-7s get: client rpc %.2f zmq %.2f other %.2f | server rpc %.2f zmq %.2f "
             "store %.2f other %.2f", sz,
             c[k][1][0][CC_RPC] + c[k][1][0][CC_MSGPACK], c[k][1][0][CC_ZMQ], c[k][1][0][CC_OTHER],
             c[k][1][1][CC_RPC] + c[k][1][1][CC_MSGPACK], c[k][1][1][CC_ZMQ], c[k][1][1][CC_APP],
             c[k][1][1][CC_OTHER]);
        note("copies %-7s echo: client rpc %.2f zmq %.2f other %.2f | server rpc %.2f zmq %.2f "
             "other %.2f", sz,
             c[k][2][0][CC_RPC] + c[k][2][0][CC_MSGPACK], c[k][2][0][CC_ZMQ], c[k][2][0][CC_OTHER],
             c[k][2][1][CC_RPC] + c[k][2][1][CC_MSGPACK], c[k][2][1][CC_ZMQ], c[k][2][1][CC_OTHER]);
    }
}
#endif

typedef struct bare_put_get {
    void *sock;
    const void *buf;
    size_t size;
} bare_put_get;

/* The floor of put then get over bare ZeroMQ, against a keeper server:
 * the payload goes up without a copy and is answered with one byte, then
 * one byte goes up and the kept payload comes back. */
static int call_bare_put_get(void *arg)
{
    bare_put_get *b = arg;
    zmq_msg_t m;
    zmq_msg_init_data(&m, (void *)b->buf, b->size, NULL, NULL);
    int rc = zmq_msg_send(&m, b->sock, 0);
    if (rc < 0)
        zmq_msg_close(&m);
    zmq_msg_init(&m);
    if (rc >= 0)
        rc = zmq_msg_recv(&m, b->sock, 0);
    if (rc >= 0 && zmq_msg_size(&m) != 1)
        rc = -1;
    zmq_msg_close(&m);
    if (rc >= 0)
        rc = zmq_send(b->sock, "g", 1, 0);
    zmq_msg_init(&m);
    if (rc >= 0)
        rc = zmq_msg_recv(&m, b->sock, 0);
    if (rc >= 0 && zmq_msg_size(&m) != b->size)
        rc = -1;
    zmq_msg_close(&m);
    if (rc < 0) {
        bench_fail("bare put/get of %zu bytes failed", b->size);
        return -1;
    }
    return 0;
}

/* Milliseconds from `b` to `a`. */
static double tv_ms(const struct timeval *a, const struct timeval *b)
{
    return (double)(a->tv_sec - b->tv_sec) * 1e3 + (double)(a->tv_usec - b->tv_usec) / 1e3;
}

/* memcpy of `size` bytes between two buffers larger than the caches, for
 * scale: what one extra copy of the payload costs on this machine. */
static double memcpy_mbs(size_t size)
{
    unsigned char *a = malloc(size), *b = malloc(size);
    double best[BENCH_MAX_ROUNDS];
    int n = cfg.rounds;
    if (!a || !b) {
        free(a);
        free(b);
        return 0;
    }
    memset(a, 1, size);
    memset(b, 2, size);
    for (int r = 0; r < n; r++) {
        double t0 = now_s();
        for (int i = 0; i < 8; i++)
            memcpy(i % 2 ? a : b, i % 2 ? b : a, size);
        best[r] = 8.0 * (double)size / (now_s() - t0) / 1e6;
    }
    free(a);
    free(b);
    return bench_median(best, n);
}

static int case_blobs(void)
{
    bench_unit *unit = NULL;
    bench_echo *echo = NULL, *keeper = NULL;
    ctl_client *client = NULL;
    void *ectx = NULL;
    echo_call ec = {NULL, NULL, 0, 1};
    bare_put_get bp = {NULL, NULL, 0};
    ctl_error err;
    char why[256];
    int rc = -1;
    size_t max = blob_sizes[n_blob_sizes - 1];
    unsigned char *data = blob_data(max);
    /* The stubs send from a ctl_blob (no copy), as the bare side sends
     * from its buffer; a 4th side sends the same bytes from a plain
     * buffer (copied into the request). */
    ctl_blob *blob = data ? ctl_blob_new(max) : NULL;
    ctl_error_init(&err);
    group("large blobs: put then get from a ctl_blob (baseline: echo of a message that "
          "size; 2nd row: bare ZeroMQ put+get; 3rd: the stubs from a plain buffer)");
    if (!blob) {
        bench_fail("out of memory");
        goto out;
    }
    if (bench_unit_start((uint64_t)1 << 30, &unit, why, sizeof why) != 0 ||
        bench_echo_start(&echo, why, sizeof why) != 0 ||
        bench_echo_start_mode(1, &keeper, why, sizeof why) != 0) {
        bench_fail("%s", why);
        goto out;
    }
    if (ctl_client_new(NULL, &client, &err) != 0) {
        bench_fail("client: %s", err.msg);
        goto out;
    }
    ectx = zmq_ctx_new();
    ec.sock = ectx ? echo_dial(ectx, bench_echo_endpoint(echo)) : NULL;
    bp.sock = ectx ? echo_dial(ectx, bench_echo_endpoint(keeper)) : NULL;
    if (!ec.sock || !bp.sock) {
        bench_fail("echo: cannot connect");
        goto out;
    }
    ec.buf = bp.buf = data;
    memcpy(ctl_blob_data(blob), data, max);
    for (size_t k = 0; k < n_blob_sizes; k++) {
        size_t size = blob_sizes[k];
        blob_call bc = {client, bench_unit_endpoint(unit), ctl_blob_data(blob), size};
        blob_call plain = {client, bench_unit_endpoint(unit), data, size};
        size_t cycles = cfg.blob_budget / size;
        /* Side 0: the stubs from the blob, 1: the echo, 2: bare put/get,
         * 3: the stubs from a plain buffer. */
        enum { SIDES = 4 };
        call_fn fns[SIDES] = {call_put_get, call_echo, call_bare_put_get, call_put_get};
        void *args[SIDES] = {&bc, &ec, &bp, &plain};
        double mbs[SIDES][BENCH_MAX_ROUNDS], faults[SIDES][BENCH_MAX_ROUNDS];
        double user_ms[SIDES][BENCH_MAX_ROUNDS], sys_ms[SIDES][BENCH_MAX_ROUNDS];
        char label[40], sz[24];
        if (cycles < 4)
            cycles = 4;
        ec.len = bp.size = size;
        for (int i = 0; i < SIDES; i++)
            if (warm(fns[i], args[i], 2) != 0)
                goto out;
        for (int r = 0; r < cfg.rounds; r++) {
            for (int i = 0; i < SIDES; i++) {
                int side = (r + i) % SIDES; /* who goes first rotates */
                struct rusage ru0, ru1;
                getrusage(RUSAGE_SELF, &ru0);
                double t0 = now_s();
                for (size_t c = 0; c < cycles; c++)
                    if (fns[side](args[side]) != 0)
                        goto out;
                double elapsed = now_s() - t0;
                getrusage(RUSAGE_SELF, &ru1);
                /* The payload crosses once each way. */
                mbs[side][r] = 2.0 * (double)size * (double)cycles / elapsed / 1e6;
                /* Page faults of the whole process (client and server):
                 * the first touch of every freshly mapped buffer. */
                faults[side][r] = (double)(ru1.ru_minflt - ru0.ru_minflt) / (double)cycles;
                user_ms[side][r] = tv_ms(&ru1.ru_utime, &ru0.ru_utime) / (double)cycles;
                sys_ms[side][r] = tv_ms(&ru1.ru_stime, &ru0.ru_stime) / (double)cycles;
            }
            bench_progress("blobs %s: round %d/%d: %.0f vs echo %.0f vs bare put/get %.0f "
                           "MB/s (from a plain buffer %.0f)",
                           size_name(size, sz, sizeof sz), r + 1, cfg.rounds, mbs[0][r],
                           mbs[1][r], mbs[2][r], mbs[3][r]);
        }
        snprintf(label, sizeof label, "%s", size_name(size, sz, sizeof sz));
        add_row(label, "MB/s", 0, mbs[0], mbs[1], cfg.rounds,
                size >= (1u << 20) ? T_GE : T_NONE, 0.85);
        add_row(label, "MB/s vs put+get", 0, mbs[0], mbs[2], cfg.rounds,
                size >= (1u << 20) ? T_GE : T_NONE, 0.85);
        add_row(label, "MB/s plain buf vs put+get", 0, mbs[3], mbs[2], cfg.rounds, T_NONE, 0);
        note("blobs %-7s per op, whole process (client and server): CPU ms user+sys: "
             "stubs %.2f+%.2f, echo %.2f+%.2f, bare put+get %.2f+%.2f, stubs from a plain "
             "buffer %.2f+%.2f; page faults: %.2f, %.2f, %.2f, %.2f", sz,
             bench_median(user_ms[0], cfg.rounds), bench_median(sys_ms[0], cfg.rounds),
             bench_median(user_ms[1], cfg.rounds), bench_median(sys_ms[1], cfg.rounds),
             bench_median(user_ms[2], cfg.rounds), bench_median(sys_ms[2], cfg.rounds),
             bench_median(user_ms[3], cfg.rounds), bench_median(sys_ms[3], cfg.rounds),
             bench_median(faults[0], cfg.rounds), bench_median(faults[1], cfg.rounds),
             bench_median(faults[2], cfg.rounds), bench_median(faults[3], cfg.rounds));
    }
    note("blobs: the echo moves the payload up and back in one round trip, put+get in two "
         "(and the stubs' ones carry the envelope); 'vs put+get' is the same two round trips "
         "over bare ZeroMQ with no copy (a ROUTER that keeps the message and sends it back). "
         "For scale, memcpy of %s here: %.0f MB/s.", size_name(max, why, sizeof why),
         memcpy_mbs(max));
    rc = 0;
out:
    if (ec.sock)
        zmq_close(ec.sock);
    if (bp.sock)
        zmq_close(bp.sock);
    if (ectx)
        zmq_ctx_term(ectx);
    ctl_client_destroy(&client);
    bench_unit_stop(&unit);
    bench_echo_stop(&echo);
    bench_echo_stop(&keeper);
    ctl_error_fini(&err);
    ctl_blob_release(&blob);
    free(data);
    if (rc == 0) {
#ifdef CTL_BENCH_COPYCOUNT_SO
        copy_counts();
#else
        note("copies: not counted in this build (the copy-counting shim is left out of "
             "sanitizer builds: ASan must come first among the libraries)");
#endif
    }
    return rc;
}

/* ---- case: the generator ------------------------------------------------ */

/* A 200-op service: five shapes of op, forty of each, over three records. */
static int write_idl(const char *path, int ops)
{
    FILE *f = fopen(path, "w");
    if (!f)
        return -1;
    fprintf(f, "/// A service of %d ops for timing ctlrpc-gen and the C compiler.\n"
               "service bench%d;\n\n", ops, ops);
    fprintf(f, "/// A blob's description.\nrecord Item {\n    key: str;\n    size: u64;\n"
               "    tags: list<str>;\n    note: str?;\n}\n\n");
    fprintf(f, "/// A page of items.\nrecord Page {\n    items: list<Item>;\n"
               "    next: str?;\n    sizes: map<str, u64>;\n}\n\n");
    fprintf(f, "/// A point.\nrecord Point {\n    x: f64;\n    y: f64;\n    label: str = \"\";\n}\n\n");
    for (int i = 0; i < ops; i++) {
        switch (i % 5) {
        case 0:
            fprintf(f, "/// Store a blob (%d).\nop put_%03d(key: str, data: bin, pin: bool = false)"
                       " -> u64 raises UnitFull, Busy;\n\n", i, i);
            break;
        case 1:
            fprintf(f, "/// Describe blobs (%d).\nop describe_%03d(keys: list<str>) -> list<Item>"
                       " raises Missing;\n\n", i, i);
            break;
        case 2:
            fprintf(f, "/// List a page (%d).\nop page_%03d(prefix: str = \"\", limit: u32 = 100,"
                       " after: str?) -> Page;\n\n", i, i);
            break;
        case 3:
            fprintf(f, "/// Forget blobs (%d).\nnotify forget_%03d(keys: list<str>);\n\n", i, i);
            break;
        default:
            fprintf(f, "/// Move points (%d).\nop move_%03d(points: list<Point>, dx: f64, dy: f64 = 0.0,"
                       " scale: i64 = 1) -> map<str, Point> raises Busy;\n\n", i, i);
            break;
        }
    }
    return fclose(f) == 0 ? 0 : -1;
}

/* Split a ':'-separated list of include directories into -I arguments. */
static size_t include_args(char *buf, size_t len, char **argv, size_t max)
{
    size_t n = 0;
    snprintf(buf, len, "%s", CTL_BENCH_GEN_INCLUDES);
    for (char *save = NULL, *d = strtok_r(buf, ":", &save); d && n + 1 < max;
         d = strtok_r(NULL, ":", &save)) {
        argv[n++] = (char *)"-I";
        argv[n++] = d;
    }
    return n;
}

/* Generate `idl` into `outdir` and compile the result; the two times. */
static int gen_and_compile(const char *idl, const char *stem, const char *outdir,
                           double *gen_s, double *cc_s)
{
    char why[512], log_path[300], src[400], obj[400], incs[2048];
    char *inc_argv[32];
    snprintf(log_path, sizeof log_path, "%s/gen.log", cfg.tmpdir);
    char *gen_argv[] = {(char *)CTLRPC_PYTHON, (char *)CTL_BENCH_GEN, (char *)idl,
                        (char *)"-o", (char *)outdir, NULL};
    if (bench_run(gen_argv, NULL, log_path, gen_s, why, sizeof why) != 0) {
        bench_fail("ctlrpc-gen: %s", why);
        return -1;
    }
    snprintf(src, sizeof src, "%s/%s.ctl.c", outdir, stem);
    snprintf(obj, sizeof obj, "%s/%s.ctl.o", outdir, stem);
    size_t ni = include_args(incs, sizeof incs, inc_argv, sizeof inc_argv / sizeof inc_argv[0]);
    char *cc_argv[48];
    size_t n = 0;
    cc_argv[n++] = (char *)CTL_BENCH_CC;
    cc_argv[n++] = (char *)"-std=c11";
    cc_argv[n++] = (char *)"-O2";
    for (size_t i = 0; i < ni; i++)
        cc_argv[n++] = inc_argv[i];
    cc_argv[n++] = (char *)"-c";
    cc_argv[n++] = src;
    cc_argv[n++] = (char *)"-o";
    cc_argv[n++] = obj;
    cc_argv[n] = NULL;
    if (bench_run(cc_argv, NULL, log_path, cc_s, why, sizeof why) != 0) {
        bench_fail("cc: %s", why);
        return -1;
    }
    return 0;
}

static int case_gen(void)
{
    char idl[300], out[320];
    double gen[2][BENCH_MAX_ROUNDS], cc[2][BENCH_MAX_ROUNDS], total[2][BENCH_MAX_ROUNDS];
    group("generator: 200-op IDL (baseline: idl/storage.idl, 9 ops), seconds");
    snprintf(idl, sizeof idl, "%s/bench200.idl", cfg.tmpdir);
    if (write_idl(idl, 200) != 0) {
        bench_fail("cannot write %s", idl);
        return -1;
    }
    for (int r = 0; r < cfg.rounds; r++) {
        bench_progress("gen: round %d/%d", r + 1, cfg.rounds);
        for (int i = 0; i < 2; i++) {
            int side = (r % 2) ? 1 - i : i;
            /* A fresh directory each time: the generator skips unchanged files. */
            snprintf(out, sizeof out, "%s/gen-%d-%d", cfg.tmpdir, r, side);
            if (mkdir(out, 0755) != 0 && errno != EEXIST) {
                bench_fail("mkdir %s: %s", out, strerror(errno));
                return -1;
            }
            if (gen_and_compile(side == 0 ? idl : CTL_BENCH_STORAGE_IDL,
                                side == 0 ? "bench200" : "storage", out,
                                &gen[side][r], &cc[side][r]) != 0)
                return -1;
            total[side][r] = gen[side][r] + cc[side][r];
        }
    }
    add_row("ctlrpc-gen", "s", 3, gen[0], gen[1], cfg.rounds, T_NONE, 0);
    add_row("cc -std=c11 -O2 -c", "s", 3, cc[0], cc[1], cfg.rounds, T_NONE, 0);
    add_row("generate + compile", "s", 3, total[0], total[1], cfg.rounds, T_NONE, 0);
    return 0;
}

/* ---- case: the Python unit ---------------------------------------------- */

static int python_usable(char *why, size_t len)
{
    char log_path[300];
    double secs;
    if (access(CTL_BENCH_PYUNIT, R_OK) != 0) {
        snprintf(why, len, "%s is missing", CTL_BENCH_PYUNIT);
        return 0;
    }
    snprintf(log_path, sizeof log_path, "%s/python-check.log", cfg.tmpdir);
    char *argv[] = {(char *)CTL_BENCH_TEST_PYTHON, (char *)"-c",
                    (char *)"import zmq, msgpack", NULL};
    if (bench_run(argv, NULL, log_path, &secs, why, len) != 0) {
        snprintf(why, len, "%s cannot import zmq and msgpack (Debian: python3-zmq, "
                 "python3-msgpack)", CTL_BENCH_TEST_PYTHON);
        return 0;
    }
    return 1;
}

static int case_python(unsigned which)
{
    bench_proc py = {.pid = -1, .out_fd = -1};
    bench_echo *echo = NULL;
    ctl_client *client = NULL;
    small_setup ss;
    ctl_error err;
    char why[512];
    int rc = -1;
    memset(&ss, 0, sizeof ss);
    ctl_error_init(&err);
    if (!python_usable(why, sizeof why)) {
        note("python: skipped: %s", why);
        return 0;
    }
    char *argv[] = {(char *)CTL_BENCH_TEST_PYTHON, (char *)CTL_BENCH_PYUNIT,
                    (char *)"--bind", (char *)"tcp://127.0.0.1:0", NULL};
    if (bench_proc_start(&py, argv, 20000, why, sizeof why) != 0) {
        bench_fail("python unit: %s", why);
        goto out;
    }
    if (small_setup_init(&ss) != 0)
        goto out;
    if (bench_echo_start(&echo, why, sizeof why) != 0) {
        bench_fail("%s", why);
        goto out;
    }
    if (ctl_client_new(NULL, &client, &err) != 0) {
        bench_fail("client: %s", err.msg);
        goto out;
    }
    if (put_blob(client, py.endpoint, SMALL_KEY, "0123456789", 10) != 0)
        goto out;
    if (which & CASE_SMALL) {
        group("for context: the Python unit (tests/interop/pyunit.py) vs the same echo");
        if (small_rows("py unit", 1, py.endpoint, bench_echo_endpoint(echo), client, &ss,
                       cfg.py_calls, T_NONE) != 0)
            goto out;
    }
    if (which & CASE_THROUGHPUT) {
        group("for context: the Python unit under load (server CPU: the whole process)");
        trial ours = {.echo = 0, .address = py.endpoint, .client = client};
        trial base = {.echo = 1, .address = bench_echo_endpoint(echo), .ectx = ss.ectx,
                      .req = ss.describe_req, .req_len = ss.describe_len};
        cpu_src oc = {NULL, py.pid};
        cpu_src ec = {bench_echo_threads(echo), 0};
        if (throughput_rows("py unit", &ours, &oc, &base, &ec, 1) != 0)
            goto out;
    }
    rc = 0;
out:
    ctl_client_destroy(&client);
    bench_echo_stop(&echo);
    bench_proc_stop(&py);
    small_setup_fini(&ss);
    ctl_error_fini(&err);
    return rc;
}

/* ---- main --------------------------------------------------------------- */

static void usage(FILE *f)
{
    fprintf(f,
            "usage: ctl-bench [--quick] [--case NAMES] [--rounds N] [--seconds S]\n"
            "       ctl-bench --vs-grpc [--quick] [--rounds N] [--seconds S]\n"
            "                 [--grpc-dir DIR] [--grpc-channels shared|per-thread]\n"
            "                 [--unit PATH]\n"
            "\n"
            "Measure ctlrpc against the bare ZeroMQ transport, each case side by side\n"
            "with its baseline in this one run, and print a table of the medians over\n"
            "the rounds and their ratios. Exits 0 when every case ran.\n"
            "\n"
            "  --quick         a short run (a few seconds a case; a smoke test)\n"
            "  --case NAMES    comma-separated, any of: small, throughput, fanout,\n"
            "                  blobs, async, gen, python, all (default all; may\n"
            "                  repeat)\n"
            "  --rounds N      rounds per case, alternating case and baseline\n"
            "                  (default 5, --quick 2)\n"
            "  --seconds S     length of one throughput trial (default 2, --quick 0.2)\n"
            "  --blob-sizes L  the blobs case's sizes, comma-separated and ascending\n"
            "                  (default 64K,1M,8M; up to 8, from 1K to 1G)\n"
            "  --vs-grpc       instead of the cases: ctlrpc (ctl-storage-unit) beside\n"
            "                  gRPC C++'s synchronous and callback servers, describe,\n"
            "                  stats and put of 64 bytes at 1/4/16 client threads (one\n"
            "                  blocking call in flight each), with raw TCP and ZeroMQ\n"
            "                  echoes as the floor: p50/p99, calls/s, server CPU per\n"
            "                  call, RSS, disk, ratios gRPC/ctlrpc (default 5 rounds of\n"
            "                  1 s trials; --quick: 1 round, 20 calls a thread)\n"
            "  --grpc-dir DIR  where ctl-bench-grpc-server and ctl-bench-grpc-load are\n"
            "                  (default: beside ctl-bench; built where gRPC C++ is)\n"
            "  --grpc-channels shared (default: one channel for every client thread)\n"
            "                  or per-thread (a channel, and connection, each)\n"
            "  --unit PATH     the ctl-storage-unit to run (default: this build's)\n"
            "  --help          this text\n"
            "\n"
            "Cases:\n"
            "  small       describe(1 key) and stats through the generated stubs, one\n"
            "              thread, vs an echo of the stub's own request bytes\n"
            "  throughput  one unit, 1/4/16 client threads (one shared ctl_client) vs\n"
            "              the echo server: calls/s, server CPU s per 10k calls\n"
            "  fanout      stats_many over 1/4/16 units vs the same fan-out to echoes\n"
            "  blobs       put+get of 64 KiB, 1 MiB, 8 MiB (--blob-sizes), the put\n"
            "              from a ctl_blob (and from a plain buffer), vs an echo\n"
            "              of that size and a bare put+get,\n"
            "              MB/s, and payload copies counted per side (not in\n"
            "              sanitizer builds)\n"
            "  async       64 calls in flight from one thread (storage_describe_start)\n"
            "              vs 64 bare DEALERs and one pipelining DEALER: calls/s;\n"
            "              then RSS per call in flight\n"
            "  gen         ctlrpc-gen + cc -c of a 200-op IDL vs idl/storage.idl\n"
            "  python      small and throughput against tests/interop/pyunit.py\n"
            "              (only the ones also named, when small or throughput is)\n"
            "\n"
            "Every server runs on 127.0.0.1. (--copy-count-child is internal: the\n"
            "child run that the blobs case starts under the copy-counting shim;\n"
            "--vs-grpc-echo-child is too: the floor's echo servers of --vs-grpc.)\n");
}

/* --blob-sizes: comma-separated sizes ("64K,1M,64M"), ascending, each from
 * 1 KiB to 1 GiB. */
static int parse_blob_sizes(const char *text)
{
    char buf[128];
    size_t n = 0;
    if (strlen(text) >= sizeof buf) {
        fprintf(stderr, "ctl-bench: --blob-sizes '%s' is too long\n", text);
        return -1;
    }
    snprintf(buf, sizeof buf, "%s", text);
    for (char *save = NULL, *t = strtok_r(buf, ",", &save); t;
         t = strtok_r(NULL, ",", &save)) {
        uint64_t v;
        if (store_parse_size(t, &v) != 0 || v < 1024 || v > ((uint64_t)1 << 30) ||
            n == MAX_BLOB_SIZES || (n > 0 && v <= blob_sizes[n - 1])) {
            fprintf(stderr, "ctl-bench: --blob-sizes '%s': '%s' is not a size from 1K "
                    "to 1G larger than the one before (at most %d sizes)\n", text, t,
                    MAX_BLOB_SIZES);
            return -1;
        }
        blob_sizes[n++] = (size_t)v;
    }
    if (n == 0) {
        fprintf(stderr, "ctl-bench: --blob-sizes '%s' names no size\n", text);
        return -1;
    }
    n_blob_sizes = n;
    snprintf(cfg.blob_sizes_arg, sizeof cfg.blob_sizes_arg, "%s", text);
    return 0;
}


static void print_header(int argc, char **argv)
{
    char model[256] = "unknown";
    char line[512];
    FILE *f = fopen("/proc/cpuinfo", "r");
    if (f) {
        while (fgets(line, sizeof line, f)) {
            if (strncmp(line, "model name", 10) == 0) {
                char *p = strchr(line, ':');
                if (p) {
                    p += 1 + strspn(p + 1, " \t");
                    p[strcspn(p, "\n")] = '\0';
                    snprintf(model, sizeof model, "%s", p);
                }
                break;
            }
        }
        fclose(f);
    }
    int zmaj, zmin, zpat;
    zmq_version(&zmaj, &zmin, &zpat);
    printf("ctl-bench:");
    for (int i = 0; i < argc; i++)
        printf(" %s", argv[i]);
    printf("\nmachine: %s, %ld online CPUs; libzmq %d.%d.%d, msgpack-c %s; build %s\n",
           model, sysconf(_SC_NPROCESSORS_ONLN), zmaj, zmin, zpat, msgpack_version(),
           CTL_BENCH_BUILD);
    printf("method: %d rounds a case, case and baseline alternating (which goes first "
           "alternates too);\n        figures are medians over the rounds, the ratio is "
           "the median of the per-round ratios ctlrpc/baseline\n\n", cfg.rounds);
}

static int rm_entry(const char *path, const struct stat *sb, int flag, struct FTW *ftw)
{
    (void)sb, (void)flag, (void)ftw;
    return remove(path);
}

int main(int argc, char **argv)
{
    static const struct option opts[] = {
        {"quick", no_argument, NULL, 'q'},
        {"case", required_argument, NULL, 'c'},
        {"rounds", required_argument, NULL, 'r'},
        {"seconds", required_argument, NULL, 's'},
        {"help", no_argument, NULL, 'h'},
        {"blob-sizes", required_argument, NULL, 'B'},
        {"copy-count-child", no_argument, NULL, 'C'},
        {"vs-grpc", no_argument, NULL, 'G'},
        {"grpc-dir", required_argument, NULL, 'D'},
        {"grpc-channels", required_argument, NULL, 'H'},
        {"unit", required_argument, NULL, 'U'},
        {"vs-grpc-echo-child", no_argument, NULL, 'E'},
        {NULL, 0, NULL, 0},
    };
    vs_grpc_options vs = {0};
    int c, rounds = 0, vs_grpc = 0, vs_only = 0;
    double seconds = 0;
    unsigned cases = 0;
    while ((c = getopt_long(argc, argv, "h", opts, NULL)) != -1) {
        char *end;
        switch (c) {
        case 'q':
            cfg.quick = 1;
            break;
        case 'c':
            if (bench_parse_cases(optarg, case_names,
                                  sizeof case_names / sizeof case_names[0], &cases) != 0)
                return 2;
            break;
        case 'r':
            rounds = (int)strtol(optarg, &end, 10);
            if (*end || rounds < 1 || rounds > BENCH_MAX_ROUNDS) {
                fprintf(stderr, "ctl-bench: --rounds wants 1..%d\n", BENCH_MAX_ROUNDS);
                return 2;
            }
            break;
        case 's':
            seconds = strtod(optarg, &end);
            if (*end || !(seconds > 0 && seconds <= 600)) {
                fprintf(stderr, "ctl-bench: --seconds wants a number in (0, 600]\n");
                return 2;
            }
            break;
        case 'B':
            if (parse_blob_sizes(optarg) != 0)
                return 2;
            break;
        case 'C':
            return copy_count_child();
        case 'G':
            vs_grpc = 1;
            break;
        case 'E':
            return vs_grpc_echo_child();
        case 'D':
            vs.grpc_dir = optarg;
            vs_only = 1;
            break;
        case 'U':
            vs.unit = optarg;
            vs_only = 1;
            break;
        case 'H':
            if (strcmp(optarg, "shared") != 0 && strcmp(optarg, "per-thread") != 0) {
                fprintf(stderr, "ctl-bench: --grpc-channels wants shared or per-thread, "
                        "not '%s'\n", optarg);
                return 2;
            }
            vs.per_thread_channels = strcmp(optarg, "per-thread") == 0;
            vs_only = 1;
            break;
        case 'h':
            usage(stdout);
            return 0;
        default:
            usage(stderr);
            return 2;
        }
    }
    if (optind < argc) {
        fprintf(stderr, "ctl-bench: unexpected argument '%s'\n", argv[optind]);
        usage(stderr);
        return 2;
    }
    if (vs_only && !vs_grpc) {
        fprintf(stderr, "ctl-bench: --grpc-dir, --grpc-channels and --unit go with --vs-grpc\n");
        usage(stderr);
        return 2;
    }
    if (vs_grpc) {
        if (cases || cfg.blob_sizes_arg[0]) {
            fprintf(stderr, "ctl-bench: --vs-grpc runs on its own (no --case, no "
                    "--blob-sizes)\n");
            usage(stderr);
            return 2;
        }
        vs.quick = cfg.quick;
        vs.rounds = rounds;
        vs.seconds = seconds;
        return vs_grpc_main(&vs, argc, argv);
    }
    cfg.cases = cases ? cases : CASE_ALL;
    cfg.rounds = rounds ? rounds : cfg.quick ? 2 : 5;
    cfg.seconds = seconds > 0 ? seconds : cfg.quick ? 0.2 : 2.0;
    cfg.small_calls = cfg.quick ? 500 : 20000;
    cfg.py_calls = cfg.quick ? 200 : 3000;
    cfg.batches = cfg.quick ? 200 : 3000;
    cfg.blob_budget = cfg.quick ? (size_t)32 << 20 : (size_t)384 << 20;
    if (!cfg.blob_sizes_arg[0])
        snprintf(cfg.blob_sizes_arg, sizeof cfg.blob_sizes_arg, "64K,1M,8M");

    const char *tmp = getenv("TMPDIR");
    snprintf(cfg.tmpdir, sizeof cfg.tmpdir, "%s/ctl-bench.XXXXXX",
             tmp && *tmp ? tmp : "/tmp");
    if (!mkdtemp(cfg.tmpdir)) {
        fprintf(stderr, "ctl-bench: cannot make a temporary directory: %s\n",
                strerror(errno));
        return 1;
    }
    print_header(argc, argv);
    fflush(stdout);

    if (cfg.cases & (CASE_SMALL | CASE_THROUGHPUT))
        case_small_and_throughput(cfg.cases);
    if (cfg.cases & CASE_FANOUT)
        case_fanout();
    if (cfg.cases & CASE_BLOBS)
        case_blobs();
    if (cfg.cases & CASE_ASYNC)
        case_async();
    if (cfg.cases & CASE_GEN)
        case_gen();
    if (cfg.cases & CASE_PYTHON)
        case_python(cfg.cases & (CASE_SMALL | CASE_THROUGHPUT)
                        ? cfg.cases
                        : CASE_SMALL | CASE_THROUGHPUT);

    print_table();
    printf("\ntargets (the project's goals) are checked for information only: ctl-bench has no "
           "thresholds.\n");
    if (bench_failed)
        printf("ctl-bench: some cases FAILED (see the errors above)\n");
    for (size_t i = 0; i < n_notes; i++)
        free(notes[i]);
    if (!bench_failed)
        nftw(cfg.tmpdir, rm_entry, 16, FTW_DEPTH | FTW_PHYS);
    else
        fprintf(stderr, "ctl-bench: kept %s for a look\n", cfg.tmpdir);
    return bench_failed ? 1 : 0;
}
