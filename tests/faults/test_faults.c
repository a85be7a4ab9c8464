/*
 * test_faults.c - the storage service under faults: real ctl-storage-unit
 * processes (UNIT_BIN) killed, frozen and restarted under live clients,
 * called through the generated stubs:
 *
 *   kill_restart   a unit SIGKILLed mid-call (its callers blocked on it),
 *                  then restarted on the same endpoint: every call fails
 *                  with a Transfer error within its deadline, then every
 *                  caller succeeds again, with nothing but correct results
 *   fd_leak        thousands of failed calls (single and fan-out) against a
 *                  killed unit leave no socket or file descriptor behind
 *                  once the retired sockets' grace period is over
 *   freeze_late    a unit frozen (SIGSTOP) past its callers' deadlines, then
 *                  resumed (SIGCONT): every late reply is drained and
 *                  counted, none reaches a later call, and what the late
 *                  requests did is there
 *   freeze_expired a unit frozen while puts queue up, resumed after their
 *                  callers' deadlines (carried in the request ids) and its
 *                  skew allowance passed: none of them runs, each is
 *                  counted in `expired`, no reply is sent
 *   call_many      one fan-out over units that are fine, frozen and dead:
 *                  each target gets its own outcome, the batch ends at its
 *                  deadline; all-fine batches end as soon as all answered
 *   backlog        a frozen unit (its I/O thread accepts nothing) still
 *                  completes the TCP handshake of 300 clients connecting at
 *                  once: its listen backlog is not libzmq's default of 100
 *
 * Each is its own ctest (fault_<name>: the executable takes a cmocka test
 * filter as its argument). Everything binds and dials 127.0.0.1. Deadlines
 * carry SLACK_MS for a loaded 2-core machine under ASan: a bound that
 * fails only says a call took far longer than its deadline.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>

#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <poll.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include "storage.ctl.h"
#include "testutil.h"
#include "unitproc.h"

#ifndef UNIT_BIN
#error "UNIT_BIN (the path of ctl-storage-unit) must be defined"
#endif

#define START_MS 20000 /* a unit has this long to print its endpoint */
#define OK_MS 10000    /* deadline of calls that must succeed */
#define SLACK_MS 2000  /* how late past its deadline a call may end */
#define MAX_UNITS 6

typedef struct fx {
    up_unit units[MAX_UNITS];
    ctl_client *client;
    ctl_error err;
} fx;

static int setup(void **state)
{
    fx *f = calloc(1, sizeof *f);
    if (!f)
        return -1;
    for (int i = 0; i < MAX_UNITS; i++)
        f->units[i].out_fd = -1;
    ctl_error_init(&f->err);
    *state = f;
    return 0;
}

static int teardown(void **state)
{
    fx *f = *state;
    ctl_client_destroy(&f->client);
    for (int i = 0; i < MAX_UNITS; i++)
        if (f->units[i].pid > 0)
            up_stop(&f->units[i], 5000);
    ctl_error_fini(&f->err);
    free(f);
    return 0;
}

static void start_unit(fx *f, int i, const char *bind)
{
    if (up_start(&f->units[i], UNIT_BIN, bind, "64M", START_MS) != 0)
        fail_msg("cannot start unit %d", i);
}

static void new_client(fx *f, int late_grace_ms, unsigned max_retired)
{
    ctl_client_options o;
    ctl_client_options_init(&o);
    o.late_grace_ms = late_grace_ms;
    o.max_retired = max_retired;
    if (ctl_client_new(&o, &f->client, &f->err) != 0)
        fail_msg("ctl_client_new: %s", f->err.msg);
}

/* `len` bytes that depend on `seed` and the position. */
static void fill(unsigned char *buf, size_t len, unsigned seed)
{
    uint32_t x = seed * 2654435761u + 1;
    for (size_t i = 0; i < len; i++) {
        x = x * 1103515245u + 12345u;
        buf[i] = (unsigned char)(x >> 16);
    }
}

static ctl_str cstr(const char *s)
{
    return (ctl_str){s, strlen(s)};
}

static int put(ctl_client *c, const char *addr, const char *key,
               const unsigned char *data, size_t len, int timeout_ms,
               uint64_t *result, ctl_error *err)
{
    storage_put_args a;
    storage_put_args_init(&a);
    a.key = cstr(key);
    a.data = (ctl_str){(const char *)data, len};
    return storage_put(c, addr, &a, timeout_ms, result, err);
}

/* get(key) must succeed and return exactly `want`. */
static void get_expect(fx *f, const char *addr, const char *key,
                       const unsigned char *want, size_t len)
{
    ctl_str k = cstr(key);
    storage_get_args a = {.keys = {.items = &k, .count = 1}};
    storage_list_bin blobs;
    ctl_reply *reply = NULL;
    int rc = storage_get(f->client, addr, &a, OK_MS, &blobs, &reply, &f->err);
    if (rc != 0)
        fail_msg("get %s at %s: %s", key, addr, f->err.msg);
    assert_int_equal(blobs.count, 1);
    assert_int_equal(blobs.items[0].len, len);
    assert_memory_equal(blobs.items[0].ptr, want, len);
    ctl_reply_destroy(&reply);
}

static void stats_ok(fx *f, const char *addr, storage_UnitStats *out)
{
    ctl_reply *reply = NULL;
    if (storage_stats(f->client, addr, OK_MS, out, &reply, &f->err) != 0)
        fail_msg("stats at %s: %s", addr, f->err.msg);
    ctl_reply_destroy(&reply);
}

/* ---- kill_restart ------------------------------------------------------ */

enum { PH_RUN, PH_DEAD, PH_RESTARTED, PH_SETTLED, PH_STOP };

#define CALLERS 4
#define CALL_MS 2000 /* every call's deadline in kill_restart */

typedef struct caller {
    ctl_client *client;
    const char *address;
    _Atomic int *phase;
    int index;
    /* results, read after join */
    int calls, bad_result, bad_kind, too_slow, fail_in_run, fail_settled;
    int fails_dead;         /* failures of calls that ended after the kill */
    atomic_int ok_restarted; /* successes of calls started after restart */
    int64_t slowest_fail_ms;
} caller;

static void *caller_main(void *arg)
{
    caller *c = arg;
    unsigned char data[600];
    char key[32];
    ctl_error err;
    ctl_error_init(&err);
    snprintf(key, sizeof key, "caller-%d", c->index);
    for (unsigned n = 0; atomic_load(c->phase) != PH_STOP; n++) {
        size_t len = 1 + (n * 37 + (unsigned)c->index) % sizeof data;
        fill(data, len, n);
        int start = atomic_load(c->phase);
        int64_t t0 = tu_now_ms();
        uint64_t got = 0;
        int rc = put(c->client, c->address, key, data, len, CALL_MS, &got, &err);
        int64_t took = tu_now_ms() - t0;
        int end = atomic_load(c->phase);
        c->calls++;
        if (rc == 0) {
            c->bad_result += got != len;
            if (start >= PH_RESTARTED)
                atomic_fetch_add(&c->ok_restarted, 1);
            continue;
        }
        if (rc != CTL_TRANSFER) {
            fprintf(stderr, "caller %d: unexpected %s: %s\n", c->index,
                    ctl_kind_name((ctl_kind)rc), err.msg);
            c->bad_kind++;
        }
        if (took > c->slowest_fail_ms)
            c->slowest_fail_ms = took;
        c->too_slow += took > CALL_MS + SLACK_MS;
        c->fail_in_run += start == PH_RUN && end == PH_RUN;
        c->fail_settled += start >= PH_SETTLED;
        c->fails_dead += end >= PH_DEAD;
    }
    ctl_error_fini(&err);
    return NULL;
}

static void test_kill_restart(void **state)
{
    fx *f = *state;
    start_unit(f, 0, NULL);
    new_client(f, 200, 64);
    char endpoint[CTL_ENDPOINT_MAX];
    snprintf(endpoint, sizeof endpoint, "%s", f->units[0].endpoint);

    _Atomic int phase = PH_RUN;
    caller callers[CALLERS];
    pthread_t threads[CALLERS];
    for (int i = 0; i < CALLERS; i++) {
        memset(&callers[i], 0, sizeof callers[i]);
        callers[i] = (caller){.client = f->client, .address = endpoint,
                              .phase = &phase, .index = i};
        atomic_init(&callers[i].ok_restarted, 0);
        assert_int_equal(pthread_create(&threads[i], NULL, caller_main, &callers[i]), 0);
    }
    tu_sleep_ms(500);

    /* Mid-call: frozen first, so every caller is blocked on it when it
     * dies. */
    atomic_store(&phase, PH_DEAD);
    assert_int_equal(up_freeze(&f->units[0]), 0);
    tu_sleep_ms(300);
    up_kill(&f->units[0]);
    tu_sleep_ms(2 * CALL_MS);

    start_unit(f, 0, endpoint);
    assert_string_equal(f->units[0].endpoint, endpoint);
    atomic_store(&phase, PH_RESTARTED);
    int64_t deadline = tu_now_ms() + 20000;
    for (;;) {
        int all = 1;
        for (int i = 0; i < CALLERS; i++)
            all &= atomic_load(&callers[i].ok_restarted) > 0;
        if (all)
            break;
        if (tu_now_ms() > deadline)
            fail_msg("not every caller succeeded within 20 s of the restart");
        tu_sleep_ms(20);
    }
    atomic_store(&phase, PH_SETTLED);
    tu_sleep_ms(1000);
    atomic_store(&phase, PH_STOP);
    for (int i = 0; i < CALLERS; i++)
        pthread_join(threads[i], NULL);

    int calls = 0;
    int64_t slowest = 0;
    for (int i = 0; i < CALLERS; i++) {
        caller *c = &callers[i];
        calls += c->calls;
        if (c->slowest_fail_ms > slowest)
            slowest = c->slowest_fail_ms;
        assert_int_equal(c->bad_result, 0);
        assert_int_equal(c->bad_kind, 0);
        assert_int_equal(c->too_slow, 0);
        assert_int_equal(c->fail_in_run, 0);
        assert_int_equal(c->fail_settled, 0);
        assert_true(c->fails_dead >= 1); /* it did see the unit die */
    }
    ctl_client_stats cs;
    ctl_client_stats_get(f->client, &cs);
    printf("kill_restart: %d calls; %llu timed out (slowest failure %lld ms, "
           "deadline %d ms)\n", calls, (unsigned long long)cs.timeouts,
           (long long)slowest, CALL_MS);
    /* The restarted unit has the data of the calls made after it started. */
    unsigned char data[16];
    fill(data, sizeof data, 7);
    assert_int_equal(put(f->client, endpoint, "after", data, sizeof data, OK_MS,
                         NULL, &f->err), 0);
    get_expect(f, endpoint, "after", data, sizeof data);
}

/* ---- fd_leak ----------------------------------------------------------- */

#define GRACE_MS 100
#define SINGLE_FAILS 500
#define FAN 50
#define FAN_BATCHES 50

/* Wait until this process has at most `want` fds (sockets close on
 * libzmq's reaper thread, a moment after zmq_close); returns the last
 * count. */
static int fds_settle(int want, int timeout_ms)
{
    int64_t end = tu_now_ms() + timeout_ms;
    int n = up_count_fds(0);
    while (n > want && tu_now_ms() < end) {
        tu_sleep_ms(20);
        n = up_count_fds(0);
    }
    return n;
}

static void test_fd_leak(void **state)
{
    fx *f = *state;
    start_unit(f, 0, NULL);
    new_client(f, GRACE_MS, 64);
    char endpoint[CTL_ENDPOINT_MAX];
    snprintf(endpoint, sizeof endpoint, "%s", f->units[0].endpoint);
    unsigned char data[64];
    fill(data, sizeof data, 1);
    for (int i = 0; i < 20; i++)
        assert_int_equal(put(f->client, endpoint, "k", data, sizeof data, OK_MS,
                             NULL, &f->err), 0);
    tu_sleep_ms(200);
    int before = up_count_fds(0);
    ctl_client_stats s0;
    ctl_client_stats_get(f->client, &s0);

    up_kill(&f->units[0]);
    int failed = 0, peak = before;
    for (int i = 0; i < SINGLE_FAILS; i++) {
        int rc = put(f->client, endpoint, "k", data, sizeof data, 2, NULL, &f->err);
        assert_int_equal(rc, CTL_TRANSFER);
        failed++;
    }
    const char *addrs[FAN];
    storage_put_args args[FAN];
    storage_put_outcome out[FAN];
    for (int i = 0; i < FAN; i++) {
        addrs[i] = endpoint;
        storage_put_args_init(&args[i]);
        args[i].key = cstr("k");
        args[i].data = (ctl_str){(const char *)data, sizeof data};
    }
    for (int b = 0; b < FAN_BATCHES; b++) {
        int rc = storage_put_many(f->client, addrs, args, FAN, 10, out);
        assert_int_equal(rc, FAN);
        for (int i = 0; i < FAN; i++)
            assert_int_equal(out[i].error.kind, CTL_TRANSFER);
        storage_put_outcomes_fini(out, FAN);
        failed += FAN;
        int n = up_count_fds(0);
        if (n > peak)
            peak = n;
    }

    /* The unit comes back; once the grace period is over the next calls
     * close every retired socket. */
    start_unit(f, 0, endpoint);
    tu_sleep_ms(GRACE_MS + 50);
    int64_t deadline = tu_now_ms() + 20000;
    while (put(f->client, endpoint, "k", data, sizeof data, 1000, NULL, &f->err) != 0)
        if (tu_now_ms() > deadline)
            fail_msg("the restarted unit does not answer: %s", f->err.msg);
    for (int i = 0; i < 20; i++)
        assert_int_equal(put(f->client, endpoint, "k", data, sizeof data, OK_MS,
                             NULL, &f->err), 0);
    /* Failed attempts above may still be in their grace period. */
    tu_sleep_ms(GRACE_MS + 50);
    assert_int_equal(put(f->client, endpoint, "k", data, sizeof data, OK_MS,
                         NULL, &f->err), 0);
    int after = fds_settle(before, 5000);
    ctl_client_stats s1;
    ctl_client_stats_get(f->client, &s1);
    printf("fd_leak: %d failed calls; fds %d before, peak %d, %d after; "
           "sockets opened %llu, closed %llu, retired %llu\n", failed, before,
           peak, after, (unsigned long long)(s1.sockets_opened - s0.sockets_opened),
           (unsigned long long)(s1.sockets_closed - s0.sockets_closed),
           (unsigned long long)(s1.sockets_retired - s0.sockets_retired));
    assert_true(failed >= 3000);
    assert_true(after <= before);
    /* Every socket the failures opened was closed: what is left open is
     * what the pool keeps idle (the calls above are sequential: one). */
    assert_true(s1.sockets_opened - s1.sockets_closed <= 2);
    assert_true(s1.sockets_retired - s0.sockets_retired >= (uint64_t)failed);
}

/* ---- freeze_late ------------------------------------------------------- */

#define LATE_THREADS 8
#define LATE_PER_THREAD 5
#define LATE_KEYS (LATE_THREADS * LATE_PER_THREAD)
#define LATE_MS 300

typedef struct late_caller {
    fx *f;
    const char *address;
    int index;
    int rc[LATE_PER_THREAD];
    ctl_cause cause[LATE_PER_THREAD];
    int64_t took[LATE_PER_THREAD];
} late_caller;

static void late_value(int key, unsigned char *buf, size_t *len)
{
    *len = 100 + (size_t)key * 7;
    fill(buf, *len, 1000u + (unsigned)key);
}

static void *late_main(void *arg)
{
    late_caller *c = arg;
    ctl_error err;
    ctl_error_init(&err);
    for (int j = 0; j < LATE_PER_THREAD; j++) {
        int k = c->index * LATE_PER_THREAD + j;
        char key[16];
        unsigned char data[512];
        size_t len;
        snprintf(key, sizeof key, "k%d", k);
        late_value(k, data, &len);
        int64_t t0 = tu_now_ms();
        c->rc[j] = put(c->f->client, c->address, key, data, len, LATE_MS, NULL, &err);
        c->took[j] = tu_now_ms() - t0;
        c->cause[j] = err.cause;
    }
    ctl_error_fini(&err);
    return NULL;
}

static void test_freeze_late(void **state)
{
    fx *f = *state;
    /* The late requests must run: the unit's deadline check is off (the
     * callers' deadlines pass while it is frozen; freeze_expired is the
     * other way). */
    f->units[0].extra[0] = "--deadline-skew-ms";
    f->units[0].extra[1] = "-1";
    start_unit(f, 0, NULL);
    new_client(f, 30000, 2 * LATE_KEYS);
    const char *addr = f->units[0].endpoint;
    unsigned char first[8] = "original";
    char key[16];
    for (int k = 0; k < LATE_KEYS; k++) {
        snprintf(key, sizeof key, "k%d", k);
        assert_int_equal(put(f->client, addr, key, first, sizeof first, OK_MS,
                             NULL, &f->err), 0);
    }

    /* Connections up before the freeze: the client hands a request only to
     * a connection that is up (ZMQ_IMMEDIATE), and a frozen unit completes
     * no new handshake. A fan-out of LATE_KEYS calls to the unit leaves as
     * many connections pooled (the pool keeps as many idle as were lent at
     * once); repeated, with a deadline, until it has, since a reply that
     * comes before the last request leaves may let a socket serve twice. */
    ctl_target warm[LATE_KEYS];
    for (int k = 0; k < LATE_KEYS; k++)
        warm[k] = (ctl_target){addr, NULL, 0};
    ctl_address_stats as;
    int64_t warm_until = tu_now_ms() + 20000;
    do {
        ctl_call *call = NULL;
        assert_int_equal(ctl_client_call_many_start(f->client, "stats", warm, LATE_KEYS, OK_MS,
                                                    NULL, NULL, &call, &f->err),
                         0);
        assert_int_equal(ctl_call_wait(call, 2 * OK_MS), 0);
        size_t n = 0;
        const ctl_outcome *o = ctl_call_outcomes(call, &n);
        for (size_t k = 0; k < n; k++)
            assert_int_equal(o[k].error.kind, CTL_OK);
        ctl_call_release(call);
        ctl_client_address_stats(f->client, addr, &as);
    } while (as.sockets < LATE_KEYS && tu_now_ms() < warm_until);
    assert_true(as.sockets >= LATE_KEYS);

    assert_int_equal(up_freeze(&f->units[0]), 0);
    late_caller lc[LATE_THREADS];
    pthread_t th[LATE_THREADS];
    for (int i = 0; i < LATE_THREADS; i++) {
        lc[i] = (late_caller){.f = f, .address = addr, .index = i};
        assert_int_equal(pthread_create(&th[i], NULL, late_main, &lc[i]), 0);
    }
    for (int i = 0; i < LATE_THREADS; i++)
        pthread_join(th[i], NULL);
    for (int i = 0; i < LATE_THREADS; i++)
        for (int j = 0; j < LATE_PER_THREAD; j++) {
            assert_int_equal(lc[i].rc[j], CTL_TRANSFER);
            assert_int_equal(lc[i].cause[j], CTL_CAUSE_TIMEOUT);
            assert_true(lc[i].took[j] >= LATE_MS - 5);
            assert_true(lc[i].took[j] <= LATE_MS + SLACK_MS);
        }
    ctl_client_stats cs;
    ctl_client_stats_get(f->client, &cs);
    assert_int_equal(cs.timeouts, LATE_KEYS);
    assert_int_equal(cs.late_replies, 0);

    /* Resumed: it answers all 40 to sockets retired long ago. Every later
     * call (each lend drains the retired sockets) must get its own reply. */
    assert_int_equal(up_thaw(&f->units[0]), 0);
    int64_t deadline = tu_now_ms() + 20000;
    uint64_t last_requests = 0;
    do {
        storage_UnitStats st;
        stats_ok(f, addr, &st);
        assert_true(st.requests > last_requests); /* its own, fresh reply */
        last_requests = st.requests;
        ctl_client_stats_get(f->client, &cs);
        if (cs.late_replies >= LATE_KEYS)
            break;
        tu_sleep_ms(20);
    } while (tu_now_ms() < deadline);
    assert_int_equal(cs.late_replies, LATE_KEYS);

    /* What the late puts did is there, each reply is the one asked for. */
    for (int k = 0; k < LATE_KEYS; k++) {
        unsigned char want[512];
        size_t len;
        late_value(k, want, &len);
        snprintf(key, sizeof key, "k%d", k);
        get_expect(f, addr, key, want, len);
    }
    for (int n = 0; n < 200; n++) {
        unsigned char data[300];
        size_t len = 1 + (size_t)(n * 13) % sizeof data;
        uint64_t got = 0;
        fill(data, len, 5000u + (unsigned)n);
        snprintf(key, sizeof key, "k%d", n % LATE_KEYS);
        assert_int_equal(put(f->client, addr, key, data, len, OK_MS, &got,
                             &f->err), 0);
        assert_int_equal(got, len);
        get_expect(f, addr, key, data, len);
    }
    storage_UnitStats st;
    stats_ok(f, addr, &st);
    ctl_client_stats_get(f->client, &cs);
    assert_int_equal(cs.late_replies, LATE_KEYS); /* no more since */
    assert_int_equal(cs.timeouts, LATE_KEYS);
    /* Every request the client sent was served, the late ones included. */
    assert_int_equal(st.requests, cs.calls);
    assert_int_equal(st.dropped, 0);
    printf("freeze_late: %d calls timed out, %llu late replies dropped and "
           "counted, %llu calls in all\n", LATE_KEYS,
           (unsigned long long)cs.late_replies, (unsigned long long)cs.calls);
}

/* ---- freeze_expired ---------------------------------------------------- */

#define EXPIRED_SKEW_MS 200

static int64_t wall_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

/* The unit's `expired`, from the built-in op _stats. */
static uint64_t unit_expired(fx *f, const char *addr)
{
    ctl_reply *reply = NULL;
    if (ctl_client_call(f->client, addr, "_stats", NULL, 0, OK_MS, &reply, &f->err) != 0)
        fail_msg("_stats at %s: %s", addr, f->err.msg);
    const msgpack_object *t = tu_obj_get(ctl_reply_result(reply), "totals");
    const msgpack_object *e = t ? tu_obj_get(t, "expired") : NULL;
    assert_non_null(e);
    assert_int_equal(e->type, MSGPACK_OBJECT_POSITIVE_INTEGER);
    uint64_t v = e->via.u64;
    ctl_reply_destroy(&reply);
    return v;
}

/* A unit frozen while puts queue up on it, past their callers' deadlines
 * and its skew allowance, then resumed: none of the puts runs (their keys
 * are missing), each is counted in `expired`, no reply is sent for any (no
 * late reply reaches the client), and the unit serves on. */
static void test_freeze_expired(void **state)
{
    fx *f = *state;
    char skew[16];
    snprintf(skew, sizeof skew, "%d", EXPIRED_SKEW_MS);
    f->units[0].extra[0] = "--deadline-skew-ms";
    f->units[0].extra[1] = skew;
    start_unit(f, 0, NULL);
    new_client(f, 30000, 2 * LATE_KEYS);
    const char *addr = f->units[0].endpoint;
    char key[16];

    /* Connections up before the freeze (as in freeze_late). */
    ctl_target warm[LATE_KEYS];
    for (int k = 0; k < LATE_KEYS; k++)
        warm[k] = (ctl_target){addr, NULL, 0};
    ctl_address_stats as;
    int64_t warm_until = tu_now_ms() + 20000;
    do {
        ctl_call *call = NULL;
        assert_int_equal(ctl_client_call_many_start(f->client, "stats", warm, LATE_KEYS, OK_MS,
                                                    NULL, NULL, &call, &f->err),
                         0);
        assert_int_equal(ctl_call_wait(call, 2 * OK_MS), 0);
        ctl_call_release(call);
        ctl_client_address_stats(f->client, addr, &as);
    } while (as.sockets < LATE_KEYS && tu_now_ms() < warm_until);
    assert_true(as.sockets >= LATE_KEYS);
    assert_int_equal(unit_expired(f, addr), 0);

    assert_int_equal(up_freeze(&f->units[0]), 0);
    late_caller lc[LATE_THREADS];
    pthread_t th[LATE_THREADS];
    for (int i = 0; i < LATE_THREADS; i++) {
        lc[i] = (late_caller){.f = f, .address = addr, .index = i};
        assert_int_equal(pthread_create(&th[i], NULL, late_main, &lc[i]), 0);
    }
    for (int i = 0; i < LATE_THREADS; i++)
        pthread_join(th[i], NULL);
    for (int i = 0; i < LATE_THREADS; i++)
        for (int j = 0; j < LATE_PER_THREAD; j++) {
            assert_int_equal(lc[i].rc[j], CTL_TRANSFER);
            assert_int_equal(lc[i].cause[j], CTL_CAUSE_TIMEOUT);
        }
    ctl_client_stats cs;
    ctl_client_stats_get(f->client, &cs);
    assert_int_equal(cs.timeouts, LATE_KEYS);
    uint64_t sent = cs.calls;

    /* Every deadline has passed (each call ended at or after its own);
     * the unit resumes once they are older than its allowance, by the wall
     * clock the ids carry. */
    int64_t thaw_at = wall_ms() + EXPIRED_SKEW_MS + 50;
    while (wall_ms() < thaw_at)
        tu_sleep_ms(10);
    assert_int_equal(up_thaw(&f->units[0]), 0);
    int64_t deadline = tu_now_ms() + 20000;
    uint64_t expired = 0;
    while ((expired = unit_expired(f, addr)) < LATE_KEYS && tu_now_ms() < deadline)
        tu_sleep_ms(20);
    assert_int_equal(expired, LATE_KEYS);

    /* None of them ran: every key is missing. */
    for (int k = 0; k < LATE_KEYS; k++) {
        snprintf(key, sizeof key, "k%d", k);
        ctl_str kk = cstr(key);
        storage_get_args a = {.keys = {.items = &kk, .count = 1}};
        storage_list_bin blobs;
        ctl_reply *reply = NULL;
        assert_int_equal(storage_get(f->client, addr, &a, OK_MS, &blobs, &reply, &f->err),
                         CTL_MISSING);
    }
    storage_UnitStats st;
    stats_ok(f, addr, &st);
    assert_int_equal(st.dropped, 0);
    /* Nothing was sent back for them: no late reply ever came. */
    ctl_client_stats_get(f->client, &cs);
    assert_int_equal(cs.late_replies, 0);
    assert_true(cs.calls > sent);
    printf("freeze_expired: %d puts timed out on a frozen unit; after it resumed, "
           "%llu expired unserved\n", LATE_KEYS, (unsigned long long)expired);
}

/* ---- call_many --------------------------------------------------------- */

#define BATCH_MS 800
#define TARGETS 7

static void test_call_many(void **state)
{
    fx *f = *state;
    /* 0, 1 fine; 2, 3 frozen; 4, 5 dead. The frozen ones answer late once
     * thawed, however late the machine lets them run: their deadline check
     * is off. */
    for (int i = 0; i < 6; i++) {
        if (i == 2 || i == 3) {
            f->units[i].extra[0] = "--deadline-skew-ms";
            f->units[i].extra[1] = "-1";
        }
        start_unit(f, i, NULL);
    }
    new_client(f, 30000, 64);
    char dead[2][CTL_ENDPOINT_MAX];
    for (int i = 0; i < 2; i++) {
        snprintf(dead[i], sizeof dead[i], "%s", f->units[4 + i].endpoint);
        up_kill(&f->units[4 + i]);
    }
    assert_int_equal(up_freeze(&f->units[2]), 0);
    assert_int_equal(up_freeze(&f->units[3]), 0);

    /* fine, frozen, dead, fine, frozen, dead, fine again */
    const char *addrs[TARGETS] = {f->units[0].endpoint, f->units[2].endpoint,
                                  dead[0], f->units[1].endpoint,
                                  f->units[3].endpoint, dead[1],
                                  f->units[0].endpoint};
    const int ok[TARGETS] = {1, 0, 0, 1, 0, 0, 1};
    unsigned char data[TARGETS][64];
    storage_put_args args[TARGETS];
    storage_put_outcome out[TARGETS];
    char keys[TARGETS][8];
    for (int i = 0; i < TARGETS; i++) {
        snprintf(keys[i], sizeof keys[i], "t%d", i);
        fill(data[i], 10 + (size_t)i, (unsigned)i);
        storage_put_args_init(&args[i]);
        args[i].key = cstr(keys[i]);
        args[i].data = (ctl_str){(const char *)data[i], 10 + (size_t)i};
    }
    int64_t t0 = tu_now_ms();
    int failed = storage_put_many(f->client, addrs, args, TARGETS, BATCH_MS, out);
    int64_t took = tu_now_ms() - t0;
    printf("call_many: mixed batch of %d ended after %lld ms (deadline %d ms)\n",
           TARGETS, (long long)took, BATCH_MS);
    assert_int_equal(failed, 4);
    assert_true(took >= BATCH_MS - 5);
    assert_true(took <= BATCH_MS + SLACK_MS);
    for (int i = 0; i < TARGETS; i++) {
        if (ok[i]) {
            if (out[i].error.kind != CTL_OK)
                fail_msg("target %d: %s", i, out[i].error.msg);
            assert_int_equal(out[i].result, 10 + i);
        } else {
            /* Frozen units time out; killed ones refuse the connection. */
            bool killed = i == 2 || i == 5;
            assert_int_equal(out[i].error.kind, CTL_TRANSFER);
            assert_int_equal(out[i].error.cause,
                             killed ? CTL_CAUSE_REFUSED : CTL_CAUSE_TIMEOUT);
            assert_non_null(strstr(out[i].error.msg, addrs[i]));
            assert_non_null(strstr(out[i].error.msg, "nothing was sent"));
        }
    }
    storage_put_outcomes_fini(out, TARGETS);

    /* All fine: the batch ends when the last reply is in. */
    const char *fine[3] = {f->units[0].endpoint, f->units[1].endpoint,
                           f->units[0].endpoint};
    t0 = tu_now_ms();
    failed = storage_put_many(f->client, fine, args, 3, 4 * OK_MS, out);
    took = tu_now_ms() - t0;
    assert_int_equal(failed, 0);
    for (int i = 0; i < 3; i++)
        assert_int_equal(out[i].result, 10 + i);
    storage_put_outcomes_fini(out, 3);
    printf("call_many: all-fine batch ended after %lld ms (deadline %d ms)\n",
           (long long)took, 4 * OK_MS);
    assert_true(took < OK_MS);

    /* The frozen units resume; a new batch gets its own replies. */
    assert_int_equal(up_thaw(&f->units[2]), 0);
    assert_int_equal(up_thaw(&f->units[3]), 0);
    const char *four[4] = {f->units[0].endpoint, f->units[2].endpoint,
                           f->units[1].endpoint, f->units[3].endpoint};
    ctl_client_stats cs;
    storage_put_args again[4];
    for (int i = 0; i < 4; i++) {
        again[i] = args[i];
        again[i].data.len = 20 + (size_t)i;
    }
    failed = storage_put_many(f->client, four, again, 4, OK_MS, out);
    assert_int_equal(failed, 0);
    for (int i = 0; i < 4; i++)
        assert_int_equal(out[i].result, 20 + i);
    storage_put_outcomes_fini(out, 4);
    ctl_client_stats_get(f->client, &cs);
    /* The first batch's requests to the frozen units found no connection up
     * (a frozen unit completes no handshake) and were never sent: nothing
     * late can come of them. */
    assert_int_equal(cs.late_replies, 0);
}

/* The kernel's cap on any listen backlog (net.core.somaxconn), 0 if
 * unknown. */
static long somaxconn(void)
{
    long v = 0;
    FILE *f = fopen("/proc/sys/net/core/somaxconn", "r");
    if (f) {
        if (fscanf(f, "%ld", &v) != 1)
            v = 0;
        fclose(f);
    }
    return v;
}

static void test_backlog(void **state)
{
    enum { N = 300 };
    fx *f = *state;
    int fds[N], connected = 0;
    if (somaxconn() < N) {
        printf("skipped: net.core.somaxconn is %ld, under %d\n", somaxconn(), N);
        skip();
    }
    start_unit(f, 0, NULL);
    const char *colon = strrchr(f->units[0].endpoint, ':');
    assert_non_null(colon);
    struct sockaddr_in sa = {.sin_family = AF_INET,
                             .sin_port = htons((uint16_t)atoi(colon + 1))};
    sa.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    /* Frozen, the unit accepts nothing: only the kernel's accept queue
     * (the listen backlog) takes connections, the rest stay in SYN_SENT
     * until a retransmission a second later. */
    assert_int_equal(up_freeze(&f->units[0]), 0);
    for (int i = 0; i < N; i++) {
        fds[i] = socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
        assert_true(fds[i] >= 0);
        int rc = connect(fds[i], (struct sockaddr *)&sa, sizeof sa);
        assert_true(rc == 0 || errno == EINPROGRESS);
    }
    int64_t deadline = tu_now_ms() + 700; /* under the first SYN retry */
    for (int i = 0; i < N; i++) {
        struct pollfd p = {fds[i], POLLOUT, 0};
        int64_t left = deadline - tu_now_ms();
        int err = 0;
        socklen_t len = sizeof err;
        if (poll(&p, 1, left > 0 ? (int)left : 0) == 1 &&
            getsockopt(fds[i], SOL_SOCKET, SO_ERROR, &err, &len) == 0 && err == 0)
            connected++;
    }
    for (int i = 0; i < N; i++)
        close(fds[i]);
    assert_int_equal(up_thaw(&f->units[0]), 0);
    printf("%d of %d connections completed against a frozen unit\n", connected, N);
    assert_int_equal(connected, N);
}

int main(int argc, char **argv)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup_teardown(test_kill_restart, setup, teardown),
        cmocka_unit_test_setup_teardown(test_fd_leak, setup, teardown),
        cmocka_unit_test_setup_teardown(test_freeze_late, setup, teardown),
        cmocka_unit_test_setup_teardown(test_freeze_expired, setup, teardown),
        cmocka_unit_test_setup_teardown(test_call_many, setup, teardown),
        cmocka_unit_test_setup_teardown(test_backlog, setup, teardown),
    };
    if (argc > 1)
        cmocka_set_test_filter(argv[1]);
    return cmocka_run_group_tests(tests, NULL, NULL);
}
