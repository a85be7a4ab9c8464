/*
 * test_client_churn.c - one long-lived client through many unit restarts.
 *
 * Units restart all the time in a fleet, each time on a new port. The
 * client must keep working and keep nothing of the units that went: its
 * open files, its sockets and its memory stay flat however many restarts
 * it lives through. Three units are live at any time; each round stops
 * the oldest, starts a new one (a fresh ephemeral port), and calls every
 * live unit, blocking and asynchronously: every call must succeed. The
 * process's open files and RSS and the client's open sockets are sampled
 * every 50 rounds and must stay within a fixed bound of the first sample
 * taken after warming up (docs/RELIABILITY.md, "Churn: a client through
 * thousands of unit restarts", states the bounds; docs/OPERATIONS.md, "A
 * long-lived client", what a client costs per unit it calls).
 *
 * CTLRPC_CHURN_RESTARTS sets the number of restarts (default 600, the
 * form CI runs; docs/RELIABILITY.md gives the long form of 5,000), as it
 * does for the Python client's churn test (tests/python/test_churn.py).
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>

#include <dirent.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "testutil.h"

#define LIVE 3
#define CALL_MS 10000
#define SAMPLE_EVERY 50
#define WARMUP 100
/* The bounds over the first sample after warming up (docs/OPERATIONS.md). */
#define FD_SLACK 32
#define SOCKET_BOUND 64
#define RSS_SLACK (16u << 20)
#define ROUND_MS 20
#define SETTLE_MS 10000

/* Under AddressSanitizer or ThreadSanitizer their own memory (shadow,
 * quarantine, history) makes RSS say little: reported, not judged. */
#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__)
#define SANITIZED 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer) || __has_feature(thread_sanitizer)
#define SANITIZED 1
#endif
#endif
#ifndef SANITIZED
#define SANITIZED 0
#endif

static int count_fds(void)
{
    DIR *d = opendir("/proc/self/fd");
    int n = 0;
    if (!d)
        return -1;
    while (readdir(d))
        n++;
    closedir(d);
    return n - 2;
}

/* The open files once they are at most `bound`, or after SETTLE_MS. A
 * socket closed by the client or a unit keeps its descriptors until libzmq's
 * reaper thread has torn it down, which on a loaded machine lags the close:
 * a leak stays over the bound, a lag comes back under it. */
static int settled_fds(int bound)
{
    int64_t until = tu_now_ms() + SETTLE_MS;
    int fds = count_fds();
    while (fds > bound && tu_now_ms() < until) {
        tu_sleep_ms(20);
        fds = count_fds();
    }
    return fds;
}

static uint64_t open_sockets(ctl_client *c)
{
    ctl_client_stats st;
    ctl_client_stats_get(c, &st);
    return st.sockets_opened - st.sockets_closed;
}

typedef struct done_count {
    atomic_int n;
    atomic_int failed;
} done_count;

static void on_done(void *user, const ctl_error *err, ctl_reply *reply)
{
    done_count *d = user;
    (void)reply;
    if (err->kind != CTL_OK) {
        fprintf(stderr, "async call failed: %s\n", err->msg ? err->msg : "?");
        atomic_fetch_add(&d->failed, 1);
    }
    atomic_fetch_add(&d->n, 1);
}

static void test_churn(void **state)
{
    (void)state;
    const char *env = getenv("CTLRPC_CHURN_RESTARTS");
    int restarts = env ? atoi(env) : 600;
    /* Enough for a sample in each half, which the flatness check compares
     * (samples from WARMUP on, one every SAMPLE_EVERY). */
    if (restarts < 2 * WARMUP + SAMPLE_EVERY)
        restarts = 2 * WARMUP + SAMPLE_EVERY;
    ctl_client_options o;
    ctl_client_options_init(&o);
    o.callbacks_on_io_thread = 1;
    ctl_client *c = NULL;
    ctl_error err;
    ctl_error_init(&err);
    assert_int_equal(ctl_client_new(&o, &c, &err), 0);
    tu_unit *units = calloc(LIVE, sizeof *units);
    for (int i = 0; i < LIVE; i++)
        assert_int_equal(tu_unit_start(&units[i], NULL, &err), 0);
    int pre_fds = count_fds();
    int base_fds = -1, max_fds = 0, max_first = 0, max_second = 0;
    size_t base_rss = 0, max_rss = 0;
    uint64_t max_sockets = 0;
    int calls = 0;
    for (int r = 0; r < restarts; r++) {
        int64_t round_start = tu_now_ms();
        int k = r % LIVE;
        tu_unit_stop(&units[k]);
        assert_int_equal(tu_unit_start(&units[k], NULL, &err), 0);
        done_count d = {0};
        for (int i = 0; i < LIVE; i++) {
            ctl_reply *reply = NULL;
            int rc = ctl_client_call(c, units[i].endpoint, "notes", NULL, 0, CALL_MS, &reply,
                                     &err);
            if (rc != 0)
                fail_msg("restart %d: call to %s: %s", r, units[i].endpoint, err.msg);
            ctl_reply_destroy(&reply);
            assert_int_equal(ctl_client_call_start(c, units[i].endpoint, "notes", NULL, 0,
                                                   CALL_MS, on_done, &d, NULL, &err),
                             0);
            calls += 2;
        }
        int64_t until = tu_now_ms() + CALL_MS;
        while (atomic_load(&d.n) < LIVE && tu_now_ms() < until)
            tu_sleep_ms(1);
        assert_int_equal(atomic_load(&d.n), LIVE);
        assert_int_equal(atomic_load(&d.failed), 0);
        if (r >= WARMUP && (r - WARMUP) % SAMPLE_EVERY == 0) {
            int fds = r < restarts / 2 ? count_fds() : settled_fds(max_first + FD_SLACK);
            size_t rss = tu_rss_bytes();
            uint64_t socks = open_sockets(c);
            if (base_fds < 0) {
                base_fds = fds;
                base_rss = rss;
            }
            if (fds > max_fds)
                max_fds = fds;
            if (r < restarts / 2 && fds > max_first)
                max_first = fds;
            if (r >= restarts / 2 && fds > max_second)
                max_second = fds;
            if (rss > max_rss)
                max_rss = rss;
            if (socks > max_sockets)
                max_sockets = socks;
            fprintf(stderr, "churn: restart %d: %d open files, %zu KiB RSS, %llu sockets\n", r,
                    fds, rss >> 10, (unsigned long long)socks);
        }
        /* At most one restart every ROUND_MS: a fierce churn, yet one a
         * fleet could see. */
        int64_t spent = tu_now_ms() - round_start;
        if (spent < ROUND_MS)
            tu_sleep_ms((int)(ROUND_MS - spent));
    }
    fprintf(stderr,
            "churn: %d restarts, %d calls, all answered; open files %d..%d, RSS %zu..%zu KiB, "
            "at most %llu client sockets\n",
            restarts, calls, base_fds, max_fds, base_rss >> 10, max_rss >> 10,
            (unsigned long long)max_sockets);
    /* Bounded, and flat: the second half holds no more than the first. */
    assert_true(max_fds <= pre_fds + 4 * SOCKET_BOUND);
    assert_true(max_second <= max_first + FD_SLACK);
    assert_true(max_sockets <= SOCKET_BOUND);
    assert_true(SANITIZED || max_rss <= base_rss + RSS_SLACK);
    for (int i = 0; i < LIVE; i++)
        tu_unit_stop(&units[i]);
    /* Idle sockets of units that went are closed by the client itself,
     * without calls: wait for the count to drop to nothing. */
    int64_t until = tu_now_ms() + 5000;
    while (open_sockets(c) > 0 && tu_now_ms() < until)
        tu_sleep_ms(20);
    assert_int_equal(open_sockets(c), 0);
    free(units);
    ctl_client_destroy(&c);
    ctl_error_fini(&err);
}

/* A quiet client closes idle sockets after idle_timeout_ms, and retired
 * ones after their grace period, with no call to drive it. */
static void test_idle_and_retired_closed_when_quiet(void **state)
{
    (void)state;
    tu_unit u;
    ctl_error err;
    ctl_error_init(&err);
    assert_int_equal(tu_unit_start(&u, NULL, &err), 0);
    ctl_client_options o;
    ctl_client_options_init(&o);
    o.idle_timeout_ms = 300;
    o.late_grace_ms = 300;
    ctl_client *c = NULL;
    assert_int_equal(ctl_client_new(&o, &c, &err), 0);
    ctl_reply *reply = NULL;
    assert_int_equal(ctl_client_call(c, u.endpoint, "notes", NULL, 0, CALL_MS, &reply, &err), 0);
    ctl_reply_destroy(&reply);
    assert_int_equal(open_sockets(c), 1);
    int64_t t0 = tu_now_ms();
    while (open_sockets(c) > 0 && tu_now_ms() - t0 < 5000)
        tu_sleep_ms(20);
    assert_int_equal(open_sockets(c), 0); /* idle, closed */
    assert_true(tu_now_ms() - t0 >= 250);
    /* A timed-out call retires its socket. */
    tu_buf b;
    tu_buf_init(&b);
    msgpack_pack_map(&b.pk, 1);
    tu_pk_str(&b.pk, "ms");
    msgpack_pack_int(&b.pk, 400);
    assert_int_equal(ctl_client_call(c, u.endpoint, "sleep", b.sb.data, b.sb.size, 50, &reply,
                                     &err),
                     CTL_TRANSFER);
    tu_buf_fini(&b);
    ctl_client_stats st;
    ctl_client_stats_get(c, &st);
    assert_int_equal(st.sockets_retired, 1);
    assert_int_equal(open_sockets(c), 1);
    t0 = tu_now_ms();
    while (open_sockets(c) > 0 && tu_now_ms() - t0 < 5000)
        tu_sleep_ms(20);
    assert_int_equal(open_sockets(c), 0);
    /* The unit is still there: the next call dials afresh. */
    assert_int_equal(ctl_client_call(c, u.endpoint, "notes", NULL, 0, CALL_MS, &reply, &err), 0);
    ctl_reply_destroy(&reply);
    ctl_client_destroy(&c);
    tu_unit_stop(&u);
    ctl_error_fini(&err);
}

/* An idle socket whose unit goes away is closed by the upkeep alone (its
 * monitor saw the drop), long before idle_timeout_ms, and the sockets of
 * the units still there stay pooled. The upkeep reads only the monitors
 * whose descriptors say an event waits: this is what says they do. */
static void test_idle_socket_closed_when_its_unit_goes(void **state)
{
    (void)state;
    enum { UNITS = 3 };
    tu_unit u[UNITS];
    ctl_error err;
    ctl_error_init(&err);
    for (int i = 0; i < UNITS; i++)
        assert_int_equal(tu_unit_start(&u[i], NULL, &err), 0);
    ctl_client_options o;
    ctl_client_options_init(&o);
    o.idle_timeout_ms = 600000;
    ctl_client *c = NULL;
    assert_int_equal(ctl_client_new(&o, &c, &err), 0);
    for (int round = 0; round < 2; round++)
        for (int i = 0; i < UNITS; i++) {
            ctl_reply *reply = NULL;
            assert_int_equal(
                ctl_client_call(c, u[i].endpoint, "notes", NULL, 0, CALL_MS, &reply, &err), 0);
            ctl_reply_destroy(&reply);
        }
    assert_int_equal(open_sockets(c), UNITS);
    /* Several upkeep passes with nothing to read. */
    tu_sleep_ms(600);
    assert_int_equal(open_sockets(c), UNITS);
    tu_unit_stop(&u[1]);
    int64_t t0 = tu_now_ms();
    while (open_sockets(c) > UNITS - 1 && tu_now_ms() - t0 < 10000)
        tu_sleep_ms(20);
    assert_int_equal(open_sockets(c), UNITS - 1);
    ctl_client_stats st;
    ctl_client_stats_get(c, &st);
    assert_int_equal(st.sockets_closed, 1);
    /* The others are still pooled: their next calls reuse them. */
    for (int i = 0; i < UNITS; i += 2) {
        ctl_reply *reply = NULL;
        assert_int_equal(
            ctl_client_call(c, u[i].endpoint, "notes", NULL, 0, CALL_MS, &reply, &err), 0);
        ctl_reply_destroy(&reply);
    }
    ctl_client_stats_get(c, &st);
    assert_int_equal(st.sockets_opened, UNITS);
    ctl_client_destroy(&c);
    tu_unit_stop(&u[0]);
    tu_unit_stop(&u[2]);
    ctl_error_fini(&err);
}

/* 64 calls in flight to one unit keep their 64 sockets pooled (more than
 * max_idle_per_address) instead of closing and redialing them. */
static void test_burst_keeps_its_sockets(void **state)
{
    (void)state;
    tu_unit u;
    ctl_error err;
    ctl_error_init(&err);
    assert_int_equal(tu_unit_start(&u, NULL, &err), 0);
    ctl_client *c = NULL;
    assert_int_equal(ctl_client_new(NULL, &c, &err), 0);
    for (int round = 0; round < 5; round++) {
        done_count d = {0};
        for (int i = 0; i < 64; i++)
            assert_int_equal(ctl_client_call_start(c, u.endpoint, "notes", NULL, 0, CALL_MS,
                                                   on_done, &d, NULL, &err),
                             0);
        int64_t until = tu_now_ms() + CALL_MS;
        while (atomic_load(&d.n) < 64 && tu_now_ms() < until)
            ctl_client_process(c, 0), tu_sleep_ms(1);
        assert_int_equal(atomic_load(&d.n), 64);
        assert_int_equal(atomic_load(&d.failed), 0);
    }
    ctl_client_stats st;
    ctl_client_stats_get(c, &st);
    /* The first burst dials up to 64; later ones reuse them. */
    assert_true(st.sockets_opened <= 64 + 8);
    ctl_client_destroy(&c);
    tu_unit_stop(&u);
    ctl_error_fini(&err);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_idle_and_retired_closed_when_quiet),
        cmocka_unit_test(test_idle_socket_closed_when_its_unit_goes),
        cmocka_unit_test(test_burst_keeps_its_sockets),
        cmocka_unit_test(test_churn),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
