/*
 * client.c - jobs-client: calls every op of jobs.idl on one jobs-unit and
 * checks every result (docs/USING.md, "The consumer example").
 *
 *   jobs-client ADDRESS [CAPACITY]
 *
 * ADDRESS is a fresh jobs-unit (one that no client has called yet), started
 * with --capacity CAPACITY (default 4, the unit's default). Exits 0 when
 * every check passed; otherwise prints "jobs-client: FAIL: ..." naming the
 * check and exits 1 (2 on a usage error).
 */
#define _POSIX_C_SOURCE 200809L
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "jobs.ctl.h"

#define CALL_MS 5000

static const char *address;
static ctl_client *client;
static ctl_error err;
static int checks;

/* Print the failed check (and the last call's error, if any) and exit 1. */
#define CHECK(cond, ...)                                                           \
    do {                                                                           \
        checks++;                                                                  \
        if (!(cond)) {                                                             \
            fprintf(stderr, "jobs-client: FAIL: ");                                \
            fprintf(stderr, __VA_ARGS__);                                          \
            fprintf(stderr, " (%s:%d: %s)%s%s\n", __FILE__, __LINE__, #cond,       \
                    err.msg ? "; last error: " : "", err.msg ? err.msg : "");      \
            exit(1);                                                               \
        }                                                                          \
    } while (0)

static bool str_is(ctl_str s, const char *want)
{
    return s.len == strlen(want) && memcmp(s.ptr, want, s.len) == 0;
}

static uint64_t submit(const char *name, const jobs_submit_args *args_or_null)
{
    jobs_submit_args a = JOBS_SUBMIT_ARGS_INIT;
    if (args_or_null)
        a = *args_or_null;
    a.name = ctl_str_c(name);
    uint64_t id = 0;
    int rc = jobs_submit(client, address, &a, CALL_MS, &id, &err);
    CHECK(rc == 0, "submit '%s' returned %d", name, rc);
    return id;
}

/* get(ids) into *out; the caller destroys *reply. */
static int get(const uint64_t *ids, size_t n, jobs_list_Job *out, ctl_reply **reply)
{
    jobs_get_args a = JOBS_GET_ARGS_INIT;
    a.ids = (jobs_list_u64){.items = ids, .count = n};
    ctl_error_clear(&err);
    return jobs_get(client, address, &a, CALL_MS, out, reply, &err);
}

static void expect_pending(uint32_t min_priority, const uint64_t *want, size_t n)
{
    jobs_pending_args a = JOBS_PENDING_ARGS_INIT;
    a.min_priority = min_priority;
    jobs_list_Job jobs;
    ctl_reply *reply = NULL;
    int rc = jobs_pending(client, address, &a, CALL_MS, &jobs, &reply, &err);
    CHECK(rc == 0, "pending(min_priority=%" PRIu32 ") returned %d", min_priority, rc);
    CHECK(jobs.count == n, "pending(min_priority=%" PRIu32 ") gave %zu jobs, not %zu",
          min_priority, jobs.count, n);
    for (size_t i = 0; i < n; i++)
        CHECK(jobs.items[i].id == want[i] && !jobs.items[i].done,
              "pending(min_priority=%" PRIu32 ")[%zu] is job %" PRIu64 ", not %" PRIu64,
              min_priority, i, jobs.items[i].id, want[i]);
    ctl_reply_destroy(&reply);
    printf("ok: pending(min_priority=%" PRIu32 ") lists %zu jobs\n", min_priority, n);
}

int main(int argc, char **argv)
{
    if (argc < 2 || argc > 3) {
        fprintf(stderr, "usage: jobs-client ADDRESS [CAPACITY]\n");
        return 2;
    }
    address = argv[1];
    unsigned long capacity = argc > 2 ? strtoul(argv[2], NULL, 10) : 4;
    if (capacity < 2 || capacity > 1000) {
        fprintf(stderr, "jobs-client: CAPACITY must be 2 to 1000\n");
        return 2;
    }
    ctl_error_init(&err);
    if (ctl_client_new(NULL, &client, &err) != 0) {
        fprintf(stderr, "jobs-client: %s\n", err.msg);
        return 1;
    }

    /* submit: one with the declared defaults, one with every argument. */
    uint64_t build = submit("build", NULL);
    jobs_submit_args full = JOBS_SUBMIT_ARGS_INIT;
    const ctl_str tags[] = {ctl_str_c("prod"), ctl_str_c("eu")};
    full.priority = 5;
    full.tags = (jobs_list_str){.items = tags, .count = 2};
    uint64_t deploy = submit("deploy", &full);
    CHECK(build == 1 && deploy == 2, "a fresh unit gave ids %" PRIu64 " and %" PRIu64
          ", not 1 and 2 (is the unit fresh?)", build, deploy);
    printf("ok: submit gave ids %" PRIu64 " and %" PRIu64 "\n", build, deploy);

    /* get: both records, defaults applied on the unit. */
    const uint64_t both[] = {deploy, build};
    jobs_list_Job jobs;
    ctl_reply *reply = NULL;
    CHECK(get(both, 2, &jobs, &reply) == 0, "get of two known jobs failed");
    CHECK(jobs.count == 2, "get gave %zu jobs, not 2", jobs.count);
    const jobs_Job *d = &jobs.items[0], *b = &jobs.items[1];
    CHECK(d->id == deploy && str_is(d->name, "deploy") && d->priority == 5 && !d->done,
          "get: job %" PRIu64 " came back wrong", deploy);
    CHECK(d->tags.count == 2 && str_is(d->tags.items[0], "prod") &&
              str_is(d->tags.items[1], "eu"),
          "get: the tags of job %" PRIu64 " came back wrong", deploy);
    CHECK(b->id == build && str_is(b->name, "build") && b->priority == 1 &&
              b->tags.count == 0 && !b->done,
          "get: job %" PRIu64 " did not get the defaults (priority 1, no tags)", build);
    ctl_reply_destroy(&reply);
    printf("ok: get returns both jobs, defaults applied\n");

    /* pending: a list of records, filtered by a defaulted argument. */
    expect_pending(0, (const uint64_t[]){deploy, build}, 2);
    expect_pending(2, (const uint64_t[]){deploy}, 1);

    /* finish: a notify, no reply. The get that follows on this thread rides
     * the same connection, so the unit has seen the notify by then. */
    jobs_finish_args fa = JOBS_FINISH_ARGS_INIT;
    fa.id = build;
    CHECK(jobs_finish(client, address, &fa, &err) == 0, "finish could not be sent");
    CHECK(get(&build, 1, &jobs, &reply) == 0 && jobs.count == 1 && jobs.items[0].done,
          "job %" PRIu64 " is not done after finish", build);
    ctl_reply_destroy(&reply);
    expect_pending(0, (const uint64_t[]){deploy}, 1);
    printf("ok: finish marked job %" PRIu64 " done\n", build);

    /* Error path 1: get of an unknown id raises Missing, naming it. */
    const uint64_t some_unknown[] = {build, 999};
    int rc = get(some_unknown, 2, &jobs, &reply);
    CHECK(rc == CTL_MISSING && err.kind == CTL_MISSING,
          "get of unknown job 999 returned %d (%s), not Missing", rc, ctl_kind_name(err.kind));
    CHECK(err.blob_count == 1 && str_is(err.blobs[0], "999"),
          "Missing names %zu ids, not exactly \"999\"", err.blob_count);
    CHECK(reply == NULL, "a failed get handed back a reply");
    printf("ok: get of job 999 raised Missing [999]: %s\n", err.msg);
    ctl_error_clear(&err);

    /* Error path 2: submit past the capacity raises UnitFull. */
    for (unsigned long n = 2; n < capacity; n++)
        submit("filler", NULL);
    jobs_submit_args over = JOBS_SUBMIT_ARGS_INIT;
    over.name = ctl_str_c("one too many");
    uint64_t id = 0;
    rc = jobs_submit(client, address, &over, CALL_MS, &id, &err);
    CHECK(rc == CTL_UNIT_FULL && err.kind == CTL_UNIT_FULL,
          "submit past a capacity of %lu returned %d (%s), not UnitFull", capacity, rc,
          ctl_kind_name(err.kind));
    printf("ok: submit past the capacity raised UnitFull: %s\n", err.msg);

    ctl_error_fini(&err);
    ctl_client_destroy(&client);
    printf("jobs-client: all %d checks passed\n", checks);
    return 0;
}
