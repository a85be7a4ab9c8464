/*
 * libuv.c - ctl-async-uv: the job of job.h on a libuv loop.
 *
 * A uv_poll_t watches the client's event descriptor (level-triggered, so
 * libuv's poll handle sees it readable for as long as completions are
 * queued) and runs them with ctl_client_process; a uv_timer_t gives the
 * job its deadline. When the job is over both handles are closed and
 * uv_run returns.
 */
#define _GNU_SOURCE /* uv.h needs the POSIX types under -std=c11 */
#include <stdio.h>
#include <uv.h>

#include "job.h"

#define JOB_DEADLINE_MS 120000

typedef struct app {
    job j;
    uv_poll_t poll;
    uv_timer_t timer;
    int closing;
} app;

static void stop(app *a)
{
    if (a->closing)
        return;
    a->closing = 1;
    uv_poll_stop(&a->poll);
    uv_close((uv_handle_t *)&a->poll, NULL);
    uv_close((uv_handle_t *)&a->timer, NULL);
}

static void on_readable(uv_poll_t *h, int status, int events)
{
    app *a = h->data;
    (void)events;
    if (status < 0) {
        fprintf(stderr, "ctl-async-uv: poll: %s\n", uv_strerror(status));
        stop(a);
        return;
    }
    ctl_client_process(a->j.client, 0);
    if (job_over(&a->j))
        stop(a);
}

static void on_deadline(uv_timer_t *t)
{
    stop(t->data);
}

int main(int argc, char **argv)
{
    static app a;
    int rc = job_args(&a.j, argc, argv, "ctl-async-uv");
    if (rc != 0)
        return rc;
    ctl_error err;
    ctl_error_init(&err);
    if (ctl_client_new(NULL, &a.j.client, &err) != 0) {
        fprintf(stderr, "ctl-async-uv: %s\n", err.msg);
        return 1;
    }
    uv_loop_t *loop = uv_default_loop();
    a.poll.data = a.timer.data = &a;
    if (uv_poll_init(loop, &a.poll, ctl_client_event_fd(a.j.client)) != 0 ||
        uv_poll_start(&a.poll, UV_READABLE, on_readable) != 0 ||
        uv_timer_init(loop, &a.timer) != 0 ||
        uv_timer_start(&a.timer, on_deadline, JOB_DEADLINE_MS, 0) != 0) {
        fprintf(stderr, "ctl-async-uv: cannot set up the loop\n");
        return 1;
    }
    uint64_t t0 = uv_hrtime();
    job_pump(&a.j);
    if (job_over(&a.j))
        stop(&a);
    uv_run(loop, UV_RUN_DEFAULT);
    double took = (double)(uv_hrtime() - t0) / 1e9;
    ctl_client_destroy(&a.j.client);
    uv_loop_close(loop);
    ctl_error_fini(&err);
    return job_report(&a.j, "ctl-async-uv", took);
}
