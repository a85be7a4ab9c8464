/*
 * ledger.c - the bytes of replies queued for each connection and not yet
 * read (ledger_int.h).
 *
 * A chained hash table of the connections with replies in flight: an entry
 * lives while some reply charged to it has not been freed by ZeroMQ, so the
 * table holds at most one entry per reply in flight and needs no expiry.
 */
#include "ledger_int.h"

#include <errno.h>
#include <pthread.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <zmq.h>

#define LEDGER_BUCKETS 256

typedef struct ledger_entry {
    struct ledger_entry *next;
    size_t bytes;    /* charged and not yet released */
    size_t replies;  /* replies in flight: the entry goes with the last */
    size_t id_len;
    unsigned char id[]; /* the connection's routing id */
} ledger_entry;

struct ctl_ledger {
    pthread_mutex_t mu;
    size_t refs; /* the owner's, and one per reply in flight */
    ledger_entry *buckets[LEDGER_BUCKETS];
};

/* One reply in flight: ZeroMQ's free callback gets it as its hint. */
typedef struct ledger_charge {
    ctl_ledger *l;
    ledger_entry *e;
    size_t size;
    void (*free)(void *data, void *hint); /* the payload's own */
    void *hint;
} ledger_charge;

ctl_ledger *ctl_ledger_new(void)
{
    ctl_ledger *l = calloc(1, sizeof *l);
    if (!l)
        return NULL;
    if (pthread_mutex_init(&l->mu, NULL) != 0) {
        free(l);
        return NULL;
    }
    l->refs = 1;
    return l;
}

/* Drop one reference; the caller holds l->mu, which this lets go. */
static void unref_unlock(ctl_ledger *l)
{
    size_t left = --l->refs;
    pthread_mutex_unlock(&l->mu);
    if (left == 0) {
        pthread_mutex_destroy(&l->mu);
        free(l);
    }
}

void ctl_ledger_release(ctl_ledger *l)
{
    if (!l)
        return;
    pthread_mutex_lock(&l->mu);
    unref_unlock(l);
}

static unsigned bucket_of(const void *id, size_t len)
{
    const unsigned char *p = id;
    uint32_t h = 2166136261u; /* FNV-1a */
    for (size_t i = 0; i < len; i++)
        h = (h ^ p[i]) * 16777619u;
    return h % LEDGER_BUCKETS;
}

static ledger_entry **find(ctl_ledger *l, const void *id, size_t len)
{
    ledger_entry **e = &l->buckets[bucket_of(id, len)];
    while (*e && ((*e)->id_len != len || memcmp((*e)->id, id, len) != 0))
        e = &(*e)->next;
    return e;
}

size_t ctl_ledger_unread(ctl_ledger *l, const void *id, size_t id_len)
{
    pthread_mutex_lock(&l->mu);
    ledger_entry *e = *find(l, id, id_len);
    size_t bytes = e ? e->bytes : 0;
    pthread_mutex_unlock(&l->mu);
    return bytes;
}

/* ZeroMQ is done with a reply: free it and release its charge. */
static void release_charge(void *data, void *hint)
{
    ledger_charge *c = hint;
    ctl_ledger *l = c->l;
    c->free(data, c->hint);
    pthread_mutex_lock(&l->mu);
    ledger_entry *e = c->e;
    e->bytes -= c->size;
    if (--e->replies == 0) {
        ledger_entry **at = find(l, e->id, e->id_len);
        *at = e->next;
        free(e);
    }
    free(c);
    unref_unlock(l);
}

int ctl_ledger_send(ctl_ledger *l, const void *id, size_t id_len, void *sock,
                    const ctl_payload *p, int flags)
{
    char *data = p->data;
    size_t size = p->size;
    ledger_charge *c = malloc(sizeof *c);
    if (!c) {
        p->free(data, p->hint);
        errno = ENOMEM;
        return -1;
    }
    pthread_mutex_lock(&l->mu);
    ledger_entry **at = find(l, id, id_len);
    ledger_entry *e = *at;
    if (!e && (e = malloc(sizeof *e + id_len)) != NULL) {
        *e = (ledger_entry){.next = NULL, .id_len = id_len};
        memcpy(e->id, id, id_len);
        *at = e;
    }
    if (!e) {
        pthread_mutex_unlock(&l->mu);
        free(c);
        p->free(data, p->hint);
        errno = ENOMEM;
        return -1;
    }
    e->bytes += size;
    e->replies++;
    l->refs++;
    *c = (ledger_charge){l, e, size, p->free, p->hint};
    pthread_mutex_unlock(&l->mu);

    zmq_msg_t m;
    if (zmq_msg_init_data(&m, data, size, release_charge, c) != 0) {
        release_charge(data, c);
        return -1;
    }
    if (zmq_msg_send(&m, sock, flags) < 0) {
        int e2 = zmq_errno();
        zmq_msg_close(&m); /* releases the charge */
        errno = e2;
        return -1;
    }
    return 0;
}
