/*
 * engine.c - the client's engine: see engine_int.h for the contract.
 *
 * Drivers. One thread at a time drives the engine: it runs its passes,
 * owns its state (the heap, the calls in flight, the sockets they use)
 * and is the only one in its epoll_wait. That is the I/O thread while
 * calls are in flight, except when a thread waiting for a call
 * (ctl_call_wait, and so the blocking fan-out) finds nobody driving: the
 * waiter then drives itself until its call ends or its wait runs out, and
 * the I/O thread sleeps on its condition variable. A reply then reaches
 * the thread that waits for it with no hand-off between two threads of
 * ours, as in a bare ZeroMQ loop. A waiter does not drive when callbacks
 * run on the I/O thread (they would run on the waiter), nor for a call
 * with sockets still to dial (send_here). The mutex hands the drive over
 * (a full barrier for the sockets, as ZeroMQ requires); a driver that
 * stops with calls still in flight signals the I/O thread to take them
 * on. With nothing in flight the I/O thread waits only for its upkeep.
 *
 * The driver sleeps in epoll_wait on two kinds of descriptor: the wake
 * eventfd (a call was submitted or cancelled, or the client is going), and
 * the ZMQ_FD of every socket with a request in flight. ZMQ_FD says only
 * "look at this socket": after a wake-up, and after every send, the socket
 * is read without blocking until it has nothing more (ZeroMQ's documented
 * rule for that descriptor), so a reply is never left unseen. A socket
 * joins the set (edge-triggered, data.ptr = its ctl_conn) the first time
 * the engine lends it and stays while it idles in the pool, so a call on a
 * warm socket costs no epoll_ctl; an event for a socket with no engine
 * request on it (conn->engine_rq) is ignored. A blocking call that lends
 * it takes it out; closing it takes it out for good, and the engine frees
 * it between two waits (pool_int.h, ctl_pool_reap).
 *
 * The work per wake-up is proportional to what happened, not to what is in
 * flight: epoll returns the sockets that have something, deadlines sit in
 * a binary heap, so a fan-out to 1024 units costs per reply what one to 16
 * costs. Two sweeps do walk every call in flight, and both are rare: the
 * monitor check (every CHECK_SLICE_MS, for requests that have waited that
 * long without a reply: the fail-fast causes of docs/API.md) and a cancel.
 *
 * Batching the wake-ups. Before it sleeps, a driver whose calls in flight
 * all have many requests left (NEAR_LEFT or more: the middle of a large
 * fan-out, where no call ends on the next reply) yields its CPU once. The
 * units and ZeroMQ's I/O thread, if they are waiting for a CPU, run first,
 * and the driver then finds many replies at one wake-up instead of waking
 * for every few: on a busy machine a wake-up costs more than the replies
 * it reads (docs/PERFORMANCE.md). It is one system call, not a spin: with
 * nothing else to run it returns at once and the driver sleeps. A call
 * near its end, or any single call, never waits behind a yield.
 *
 * Delivery. Calls that end during a pass of the loop are collected and
 * delivered after it, never in the middle of handling the epoll events (a
 * callback may start calls, release handles, or cancel other calls).
 *
 * Locking: one mutex guards the submission queue, the cancel count, the
 * completion queue, who drives, and `stopping`. It is never held while a
 * callback runs or while a socket is touched.
 *
 * Waiting. A thread in ctl_call_wait sleeps on its call's own state word (a
 * futex), so a call that ends wakes only the threads waiting for that
 * call, with one system call and no lock for them to take on waking (a
 * condition variable shared by the engine woke every waiter at every end,
 * each to take the engine's mutex). The call's `waiting` count saves the
 * system call when nobody waits: the state is stored before the count is
 * read, and a waiter counts itself before it reads the state, both
 * sequentially consistent, so one of the two sees the other.
 */
#include "engine_int.h"

#include <errno.h>
#include <limits.h>
#include <linux/futex.h>
#include <pthread.h>
#include <sched.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#include <zmq.h>

#include "call_int.h"
#include "client_int.h"
#include "pool_int.h"
#include "util_int.h"

/* A request that has waited this long without its reply reads its
 * connection's monitor (and again every slice after); the blocking call
 * uses the same slice (client.c). */
#define CHECK_SLICE_MS CTL_CHECK_SLICE_MS
/* How often the sockets' upkeep runs (retired sockets drained and closed,
 * idle monitors read, idle sockets closed). */
#define UPKEEP_MS 250
#define EVENTS_PER_WAIT 256
/* A call in flight with fewer requests than this left is "near" its end:
 * its next reply may end it, so the driver waits for it without yielding
 * first ("Batching the wake-ups" above). */
#define NEAR_LEFT 16

/* Who drives the engine (runs its passes): nobody, its I/O thread, or a
 * thread waiting for a call. */
enum { DRIVER_NONE, DRIVER_IO, DRIVER_WAITER };
/* What a pass leaves: calls in flight, none, or the engine stopped. */
enum { PASS_BUSY, PASS_IDLE, PASS_STOPPED };

struct ctl_engine {
    ctl_client *client;
    _Atomic int refs;  /* the client's, and one a call (ctl_call.engine) */
    pthread_t thread;
    int epfd;
    int wake_fd;  /* the driver's wake-up, in the epoll set */
    int ready_fd; /* readable while completions are queued */
    /* opts.callbacks_on_io_thread, kept here: a waiter reads it while the
     * client may be going. */
    int io_callbacks;
    pthread_mutex_t mu;
    pthread_cond_t idle; /* the I/O thread's, while it does not drive */
    int driver;        /* DRIVER_* */
    int wake_pending;
    int stopping;
    int joined;        /* the I/O thread has gone: no more wake-ups */
    unsigned cancels;          /* cancels asked for since the last pass */
    ctl_call *sub_head, *sub_tail;
    ctl_call *done_head, *done_tail;
    /* The I/O thread's own. */
    ctl_timer **heap;          /* deadlines and backoffs, soonest first */
    size_t heap_len, heap_cap;
    ctl_call *live;            /* the calls in flight */
    size_t n_live;
    size_t near;               /* those with under NEAR_LEFT requests left */
    ctl_call *ended;           /* ended in this pass, to deliver after it */
    int64_t next_check_ms;
    int64_t next_upkeep_ms;
    int resubmitted;           /* a callback on this thread submitted */
};

/* The engine whose I/O thread this is: a call submitted there (by a
 * callback run on the I/O thread) needs no wake-up, because the thread
 * looks at its submissions again before it sleeps. */
static _Thread_local ctl_engine *io_engine;

/* The call whose callback runs on this thread now (the innermost): its
 * outcomes are its callback's to read, in either delivery, even while its
 * state still says started (on the I/O thread the state moves after the
 * callback, so that a waiter wakes to a callback that has run). */
static _Thread_local const ctl_call *delivering;

/* ---- the timer heap (I/O thread only) --------------------------------- */

/* One heap holds every call's deadline and every backoff of a request
 * waiting to be retried (ctl_timer). */

static void heap_set(ctl_engine *e, size_t i, ctl_timer *t)
{
    e->heap[i] = t;
    t->heap_at = i + 1;
}

static void heap_up(ctl_engine *e, size_t i)
{
    ctl_timer *x = e->heap[i];
    while (i > 0) {
        size_t parent = (i - 1) / 2;
        if (e->heap[parent]->at <= x->at)
            break;
        heap_set(e, i, e->heap[parent]);
        i = parent;
    }
    heap_set(e, i, x);
}

static void heap_down(ctl_engine *e, size_t i)
{
    ctl_timer *x = e->heap[i];
    for (;;) {
        size_t l = 2 * i + 1, r = l + 1, m = i;
        int64_t best = x->at;
        if (l < e->heap_len && e->heap[l]->at < best)
            m = l, best = e->heap[l]->at;
        if (r < e->heap_len && e->heap[r]->at < best)
            m = r;
        if (m == i)
            break;
        heap_set(e, i, e->heap[m]);
        i = m;
    }
    heap_set(e, i, x);
}

static int heap_push(ctl_engine *e, ctl_timer *t)
{
    if (e->heap_len == e->heap_cap) {
        size_t cap = e->heap_cap ? e->heap_cap * 2 : 64;
        ctl_timer **h = realloc(e->heap, cap * sizeof *h);
        if (!h)
            return -1;
        e->heap = h;
        e->heap_cap = cap;
    }
    heap_set(e, e->heap_len++, t);
    heap_up(e, e->heap_len - 1);
    return 0;
}

static void heap_remove(ctl_engine *e, ctl_timer *t)
{
    if (!t->heap_at)
        return;
    size_t i = t->heap_at - 1;
    t->heap_at = 0;
    ctl_timer *last = e->heap[--e->heap_len];
    if (i == e->heap_len)
        return;
    heap_set(e, i, last);
    heap_up(e, i);
    heap_down(e, last->heap_at - 1);
}

static ctl_call *timer_call(ctl_timer *t)
{
    return (ctl_call *)((char *)t - offsetof(ctl_call, timer));
}

static ctl_rq *timer_rq(ctl_timer *t)
{
    return (ctl_rq *)((char *)t - offsetof(ctl_rq, timer));
}

/* ---- the calls in flight (I/O thread only) ---------------------------- */

static void live_add(ctl_engine *e, ctl_call *call)
{
    call->live_prev = NULL;
    call->live_next = e->live;
    if (e->live)
        e->live->live_prev = call;
    e->live = call;
    e->n_live++;
    if (call->left < NEAR_LEFT)
        e->near++;
}

static void live_remove(ctl_engine *e, ctl_call *call)
{
    if (call->live_prev)
        call->live_prev->live_next = call->live_next;
    else if (e->live == call)
        e->live = call->live_next;
    else
        return; /* not in the list */
    if (call->live_next)
        call->live_next->live_prev = call->live_prev;
    call->live_prev = call->live_next = NULL;
    e->n_live--;
    if (call->left < NEAR_LEFT)
        e->near--;
}

/* ---- calls ------------------------------------------------------------ */

static void engine_ref(ctl_engine *e)
{
    atomic_fetch_add_explicit(&e->refs, 1, memory_order_relaxed);
}

/* The last reference frees what a waiter may still look at: the struct,
 * its mutex and condition variable (the descriptors and the thread went
 * with ctl_engine_destroy). */
static void engine_unref(ctl_engine *e)
{
    if (atomic_fetch_sub_explicit(&e->refs, 1, memory_order_acq_rel) != 1)
        return;
    pthread_cond_destroy(&e->idle);
    pthread_mutex_destroy(&e->mu);
    free(e);
}

ctl_call *ctl_call_alloc(ctl_client *c, const char *op,
                         const char *const *addresses, size_t count, int many,
                         int timeout_ms)
{
    size_t n = count ? count : 1;
    size_t strings = strlen(op) + 1;
    for (size_t i = 0; i < count; i++)
        if (addresses[i])
            strings += strlen(addresses[i]) + 1;
    /* One block: the call, then its arrays, then the strings. */
    size_t sz = sizeof(ctl_call);
    size_t at_rqs = sz;
    sz += n * sizeof(ctl_rq);
    size_t at_reqs = sz;
    sz += n * sizeof(ctl_frame);
    size_t at_out = sz;
    sz += n * sizeof(ctl_outcome);
    size_t at_rep = sz;
    sz += n * sizeof(ctl_reply *);
    size_t at_addr = sz;
    sz += n * sizeof(char *);
    size_t at_str = sz;
    sz += strings;
    char *block = calloc(1, sz);
    if (!block)
        return NULL;
    ctl_call *call = (ctl_call *)block;
    call->client = c;
    call->engine = c->engine;
    engine_ref(c->engine);
    call->many = many;
    call->count = count;
    call->timeout_ms = timeout_ms;
    call->rqs = (ctl_rq *)(block + at_rqs);
    call->reqs = (ctl_frame *)(block + at_reqs);
    call->outcomes = (ctl_outcome *)(block + at_out);
    call->replies = (ctl_reply **)(block + at_rep);
    call->addresses = (char **)(block + at_addr);
    char *s = block + at_str;
    call->op = s;
    memcpy(s, op, strlen(op) + 1);
    s += strlen(op) + 1;
    for (size_t i = 0; i < count; i++) {
        ctl_error_init(&call->outcomes[i].error);
        if (!addresses[i])
            continue;
        size_t len = strlen(addresses[i]) + 1;
        memcpy(s, addresses[i], len);
        call->addresses[i] = s;
        s += len;
    }
    atomic_init(&call->refs, 0);
    atomic_init(&call->state, CTL_CALL_STARTED);
    atomic_init(&call->waiting, 0);
    atomic_init(&call->cancel, 0);
    return call;
}

static void call_free(ctl_call *call)
{
    if (call->ext.fini)
        call->ext.fini(call);
    /* A request made final let go of its frame and its reply then
     * (outcome_final): a fan-out of a thousand that ended in full is not
     * walked again here, after its last reply, where nothing else runs. */
    int all_final = call->finals == call->count;
    if (!all_final)
        for (size_t i = 0; i < call->count; i++) {
            ctl_frame_fini(&call->reqs[i]); /* those never sent */
            ctl_reply_destroy(&call->replies[i]);
        }
    if (!all_final || call->held)
        ctl_outcomes_fini(call->outcomes, call->count);
    ctl_engine *e = call->engine;
    free(call);
    engine_unref(e);
}

void ctl_call_abandon(ctl_call *call)
{
    if (call)
        call_free(call);
}

static void call_unref(ctl_call *call)
{
    if (atomic_fetch_sub_explicit(&call->refs, 1, memory_order_acq_rel) == 1)
        call_free(call);
}

void ctl_call_release(ctl_call *call)
{
    if (call)
        call_unref(call);
}

/* Set up the requests of a submitted call. */
static void rqs_setup_range(ctl_call *call, size_t from, size_t to)
{
    for (size_t i = from; i < to; i++) {
        ctl_rq *rq = &call->rqs[i];
        ctl_rq_init(rq, call->addresses[i], call->op, call->timeout_ms,
                    &call->reqs[i], &call->replies[i], &call->outcomes[i].error);
        rq->deadline_wall_ms = call->deadline_wall_ms;
        rq->owner = call;
        rq->flags = call->flags;
        rq->deadline_ms = call->deadline_ms;
    }
}

static void rqs_setup(ctl_call *call)
{
    rqs_setup_range(call, 0, call->count);
}

/* Pack request i's frame, when the starter left that to the engine
 * (ctl_call_ext.frame). */
static void frame_one(ctl_call *call, size_t i)
{
    if (call->ext.frame)
        call->ext.frame(call, i);
}

static void frame_all(ctl_call *call)
{
    for (size_t i = 0; call->ext.frame && i < call->count; i++)
        call->ext.frame(call, i);
}

/* Request i of `call` has no address (or no usable one: its starter set
 * the error then): it fails as CTL_INVALID, unsent. */
static void rq_no_address(ctl_call *call, size_t i)
{
    ctl_rq *rq = &call->rqs[i];
    if (rq->err->kind == CTL_OK)
        ctl_error_set(rq->err, CTL_INVALID, "%s_many: target #%zu has no address",
                      call->op, i);
    ctl_frame_fini(rq->req);
    rq->done = 1;
}

/* How many targets ahead send_here reads a socket's state into the cache
 * (a fan-out's). */
#define PREFETCH_AHEAD 4
/* send_here sets up, lends and sends a fan-out's requests this many at a
 * time. */
#define SEND_CHUNK 64

/* Start reading what a send touches of connection `conn` (NULL: none)
 * into the cache: its first two cache lines (its socket, its address,
 * whether it was reused, its lost connection). */
static void prefetch_conn(const ctl_conn *conn)
{
    _Static_assert(offsetof(ctl_conn, st.lost) < 128,
                   "a send's fields of ctl_conn are in its first 128 bytes");
    if (!conn)
        return;
    __builtin_prefetch(conn);
    __builtin_prefetch((const char *)conn + 64);
}

/* Whether send_here left request `rq` for the I/O thread to send: it
 * still holds its frame (ctl_rq_send consumes it unless it found no idle
 * socket; a request without an address is done). */
static int left_unsent(const ctl_rq *rq)
{
    return !rq->done && rq->req;
}

/* Send the requests of `call` that have an idle socket on the calling
 * thread (send_on_submit, CTL_SEND_IDLE). The sockets are
 * lent to this thread until the I/O thread takes the call over: it
 * ignores their signals meanwhile (no engine request on them) and reads
 * each one as it adopts it (watch). A request that fails here is done,
 * with its error, and its retries are the I/O thread's; one left unsent
 * (no idle socket) the I/O thread sends. */
static void send_here(ctl_call *call)
{
    ctl_client *c = call->client;
    /* A chunk at a time: its requests set up, its idle sockets lent under
     * one hold of the pool's lock, then its frames packed and sent, each
     * with the socket a few targets on being read into the cache
     * meanwhile. A large fan-out's sockets are rarely all in the cache,
     * and the request that leaves last ends the batch; in chunks, the
     * first leaves after one chunk's setup rather than the whole batch's,
     * and the units start on it while the rest go out. */
    for (size_t from = 0; from < call->count; from += SEND_CHUNK) {
        size_t to = call->count - from > SEND_CHUNK ? from + SEND_CHUNK : call->count;
        rqs_setup_range(call, from, to);
        ctl_pool_lock(c->pool);
        for (size_t i = from; i < to; i++)
            if (call->rqs[i].address)
                call->rqs[i].conn = ctl_pool_lend_idle_locked(c->pool, call->rqs[i].address);
        ctl_pool_unlock(c->pool);
        for (size_t i = from; i < to; i++) {
            ctl_rq *rq = &call->rqs[i];
            if (i + PREFETCH_AHEAD < to)
                prefetch_conn(call->rqs[i + PREFETCH_AHEAD].conn);
            if (!rq->address) {
                rq_no_address(call, i);
                continue;
            }
            frame_one(call, i);
            rq->idle_only = 1;
            ctl_rq_send(c, rq);
            rq->idle_only = 0;
            if (left_unsent(rq))
                call->dials = 1;
        }
    }
    call->sent = 1;
}

/* Tell the engine there is work (a submission, a cancel, the end): the
 * driver, in its epoll_wait, through the wake-up eventfd; the I/O thread,
 * when nobody drives, through its condition variable. Called with the
 * mutex held. */
static void kick(ctl_engine *e)
{
    if (e->driver == DRIVER_NONE) {
        pthread_cond_signal(&e->idle);
        return;
    }
    if (e->wake_pending || e->joined)
        return;
    e->wake_pending = 1;
    uint64_t one = 1;
    ssize_t n = write(e->wake_fd, &one, sizeof one);
    (void)n; /* a full counter (never here) is a wake-up all the same */
}

/* Whether a thread waiting for `call` may drive the engine for it: not
 * when callbacks run on the I/O thread (they would run on the waiter),
 * nor for a call the caller's thread has not sent, or left sockets to dial
 * (send_here): sockets are made on the I/O thread. */
static int waiter_may_drive(const ctl_engine *e, const ctl_call *call)
{
    return !e->io_callbacks && call->sent && !call->dials;
}

int ctl_call_submit(ctl_call *call, ctl_call **out, ctl_error *err)
{
    ctl_client *c = call->client;
    ctl_engine *e = c->engine;
    int rc = ctl_client_reserve(c, call->op, (const char *const *)call->addresses,
                                call->count, call->many, err);
    if (rc != 0) {
        call_free(call);
        return rc;
    }
    int64_t tmo = call->timeout_ms;
    call->deadline_ms = ctl_now_ms() + tmo;
    call->deadline_wall_ms = ctl_wall_ms() + tmo;
    atomic_store_explicit(&call->refs, out ? 2 : 1, memory_order_relaxed);
    if (out)
        *out = call;
    /* send_here packs each frame as it sends; otherwise all are packed
     * now, while the caller's args are there. */
    int here = call->send_on_submit && io_engine != e;
    if (!here)
        frame_all(call);
    pthread_mutex_lock(&e->mu);
    if (!e->stopping && here) {
        /* A client is never destroyed while one of its blocking calls runs
         * (ctl_client_destroy is not thread-safe): checked once, here. */
        pthread_mutex_unlock(&e->mu);
        send_here(call);
        pthread_mutex_lock(&e->mu);
    }
    call->ext.frame = NULL; /* every frame is packed: the args are the caller's again */
    call->ext.args = NULL;
    if (e->stopping && !call->sent) {
        pthread_mutex_unlock(&e->mu);
        ctl_client_unreserve(c, call->count);
        if (out)
            *out = NULL;
        rc = ctl_error_set(err, CTL_INVALID,
                           "%s%s: the client is being destroyed; nothing was sent",
                           call->op, call->many ? "_many" : "");
        call_free(call);
        return rc;
    }
    call->next = NULL;
    if (e->sub_tail)
        e->sub_tail->next = call;
    else
        e->sub_head = call;
    e->sub_tail = call;
    if (io_engine == e)
        e->resubmitted = 1;
    else if (!(call->waited && waiter_may_drive(e, call) &&
               e->driver == DRIVER_NONE))
        kick(e); /* else the starter's wait drives, and adopts it */
    pthread_mutex_unlock(&e->mu);
    return 0;
}

void ctl_call_cancel(ctl_call *call)
{
    if (!call ||
        atomic_load_explicit(&call->state, memory_order_acquire) != CTL_CALL_STARTED)
        return;
    if (atomic_exchange_explicit(&call->cancel, 1, memory_order_acq_rel))
        return; /* asked already */
    ctl_engine *e = call->engine;
    pthread_mutex_lock(&e->mu);
    e->cancels++;
    kick(e);
    pthread_mutex_unlock(&e->mu);
}

/* Move `call` to `state` and wake the threads waiting for it. The caller
 * holds a reference to the call. */
static void set_state(ctl_call *call, int state)
{
    atomic_store(&call->state, state);
    if (atomic_load(&call->waiting) > 0)
        syscall(SYS_futex, (int *)&call->state, FUTEX_WAKE_PRIVATE, INT_MAX, NULL,
                NULL, 0);
}

static int pass(ctl_engine *e, int cap_ms);

/* Drive the engine on this thread until `call` has ended, or until
 * `until_ns` (0: no limit) has passed. Returns 0 (it has ended),
 * CTL_TRANSFER (the time ran out), or 1 when this thread may not drive
 * (another does, the engine is going, callbacks must run on the I/O
 * thread, or the call has requests that the I/O thread sends) or has
 * stopped driving early: the caller waits instead. */
static int drive_for(ctl_engine *e, ctl_call *call, int64_t until_ns)
{
    if (io_engine == e || !waiter_may_drive(e, call))
        return 1;
    pthread_mutex_lock(&e->mu);
    int mine = e->driver == DRIVER_NONE && !e->stopping;
    if (mine)
        e->driver = DRIVER_WAITER;
    pthread_mutex_unlock(&e->mu);
    if (!mine)
        return 1;
    int rc = 1;
    for (;;) {
        if (atomic_load_explicit(&call->state, memory_order_acquire) != CTL_CALL_STARTED) {
            rc = 0;
            break;
        }
        int cap = -1;
        if (until_ns) {
            int64_t ns = until_ns - ctl_now_ns();
            if (ns <= 0) {
                rc = CTL_TRANSFER;
                break;
            }
            int64_t ms = (ns + 999999) / 1000000; /* no turn with 0 left */
            cap = ms > INT32_MAX ? INT32_MAX : (int)ms;
        }
        if (pass(e, cap) != PASS_BUSY)
            break; /* the engine is going (the I/O thread ends the calls) */
    }
    /* Give the drive back; the I/O thread takes it if anything is left. */
    int busy = e->live != NULL;
    pthread_mutex_lock(&e->mu);
    e->driver = DRIVER_NONE;
    if (busy || e->sub_head || e->cancels || e->stopping)
        pthread_cond_signal(&e->idle);
    pthread_mutex_unlock(&e->mu);
    return rc;
}

int ctl_call_wait(ctl_call *call, int timeout_ms)
{
    if (!call)
        return CTL_INVALID;
    if (atomic_load_explicit(&call->state, memory_order_acquire) != CTL_CALL_STARTED)
        return 0;
    int64_t until = timeout_ms >= 0 ? ctl_now_ns() + (int64_t)timeout_ms * 1000000 : 0;
    int rc = drive_for(call->engine, call, until);
    if (rc != 1)
        return rc;
    rc = 0;
    atomic_fetch_add(&call->waiting, 1);
    while (atomic_load(&call->state) == CTL_CALL_STARTED) {
        struct timespec left, *lp = NULL;
        if (timeout_ms >= 0) {
            int64_t ns = until - ctl_now_ns();
            if (ns <= 0) {
                rc = CTL_TRANSFER;
                break;
            }
            left.tv_sec = (time_t)(ns / 1000000000);
            left.tv_nsec = (long)(ns % 1000000000);
            lp = &left;
        }
        /* Returns at once if the state has moved; woken, timed out or
         * interrupted, the loop looks again. */
        syscall(SYS_futex, (int *)&call->state, FUTEX_WAIT_PRIVATE, CTL_CALL_STARTED,
                lp, NULL, 0);
    }
    atomic_fetch_sub(&call->waiting, 1);
    return rc;
}

const ctl_outcome *ctl_call_outcomes(const ctl_call *call, size_t *count)
{
    if (count)
        *count = 0;
    /* A typed call's outcomes belong to its typed delivery, which moves or
     * frees them on whichever thread delivers it: none are lent here. */
    if (!call || call->ext.deliver ||
        (atomic_load_explicit(&call->state, memory_order_acquire) == CTL_CALL_STARTED &&
         call != delivering))
        return NULL;
    if (count)
        *count = call->count;
    return call->outcomes;
}

/* Run the call's callback (on whichever thread delivers it). */
static void run_callback(ctl_call *call)
{
    const ctl_call *outer = delivering;
    delivering = call;
    if (call->ext.deliver)
        call->ext.deliver(call);
    else if (call->many && call->done_many)
        call->done_many(call->user, call->outcomes, call->count);
    else if (!call->many && call->done_one)
        call->done_one(call->user, &call->outcomes[0].error,
                       call->outcomes[0].reply);
    delivering = outer;
}

static int has_callback(const ctl_call *call)
{
    return call->ext.deliver || (call->many ? call->done_many != NULL
                                            : call->done_one != NULL);
}

/* Deliver the calls that ended in this pass (I/O thread). */
static void deliver_ended(ctl_engine *e)
{
    while (e->ended) {
        ctl_call *call = e->ended;
        e->ended = call->next;
        call->next = NULL;
        if (e->io_callbacks || !has_callback(call)) {
            run_callback(call);
            /* Delivered before a waiter can see it: the waiter may release
             * its handle at once (this thread's reference keeps the call
             * until the waiters are woken). */
            set_state(call, CTL_CALL_DELIVERED);
            call_unref(call);
            continue;
        }
        pthread_mutex_lock(&e->mu);
        if (!e->done_head) {
            uint64_t one = 1;
            ssize_t n = write(e->ready_fd, &one, sizeof one);
            (void)n;
        }
        if (e->done_tail)
            e->done_tail->next = call;
        else
            e->done_head = call;
        e->done_tail = call;
        set_state(call, CTL_CALL_DONE); /* its outcome final: waiters go */
        pthread_mutex_unlock(&e->mu);
    }
}

int ctl_engine_process(ctl_engine *e, int max)
{
    /* Take what is queued now (up to `max`) in one hold of the mutex, then
     * run it without. What ends meanwhile, the calls these callbacks start
     * included, waits for the next call: a loop that calls this when the
     * event descriptor is readable gets its turn back after a bounded
     * batch, however long a chain of callbacks goes on. */
    int n = 0;
    pthread_mutex_lock(&e->mu);
    ctl_call *batch = e->done_head, *last = NULL;
    for (ctl_call *c = batch; c && (max <= 0 || n < max); c = c->next) {
        last = c;
        n++;
    }
    if (last) {
        e->done_head = last->next;
        last->next = NULL;
        if (!e->done_head) {
            e->done_tail = NULL;
            uint64_t v;
            ssize_t r = read(e->ready_fd, &v, sizeof v);
            (void)r;
        }
    }
    pthread_mutex_unlock(&e->mu);
    while (batch) {
        ctl_call *call = batch;
        batch = call->next;
        call->next = NULL;
        run_callback(call);
        atomic_store_explicit(&call->state, CTL_CALL_DELIVERED, memory_order_release);
        call_unref(call);
    }
    return n;
}

int ctl_engine_event_fd(const ctl_engine *e)
{
    return e->ready_fd;
}

/* ---- the I/O thread ---------------------------------------------------- */

/* Request i of `call` is done for good: its outcome is made final (its
 * reply moved there, or an error), its counts taken, and the typed
 * layer's hook run on it. Once a request, as it ends, so that a large
 * fan-out's last reply leaves little to do after it. */
static void outcome_final(ctl_engine *e, ctl_call *call, size_t i)
{
    ctl_rq *rq = &call->rqs[i];
    if (rq->final)
        return;
    rq->final = 1;
    call->finals++;
    if (rq->req) /* never sent, and it will not be now */
        ctl_frame_fini(rq->req);
    ctl_outcome *o = &call->outcomes[i];
    o->reply = call->replies[i];
    call->replies[i] = NULL;
    if (!o->reply && o->error.kind == CTL_OK)
        ctl_error_transfer(&o->error, CTL_CAUSE_TRANSPORT,
                           "%s at %s: no reply", call->op,
                           call->addresses[i] ? call->addresses[i] : "?");
    rq->reply = &o->reply;
    ctl_rq_end(e->client, rq);
    if (call->ext.outcome_final)
        call->ext.outcome_final(call, i);
    /* The typed layer moves what the outcome held into its own. */
    if (o->reply || o->error.kind != CTL_OK || o->error.msg)
        call->held++;
}

/* A call whose requests are all done: queue it for delivery after this
 * pass. */
static void end_call(ctl_engine *e, ctl_call *call)
{
    heap_remove(e, &call->timer);
    live_remove(e, call);
    /* Those not made final as they ended (a call that never got going). */
    for (size_t i = 0; call->finals < call->count && i < call->count; i++)
        outcome_final(e, call, i);
    ctl_client_unreserve(e->client, call->count);
    call->next = e->ended;
    e->ended = call;
}

/* Request `rq` of `call` (a call in flight) is done, for good. */
static void rq_done(ctl_engine *e, ctl_call *call, ctl_rq *rq)
{
    outcome_final(e, call, (size_t)(rq - call->rqs));
    if (call->left == NEAR_LEFT)
        e->near++;
    if (--call->left == 0)
        end_call(e, call);
}

/* Take an attempt's own limit out of the heap (its attempt has ended). */
static void disarm(ctl_engine *e, ctl_rq *rq)
{
    if (rq->attempt_timer) {
        heap_remove(e, &rq->timer);
        rq->attempt_timer = 0;
    }
}

/* An attempt of `rq` has ended: the request is done, or waits out a
 * backoff (a timer in the heap) before its next attempt. */
static void rq_ended(ctl_engine *e, ctl_rq *rq)
{
    int64_t at;
    ctl_call *call = rq->owner;
    disarm(e, rq);
    if (!atomic_load_explicit(&call->cancel, memory_order_acquire) &&
        ctl_rq_retry(e->client, rq, ctl_now_ms(), &at)) {
        rq->timer.at = at;
        rq->timer.is_rq = 1;
        if (heap_push(e, &rq->timer) == 0)
            return;
        rq->backoff = 0; /* out of memory for the timer: it ends here */
    }
    rq_done(e, call, rq);
}

/* Read what has arrived for `rq` until its socket has nothing more. */
static void drain(ctl_engine *e, ctl_rq *rq)
{
    ctl_client *c = e->client;
    if (rq->done)
        return;
    for (int tries = 0; tries < 2; tries++) {
        if (ctl_rq_try_send(c, rq)) {
            /* A receive that finds nothing has processed the socket's
             * commands, so its next one signals again. */
            while (!rq->done && ctl_rq_recv(c, rq, ZMQ_DONTWAIT) == 0)
                ;
            break;
        }
        /* Still no connection. A send may leave the socket's commands
         * unprocessed (ZeroMQ throttles that), and the set is
         * edge-triggered: ZMQ_EVENTS processes them, and says whether the
         * connection came up meanwhile. */
        int events = 0;
        size_t len = sizeof events;
        if (zmq_getsockopt(rq->conn->sock, ZMQ_EVENTS, &events, &len) != 0 ||
            !(events & ZMQ_POLLOUT))
            break;
    }
    if (rq->done)
        rq_ended(e, rq);
}

/* A request's attempt has been handed to its socket (ctl_rq_send or
 * ctl_rq_resend returned `rc`): watch its socket, or end the attempt. */
static void watch(ctl_engine *e, ctl_rq *rq, int rc)
{
    if (rc == 0) {
        /* An attempt with a limit of its own before the call's deadline
         * (retry.attempt_timeout_ms) has a timer of its own. */
        int64_t until = ctl_rq_attempt_until(e->client, rq, ctl_now_ms());
        if (until < rq->deadline_ms) {
            rq->timer.at = until;
            rq->timer.is_rq = 1;
            rq->attempt_timer = heap_push(e, &rq->timer) == 0;
        }
        if (ctl_pool_watch(e->client->pool, rq->conn) != 0) {
            ctl_rq_fail(e->client, rq, CTL_CAUSE_TRANSPORT,
                        "cannot watch the socket (epoll)");
        } else {
            rq->conn->engine_rq = rq;
            /* The send may have taken the socket's signal: look now, as
             * after a wake-up (drain ends the attempt if it is done). The
             * set is edge-triggered, so the socket is read until it has
             * nothing more before the thread waits again. */
            drain(e, rq);
            return;
        }
    }
    if (rq->done)
        rq_ended(e, rq);
}

/* Send the requests of a submitted call (none when `refuse_why` is set:
 * the client is going, and the call ends with it). */
static void start_call(ctl_engine *e, ctl_call *call, const char *refuse_why)
{
    ctl_client *c = e->client;
    int cancelled = atomic_load_explicit(&call->cancel, memory_order_acquire);
    call->left = call->count;
    if (!call->sent)
        rqs_setup(call);
    call->timer.at = call->deadline_ms;
    call->timer.is_rq = 0;
    if (call->count == 0 || heap_push(e, &call->timer) != 0) {
        for (size_t i = 0; i < call->count; i++) {
            ctl_rq *rq = &call->rqs[i];
            if (call->sent && !left_unsent(rq)) {
                /* Sent by the caller: a request still out ends here, its
                 * socket retired as a timeout's; the others keep their
                 * outcome. */
                if (!rq->done)
                    ctl_rq_fail(c, rq, CTL_CAUSE_NOMEM,
                                "out of memory in the client's engine after "
                                "it was sent (the unit may have run it)");
                continue;
            }
            ctl_error_transfer(&call->outcomes[i].error, CTL_CAUSE_NOMEM,
                               "%s at %s: out of memory", call->op,
                               call->addresses[i] ? call->addresses[i] : "?");
        }
        end_call(e, call);
        return;
    }
    live_add(e, call);
    for (size_t i = 0; i < call->count; i++) {
        ctl_rq *rq = &call->rqs[i];
        if (call->sent && !left_unsent(rq)) {
            /* Sent by the caller (send_here): watch it, or end the attempt
             * that failed there (its retries go on here). */
            if (!rq->address) {
                rq_done(e, call, rq);
                continue;
            }
            watch(e, rq, rq->done ? -1 : 0);
        } else if (!rq->address) {
            rq_no_address(call, i);
            rq_done(e, call, rq);
        } else if (cancelled || refuse_why) {
            ctl_frame_fini(rq->req);
            ctl_rq_fail(c, rq, CTL_CAUSE_CANCELLED,
                        refuse_why ? refuse_why
                                   : "cancelled by the caller; nothing was sent");
            rq_done(e, call, rq);
        } else {
            watch(e, rq, ctl_rq_send(c, rq));
        }
    }
}

/* The next attempt of a request whose backoff has ended. */
static void retry_now(ctl_engine *e, ctl_rq *rq)
{
    watch(e, rq, ctl_rq_resend(e->client, rq));
}

/* Fail every request of `call` not done yet with `cause`: `sent_why` for
 * one whose request is on its way, `unsent_why` for one not sent, and
 * `between_why` for one waiting out a backoff after an attempt left. */
static void fail_call(ctl_engine *e, ctl_call *call, ctl_cause cause,
                      const char *sent_why, const char *unsent_why,
                      const char *between_why)
{
    for (size_t i = 0; i < call->count && call->left; i++) {
        ctl_rq *rq = &call->rqs[i];
        if (rq->backoff) {
            heap_remove(e, &rq->timer);
            rq->backoff = 0;
            ctl_rq_fail(e->client, rq, cause,
                        rq->ever_left ? between_why : unsent_why);
        } else if (rq->done) {
            continue;
        } else {
            disarm(e, rq);
            ctl_rq_fail(e->client, rq, cause,
                        rq->conn && !rq->unsent ? sent_why : unsent_why);
        }
        rq_done(e, call, rq);
    }
}

/* Cancels: walk the calls in flight for those asked to end. */
static void cancel_pass(ctl_engine *e)
{
    ctl_call *next;
    for (ctl_call *call = e->live; call; call = next) {
        next = call->live_next; /* only `call` can leave the list here */
        if (atomic_load_explicit(&call->cancel, memory_order_acquire))
            fail_call(e, call, CTL_CAUSE_CANCELLED,
                      "cancelled by the caller after it was sent (the unit "
                      "may have run it)",
                      "cancelled by the caller; nothing was sent",
                      "cancelled by the caller while waiting to retry (an "
                      "earlier attempt was sent: the unit may have run it)");
    }
}

/* Requests that have waited a slice read their connection's monitor. */
static void check_pass(ctl_engine *e, int64_t now)
{
    ctl_call *next;
    for (ctl_call *call = e->live; call; call = next) {
        next = call->live_next;
        for (size_t j = 0; j < call->count && call->left; j++) {
            ctl_rq *rq = &call->rqs[j];
            if (rq->done || rq->backoff || now - rq->sent_ms < CHECK_SLICE_MS)
                continue;
            ctl_rq_check_conn(e->client, rq, now);
            if (rq->done)
                rq_ended(e, rq);
        }
    }
}

/* Timers that are due: backoffs that have ended, deadlines that have
 * passed. */
static void expire_pass(ctl_engine *e, int64_t now)
{
    while (e->heap_len && e->heap[0]->at <= now) {
        ctl_timer *t = e->heap[0];
        if (t->is_rq) {
            ctl_rq *rq = timer_rq(t);
            heap_remove(e, t);
            if (rq->attempt_timer) {
                /* The attempt's own limit: it ends as a timeout, which
                 * the policy may retry. */
                rq->attempt_timer = 0;
                if (!rq->done)
                    ctl_rq_time_out(e->client, rq);
                rq_ended(e, rq);
            } else {
                retry_now(e, rq);
            }
            continue;
        }
        ctl_call *call = timer_call(t);
        for (size_t i = 0; i < call->count && call->left; i++) {
            ctl_rq *rq = &call->rqs[i];
            if (rq->backoff) {
                /* Its last attempt's error stands (ctl_rq_retry never
                 * lets a backoff pass the deadline; a late timer can). */
                heap_remove(e, &rq->timer);
                rq->backoff = 0;
                rq_done(e, call, rq);
                continue;
            }
            if (rq->done)
                continue;
            disarm(e, rq);
            ctl_rq_time_out(e->client, rq);
            rq_done(e, call, rq);
        }
    }
}

static int wait_ms(ctl_engine *e, int64_t now)
{
    int64_t until = e->next_upkeep_ms;
    if (e->heap_len) {
        if (e->heap[0]->at < until)
            until = e->heap[0]->at;
        if (e->next_check_ms < until)
            until = e->next_check_ms;
    }
    int64_t d = until - now;
    return d < 0 ? 0 : d > INT32_MAX ? INT32_MAX : (int)d;
}

/* Run the sockets' upkeep when it is due. */
static void upkeep(ctl_engine *e, int64_t now)
{
    ctl_client *c = e->client;
    if (now >= e->next_upkeep_ms &&
        !atomic_load_explicit(&c->no_upkeep, memory_order_relaxed)) {
        ctl_pool_upkeep(c->pool, now);
        e->next_upkeep_ms = now + UPKEEP_MS;
    }
}

/* One pass of the engine, by its driver: take the submissions and
 * cancels, and with calls in flight wait (at most `cap_ms`, < 0: no cap)
 * for their sockets and timers and handle what came. A waiter's pass
 * leaves the engine's end to the I/O thread. */
static int pass(ctl_engine *e, int cap_ms)
{
    ctl_client *c = e->client;
    struct epoll_event evs[EVENTS_PER_WAIT];
    e->resubmitted = 0;
    /* Between two waits: no event in hand can point at these. */
    ctl_pool_reap(c->pool);
    pthread_mutex_lock(&e->mu);
    int stopping = e->stopping;
    if (stopping && io_engine != e) {
        pthread_mutex_unlock(&e->mu);
        return PASS_STOPPED;
    }
    ctl_call *subs = e->sub_head;
    e->sub_head = e->sub_tail = NULL;
    unsigned cancels = e->cancels;
    e->cancels = 0;
    e->wake_pending = 0;
    pthread_mutex_unlock(&e->mu);

    int had_live = e->live != NULL;
    while (subs) {
        ctl_call *call = subs;
        subs = call->next;
        call->next = NULL;
        start_call(e, call,
                   stopping ? "the client was destroyed; nothing was sent" : NULL);
    }
    if (!had_live && e->live)
        e->next_check_ms = ctl_now_ms() + CHECK_SLICE_MS;
    if (cancels)
        cancel_pass(e);
    if (stopping) {
        while (e->live)
            fail_call(e, e->live, CTL_CAUSE_CANCELLED,
                      "the client was destroyed while the call was in "
                      "flight (the unit may have run it)",
                      "the client was destroyed; nothing was sent",
                      "the client was destroyed while the call waited to "
                      "retry (an earlier attempt was sent: the unit may "
                      "have run it)");
        deliver_ended(e);
        return PASS_STOPPED;
    }
    deliver_ended(e);

    int64_t now = ctl_now_ms();
    if (!e->live && !e->resubmitted) {
        /* Nothing to wait for: an idle socket's signal is for nobody, and
         * the set keeps it for the next driver's wait. */
        upkeep(e, now);
        return PASS_IDLE;
    }
    int ms = e->resubmitted ? 0 : wait_ms(e, now);
    if (cap_ms >= 0 && cap_ms < ms)
        ms = cap_ms;
    if (ms > 0 && !e->near)
        sched_yield(); /* nothing ends on the next reply: let it gather more */
    int n = epoll_wait(e->epfd, evs, EVENTS_PER_WAIT, ms);
    for (int i = 0; i < n; i++) {
        ctl_conn *conn = evs[i].data.ptr;
        if (!conn) {
            uint64_t v;
            ssize_t r = read(e->wake_fd, &v, sizeof v);
            (void)r;
            continue;
        }
        if (conn->engine_rq) /* else idle, or lent to a blocking call */
            drain(e, conn->engine_rq);
    }
    now = ctl_now_ms();
    expire_pass(e, now);
    if (now >= e->next_check_ms) {
        check_pass(e, now);
        e->next_check_ms = now + CHECK_SLICE_MS;
    }
    upkeep(e, now);
    deliver_ended(e);
    return PASS_BUSY;
}

/* Whether the I/O thread has work to take up (mutex held, nobody
 * driving: the engine's state is the last driver's, handed over). */
static int io_has_work(const ctl_engine *e)
{
    return e->stopping || e->sub_head || e->cancels || e->live ||
           ctl_now_ms() >= e->next_upkeep_ms;
}

/* Sleep on the condition variable until `until_ms` (monotonic). */
static void idle_until(ctl_engine *e, int64_t until_ms)
{
    struct timespec ts = {.tv_sec = (time_t)(until_ms / 1000),
                          .tv_nsec = (long)(until_ms % 1000) * 1000000};
    pthread_cond_timedwait(&e->idle, &e->mu, &ts);
}

/* The I/O thread drives the engine while calls are in flight and nobody
 * else does; otherwise it sleeps, waking for the sockets' upkeep. */
static void *io_thread(void *arg)
{
    ctl_engine *e = arg;
    io_engine = e;
    pthread_mutex_lock(&e->mu);
    for (;;) {
        /* While a waiter drives, the engine's timers are its: look again
         * every upkeep period (it hands the drive back with a signal when
         * calls are left in flight). */
        while (e->driver != DRIVER_NONE || !io_has_work(e))
            idle_until(e, e->driver != DRIVER_NONE ? ctl_now_ms() + UPKEEP_MS
                                                   : e->next_upkeep_ms);
        e->driver = DRIVER_IO;
        pthread_mutex_unlock(&e->mu);
        int st;
        do
            st = pass(e, -1);
        while (st == PASS_BUSY);
        pthread_mutex_lock(&e->mu);
        if (st == PASS_STOPPED)
            break;
        e->driver = DRIVER_NONE;
    }
    pthread_mutex_unlock(&e->mu);
    return NULL;
}

int ctl_engine_new(ctl_client *c, ctl_engine **out, ctl_error *err)
{
    *out = NULL;
    ctl_engine *e = calloc(1, sizeof *e);
    if (!e)
        return ctl_error_transfer(err, CTL_CAUSE_NOMEM, "client: out of memory");
    e->client = c;
    atomic_init(&e->refs, 1);
    e->io_callbacks = c->opts.callbacks_on_io_thread;
    int64_t now = ctl_now_ms();
    e->next_check_ms = now + CHECK_SLICE_MS;
    e->next_upkeep_ms = now + UPKEEP_MS;
    e->epfd = epoll_create1(EPOLL_CLOEXEC);
    e->wake_fd = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
    e->ready_fd = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
    struct epoll_event ev = {.events = EPOLLIN, .data.ptr = NULL};
    int e_no = errno;
    if (e->epfd < 0 || e->wake_fd < 0 || e->ready_fd < 0 ||
        epoll_ctl(e->epfd, EPOLL_CTL_ADD, e->wake_fd, &ev) != 0) {
        e_no = errno;
        goto fail;
    }
    pthread_condattr_t ca;
    pthread_condattr_init(&ca);
    pthread_condattr_setclock(&ca, CLOCK_MONOTONIC); /* ctl_now_ms's */
    pthread_cond_init(&e->idle, &ca);
    pthread_condattr_destroy(&ca);
    pthread_mutex_init(&e->mu, NULL);
    ctl_pool_set_epfd(c->pool, e->epfd);
    if ((e_no = ctl_thread_start(&e->thread, io_thread, e)) != 0) {
        ctl_pool_set_epfd(c->pool, -1);
        pthread_mutex_destroy(&e->mu);
        pthread_cond_destroy(&e->idle);
        goto fail;
    }
    *out = e;
    return 0;
fail:
    if (e->epfd >= 0)
        close(e->epfd);
    if (e->wake_fd >= 0)
        close(e->wake_fd);
    if (e->ready_fd >= 0)
        close(e->ready_fd);
    free(e);
    return ctl_error_transfer(err, CTL_CAUSE_TRANSPORT,
                              "client: cannot start its I/O thread: %s",
                              strerror(e_no));
}

void ctl_engine_destroy(ctl_engine **engine)
{
    if (!engine || !*engine)
        return;
    ctl_engine *e = *engine;
    pthread_mutex_lock(&e->mu);
    e->stopping = 1;
    e->wake_pending = 0;
    kick(e);
    pthread_mutex_unlock(&e->mu);
    pthread_join(e->thread, NULL);
    /* A late cancel writes nothing to the descriptors closed below. */
    pthread_mutex_lock(&e->mu);
    e->joined = 1;
    pthread_mutex_unlock(&e->mu);
    /* Calls submitted after the thread's last look (none can be: submit
     * refuses once stopping is set) and completions still queued, to the
     * last: each call of ctl_engine_process runs only what it finds. */
    while (ctl_engine_process(e, 0) > 0)
        ;
    free(e->heap);
    /* The pooled sockets leave a set that is going (closing them later
     * takes nothing out of it). */
    ctl_pool_set_epfd(e->client->pool, -1);
    close(e->epfd);
    close(e->wake_fd);
    close(e->ready_fd);
    *engine = NULL;
    engine_unref(e); /* the calls still held keep the rest */
}
