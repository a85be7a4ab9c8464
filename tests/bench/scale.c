/*
 * scale.c - ctl-scale: ctlrpc measured at scale, the companion of
 * ctl-bench (bench.c). Where ctl-bench asks "how close to the bare
 * transport is one call", ctl-scale asks "what happens as the numbers
 * grow": more units, more blobs, more clients, bigger blobs.
 *
 * As in ctl-bench, a figure that has a baseline is measured side by side
 * with it in the same run (rounds alternate which goes first, tables quote
 * medians over the rounds and the median of the per-round ratios); a
 * figure without one is given as a curve against the smallest size of the
 * same run.
 *
 * Cases (--case):
 *   fanout   storage_stats_many (blocking) and storage_stats_many_start
 *            (asynchronous, waited for, its callback run by
 *            ctl_client_process, or with --io-callbacks on the client's
 *            I/O thread) over 16, 64, 256, 1024 servers vs
 *            the bare ZeroMQ fan-out (a DEALER per address: send all, then
 *            collect all) to the SAME servers: ROUTERs that answer every
 *            request with a fixed, well-formed stats reply carrying the
 *            request's id, 64 to a child process served by one thread
 *            polling them all. Both sides meet identical servers, so the
 *            figures say what the client costs, and this process is the
 *            client alone. The three sides take turns batch by batch, in
 *            an order where each follows each other equally often:
 *            batch p50/p99 and per target, the client's CPU per target
 *            (the sum of this process's threads' CPU clocks over a side's
 *            batches), the machine's TCP segments per target, its memory
 *            and open files per address (VmRSS and /proc/self/fd, before
 *            and after the first batch, a fresh client and context for
 *            each size), and its CPU a second while both clients idle.
 *            Then again with batches of 16, 64 and 256 to one fleet of
 *            1024 (each batch to the next ones, every connection warm),
 *            so that the work per target is seen against the batch alone.
 *   held     one unit (in this process: the storage service's handlers and
 *            store behind storage_serve) filled to 10 thousand, 1 million
 *            and, memory allowing, 10 million blobs of 8 bytes, straight
 *            through the store's API under the unit's lock; at each level
 *            put (over an existing key), get and describe of random keys
 *            through the stubs, p50/p99, and the cost of stats, of a list
 *            page with a prefix that matches 10 keys, and of the first page
 *            of 1000 keys with no prefix. Ratios against the first level.
 *   clients  5000 clients (ctl_client objects, one thread each, spread
 *            over child processes of 625) connecting at once to one
 *            ctl-storage-unit process and making 4 calls each (stats and
 *            describe, alternating): every call must be answered; the
 *            unit's RSS and open files (/proc/<pid>/status, /proc/<pid>/fd)
 *            before, with every client connected, and after they left, and
 *            per connection. The unit is started with a soft open-file
 *            limit of 1024, so it must raise its own (unit.c).
 *   blobs    ctl-bench's blobs case with sizes 64 KiB, 1 MiB, 8 MiB and
 *            64 MiB (ctl-bench --case blobs --blob-sizes ...): put+get MB/s
 *            against the bare echo at each size, and the copies counted.
 *
 * --quick is the smoke test CI runs: fan-out to 16 and 64 units, 10k and
 * 100k blobs held, 200 clients, blobs of 64 KiB to 1 MiB, 2 rounds.
 *
 * Internal modes (this program run as a child of itself):
 *   --host units N    serve N storage units, print their endpoints, one a
 *   --host echo N     line, then "ready"; stop at the end of stdin
 *   --clients-host N ADDRESS CALLS
 *                     N client threads; "ready" once each has its client,
 *                     calls on "go", prints "done OK FAILED P50 P99 MAX"
 *                     (latencies in us) and closes its clients at the end
 *                     of stdin
 * A child raises its soft open-file limit to the hard one, as this process
 * does, and dies with its parent.
 *
 * Exit status: 0 when every case ran (there are no thresholds), 1 when a
 * call failed or a case could not be set up, 2 for a bad command line.
 */
#define _GNU_SOURCE
#include "bench.h"
#include "unitproc.h"

#include <errno.h>
#include <dirent.h>
#include <fcntl.h>
#include <getopt.h>
#include <inttypes.h>
#include <malloc.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <spawn.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <zmq.h>

#define CALL_TIMEOUT_MS 60000
#define LIST_TIMEOUT_MS 300000
#define PER_HOST 64          /* units or echo sockets per child process */
#define CLIENTS_PER_HOST 625 /* client threads per child process */
#define HELD_KEY_FMT "b%010zu"
#define HELD_FEW 10          /* keys under the prefix "few-" */

extern char **environ;

/* ---- configuration ------------------------------------------------------ */

enum {
    CASE_FANOUT = 1 << 0,
    CASE_HELD = 1 << 1,
    CASE_CLIENTS = 1 << 2,
    CASE_BLOBS = 1 << 3,
    CASE_ALL = (1 << 4) - 1
};

static const bench_case_name case_names[] = {
    {"fanout", CASE_FANOUT}, {"held", CASE_HELD}, {"clients", CASE_CLIENTS},
    {"blobs", CASE_BLOBS},   {"all", CASE_ALL},
};

typedef struct config {
    int quick;
    int io_callbacks; /* the fan-out's asynchronous client: callbacks_on_io_thread */
    int rounds;
    unsigned cases;
    char self[512]; /* this program, for the children */
} config;

static config cfg;

/* ---- messages ----------------------------------------------------------- */



/* ---- figures ------------------------------------------------------------ */



/* The median of the per-round ratios a/b. */
static double median_ratio(const double *a, const double *b, int n)
{
    double r[BENCH_MAX_ROUNDS];
    int k = 0;
    for (int i = 0; i < n; i++)
        if (b[i] > 0)
            r[k++] = a[i] / b[i];
    return bench_median(r, k);
}


/* The p-th percentile of `n` latencies in ns (sorts them), in us. */
static double pct_us(uint64_t *ns, size_t n, int p)
{
    if (n == 0)
        return 0;
    qsort(ns, n, sizeof *ns, bench_cmp_u64);
    return (double)ns[(n - 1) * (size_t)p / 100] / 1e3;
}

/* ---- limits and contexts ------------------------------------------------ */

/* Soft RLIMIT_NOFILE up to the hard limit: every socket and connection
 * takes a file descriptor. */
static void raise_nofile(void)
{
    struct rlimit rl;
    if (getrlimit(RLIMIT_NOFILE, &rl) == 0 && rl.rlim_cur < rl.rlim_max) {
        rl.rlim_cur = rl.rlim_max;
        if (setrlimit(RLIMIT_NOFILE, &rl) != 0)
            bench_progress("cannot raise the open-file limit: %s", strerror(errno));
    }
}

static unsigned long long nofile_soft(void)
{
    struct rlimit rl;
    return getrlimit(RLIMIT_NOFILE, &rl) == 0 ? (unsigned long long)rl.rlim_cur : 0;
}

/* A ZeroMQ context that allows `sockets` sockets (the default, 1023, is
 * too few for a client of 1024 units). NULL on failure. */
static void *scale_ctx(size_t sockets)
{
    void *ctx = zmq_ctx_new();
    if (ctx && sockets > 1023 && zmq_ctx_set(ctx, ZMQ_MAX_SOCKETS, (int)sockets) != 0) {
        zmq_ctx_term(ctx);
        return NULL;
    }
    return ctx;
}

/* The soft open-file limit of process `pid` ("Max open files" in
 * /proc/<pid>/limits), 0 when it cannot be read. */
static unsigned long long proc_nofile(pid_t pid)
{
    char path[64], line[256];
    unsigned long long soft = 0;
    snprintf(path, sizeof path, "/proc/%d/limits", (int)pid);
    FILE *f = fopen(path, "r");
    if (!f)
        return 0;
    while (fgets(line, sizeof line, f))
        if (strncmp(line, "Max open files", 14) == 0)
            soft = strtoull(line + 14, NULL, 10);
    fclose(f);
    return soft;
}

/* MemAvailable in KiB (0 when unknown). */
static uint64_t mem_available_kib(void)
{
    char line[256];
    uint64_t kib = 0;
    FILE *f = fopen("/proc/meminfo", "r");
    if (!f)
        return 0;
    while (fgets(line, sizeof line, f))
        if (strncmp(line, "MemAvailable:", 13) == 0)
            kib = strtoull(line + 13, NULL, 10);
    fclose(f);
    return kib;
}

/* TcpExt ListenOverflows of /proc/net/netstat: connections the kernel
 * could not queue because a listener's accept queue was full (for the
 * whole machine; the client retries them with SYNs after 1 s, 3 s, ...).
 * -1 when it cannot be read. */
static long long listen_overflows(void)
{
    char names[4096], values[4096];
    long long v = -1;
    FILE *f = fopen("/proc/net/netstat", "r");
    if (!f)
        return -1;
    while (fgets(names, sizeof names, f) && fgets(values, sizeof values, f)) {
        if (strncmp(names, "TcpExt:", 7) != 0)
            continue;
        char *ns = NULL, *vs = NULL;
        char *n = strtok_r(names, " \n", &ns), *x = strtok_r(values, " \n", &vs);
        while (n && x) {
            if (strcmp(n, "ListenOverflows") == 0)
                v = strtoll(x, NULL, 10);
            n = strtok_r(NULL, " \n", &ns);
            x = strtok_r(NULL, " \n", &vs);
        }
    }
    fclose(f);
    return v;
}

/* ---- children ----------------------------------------------------------- */

/* A child run of this program, talked to through its stdin and stdout. */
typedef struct kid {
    pid_t pid;
    int in_fd;  /* its stdin; closing it tells the child to finish */
    int out_fd; /* its stdout */
    char buf[4096];
    size_t len;
} kid;

static int kid_start(kid *k, char *const argv[])
{
    int in[2], out[2];
    posix_spawn_file_actions_t fa;
    memset(k, 0, sizeof *k);
    k->pid = -1;
    k->in_fd = k->out_fd = -1;
    if (pipe2(in, O_CLOEXEC) != 0)
        return -1;
    if (pipe2(out, O_CLOEXEC) != 0) {
        close(in[0]);
        close(in[1]);
        return -1;
    }
    posix_spawn_file_actions_init(&fa);
    posix_spawn_file_actions_adddup2(&fa, in[0], 0);
    posix_spawn_file_actions_adddup2(&fa, out[1], 1);
    int rc = posix_spawn(&k->pid, argv[0], &fa, NULL, argv, environ);
    posix_spawn_file_actions_destroy(&fa);
    close(in[0]);
    close(out[1]);
    if (rc != 0) {
        close(in[1]);
        close(out[0]);
        k->pid = -1;
        errno = rc;
        return -1;
    }
    k->in_fd = in[1];
    k->out_fd = out[0];
    return 0;
}

/* The child's next line (without its newline), waiting up to `timeout_ms`.
 * 0, or -1 when it ended or took too long. */
static int kid_line(kid *k, char *line, size_t cap, int timeout_ms)
{
    uint64_t deadline = now_ns() + (uint64_t)timeout_ms * 1000000u;
    for (;;) {
        char *nl = memchr(k->buf, '\n', k->len);
        if (nl) {
            size_t n = (size_t)(nl - k->buf);
            snprintf(line, cap, "%.*s", (int)n, k->buf);
            k->len -= n + 1;
            memmove(k->buf, nl + 1, k->len);
            return 0;
        }
        if (k->len == sizeof k->buf)
            return -1; /* a line longer than the buffer: not ours */
        uint64_t now = now_ns();
        if (now >= deadline)
            return -1;
        struct pollfd pfd = {k->out_fd, POLLIN, 0};
        int rc = poll(&pfd, 1, (int)((deadline - now) / 1000000u) + 1);
        if (rc < 0 && errno == EINTR)
            continue;
        if (rc <= 0)
            continue;
        ssize_t r = read(k->out_fd, k->buf + k->len, sizeof k->buf - k->len);
        if (r < 0 && errno == EINTR)
            continue;
        if (r <= 0)
            return -1;
        k->len += (size_t)r;
    }
}

static int kid_say(kid *k, const char *text)
{
    size_t n = strlen(text);
    return write(k->in_fd, text, n) == (ssize_t)n ? 0 : -1;
}

/* Close its stdin and reap it (SIGKILL after `timeout_ms`). Its exit
 * status, or -1. */
static int kid_stop(kid *k, int timeout_ms)
{
    int status = -1;
    if (k->in_fd >= 0)
        close(k->in_fd);
    k->in_fd = -1;
    if (k->pid > 0) {
        uint64_t deadline = now_ns() + (uint64_t)timeout_ms * 1000000u;
        int st;
        pid_t r;
        while ((r = waitpid(k->pid, &st, WNOHANG)) == 0 && now_ns() < deadline) {
            struct timespec ts = {0, 10000000};
            nanosleep(&ts, NULL);
        }
        if (r == 0) {
            kill(k->pid, SIGKILL);
            waitpid(k->pid, &st, 0);
        } else if (r < 0) {
            st = -1;
        }
        status = r > 0 && WIFEXITED(st) ? WEXITSTATUS(st) : -1;
        k->pid = -1;
    }
    if (k->out_fd >= 0)
        close(k->out_fd);
    k->out_fd = -1;
    return status;
}

/* In a child: die with the parent. */
static void child_setup(void)
{
    prctl(PR_SET_PDEATHSIG, SIGKILL);
    if (getppid() == 1)
        _exit(1);
    raise_nofile();
}

/* ---- child: hosts of units and echo sockets ----------------------------- */

/* Serve every message of one ROUTER that is waiting, sending it back as it
 * came (identity and all). ETERM ends it. */
static void echo_ready(void *router)
{
    for (;;) {
        zmq_msg_t frames[4];
        int n = 0, more = 1;
        while (more) {
            zmq_msg_t scratch;
            zmq_msg_t *m = n < 4 ? &frames[n] : &scratch;
            zmq_msg_init(m);
            if (zmq_msg_recv(m, router, n == 0 ? ZMQ_DONTWAIT : 0) < 0) {
                zmq_msg_close(m);
                for (int i = 0; i < n; i++)
                    zmq_msg_close(&frames[i]);
                return;
            }
            more = zmq_msg_more(m);
            if (n < 4)
                n++;
            else
                zmq_msg_close(m);
        }
        for (int i = 0; i < n; i++)
            if (zmq_msg_send(&frames[i], router, i + 1 < n ? ZMQ_SNDMORE : 0) < 0)
                zmq_msg_close(&frames[i]);
    }
}

/* The fixed reply's result: a UnitStats map (blobs, bytes, capacity,
 * pinned, spilled, requests, dropped; all 1). */
static const unsigned char fixed_result[] = {
    0x87, 0xa5, 'b', 'l', 'o', 'b', 's', 0x01, 0xa5, 'b', 'y', 't', 'e', 's', 0x01,
    0xa8, 'c', 'a', 'p', 'a', 'c', 'i', 't', 'y', 0x01, 0xa6, 'p', 'i', 'n', 'n', 'e', 'd', 0x01,
    0xa7, 's', 'p', 'i', 'l', 'l', 'e', 'd', 0x01, 0xa8, 'r', 'e', 'q', 'u', 'e', 's', 't', 's',
    0x01, 0xa7, 'd', 'r', 'o', 'p', 'p', 'e', 'd', 0x01};

/* A msgpack str at p (fixstr or str8) within n bytes: its length and the
 * bytes used by its head, or -1. */
static int str_at(const unsigned char *p, size_t n, size_t *len, size_t *head)
{
    if (n >= 1 && (p[0] & 0xe0) == 0xa0) {
        *len = p[0] & 0x1f;
        *head = 1;
    } else if (n >= 2 && p[0] == 0xd9) {
        *len = p[1];
        *head = 2;
    } else {
        return -1;
    }
    return *head + *len <= n ? 0 : -1;
}

/* Answer every waiting message of one ROUTER with [id, true, fixed]. */
static void fixed_ready(void *router)
{
    for (;;) {
        zmq_msg_t id, body;
        zmq_msg_init(&id);
        zmq_msg_init(&body);
        if (zmq_msg_recv(&id, router, ZMQ_DONTWAIT) < 0 || !zmq_msg_more(&id) ||
            zmq_msg_recv(&body, router, 0) < 0) {
            zmq_msg_close(&id);
            zmq_msg_close(&body);
            return;
        }
        const unsigned char *p = zmq_msg_data(&body);
        size_t n = zmq_msg_size(&body), olen, ohead, ilen, ihead;
        unsigned char out[512];
        if (n > 1 && p[0] == 0x93 && str_at(p + 1, n - 1, &olen, &ohead) == 0 &&
            str_at(p + 1 + ohead + olen, n - 1 - ohead - olen, &ilen, &ihead) == 0 &&
            1 + ihead + ilen + 1 + sizeof fixed_result <= sizeof out) {
            size_t k = 0;
            out[k++] = 0x93;
            memcpy(out + k, p + 1 + ohead + olen, ihead + ilen);
            k += ihead + ilen;
            out[k++] = 0xc3;
            memcpy(out + k, fixed_result, sizeof fixed_result);
            k += sizeof fixed_result;
            if (zmq_msg_send(&id, router, ZMQ_SNDMORE) >= 0)
                zmq_send(router, out, k, 0);
            else
                zmq_msg_close(&id);
        } else {
            zmq_msg_close(&id);
        }
        zmq_msg_close(&body);
    }
}

/* --host echo N / --host fixed N: N bare ROUTERs in one context, one
 * thread polling them all (and stdin, whose end stops it); `ready` serves
 * the messages waiting on one of them. */
static int host_routers(size_t n, void (*ready)(void *router))
{
    void *ctx = scale_ctx(n + 64);
    void **routers = calloc(n, sizeof *routers);
    zmq_pollitem_t *items = calloc(n + 1, sizeof *items);
    int rc = 1, zero = 0;
    if (!ctx || !routers || !items) {
        fprintf(stderr, "ctl-scale: router host: out of memory or no context\n");
        goto out;
    }
    for (size_t i = 0; i < n; i++) {
        char ep[BENCH_ENDPOINT_MAX];
        size_t len = sizeof ep;
        routers[i] = zmq_socket(ctx, ZMQ_ROUTER);
        if (!routers[i] || zmq_setsockopt(routers[i], ZMQ_LINGER, &zero, sizeof zero) != 0 ||
            zmq_bind(routers[i], "tcp://127.0.0.1:*") != 0 ||
            zmq_getsockopt(routers[i], ZMQ_LAST_ENDPOINT, ep, &len) != 0) {
            fprintf(stderr, "ctl-scale: router host: socket %zu of %zu: %s\n", i + 1, n,
                    zmq_strerror(zmq_errno()));
            goto out;
        }
        printf("%s\n", ep);
        items[i] = (zmq_pollitem_t){routers[i], 0, ZMQ_POLLIN, 0};
    }
    items[n] = (zmq_pollitem_t){NULL, 0, ZMQ_POLLIN, 0};
    printf("ready\n");
    fflush(stdout);
    for (;;) {
        int r = zmq_poll(items, (int)n + 1, -1);
        if (r < 0) {
            if (zmq_errno() == EINTR)
                continue;
            break;
        }
        if (items[n].revents) {
            char buf[64];
            if (read(0, buf, sizeof buf) <= 0)
                break;
        }
        for (size_t i = 0; i < n; i++)
            if (items[i].revents & ZMQ_POLLIN)
                ready(routers[i]);
    }
    rc = 0;
out:
    for (size_t i = 0; routers && i < n; i++)
        if (routers[i])
            zmq_close(routers[i]);
    if (ctx)
        zmq_ctx_term(ctx);
    free(routers);
    free(items);
    return rc;
}

/* --host units N: N storage units sharing one context. */
static int host_units(size_t n)
{
    void *ctx = scale_ctx(2 * n + 64);
    bench_unit **units = calloc(n, sizeof *units);
    char why[256];
    int rc = 1;
    if (!ctx || !units) {
        fprintf(stderr, "ctl-scale: unit host: out of memory or no context\n");
        goto out;
    }
    for (size_t i = 0; i < n; i++) {
        if (bench_unit_start_in((uint64_t)1 << 20, ctx, &units[i], why, sizeof why) != 0) {
            fprintf(stderr, "ctl-scale: unit host: unit %zu of %zu: %s\n", i + 1, n, why);
            goto out;
        }
        printf("%s\n", bench_unit_endpoint(units[i]));
    }
    printf("ready\n");
    fflush(stdout);
    char buf[64];
    ssize_t r;
    while ((r = read(0, buf, sizeof buf)) > 0 || (r < 0 && errno == EINTR))
        ;
    rc = 0;
out:
    for (size_t i = 0; units && i < n; i++)
        bench_unit_stop(&units[i]);
    if (ctx)
        zmq_ctx_term(ctx);
    free(units);
    return rc;
}

/* ---- child: many clients ------------------------------------------------ */

typedef struct crowd {
    void *ctx;
    const char *address;
    int calls;
    pthread_mutex_t mu;
    pthread_cond_t cond;
    int ready, go, done, quit;
} crowd;

typedef struct crowd_client {
    crowd *c;
    pthread_t thread;
    uint64_t *lat; /* `calls` latencies, ns */
    int ok, failed;
    char err[256];
} crowd_client;

static const ctl_str crowd_keys[1] = {{"scale-key", 9}};

static int crowd_call(ctl_client *client, const char *address, int i, ctl_error *err)
{
    ctl_reply *reply = NULL;
    int rc;
    if (i % 2 == 0) {
        storage_UnitStats res;
        rc = storage_stats(client, address, CALL_TIMEOUT_MS, &res, &reply, err);
    } else {
        storage_describe_args a;
        storage_list_BlobInfo res;
        storage_describe_args_init(&a);
        a.keys = (storage_list_str){.items = crowd_keys, .count = 1};
        rc = storage_describe(client, address, &a, CALL_TIMEOUT_MS, &res, &reply, err);
        if (rc == 0 && res.count != 1)
            rc = ctl_error_set(err, CTL_PROTOCOL, "describe: %zu results", res.count);
    }
    ctl_reply_destroy(&reply);
    return rc;
}

static void *crowd_main(void *arg)
{
    crowd_client *t = arg;
    crowd *c = t->c;
    ctl_client *client = NULL;
    ctl_client_options o;
    ctl_error err;
    ctl_error_init(&err);
    ctl_client_options_init(&o);
    o.zmq_context = c->ctx;
    int made = ctl_client_new(&o, &client, &err) == 0;
    if (!made) {
        snprintf(t->err, sizeof t->err, "client: %s", err.msg ? err.msg : "failed");
        t->failed = c->calls;
    }
    pthread_mutex_lock(&c->mu);
    c->ready++;
    pthread_cond_broadcast(&c->cond);
    while (!c->go && !c->quit)
        pthread_cond_wait(&c->cond, &c->mu);
    int call = !c->quit; /* told to stop before going: no calls */
    pthread_mutex_unlock(&c->mu);
    for (int i = 0; made && call && i < c->calls; i++) {
        uint64_t t0 = now_ns();
        if (crowd_call(client, c->address, i, &err) == 0) {
            t->lat[t->ok++] = now_ns() - t0;
        } else {
            if (!t->failed)
                snprintf(t->err, sizeof t->err, "%s", err.msg ? err.msg : "failed");
            t->failed++;
        }
    }
    /* Stay connected until the parent has looked at the unit. */
    pthread_mutex_lock(&c->mu);
    c->done++;
    pthread_cond_broadcast(&c->cond);
    while (!c->quit)
        pthread_cond_wait(&c->cond, &c->mu);
    pthread_mutex_unlock(&c->mu);
    ctl_client_destroy(&client);
    ctl_error_fini(&err);
    return NULL;
}

/* Wait (under c->mu) until *counter reaches n. */
static void crowd_wait(crowd *c, const int *counter, int n)
{
    pthread_mutex_lock(&c->mu);
    while (*counter < n)
        pthread_cond_wait(&c->cond, &c->mu);
    pthread_mutex_unlock(&c->mu);
}

static void crowd_set(crowd *c, int *flag)
{
    pthread_mutex_lock(&c->mu);
    *flag = 1;
    pthread_cond_broadcast(&c->cond);
    pthread_mutex_unlock(&c->mu);
}

/* A line from stdin (blocking); -1 at its end. */
static int read_line(char *buf, size_t cap)
{
    size_t n = 0;
    while (n + 1 < cap) {
        char ch;
        ssize_t r = read(0, &ch, 1);
        if (r < 0 && errno == EINTR)
            continue;
        if (r <= 0)
            return -1;
        if (ch == '\n')
            break;
        buf[n++] = ch;
    }
    buf[n] = '\0';
    return 0;
}

/* --clients-host N ADDRESS CALLS */
static int host_clients(int n, const char *address, int calls)
{
    crowd c = {.address = address, .calls = calls};
    crowd_client *ts = calloc((size_t)n, sizeof *ts);
    uint64_t *all = calloc((size_t)n * (size_t)calls + 1, sizeof *all);
    pthread_attr_t attr;
    int started = 0, ok = 0, failed = 0;
    char line[64];
    c.ctx = scale_ctx(4 * (size_t)n + 64);
    if (!c.ctx || !ts || !all) {
        fprintf(stderr, "ctl-scale: clients host: out of memory or no context\n");
        free(ts);
        free(all);
        if (c.ctx)
            zmq_ctx_term(c.ctx);
        return 1;
    }
    pthread_mutex_init(&c.mu, NULL);
    pthread_cond_init(&c.cond, NULL);
    pthread_attr_init(&attr);
    pthread_attr_setstacksize(&attr, (size_t)512 << 10);
    for (int i = 0; i < n; i++) {
        ts[i].c = &c;
        ts[i].lat = all + (size_t)i * (size_t)calls;
        if (pthread_create(&ts[i].thread, &attr, crowd_main, &ts[i]) != 0) {
            fprintf(stderr, "ctl-scale: clients host: thread %d of %d: cannot start it\n",
                    i + 1, n);
            failed += (n - i) * calls;
            break;
        }
        started++;
    }
    pthread_attr_destroy(&attr);
    crowd_wait(&c, &c.ready, started);
    printf("ready\n");
    fflush(stdout);
    if (read_line(line, sizeof line) == 0 && strcmp(line, "go") == 0) {
        crowd_set(&c, &c.go);
        crowd_wait(&c, &c.done, started);
    } else {
        failed += started * calls; /* told to stop before calling */
    }
    /* The latencies side by side, for the percentiles. */
    size_t k = 0;
    const char *first_err = NULL;
    for (int i = 0; i < started; i++) {
        for (int j = 0; j < ts[i].ok; j++)
            all[k++] = ts[i].lat[j];
        ok += ts[i].ok;
        failed += ts[i].failed;
        if (!first_err && ts[i].err[0])
            first_err = ts[i].err;
    }
    if (first_err)
        fprintf(stderr, "ctl-scale: clients host: first failure: %s\n", first_err);
    double p50 = pct_us(all, k, 50), p99 = pct_us(all, k, 99);
    double max = k ? (double)all[k - 1] / 1e3 : 0;
    printf("done %d %d %.1f %.1f %.1f\n", ok, failed, p50, p99, max);
    fflush(stdout);
    while (read_line(line, sizeof line) == 0)
        ; /* until the parent closes our stdin */
    crowd_set(&c, &c.quit);
    for (int i = 0; i < started; i++)
        pthread_join(ts[i].thread, NULL);
    zmq_ctx_term(c.ctx);
    pthread_cond_destroy(&c.cond);
    pthread_mutex_destroy(&c.mu);
    free(ts);
    free(all);
    return failed ? 1 : 0;
}

/* ---- hosts, seen from the parent ---------------------------------------- */

typedef struct hosts {
    kid *kids;
    size_t n_kids;
    char (*endpoints)[BENCH_ENDPOINT_MAX];
    size_t n;
} hosts;

/* Start ceil(n / PER_HOST) children serving `kind` ("units", "echo") and
 * collect n endpoints. */
static int hosts_start(hosts *h, const char *kind, size_t n)
{
    memset(h, 0, sizeof *h);
    size_t nk = (n + PER_HOST - 1) / PER_HOST;
    h->kids = calloc(nk, sizeof *h->kids);
    h->endpoints = calloc(n, sizeof *h->endpoints);
    if (!h->kids || !h->endpoints) {
        bench_fail("out of memory");
        return -1;
    }
    for (size_t i = 0; i < nk; i++) {
        char count[16];
        size_t here = n - i * PER_HOST < PER_HOST ? n - i * PER_HOST : PER_HOST;
        snprintf(count, sizeof count, "%zu", here);
        char *argv[] = {cfg.self, (char *)"--host", (char *)kind, count, NULL};
        if (kid_start(&h->kids[i], argv) != 0) {
            bench_fail("cannot start a %s host (%s): %s", kind, cfg.self, strerror(errno));
            return -1;
        }
        h->n_kids++;
    }
    for (size_t i = 0; i < nk; i++) {
        char line[256];
        for (;;) {
            if (kid_line(&h->kids[i], line, sizeof line, 60000) != 0) {
                bench_fail("%s host %zu of %zu (pid %d) did not come up (see its errors above)",
                     kind, i + 1, nk, (int)h->kids[i].pid);
                return -1;
            }
            if (strcmp(line, "ready") == 0)
                break;
            if (strncmp(line, "tcp://", 6) != 0 || h->n == n ||
                strlen(line) >= BENCH_ENDPOINT_MAX) {
                bench_fail("%s host %zu: unexpected line '%s'", kind, i + 1, line);
                return -1;
            }
            memcpy(h->endpoints[h->n++], line, strlen(line) + 1);
        }
    }
    if (h->n != n) {
        bench_fail("%s hosts: %zu endpoints of %zu", kind, h->n, n);
        return -1;
    }
    return 0;
}

static void hosts_stop(hosts *h)
{
    for (size_t i = 0; h->kids && i < h->n_kids; i++)
        if (kid_stop(&h->kids[i], 20000) != 0)
            bench_fail("a host (child %zu) did not exit cleanly", i + 1);
    free(h->kids);
    free(h->endpoints);
    memset(h, 0, sizeof *h);
}

/* ---- case: fan-out ------------------------------------------------------ */

/* How long the idle clients are watched after a size's rounds. */
#define IDLE_MEASURE_MS 2000

/* The bytes of a stats request as the ctlrpc client sends it ([op, id,
 * {}], 35 bytes: its ids are 12 hex digits, '@' and the deadline in
 * milliseconds of the wall clock, docs/PROTOCOL.md): what the bare fan-out
 * sends, so that both sides move requests of the same size, and the
 * fixed-reply servers, which answer with the request's id, replies of the
 * same size. */
static const unsigned char stats_req[] = {
    0x93, 0xa5, 's', 't', 'a', 't', 's', 0xba, '0', '0', '0', '0', '0', '0', '0', '0', '0',
    '0', '0', '1', '@', '1', '7', '9', '6', '0', '0', '0', '0', '0', '0', '0', '0', '0',
    0x80};

/* A fan-out side. It holds a socket for each address of its fleet, and a
 * batch goes to `n` of them from `first` on, so a batch of 16 can go to 16
 * units of a fleet of 1024 whose every connection is warm, as well as to a
 * fleet of 16. */
typedef struct fan_ours {
    ctl_client *client;
    const char **addresses;          /* the fleet's */
    storage_stats_outcome *outcomes; /* as many */
    int async; /* storage_stats_many_start and wait, not storage_stats_many */
    int async_failed;
} fan_ours;

static void fan_async_done(void *user, storage_stats_outcome *outcomes, size_t count)
{
    fan_ours *f = user;
    f->async_failed = 0;
    for (size_t i = 0; i < count; i++)
        if (outcomes[i].error.kind != CTL_OK && f->async_failed++ == 0)
            bench_fail("stats_many_start over %zu: %s", count, outcomes[i].error.msg);
}

typedef struct fan_bare {
    void **socks;          /* the fleet's, a DEALER an address */
    zmq_pollitem_t *items; /* as many */
    size_t *which;         /* as many */
} fan_bare;

static int fan_ours_batch(fan_ours *f, size_t first, size_t n)
{
    const char **addresses = f->addresses + first;
    if (f->async) {
        ctl_call *call = NULL;
        f->async_failed = -1;
        if (storage_stats_many_start(f->client, addresses, n, CALL_TIMEOUT_MS,
                                     fan_async_done, f, &call) != 0 ||
            ctl_call_wait(call, -1) != 0 ||
            (!cfg.io_callbacks && ctl_client_process(f->client, 0) != 1)) {
            bench_fail("stats_many_start over %zu: could not start, wait or deliver", n);
            ctl_call_release(call);
            return -1;
        }
        ctl_call_release(call);
        return f->async_failed == 0 ? 0 : -1;
    }
    int failed = storage_stats_many(f->client, addresses, n, CALL_TIMEOUT_MS, f->outcomes);
    if (failed != 0)
        for (size_t i = 0; i < n; i++)
            if (f->outcomes[i].error.kind != CTL_OK) {
                bench_fail("stats_many over %zu units: %d failed, first %s", n, failed,
                     f->outcomes[i].error.msg);
                break;
            }
    storage_stats_outcomes_fini(f->outcomes, n);
    return failed ? -1 : 0;
}

/* Send to every echo socket of the batch, then collect every reply,
 * polling the ones still waiting. */
static int fan_bare_batch(fan_bare *f, size_t first, size_t n)
{
    void **socks = f->socks + first;
    size_t left = n;
    for (size_t i = 0; i < n; i++) {
        if (zmq_send(socks[i], stats_req, sizeof stats_req, 0) < 0) {
            bench_fail("bare fan-out: send to socket %zu: %s", i, zmq_strerror(zmq_errno()));
            return -1;
        }
        f->which[i] = i;
    }
    while (left) {
        for (size_t j = 0; j < left; j++)
            f->items[j] = (zmq_pollitem_t){socks[f->which[j]], 0, ZMQ_POLLIN, 0};
        int rc = zmq_poll(f->items, (int)left, CALL_TIMEOUT_MS);
        if (rc <= 0) {
            bench_fail("bare fan-out over %zu: %s", n,
                 rc == 0 ? "timed out" : zmq_strerror(zmq_errno()));
            return -1;
        }
        size_t kept = 0;
        for (size_t j = 0; j < left; j++) {
            size_t i = f->which[j];
            int got = 0;
            if (f->items[j].revents & ZMQ_POLLIN) {
                zmq_msg_t m;
                zmq_msg_init(&m);
                got = zmq_msg_recv(&m, socks[i], ZMQ_DONTWAIT) >= 0;
                zmq_msg_close(&m);
            }
            if (!got)
                f->which[kept++] = i;
        }
        left = kept;
    }
    return 0;
}

typedef struct fan_side {
    double p50[BENCH_MAX_ROUNDS], p99[BENCH_MAX_ROUNDS], cpu[BENCH_MAX_ROUNDS];
    double rss_kib, fds; /* per address, after the first batch */
} fan_side;

/* This process's CPU time, exactly: the sum of its threads' CPU clocks.
 * CLOCK_PROCESS_CPUTIME_ID is not exact. The kernel adds to it what a
 * thread running on another CPU has run only when that CPU next books it
 * (a tick, a switch), so up to a tick of a busy thread's work (4 ms at
 * 250 Hz) lands after the batch it belongs to, in the next side's. Over a
 * batch of 1024 targets that read about 1.5 us a target off the bare
 * fan-out, whose ZeroMQ I/O thread runs without a break to the end of a
 * batch, and onto the side after it. A thread's own clock is brought up
 * to date when it is read. */
typedef struct proc_clocks {
    clockid_t *others;        /* every other thread's clock */
    size_t n;
    uint64_t *before, *after; /* a reading of each: the others, then this thread */
} proc_clocks;

#define CLOCK_UNREAD UINT64_MAX

/* The CPU clock of thread `tid` of this process, in Linux's encoding of a
 * thread clock (the value pthread_getcpuclockid gives): the threads of
 * ZeroMQ and of the client were not started here, so only their ids are
 * known. */
static clockid_t tid_clock(unsigned tid)
{
    return (clockid_t)((~tid << 3) | 6u);
}

static void proc_clocks_fini(proc_clocks *p)
{
    free(p->others);
    free(p->before);
    free(p->after);
    memset(p, 0, sizeof *p);
}

/* The threads of this process other than the caller, from
 * /proc/self/task: taken once a round, as no thread starts or ends during
 * one (a client's I/O thread and ZeroMQ's start with them). On failure
 * (said) *p holds nothing; otherwise proc_clocks_fini frees it. */
static int proc_clocks_scan(proc_clocks *p)
{
    DIR *d = opendir("/proc/self/task");
    size_t cap = 0;
    struct dirent *e;
    unsigned self = (unsigned)gettid();
    memset(p, 0, sizeof *p);
    if (!d) {
        bench_fail("cannot list this process's threads (/proc/self/task): %s", strerror(errno));
        return -1;
    }
    while ((e = readdir(d)) != NULL) {
        char *end;
        unsigned long tid = strtoul(e->d_name, &end, 10);
        if (e->d_name[0] == '.' || *end || tid == self)
            continue;
        if (p->n == cap) {
            size_t ncap = cap ? 2 * cap : 16;
            clockid_t *grown = realloc(p->others, ncap * sizeof *grown);
            if (!grown) {
                closedir(d);
                proc_clocks_fini(p);
                bench_fail("out of memory");
                return -1;
            }
            p->others = grown;
            cap = ncap;
        }
        p->others[p->n++] = tid_clock((unsigned)tid);
    }
    closedir(d);
    p->before = malloc((p->n + 1) * sizeof *p->before);
    p->after = malloc((p->n + 1) * sizeof *p->after);
    if (!p->before || !p->after) {
        proc_clocks_fini(p);
        bench_fail("out of memory");
        return -1;
    }
    return 0;
}

static uint64_t clock_read_ns(clockid_t c)
{
    struct timespec ts;
    if (clock_gettime(c, &ts) != 0)
        return CLOCK_UNREAD; /* the thread has ended */
    return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

/* Start a window: every thread's clock, this thread's last, so that
 * reading the others is outside it. */
static void proc_clocks_start(proc_clocks *p)
{
    for (size_t i = 0; i < p->n; i++)
        p->before[i] = clock_read_ns(p->others[i]);
    p->before[p->n] = clock_read_ns(CLOCK_THREAD_CPUTIME_ID);
}

/* End the window (this thread's clock first): the process's CPU time in
 * it, in ns. */
static uint64_t proc_clocks_stop(proc_clocks *p)
{
    uint64_t sum = 0;
    p->after[p->n] = clock_read_ns(CLOCK_THREAD_CPUTIME_ID);
    for (size_t i = 0; i < p->n; i++)
        p->after[i] = clock_read_ns(p->others[i]);
    for (size_t i = 0; i <= p->n; i++)
        if (p->before[i] != CLOCK_UNREAD && p->after[i] != CLOCK_UNREAD &&
            p->after[i] >= p->before[i])
            sum += p->after[i] - p->before[i];
    return sum;
}

/* The machine's TCP segments sent so far (Tcp OutSegs in /proc/net/snmp),
 * -1 when it cannot be read. Over loopback that counts every segment once,
 * requests, replies and any acknowledgement sent alone. */
static long long tcp_out_segments(void)
{
    FILE *f = fopen("/proc/net/snmp", "r");
    char names[2048], values[2048];
    long long out = -1;
    while (f && out < 0 && fgets(names, sizeof names, f) && fgets(values, sizeof values, f)) {
        if (strncmp(names, "Tcp:", 4) != 0 || strncmp(values, "Tcp:", 4) != 0)
            continue;
        char *sn, *sv;
        char *name = strtok_r(names, " \n", &sn), *value = strtok_r(values, " \n", &sv);
        for (; name && value; name = strtok_r(NULL, " \n", &sn), value = strtok_r(NULL, " \n", &sv))
            if (strcmp(name, "OutSegs") == 0) {
                out = strtoll(value, NULL, 10);
                break;
            }
    }
    if (f)
        fclose(f);
    return out;
}

/* The order of the three sides (0 blocking, 1 asynchronous, 2 bare) in six
 * turns: each side goes first, second and third equally often, and
 * follows each other side equally often (a Williams design), so that what
 * a batch leaves behind (its frees, the kernel's work for its connections)
 * weighs on every side alike. A plain rotation (0 1 2, 1 2 0, 2 0 1) puts
 * the blocking side after the bare one two times in three. */
static const int fan_order[6][3] = {{0, 1, 2}, {1, 2, 0}, {2, 0, 1},
                                    {0, 2, 1}, {2, 1, 0}, {1, 0, 2}};

/* One round: `batches` batches of `n` targets for each side, interleaved
 * batch by batch (in the turns of fan_order), so that all three meet the
 * same moments of a noisy machine; each side's batches go round its
 * `fleet` addresses (n divides fleet). Each batch timed, and this
 * process's CPU during each side's batches booked to that side, per
 * target. The TCP segments the machine sent are counted over the round,
 * the three sides together (*segs, a target; < 0 unknown): reading them
 * takes about 20 us, which between batches would change what it
 * measures. */
static int fan_round(fan_ours *o, fan_ours *a, fan_bare *b, size_t n, size_t fleet,
                     size_t batches, int r, fan_side *sides[3], double *segs)
{
    uint64_t *lat[3] = {malloc(batches * sizeof(uint64_t)),
                        malloc(batches * sizeof(uint64_t)),
                        malloc(batches * sizeof(uint64_t))};
    uint64_t cpu[3] = {0, 0, 0};
    size_t next[3] = {0, 0, 0}; /* where each side's next batch starts */
    long long seg0 = tcp_out_segments();
    int rc = -1;
    proc_clocks pc = {0};
    if (!lat[0] || !lat[1] || !lat[2]) {
        bench_fail("out of memory");
        goto out;
    }
    if (proc_clocks_scan(&pc) != 0)
        goto out;
    for (size_t i = 0; i < batches; i++)
        for (int k = 0; k < 3; k++) {
            int side = fan_order[i % 6][k];
            size_t first = next[side];
            next[side] = (first + n) % fleet;
            proc_clocks_start(&pc);
            uint64_t t0 = now_ns();
            if ((side == 2 ? fan_bare_batch(b, first, n)
                           : fan_ours_batch(side == 1 ? a : o, first, n)) != 0)
                goto out;
            lat[side][i] = now_ns() - t0;
            cpu[side] += proc_clocks_stop(&pc);
        }
    long long seg1 = tcp_out_segments();
    double targets = (double)(batches * n);
    *segs = seg0 >= 0 && seg1 >= seg0 ? (double)(seg1 - seg0) / (3 * targets) : -1;
    for (int side = 0; side < 3; side++) {
        sides[side]->cpu[r] = (double)cpu[side] / 1e3 / targets;
        sides[side]->p50[r] = pct_us(lat[side], batches, 50);
        sides[side]->p99[r] = pct_us(lat[side], batches, 99);
    }
    rc = 0;
out:
    for (int side = 0; side < 3; side++)
        free(lat[side]);
    proc_clocks_fini(&pc);
    return rc;
}

typedef struct fan_size {
    size_t n, fleet;
    fan_side ours, async, bare;
    double segs[BENCH_MAX_ROUNDS]; /* TCP segments a target, < 0 unknown */
    double idle_ms_per_s;          /* this process's CPU while both clients idle */
} fan_size;

/* Open files and resident KiB of this process, after giving freed heap
 * back. */
static void self_usage(int *fds, size_t *rss)
{
    malloc_trim(0);
    *fds = up_count_fds(0);
    *rss = up_rss_kib(0);
}

/* This process's CPU time over `ms` milliseconds of sleep, in ms a
 * second: what the idle clients' upkeep costs. */
static double idle_cpu_ms_per_s(int ms)
{
    proc_clocks pc;
    if (proc_clocks_scan(&pc) != 0)
        return -1;
    struct timespec idle = {ms / 1000, (ms % 1000) * 1000000L};
    proc_clocks_start(&pc);
    uint64_t t0 = now_ns();
    nanosleep(&idle, NULL);
    double elapsed_s = (double)(now_ns() - t0) / 1e9;
    double out = (double)proc_clocks_stop(&pc) / 1e6 / elapsed_s;
    proc_clocks_fini(&pc);
    return out;
}

/* One fan-out size: batches of `n` targets, each to the next n of a fleet
 * of `fleet` servers (n divides fleet); files and memory per address, then
 * `rounds` rounds. */
static int fan_one_size(const hosts *units, const hosts *echos, size_t n, size_t fleet,
                        int rounds, fan_size *out)
{
    size_t batches = (cfg.quick ? 2000 : 50000) / n;
    void *octx = NULL, *bctx = NULL;
    fan_ours o = {0}, a = {0};
    fan_bare b = {0};
    ctl_client_options co;
    ctl_error err;
    int rc = -1, fd0, fd1;
    size_t rss0, rss1;
    if (batches < (cfg.quick ? 10u : 30u))
        batches = cfg.quick ? 10 : 30;
    memset(out, 0, sizeof *out);
    out->n = n;
    out->fleet = fleet;
    ctl_error_init(&err);
    o.addresses = calloc(fleet, sizeof *o.addresses);
    o.outcomes = calloc(fleet, sizeof *o.outcomes);
    b.socks = calloc(fleet, sizeof *b.socks);
    b.items = calloc(fleet, sizeof *b.items);
    b.which = calloc(fleet, sizeof *b.which);
    if (!o.addresses || !o.outcomes || !b.socks || !b.items || !b.which) {
        bench_fail("out of memory");
        goto out;
    }
    for (size_t i = 0; i < fleet; i++)
        o.addresses[i] = units->endpoints[i];
    a = o;
    a.async = 1;
    a.outcomes = NULL;

    /* ctlrpc: a fresh context and client; files and memory per address
     * from before the first batch (to the whole fleet) to after it. The
     * context holds both clients, blocking and asynchronous: each has
     * three ZeroMQ sockets an address (the DEALER, its monitor and the
     * monitor's reader), and room for the sockets retired along the way. */
    octx = scale_ctx(8 * fleet + 256);
    ctl_client_options_init(&co);
    co.zmq_context = octx;
    if (!octx || ctl_client_new(&co, &o.client, &err) != 0) {
        bench_fail("fan-out client: %s", octx ? err.msg : "no ZeroMQ context");
        goto out;
    }
    self_usage(&fd0, &rss0);
    if (fan_ours_batch(&o, 0, fleet) != 0)
        goto out;
    self_usage(&fd1, &rss1);
    out->ours.fds = (double)(fd1 - fd0) / (double)fleet;
    out->ours.rss_kib = ((double)rss1 - (double)rss0) / (double)fleet;
    /* The asynchronous side: its own client. With queued completions (the
     * default) the thread that waits drives the engine and then runs the
     * callback (ctl_client_process); --io-callbacks: the I/O thread drives
     * and runs it. */
    co.callbacks_on_io_thread = cfg.io_callbacks;
    if (ctl_client_new(&co, &a.client, &err) != 0) {
        bench_fail("fan-out async client: %s", err.msg);
        goto out;
    }

    /* Bare: a DEALER per address, likewise. */
    bctx = scale_ctx(2 * fleet + 256);
    if (!bctx) {
        bench_fail("bare fan-out: no ZeroMQ context");
        goto out;
    }
    self_usage(&fd0, &rss0);
    for (size_t i = 0; i < fleet; i++) {
        int zero = 0;
        b.socks[i] = zmq_socket(bctx, ZMQ_DEALER);
        if (!b.socks[i] || zmq_setsockopt(b.socks[i], ZMQ_LINGER, &zero, sizeof zero) != 0 ||
            zmq_connect(b.socks[i], echos->endpoints[i]) != 0) {
            bench_fail("bare fan-out: DEALER %zu of %zu to %s: %s", i + 1, fleet,
                 echos->endpoints[i], zmq_strerror(zmq_errno()));
            goto out;
        }
    }
    if (fan_bare_batch(&b, 0, fleet) != 0)
        goto out;
    self_usage(&fd1, &rss1);
    out->bare.fds = (double)(fd1 - fd0) / (double)fleet;
    out->bare.rss_kib = ((double)rss1 - (double)rss0) / (double)fleet;

    /* Warm every connection of all three, then the rounds. */
    for (size_t i = 0; i < 3; i++)
        if (fan_ours_batch(&o, 0, fleet) != 0 || fan_ours_batch(&a, 0, fleet) != 0 ||
            fan_bare_batch(&b, 0, fleet) != 0)
            goto out;
    for (int r = 0; r < rounds; r++) {
        fan_side *sides[3] = {&out->ours, &out->async, &out->bare};
        if (fan_round(&o, &a, &b, n, fleet, batches, r, sides, &out->segs[r]) != 0)
            goto out;
        bench_progress("fan-out to %zu of %zu: round %d/%d: batch p50 %.0f / %.0f (async) vs "
                 "%.0f us, CPU %.1f / %.1f vs %.1f us/target, %.2f TCP segments a target", n,
                 fleet, r + 1, cfg.rounds, out->ours.p50[r], out->async.p50[r],
                 out->bare.p50[r], out->ours.cpu[r], out->async.cpu[r], out->bare.cpu[r],
                 out->segs[r]);
    }
    /* Both clients idle, each holding a pooled socket an address: what
     * their upkeep costs (the bare DEALERs cost nothing idle). */
    if (rounds > 0 && (out->idle_ms_per_s = idle_cpu_ms_per_s(IDLE_MEASURE_MS)) < 0)
        goto out;
    rc = 0;
out:
    ctl_client_destroy(&a.client);
    ctl_client_destroy(&o.client);
    if (octx)
        zmq_ctx_term(octx);
    for (size_t i = 0; b.socks && i < fleet; i++)
        if (b.socks[i])
            zmq_close(b.socks[i]);
    if (bctx)
        zmq_ctx_term(bctx);
    free(o.addresses);
    free(o.outcomes);
    free(b.socks);
    free(b.items);
    free(b.which);
    ctl_error_fini(&err);
    return rc;
}

/* The TCP segments a target, the median over the rounds, or "n/a". */
static const char *fan_segs(const fan_size *s, int R, char *buf, size_t len)
{
    double m = bench_median(s->segs, R);
    if (m < 0)
        snprintf(buf, len, "n/a");
    else
        snprintf(buf, len, "%.2f", m);
    return buf;
}

/* Each side's CPU per target at each size against its own at the first:
 * whether the work per target grows with the batch. */
static void fan_print_growth(const fan_size *res, int done, int R, const char *what)
{
    printf("\n| %s | CPU per target vs %zu: blocking | async | bare |\n|---:|---:|---:|---:|\n",
           what, res[0].n);
    for (int k = 0; k < done; k++) {
        const fan_size *s = &res[k];
        printf("| %zu | %.3fx | %.3fx | %.3fx |\n", s->n,
               bench_median(s->ours.cpu, R) / bench_median(res[0].ours.cpu, R),
               bench_median(s->async.cpu, R) / bench_median(res[0].async.cpu, R),
               bench_median(s->bare.cpu, R) / bench_median(res[0].bare.cpu, R));
    }
}

/* Batch latency and CPU per target of the three sides, and their ratios. */
static void fan_print_sides(const fan_size *res, int done, int R, const char *what)
{
    char segs[64];
    printf("| %s | batch p50 us | async p50 us | bare p50 us | ratio | async ratio "
           "| batch p99 us | async p99 us | bare p99 us | p50 per target us | bare per target us "
           "|\n|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|\n", what);
    for (int k = 0; k < done; k++) {
        const fan_size *s = &res[k];
        double p50o = bench_median(s->ours.p50, R), p50b = bench_median(s->bare.p50, R);
        printf("| %zu | %.0f | %.0f | %.0f | %.3fx | %.3fx | %.0f | %.0f | %.0f | %.2f | %.2f |\n",
               s->n, p50o, bench_median(s->async.p50, R), p50b,
               median_ratio(s->ours.p50, s->bare.p50, R),
               median_ratio(s->async.p50, s->bare.p50, R), bench_median(s->ours.p99, R),
               bench_median(s->async.p99, R), bench_median(s->bare.p99, R),
               p50o / (double)s->n, p50b / (double)s->n);
    }
    printf("\n| %s | client CPU us/target | async us/target | bare us/target | ratio "
           "| async ratio | TCP segments/target |\n"
           "|---:|---:|---:|---:|---:|---:|---:|\n", what);
    for (int k = 0; k < done; k++) {
        const fan_size *s = &res[k];
        printf("| %zu | %.2f | %.2f | %.2f | %.3fx | %.3fx | %s |\n", s->n,
               bench_median(s->ours.cpu, R), bench_median(s->async.cpu, R),
               bench_median(s->bare.cpu, R), median_ratio(s->ours.cpu, s->bare.cpu, R),
               median_ratio(s->async.cpu, s->bare.cpu, R), fan_segs(s, R, segs, sizeof segs));
    }
}

static int case_fanout(void)
{
    static const size_t full[] = {16, 64, 256, 1024}, quick[] = {16, 64};
    const size_t *sizes = cfg.quick ? quick : full;
    size_t n_sizes = cfg.quick ? 2 : 4, max = sizes[n_sizes - 1];
    fan_size res[4], in_fleet[4];
    hosts units, echos;
    int rc = -1, done = 0, done_fleet = 0;
    memset(&units, 0, sizeof units);
    memset(&echos, 0, sizeof echos);
    bench_progress("fan-out: starting %zu fixed-reply servers, %d to a process", max, PER_HOST);
    /* One set of servers for every side. */
    if (hosts_start(&echos, "fixed", max) != 0)
        goto out;
    units = echos;
    /* Once, unmeasured: what the first client and context of a process
     * allocate for good (an arena for the I/O thread, ...) would otherwise
     * be booked to the first size's addresses. */
    if (fan_one_size(&units, &echos, sizes[0], sizes[0], 0, &res[0]) != 0)
        goto out;
    /* A fleet as large as the batch: 16 units, then 64, ... */
    for (size_t k = 0; k < n_sizes; k++, done++)
        if (fan_one_size(&units, &echos, sizes[k], sizes[k], cfg.rounds, &res[k]) != 0)
            goto out;
    /* Batches of 16, 64, ... to one fleet of the largest size, every
     * connection warm: the work per target against the batch alone, the
     * number of connections and the time between two batches to one unit
     * the same at every size. The largest batch is the run above. */
    for (size_t k = 0; k + 1 < n_sizes; k++, done_fleet++)
        if (fan_one_size(&units, &echos, sizes[k], max, cfg.rounds, &in_fleet[k]) != 0)
            goto out;
    in_fleet[done_fleet++] = res[n_sizes - 1];
    rc = 0;
out:
    hosts_stop(&echos);
    if (done == 0)
        return rc;
    int R = cfg.rounds;
    printf("\n## fanout: storage_stats_many (blocking) and storage_stats_many_start "
           "(asynchronous) vs the bare fan-out (send all, collect all), all to the same "
           "fixed-reply servers\n\n");
    fan_print_sides(res, done, R, "servers");
    printf("\n| servers | RSS KiB/address | bare KiB/address | open files/address "
           "| bare files/address | idle CPU ms/s |\n|---:|---:|---:|---:|---:|---:|\n");
    for (int k = 0; k < done; k++) {
        fan_size *s = &res[k];
        printf("| %zu | %.1f | %.1f | %.2f | %.2f | %.2f |\n", s->n, s->ours.rss_kib,
               s->bare.rss_kib, s->ours.fds, s->bare.fds, s->idle_ms_per_s);
    }
    fan_print_growth(res, done, R, "servers");
    printf("\n(per target = batch p50 / units; the three sides take turns batch by batch; "
           "CPU = this process's CPU time during a side's batches / targets, the sum of its "
           "threads' clocks; TCP segments = the machine's (/proc/net/snmp) over each round, "
           "the three sides together; RSS and files: a "
           "fresh client and context per size, before and after its first batch; idle CPU = "
           "this process's CPU time a second over %d ms after the rounds, both clients idle "
           "with their sockets pooled; CPU vs %zu: the medians' ratio)\n",
           IDLE_MEASURE_MS, res[0].n);
    if (done_fleet == (int)n_sizes) {
        printf("\n## fanout within one fleet: batches of %zu to %zu of the same %zu servers, "
               "each batch to the next ones, every connection warm\n\n", sizes[0], max, max);
        fan_print_sides(in_fleet, done_fleet, R, "batch");
        fan_print_growth(in_fleet, done_fleet, R, "batch");
        printf("\n(as above, but each side holds a connection to every one of the %zu servers "
               "at every size, and its batches go round them: the number of connections and "
               "the time between two requests to one server do not change with the batch, "
               "so the CPU per target against the batch is the client's work per reply; the "
               "%zu row is the run above)\n", max, max);
    }
    fflush(stdout);
    return rc;
}

/* ---- case: blobs held --------------------------------------------------- */

enum { H_PUT, H_GET, H_DESCRIBE, H_OPS };
static const char *const held_op_names[H_OPS] = {"put", "get", "describe"};

typedef struct held_level {
    size_t blobs;
    double p50[H_OPS], p99[H_OPS];
    double stats_us, list_few_us, list_page_us;
    double rss_b_per_blob;
    double fill_s;
} held_level;

static uint64_t xorshift(uint64_t *x)
{
    *x ^= *x << 13;
    *x ^= *x >> 7;
    *x ^= *x << 17;
    return *x;
}

/* Fill the store to `level` blobs of 8 bytes, through its API under the
 * unit's lock. */
static int held_fill(storage_unit *su, size_t *have, size_t level)
{
    ctl_error err;
    char key[32];
    int rc = 0;
    ctl_error_init(&err);
    pthread_mutex_lock(&su->lock);
    for (size_t i = *have; i < level && rc == 0; i++) {
        int len = snprintf(key, sizeof key, HELD_KEY_FMT, i);
        rc = store_put(su->store, (ctl_str){key, (size_t)len}, ctl_str_c("8 bytes!"), NULL,
                       false, NULL, &err);
        if (rc == 0)
            *have = i + 1;
    }
    pthread_mutex_unlock(&su->lock);
    if (rc != 0)
        bench_fail("filling the store at %zu blobs: %s", *have, err.msg ? err.msg : "failed");
    ctl_error_fini(&err);
    return rc ? -1 : 0;
}

static int held_call(ctl_client *c, const char *addr, int op, const char *key)
{
    ctl_str k = ctl_str_c(key);
    ctl_reply *reply = NULL;
    ctl_error err;
    int rc;
    ctl_error_init(&err);
    if (op == H_PUT) {
        storage_put_args a;
        uint64_t stored = 0;
        storage_put_args_init(&a);
        a.key = k;
        a.data = ctl_str_c("8 bytes?");
        rc = storage_put(c, addr, &a, CALL_TIMEOUT_MS, &stored, &err);
    } else if (op == H_GET) {
        storage_get_args a;
        storage_list_bin res;
        storage_get_args_init(&a);
        a.keys = (storage_list_str){.items = &k, .count = 1};
        rc = storage_get(c, addr, &a, CALL_TIMEOUT_MS, &res, &reply, &err);
        if (rc == 0 && (res.count != 1 || res.items[0].len != 8))
            rc = ctl_error_set(&err, CTL_PROTOCOL, "get: wrong result");
    } else {
        storage_describe_args a;
        storage_list_BlobInfo res;
        storage_describe_args_init(&a);
        a.keys = (storage_list_str){.items = &k, .count = 1};
        rc = storage_describe(c, addr, &a, CALL_TIMEOUT_MS, &res, &reply, &err);
        if (rc == 0 && (res.count != 1 || res.items[0].size != 8))
            rc = ctl_error_set(&err, CTL_PROTOCOL, "describe: wrong result");
    }
    if (rc != 0)
        bench_fail("%s of %s at %s: %s", held_op_names[op], key, addr, err.msg ? err.msg : "failed");
    ctl_reply_destroy(&reply);
    ctl_error_fini(&err);
    return rc ? -1 : 0;
}

/* One list call: `prefix` and `limit`; checks the count if `want` >= 0. */
static int held_list(ctl_client *c, const char *addr, const char *prefix, uint32_t limit,
                     long want)
{
    storage_list_args a;
    storage_list_str res;
    ctl_reply *reply = NULL;
    ctl_error err;
    ctl_error_init(&err);
    storage_list_args_init(&a);
    a.prefix = ctl_str_c(prefix);
    a.limit = limit;
    int rc = storage_list(c, addr, &a, LIST_TIMEOUT_MS, &res, &reply, &err);
    if (rc == 0 && want >= 0 && res.count != (size_t)want)
        rc = ctl_error_set(&err, CTL_PROTOCOL, "%zu keys, not %ld", res.count, want);
    if (rc != 0)
        bench_fail("list (prefix '%s', limit %u) at %s: %s", prefix, (unsigned)limit, addr,
             err.msg ? err.msg : "failed");
    ctl_reply_destroy(&reply);
    ctl_error_fini(&err);
    return rc ? -1 : 0;
}

static int held_stats(ctl_client *c, const char *addr, uint64_t *blobs)
{
    storage_UnitStats res;
    ctl_reply *reply = NULL;
    ctl_error err;
    ctl_error_init(&err);
    int rc = storage_stats(c, addr, CALL_TIMEOUT_MS, &res, &reply, &err);
    if (rc != 0)
        bench_fail("stats at %s: %s", addr, err.msg ? err.msg : "failed");
    else if (blobs)
        *blobs = res.blobs;
    ctl_reply_destroy(&reply);
    ctl_error_fini(&err);
    return rc ? -1 : 0;
}

/* The p50 of calls of `what` repeated for at least `min` times and about
 * `budget_s` seconds (at most 1000 times), in us. */
typedef int (*held_fn)(ctl_client *, const char *, int);

static int held_stats_fn(ctl_client *c, const char *addr, int arg)
{
    (void)arg;
    return held_stats(c, addr, NULL);
}

static int held_list_fn(ctl_client *c, const char *addr, int few)
{
    return few ? held_list(c, addr, "few-", 1000, HELD_FEW) : held_list(c, addr, "", 1000, 1000);
}

static int held_repeat(held_fn fn, ctl_client *c, const char *addr, int arg, int min,
                       double budget_s, double *p50)
{
    uint64_t lat[1000];
    size_t n = 0;
    double t0 = now_s();
    while (n < sizeof lat / sizeof lat[0] && (n < (size_t)min || now_s() - t0 < budget_s)) {
        uint64_t a = now_ns();
        if (fn(c, addr, arg) != 0)
            return -1;
        lat[n++] = now_ns() - a;
    }
    *p50 = pct_us(lat, n, 50);
    return 0;
}

static int held_measure(ctl_client *c, const char *addr, held_level *lv, size_t rss0_kib)
{
    size_t calls = cfg.quick ? 300 : 3000;
    double p50[H_OPS][BENCH_MAX_ROUNDS], p99[H_OPS][BENCH_MAX_ROUNDS];
    uint64_t *lat = malloc(calls * sizeof *lat);
    uint64_t x = 0x9e3779b97f4a7c15u ^ lv->blobs, blobs = 0;
    char key[32];
    if (!lat) {
        bench_fail("out of memory");
        return -1;
    }
    for (int op = 0; op < H_OPS; op++) /* warm */
        for (int i = 0; i < 20; i++) {
            snprintf(key, sizeof key, HELD_KEY_FMT, (size_t)(xorshift(&x) % lv->blobs));
            if (held_call(c, addr, op, key) != 0)
                goto fail;
        }
    for (int r = 0; r < cfg.rounds; r++) {
        for (int k = 0; k < H_OPS; k++) {
            int op = (r + k) % H_OPS; /* who goes first rotates */
            for (size_t i = 0; i < calls; i++) {
                snprintf(key, sizeof key, HELD_KEY_FMT, (size_t)(xorshift(&x) % lv->blobs));
                uint64_t t0 = now_ns();
                if (held_call(c, addr, op, key) != 0)
                    goto fail;
                lat[i] = now_ns() - t0;
            }
            p50[op][r] = pct_us(lat, calls, 50);
            p99[op][r] = pct_us(lat, calls, 99);
        }
    }
    for (int op = 0; op < H_OPS; op++) {
        lv->p50[op] = bench_median(p50[op], cfg.rounds);
        lv->p99[op] = bench_median(p99[op], cfg.rounds);
    }
    free(lat);
    lat = NULL;
    if (held_repeat(held_stats_fn, c, addr, 0, 50, 0.5, &lv->stats_us) != 0 ||
        held_repeat(held_list_fn, c, addr, 1, 3, 2.0, &lv->list_few_us) != 0 ||
        held_repeat(held_list_fn, c, addr, 0, 3, 2.0, &lv->list_page_us) != 0 ||
        held_stats(c, addr, &blobs) != 0)
        goto fail;
    if (blobs != lv->blobs + HELD_FEW) {
        bench_fail("held: the unit reports %" PRIu64 " blobs, not %zu", blobs, lv->blobs + HELD_FEW);
        goto fail;
    }
    malloc_trim(0);
    lv->rss_b_per_blob = ((double)up_rss_kib(0) - (double)rss0_kib) * 1024.0 /
                         (double)lv->blobs;
    return 0;
fail:
    free(lat);
    return -1;
}

static int case_held(void)
{
    static const size_t full[] = {10000, 1000000, 10000000}, quick[] = {10000, 100000};
    const size_t *levels = cfg.quick ? quick : full;
    size_t n_levels = cfg.quick ? 2 : 3;
    held_level lv[3];
    bench_unit *unit = NULL;
    ctl_client *client = NULL;
    ctl_error err;
    char why[256];
    size_t have = 0;
    int done = 0, rc = -1;
    ctl_error_init(&err);
    memset(lv, 0, sizeof lv);
    /* 10 million blobs take about 2.1 GB here (node with its table and
     * tree links, key, bytes, table); a list gathers one page. */
    if (!cfg.quick && mem_available_kib() < ((uint64_t)6 << 20)) {
        bench_progress("held: less than 6 GiB available; stopping at 1 million blobs");
        n_levels = 2;
    }
    malloc_trim(0);
    size_t rss0 = up_rss_kib(0);
    if (bench_unit_start((uint64_t)1 << 30, &unit, why, sizeof why) != 0) {
        bench_fail("held: %s", why);
        goto out;
    }
    storage_unit *su = bench_unit_storage(unit);
    const char *addr = bench_unit_endpoint(unit);
    pthread_mutex_lock(&su->lock);
    /* Nothing refused: keys and bookkeeping may take what they need. */
    store_set_limits(su->store, 0, (uint64_t)1 << 40, 0);
    for (int i = 0; i < HELD_FEW; i++) {
        char key[16];
        int len = snprintf(key, sizeof key, "few-%d", i);
        store_put(su->store, (ctl_str){key, (size_t)len}, ctl_str_c("8 bytes!"), NULL, false,
                  NULL, &err);
    }
    pthread_mutex_unlock(&su->lock);
    if (ctl_client_new(NULL, &client, &err) != 0) {
        bench_fail("held: client: %s", err.msg);
        goto out;
    }
    for (size_t k = 0; k < n_levels; k++) {
        double t0 = now_s();
        lv[k].blobs = levels[k];
        bench_progress("held: filling to %zu blobs", levels[k]);
        if (held_fill(su, &have, levels[k]) != 0)
            goto out;
        lv[k].fill_s = now_s() - t0;
        bench_progress("held: %zu blobs (filled in %.1f s); measuring", levels[k], lv[k].fill_s);
        if (held_measure(client, addr, &lv[k], rss0) != 0)
            goto out;
        done++;
    }
    rc = 0;
out:
    ctl_client_destroy(&client);
    bench_unit_stop(&unit);
    ctl_error_fini(&err);
    malloc_trim(0);
    if (done == 0)
        return rc;
    printf("\n## held: one unit holding many 8-byte blobs (latency in us; ratio = this level / "
           "%zu blobs)\n\n", lv[0].blobs);
    printf("| blobs | put p50 | put p99 | get p50 | get p99 | describe p50 | describe p99 "
           "| stats | list prefix (10 keys) | list page of 1000 | RSS B/blob | fill s |\n"
           "|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|\n");
    for (int k = 0; k < done; k++)
        printf("| %zu | %.1f | %.1f | %.1f | %.1f | %.1f | %.1f | %.1f | %.0f | %.0f | %.0f | "
               "%.1f |\n", lv[k].blobs, lv[k].p50[H_PUT], lv[k].p99[H_PUT], lv[k].p50[H_GET],
               lv[k].p99[H_GET], lv[k].p50[H_DESCRIBE], lv[k].p99[H_DESCRIBE], lv[k].stats_us,
               lv[k].list_few_us, lv[k].list_page_us, lv[k].rss_b_per_blob, lv[k].fill_s);
    for (int k = 1; k < done; k++)
        printf("| ratio %zu | %.2fx | %.2fx | %.2fx | %.2fx | %.2fx | %.2fx | %.2fx | %.2fx | "
               "%.2fx | | |\n", lv[k].blobs, lv[k].p50[H_PUT] / lv[0].p50[H_PUT],
               lv[k].p99[H_PUT] / lv[0].p99[H_PUT], lv[k].p50[H_GET] / lv[0].p50[H_GET],
               lv[k].p99[H_GET] / lv[0].p99[H_GET],
               lv[k].p50[H_DESCRIBE] / lv[0].p50[H_DESCRIBE],
               lv[k].p99[H_DESCRIBE] / lv[0].p99[H_DESCRIBE], lv[k].stats_us / lv[0].stats_us,
               lv[k].list_few_us / lv[0].list_few_us, lv[k].list_page_us / lv[0].list_page_us);
    printf("\n(put overwrites a random existing key; get and describe read one; the store is "
           "filled through its API in this process, under the unit's lock)\n");
    fflush(stdout);
    return rc;
}

/* ---- case: many clients ------------------------------------------------- */

static int case_clients(void)
{
    int total = cfg.quick ? 200 : 5000, calls = 4;
    int per = cfg.quick ? 100 : CLIENTS_PER_HOST;
    int nk = (total + per - 1) / per;
    up_unit unit = {0};
    kid *kids = calloc((size_t)nk, sizeof *kids);
    ctl_client *client = NULL;
    ctl_error err;
    struct rlimit rl;
    int rc = -1, started = 0, ok = 0, failed = 0;
    double p50s[64], p99 = 0, max = 0, elapsed = 0;
    unsigned long long unit_nofile = 0;
    int fd0 = 0, fd1 = 0, fd2 = 0;
    size_t rss0 = 0, rss1 = 0, rss2 = 0;
    uint64_t requests0 = 0;
    long long overflows0 = -1, overflows = -1;
    ctl_error_init(&err);
    unit.pid = 0;
    unit.out_fd = -1;
    if (!kids || nk > 64) {
        bench_fail("clients: out of memory");
        goto out;
    }
    /* Start the unit with the usual soft limit of 1024 open files: it must
     * raise its own to serve thousands of connections. */
    getrlimit(RLIMIT_NOFILE, &rl);
    struct rlimit low = rl;
    if (low.rlim_cur > 1024)
        low.rlim_cur = 1024;
    setrlimit(RLIMIT_NOFILE, &low);
    int up = up_start(&unit, CTL_SCALE_UNIT, NULL, NULL, 20000);
    setrlimit(RLIMIT_NOFILE, &rl);
    if (up != 0) {
        bench_fail("clients: cannot start %s", CTL_SCALE_UNIT);
        goto out;
    }
    unit_nofile = proc_nofile(unit.pid);
    if (ctl_client_new(NULL, &client, &err) != 0) {
        bench_fail("clients: client: %s", err.msg);
        goto out;
    }
    {
        storage_put_args a;
        uint64_t stored;
        storage_put_args_init(&a);
        a.key = crowd_keys[0];
        a.data = ctl_str_c("0123456789");
        if (storage_put(client, unit.endpoint, &a, CALL_TIMEOUT_MS, &stored, &err) != 0 ||
            held_stats(client, unit.endpoint, NULL) != 0) {
            bench_fail("clients: put at %s: %s", unit.endpoint, err.msg ? err.msg : "failed");
            goto out;
        }
    }
    {
        storage_UnitStats st;
        ctl_reply *reply = NULL;
        if (storage_stats(client, unit.endpoint, CALL_TIMEOUT_MS, &st, &reply, &err) == 0)
            requests0 = st.requests;
        ctl_reply_destroy(&reply);
    }
    fd0 = up_count_fds(unit.pid);
    rss0 = up_rss_kib(unit.pid);
    bench_progress("clients: %d clients in %d processes against %s (pid %d, open-file limit %llu)",
             total, nk, unit.endpoint, (int)unit.pid, unit_nofile);
    for (int i = 0; i < nk; i++) {
        char count[16], ncalls[16];
        int here = total - i * per < per ? total - i * per : per;
        snprintf(count, sizeof count, "%d", here);
        snprintf(ncalls, sizeof ncalls, "%d", calls);
        char *argv[] = {cfg.self, (char *)"--clients-host", count, unit.endpoint, ncalls, NULL};
        if (kid_start(&kids[i], argv) != 0) {
            bench_fail("clients: cannot start a clients host: %s", strerror(errno));
            goto out;
        }
        started++;
    }
    for (int i = 0; i < nk; i++) {
        char line[128];
        if (kid_line(&kids[i], line, sizeof line, 120000) != 0 || strcmp(line, "ready") != 0) {
            bench_fail("clients: clients host %d did not get ready", i + 1);
            goto out;
        }
    }
    overflows0 = listen_overflows();
    double t0 = now_s();
    for (int i = 0; i < nk; i++)
        kid_say(&kids[i], "go\n");
    for (int i = 0; i < nk; i++) {
        char line[128];
        int o = 0, f = 0;
        double a = 0, b = 0, c = 0;
        if (kid_line(&kids[i], line, sizeof line, 300000) != 0 ||
            sscanf(line, "done %d %d %lf %lf %lf", &o, &f, &a, &b, &c) != 5) {
            bench_fail("clients: clients host %d did not report", i + 1);
            goto out;
        }
        ok += o;
        failed += f;
        p50s[i] = a;
        p99 = b > p99 ? b : p99;
        max = c > max ? c : max;
    }
    elapsed = now_s() - t0;
    if (overflows0 >= 0 && listen_overflows() >= 0)
        overflows = listen_overflows() - overflows0;
    fd1 = up_count_fds(unit.pid);
    rss1 = up_rss_kib(unit.pid);
    for (int i = 0; i < nk; i++)
        if (kid_stop(&kids[i], 60000) > 1)
            bench_fail("clients: clients host %d did not exit cleanly", i + 1);
    started = 0;
    /* The connections close: the unit's files go back down. */
    for (int i = 0; i < 500 && (fd2 = up_count_fds(unit.pid)) > fd0 + 1; i++) {
        struct timespec ts = {0, 10000000};
        nanosleep(&ts, NULL);
    }
    rss2 = up_rss_kib(unit.pid);
    {
        storage_UnitStats st;
        ctl_reply *reply = NULL;
        if (storage_stats(client, unit.endpoint, CALL_TIMEOUT_MS, &st, &reply, &err) != 0) {
            bench_fail("clients: stats at the end: %s", err.msg);
        } else if (st.requests - requests0 < (uint64_t)total * (uint64_t)calls) {
            bench_fail("clients: the unit counted %" PRIu64 " requests, fewer than %d",
                 st.requests - requests0, total * calls);
        }
        ctl_reply_destroy(&reply);
    }
    if (ok != total * calls || failed)
        bench_fail("clients: %d of %d calls answered, %d failed", ok, total * calls, failed);
    else
        rc = 0;
out:
    for (int i = 0; i < started; i++)
        kid_stop(&kids[i], 10000);
    ctl_client_destroy(&client);
    if (unit.pid > 0 && up_stop(&unit, 20000) != 0)
        bench_fail("clients: %s did not stop cleanly", CTL_SCALE_UNIT);
    ctl_error_fini(&err);
    free(kids);
    if (fd1 == 0)
        return -1;
    printf("\n## clients: %d clients (one thread and one ctl_client each, %d processes) "
           "connecting at once to one ctl-storage-unit, %d calls each\n\n", total, nk, calls);
    printf("| calls answered | wall s | call p50 us | call p99 us | call max us | listen "
           "overflows | unit open-file limit |\n|---:|---:|---:|---:|---:|---:|---:|\n");
    printf("| %d of %d | %.2f | %.0f | %.0f | %.0f | %lld | %llu (started with 1024) |\n\n",
           ok, total * calls, elapsed, bench_median(p50s, nk), p99, max, overflows, unit_nofile);
    printf("| unit | before | all connected | after they left | per connection |\n"
           "|---|---:|---:|---:|---:|\n");
    printf("| open files | %d | %d | %d | %.2f |\n", fd0, fd1, fd2,
           (double)(fd1 - fd0) / (double)total);
    printf("| RSS KiB | %zu | %zu | %zu | %.1f |\n", rss0, rss1, rss2,
           ((double)rss1 - (double)rss0) / (double)total);
    printf("\n(p50: the median of the processes' p50s; p99 and max: the largest; the first "
           "call of each client includes its connection; listen overflows: TcpExt "
           "ListenOverflows of /proc/net/netstat over the calls, machine-wide)\n");
    fflush(stdout);
    return rc;
}

/* ---- case: blobs (ctl-bench's) ------------------------------------------ */

static int case_blobs(void)
{
    char rounds[16];
    pid_t pid;
    int status = 0;
    snprintf(rounds, sizeof rounds, "%d", cfg.rounds);
    char *argv[] = {(char *)CTL_SCALE_BENCH, (char *)"--case", (char *)"blobs",
                    (char *)"--blob-sizes",
                    (char *)(cfg.quick ? "64K,256K,1M" : "64K,1M,8M,64M"),
                    (char *)"--rounds", rounds, cfg.quick ? (char *)"--quick" : NULL, NULL};
    printf("\n## blobs: ctl-bench --case blobs --blob-sizes %s --rounds %s%s\n\n", argv[4],
           rounds, cfg.quick ? " --quick" : "");
    fflush(stdout);
    int rc = posix_spawn(&pid, argv[0], NULL, NULL, argv, environ);
    if (rc != 0) {
        bench_fail("blobs: cannot run %s: %s", argv[0], strerror(rc));
        return -1;
    }
    while (waitpid(pid, &status, 0) < 0 && errno == EINTR)
        ;
    if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) {
        bench_fail("blobs: %s failed (status %d)", argv[0], status);
        return -1;
    }
    return 0;
}

/* ---- main --------------------------------------------------------------- */

static void usage(FILE *f)
{
    fprintf(f,
            "usage: ctl-scale [--quick] [--case NAMES] [--rounds N]\n"
            "\n"
            "Measure ctlrpc as the numbers grow: units in a fan-out, blobs held by\n"
            "one unit, clients of one unit, the size of a blob; against the bare\n"
            "ZeroMQ transport where there is one, in this one run. Exits 0 when\n"
            "every case ran.\n"
            "\n"
            "  --quick         a short run (the smoke test CI runs; under a minute)\n"
            "  --case NAMES    comma-separated, any of: fanout, held, clients, blobs,\n"
            "                  all (default all; may repeat)\n"
            "  --rounds N      rounds per case (default 5, --quick 2)\n"
            "  --io-callbacks  the fan-out's asynchronous client runs its callbacks\n"
            "                  on its I/O thread (callbacks_on_io_thread) instead of\n"
            "                  queuing them for the thread that waits\n"
            "  --help          this text\n"
            "\n"
            "Cases (--quick sizes in brackets):\n"
            "  fanout   16/64/256/1024 [16/64] servers that answer every request\n"
            "           with a fixed stats reply: storage_stats_many (blocking) and\n"
            "           storage_stats_many_start (async) vs the bare fan-out, all\n"
            "           against the same servers: batch latency, client CPU and TCP\n"
            "           segments per target, files and memory per address; then\n"
            "           batches of each size to one fleet of the largest\n"
            "  held     one unit holding 10k/1M/10M [10k/100k] blobs: put, get, describe,\n"
            "           stats and list latency against the smallest level\n"
            "  clients  5000 [200] clients connecting at once to one ctl-storage-unit:\n"
            "           every call answered; the unit's files and memory per connection\n"
            "  blobs    ctl-bench's blobs case at 64K/1M/8M/64M [64K/256K/1M]\n"
            "\n"
            "(--host and --clients-host are internal: the children the cases start.)\n");
}


static int parse_count(const char *text, long max, long *out)
{
    char *end;
    errno = 0;
    long v = strtol(text, &end, 10);
    if (errno || *end || v < 1 || v > max)
        return -1;
    *out = v;
    return 0;
}

/* The internal modes: argv after the mode's option. */
static int internal_mode(int argc, char **argv)
{
    long n = 0, calls = 0;
    child_setup();
    if (strcmp(argv[1], "--host") == 0 && argc == 4 && parse_count(argv[3], 4096, &n) == 0) {
        if (strcmp(argv[2], "units") == 0)
            return host_units((size_t)n);
        if (strcmp(argv[2], "echo") == 0)
            return host_routers((size_t)n, echo_ready);
        if (strcmp(argv[2], "fixed") == 0)
            return host_routers((size_t)n, fixed_ready);
    }
    if (strcmp(argv[1], "--clients-host") == 0 && argc == 5 &&
        parse_count(argv[2], 10000, &n) == 0 && parse_count(argv[4], 1000, &calls) == 0)
        return host_clients((int)n, argv[3], (int)calls);
    fprintf(stderr, "ctl-scale: bad internal command line\n");
    return 2;
}

int main(int argc, char **argv)
{
    bench_prog = "ctl-scale";
    static const struct option opts[] = {
        {"quick", no_argument, NULL, 'q'},
        {"case", required_argument, NULL, 'c'},
        {"rounds", required_argument, NULL, 'r'},
        {"io-callbacks", no_argument, NULL, 'i'},
        {"help", no_argument, NULL, 'h'},
        {NULL, 0, NULL, 0},
    };
    int c, rounds = 0;
    unsigned cases = 0;
    if (argc >= 2 && (strcmp(argv[1], "--host") == 0 || strcmp(argv[1], "--clients-host") == 0))
        return internal_mode(argc, argv);
    while ((c = getopt_long(argc, argv, "h", opts, NULL)) != -1) {
        char *end;
        switch (c) {
        case 'q':
            cfg.quick = 1;
            break;
        case 'i':
            cfg.io_callbacks = 1;
            break;
        case 'c':
            if (bench_parse_cases(optarg, case_names,
                                  sizeof case_names / sizeof case_names[0], &cases) != 0)
                return 2;
            break;
        case 'r':
            rounds = (int)strtol(optarg, &end, 10);
            if (*end || rounds < 1 || rounds > BENCH_MAX_ROUNDS) {
                fprintf(stderr, "ctl-scale: --rounds wants 1..%d\n", BENCH_MAX_ROUNDS);
                return 2;
            }
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
        fprintf(stderr, "ctl-scale: unexpected argument '%s'\n", argv[optind]);
        usage(stderr);
        return 2;
    }
    cfg.cases = cases ? cases : CASE_ALL;
    cfg.rounds = rounds ? rounds : cfg.quick ? 2 : 5;
    ssize_t sl = readlink("/proc/self/exe", cfg.self, sizeof cfg.self - 1);
    if (sl <= 0) {
        fprintf(stderr, "ctl-scale: cannot find this program (/proc/self/exe)\n");
        return 1;
    }
    cfg.self[sl] = '\0';
    unsigned long long before = nofile_soft();
    raise_nofile();
    signal(SIGPIPE, SIG_IGN);

    int zmaj, zmin, zpat;
    zmq_version(&zmaj, &zmin, &zpat);
    printf("ctl-scale:");
    for (int i = 0; i < argc; i++)
        printf(" %s", argv[i]);
    printf("\nmachine: %ld online CPUs, %.1f GiB available; libzmq %d.%d.%d, msgpack-c %s; "
           "build %s\nopen-file limit: %llu (soft, raised from %llu)\n"
           "method: %d rounds where there is a baseline (sides alternating; medians over "
           "the rounds, ratio = median of the per-round ratios)\n",
           sysconf(_SC_NPROCESSORS_ONLN), (double)mem_available_kib() / 1048576.0, zmaj,
           zmin, zpat, msgpack_version(), CTL_SCALE_BUILD, nofile_soft(), before, cfg.rounds);
    fflush(stdout);
    double t0 = now_s();
    if (cfg.cases & CASE_FANOUT)
        case_fanout();
    if (cfg.cases & CASE_HELD)
        case_held();
    if (cfg.cases & CASE_CLIENTS)
        case_clients();
    if (cfg.cases & CASE_BLOBS)
        case_blobs();
    printf("\nctl-scale: %.0f s%s\n", now_s() - t0, bench_failed ? "; some cases FAILED (see the "
                                                               "errors above)" : "");
    return bench_failed ? 1 : 0;
}
