/*
 * test_nofile.c - a unit's open files: real ctl-storage-unit processes
 * started with a soft RLIMIT_NOFILE of 1024 (as `ulimit -Sn 1024` leaves
 * a shell), and a crowd of clients connecting at once.
 *
 *   test_nofile_raised        the unit raises its soft limit to the hard
 *                             one (and says so at --log-level info): 2000
 *                             clients connecting at once are all answered,
 *                             and no accept failed
 *   test_nofile_accept_failed a unit whose hard limit is low too (256),
 *                             with no connection cap (--max-connections
 *                             0), cannot accept them all: it logs the failure
 *                             with its errno at the default level, once a
 *                             second at most, and counts it (_stats)
 *
 * The clients are raw DEALER sockets of one ZeroMQ context in this
 * process, each sending one _health request; the test raises its own limit
 * to the hard one for them. Skipped (77) when the hard limit is too low
 * for 2000 connections on both sides.
 */
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <msgpack.h>
#include <zmq.h>

#define CROWD 2000
#define SMALL_HARD 256
#define SMALL_CROWD 400

static int failures;

#define CHECK(cond, ...)                                                       \
    do {                                                                       \
        if (!(cond)) {                                                         \
            fprintf(stderr, "test_nofile: %s:%d: ", __FILE__, __LINE__);       \
            fprintf(stderr, __VA_ARGS__);                                      \
            fputc('\n', stderr);                                               \
            failures++;                                                        \
        }                                                                      \
    } while (0)

static int64_t now_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

typedef struct unit {
    pid_t pid;
    int out_fd;
    char err_path[64];
    char endpoint[256];
} unit;

/* Start ctl-storage-unit with RLIMIT_NOFILE {soft, hard} and
 * --max-connections `max_conns` (NULL: the unit's default), its stderr in a
 * file, and read the endpoint it prints. */
static int unit_start(unit *u, rlim_t soft, rlim_t hard, const char *level,
                      const char *max_conns)
{
    int p[2];
    snprintf(u->err_path, sizeof u->err_path, "/tmp/ctl-nofile.XXXXXX");
    int err_fd = mkstemp(u->err_path);
    if (err_fd < 0 || pipe2(p, O_CLOEXEC) != 0)
        return -1;
    u->pid = fork();
    if (u->pid < 0)
        return -1;
    if (u->pid == 0) {
        struct rlimit rl = {soft, hard};
        if (prctl(PR_SET_PDEATHSIG, SIGKILL) != 0 || setrlimit(RLIMIT_NOFILE, &rl) != 0 ||
            dup2(p[1], STDOUT_FILENO) < 0 || dup2(err_fd, STDERR_FILENO) < 0)
            _exit(127);
        const char *argv[] = {UNIT_BIN, "--bind", "tcp://127.0.0.1:0", "--log-level", level,
                              max_conns ? "--max-connections" : NULL, max_conns, NULL};
        execv(UNIT_BIN, (char *const *)argv);
        _exit(127);
    }
    close(p[1]);
    close(err_fd);
    u->out_fd = p[0];
    size_t n = 0;
    int64_t deadline = now_ms() + 20000;
    while (n + 1 < sizeof u->endpoint && (n == 0 || u->endpoint[n - 1] != '\n')) {
        struct pollfd pfd = {p[0], POLLIN, 0};
        if (now_ms() > deadline || poll(&pfd, 1, 1000) < 0)
            return -1;
        if (!(pfd.revents & (POLLIN | POLLHUP)))
            continue;
        if (read(p[0], u->endpoint + n, 1) != 1)
            return -1;
        n++;
    }
    u->endpoint[n - 1] = '\0';
    return 0;
}

/* SIGTERM and reap; returns the exit status or -1. */
static int unit_stop(unit *u)
{
    int status = 0;
    kill(u->pid, SIGTERM);
    for (int i = 0; i < 2000; i++) {
        if (waitpid(u->pid, &status, WNOHANG) == u->pid) {
            close(u->out_fd);
            return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
        }
        struct timespec ts = {0, 10000000};
        nanosleep(&ts, NULL);
    }
    kill(u->pid, SIGKILL);
    waitpid(u->pid, &status, 0);
    close(u->out_fd);
    return -1;
}

static char *unit_stderr(const unit *u)
{
    FILE *f = fopen(u->err_path, "r");
    char *buf = calloc(1, 1 << 20);
    if (f && buf)
        buf[fread(buf, 1, (1 << 20) - 1, f)] = '\0';
    if (f)
        fclose(f);
    return buf;
}

/* [op, id, {}] */
static void pack_request(msgpack_sbuffer *sb, const char *op, const char *id)
{
    msgpack_packer pk;
    msgpack_sbuffer_clear(sb);
    msgpack_packer_init(&pk, sb, msgpack_sbuffer_write);
    msgpack_pack_array(&pk, 3);
    msgpack_pack_str(&pk, strlen(op));
    msgpack_pack_str_body(&pk, op, strlen(op));
    msgpack_pack_str(&pk, strlen(id));
    msgpack_pack_str_body(&pk, id, strlen(id));
    msgpack_pack_map(&pk, 0);
}

/* `n` DEALERs connect to `endpoint` at once and send _health each; count
 * the replies within `timeout_ms`. The sockets are left open in `socks`. */
static int crowd(void *ctx, void **socks, int n, const char *endpoint, int timeout_ms)
{
    msgpack_sbuffer sb;
    msgpack_sbuffer_init(&sb);
    zmq_pollitem_t *items = calloc((size_t)n, sizeof *items);
    int zero = 0, answered = 0;
    for (int i = 0; i < n; i++) {
        char id[16];
        socks[i] = zmq_socket(ctx, ZMQ_DEALER);
        if (!socks[i])
            break;
        zmq_setsockopt(socks[i], ZMQ_LINGER, &zero, sizeof zero);
        zmq_connect(socks[i], endpoint);
        snprintf(id, sizeof id, "c%d", i);
        pack_request(&sb, "_health", id);
        zmq_send(socks[i], sb.data, sb.size, ZMQ_DONTWAIT);
        items[i] = (zmq_pollitem_t){socks[i], 0, ZMQ_POLLIN, 0};
    }
    int64_t deadline = now_ms() + timeout_ms;
    while (answered < n && now_ms() < deadline) {
        int rc = zmq_poll(items, n, (long)(deadline - now_ms()));
        if (rc < 0 && zmq_errno() != EINTR)
            break;
        for (int i = 0; rc > 0 && i < n; i++) {
            char buf[512];
            if (items[i].socket && (items[i].revents & ZMQ_POLLIN) &&
                zmq_recv(socks[i], buf, sizeof buf, ZMQ_DONTWAIT) >= 0) {
                answered++;
                items[i].socket = NULL; /* answered: zmq_poll skips... */
                items[i].events = 0;
                items[i].fd = -1;
            }
        }
    }
    free(items);
    msgpack_sbuffer_destroy(&sb);
    return answered;
}

/* Ask one fresh client for _stats; the value of totals[key], or -1. */
static long long stats_total(void *ctx, const char *endpoint, const char *key)
{
    msgpack_sbuffer sb;
    char buf[65536];
    long long v = -1;
    int zero = 0;
    void *s = zmq_socket(ctx, ZMQ_DEALER);
    zmq_setsockopt(s, ZMQ_LINGER, &zero, sizeof zero);
    zmq_connect(s, endpoint);
    msgpack_sbuffer_init(&sb);
    pack_request(&sb, "_stats", "s");
    zmq_send(s, sb.data, sb.size, 0);
    zmq_pollitem_t it = {s, 0, ZMQ_POLLIN, 0};
    int n = zmq_poll(&it, 1, 10000) == 1 ? zmq_recv(s, buf, sizeof buf, 0) : -1;
    msgpack_unpacked up;
    msgpack_unpacked_init(&up);
    if (n > 0 && msgpack_unpack_next(&up, buf, (size_t)n, NULL) == MSGPACK_UNPACK_SUCCESS &&
        up.data.type == MSGPACK_OBJECT_ARRAY && up.data.via.array.size == 3) {
        const msgpack_object *r = &up.data.via.array.ptr[2];
        for (uint32_t i = 0; r->type == MSGPACK_OBJECT_MAP && i < r->via.map.size; i++) {
            const msgpack_object_kv *kv = &r->via.map.ptr[i];
            if (kv->key.via.str.size != 6 || memcmp(kv->key.via.str.ptr, "totals", 6) != 0)
                continue;
            for (uint32_t j = 0; j < kv->val.via.map.size; j++) {
                const msgpack_object_kv *t = &kv->val.via.map.ptr[j];
                if (t->key.via.str.size == strlen(key) &&
                    memcmp(t->key.via.str.ptr, key, strlen(key)) == 0)
                    v = (long long)t->val.via.u64;
            }
        }
    }
    msgpack_unpacked_destroy(&up);
    msgpack_sbuffer_destroy(&sb);
    zmq_close(s);
    return v;
}

/* stats_total once it reaches `want`, or the last value read when
 * `timeout_ms` passes: the counters of connections are written by the
 * unit's monitor thread a moment after the event. */
static long long stats_wait_atleast(void *ctx, const char *endpoint, const char *key,
                                    long long want, int timeout_ms)
{
    int64_t deadline = now_ms() + timeout_ms;
    long long v = stats_total(ctx, endpoint, key);
    while (v < want && now_ms() < deadline) {
        poll(NULL, 0, 20);
        v = stats_total(ctx, endpoint, key);
    }
    return v;
}

static void *crowd_ctx(int n)
{
    void *ctx = zmq_ctx_new();
    zmq_ctx_set(ctx, ZMQ_MAX_SOCKETS, n + 64);
    return ctx;
}

static void close_all(void **socks, int n)
{
    for (int i = 0; i < n; i++)
        if (socks[i])
            zmq_close(socks[i]);
}

static int test_nofile_raised(void)
{
    struct rlimit rl;
    getrlimit(RLIMIT_NOFILE, &rl);
    unit u;
    CHECK(unit_start(&u, 1024, rl.rlim_max, "info", NULL) == 0, "cannot start %s", UNIT_BIN);
    if (failures)
        return 1;
    void *ctx = crowd_ctx(CROWD);
    void **socks = calloc(CROWD, sizeof *socks);
    int64_t t0 = now_ms();
    int answered = crowd(ctx, socks, CROWD, u.endpoint, 45000);
    fprintf(stderr, "test_nofile: %d of %d clients answered in %lld ms\n", answered, CROWD,
            (long long)(now_ms() - t0));
    CHECK(answered == CROWD, "%d of %d clients answered", answered, CROWD);
    CHECK(stats_total(ctx, u.endpoint, "accept_failures") == 0, "accept failures counted");
    CHECK(stats_wait_atleast(ctx, u.endpoint, "connections", CROWD, 10000) >= CROWD,
          "connections not counted");
    close_all(socks, CROWD);
    free(socks);
    zmq_ctx_term(ctx);
    CHECK(unit_stop(&u) == 0, "the unit did not exit cleanly");
    char *log = unit_stderr(&u);
    char want[128];
    snprintf(want, sizeof want, " info ctl-storage-unit: open-file limit raised from 1024 to %llu\n",
             (unsigned long long)rl.rlim_max);
    CHECK(log && strstr(log, want), "no line '%s' in the unit's stderr:\n%s", want,
          log ? log : "");
    CHECK(log && !strstr(log, "cannot accept"), "accept failures logged:\n%s", log ? log : "");
    free(log);
    unlink(u.err_path);
    return failures != 0;
}

static int test_nofile_accept_failed(void)
{
    unit u;
    /* No connection cap: the default one (the limit less a quarter) would
     * refuse the crowd's excess before the unit ran out of descriptors. */
    CHECK(unit_start(&u, SMALL_HARD, SMALL_HARD, "warn", "0") == 0, "cannot start %s",
          UNIT_BIN);
    if (failures)
        return 1;
    void *ctx = crowd_ctx(SMALL_CROWD);
    void **socks = calloc(SMALL_CROWD, sizeof *socks);
    int answered = crowd(ctx, socks, SMALL_CROWD, u.endpoint, 3000);
    fprintf(stderr, "test_nofile: %d of %d clients answered by a unit with %d files\n",
            answered, SMALL_CROWD, SMALL_HARD);
    CHECK(answered < SMALL_CROWD, "every client was answered: the limit did not bite");
    close_all(socks, SMALL_CROWD);
    free(socks);
    /* Its files come back as the clients leave; then it answers again. */
    long long failed = stats_wait_atleast(ctx, u.endpoint, "accept_failures", 1, 10000);
    CHECK(failed > 0, "accept failures not counted (%lld)", failed);
    zmq_ctx_term(ctx);
    CHECK(unit_stop(&u) == 0, "the unit did not exit cleanly");
    char *log = unit_stderr(&u);
    const char *line = log ? strstr(log, " warn server: tcp://127.0.0.1:") : NULL;
    CHECK(line && strstr(line, ": cannot accept a connection: Too many open files (errno 24); "
                               "out of file descriptors: raise the open-file limit"),
          "no accept failure logged:\n%s", log ? log : "");
    /* At most a line a second, however many failed. */
    size_t lines = 0;
    for (const char *p = log; p && (p = strstr(p, "cannot accept")) != NULL; p++)
        lines++;
    CHECK(lines >= 1 && lines <= 20, "%zu accept failure lines for %lld failures", lines, failed);
    free(log);
    unlink(u.err_path);
    return failures != 0;
}

int main(int argc, char **argv)
{
    struct rlimit rl;
    signal(SIGPIPE, SIG_IGN);
    if (getrlimit(RLIMIT_NOFILE, &rl) != 0 || rl.rlim_max < 3 * CROWD + 512) {
        fprintf(stderr, "test_nofile: the hard open-file limit is too low for %d clients: "
                "skipped\n", CROWD);
        return 77;
    }
    rl.rlim_cur = rl.rlim_max;
    setrlimit(RLIMIT_NOFILE, &rl);
    if (argc == 2 && strcmp(argv[1], "test_nofile_raised") == 0)
        return test_nofile_raised();
    if (argc == 2 && strcmp(argv[1], "test_nofile_accept_failed") == 0)
        return test_nofile_accept_failed();
    fprintf(stderr, "usage: test_nofile test_nofile_raised|test_nofile_accept_failed\n");
    return 2;
}
