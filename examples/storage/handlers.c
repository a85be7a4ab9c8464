/*
 * handlers.c - the storage service's handlers: see handlers.h.
 *
 * Each one gets typed args from the generated dispatch code and fills a
 * typed result. They run one at a time on the server thread under the
 * unit's lock, so the store needs no locking of its own. Results of get
 * point straight at the blobs in memory (packed while the lock is still
 * held). A large blob is kept by holding its put request (no copy), and a
 * get of it shares that hold with its reply (ctl_req_share), which then
 * goes out of the held message itself: no copy either way.
 */
#define _GNU_SOURCE
#include "handlers.h"

#include <inttypes.h>
#include <stdlib.h>
#include <string.h>

/* Each handler is declared with the function type generated for its op, so
 * a definition that does not match the op in idl/storage.idl is a compile
 * error (conflicting types), whatever the warning flags. */
static storage_put_handler on_put;
static storage_get_handler on_get;
static storage_describe_handler on_describe;
static storage_pin_handler on_pin;
static storage_unpin_handler on_unpin;
static storage_abort_handler on_abort;
static storage_delete_handler on_delete;
static storage_list_handler on_list;
static storage_stats_handler on_stats;

/* The absent keys of `keys`, as a Missing error; 0 when all are present. */
static int check_present(storage_unit *u, const storage_list_str *keys, ctl_req *req)
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

/* Blobs at least this large are kept by holding the request message
 * (no copy); smaller ones are copied, so a held message is never much
 * larger than the blob it keeps. */
#define HOLD_MIN ((size_t)64 * 1024)

static int on_put(void *ctx, const storage_put_args *a, uint64_t *result,
                  ctl_req *req)
{
    storage_unit *u = ctx;
    ctl_error err;
    bool taken = false;
    ctl_hold *hold = a->data.len >= HOLD_MIN ? ctl_req_hold(req, a->data) : NULL;
    ctl_error_init(&err);
    int rc = store_put(u->store, a->key, a->data, hold, a->pin, &taken, &err);
    if (!taken)
        ctl_hold_release(&hold);
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
    storage_unit *u = ctx;
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
            /* The last bin ends the reply: it may go from the held put
             * request itself, without a copy. */
            if (b->hold && i + 1 == a->keys.count)
                ctl_req_share(req, b->hold);
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
    storage_unit *u = ctx;
    int rc = check_present(u, &a->keys, req);
    if (rc)
        return rc;
    storage_BlobInfo *items = ctl_req_alloc(req, (a->keys.count ? a->keys.count : 1) * sizeof *items);
    if (!items)
        return ctl_req_fail(req, CTL_PROTOCOL, "out of memory");
    for (size_t i = 0; i < a->keys.count; i++) {
        const store_blob *b = store_find(u->store, a->keys.items[i]);
        /* From the record's defaults, so a field added to the IDL with a
         * default keeps it here. */
        storage_BlobInfo_init(&items[i]);
        items[i].key = b->key;
        items[i].size = b->size;
        items[i].pinned = b->pinned;
        items[i].spilled = b->spilled;
    }
    result->items = items;
    result->count = a->keys.count;
    return 0;
}

static int on_pin(void *ctx, const storage_pin_args *a, uint64_t *result,
                  ctl_req *req)
{
    storage_unit *u = ctx;
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
    storage_unit *u = ctx;
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
    storage_unit *u = ctx;
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
    storage_unit *u = ctx;
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

/* The keys of one page, in the order store_list gives them. */
typedef struct key_page {
    ctl_str *keys;
    size_t n;
} key_page;

static void take_key(const store_blob *b, void *arg)
{
    key_page *p = arg;
    p->keys[p->n++] = b->key;
}

/* A page of keys: sorted, after `after`, at most `limit` (or the unit's
 * page limit, --max-list-keys). The store seeks to the first key in its
 * key-ordered index and walks one page, so a page costs the same however
 * many blobs the unit holds. */
static int on_list(void *ctx, const storage_list_args *a,
                   storage_list_str *result, ctl_req *req)
{
    storage_unit *u = ctx;
    store_totals t;
    uint32_t page = store_max_list(u->store);
    size_t want = a->limit && a->limit < page ? a->limit : page;
    /* Without a limit, every match must fit in one page: one key past it
     * tells that it does not, without counting the rest. */
    size_t walk = a->limit ? want : (size_t)page + 1;
    store_totals_get(u->store, &t);
    size_t room = walk < t.blobs ? walk : (size_t)t.blobs;
    key_page p = {ctl_req_alloc(req, (room ? room : 1) * sizeof(ctl_str)), 0};
    if (!p.keys)
        return ctl_req_fail(req, CTL_PROTOCOL, "out of memory");
    store_list(u->store, a->prefix, a->after, room, take_key, &p);
    if (p.n > page)
        return ctl_req_fail(req, CTL_PROTOCOL,
                            "more than %" PRIu32 " keys match, and this unit lists at most "
                            "that many at once (--max-list-keys): page with 'after' and "
                            "'limit'", page);
    result->items = p.keys;
    result->count = p.n;
    return 0;
}

static int on_stats(void *ctx, storage_UnitStats *result, ctl_req *req)
{
    storage_unit *u = ctx;
    store_totals t;
    ctl_server_stats ss;
    (void)req;
    store_totals_get(u->store, &t);
    /* A unit served without a ctl_server (a dispatch core in a test) has
     * no server counters to report. */
    memset(&ss, 0, sizeof ss);
    if (u->server)
        ctl_server_stats_get(u->server, &ss);
    storage_UnitStats_init(result);
    result->blobs = t.blobs;
    result->bytes = t.bytes;
    result->capacity = t.capacity;
    result->pinned = t.pinned;
    result->spilled = t.spilled;
    result->requests = ss.requests;
    result->dropped = ss.dropped;
    result->index_bytes = t.index_bytes;
    result->index_capacity = t.index_capacity;
    return 0;
}

void storage_unit_handlers(storage_unit *u, storage_handlers *h)
{
    *h = (storage_handlers){
        .ctx = u,
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
}
