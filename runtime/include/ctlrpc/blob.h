/*
 * ctlrpc/blob.h - payload buffers that calls send without copying them.
 *
 * A request or a reply is one ZeroMQ frame (docs/PROTOCOL.md), so a bin
 * argument is packed into that frame, which copies it: for a 64 MiB put,
 * that copy is most of what the client spends. A ctl_blob is a buffer
 * with spare room before and after its bytes. When a bin of at least
 * CTL_BLOB_MIN bytes lies inside a live blob, the runtime writes the rest
 * of the message (its head, and any args after the bin) into that room
 * and hands ZeroMQ the blob's own memory: the payload is not copied.
 *
 *     ctl_blob *b = ctl_blob_new(size);
 *     if (!b) ... out of memory ...
 *     fill(ctl_blob_data(b), size);
 *     storage_put_args a = {.key = ctl_str_c("k"), .data = ctl_blob_bin(b, 0, size)};
 *     storage_put(client, address, &a, 5000, &stored, &err);
 *     ctl_blob_release(&b);
 *
 * The bin must start at the blob's first byte, and, when the message goes
 * on after it (the put's `pin` comes after its `data`), end at its last
 * byte: the room is outside the blob's data, never over bytes of yours.
 * So pass the whole blob (make it the size you fill), or its first bytes
 * when the bin is the last thing packed; any other range is copied.
 *
 * It works for any bin of any generated op (a field of a record, an item
 * of a list, an arg of its own), through every kind of call (blocking,
 * fan-out, asynchronous), and for a handler's result too: a unit that
 * answers with a blob's bytes sends them without a copy. Only one bin per
 * message travels this way (the last large one packed); any other bin is
 * copied as before. The untyped calls take args already packed, so their
 * bytes are copied once, when you pack them.
 *
 * One message at a time borrows a blob's room. A second message that
 * carries the same blob while the first is still being sent (a fan-out of
 * one put to three units, say) copies it, as any bin is copied: the
 * outcome is the same, only slower.
 *
 * The blob's bytes must not change while a message carrying them may
 * still be sent. Once a call that carried it has its reply (an error reply
 * included), its request has left, and the bytes may change. After a
 * timeout, a cancel or a failed send, the request may still be queued in
 * ZeroMQ: ctl_blob_sending() says whether a message still holds the blob's
 * memory; write into the blob only when it is false, or fill a new blob.
 *
 * Memory: a blob keeps CTL_BLOB_ROOM bytes of room on each side of its
 * data, and its data is aligned to a page. It lives until it is released
 * and no message holds it any more (ZeroMQ lets go of a message once it
 * is sent or its connection is closed).
 *
 * Thread safety: a blob may be used by many threads at once (several
 * calls carrying it); each function is safe to call concurrently, except
 * that ctl_blob_release must be the owner's last use.
 */
#ifndef CTLRPC_BLOB_H
#define CTLRPC_BLOB_H

#include <stdbool.h>
#include <stddef.h>

#include "ctlrpc/codec.h"
#include "ctlrpc/export.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Bins smaller than this are always copied: the copy costs less than
 * keeping the message apart. */
#define CTL_BLOB_MIN ((size_t)64 * 1024)

/* The room before and after a blob's data: what a message may put around
 * the bin (its head: op, id and the args packed before the bin; its tail:
 * the args packed after it). A message whose head or tail does not fit is
 * sent with a copy. */
#define CTL_BLOB_ROOM ((size_t)4096)

typedef struct ctl_blob ctl_blob;

/* A new blob of `size` bytes (not cleared), or NULL when out of memory or
 * when `size` is 0. */
CTL_API ctl_blob *ctl_blob_new(size_t size);

/* The blob's `size` bytes, to fill. */
CTL_API void *ctl_blob_data(ctl_blob *blob);

/* The size it was made with. */
CTL_API size_t ctl_blob_size(const ctl_blob *blob);

/* The bin of `len` bytes from `off` in the blob, to pass as a bin argument
 * or result; `off` and `len` are clamped to the blob. */
CTL_API ctl_str ctl_blob_bin(const ctl_blob *blob, size_t off, size_t len);

/* Whether a message being sent still holds the blob's memory (its bytes
 * must not change meanwhile). */
CTL_API bool ctl_blob_sending(const ctl_blob *blob);

/* Let go of the blob; sets *blob to NULL. Its memory lives on while a
 * message being sent holds it. Accepts NULL and a pointer to NULL. */
CTL_API void ctl_blob_release(ctl_blob **blob);

#ifdef __cplusplus
}
#endif

#endif /* CTLRPC_BLOB_H */
