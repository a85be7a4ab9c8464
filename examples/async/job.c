/*
 * job.c - see job.h.
 */
#include "job.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define CALL_TIMEOUT_MS 10000
#define BLOB_BYTES 64

/* One call's context: which blob it is about. */
typedef struct call_ctx {
    job *j;
    int index;
} call_ctx;

static void blob_key(int index, char *buf, size_t size)
{
    snprintf(buf, size, "async-example-%06d", index);
}

static void blob_bytes(int index, unsigned char out[BLOB_BYTES])
{
    for (int i = 0; i < BLOB_BYTES; i++)
        out[i] = (unsigned char)(index * 31 + i);
}

static void failed(job *j, const char *what, const ctl_error *err)
{
    if (j->failed++ == 0)
        snprintf(j->first_error, sizeof j->first_error, "%s: %s", what,
                 err && err->msg ? err->msg : "could not start");
}

static void finish_one(job *j)
{
    j->in_flight--;
    j->done++;
    if (j->done == j->calls && j->phase < 2) {
        /* This phase is over: the next starts from zero. */
        j->phase++;
        j->started = j->done = 0;
    }
    job_pump(j);
}

static void on_put(void *user, const ctl_error *err, const uint64_t *stored)
{
    call_ctx *c = user;
    job *j = c->j;
    if (!stored || *stored != BLOB_BYTES)
        failed(j, "put", err);
    free(c);
    finish_one(j);
}

/* The result's views (the blob's bytes) live until this returns: compare
 * them here, copy nothing. */
static void on_get(void *user, const ctl_error *err, const storage_list_bin *blobs)
{
    call_ctx *c = user;
    job *j = c->j;
    unsigned char want[BLOB_BYTES];
    blob_bytes(c->index, want);
    if (!blobs || blobs->count != 1 || blobs->items[0].len != BLOB_BYTES ||
        memcmp(blobs->items[0].ptr, want, BLOB_BYTES) != 0)
        failed(j, "get", err && err->kind ? err
                                          : &(ctl_error){.msg = "wrong bytes"});
    free(c);
    finish_one(j);
}

static int start_one(job *j, int index)
{
    const char *address = j->addresses[(size_t)index % j->n_addresses];
    char key[64];
    blob_key(index, key, sizeof key);
    call_ctx *c = malloc(sizeof *c);
    if (!c)
        return -1;
    c->j = j;
    c->index = index;
    int rc;
    /* Args live on this stack frame: the stubs copy them before returning. */
    if (j->phase == 0) {
        unsigned char data[BLOB_BYTES];
        blob_bytes(index, data);
        storage_put_args a = STORAGE_PUT_ARGS_INIT;
        a.key = (ctl_str){key, strlen(key)};
        a.data = (ctl_str){(const char *)data, sizeof data};
        rc = storage_put_start(j->client, address, &a, CALL_TIMEOUT_MS, on_put, c, NULL);
    } else {
        ctl_str k = {key, strlen(key)};
        storage_get_args a = STORAGE_GET_ARGS_INIT;
        a.keys = (storage_list_str){&k, 1};
        rc = storage_get_start(j->client, address, &a, CALL_TIMEOUT_MS, on_get, c, NULL);
    }
    if (rc != 0)
        free(c);
    return rc;
}

void job_pump(job *j)
{
    while (j->phase < 2 && !j->failed && j->in_flight < j->window && j->started < j->calls) {
        if (start_one(j, j->started) != 0) {
            failed(j, j->phase == 0 ? "put_start" : "get_start", NULL);
            return;
        }
        j->started++;
        if (++j->in_flight > j->most_in_flight)
            j->most_in_flight = j->in_flight;
    }
}

int job_over(const job *j)
{
    return j->phase == 2 || (j->failed && j->in_flight == 0);
}

int job_report(const job *j, const char *loop, double seconds)
{
    if (j->failed) {
        fprintf(stderr, "%s: %d calls failed; the first: %s\n", loop, j->failed,
                j->first_error);
        return 1;
    }
    if (j->phase != 2) {
        fprintf(stderr, "%s: the job did not finish in time (%d calls in flight)\n", loop,
                j->in_flight);
        return 1;
    }
    printf("%s: put and got back %d blobs over %zu unit(s), up to %d calls in flight "
           "from one thread, in %.3f s\n",
           loop, j->calls, j->n_addresses, j->most_in_flight, seconds);
    return 0;
}

int job_args(job *j, int argc, char **argv, const char *program)
{
    memset(j, 0, sizeof *j);
    j->calls = 2000;
    j->window = 64;
    int i = 1;
    for (; i < argc && strncmp(argv[i], "--", 2) == 0; i += 2) {
        long v = i + 1 < argc ? strtol(argv[i + 1], NULL, 10) : 0;
        if (strcmp(argv[i], "--calls") == 0 && v > 0 && v <= 10000000)
            j->calls = (int)v;
        else if (strcmp(argv[i], "--window") == 0 && v > 0 && v <= 4096)
            j->window = (int)v;
        else
            goto usage;
    }
    if (i >= argc)
        goto usage;
    j->addresses = (const char *const *)&argv[i];
    j->n_addresses = (size_t)(argc - i);
    return 0;
usage:
    fprintf(stderr,
            "usage: %s [--calls N] [--window K] ADDRESS...\n"
            "Put N blobs of 64 bytes over the storage units at ADDRESS..., then get\n"
            "them back, with up to K calls in flight from one thread (default N 2000,\n"
            "K 64).\n",
            program);
    return 2;
}
