/*
 * client_int.h - requests packed in place (internal to libctlrpc).
 *
 * A request travels as one ZeroMQ frame, [op, id, args]. To send it without
 * copying the args a second time, the whole frame is packed into one
 * buffer: ctl_request_begin packs the head with room for the id, the caller
 * (ctl_client_call, or a generated stub through stub.c) packs the args map
 * straight after it, and the send fills the id in and hands the buffer to
 * ZeroMQ, which frees it when the frame has left (zmq_msg_init_data).
 */
#ifndef CTLRPC_CLIENT_INT_H
#define CTLRPC_CLIENT_INT_H

#include <stdbool.h>
#include <stddef.h>

#include <msgpack.h>

#include "ctlrpc/client.h"

typedef struct ctl_request {
    msgpack_sbuffer sb; /* the frame so far */
    size_t id_off;      /* where the id's bytes go */
    size_t id_len;      /* 12 for calls, 0 for notifies */
    bool failed;        /* packing ran out of memory */
} ctl_request;

/* Start a request for `op`: [op, <id> . The args map comes next. Sets
 * `failed` when out of memory. */
void ctl_request_begin(ctl_request *req, const char *op, bool notify);

/* Append already packed args (NULL or length 0: an empty map). */
void ctl_request_args(ctl_request *req, const void *args, size_t args_len);

/* Release a request that was not sent. */
void ctl_request_fini(ctl_request *req);

/* As ctl_client_call / ctl_client_notify / ctl_client_call_many, with the
 * requests already packed. Every request is consumed (sent or released),
 * whatever the outcome. */
int ctl_client_call_req(ctl_client *client, const char *address,
                        const char *op, ctl_request *req, int timeout_ms,
                        ctl_reply **reply, ctl_error *err);
int ctl_client_notify_req(ctl_client *client, const char *address,
                          const char *op, ctl_request *req, ctl_error *err);
/* `outcomes` are initialised here; addresses[i] gets reqs[i]. */
int ctl_client_call_many_req(ctl_client *client, const char *op,
                             const char *const *addresses, ctl_request *reqs,
                             size_t count, int timeout_ms,
                             ctl_outcome *outcomes);

#endif /* CTLRPC_CLIENT_INT_H */
