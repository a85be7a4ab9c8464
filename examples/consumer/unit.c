/*
 * unit.c - jobs-unit: one unit serving jobs.idl, the consumer example's
 * service (docs/USING.md, "The consumer example").
 *
 *   jobs-unit [--bind ENDPOINT] [--capacity N]
 *
 * Prints its bound endpoint as the first line of stdout (default bind
 * tcp://127.0.0.1:0, a free port), serves until SIGINT or SIGTERM, then
 * answers what has already arrived and exits with status 0. A job queue of
 * at most N jobs (default 4): submit past that raises UnitFull.
 *
 * It uses only what an installed ctlrpc provides: <ctlrpc/ctlrpc.h> (through
 * the generated jobs.ctl.h) and libctlrpc.
 */
#define _POSIX_C_SOURCE 200809L
#include <inttypes.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "jobs.ctl.h"

#define DEFAULT_CAPACITY 4

/* One job, owned by the queue (the strings are copies of what was sent). */
typedef struct job {
    uint64_t id;
    ctl_str name;
    uint32_t priority;
    ctl_str *tags;
    size_t tag_count;
    bool done;
} job;

typedef struct queue {
    job *jobs;
    size_t count, capacity;
} queue;

static ctl_str copy_str(ctl_str s)
{
    char *p = malloc(s.len ? s.len : 1);
    if (p && s.len)
        memcpy(p, s.ptr, s.len);
    return (ctl_str){.ptr = p, .len = p ? s.len : 0};
}

static job *find(queue *q, uint64_t id)
{
    /* Ids are 1, 2, 3 ... in submission order. */
    return id >= 1 && id <= q->count ? &q->jobs[id - 1] : NULL;
}

/* The record for `j`: views into the queue, packed while the job is held. */
static jobs_Job record_of(const job *j)
{
    jobs_Job r = JOBS_JOB_INIT;
    r.id = j->id;
    r.name = j->name;
    r.priority = j->priority;
    r.tags = (jobs_list_str){.items = j->tags, .count = j->tag_count};
    r.done = j->done;
    return r;
}

/* Each handler is declared with the type the generator gives it: a
 * signature that does not match jobs.idl is a compile error right here. */
static jobs_submit_handler on_submit;
static jobs_get_handler on_get;
static jobs_pending_handler on_pending;
static jobs_finish_handler on_finish;

static int on_submit(void *ctx, const jobs_submit_args *args, uint64_t *result,
                     ctl_req *req)
{
    queue *q = ctx;
    if (q->count == q->capacity)
        return ctl_req_fail(req, CTL_UNIT_FULL, "the unit holds %zu jobs, its capacity",
                            q->capacity);
    job *j = &q->jobs[q->count];
    memset(j, 0, sizeof *j);
    j->name = copy_str(args->name);
    j->tags = calloc(args->tags.count ? args->tags.count : 1, sizeof *j->tags);
    if (!j->name.ptr || !j->tags) {
        free((void *)j->name.ptr);
        free(j->tags);
        return ctl_req_fail(req, CTL_PROTOCOL, "out of memory");
    }
    for (size_t i = 0; i < args->tags.count; i++) {
        j->tags[i] = copy_str(args->tags.items[i]);
        j->tag_count += j->tags[i].ptr != NULL;
    }
    j->id = ++q->count;
    j->priority = args->priority;
    *result = j->id;
    return 0;
}

static int on_get(void *ctx, const jobs_get_args *args, jobs_list_Job *result, ctl_req *req)
{
    queue *q = ctx;
    size_t absent = 0;
    for (size_t i = 0; i < args->ids.count; i++)
        absent += find(q, args->ids.items[i]) == NULL;
    if (absent) {
        /* Missing names each unknown id, in decimal. */
        ctl_str *ids = ctl_req_alloc(req, absent * sizeof *ids);
        char *text = ctl_req_alloc(req, absent * 21);
        if (!ids || !text)
            return ctl_req_fail(req, CTL_PROTOCOL, "out of memory");
        size_t n = 0;
        for (size_t i = 0; i < args->ids.count; i++) {
            if (find(q, args->ids.items[i]))
                continue;
            int len = snprintf(text + 21 * n, 21, "%" PRIu64, args->ids.items[i]);
            ids[n] = (ctl_str){.ptr = text + 21 * n, .len = (size_t)len};
            n++;
        }
        return ctl_req_missing(req, ids, n, "%zu of %zu jobs are not on this unit", n,
                               args->ids.count);
    }
    jobs_Job *items = ctl_req_alloc(req, (args->ids.count ? args->ids.count : 1) * sizeof *items);
    if (!items)
        return ctl_req_fail(req, CTL_PROTOCOL, "out of memory");
    for (size_t i = 0; i < args->ids.count; i++)
        items[i] = record_of(find(q, args->ids.items[i]));
    *result = (jobs_list_Job){.items = items, .count = args->ids.count};
    return 0;
}

static int by_priority(const void *x, const void *y)
{
    const jobs_Job *a = x, *b = y;
    if (a->priority != b->priority)
        return a->priority > b->priority ? -1 : 1;
    return a->id < b->id ? -1 : a->id > b->id;
}

static int on_pending(void *ctx, const jobs_pending_args *args, jobs_list_Job *result,
                      ctl_req *req)
{
    queue *q = ctx;
    jobs_Job *items = ctl_req_alloc(req, (q->count ? q->count : 1) * sizeof *items);
    if (!items)
        return ctl_req_fail(req, CTL_PROTOCOL, "out of memory");
    size_t n = 0;
    for (size_t i = 0; i < q->count; i++)
        if (!q->jobs[i].done && q->jobs[i].priority >= args->min_priority)
            items[n++] = record_of(&q->jobs[i]);
    qsort(items, n, sizeof *items, by_priority);
    *result = (jobs_list_Job){.items = items, .count = n};
    return 0;
}

static int on_finish(void *ctx, const jobs_finish_args *args, ctl_req *req)
{
    (void)req;
    job *j = find(ctx, args->id);
    if (j)
        j->done = true;
    return 0;
}

static void queue_free(queue *q)
{
    for (size_t i = 0; i < q->count; i++) {
        free((void *)q->jobs[i].name.ptr);
        for (size_t t = 0; t < q->jobs[i].tag_count; t++)
            free((void *)q->jobs[i].tags[t].ptr);
        free(q->jobs[i].tags);
    }
    free(q->jobs);
}

static int usage(void)
{
    fprintf(stderr, "usage: jobs-unit [--bind tcp://HOST:PORT] [--capacity N]\n");
    return 2;
}

int main(int argc, char **argv)
{
    const char *bind = "tcp://127.0.0.1:0";
    unsigned long capacity = DEFAULT_CAPACITY;
    for (int i = 1; i < argc; i++) {
        if (strcmp(argv[i], "--bind") == 0 && i + 1 < argc) {
            bind = argv[++i];
        } else if (strcmp(argv[i], "--capacity") == 0 && i + 1 < argc) {
            char *end;
            capacity = strtoul(argv[++i], &end, 10);
            if (*end || capacity == 0 || capacity > 1000000)
                return usage();
        } else {
            return usage();
        }
    }

    /* SIGINT and SIGTERM are taken by sigwait below: block them before the
     * server thread starts, so that it inherits the mask. */
    sigset_t stop;
    sigemptyset(&stop);
    sigaddset(&stop, SIGINT);
    sigaddset(&stop, SIGTERM);
    pthread_sigmask(SIG_BLOCK, &stop, NULL);

    queue q = {.jobs = calloc(capacity, sizeof(job)), .capacity = capacity};
    if (!q.jobs) {
        fprintf(stderr, "jobs-unit: out of memory\n");
        return 1;
    }
    jobs_handlers h = {
        .ctx = &q,
        .on_submit = on_submit,
        .on_get = on_get,
        .on_pending = on_pending,
        .on_finish = on_finish,
    };
    ctl_server_options so;
    ctl_server_options_init(&so);
    so.endpoint = bind;
    ctl_server *server = NULL;
    ctl_error err;
    ctl_error_init(&err);
    if (jobs_serve(&h, &so, &server, &err) != 0) {
        fprintf(stderr, "jobs-unit: %s\n", err.msg);
        ctl_error_fini(&err);
        queue_free(&q);
        return 1;
    }
    printf("%s\n", ctl_server_endpoint(server));
    fflush(stdout);

    int sig = 0;
    while (sigwait(&stop, &sig) != 0)
        ;
    /* Answer what has arrived (for at most 1 s), then stop. */
    ctl_server_drain(server, 1000);
    ctl_server_stats ss;
    ctl_server_stats_get(server, &ss);
    fprintf(stderr, "jobs-unit: signal %d, stopped after %" PRIu64 " requests\n", sig,
            ss.requests);
    ctl_server_destroy(&server);
    queue_free(&q);
    ctl_error_fini(&err);
    return 0;
}
