/*
 * transport.c - see transport_int.h.
 */
#include "transport_int.h"

#include <signal.h>
#include <stdint.h>
#include <stdlib.h>

int ctl_recv_message(void *sock, zmq_msg_t *frames, int max, int flags, size_t *discarded)
{
    int n = 0, more = 1;
    if (discarded)
        *discarded = 0;
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
        if (n >= max) {
            if (discarded)
                *discarded += zmq_msg_size(m);
            zmq_msg_close(m);
        }
        n++;
    }
    return n;
}

void ctl_frames_close(zmq_msg_t *frames, int n)
{
    for (int i = 0; i < n; i++)
        zmq_msg_close(&frames[i]);
}

int ctl_send_prepare(zmq_msg_t *m, const ctl_payload *p)
{
    if (zmq_msg_init_data(m, p->data, p->size, p->free, p->hint) != 0) {
        p->free(p->data, p->hint);
        return -1;
    }
    return 0;
}

void ctl_zmq_threads_start(void *ctx)
{
    sigset_t all, old;
    sigfillset(&all);
    pthread_sigmask(SIG_SETMASK, &all, &old);
    void *s = zmq_socket(ctx, ZMQ_PAIR);
    if (s) {
        int zero = 0;
        zmq_setsockopt(s, ZMQ_LINGER, &zero, sizeof zero);
        zmq_close(s);
    }
    pthread_sigmask(SIG_SETMASK, &old, NULL);
}
