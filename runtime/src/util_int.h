/*
 * util_int.h - small helpers shared by the runtime's modules: owned string
 * copies, formatting, monotonic time, and a safe rendering of peer-supplied
 * strings for messages.
 */
#ifndef CTLRPC_UTIL_INT_H
#define CTLRPC_UTIL_INT_H

#include <pthread.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include <msgpack.h>

#include "ctlrpc/error.h"

/* A NUL-terminated copy of `len` bytes at `s` (which may hold NULs), or
 * NULL when out of memory. */
char *ctl_strndup(const char *s, size_t len);

/* printf into a new string; NULL when out of memory. */
char *ctl_vasprintf(const char *fmt, va_list ap) CTL_PRINTF(1, 0);

/* `size` bytes from `zone`, aligned for any type (msgpack_zone_malloc
 * only aligns to a pointer). NULL when out of memory. */
void *ctl_zone_alloc(msgpack_zone *zone, size_t size);

/* Whether the `len` bytes at `ptr` lie inside the `size` bytes at `base`
 * (no overflow for any values). */
static inline bool ctl_bytes_within(const void *ptr, size_t len, const void *base, size_t size)
{
    uintptr_t p = (uintptr_t)ptr, b = (uintptr_t)base;
    return p >= b && p - b <= size && len <= size - (p - b);
}

/* Milliseconds on the monotonic clock. */
int64_t ctl_now_ms(void);

/* Nanoseconds on the monotonic clock. */
int64_t ctl_now_ns(void);

/* Milliseconds since the Unix epoch on the wall clock (CLOCK_REALTIME):
 * the clock of the deadlines that request ids carry, which units on other
 * hosts compare with theirs. */
int64_t ctl_wall_ms(void);

/* Milliseconds left until `deadline_ms` (never negative, capped to INT_MAX
 * so it fits zmq_poll's timeout). */
int ctl_ms_left(int64_t deadline_ms);

/* Render a peer-supplied string for a message: printable ASCII as is, other
 * bytes as \xNN, cut after `CTL_SHOW_MAX` bytes with "...". Always
 * NUL-terminates `buf`. Returns `buf`. */
#define CTL_SHOW_MAX 64
#define CTL_SHOW_BUF (CTL_SHOW_MAX * 4 + 8)
const char *ctl_show(char *buf, size_t buflen, ctl_str s);

/*
 * A name for an inproc endpoint, unique within this process for its whole
 * life: "inproc://ctlrpc-<what>-<pid>-<n>", n from a process-wide atomic
 * counter. Every inproc endpoint the runtime binds (socket monitors) takes
 * its name from here, never from a heap address: libzmq frees the name of
 * a closed socket later, on its reaper thread, so a name made from an
 * address that malloc hands out again can still be taken when the next
 * object binds it, on a context shared by many objects. `what` is one
 * short word ("srvmon", "poolmon"). Writes at most `size` bytes,
 * NUL-terminated; returns `buf`. Thread-safe.
 */
#define CTL_INPROC_NAME_MAX 96
char *ctl_inproc_name(char *buf, size_t size, const char *what);

/* A number no earlier call in this process returned (the counter behind
 * ctl_inproc_name); thread-safe. */
uint64_t ctl_unique_u64(void);

/* The `n`-byte big-endian unsigned integer at `p` (n <= 8). */
uint64_t ctl_load_be(const unsigned char *p, unsigned n);

/*
 * Signals belong to the program: every thread of the runtime is started
 * here, with every signal blocked around pthread_create, so that it has
 * the full mask from its first instruction (a thread inherits its
 * creator's mask; one that blocked signals itself once running could take
 * one that came first: SIGTERM, its action the default, would end the
 * process under a main thread waiting for it in sigwait). The caller's
 * mask is put back at once. Returns pthread_create's result.
 */
int ctl_thread_start(pthread_t *thread, void *(*fn)(void *), void *arg);

#endif /* CTLRPC_UTIL_INT_H */
