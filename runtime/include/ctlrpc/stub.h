/*
 * ctlrpc/stub.h - the runtime side of generated code.
 *
 * Generated client stubs and dispatch functions are thin typed wrappers:
 * they know the op's types, and hand the parts that are the same for every
 * op (packing into a buffer, calling, decoding the result into the reply's
 * memory, turning a decode failure into the right error) to the functions
 * here, with the op's encoder and decoder as callbacks. So the logic is
 * written, and tested, once.
 *
 * User code does not call these directly; it calls the generated
 * <service>_<op>() functions, whose header documents them.
 *
 * Threading: as ctl_client_call / ctl_client_call_many / ctl_client_notify.
 */
#ifndef CTLRPC_STUB_H
#define CTLRPC_STUB_H

#include <stddef.h>

#include <msgpack.h>

#include "ctlrpc/client.h"
#include "ctlrpc/codec.h"
#include "ctlrpc/error.h"
#include "ctlrpc/server.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Pack `value` (an op's args struct) as a msgpack map. 0 or -1. */
typedef int (*ctl_enc_fn)(msgpack_packer *pk, const void *value);
/* Decode `o` into `out` (an op's result type). 0, or -1 with `d` filled. */
typedef int (*ctl_dec_fn)(const msgpack_object *o, void *out, ctl_dec *d);

/*
 * Call `op` with args packed by `enc_args` (NULL: an empty map) and decode
 * the result with `dec_result` into `result` (both NULL: the result is
 * ignored). If `keep` is not NULL the reply, which owns the result's views,
 * is stored there on success (caller destroys it); otherwise it is freed
 * before returning. A result that does not decode is CTL_TRANSFER with
 * cause CTL_CAUSE_BAD_REPLY, naming where in the result it failed
 * ("find at tcp://...: bad reply: result.children[1].label: expected str,
 * got int").
 */
int ctl_stub_call(ctl_client *client, const char *address, const char *op,
                  ctl_enc_fn enc_args, const void *args, int timeout_ms,
                  ctl_dec_fn dec_result, void *result, ctl_reply **keep,
                  ctl_error *err);

/* Where the parts of a generated <op>_outcome struct are. */
typedef struct ctl_stub_layout {
    size_t args_size;     /* sizeof the args struct (0: the op has none) */
    size_t outcome_size;  /* sizeof the outcome struct */
    size_t error_offset;  /* offsetof its ctl_error */
    size_t reply_offset;  /* offsetof its ctl_reply * */
    size_t result_offset; /* offsetof its result (ignored without dec) */
    int keep_reply;       /* the result has views: keep the reply */
} ctl_stub_layout;

/*
 * Fan `op` out to `count` addresses, with args[i] (an array of `count`
 * args structs, or NULL when the op has none) for addresses[i], under one
 * deadline. Fills every outcome (their previous contents are ignored):
 * error.kind CTL_OK and the decoded result, or the error. Returns the
 * number of failed outcomes, or CTL_INVALID for NULL arguments.
 */
int ctl_stub_call_many(ctl_client *client, const char *op,
                       const char *const *addresses, size_t count,
                       ctl_enc_fn enc_args, const void *args, int timeout_ms,
                       ctl_dec_fn dec_result, void *outcomes,
                       const ctl_stub_layout *layout);

/* Release what `count` outcomes hold (replies and errors). */
void ctl_stub_outcomes_fini(void *outcomes, size_t count,
                            const ctl_stub_layout *layout);

/* Notify `op` with args packed by `enc_args` (NULL: an empty map). */
int ctl_stub_notify(ctl_client *client, const char *address, const char *op,
                    ctl_enc_fn enc_args, const void *args, ctl_error *err);

/* In a dispatch function: fail the request with the Protocol error that
 * `d` describes ("op 'put': arg keys[2]: expected str, got int"). Returns
 * CTL_PROTOCOL. */
int ctl_stub_fail_args(ctl_req *req, const ctl_dec *d);

/* In a dispatch function: pack the handler's result with `enc`, or fail
 * the request when out of memory. Returns 0 or CTL_PROTOCOL. */
int ctl_stub_reply(ctl_req *req, ctl_enc_fn enc, const void *result);

#ifdef __cplusplus
}
#endif

#endif /* CTLRPC_STUB_H */
