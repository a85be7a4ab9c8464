/*
 * version.c - ctl_version: see ctlrpc/version.h.
 */
#include "ctlrpc/version.h"

const char *ctl_version(void)
{
    return CTLRPC_VERSION_STRING;
}
