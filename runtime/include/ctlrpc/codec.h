/*
 * ctlrpc/codec.h - the decoding context of generated code.
 *
 * Generated decoders turn a msgpack_object (the args map of a request, the
 * result of a reply) into typed C structs. Strings and bins become views
 * into the message; arrays are allocated from the memory that lives as long
 * as the message: the request's scratch memory on a server (ctl_req_alloc),
 * the reply's on a client (ctl_reply_alloc). Nothing is freed one by one.
 *
 * When a value does not fit its declared type, the decoder records what was
 * expected and what came, and each level on the way back out prepends where
 * it was ("[2]", ".size"), so the message names the exact spot:
 * "arg infos[2].size: expected u64, got str" on a unit, "bad reply:
 * result[2].size: ..." on a client. A path too long to keep loses its outer
 * part: "...[2].size".
 *
 * Threading: a ctl_dec belongs to one decoding on one thread.
 */
#ifndef CTLRPC_CODEC_H
#define CTLRPC_CODEC_H

#include <stddef.h>

#include <msgpack.h>

#include "ctlrpc/client.h"
#include "ctlrpc/error.h"
#include "ctlrpc/server.h"

#ifdef __cplusplus
extern "C" {
#endif

#define CTL_DEC_PATH_MAX 160
#define CTL_DEC_WHAT_MAX 160

typedef struct ctl_dec {
    void *(*alloc)(void *owner, size_t size);
    void *owner;
    size_t path_start;           /* the path is path[path_start..] */
    int cut;                     /* the path outgrew its buffer */
    char path[CTL_DEC_PATH_MAX]; /* built back to front */
    char what[CTL_DEC_WHAT_MAX];
} ctl_dec;

/* Decode into memory that lives as long as the request / the reply. */
void ctl_dec_init_req(ctl_dec *d, ctl_req *req);
void ctl_dec_init_reply(ctl_dec *d, ctl_reply *reply);

/* `n` elements of `size` bytes, zeroed; NULL (and the failure recorded)
 * on overflow or when out of memory. n == 0 gives a non-NULL pointer. */
void *ctl_dec_alloc(ctl_dec *d, size_t n, size_t size);

/* Record a type mismatch: "expected <expected>, got <family of got>", or
 * for an integer outside an integer type ("i32", "u64", ...) "expected u32,
 * got -1 (out of range)". Returns -1. */
int ctl_dec_mismatch(ctl_dec *d, const char *expected, const msgpack_object *got);

/* Record another failure (printf-style). Returns -1. */
int ctl_dec_fail(ctl_dec *d, const char *fmt, ...) CTL_PRINTF(2, 3);

/* Prepend a list index / a map key or field name to the path. Return -1,
 * so a decoder can `return ctl_dec_at_index(d, i);` on its way out. */
int ctl_dec_at_index(ctl_dec *d, size_t index);
int ctl_dec_at_key(ctl_dec *d, ctl_str key);

/* Where the failure is ("[2].size"; empty at the top) and what it is.
 * NUL-terminated, owned by `d`. */
const char *ctl_dec_where(const ctl_dec *d);
const char *ctl_dec_what(const ctl_dec *d);

/* True when the msgpack str `key` equals the NUL-terminated `name`. */
int ctl_key_is(const msgpack_object *key, const char *name, size_t name_len);

#ifdef __cplusplus
}
#endif

#endif /* CTLRPC_CODEC_H */
