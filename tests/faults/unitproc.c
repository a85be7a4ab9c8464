/*
 * unitproc.c - see unitproc.h.
 */
#include "unitproc.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

static int64_t now_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

static void sleep_ms(int ms)
{
    struct timespec ts = {ms / 1000, (long)(ms % 1000) * 1000000L};
    while (nanosleep(&ts, &ts) != 0 && errno == EINTR)
        ;
}

static void reap(up_unit *u)
{
    int status;
    while (waitpid(u->pid, &status, 0) < 0 && errno == EINTR)
        ;
    u->pid = 0;
    u->frozen = 0;
    if (u->out_fd >= 0)
        close(u->out_fd);
    u->out_fd = -1;
}

/* One attempt: 0 started, 1 exited before printing (bind failed?), -1. */
static int start_once(up_unit *u, const char *bin, const char *bind,
                      const char *capacity, int64_t deadline)
{
    int p[2];
    if (pipe2(p, O_CLOEXEC) != 0)
        return -1;
    const char *argv[6 + UP_MAX_EXTRA] = {bin, "--bind", bind ? bind : "tcp://127.0.0.1:0"};
    size_t argc = 3;
    if (capacity) {
        argv[argc++] = "--capacity";
        argv[argc++] = capacity;
    }
    for (size_t i = 0; i < UP_MAX_EXTRA && u->extra[i]; i++)
        argv[argc++] = u->extra[i];
    pid_t pid = fork();
    if (pid < 0) {
        close(p[0]);
        close(p[1]);
        return -1;
    }
    if (pid == 0) {
        /* Only async-signal-safe calls between fork and exec. */
        if (prctl(PR_SET_PDEATHSIG, SIGKILL) != 0 ||
            dup2(p[1], STDOUT_FILENO) < 0)
            _exit(127);
        execv(bin, (char *const *)argv);
        _exit(127);
    }
    close(p[1]);
    u->pid = pid;
    u->out_fd = p[0];
    u->frozen = 0;
    size_t n = 0;
    while (n == 0 || u->endpoint[n - 1] != '\n') {
        int64_t left = deadline - now_ms();
        struct pollfd pfd = {p[0], POLLIN, 0};
        if (left <= 0 || n + 1 >= sizeof u->endpoint) {
            fprintf(stderr, "unitproc: %s did not print its endpoint in time\n", bin);
            kill(pid, SIGKILL);
            reap(u);
            return -1;
        }
        int r = poll(&pfd, 1, (int)left);
        if (r <= 0)
            continue;
        ssize_t got = read(p[0], u->endpoint + n, 1);
        if (got < 0 && errno == EINTR)
            continue;
        if (got <= 0) {
            reap(u);
            return 1;
        }
        n += (size_t)got;
    }
    u->endpoint[n - 1] = '\0';
    return 0;
}

int up_start(up_unit *u, const char *bin, const char *bind,
             const char *capacity, int timeout_ms)
{
    int64_t deadline = now_ms() + timeout_ms;
    u->pid = 0;
    u->out_fd = -1;
    for (;;) {
        int rc = start_once(u, bin, bind, capacity, deadline);
        if (rc <= 0)
            return rc;
        if (now_ms() >= deadline) {
            fprintf(stderr, "unitproc: %s exited before printing its endpoint "
                    "(bind %s)\n", bin, bind ? bind : "tcp://127.0.0.1:0");
            return -1;
        }
        sleep_ms(50); /* the endpoint may still be held: try again */
    }
}

int up_freeze(up_unit *u)
{
    int status;
    if (u->pid <= 0 || kill(u->pid, SIGSTOP) != 0)
        return -1;
    pid_t r;
    while ((r = waitpid(u->pid, &status, WUNTRACED)) < 0 && errno == EINTR)
        ;
    if (r != u->pid || !WIFSTOPPED(status))
        return -1;
    u->frozen = 1;
    return 0;
}

int up_thaw(up_unit *u)
{
    int status;
    if (u->pid <= 0 || kill(u->pid, SIGCONT) != 0)
        return -1;
    pid_t r;
    while ((r = waitpid(u->pid, &status, WCONTINUED)) < 0 && errno == EINTR)
        ;
    u->frozen = 0;
    return r == u->pid && WIFCONTINUED(status) ? 0 : -1;
}

void up_kill(up_unit *u)
{
    if (u->pid <= 0)
        return;
    kill(u->pid, SIGKILL);
    reap(u);
}

int up_stop(up_unit *u, int timeout_ms)
{
    if (u->pid <= 0)
        return -1;
    if (u->frozen)
        kill(u->pid, SIGCONT);
    kill(u->pid, SIGTERM);
    int64_t deadline = now_ms() + timeout_ms;
    int status = 0;
    for (;;) {
        pid_t r = waitpid(u->pid, &status, WNOHANG);
        if (r == u->pid)
            break;
        if ((r < 0 && errno != EINTR) || now_ms() > deadline) {
            up_kill(u);
            return -1;
        }
        sleep_ms(10);
    }
    u->pid = 0;
    u->frozen = 0;
    close(u->out_fd);
    u->out_fd = -1;
    return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
}

int up_count_fds(pid_t pid)
{
    char path[64];
    if (pid > 0)
        snprintf(path, sizeof path, "/proc/%d/fd", (int)pid);
    else
        snprintf(path, sizeof path, "/proc/self/fd");
    DIR *d = opendir(path);
    if (!d)
        return -1;
    int n = 0;
    struct dirent *e;
    while ((e = readdir(d)) != NULL)
        if (e->d_name[0] != '.')
            n++;
    closedir(d);
    return pid > 0 ? n : n - 1; /* not the directory stream's own fd */
}

size_t up_rss_kib(pid_t pid)
{
    char path[64];
    if (pid > 0)
        snprintf(path, sizeof path, "/proc/%d/statm", (int)pid);
    else
        snprintf(path, sizeof path, "/proc/self/statm");
    FILE *f = fopen(path, "r");
    unsigned long size = 0, resident = 0;
    if (!f)
        return 0;
    if (fscanf(f, "%lu %lu", &size, &resident) != 2)
        resident = 0;
    fclose(f);
    return (size_t)resident * ((size_t)sysconf(_SC_PAGESIZE) / 1024);
}
