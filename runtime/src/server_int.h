/*
 * server_int.h - what other parts of libctlrpc may know of a ctl_server
 * beyond its public API (internal).
 *
 * Hooks let a part built above the transport (the etcd registration of
 * ctlrpc/directory.h) follow a server's life without the server knowing
 * what it is: one set of hooks per server, called on the owning thread.
 */
#ifndef CTLRPC_SERVER_INT_H
#define CTLRPC_SERVER_INT_H

#include "ctlrpc/server.h"

typedef struct ctl_server_hooks {
    void (*on_drain)(void *arg);   /* ctl_server_drain is about to drain */
    void (*on_closed)(void *arg);  /* the server has stopped serving (once) */
    void (*on_destroy)(void *arg); /* the server is being freed */
    void *arg;
} ctl_server_hooks;

/* Install `hooks` (copied). -1 when the server has hooks already or is
 * closed. Owning thread. */
int ctl_server_set_hooks(ctl_server *server, const ctl_server_hooks *hooks);

/* The hooks' arg, or NULL when none are set. */
void *ctl_server_hooks_arg(const ctl_server *server);

/* The served table. */
const ctl_service *ctl_server_service(const ctl_server *server);

/* The server's CURVE public key (Z85, NUL-terminated), "" without CURVE. */
const char *ctl_server_curve_public(const ctl_server *server);

#endif /* CTLRPC_SERVER_INT_H */
