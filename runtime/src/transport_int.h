/*
 * transport_int.h - the few ZeroMQ steps the transport files (server.c,
 * client.c, the ZAP handler in curve.c) share: reading one whole message,
 * and sending a payload without copying it.
 */
#ifndef CTLRPC_TRANSPORT_INT_H
#define CTLRPC_TRANSPORT_INT_H

#include <stddef.h>

#include <zmq.h>

#include "lend_int.h"

/*
 * Read one whole message from `sock`, waiting for its first frame with
 * `flags` (0 blocks up to the socket's ZMQ_RCVTIMEO, ZMQ_DONTWAIT does
 * not). Its first `max` frames land in frames[0..max) (initialised here);
 * further frames are read and discarded, so the socket is always left at a
 * message boundary (their bytes in *discarded, when not NULL). Returns the
 * number of frames the message had (which may exceed `max`; close
 * min(n, max) of them with ctl_frames_close), or -1 with nothing to close
 * when no message could be read (zmq_errno(): EAGAIN, EINTR, ETERM, ...).
 */
int ctl_recv_message(void *sock, zmq_msg_t *frames, int max, int flags, size_t *discarded);

/* Close the first `n` frames. */
void ctl_frames_close(zmq_msg_t *frames, int n);

/* Wrap `p` (taken over in every case) in `m` for sending without a copy:
 * ZeroMQ calls p->free once it is done with it. Returns 0, or -1 with the
 * payload let go. Then zmq_msg_send(m) until it leaves (and zmq_msg_close(m)
 * if it never does). */
int ctl_send_prepare(zmq_msg_t *m, const ctl_payload *p);

/*
 * Start the threads of ZeroMQ context `ctx` (its I/O thread and reaper)
 * with every signal blocked, if they have not started. libzmq starts them
 * with a context's first socket, from the thread that makes it, and each
 * blocks signals itself only once it runs: until then a signal sent to the
 * process could be taken by one (ctl_thread_start says why that matters).
 * Made under the full mask, they have it from their first instruction.
 * Every client and server calls this on its context, its own or one it
 * was given, before it makes a socket. Costs a socket made and closed.
 */
void ctl_zmq_threads_start(void *ctx);

#endif /* CTLRPC_TRANSPORT_INT_H */
