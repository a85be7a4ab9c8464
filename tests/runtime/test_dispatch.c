/*
 * test_dispatch.c - the server's core without a socket (dispatch_int.h):
 * request bytes in, verdict and reply bytes out.
 *
 * A hand-written service (no generated code) is served by a ctl_dispatch
 * fed plain buffers as the transport would hand them over (ctl_inbound).
 * Requests are packed with msgpack-c by hand and every reply is compared
 * byte for byte with one packed here the way docs/PROTOCOL.md describes it, so
 * the core is checked against the protocol, not against the runtime's own
 * packers. Handlers run on the test's thread.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>

#include <errno.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "testutil.h"
#include "dispatch_int.h"

#define ID "id-0001"

/* A view of a string literal that may hold NUL bytes. */
#define LIT(s) ((ctl_str){(s), sizeof(s) - 1})

/* ---- the service ------------------------------------------------------ */

typedef struct dt_state {
    ctl_dispatch *d;    /* the core serving the handlers */
    int calls;          /* every handler entry */
    int notes;          /* note, note_fail, note_bare */
    int fail_rc;        /* what the last ctl_req_fail_error returned */
    int lock_busy;      /* trylock of the core's lock in `locked` */
    ctl_hold *hold;     /* hold: the held "data" */
    ctl_hold *hold_empty;
    ctl_hold *hold_outside; /* must stay NULL */
    ctl_str data_view;  /* hold: where "data" was in the request */
} dt_state;

static const msgpack_object *arg(const msgpack_object *args, const char *key)
{
    return tu_obj_get(args, key);
}

static int h_echo(void *user, const msgpack_object *args, ctl_req *req)
{
    dt_state *st = user;
    st->calls++;
    return msgpack_pack_object(ctl_req_packer(req), *args) ? -1 : 0;
}

/* [op, id] as the handler sees them. */
static int h_whoami(void *user, const msgpack_object *args, ctl_req *req)
{
    dt_state *st = user;
    msgpack_packer *pk = ctl_req_packer(req);
    ctl_str op = ctl_req_op(req), id = ctl_req_id(req);
    (void)args;
    st->calls++;
    msgpack_pack_array(pk, 2);
    tu_pk_strn(pk, op.ptr, op.len);
    tu_pk_strn(pk, id.ptr, id.len);
    return 0;
}

static int h_nothing(void *user, const msgpack_object *args, ctl_req *req)
{
    dt_state *st = user;
    (void)args;
    (void)req;
    st->calls++;
    return 0;
}

static int h_bare(void *user, const msgpack_object *args, ctl_req *req)
{
    dt_state *st = user;
    (void)args;
    (void)req;
    st->calls++;
    return -1;
}

static int h_bare7(void *user, const msgpack_object *args, ctl_req *req)
{
    dt_state *st = user;
    (void)args;
    (void)req;
    st->calls++;
    return 7;
}

/* Packs a result, then fails: the result must not reach the reply. */
static int h_partial(void *user, const msgpack_object *args, ctl_req *req)
{
    dt_state *st = user;
    (void)args;
    st->calls++;
    msgpack_pack_array(ctl_req_packer(req), 2);
    tu_pk_str(ctl_req_packer(req), "half");
    return ctl_req_fail(req, CTL_UNIT_FULL, "full after %d of %d", 1, 2);
}

/* ctl_req_fail_error with the error args["kind"] names: "ok", "ok-empty",
 * "transfer", "invalid", "busy", "missing". */
static int h_fail_error(void *user, const msgpack_object *args, ctl_req *req)
{
    dt_state *st = user;
    const msgpack_object *k = arg(args, "kind");
    const ctl_str blobs[] = {LIT("b\0one"), LIT("")};
    ctl_error e;
    st->calls++;
    ctl_error_init(&e);
    if (tu_obj_is_str(k, "ok"))
        ctl_error_set(&e, CTL_OK, "nothing failed, yet %s", "here we are");
    else if (tu_obj_is_str(k, "transfer"))
        ctl_error_transfer(&e, CTL_CAUSE_TIMEOUT, "upstream timed out after %d ms", 5);
    else if (tu_obj_is_str(k, "invalid"))
        ctl_error_set(&e, CTL_INVALID, "bad endpoint");
    else if (tu_obj_is_str(k, "busy"))
        ctl_error_busy(&e, "pinned", "blob is pinned");
    else if (tu_obj_is_str(k, "missing"))
        ctl_error_missing(&e, blobs, 2, "two gone");
    /* "ok-empty": an error just initialised, no message at all */
    st->fail_rc = ctl_req_fail_error(req, &e);
    ctl_error_fini(&e); /* the request holds a copy */
    return st->fail_rc;
}

/* Holds args["data"], an empty view and a view outside the message. */
static int h_hold(void *user, const msgpack_object *args, ctl_req *req)
{
    dt_state *st = user;
    static const char elsewhere[] = "not in the message";
    ctl_str data;
    st->calls++;
    if (!ctl_obj_bin(arg(args, "data"), &data))
        return ctl_req_fail(req, CTL_PROTOCOL, "no data");
    st->data_view = data;
    st->hold = ctl_req_hold(req, data);
    st->hold_empty = ctl_req_hold(req, (ctl_str){NULL, 0});
    st->hold_outside = ctl_req_hold(req, (ctl_str){elsewhere, sizeof elsewhere});
    return msgpack_pack_true(ctl_req_packer(req)) ? -1 : 0;
}

static int h_locked(void *user, const msgpack_object *args, ctl_req *req)
{
    dt_state *st = user;
    (void)args;
    st->calls++;
    st->lock_busy = pthread_mutex_trylock(st->d->lock) == EBUSY;
    if (!st->lock_busy)
        pthread_mutex_unlock(st->d->lock);
    return msgpack_pack_true(ctl_req_packer(req)) ? -1 : 0;
}

/* A bin of args["n"] bytes built in request memory. */
static int h_alloc(void *user, const msgpack_object *args, ctl_req *req)
{
    dt_state *st = user;
    uint32_t n = 0;
    st->calls++;
    ctl_obj_u32(arg(args, "n"), &n);
    unsigned char *p = ctl_req_alloc(req, n);
    if (p == NULL || (uintptr_t)p % _Alignof(max_align_t) != 0)
        return ctl_req_fail(req, CTL_PROTOCOL, "bad scratch memory");
    for (uint32_t i = 0; i < n; i++)
        p[i] = (unsigned char)i;
    msgpack_pack_bin(ctl_req_packer(req), n);
    return msgpack_pack_bin_body(ctl_req_packer(req), p, n) ? -1 : 0;
}

static int h_note(void *user, const msgpack_object *args, ctl_req *req)
{
    dt_state *st = user;
    (void)args;
    st->calls++;
    st->notes++;
    /* Whatever a notify packs goes nowhere. */
    return msgpack_pack_true(ctl_req_packer(req)) ? -1 : 0;
}

static int h_note_fail(void *user, const msgpack_object *args, ctl_req *req)
{
    dt_state *st = user;
    (void)args;
    st->calls++;
    st->notes++;
    return ctl_req_fail(req, CTL_PROTOCOL, "a notify that fails");
}

static int h_note_bare(void *user, const msgpack_object *args, ctl_req *req)
{
    dt_state *st = user;
    (void)args;
    (void)req;
    st->calls++;
    st->notes++;
    return -1;
}

static const ctl_op dt_ops[] = {
    {.name = "whoami", .handler = h_whoami},
    {.name = "echo", .handler = h_echo},
    {.name = "nothing", .handler = h_nothing},
    {.name = "bare", .handler = h_bare},
    {.name = "bare7", .handler = h_bare7},
    {.name = "partial", .handler = h_partial},
    {.name = "fail_error", .handler = h_fail_error},
    {.name = "hold", .handler = h_hold},
    {.name = "locked", .handler = h_locked},
    {.name = "alloc", .handler = h_alloc},
    {.name = "note", .handler = h_note, .flags = CTL_OP_NOREPLY},
    {.name = "note_fail", .handler = h_note_fail, .flags = CTL_OP_NOREPLY},
    {.name = "note_bare", .handler = h_note_bare, .flags = CTL_OP_NOREPLY},
};

static const ctl_service dt_service = {
    .name = "dt", .ops = dt_ops, .op_count = sizeof dt_ops / sizeof dt_ops[0]};

/* ---- fixture ---------------------------------------------------------- */

typedef struct fx {
    dt_state st;
    ctl_dispatch d;
    ctl_error err;
    tu_buf req;  /* the request payload */
    tu_buf args; /* an args map for pack_req */
    tu_buf want; /* the expected reply */
} fx;

static int setup(void **state)
{
    fx *f = calloc(1, sizeof *f);
    if (f == NULL)
        return -1;
    ctl_error_init(&f->err);
    tu_buf_init(&f->req);
    tu_buf_init(&f->args);
    tu_buf_init(&f->want);
    f->st.d = &f->d;
    *state = f;
    if (ctl_dispatch_init(&f->d, &dt_service, &f->st, NULL, NULL, &f->err) != 0) {
        fprintf(stderr, "ctl_dispatch_init: %s\n", f->err.msg ? f->err.msg : "?");
        return -1;
    }
    return 0;
}

static int teardown(void **state)
{
    fx *f = *state;
    ctl_hold_release(&f->st.hold);
    ctl_hold_release(&f->st.hold_empty);
    ctl_hold_release(&f->st.hold_outside);
    ctl_dispatch_fini(&f->d);
    tu_buf_fini(&f->req);
    tu_buf_fini(&f->args);
    tu_buf_fini(&f->want);
    ctl_error_fini(&f->err);
    free(f);
    return 0;
}

/* [op, id, <f->args, or {} when empty>] into f->req. */
static void pack_req(fx *f, const char *op, ctl_str id)
{
    tu_buf_reset(&f->req);
    tu_pack_request(&f->req, op, id.ptr, id.len, f->args.sb.data, f->args.sb.size);
}

/* Serve f->req as a message of `frames` frames whose middle frame (with 3)
 * is `delim_len` bytes. The reply stays in f->d.out until the next one. */
static ctl_verdict serve_framed(fx *f, size_t frames, size_t delim_len,
                                bool *delimited)
{
    ctl_inbound in = {.frames = frames,
                      .delimiter_len = delim_len,
                      .payload = f->req.sb.data,
                      .payload_len = f->req.sb.size};
    ctl_dispatch_done(&f->d);
    return ctl_dispatch_message(&f->d, &in, delimited);
}

/* Serve f->req as [identity, payload]. */
static ctl_verdict serve(fx *f)
{
    bool delimited = true;
    ctl_verdict v = serve_framed(f, 2, 0, &delimited);
    assert_false(delimited);
    return v;
}

/* `op` with f->args, id ID, as [identity, payload]. */
static ctl_verdict call(fx *f, const char *op)
{
    pack_req(f, op, LIT(ID));
    return serve(f);
}

/* f->want := [id, ok, ... (the caller packs the third element). */
static void want_head(fx *f, ctl_str id, bool ok)
{
    tu_buf_reset(&f->want);
    msgpack_pack_array(&f->want.pk, 3);
    tu_pk_strn(&f->want.pk, id.ptr, id.len);
    if (ok)
        msgpack_pack_true(&f->want.pk);
    else
        msgpack_pack_false(&f->want.pk);
}

/* f->want := [id, false, {kind, msg, reason, blobs}], in docs/PROTOCOL.md's
 * key order, nil for an absent reason or blob list. */
static void want_error(fx *f, ctl_str id, const char *kind, const char *msg,
                       const char *reason, const ctl_str *blobs, size_t n)
{
    msgpack_packer *pk = &f->want.pk;
    want_head(f, id, false);
    msgpack_pack_map(pk, 4);
    tu_pk_str(pk, "kind");
    tu_pk_str(pk, kind);
    tu_pk_str(pk, "msg");
    tu_pk_str(pk, msg);
    tu_pk_str(pk, "reason");
    if (reason)
        tu_pk_str(pk, reason);
    else
        msgpack_pack_nil(pk);
    tu_pk_str(pk, "blobs");
    if (!blobs) {
        msgpack_pack_nil(pk);
        return;
    }
    msgpack_pack_array(pk, (uint32_t)n);
    for (size_t i = 0; i < n; i++)
        tu_pk_strn(pk, blobs[i].ptr, blobs[i].len);
}

/* The core's output is exactly f->want. */
static void expect_out(fx *f)
{
    const msgpack_sbuffer *out = &f->d.out;
    if (out->size == f->want.sb.size &&
        (out->size == 0 || memcmp(out->data, f->want.sb.data, out->size) == 0))
        return;
    /* Say what came instead. */
    msgpack_zone zone;
    tu_reply r;
    const msgpack_object *m = NULL;
    msgpack_zone_init(&zone, 1024);
    if (out->size && tu_parse_reply(out->data, out->size, &zone, &r) == 0)
        m = tu_obj_get(&r.body, "msg");
    if (m && m->type == MSGPACK_OBJECT_STR)
        fail_msg("reply of %zu bytes (msg '%.*s'), not the %zu expected", out->size,
                 (int)m->via.str.size, m->via.str.ptr, f->want.sb.size);
    fail_msg("reply of %zu bytes, not the %zu expected", out->size, f->want.sb.size);
}

/* `op` with f->args is refused with a Protocol error saying exactly `msg`. */
static void expect_protocol(fx *f, const char *op, const char *msg)
{
    assert_int_equal(call(f, op), CTL_DISPATCH_REPLY);
    want_error(f, LIT(ID), "Protocol", msg, NULL, NULL, 0);
    expect_out(f);
}

static uint64_t counter(_Atomic uint64_t *c)
{
    return atomic_load(c);
}

/* ---- the service check ------------------------------------------------ */

static void test_init_checks_the_service(void **state)
{
    (void)state;
    ctl_dispatch d;
    ctl_error err;
    static const ctl_op unnamed[] = {{.name = "", .handler = h_echo}};
    static const ctl_op null_name[] = {{.name = "a", .handler = h_echo},
                                       {.name = NULL, .handler = h_echo}};
    static const ctl_op no_handler[] = {{.name = "a", .handler = h_echo},
                                        {.name = "b"}};
    static const ctl_op twice[] = {{.name = "b", .handler = h_echo},
                                   {.name = "a", .handler = h_echo},
                                   {.name = "b", .handler = h_nothing}};
    static const struct {
        ctl_service svc;
        const char *msg;
    } cases[] = {
        {{.name = "s", .ops = NULL, .op_count = 2}, "service s: 2 ops but no op table"},
        {{.name = "s", .ops = unnamed, .op_count = 1}, "service s: op #0 has no name"},
        {{.name = NULL, .ops = null_name, .op_count = 2}, "service (unnamed): op #1 has no name"},
        {{.name = "s", .ops = no_handler, .op_count = 2}, "service s: op 'b' has no handler"},
        {{.name = "s", .ops = twice, .op_count = 3}, "service s: op 'b' is declared twice"},
    };
    ctl_error_init(&err);
    assert_int_equal(ctl_dispatch_init(&d, NULL, NULL, NULL, NULL, &err), CTL_INVALID);
    assert_string_equal(err.msg, "server: service is NULL");
    /* A failed init needs no fini, and one after it frees nothing twice
     * (ASan would report it). */
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        assert_int_equal(ctl_dispatch_init(&d, &cases[i].svc, NULL, NULL, NULL, &err),
                         CTL_INVALID);
        assert_int_equal(err.kind, CTL_INVALID);
        assert_string_equal(err.msg, cases[i].msg);
        ctl_dispatch_fini(&d);
    }
    /* A service without ops is fine: every op is unknown. */
    static const ctl_service empty = {.name = "empty"};
    assert_int_equal(ctl_dispatch_init(&d, &empty, NULL, NULL, NULL, &err), 0);
    tu_buf b;
    tu_buf_init(&b);
    tu_pack_request(&b, "x", "i", 1, NULL, 0);
    bool delimited;
    ctl_inbound in = {.frames = 2, .payload = b.sb.data, .payload_len = b.sb.size};
    assert_int_equal(ctl_dispatch_message(&d, &in, &delimited), CTL_DISPATCH_REPLY);
    ctl_dispatch_done(&d);
    ctl_dispatch_fini(&d);
    ctl_dispatch_fini(&d); /* twice is fine */
    tu_buf_fini(&b);
    ctl_error_fini(&err);
}

/* ---- framing ---------------------------------------------------------- */

/* [identity, payload] and a REQ peer's [identity, "", payload] get the same
 * reply; only the delimiter flag differs. */
static void test_frames_router_and_req_style(void **state)
{
    fx *f = *state;
    bool delimited = true;

    pack_req(f, "whoami", LIT(ID));
    assert_int_equal(serve_framed(f, 2, 0, &delimited), CTL_DISPATCH_REPLY);
    assert_false(delimited);
    want_head(f, LIT(ID), true);
    msgpack_pack_array(&f->want.pk, 2);
    tu_pk_str(&f->want.pk, "whoami");
    tu_pk_str(&f->want.pk, ID);
    expect_out(f);

    delimited = false;
    assert_int_equal(serve_framed(f, 3, 0, &delimited), CTL_DISPATCH_REPLY);
    assert_true(delimited);
    expect_out(f);
    assert_int_equal(f->st.calls, 2);
    assert_int_equal(counter(&f->d.counters.requests), 2);
    assert_int_equal(counter(&f->d.counters.dropped), 0);
}

/* Any other framing is dropped and counted, whatever the payload. */
static void test_frames_bad_dropped_and_counted(void **state)
{
    fx *f = *state;
    static const struct {
        size_t frames, delim_len;
    } cases[] = {
        {3, 1},   /* a middle frame that is not an empty delimiter */
        {3, 200},
        {1, 0},   /* identity only */
        {0, 0},
        {4, 0},   /* too many */
        {5, 0},
        {1000, 0},
        {SIZE_MAX, 0},
    };
    pack_req(f, "whoami", LIT(ID));
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        bool delimited;
        assert_int_equal(serve_framed(f, cases[i].frames, cases[i].delim_len, &delimited),
                         CTL_DISPATCH_DROPPED);
        assert_int_equal(f->d.out.size, 0);
        assert_int_equal(counter(&f->d.counters.dropped), i + 1);
    }
    assert_int_equal(f->st.calls, 0);
    assert_int_equal(counter(&f->d.counters.requests), 0);
    /* The core is fine after them. */
    assert_int_equal(serve(f), CTL_DISPATCH_REPLY);
    assert_int_equal(f->st.calls, 1);
}

/* A payload without a usable op and id cannot be answered: dropped. */
static void test_unusable_payload_dropped(void **state)
{
    fx *f = *state;
    static const struct {
        const char *bytes;
        size_t len;
    } cases[] = {
#define B(s) {s, sizeof(s) - 1}
        B(""),
        B("\xc0"),                               /* nil */
        B("\x92\xa4" "echo\xa1i"),                /* an array of 2 */
        B("\x94\xa4" "echo\xa1i\x80\xc0"),        /* an array of 4 */
        B("\x93\x01\xa1i\x80"),                  /* op an int */
        B("\x93\xc4\x04" "echo\xa1i\x80"),        /* op a bin */
        B("\x93\xa4" "echo\x01\x80"),             /* id an int */
        B("\x93\xa4" "echo\xc0\x80"),             /* id nil */
        B("\x93\xa4" "ech"),                      /* op truncated */
        B("\x93\xa4" "echo\xa5id"),               /* id truncated */
        B("\x93\xa4" "echo"),                     /* no id */
        B("\xdd\x00\x00\x00\x03\xa4" "echo"),     /* array32, then no id */
        B("\x93\xdb\xff\xff\xff\xff\xa4" "echo"), /* str32 longer than the rest */
#undef B
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        tu_buf_reset(&f->req);
        if (cases[i].len)
            msgpack_sbuffer_write(&f->req.sb, cases[i].bytes, cases[i].len);
        if (serve(f) != CTL_DISPATCH_DROPPED)
            fail_msg("payload #%zu was not dropped", i);
        assert_int_equal(f->d.out.size, 0);
    }
    assert_int_equal(counter(&f->d.counters.dropped), sizeof cases / sizeof cases[0]);
    assert_int_equal(counter(&f->d.counters.requests), 0);
    assert_int_equal(f->st.calls, 0);
}

/* ---- refusals ------------------------------------------------------- */

static void test_unknown_op_named(void **state)
{
    fx *f = *state;
    static const struct {
        const char *op;
        size_t len;
        const char *msg;
    } cases[] = {
        {"nope", 4, "unknown op 'nope' (service dt)"},
        {"Echo", 4, "unknown op 'Echo' (service dt)"},
        {"ech", 3, "unknown op 'ech' (service dt)"},     /* a prefix of an op */
        {"echoo", 5, "unknown op 'echoo' (service dt)"}, /* an op is its prefix */
        {"", 0, "unknown op '' (service dt)"},
        {"echo\0", 5, "unknown op 'echo\\x00' (service dt)"},
        {"\xff\xfe", 2, "unknown op '\\xff\\xfe' (service dt)"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        tu_buf_reset(&f->req);
        msgpack_pack_array(&f->req.pk, 3);
        tu_pk_strn(&f->req.pk, cases[i].op, cases[i].len);
        tu_pk_str(&f->req.pk, ID);
        /* Not even a map: the op is looked up first. */
        msgpack_pack_array(&f->req.pk, 0);
        assert_int_equal(serve(f), CTL_DISPATCH_REPLY);
        want_error(f, LIT(ID), "Protocol", cases[i].msg, NULL, NULL, 0);
        expect_out(f);
    }
    assert_int_equal(counter(&f->d.counters.requests), sizeof cases / sizeof cases[0]);
    assert_int_equal(counter(&f->d.counters.dropped), 0);
    assert_int_equal(f->st.calls, 0);
}

/* A notify of an op the unit does not know (a newer client's, to a unit of
 * an earlier release: notifies send the empty id) gets nothing back, not
 * even an error: it is dropped and counted. With any other id, the same op
 * is refused. */
static void test_unknown_notify_dropped(void **state)
{
    fx *f = *state;
    tu_buf_reset(&f->args);
    pack_req(f, "newer", LIT(""));
    assert_int_equal(serve(f), CTL_DISPATCH_DROPPED);
    assert_int_equal(f->d.out.size, 0);
    assert_int_equal(counter(&f->d.counters.dropped), 1);
    pack_req(f, "newer", LIT(ID));
    assert_int_equal(serve(f), CTL_DISPATCH_REPLY);
    want_error(f, LIT(ID), "Protocol", "unknown op 'newer' (service dt)", NULL, NULL, 0);
    expect_out(f);
    assert_int_equal(counter(&f->d.counters.dropped), 1);
    /* A known op with the empty id is answered, the id echoed. */
    pack_req(f, "whoami", LIT(""));
    assert_int_equal(serve(f), CTL_DISPATCH_REPLY);
    assert_int_equal(f->st.calls, 1);
}

static void test_bad_args_refused(void **state)
{
    fx *f = *state;
    static const struct {
        const char *args;
        size_t len;
        const char *msg;
    } cases[] = {
#define B(s) s, sizeof(s) - 1
        {B("\x90"), "op 'echo': args must be a map, not array"},
        {B("\xa1x"), "op 'echo': args must be a map, not str"},
        {B("\x2a"), "op 'echo': args must be a map, not int"},
        {B(""), "op 'echo': args: truncated"},
        {B("\x81\xa1k"), "op 'echo': args: truncated"},
        {B("\x80\x80"), "op 'echo': 1 trailing bytes after the message"},
        {B("\x80\xc0\xc0\xc0"), "op 'echo': 3 trailing bytes after the message"},
        {B("\xc1"), "op 'echo': args: invalid byte 0xc1"},
        {B("\xdf\x7f\xff\xff\xff"), "op 'echo': args: container count exceeds the message size"},
#undef B
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        tu_buf_reset(&f->req);
        msgpack_pack_array(&f->req.pk, 3);
        tu_pk_str(&f->req.pk, "echo");
        tu_pk_str(&f->req.pk, ID);
        msgpack_sbuffer_write(&f->req.sb, cases[i].args, cases[i].len);
        assert_int_equal(serve(f), CTL_DISPATCH_REPLY);
        want_error(f, LIT(ID), "Protocol", cases[i].msg, NULL, NULL, 0);
        expect_out(f);
    }
    assert_int_equal(f->st.calls, 0);
    assert_int_equal(counter(&f->d.counters.requests), sizeof cases / sizeof cases[0]);
}

/* Decoding bounds come from the limits the core was made with. */
static void test_limits_applied(void **state)
{
    fx *f = *state;
    ctl_limits lim = {.max_depth = 3, .max_items = 12};
    ctl_dispatch_fini(&f->d);
    assert_int_equal(ctl_dispatch_init(&f->d, &dt_service, &f->st, NULL, &lim,
                                       &f->err), 0);
    /* envelope (1) > args map (2) > array (3): fine; one more: too deep. */
    tu_buf_reset(&f->args);
    msgpack_pack_map(&f->args.pk, 1);
    tu_pk_str(&f->args.pk, "a");
    msgpack_pack_array(&f->args.pk, 1);
    msgpack_pack_int(&f->args.pk, 1);
    assert_int_equal(call(f, "echo"), CTL_DISPATCH_REPLY);
    want_head(f, LIT(ID), true);
    msgpack_sbuffer_write(&f->want.sb, f->args.sb.data, f->args.sb.size);
    expect_out(f);

    tu_buf_reset(&f->args);
    msgpack_pack_map(&f->args.pk, 1);
    tu_pk_str(&f->args.pk, "a");
    msgpack_pack_array(&f->args.pk, 1);
    msgpack_pack_array(&f->args.pk, 0);
    expect_protocol(f, "echo", "op 'echo': args: nested too deeply");

    /* 3 for the envelope's head, the map, its key, an array of 8. */
    tu_buf_reset(&f->args);
    msgpack_pack_map(&f->args.pk, 1);
    tu_pk_str(&f->args.pk, "a");
    msgpack_pack_array(&f->args.pk, 8);
    for (int i = 0; i < 8; i++)
        msgpack_pack_int(&f->args.pk, i);
    expect_protocol(f, "echo", "op 'echo': args: too many objects");
    assert_int_equal(f->st.calls, 1);
}

/* ---- notify ops ------------------------------------------------------- */

/* A notify op is never answered: not its result, not its failure, not its
 * bad args, whatever id it carries. */
static void test_notify_never_answered(void **state)
{
    fx *f = *state;
    static const char *const ops[] = {"note", "note_fail", "note_bare"};
    static const ctl_str ids[] = {{"", 0}, {ID, sizeof ID - 1}};

    for (size_t i = 0; i < 3; i++) {
        for (size_t j = 0; j < 2; j++) {
            tu_buf_reset(&f->args);
            pack_req(f, ops[i], ids[j]);
            assert_int_equal(serve(f), CTL_DISPATCH_SILENT);
            assert_int_equal(f->d.out.size, 0);
            /* Bad args: not even the handler hears of it. */
            tu_buf_reset(&f->req);
            msgpack_pack_array(&f->req.pk, 3);
            tu_pk_str(&f->req.pk, ops[i]);
            tu_pk_strn(&f->req.pk, ids[j].ptr, ids[j].len);
            msgpack_pack_array(&f->req.pk, 1);
            msgpack_pack_nil(&f->req.pk);
            assert_int_equal(serve(f), CTL_DISPATCH_SILENT);
            assert_int_equal(f->d.out.size, 0);
            msgpack_sbuffer_write(&f->req.sb, "\xc0", 1); /* trailing bytes */
            assert_int_equal(serve(f), CTL_DISPATCH_SILENT);
            assert_int_equal(f->d.out.size, 0);
        }
    }
    assert_int_equal(f->st.notes, 6);
    assert_int_equal(counter(&f->d.counters.requests), 18);
    assert_int_equal(counter(&f->d.counters.dropped), 0);
}

/* A draining core serves nothing: every request (a known op, an unknown
 * one) is answered Busy "draining", notifies are dropped, handlers never
 * run. A notify of an op it does not know (the empty id) is dropped, as
 * when it is not draining: a Busy would come to its client's next call. */
static void test_draining_answers_busy(void **state)
{
    fx *f = *state;
    f->d.draining = true;
    static const char *const ops[] = {"echo", "no_such_op"};
    for (size_t i = 0; i < 2; i++) {
        assert_int_equal(call(f, ops[i]), CTL_DISPATCH_REPLY);
        want_error(f, LIT(ID), "Busy", "unit is shutting down: retry at another unit or later",
                   "draining", NULL, 0);
        expect_out(f);
    }
    pack_req(f, "note", LIT(ID));
    assert_int_equal(serve(f), CTL_DISPATCH_SILENT);
    assert_int_equal(f->d.out.size, 0);
    assert_int_equal(f->st.notes, 0);
    assert_int_equal(counter(&f->d.counters.requests), 3);
    assert_int_equal(counter(&f->d.counters.dropped), 0);
    tu_buf_reset(&f->args);
    pack_req(f, "newer", LIT(""));
    assert_int_equal(serve(f), CTL_DISPATCH_DROPPED);
    assert_int_equal(f->d.out.size, 0);
    assert_int_equal(counter(&f->d.counters.dropped), 1);
}

/* bytes_in counts every frame after the identity, of a dropped message
 * too: a non-empty middle frame, and frames past the third. */
static void test_bytes_in_every_frame(void **state)
{
    fx *f = *state;
    bool delimited;
    pack_req(f, "whoami", LIT(ID));
    size_t len = f->req.sb.size;
    assert_int_equal(serve(f), CTL_DISPATCH_REPLY);
    assert_int_equal(counter(&f->d.counters.bytes_in), len);
    assert_int_equal(serve_framed(f, 3, 0, &delimited), CTL_DISPATCH_REPLY);
    assert_int_equal(counter(&f->d.counters.bytes_in), 2 * len);
    assert_int_equal(serve_framed(f, 3, 5, &delimited), CTL_DISPATCH_DROPPED);
    assert_int_equal(counter(&f->d.counters.bytes_in), 3 * len + 5);
    ctl_inbound in = {.frames = 5, .delimiter_len = 2, .payload = f->req.sb.data,
                      .payload_len = len, .discarded_len = 11};
    ctl_dispatch_done(&f->d);
    assert_int_equal(ctl_dispatch_message(&f->d, &in, &delimited), CTL_DISPATCH_DROPPED);
    assert_int_equal(counter(&f->d.counters.bytes_in), 4 * len + 5 + 2 + 11);
    assert_int_equal(counter(&f->d.counters.dropped), 2);
}

/* ---- handler failures -------------------------------------------------- */

static void test_bare_failure_is_generic_protocol(void **state)
{
    fx *f = *state;
    expect_protocol(f, "bare", "op 'bare' failed (handler returned -1 without an error)");
    expect_protocol(f, "bare7", "op 'bare7' failed (handler returned 7 without an error)");
    assert_int_equal(f->st.calls, 2);
}

/* What a handler packed before failing is discarded. */
static void test_partial_result_discarded(void **state)
{
    fx *f = *state;
    assert_int_equal(call(f, "partial"), CTL_DISPATCH_REPLY);
    want_error(f, LIT(ID), "UnitFull", "full after 1 of 2", NULL, NULL, 0);
    expect_out(f);
}

/* ctl_req_fail_error: a kind that cannot cross the wire (CTL_OK,
 * CTL_TRANSFER, CTL_INVALID) is sent as Protocol with its message, and the
 * handler gets CTL_PROTOCOL back; the wire kinds keep their details. */
static void test_fail_error_kinds(void **state)
{
    fx *f = *state;
    static const ctl_str blobs[] = {{"b\0one", 5}, {"", 0}};
    static const struct {
        const char *arg, *kind, *msg, *reason;
        const ctl_str *blobs;
        size_t n;
        int rc;
    } cases[] = {
        {"ok", "Protocol", "nothing failed, yet here we are", NULL, NULL, 0, CTL_PROTOCOL},
        {"ok-empty", "Protocol", "", NULL, NULL, 0, CTL_PROTOCOL},
        {"transfer", "Protocol", "upstream timed out after 5 ms", NULL, NULL, 0, CTL_PROTOCOL},
        {"invalid", "Protocol", "bad endpoint", NULL, NULL, 0, CTL_PROTOCOL},
        {"busy", "Busy", "blob is pinned", "pinned", NULL, 0, CTL_BUSY},
        {"missing", "Missing", "two gone", NULL, blobs, 2, CTL_MISSING},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        tu_buf_reset(&f->args);
        msgpack_pack_map(&f->args.pk, 1);
        tu_pk_str(&f->args.pk, "kind");
        tu_pk_str(&f->args.pk, cases[i].arg);
        f->st.fail_rc = 12345;
        assert_int_equal(call(f, "fail_error"), CTL_DISPATCH_REPLY);
        if (f->st.fail_rc != cases[i].rc)
            fail_msg("%s: ctl_req_fail_error returned %d, not %d", cases[i].arg,
                     f->st.fail_rc, cases[i].rc);
        want_error(f, LIT(ID), cases[i].kind, cases[i].msg, cases[i].reason,
                   cases[i].blobs, cases[i].n);
        expect_out(f);
    }
}

/* ---- results and ids -------------------------------------------------- */

static void test_empty_result_is_nil(void **state)
{
    fx *f = *state;
    assert_int_equal(call(f, "nothing"), CTL_DISPATCH_REPLY);
    want_head(f, LIT(ID), true);
    msgpack_pack_nil(&f->want.pk);
    expect_out(f);
    assert_int_equal(f->d.out.size, 1 + 1 + sizeof ID - 1 + 1 + 1);
}

/* The id comes back byte for byte in the reply head, and the handler sees
 * it (and the op) as sent: empty, with NUL bytes, not UTF-8, as long as a
 * unit takes (256 bytes). */
static void test_ids_echoed(void **state)
{
    fx *f = *state;
    static char long_id[70000];
    memset(long_id, 'x', sizeof long_id);
    long_id[7] = '\0';
    const ctl_str ids[] = {
        {"", 0},
        {"\0", 1},
        {"a\0b\0", 4},
        {"\xff\xfe\x80", 3},
        {"000000000abc", 12},
        {long_id, 200},          /* str8 */
        {long_id, 256},          /* str16, the longest */
    };
    for (size_t i = 0; i < sizeof ids / sizeof ids[0]; i++) {
        tu_buf_reset(&f->args);
        pack_req(f, "whoami", ids[i]);
        assert_int_equal(serve(f), CTL_DISPATCH_REPLY);
        want_head(f, ids[i], true);
        msgpack_pack_array(&f->want.pk, 2);
        tu_pk_str(&f->want.pk, "whoami");
        tu_pk_strn(&f->want.pk, ids[i].ptr, ids[i].len);
        expect_out(f);
        /* Refusals echo it too (the empty id's is a notify's: nothing back,
         * test_unknown_notify_dropped). */
        tu_buf_reset(&f->req);
        msgpack_pack_array(&f->req.pk, 3);
        tu_pk_str(&f->req.pk, "nope");
        tu_pk_strn(&f->req.pk, ids[i].ptr, ids[i].len);
        msgpack_pack_map(&f->req.pk, 0);
        if (ids[i].len == 0) {
            assert_int_equal(serve(f), CTL_DISPATCH_DROPPED);
            continue;
        }
        assert_int_equal(serve(f), CTL_DISPATCH_REPLY);
        want_error(f, ids[i], "Protocol", "unknown op 'nope' (service dt)", NULL, NULL, 0);
        expect_out(f);
    }
}

/* Every reply echoes the id, so a longer one than 256 bytes would let a
 * peer make each error or Busy reply as large as its request: dropped and
 * counted, never answered. */
static void test_long_ids_dropped(void **state)
{
    fx *f = *state;
    static char long_id[70000];
    memset(long_id, 'x', sizeof long_id);
    const size_t lens[] = {257, 300, sizeof long_id};
    for (size_t i = 0; i < sizeof lens / sizeof lens[0]; i++) {
        tu_buf_reset(&f->args);
        pack_req(f, "whoami", (ctl_str){long_id, lens[i]});
        assert_int_equal(serve(f), CTL_DISPATCH_DROPPED);
        assert_int_equal(f->d.out.size, 0);
    }
    assert_int_equal(counter(&f->d.counters.dropped), 3);
    assert_int_equal(f->st.calls, 0);
}

/* An error reply is bounded as a result is: a Missing that lists more
 * than max_reply_bytes of blobs goes out as the Protocol error saying so. */
static void test_error_reply_bounded(void **state)
{
    fx *f = *state;
    f->d.max_reply_bytes = 40;
    tu_buf_reset(&f->args);
    msgpack_pack_map(&f->args.pk, 1);
    tu_pk_str(&f->args.pk, "kind");
    tu_pk_str(&f->args.pk, "missing");
    assert_int_equal(call(f, "fail_error"), CTL_DISPATCH_REPLY);
    msgpack_zone zone;
    tu_reply r;
    msgpack_zone_init(&zone, 1024);
    assert_int_equal(tu_parse_reply(f->d.out.data, f->d.out.size, &zone, &r), 0);
    assert_false(r.ok);
    assert_true(tu_obj_is_str(tu_obj_get(&r.body, "kind"), "Protocol"));
    const msgpack_object *msg = tu_obj_get(&r.body, "msg");
    assert_non_null(msg);
    char text[256];
    snprintf(text, sizeof text, "%.*s", (int)msg->via.str.size, msg->via.str.ptr);
    if (!strstr(text, "the Missing reply is ") ||
        !strstr(text, "bytes, larger than this unit's max_reply_bytes (40 bytes): ask for "
                      "less in one call"))
        fail_msg("got: %s", text);
    msgpack_zone_destroy(&zone);
    /* One that fits goes as it is. */
    f->d.max_reply_bytes = 4096;
    tu_buf_reset(&f->args);
    msgpack_pack_map(&f->args.pk, 1);
    tu_pk_str(&f->args.pk, "kind");
    tu_pk_str(&f->args.pk, "missing");
    static const ctl_str blobs[] = {{"b\0one", 5}, {"", 0}};
    assert_int_equal(call(f, "fail_error"), CTL_DISPATCH_REPLY);
    want_error(f, LIT(ID), "Missing", "two gone", NULL, blobs, 2);
    expect_out(f);
}

/* Scratch memory is aligned and lives until the reply is built. */
static void test_req_alloc(void **state)
{
    fx *f = *state;
    static const uint32_t sizes[] = {0, 1, 100, 5000, 100000};
    for (size_t i = 0; i < sizeof sizes / sizeof sizes[0]; i++) {
        unsigned char *bytes = malloc(sizes[i] ? sizes[i] : 1);
        assert_non_null(bytes);
        for (uint32_t j = 0; j < sizes[i]; j++)
            bytes[j] = (unsigned char)j;
        tu_buf_reset(&f->args);
        msgpack_pack_map(&f->args.pk, 1);
        tu_pk_str(&f->args.pk, "n");
        msgpack_pack_uint32(&f->args.pk, sizes[i]);
        assert_int_equal(call(f, "alloc"), CTL_DISPATCH_REPLY);
        want_head(f, LIT(ID), true);
        msgpack_pack_bin(&f->want.pk, sizes[i]);
        msgpack_pack_bin_body(&f->want.pk, bytes, sizes[i]);
        free(bytes);
        expect_out(f);
    }
}

/* ---- holds and the lock -------------------------------------------- */

/* On a plain buffer (no transport hook), a hold copies the bytes: they stay
 * valid after ctl_dispatch_done and after the buffer itself is gone. */
static void test_hold_copies_plain_buffer(void **state)
{
    fx *f = *state;
    static const char data[] = "held \0 bytes \xff";
    tu_buf_reset(&f->args);
    msgpack_pack_map(&f->args.pk, 1);
    tu_pk_str(&f->args.pk, "data");
    msgpack_pack_bin(&f->args.pk, sizeof data);
    msgpack_pack_bin_body(&f->args.pk, data, sizeof data);
    assert_int_equal(call(f, "hold"), CTL_DISPATCH_REPLY);

    assert_non_null(f->st.hold);
    assert_null(f->st.hold_outside); /* not in the message */
    assert_non_null(f->st.hold_empty);
    assert_int_equal(ctl_hold_view(f->st.hold_empty).len, 0);
    ctl_str v = ctl_hold_view(f->st.hold);
    assert_int_equal(v.len, sizeof data);
    assert_memory_equal(v.ptr, data, sizeof data);
    /* A copy, not a view into the request. */
    const char *lo = f->req.sb.data, *hi = lo + f->req.sb.size;
    assert_true(v.ptr < lo || v.ptr >= hi);
    assert_true(f->st.data_view.ptr >= lo && f->st.data_view.ptr < hi);

    ctl_dispatch_done(&f->d);
    memset(f->req.sb.data, 0xee, f->req.sb.size);
    tu_buf_fini(&f->req);
    tu_buf_init(&f->req);
    assert_true(ctl_hold_view(f->st.hold).ptr == v.ptr);
    assert_memory_equal(ctl_hold_view(f->st.hold).ptr, data, sizeof data);

    ctl_hold_release(&f->st.hold);
    assert_null(f->st.hold);
    ctl_hold_release(&f->st.hold); /* NULL: fine */
    ctl_hold_release(NULL);
}

/* With a transport hook, the hold is the transport's: it gets the message
 * and where the bytes lie in the payload. */
typedef struct hook_log {
    int calls;
    void *msg[4];
    size_t off[4], len[4];
    ctl_hold hold;
} hook_log;

static hook_log the_hook;

static void hook_release(ctl_hold *h)
{
    (void)h;
    the_hook.calls += 100;
}

static ctl_hold *hook_hold(void *msg, size_t off, size_t len)
{
    if (the_hook.calls < 4) {
        the_hook.msg[the_hook.calls] = msg;
        the_hook.off[the_hook.calls] = off;
        the_hook.len[the_hook.calls] = len;
    }
    the_hook.calls++;
    the_hook.hold.view = (ctl_str){"hooked", 6};
    the_hook.hold.release = hook_release;
    return &the_hook.hold;
}

static void test_hold_uses_transport_hook(void **state)
{
    fx *f = *state;
    int token;
    bool delimited;
    memset(&the_hook, 0, sizeof the_hook);
    tu_buf_reset(&f->args);
    msgpack_pack_map(&f->args.pk, 1);
    tu_pk_str(&f->args.pk, "data");
    msgpack_pack_bin(&f->args.pk, 3);
    msgpack_pack_bin_body(&f->args.pk, "abc", 3);
    pack_req(f, "hold", LIT(ID));
    ctl_inbound in = {.frames = 2,
                      .payload = f->req.sb.data,
                      .payload_len = f->req.sb.size,
                      .hold = hook_hold,
                      .msg = &token};
    assert_int_equal(ctl_dispatch_message(&f->d, &in, &delimited), CTL_DISPATCH_REPLY);
    ctl_dispatch_done(&f->d);
    /* "data" and the empty view went to the hook, with the message and
     * where the bytes lie in the payload; the outside view did not. */
    assert_int_equal(the_hook.calls, 2);
    assert_ptr_equal(the_hook.msg[0], &token);
    assert_int_equal(the_hook.off[0], f->req.sb.size - 3); /* the last bytes */
    assert_int_equal(the_hook.len[0], 3);
    assert_ptr_equal(f->st.data_view.ptr, f->req.sb.data + f->req.sb.size - 3);
    assert_ptr_equal(the_hook.msg[1], &token);
    assert_int_equal(the_hook.off[1], 0);
    assert_int_equal(the_hook.len[1], 0);
    assert_ptr_equal(f->st.hold, &the_hook.hold);
    assert_null(f->st.hold_outside);
    ctl_hold_release(&f->st.hold);
    f->st.hold_empty = NULL; /* the same static hold: released once */
    assert_int_equal(the_hook.calls, 102);
}

/* Handlers run under the core's lock: its own, or the one it was given. */
static void test_handler_runs_under_the_lock(void **state)
{
    fx *f = *state;
    pthread_mutex_t mine = PTHREAD_MUTEX_INITIALIZER;
    assert_int_equal(call(f, "locked"), CTL_DISPATCH_REPLY);
    assert_true(f->st.lock_busy);
    /* Not held between requests. */
    assert_int_equal(pthread_mutex_trylock(f->d.lock), 0);
    pthread_mutex_unlock(f->d.lock);

    ctl_dispatch_fini(&f->d);
    assert_int_equal(ctl_dispatch_init(&f->d, &dt_service, &f->st, &mine, NULL,
                                       &f->err), 0);
    assert_ptr_equal(f->d.lock, &mine);
    f->st.lock_busy = 0;
    assert_int_equal(call(f, "locked"), CTL_DISPATCH_REPLY);
    assert_true(f->st.lock_busy);
    assert_int_equal(pthread_mutex_trylock(&mine), 0);
    pthread_mutex_unlock(&mine);
    ctl_dispatch_fini(&f->d);
    /* The caller's lock survives the core. */
    assert_int_equal(pthread_mutex_trylock(&mine), 0);
    pthread_mutex_unlock(&mine);
    pthread_mutex_destroy(&mine);
    assert_int_equal(ctl_dispatch_init(&f->d, &dt_service, &f->st, NULL, NULL,
                                       &f->err), 0);
}

/* ---- deadlines in ids --------------------------------------------------- */

static int64_t wall_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

/* Serve `op` with id "<unique>@<deadline>"; the verdict. */
static ctl_verdict call_by(fx *f, const char *op, int64_t deadline)
{
    char id[64];
    int n = snprintf(id, sizeof id, "0123456789ab@%lld", (long long)deadline);
    pack_req(f, op, (ctl_str){id, (size_t)n});
    return serve(f);
}

/* A request whose id's deadline passed more than the skew allowance ago is
 * skipped: no handler, nothing sent, counted in `expired` (and its op's
 * calls and dropped); one within the allowance, one in the future and one
 * without a deadline run; built-ins are answered whatever their deadline;
 * a negative allowance turns the check off. */
static void test_expired_skipped(void **state)
{
    fx *f = *state;
    int64_t now = wall_ms();
    assert_int_equal(f->d.deadline_skew_ms, CTL_DEFAULT_DEADLINE_SKEW_MS);
    assert_int_equal(CTL_DEFAULT_DEADLINE_SKEW_MS, 1000);
    static const int64_t past[] = {1, 0}; /* 1970; "@0" */
    for (size_t i = 0; i < 2; i++) {
        assert_int_equal(call_by(f, "nothing", past[i]), CTL_DISPATCH_SILENT);
        assert_int_equal(f->d.out.size, 0);
    }
    assert_int_equal(call_by(f, "nothing", now - 60000), CTL_DISPATCH_SILENT);
    assert_int_equal(call_by(f, "nope", now - 60000), CTL_DISPATCH_SILENT); /* unknown op */
    assert_int_equal(call_by(f, "note", now - 60000), CTL_DISPATCH_SILENT);
    assert_int_equal(f->st.calls, 0);
    assert_int_equal(f->st.notes, 0);
    assert_int_equal(counter(&f->d.counters.expired), 5);
    assert_int_equal(counter(&f->d.counters.requests), 5);
    assert_int_equal(counter(&f->d.counters.unknown_op), 1);
    ctl_op_stats os = {0};
    for (size_t i = 0; i < ctl_dispatch_op_count(&f->d); i++) {
        ctl_dispatch_op_stats(&f->d, i, &os);
        if (strcmp(os.name, "nothing") == 0)
            break;
    }
    assert_string_equal(os.name, "nothing");
    assert_int_equal(os.calls, 3);
    assert_int_equal(os.dropped, 3);

    /* Within the allowance (late by less than a second), in the future,
     * without a deadline, or not a deadline at all: served. */
    static const int64_t fine[] = {0, 60000, -200}; /* from now */
    for (size_t i = 0; i < 3; i++)
        assert_int_equal(call_by(f, "nothing", wall_ms() + fine[i]), CTL_DISPATCH_REPLY);
    static const ctl_str plain[] = {{"", 0}, {"0123456789ab", 12}, {"x@", 2},
                                    {"x@12345678901234567", 19}, {"x@1a", 4}};
    for (size_t i = 0; i < sizeof plain / sizeof plain[0]; i++) {
        pack_req(f, "nothing", plain[i]);
        assert_int_equal(serve(f), CTL_DISPATCH_REPLY);
    }
    assert_int_equal(f->st.calls, 8);
    assert_int_equal(counter(&f->d.counters.expired), 5);

    /* Built-ins answer whatever their deadline. */
    assert_int_equal(call_by(f, "_health", 1), CTL_DISPATCH_REPLY);
    assert_int_equal(call_by(f, "_stats", 1), CTL_DISPATCH_REPLY);
    assert_int_equal(counter(&f->d.counters.expired), 5);

    /* A larger allowance lets an older deadline through. */
    f->d.deadline_skew_ms = 120000;
    assert_int_equal(call_by(f, "nothing", now - 60000), CTL_DISPATCH_REPLY);
    assert_int_equal(call_by(f, "nothing", now - 240000), CTL_DISPATCH_SILENT);
    /* Negative: no check at all. */
    f->d.deadline_skew_ms = -1;
    assert_int_equal(call_by(f, "nothing", 1), CTL_DISPATCH_REPLY);
    assert_int_equal(call_by(f, "note", 1), CTL_DISPATCH_SILENT);
    assert_int_equal(f->st.calls, 11);
    assert_int_equal(f->st.notes, 1);
    assert_int_equal(counter(&f->d.counters.expired), 6);
    /* A draining core skips an expired request too (nothing to answer). */
    f->d.deadline_skew_ms = 0;
    f->d.draining = true;
    assert_int_equal(call_by(f, "nothing", 1), CTL_DISPATCH_SILENT);
    assert_int_equal(counter(&f->d.counters.expired), 7);
}

/* ---- counters -------------------------------------------------------- */

static void test_counters(void **state)
{
    fx *f = *state;
    bool delimited;
    assert_int_equal(call(f, "nothing"), CTL_DISPATCH_REPLY);
    assert_int_equal(call(f, "nope"), CTL_DISPATCH_REPLY);
    assert_int_equal(call(f, "note"), CTL_DISPATCH_SILENT);
    assert_int_equal(serve_framed(f, 1, 0, &delimited), CTL_DISPATCH_DROPPED);
    tu_buf_reset(&f->req);
    assert_int_equal(serve(f), CTL_DISPATCH_DROPPED);
    assert_int_equal(counter(&f->d.counters.requests), 3);
    assert_int_equal(counter(&f->d.counters.dropped), 2);
    /* Replies and send failures are the transport's to count. */
    assert_int_equal(counter(&f->d.counters.replies), 0);
    ctl_dispatch_sent(&f->d, true);
    ctl_dispatch_sent(&f->d, true);
    ctl_dispatch_sent(&f->d, false);
    assert_int_equal(counter(&f->d.counters.replies), 2);
    assert_int_equal(counter(&f->d.counters.send_failures), 1);
}

int main(void)
{
#define T(fn) cmocka_unit_test_setup_teardown(fn, setup, teardown)
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_init_checks_the_service),
        T(test_frames_router_and_req_style),
        T(test_frames_bad_dropped_and_counted),
        T(test_unusable_payload_dropped),
        T(test_unknown_notify_dropped),
        T(test_unknown_op_named),
        T(test_bad_args_refused),
        T(test_limits_applied),
        T(test_notify_never_answered),
        T(test_draining_answers_busy),
        T(test_bytes_in_every_frame),
        T(test_bare_failure_is_generic_protocol),
        T(test_partial_result_discarded),
        T(test_fail_error_kinds),
        T(test_empty_result_is_nil),
        T(test_ids_echoed),
        T(test_long_ids_dropped),
        T(test_error_reply_bounded),
        T(test_req_alloc),
        T(test_hold_copies_plain_buffer),
        T(test_hold_uses_transport_hook),
        T(test_handler_runs_under_the_lock),
        T(test_counters),
        T(test_expired_skipped),
    };
#undef T
    return cmocka_run_group_tests(tests, NULL, NULL);
}
