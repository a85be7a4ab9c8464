/*
 * ctlrpc/ctlrpc.h - the whole public API of libctlrpc in one include.
 *
 * Conventions (see docs/API.md): functions return 0 or a negative ctl_kind
 * and fill a caller-owned ctl_error; heap objects are made by `_new` and
 * freed by `_destroy(T **)`, which accepts NULL and NULLs the caller's
 * pointer; caller-owned storage is set up by `_init` and released by `_fini`.
 *
 * Generated code includes ctlrpc/gen.h as well, the support API only it
 * calls; user code never needs it.
 */
#ifndef CTLRPC_CTLRPC_H
#define CTLRPC_CTLRPC_H

#include "ctlrpc/version.h"
#include "ctlrpc/codec.h"
#include "ctlrpc/error.h"
#include "ctlrpc/net.h"
#include "ctlrpc/curve.h"
#include "ctlrpc/log.h"
#include "ctlrpc/server.h"
#include "ctlrpc/client.h"
#include "ctlrpc/blob.h"

#endif /* CTLRPC_CTLRPC_H */
