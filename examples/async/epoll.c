/*
 * epoll.c - ctl-async-epoll: the job of job.h on a plain epoll loop.
 *
 * The loop watches two descriptors: the client's event descriptor
 * (ctl_client_event_fd: readable, level-triggered, while completions are
 * queued) and a timerfd for the job's deadline. When the first is readable
 * it runs the queued completions with ctl_client_process; their callbacks
 * start the next calls. Nothing here blocks but epoll_wait.
 */
#define _GNU_SOURCE /* clock_gettime, timerfd under -std=c11 */
#include <errno.h>
#include <stdio.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/timerfd.h>
#include <time.h>
#include <unistd.h>

#include "job.h"

#define JOB_DEADLINE_S 120

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

int main(int argc, char **argv)
{
    job j;
    int rc = job_args(&j, argc, argv, "ctl-async-epoll");
    if (rc != 0)
        return rc;
    ctl_error err;
    ctl_error_init(&err);
    if (ctl_client_new(NULL, &j.client, &err) != 0) {
        fprintf(stderr, "ctl-async-epoll: %s\n", err.msg);
        return 1;
    }
    int ep = epoll_create1(EPOLL_CLOEXEC);
    int timer = timerfd_create(CLOCK_MONOTONIC, TFD_CLOEXEC);
    struct itimerspec at = {.it_value = {JOB_DEADLINE_S, 0}};
    struct epoll_event ev = {.events = EPOLLIN, .data.fd = ctl_client_event_fd(j.client)};
    struct epoll_event tev = {.events = EPOLLIN, .data.fd = timer};
    if (ep < 0 || timer < 0 || timerfd_settime(timer, 0, &at, NULL) != 0 ||
        epoll_ctl(ep, EPOLL_CTL_ADD, ev.data.fd, &ev) != 0 ||
        epoll_ctl(ep, EPOLL_CTL_ADD, timer, &tev) != 0) {
        fprintf(stderr, "ctl-async-epoll: cannot set up the loop: %s\n", strerror(errno));
        return 1;
    }
    double t0 = now_s();
    job_pump(&j);
    int timed_out = 0;
    while (!job_over(&j) && !timed_out) {
        struct epoll_event got[2];
        int n = epoll_wait(ep, got, 2, -1);
        if (n < 0 && errno == EINTR)
            continue;
        if (n < 0) {
            fprintf(stderr, "ctl-async-epoll: epoll_wait: %s\n", strerror(errno));
            break;
        }
        for (int i = 0; i < n; i++) {
            if (got[i].data.fd == timer)
                timed_out = 1;
            else
                ctl_client_process(j.client, 0);
        }
    }
    double took = now_s() - t0;
    /* Calls still in flight (a deadline hit) end here, their callbacks run. */
    ctl_client_destroy(&j.client);
    close(timer);
    close(ep);
    ctl_error_fini(&err);
    return job_report(&j, "ctl-async-epoll", took);
}
