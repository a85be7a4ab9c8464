/*
 * unit.c - ctl-storage-unit: one storage unit serving idl/storage.idl.
 *
 *   ctl-storage-unit [--bind ENDPOINT] [--capacity BYTES] [--spill-dir DIR]
 *                    [--max-msg-bytes BYTES] [--curve-secret FILE
 *                    [--curve-allow FILE]]
 *   ctl-storage-unit --gen-keys PREFIX
 *
 * Prints its bound endpoint as the first line of stdout, serves until
 * SIGINT or SIGTERM, then shuts down cleanly (spill files are removed).
 *
 * The handlers below are the whole service: each one gets typed args from
 * the generated dispatch code and fills a typed result. They run one at a
 * time on the server thread under the unit's lock, so the store needs no
 * locking of its own. Results of get point straight at the blobs in memory
 * (packed while the lock is still held), so serving a blob copies it once,
 * into the reply.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <getopt.h>
#include <inttypes.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "storage.ctl.h"
#include "store.h"

typedef struct unit {
    store *store;
    ctl_server *server; /* set under `lock` before any handler can run */
    pthread_mutex_t lock;
} unit;

/* The absent keys of `keys`, as a Missing error; 0 when all are present. */
static int check_present(unit *u, const storage_list_str *keys, ctl_req *req)
{
    size_t absent = 0;
    for (size_t i = 0; i < keys->count; i++)
        absent += store_find(u->store, keys->items[i]) == NULL;
    if (absent == 0)
        return 0;
    ctl_str *ids = ctl_req_alloc(req, absent * sizeof *ids);
    if (!ids)
        return ctl_req_fail(req, CTL_PROTOCOL, "out of memory");
    size_t n = 0;
    for (size_t i = 0; i < keys->count; i++)
        if (!store_find(u->store, keys->items[i]))
            ids[n++] = keys->items[i];
    return ctl_req_missing(req, ids, n, "%zu of %zu keys are not on this unit",
                           n, keys->count);
}

static int on_put(void *ctx, const storage_put_args *a, uint64_t *result,
                  ctl_req *req)
{
    unit *u = ctx;
    ctl_error err;
    ctl_error_init(&err);
    int rc = store_put(u->store, a->key, a->data, a->pin, &err);
    if (rc == 0)
        *result = a->data.len;
    else
        ctl_req_fail_error(req, &err);
    ctl_error_fini(&err);
    return rc;
}

static int on_get(void *ctx, const storage_get_args *a,
                  storage_list_bin *result, ctl_req *req)
{
    unit *u = ctx;
    int rc = check_present(u, &a->keys, req);
    if (rc)
        return rc;
    ctl_str *items = ctl_req_alloc(req, (a->keys.count ? a->keys.count : 1) * sizeof *items);
    if (!items)
        return ctl_req_fail(req, CTL_PROTOCOL, "out of memory");
    for (size_t i = 0; i < a->keys.count; i++) {
        store_blob *b = store_find(u->store, a->keys.items[i]);
        if (!b->spilled) {
            items[i] = (ctl_str){(const char *)b->data, b->size};
            continue;
        }
        void *buf = ctl_req_alloc(req, b->size ? b->size : 1);
        ctl_error err;
        ctl_error_init(&err);
        if (!buf)
            rc = ctl_req_fail(req, CTL_PROTOCOL, "out of memory reading a spilled blob");
        else if (store_read_spilled(u->store, b, buf, &err) != 0)
            rc = ctl_req_fail_error(req, &err);
        ctl_error_fini(&err);
        if (rc)
            return rc;
        items[i] = (ctl_str){buf, b->size};
    }
    result->items = items;
    result->count = a->keys.count;
    return 0;
}

static int on_describe(void *ctx, const storage_describe_args *a,
                       storage_list_BlobInfo *result, ctl_req *req)
{
    unit *u = ctx;
    int rc = check_present(u, &a->keys, req);
    if (rc)
        return rc;
    storage_BlobInfo *items = ctl_req_alloc(req, (a->keys.count ? a->keys.count : 1) * sizeof *items);
    if (!items)
        return ctl_req_fail(req, CTL_PROTOCOL, "out of memory");
    for (size_t i = 0; i < a->keys.count; i++) {
        const store_blob *b = store_find(u->store, a->keys.items[i]);
        items[i] = (storage_BlobInfo){b->key, b->size, b->pinned, b->spilled};
    }
    result->items = items;
    result->count = a->keys.count;
    return 0;
}

static int on_pin(void *ctx, const storage_pin_args *a, uint64_t *result,
                  ctl_req *req)
{
    unit *u = ctx;
    int rc = check_present(u, &a->keys, req);
    if (rc)
        return rc;
    /* "How many are now pinned": the distinct blobs this call names. */
    uint64_t pass = store_new_pass(u->store), n = 0;
    for (size_t i = 0; i < a->keys.count; i++) {
        store_blob *b = store_find(u->store, a->keys.items[i]);
        store_set_pinned(u->store, b, true);
        n += store_mark(b, pass);
    }
    *result = n;
    return 0;
}

static int on_unpin(void *ctx, const storage_unpin_args *a, ctl_req *req)
{
    unit *u = ctx;
    (void)req;
    for (size_t i = 0; i < a->keys.count; i++) {
        store_blob *b = store_find(u->store, a->keys.items[i]);
        if (b)
            store_set_pinned(u->store, b, false);
    }
    return 0;
}

static int on_abort(void *ctx, const storage_abort_args *a, ctl_req *req)
{
    unit *u = ctx;
    (void)req;
    for (size_t i = 0; i < a->keys.count; i++) {
        store_blob *b = store_find(u->store, a->keys.items[i]);
        if (b && !b->pinned)
            store_remove(u->store, a->keys.items[i]);
    }
    return 0;
}

static int on_delete(void *ctx, const storage_delete_args *a,
                     uint64_t *result, ctl_req *req)
{
    unit *u = ctx;
    for (size_t i = 0; i < a->keys.count; i++) {
        store_blob *b = store_find(u->store, a->keys.items[i]);
        if (b && b->pinned)
            return ctl_req_busy(req, "pinned",
                                "a named blob is pinned; nothing was deleted");
    }
    uint64_t n = 0;
    for (size_t i = 0; i < a->keys.count; i++) {
        if (store_find(u->store, a->keys.items[i])) {
            store_remove(u->store, a->keys.items[i]);
            n++;
        }
    }
    *result = n;
    return 0;
}

typedef struct key_list {
    ctl_str *keys;
    size_t n, cap;
    int failed;
} key_list;

static void collect_key(store_blob *b, void *arg)
{
    key_list *l = arg;
    if (l->n < l->cap)
        l->keys[l->n++] = b->key;
}

/* Byte order, then length: the order of memcmp on keys, which is what a
 * peer in any language gets by sorting byte strings. */
static int cmp_key(const void *x, const void *y)
{
    const ctl_str *a = x, *b = y;
    int c = memcmp(a->ptr, b->ptr, a->len < b->len ? a->len : b->len);
    if (c)
        return c;
    return a->len < b->len ? -1 : a->len > b->len;
}

static int on_list(void *ctx, const storage_list_args *a,
                   storage_list_str *result, ctl_req *req)
{
    unit *u = ctx;
    store_totals t;
    store_totals_get(u->store, &t);
    key_list l = {ctl_req_alloc(req, (t.blobs ? t.blobs : 1) * sizeof(ctl_str)), 0, t.blobs, 0};
    if (!l.keys)
        return ctl_req_fail(req, CTL_PROTOCOL, "out of memory");
    store_each(u->store, a->prefix, collect_key, &l);
    qsort(l.keys, l.n, sizeof *l.keys, cmp_key);
    result->items = l.keys;
    result->count = l.n;
    return 0;
}

static int on_stats(void *ctx, storage_UnitStats *result, ctl_req *req)
{
    unit *u = ctx;
    store_totals t;
    ctl_server_stats ss;
    (void)req;
    store_totals_get(u->store, &t);
    ctl_server_stats_get(u->server, &ss);
    *result = (storage_UnitStats){t.blobs, t.bytes, t.capacity, t.pinned,
                                  t.spilled, ss.requests, ss.dropped};
    return 0;
}

static void usage(FILE *f)
{
    fprintf(f,
            "usage: ctl-storage-unit [--bind ENDPOINT] [--capacity BYTES]\n"
            "                        [--spill-dir DIR] [--max-msg-bytes BYTES]\n"
            "                        [--curve-secret FILE [--curve-allow FILE]]\n"
            "       ctl-storage-unit --gen-keys PREFIX\n"
            "\n"
            "Serve one storage unit (idl/storage.idl) until SIGINT or SIGTERM.\n"
            "The first line of stdout is the bound endpoint.\n"
            "\n"
            "  --bind ENDPOINT      tcp://host:port; port 0 or * picks a free one\n"
            "                       (default tcp://<node ip>:0; the node ip can be\n"
            "                       set with $%s)\n"
            "  --capacity BYTES     bytes held in memory, e.g. 64M, 1G (default 1G)\n"
            "  --spill-dir DIR      write blobs that do not fit in memory here\n"
            "                       (created if missing; its blob files are removed\n"
            "                       at shutdown) instead of refusing them\n"
            "  --max-msg-bytes N    largest request accepted (default 256M)\n"
            "  --curve-secret FILE  encrypt with CURVE: the unit's secret key (the\n"
            "                       file must not be readable by others); only\n"
            "                       clients that know its public key get through\n"
            "  --curve-allow FILE   also require clients to hold one of the public\n"
            "                       keys listed in FILE (one per line)\n"
            "  --gen-keys PREFIX    write a new key pair to PREFIX.key (secret,\n"
            "                       mode 0600) and PREFIX.pub, then exit\n",
            CTL_NODE_IP_ENV);
}

int main(int argc, char **argv)
{
    static const struct option opts[] = {
        {"bind", required_argument, NULL, 'b'},
        {"capacity", required_argument, NULL, 'c'},
        {"spill-dir", required_argument, NULL, 's'},
        {"max-msg-bytes", required_argument, NULL, 'm'},
        {"curve-secret", required_argument, NULL, 'k'},
        {"curve-allow", required_argument, NULL, 'A'},
        {"gen-keys", required_argument, NULL, 'g'},
        {"help", no_argument, NULL, 'h'},
        {NULL, 0, NULL, 0},
    };
    const char *bind = NULL, *spill = NULL, *secret_file = NULL, *allow_file = NULL;
    uint64_t capacity = (uint64_t)1 << 30, max_msg = 0;
    int c;
    while ((c = getopt_long(argc, argv, "h", opts, NULL)) != -1) {
        switch (c) {
        case 'b':
            bind = optarg;
            break;
        case 'c':
            if (store_parse_size(optarg, &capacity) != 0) {
                fprintf(stderr, "ctl-storage-unit: --capacity '%s' is not a "
                        "size (e.g. 1048576, 64M, 1G)\n", optarg);
                return 2;
            }
            break;
        case 's':
            spill = optarg;
            break;
        case 'm':
            if (store_parse_size(optarg, &max_msg) != 0 || max_msg == 0) {
                fprintf(stderr, "ctl-storage-unit: --max-msg-bytes '%s' is not "
                        "a positive size\n", optarg);
                return 2;
            }
            break;
        case 'k':
            secret_file = optarg;
            break;
        case 'A':
            allow_file = optarg;
            break;
        case 'g': {
            ctl_error gerr;
            ctl_error_init(&gerr);
            int grc = ctl_curve_write_keypair(optarg, &gerr);
            if (grc)
                fprintf(stderr, "ctl-storage-unit: %s\n", gerr.msg);
            else
                printf("wrote %s.key (secret) and %s.pub\n", optarg, optarg);
            ctl_error_fini(&gerr);
            return grc ? 1 : 0;
        }
        case 'h':
            usage(stdout);
            return 0;
        default:
            usage(stderr);
            return 2;
        }
    }
    if (allow_file && !secret_file) {
        fprintf(stderr, "ctl-storage-unit: --curve-allow needs --curve-secret\n");
        return 2;
    }
    if (optind < argc) {
        fprintf(stderr, "ctl-storage-unit: unexpected argument '%s'\n", argv[optind]);
        usage(stderr);
        return 2;
    }

    /* Signals are taken synchronously by this thread (sigwait below); block
     * them before any thread starts so none of them gets one. */
    sigset_t stop;
    sigemptyset(&stop);
    sigaddset(&stop, SIGINT);
    sigaddset(&stop, SIGTERM);
    pthread_sigmask(SIG_BLOCK, &stop, NULL);

    unit u = {NULL, NULL, PTHREAD_MUTEX_INITIALIZER};
    ctl_error err;
    ctl_error_init(&err);
    char secret[CTL_CURVE_KEY_BUF] = "";
    char(*allow)[CTL_CURVE_KEY_BUF] = NULL;
    const char **allow_ptrs = NULL;
    size_t allow_count = 0;
    if ((secret_file && ctl_curve_read_key(secret_file, true, secret, &err) != 0) ||
        (allow_file &&
         ctl_curve_read_allowlist(allow_file, &allow, &allow_count, &err) != 0)) {
        fprintf(stderr, "ctl-storage-unit: %s\n", err.msg);
        ctl_error_fini(&err);
        return 2;
    }
    if (allow_file && allow_count == 0) {
        fprintf(stderr, "ctl-storage-unit: allowlist %s lists no keys\n", allow_file);
        return 2;
    }
    allow_ptrs = calloc(allow_count ? allow_count : 1, sizeof *allow_ptrs);
    for (size_t i = 0; allow_ptrs && i < allow_count; i++)
        allow_ptrs[i] = allow[i];
    if (store_new(capacity, spill, &u.store, &err) != 0) {
        fprintf(stderr, "ctl-storage-unit: %s\n", err.msg);
        ctl_error_fini(&err);
        return 1;
    }
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
    so.limits.max_msg_bytes = (size_t)max_msg;
    so.curve_secret_key = secret_file ? secret : NULL;
    so.curve_allow = allow_ptrs;
    so.curve_allow_count = allow_count;

    /* Hold the lock until u.server is set: a request that arrives at once
     * waits for it instead of reading a NULL server in stats. */
    pthread_mutex_lock(&u.lock);
    int rc = storage_serve(&h, &so, &u.server, &err);
    pthread_mutex_unlock(&u.lock);
    memset(secret, 0, sizeof secret);
    free(allow_ptrs);
    free(allow);
    if (rc != 0) {
        fprintf(stderr, "ctl-storage-unit: %s\n", err.msg);
        store_destroy(&u.store);
        ctl_error_fini(&err);
        return 1;
    }
    printf("%s\n", ctl_server_endpoint(u.server));
    fflush(stdout);

    int sig = 0;
    while (sigwait(&stop, &sig) != 0)
        ;
    fprintf(stderr, "ctl-storage-unit: %s, shutting down\n", strsignal(sig));
    ctl_server_destroy(&u.server);
    store_destroy(&u.store);
    ctl_error_fini(&err);
    return 0;
}
