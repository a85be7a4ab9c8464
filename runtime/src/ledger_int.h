/*
 * ledger_int.h - the bytes of replies a unit has queued for each connection
 * and its peer has not read yet.
 *
 * ZeroMQ's send high-water mark counts messages, not bytes, so a peer that
 * sends requests and never reads the replies could make a unit hold many
 * large ones. The ledger charges every reply sent without a copy (the large
 * ones: the serving thread hands ZeroMQ its buffer) to the connection's
 * routing id until ZeroMQ frees the buffer, which it does once the bytes
 * have gone to the kernel or the connection has closed. The serving thread
 * reads a connection's charge before it serves the connection's next
 * request (ctl_ledger_unread) and answers Busy when it is at the unit's
 * bound.
 *
 * Thread safety: the serving thread charges and reads; ZeroMQ's I/O thread
 * (or whichever thread closes the message) releases. One mutex guards the
 * table; it is never held while a message is sent, so a release that runs
 * inside zmq_msg_send (a message dropped at once) does not deadlock. The
 * ledger is reference counted: each reply in flight holds it, so a release
 * after ctl_server_destroy (a borrowed context frees pending messages later,
 * on its reaper thread) finds it alive.
 */
#ifndef CTLRPC_LEDGER_INT_H
#define CTLRPC_LEDGER_INT_H

#include <stddef.h>

#include "lend_int.h"

typedef struct ctl_ledger ctl_ledger;

/* A new, empty ledger, or NULL when out of memory. */
ctl_ledger *ctl_ledger_new(void);

/* The owner lets go; the ledger lives on until the last reply charged to
 * it is released. NULL is ignored. */
void ctl_ledger_release(ctl_ledger *l);

/* The bytes charged to the connection of routing id `id` and not yet
 * released. */
size_t ctl_ledger_unread(ctl_ledger *l, const void *id, size_t id_len);

/*
 * Send the payload `p` (taken over in every case) as the last frame of a
 * message on `sock` without a copy, charged to `id` until ZeroMQ is done
 * with it (then p->free lets it go). Returns 0, or -1 (zmq_errno() says
 * why; the payload is let go and nothing stays charged).
 */
int ctl_ledger_send(ctl_ledger *l, const void *id, size_t id_len, void *sock,
                    const ctl_payload *p, int flags);

#endif
