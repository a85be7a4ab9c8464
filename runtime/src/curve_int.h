/*
 * curve_int.h - the ZAP handler that enforces a unit's client allowlist
 * (internal to libctlrpc).
 *
 * ZeroMQ asks the ZAP endpoint of a socket's context (RFC 27,
 * inproc://zeromq.zap.01) whether a CURVE client may connect. A ctl_zap
 * binds that endpoint in the unit's context and answers 200 for a client
 * whose public key is on the list and 400 for anything else; it is served
 * from the unit's thread (server.c polls its socket). Only one ZAP handler
 * can bind a context, so at most one unit with an allowlist per context.
 */
#ifndef CTLRPC_CURVE_INT_H
#define CTLRPC_CURVE_INT_H

#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>

#include "ctlrpc/error.h"

typedef struct ctl_zap ctl_zap;

/* Bind a ZAP handler in `ctx` allowing the `count` Z85 client keys (copied;
 * each must be valid). Each client refused adds one to *denied (borrowed;
 * read it from any thread) and is logged (warn, at most a line a second).
 * `who` names the unit in messages. Returns 0,
 * or CTL_INVALID (a bad key, the endpoint taken) / CTL_TRANSFER (no
 * memory). */
int ctl_zap_new(void *ctx, const char *const *keys, size_t count,
                _Atomic uint64_t *denied, const char *who, ctl_zap **out,
                ctl_error *err);

/* Name the unit in the log lines of refused clients: `endpoint` (borrowed,
 * NUL-terminated; it must outlive the handler). */
void ctl_zap_set_endpoint(ctl_zap *zap, const char *endpoint);

/* The socket to poll for ZAP requests. */
void *ctl_zap_socket(ctl_zap *zap);

/* Answer every ZAP request waiting (never blocks). */
void ctl_zap_serve(ctl_zap *zap);

/* Close the socket and free; sets *zap to NULL. Accepts NULL. */
void ctl_zap_destroy(ctl_zap **zap);

#endif /* CTLRPC_CURVE_INT_H */
