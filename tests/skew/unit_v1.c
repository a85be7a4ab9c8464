/*
 * unit_v1.c - skew-unit-v1: a storage unit of the first release, for the
 * skew tests.
 *
 *   skew-unit-v1 [--bind ENDPOINT] [--capacity BYTES]
 *
 * Serves tests/skew/storage_v1.idl, the storage service as its first
 * release declared it: list(prefix) without paging, stats without the
 * index fields. Its stubs are generated from that file, so it refuses what
 * such a unit refused: an argument it does not know (`after`, `limit`) is a
 * Protocol error naming it, and its stats reply has no index_bytes or
 * index_capacity. It stands in for a unit nobody has upgraded yet, so that
 * today's clients are checked against one (tests/skew/test_skew.py).
 *
 * The store is deliberately small: a table of blobs in memory up to
 * --capacity bytes (default 1 MiB; beyond it a put is UnitFull), searched
 * linearly, with no spill directory. Prints its bound endpoint as the first
 * line of stdout and serves until SIGINT or SIGTERM.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <getopt.h>
#include <inttypes.h>
#include <pthread.h>
#include <signal.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "storage_v1.ctl.h"

/* The most blobs the unit holds: a put of a new key beyond it is UnitFull. */
#define MAX_BLOBS 4096

typedef struct blob {
    char *key;
    size_t key_len;
    char *data;
    size_t len;
    bool pinned;
} blob;

typedef struct unit {
    blob blobs[MAX_BLOBS];
    size_t count;
    uint64_t bytes, capacity;
    ctl_server *server;
    pthread_mutex_t lock; /* the server's handler lock */
} unit;

static blob *find(unit *u, ctl_str key)
{
    for (size_t i = 0; i < u->count; i++)
        if (u->blobs[i].key_len == key.len && memcmp(u->blobs[i].key, key.ptr, key.len) == 0)
            return &u->blobs[i];
    return NULL;
}

static void drop(unit *u, blob *b)
{
    u->bytes -= b->len;
    free(b->key);
    free(b->data);
    *b = u->blobs[--u->count];
}

/* Missing naming every absent key of `keys`; 0 when all are here. */
static int check_present(unit *u, const storage_list_str *keys, ctl_req *req)
{
    size_t absent = 0;
    for (size_t i = 0; i < keys->count; i++)
        absent += find(u, keys->items[i]) == NULL;
    if (absent == 0)
        return 0;
    ctl_str *ids = ctl_req_alloc(req, absent * sizeof *ids);
    if (!ids)
        return ctl_req_fail(req, CTL_PROTOCOL, "out of memory");
    size_t n = 0;
    for (size_t i = 0; i < keys->count; i++)
        if (!find(u, keys->items[i]))
            ids[n++] = keys->items[i];
    return ctl_req_missing(req, ids, n, "%zu of %zu keys are not on this unit", n,
                           keys->count);
}

static int on_put(void *ctx, const storage_put_args *a, uint64_t *result, ctl_req *req)
{
    unit *u = ctx;
    blob *old = find(u, a->key);
    if (old && old->pinned)
        return ctl_req_busy(req, "pinned", "blob '%.*s' is pinned", (int)a->key.len,
                            a->key.ptr);
    uint64_t after = u->bytes - (old ? old->len : 0) + a->data.len;
    if (after > u->capacity || (!old && u->count == MAX_BLOBS))
        return ctl_req_fail(req, CTL_UNIT_FULL, "%zu bytes do not fit (%" PRIu64 " of %" PRIu64
                            " bytes held)", a->data.len, u->bytes, u->capacity);
    char *data = malloc(a->data.len ? a->data.len : 1);
    char *key = old ? NULL : malloc(a->key.len ? a->key.len : 1);
    if (!data || (!old && !key)) {
        free(data);
        free(key);
        return ctl_req_fail(req, CTL_PROTOCOL, "out of memory");
    }
    memcpy(data, a->data.ptr, a->data.len);
    if (!old) {
        old = &u->blobs[u->count++];
        memcpy(key, a->key.ptr, a->key.len);
        *old = (blob){key, a->key.len, NULL, 0, false};
    }
    u->bytes = after;
    free(old->data);
    old->data = data;
    old->len = a->data.len;
    old->pinned = a->pin;
    *result = a->data.len;
    return 0;
}

static int on_get(void *ctx, const storage_get_args *a, storage_list_bin *result,
                  ctl_req *req)
{
    unit *u = ctx;
    int rc = check_present(u, &a->keys, req);
    if (rc)
        return rc;
    ctl_str *items = ctl_req_alloc(req, (a->keys.count ? a->keys.count : 1) * sizeof *items);
    if (!items)
        return ctl_req_fail(req, CTL_PROTOCOL, "out of memory");
    for (size_t i = 0; i < a->keys.count; i++) {
        const blob *b = find(u, a->keys.items[i]);
        items[i] = (ctl_str){b->data, b->len};
    }
    *result = (storage_list_bin){items, a->keys.count};
    return 0;
}

static int on_describe(void *ctx, const storage_describe_args *a,
                       storage_list_BlobInfo *result, ctl_req *req)
{
    unit *u = ctx;
    int rc = check_present(u, &a->keys, req);
    if (rc)
        return rc;
    storage_BlobInfo *items =
        ctl_req_alloc(req, (a->keys.count ? a->keys.count : 1) * sizeof *items);
    if (!items)
        return ctl_req_fail(req, CTL_PROTOCOL, "out of memory");
    for (size_t i = 0; i < a->keys.count; i++) {
        const blob *b = find(u, a->keys.items[i]);
        storage_BlobInfo_init(&items[i]);
        items[i].key = (ctl_str){b->key, b->key_len};
        items[i].size = b->len;
        items[i].pinned = b->pinned;
        items[i].spilled = false;
    }
    *result = (storage_list_BlobInfo){items, a->keys.count};
    return 0;
}

static int on_pin(void *ctx, const storage_pin_args *a, uint64_t *result, ctl_req *req)
{
    unit *u = ctx;
    int rc = check_present(u, &a->keys, req);
    if (rc)
        return rc;
    for (size_t i = 0; i < a->keys.count; i++)
        find(u, a->keys.items[i])->pinned = true;
    *result = a->keys.count;
    return 0;
}

static int on_unpin(void *ctx, const storage_unpin_args *a, ctl_req *req)
{
    unit *u = ctx;
    (void)req;
    for (size_t i = 0; i < a->keys.count; i++) {
        blob *b = find(u, a->keys.items[i]);
        if (b)
            b->pinned = false;
    }
    return 0;
}

static int on_abort(void *ctx, const storage_abort_args *a, ctl_req *req)
{
    unit *u = ctx;
    (void)req;
    for (size_t i = 0; i < a->keys.count; i++) {
        blob *b = find(u, a->keys.items[i]);
        if (b && !b->pinned)
            drop(u, b);
    }
    return 0;
}

static int on_delete(void *ctx, const storage_delete_args *a, uint64_t *result,
                     ctl_req *req)
{
    unit *u = ctx;
    for (size_t i = 0; i < a->keys.count; i++) {
        const blob *b = find(u, a->keys.items[i]);
        if (b && b->pinned)
            return ctl_req_busy(req, "pinned", "blob '%.*s' is pinned", (int)b->key_len,
                                b->key);
    }
    uint64_t n = 0;
    for (size_t i = 0; i < a->keys.count; i++) {
        blob *b = find(u, a->keys.items[i]);
        if (b) {
            drop(u, b);
            n++;
        }
    }
    *result = n;
    return 0;
}

/* Byte order, then length: memcmp over the common part, the shorter first. */
static int key_cmp(const void *pa, const void *pb)
{
    const ctl_str *a = pa, *b = pb;
    size_t n = a->len < b->len ? a->len : b->len;
    int c = n ? memcmp(a->ptr, b->ptr, n) : 0;
    return c ? c : (a->len > b->len) - (a->len < b->len);
}

/* Every key with the prefix, sorted, in one reply: this release has no
 * paging (and no page limit). */
static int on_list(void *ctx, const storage_list_args *a, storage_list_str *result,
                   ctl_req *req)
{
    unit *u = ctx;
    ctl_str *keys = ctl_req_alloc(req, (u->count ? u->count : 1) * sizeof *keys);
    if (!keys)
        return ctl_req_fail(req, CTL_PROTOCOL, "out of memory");
    size_t n = 0;
    for (size_t i = 0; i < u->count; i++) {
        const blob *b = &u->blobs[i];
        if (b->key_len >= a->prefix.len && memcmp(b->key, a->prefix.ptr, a->prefix.len) == 0)
            keys[n++] = (ctl_str){b->key, b->key_len};
    }
    qsort(keys, n, sizeof *keys, key_cmp);
    *result = (storage_list_str){keys, n};
    return 0;
}

static int on_stats(void *ctx, storage_UnitStats *result, ctl_req *req)
{
    unit *u = ctx;
    ctl_server_stats ss;
    (void)req;
    memset(&ss, 0, sizeof ss);
    if (u->server)
        ctl_server_stats_get(u->server, &ss);
    storage_UnitStats_init(result);
    result->blobs = u->count;
    result->bytes = u->bytes;
    result->capacity = u->capacity;
    for (size_t i = 0; i < u->count; i++)
        result->pinned += u->blobs[i].pinned;
    result->requests = ss.requests;
    result->dropped = ss.dropped;
    return 0;
}

int main(int argc, char **argv)
{
    static const struct option opts[] = {{"bind", required_argument, NULL, 'b'},
                                         {"capacity", required_argument, NULL, 'c'},
                                         {NULL, 0, NULL, 0}};
    const char *bind = "tcp://127.0.0.1:*";
    static unit u = {.capacity = 1u << 20, .lock = PTHREAD_MUTEX_INITIALIZER};
    int o;
    while ((o = getopt_long(argc, argv, "", opts, NULL)) != -1) {
        char *end = NULL;
        switch (o) {
        case 'b':
            bind = optarg;
            break;
        case 'c':
            errno = 0;
            u.capacity = strtoull(optarg, &end, 10);
            if (errno || end == optarg || *end) {
                fprintf(stderr, "skew-unit-v1: --capacity '%s' is not a number of bytes\n",
                        optarg);
                return 2;
            }
            break;
        default:
            fprintf(stderr, "usage: skew-unit-v1 [--bind ENDPOINT] [--capacity BYTES]\n");
            return 2;
        }
    }
    sigset_t stop;
    sigemptyset(&stop);
    sigaddset(&stop, SIGINT);
    sigaddset(&stop, SIGTERM);
    pthread_sigmask(SIG_BLOCK, &stop, NULL);

    storage_handlers h = {
        .ctx = &u,
        .on_put = on_put,
        .on_get = on_get,
        .on_describe = on_describe,
        .on_pin = on_pin,
        .on_unpin = on_unpin,
        .on_abort = on_abort,
        .on_delete = on_delete,
        .on_list = on_list,
        .on_stats = on_stats,
    };
    ctl_server_options so;
    ctl_server_options_init(&so);
    so.endpoint = bind;
    so.lock = &u.lock;
    ctl_error err;
    ctl_error_init(&err);
    /* Hold the lock until u.server is set, so stats never reads it unset. */
    pthread_mutex_lock(&u.lock);
    int rc = storage_serve(&h, &so, &u.server, &err);
    pthread_mutex_unlock(&u.lock);
    if (rc != 0) {
        fprintf(stderr, "skew-unit-v1: %s\n", err.msg);
        ctl_error_fini(&err);
        return 1;
    }
    printf("%s\n", ctl_server_endpoint(u.server));
    fflush(stdout);
    int sig = 0;
    while (sigwait(&stop, &sig) != 0)
        ;
    ctl_server_destroy(&u.server);
    while (u.count)
        drop(&u, &u.blobs[u.count - 1]);
    ctl_error_fini(&err);
    return 0;
}
