/*
 * ctlrpc/codec.h - values on the wire: string views, decoding bounds, and
 * the helpers that read and write msgpack values.
 *
 * Everything here works on bytes and msgpack objects; nothing knows about
 * sockets, envelopes or ops. Handlers of the untyped API (server.h) read
 * their args and pack their results with these helpers; generated code
 * uses them through the descriptors of ctlrpc/gen.h.
 *
 * Messages are msgpack (docs/PROTOCOL.md, "Messages"). Decoding goes through a
 * bounded scan (ctl_wire_check) before msgpack-c builds any object, so that
 * a hostile header claiming a 4 GiB array is refused without allocating:
 * every container's count is checked against the bytes left (each element
 * takes at least one byte), nesting is capped, and so is the total number of
 * objects. Once a payload has passed the scan, msgpack-c's unpacker allocates
 * at most `max_items` objects, and its strings and bins are views into the
 * payload (no copy).
 *
 * Threading: every function here is reentrant; none keeps state.
 */
#ifndef CTLRPC_CODEC_H
#define CTLRPC_CODEC_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include <msgpack.h>

#include "ctlrpc/export.h"

#ifdef __cplusplus
extern "C" {
#endif

/* A borrowed string: `len` bytes at `ptr`, not necessarily NUL-terminated.
 * Wire strings may contain NUL bytes; always use `len`. */
typedef struct ctl_str {
    const char *ptr;
    size_t len;
} ctl_str;

/* Build a view of a NUL-terminated C string (NULL gives the empty view). */
CTL_API ctl_str ctl_str_c(const char *s);

/* Decoding bounds. A zero field means "the default". */
typedef struct ctl_limits {
    size_t max_msg_bytes; /* largest payload accepted; enforced by ZeroMQ
                             (ZMQ_MAXMSGSIZE) before anything is read.
                             Default CTL_DEFAULT_MAX_MSG_BYTES. */
    unsigned max_depth;   /* deepest nesting of arrays/maps; the envelope
                             counts as level 1. Default CTL_DEFAULT_MAX_DEPTH */
    size_t max_items;     /* most objects in one message (every scalar,
                             string, array and map counts one). Default
                             CTL_DEFAULT_MAX_ITEMS. */
} ctl_limits;

#define CTL_DEFAULT_MAX_MSG_BYTES ((size_t)256 << 20) /* 256 MiB */
#define CTL_DEFAULT_MAX_DEPTH 32u /* msgpack-c's own stack depth */
#define CTL_DEFAULT_MAX_ITEMS ((size_t)1 << 20)

/* `in` with zero fields replaced by the defaults; `in` may be NULL. */
CTL_API ctl_limits ctl_limits_resolve(const ctl_limits *in);

/* Outcome of ctl_wire_check. */
typedef enum ctl_wire_status {
    CTL_WIRE_OK = 0,
    CTL_WIRE_TRUNCATED,  /* the object runs past the end of the bytes */
    CTL_WIRE_BAD_BYTE,   /* 0xc1, the byte msgpack never uses */
    CTL_WIRE_TOO_DEEP,   /* nesting beyond max_depth */
    CTL_WIRE_TOO_MANY,   /* more objects than max_items */
    CTL_WIRE_BAD_COUNT   /* a container claims more elements than the
                            bytes left could hold */
} ctl_wire_status;

/* A short description of a status ("truncated", ...). Constant string. */
CTL_API const char *ctl_wire_status_name(ctl_wire_status status);

/*
 * Scan exactly one msgpack object at the start of `data` without allocating.
 * On CTL_WIRE_OK stores its size in bytes in *used (may be NULL); the bytes
 * after it are not looked at. `depth0` is the nesting level the object sits
 * at (0 at top level) and `items` (may be NULL) accumulates the object count
 * across calls so one message's parts share one budget.
 */
CTL_API ctl_wire_status ctl_wire_check(const void *data, size_t len,
                               const ctl_limits *limits, unsigned depth0,
                               size_t *items, size_t *used);

/* ---- reading decoded values ------------------------------------------ */

/* Each returns true and stores the value when `o` holds a value of the
 * right family that fits the C type (any msgpack integer width is accepted;
 * f64 also accepts float32 and integers), false otherwise. */
CTL_API bool ctl_obj_bool(const msgpack_object *o, bool *out);
CTL_API bool ctl_obj_i32(const msgpack_object *o, int32_t *out);
CTL_API bool ctl_obj_i64(const msgpack_object *o, int64_t *out);
CTL_API bool ctl_obj_u32(const msgpack_object *o, uint32_t *out);
CTL_API bool ctl_obj_u64(const msgpack_object *o, uint64_t *out);
CTL_API bool ctl_obj_f64(const msgpack_object *o, double *out);
/* str and bin give views into the message (no copy). */
CTL_API bool ctl_obj_str(const msgpack_object *o, ctl_str *out);
CTL_API bool ctl_obj_bin(const msgpack_object *o, ctl_str *out);

/* The value under string key `key` in map `o`, or NULL when `o` is not a
 * map or has no such key. Linear in the map's size. */
CTL_API const msgpack_object *ctl_obj_get(const msgpack_object *o, const char *key);

/* The msgpack family of `o` as a word for messages ("str", "array", ...). */
CTL_API const char *ctl_obj_type_name(const msgpack_object *o);

/* ---- writing -------------------------------------------------------- */

/* Pack a string view as msgpack str / bin. Return 0 or -1 (out of memory). */
CTL_API int ctl_pack_str(msgpack_packer *pk, ctl_str s);
CTL_API int ctl_pack_bin(msgpack_packer *pk, ctl_str b);
/* Pack a NUL-terminated string as msgpack str. */
CTL_API int ctl_pack_cstr(msgpack_packer *pk, const char *s);

#ifdef __cplusplus
}
#endif

#endif /* CTLRPC_CODEC_H */
