/*
 * servers.c - the servers ctl-bench measures, and how it reads their CPU.
 * See bench.h.
 *
 * The in-process unit serves the storage service's own handlers and store
 * (the storage_service library, examples/storage/handlers.c), set up as
 * ctl-storage-unit sets them up, so it does per request exactly the work
 * the real unit does; running it in-process lets the bench find its
 * threads and read their CPU exactly as it does the echo server's. Both servers own their ZeroMQ context, as a unit
 * process does.
 */
#define _GNU_SOURCE
#include "bench.h"

#include <dirent.h>
#include <dlfcn.h>
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <spawn.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <zmq.h>

#include "handlers.h"

extern char **environ;

/* ---- time and CPU ------------------------------------------------------ */

uint64_t now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

double now_s(void)
{
    return (double)now_ns() / 1e9;
}

double cpu_tick_seconds(void)
{
    long hz = sysconf(_SC_CLK_TCK);
    return 1.0 / (double)(hz > 0 ? hz : 100);
}

size_t tids_now(pid_t *out, size_t max)
{
    DIR *d = opendir("/proc/self/task");
    size_t n = 0;
    if (!d)
        return 0;
    struct dirent *e;
    while ((e = readdir(d)) != NULL && n < max) {
        if (e->d_name[0] < '0' || e->d_name[0] > '9')
            continue;
        out[n++] = (pid_t)strtol(e->d_name, NULL, 10);
    }
    closedir(d);
    return n;
}

void tids_new(const pid_t *before, size_t n_before, const pid_t *after,
              size_t n_after, tidset *out)
{
    out->n = 0;
    for (size_t i = 0; i < n_after; i++) {
        int seen = 0;
        for (size_t j = 0; j < n_before && !seen; j++)
            seen = after[i] == before[j];
        if (!seen && out->n < sizeof out->tids / sizeof out->tids[0])
            out->tids[out->n++] = after[i];
    }
}

/* utime+stime from a /proc .../stat file: fields 14 and 15, counted after
 * the command name, which is in parentheses and may contain spaces. */
static uint64_t stat_ticks(const char *path)
{
    char buf[1024];
    FILE *f = fopen(path, "r");
    if (!f)
        return 0;
    size_t n = fread(buf, 1, sizeof buf - 1, f);
    fclose(f);
    buf[n] = '\0';
    char *p = strrchr(buf, ')');
    if (!p)
        return 0;
    unsigned long long utime = 0, stime = 0;
    /* state ppid pgrp session tty tpgid flags minflt cminflt majflt
     * cmajflt utime stime */
    if (sscanf(p + 1, " %*c %*d %*d %*d %*d %*d %*u %*u %*u %*u %*u %llu %llu",
               &utime, &stime) != 2)
        return 0;
    return (uint64_t)(utime + stime);
}

uint64_t tidset_cpu_ticks(const tidset *set)
{
    uint64_t sum = 0;
    char path[64];
    for (size_t i = 0; i < set->n; i++) {
        snprintf(path, sizeof path, "/proc/self/task/%d/stat", (int)set->tids[i]);
        sum += stat_ticks(path);
    }
    return sum;
}

uint64_t pid_cpu_ticks(pid_t pid)
{
    char path[64];
    snprintf(path, sizeof path, "/proc/%d/stat", (int)pid);
    return stat_ticks(path);
}

/* The threads created by `start` (run on this thread). */
#define MAX_THREADS 1024

static void note_server_threads(const tidset *set)
{
    if (bench_cc.side)
        for (size_t i = 0; i < set->n; i++)
            bench_cc.side(set->tids[i], CC_SERVER);
}

/* ---- copy-counting hooks ------------------------------------------------ */

cc_hooks bench_cc;

static void *sym(const char *name)
{
    return dlsym(RTLD_DEFAULT, name);
}

void bench_cc_init(void)
{
    union { void *obj; cc_begin_fn fn; } b = {sym(CC_BEGIN_SYM)};
    union { void *obj; cc_end_fn fn; } e = {sym(CC_END_SYM)};
    union { void *obj; cc_side_fn fn; } s = {sym(CC_SIDE_SYM)};
    union { void *obj; cc_tag_fn fn; } t = {sym(CC_TAG_SYM)};
    if (b.obj && e.obj && s.obj && t.obj) {
        bench_cc.begin = b.fn;
        bench_cc.end = e.fn;
        bench_cc.side = s.fn;
        bench_cc.tag = t.fn;
    }
}

/* ---- the in-process unit ------------------------------------------------ */

struct bench_unit {
    storage_unit unit; /* the store, the server and the lock, as unit.c has */
    tidset threads;
    storage_handlers handlers;
};

/* The real put handler, tagged: the store keeping its own copy of the blob
 * is the application's doing, not the RPC layer's, and the copy counter
 * books copies made while the tag is set apart. */
static int (*real_on_put)(void *, const storage_put_args *, uint64_t *, ctl_req *);

static int on_put_tagged(void *ctx, const storage_put_args *a, uint64_t *result,
                         ctl_req *req)
{
    bench_cc.tag(1);
    int rc = real_on_put(ctx, a, result, req);
    bench_cc.tag(0);
    return rc;
}

int bench_unit_start(uint64_t capacity, bench_unit **out, char *why,
                     size_t why_len)
{
    return bench_unit_start_in(capacity, NULL, out, why, why_len);
}

int bench_unit_start_in(uint64_t capacity, void *zmq_context, bench_unit **out,
                        char *why, size_t why_len)
{
    *out = NULL;
    bench_unit *u = calloc(1, sizeof *u);
    if (!u) {
        snprintf(why, why_len, "out of memory");
        return -1;
    }
    pthread_mutex_init(&u->unit.lock, NULL);
    ctl_error err;
    ctl_error_init(&err);
    if (store_new(capacity, NULL, &u->unit.store, &err) != 0) {
        snprintf(why, why_len, "store: %s", err.msg ? err.msg : "failed");
        ctl_error_fini(&err);
        pthread_mutex_destroy(&u->unit.lock);
        free(u);
        return -1;
    }
    storage_unit_handlers(&u->unit, &u->handlers);
    if (bench_cc.tag) {
        real_on_put = u->handlers.on_put;
        u->handlers.on_put = on_put_tagged;
    }
    ctl_server_options so;
    ctl_server_options_init(&so);
    so.endpoint = "tcp://127.0.0.1:*";
    so.lock = &u->unit.lock;
    so.zmq_context = zmq_context;

    pid_t before[MAX_THREADS], after[MAX_THREADS];
    size_t nb = tids_now(before, MAX_THREADS);
    /* As unit.c: hold the lock until the server is set (stats reads it). */
    pthread_mutex_lock(&u->unit.lock);
    int rc = storage_serve(&u->handlers, &so, &u->unit.server, &err);
    pthread_mutex_unlock(&u->unit.lock);
    if (rc != 0) {
        snprintf(why, why_len, "storage_serve: %s", err.msg ? err.msg : "failed");
        ctl_error_fini(&err);
        store_destroy(&u->unit.store);
        pthread_mutex_destroy(&u->unit.lock);
        free(u);
        return -1;
    }
    size_t na = tids_now(after, MAX_THREADS);
    tids_new(before, nb, after, na, &u->threads);
    note_server_threads(&u->threads);
    ctl_error_fini(&err);
    *out = u;
    return 0;
}

const char *bench_unit_endpoint(const bench_unit *u)
{
    return ctl_server_endpoint(u->unit.server);
}

const tidset *bench_unit_threads(const bench_unit *u)
{
    return &u->threads;
}

storage_unit *bench_unit_storage(bench_unit *u)
{
    return &u->unit;
}

void bench_unit_stop(bench_unit **pu)
{
    if (!pu || !*pu)
        return;
    bench_unit *u = *pu;
    ctl_server_destroy(&u->unit.server);
    store_destroy(&u->unit.store);
    pthread_mutex_destroy(&u->unit.lock);
    free(u);
    *pu = NULL;
}

/* ---- the echo server ---------------------------------------------------- */

struct bench_echo {
    int keeper;        /* the put/get floor instead of an echo */
    zmq_msg_t kept;    /* keeper: the last large payload */
    void *ctx;
    void *router;
    pthread_t thread;
    tidset threads;
    char endpoint[BENCH_ENDPOINT_MAX];
};

/* Keeper mode: a payload of 64 bytes or more is kept (moved, not copied)
 * and answered with one byte; a smaller one is answered with the kept
 * payload (a reference-counted copy of the message, not of its bytes). */
static void keep_or_serve(bench_echo *e, zmq_msg_t *payload)
{
    if (zmq_msg_size(payload) >= 64) {
        zmq_msg_close(&e->kept);
        zmq_msg_init(&e->kept);
        zmq_msg_move(&e->kept, payload);
        zmq_msg_close(payload);
        zmq_msg_init_size(payload, 1);
        *(char *)zmq_msg_data(payload) = 'k';
    } else {
        zmq_msg_close(payload);
        zmq_msg_init(payload);
        zmq_msg_copy(payload, &e->kept);
    }
}

/* Receive a whole message (up to 4 frames kept) and send it back as it
 * came (keeper mode: see keep_or_serve). zmq_ctx_shutdown ends the loop
 * (ETERM). */
static void *echo_main(void *arg)
{
    bench_echo *e = arg;
    for (;;) {
        zmq_msg_t frames[4];
        int n = 0, more = 1, failed = 0;
        while (more) {
            zmq_msg_t scratch;
            zmq_msg_t *m = n < 4 ? &frames[n] : &scratch;
            zmq_msg_init(m);
            if (zmq_msg_recv(m, e->router, 0) < 0) {
                zmq_msg_close(m);
                if (zmq_errno() == EINTR)
                    continue;
                for (int i = 0; i < n; i++)
                    zmq_msg_close(&frames[i]);
                return NULL;
            }
            more = zmq_msg_more(m);
            if (n < 4)
                n++;
            else
                zmq_msg_close(m);
        }
        if (e->keeper && n >= 2)
            keep_or_serve(e, &frames[n - 1]);
        for (int i = 0; i < n; i++) {
            if (!failed && zmq_msg_send(&frames[i], e->router,
                                        i + 1 < n ? ZMQ_SNDMORE : 0) >= 0)
                continue;
            failed = 1;
            zmq_msg_close(&frames[i]);
        }
        if (failed && zmq_errno() == ETERM)
            return NULL;
    }
}

int bench_echo_start(bench_echo **out, char *why, size_t why_len)
{
    return bench_echo_start_mode(0, out, why, why_len);
}

int bench_echo_start_mode(int keeper, bench_echo **out, char *why, size_t why_len)
{
    *out = NULL;
    bench_echo *e = calloc(1, sizeof *e);
    if (!e) {
        snprintf(why, why_len, "out of memory");
        return -1;
    }
    e->keeper = keeper;
    zmq_msg_init(&e->kept);
    pid_t before[MAX_THREADS], after[MAX_THREADS];
    size_t nb = tids_now(before, MAX_THREADS);
    int zero = 0;
    size_t len = sizeof e->endpoint;
    e->ctx = zmq_ctx_new();
    e->router = e->ctx ? zmq_socket(e->ctx, ZMQ_ROUTER) : NULL;
    if (!e->router ||
        zmq_setsockopt(e->router, ZMQ_LINGER, &zero, sizeof zero) != 0 ||
        zmq_bind(e->router, "tcp://127.0.0.1:*") != 0 ||
        zmq_getsockopt(e->router, ZMQ_LAST_ENDPOINT, e->endpoint, &len) != 0 ||
        pthread_create(&e->thread, NULL, echo_main, e) != 0) {
        snprintf(why, why_len, "echo server: %s", zmq_strerror(zmq_errno()));
        if (e->router)
            zmq_close(e->router);
        if (e->ctx)
            zmq_ctx_term(e->ctx);
        zmq_msg_close(&e->kept);
        free(e);
        return -1;
    }
    size_t na = tids_now(after, MAX_THREADS);
    tids_new(before, nb, after, na, &e->threads);
    note_server_threads(&e->threads);
    *out = e;
    return 0;
}

const char *bench_echo_endpoint(const bench_echo *e)
{
    return e->endpoint;
}

const tidset *bench_echo_threads(const bench_echo *e)
{
    return &e->threads;
}

void bench_echo_stop(bench_echo **pe)
{
    if (!pe || !*pe)
        return;
    bench_echo *e = *pe;
    zmq_ctx_shutdown(e->ctx);
    pthread_join(e->thread, NULL);
    zmq_close(e->router);
    zmq_msg_close(&e->kept);
    zmq_ctx_term(e->ctx);
    free(e);
    *pe = NULL;
}

/* ---- programs ----------------------------------------------------------- */

int bench_proc_start(bench_proc *p, char *const argv[], int timeout_ms,
                     char *why, size_t why_len)
{
    int fds[2];
    posix_spawn_file_actions_t fa;
    memset(p, 0, sizeof *p);
    p->pid = -1;
    p->out_fd = -1;
    if (pipe2(fds, O_CLOEXEC) != 0) {
        snprintf(why, why_len, "pipe: %s", strerror(errno));
        return -1;
    }
    posix_spawn_file_actions_init(&fa);
    posix_spawn_file_actions_addopen(&fa, 0, "/dev/null", O_RDONLY, 0);
    posix_spawn_file_actions_adddup2(&fa, fds[1], 1);
    posix_spawn_file_actions_adddup2(&fa, fds[1], 2);
    int rc = posix_spawn(&p->pid, argv[0], &fa, NULL, argv, environ);
    posix_spawn_file_actions_destroy(&fa);
    close(fds[1]);
    if (rc != 0) {
        close(fds[0]);
        p->pid = -1;
        snprintf(why, why_len, "cannot start %s: %s", argv[0], strerror(rc));
        return -1;
    }
    p->out_fd = fds[0];

    /* Read up to the first newline. */
    char line[512];
    size_t n = 0;
    uint64_t deadline = now_ns() + (uint64_t)timeout_ms * 1000000u;
    while (n < sizeof line - 1 && !memchr(line, '\n', n)) {
        struct pollfd pfd = {p->out_fd, POLLIN, 0};
        uint64_t now = now_ns();
        int left = now < deadline ? (int)((deadline - now) / 1000000u) : 0;
        if (left <= 0 || poll(&pfd, 1, left) <= 0)
            break;
        ssize_t r = read(p->out_fd, line + n, sizeof line - 1 - n);
        if (r <= 0)
            break;
        n += (size_t)r;
    }
    line[n] = '\0';
    char *nl = strchr(line, '\n');
    if (!nl || strncmp(line, "tcp://", 6) != 0 ||
        (size_t)(nl - line) >= sizeof p->endpoint) {
        snprintf(why, why_len, "%s printed no endpoint within %d ms; it said: %.300s",
                 argv[0], timeout_ms, line);
        bench_proc_stop(p);
        return -1;
    }
    memcpy(p->endpoint, line, (size_t)(nl - line));
    p->endpoint[nl - line] = '\0';
    return 0;
}

void bench_proc_stop(bench_proc *p)
{
    if (p->pid > 0) {
        int status;
        kill(p->pid, SIGTERM);
        uint64_t deadline = now_ns() + 5000000000u;
        while (waitpid(p->pid, &status, WNOHANG) == 0) {
            if (now_ns() > deadline) {
                kill(p->pid, SIGKILL);
                waitpid(p->pid, &status, 0);
                break;
            }
            struct timespec ts = {0, 10000000};
            nanosleep(&ts, NULL);
        }
        p->pid = -1;
    }
    if (p->out_fd >= 0)
        close(p->out_fd);
    p->out_fd = -1;
}

int bench_run(char *const argv[], char *const envp[], const char *log_path,
              double *seconds, char *why, size_t why_len)
{
    posix_spawn_file_actions_t fa;
    pid_t pid;
    int status = 0;
    posix_spawn_file_actions_init(&fa);
    posix_spawn_file_actions_addopen(&fa, 0, "/dev/null", O_RDONLY, 0);
    posix_spawn_file_actions_addopen(&fa, 1, log_path,
                                     O_WRONLY | O_CREAT | O_TRUNC, 0644);
    posix_spawn_file_actions_adddup2(&fa, 1, 2);
    double t0 = now_s();
    int rc = posix_spawn(&pid, argv[0], &fa, NULL, argv, envp ? envp : environ);
    posix_spawn_file_actions_destroy(&fa);
    if (rc != 0) {
        snprintf(why, why_len, "cannot run %s: %s", argv[0], strerror(rc));
        return -1;
    }
    while (waitpid(pid, &status, 0) < 0 && errno == EINTR)
        ;
    *seconds = now_s() - t0;
    if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) {
        snprintf(why, why_len, "%s failed (status %d); its output is in %s",
                 argv[0], status, log_path);
        return -1;
    }
    return 0;
}

/* ---- what ctl-bench and ctl-scale share -------------------------------- */

const char *bench_prog = "ctl-bench";
int bench_failed;

static void say(const char *what, const char *fmt, va_list ap)
    __attribute__((format(printf, 2, 0)));
static void say(const char *what, const char *fmt, va_list ap)
{
    fprintf(stderr, "%s: %s", bench_prog, what);
    vfprintf(stderr, fmt, ap);
    fputc('\n', stderr);
}

void bench_progress(const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    say("", fmt, ap);
    va_end(ap);
}

void bench_fail(const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    say("error: ", fmt, ap);
    va_end(ap);
    bench_failed = 1;
}

int bench_cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

int bench_cmp_u64(const void *a, const void *b)
{
    uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;
    return x < y ? -1 : x > y;
}

double bench_median(const double *v, int n)
{
    double tmp[BENCH_MAX_ROUNDS];
    if (n <= 0)
        return 0;
    if (n > BENCH_MAX_ROUNDS)
        n = BENCH_MAX_ROUNDS;
    memcpy(tmp, v, (size_t)n * sizeof *v);
    qsort(tmp, (size_t)n, sizeof *tmp, bench_cmp_double);
    return n % 2 ? tmp[n / 2] : (tmp[n / 2 - 1] + tmp[n / 2]) / 2;
}

int bench_parse_cases(const char *text, const bench_case_name *names, size_t count,
                      unsigned *out)
{
    char buf[256];
    snprintf(buf, sizeof buf, "%s", text);
    for (char *save = NULL, *t = strtok_r(buf, ",", &save); t;
         t = strtok_r(NULL, ",", &save)) {
        size_t i;
        for (i = 0; i < count; i++)
            if (strcmp(t, names[i].name) == 0)
                break;
        if (i == count) {
            fprintf(stderr, "%s: unknown case '%s'\n", bench_prog, t);
            return -1;
        }
        *out |= names[i].bit;
    }
    return 0;
}
