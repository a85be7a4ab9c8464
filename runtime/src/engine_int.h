/*
 * engine_int.h - the client's engine: its I/O thread and the calls it
 * drives (internal).
 *
 * Every ctl_client has one engine: one I/O thread that owns the upkeep of
 * the client's sockets (draining and closing retired sockets, reading the
 * monitors of idle ones, closing idle sockets after their idle time or as
 * soon as their unit has gone) and that drives every call that is not a
 * single blocking call: asynchronous calls, asynchronous fan-outs and the
 * blocking fan-out (which starts one and waits for it). A thread waiting
 * for a call drives the engine itself when nobody else does (engine.c,
 * "Drivers"). A call is a set of requests (request_int.h) with one
 * deadline, one completion and one handle (ctl_call).
 *
 * A single blocking call does not come here: it borrows a connection and
 * drives its one request on its caller's thread, because handing it to the
 * I/O thread and back would add two thread wake-ups to every round trip
 * (docs/PERFORMANCE.md). It uses the same request code, the same pool and
 * the same counters, so both paths reach the same outcome for the same
 * replies.
 *
 * Completion. Only the engine's driver ends a call, and one thread drives
 * at a time, so a call ends exactly once whatever races it (a reply, its
 * deadline, a cancel, the client's destruction). An ended call is
 * delivered either at once on the I/O thread
 * (ctl_client_options.callbacks_on_io_thread) or queued until the
 * caller runs ctl_client_process; an eventfd is readable while the queue
 * is not empty. A call's handle has two references, the caller's and the
 * engine's (dropped after delivery); the call and everything its outcome
 * holds are freed when both are gone.
 */
#ifndef CTLRPC_ENGINE_INT_H
#define CTLRPC_ENGINE_INT_H

#include <stdatomic.h>
#include <stddef.h>

#include "ctlrpc/client.h"
#include "request_int.h"

/* The typed layer's hooks (stub.c): how a call's outcome is delivered and
 * what else it holds. NULL hooks: the untyped delivery. */
typedef struct ctl_call_ext {
    void (*deliver)(ctl_call *call);
    void (*fini)(ctl_call *call);
    /* Request i's outcome is final (call->outcomes[i], its reply there):
     * run by the engine's driver as each request ends, before the call
     * ends, so that a fan-out's results decode as their replies come
     * rather than all after the last. It runs no caller code. */
    void (*outcome_final)(ctl_call *call, size_t i);
    /* Pack request i's frame (call->reqs[i]) from the caller's args: set
     * by a starter that leaves the packing to the engine, which packs each
     * frame just before its request is sent (send_here), so that a large
     * fan-out's first request does not wait for its last to be packed.
     * Every frame is packed before ctl_call_submit returns (the caller's
     * args are not kept). NULL: the starter packed them all. */
    void (*frame)(ctl_call *call, size_t i);
    const void *args;       /* what `frame` packs from (the caller's) */
    /* Typed outcomes that failed, and those that keep their reply (for
     * the views their results hold), counted by the typed layer's
     * outcome_final as each request ends: with neither, the typed
     * outcomes hold nothing to release. */
    size_t failed;
    size_t kept;
    const void *desc;       /* the op's descriptor */
    void *typed;            /* typed outcomes (fan-out) */
    void (*done)(void);     /* the typed callback, cast back by `thunk` */
    void (*thunk)(void);    /* the generated trampoline that calls `done` */
} ctl_call_ext;

struct ctl_call {
    _Atomic int refs;   /* the caller's handle and the engine's */
    _Atomic int state;  /* CTL_CALL_* below; waiters sleep on it (a futex) */
    _Atomic int waiting; /* threads in ctl_call_wait on it */
    _Atomic int cancel; /* the caller asked for a cancel */
    ctl_client *client;
    /* Its client's engine, which the call keeps (a reference): a thread
     * waiting for the call looks at the engine even while the client is
     * being destroyed. */
    ctl_engine *engine;
    int many;           /* a fan-out (its callback takes the outcomes) */
    size_t count;       /* requests */
    size_t left;        /* requests not done yet (I/O thread) */
    /* Requests whose outcome is final (outcome_final), and of those the
     * outcomes that still hold something (a reply, an error) for the
     * caller: with every outcome final and none held, freeing the call
     * walks none of its requests again. */
    size_t finals;
    size_t held;
    int timeout_ms;
    unsigned flags;     /* CTL_CALL_IDEMPOTENT */
    int64_t deadline_ms;
    int64_t deadline_wall_ms; /* the same, on the wall clock (its ids') */
    ctl_timer timer;    /* its deadline, in the engine's heap */
    ctl_call *live_prev, *live_next; /* the calls in flight (I/O thread) */
    ctl_rq *rqs;
    ctl_frame *reqs;    /* request i's frame (filled by the starter) */
    ctl_reply **replies;
    ctl_outcome *outcomes;
    char *op;
    char **addresses;
    ctl_call_done *done_one;
    ctl_call_many_done *done_many;
    void *user;
    ctl_call_ext ext;
    ctl_call *next;     /* in the submission or the completion queue */
    /* Set by the starter (CTL_SEND_IDLE, a fan-out, blocking or not):
     * ctl_call_submit sends on the calling thread, before it hands the call
     * over, the requests whose address has an idle socket, so that no
     * wake-up of the I/O thread stands between the caller and its first
     * send. The I/O thread sends the rest: a dial may look a host name up,
     * which an event loop's thread must not wait for, and a socket made
     * on the I/O thread keeps its memory with the engine's rather than
     * among the caller's own allocations (sends on sockets dialled by a
     * busy caller thread measured half again as slow at 1024 units).
     * `sent`: the requests were set up and tried; a request still holding
     * its frame (`req`) and no socket was left for the I/O thread. */
    int send_on_submit;
    int sent;
    int dials; /* send_here left requests for the I/O thread to dial */
    /* Set by the starter that waits for the call at once (the blocking
     * fan-out): the submit wakes nobody when nobody drives the engine,
     * because the starter's wait will (ctl_call_wait). */
    int waited;
};

enum { CTL_CALL_STARTED, CTL_CALL_DONE, CTL_CALL_DELIVERED };
enum { CTL_SEND_LATER = 0, CTL_SEND_IDLE };

/* Start and stop a client's engine (its I/O thread). */
int ctl_engine_new(ctl_client *c, ctl_engine **out, ctl_error *err);
/* Ends every call still going (CTL_CAUSE_CANCELLED, "the client was
 * destroyed"), delivers them (queued ones on the calling thread), joins
 * the thread. */
void ctl_engine_destroy(ctl_engine **engine);

/* A call of `count` requests for `op` to addresses[i] (copied; NULL
 * entries allowed: that request fails as CTL_INVALID). The caller packs
 * call->reqs[i] (or sets ext.frame to have the engine pack them), sets
 * the callback and the hooks, then starts it with ctl_call_submit. NULL
 * when out of memory. */
ctl_call *ctl_call_alloc(ctl_client *c, const char *op,
                         const char *const *addresses, size_t count, int many,
                         int timeout_ms);

/* Start `call`: reserve its requests in flight and hand it to the I/O
 * thread. On success *out (when not NULL) holds the caller's handle and
 * the call will complete exactly once. On failure the call is freed (its
 * frames too), nothing was sent, nothing will complete, and the negative
 * kind is returned with `err` set. */
int ctl_call_submit(ctl_call *call, ctl_call **out, ctl_error *err);

/* Free a call that was never submitted. */
void ctl_call_abandon(ctl_call *call);

/* Run up to `max` queued completions on the calling thread. */
int ctl_engine_process(ctl_engine *e, int max);
int ctl_engine_event_fd(const ctl_engine *e);

#endif /* CTLRPC_ENGINE_INT_H */
