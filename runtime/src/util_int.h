/*
 * util_int.h - small helpers shared by the runtime's modules: owned string
 * copies, formatting, monotonic time, and a safe rendering of peer-supplied
 * strings for messages.
 */
#ifndef CTLRPC_UTIL_INT_H
#define CTLRPC_UTIL_INT_H

#include <stdarg.h>
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

/* Milliseconds on the monotonic clock. */
int64_t ctl_now_ms(void);

/* Milliseconds left until `deadline_ms` (never negative, capped to INT_MAX
 * so it fits zmq_poll's timeout). */
int ctl_ms_left(int64_t deadline_ms);

/* Render a peer-supplied string for a message: printable ASCII as is, other
 * bytes as \xNN, cut after `CTL_SHOW_MAX` bytes with "...". Always
 * NUL-terminates `buf`. Returns `buf`. */
#define CTL_SHOW_MAX 64
#define CTL_SHOW_BUF (CTL_SHOW_MAX * 4 + 8)
const char *ctl_show(char *buf, size_t buflen, ctl_str s);

/* The `n`-byte big-endian unsigned integer at `p` (n <= 8). */
uint64_t ctl_load_be(const unsigned char *p, unsigned n);

#endif /* CTLRPC_UTIL_INT_H */
