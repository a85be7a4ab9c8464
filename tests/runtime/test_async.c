/*
 * test_async.c - asynchronous calls on the client's engine.
 *
 * Every started call completes exactly once: each test counts completions
 * per call and checks the count is 1 (and never 2) after waiting for
 * them with a deadline. The paths that end a call (reply, error,
 * deadline, cancel, a dead unit, the client's destruction) are driven one
 * by one and raced against each other (cancel against a reply, thousands
 * of times with each delivery, at points from before the send to after the
 * callback, some of them forced: run it under TSan). Delivery is checked
 * both ways: queued for ctl_client_process with the event descriptor
 * level-triggered, and on the I/O thread.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>

#include <poll.h>
#include <pthread.h>
#include <sched.h>
#include <signal.h>
#include <dirent.h>
#include <sys/syscall.h>
#include <unistd.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ctlrpc/gen.h"
#include "testutil.h"

#define CALL_MS 10000

typedef struct race_unit race_unit;
typedef struct race_call race_call;

typedef struct fx {
    tu_unit unit;
    ctl_client *client;
    ctl_error err;
    tu_buf args;
    tu_fake *fake;
    /* test_cancel_races_reply*: its client, unit and calls */
    ctl_client *race_client;
    race_unit *race;
    race_call *race_calls;
} fx;

static void race_teardown(fx *f);

static ctl_client *new_client(int on_io_thread, unsigned max_in_flight)
{
    ctl_client_options o;
    ctl_client *c = NULL;
    ctl_error err;
    ctl_error_init(&err);
    ctl_client_options_init(&o);
    o.callbacks_on_io_thread = on_io_thread;
    o.max_in_flight = max_in_flight;
    o.late_grace_ms = 2000;
    if (ctl_client_new(&o, &c, &err) != 0)
        fprintf(stderr, "client_new: %s\n", err.msg ? err.msg : "?");
    ctl_error_fini(&err);
    return c;
}

static int setup(void **state)
{
    fx *f = calloc(1, sizeof *f);
    if (!f)
        return -1;
    ctl_error_init(&f->err);
    tu_buf_init(&f->args);
    if (tu_unit_start(&f->unit, NULL, &f->err) != 0)
        return -1;
    f->client = new_client(0, 0);
    if (!f->client)
        return -1;
    *state = f;
    return 0;
}

static int teardown(void **state)
{
    fx *f = *state;
    race_teardown(f);
    ctl_client_destroy(&f->client);
    tu_fake_stop(&f->fake);
    tu_unit_stop(&f->unit);
    tu_buf_fini(&f->args);
    ctl_error_fini(&f->err);
    free(f);
    return 0;
}

/* What one call's completion saw. */
typedef struct seen {
    atomic_int completions;
    int kind;
    int cause;
    int64_t value; /* the echoed "v", or -1 */
    char msg[256];
    pthread_t thread;
} seen;

static void on_done(void *user, const ctl_error *err, ctl_reply *reply)
{
    seen *s = user;
    s->kind = err->kind;
    s->cause = err->cause;
    s->value = -1;
    s->thread = pthread_self();
    snprintf(s->msg, sizeof s->msg, "%s", err->msg ? err->msg : "");
    if (reply) {
        const msgpack_object *o = ctl_reply_result(reply);
        if (o->type == MSGPACK_OBJECT_POSITIVE_INTEGER)
            s->value = (int64_t)o->via.u64;
    }
    atomic_fetch_add(&s->completions, 1);
}

/* Pack {"field": "v", "v": n}: the test unit's echo returns n. */
static void pack_echo(tu_buf *b, int64_t n)
{
    tu_buf_reset(b);
    msgpack_pack_map(&b->pk, 2);
    tu_pk_str(&b->pk, "field");
    tu_pk_str(&b->pk, "v");
    tu_pk_str(&b->pk, "v");
    msgpack_pack_int64(&b->pk, n);
}

static void pack_sleep(tu_buf *b, int ms)
{
    tu_buf_reset(b);
    msgpack_pack_map(&b->pk, 1);
    tu_pk_str(&b->pk, "ms");
    msgpack_pack_int(&b->pk, ms);
}

/* Run queued completions until *count reaches `want` or timeout_ms passes,
 * sleeping in poll() on the event descriptor in between. */
static int process_until(ctl_client *c, atomic_int *count, int want, int timeout_ms)
{
    int64_t until = tu_now_ms() + timeout_ms;
    struct pollfd p = {ctl_client_event_fd(c), POLLIN, 0};
    while (atomic_load(count) < want) {
        int64_t left = until - tu_now_ms();
        if (left <= 0)
            break;
        if (poll(&p, 1, (int)(left < 50 ? left : 50)) > 0)
            ctl_client_process(c, 0);
    }
    return atomic_load(count);
}

static int readable(int fd)
{
    struct pollfd p = {fd, POLLIN, 0};
    return poll(&p, 1, 0) == 1 && (p.revents & POLLIN);
}

static void test_one_call(void **state)
{
    fx *f = *state;
    seen s = {0};
    ctl_call *call = NULL;
    pack_echo(&f->args, 42);
    assert_int_equal(ctl_client_call_start(f->client, f->unit.endpoint, "echo",
                                           f->args.sb.data, f->args.sb.size,
                                           CALL_MS, on_done, &s, &call, &f->err),
                     0);
    assert_non_null(call);
    /* Args are copied: scribble over them at once. */
    memset(f->args.sb.data, 0xee, f->args.sb.size);
    assert_int_equal(ctl_call_wait(call, CALL_MS), 0);
    /* Completed and queued: the descriptor says so until it is processed. */
    assert_true(readable(ctl_client_event_fd(f->client)));
    assert_true(readable(ctl_client_event_fd(f->client))); /* level, not edge */
    assert_int_equal(atomic_load(&s.completions), 0);
    assert_int_equal(ctl_client_process(f->client, 0), 1);
    assert_false(readable(ctl_client_event_fd(f->client)));
    assert_int_equal(atomic_load(&s.completions), 1);
    assert_int_equal(s.kind, CTL_OK);
    assert_int_equal(s.value, 42);
    assert_true(pthread_equal(s.thread, pthread_self()));
    size_t n = 0;
    const ctl_outcome *o = ctl_call_outcomes(call, &n);
    assert_non_null(o);
    assert_int_equal(n, 1);
    assert_non_null(o[0].reply);
    ctl_call_release(call);
    assert_int_equal(ctl_client_process(f->client, 0), 0);
    assert_int_equal(atomic_load(&s.completions), 1);
}

static void test_args_freed_after_start(void **state)
{
    fx *f = *state;
    seen s[8];
    memset(s, 0, sizeof s);
    for (int i = 0; i < 8; i++) {
        tu_buf b;
        tu_buf_init(&b);
        pack_echo(&b, 100 + i);
        char *addr = strdup(f->unit.endpoint);
        assert_int_equal(ctl_client_call_start(f->client, addr, "echo", b.sb.data,
                                               b.sb.size, CALL_MS, on_done, &s[i],
                                               NULL, &f->err),
                         0);
        /* Address and args freed right after start (ASan watches). */
        free(addr);
        tu_buf_fini(&b);
    }
    atomic_int total = 0;
    for (int i = 0; i < 8; i++) {
        int64_t until = tu_now_ms() + CALL_MS;
        while (atomic_load(&s[i].completions) == 0 && tu_now_ms() < until)
            process_until(f->client, &s[i].completions, 1, 50);
        atomic_fetch_add(&total, atomic_load(&s[i].completions));
        assert_int_equal(s[i].kind, CTL_OK);
        assert_int_equal(s[i].value, 100 + i);
    }
    assert_int_equal(atomic_load(&total), 8);
}

/* Many calls in flight from one thread, each completing once. */
static void test_many_in_flight(void **state)
{
    fx *f = *state;
    enum { N = 300 };
    seen *s = calloc(N, sizeof *s);
    atomic_int done = 0;
    for (int i = 0; i < N; i++) {
        pack_echo(&f->args, i);
        assert_int_equal(ctl_client_call_start(f->client, f->unit.endpoint, "echo",
                                               f->args.sb.data, f->args.sb.size,
                                               CALL_MS, on_done, &s[i], NULL,
                                               &f->err),
                         0);
    }
    int64_t until = tu_now_ms() + 2 * CALL_MS;
    int got = 0;
    while (got < N && tu_now_ms() < until) {
        process_until(f->client, &done, 1, 50);
        got = 0;
        for (int i = 0; i < N; i++)
            got += atomic_load(&s[i].completions);
    }
    for (int i = 0; i < N; i++) {
        assert_int_equal(atomic_load(&s[i].completions), 1);
        assert_int_equal(s[i].kind, CTL_OK);
        assert_int_equal(s[i].value, i);
    }
    /* Sockets came back to the pool: nothing retired. */
    ctl_client_stats st;
    ctl_client_stats_get(f->client, &st);
    assert_int_equal(st.sockets_retired, 0);
    free(s);
}

static void silent(tu_fake *fake, const tu_fake_req *req, void *user)
{
    (void)fake;
    (void)req;
    (void)user;
}

static void test_deadline(void **state)
{
    fx *f = *state;
    seen s = {0};
    assert_int_equal(tu_fake_start(&f->fake, silent, NULL), 0);
    int64_t t0 = tu_now_ms();
    assert_int_equal(ctl_client_call_start(f->client, tu_fake_endpoint(f->fake),
                                           "echo", NULL, 0, 200, on_done, &s, NULL,
                                           &f->err),
                     0);
    assert_int_equal(process_until(f->client, &s.completions, 1, CALL_MS), 1);
    int64_t took = tu_now_ms() - t0;
    assert_int_equal(s.kind, CTL_TRANSFER);
    assert_int_equal(s.cause, CTL_CAUSE_TIMEOUT);
    assert_true(took >= 190 && took < 3000);
    assert_non_null(strstr(s.msg, "echo at "));
}

static void test_timeout_zero_and_bad_address(void **state)
{
    fx *f = *state;
    seen a = {0}, b = {0}, c = {0};
    assert_int_equal(ctl_client_call_start(f->client, f->unit.endpoint, "echo", NULL,
                                           0, 0, on_done, &a, NULL, &f->err),
                     0);
    assert_int_equal(ctl_client_call_start(f->client, "tcp://nope", "echo", NULL, 0,
                                           CALL_MS, on_done, &b, NULL, &f->err),
                     0);
    char dead[CTL_ENDPOINT_MAX];
    tu_dead_address(dead, sizeof dead);
    assert_int_equal(ctl_client_call_start(f->client, dead, "echo", NULL, 0, CALL_MS,
                                           on_done, &c, NULL, &f->err),
                     0);
    process_until(f->client, &a.completions, 1, CALL_MS);
    process_until(f->client, &b.completions, 1, CALL_MS);
    int64_t t0 = tu_now_ms();
    process_until(f->client, &c.completions, 1, CALL_MS);
    assert_int_equal(a.kind, CTL_TRANSFER);
    assert_int_equal(a.cause, CTL_CAUSE_TIMEOUT);
    assert_non_null(strstr(a.msg, "nothing was sent"));
    assert_int_equal(b.kind, CTL_INVALID);
    assert_int_equal(c.kind, CTL_TRANSFER);
    assert_int_equal(c.cause, CTL_CAUSE_REFUSED);
    assert_true(tu_now_ms() - t0 < 5000);
    assert_int_equal(atomic_load(&f->unit.calls), 0);
}

static void test_cancel_in_flight(void **state)
{
    fx *f = *state;
    seen s = {0};
    ctl_call *call = NULL;
    assert_int_equal(tu_fake_start(&f->fake, silent, NULL), 0);
    assert_int_equal(ctl_client_call_start(f->client, tu_fake_endpoint(f->fake),
                                           "echo", NULL, 0, CALL_MS, on_done, &s,
                                           &call, &f->err),
                     0);
    /* Wait until it has reached the fake, then cancel. */
    int64_t until = tu_now_ms() + CALL_MS;
    while (tu_fake_seen(f->fake) < 1 && tu_now_ms() < until)
        tu_sleep_ms(5);
    assert_int_equal(tu_fake_seen(f->fake), 1);
    int64_t t0 = tu_now_ms();
    ctl_call_cancel(call);
    ctl_call_cancel(call); /* twice is once */
    assert_int_equal(process_until(f->client, &s.completions, 1, CALL_MS), 1);
    assert_true(tu_now_ms() - t0 < 2000);
    assert_int_equal(s.kind, CTL_TRANSFER);
    assert_int_equal(s.cause, CTL_CAUSE_CANCELLED);
    assert_non_null(strstr(s.msg, "after it was sent"));
    ctl_client_stats st;
    ctl_client_stats_get(f->client, &st);
    assert_int_equal(st.sockets_retired, 1); /* as a timeout retires it */
    ctl_call_cancel(call);                   /* after the end: nothing */
    ctl_call_release(call);
    assert_int_equal(atomic_load(&s.completions), 1);
}

/*
 * Cancel raced against the reply, RACE_N times per delivery mode: each call
 * completes exactly once (its own counter), with its reply or as cancelled,
 * never both and never neither. Under TSan, the io variant is the one that
 * matters: the cancel runs on this thread while the I/O thread ends and
 * delivers the call.
 *
 * The race is shown to happen, not hoped for: each call is cancelled at one
 * of several points spread from before its request leaves to after its
 * reply has been delivered, and the outcome says where the cancel landed
 * (its reply: after the reply arrived; "after it was sent": between the
 * send and the reply; "nothing was sent": before the send). The points at
 * the ends are not left to timing: the unit holds one request's reply until
 * the cancel has landed (the cancel must win, and the reply then reaches a
 * retired socket and is counted late); a cancel after the call has
 * completed, or while its callback runs, must leave the reply standing;
 * and on the I/O thread, a call started and cancelled while another call's
 * callback holds that thread must end with nothing sent. Between them the
 * cancel comes right after the start, after a busy loop of 1 to 2^19
 * turns, or once the unit has the request, and lands wherever it does; the
 * counts per point are printed.
 */
enum { RACE_N = 2000 };

typedef enum race_point {
    AT_ONCE,         /* right after the start */
    AFTER_SPIN,      /* after a busy loop of a varying length */
    AFTER_ARRIVAL,   /* once the unit has the request: it races the reply */
    WHILE_HELD,      /* the unit holds the reply until the cancel has landed */
    AFTER_END,       /* once the call has completed */
    IN_CALLBACK,     /* while its callback runs (queued: from the callback) */
    BEHIND_CALLBACK, /* on the I/O thread: while another call's callback holds it */
    RACE_POINTS
} race_point;

static const char *const race_point_name[RACE_POINTS] = {
    "at once", "after a spin", "after arrival", "while held", "after the end",
    "in the callback", "behind a callback",
};

/* The race's unit: echo {v, hold?} answers v, after marking that request v
 * arrived; with hold, only once the test opens gate v (or stop is set). */
typedef struct race_unit {
    ctl_server *server;
    char endpoint[CTL_ENDPOINT_MAX];
    atomic_int arrived[RACE_N + 2];
    atomic_int gate[RACE_N + 2];
    atomic_int stop;
} race_unit;

/* Wait until *flag is set, at most timeout_ms; 1 when it is. */
static int wait_flag(atomic_int *flag, int timeout_ms)
{
    int64_t until = tu_now_ms() + timeout_ms;
    for (unsigned turn = 0; !atomic_load(flag); turn++) {
        if (tu_now_ms() >= until)
            return 0;
        if (turn < 1000)
            sched_yield();
        else
            tu_sleep_ms(1);
    }
    return 1;
}

static int race_echo(void *user, const msgpack_object *args, ctl_req *req)
{
    race_unit *u = user;
    const msgpack_object *v = tu_obj_get(args, "v");
    const msgpack_object *hold = tu_obj_get(args, "hold");
    if (!v || v->type != MSGPACK_OBJECT_POSITIVE_INTEGER || v->via.u64 > RACE_N + 1)
        return ctl_req_fail(req, CTL_PROTOCOL, "race: bad v");
    size_t i = (size_t)v->via.u64;
    atomic_store(&u->arrived[i], 1);
    if (hold && hold->type == MSGPACK_OBJECT_BOOLEAN && hold->via.boolean) {
        int64_t until = tu_now_ms() + CALL_MS;
        while (!atomic_load(&u->gate[i]) && !atomic_load(&u->stop) && tu_now_ms() < until)
            tu_sleep_ms(1);
    }
    msgpack_pack_uint64(ctl_req_packer(req), v->via.u64);
    return 0;
}

static const ctl_op race_ops[] = {{.name = "echo", .handler = race_echo}};
static const ctl_service race_service = {.name = "race", .ops = race_ops, .op_count = 1};

static race_unit *race_unit_start(void)
{
    race_unit *u = calloc(1, sizeof *u);
    ctl_server_options o;
    ctl_error err;
    if (!u)
        return NULL;
    ctl_error_init(&err);
    ctl_server_options_init(&o);
    o.endpoint = "tcp://127.0.0.1:*";
    if (ctl_server_new(&race_service, u, &o, &u->server, &err) != 0) {
        fprintf(stderr, "race unit: %s\n", err.msg ? err.msg : "?");
        ctl_error_fini(&err);
        free(u);
        return NULL;
    }
    snprintf(u->endpoint, sizeof u->endpoint, "%s", ctl_server_endpoint(u->server));
    return u;
}

static void race_unit_stop(race_unit **u)
{
    if (!*u)
        return;
    atomic_store(&(*u)->stop, 1); /* lets a held request go */
    ctl_server_destroy(&(*u)->server);
    free(*u);
    *u = NULL;
}

/* One call of the race, and what its completion saw. */
typedef struct race_call {
    ctl_call *call;
    race_point point;
    atomic_int completions;
    int kind;
    int cause;
    int64_t value;
    int sent;   /* cancelled "after it was sent" */
    int unsent; /* cancelled with "nothing was sent" */
    /* IN_CALLBACK: queued, the callback cancels its own call; on the I/O
     * thread, it waits for `released`, having set `entered`. */
    int cancel_in_callback;
    int hold_callback;
    atomic_int entered;
    atomic_int released;
} race_call;

static void on_race_done(void *user, const ctl_error *err, ctl_reply *reply)
{
    race_call *r = user;
    r->kind = err->kind;
    r->cause = err->cause;
    r->value = -1;
    if (reply && ctl_reply_result(reply)->type == MSGPACK_OBJECT_POSITIVE_INTEGER)
        r->value = (int64_t)ctl_reply_result(reply)->via.u64;
    r->sent = err->msg && strstr(err->msg, "after it was sent") != NULL;
    r->unsent = err->msg && strstr(err->msg, "nothing was sent") != NULL;
    if (r->cancel_in_callback)
        ctl_call_cancel(r->call); /* its own, ended: changes nothing */
    if (r->hold_callback) {
        atomic_store(&r->entered, 1);
        wait_flag(&r->released, CALL_MS);
    }
    atomic_fetch_add(&r->completions, 1);
}

static void race_start(fx *f, ctl_client *c, race_unit *u, race_call *r, size_t i, bool hold)
{
    tu_buf_reset(&f->args);
    msgpack_pack_map(&f->args.pk, hold ? 2 : 1);
    tu_pk_str(&f->args.pk, "v");
    msgpack_pack_uint64(&f->args.pk, i);
    if (hold) {
        tu_pk_str(&f->args.pk, "hold");
        msgpack_pack_true(&f->args.pk);
    }
    assert_int_equal(ctl_client_call_start(c, u->endpoint, "echo", f->args.sb.data,
                                           f->args.sb.size, CALL_MS, on_race_done, r,
                                           &r->call, &f->err),
                     0);
}

/* 1 to 2^19 turns of a loop the compiler keeps. */
static void spin(size_t i)
{
    volatile unsigned sink = 0;
    unsigned n = 1u << (i / RACE_POINTS % 20);
    for (unsigned k = 0; k < n; k++)
        sink += k;
    (void)sink;
}

/* A client whose retired sockets wait long enough for any late reply. */
static ctl_client *race_client(int on_io_thread)
{
    ctl_client_options o;
    ctl_client *c = NULL;
    ctl_error err;
    ctl_error_init(&err);
    ctl_client_options_init(&o);
    o.callbacks_on_io_thread = on_io_thread;
    o.late_grace_ms = CALL_MS;
    if (ctl_client_new(&o, &c, &err) != 0)
        fprintf(stderr, "client_new: %s\n", err.msg ? err.msg : "?");
    ctl_error_fini(&err);
    return c;
}

static void cancel_race(fx *f, int on_io)
{
    ctl_client *c = f->race_client = race_client(on_io);
    race_unit *u = f->race = race_unit_start();
    race_call *r = f->race_calls = calloc(RACE_N + 1, sizeof *r);
    int counts[RACE_POINTS][3]; /* [point][0: reply, 1: cancelled after the send, 2: before] */
    memset(counts, 0, sizeof counts);
    assert_non_null(c);
    assert_non_null(u);
    assert_non_null(r);

    for (size_t i = 0; i < RACE_N; i++) {
        race_point p = (race_point)(i % RACE_POINTS);
        if (p == BEHIND_CALLBACK && on_io)
            continue; /* started by the IN_CALLBACK before it */
        if (p == BEHIND_CALLBACK || (p == IN_CALLBACK && on_io && i + 1 == RACE_N))
            p = AT_ONCE;
        r[i].point = p;
        r[i].cancel_in_callback = p == IN_CALLBACK && !on_io;
        r[i].hold_callback = p == IN_CALLBACK && on_io;
        race_start(f, c, u, &r[i], i, p == WHILE_HELD);
        switch (p) {
        case AT_ONCE:
        case BEHIND_CALLBACK:
            break;
        case AFTER_SPIN:
            spin(i);
            break;
        case AFTER_ARRIVAL:
            assert_true(wait_flag(&u->arrived[i], CALL_MS));
            break;
        case WHILE_HELD:
            assert_true(wait_flag(&u->arrived[i], CALL_MS));
            ctl_call_cancel(r[i].call);
            assert_int_equal(ctl_call_wait(r[i].call, CALL_MS), 0);
            atomic_store(&u->gate[i], 1); /* the reply goes now, too late */
            break;
        case AFTER_END:
            assert_int_equal(ctl_call_wait(r[i].call, CALL_MS), 0);
            break;
        case IN_CALLBACK:
            if (!on_io) {
                assert_int_equal(ctl_call_wait(r[i].call, CALL_MS), 0);
                break;
            }
            /* The callback holds the I/O thread: a call started and
             * cancelled now cannot have left when that thread next looks. */
            assert_true(wait_flag(&r[i].entered, CALL_MS));
            r[i + 1].point = BEHIND_CALLBACK;
            race_start(f, c, u, &r[i + 1], i + 1, false);
            ctl_call_cancel(r[i + 1].call);
            ctl_call_cancel(r[i].call);
            atomic_store(&r[i].released, 1);
            break;
        case RACE_POINTS:
            break;
        }
        if (p != WHILE_HELD)
            ctl_call_cancel(r[i].call);
        ctl_call_cancel(r[i].call); /* twice is once */
        if (!on_io && i % 64 == 0)
            ctl_client_process(c, 0);
    }

    /* Every call completes; then one more, whose completion comes after
     * any the others could still (wrongly) deliver. */
    int64_t until = tu_now_ms() + 2 * CALL_MS;
    for (size_t i = 0; i < RACE_N; i++)
        assert_int_equal(ctl_call_wait(r[i].call, CALL_MS), 0);
    race_start(f, c, u, &r[RACE_N], RACE_N, false);
    assert_int_equal(ctl_call_wait(r[RACE_N].call, CALL_MS), 0);
    if (!on_io)
        while (atomic_load(&r[RACE_N].completions) == 0 && tu_now_ms() < until)
            process_until(c, &r[RACE_N].completions, 1, 50);
    assert_int_equal(atomic_load(&r[RACE_N].completions), 1);
    assert_int_equal(r[RACE_N].kind, CTL_OK);

    int ok = 0, sent = 0, unsent = 0;
    for (size_t i = 0; i < RACE_N; i++) {
        race_call *x = &r[i];
        if (atomic_load(&x->completions) != 1)
            fail_msg("call %zu (%s) completed %d times", i, race_point_name[x->point],
                     atomic_load(&x->completions));
        if (x->kind == CTL_OK) {
            assert_int_equal(x->value, (int64_t)i);
            counts[x->point][0]++;
            ok++;
        } else {
            assert_int_equal(x->kind, CTL_TRANSFER);
            assert_int_equal(x->cause, CTL_CAUSE_CANCELLED);
            assert_int_equal(x->sent + x->unsent, 1);
            counts[x->point][x->sent ? 1 : 2]++;
            sent += x->sent;
            unsent += x->unsent;
        }
        switch (x->point) {
        case WHILE_HELD:
            if (!x->sent)
                fail_msg("call %zu: a cancel while the unit held it did not land "
                         "between the send and the reply", i);
            break;
        case AFTER_END:
        case IN_CALLBACK:
            if (x->kind != CTL_OK)
                fail_msg("call %zu: a cancel %s changed its outcome", i,
                         race_point_name[x->point]);
            break;
        case BEHIND_CALLBACK:
            if (!x->unsent)
                fail_msg("call %zu: cancelled behind a callback, yet sent", i);
            break;
        default:
            break;
        }
    }
    for (int p = 0; p < RACE_POINTS; p++)
        if (counts[p][0] + counts[p][1] + counts[p][2])
            print_message("  %-18s reply %4d, cancelled after the send %4d, before %4d\n",
                          race_point_name[p], counts[p][0], counts[p][1], counts[p][2]);
    assert_int_equal(ok + sent + unsent, RACE_N);
    /* Both sides of the race, every run. */
    assert_true(ok >= 1);
    assert_true(sent >= 1);
    if (on_io)
        assert_true(unsent >= 1);

    /* The counters agree: a cancel after the send retires its socket (one
     * before it may too, when a socket had been lent and was still
     * connecting); a reply never does. And a held reply, sent after its
     * cancel landed, is drained from the retired socket as a late reply,
     * never delivered. */
    ctl_address_stats st;
    ctl_client_address_stats(c, u->endpoint, &st);
    assert_true(st.retired >= (uint64_t)sent);
    assert_true(st.retired <= (uint64_t)(sent + unsent));
    until = tu_now_ms() + CALL_MS;
    while (st.late_replies == 0 && tu_now_ms() < until) {
        tu_sleep_ms(20);
        ctl_client_address_stats(c, u->endpoint, &st);
    }
    assert_true(st.late_replies >= 1);
    assert_true(st.late_replies <= (uint64_t)sent);

    /* Whatever happened, the client still works. */
    ctl_reply *reply = NULL;
    tu_buf_reset(&f->args);
    msgpack_pack_map(&f->args.pk, 1);
    tu_pk_str(&f->args.pk, "v");
    msgpack_pack_uint64(&f->args.pk, 7);
    assert_int_equal(ctl_client_call(c, u->endpoint, "echo", f->args.sb.data,
                                     f->args.sb.size, CALL_MS, &reply, &f->err),
                     0);
    assert_int_equal(ctl_reply_result(reply)->via.u64, 7);
    ctl_reply_destroy(&reply);
}

static void test_cancel_races_reply(void **state)
{
    cancel_race(*state, 0);
}

static void test_cancel_races_reply_io(void **state)
{
    cancel_race(*state, 1);
}

/* The race's client goes first (every call it still has completes), then
 * the handles and the unit. A callback still held is let go. */
static void race_teardown(fx *f)
{
    for (size_t i = 0; f->race_calls && i <= RACE_N; i++)
        atomic_store(&f->race_calls[i].released, 1);
    ctl_client_destroy(&f->race_client);
    for (size_t i = 0; f->race_calls && i <= RACE_N; i++)
        ctl_call_release(f->race_calls[i].call);
    free(f->race_calls);
    f->race_calls = NULL;
    race_unit_stop(&f->race);
}

/* A late reply after a cancel never reaches another call on the address. */
typedef struct delayed {
    atomic_int answered;
} delayed;

static void answer_late(tu_fake *fake, const tu_fake_req *req, void *user)
{
    delayed *d = user;
    if (req->seq == 0)
        tu_sleep_ms(300); /* the first one late: after its cancel */
    unsigned char body[1] = {(unsigned char)(req->seq == 0 ? 0x01 : 0x02)};
    tu_fake_answer(fake, req, req->id, req->id_len, true, body, 1);
    atomic_fetch_add(&d->answered, 1);
}

static void test_cancel_then_late_reply(void **state)
{
    fx *f = *state;
    delayed d = {0};
    seen a = {0}, b = {0};
    ctl_call *call = NULL;
    assert_int_equal(tu_fake_start(&f->fake, answer_late, &d), 0);
    const char *addr = tu_fake_endpoint(f->fake);
    assert_int_equal(ctl_client_call_start(f->client, addr, "echo", NULL, 0, CALL_MS,
                                           on_done, &a, &call, &f->err),
                     0);
    int64_t until = tu_now_ms() + CALL_MS;
    while (tu_fake_seen(f->fake) < 1 && tu_now_ms() < until)
        tu_sleep_ms(5);
    ctl_call_cancel(call);
    process_until(f->client, &a.completions, 1, CALL_MS);
    assert_int_equal(a.cause, CTL_CAUSE_CANCELLED);
    assert_int_equal(ctl_client_call_start(f->client, addr, "echo", NULL, 0, CALL_MS,
                                           on_done, &b, NULL, &f->err),
                     0);
    process_until(f->client, &b.completions, 1, CALL_MS);
    assert_int_equal(b.kind, CTL_OK);
    assert_int_equal(b.value, 2); /* its own reply, not the late one */
    /* The late reply is drained from the retired socket and counted. */
    ctl_client_stats st;
    until = tu_now_ms() + CALL_MS;
    do {
        ctl_client_stats_get(f->client, &st);
        if (st.late_replies >= 1)
            break;
        tu_sleep_ms(20);
    } while (tu_now_ms() < until);
    assert_int_equal(st.late_replies, 1);
    ctl_call_release(call);
}

/* Destroying the client completes every call in flight, before it returns. */
static void test_destroy_in_flight(void **state)
{
    fx *f = *state;
    enum { N = 20 };
    seen s[N];
    ctl_call *calls[N];
    memset(s, 0, sizeof s);
    assert_int_equal(tu_fake_start(&f->fake, silent, NULL), 0);
    for (int on_io = 0; on_io < 2; on_io++) {
        memset(s, 0, sizeof s);
        ctl_client *c = new_client(on_io, 0);
        assert_non_null(c);
        for (int i = 0; i < N; i++)
            assert_int_equal(ctl_client_call_start(c, tu_fake_endpoint(f->fake),
                                                   "echo", NULL, 0, CALL_MS, on_done,
                                                   &s[i], i % 2 ? &calls[i] : NULL,
                                                   &f->err),
                             0);
        int64_t t0 = tu_now_ms();
        ctl_client_destroy(&c);
        assert_null(c);
        assert_true(tu_now_ms() - t0 < 3000);
        for (int i = 0; i < N; i++) {
            assert_int_equal(atomic_load(&s[i].completions), 1);
            assert_int_equal(s[i].kind, CTL_TRANSFER);
            assert_int_equal(s[i].cause, CTL_CAUSE_CANCELLED);
            assert_non_null(strstr(s[i].msg, "destroyed"));
        }
        /* Handles outlive the client. */
        for (int i = 1; i < N; i += 2) {
            assert_int_equal(ctl_call_wait(calls[i], 0), 0);
            ctl_call_release(calls[i]);
        }
    }
}

/* Callbacks that start the next call and release their own handle. */
typedef struct chain {
    ctl_client *client;
    const char *address;
    atomic_int left;
    atomic_int completions;
    atomic_int failures;
    ctl_call *handle;
} chain;

static void on_chain(void *user, const ctl_error *err, ctl_reply *reply)
{
    chain *ch = user;
    (void)reply;
    atomic_fetch_add(&ch->completions, 1);
    if (err->kind != CTL_OK)
        atomic_fetch_add(&ch->failures, 1);
    ctl_call_release(ch->handle); /* its own handle */
    ch->handle = NULL;
    if (atomic_fetch_sub(&ch->left, 1) > 1) {
        ctl_error e;
        ctl_error_init(&e);
        if (ctl_client_call_start(ch->client, ch->address, "notes", NULL, 0, CALL_MS,
                                  on_chain, ch, &ch->handle, &e) != 0)
            atomic_fetch_add(&ch->failures, 1);
        ctl_error_fini(&e);
    }
}

static void test_callback_starts_calls(void **state)
{
    fx *f = *state;
    for (int on_io = 0; on_io < 2; on_io++) {
        ctl_client *c = on_io ? new_client(1, 0) : f->client;
        chain ch = {.client = c, .address = f->unit.endpoint};
        atomic_store(&ch.left, 50);
        assert_int_equal(ctl_client_call_start(c, f->unit.endpoint, "notes", NULL, 0,
                                               CALL_MS, on_chain, &ch, &ch.handle,
                                               &f->err),
                         0);
        if (on_io) {
            int64_t until = tu_now_ms() + 2 * CALL_MS;
            while (atomic_load(&ch.completions) < 50 && tu_now_ms() < until)
                tu_sleep_ms(5);
            /* Nothing is ever queued on this client. */
            assert_false(readable(ctl_client_event_fd(c)));
            assert_int_equal(ctl_client_process(c, 0), 0);
        } else {
            process_until(c, &ch.completions, 50, 2 * CALL_MS);
        }
        assert_int_equal(atomic_load(&ch.completions), 50);
        assert_int_equal(atomic_load(&ch.failures), 0);
        if (on_io)
            ctl_client_destroy(&c);
    }
}

/* On the I/O thread: the callback runs there, and wait returns after it. */
static void test_io_thread_delivery(void **state)
{
    fx *f = *state;
    ctl_client *c = new_client(1, 0);
    seen s = {0};
    ctl_call *call = NULL;
    pack_echo(&f->args, 5);
    assert_int_equal(ctl_client_call_start(c, f->unit.endpoint, "echo",
                                           f->args.sb.data, f->args.sb.size, CALL_MS,
                                           on_done, &s, &call, &f->err),
                     0);
    assert_int_equal(ctl_call_wait(call, CALL_MS), 0);
    assert_int_equal(atomic_load(&s.completions), 1);
    assert_false(pthread_equal(s.thread, pthread_self()));
    assert_int_equal(s.value, 5);
    ctl_call_release(call);
    ctl_client_destroy(&c);
}

/* The engine keeps a socket in its epoll set while it idles in the pool;
 * a blocking call that borrows it takes it out, and a socket the pool
 * closes (idle past idle_timeout_ms here) is freed by the I/O thread.
 * Rounds of 8 calls at once, each followed by blocking calls on the same
 * sockets, and every tenth round waits for the upkeep to close idle
 * sockets: every call answered (under ASan: nothing touched after free). */
static void test_sockets_shared_with_blocking_calls(void **state)
{
    fx *f = *state;
    ctl_client_options o;
    ctl_client *c = NULL;
    ctl_client_options_init(&o);
    o.max_idle_per_address = 2;
    o.idle_timeout_ms = 1;
    assert_int_equal(ctl_client_new(&o, &c, &f->err), 0);
    for (int round = 0; round < 60; round++) {
        if (round % 10 == 9) {
            ctl_client_stats before, now;
            ctl_client_stats_get(c, &before);
            int64_t wait_until = tu_now_ms() + CALL_MS;
            do {
                tu_sleep_ms(5);
                ctl_client_stats_get(c, &now);
            } while (now.sockets_closed == before.sockets_closed &&
                     tu_now_ms() < wait_until);
            assert_true(now.sockets_closed > before.sockets_closed);
        }
        seen s[8];
        atomic_int done = 0;
        memset(s, 0, sizeof s);
        for (int i = 0; i < 8; i++) {
            pack_echo(&f->args, round * 8 + i);
            assert_int_equal(ctl_client_call_start(c, f->unit.endpoint, "echo",
                                                   f->args.sb.data, f->args.sb.size,
                                                   CALL_MS, on_done, &s[i], NULL, &f->err),
                             0);
        }
        int64_t until = tu_now_ms() + CALL_MS;
        while (tu_now_ms() < until) {
            int n = 0;
            ctl_client_process(c, 0);
            for (int i = 0; i < 8; i++)
                n += atomic_load(&s[i].completions);
            atomic_store(&done, n);
            if (n == 8)
                break;
            struct pollfd p = {ctl_client_event_fd(c), POLLIN, 0};
            poll(&p, 1, 50);
        }
        assert_int_equal(atomic_load(&done), 8);
        for (int i = 0; i < 8; i++) {
            assert_int_equal(s[i].kind, CTL_OK);
            assert_int_equal(s[i].value, round * 8 + i);
        }
        for (int i = 0; i < 3; i++) {
            ctl_reply *reply = NULL;
            pack_echo(&f->args, i);
            assert_int_equal(ctl_client_call(c, f->unit.endpoint, "echo", f->args.sb.data,
                                             f->args.sb.size, CALL_MS, &reply, &f->err),
                             0);
            assert_int_equal(ctl_reply_result(reply)->via.u64, (uint64_t)i);
            ctl_reply_destroy(&reply);
        }
    }
    ctl_client_destroy(&c);
}

static void many_done_noop(void *user, ctl_outcome *outcomes, size_t count)
{
    (void)user;
    (void)outcomes;
    (void)count;
    fail_msg("a fan-out refused at its start completed");
}

static void test_max_in_flight(void **state)
{
    fx *f = *state;
    ctl_client *c = new_client(0, 3);
    seen s[4];
    memset(s, 0, sizeof s);
    assert_int_equal(tu_fake_start(&f->fake, silent, NULL), 0);
    for (int i = 0; i < 3; i++)
        assert_int_equal(ctl_client_call_start(c, tu_fake_endpoint(f->fake), "echo",
                                               NULL, 0, 300, on_done, &s[i], NULL,
                                               &f->err),
                         0);
    ctl_call *call = (ctl_call *)&s; /* must be reset to NULL */
    assert_int_equal(ctl_client_call_start(c, f->unit.endpoint, "echo", NULL, 0,
                                           CALL_MS, on_done, &s[3], &call, &f->err),
                     CTL_TRANSFER);
    assert_null(call);
    assert_int_equal(f->err.cause, CTL_CAUSE_LIMIT);
    assert_non_null(strstr(f->err.msg, "max_in_flight"));
    assert_non_null(strstr(f->err.msg, f->unit.endpoint)); /* the call's address */
    /* A blocking call is counted too. */
    ctl_reply *r = NULL;
    assert_int_equal(ctl_client_call(c, f->unit.endpoint, "echo", NULL, 0, CALL_MS,
                                     &r, &f->err),
                     CTL_TRANSFER);
    assert_int_equal(f->err.cause, CTL_CAUSE_LIMIT);
    /* And a fan-out, each of its targets. Every refusal is in its
     * address's errors[limit]. */
    ctl_target two[2] = {{f->unit.endpoint, NULL, 0}, {f->unit.endpoint, NULL, 0}};
    assert_int_equal(ctl_client_call_many_start(c, "echo", two, 2, CALL_MS, many_done_noop,
                                                NULL, NULL, &f->err),
                     CTL_TRANSFER);
    ctl_address_stats as;
    ctl_client_address_stats(c, f->unit.endpoint, &as);
    assert_int_equal(as.errors[CTL_CAUSE_LIMIT], 4);
    for (int i = 0; i < 3; i++)
        process_until(c, &s[i].completions, 1, CALL_MS);
    assert_int_equal(atomic_load(&s[3].completions), 0);
    /* Room again once they have ended. */
    assert_int_equal(ctl_client_call(c, f->unit.endpoint, "echo", NULL, 0, CALL_MS,
                                     &r, &f->err),
                     0);
    ctl_reply_destroy(&r);
    ctl_client_destroy(&c);
}

/* The client's log of typed calls that could not start (ctl_stub_call_start
 * has no error argument): one limiter per cause of failure, so a burst of
 * one cause cannot hide another, and the count a line ends with is of its
 * own cause's lines left out since its last line. The log function is
 * called on the starting thread, so each line is checked against the
 * attempts made so far. */
typedef struct start_log {
    int attempts[2]; /* [0]: a NULL callback (Invalid), [1]: cause limit */
    int logged_at[2]; /* attempts[k] when kind k's last line was logged */
    int lines[2];
    int counted[2];   /* lines that ended with a count of lines left out */
    int wrong;        /* lines whose count was not what was left out, or unknown lines */
} start_log;

static void check_start_line(void *user, const char *line)
{
    start_log *l = user;
    int k = strstr(line, "done is NULL") ? 0 : strstr(line, "max_in_flight") ? 1 : -1;
    if (k < 0) {
        l->wrong++;
        return;
    }
    unsigned long long more = 0;
    const char *tail = strstr(line, " (");
    while (tail && strstr(tail + 1, " ("))
        tail = strstr(tail + 1, " (");
    if (tail && sscanf(tail, " (%llu more like this since the last such line)", &more) == 1)
        l->counted[k]++;
    if (strstr(line, "more such lines") ||
        more != (unsigned long long)(l->attempts[k] - l->logged_at[k] - 1))
        l->wrong++;
    l->logged_at[k] = l->attempts[k];
    l->lines[k]++;
}

static void unused_thunk(void (*done)(void), void *user, const ctl_error *err,
                         const void *result)
{
    (void)done;
    (void)user;
    (void)err;
    (void)result;
}

static void unused_done(void) {}

static void test_start_failures_logged_per_cause(void **state)
{
    fx *f = *state;
    start_log l;
    memset(&l, 0, sizeof l);
    ctl_client_options o;
    ctl_client *c = NULL;
    ctl_client_options_init(&o);
    o.max_in_flight = 1;
    o.log = check_start_line;
    o.log_user = &l;
    assert_int_equal(ctl_client_new(&o, &c, &f->err), 0);
    /* The one request in flight this client allows, held by a unit that
     * never answers (the client's destruction ends it). */
    seen held = {0};
    assert_int_equal(tu_fake_start(&f->fake, silent, NULL), 0);
    const char *addr = tu_fake_endpoint(f->fake);
    assert_int_equal(ctl_client_call_start(c, addr, "echo", NULL, 0, CALL_MS, on_done, &held,
                                           NULL, &f->err),
                     0);
    ctl_op_desc desc;
    memset(&desc, 0, sizeof desc);
    desc.name = "echo";
    /* Until each cause has logged a line with a count, which takes its
     * limiter's second; the first round logs both causes' first lines. */
    int64_t deadline = tu_now_ms() + CALL_MS;
    for (int i = 0; (l.counted[0] < 1 || l.counted[1] < 1) && tu_now_ms() < deadline;
         i++) {
        l.attempts[0]++;
        assert_int_equal(ctl_stub_call_start(c, addr, &desc, NULL, CALL_MS, unused_thunk,
                                             NULL, NULL, NULL),
                         CTL_INVALID);
        l.attempts[1]++;
        assert_int_equal(ctl_stub_call_start(c, addr, &desc, NULL, CALL_MS, unused_thunk,
                                             unused_done, NULL, NULL),
                         CTL_TRANSFER);
        if (i == 0) {
            assert_int_equal(l.lines[0], 1);
            assert_int_equal(l.lines[1], 1);
        }
        tu_sleep_ms(5);
    }
    ctl_client_destroy(&c);
    assert_int_equal(l.wrong, 0);
    assert_true(l.counted[0] >= 1);
    assert_true(l.counted[1] >= 1);
    assert_int_equal(atomic_load(&held.completions), 1);
}

/* An asynchronous fan-out: outcomes in target order, one per target. */
typedef struct many_seen {
    atomic_int completions;
    size_t count;
    int kinds[8];
    int causes[8];
    int64_t values[8];
    char msgs[8][160];
} many_seen;

static void on_many(void *user, ctl_outcome *outcomes, size_t count)
{
    many_seen *m = user;
    m->count = count;
    for (size_t i = 0; i < count && i < 8; i++) {
        m->kinds[i] = outcomes[i].error.kind;
        m->causes[i] = outcomes[i].error.cause;
        snprintf(m->msgs[i], sizeof m->msgs[i], "%s",
                 outcomes[i].error.msg ? outcomes[i].error.msg : "");
        m->values[i] = outcomes[i].reply
                           ? (int64_t)ctl_reply_result(outcomes[i].reply)->via.u64
                           : -1;
    }
    atomic_fetch_add(&m->completions, 1);
}

static void test_many_start(void **state)
{
    fx *f = *state;
    tu_buf b[3];
    char dead[CTL_ENDPOINT_MAX];
    tu_dead_address(dead, sizeof dead);
    for (int i = 0; i < 3; i++) {
        tu_buf_init(&b[i]);
        pack_echo(&b[i], 10 + i);
    }
    ctl_target t[4] = {
        {f->unit.endpoint, b[0].sb.data, b[0].sb.size},
        {dead, b[1].sb.data, b[1].sb.size},
        {f->unit.endpoint, b[2].sb.data, b[2].sb.size},
        {NULL, NULL, 0},
    };
    many_seen m = {0};
    ctl_call *call = NULL;
    assert_int_equal(ctl_client_call_many_start(f->client, "echo", t, 4, CALL_MS,
                                                on_many, &m, &call, &f->err),
                     0);
    for (int i = 0; i < 3; i++)
        tu_buf_fini(&b[i]);
    assert_int_equal(process_until(f->client, &m.completions, 1, CALL_MS), 1);
    assert_int_equal(m.count, 4);
    assert_int_equal(m.kinds[0], CTL_OK);
    assert_int_equal(m.values[0], 10);
    assert_int_equal(m.kinds[1], CTL_TRANSFER);
    assert_int_equal(m.causes[1], CTL_CAUSE_REFUSED);
    assert_int_equal(m.kinds[2], CTL_OK);
    assert_int_equal(m.values[2], 12);
    assert_int_equal(m.kinds[3], CTL_INVALID);
    ctl_call_release(call);
}

/* A fan-out's requests are settled and counted as each ends, not when
 * the last one does: with one target refused and one silent, the refusal
 * is in its address's counters while the call still waits for the other. */
static void test_many_counts_each_as_it_ends(void **state)
{
    fx *f = *state;
    char dead[CTL_ENDPOINT_MAX];
    tu_dead_address(dead, sizeof dead);
    assert_int_equal(tu_fake_start(&f->fake, silent, NULL), 0);
    ctl_target t[2] = {{dead, NULL, 0}, {tu_fake_endpoint(f->fake), NULL, 0}};
    many_seen m = {0};
    ctl_call *call = NULL;
    assert_int_equal(ctl_client_call_many_start(f->client, "echo", t, 2, 6 * CALL_MS,
                                                on_many, &m, &call, &f->err),
                     0);
    ctl_address_stats as;
    int64_t until = tu_now_ms() + CALL_MS;
    do {
        ctl_client_address_stats(f->client, dead, &as);
        if (as.errors[CTL_CAUSE_REFUSED] > 0)
            break;
        tu_sleep_ms(5);
    } while (tu_now_ms() < until);
    assert_int_equal(as.errors[CTL_CAUSE_REFUSED], 1);
    assert_int_equal(ctl_call_wait(call, 0), CTL_TRANSFER); /* still in flight */
    assert_int_equal(atomic_load(&m.completions), 0);
    ctl_call_cancel(call);
    assert_int_equal(process_until(f->client, &m.completions, 1, CALL_MS), 1);
    assert_int_equal(m.kinds[0], CTL_TRANSFER);
    assert_int_equal(m.causes[0], CTL_CAUSE_REFUSED);
    assert_int_equal(m.kinds[1], CTL_TRANSFER);
    assert_int_equal(m.causes[1], CTL_CAUSE_CANCELLED);
    ctl_call_release(call);
}

/* An asynchronous fan-out sends on the caller's thread the requests whose
 * address has an idle socket, and leaves the rest (a dial) to the I/O
 * thread: with one idle socket to the unit and three targets there, one
 * goes at once, two wait for the I/O thread, and every outcome is in its
 * place. */
static void test_many_start_warm_and_cold(void **state)
{
    fx *f = *state;
    tu_buf warm, b[4];
    tu_buf_init(&warm);
    pack_echo(&warm, 1);
    ctl_reply *reply = NULL;
    assert_int_equal(ctl_client_call(f->client, f->unit.endpoint, "echo", warm.sb.data,
                                     warm.sb.size, CALL_MS, &reply, &f->err), 0);
    ctl_reply_destroy(&reply);
    tu_buf_fini(&warm);
    char dead[CTL_ENDPOINT_MAX];
    tu_dead_address(dead, sizeof dead);
    for (int i = 0; i < 4; i++) {
        tu_buf_init(&b[i]);
        pack_echo(&b[i], 20 + i);
    }
    ctl_target t[5] = {
        {f->unit.endpoint, b[0].sb.data, b[0].sb.size},
        {f->unit.endpoint, b[1].sb.data, b[1].sb.size},
        {dead, b[2].sb.data, b[2].sb.size},
        {NULL, NULL, 0},
        {f->unit.endpoint, b[3].sb.data, b[3].sb.size},
    };
    many_seen m = {0};
    ctl_call *call = NULL;
    assert_int_equal(ctl_client_call_many_start(f->client, "echo", t, 5, CALL_MS, on_many, &m,
                                                &call, &f->err), 0);
    for (int i = 0; i < 4; i++)
        tu_buf_fini(&b[i]);
    assert_int_equal(process_until(f->client, &m.completions, 1, CALL_MS), 1);
    assert_int_equal(m.count, 5);
    assert_int_equal(m.kinds[0], CTL_OK);
    assert_int_equal(m.values[0], 20);
    assert_int_equal(m.kinds[1], CTL_OK);
    assert_int_equal(m.values[1], 21);
    assert_int_equal(m.kinds[2], CTL_TRANSFER);
    assert_int_equal(m.causes[2], CTL_CAUSE_REFUSED);
    assert_int_equal(m.kinds[3], CTL_INVALID);
    assert_int_equal(m.kinds[4], CTL_OK);
    assert_int_equal(m.values[4], 23);
    ctl_call_release(call);
}

/* A fan-out cancelled as soon as it starts, over and over, on warm sockets
 * (sent by the caller) and a cold one (sent by the I/O thread): each
 * completes once, each target with its reply or cancelled, and the pool
 * keeps serving. */
static void test_many_start_cancelled_at_once(void **state)
{
    fx *f = *state;
    tu_buf b;
    tu_buf_init(&b);
    pack_echo(&b, 7);
    int replied = 0, cancelled = 0;
    for (int round = 0; round < 200; round++) {
        ctl_target t[3] = {
            {f->unit.endpoint, b.sb.data, b.sb.size},
            {f->unit.endpoint, b.sb.data, b.sb.size},
            {f->unit.endpoint, b.sb.data, b.sb.size},
        };
        many_seen m = {0};
        ctl_call *call = NULL;
        assert_int_equal(ctl_client_call_many_start(f->client, "echo", t, round % 2 ? 3 : 2,
                                                    CALL_MS, on_many, &m, &call, &f->err),
                         0);
        ctl_call_cancel(call);
        assert_int_equal(process_until(f->client, &m.completions, 1, CALL_MS), 1);
        for (size_t i = 0; i < m.count; i++) {
            if (m.kinds[i] == CTL_OK) {
                assert_int_equal(m.values[i], 7);
                replied++;
            } else {
                assert_int_equal(m.kinds[i], CTL_TRANSFER);
                assert_int_equal(m.causes[i], CTL_CAUSE_CANCELLED);
                cancelled++;
            }
        }
        ctl_call_release(call);
        assert_int_equal(atomic_load(&m.completions), 1);
    }
    print_message("  fan-outs cancelled at once: %d replies, %d cancelled\n", replied,
                  cancelled);
    assert_true(cancelled > 0);
    ctl_reply *reply = NULL;
    assert_int_equal(ctl_client_call(f->client, f->unit.endpoint, "echo", b.sb.data, b.sb.size,
                                     CALL_MS, &reply, &f->err), 0);
    ctl_reply_destroy(&reply);
    tu_buf_fini(&b);
}

/* Release before the end does not cancel: the callback still runs once. */
static void test_release_early(void **state)
{
    fx *f = *state;
    seen s = {0};
    ctl_call *call = NULL;
    pack_sleep(&f->args, 100);
    assert_int_equal(ctl_client_call_start(f->client, f->unit.endpoint, "sleep",
                                           f->args.sb.data, f->args.sb.size, CALL_MS,
                                           on_done, &s, &call, &f->err),
                     0);
    ctl_call_release(call);
    assert_int_equal(process_until(f->client, &s.completions, 1, CALL_MS), 1);
    assert_int_equal(s.kind, CTL_OK);
    assert_int_equal(s.value, 100);
}

/* A call waited for without a callback; its outcome read from the handle. */
static void test_wait_without_callback(void **state)
{
    fx *f = *state;
    ctl_call *call = NULL;
    pack_echo(&f->args, 9);
    assert_int_equal(ctl_client_call_start(f->client, f->unit.endpoint, "echo",
                                           f->args.sb.data, f->args.sb.size, CALL_MS,
                                           NULL, NULL, &call, &f->err),
                     0);
    size_t n = 1;
    assert_int_equal(ctl_call_wait(call, CALL_MS), 0);
    const ctl_outcome *o = ctl_call_outcomes(call, &n);
    assert_int_equal(n, 1);
    assert_int_equal(o[0].error.kind, CTL_OK);
    assert_int_equal(ctl_reply_result(o[0].reply)->via.u64, 9);
    /* Nothing was queued for it. */
    assert_false(readable(ctl_client_event_fd(f->client)));
    ctl_call_release(call);
}

/* ctl_call_wait bounded by its own timeout when the call goes on. */
static void test_wait_times_out(void **state)
{
    fx *f = *state;
    ctl_call *call = NULL;
    seen s = {0};
    assert_int_equal(tu_fake_start(&f->fake, silent, NULL), 0);
    assert_int_equal(ctl_client_call_start(f->client, tu_fake_endpoint(f->fake),
                                           "echo", NULL, 0, CALL_MS, on_done, &s,
                                           &call, &f->err),
                     0);
    int64_t t0 = tu_now_ms();
    assert_int_equal(ctl_call_wait(call, 100), CTL_TRANSFER);
    assert_true(tu_now_ms() - t0 >= 90);
    assert_null(ctl_call_outcomes(call, NULL));
    ctl_call_cancel(call);
    assert_int_equal(ctl_call_wait(call, CALL_MS), 0);
    process_until(f->client, &s.completions, 1, CALL_MS);
    assert_int_equal(s.cause, CTL_CAUSE_CANCELLED);
    ctl_call_release(call);
}

/* A thread waiting in ctl_call_wait, and what it got. */
typedef struct waiter {
    pthread_t thread;
    ctl_call *call;
    int rc;
    atomic_int *returned;
} waiter;

static void *wait_thread(void *arg)
{
    waiter *w = arg;
    w->rc = ctl_call_wait(w->call, CALL_MS);
    atomic_fetch_add(w->returned, 1);
    return NULL;
}

/* Several threads waiting for each of two calls: the end of one call
 * returns its waiters and none of the other's, which return when their own
 * call ends. */
static void test_wait_from_many_threads(void **state)
{
    enum { PER_CALL = 3 };
    fx *f = *state;
    ctl_call *going = NULL, *answered = NULL;
    atomic_int returned_going = 0, returned_answered = 0;
    waiter w[2 * PER_CALL];
    assert_int_equal(tu_fake_start(&f->fake, silent, NULL), 0);
    assert_int_equal(ctl_client_call_start(f->client, tu_fake_endpoint(f->fake), "echo",
                                           NULL, 0, CALL_MS, NULL, NULL, &going, &f->err),
                     0);
    for (int i = 0; i < 2 * PER_CALL; i++) {
        w[i].call = i < PER_CALL ? going : NULL;
        w[i].returned = i < PER_CALL ? &returned_going : &returned_answered;
        w[i].rc = -1;
    }
    for (int i = 0; i < PER_CALL; i++)
        assert_int_equal(pthread_create(&w[i].thread, NULL, wait_thread, &w[i]), 0);
    /* The second call starts while the first one's waiters wait. */
    pack_echo(&f->args, 7);
    assert_int_equal(ctl_client_call_start(f->client, f->unit.endpoint, "echo",
                                           f->args.sb.data, f->args.sb.size, CALL_MS,
                                           NULL, NULL, &answered, &f->err),
                     0);
    for (int i = PER_CALL; i < 2 * PER_CALL; i++) {
        w[i].call = answered;
        assert_int_equal(pthread_create(&w[i].thread, NULL, wait_thread, &w[i]), 0);
    }
    assert_int_equal(tu_wait_atleast(&returned_answered, PER_CALL, CALL_MS), PER_CALL);
    for (int i = PER_CALL; i < 2 * PER_CALL; i++) {
        pthread_join(w[i].thread, NULL);
        assert_int_equal(w[i].rc, 0);
    }
    size_t n = 0;
    const ctl_outcome *o = ctl_call_outcomes(answered, &n);
    assert_int_equal(n, 1);
    assert_int_equal(o[0].error.kind, CTL_OK);
    assert_int_equal(ctl_reply_result(o[0].reply)->via.u64, 7);
    /* The first call goes on (its unit never answers, its deadline is far
     * off): none of its waiters has returned. */
    assert_null(ctl_call_outcomes(going, NULL));
    assert_int_equal(atomic_load(&returned_going), 0);
    ctl_call_cancel(going);
    assert_int_equal(tu_wait_atleast(&returned_going, PER_CALL, CALL_MS), PER_CALL);
    for (int i = 0; i < PER_CALL; i++) {
        pthread_join(w[i].thread, NULL);
        assert_int_equal(w[i].rc, 0);
    }
    o = ctl_call_outcomes(going, &n);
    assert_int_equal(n, 1);
    assert_int_equal(o[0].error.cause, CTL_CAUSE_CANCELLED);
    ctl_call_release(going);
    ctl_call_release(answered);
}

/* A blocking fan-out on its own thread, and what it got. */
typedef struct fanner {
    pthread_t thread;
    ctl_client *client;
    const char *address;
    int timeout_ms;
    int failed;
    int cause;
    atomic_int returned;
} fanner;

static void *fan_thread(void *arg)
{
    fanner *w = arg;
    ctl_target t = {w->address, NULL, 0};
    ctl_outcome out;
    w->failed = ctl_client_call_many(w->client, "echo", &t, 1, w->timeout_ms, &out);
    w->cause = out.error.cause;
    ctl_outcomes_fini(&out, 1);
    atomic_store(&w->returned, 1);
    return NULL;
}

/* A thread blocked in a fan-out drives the engine (nobody else does): the
 * calls other threads start meanwhile go out and complete through it, long
 * before its own call ends; when it has returned, the I/O thread drives
 * what is left. */
static void test_waiter_drives_other_calls(void **state)
{
    enum { N = 8 };
    fx *f = *state;
    seen s[N];
    memset(s, 0, sizeof s);
    assert_int_equal(tu_fake_start(&f->fake, silent, NULL), 0);
    fanner w = {.client = f->client, .address = tu_fake_endpoint(f->fake),
                .timeout_ms = 1500};
    atomic_init(&w.returned, 0);
    assert_int_equal(pthread_create(&w.thread, NULL, fan_thread, &w), 0);
    int64_t until = tu_now_ms() + CALL_MS;
    while (tu_fake_seen(f->fake) < 1 && tu_now_ms() < until)
        sched_yield();
    assert_int_equal(tu_fake_seen(f->fake), 1);
    /* Others' calls while it waits: asynchronous ones, and one whose
     * deadline falls after the fan-out's end. */
    for (int i = 0; i < N - 1; i++) {
        pack_echo(&f->args, i);
        assert_int_equal(ctl_client_call_start(f->client, f->unit.endpoint, "echo",
                                               f->args.sb.data, f->args.sb.size, CALL_MS,
                                               on_done, &s[i], NULL, &f->err),
                         0);
    }
    assert_int_equal(ctl_client_call_start(f->client, tu_fake_endpoint(f->fake), "echo",
                                           NULL, 0, 2500, on_done, &s[N - 1], NULL,
                                           &f->err),
                     0);
    for (int i = 0; i < N - 1; i++) {
        assert_int_equal(process_until(f->client, &s[i].completions, 1, CALL_MS), 1);
        assert_int_equal(s[i].kind, CTL_OK);
        assert_int_equal(s[i].value, i);
    }
    /* All answered while the fan-out still waited for its silent unit. */
    assert_int_equal(atomic_load(&w.returned), 0);
    assert_int_equal(pthread_join(w.thread, NULL), 0);
    assert_int_equal(w.failed, 1);
    assert_int_equal(w.cause, CTL_CAUSE_TIMEOUT);
    /* The last call outlived the fan-out: its deadline still ends it. */
    assert_int_equal(process_until(f->client, &s[N - 1].completions, 1, CALL_MS), 1);
    assert_int_equal(s[N - 1].kind, CTL_TRANSFER);
    assert_int_equal(s[N - 1].cause, CTL_CAUSE_TIMEOUT);
}

/* A wait that runs out gives the drive back: the call still ends at its
 * own deadline, with nobody waiting. */
static void test_wait_runs_out_then_deadline(void **state)
{
    fx *f = *state;
    ctl_call *call = NULL;
    seen s = {0};
    assert_int_equal(tu_fake_start(&f->fake, silent, NULL), 0);
    assert_int_equal(ctl_client_call_start(f->client, tu_fake_endpoint(f->fake), "echo",
                                           NULL, 0, 400, on_done, &s, &call, &f->err),
                     0);
    assert_int_equal(ctl_call_wait(call, 50), CTL_TRANSFER);
    assert_int_equal(process_until(f->client, &s.completions, 1, CALL_MS), 1);
    assert_int_equal(s.cause, CTL_CAUSE_TIMEOUT);
    assert_int_equal(ctl_call_wait(call, 0), 0);
    ctl_call_release(call);
}

/* A client destroyed while another thread waits for one of its calls
 * (driving the engine or not): the wait returns, the call completed as
 * destroyed, and the handle outlives the client. */
static void test_destroy_while_waiting(void **state)
{
    fx *f = *state;
    assert_int_equal(tu_fake_start(&f->fake, silent, NULL), 0);
    for (int round = 0; round < 40; round++) {
        ctl_client *c = new_client(round % 4 == 3, 0);
        assert_non_null(c);
        ctl_call *call = NULL;
        atomic_int returned = 0;
        waiter w = {.returned = &returned, .rc = -1};
        assert_int_equal(ctl_client_call_start(c, tu_fake_endpoint(f->fake), "echo", NULL,
                                               0, CALL_MS, NULL, NULL, &call, &f->err),
                         0);
        w.call = call;
        assert_int_equal(pthread_create(&w.thread, NULL, wait_thread, &w), 0);
        if (round % 2)
            sched_yield();
        ctl_client_destroy(&c);
        assert_int_equal(tu_wait_atleast(&returned, 1, CALL_MS), 1);
        pthread_join(w.thread, NULL);
        assert_int_equal(w.rc, 0);
        size_t n = 0;
        const ctl_outcome *o = ctl_call_outcomes(call, &n);
        assert_int_equal(n, 1);
        assert_int_equal(o[0].error.cause, CTL_CAUSE_CANCELLED);
        assert_non_null(strstr(o[0].error.msg, "destroyed"));
        ctl_call_release(call);
    }
}

/* What a fan-out of 16 sleeps saw: how many slept, and how many ended
 * otherwise (and how). */
typedef struct sleeps_seen {
    atomic_int completions;
    int ok, failed, cause;
} sleeps_seen;

static void on_sleeps(void *user, ctl_outcome *outcomes, size_t count)
{
    sleeps_seen *m = user;
    for (size_t i = 0; i < count; i++) {
        if (outcomes[i].error.kind == CTL_OK &&
            ctl_reply_result(outcomes[i].reply)->via.i64 == 2) {
            m->ok++;
        } else {
            m->failed++;
            m->cause = outcomes[i].error.cause;
        }
    }
    atomic_fetch_add(&m->completions, 1);
}

/* A large asynchronous fan-out on warm sockets, waited for: the waiter
 * drives the engine when it finds nobody driving, or waits while the I/O
 * thread (woken by the start) drives; with one waiter or two, with a wait
 * that runs out first, or with the client destroyed meanwhile, the call
 * completes once with every outcome in place. */
static void test_large_fanout_waited_for(void **state)
{
    enum { N = 16, ROUNDS = 24 };
    fx *f = *state;
    ctl_target t[N];
    tu_buf args;
    tu_buf_init(&args);
    tu_buf_reset(&args);
    msgpack_pack_map(&args.pk, 1);
    tu_pk_str(&args.pk, "ms");
    msgpack_pack_int64(&args.pk, 2);
    for (int i = 0; i < N; i++)
        t[i] = (ctl_target){f->unit.endpoint, args.sb.data, args.sb.size};
    for (int round = 0; round < ROUNDS; round++) {
        int destroy = round % 4 == 3;
        ctl_client *c = destroy ? new_client(0, 0) : f->client;
        assert_non_null(c);
        /* Warm: an idle socket for each request, so that a waiter may drive. */
        ctl_outcome out[N];
        assert_int_equal(ctl_client_call_many(c, "sleep", t, N, CALL_MS, out), 0);
        ctl_outcomes_fini(out, N);
        sleeps_seen m = {0};
        ctl_call *call = NULL;
        assert_int_equal(ctl_client_call_many_start(c, "sleep", t, N, CALL_MS, on_sleeps, &m,
                                                    &call, &f->err),
                         0);
        atomic_int returned = 0;
        waiter w = {.call = call, .returned = &returned, .rc = -1};
        if (round % 4 == 1) /* a wait that runs out, then one that does not */
            ctl_call_wait(call, 1);
        if (round % 4 >= 2)
            assert_int_equal(pthread_create(&w.thread, NULL, wait_thread, &w), 0);
        if (destroy) {
            ctl_client_destroy(&c);
        } else {
            assert_int_equal(ctl_call_wait(call, CALL_MS), 0);
            assert_int_equal(process_until(c, &m.completions, 1, CALL_MS), 1);
        }
        if (round % 4 >= 2) {
            assert_int_equal(tu_wait_atleast(&returned, 1, CALL_MS), 1);
            pthread_join(w.thread, NULL);
            assert_int_equal(w.rc, 0);
        }
        assert_int_equal(atomic_load(&m.completions), 1);
        assert_int_equal(m.ok + m.failed, N);
        if (destroy) {
            /* Some may have been answered before the client went. */
            if (m.failed)
                assert_int_equal(m.cause, CTL_CAUSE_CANCELLED);
        } else {
            assert_int_equal(m.ok, N);
        }
        ctl_call_release(call);
    }
    tu_buf_fini(&args);
}

/* What an echo fan-out's completion saw: how many targets answered with
 * their own value (the echo of target i is i), and the first failure. */
typedef struct echoes_seen {
    atomic_int completions;
    size_t count, right;
    char first_failure[256];
} echoes_seen;

static void on_echoes(void *user, ctl_outcome *outcomes, size_t count)
{
    echoes_seen *m = user;
    m->count = count;
    m->right = 0;
    m->first_failure[0] = '\0';
    for (size_t i = 0; i < count; i++) {
        const msgpack_object *o =
            outcomes[i].reply ? ctl_reply_result(outcomes[i].reply) : NULL;
        if (o && o->type == MSGPACK_OBJECT_POSITIVE_INTEGER && o->via.u64 == i)
            m->right++;
        else if (!m->first_failure[0])
            snprintf(m->first_failure, sizeof m->first_failure, "target %zu: %s", i,
                     outcomes[i].error.msg ? outcomes[i].error.msg : "a wrong value");
    }
    atomic_fetch_add(&m->completions, 1);
}

/* An asynchronous fan-out on warm sockets is sent on the caller's thread
 * and adopted by the I/O thread after. Here the I/O thread is in its
 * epoll_wait for another call all along, so replies that come before the
 * adoption signal sockets it has no request on yet, and it sets those
 * signals aside: adopting a request must read its socket, or the reply
 * would wait there for the deadline. Round after round, every target
 * answers with its own value. */
static void test_replies_before_adoption(void **state)
{
    enum { N = 32, ROUNDS = 40, FAN_MS = 3000 };
    fx *f = *state;
    tu_buf b[N];
    ctl_target t[N];
    for (int i = 0; i < N; i++) {
        tu_buf_init(&b[i]);
        pack_echo(&b[i], i);
        t[i] = (ctl_target){f->unit.endpoint, b[i].sb.data, b[i].sb.size};
    }
    /* N idle sockets to the unit. */
    ctl_outcome out[N];
    assert_int_equal(ctl_client_call_many(f->client, "echo", t, N, CALL_MS, out), 0);
    ctl_outcomes_fini(out, N);
    /* A call that keeps the I/O thread driving through every round. */
    assert_int_equal(tu_fake_start(&f->fake, silent, NULL), 0);
    seen held = {0};
    ctl_call *hold = NULL;
    assert_int_equal(ctl_client_call_start(f->client, tu_fake_endpoint(f->fake), "echo", NULL,
                                           0, 60000, on_done, &held, &hold, &f->err),
                     0);
    int64_t until = tu_now_ms() + CALL_MS;
    while (tu_fake_seen(f->fake) < 1 && tu_now_ms() < until)
        sched_yield();
    assert_int_equal(tu_fake_seen(f->fake), 1);
    for (int round = 0; round < ROUNDS; round++) {
        echoes_seen m = {0};
        ctl_call *call = NULL;
        assert_int_equal(ctl_client_call_many_start(f->client, "echo", t, N, FAN_MS, on_echoes,
                                                    &m, &call, &f->err),
                         0);
        assert_int_equal(process_until(f->client, &m.completions, 1, CALL_MS), 1);
        if (m.right != N)
            fail_msg("round %d: %zu of %d answered; %s", round, m.right, N, m.first_failure);
        ctl_call_release(call);
    }
    assert_int_equal(atomic_load(&held.completions), 0);
    ctl_call_cancel(hold);
    assert_int_equal(process_until(f->client, &held.completions, 1, CALL_MS), 1);
    assert_int_equal(held.cause, CTL_CAUSE_CANCELLED);
    ctl_call_release(hold);
    for (int i = 0; i < N; i++)
        tu_buf_fini(&b[i]);
}

/* A chain of callbacks, each starting the next call (a timeout of 0: it
 * ends at once) and waiting, in the callback, until that call's completion
 * is queued. ctl_client_process runs what was queued when it was called:
 * one callback a call, the next left queued with the descriptor readable,
 * so that a loop gets its turn back however long the chain goes on. */
typedef struct relay {
    ctl_client *client;
    const char *address;
    atomic_int ran;
    int queued_in_callback; /* every next completion was seen queued */
} relay;

enum { RELAY_LEN = 6 };

static void on_relay(void *user, const ctl_error *err, ctl_reply *reply)
{
    (void)err;
    (void)reply;
    relay *ch = user;
    if (atomic_fetch_add(&ch->ran, 1) + 1 >= RELAY_LEN)
        return;
    ctl_error e;
    ctl_error_init(&e);
    if (ctl_client_call_start(ch->client, ch->address, "echo", NULL, 0, 0, on_relay, ch, NULL,
                              &e) != 0) {
        ch->queued_in_callback = 0;
        ctl_error_fini(&e);
        return;
    }
    ctl_error_fini(&e);
    struct pollfd p = {ctl_client_event_fd(ch->client), POLLIN, 0};
    if (poll(&p, 1, CALL_MS) != 1)
        ch->queued_in_callback = 0;
}

static void test_process_runs_what_was_queued(void **state)
{
    fx *f = *state;
    relay ch = {.client = f->client, .address = f->unit.endpoint, .queued_in_callback = 1};
    atomic_init(&ch.ran, 0);
    assert_int_equal(ctl_client_call_start(f->client, f->unit.endpoint, "echo", NULL, 0, 0,
                                           on_relay, &ch, NULL, &f->err),
                     0);
    for (int i = 1; i <= RELAY_LEN; i++) {
        struct pollfd p = {ctl_client_event_fd(f->client), POLLIN, 0};
        assert_int_equal(poll(&p, 1, CALL_MS), 1);
        assert_int_equal(ctl_client_process(f->client, 0), 1);
        assert_int_equal(atomic_load(&ch.ran), i);
        /* The next one is queued, and waits for the next call. */
        assert_int_equal(readable(ctl_client_event_fd(f->client)), i < RELAY_LEN);
    }
    assert_int_equal(ch.queued_in_callback, 1);
    assert_int_equal(ctl_client_process(f->client, 0), 0);
}

/* A callback reads its own call's outcomes through its handle, in either
 * delivery: on the I/O thread too, where the call's state moves only
 * after the callback has run. */
typedef struct own {
    _Atomic(ctl_call *) handle;
    atomic_int completions;
    const ctl_outcome *outcomes;
    size_t count;
    int kind;
} own;

static void on_own(void *user, const ctl_error *err, ctl_reply *reply)
{
    (void)reply;
    own *o = user;
    int64_t until = tu_now_ms() + CALL_MS;
    ctl_call *h;
    while (!(h = atomic_load(&o->handle)) && tu_now_ms() < until)
        sched_yield(); /* the start may not have returned yet */
    o->outcomes = ctl_call_outcomes(h, &o->count);
    o->kind = o->outcomes ? o->outcomes[0].error.kind : -1;
    assert_int_equal(err->kind, CTL_OK);
    atomic_fetch_add(&o->completions, 1);
}

static void test_outcomes_from_own_callback(void **state)
{
    fx *f = *state;
    for (int io = 0; io < 2; io++) {
        ctl_client *c = new_client(io, 0);
        assert_non_null(c);
        own o;
        memset(&o, 0, sizeof o);
        atomic_init(&o.handle, NULL);
        atomic_init(&o.completions, 0);
        ctl_call *call = NULL;
        pack_echo(&f->args, 5);
        assert_int_equal(ctl_client_call_start(c, f->unit.endpoint, "echo", f->args.sb.data,
                                               f->args.sb.size, CALL_MS, on_own, &o, &call,
                                               &f->err),
                         0);
        atomic_store(&o.handle, call);
        if (io)
            assert_int_equal(ctl_call_wait(call, CALL_MS), 0);
        else
            assert_int_equal(process_until(c, &o.completions, 1, CALL_MS), 1);
        assert_int_equal(atomic_load(&o.completions), 1);
        assert_non_null(o.outcomes);
        assert_int_equal(o.count, 1);
        assert_int_equal(o.kind, CTL_OK);
        ctl_call_release(call);
        ctl_client_destroy(&c);
    }
}

/* A fan-out target with NULL args but a length fails on its own, saying
 * so (not "no address"), as in the blocking fan-out; the others go. */
static void test_many_start_null_args_target(void **state)
{
    fx *f = *state;
    pack_echo(&f->args, 7);
    ctl_target t[2] = {
        {f->unit.endpoint, NULL, 5},
        {f->unit.endpoint, f->args.sb.data, f->args.sb.size},
    };
    many_seen m = {0};
    ctl_call *call = NULL;
    assert_int_equal(ctl_client_call_many_start(f->client, "echo", t, 2, CALL_MS, on_many, &m,
                                                &call, &f->err),
                     0);
    assert_int_equal(process_until(f->client, &m.completions, 1, CALL_MS), 1);
    assert_int_equal(m.kinds[0], CTL_INVALID);
    assert_non_null(strstr(m.msgs[0], "target #0 has NULL args but a length"));
    assert_int_equal(m.kinds[1], CTL_OK);
    assert_int_equal(m.values[1], 7);
    ctl_call_release(call);
    ctl_outcome out[2];
    assert_int_equal(ctl_client_call_many(f->client, "echo", t, 2, CALL_MS, out), 1);
    assert_int_equal(out[0].error.kind, CTL_INVALID);
    assert_non_null(strstr(out[0].error.msg, "target #0 has NULL args but a length"));
    ctl_outcomes_fini(out, 2);
}

static void test_bad_start_arguments(void **state)
{
    fx *f = *state;
    ctl_call *call = NULL;
    assert_int_equal(ctl_client_call_start(NULL, "tcp://127.0.0.1:1", "echo", NULL, 0,
                                           1, on_done, NULL, &call, &f->err),
                     CTL_INVALID);
    assert_int_equal(ctl_client_call_start(f->client, NULL, "echo", NULL, 0, 1,
                                           on_done, NULL, &call, &f->err),
                     CTL_INVALID);
    assert_non_null(strstr(f->err.msg, "address"));
    assert_int_equal(ctl_client_call_start(f->client, "tcp://127.0.0.1:1", "echo",
                                           NULL, 3, 1, on_done, NULL, &call, &f->err),
                     CTL_INVALID);
    assert_int_equal(ctl_client_call_many_start(f->client, "echo", NULL, 2, 1,
                                                on_many, NULL, &call, &f->err),
                     CTL_INVALID);
    assert_null(call);
    ctl_call_cancel(NULL);
    ctl_call_release(NULL);
    assert_int_equal(ctl_call_wait(NULL, 0), CTL_INVALID);
    assert_int_equal(ctl_client_process(NULL, 0), 0);
    assert_int_equal(ctl_client_event_fd(NULL), -1);
}

/* Whether thread `tid` of this process blocks signal `sig`, from the
 * SigBlk line of its /proc status (-1 when it cannot be read). */
static int thread_blocks(const char *tid, int sig)
{
    char path[300], line[256];
    snprintf(path, sizeof path, "/proc/self/task/%.255s/status", tid);
    FILE *fp = fopen(path, "r");
    if (!fp)
        return -1;
    int blocked = -1;
    while (fgets(line, sizeof line, fp))
        if (strncmp(line, "SigBlk:", 7) == 0) {
            unsigned long long mask = strtoull(line + 7, NULL, 16);
            blocked = (int)((mask >> (sig - 1)) & 1);
        }
    fclose(fp);
    return blocked;
}

/* Signals belong to the program: every thread the runtime and libzmq start
 * (the unit's, the client's engine, both contexts' I/O threads and
 * reapers) blocks them from its first instruction, so a main thread that
 * blocks SIGTERM only now and waits for it in sigwait always takes it. The
 * engine's thread did not block them at all. */
static void test_runtime_threads_take_no_signals(void **state)
{
    fx *f = *state;
    seen s = {0};
    ctl_call *call = NULL;
    pack_echo(&f->args, 7);
    assert_int_equal(ctl_client_call_start(f->client, f->unit.endpoint, "echo",
                                           f->args.sb.data, f->args.sb.size,
                                           CALL_MS, on_done, &s, &call, &f->err),
                     0);
    assert_int_equal(ctl_call_wait(call, CALL_MS), 0);
    ctl_call_release(call);
    ctl_client_process(f->client, 0);
    char self[32];
    snprintf(self, sizeof self, "%ld", (long)syscall(SYS_gettid));
    DIR *d = opendir("/proc/self/task");
    assert_non_null(d);
    int others = 0;
    struct dirent *e;
    while ((e = readdir(d))) {
        if (e->d_name[0] == '.' || strcmp(e->d_name, self) == 0)
            continue;
        others++;
        const int sigs[] = {SIGTERM, SIGINT, SIGHUP, SIGUSR1};
        for (size_t i = 0; i < sizeof sigs / sizeof sigs[0]; i++)
            if (thread_blocks(e->d_name, sigs[i]) != 1)
                fail_msg("thread %s does not block signal %d", e->d_name, sigs[i]);
    }
    closedir(d);
    assert_true(others >= 5); /* the unit's 2, the engine, 2 contexts' 2 */
}

int main(void)
{
#define T(fn) cmocka_unit_test_setup_teardown(fn, setup, teardown)
    const struct CMUnitTest tests[] = {
        T(test_one_call),
        T(test_args_freed_after_start),
        T(test_many_in_flight),
        T(test_deadline),
        T(test_timeout_zero_and_bad_address),
        T(test_cancel_in_flight),
        T(test_cancel_races_reply),
        T(test_cancel_races_reply_io),
        T(test_cancel_then_late_reply),
        T(test_destroy_in_flight),
        T(test_callback_starts_calls),
        T(test_io_thread_delivery),
        T(test_sockets_shared_with_blocking_calls),
        T(test_max_in_flight),
        T(test_start_failures_logged_per_cause),
        T(test_many_start),
        T(test_many_counts_each_as_it_ends),
        T(test_many_start_warm_and_cold),
        T(test_many_start_cancelled_at_once),
        T(test_release_early),
        T(test_wait_without_callback),
        T(test_wait_times_out),
        T(test_wait_from_many_threads),
        T(test_waiter_drives_other_calls),
        T(test_wait_runs_out_then_deadline),
        T(test_destroy_while_waiting),
        T(test_large_fanout_waited_for),
        T(test_replies_before_adoption),
        T(test_process_runs_what_was_queued),
        T(test_outcomes_from_own_callback),
        T(test_many_start_null_args_target),
        T(test_bad_start_arguments),
        T(test_runtime_threads_take_no_signals),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
