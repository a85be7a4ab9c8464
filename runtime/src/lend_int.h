/*
 * lend_int.h - large bytes a message carries without copying them.
 *
 * A request or reply is one frame, packed into one buffer. A bin of
 * CTL_BLOB_MIN bytes or more whose memory has an owner with spare room
 * around it (a lender: a ctl_blob, or a unit's hold on a received message)
 * is not packed: the packer records it as the buffer's segment, and the
 * rest of the message is packed around it. When the message is sent, the
 * bytes packed before the segment go into the room before it and the
 * bytes after it into the room after, and ZeroMQ is handed the lender's
 * memory (ctl_payload_take). A lender whose room is too small, or already
 * lent to a message being sent, makes the segment a plain copy instead.
 *
 * Only the packers call ctl_seg_append: the client's request framer
 * (envelope.c) and the unit's reply writer (dispatch.c). Everything here
 * works on bytes; the transport hands the payload to ZeroMQ with the free
 * function it names.
 *
 * Thread safety: lenders are reference counted and lent with an atomic
 * flag; the blob registry has one lock. A segment belongs to its buffer's
 * owner.
 */
#ifndef CTLRPC_LEND_INT_H
#define CTLRPC_LEND_INT_H

#include <stdatomic.h>
#include <stdbool.h>
#include <stddef.h>

#include <msgpack.h>

#include "ctlrpc/blob.h"

typedef struct ctl_lender ctl_lender;

typedef struct ctl_lender_ops {
    void (*ref)(ctl_lender *l);
    void (*unref)(ctl_lender *l);
    /* The bytes free for a message's use before `ptr` and after
     * `ptr + len` (a range inside the lender). */
    void (*room)(const ctl_lender *l, const char *ptr, size_t len, size_t *head,
                 size_t *tail);
} ctl_lender_ops;

struct ctl_lender {
    const ctl_lender_ops *ops;
    atomic_bool lent; /* a message being sent holds the room */
};

/* A lender's starting state. */
void ctl_lender_init(ctl_lender *l, const ctl_lender_ops *ops);

/* The live ctl_blob whose data holds [ptr, ptr + len), with a reference
 * taken, or NULL. */
ctl_lender *ctl_lender_find(const char *ptr, size_t len);

/* The bytes a buffer carries by reference: the lender's [ptr, ptr + len)
 * goes at offset `at` of the buffer (the buffer's bytes from `at` on come
 * after it). lender NULL: none. The segment holds a reference. */
typedef struct ctl_seg {
    ctl_lender *lender;
    const char *ptr;
    size_t len;
    size_t at;
} ctl_seg;

/* Write `len` bytes at `buf` to `sb` (ctl_sbuffer_write); `cand` (a
 * reference the call takes over, or NULL) is the lender that owns them.
 * With a lender and CTL_BLOB_MIN bytes or more they become the segment,
 * and an earlier segment is copied into place. Returns 0, or -1 when out
 * of memory. */
int ctl_seg_append(msgpack_sbuffer *sb, ctl_seg *seg, ctl_lender *cand,
                   const char *buf, size_t len);

/* Copy the segment into its place in `sb` and drop it. Returns 0, or -1
 * when out of memory (the segment is dropped either way). */
int ctl_seg_flatten(msgpack_sbuffer *sb, ctl_seg *seg);

/* Drop the segment without copying it. */
void ctl_seg_drop(ctl_seg *seg);

/* A message's payload, handed to ZeroMQ without a copy: `free(data, hint)`
 * once ZeroMQ is done with it (a zmq_free_fn). */
typedef struct ctl_payload {
    char *data;
    size_t size;
    void (*free)(void *data, void *hint);
    void *hint;
} ctl_payload;

/*
 * Make the payload of `sb` and its segment. In the segment's lender's
 * room when it is free and large enough (then `sb` is left as it was, for
 * its owner to clear or free); else the segment is copied into `sb`, whose
 * buffer the payload takes (`sb` is left empty). The segment is dropped.
 * Returns 0, or -1 when out of memory (nothing to free).
 */
int ctl_payload_take(ctl_payload *p, msgpack_sbuffer *sb, ctl_seg *seg);

#endif /* CTLRPC_LEND_INT_H */
