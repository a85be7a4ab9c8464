/*
 * client_int.h - calls with their request frames already packed (internal
 * to libctlrpc): what the generated stubs' support (stub.c) builds on, so a
 * typed stub packs its args straight into the frame that is sent.
 */
#ifndef CTLRPC_CLIENT_INT_H
#define CTLRPC_CLIENT_INT_H

#include <stddef.h>

#include <msgpack.h>

#include "ctlrpc/client.h"
#include "envelope_int.h"

/* A call's timeout: `timeout_ms`, or the client's default_timeout_ms when
 * it is negative. */
int ctl_client_timeout(const ctl_client *c, int timeout_ms);

/* As ctl_client_call_ex / ctl_client_notify / ctl_client_call_many_ex,
 * with the requests already packed. Every request is consumed (sent or
 * released), whatever the outcome. */
int ctl_client_call_req(ctl_client *client, const char *address,
                        const char *op, ctl_frame *req, int timeout_ms,
                        unsigned flags, ctl_reply **reply, ctl_error *err);
int ctl_client_notify_req(ctl_client *client, const char *address,
                          const char *op, ctl_frame *req, ctl_error *err);
/* `outcomes` are initialised here; addresses[i] gets reqs[i]. */
int ctl_client_call_many_req(ctl_client *client, const char *op,
                             const char *const *addresses, ctl_frame *reqs,
                             size_t count, int timeout_ms, unsigned flags,
                             ctl_outcome *outcomes);

/* Run a blocking fan-out: `call` comes from ctl_call_alloc (many, with a
 * count of at least one) with its requests packed in call->reqs (packed
 * there, after the allocation, so that they are still in the cache when
 * they are sent). Its requests with an idle socket are sent on this
 * thread, the rest by the I/O thread, and this thread waits for every
 * outcome. Returns 0 with the outcomes in call->outcomes;
 * the caller takes them and releases the call (ctl_call_release).
 * Otherwise (the client refused it: its cap on calls in flight, or it is
 * being destroyed) the call is freed, nothing was sent, and `err` says
 * why. */
int ctl_client_many_run(ctl_call *call, unsigned flags, ctl_error *err);

#endif /* CTLRPC_CLIENT_INT_H */
