/*
 * vsgrpc.c - ctl-bench --vs-grpc: ctlrpc beside gRPC C++, the program a
 * user would pick instead, on the storage unit's small ops.
 *
 * Sides, each a server and its clients:
 *   ctlrpc     the real ctl-storage-unit process, called by T threads of
 *              this process through the generated stubs and one shared
 *              ctl_client
 *   grpc-sync  ctl-bench-grpc-server --mode sync (gRPC's synchronous
 *              server), called by ctl-bench-grpc-load's T threads
 *   grpc-cb    ctl-bench-grpc-server --mode callback (the callback server)
 * and, as the floor, two bare echoes of 64 bytes, each served by one thread
 * of a child process (this program run with --vs-grpc-echo-child) and
 * called by threads of this one: raw TCP (one epoll thread; a blocking
 * write and read per call on the client) and ZeroMQ (bench.h's ROUTER
 * echo; a DEALER per client thread).
 *
 * Ops: describe (one key), stats, put (64 bytes, a key per client thread).
 * Every client thread has one blocking call in flight. At T = 1, 4 and 16
 * threads, round after round, every op runs on every side and the floors
 * run once, in an order that rotates from round to round; every trial
 * starts its threads, makes 10 untimed calls on each, then times for
 * `seconds` (or up to a number of calls, --quick) while the server's CPU is
 * read before and after: the whole process for the three servers
 * (/proc/<pid>/stat), the echo child's for the floors. Figures are
 * medians over the rounds, ratios the median of the per-round ratios
 * gRPC / ctlrpc. RSS (VmRSS) of each server process after each load, and
 * the disk it stands on: the bytes of its executable and of every shared
 * object it maps (/proc/<pid>/maps).
 *
 * The gRPC programs (tests/bench/grpc/) are looked for beside ctl-bench or
 * in --grpc-dir; ctl-bench-grpc-load is driven over a pipe (see
 * grpc_load.cc), one trial at a time. Every child is stopped by its pid
 * (SIGTERM, SIGKILL after 5 s), and every wait on one has a deadline.
 */
#define _GNU_SOURCE
#include "vsgrpc.h"

#include "bench.h"

#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <spawn.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <arpa/inet.h>
#include <time.h>
#include <unistd.h>

#include <zmq.h>

extern char **environ;

#define VS_CALL_TIMEOUT_MS 30000
#define VS_MAX_THREADS 16
#define VS_WARM_CALLS 10
#define VS_MSG 64
#define VS_KEY "bench-key"

/* ---- what is measured --------------------------------------------------- */

enum { OP_DESCRIBE, OP_STATS, OP_PUT, N_OPS };
static const char *const op_names[N_OPS] = {"describe", "stats", "put"};
static const char *const op_labels[N_OPS] = {"describe(1 key)", "stats", "put 64 B"};

enum { S_CTLRPC, S_SYNC, S_CB, N_SERVERS, S_TCP = N_SERVERS, S_ZMQ, N_SIDES };
static const char *const side_names[N_SIDES] = {"ctlrpc", "grpc-sync", "grpc-cb", "raw TCP",
                                                "ZeroMQ"};

enum { M_P50, M_P99, M_RATE, M_CPU, N_METRICS };
static const char *const metric_names[N_METRICS] = {"p50 us", "p99 us", "calls/s",
                                                    "srv CPU us/call"};

static const int thread_counts[] = {1, 4, 16};
#define N_LOADS (sizeof thread_counts / sizeof thread_counts[0])

typedef struct trial_out {
    double m[N_METRICS];
} trial_out;

typedef struct vs_state {
    vs_grpc_options o;
    int rounds;
    double seconds;
    uint64_t max_calls; /* per client thread; 0: none */
    /* [load][op][side][metric][round]; the floors use op 0. */
    double fig[N_LOADS][N_OPS][N_SIDES][N_METRICS][BENCH_MAX_ROUNDS];
    double rss_kib[N_LOADS][N_SERVERS];
    uint64_t disk[N_SERVERS], disk_own[N_SERVERS], disk_rpc[N_SERVERS];
} vs_state;

/* ---- latencies ---------------------------------------------------------- */

typedef struct lat_buf {
    uint64_t *v;
    size_t n, cap;
} lat_buf;

static int lat_push(lat_buf *b, uint64_t ns)
{
    if (b->n == b->cap) {
        size_t cap = b->cap ? b->cap * 2 : 4096;
        uint64_t *v = realloc(b->v, cap * sizeof *v);
        if (!v)
            return -1;
        b->v = v;
        b->cap = cap;
    }
    b->v[b->n++] = ns;
    return 0;
}

/* ---- the raw TCP echo --------------------------------------------------- */

typedef struct tcp_echo {
    int listen_fd, ep_fd, wake_fd;
    pthread_t thread;
    tidset threads;
    int port;
} tcp_echo;

/* Write all of buf on a non-blocking socket, waiting (bounded) when full. */
static int write_all(int fd, const char *buf, size_t len)
{
    while (len > 0) {
        ssize_t w = write(fd, buf, len);
        if (w > 0) {
            buf += w;
            len -= (size_t)w;
            continue;
        }
        if (w < 0 && errno == EINTR)
            continue;
        if (w < 0 && errno == EAGAIN) {
            struct pollfd p = {fd, POLLOUT, 0};
            if (poll(&p, 1, VS_CALL_TIMEOUT_MS) == 1)
                continue;
        }
        return -1;
    }
    return 0;
}

/* One thread: accept, and send back whatever arrives. */
static void *tcp_echo_main(void *arg)
{
    tcp_echo *e = arg;
    char buf[4096];
    for (;;) {
        struct epoll_event ev[32];
        int n = epoll_wait(e->ep_fd, ev, 32, -1);
        if (n < 0 && errno == EINTR)
            continue;
        if (n < 0)
            return NULL;
        for (int i = 0; i < n; i++) {
            int fd = ev[i].data.fd;
            if (fd == e->wake_fd)
                return NULL;
            if (fd == e->listen_fd) {
                int c = accept4(e->listen_fd, NULL, NULL, SOCK_NONBLOCK | SOCK_CLOEXEC);
                if (c < 0)
                    continue;
                int one = 1;
                setsockopt(c, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
                struct epoll_event ce = {.events = EPOLLIN, .data.fd = c};
                if (epoll_ctl(e->ep_fd, EPOLL_CTL_ADD, c, &ce) != 0)
                    close(c);
                continue;
            }
            ssize_t r = read(fd, buf, sizeof buf);
            if (r > 0 && write_all(fd, buf, (size_t)r) == 0)
                continue;
            if (r < 0 && (errno == EAGAIN || errno == EINTR))
                continue;
            epoll_ctl(e->ep_fd, EPOLL_CTL_DEL, fd, NULL);
            close(fd);
        }
    }
}

static int tcp_echo_start(tcp_echo *e, char *why, size_t why_len)
{
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = 0};
    socklen_t alen = sizeof a;
    memset(e, 0, sizeof *e);
    e->listen_fd = e->ep_fd = e->wake_fd = -1;
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    e->listen_fd = socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
    e->ep_fd = epoll_create1(EPOLL_CLOEXEC);
    e->wake_fd = eventfd(0, EFD_CLOEXEC);
    struct epoll_event le = {.events = EPOLLIN}, we = {.events = EPOLLIN};
    le.data.fd = e->listen_fd;
    we.data.fd = e->wake_fd;
    pid_t before[1024], after[1024];
    size_t nb = tids_now(before, 1024);
    if (e->listen_fd < 0 || e->ep_fd < 0 || e->wake_fd < 0 ||
        bind(e->listen_fd, (struct sockaddr *)&a, sizeof a) != 0 ||
        listen(e->listen_fd, 64) != 0 ||
        getsockname(e->listen_fd, (struct sockaddr *)&a, &alen) != 0 ||
        epoll_ctl(e->ep_fd, EPOLL_CTL_ADD, e->listen_fd, &le) != 0 ||
        epoll_ctl(e->ep_fd, EPOLL_CTL_ADD, e->wake_fd, &we) != 0 ||
        pthread_create(&e->thread, NULL, tcp_echo_main, e) != 0) {
        snprintf(why, why_len, "raw TCP echo on 127.0.0.1: %s", strerror(errno));
        if (e->listen_fd >= 0)
            close(e->listen_fd);
        if (e->ep_fd >= 0)
            close(e->ep_fd);
        if (e->wake_fd >= 0)
            close(e->wake_fd);
        e->listen_fd = -1;
        return -1;
    }
    size_t na = tids_now(after, 1024);
    tids_new(before, nb, after, na, &e->threads);
    e->port = ntohs(a.sin_port);
    return 0;
}

static void tcp_echo_stop(tcp_echo *e)
{
    if (e->listen_fd < 0)
        return;
    uint64_t one = 1;
    if (write(e->wake_fd, &one, sizeof one) == sizeof one)
        pthread_join(e->thread, NULL);
    close(e->listen_fd);
    close(e->ep_fd);
    close(e->wake_fd);
    e->listen_fd = -1;
}

static int tcp_dial(int port)
{
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons((uint16_t)port)};
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    int one = 1;
    struct timeval tv = {VS_CALL_TIMEOUT_MS / 1000, 0};
    if (fd < 0)
        return -1;
    setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
    setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
    setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof tv);
    if (connect(fd, (struct sockaddr *)&a, sizeof a) != 0) {
        close(fd);
        return -1;
    }
    return fd;
}

/* ---- the in-process clients --------------------------------------------- */

typedef struct inproc {
    int side; /* S_CTLRPC, S_TCP or S_ZMQ */
    int op;
    ctl_client *client;
    const char *address; /* ctlrpc and ZeroMQ */
    void *zctx;          /* ZeroMQ */
    int port;            /* raw TCP */
    double seconds;
    uint64_t max_calls;
    /* The start gate: workers count themselves ready, then wait for go. */
    pthread_mutex_t mu;
    pthread_cond_t cond;
    int ready, go;
    uint64_t deadline_ns;
    atomic_int failed;
} inproc;

typedef struct inproc_worker {
    inproc *t;
    int index;
    pthread_t th;
    lat_buf lat;
    uint64_t end_ns;
    /* The thread's connection. */
    void *zsock;
    int fd;
    char put_key[32];
} inproc_worker;

static int ctlrpc_call(inproc_worker *w)
{
    inproc *t = w->t;
    ctl_error err;
    int rc;
    ctl_error_init(&err);
    if (t->op == OP_DESCRIBE) {
        static const ctl_str key = {VS_KEY, sizeof VS_KEY - 1};
        storage_describe_args a;
        storage_list_BlobInfo res;
        ctl_reply *reply = NULL;
        storage_describe_args_init(&a);
        a.keys = (storage_list_str){.items = &key, .count = 1};
        rc = storage_describe(t->client, t->address, &a, VS_CALL_TIMEOUT_MS, &res, &reply,
                              &err);
        if (rc == 0 && res.count != 1)
            rc = -1;
        ctl_reply_destroy(&reply);
    } else if (t->op == OP_STATS) {
        storage_UnitStats res;
        ctl_reply *reply = NULL;
        rc = storage_stats(t->client, t->address, VS_CALL_TIMEOUT_MS, &res, &reply, &err);
        ctl_reply_destroy(&reply);
    } else {
        static const char data[VS_MSG] = "0123456789abcdef0123456789abcdef"
                                         "0123456789abcdef0123456789abcde";
        storage_put_args a;
        uint64_t stored = 0;
        storage_put_args_init(&a);
        a.key = ctl_str_c(w->put_key);
        a.data = (ctl_str){data, VS_MSG};
        rc = storage_put(t->client, t->address, &a, VS_CALL_TIMEOUT_MS, &stored, &err);
        if (rc == 0 && stored != VS_MSG)
            rc = -1;
    }
    if (rc != 0)
        bench_fail("ctlrpc %s at %s: %s", op_names[t->op], t->address,
                   err.msg ? err.msg : "a wrong result");
    ctl_error_fini(&err);
    return rc ? -1 : 0;
}

static int echo_call(inproc_worker *w)
{
    char buf[VS_MSG];
    memset(buf, 'x', sizeof buf);
    if (w->t->side == S_ZMQ) {
        zmq_msg_t m;
        if (zmq_send(w->zsock, buf, VS_MSG, 0) != VS_MSG)
            goto zfail;
        zmq_msg_init(&m);
        int rc = zmq_msg_recv(&m, w->zsock, 0);
        size_t got = zmq_msg_size(&m);
        zmq_msg_close(&m);
        if (rc < 0 || got != VS_MSG)
            goto zfail;
        return 0;
    zfail:
        bench_fail("ZeroMQ echo at %s: %s", w->t->address,
                   zmq_errno() ? zmq_strerror(zmq_errno()) : "a wrong size");
        return -1;
    }
    if (write(w->fd, buf, VS_MSG) != VS_MSG)
        goto tfail;
    for (size_t got = 0; got < VS_MSG;) {
        ssize_t r = read(w->fd, buf + got, VS_MSG - got);
        if (r < 0 && errno == EINTR)
            continue;
        if (r <= 0)
            goto tfail;
        got += (size_t)r;
    }
    return 0;
tfail:
    bench_fail("raw TCP echo on 127.0.0.1:%d: %s", w->t->port,
               errno ? strerror(errno) : "closed");
    return -1;
}

static int inproc_call(inproc_worker *w)
{
    return w->t->side == S_CTLRPC ? ctlrpc_call(w) : echo_call(w);
}

static void *inproc_main(void *arg)
{
    inproc_worker *w = arg;
    inproc *t = w->t;
    int ok = 1;
    snprintf(w->put_key, sizeof w->put_key, "bench-put-%d", w->index);
    if (t->side == S_ZMQ) {
        int zero = 0, tmo = VS_CALL_TIMEOUT_MS;
        w->zsock = zmq_socket(t->zctx, ZMQ_DEALER);
        ok = w->zsock && zmq_setsockopt(w->zsock, ZMQ_LINGER, &zero, sizeof zero) == 0 &&
             zmq_setsockopt(w->zsock, ZMQ_RCVTIMEO, &tmo, sizeof tmo) == 0 &&
             zmq_setsockopt(w->zsock, ZMQ_SNDTIMEO, &tmo, sizeof tmo) == 0 &&
             zmq_connect(w->zsock, t->address) == 0;
        if (!ok)
            bench_fail("ZeroMQ echo: cannot connect to %s", t->address);
    } else if (t->side == S_TCP) {
        w->fd = tcp_dial(t->port);
        ok = w->fd >= 0;
        if (!ok)
            bench_fail("raw TCP echo: cannot connect to 127.0.0.1:%d: %s", t->port,
                       strerror(errno));
    }
    for (int i = 0; ok && i < VS_WARM_CALLS; i++)
        ok = inproc_call(w) == 0;
    if (!ok)
        atomic_store(&t->failed, 1);
    pthread_mutex_lock(&t->mu);
    t->ready++;
    pthread_cond_broadcast(&t->cond);
    while (!t->go)
        pthread_cond_wait(&t->cond, &t->mu);
    uint64_t deadline = t->deadline_ns;
    pthread_mutex_unlock(&t->mu);
    for (uint64_t n = 0; !atomic_load_explicit(&t->failed, memory_order_relaxed) &&
                         (t->max_calls == 0 || n < t->max_calls);
         n++) {
        uint64_t a = now_ns();
        if (a >= deadline)
            break;
        if (inproc_call(w) != 0 || lat_push(&w->lat, now_ns() - a) != 0) {
            atomic_store(&t->failed, 1);
            break;
        }
    }
    w->end_ns = now_ns();
    if (w->zsock)
        zmq_close(w->zsock);
    if (w->fd >= 0)
        close(w->fd);
    return NULL;
}

/* The figures of a trial from every thread's latencies. */
static int trial_figures(lat_buf *bufs, int n, uint64_t t0, uint64_t end, uint64_t ticks,
                         trial_out *out)
{
    size_t total = 0, k = 0;
    for (int i = 0; i < n; i++)
        total += bufs[i].n;
    if (total == 0) {
        bench_fail("no call was timed");
        return -1;
    }
    uint64_t *all = malloc(total * sizeof *all);
    if (!all) {
        bench_fail("out of memory");
        return -1;
    }
    for (int i = 0; i < n; i++) {
        memcpy(all + k, bufs[i].v, bufs[i].n * sizeof *all);
        k += bufs[i].n;
    }
    qsort(all, total, sizeof *all, bench_cmp_u64);
    double elapsed = (double)(end - t0) / 1e9;
    out->m[M_P50] = (double)all[(total - 1) * 50 / 100] / 1e3;
    out->m[M_P99] = (double)all[(total - 1) * 99 / 100] / 1e3;
    out->m[M_RATE] = elapsed > 0 ? (double)total / elapsed : 0;
    out->m[M_CPU] = (double)ticks * cpu_tick_seconds() * 1e6 / (double)total;
    free(all);
    return 0;
}

typedef struct cpu_of {
    pid_t pid;            /* a server process */
    const tidset *threads; /* or threads of this one */
} cpu_of;

static uint64_t cpu_ticks(const cpu_of *c)
{
    return c->pid > 0 ? pid_cpu_ticks(c->pid) : tidset_cpu_ticks(c->threads);
}

/* One trial of T threads of this process. */
static int inproc_trial(inproc *t, int threads, const cpu_of *cpu, trial_out *out)
{
    inproc_worker w[VS_MAX_THREADS];
    int started = 0, rc = -1;
    lat_buf bufs[VS_MAX_THREADS];
    atomic_store(&t->failed, 0);
    pthread_mutex_init(&t->mu, NULL);
    pthread_cond_init(&t->cond, NULL);
    t->ready = t->go = 0;
    for (int i = 0; i < threads; i++) {
        memset(&w[i], 0, sizeof w[i]);
        w[i].t = t;
        w[i].index = i;
        w[i].fd = -1;
        if (pthread_create(&w[i].th, NULL, inproc_main, &w[i]) != 0) {
            bench_fail("cannot start a client thread");
            atomic_store(&t->failed, 1);
            break;
        }
        started++;
    }
    pthread_mutex_lock(&t->mu);
    while (t->ready < started)
        pthread_cond_wait(&t->cond, &t->mu);
    uint64_t c0 = cpu_ticks(cpu);
    uint64_t t0 = now_ns();
    t->deadline_ns = t0 + (uint64_t)(t->seconds * 1e9);
    t->go = 1;
    pthread_cond_broadcast(&t->cond);
    pthread_mutex_unlock(&t->mu);
    uint64_t end = t0;
    for (int i = 0; i < started; i++) {
        pthread_join(w[i].th, NULL);
        if (w[i].end_ns > end)
            end = w[i].end_ns;
        bufs[i] = w[i].lat;
    }
    uint64_t c1 = cpu_ticks(cpu);
    if (!atomic_load(&t->failed) && started == threads)
        rc = trial_figures(bufs, started, t0, end, c1 - c0, out);
    for (int i = 0; i < started; i++)
        free(w[i].lat.v);
    pthread_cond_destroy(&t->cond);
    pthread_mutex_destroy(&t->mu);
    return rc;
}

/* ---- the gRPC load generator, a child on two pipes ---------------------- */

typedef struct loadgen {
    pid_t pid;
    int in_fd, out_fd; /* its stdin (we write), its stdout (we read) */
    char buf[512];
    size_t fill;
} loadgen;

static int loadgen_start(loadgen *g, const char *prog, const char *target, int per_thread,
                         char *why, size_t why_len)
{
    int in[2], out[2];
    posix_spawn_file_actions_t fa;
    memset(g, 0, sizeof *g);
    g->pid = -1;
    g->in_fd = g->out_fd = -1;
    if (pipe2(in, O_CLOEXEC) != 0 || pipe2(out, O_CLOEXEC) != 0) {
        snprintf(why, why_len, "pipe: %s", strerror(errno));
        return -1;
    }
    char *argv[] = {(char *)prog, (char *)"--target", (char *)target, (char *)"--channels",
                    (char *)(per_thread ? "per-thread" : "shared"), NULL};
    posix_spawn_file_actions_init(&fa);
    posix_spawn_file_actions_adddup2(&fa, in[0], 0);
    posix_spawn_file_actions_adddup2(&fa, out[1], 1);
    int rc = posix_spawn(&g->pid, prog, &fa, NULL, argv, environ);
    posix_spawn_file_actions_destroy(&fa);
    close(in[0]);
    close(out[1]);
    g->in_fd = in[1];
    g->out_fd = out[0];
    if (rc != 0) {
        snprintf(why, why_len, "cannot start %s: %s", prog, strerror(rc));
        g->pid = -1;
        return -1;
    }
    return 0;
}

/* The next line it prints, within `timeout_ms`; -1 on a timeout or its
 * end (it exited). */
static int loadgen_line(loadgen *g, char *line, size_t len, int timeout_ms)
{
    uint64_t deadline = now_ns() + (uint64_t)timeout_ms * 1000000u;
    for (;;) {
        char *nl = memchr(g->buf, '\n', g->fill);
        if (nl) {
            size_t n = (size_t)(nl - g->buf);
            snprintf(line, len, "%.*s", (int)n, g->buf);
            memmove(g->buf, nl + 1, g->fill - n - 1);
            g->fill -= n + 1;
            return 0;
        }
        if (g->fill == sizeof g->buf - 1)
            g->fill = 0; /* a line longer than any it prints: drop it */
        uint64_t now = now_ns();
        struct pollfd p = {g->out_fd, POLLIN, 0};
        int left = now < deadline ? (int)((deadline - now) / 1000000u) : 0;
        if (left <= 0 || poll(&p, 1, left) <= 0)
            return -1;
        ssize_t r = read(g->out_fd, g->buf + g->fill, sizeof g->buf - 1 - g->fill);
        if (r < 0 && errno == EINTR)
            continue;
        if (r <= 0)
            return -1;
        g->fill += (size_t)r;
    }
}

static int loadgen_say(loadgen *g, const char *text)
{
    size_t n = strlen(text);
    return write(g->in_fd, text, n) == (ssize_t)n ? 0 : -1;
}

/* Close its stdin (it exits at the end of its input), then stop it by its
 * pid with a deadline. */
static void loadgen_stop(loadgen *g)
{
    if (g->in_fd >= 0)
        close(g->in_fd);
    g->in_fd = -1;
    bench_proc p = {.pid = g->pid, .out_fd = g->out_fd};
    bench_proc_stop(&p);
    g->pid = -1;
    g->out_fd = -1;
}

static int grpc_trial(loadgen *g, const char *who, int op, int threads, double seconds,
                      uint64_t max_calls, pid_t server, trial_out *out)
{
    char cmd[128], line[512];
    snprintf(cmd, sizeof cmd, "run %s %d %.3f %llu\n", op_names[op], threads, seconds,
             (unsigned long long)max_calls);
    if (loadgen_say(g, cmd) != 0 || loadgen_line(g, line, sizeof line, 60000) != 0) {
        bench_fail("%s: the load generator did not answer '%s'", who, op_names[op]);
        return -1;
    }
    if (strcmp(line, "ready") != 0) {
        bench_fail("%s %s: %s", who, op_names[op], line);
        return -1;
    }
    cpu_of cpu = {server, NULL};
    uint64_t c0 = cpu_ticks(&cpu);
    int timeout = (int)(seconds * 1000) + 60000;
    if (loadgen_say(g, "go\n") != 0 || loadgen_line(g, line, sizeof line, timeout) != 0) {
        bench_fail("%s: the load generator did not finish '%s' within %d ms", who,
                   op_names[op], timeout);
        return -1;
    }
    uint64_t c1 = cpu_ticks(&cpu);
    unsigned long long calls = 0;
    double elapsed = 0, p50 = 0, p99 = 0;
    if (sscanf(line, "ok %llu %lf %lf %lf", &calls, &elapsed, &p50, &p99) != 4 || calls == 0) {
        bench_fail("%s %s: %s", who, op_names[op], line);
        return -1;
    }
    out->m[M_P50] = p50;
    out->m[M_P99] = p99;
    out->m[M_RATE] = elapsed > 0 ? (double)calls / elapsed : 0;
    out->m[M_CPU] = (double)(c1 - c0) * cpu_tick_seconds() * 1e6 / (double)calls;
    return 0;
}

/* ---- memory and disk ---------------------------------------------------- */

static double rss_kib(pid_t pid)
{
    char path[64], line[256];
    double kib = 0;
    snprintf(path, sizeof path, "/proc/%d/status", (int)pid);
    FILE *f = fopen(path, "r");
    if (!f)
        return 0;
    while (fgets(line, sizeof line, f))
        if (sscanf(line, "VmRSS: %lf kB", &kib) == 1)
            break;
    fclose(f);
    return kib;
}

#define MAX_MAPPED 128
typedef struct mapped {
    char *paths[MAX_MAPPED];
    size_t n;
} mapped;

/* The files `pid` maps (its executable and shared objects), each once. */
static void mapped_files(pid_t pid, mapped *m)
{
    char path[64], line[1024];
    m->n = 0;
    snprintf(path, sizeof path, "/proc/%d/maps", (int)pid);
    FILE *f = fopen(path, "r");
    if (!f)
        return;
    while (fgets(line, sizeof line, f)) {
        char *p = strchr(line, '/');
        if (!p)
            continue;
        p[strcspn(p, "\n")] = '\0';
        int seen = 0;
        for (size_t i = 0; i < m->n && !seen; i++)
            seen = strcmp(m->paths[i], p) == 0;
        if (!seen && m->n < MAX_MAPPED && (m->paths[m->n] = strdup(p)) != NULL)
            m->n++;
    }
    fclose(f);
}

static uint64_t file_bytes(const char *path)
{
    struct stat st;
    return stat(path, &st) == 0 ? (uint64_t)st.st_size : 0;
}

/* The RPC stack of each side, by file name: the server's executable (which
 * has the ctlrpc runtime or the generated gRPC code linked in) and the
 * libraries of the RPC system and of its transport. */
static int rpc_file(int side, const char *path, const char *exe)
{
    static const char *const ctlrpc_libs[] = {"libctlrpc", "libzmq", "libmsgpack", "libsodium",
                                              "libpgm", "libnorm", NULL};
    static const char *const grpc_libs[] = {"libgrpc", "libgpr", "libprotobuf", "libabsl_",
                                            "libupb", "libre2", "libcares",
                                            "libaddress_sorting", NULL};
    const char *base = strrchr(path, '/');
    base = base ? base + 1 : path;
    if (strcmp(path, exe) == 0)
        return 1;
    for (const char *const *l = side == S_CTLRPC ? ctlrpc_libs : grpc_libs; *l; l++)
        if (strncmp(base, *l, strlen(*l)) == 0)
            return 1;
    return 0;
}

static void exe_path(pid_t pid, char *out, size_t len)
{
    char link[64];
    snprintf(link, sizeof link, "/proc/%d/exe", (int)pid);
    ssize_t n = readlink(link, out, len - 1);
    out[n > 0 ? n : 0] = '\0';
}

/* The bytes each server stands on; "own" leaves out the files that the
 * ctlrpc unit and a gRPC server both map (libc, libstdc++, ...), "rpc"
 * counts the RPC stack alone (rpc_file). */
static void disk_figures(vs_state *s, const pid_t pids[N_SERVERS])
{
    mapped m[N_SERVERS];
    for (int i = 0; i < N_SERVERS; i++)
        mapped_files(pids[i], &m[i]);
    for (int i = 0; i < N_SERVERS; i++) {
        char exe[512];
        exe_path(pids[i], exe, sizeof exe);
        s->disk[i] = s->disk_own[i] = s->disk_rpc[i] = 0;
        for (size_t k = 0; k < m[i].n; k++) {
            uint64_t b = file_bytes(m[i].paths[k]);
            int shared = 0;
            for (int j = 0; j < N_SERVERS && !shared; j++) {
                if ((i == S_CTLRPC) == (j == S_CTLRPC))
                    continue; /* only ctlrpc against gRPC */
                for (size_t l = 0; l < m[j].n && !shared; l++)
                    shared = strcmp(m[i].paths[k], m[j].paths[l]) == 0;
            }
            s->disk[i] += b;
            if (rpc_file(i, m[i].paths[k], exe))
                s->disk_rpc[i] += b;
            if (!shared)
                s->disk_own[i] += b;
        }
    }
    for (int i = 0; i < N_SERVERS; i++)
        for (size_t k = 0; k < m[i].n; k++)
            free(m[i].paths[k]);
}

/* ---- the table ---------------------------------------------------------- */

static double ratio_median(const double *grpc, const double *ours, int n)
{
    double r[BENCH_MAX_ROUNDS];
    int k = 0;
    for (int i = 0; i < n; i++)
        if (ours[i] > 0)
            r[k++] = grpc[i] / ours[i];
    return k ? bench_median(r, k) : 0;
}

static void print_results(const vs_state *s)
{
    int R = s->rounds;
    printf("%-16s %-16s %10s %10s %10s %11s %11s\n", "op", "metric", "ctlrpc", "grpc-sync",
           "grpc-cb", "sync/ctlrpc", "cb/ctlrpc");
    for (size_t l = 0; l < N_LOADS; l++) {
        printf("-- %d client thread%s, one blocking call in flight each\n", thread_counts[l],
               thread_counts[l] > 1 ? "s" : "");
        for (int op = 0; op < N_OPS; op++) {
            for (int m = 0; m < N_METRICS; m++) {
                int dec = m == M_RATE ? 0 : 1;
                const double *v[N_SERVERS];
                for (int sd = 0; sd < N_SERVERS; sd++)
                    v[sd] = s->fig[l][op][sd][m];
                printf("%-16s %-16s %10.*f %10.*f %10.*f %10.3fx %10.3fx\n",
                       m == 0 ? op_labels[op] : "", metric_names[m], dec,
                       bench_median(v[S_CTLRPC], R), dec, bench_median(v[S_SYNC], R), dec,
                       bench_median(v[S_CB], R), ratio_median(v[S_SYNC], v[S_CTLRPC], R),
                       ratio_median(v[S_CB], v[S_CTLRPC], R));
            }
        }
        printf("%-16s %-16s %10.1f %10.1f %10.1f %10.3fx %10.3fx\n", "server", "RSS MiB",
               s->rss_kib[l][S_CTLRPC] / 1024, s->rss_kib[l][S_SYNC] / 1024,
               s->rss_kib[l][S_CB] / 1024,
               s->rss_kib[l][S_CTLRPC] > 0 ? s->rss_kib[l][S_SYNC] / s->rss_kib[l][S_CTLRPC] : 0,
               s->rss_kib[l][S_CTLRPC] > 0 ? s->rss_kib[l][S_CB] / s->rss_kib[l][S_CTLRPC] : 0);
        printf("%-16s %-16s %10s %10s\n", "floor: 64 B echo", "", "raw TCP", "ZeroMQ");
        for (int m = 0; m < N_METRICS; m++) {
            int dec = m == M_RATE ? 0 : 1;
            printf("%-16s %-16s %10.*f %10.*f\n", "", metric_names[m], dec,
                   bench_median(s->fig[l][0][S_TCP][m], R), dec,
                   bench_median(s->fig[l][0][S_ZMQ][m], R));
        }
    }
    printf("-- disk: the executable and every shared object the server maps\n");
    for (int k = 0; k < 3; k++) {
        static const char *const what[3] = {"MB, all files", "MB, not shared", "MB, RPC stack"};
        const uint64_t *d = k == 0 ? s->disk : k == 1 ? s->disk_own : s->disk_rpc;
        printf("%-16s %-16s %10.1f %10.1f %10.1f %10.3fx %10.3fx\n", k == 0 ? "server" : "",
               what[k],
               (double)d[S_CTLRPC] / 1e6, (double)d[S_SYNC] / 1e6, (double)d[S_CB] / 1e6,
               d[S_CTLRPC] ? (double)d[S_SYNC] / (double)d[S_CTLRPC] : 0,
               d[S_CTLRPC] ? (double)d[S_CB] / (double)d[S_CTLRPC] : 0);
    }
    printf("\nratios: medians of the per-round ratios gRPC / ctlrpc (RSS and disk: of the one "
           "reading); ctlrpc is ahead where the ratio is above 1 for p50, p99, CPU, RSS and "
           "disk, and below 1 for calls/s. Disk: 'not shared' leaves out the files that the ctlrpc "
           "unit and the gRPC servers both map (libc, libstdc++, libssl, ...); 'RPC stack' is "
           "the executable and the RPC system's libraries (ctlrpc: libzmq, libmsgpackc, "
           "libsodium, libpgm, libnorm; gRPC: libgrpc*, libgpr, libprotobuf, libabsl_*, libupb, "
           "libre2, libcares, libaddress_sorting). RSS: VmRSS of the server "
           "process after the load's last round.\n");
}

/* ---- the floor's servers, in a child process ---------------------------- */

int vs_grpc_echo_child(void)
{
    tcp_echo tcp;
    bench_echo *zecho = NULL;
    char why[256];
    sigset_t stop;
    int sig = 0;
    /* SIGTERM is taken by sigwait: blocked before any thread starts. */
    sigemptyset(&stop);
    sigaddset(&stop, SIGTERM);
    sigaddset(&stop, SIGINT);
    pthread_sigmask(SIG_BLOCK, &stop, NULL);
    if (tcp_echo_start(&tcp, why, sizeof why) != 0 ||
        bench_echo_start(&zecho, why, sizeof why) != 0) {
        fprintf(stderr, "ctl-bench: %s\n", why);
        tcp_echo_stop(&tcp);
        return 1;
    }
    printf("%s %d\n", bench_echo_endpoint(zecho), tcp.port);
    fflush(stdout);
    while (sigwait(&stop, &sig) != 0)
        ;
    tcp_echo_stop(&tcp);
    bench_echo_stop(&zecho);
    return 0;
}

/* ---- the run ------------------------------------------------------------ */

static int find_program(const char *dir, const char *name, char *out, size_t len)
{
    snprintf(out, len, "%s/%s", dir, name);
    return access(out, X_OK);
}

/* One round at one load: every op on every side, then the floors (first
 * in odd rounds), the sides' order rotating with the round. */
static int run_round(vs_state *s, size_t l, int r, inproc *ours, loadgen g[2],
                     const pid_t pids[N_SERVERS], inproc *tcp, inproc *zmq,
                     const cpu_of *floor_cpu)
{
    int threads = thread_counts[l];
    trial_out t;
    cpu_of unit_cpu = {pids[S_CTLRPC], NULL};
    for (int pass = 0; pass < 2; pass++) {
        if (pass == (r % 2)) {
            for (int k = 0; k < 2; k++) {
                int side = (k + r) % 2 ? S_ZMQ : S_TCP;
                inproc *f = side == S_TCP ? tcp : zmq;
                if (inproc_trial(f, threads, floor_cpu, &t) != 0)
                    return -1;
                for (int m = 0; m < N_METRICS; m++)
                    s->fig[l][0][side][m][r] = t.m[m];
            }
            continue;
        }
        for (int op = 0; op < N_OPS; op++) {
            for (int k = 0; k < N_SERVERS; k++) {
                int side = (k + r + op) % N_SERVERS;
                int rc;
                if (side == S_CTLRPC) {
                    ours->op = op;
                    rc = inproc_trial(ours, threads, &unit_cpu, &t);
                } else {
                    rc = grpc_trial(&g[side - 1], side_names[side], op, threads, s->seconds,
                                    s->max_calls, pids[side], &t);
                }
                if (rc != 0)
                    return -1;
                for (int m = 0; m < N_METRICS; m++)
                    s->fig[l][op][side][m][r] = t.m[m];
            }
        }
    }
    bench_progress("vs gRPC, %d thread%s: round %d/%d: stats p50 %.1f / %.1f / %.1f us "
                   "(ctlrpc / sync / callback), floor %.1f / %.1f us (TCP / ZeroMQ)",
                   threads, threads > 1 ? "s" : "", r + 1, s->rounds,
                   s->fig[l][OP_STATS][S_CTLRPC][M_P50][r], s->fig[l][OP_STATS][S_SYNC][M_P50][r],
                   s->fig[l][OP_STATS][S_CB][M_P50][r], s->fig[l][0][S_TCP][M_P50][r],
                   s->fig[l][0][S_ZMQ][M_P50][r]);
    return 0;
}

static int seed_key(ctl_client *client, const char *address)
{
    storage_put_args a;
    uint64_t stored = 0;
    ctl_error err;
    storage_put_args_init(&a);
    a.key = ctl_str_c(VS_KEY);
    a.data = ctl_str_c("0123456789");
    ctl_error_init(&err);
    int rc = storage_put(client, address, &a, VS_CALL_TIMEOUT_MS, &stored, &err);
    if (rc != 0)
        bench_fail("put of %s at %s: %s", VS_KEY, address, err.msg);
    ctl_error_fini(&err);
    return rc;
}

int vs_grpc_main(const vs_grpc_options *o, int argc, char **argv)
{
    char self[512], dir[512], server_prog[600], load_prog[600], why[1400];
    ssize_t sl = readlink("/proc/self/exe", self, sizeof self - 1);
    if (sl <= 0) {
        fprintf(stderr, "ctl-bench: cannot find this program (/proc/self/exe)\n");
        return 1;
    }
    self[sl] = '\0';
    snprintf(dir, sizeof dir, "%s", self);
    char *slash = strrchr(dir, '/');
    if (slash)
        *slash = '\0';
    const char *gdir = o->grpc_dir ? o->grpc_dir : dir;
    if (find_program(gdir, "ctl-bench-grpc-server", server_prog, sizeof server_prog) != 0 ||
        find_program(gdir, "ctl-bench-grpc-load", load_prog, sizeof load_prog) != 0) {
        fprintf(stderr,
                "ctl-bench: --vs-grpc needs ctl-bench-grpc-server and ctl-bench-grpc-load in "
                "%s (%s is not there). They are built only where gRPC C++ is installed; this "
                "build: %s. --grpc-dir DIR says where they are\n",
                gdir, access(server_prog, X_OK) != 0 ? server_prog : load_prog,
                CTL_BENCH_GRPC_STATUS);
        return 2;
    }
    const char *unit_prog = o->unit ? o->unit : CTL_BENCH_UNIT;
    if (access(unit_prog, X_OK) != 0) {
        fprintf(stderr, "ctl-bench: --vs-grpc: the storage unit %s is not there (--unit PATH)\n",
                unit_prog);
        return 2;
    }

    vs_state *s = calloc(1, sizeof *s);
    if (!s) {
        fprintf(stderr, "ctl-bench: out of memory\n");
        return 1;
    }
    s->o = *o;
    s->rounds = o->rounds ? o->rounds : o->quick ? 1 : 5;
    s->seconds = o->seconds > 0 ? o->seconds : o->quick ? 10 : 1;
    /* --quick: a few hundred calls a side and load, bounded by count. */
    s->max_calls = o->quick ? 20 : 0;

    signal(SIGPIPE, SIG_IGN); /* a load generator that died: its pipe fails, we say so */
    bench_proc procs[N_SERVERS], floor = {.pid = -1, .out_fd = -1};
    loadgen g[2];
    ctl_client *client = NULL;
    void *zctx = NULL;
    pid_t pids[N_SERVERS] = {0};
    int rc = 1;
    for (int i = 0; i < N_SERVERS; i++)
        procs[i] = (bench_proc){.pid = -1, .out_fd = -1};
    for (int i = 0; i < 2; i++)
        g[i] = (loadgen){.pid = -1, .in_fd = -1, .out_fd = -1};

    char *unit_argv[] = {(char *)unit_prog, (char *)"--bind", (char *)"tcp://127.0.0.1:0", NULL};
    char *sync_argv[] = {server_prog, (char *)"--mode", (char *)"sync", NULL};
    char *cb_argv[] = {server_prog, (char *)"--mode", (char *)"callback", NULL};
    char *const *argvs[N_SERVERS] = {unit_argv, sync_argv, cb_argv};
    for (int i = 0; i < N_SERVERS; i++) {
        if (bench_proc_start(&procs[i], argvs[i], 20000, why, sizeof why) != 0) {
            bench_fail("%s: %s", side_names[i], why);
            goto out;
        }
        pids[i] = procs[i].pid;
    }
    for (int i = 0; i < 2; i++) {
        if (loadgen_start(&g[i], load_prog, procs[S_SYNC + i].endpoint, o->per_thread_channels,
                          why, sizeof why) != 0) {
            bench_fail("%s: %s", side_names[S_SYNC + i], why);
            goto out;
        }
    }
    ctl_error err;
    ctl_error_init(&err);
    if (ctl_client_new(NULL, &client, &err) != 0) {
        bench_fail("client: %s", err.msg);
        ctl_error_fini(&err);
        goto out;
    }
    ctl_error_fini(&err);
    if (seed_key(client, procs[S_CTLRPC].endpoint) != 0)
        goto out;
    /* The floor's servers in a process of their own, as every server is. */
    char *floor_argv[] = {self, (char *)"--vs-grpc-echo-child", NULL};
    char *space = NULL;
    int tcp_port = 0;
    if (bench_proc_start(&floor, floor_argv, 20000, why, sizeof why) != 0) {
        bench_fail("floor: %s", why);
        goto out;
    }
    space = strchr(floor.endpoint, ' ');
    if (!space || (tcp_port = atoi(space + 1)) <= 0) {
        bench_fail("floor: the echo servers said '%s'", floor.endpoint);
        goto out;
    }
    *space = '\0';
    if (!(zctx = zmq_ctx_new())) {
        bench_fail("zmq_ctx_new failed");
        goto out;
    }

    /* The header, as ctl-bench's. */
    printf("ctl-bench:");
    for (int i = 0; i < argc; i++)
        printf(" %s", argv[i]);
    printf("\nsides: ctlrpc = %s (pid %d) called through the generated stubs, one shared "
           "ctl_client; grpc-sync / grpc-cb = %s --mode sync / callback (gRPC %s), called by "
           "%s with %s; floor = raw TCP and ZeroMQ echoes of 64 bytes served by a child "
           "process (%s --vs-grpc-echo-child), called by threads of this one\n",
           unit_prog, (int)pids[S_CTLRPC], server_prog, CTL_BENCH_GRPC_VERSION, load_prog,
           o->per_thread_channels ? "a channel per client thread" : "one shared channel", self);
    char span[64];
    if (s->max_calls)
        snprintf(span, sizeof span, "%llu calls a client thread",
                 (unsigned long long)s->max_calls);
    else
        snprintf(span, sizeof span, "%.3g s", s->seconds);
    printf("method: %d round%s a load; in each round every op on every side and the floors, "
           "the order rotating; %s a trial, after 10 untimed calls a thread; figures are "
           "medians over the rounds\n\n",
           s->rounds, s->rounds > 1 ? "s" : "", span);
    fflush(stdout);

    inproc ours = {.side = S_CTLRPC, .client = client, .address = procs[S_CTLRPC].endpoint};
    inproc tcpc = {.side = S_TCP, .port = tcp_port};
    inproc zc = {.side = S_ZMQ, .zctx = zctx, .address = floor.endpoint};
    cpu_of floor_cpu = {floor.pid, NULL};
    inproc *all[3] = {&ours, &tcpc, &zc};
    for (int i = 0; i < 3; i++) {
        all[i]->seconds = s->seconds;
        all[i]->max_calls = s->max_calls;
    }
    for (size_t l = 0; l < N_LOADS; l++) {
        for (int r = 0; r < s->rounds; r++)
            if (run_round(s, l, r, &ours, g, pids, &tcpc, &zc, &floor_cpu) != 0)
                goto out;
        for (int i = 0; i < N_SERVERS; i++)
            s->rss_kib[l][i] = rss_kib(pids[i]);
    }
    disk_figures(s, pids);
    print_results(s);
    rc = 0;
out:
    for (int i = 0; i < 2; i++)
        loadgen_stop(&g[i]);
    for (int i = 0; i < N_SERVERS; i++)
        bench_proc_stop(&procs[i]);
    ctl_client_destroy(&client);
    bench_proc_stop(&floor);
    if (zctx)
        zmq_ctx_term(zctx);
    free(s);
    if (rc != 0 || bench_failed) {
        printf("ctl-bench: --vs-grpc FAILED (see the errors above)\n");
        return 1;
    }
    return 0;
}
