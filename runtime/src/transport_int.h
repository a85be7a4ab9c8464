/*
 * transport_int.h - the few ZeroMQ steps the transport files (server.c,
 * client.c, the ZAP handler in curve.c) share: reading one whole message,
 * and sending a malloc'd buffer without copying it.
 */
#ifndef CTLRPC_TRANSPORT_INT_H
#define CTLRPC_TRANSPORT_INT_H

#include <stddef.h>

#include <zmq.h>

/*
 * Read one whole message from `sock`, waiting for its first frame with
 * `flags` (0 blocks up to the socket's ZMQ_RCVTIMEO, ZMQ_DONTWAIT does
 * not). Its first `max` frames land in frames[0..max) (initialised here);
 * further frames are read and discarded, so the socket is always left at a
 * message boundary. Returns the number of frames the message had (which
 * may exceed `max`; close min(n, max) of them with ctl_frames_close), or
 * -1 with nothing to close when no message could be read (zmq_errno():
 * EAGAIN, EINTR, ETERM, ...).
 */
int ctl_recv_message(void *sock, zmq_msg_t *frames, int max, int flags);

/* Close the first `n` frames. */
void ctl_frames_close(zmq_msg_t *frames, int n);

/*
 * Send `data` (malloc'd, `size` bytes of a buffer of `cap`) as one frame
 * without copying it: once ZeroMQ is done with it, it goes back to the
 * kept large buffers (bigbuf_int.h) or is freed. `data` is taken over in
 * every case. Returns 0, or -1 with zmq_errno() set (the buffer is already
 * let go, or kept in `m` for a retry: see ctl_send_prepare).
 */
int ctl_send_owned(void *sock, char *data, size_t size, size_t cap, int flags);

/* The same in two steps, for callers that retry a send: wrap `data` in
 * `m` (0, or -1 with `data` let go), then zmq_msg_send(m) until it leaves
 * (and zmq_msg_close(m) if it never does). */
int ctl_send_prepare(zmq_msg_t *m, char *data, size_t size, size_t cap);

#endif /* CTLRPC_TRANSPORT_INT_H */
