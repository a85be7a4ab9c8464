/*
 * ctlrpc/gen.h - the runtime side of generated code.
 *
 * ctlrpc-gen emits mostly data: one constant ctl_type per record, list,
 * map and optional type of a service, one constant ctl_op_desc per op, and
 * a ctl_op table whose handlers are all ctl_stub_serve. The runtime
 * interprets them: it packs and decodes every value by its ctl_type, calls
 * and fans out by the op's descriptor, and serves a request by decoding
 * its args, calling the typed handler through the descriptor's `invoke`
 * and packing its result. So the logic is written, and tested, once, and a
 * generated file holds little beyond the typed entry points users call.
 *
 * User code does not include this header or call these functions: it
 * calls the generated <service>_<op>() functions, whose header documents
 * them. Generated headers include it and check CTL_GEN_ABI.
 *
 * Layout rules the generator follows (and the interpreter relies on):
 *   list<T>      struct { T const *items; size_t count; }
 *   map<str, T>  struct { E const *items; size_t count; } with
 *                E = struct { ctl_str key; T value; }
 *   optional<T>  struct { bool present; T value; }, except optional<R> of
 *                a record R, which is `const R *` (NULL when absent)
 *   records and args structs: one member per field, at `offset`.
 *
 * Threading: descriptors are immutable; the functions are as thread-safe
 * as the ctl_client / ctl_req they are given.
 */
#ifndef CTLRPC_GEN_H
#define CTLRPC_GEN_H

#include <stdarg.h>
#include <stdbool.h>
#include <stddef.h>

#include <msgpack.h>

#include "ctlrpc/ctlrpc.h"

#ifdef __cplusplus
extern "C" {
#endif

/* The interface generated code is written against. Generated headers check
 * it (`#if CTL_GEN_ABI != N` / `#error`) and must be regenerated when it
 * changes. */
#define CTL_GEN_ABI 4

/* ---- decoding context ------------------------------------------------ */

/*
 * Decoders turn a msgpack_object (the args map of a request, the result of
 * a reply) into typed C values. Strings and bins become views into the
 * message; arrays are allocated from memory that lives as long as the
 * message (the request's on a unit, the reply's on a client), through
 * `alloc`. Nothing is freed one by one.
 *
 * When a value does not fit its declared type, the decoder records what
 * was expected and what came, and each level on the way back out prepends
 * where it was ("[2]", ".size"), so the message names the exact spot:
 * "arg infos[2].size: expected u64, got str" on a unit, "bad reply:
 * result[2].size: ..." on a client. A path too long to keep loses its
 * outer part: "...[2].size".
 */
#define CTL_DEC_PATH_MAX 160
#define CTL_DEC_WHAT_MAX 160

typedef void *(*ctl_alloc_fn)(void *owner, size_t size);

typedef struct ctl_dec {
    ctl_alloc_fn alloc;
    void *owner;
    size_t path_start;           /* the path is path[path_start..] */
    int cut;                     /* the path outgrew its buffer */
    char path[CTL_DEC_PATH_MAX]; /* built back to front */
    char what[CTL_DEC_WHAT_MAX];
} ctl_dec;

/* Decode into memory from `alloc(owner, size)` (aligned for any type,
 * NULL when out of memory). */
CTL_API void ctl_dec_init(ctl_dec *d, ctl_alloc_fn alloc, void *owner);

/* `n` elements of `size` bytes, zeroed; NULL (and the failure recorded)
 * on overflow or when out of memory. n == 0 gives a non-NULL pointer. */
CTL_API void *ctl_dec_alloc(ctl_dec *d, size_t n, size_t size);

/* Record a type mismatch: "expected <expected>, got <family of got>", or
 * for an integer outside an integer type ("i32", "u64", ...) "expected u32,
 * got -1 (out of range)". Returns -1. */
CTL_API int ctl_dec_mismatch(ctl_dec *d, const char *expected, const msgpack_object *got);

/* Record another failure (printf-style). Returns -1. */
CTL_API int ctl_dec_fail(ctl_dec *d, const char *fmt, ...) CTL_PRINTF(2, 3);

/* Prepend a list index / a map key or field name to the path. Return -1,
 * so a decoder can `return ctl_dec_at_index(d, i);` on its way out. */
CTL_API int ctl_dec_at_index(ctl_dec *d, size_t index);
CTL_API int ctl_dec_at_key(ctl_dec *d, ctl_str key);

/* Where the failure is ("[2].size"; empty at the top) and what it is.
 * NUL-terminated, owned by `d`. */
CTL_API const char *ctl_dec_where(const ctl_dec *d);
CTL_API const char *ctl_dec_what(const ctl_dec *d);

/* ---- type descriptors ------------------------------------------------ */

typedef enum ctl_type_kind {
    CTL_TYPE_BOOL,
    CTL_TYPE_I32,
    CTL_TYPE_I64,
    CTL_TYPE_U32,
    CTL_TYPE_U64,
    CTL_TYPE_F64,
    CTL_TYPE_STR,
    CTL_TYPE_BIN,
    CTL_TYPE_LIST,
    CTL_TYPE_MAP,
    CTL_TYPE_OPTIONAL,
    CTL_TYPE_RECORD
} ctl_type_kind;

typedef struct ctl_type ctl_type;

/* One field of a record (or one arg of an op). */
typedef struct ctl_field {
    const char *name; /* as on the wire */
    size_t name_len;
    const ctl_type *type;
    size_t offset;    /* of its member in the C struct */
    bool required;    /* no default: a peer must send it */
} ctl_field;

/* Record flags. */
enum {
    /* An op's args: unknown keys are refused, keys must be strings, and an
     * arg equal to its default is not sent (the unit applies it). */
    CTL_RECORD_ARGS = 1u << 0
};

struct ctl_type {
    ctl_type_kind kind;
    const char *idl;     /* for messages: "list<str>", "record BlobInfo" */
    size_t size;         /* sizeof the C value */
    /* LIST: the element; MAP: the value; OPTIONAL: the inner type. */
    const ctl_type *elem;
    size_t elem_size;    /* LIST: sizeof an element; MAP: of an entry */
    size_t value_offset; /* MAP: of the value in an entry; OPTIONAL (by
                            value): of `value` */
    bool by_pointer;     /* OPTIONAL of a record: held as `const R *` */
    /* RECORD */
    const char *name;    /* the record's (or the op's) name */
    const ctl_field *fields;
    size_t field_count;
    const void *defaults; /* a value holding every default (NULL: zero) */
    unsigned flags;       /* CTL_RECORD_* */
};

/* The scalars. */
CTL_API extern const ctl_type ctl_type_bool;
CTL_API extern const ctl_type ctl_type_i32;
CTL_API extern const ctl_type ctl_type_i64;
CTL_API extern const ctl_type ctl_type_u32;
CTL_API extern const ctl_type ctl_type_u64;
CTL_API extern const ctl_type ctl_type_f64;
CTL_API extern const ctl_type ctl_type_str;
CTL_API extern const ctl_type ctl_type_bin;

/* Pack the C value at `value` as `type`. 0, or -1 (out of memory, or a
 * list/map with more than 2^32-1 entries or NULL items). */
CTL_API int ctl_type_pack(msgpack_packer *pk, const ctl_type *type, const void *value);

/* The bytes ctl_type_pack would write for the C value at `value` (exact;
 * SIZE_MAX when the sum would not fit a size_t). Lets a unit refuse a
 * result over its reply bound before packing any of it. */
CTL_API size_t ctl_type_packed_size(const ctl_type *type, const void *value);

/* Decode `o` as `type` into the C value at `out` (records and args start
 * from their defaults). 0, or -1 with `d` saying where and what. */
CTL_API int ctl_type_decode(const msgpack_object *o, const ctl_type *type, void *out,
                    ctl_dec *d);

/* ---- op descriptors -------------------------------------------------- */

/* Call a service's typed handler for one op: `handlers` is the service's
 * handler table, `args` its args struct (NULL when it takes none), `result`
 * its zeroed result (NULL when it returns nothing). */
typedef int (*ctl_invoke_fn)(const void *handlers, const void *args,
                             void *result, ctl_req *req);

/* An error kind a service declares (`error NotFound;`): its name on the
 * wire and its generated constant (<SERVICE>_ERR_<Kind>, from 1). */
typedef struct ctl_error_kind {
    const char *name;
    int code;
} ctl_error_kind;

/* The built-in kinds an op lists in `raises` (Protocol is implicit). */
#define CTL_RAISES_UNIT_FULL 0x1u
#define CTL_RAISES_BUSY 0x2u
#define CTL_RAISES_MISSING 0x4u

typedef struct ctl_op_desc {
    const char *name;
    unsigned flags;          /* CTL_OP_NOREPLY, CTL_OP_IDEMPOTENT */
    /* What the op may fail with beside Protocol: built-in kinds
     * (CTL_RAISES_*) and the declared kinds it lists. A handler that fails
     * with anything else is answered with a Protocol error naming the op
     * and the kind, and counted (ctl_server_stats.undeclared); a client
     * reports a declared kind of this list as CTL_DECLARED. */
    unsigned raises;
    const ctl_error_kind *const *declared;
    size_t declared_count;
    const ctl_type *args;    /* a record with CTL_RECORD_ARGS; NULL: none */
    const ctl_type *result;  /* NULL: the op returns nothing */
    bool keep_reply;         /* the result holds views into the reply */
    /* The <op>_outcome struct of <op>_many. */
    size_t outcome_size;
    size_t outcome_error;    /* offsetof its ctl_error */
    size_t outcome_reply;    /* offsetof its ctl_reply * */
    size_t outcome_result;   /* offsetof its result (when there is one) */
    ctl_invoke_fn invoke;
} ctl_op_desc;

/*
 * Call `op` with `args` (its args struct, NULL when it takes none) and
 * decode the result into `result` (NULL: ignore it). When the result holds
 * views (op->keep_reply), `reply` receives the reply that owns them
 * (caller destroys it) and must not be NULL if `result` is not; otherwise
 * `reply` may be NULL. A result that does not decode is CTL_TRANSFER with
 * cause CTL_CAUSE_BAD_REPLY, naming where in the result it failed.
 */
CTL_API int ctl_stub_call(ctl_client *client, const char *address,
                  const ctl_op_desc *op, const void *args, int timeout_ms,
                  void *result, ctl_reply **reply, ctl_error *err);

/*
 * Fan `op` out to `count` addresses, with args[i] (an array of `count`
 * args structs, or NULL when the op takes none) for addresses[i], under
 * one deadline. Fills every outcome (an array of `count` <op>_outcome
 * structs; their previous contents are ignored): error.kind CTL_OK and the
 * decoded result, or the error. Returns the number of failed outcomes, or
 * CTL_INVALID for NULL arguments.
 */
CTL_API int ctl_stub_call_many(ctl_client *client, const ctl_op_desc *op,
                       const char *const *addresses, const void *args,
                       size_t count, int timeout_ms, void *outcomes);

/* Release what `count` outcomes of `op` hold (replies and errors). */
CTL_API void ctl_stub_outcomes_fini(const ctl_op_desc *op, void *outcomes,
                            size_t count);

/* The generated trampolines that call a typed completion: `done` is the
 * typed callback, cast to a generic function pointer and back. */
typedef void ctl_stub_thunk(void (*done)(void), void *user, const ctl_error *err,
                            const void *result);
typedef void ctl_stub_many_thunk(void (*done)(void), void *user, void *outcomes,
                                 size_t count);

/*
 * Start `op` asynchronously (ctlrpc/client.h, "Asynchronous calls"); the
 * args are packed (copied) before it returns. On completion the result is
 * decoded into memory owned by the call and `thunk` calls `done` with it
 * (NULL on failure). Returns 0, or a negative kind when the call could not
 * start (logged through the client's log, at most once a second for each
 * cause): nothing was sent and nothing will complete.
 */
CTL_API int ctl_stub_call_start(ctl_client *client, const char *address,
                                const ctl_op_desc *op, const void *args,
                                int timeout_ms, ctl_stub_thunk *thunk,
                                void (*done)(void), void *user, ctl_call **call);

/* The fan-out of ctl_stub_call_start: `thunk` calls `done` with `count`
 * <op>_outcome records (owned by the call), filled as by ctl_stub_call_many. */
CTL_API int ctl_stub_call_many_start(ctl_client *client, const ctl_op_desc *op,
                                     const char *const *addresses,
                                     const void *args, size_t count,
                                     int timeout_ms, ctl_stub_many_thunk *thunk,
                                     void (*done)(void), void *user,
                                     ctl_call **call);

/* Notify `op` with `args` (NULL when it takes none). */
CTL_API int ctl_stub_notify(ctl_client *client, const char *address,
                    const ctl_op_desc *op, const void *args, ctl_error *err);

/* Decode a reply's result as `op`'s into `result`: 0, or CTL_TRANSFER /
 * CTL_CAUSE_BAD_REPLY ("<op> at <address>: bad reply: result[1].size:
 * expected u64, got str"). */
CTL_API int ctl_stub_decode_result(const ctl_op_desc *op, ctl_reply *reply,
                           const char *address, void *result, ctl_error *err);

/* The handler of every generated op (ctl_op.handler): decodes the args by
 * the op's descriptor (ctl_op.desc), calls the typed handler in `handlers`
 * and packs its result; a bad arg is a Protocol error naming it. */
CTL_API int ctl_stub_serve(void *handlers, const msgpack_object *args, ctl_req *req);

/* Fail the request with the declared error `kind` (the generated
 * <service>_<op>_raise_<Kind> helpers call it; they exist only for the
 * ops that list the kind). `reason` may be NULL. Returns CTL_DECLARED. */
CTL_API int ctl_req_raisev(ctl_req *req, const ctl_error_kind *kind, const char *reason,
                           const char *fmt, va_list ap) CTL_PRINTF(4, 0);

#ifdef __cplusplus
}
#endif

#endif /* CTLRPC_GEN_H */
