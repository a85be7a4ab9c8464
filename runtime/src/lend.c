/*
 * lend.c - large bytes a message carries without copying them
 * (lend_int.h), and the ctl_blob lender (ctlrpc/blob.h).
 */
#include "lend_int.h"

#include <pthread.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "bigbuf_int.h"
#include "util_int.h"

void ctl_lender_init(ctl_lender *l, const ctl_lender_ops *ops)
{
    l->ops = ops;
    atomic_init(&l->lent, false);
}

/* ---- blobs -------------------------------------------------------------- */

struct ctl_blob {
    ctl_lender lender; /* first: a lender is its blob */
    atomic_size_t refs; /* the owner's, segments', messages' */
    char *base;         /* CTL_BLOB_ROOM, the data, CTL_BLOB_ROOM */
    char *data;
    size_t size;
};

/* The live blobs, sorted by data address, for ctl_lender_find. A process
 * has few blobs at once; an insertion moves the pointers after it. */
static pthread_mutex_t reg_lock = PTHREAD_MUTEX_INITIALIZER;
static ctl_blob **reg;
static size_t reg_len, reg_cap;

/* The index of the first blob whose data starts after `ptr`. */
static size_t reg_upper(const char *ptr)
{
    size_t lo = 0, hi = reg_len;
    while (lo < hi) {
        size_t mid = lo + (hi - lo) / 2;
        if ((uintptr_t)reg[mid]->data <= (uintptr_t)ptr)
            lo = mid + 1;
        else
            hi = mid;
    }
    return lo;
}

static void blob_ref(ctl_lender *l)
{
    atomic_fetch_add_explicit(&((ctl_blob *)l)->refs, 1, memory_order_relaxed);
}

static void blob_unref(ctl_lender *l)
{
    ctl_blob *b = (ctl_blob *)l;
    if (atomic_fetch_sub_explicit(&b->refs, 1, memory_order_acq_rel) == 1) {
        free(b->base);
        free(b);
    }
}

static void blob_room(const ctl_lender *l, const char *ptr, size_t len, size_t *head,
                      size_t *tail)
{
    /* The room is outside the data: a range inside it has the caller's
     * bytes next to it, which no message may write over. */
    const ctl_blob *b = (const ctl_blob *)l;
    *head = ptr == b->data ? CTL_BLOB_ROOM : 0;
    *tail = ptr + len == b->data + b->size ? CTL_BLOB_ROOM : 0;
}

static const ctl_lender_ops blob_ops = {blob_ref, blob_unref, blob_room};

ctl_blob *ctl_blob_new(size_t size)
{
    if (size == 0 || size > SIZE_MAX - 2 * CTL_BLOB_ROOM)
        return NULL;
    ctl_blob *b = malloc(sizeof *b);
    void *base = NULL;
    /* CTL_BLOB_ROOM is a page: the data starts on a page boundary. */
    if (!b || posix_memalign(&base, CTL_BLOB_ROOM, size + 2 * CTL_BLOB_ROOM) != 0) {
        free(b);
        return NULL;
    }
    ctl_lender_init(&b->lender, &blob_ops);
    atomic_init(&b->refs, 1);
    b->base = base;
    b->data = b->base + CTL_BLOB_ROOM;
    b->size = size;
    pthread_mutex_lock(&reg_lock);
    if (reg_len == reg_cap) {
        size_t cap = reg_cap ? 2 * reg_cap : 16;
        ctl_blob **grown = realloc(reg, cap * sizeof *grown);
        if (!grown) {
            pthread_mutex_unlock(&reg_lock);
            free(base);
            free(b);
            return NULL;
        }
        reg = grown;
        reg_cap = cap;
    }
    size_t at = reg_upper(b->data);
    memmove(reg + at + 1, reg + at, (reg_len - at) * sizeof *reg);
    reg[at] = b;
    reg_len++;
    pthread_mutex_unlock(&reg_lock);
    return b;
}

void *ctl_blob_data(ctl_blob *blob)
{
    return blob->data;
}

size_t ctl_blob_size(const ctl_blob *blob)
{
    return blob->size;
}

ctl_str ctl_blob_bin(const ctl_blob *blob, size_t off, size_t len)
{
    if (off > blob->size)
        off = blob->size;
    if (len > blob->size - off)
        len = blob->size - off;
    return (ctl_str){blob->data + off, len};
}

bool ctl_blob_sending(const ctl_blob *blob)
{
    return atomic_load_explicit(&blob->lender.lent, memory_order_acquire);
}

void ctl_blob_release(ctl_blob **blob)
{
    if (!blob || !*blob)
        return;
    ctl_blob *b = *blob;
    *blob = NULL;
    pthread_mutex_lock(&reg_lock);
    size_t at = reg_upper(b->data);
    if (at > 0 && reg[at - 1] == b) {
        memmove(reg + at - 1, reg + at, (reg_len - at) * sizeof *reg);
        reg_len--;
    }
    if (reg_len == 0) {
        free(reg);
        reg = NULL;
        reg_cap = 0;
    }
    pthread_mutex_unlock(&reg_lock);
    blob_unref(&b->lender);
}

ctl_lender *ctl_lender_find(const char *ptr, size_t len)
{
    ctl_lender *found = NULL;
    pthread_mutex_lock(&reg_lock);
    size_t at = reg_len ? reg_upper(ptr) : 0;
    if (at > 0) {
        ctl_blob *b = reg[at - 1];
        if (ctl_bytes_within(ptr, len, b->data, b->size)) {
            blob_ref(&b->lender);
            found = &b->lender;
        }
    }
    pthread_mutex_unlock(&reg_lock);
    return found;
}

/* ---- segments ----------------------------------------------------------- */

void ctl_seg_drop(ctl_seg *seg)
{
    if (seg->lender)
        seg->lender->ops->unref(seg->lender);
    *seg = (ctl_seg){0};
}

int ctl_seg_flatten(msgpack_sbuffer *sb, ctl_seg *seg)
{
    if (!seg->lender)
        return 0;
    int rc = 0;
    size_t after = sb->size - seg->at;
    if (after == 0) {
        rc = ctl_sbuffer_write(sb, seg->ptr, seg->len);
    } else {
        /* The bytes packed after it are few (the args after a bin): moved
         * aside, then written back after it. */
        char *tail = malloc(after);
        if (!tail) {
            rc = -1;
        } else {
            memcpy(tail, sb->data + seg->at, after);
            sb->size = seg->at;
            rc = ctl_sbuffer_write(sb, seg->ptr, seg->len) || ctl_sbuffer_write(sb, tail, after);
            free(tail);
        }
    }
    ctl_seg_drop(seg);
    return rc ? -1 : 0;
}

int ctl_seg_append(msgpack_sbuffer *sb, ctl_seg *seg, ctl_lender *cand,
                   const char *buf, size_t len)
{
    if (!cand || len < CTL_BLOB_MIN) {
        if (cand)
            cand->ops->unref(cand);
        return ctl_sbuffer_write(sb, buf, len);
    }
    if (seg->lender && ctl_seg_flatten(sb, seg) != 0) {
        cand->ops->unref(cand);
        return -1;
    }
    *seg = (ctl_seg){cand, buf, len, sb->size};
    return 0;
}

/* ZeroMQ is done with a message in a lender's room. */
static void lent_done(void *data, void *hint)
{
    ctl_lender *l = hint;
    (void)data;
    atomic_store_explicit(&l->lent, false, memory_order_release);
    l->ops->unref(l);
}

int ctl_payload_take(ctl_payload *p, msgpack_sbuffer *sb, ctl_seg *seg)
{
    ctl_lender *l = seg->lender;
    if (l) {
        size_t head, tail, before = seg->at, after = sb->size - seg->at;
        bool idle = false;
        l->ops->room(l, seg->ptr, seg->len, &head, &tail);
        if (before <= head && after <= tail &&
            atomic_compare_exchange_strong_explicit(&l->lent, &idle, true,
                                                    memory_order_acq_rel,
                                                    memory_order_relaxed)) {
            char *start = (char *)seg->ptr - before;
            memcpy(start, sb->data, before);
            if (after)
                memcpy((char *)seg->ptr + seg->len, sb->data + seg->at, after);
            *p = (ctl_payload){start, before + seg->len + after, lent_done, l};
            *seg = (ctl_seg){0}; /* its reference is the message's now */
            return 0;
        }
        if (ctl_seg_flatten(sb, seg) != 0)
            return -1;
    }
    size_t size = sb->size, cap = sb->alloc;
    char *data = msgpack_sbuffer_release(sb);
    if (!data)
        return -1;
    *p = (ctl_payload){data, size, ctl_bigbuf_free, (void *)(uintptr_t)cap};
    return 0;
}
