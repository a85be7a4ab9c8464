/*
 * typed_int.h - what the runtime's own code asks of typed values (typed.c)
 * beyond what ctlrpc/gen.h gives generated code.
 */
#ifndef CTLRPC_TYPED_INT_H
#define CTLRPC_TYPED_INT_H

#include "ctlrpc/gen.h"

/* When value `v` of type `t` (an op's args) holds something that cannot be
 * packed (a str, bin, list or map whose pointer is NULL but whose length is
 * not 0), heap text naming it ("arg keys[2]: its ptr is NULL but its len
 * is not 0"; free() it); else NULL, and NULL when out of memory. */
char *ctl_type_invalid(const ctl_type *t, const void *v);

#endif
