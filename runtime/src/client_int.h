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

#endif /* CTLRPC_CLIENT_INT_H */
