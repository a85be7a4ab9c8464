/*
 * transport.c - see transport_int.h.
 */
#include "transport_int.h"

#include <stdint.h>
#include <stdlib.h>

#include "bigbuf_int.h"

int ctl_recv_message(void *sock, zmq_msg_t *frames, int max, int flags)
{
    int n = 0, more = 1;
    while (more) {
        zmq_msg_t scratch;
        zmq_msg_t *m = n < max ? &frames[n] : &scratch;
        zmq_msg_init(m);
        /* Only the first frame is waited for: ZeroMQ delivers a message's
         * frames together. */
        if (zmq_msg_recv(m, sock, n == 0 ? flags : 0) < 0) {
            zmq_msg_close(m);
            ctl_frames_close(frames, n < max ? n : max);
            return -1;
        }
        more = zmq_msg_more(m);
        if (n >= max)
            zmq_msg_close(m);
        n++;
    }
    return n;
}

void ctl_frames_close(zmq_msg_t *frames, int n)
{
    for (int i = 0; i < n; i++)
        zmq_msg_close(&frames[i]);
}

int ctl_send_prepare(zmq_msg_t *m, char *data, size_t size, size_t cap)
{
    if (zmq_msg_init_data(m, data, size, ctl_bigbuf_free, (void *)(uintptr_t)cap) != 0) {
        ctl_bigbuf_give(data, cap);
        return -1;
    }
    return 0;
}

int ctl_send_owned(void *sock, char *data, size_t size, size_t cap, int flags)
{
    zmq_msg_t m;
    if (ctl_send_prepare(&m, data, size, cap) != 0)
        return -1;
    if (zmq_msg_send(&m, sock, flags) < 0) {
        zmq_msg_close(&m);
        return -1;
    }
    return 0;
}
