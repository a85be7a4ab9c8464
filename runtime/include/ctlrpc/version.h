/*
 * version.h - the version of ctlrpc.
 *
 * One version for the runtime, the generator (ctlrpc-gen --version, from
 * gen/ctlrpc_gen/version.py; the build refuses to configure when the two
 * disagree) and the packages. Generated code is built for the runtime of
 * the same version: ctlrpc_generate() refuses a generator of another one.
 * The shared library's SONAME carries CTLRPC_SOVERSION (libctlrpc.so.1).
 */
#ifndef CTLRPC_VERSION_H
#define CTLRPC_VERSION_H

#include "ctlrpc/export.h"

#define CTLRPC_VERSION_MAJOR 0
#define CTLRPC_VERSION_MINOR 2
#define CTLRPC_VERSION_PATCH 0
#define CTLRPC_VERSION_STRING "0.2.0"
#define CTLRPC_SOVERSION 1

#ifdef __cplusplus
extern "C" {
#endif

/* The version of the libctlrpc linked at run time ("0.2.0"), which may
 * differ from CTLRPC_VERSION_STRING, the one compiled against. */
CTL_API const char *ctl_version(void);

#ifdef __cplusplus
}
#endif

#endif
