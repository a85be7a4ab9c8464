/*
 * bigbuf_int.h - large payload buffers kept between calls (internal).
 *
 * glibc serves an allocation over its mmap threshold (at most 32 MiB) with
 * fresh pages and gives them back to the kernel on free, so a client that
 * packs a 64 MiB put, or a unit that packs a 64 MiB reply, would map and
 * fault a payload-sized buffer at every call. The runtime keeps the last
 * CTL_BIGBUF_KEEP such buffers it was done with (once ZeroMQ has sent
 * them) and packs the next large message into one, whose pages are
 * already there. Only buffers of CTL_BIGBUF_MIN bytes and more are kept
 * (glibc's heap reuses smaller ones by itself), so a process holds at most
 * CTL_BIGBUF_KEEP idle buffers, each no larger than the largest message it
 * has packed (bounded by its max_msg_bytes / max_reply_bytes).
 *
 * Thread safety: any thread; one lock.
 */
#ifndef CTLRPC_BIGBUF_INT_H
#define CTLRPC_BIGBUF_INT_H

#include <stddef.h>

#include <msgpack.h>

#define CTL_BIGBUF_MIN ((size_t)16 << 20)
#define CTL_BIGBUF_KEEP 2

/* A kept buffer of at least `need` bytes (its capacity in *cap), or NULL. */
char *ctl_bigbuf_take(size_t need, size_t *cap);

/* Done with `data` of capacity `cap` (malloc'd): kept when it is large
 * enough and there is room (the smallest kept one makes way for a larger
 * one), else freed. */
void ctl_bigbuf_give(char *data, size_t cap);

/* msgpack_sbuffer_write, except that a buffer growing to CTL_BIGBUF_MIN or
 * more moves into a kept buffer when one is large enough. */
int ctl_sbuffer_write(void *sbuffer, const char *buf, size_t len);

/* ZeroMQ's free callback for a buffer sent without a copy: the hint is its
 * capacity, (void *)(uintptr_t)cap. */
void ctl_bigbuf_free(void *data, void *hint);

#endif
