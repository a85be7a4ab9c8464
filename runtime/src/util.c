/*
 * util.c - see util_int.h.
 */
#include "util_int.h"

#include <limits.h>
#include <signal.h>
#include <stdatomic.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

char *ctl_strndup(const char *s, size_t len)
{
    if (len == SIZE_MAX)
        return NULL;
    char *copy = malloc(len + 1);
    if (!copy)
        return NULL;
    if (len)
        memcpy(copy, s, len);
    copy[len] = '\0';
    return copy;
}

char *ctl_vasprintf(const char *fmt, va_list ap)
{
    va_list again;
    va_copy(again, ap);
    int n = vsnprintf(NULL, 0, fmt, ap);
    if (n < 0) {
        va_end(again);
        return NULL;
    }
    char *out = malloc((size_t)n + 1);
    if (out)
        vsnprintf(out, (size_t)n + 1, fmt, again);
    va_end(again);
    return out;
}

void *ctl_zone_alloc(msgpack_zone *zone, size_t size)
{
    const size_t align = _Alignof(max_align_t);
    if (size > SIZE_MAX - align)
        return NULL;
    char *p = msgpack_zone_malloc_no_align(zone, size + align);
    if (!p)
        return NULL;
    return p + (align - (uintptr_t)p % align) % align;
}

int64_t ctl_now_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

int64_t ctl_now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000000000 + ts.tv_nsec;
}

int64_t ctl_wall_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

int ctl_ms_left(int64_t deadline_ms)
{
    int64_t left = deadline_ms - ctl_now_ms();
    if (left < 0)
        return 0;
    if (left > INT_MAX)
        return INT_MAX;
    return (int)left;
}

const char *ctl_show(char *buf, size_t buflen, ctl_str s)
{
    static const char hex[] = "0123456789abcdef";
    size_t o = 0;
    if (buflen == 0)
        return buf;
    for (size_t i = 0; i < s.len; i++) {
        unsigned char c = (unsigned char)s.ptr[i];
        if (i == CTL_SHOW_MAX) {
            if (o + 4 > buflen)
                break;
            memcpy(buf + o, "...", 3);
            o += 3;
            break;
        }
        if (c >= 0x20 && c < 0x7f && c != '\\') {
            if (o + 2 > buflen)
                break;
            buf[o++] = (char)c;
        } else {
            if (o + 5 > buflen)
                break;
            buf[o++] = '\\';
            buf[o++] = 'x';
            buf[o++] = hex[c >> 4];
            buf[o++] = hex[c & 15];
        }
    }
    buf[o] = '\0';
    return buf;
}

uint64_t ctl_load_be(const unsigned char *p, unsigned n)
{
    uint64_t v = 0;
    for (unsigned i = 0; i < n; i++)
        v = (v << 8) | p[i];
    return v;
}

static _Atomic uint64_t unique_counter;

uint64_t ctl_unique_u64(void)
{
    return atomic_fetch_add_explicit(&unique_counter, 1, memory_order_relaxed) + 1;
}

char *ctl_inproc_name(char *buf, size_t size, const char *what)
{
    if (size)
        snprintf(buf, size, "inproc://ctlrpc-%s-%ld-%llu", what && *what ? what : "ep",
                 (long)getpid(), (unsigned long long)ctl_unique_u64());
    return buf;
}

int ctl_thread_start(pthread_t *thread, void *(*fn)(void *), void *arg)
{
    sigset_t all, old;
    sigfillset(&all);
    pthread_sigmask(SIG_SETMASK, &all, &old);
    int rc = pthread_create(thread, NULL, fn, arg);
    pthread_sigmask(SIG_SETMASK, &old, NULL);
    return rc;
}
