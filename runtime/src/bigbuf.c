/*
 * bigbuf.c - large payload buffers kept between calls (bigbuf_int.h).
 */
#include "bigbuf_int.h"

#include <pthread.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

static pthread_mutex_t kept_lock = PTHREAD_MUTEX_INITIALIZER;
static struct {
    char *data;
    size_t cap;
} kept[CTL_BIGBUF_KEEP];

char *ctl_bigbuf_take(size_t need, size_t *cap)
{
    int best = -1;
    pthread_mutex_lock(&kept_lock);
    for (int i = 0; i < CTL_BIGBUF_KEEP; i++)
        if (kept[i].data && kept[i].cap >= need && (best < 0 || kept[i].cap < kept[best].cap))
            best = i;
    char *data = NULL;
    if (best >= 0) {
        data = kept[best].data;
        *cap = kept[best].cap;
        kept[best].data = NULL;
        kept[best].cap = 0;
    }
    pthread_mutex_unlock(&kept_lock);
    return data;
}

void ctl_bigbuf_give(char *data, size_t cap)
{
    if (!data)
        return;
    if (cap >= CTL_BIGBUF_MIN) {
        /* An empty slot, else the smallest kept one if it is smaller. */
        int slot = -1;
        pthread_mutex_lock(&kept_lock);
        for (int i = 0; i < CTL_BIGBUF_KEEP && slot < 0; i++)
            if (!kept[i].data)
                slot = i;
        for (int i = 0; i < CTL_BIGBUF_KEEP && slot < 0; i++)
            if (kept[i].cap < cap)
                slot = i;
        char *out = data;
        if (slot >= 0) {
            out = kept[slot].data; /* NULL, or the smaller one */
            kept[slot].data = data;
            kept[slot].cap = cap;
        }
        pthread_mutex_unlock(&kept_lock);
        free(out);
        return;
    }
    free(data);
}

void ctl_bigbuf_free(void *data, void *hint)
{
    ctl_bigbuf_give(data, (size_t)(uintptr_t)hint);
}

int ctl_sbuffer_write(void *sbuffer, const char *buf, size_t len)
{
    msgpack_sbuffer *sb = sbuffer;
    if (sb->alloc - sb->size < len && len <= SIZE_MAX - sb->size &&
        sb->size + len >= CTL_BIGBUF_MIN) {
        size_t cap = 0;
        char *data = ctl_bigbuf_take(sb->size + len, &cap);
        if (data) {
            if (sb->size)
                memcpy(data, sb->data, sb->size);
            ctl_bigbuf_give(sb->data, sb->alloc);
            sb->data = data;
            sb->alloc = cap;
        }
    }
    return msgpack_sbuffer_write(sb, buf, len);
}
