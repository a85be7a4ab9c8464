/*
 * curve_int.h - the ZAP handler that enforces units' client allowlists
 * (internal to libctlrpc).
 *
 * ZeroMQ asks the ZAP endpoint of a socket's context (RFC 27,
 * inproc://zeromq.zap.01) whether a CURVE client may connect. Only one
 * socket can bind that endpoint in a context, so the runtime keeps one
 * handler per context, shared by every unit with an allowlist on it and
 * refcounted (curve.c): each unit registers its allowlist under a ZAP
 * domain of its own, which it sets on its ROUTER (ZMQ_ZAP_DOMAIN), and
 * the handler answers 200 for a client whose key is on that unit's list,
 * 400 for anything else. The handler has a thread of its own, so
 * handshakes are answered whatever the units' threads are doing (a drain,
 * a long handler).
 *
 * Threading: ctl_zap_new and ctl_zap_destroy may be called from any
 * thread; the registry is process-wide and locked.
 */
#ifndef CTLRPC_CURVE_INT_H
#define CTLRPC_CURVE_INT_H

#include <stdatomic.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "ctlrpc/error.h"

typedef struct ctl_zap ctl_zap;

/* Connection caps a unit has its ZAP handler enforce (0: none). Each
 * connection refused adds one to *refused (borrowed until destroy). */
typedef struct ctl_zap_caps {
    unsigned max_connections;
    unsigned max_per_address;
    _Atomic uint64_t *refused;
} ctl_zap_caps;

/* Register a unit with the ZAP handler of `ctx`: an allowlist of the
 * `count` Z85 client keys (copied; each must be valid; none: any key, or
 * no CURVE at all, passes) and connection caps (NULL: none), binding its endpoint and
 * starting its thread when this is the context's first. Each client
 * refused adds one to *denied (borrowed until ctl_zap_destroy; read it
 * from any thread) and is logged (warn, at most a line a second). `who`
 * names the unit in messages. Returns 0, or CTL_INVALID (a bad key; the
 * endpoint held by a ZAP handler that is not the runtime's) /
 * CTL_TRANSFER (no memory, no thread). */
int ctl_zap_new(void *ctx, const char *const *keys, size_t count,
                _Atomic uint64_t *denied, const ctl_zap_caps *caps, const char *who,
                ctl_zap **out, ctl_error *err);

/* With caps: a connection of the unit's socket was accepted on / has
 * closed its descriptor `fd` (the socket monitor's events, from the
 * monitor's thread). The address is read at the accept (getpeername). */
void ctl_zap_conn_opened(ctl_zap *zap, int fd);
void ctl_zap_conn_closed(ctl_zap *zap, int fd);

/* With caps: before a handshake is judged, the handler's thread calls
 * fn(arg) (without its own lock held) to count the monitor events the
 * unit's monitor thread has not read yet: libzmq reports a connection's
 * accept before its handshake asks ZAP, so the caps then see every earlier
 * connection. fn may call ctl_zap_conn_opened/closed; ctl_zap_destroy
 * waits for a call under way. */
void ctl_zap_set_catch_up(ctl_zap *zap, void (*fn)(void *arg), void *arg);

/* Whether `zap` (may be NULL) has caps, and so wants those events. */
bool ctl_zap_counts(const ctl_zap *zap);

/* The ZAP domain to set on the unit's socket (ZMQ_ZAP_DOMAIN), before it
 * binds. NUL-terminated; owned by the registration. */
const char *ctl_zap_domain(const ctl_zap *zap);

/* Name the unit in the log lines of refused clients (copied). */
void ctl_zap_set_endpoint(ctl_zap *zap, const char *endpoint);

/* Replace the allowlist for the handshakes judged from now on (connections
 * admitted stay): the keys are checked and copied first, so on an error
 * (CTL_INVALID naming the key, or out of memory) the old list is kept.
 * Only for a registration made with keys (count > 0). */
int ctl_zap_set_keys(ctl_zap *zap, const char *const *keys, size_t count, const char *who,
                     ctl_error *err);

/* Unregister; the context's last user stops the handler's thread and
 * unbinds its endpoint before this returns, so a unit created next on the
 * context can bind it. Call after the unit's socket is closed. Sets *zap
 * to NULL; accepts NULL. */
void ctl_zap_destroy(ctl_zap **zap);

#endif /* CTLRPC_CURVE_INT_H */
