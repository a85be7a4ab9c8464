/*
 * test_client.c - call, notify and call_many against real units on
 * 127.0.0.1, and against a scripted fake unit (a raw ROUTER) for the replies
 * a healthy unit never sends: another request's id, garbage, unknown error
 * kinds, malformed error maps, late replies (client.h, pool).
 *
 * Timing assertions leave wide margins (hundreds of ms) so a loaded 2-core
 * machine under ASan does not flake them; they still fail when a deadline
 * is ignored altogether.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>

#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <zmq.h>

#include "testutil.h"

#define CALL_MS 10000  /* deadline for calls that must succeed */
#define LATE_GRACE_MS 3000

typedef struct fx {
    tu_unit unit;
    ctl_client *client;
    ctl_error err;
    tu_buf args;
    ctl_reply *reply;
    tu_fake *fake;
    char fake_addr[CTL_ENDPOINT_MAX]; /* kept after the fake is stopped */
    tu_unit extra[4];
    int n_extra;
} fx;

static int setup(void **state)
{
    fx *f = calloc(1, sizeof *f);
    ctl_client_options o;
    if (f == NULL)
        return -1;
    ctl_error_init(&f->err);
    tu_buf_init(&f->args);
    if (tu_unit_start(&f->unit, NULL, &f->err) != 0) {
        fprintf(stderr, "unit start failed: %s\n", f->err.msg ? f->err.msg : "?");
        return -1;
    }
    ctl_client_options_init(&o);
    o.late_grace_ms = LATE_GRACE_MS;
    if (ctl_client_new(&o, &f->client, &f->err) != 0) {
        fprintf(stderr, "client_new failed: %s\n", f->err.msg ? f->err.msg : "?");
        return -1;
    }
    *state = f;
    return 0;
}

static int teardown(void **state)
{
    fx *f = *state;
    ctl_reply_destroy(&f->reply);
    ctl_client_destroy(&f->client);
    tu_fake_stop(&f->fake);
    for (int i = 0; i < f->n_extra; i++)
        tu_unit_stop(&f->extra[i]);
    tu_unit_stop(&f->unit);
    tu_buf_fini(&f->args);
    ctl_error_fini(&f->err);
    free(f);
    return 0;
}

static const char *start_extra(fx *f)
{
    tu_unit *u = &f->extra[f->n_extra];
    assert_true(f->n_extra < 4);
    assert_int_equal(tu_unit_start(u, NULL, &f->err), 0);
    f->n_extra++;
    return u->endpoint;
}

static void assert_msg_names(const ctl_error *e, const char *address, const char *op)
{
    assert_non_null(e->msg);
    if (strstr(e->msg, address) == NULL)
        fail_msg("message does not name the address %s: \"%s\"", address, e->msg);
    if (strstr(e->msg, op) == NULL)
        fail_msg("message does not name the op %s: \"%s\"", op, e->msg);
}

/* Call with the packed args in f->args; the reply lands in f->reply. */
static int call(fx *f, const char *address, const char *op, int timeout_ms)
{
    ctl_reply_destroy(&f->reply);
    int rc = ctl_client_call(f->client, address, op, f->args.sb.data, f->args.sb.size,
                             timeout_ms, &f->reply, &f->err);
    if (rc == 0) {
        assert_non_null(f->reply);
        assert_int_equal(f->err.kind, CTL_OK);
    } else {
        assert_null(f->reply);
        assert_int_equal(f->err.kind, rc);
    }
    return rc;
}

static void args_ms(fx *f, int ms)
{
    tu_buf_reset(&f->args);
    msgpack_pack_map(&f->args.pk, 1);
    tu_pk_str(&f->args.pk, "ms");
    msgpack_pack_int(&f->args.pk, ms);
}

static void args_tag(tu_buf *b, const char *tag)
{
    tu_buf_reset(b);
    msgpack_pack_map(&b->pk, 2);
    tu_pk_str(&b->pk, "tag");
    tu_pk_str(&b->pk, tag);
    tu_pk_str(&b->pk, "n");
    msgpack_pack_int(&b->pk, (int)strlen(tag));
}

/* ---- call: success ----------------------------------------------------------- */

static void test_call_echo(void **state)
{
    fx *f = *state;
    msgpack_pack_map(&f->args.pk, 3);
    tu_pk_str(&f->args.pk, "s");
    tu_pk_strn(&f->args.pk, "a\0b", 3);
    tu_pk_str(&f->args.pk, "bin");
    msgpack_pack_bin(&f->args.pk, 2);
    msgpack_pack_bin_body(&f->args.pk, "\x00\xff", 2);
    tu_pk_str(&f->args.pk, "list");
    msgpack_pack_array(&f->args.pk, 2);
    msgpack_pack_int(&f->args.pk, -1);
    msgpack_pack_double(&f->args.pk, 2.5);
    assert_int_equal(call(f, f->unit.endpoint, "echo", CALL_MS), 0);
    const msgpack_object *r = ctl_reply_result(f->reply);
    assert_non_null(r);
    assert_true(tu_obj_packs_to(r, f->args.sb.data, f->args.sb.size));
    assert_true(ctl_reply_id(f->reply).len > 0);
}

static void test_call_null_args_is_empty_map(void **state)
{
    fx *f = *state;
    assert_int_equal(ctl_client_call(f->client, f->unit.endpoint, "echo", NULL, 0,
                                     CALL_MS, &f->reply, &f->err),
                     0);
    const msgpack_object *r = ctl_reply_result(f->reply);
    assert_int_equal(r->type, MSGPACK_OBJECT_MAP);
    assert_int_equal(r->via.map.size, 0);
}

static void test_call_reply_id_is_the_request_id(void **state)
{
    fx *f = *state;
    assert_int_equal(call(f, f->unit.endpoint, "whoami", CALL_MS), 0);
    const msgpack_object *r = ctl_reply_result(f->reply);
    ctl_str id = ctl_reply_id(f->reply);
    assert_int_equal(r->type, MSGPACK_OBJECT_ARRAY);
    assert_true(tu_obj_is_str(&r->via.array.ptr[0], "whoami"));
    assert_int_equal(r->via.array.ptr[1].via.str.size, id.len);
    assert_memory_equal(r->via.array.ptr[1].via.str.ptr, id.ptr, id.len);
    assert_true(id.len > 0);
}

static void test_call_nil_result(void **state)
{
    fx *f = *state;
    assert_int_equal(call(f, f->unit.endpoint, "nothing", CALL_MS), 0);
    assert_int_equal(ctl_reply_result(f->reply)->type, MSGPACK_OBJECT_NIL);
}

static void test_call_big_payload(void **state)
{
    fx *f = *state;
    size_t n = 4u << 20;
    unsigned char *blob = malloc(n);
    for (size_t i = 0; i < n; i++)
        blob[i] = (unsigned char)(i * 131 + (i >> 12));
    msgpack_pack_map(&f->args.pk, 2);
    tu_pk_str(&f->args.pk, "field");
    tu_pk_str(&f->args.pk, "data");
    tu_pk_str(&f->args.pk, "data");
    msgpack_pack_bin(&f->args.pk, n);
    msgpack_pack_bin_body(&f->args.pk, blob, n);
    int rc = call(f, f->unit.endpoint, "echo", CALL_MS);
    if (rc != 0) {
        free(blob);
        fail_msg("4 MiB echo failed: %s", f->err.msg);
    }
    const msgpack_object *r = ctl_reply_result(f->reply);
    int same = r->type == MSGPACK_OBJECT_BIN && r->via.bin.size == n &&
               memcmp(r->via.bin.ptr, blob, n) == 0;
    free(blob);
    assert_true(same);
}

static void test_reply_alloc_lives_with_reply(void **state)
{
    fx *f = *state;
    assert_int_equal(call(f, f->unit.endpoint, "echo", CALL_MS), 0);
    char *p[8];
    for (int i = 0; i < 8; i++) {
        size_t n = (size_t)1 << (i * 2);
        p[i] = ctl_reply_alloc(f->reply, n + (size_t)i);
        assert_non_null(p[i]);
        assert_int_equal((uintptr_t)p[i] % _Alignof(max_align_t), 0);
        memset(p[i], 'a' + i, n + (size_t)i);
    }
    for (int i = 0; i < 8; i++)
        assert_int_equal(p[i][0], 'a' + i);
    /* The result is untouched by allocations next to it. */
    assert_int_equal(ctl_reply_result(f->reply)->type, MSGPACK_OBJECT_MAP);
    ctl_reply_destroy(&f->reply); /* frees them (LSan checks) */
}

static void test_pool_reuses_one_socket(void **state)
{
    fx *f = *state;
    ctl_client_stats st;
    for (int i = 0; i < 5; i++)
        assert_int_equal(call(f, f->unit.endpoint, "echo", CALL_MS), 0);
    ctl_client_stats_get(f->client, &st);
    assert_int_equal(st.calls, 5);
    assert_int_equal(st.sockets_opened, 1);
    assert_int_equal(st.sockets_retired, 0);
    assert_int_equal(st.timeouts, 0);
    assert_int_equal(st.late_replies, 0);
    assert_int_equal(st.notifies, 0);
}

/* ---- call: every error kind rebuilt ------------------------------------------------ */

static void args_fail(fx *f, const char *kind)
{
    tu_buf_reset(&f->args);
    msgpack_pack_map(&f->args.pk, 3);
    tu_pk_str(&f->args.pk, "kind");
    tu_pk_str(&f->args.pk, kind);
    tu_pk_str(&f->args.pk, "reason");
    tu_pk_str(&f->args.pk, "pinned");
    tu_pk_str(&f->args.pk, "blobs");
    msgpack_pack_array(&f->args.pk, 3);
    tu_pk_str(&f->args.pk, "blob-a");
    tu_pk_strn(&f->args.pk, "blob\0b", 6);
    tu_pk_str(&f->args.pk, "blob-c");
}

static void test_call_unit_full(void **state)
{
    fx *f = *state;
    args_fail(f, "UnitFull");
    assert_int_equal(call(f, f->unit.endpoint, "fail", CALL_MS), CTL_UNIT_FULL);
    assert_int_equal(f->err.cause, CTL_CAUSE_NONE);
    assert_null(f->err.reason);
    assert_int_equal(f->err.blob_count, 0);
    assert_msg_names(&f->err, f->unit.endpoint, "fail");
    assert_non_null(strstr(f->err.msg, TU_MSG_MARK));
}

static void test_call_busy_with_reason(void **state)
{
    fx *f = *state;
    args_fail(f, "Busy");
    assert_int_equal(call(f, f->unit.endpoint, "fail", CALL_MS), CTL_BUSY);
    assert_non_null(f->err.reason);
    assert_string_equal(f->err.reason, "pinned");
    assert_int_equal(f->err.blob_count, 0);
    assert_msg_names(&f->err, f->unit.endpoint, "fail");
}

static void test_call_missing_with_blobs(void **state)
{
    fx *f = *state;
    args_fail(f, "Missing");
    assert_int_equal(call(f, f->unit.endpoint, "fail", CALL_MS), CTL_MISSING);
    assert_int_equal(f->err.blob_count, 3);
    assert_int_equal(f->err.blobs[0].len, 6);
    assert_memory_equal(f->err.blobs[0].ptr, "blob-a", 6);
    assert_int_equal(f->err.blobs[1].len, 6);
    assert_memory_equal(f->err.blobs[1].ptr, "blob\0b", 6);
    assert_int_equal(f->err.blobs[2].len, 6);
    assert_memory_equal(f->err.blobs[2].ptr, "blob-c", 6);
    assert_null(f->err.reason);
    assert_msg_names(&f->err, f->unit.endpoint, "fail");
}

static void test_call_remote_protocol_is_transfer(void **state)
{
    fx *f = *state;
    args_fail(f, "Protocol");
    assert_int_equal(call(f, f->unit.endpoint, "fail", CALL_MS), CTL_TRANSFER);
    assert_int_equal(f->err.cause, CTL_CAUSE_REMOTE);
    assert_non_null(f->err.remote_kind);
    assert_string_equal(f->err.remote_kind, "Protocol");
    assert_msg_names(&f->err, f->unit.endpoint, "fail");
    assert_non_null(strstr(f->err.msg, TU_MSG_MARK));
    /* A remote error is a complete reply: the socket stays in the pool. */
    ctl_client_stats st;
    ctl_client_stats_get(f->client, &st);
    assert_int_equal(st.sockets_retired, 0);
}

static void test_call_unknown_op(void **state)
{
    fx *f = *state;
    assert_int_equal(call(f, f->unit.endpoint, "frobnicate", CALL_MS), CTL_TRANSFER);
    assert_int_equal(f->err.cause, CTL_CAUSE_REMOTE);
    assert_string_equal(f->err.remote_kind, "Protocol");
    assert_msg_names(&f->err, f->unit.endpoint, "frobnicate");
}

static void test_call_args_not_a_map(void **state)
{
    fx *f = *state;
    /* Refused up front (Invalid) or by the unit (remote Protocol); never
     * a success, never a hang. */
    static const unsigned char notmap[] = {0x92, 0x01, 0x02};
    int rc = ctl_client_call(f->client, f->unit.endpoint, "echo", notmap, sizeof notmap,
                             CALL_MS, &f->reply, &f->err);
    assert_null(f->reply);
    if (rc == CTL_TRANSFER)
        assert_int_equal(f->err.cause, CTL_CAUSE_REMOTE);
    else
        assert_int_equal(rc, CTL_INVALID);
    assert_int_equal(atomic_load(&f->unit.calls), 0);
}

static void test_call_reply_over_client_limits(void **state)
{
    fx *f = *state;
    ctl_client_options o;
    ctl_client *c = NULL;
    ctl_client_options_init(&o);
    o.limits.max_depth = 4;
    assert_int_equal(ctl_client_new(&o, &c, &f->err), 0);
    /* The unit (default depth 32) echoes 6 levels; the client takes 4. */
    msgpack_pack_map(&f->args.pk, 1);
    tu_pk_str(&f->args.pk, "x");
    msgpack_pack_array(&f->args.pk, 1);
    msgpack_pack_array(&f->args.pk, 1);
    msgpack_pack_array(&f->args.pk, 1);
    msgpack_pack_array(&f->args.pk, 0);
    int rc = ctl_client_call(c, f->unit.endpoint, "echo", f->args.sb.data,
                             f->args.sb.size, CALL_MS, &f->reply, &f->err);
    ctl_client_destroy(&c);
    assert_null(c);
    assert_int_equal(rc, CTL_TRANSFER);
    assert_int_equal(f->err.cause, CTL_CAUSE_BAD_REPLY);
    assert_null(f->reply);
}

/* ---- timeouts and late replies ------------------------------------------------------ */

/* A fake unit that takes requests and never answers. */
static void fake_silent(tu_fake *fk, const tu_fake_req *req, void *user)
{
    (void)fk;
    (void)req;
    (void)user;
}

static const char *start_silent(fx *f)
{
    assert_int_equal(tu_fake_start(&f->fake, fake_silent, NULL), 0);
    snprintf(f->fake_addr, sizeof f->fake_addr, "%s", tu_fake_endpoint(f->fake));
    return f->fake_addr;
}

static void test_timeout_to_silent_unit(void **state)
{
    fx *f = *state;
    const char *silent = start_silent(f);
    int64_t t0 = tu_now_ms();
    assert_int_equal(call(f, silent, "echo", 300), CTL_TRANSFER);
    int64_t took = tu_now_ms() - t0;
    assert_int_equal(f->err.cause, CTL_CAUSE_TIMEOUT);
    assert_msg_names(&f->err, silent, "echo");
    if (took < 250 || took > 1300)
        fail_msg("300 ms deadline took %lld ms", (long long)took);
    ctl_client_stats st;
    ctl_client_stats_get(f->client, &st);
    assert_int_equal(st.timeouts, 1);
}

static void test_default_timeout_applies(void **state)
{
    fx *f = *state;
    ctl_client_options o;
    ctl_client *c = NULL;
    const char *silent = start_silent(f);
    ctl_client_options_init(&o);
    o.default_timeout_ms = 300;
    assert_int_equal(ctl_client_new(&o, &c, &f->err), 0);
    int64_t t0 = tu_now_ms();
    int rc = ctl_client_call(c, silent, "echo", NULL, 0, -1, &f->reply, &f->err);
    int64_t took = tu_now_ms() - t0;
    ctl_client_destroy(&c);
    assert_int_equal(rc, CTL_TRANSFER);
    assert_int_equal(f->err.cause, CTL_CAUSE_TIMEOUT);
    if (took < 250 || took > 1300)
        fail_msg("default 300 ms deadline took %lld ms", (long long)took);
}

/* A zero timeout leaves no time for a reply: nothing is sent, and the call
 * says so at once. A negative one is the client's default. */
static void test_timeout_zero_sends_nothing(void **state)
{
    fx *f = *state;
    const char *silent = start_silent(f);
    int64_t t0 = tu_now_ms();
    assert_int_equal(call(f, silent, "echo", 0), CTL_TRANSFER);
    assert_true(tu_now_ms() - t0 < 1000);
    assert_int_equal(f->err.cause, CTL_CAUSE_TIMEOUT);
    assert_msg_names(&f->err, silent, "echo");
    assert_non_null(strstr(f->err.msg, "nothing was sent"));

    ctl_target t[2] = {{silent, NULL, 0}, {f->unit.endpoint, NULL, 0}};
    ctl_outcome out[2];
    assert_int_equal(ctl_client_call_many(f->client, "echo", t, 2, 0, out), 2);
    assert_int_equal(out[0].error.cause, CTL_CAUSE_TIMEOUT);
    assert_int_equal(out[1].error.cause, CTL_CAUSE_TIMEOUT);
    ctl_outcomes_fini(out, 2);

    /* The unit and the fake saw nothing; no socket was opened. */
    tu_sleep_ms(100);
    assert_int_equal(tu_fake_seen(f->fake), 0);
    assert_int_equal(atomic_load(&f->unit.calls), 0);
    ctl_client_stats st;
    ctl_client_stats_get(f->client, &st);
    assert_int_equal(st.calls, 0);
    assert_int_equal(st.sockets_opened, 0);
    assert_int_equal(st.timeouts, 3);
    ctl_address_stats as;
    ctl_client_address_stats(f->client, silent, &as);
    assert_int_equal(as.calls, 0);
    assert_int_equal(as.timeouts, 2);
    assert_int_equal(as.errors[CTL_CAUSE_TIMEOUT], 2);

    /* A client whose default is 0 takes the library's default. */
    ctl_client_options o;
    ctl_client *c = NULL;
    ctl_client_options_init(&o);
    o.default_timeout_ms = 0;
    assert_int_equal(ctl_client_new(&o, &c, &f->err), 0);
    assert_int_equal(ctl_client_call(c, f->unit.endpoint, "echo", NULL, 0, -1,
                                     &f->reply, &f->err), 0);
    ctl_client_destroy(&c);
    o.default_timeout_ms = -5;
    assert_int_equal(ctl_client_new(&o, &c, &f->err), CTL_INVALID);
    assert_null(c);
}

/* ---- failures that end a call early ------------------------------------------------- */

#define LONG_MS 30000 /* a deadline the call must not wait for */
#define EARLY_MS 5000 /* "well before the deadline", generous for a loaded machine */

static void test_refused_fails_fast(void **state)
{
    fx *f = *state;
    char dead[64];
    tu_dead_address(dead, sizeof dead);
    int64_t t0 = tu_now_ms();
    assert_int_equal(call(f, dead, "put", LONG_MS), CTL_TRANSFER);
    int64_t took = tu_now_ms() - t0;
    printf("refused: failed after %lld ms\n", (long long)took);
    assert_int_equal(f->err.cause, CTL_CAUSE_REFUSED);
    assert_msg_names(&f->err, dead, "put");
    assert_non_null(strstr(f->err.msg, "connection refused"));
    if (took > EARLY_MS)
        fail_msg("a refused connection took %lld ms to fail", (long long)took);
    /* Sockets are ZMQ_IMMEDIATE: with no connection the request was never
     * queued, so it is not counted as sent, and the message says so. */
    assert_non_null(strstr(f->err.msg, "nothing was sent"));
    ctl_address_stats as;
    ctl_client_address_stats(f->client, dead, &as);
    assert_int_equal(as.calls, 0);
    assert_int_equal(as.errors[CTL_CAUSE_REFUSED], 1);
    assert_int_equal(as.timeouts, 0);
    assert_int_equal(as.retired, 1);
    ctl_client_stats st;
    ctl_client_stats_get(f->client, &st);
    assert_int_equal(st.timeouts, 0);
}

/* A call reported refused never reaches a handler, even when a unit comes
 * up on that address at once, within the retired socket's grace period
 * (blocking, asynchronous and notify alike). */
static void test_refused_never_runs_later(void **state)
{
    fx *f = *state;
    for (int path = 0; path < 3; path++) {
        char dead[64];
        tu_dead_address(dead, sizeof dead);
        ctl_error_clear(&f->err);
        if (path == 0) {
            assert_int_equal(call(f, dead, "note", LONG_MS), CTL_TRANSFER);
        } else if (path == 1) {
            ctl_call *c = NULL;
            assert_int_equal(ctl_client_call_start(f->client, dead, "note", NULL, 0, LONG_MS,
                                                   NULL, NULL, &c, &f->err),
                             0);
            assert_int_equal(ctl_call_wait(c, LONG_MS), 0);
            size_t n = 0;
            const ctl_outcome *o = ctl_call_outcomes(c, &n);
            ctl_error_copy(&f->err, &o[0].error);
            ctl_call_release(c);
        } else {
            assert_int_equal(ctl_client_notify(f->client, dead, "note", NULL, 0, &f->err),
                             CTL_TRANSFER);
        }
        assert_int_equal(f->err.cause, CTL_CAUSE_REFUSED);
        assert_non_null(strstr(f->err.msg, "nothing was sent"));
        /* A unit appears on that very address now. */
        tu_unit u;
        ctl_server_options so;
        ctl_server_options_init(&so);
        so.endpoint = dead;
        tu_dead_release(dead);
        assert_int_equal(tu_unit_start(&u, &so, &f->err), 0);
        /* Until the refused call's socket is gone (its grace period), call
         * the new unit: only these calls may reach it. */
        int mine = 0;
        ctl_address_stats as;
        int64_t until = tu_now_ms() + 10000;
        do {
            ctl_reply_destroy(&f->reply);
            assert_int_equal(call(f, dead, "notes", LONG_MS), 0);
            mine++;
            ctl_client_address_stats(f->client, dead, &as);
        } while (as.sockets > 1 && tu_now_ms() < until);
        assert_int_equal(as.sockets, 1);
        assert_int_equal(atomic_load(&u.notes), 0); /* the refused note never ran */
        assert_int_equal(atomic_load(&u.calls), mine);
        ctl_reply_destroy(&f->reply);
        tu_unit_stop(&u);
    }
}

static void test_unresolved_fails_fast(void **state)
{
    fx *f = *state;
    const char *addr = "tcp://nosuchhost.invalid:5999";
    int64_t t0 = tu_now_ms();
    assert_int_equal(call(f, addr, "get", LONG_MS), CTL_TRANSFER);
    int64_t took = tu_now_ms() - t0;
    printf("unresolved: failed after %lld ms: %s\n", (long long)took, f->err.msg);
    assert_int_equal(f->err.cause, CTL_CAUSE_UNRESOLVED);
    assert_msg_names(&f->err, addr, "get");
    assert_non_null(strstr(f->err.msg, "host 'nosuchhost.invalid' does not resolve"));
    if (took > EARLY_MS)
        fail_msg("an unresolvable host took %lld ms to fail", (long long)took);
    ctl_address_stats as;
    ctl_client_address_stats(f->client, addr, &as);
    assert_int_equal(as.errors[CTL_CAUSE_UNRESOLVED], 1);
}

/* A unit that is back is served again: the failure is not remembered. */
static void test_refused_then_listening(void **state)
{
    fx *f = *state;
    char dead[64];
    tu_dead_address(dead, sizeof dead);
    assert_int_equal(call(f, dead, "echo", LONG_MS), CTL_TRANSFER);
    assert_int_equal(f->err.cause, CTL_CAUSE_REFUSED);
    ctl_server_options so;
    ctl_server_options_init(&so);
    so.endpoint = dead;
    tu_dead_release(dead);
    tu_unit *u = &f->extra[f->n_extra];
    if (tu_unit_start(u, &so, &f->err) != 0)
        skip(); /* the port was taken meanwhile */
    f->n_extra++;
    assert_int_equal(call(f, dead, "echo", CALL_MS), 0);
}

static void test_call_many_refused_returns_early(void **state)
{
    fx *f = *state;
    enum { N = 4 };
    char dead[64];
    tu_dead_address(dead, sizeof dead);
    ctl_target t[N] = {{f->unit.endpoint, NULL, 0},
                       {dead, NULL, 0},
                       {start_extra(f), NULL, 0},
                       {f->unit.endpoint, NULL, 0}};
    ctl_outcome out[N];
    int64_t t0 = tu_now_ms();
    int failed = ctl_client_call_many(f->client, "echo", t, N, LONG_MS, out);
    int64_t took = tu_now_ms() - t0;
    printf("call_many with a refused target: ended after %lld ms\n", (long long)took);
    ctl_kind k[N];
    for (int i = 0; i < N; i++)
        k[i] = out[i].error.kind;
    ctl_cause cause = out[1].error.cause;
    bool named = out[1].error.msg && strstr(out[1].error.msg, dead);
    ctl_outcomes_fini(out, N);
    assert_int_equal(failed, 1);
    assert_int_equal(k[0], CTL_OK);
    assert_int_equal(k[2], CTL_OK);
    assert_int_equal(k[3], CTL_OK);
    assert_int_equal(k[1], CTL_TRANSFER);
    assert_int_equal(cause, CTL_CAUSE_REFUSED);
    assert_true(named);
    if (took > EARLY_MS)
        fail_msg("a batch with a refused target took %lld ms", (long long)took);
}

typedef struct log_lines {
    int n;
    char last[512];
} log_lines;

static void keep_log(void *user, const char *line)
{
    log_lines *l = user;
    l->n++;
    snprintf(l->last, sizeof l->last, "%s", line);
}

/* A client whose messages are limited to `max_msg_bytes`, its log lines
 * kept in *logged. */
static ctl_client *limited_client(fx *f, size_t max_msg_bytes, log_lines *logged)
{
    ctl_client_options o;
    ctl_client *c = NULL;
    ctl_client_options_init(&o);
    o.limits.max_msg_bytes = max_msg_bytes;
    o.log = keep_log;
    o.log_user = logged;
    assert_int_equal(ctl_client_new(&o, &c, &f->err), 0);
    return c;
}

/* Args {"data": 4096 bytes} in f->args: over a 1024-byte limit. */
static void pack_big_data(fx *f)
{
    static unsigned char big[4096];
    msgpack_pack_map(&f->args.pk, 1);
    tu_pk_str(&f->args.pk, "data");
    msgpack_pack_bin(&f->args.pk, sizeof big);
    msgpack_pack_bin_body(&f->args.pk, big, sizeof big);
}

static void test_oversize_request_not_sent(void **state)
{
    fx *f = *state;
    log_lines logged = {0, ""};
    ctl_client *c = limited_client(f, 1024, &logged);
    const char *silent = start_silent(f);
    pack_big_data(f);
    int rc = ctl_client_call(c, silent, "put", f->args.sb.data, f->args.sb.size,
                             LONG_MS, &f->reply, &f->err);
    assert_int_equal(rc, CTL_TRANSFER);
    assert_int_equal(f->err.cause, CTL_CAUSE_TOO_LARGE);
    assert_msg_names(&f->err, silent, "put");
    assert_non_null(strstr(f->err.msg, "limit of 1024 bytes"));
    assert_non_null(strstr(f->err.msg, "not sent"));
    rc = ctl_client_notify(c, silent, "note", f->args.sb.data, f->args.sb.size, &f->err);
    assert_int_equal(rc, CTL_TRANSFER);
    assert_int_equal(f->err.cause, CTL_CAUSE_TOO_LARGE);
    /* Logged once: a burst of them is limited to a line a second, the next
     * one saying how many were left out. */
    assert_int_equal(logged.n, 1);
    assert_non_null(strstr(logged.last, "limit of 1024 bytes"));
    int sent = 2;
    int64_t until = tu_now_ms() + 3000;
    while (logged.n < 2 && tu_now_ms() < until) {
        assert_int_equal(ctl_client_notify(c, silent, "note", f->args.sb.data,
                                           f->args.sb.size, &f->err),
                         CTL_TRANSFER);
        sent++;
        tu_sleep_ms(10);
    }
    assert_int_equal(logged.n, 2);
    assert_non_null(strstr(logged.last, "limit of 1024 bytes"));
    assert_non_null(strstr(logged.last, "more like this since the last such line"));
    ctl_address_stats as;
    ctl_client_address_stats(c, silent, &as);
    ctl_client_stats st;
    ctl_client_stats_get(c, &st);
    ctl_client_destroy(&c);
    tu_sleep_ms(100);
    assert_int_equal(tu_fake_seen(f->fake), 0);
    assert_int_equal(as.calls, 0);
    assert_int_equal(as.errors[CTL_CAUSE_TOO_LARGE], sent);
    assert_int_equal(st.sockets_opened, 0);
}

/* A fan-out lends each target an idle socket before it sends any: a
 * target refused after that (its request over the limit) gives its socket
 * back, and the next fan-out uses it again rather than dialing. */
static void test_oversize_target_returns_socket(void **state)
{
    fx *f = *state;
    log_lines logged = {0, ""};
    ctl_client *c = limited_client(f, 1024, &logged);
    assert_int_equal(ctl_client_call(c, f->unit.endpoint, "echo", NULL, 0, CALL_MS,
                                     &f->reply, &f->err), 0);
    ctl_reply_destroy(&f->reply);
    pack_big_data(f);
    ctl_target targets[2] = {
        {f->unit.endpoint, f->args.sb.data, f->args.sb.size},
        {f->unit.endpoint, NULL, 0},
    };
    for (int round = 0; round < 4; round++) {
        ctl_outcome out[2];
        assert_int_equal(ctl_client_call_many(c, "echo", targets, 2, CALL_MS, out), 1);
        assert_int_equal(out[0].error.kind, CTL_TRANSFER);
        assert_int_equal(out[0].error.cause, CTL_CAUSE_TOO_LARGE);
        assert_int_equal(out[1].error.kind, CTL_OK);
        ctl_outcomes_fini(out, 2);
    }
    ctl_client_stats st;
    ctl_client_stats_get(c, &st);
    ctl_address_stats as;
    ctl_client_address_stats(c, f->unit.endpoint, &as);
    ctl_client_destroy(&c);
    /* The one socket, lent to the first target, given back when it was
     * refused, and lent again to the second: never one dialed, none kept
     * from the pool. */
    assert_int_equal(st.sockets_opened, 1);
    assert_int_equal(as.sockets, 1);
    assert_int_equal(as.errors[CTL_CAUSE_TOO_LARGE], 4);
}

static void test_oversize_reply_dropped(void **state)
{
    fx *f = *state;
    log_lines logged = {0, ""};
    ctl_client *c = limited_client(f, 4096, &logged);
    /* A small call first: the connection is up and fine. */
    assert_int_equal(ctl_client_call(c, f->unit.endpoint, "echo", NULL, 0, CALL_MS,
                                     &f->reply, &f->err), 0);
    ctl_reply_destroy(&f->reply);
    msgpack_pack_map(&f->args.pk, 1);
    tu_pk_str(&f->args.pk, "n");
    msgpack_pack_int(&f->args.pk, 64 * 1024);
    int64_t t0 = tu_now_ms();
    int rc = ctl_client_call(c, f->unit.endpoint, "alloc", f->args.sb.data,
                             f->args.sb.size, LONG_MS, &f->reply, &f->err);
    int64_t took = tu_now_ms() - t0;
    printf("oversize reply: failed after %lld ms: %s\n", (long long)took,
           f->err.msg ? f->err.msg : "");
    ctl_address_stats as;
    ctl_client_address_stats(c, f->unit.endpoint, &as);
    ctl_client_destroy(&c);
    assert_int_equal(rc, CTL_TRANSFER);
    assert_int_equal(f->err.cause, CTL_CAUSE_TOO_LARGE);
    assert_msg_names(&f->err, f->unit.endpoint, "alloc");
    assert_non_null(strstr(f->err.msg, "limit of 4096 bytes"));
    if (took > EARLY_MS)
        fail_msg("a reply over the limit took %lld ms to fail", (long long)took);
    assert_int_equal(logged.n, 1);
    assert_int_equal(as.errors[CTL_CAUSE_TOO_LARGE], 1);
    assert_int_equal(as.calls, 2);
}

static void test_address_stats(void **state)
{
    fx *f = *state;
    const char *other = start_extra(f);
    for (int i = 0; i < 3; i++)
        assert_int_equal(call(f, f->unit.endpoint, "echo", CALL_MS), 0);
    assert_int_equal(call(f, other, "echo", CALL_MS), 0);
    ctl_address_stats a, b, none;
    ctl_client_address_stats(f->client, f->unit.endpoint, &a);
    ctl_client_address_stats(f->client, other, &b);
    ctl_client_address_stats(f->client, "tcp://127.0.0.1:1", &none);
    assert_int_equal(a.calls, 3);
    assert_int_equal(a.sockets, 1);
    assert_int_equal(a.retired, 0);
    assert_int_equal(a.timeouts, 0);
    assert_int_equal(a.late_replies, 0);
    assert_int_equal(b.calls, 1);
    assert_int_equal(b.sockets, 1);
    assert_int_equal(none.calls, 0);
    assert_int_equal(none.sockets, 0);
    const char *addrs[4] = {NULL};
    assert_int_equal(ctl_client_addresses(f->client, addrs, 4), 2);
    assert_true((strcmp(addrs[0], f->unit.endpoint) == 0 && strcmp(addrs[1], other) == 0) ||
                (strcmp(addrs[1], f->unit.endpoint) == 0 && strcmp(addrs[0], other) == 0));
    assert_int_equal(ctl_client_addresses(f->client, NULL, 0), 2);
}

/* Thousands of addresses (the client's table grows as they come): each
 * keeps its own counters, found again after every growth, and none is
 * listed twice. A timeout of 0 makes each call's entry without a socket. */
static void test_address_stats_many(void **state)
{
    enum { N = 3000 };
    fx *f = *state;
    static char names[N][40];
    for (int pass = 1; pass <= 2; pass++)
        for (int i = 0; i < N; i++) {
            snprintf(names[i], sizeof names[i], "tcp://127.0.0.1:%d", 20000 + i);
            assert_int_equal(call(f, names[i], "echo", 0), CTL_TRANSFER);
            assert_int_equal(f->err.cause, CTL_CAUSE_TIMEOUT);
        }
    assert_int_equal(call(f, f->unit.endpoint, "echo", CALL_MS), 0);
    for (int i = 0; i < N; i++) {
        ctl_address_stats s;
        ctl_client_address_stats(f->client, names[i], &s);
        assert_int_equal(s.timeouts, 2);
        assert_int_equal(s.calls, 0);
    }
    ctl_address_stats unit, none;
    ctl_client_address_stats(f->client, f->unit.endpoint, &unit);
    ctl_client_address_stats(f->client, "tcp://127.0.0.1:19999", &none);
    assert_int_equal(unit.calls, 1);
    assert_int_equal(none.timeouts, 0);

    static const char *listed[N + 2];
    assert_int_equal(ctl_client_addresses(f->client, listed, N + 2), N + 1);
    int seen_unit = 0;
    static unsigned char seen[N];
    memset(seen, 0, sizeof seen);
    for (int k = 0; k < N + 1; k++) {
        int port = 0;
        if (strcmp(listed[k], f->unit.endpoint) == 0) {
            seen_unit++;
            continue;
        }
        assert_int_equal(sscanf(listed[k], "tcp://127.0.0.1:%d", &port), 1);
        assert_true(port >= 20000 && port < 20000 + N);
        assert_int_equal(seen[port - 20000]++, 0);
    }
    assert_int_equal(seen_unit, 1);
}

/* Read the client's stats until late_replies reaches `want` (the I/O
 * thread's upkeep drains retired sockets a few times a second) or 5 s
 * pass. */
static void wait_late_replies(ctl_client *c, uint64_t want, ctl_client_stats *st)
{
    int64_t until = tu_now_ms() + 5000;
    do {
        ctl_client_stats_get(c, st);
        if (st->late_replies >= want)
            return;
        tu_sleep_ms(10);
    } while (tu_now_ms() < until);
}

static void test_timeout_then_late_reply(void **state)
{
    fx *f = *state;
    ctl_client_stats st;
    args_ms(f, 400);
    int64_t t0 = tu_now_ms();
    assert_int_equal(call(f, f->unit.endpoint, "sleep", 150), CTL_TRANSFER);
    int64_t took = tu_now_ms() - t0;
    assert_int_equal(f->err.cause, CTL_CAUSE_TIMEOUT);
    assert_msg_names(&f->err, f->unit.endpoint, "sleep");
    if (took < 100 || took > 1150)
        fail_msg("150 ms deadline took %lld ms", (long long)took);
    ctl_client_stats_get(f->client, &st);
    assert_int_equal(st.timeouts, 1);
    assert_true(st.sockets_retired >= 1);

    /* The late reply reaches the retired socket (well within the grace);
     * the client's upkeep drains it and counts it, with no call needed. */
    assert_int_equal(tu_wait_atleast(&f->unit.sleeps_done, 1, 5000), 1);
    wait_late_replies(f->client, 1, &st);
    assert_true(st.late_replies >= 1);

    args_tag(&f->args, "the-next-call");
    assert_int_equal(call(f, f->unit.endpoint, "echo", CALL_MS), 0);
    assert_true(tu_obj_packs_to(ctl_reply_result(f->reply), f->args.sb.data,
                                f->args.sb.size));
    ctl_client_stats_get(f->client, &st);
    assert_true(st.late_replies >= 1);
    assert_true(st.sockets_retired >= 1);
    assert_true(st.sockets_opened >= 2);
    /* The same, counted for the address. */
    ctl_address_stats as;
    ctl_client_address_stats(f->client, f->unit.endpoint, &as);
    assert_int_equal(as.calls, 2);
    assert_int_equal(as.timeouts, 1);
    assert_int_equal(as.errors[CTL_CAUSE_TIMEOUT], 1);
    assert_int_equal(as.late_replies, st.late_replies);
    assert_int_equal(as.retired, 1);
    assert_int_equal(as.sockets, st.sockets_opened - st.sockets_closed);
}

/* ---- the fake unit ------------------------------------------------------------------ */

enum fake_mode {
    FAKE_WRONG_ID_FIRST,
    FAKE_UNKNOWN_KIND,
    FAKE_OLD_FORM,
    FAKE_BAD_ERROR_MAP,
    FAKE_GARBAGE,
    FAKE_OK_NOT_BOOL,
    FAKE_LATE
};

typedef struct script {
    enum fake_mode mode;
    int delay_ms;
    pthread_mutex_t mu;
    unsigned char identity[2][256];
    size_t identity_len[2];
    char id[2][128];
    size_t id_len[2];
} script;

static void answer_str(tu_fake *fk, const tu_fake_req *req, const char *id, size_t id_len,
                       const char *value)
{
    tu_buf b;
    tu_buf_init(&b);
    tu_pk_str(&b.pk, value);
    tu_fake_answer(fk, req, id, id_len, true, b.sb.data, b.sb.size);
    tu_buf_fini(&b);
}

static void fake_script(tu_fake *fk, const tu_fake_req *req, void *user)
{
    script *s = user;
    tu_buf b;
    if (req->seq < 2) {
        pthread_mutex_lock(&s->mu);
        size_t il = req->identity_len < 256 ? req->identity_len : 256;
        memcpy(s->identity[req->seq], req->identity, il);
        s->identity_len[req->seq] = il;
        size_t dl = req->id_len < 128 ? req->id_len : 128;
        if (dl)
            memcpy(s->id[req->seq], req->id, dl);
        s->id_len[req->seq] = dl;
        pthread_mutex_unlock(&s->mu);
    }
    if (req->id == NULL)
        return;
    if (req->seq >= 1) {
        answer_str(fk, req, req->id, req->id_len, "second");
        return;
    }
    tu_buf_init(&b);
    switch (s->mode) {
    case FAKE_WRONG_ID_FIRST:
        answer_str(fk, req, "not-your-id", 11, "other");
        answer_str(fk, req, req->id, req->id_len, "mine");
        break;
    case FAKE_UNKNOWN_KIND:
        msgpack_pack_map(&b.pk, 4);
        tu_pk_str(&b.pk, "kind");
        tu_pk_str(&b.pk, "Weird");
        tu_pk_str(&b.pk, "msg");
        tu_pk_str(&b.pk, "something strange");
        tu_pk_str(&b.pk, "reason");
        msgpack_pack_nil(&b.pk);
        tu_pk_str(&b.pk, "blobs");
        msgpack_pack_nil(&b.pk);
        tu_fake_answer(fk, req, req->id, req->id_len, false, b.sb.data, b.sb.size);
        break;
    case FAKE_OLD_FORM:
        /* The reference design's earlier release: [kind, msg], by op name
         * (put: a built-in kind; anything else: a kind we do not know). */
        msgpack_pack_array(&b.pk, 2);
        tu_pk_str(&b.pk, req->op_len == 3 && memcmp(req->op, "put", 3) == 0 ? "Busy" : "Gone");
        tu_pk_str(&b.pk, "in the old form");
        tu_fake_answer(fk, req, req->id, req->id_len, false, b.sb.data, b.sb.size);
        break;
    case FAKE_BAD_ERROR_MAP:
        msgpack_pack_int(&b.pk, 42);
        tu_fake_answer(fk, req, req->id, req->id_len, false, b.sb.data, b.sb.size);
        break;
    case FAKE_GARBAGE:
        tu_fake_send(fk, req, "\xc1\xc1\x00garbage", 10);
        break;
    case FAKE_OK_NOT_BOOL:
        msgpack_pack_array(&b.pk, 3);
        tu_pk_strn(&b.pk, req->id, req->id_len);
        tu_pk_str(&b.pk, "yes");
        msgpack_pack_int(&b.pk, 1);
        tu_fake_send(fk, req, b.sb.data, b.sb.size);
        break;
    case FAKE_LATE:
        tu_sleep_ms(s->delay_ms);
        answer_str(fk, req, req->id, req->id_len, "late");
        break;
    }
    tu_buf_fini(&b);
}

static script *start_fake(fx *f, enum fake_mode mode)
{
    script *s = calloc(1, sizeof *s);
    s->mode = mode;
    pthread_mutex_init(&s->mu, NULL);
    assert_int_equal(tu_fake_start(&f->fake, fake_script, s), 0);
    snprintf(f->fake_addr, sizeof f->fake_addr, "%s", tu_fake_endpoint(f->fake));
    return s;
}

/* Stop the fake (its thread uses the script) and free the script. */
static void free_script(fx *f, script *s)
{
    tu_fake_stop(&f->fake);
    pthread_mutex_destroy(&s->mu);
    free(s);
}

static bool result_is(const ctl_reply *r, const char *s)
{
    return r != NULL && tu_obj_is_str(ctl_reply_result(r), s);
}

/* After a failed or suspect exchange, the next call must come on another
 * socket (another ROUTER identity) and get its own reply. */
static void assert_next_call_on_new_socket(fx *f, script *s)
{
    const char *addr = f->fake_addr;
    assert_int_equal(call(f, addr, "echo", CALL_MS), 0);
    assert_true(result_is(f->reply, "second"));
    pthread_mutex_lock(&s->mu);
    int same = s->identity_len[0] == s->identity_len[1] &&
               memcmp(s->identity[0], s->identity[1], s->identity_len[0]) == 0;
    ctl_str got = ctl_reply_id(f->reply);
    int id_ok = got.len == s->id_len[1] && memcmp(got.ptr, s->id[1], got.len) == 0;
    pthread_mutex_unlock(&s->mu);
    assert_false(same);
    assert_true(id_ok);
}

static void test_fake_wrong_id_then_right(void **state)
{
    fx *f = *state;
    script *s = start_fake(f, FAKE_WRONG_ID_FIRST);
    const char *addr = f->fake_addr;
    int rc = call(f, addr, "echo", CALL_MS);
    bool mine = result_is(f->reply, "mine");
    ctl_client_stats st;
    ctl_client_stats_get(f->client, &st);
    if (rc == 0 && mine && st.late_replies >= 1 && st.sockets_retired >= 1)
        assert_next_call_on_new_socket(f, s);
    free_script(f, s);
    assert_int_equal(rc, 0);
    assert_true(mine);
    assert_true(st.late_replies >= 1);
    assert_true(st.sockets_retired >= 1);
}

static void test_fake_unknown_kind(void **state)
{
    fx *f = *state;
    script *s = start_fake(f, FAKE_UNKNOWN_KIND);
    const char *addr = f->fake_addr;
    int rc = call(f, addr, "put", CALL_MS);
    free_script(f, s);
    assert_int_equal(rc, CTL_TRANSFER);
    assert_int_equal(f->err.cause, CTL_CAUSE_REMOTE);
    assert_non_null(f->err.remote_kind);
    assert_string_equal(f->err.remote_kind, "Weird");
    assert_msg_names(&f->err, addr, "put");
}

/* A peer that answers errors only in the earlier [kind, msg] form: the
 * kind is read as from the map; an unknown one is a remote Protocol error. */
static void test_fake_old_error_form(void **state)
{
    fx *f = *state;
    script *s = start_fake(f, FAKE_OLD_FORM);
    const char *addr = f->fake_addr;
    int rc = call(f, addr, "put", CALL_MS);
    assert_int_equal(rc, CTL_BUSY);
    assert_null(f->err.reason);
    assert_msg_names(&f->err, addr, "put");
    assert_non_null(strstr(f->err.msg, "in the old form"));
    free_script(f, s);
    s = start_fake(f, FAKE_OLD_FORM); /* it answers only its first request so */
    addr = f->fake_addr;
    rc = call(f, addr, "get", CALL_MS);
    free_script(f, s);
    assert_int_equal(rc, CTL_TRANSFER);
    assert_int_equal(f->err.cause, CTL_CAUSE_REMOTE);
    assert_string_equal(f->err.remote_kind, "Gone");
    assert_non_null(strstr(f->err.msg, "Gone error: in the old form"));
}

static void test_fake_malformed_error_map(void **state)
{
    fx *f = *state;
    script *s = start_fake(f, FAKE_BAD_ERROR_MAP);
    const char *addr = f->fake_addr;
    int rc = call(f, addr, "get", CALL_MS);
    free_script(f, s);
    assert_int_equal(rc, CTL_TRANSFER);
    assert_int_equal(f->err.cause, CTL_CAUSE_BAD_REPLY);
    assert_msg_names(&f->err, addr, "get");
}

static void test_fake_garbage_reply(void **state)
{
    fx *f = *state;
    script *s = start_fake(f, FAKE_GARBAGE);
    const char *addr = f->fake_addr;
    int rc = call(f, addr, "get", 3000);
    ctl_cause cause = f->err.cause;
    ctl_client_stats st;
    ctl_client_stats_get(f->client, &st);
    if (rc == CTL_TRANSFER && st.sockets_retired >= 1)
        assert_next_call_on_new_socket(f, s);
    free_script(f, s);
    assert_int_equal(rc, CTL_TRANSFER);
    assert_int_equal(cause, CTL_CAUSE_BAD_REPLY);
    assert_true(st.sockets_retired >= 1);
}

static void test_fake_ok_not_bool(void **state)
{
    fx *f = *state;
    script *s = start_fake(f, FAKE_OK_NOT_BOOL);
    int rc = call(f, f->fake_addr, "get", 3000);
    free_script(f, s);
    assert_int_equal(rc, CTL_TRANSFER);
    assert_int_equal(f->err.cause, CTL_CAUSE_BAD_REPLY);
}

static void test_fake_late_reply_never_reaches_next_call(void **state)
{
    fx *f = *state;
    script *s = start_fake(f, FAKE_LATE);
    s->delay_ms = 400;
    const char *addr = f->fake_addr;
    int rc = call(f, addr, "get", 150);
    ctl_cause cause = f->err.cause;
    tu_sleep_ms(600); /* the late reply has been sent by now */
    if (rc == CTL_TRANSFER)
        assert_next_call_on_new_socket(f, s);
    /* The client's upkeep drains the retired socket and counts the reply. */
    ctl_client_stats st;
    wait_late_replies(f->client, 1, &st);
    free_script(f, s);
    assert_int_equal(rc, CTL_TRANSFER);
    assert_int_equal(cause, CTL_CAUSE_TIMEOUT);
    assert_true(st.late_replies >= 1);
    assert_int_equal(st.timeouts, 1);
}

/* ---- notify --------------------------------------------------------------------------- */

static void test_notify_runs_handler(void **state)
{
    fx *f = *state;
    msgpack_pack_map(&f->args.pk, 1);
    tu_pk_str(&f->args.pk, "v");
    msgpack_pack_int(&f->args.pk, 9);
    int64_t t0 = tu_now_ms();
    assert_int_equal(ctl_client_notify(f->client, f->unit.endpoint, "note", f->args.sb.data,
                                       f->args.sb.size, &f->err),
                     0);
    assert_true(tu_now_ms() - t0 < 2000);
    assert_int_equal(tu_wait_atleast(&f->unit.notes, 1, 5000), 1);
    assert_int_equal(atomic_load(&f->unit.last_note_v), 9);
    ctl_client_stats st;
    ctl_client_stats_get(f->client, &st);
    assert_int_equal(st.notifies, 1);
    assert_int_equal(st.calls, 0);
    ctl_server_stats ss;
    ctl_server_stats_get(f->unit.server, &ss);
    assert_int_equal(ss.replies, 0);
}

static void test_notify_then_call_in_order(void **state)
{
    fx *f = *state;
    for (int i = 1; i <= 20; i++) {
        tu_buf_reset(&f->args);
        msgpack_pack_map(&f->args.pk, 1);
        tu_pk_str(&f->args.pk, "v");
        msgpack_pack_int(&f->args.pk, i);
        assert_int_equal(ctl_client_notify(f->client, f->unit.endpoint, "note",
                                           f->args.sb.data, f->args.sb.size, &f->err),
                         0);
        tu_buf_reset(&f->args);
        assert_int_equal(call(f, f->unit.endpoint, "notes", CALL_MS), 0);
        const msgpack_object *r = ctl_reply_result(f->reply);
        assert_int_equal(r->type, MSGPACK_OBJECT_POSITIVE_INTEGER);
        assert_int_equal(r->via.u64, i);
    }
}

static void test_notify_failing_handler(void **state)
{
    fx *f = *state;
    assert_int_equal(ctl_client_notify(f->client, f->unit.endpoint, "note_fail", NULL, 0,
                                       &f->err),
                     0);
    assert_int_equal(tu_wait_atleast(&f->unit.note_fails, 1, 5000), 1);
    /* Nothing came back to disturb the pool: the next call is clean. */
    assert_int_equal(call(f, f->unit.endpoint, "echo", CALL_MS), 0);
    ctl_client_stats st;
    ctl_client_stats_get(f->client, &st);
    assert_int_equal(st.late_replies, 0);
    assert_int_equal(st.sockets_retired, 0);
}

/* ---- call_many -------------------------------------------------------------------------- */

static void test_call_many_slow_dead_and_healthy(void **state)
{
    fx *f = *state;
    enum { N = 5, DEADLINE = 700 };
    char dead[64];
    tu_buf a[N];
    ctl_target t[N];
    ctl_outcome out[N];
    const char *addr[N];
    tu_dead_address(dead, sizeof dead);
    addr[0] = f->unit.endpoint;
    addr[1] = start_extra(f);
    addr[2] = start_extra(f); /* the slow one */
    addr[3] = dead;
    addr[4] = start_extra(f);
    for (int i = 0; i < N; i++) {
        tu_buf_init(&a[i]);
        char tag[32];
        snprintf(tag, sizeof tag, "target-%d", i);
        tu_buf_reset(&a[i]);
        msgpack_pack_map(&a[i].pk, 2);
        tu_pk_str(&a[i].pk, "ms");
        msgpack_pack_int(&a[i].pk, i == 2 ? 1600 : 0);
        tu_pk_str(&a[i].pk, "tag");
        tu_pk_str(&a[i].pk, tag);
        t[i].address = addr[i];
        t[i].args = a[i].sb.data;
        t[i].args_len = a[i].sb.size;
    }
    int64_t t0 = tu_now_ms();
    int failed = ctl_client_call_many(f->client, "sleep", t, N, DEADLINE, out);
    int64_t took = tu_now_ms() - t0;
    for (int i = 0; i < N; i++) {
        bool bad = i == 2 || i == 3;
        if (bad) {
            assert_null(out[i].reply);
            assert_int_equal(out[i].error.kind, CTL_TRANSFER);
            /* The slow one times out; the dead one is refused. */
            assert_int_equal(out[i].error.cause,
                             i == 2 ? CTL_CAUSE_TIMEOUT : CTL_CAUSE_REFUSED);
            assert_msg_names(&out[i].error, addr[i], "sleep");
        } else {
            if (out[i].reply == NULL)
                fail_msg("healthy target %d failed: %s", i,
                         out[i].error.msg ? out[i].error.msg : "?");
            assert_int_equal(out[i].error.kind, CTL_OK);
            assert_int_equal(ctl_reply_result(out[i].reply)->type,
                             MSGPACK_OBJECT_POSITIVE_INTEGER);
        }
    }
    ctl_outcomes_fini(out, N);
    for (int i = 0; i < N; i++)
        tu_buf_fini(&a[i]);
    assert_int_equal(failed, 2);
    if (took < DEADLINE - 50 || took > DEADLINE + 1000)
        fail_msg("batch with a %d ms deadline took %lld ms", DEADLINE, (long long)took);
}

static void test_call_many_results_match_targets(void **state)
{
    fx *f = *state;
    enum { N = 6 };
    tu_buf a[N];
    ctl_target t[N];
    ctl_outcome out[N];
    const char *other = start_extra(f);
    for (int i = 0; i < N; i++) {
        char tag[32];
        snprintf(tag, sizeof tag, "tag-%d-%s", i, i % 2 ? "odd" : "even");
        tu_buf_init(&a[i]);
        args_tag(&a[i], tag);
        /* The same address appears several times: separate requests. */
        t[i].address = i % 3 == 0 ? other : f->unit.endpoint;
        t[i].args = a[i].sb.data;
        t[i].args_len = a[i].sb.size;
    }
    int failed = ctl_client_call_many(f->client, "echo", t, N, CALL_MS, out);
    int matched = 0;
    for (int i = 0; i < N; i++) {
        if (out[i].reply != NULL &&
            tu_obj_packs_to(ctl_reply_result(out[i].reply), a[i].sb.data, a[i].sb.size))
            matched++;
    }
    ctl_outcomes_fini(out, N);
    for (int i = 0; i < N; i++)
        tu_buf_fini(&a[i]);
    assert_int_equal(failed, 0);
    assert_int_equal(matched, N);
}

static void test_call_many_sends_all_first(void **state)
{
    fx *f = *state;
    enum { N = 4 };
    ctl_target t[N];
    ctl_outcome out[N];
    args_ms(f, 400);
    for (int i = 0; i < N; i++) {
        t[i].address = i == 0 ? f->unit.endpoint : start_extra(f);
        t[i].args = f->args.sb.data;
        t[i].args_len = f->args.sb.size;
    }
    int64_t t0 = tu_now_ms();
    int failed = ctl_client_call_many(f->client, "sleep", t, N, CALL_MS, out);
    int64_t took = tu_now_ms() - t0;
    ctl_outcomes_fini(out, N);
    assert_int_equal(failed, 0);
    /* Four 400 ms sleeps on four units in parallel: well under 1600 ms. */
    if (took > 1200)
        fail_msg("4 x 400 ms on 4 units took %lld ms: requests were not all sent first",
                 (long long)took);
}

static void test_call_many_errors_per_target(void **state)
{
    fx *f = *state;
    enum { N = 4 };
    tu_buf a[N];
    ctl_target t[N];
    ctl_outcome out[N];
    const char *kinds[N] = {"UnitFull", "Busy", "Missing", "Protocol"};
    for (int i = 0; i < N; i++) {
        tu_buf_init(&a[i]);
        msgpack_pack_map(&a[i].pk, 3);
        tu_pk_str(&a[i].pk, "kind");
        tu_pk_str(&a[i].pk, kinds[i]);
        tu_pk_str(&a[i].pk, "reason");
        tu_pk_str(&a[i].pk, "draining");
        tu_pk_str(&a[i].pk, "blobs");
        msgpack_pack_array(&a[i].pk, 1);
        tu_pk_str(&a[i].pk, "only-blob");
        t[i].address = f->unit.endpoint;
        t[i].args = a[i].sb.data;
        t[i].args_len = a[i].sb.size;
    }
    int failed = ctl_client_call_many(f->client, "fail", t, N, CALL_MS, out);
    ctl_kind k[N];
    for (int i = 0; i < N; i++)
        k[i] = out[i].error.kind;
    bool reason_ok = out[1].error.reason && strcmp(out[1].error.reason, "draining") == 0;
    bool blobs_ok = out[2].error.blob_count == 1 && out[2].error.blobs[0].len == 9 &&
                    memcmp(out[2].error.blobs[0].ptr, "only-blob", 9) == 0;
    ctl_cause c3 = out[3].error.cause;
    ctl_outcomes_fini(out, N);
    for (int i = 0; i < N; i++)
        tu_buf_fini(&a[i]);
    assert_int_equal(failed, 4);
    assert_int_equal(k[0], CTL_UNIT_FULL);
    assert_int_equal(k[1], CTL_BUSY);
    assert_int_equal(k[2], CTL_MISSING);
    assert_int_equal(k[3], CTL_TRANSFER);
    assert_int_equal(c3, CTL_CAUSE_REMOTE);
    assert_true(reason_ok);
    assert_true(blobs_ok);
}

static void test_call_many_invalid(void **state)
{
    fx *f = *state;
    ctl_outcome out[3];
    ctl_target t[3] = {{f->unit.endpoint, NULL, 0},
                       {"not-an-address", NULL, 0},
                       {f->unit.endpoint, NULL, 0}};
    /* One unusable target fails alone. */
    int failed = ctl_client_call_many(f->client, "echo", t, 3, CALL_MS, out);
    ctl_kind k0 = out[0].error.kind, k1 = out[1].error.kind, k2 = out[2].error.kind;
    bool named = out[1].error.msg && strstr(out[1].error.msg, "not-an-address");
    ctl_outcomes_fini(out, 3);
    assert_int_equal(failed, 1);
    assert_int_equal(k0, CTL_OK);
    assert_int_equal(k1, CTL_INVALID);
    assert_int_equal(k2, CTL_OK);
    assert_true(named);

    /* NULL op: nothing attempted, every outcome says why. */
    assert_int_equal(ctl_client_call_many(f->client, NULL, t, 3, CALL_MS, out), CTL_INVALID);
    for (int i = 0; i < 3; i++) {
        assert_null(out[i].reply);
        assert_int_equal(out[i].error.kind, CTL_INVALID);
    }
    ctl_outcomes_fini(out, 3);
    assert_int_equal(ctl_client_call_many(NULL, "echo", t, 3, CALL_MS, out), CTL_INVALID);
    ctl_outcomes_fini(out, 3);
    assert_int_equal(ctl_client_call_many(f->client, "echo", NULL, 3, CALL_MS, out),
                     CTL_INVALID);
    ctl_outcomes_fini(out, 3);
    assert_int_equal(ctl_client_call_many(f->client, "echo", t, 3, CALL_MS, NULL),
                     CTL_INVALID);
    /* An empty batch is trivially done. */
    assert_int_equal(ctl_client_call_many(f->client, "echo", t, 0, CALL_MS, out), 0);
    ctl_outcomes_fini(NULL, 3);
}

/* ---- invalid arguments -------------------------------------------------------------------- */

static void test_invalid_addresses(void **state)
{
    fx *f = *state;
    const char *bad[] = {"", "localhost", "udp://127.0.0.1:5555", "tcp://127.0.0.1",
                         "tcp://127.0.0.1:99999", "tcp://:80", "inproc://unit",
                         "tcp://_bad-host:4000"};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        int64_t t0 = tu_now_ms();
        int rc = call(f, bad[i], "echo", CALL_MS);
        if (rc != CTL_INVALID)
            fail_msg("call to \"%s\" gave %d, expected CTL_INVALID", bad[i], rc);
        assert_true(tu_now_ms() - t0 < 1000);
        if (bad[i][0] && strstr(f->err.msg, bad[i]) == NULL)
            fail_msg("message does not name \"%s\": \"%s\"", bad[i], f->err.msg);
        rc = ctl_client_notify(f->client, bad[i], "note", NULL, 0, &f->err);
        assert_int_equal(rc, CTL_INVALID);
        if (bad[i][0])
            assert_non_null(strstr(f->err.msg, bad[i]));
    }
    ctl_client_stats st;
    ctl_client_stats_get(f->client, &st);
    assert_int_equal(st.sockets_opened, 0);
}

static void test_any_port_address_invalid(void **state)
{
    fx *f = *state;
    /* A client cannot dial "any port". */
    assert_int_equal(call(f, "tcp://127.0.0.1:*", "echo", 2000), CTL_INVALID);
    assert_int_equal(call(f, "tcp://127.0.0.1:0", "echo", 2000), CTL_INVALID);
}

static void test_null_arguments(void **state)
{
    fx *f = *state;
    ctl_reply *r = NULL;
    const char *ep = f->unit.endpoint;
    assert_int_equal(ctl_client_call(NULL, ep, "echo", NULL, 0, 100, &r, &f->err), CTL_INVALID);
    assert_int_equal(f->err.kind, CTL_INVALID);
    assert_non_null(f->err.msg);
    assert_int_equal(ctl_client_call(f->client, NULL, "echo", NULL, 0, 100, &r, &f->err),
                     CTL_INVALID);
    assert_int_equal(ctl_client_call(f->client, ep, NULL, NULL, 0, 100, &r, &f->err),
                     CTL_INVALID);
    assert_int_equal(ctl_client_call(f->client, ep, "echo", NULL, 0, 100, NULL, &f->err),
                     CTL_INVALID);
    assert_null(r);
    /* A NULL error is allowed: the kind still comes back. */
    assert_int_equal(ctl_client_call(f->client, NULL, "echo", NULL, 0, 100, &r, NULL),
                     CTL_INVALID);
    assert_int_equal(ctl_client_notify(NULL, ep, "note", NULL, 0, &f->err), CTL_INVALID);
    assert_int_equal(ctl_client_notify(f->client, NULL, "note", NULL, 0, &f->err), CTL_INVALID);
    assert_int_equal(ctl_client_notify(f->client, ep, NULL, NULL, 0, &f->err), CTL_INVALID);
    assert_int_equal(ctl_client_new(NULL, NULL, &f->err), CTL_INVALID);
    assert_int_equal(atomic_load(&f->unit.calls), 0);
    assert_int_equal(atomic_load(&f->unit.notes), 0);
}

/* Caller mistakes that would reach a unit as nothing it can answer: an
 * empty op name, a notify whose args are no map (the unit would drop it
 * unanswered). Refused here, nothing sent; a success leaves no stale
 * error behind. */
static void test_empty_op_and_notify_args_not_a_map(void **state)
{
    fx *f = *state;
    assert_int_equal(ctl_client_call(f->client, f->unit.endpoint, "", NULL, 0, CALL_MS,
                                     &f->reply, &f->err),
                     CTL_INVALID);
    assert_non_null(strstr(f->err.msg, "names no op"));
    assert_int_equal(ctl_client_notify(f->client, f->unit.endpoint, "", NULL, 0, &f->err),
                     CTL_INVALID);
    static const unsigned char five[] = {0x05}, bad[] = {0xc1}, list[] = {0x91, 0x01};
    assert_int_equal(ctl_client_notify(f->client, f->unit.endpoint, "note", five, 1, &f->err),
                     CTL_INVALID);
    assert_non_null(strstr(f->err.msg, "args are not a msgpack map (their first byte is 0x05)"));
    assert_int_equal(ctl_client_notify(f->client, f->unit.endpoint, "note", bad, 1, &f->err),
                     CTL_INVALID);
    assert_int_equal(ctl_client_notify(f->client, f->unit.endpoint, "note", list, 2, &f->err),
                     CTL_INVALID);
    assert_int_equal(atomic_load(&f->unit.notes), 0);
    ctl_client_stats st;
    ctl_client_stats_get(f->client, &st);
    assert_int_equal(st.notifies, 0);

    /* Options: a negative late_grace_ms is refused naming it; a client
     * made after a failure holds no error. */
    ctl_client_options o;
    ctl_client_options_init(&o);
    o.late_grace_ms = -1;
    ctl_client *c = NULL;
    assert_int_equal(ctl_client_new(&o, &c, &f->err), CTL_INVALID);
    assert_non_null(strstr(f->err.msg, "late_grace_ms -1"));
    assert_null(c);
    o.late_grace_ms = 0;
    assert_int_equal(ctl_client_new(&o, &c, &f->err), 0);
    assert_int_equal(f->err.kind, CTL_OK);
    assert_null(f->err.msg);
    ctl_client_destroy(&c);
    ctl_endpoint ep;
    ctl_error_set(&f->err, CTL_INVALID, "stale");
    assert_int_equal(ctl_endpoint_parse("tcp://127.0.0.1:1", &ep, &f->err), 0);
    assert_int_equal(f->err.kind, CTL_OK);
}

/* A NULL args pointer with a non-zero length is a caller bug, not an
 * empty map ("NULL/0" is the empty map). */
static void test_null_args_with_length(void **state)
{
    fx *f = *state;
    ctl_target t = {f->unit.endpoint, NULL, 5};
    ctl_outcome out;
    assert_int_equal(ctl_client_call(f->client, f->unit.endpoint, "echo", NULL, 5,
                                     CALL_MS, &f->reply, &f->err),
                     CTL_INVALID);
    assert_null(f->reply);
    assert_int_equal(ctl_client_notify(f->client, f->unit.endpoint, "note", NULL, 5,
                                       &f->err),
                     CTL_INVALID);
    /* One bad target: that target fails (or the batch is refused). */
    int rc = ctl_client_call_many(f->client, "echo", &t, 1, CALL_MS, &out);
    assert_true(rc == 1 || rc == CTL_INVALID);
    ctl_kind k = out.error.kind;
    ctl_outcomes_fini(&out, 1);
    assert_int_equal(k, CTL_INVALID);
}

static void test_destroy_null_and_twice(void **state)
{
    fx *f = *state;
    ctl_client *c = NULL;
    ctl_reply *r = NULL;
    ctl_client_destroy(NULL);
    ctl_client_destroy(&c);
    ctl_reply_destroy(NULL);
    ctl_reply_destroy(&r);
    assert_int_equal(ctl_client_new(NULL, &c, &f->err), 0);
    assert_non_null(c);
    assert_int_equal(ctl_client_call(c, f->unit.endpoint, "echo", NULL, 0, CALL_MS, &r,
                                     &f->err),
                     0);
    /* A reply outlives its client. */
    ctl_client_destroy(&c);
    assert_null(c);
    assert_int_equal(ctl_reply_result(r)->type, MSGPACK_OBJECT_MAP);
    ctl_reply_destroy(&r);
    assert_null(r);
    ctl_client_destroy(&c);
}

static void *term_ctx(void *ctx)
{
    zmq_ctx_term(ctx);
    return NULL;
}

/* With a borrowed context, destroy must close every socket it made: the
 * context's owner can then terminate it (which blocks while any socket of
 * the context is still open). */
static void test_borrowed_context_fully_released(void **state)
{
    fx *f = *state;
    void *ctx = zmq_ctx_new();
    ctl_client_options co;
    ctl_server_options so;
    ctl_client *c = NULL;
    tu_unit u;
    char dead[64];
    ctl_reply *r = NULL;
    tu_dead_address(dead, sizeof dead);
    ctl_client_options_init(&co);
    co.zmq_context = ctx;
    co.late_grace_ms = 60000;
    ctl_server_options_init(&so);
    so.zmq_context = ctx;
    assert_int_equal(tu_unit_start(&u, &so, &f->err), 0);
    assert_int_equal(ctl_client_new(&co, &c, &f->err), 0);
    assert_int_equal(ctl_client_call(c, u.endpoint, "echo", NULL, 0, CALL_MS, &r, &f->err), 0);
    ctl_reply_destroy(&r);
    assert_int_equal(ctl_client_notify(c, u.endpoint, "note", NULL, 0, &f->err), 0);
    assert_int_equal(ctl_client_call(c, dead, "echo", NULL, 0, 50, &r, &f->err), CTL_TRANSFER);
    ctl_client_destroy(&c);
    tu_unit_stop(&u);
    pthread_t t;
    struct timespec until;
    assert_int_equal(pthread_create(&t, NULL, term_ctx, ctx), 0);
    clock_gettime(CLOCK_REALTIME, &until);
    until.tv_sec += 5;
    if (pthread_timedjoin_np(t, NULL, &until) != 0)
        fail_msg("zmq_ctx_term blocked: a socket of the borrowed context is still open");
}

static void test_destroy_is_prompt_with_retired_sockets(void **state)
{
    fx *f = *state;
    ctl_client_options o;
    ctl_client *c = NULL;
    char dead[64];
    tu_dead_address(dead, sizeof dead);
    ctl_client_options_init(&o);
    o.late_grace_ms = 60000;
    assert_int_equal(ctl_client_new(&o, &c, &f->err), 0);
    for (int i = 0; i < 3; i++)
        assert_int_equal(ctl_client_call(c, dead, "echo", NULL, 0, 50, &f->reply, &f->err),
                         CTL_TRANSFER);
    int64_t t0 = tu_now_ms();
    ctl_client_destroy(&c);
    int64_t took = tu_now_ms() - t0;
    if (took > 1000)
        fail_msg("destroy with retired sockets took %lld ms", (long long)took);
}

int main(void)
{
#define T(fn) cmocka_unit_test_setup_teardown(fn, setup, teardown)
    const struct CMUnitTest tests[] = {
        T(test_call_echo),
        T(test_call_null_args_is_empty_map),
        T(test_call_reply_id_is_the_request_id),
        T(test_call_nil_result),
        T(test_call_big_payload),
        T(test_reply_alloc_lives_with_reply),
        T(test_pool_reuses_one_socket),
        T(test_call_unit_full),
        T(test_call_busy_with_reason),
        T(test_call_missing_with_blobs),
        T(test_call_remote_protocol_is_transfer),
        T(test_call_unknown_op),
        T(test_call_args_not_a_map),
        T(test_call_reply_over_client_limits),
        T(test_timeout_to_silent_unit),
        T(test_default_timeout_applies),
        T(test_timeout_zero_sends_nothing),
        T(test_refused_fails_fast),
        T(test_refused_never_runs_later),
        T(test_unresolved_fails_fast),
        T(test_refused_then_listening),
        T(test_call_many_refused_returns_early),
        T(test_oversize_request_not_sent),
        T(test_oversize_target_returns_socket),
        T(test_oversize_reply_dropped),
        T(test_address_stats),
        T(test_address_stats_many),
        T(test_timeout_then_late_reply),
        T(test_fake_wrong_id_then_right),
        T(test_fake_unknown_kind),
        T(test_fake_old_error_form),
        T(test_fake_malformed_error_map),
        T(test_fake_garbage_reply),
        T(test_fake_ok_not_bool),
        T(test_fake_late_reply_never_reaches_next_call),
        T(test_notify_runs_handler),
        T(test_notify_then_call_in_order),
        T(test_notify_failing_handler),
        T(test_call_many_slow_dead_and_healthy),
        T(test_call_many_results_match_targets),
        T(test_call_many_sends_all_first),
        T(test_call_many_errors_per_target),
        T(test_call_many_invalid),
        T(test_invalid_addresses),
        T(test_any_port_address_invalid),
        T(test_null_arguments),
        T(test_empty_op_and_notify_args_not_a_map),
        T(test_null_args_with_length),
        T(test_destroy_null_and_twice),
        T(test_destroy_is_prompt_with_retired_sockets),
        T(test_borrowed_context_fully_released),
    };
#undef T
    return cmocka_run_group_tests(tests, NULL, NULL);
}
