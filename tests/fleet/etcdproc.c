/*
 * etcdproc.c - see etcdproc.h.
 */
#include "etcdproc.h"

#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <poll.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <curl/curl.h>

long long ep_now_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (long long)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

void ep_sleep_ms(int ms)
{
    struct timespec ts = {ms / 1000, (long)(ms % 1000) * 1000000L};
    while (nanosleep(&ts, &ts) != 0 && errno == EINTR)
        ;
}

static int free_port(void)
{
    int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = 0};
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    socklen_t len = sizeof a;
    int port = -1;
    if (fd >= 0 && bind(fd, (struct sockaddr *)&a, sizeof a) == 0 &&
        getsockname(fd, (struct sockaddr *)&a, &len) == 0)
        port = ntohs(a.sin_port);
    if (fd >= 0)
        close(fd);
    return port;
}

int ep_free_port(void)
{
    return free_port();
}

/* Reap `pid` within `timeout_ms`: its status, or -1. */
static int reap_within(pid_t pid, int timeout_ms)
{
    long long deadline = ep_now_ms() + timeout_ms;
    for (;;) {
        int status;
        pid_t r = waitpid(pid, &status, WNOHANG);
        if (r == pid)
            return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
        if (r < 0 && errno != EINTR)
            return -1;
        if (ep_now_ms() >= deadline)
            return -1;
        ep_sleep_ms(10);
    }
}

int ep_run(char *out, size_t outlen, int timeout_ms, const char *const *argv)
{
    int p[2];
    if (pipe2(p, O_CLOEXEC) != 0)
        return -1;
    pid_t pid = fork();
    if (pid < 0)
        return -1;
    if (pid == 0) {
        prctl(PR_SET_PDEATHSIG, SIGKILL);
        dup2(p[1], STDOUT_FILENO);
        int devnull = open("/dev/null", O_WRONLY);
        if (!out && devnull >= 0)
            dup2(devnull, STDOUT_FILENO);
        execvp(argv[0], (char *const *)argv);
        _exit(127);
    }
    close(p[1]);
    size_t n = 0;
    long long deadline = ep_now_ms() + timeout_ms;
    for (;;) {
        long long left = deadline - ep_now_ms();
        struct pollfd pfd = {p[0], POLLIN, 0};
        if (left <= 0)
            break;
        int pr = poll(&pfd, 1, (int)left);
        if (pr <= 0)
            continue;
        char tmp[4096];
        ssize_t r = read(p[0], tmp, sizeof tmp);
        if (r <= 0)
            break;
        if (out && n + 1 < outlen) {
            size_t take = (size_t)r < outlen - 1 - n ? (size_t)r : outlen - 1 - n;
            memcpy(out + n, tmp, take);
            n += take;
        }
    }
    if (out && outlen)
        out[n] = '\0';
    close(p[0]);
    int st = reap_within(pid, (int)(deadline - ep_now_ms() > 0 ? deadline - ep_now_ms() : 1));
    if (st < 0) {
        kill(pid, SIGKILL);
        reap_within(pid, 5000);
    }
    return st;
}

/* The CA and a server certificate for 127.0.0.1, made with openssl. */
static int make_certs(ep_etcd *e)
{
    char ca_key[300], ca_crt[300], key[300], csr[300], crt[300], ext[300];
    snprintf(ca_key, sizeof ca_key, "%s/ca.key", e->dir);
    snprintf(ca_crt, sizeof ca_crt, "%s/ca.crt", e->dir);
    snprintf(key, sizeof key, "%s/server.key", e->dir);
    snprintf(csr, sizeof csr, "%s/server.csr", e->dir);
    snprintf(crt, sizeof crt, "%s/server.crt", e->dir);
    snprintf(ext, sizeof ext, "%s/ext.cnf", e->dir);
    FILE *f = fopen(ext, "w");
    if (!f)
        return -1;
    fprintf(f, "subjectAltName=IP:127.0.0.1\nextendedKeyUsage=serverAuth,clientAuth\n");
    fclose(f);
    const char *a1[] = {"openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout",
                        ca_key, "-out", ca_crt, "-days", "2", "-subj", "/CN=ctlrpc test CA",
                        NULL};
    const char *a2[] = {"openssl", "req", "-newkey", "rsa:2048", "-nodes", "-keyout", key,
                        "-out", csr, "-subj", "/CN=127.0.0.1", NULL};
    const char *a3[] = {"openssl", "x509", "-req", "-in", csr, "-CA", ca_crt, "-CAkey",
                        ca_key, "-CAcreateserial", "-out", crt, "-days", "2", "-extfile", ext,
                        NULL};
    snprintf(e->client_key, sizeof e->client_key, "%s/client.key", e->dir);
    snprintf(e->client_cert, sizeof e->client_cert, "%s/client.crt", e->dir);
    char ccsr[300];
    snprintf(ccsr, sizeof ccsr, "%s/client.csr", e->dir);
    const char *a4[] = {"openssl", "req", "-newkey", "rsa:2048", "-nodes", "-keyout",
                        e->client_key, "-out", ccsr, "-subj", "/CN=ctlrpc test client", NULL};
    const char *a5[] = {"openssl", "x509", "-req", "-in", ccsr, "-CA", ca_crt, "-CAkey", ca_key,
                        "-CAcreateserial", "-out", e->client_cert, "-days", "2", "-extfile",
                        ext, NULL};
    if (ep_run(NULL, 0, 30000, a1) != 0 || ep_run(NULL, 0, 30000, a2) != 0 ||
        ep_run(NULL, 0, 30000, a3) != 0 ||
        (e->client_auth && (ep_run(NULL, 0, 30000, a4) != 0 || ep_run(NULL, 0, 30000, a5) != 0))) {
        fprintf(stderr, "etcdproc: openssl could not make the test certificates\n");
        return -1;
    }
    snprintf(e->cacert, sizeof e->cacert, "%s", ca_crt);
    return 0;
}

static size_t discard(char *p, size_t s, size_t n, void *a)
{
    (void)p;
    (void)a;
    return s * n;
}

/* Does it answer /v3/maintenance/status? */
static bool answers(const ep_etcd *e)
{
    CURL *h = curl_easy_init();
    if (!h)
        return false;
    char url[200];
    snprintf(url, sizeof url, "%s/v3/maintenance/status", e->url);
    curl_easy_setopt(h, CURLOPT_URL, url);
    curl_easy_setopt(h, CURLOPT_POSTFIELDS, "{}");
    curl_easy_setopt(h, CURLOPT_TIMEOUT_MS, 1000L);
    curl_easy_setopt(h, CURLOPT_NOSIGNAL, 1L);
    curl_easy_setopt(h, CURLOPT_WRITEFUNCTION, discard);
    if (e->tls)
        curl_easy_setopt(h, CURLOPT_CAINFO, e->cacert);
    if (e->client_auth) {
        curl_easy_setopt(h, CURLOPT_SSLCERT, e->client_cert);
        curl_easy_setopt(h, CURLOPT_SSLKEY, e->client_key);
    }
    long code = 0;
    bool ok = curl_easy_perform(h) == CURLE_OK &&
              curl_easy_getinfo(h, CURLINFO_RESPONSE_CODE, &code) == CURLE_OK && code == 200;
    curl_easy_cleanup(h);
    return ok;
}

static int spawn(ep_etcd *e, int timeout_ms)
{
    char data[300], client[128], peer[128], cluster[200], crt[300], key[300];
    snprintf(data, sizeof data, "%s/data", e->dir);
    snprintf(client, sizeof client, "%s://127.0.0.1:%d", e->tls ? "https" : "http",
             e->client_port);
    snprintf(peer, sizeof peer, "http://127.0.0.1:%d", e->peer_port);
    snprintf(cluster, sizeof cluster, "t=%s", peer);
    snprintf(crt, sizeof crt, "%s/server.crt", e->dir);
    snprintf(key, sizeof key, "%s/server.key", e->dir);
    snprintf(e->url, sizeof e->url, "%s", client);
    snprintf(e->log, sizeof e->log, "%s/etcd.log", e->dir);
    pid_t pid = fork();
    if (pid < 0)
        return -1;
    if (pid == 0) {
        prctl(PR_SET_PDEATHSIG, SIGKILL);
        int fd = open(e->log, O_WRONLY | O_CREAT | O_APPEND, 0644);
        if (fd >= 0) {
            dup2(fd, STDOUT_FILENO);
            dup2(fd, STDERR_FILENO);
        }
        const char *argv[32] = {"etcd", "--name", "t", "--data-dir", data,
                                "--listen-client-urls", client, "--advertise-client-urls",
                                client, "--listen-peer-urls", peer,
                                "--initial-advertise-peer-urls", peer, "--initial-cluster",
                                cluster, "--logger", "zap", "--log-level", "warn", NULL};
        int n = 19;
        char ttl[32];
        if (e->tls) {
            argv[n++] = "--cert-file";
            argv[n++] = crt;
            argv[n++] = "--key-file";
            argv[n++] = key;
        }
        if (e->client_auth) {
            argv[n++] = "--client-cert-auth";
            argv[n++] = "--trusted-ca-file";
            argv[n++] = e->cacert;
        }
        if (e->token_ttl_s > 0) {
            snprintf(ttl, sizeof ttl, "--auth-token-ttl=%d", e->token_ttl_s);
            argv[n++] = ttl;
        }
        argv[n] = NULL;
        execvp("etcd", (char *const *)argv);
        _exit(127);
    }
    e->pid = pid;
    long long deadline = ep_now_ms() + timeout_ms;
    while (ep_now_ms() < deadline) {
        int status;
        if (waitpid(pid, &status, WNOHANG) == pid) {
            e->pid = 0;
            return 1; /* exited: a port was taken? */
        }
        if (answers(e))
            return 0;
        ep_sleep_ms(50);
    }
    fprintf(stderr, "etcdproc: etcd on %s did not answer in %d ms (log %s)\n", e->url,
            timeout_ms, e->log);
    ep_stop(e);
    return -1;
}

int ep_start(ep_etcd *e, bool tls, int timeout_ms)
{
    ep_options o = {.tls = tls};
    return ep_start_with(e, &o, timeout_ms);
}

int ep_start_with(ep_etcd *e, const ep_options *o, int timeout_ms)
{
    bool tls = o->tls;
    memset(e, 0, sizeof *e);
    e->client_auth = o->tls && o->client_auth;
    e->token_ttl_s = o->token_ttl_s;
    curl_global_init(CURL_GLOBAL_DEFAULT);
    const char *tmp = getenv("TMPDIR");
    snprintf(e->dir, sizeof e->dir, "%s/ctlrpc-etcd-XXXXXX", tmp && *tmp ? tmp : "/tmp");
    if (!mkdtemp(e->dir)) {
        fprintf(stderr, "etcdproc: mkdtemp: %s\n", strerror(errno));
        return -1;
    }
    e->tls = tls;
    if (tls && make_certs(e) != 0)
        return -1;
    for (int attempt = 0; attempt < 5; attempt++) {
        e->client_port = free_port();
        e->peer_port = free_port();
        if (e->client_port <= 0 || e->peer_port <= 0 || e->client_port == e->peer_port)
            continue;
        int rc = spawn(e, timeout_ms);
        if (rc == 0)
            return 0;
        if (rc < 0)
            return -1;
    }
    fprintf(stderr, "etcdproc: etcd would not start (log %s)\n", e->log);
    return -1;
}

void ep_stop(ep_etcd *e)
{
    if (e->pid <= 0)
        return;
    kill(e->pid, SIGCONT);
    kill(e->pid, SIGTERM);
    if (reap_within(e->pid, 5000) < 0) {
        kill(e->pid, SIGKILL);
        reap_within(e->pid, 5000);
    }
    e->pid = 0;
}

static void remove_tree(const char *dir)
{
    const char *argv[] = {"rm", "-rf", dir, NULL};
    ep_run(NULL, 0, 30000, argv);
}

void ep_destroy(ep_etcd *e)
{
    ep_stop(e);
    if (e->dir[0])
        remove_tree(e->dir);
    e->dir[0] = '\0';
}

int ep_restart(ep_etcd *e, bool wipe, int timeout_ms)
{
    ep_stop(e);
    if (wipe) {
        char data[300];
        snprintf(data, sizeof data, "%s/data", e->dir);
        remove_tree(data);
    }
    /* The ports may be held for a moment by the old process's sockets. */
    long long deadline = ep_now_ms() + timeout_ms;
    while (ep_now_ms() < deadline) {
        int rc = spawn(e, (int)(deadline - ep_now_ms()));
        if (rc == 0)
            return 0;
        if (rc < 0)
            return -1;
        ep_sleep_ms(100);
    }
    return -1;
}

static int wait_state(pid_t pid, char want, int timeout_ms)
{
    long long deadline = ep_now_ms() + timeout_ms;
    char path[64];
    snprintf(path, sizeof path, "/proc/%d/stat", (int)pid);
    while (ep_now_ms() < deadline) {
        FILE *f = fopen(path, "r");
        char buf[512] = "";
        if (f) {
            size_t n = fread(buf, 1, sizeof buf - 1, f);
            buf[n] = '\0';
            fclose(f);
        }
        const char *p = strrchr(buf, ')');
        if (p && p[1] == ' ' && (want == 'T' ? p[2] == 'T' : p[2] != 'T'))
            return 0;
        ep_sleep_ms(5);
    }
    return -1;
}

int ep_freeze(ep_etcd *e)
{
    return kill(e->pid, SIGSTOP) == 0 ? wait_state(e->pid, 'T', 5000) : -1;
}

int ep_thaw(ep_etcd *e)
{
    return kill(e->pid, SIGCONT) == 0 ? wait_state(e->pid, 'R', 5000) : -1;
}

int ep_etcdctl(ep_etcd *e, char *out, size_t outlen, const char *arg, ...)
{
    const char *argv[32];
    char eps[160], ca[320], cert[320], key[320];
    int n = 0;
    argv[n++] = "etcdctl";
    snprintf(eps, sizeof eps, "--endpoints=%s", e->url);
    argv[n++] = eps;
    if (e->tls) {
        snprintf(ca, sizeof ca, "--cacert=%s", e->cacert);
        argv[n++] = ca;
    }
    if (e->client_auth) {
        snprintf(cert, sizeof cert, "--cert=%s", e->client_cert);
        snprintf(key, sizeof key, "--key=%s", e->client_key);
        argv[n++] = cert;
        argv[n++] = key;
    }
    va_list ap;
    va_start(ap, arg);
    for (const char *a = arg; a && n < 31; a = va_arg(ap, const char *))
        argv[n++] = a;
    va_end(ap);
    argv[n] = NULL;
    setenv("ETCDCTL_API", "3", 1);
    return ep_run(out, outlen, 10000, argv);
}

/* ---- units ------------------------------------------------------------ */

int ep_unit_start(ep_unit *u, const char *const *argv, int timeout_ms)
{
    return ep_unit_start_err(u, argv, NULL, timeout_ms);
}

int ep_unit_start_err(ep_unit *u, const char *const *argv, const char *err_path,
                      int timeout_ms)
{
    memset(u, 0, sizeof *u);
    u->out_fd = -1;
    int err_fd = -1;
    if (err_path &&
        (err_fd = open(err_path, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600)) < 0) {
        fprintf(stderr, "etcdproc: %s: %s\n", err_path, strerror(errno));
        return -1;
    }
    int p[2];
    if (pipe2(p, O_CLOEXEC) != 0) {
        if (err_fd >= 0)
            close(err_fd);
        return -1;
    }
    pid_t pid = fork();
    if (pid < 0) {
        close(p[0]);
        close(p[1]);
        if (err_fd >= 0)
            close(err_fd);
        return -1;
    }
    if (pid == 0) {
        prctl(PR_SET_PDEATHSIG, SIGKILL);
        dup2(p[1], STDOUT_FILENO);
        if (err_fd >= 0)
            dup2(err_fd, STDERR_FILENO);
        execv(argv[0], (char *const *)argv);
        _exit(127);
    }
    if (err_fd >= 0)
        close(err_fd);
    close(p[1]);
    u->pid = pid;
    u->out_fd = p[0];
    size_t n = 0;
    long long deadline = ep_now_ms() + timeout_ms;
    while (n == 0 || u->endpoint[n - 1] != '\n') {
        long long left = deadline - ep_now_ms();
        struct pollfd pfd = {p[0], POLLIN, 0};
        if (left <= 0 || n + 1 >= sizeof u->endpoint || poll(&pfd, 1, (int)left) < 0) {
            fprintf(stderr, "etcdproc: %s printed no endpoint in time\n", argv[0]);
            ep_unit_kill(u);
            return -1;
        }
        if (!(pfd.revents & (POLLIN | POLLHUP)))
            continue;
        ssize_t r = read(p[0], u->endpoint + n, 1);
        if (r <= 0) {
            fprintf(stderr, "etcdproc: %s exited before printing its endpoint\n", argv[0]);
            ep_unit_kill(u);
            return -1;
        }
        n++;
    }
    u->endpoint[n - 1] = '\0';
    return 0;
}

void ep_unit_kill(ep_unit *u)
{
    if (u->pid > 0) {
        kill(u->pid, SIGKILL);
        reap_within(u->pid, 5000);
    }
    u->pid = 0;
    if (u->out_fd >= 0)
        close(u->out_fd);
    u->out_fd = -1;
}

void ep_unit_signal(ep_unit *u, int sig)
{
    if (u->pid > 0)
        kill(u->pid, sig);
}

int ep_unit_wait(ep_unit *u, int timeout_ms)
{
    if (u->pid <= 0)
        return -1;
    int st = reap_within(u->pid, timeout_ms);
    if (st >= 0) {
        u->pid = 0;
        if (u->out_fd >= 0)
            close(u->out_fd);
        u->out_fd = -1;
    }
    return st;
}

int ep_unit_stop(ep_unit *u, int timeout_ms)
{
    if (u->pid <= 0)
        return -1;
    kill(u->pid, SIGTERM);
    int st = ep_unit_wait(u, timeout_ms);
    if (st < 0)
        ep_unit_kill(u);
    return st;
}

/* ---- the forwarder -------------------------------------------------------- */

#include <pthread.h>
#include <stdatomic.h>

#define PROXY_MAX 64

struct ep_proxy {
    int listen_fd, target_port;
    char url[64];
    atomic_int paused, stop;
    atomic_int refused; /* connections accepted and closed while paused */
    pthread_t thread;
    int pairs[PROXY_MAX][2]; /* client fd, etcd fd; -1 when free */
};

static void close_pair(ep_proxy *p, int i)
{
    for (int k = 0; k < 2; k++)
        if (p->pairs[i][k] >= 0) {
            close(p->pairs[i][k]);
            p->pairs[i][k] = -1;
        }
}

static void *proxy_main(void *arg)
{
    ep_proxy *p = arg;
    while (!atomic_load(&p->stop)) {
        struct pollfd pfd[1 + 2 * PROXY_MAX];
        int idx[1 + 2 * PROXY_MAX];
        int n = 0;
        pfd[n] = (struct pollfd){p->listen_fd, POLLIN, 0};
        idx[n++] = -1;
        bool paused = atomic_load(&p->paused);
        for (int i = 0; i < PROXY_MAX; i++) {
            if (p->pairs[i][0] < 0)
                continue;
            if (paused) {
                close_pair(p, i);
                continue;
            }
            for (int k = 0; k < 2; k++) {
                pfd[n] = (struct pollfd){p->pairs[i][k], POLLIN, 0};
                idx[n++] = i * 2 + k;
            }
        }
        if (poll(pfd, (nfds_t)n, 20) <= 0)
            continue;
        if (pfd[0].revents & POLLIN) {
            int c = accept4(p->listen_fd, NULL, NULL, SOCK_CLOEXEC);
            if (c >= 0 && atomic_load(&p->paused)) {
                close(c);
                atomic_fetch_add(&p->refused, 1);
            } else if (c >= 0) {
                int t = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
                struct sockaddr_in a = {.sin_family = AF_INET,
                                        .sin_port = htons((uint16_t)p->target_port)};
                a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
                int slot = -1;
                for (int i = 0; i < PROXY_MAX && slot < 0; i++)
                    if (p->pairs[i][0] < 0)
                        slot = i;
                if (t < 0 || slot < 0 || connect(t, (struct sockaddr *)&a, sizeof a) != 0) {
                    close(c);
                    if (t >= 0)
                        close(t);
                } else {
                    p->pairs[slot][0] = c;
                    p->pairs[slot][1] = t;
                }
            }
        }
        for (int j = 1; j < n; j++) {
            if (!(pfd[j].revents & (POLLIN | POLLHUP | POLLERR)))
                continue;
            int i = idx[j] / 2, k = idx[j] % 2;
            if (p->pairs[i][k] < 0)
                continue;
            char buf[65536];
            ssize_t r = read(p->pairs[i][k], buf, sizeof buf);
            if (r <= 0 || write(p->pairs[i][1 - k], buf, (size_t)r) != r)
                close_pair(p, i);
        }
    }
    for (int i = 0; i < PROXY_MAX; i++)
        close_pair(p, i);
    return NULL;
}

ep_proxy *ep_proxy_new(int target_port)
{
    ep_proxy *p = calloc(1, sizeof *p);
    if (!p)
        return NULL;
    for (int i = 0; i < PROXY_MAX; i++)
        p->pairs[i][0] = p->pairs[i][1] = -1;
    p->target_port = target_port;
    p->listen_fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = 0};
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    socklen_t len = sizeof a;
    if (p->listen_fd < 0 || bind(p->listen_fd, (struct sockaddr *)&a, sizeof a) != 0 ||
        listen(p->listen_fd, 64) != 0 ||
        getsockname(p->listen_fd, (struct sockaddr *)&a, &len) != 0) {
        if (p->listen_fd >= 0)
            close(p->listen_fd);
        free(p);
        return NULL;
    }
    snprintf(p->url, sizeof p->url, "http://127.0.0.1:%d", ntohs(a.sin_port));
    if (pthread_create(&p->thread, NULL, proxy_main, p) != 0) {
        close(p->listen_fd);
        free(p);
        return NULL;
    }
    return p;
}

const char *ep_proxy_url(const ep_proxy *p)
{
    return p->url;
}

void ep_proxy_pause(ep_proxy *p, bool paused)
{
    atomic_store(&p->paused, paused ? 1 : 0);
}

int ep_proxy_refused(ep_proxy *p)
{
    return atomic_load(&p->refused);
}

void ep_proxy_destroy(ep_proxy **pp)
{
    if (!pp || !*pp)
        return;
    ep_proxy *p = *pp;
    atomic_store(&p->stop, 1);
    pthread_join(p->thread, NULL);
    close(p->listen_fd);
    free(p);
    *pp = NULL;
}
