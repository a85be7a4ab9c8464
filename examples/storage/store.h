/*
 * store.h - the blob store behind one storage unit (docs/STORAGE.md).
 *
 * A store maps arbitrary byte-string keys to blobs. Blobs live in memory up
 * to `capacity` bytes; when a spill directory is set, a blob that does not
 * fit goes to a file there instead and is still served. Spill files are
 * named by a counter ("blob-<n>"), never by the key, so no key (say
 * "../../etc/passwd") can reach outside the directory. A name that is
 * already taken (left by a unit that was killed) is skipped, never
 * overwritten; only the store's own files are removed.
 *
 * Semantics (the contract of idl/storage.idl):
 * - put replaces an unpinned blob of the same key (its old size no longer
 *   counts); a pinned one makes put fail with Busy "pinned". Spilled blobs
 *   do not count against the memory capacity.
 * - pin/unpin mark blobs; a pinned blob may not be overwritten, deleted or
 *   aborted. abort drops the unpinned blobs it names; delete refuses (Busy)
 *   when any named blob is pinned and then deletes nothing.
 * - get/describe/pin name every absent key in their Missing error.
 *
 * Bounds: blob bytes kept in memory count against `capacity`. Everything
 * else a blob keeps in memory (its key, its node in the table and in the
 * key-ordered index, and the rest of a request message held for it)
 * counts against a second bound, the index capacity, so no client can
 * grow a unit past both, whatever keys it sends; and a put whose key is
 * longer than `max_key_bytes` is refused with a Protocol error naming the
 * limit.
 *
 * Threading: none inside; the unit calls it under its server lock.
 */
#ifndef CTL_STORAGE_STORE_H
#define CTL_STORAGE_STORE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include <ctlrpc/error.h>
#include <ctlrpc/server.h>

typedef struct store store;

typedef struct store_blob {
    ctl_str key;       /* owned by the store */
    size_t size;
    size_t index_cost; /* what it counts against the index capacity */
    bool pinned;
    bool spilled;
    unsigned char *data; /* in memory; NULL when spilled */
    ctl_hold *hold;      /* when `data` lies in a held request message */
    uint64_t spill_id;   /* the spill file's number when spilled */
    uint64_t mark;       /* see store_mark */
} store_blob;

typedef struct store_totals {
    uint64_t blobs, bytes, capacity, pinned, spilled;
    uint64_t index_bytes, index_capacity; /* keys and bookkeeping */
} store_totals;

/* Defaults of store_set_limits. */
#define STORE_DEFAULT_MAX_KEY_BYTES 4096u
#define STORE_DEFAULT_INDEX_CAPACITY ((uint64_t)64 << 20)
#define STORE_DEFAULT_MAX_LIST_KEYS 100000u

/* What a blob costs the index beside its key: its node in the table and
 * the key-ordered tree, its bucket slots, and the allocator's headers and
 * rounding of its node and its key and data copies (what store.c's
 * _Static_assert adds up; measured at about 207 bytes with an 8-byte key
 * and an empty blob over 1.2 million blobs; this is on the high side). */
#define STORE_BLOB_OVERHEAD 224u

/* A store of `capacity` bytes in memory, spilling to `spill_dir` (created
 * if missing; NULL: no spilling). Returns 0, or CTL_INVALID naming the
 * directory when it cannot be used. */
int store_new(uint64_t capacity, const char *spill_dir, store **out,
              ctl_error *err);

/* Set the longest key a put accepts, the bytes that keys and bookkeeping
 * may take, and the most keys one list reply carries (0: the defaults
 * above). */
void store_set_limits(store *s, size_t max_key_bytes, uint64_t index_capacity,
                      uint32_t max_list_keys);

/* The most keys one list reply carries. */
uint32_t store_max_list(const store *s);

/* Free the store and remove its spill files. Accepts NULL. */
void store_destroy(store **s);

/* The blob under `key`, or NULL. Borrowed until the next change. */
store_blob *store_find(store *s, ctl_str key);

/* Store `data` under `key`, pinned if `pin`. The bytes are copied, unless
 * `hold` (may be NULL) holds them: then a blob kept in memory keeps the
 * hold instead of a copy (the store owns `hold` when this returns 0 with
 * *hold_taken set; otherwise the caller still does). Returns 0, CTL_BUSY
 * (pinned), CTL_UNIT_FULL (no room for the bytes, or for another key in the
 * index, or the spill file could not be written: the message names the
 * cause, and no partial file is left), or CTL_PROTOCOL (a key over the
 * limit). */
int store_put(store *s, ctl_str key, ctl_str data, ctl_hold *hold, bool pin,
              bool *hold_taken, ctl_error *err);

/* Read a spilled blob's bytes into `buf` (blob->size bytes). 0 or
 * CTL_PROTOCOL naming the failure. */
int store_read_spilled(store *s, const store_blob *blob, void *buf,
                       ctl_error *err);

/* Pin or unpin a blob (keeps the store's counters right). */
void store_set_pinned(store *s, store_blob *blob, bool pinned);

/* Start a new marking pass (returns its number), and mark a blob in it:
 * store_mark returns true the first time a blob is marked in the pass. Lets
 * an op count each distinct blob once however often a request names it. */
uint64_t store_new_pass(store *s);
bool store_mark(store_blob *blob, uint64_t pass);

/* Remove the blob under `key` if present (pinned or not). */
void store_remove(store *s, ctl_str key);

/* Call `fn`, in key order (byte order, then length), for the blobs whose
 * keys start with `prefix` and sort after `after` (empty: from the first),
 * at most `max` of them; returns how many. Costs a seek (O(log n)) and the
 * keys passed to `fn`, however many blobs the store holds. `fn` may not
 * change the store. */
size_t store_list(store *s, ctl_str prefix, ctl_str after, size_t max,
                  void (*fn)(const store_blob *, void *), void *arg);

/* Check the store's key-ordered index against its table (for tests): NULL
 * when they agree and the index is sound, else what is wrong. Walks every
 * blob. */
const char *store_check(store *s);

void store_totals_get(const store *s, store_totals *out);

/* Parse a byte count with an optional binary suffix: "1048576", "64K",
 * "64M", "1G", "2T" (also "64MiB", "64MB": all powers of 1024). Returns 0
 * or -1. */
int store_parse_size(const char *text, uint64_t *out);

#endif /* CTL_STORAGE_STORE_H */
