/*
 * test_server.c - the ROUTER server seen from raw ZeroMQ peers (server.h).
 *
 * Requests here are packed with msgpack-c and sent over plain libzmq
 * DEALER and REQ sockets, so what is checked is the wire of docs/PROTOCOL.md, not
 * agreement with the runtime's own client. Every wait is bounded: "nothing
 * came back" is checked by polling for a fixed window.
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

#include <zmq.h>

#include "testutil.h"

#define REPLY_MS 5000  /* generous wait for a reply that must come */
#define SILENCE_MS 200 /* window in which nothing may come */

typedef struct fx {
    tu_unit unit;
    void *ctx;
    void *dealer;
    ctl_error err;
    tu_buf req;
    tu_buf args;
    msgpack_zone zone;
    tu_rx rx;
    tu_reply rep;
} fx;

static int setup(void **state)
{
    fx *f = calloc(1, sizeof *f);
    if (f == NULL)
        return -1;
    ctl_error_init(&f->err);
    tu_buf_init(&f->req);
    tu_buf_init(&f->args);
    msgpack_zone_init(&f->zone, 4096);
    if (tu_unit_start(&f->unit, NULL, &f->err) != 0) {
        fprintf(stderr, "unit start failed: %s\n", f->err.msg ? f->err.msg : "?");
        return -1;
    }
    f->ctx = zmq_ctx_new();
    f->dealer = tu_raw_connect(f->ctx, ZMQ_DEALER, f->unit.endpoint);
    if (f->dealer == NULL)
        return -1;
    *state = f;
    return 0;
}

static int teardown(void **state)
{
    fx *f = *state;
    tu_rx_free(&f->rx);
    if (f->dealer)
        zmq_close(f->dealer);
    tu_unit_stop(&f->unit);
    if (f->ctx)
        zmq_ctx_term(f->ctx);
    msgpack_zone_destroy(&f->zone);
    tu_buf_fini(&f->req);
    tu_buf_fini(&f->args);
    ctl_error_fini(&f->err);
    free(f);
    return 0;
}

/* Send [op, id, args-in-f->args] from the raw DEALER. */
static void send_req(fx *f, const char *op, const void *id, size_t id_len)
{
    tu_buf_reset(&f->req);
    tu_pack_request(&f->req, op, id, id_len, f->args.sb.data, f->args.sb.size);
    assert_int_equal(tu_raw_send(f->dealer, f->req.sb.data, f->req.sb.size), 0);
}

/* Receive one reply on the raw DEALER and parse it into f->rep. */
static void recv_reply(fx *f)
{
    tu_rx_free(&f->rx);
    msgpack_zone_clear(&f->zone);
    if (tu_raw_recv(f->dealer, REPLY_MS, &f->rx) != 0)
        fail_msg("no reply within %d ms", REPLY_MS);
    assert_int_equal(f->rx.nframes, 1);
    assert_int_equal(tu_parse_reply(f->rx.frame[0], f->rx.len[0], &f->zone, &f->rep), 0);
}

static void assert_id(const tu_reply *r, const void *id, size_t len)
{
    assert_int_equal(r->id_len, len);
    if (len)
        assert_memory_equal(r->id, id, len);
}

/* The reply is a Protocol error whose message contains `needle`. */
static void assert_protocol_error(const tu_reply *r, const char *needle)
{
    assert_false(r->ok);
    assert_int_equal(r->body.type, MSGPACK_OBJECT_MAP);
    assert_true(tu_obj_is_str(tu_obj_get(&r->body, "kind"), "Protocol"));
    const msgpack_object *msg = tu_obj_get(&r->body, "msg");
    assert_non_null(msg);
    assert_int_equal(msg->type, MSGPACK_OBJECT_STR);
    if (needle != NULL) {
        char buf[512];
        size_t n = msg->via.str.size < sizeof buf - 1 ? msg->via.str.size : sizeof buf - 1;
        memcpy(buf, msg->via.str.ptr, n);
        buf[n] = '\0';
        if (strstr(buf, needle) == NULL)
            fail_msg("error message \"%s\" does not name \"%s\"", buf, needle);
    }
}

/* ---- creation ---------------------------------------------------------------- */

static void test_endpoint_is_concrete(void **state)
{
    fx *f = *state;
    const char *ep = ctl_server_endpoint(f->unit.server);
    ctl_endpoint parsed;
    assert_non_null(ep);
    assert_true(strncmp(ep, "tcp://127.0.0.1:", 16) == 0);
    assert_int_equal(ctl_endpoint_parse(ep, &parsed, &f->err), 0);
    assert_false(parsed.any_port);
    assert_true(parsed.port > 0);
}

static void test_new_bad_endpoint(void **state)
{
    fx *f = *state;
    const char *bad[] = {"udp://127.0.0.1:1", "tcp://127.0.0.1", "nonsense",
                         "tcp://127.0.0.1:70000"};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        ctl_server_options o;
        ctl_server *s = (ctl_server *)&o; /* must be reset to NULL */
        ctl_server_options_init(&o);
        o.endpoint = bad[i];
        assert_int_equal(ctl_server_new(&tu_service, NULL, &o, &s, &f->err), CTL_INVALID);
        assert_null(s);
        assert_int_equal(f->err.kind, CTL_INVALID);
        if (strstr(f->err.msg, bad[i]) == NULL)
            fail_msg("message does not name \"%s\": \"%s\"", bad[i], f->err.msg);
    }
}

static void test_new_bad_service(void **state)
{
    fx *f = *state;
    ctl_server_options o;
    ctl_server *s = NULL;
    ctl_server_options_init(&o);
    o.endpoint = "tcp://127.0.0.1:*";
    assert_int_equal(ctl_server_new(NULL, NULL, &o, &s, &f->err), CTL_INVALID);
    assert_null(s);
    const ctl_service no_ops = {.name = "broken", .ops = NULL, .op_count = 3};
    assert_int_equal(ctl_server_new(&no_ops, NULL, &o, &s, &f->err), CTL_INVALID);
    assert_null(s);
    /* Refused by the dispatch core after it allocated its index: nothing
     * is freed twice on the way out (ASan checks). */
    const ctl_op twice[] = {{.name = "a", .handler = tu_service.ops[0].handler},
                            {.name = "a", .handler = tu_service.ops[0].handler}};
    const ctl_service dup = {.name = "dup", .ops = twice, .op_count = 2};
    assert_int_equal(ctl_server_new(&dup, NULL, &o, &s, &f->err), CTL_INVALID);
    assert_string_equal(f->err.msg, "service dup: op 'a' is declared twice");
    assert_null(s);
    assert_int_equal(ctl_server_new(&tu_service, NULL, &o, NULL, &f->err), CTL_INVALID);
}

static void test_new_port_in_use(void **state)
{
    fx *f = *state;
    ctl_server_options o;
    ctl_server *s = NULL;
    ctl_server_options_init(&o);
    o.endpoint = f->unit.endpoint;
    assert_int_equal(ctl_server_new(&tu_service, NULL, &o, &s, &f->err), CTL_TRANSFER);
    assert_null(s);
    assert_int_equal(f->err.kind, CTL_TRANSFER);
    if (strstr(f->err.msg, f->unit.endpoint) == NULL)
        fail_msg("bind failure does not name the endpoint: \"%s\"", f->err.msg);
}

static void test_default_endpoint_uses_node_ip(void **state)
{
    fx *f = *state;
    char *saved = getenv(CTL_NODE_IP_ENV) ? strdup(getenv(CTL_NODE_IP_ENV)) : NULL;
    ctl_server *s = NULL;
    setenv(CTL_NODE_IP_ENV, "127.0.0.1", 1);
    int rc = ctl_server_new(&tu_service, NULL, NULL, &s, &f->err);
    if (saved) {
        setenv(CTL_NODE_IP_ENV, saved, 1);
        free(saved);
    } else {
        unsetenv(CTL_NODE_IP_ENV);
    }
    assert_int_equal(rc, 0);
    assert_true(strncmp(ctl_server_endpoint(s), "tcp://127.0.0.1:", 16) == 0);
    assert_string_not_equal(ctl_server_endpoint(s), "tcp://127.0.0.1:0");
    ctl_server_destroy(&s);
    assert_null(s);
}

/* ---- request / reply ---------------------------------------------------------- */

static void test_echo_over_dealer(void **state)
{
    fx *f = *state;
    msgpack_pack_map(&f->args.pk, 2);
    tu_pk_str(&f->args.pk, "a");
    msgpack_pack_int(&f->args.pk, 1);
    tu_pk_str(&f->args.pk, "b");
    msgpack_pack_bin(&f->args.pk, 3);
    msgpack_pack_bin_body(&f->args.pk, "x\0y", 3);
    send_req(f, "echo", "abcdef012345", 12);
    recv_reply(f);
    assert_id(&f->rep, "abcdef012345", 12);
    assert_true(f->rep.ok);
    assert_true(tu_obj_packs_to(&f->rep.body, f->args.sb.data, f->args.sb.size));

    ctl_server_stats st;
    tu_server_stats_wait(f->unit.server, &st, 1, REPLY_MS);
    assert_int_equal(st.requests, 1);
    assert_int_equal(st.replies, 1);
    assert_int_equal(st.dropped, 0);
}

static void test_ids_echoed_unchanged(void **state)
{
    fx *f = *state;
    msgpack_pack_map(&f->args.pk, 0);
    send_req(f, "echo", "", 0);
    recv_reply(f);
    assert_id(&f->rep, "", 0);
    assert_true(f->rep.ok);
    send_req(f, "echo", "\0\0x\0", 4);
    recv_reply(f);
    assert_id(&f->rep, "\0\0x\0", 4);
    char big[256]; /* the longest a unit takes */
    for (size_t i = 0; i < sizeof big; i++)
        big[i] = (char)(i * 7);
    send_req(f, "whoami", big, sizeof big);
    recv_reply(f);
    assert_id(&f->rep, big, sizeof big);
    /* The handler saw the same op and id. */
    assert_int_equal(f->rep.body.type, MSGPACK_OBJECT_ARRAY);
    assert_int_equal(f->rep.body.via.array.size, 2);
    assert_true(tu_obj_is_str(&f->rep.body.via.array.ptr[0], "whoami"));
    assert_int_equal(f->rep.body.via.array.ptr[1].via.str.size, sizeof big);
    assert_memory_equal(f->rep.body.via.array.ptr[1].via.str.ptr, big, sizeof big);
}

static void test_req_socket_gets_answer(void **state)
{
    fx *f = *state;
    void *req = tu_raw_connect(f->ctx, ZMQ_REQ, f->unit.endpoint);
    tu_rx rx;
    assert_non_null(req);
    msgpack_pack_map(&f->args.pk, 1);
    tu_pk_str(&f->args.pk, "k");
    tu_pk_str(&f->args.pk, "v");
    tu_pack_request(&f->req, "echo", "req-1", 5, f->args.sb.data, f->args.sb.size);
    assert_int_equal(tu_raw_send(req, f->req.sb.data, f->req.sb.size), 0);
    int got = tu_raw_recv(req, REPLY_MS, &rx);
    zmq_close(req);
    assert_int_equal(got, 0);
    assert_int_equal(rx.nframes, 1); /* REQ strips the delimiter */
    assert_int_equal(tu_parse_reply(rx.frame[0], rx.len[0], &f->zone, &f->rep), 0);
    assert_id(&f->rep, "req-1", 5);
    assert_true(f->rep.ok);
    assert_true(tu_obj_packs_to(&f->rep.body, f->args.sb.data, f->args.sb.size));
    tu_rx_free(&rx);
}

static void test_delimiter_frame_is_echoed(void **state)
{
    fx *f = *state;
    tu_pack_request(&f->req, "echo", "d-1", 3, NULL, 0);
    const void *frames[2] = {"", f->req.sb.data};
    size_t lens[2] = {0, f->req.sb.size};
    assert_int_equal(tu_raw_send_frames(f->dealer, frames, lens, 2), 0);
    tu_rx_free(&f->rx);
    assert_int_equal(tu_raw_recv(f->dealer, REPLY_MS, &f->rx), 0);
    assert_int_equal(f->rx.nframes, 2);
    assert_int_equal(f->rx.len[0], 0);
    assert_int_equal(tu_parse_reply(f->rx.frame[1], f->rx.len[1], &f->zone, &f->rep), 0);
    assert_id(&f->rep, "d-1", 3);
}

static void test_unknown_op_names_it(void **state)
{
    fx *f = *state;
    send_req(f, "no_such_op_xyz", "u1", 2);
    recv_reply(f);
    assert_id(&f->rep, "u1", 2);
    assert_protocol_error(&f->rep, "no_such_op_xyz");
    ctl_server_stats st;
    tu_server_stats_wait(f->unit.server, &st, 1, REPLY_MS);
    assert_int_equal(st.requests, 1);
    assert_int_equal(st.replies, 1);
    assert_int_equal(atomic_load(&f->unit.calls), 0);
}

static void test_bad_args_not_map(void **state)
{
    fx *f = *state;
    /* args: an array, an int, a string: each answered with Protocol. */
    static const unsigned char argsv[][4] = {{0x92, 0x01, 0x02}, {0x2a}, {0xa1, 'x'}};
    static const size_t argsl[] = {3, 1, 2};
    for (size_t i = 0; i < 3; i++) {
        tu_buf_reset(&f->req);
        msgpack_pack_array(&f->req.pk, 3);
        tu_pk_str(&f->req.pk, "echo");
        tu_pk_str(&f->req.pk, "ba");
        msgpack_sbuffer_write(&f->req.sb, (const char *)argsv[i], argsl[i]);
        assert_int_equal(tu_raw_send(f->dealer, f->req.sb.data, f->req.sb.size), 0);
        recv_reply(f);
        assert_id(&f->rep, "ba", 2);
        assert_protocol_error(&f->rep, NULL);
    }
    assert_int_equal(atomic_load(&f->unit.calls), 0);
}

/* ---- error replies ------------------------------------------------------------- */

static void pack_fail_args(tu_buf *a, const char *kind)
{
    tu_buf_reset(a);
    msgpack_pack_map(&a->pk, 3);
    tu_pk_str(&a->pk, "kind");
    tu_pk_str(&a->pk, kind);
    tu_pk_str(&a->pk, "reason");
    tu_pk_str(&a->pk, "pinned");
    tu_pk_str(&a->pk, "blobs");
    msgpack_pack_array(&a->pk, 2);
    tu_pk_str(&a->pk, "b1");
    tu_pk_strn(&a->pk, "b\0002", 3);
}

static void check_error_map_shape(const msgpack_object *body)
{
    assert_int_equal(body->type, MSGPACK_OBJECT_MAP);
    assert_int_equal(body->via.map.size, 4);
    assert_non_null(tu_obj_get(body, "kind"));
    assert_non_null(tu_obj_get(body, "msg"));
    assert_non_null(tu_obj_get(body, "reason"));
    assert_non_null(tu_obj_get(body, "blobs"));
    assert_int_equal(tu_obj_get(body, "msg")->type, MSGPACK_OBJECT_STR);
}

static void test_error_maps_on_the_wire(void **state)
{
    fx *f = *state;
    const msgpack_object *o;

    pack_fail_args(&f->args, "UnitFull");
    send_req(f, "fail", "e1", 2);
    recv_reply(f);
    assert_false(f->rep.ok);
    check_error_map_shape(&f->rep.body);
    assert_true(tu_obj_is_str(tu_obj_get(&f->rep.body, "kind"), "UnitFull"));
    assert_int_equal(tu_obj_get(&f->rep.body, "reason")->type, MSGPACK_OBJECT_NIL);
    assert_int_equal(tu_obj_get(&f->rep.body, "blobs")->type, MSGPACK_OBJECT_NIL);

    pack_fail_args(&f->args, "Busy");
    send_req(f, "fail", "e2", 2);
    recv_reply(f);
    check_error_map_shape(&f->rep.body);
    assert_true(tu_obj_is_str(tu_obj_get(&f->rep.body, "kind"), "Busy"));
    assert_true(tu_obj_is_str(tu_obj_get(&f->rep.body, "reason"), "pinned"));
    assert_int_equal(tu_obj_get(&f->rep.body, "blobs")->type, MSGPACK_OBJECT_NIL);

    pack_fail_args(&f->args, "Missing");
    send_req(f, "fail", "e3", 2);
    recv_reply(f);
    check_error_map_shape(&f->rep.body);
    assert_true(tu_obj_is_str(tu_obj_get(&f->rep.body, "kind"), "Missing"));
    o = tu_obj_get(&f->rep.body, "blobs");
    assert_int_equal(o->type, MSGPACK_OBJECT_ARRAY);
    assert_int_equal(o->via.array.size, 2);
    assert_true(tu_obj_is_str(&o->via.array.ptr[0], "b1"));
    assert_int_equal(o->via.array.ptr[1].via.str.size, 3);
    assert_memory_equal(o->via.array.ptr[1].via.str.ptr, "b\0002", 3);
    assert_int_equal(tu_obj_get(&f->rep.body, "reason")->type, MSGPACK_OBJECT_NIL);

    pack_fail_args(&f->args, "Protocol");
    send_req(f, "fail", "e4", 2);
    recv_reply(f);
    check_error_map_shape(&f->rep.body);
    assert_protocol_error(&f->rep, TU_MSG_MARK);

    /* A handler returning -1 on its own gets a generic Protocol error. */
    pack_fail_args(&f->args, "bare");
    send_req(f, "fail", "e5", 2);
    recv_reply(f);
    assert_id(&f->rep, "e5", 2);
    check_error_map_shape(&f->rep.body);
    assert_protocol_error(&f->rep, NULL);

    /* ctl_req_fail_error: a kind that cannot cross the wire becomes
     * Protocol with its message kept; Busy keeps its reason. */
    pack_fail_args(&f->args, "error-transfer");
    send_req(f, "fail", "e6", 2);
    recv_reply(f);
    check_error_map_shape(&f->rep.body);
    assert_protocol_error(&f->rep, "prebuilt transfer");
    pack_fail_args(&f->args, "error-busy");
    send_req(f, "fail", "e7", 2);
    recv_reply(f);
    check_error_map_shape(&f->rep.body);
    assert_true(tu_obj_is_str(tu_obj_get(&f->rep.body, "kind"), "Busy"));
    assert_true(tu_obj_is_str(tu_obj_get(&f->rep.body, "reason"), "draining"));
}

static void test_results_nil_and_arena(void **state)
{
    fx *f = *state;
    send_req(f, "nothing", "n1", 2);
    recv_reply(f);
    assert_true(f->rep.ok);
    assert_int_equal(f->rep.body.type, MSGPACK_OBJECT_NIL);

    tu_buf_reset(&f->args);
    msgpack_pack_map(&f->args.pk, 1);
    tu_pk_str(&f->args.pk, "n");
    msgpack_pack_int(&f->args.pk, 1 << 20);
    send_req(f, "alloc", "a1", 2);
    recv_reply(f);
    assert_true(f->rep.ok);
    assert_int_equal(f->rep.body.type, MSGPACK_OBJECT_BIN);
    assert_int_equal(f->rep.body.via.bin.size, 1 << 20);
    for (size_t i = 0; i < (1u << 20); i += 4099)
        assert_int_equal((unsigned char)f->rep.body.via.bin.ptr[i], i & 0xff);
}

/* A unit with max_reply_bytes: a hand-written handler's reply over it is
 * refused with a Protocol error that says so (its packing stops at the
 * bound), one under it is served, and the unit goes on. */
static void test_reply_bound(void **state)
{
    fx *f = *state;
    ctl_server_options so;
    ctl_server_options_init(&so);
    so.max_reply_bytes = 64 * 1024;
    tu_unit u;
    assert_int_equal(tu_unit_start(&u, &so, &f->err), 0);
    void *d = tu_raw_connect(f->ctx, ZMQ_DEALER, u.endpoint);
    assert_non_null(d);
    const int sizes[] = {100 * 1024, 1000, 64 * 1024, 60 * 1024};
    const bool fits[] = {false, true, false, true};
    for (size_t i = 0; i < 4; i++) {
        tu_buf_reset(&f->args);
        msgpack_pack_map(&f->args.pk, 1);
        tu_pk_str(&f->args.pk, "n");
        msgpack_pack_int(&f->args.pk, sizes[i]);
        tu_buf_reset(&f->req);
        tu_pack_request(&f->req, "alloc", "b1", 2, f->args.sb.data, f->args.sb.size);
        assert_int_equal(tu_raw_send(d, f->req.sb.data, f->req.sb.size), 0);
        tu_rx_free(&f->rx);
        msgpack_zone_clear(&f->zone);
        assert_int_equal(tu_raw_recv(d, REPLY_MS, &f->rx), 0);
        assert_int_equal(tu_parse_reply(f->rx.frame[0], f->rx.len[0], &f->zone, &f->rep), 0);
        if (fits[i]) {
            assert_true(f->rep.ok);
            assert_int_equal(f->rep.body.via.bin.size, sizes[i]);
        } else {
            assert_protocol_error(&f->rep, "op 'alloc': the reply is larger than this unit's "
                                           "max_reply_bytes (65536 bytes)");
        }
    }
    zmq_close(d);
    tu_unit_stop(&u);
}

/* A peer that sends requests and does not read the replies: once the
 * large replies queued for its connection reach max_queued_reply_bytes,
 * its further requests are answered Busy "replies_unread" without running;
 * once it has read them, it is served again. */
static void test_unread_replies_bound(void **state)
{
    fx *f = *state;
    enum { N = 200, SIZE = 256 * 1024 };
    ctl_server_options so;
    ctl_server_options_init(&so);
    so.max_queued_reply_bytes = 1 << 20;
    tu_unit u;
    assert_int_equal(tu_unit_start(&u, &so, &f->err), 0);
    /* A peer that reads as little as it can: a small kernel buffer, one
     * message in its pipe. */
    void *d = zmq_socket(f->ctx, ZMQ_DEALER);
    int zero = 0, one = 1, rcvbuf = 4096;
    zmq_setsockopt(d, ZMQ_LINGER, &zero, sizeof zero);
    zmq_setsockopt(d, ZMQ_RCVHWM, &one, sizeof one);
    zmq_setsockopt(d, ZMQ_RCVBUF, &rcvbuf, sizeof rcvbuf);
    assert_int_equal(zmq_connect(d, u.endpoint), 0);
    tu_buf_reset(&f->args);
    msgpack_pack_map(&f->args.pk, 1);
    tu_pk_str(&f->args.pk, "n");
    msgpack_pack_int(&f->args.pk, SIZE);
    for (int i = 0; i < N; i++) {
        char id[16];
        int len = snprintf(id, sizeof id, "q%d", i);
        tu_buf_reset(&f->req);
        tu_pack_request(&f->req, "alloc", id, (size_t)len, f->args.sb.data, f->args.sb.size);
        assert_int_equal(tu_raw_send(d, f->req.sb.data, f->req.sb.size), 0);
    }
    /* Every request answered or refused before the peer reads a thing. */
    ctl_server_stats st;
    int64_t until = tu_now_ms() + 30000;
    do {
        tu_sleep_ms(5);
        ctl_server_stats_get(u.server, &st);
    } while (st.requests < N && tu_now_ms() < until);
    assert_int_equal(st.requests, N);
    int served = 0, busy = 0;
    for (int i = 0; i < N; i++) {
        tu_rx_free(&f->rx);
        msgpack_zone_clear(&f->zone);
        assert_int_equal(tu_raw_recv(d, 30000, &f->rx), 0);
        assert_int_equal(tu_parse_reply(f->rx.frame[0], f->rx.len[0], &f->zone, &f->rep), 0);
        if (f->rep.ok) {
            assert_int_equal(f->rep.body.via.bin.size, SIZE);
            served++;
            continue;
        }
        assert_true(tu_obj_is_str(tu_obj_get(&f->rep.body, "kind"), "Busy"));
        assert_true(tu_obj_is_str(tu_obj_get(&f->rep.body, "reason"), "replies_unread"));
        const msgpack_object *msg = tu_obj_get(&f->rep.body, "msg");
        assert_non_null(msg);
        char buf[256];
        size_t n = msg->via.str.size < sizeof buf - 1 ? msg->via.str.size : sizeof buf - 1;
        memcpy(buf, msg->via.str.ptr, n);
        buf[n] = '\0';
        if (!strstr(buf, "op 'alloc': ") || !strstr(buf, "(max_queued_reply_bytes 1048576)"))
            fail_msg("unexpected Busy message: %s", buf);
        busy++;
    }
    /* Refused ones did not run; the kernel buffers took some, then the
     * bound held: at most 1 MiB plus one reply queued beyond them. */
    assert_true(busy > 0);
    assert_int_equal(served + busy, N);
    assert_int_equal(atomic_load(&u.calls), served);
    /* Read: served again, on the same connection. */
    tu_buf_reset(&f->req);
    tu_pack_request(&f->req, "alloc", "after", 5, f->args.sb.data, f->args.sb.size);
    int64_t again = tu_now_ms() + 10000;
    for (;;) {
        assert_int_equal(tu_raw_send(d, f->req.sb.data, f->req.sb.size), 0);
        tu_rx_free(&f->rx);
        msgpack_zone_clear(&f->zone);
        assert_int_equal(tu_raw_recv(d, 30000, &f->rx), 0);
        assert_int_equal(tu_parse_reply(f->rx.frame[0], f->rx.len[0], &f->zone, &f->rep), 0);
        /* ZeroMQ frees the last reply read a moment after its bytes left. */
        if (f->rep.ok || tu_now_ms() > again)
            break;
        tu_sleep_ms(5);
    }
    assert_true(f->rep.ok);
    zmq_close(d);
    tu_unit_stop(&u);
}

/* Large requests and replies, one after another, through buffers the
 * runtime keeps between calls: each reply carries its own request's
 * bytes, never a kept buffer's earlier ones. */
static void test_large_payloads_in_kept_buffers(void **state)
{
    fx *f = *state;
    enum { SIZE = 20 << 20 };
    char *blob = malloc(SIZE);
    assert_non_null(blob);
    ctl_client *c = NULL;
    assert_int_equal(ctl_client_new(NULL, &c, &f->err), 0);
    for (int round = 0; round < 4; round++) {
        memset(blob, 'a' + round, SIZE);
        blob[round] = 'x';
        tu_buf_reset(&f->args);
        msgpack_pack_map(&f->args.pk, 2);
        tu_pk_str(&f->args.pk, "field");
        tu_pk_str(&f->args.pk, "v");
        tu_pk_str(&f->args.pk, "v");
        msgpack_pack_bin(&f->args.pk, SIZE);
        msgpack_pack_bin_body(&f->args.pk, blob, SIZE);
        ctl_reply *reply = NULL;
        assert_int_equal(ctl_client_call(c, f->unit.endpoint, "echo", f->args.sb.data,
                                         f->args.sb.size, 30000, &reply, &f->err),
                         0);
        const msgpack_object *r = ctl_reply_result(reply);
        assert_int_equal(r->type, MSGPACK_OBJECT_BIN);
        assert_int_equal(r->via.bin.size, SIZE);
        assert_memory_equal(r->via.bin.ptr, blob, SIZE);
        ctl_reply_destroy(&reply);
    }
    ctl_client_destroy(&c);
    free(blob);
}

/* ---- notify ops ------------------------------------------------------------------ */

static void test_notify_sends_nothing(void **state)
{
    fx *f = *state;
    msgpack_pack_map(&f->args.pk, 1);
    tu_pk_str(&f->args.pk, "v");
    msgpack_pack_int(&f->args.pk, 77);
    send_req(f, "note", "", 0);
    tu_rx_free(&f->rx);
    assert_int_equal(tu_raw_recv(f->dealer, SILENCE_MS, &f->rx), -1);
    assert_int_equal(atomic_load(&f->unit.notes), 1);
    assert_int_equal(atomic_load(&f->unit.last_note_v), 77);
    /* Even with a non-empty id: the op is declared no-reply. */
    send_req(f, "note", "has-an-id", 9);
    assert_int_equal(tu_raw_recv(f->dealer, SILENCE_MS, &f->rx), -1);
    assert_int_equal(tu_wait_atleast(&f->unit.notes, 2, REPLY_MS), 2);
    /* The next reply on this socket is the next call's, not a notify's. */
    tu_buf_reset(&f->args);
    send_req(f, "notes", "after", 5);
    recv_reply(f);
    assert_id(&f->rep, "after", 5);
    assert_int_equal(f->rep.body.via.u64, 2);
    ctl_server_stats st;
    tu_server_stats_wait(f->unit.server, &st, 1, REPLY_MS);
    assert_int_equal(st.replies, 1);
}

static void test_failing_notify_sends_nothing(void **state)
{
    fx *f = *state;
    send_req(f, "note_fail", "", 0);
    send_req(f, "note_fail", "with-id", 7);
    tu_rx_free(&f->rx);
    assert_int_equal(tu_raw_recv(f->dealer, SILENCE_MS, &f->rx), -1);
    assert_int_equal(tu_wait_atleast(&f->unit.note_fails, 2, REPLY_MS), 2);
    /* Bad args to a notify op: still nothing. */
    tu_buf_reset(&f->req);
    msgpack_pack_array(&f->req.pk, 3);
    tu_pk_str(&f->req.pk, "note");
    tu_pk_str(&f->req.pk, "x");
    msgpack_pack_int(&f->req.pk, 5);
    assert_int_equal(tu_raw_send(f->dealer, f->req.sb.data, f->req.sb.size), 0);
    assert_int_equal(tu_raw_recv(f->dealer, SILENCE_MS, &f->rx), -1);
    ctl_server_stats st;
    ctl_server_stats_get(f->unit.server, &st);
    assert_int_equal(st.replies, 0);
    assert_int_equal(st.send_failures, 0);
}

/* ---- the lock ---------------------------------------------------------------------- */

static void test_handlers_run_under_the_lock(void **state)
{
    fx *f = *state;
    send_req(f, "locked", "l1", 2);
    recv_reply(f);
    assert_true(f->rep.ok);
    assert_int_equal(f->rep.body.type, MSGPACK_OBJECT_BOOLEAN);
    assert_true(f->rep.body.via.boolean);
    /* Outside a handler the lock is free. */
    pthread_mutex_t *lock = ctl_server_lock(f->unit.server);
    assert_int_equal(pthread_mutex_trylock(lock), 0);
    pthread_mutex_unlock(lock);
}

typedef struct holder {
    pthread_mutex_t *lock;
    atomic_int held;
    int hold_ms;
} holder;

static void *hold_lock(void *arg)
{
    holder *h = arg;
    pthread_mutex_lock(h->lock);
    atomic_store(&h->held, 1);
    tu_sleep_ms(h->hold_ms);
    pthread_mutex_unlock(h->lock);
    return NULL;
}

/* Out-of-band work holding the lock delays handlers until it is done. */
static void test_lock_excludes_handlers(void **state)
{
    fx *f = *state;
    holder h;
    pthread_t t;
    h.lock = ctl_server_lock(f->unit.server);
    h.hold_ms = 400;
    atomic_init(&h.held, 0);
    assert_int_equal(pthread_create(&t, NULL, hold_lock, &h), 0);
    while (!atomic_load(&h.held))
        tu_sleep_ms(1);
    int64_t t0 = tu_now_ms();
    send_req(f, "echo", "w1", 2);
    recv_reply(f);
    int64_t waited = tu_now_ms() - t0;
    pthread_join(t, NULL);
    assert_true(f->rep.ok);
    if (waited < 300)
        fail_msg("handler ran while the lock was held (reply after %lld ms)",
                 (long long)waited);
}

static void test_caller_supplied_lock(void **state)
{
    fx *f = *state;
    pthread_mutex_t mine = PTHREAD_MUTEX_INITIALIZER;
    ctl_server_options o;
    tu_unit u2;
    ctl_server_options_init(&o);
    o.lock = &mine;
    assert_int_equal(tu_unit_start(&u2, &o, &f->err), 0);
    assert_ptr_equal(ctl_server_lock(u2.server), &mine);
    void *d = tu_raw_connect(f->ctx, ZMQ_DEALER, u2.endpoint);
    tu_buf_reset(&f->req);
    tu_pack_request(&f->req, "locked", "m1", 2, NULL, 0);
    tu_raw_send(d, f->req.sb.data, f->req.sb.size);
    tu_rx rx;
    int got = tu_raw_recv(d, REPLY_MS, &rx);
    zmq_close(d);
    tu_unit_stop(&u2);
    pthread_mutex_destroy(&mine);
    assert_int_equal(got, 0);
    assert_int_equal(tu_parse_reply(rx.frame[0], rx.len[0], &f->zone, &f->rep), 0);
    assert_true(f->rep.ok && f->rep.body.via.boolean);
    tu_rx_free(&rx);
}

/* ---- limits ------------------------------------------------------------------------ */

static void test_oversize_message_refused(void **state)
{
    fx *f = *state;
    ctl_server_options o;
    tu_unit u2;
    ctl_server_options_init(&o);
    o.limits.max_msg_bytes = 64 * 1024;
    assert_int_equal(tu_unit_start(&u2, &o, &f->err), 0);
    void *d = tu_raw_connect(f->ctx, ZMQ_DEALER, u2.endpoint);

    /* 1 MiB of args: ZeroMQ refuses it before the unit reads anything. */
    size_t big = 1 << 20;
    char *blob = calloc(1, big);
    tu_buf_reset(&f->args);
    msgpack_pack_map(&f->args.pk, 1);
    tu_pk_str(&f->args.pk, "b");
    msgpack_pack_bin(&f->args.pk, big);
    msgpack_pack_bin_body(&f->args.pk, blob, big);
    free(blob);
    tu_buf_reset(&f->req);
    tu_pack_request(&f->req, "echo", "big", 3, f->args.sb.data, f->args.sb.size);
    tu_raw_send(d, f->req.sb.data, f->req.sb.size);
    tu_rx rx;
    /* ZeroMQ drops the oversize message (ZMQ_MAXMSGSIZE); a runtime that
     * read it anyway must at most answer Protocol, never run the handler. */
    int got = tu_raw_recv(d, 500, &rx);
    bool answered_ok = false;
    if (got == 0) {
        msgpack_zone_clear(&f->zone);
        answered_ok = tu_parse_reply(TU_RX_PAYLOAD(&rx), TU_RX_PAYLOAD_LEN(&rx),
                                     &f->zone, &f->rep) != 0 ||
                      f->rep.ok;
        tu_rx_free(&rx);
    }
    zmq_close(d);
    int handled = atomic_load(&u2.calls);

    /* The unit still serves a small request from a fresh peer. */
    d = tu_raw_connect(f->ctx, ZMQ_DEALER, u2.endpoint);
    tu_buf_reset(&f->req);
    tu_pack_request(&f->req, "echo", "small", 5, NULL, 0);
    tu_raw_send(d, f->req.sb.data, f->req.sb.size);
    int got2 = tu_raw_recv(d, REPLY_MS, &rx);
    zmq_close(d);
    tu_unit_stop(&u2);
    assert_false(answered_ok);
    assert_int_equal(handled, 0);
    assert_int_equal(got2, 0);
    assert_int_equal(tu_parse_reply(rx.frame[0], rx.len[0], &f->zone, &f->rep), 0);
    assert_id(&f->rep, "small", 5);
    assert_true(f->rep.ok);
    tu_rx_free(&rx);
}

static void test_depth_limit_answered(void **state)
{
    fx *f = *state;
    ctl_server_options o;
    tu_unit u2;
    ctl_server_options_init(&o);
    o.limits.max_depth = 3;
    assert_int_equal(tu_unit_start(&u2, &o, &f->err), 0);
    void *d = tu_raw_connect(f->ctx, ZMQ_DEALER, u2.endpoint);
    /* envelope(1) > args map(2) > [..](3) > [..](4): one level too many */
    tu_buf_reset(&f->args);
    msgpack_pack_map(&f->args.pk, 1);
    tu_pk_str(&f->args.pk, "x");
    msgpack_pack_array(&f->args.pk, 1);
    msgpack_pack_array(&f->args.pk, 0);
    tu_buf_reset(&f->req);
    tu_pack_request(&f->req, "echo", "deep", 4, f->args.sb.data, f->args.sb.size);
    tu_raw_send(d, f->req.sb.data, f->req.sb.size);
    tu_rx rx;
    int got = tu_raw_recv(d, REPLY_MS, &rx);
    zmq_close(d);
    tu_unit_stop(&u2);
    assert_int_equal(got, 0);
    assert_int_equal(tu_parse_reply(rx.frame[0], rx.len[0], &f->zone, &f->rep), 0);
    assert_id(&f->rep, "deep", 4);
    assert_protocol_error(&f->rep, NULL);
    tu_rx_free(&rx);
}

/* ---- close ----------------------------------------------------------------------------- */

static void test_close_idle_is_prompt(void **state)
{
    fx *f = *state;
    int64_t t0 = tu_now_ms();
    ctl_server_close(f->unit.server);
    int64_t took = tu_now_ms() - t0;
    if (took > 300)
        fail_msg("closing an idle server took %lld ms", (long long)took);
    /* Closed: requests are no longer answered (the send may time out). */
    tu_pack_request(&f->req, "echo", "late", 4, NULL, 0);
    (void)tu_raw_send(f->dealer, f->req.sb.data, f->req.sb.size);
    tu_rx_free(&f->rx);
    assert_int_equal(tu_raw_recv(f->dealer, SILENCE_MS, &f->rx), -1);
    /* Stats and endpoint stay readable until destroy. */
    ctl_server_stats st;
    ctl_server_stats_get(f->unit.server, &st);
    assert_non_null(ctl_server_endpoint(f->unit.server));
}

static void test_close_twice_and_destroy_null(void **state)
{
    fx *f = *state;
    ctl_server_close(f->unit.server);
    ctl_server_close(f->unit.server);
    ctl_server_destroy(&f->unit.server);
    assert_null(f->unit.server);
    ctl_server_destroy(&f->unit.server); /* pointer to NULL */
    ctl_server_destroy(NULL);
    ctl_server_close(NULL);
}

/* An idle server drains at once (it waits only for a short quiet
 * period); drain after close, twice, or on NULL does nothing. */
static void test_drain_idle(void **state)
{
    fx *f = *state;
    send_req(f, "echo", "x", 1);
    recv_reply(f);
    int64_t t0 = tu_now_ms();
    ctl_server_drain(f->unit.server, 5000);
    assert_true(tu_now_ms() - t0 < 1000);
    ctl_server_drain(f->unit.server, 5000);
    ctl_server_close(f->unit.server);
    ctl_server_drain(NULL, 100);
    ctl_server_stats st;
    ctl_server_stats_get(f->unit.server, &st);
    assert_int_equal(st.replies, 1);
}

static void test_destroy_without_close(void **state)
{
    fx *f = *state;
    send_req(f, "echo", "x", 1);
    recv_reply(f);
    int64_t t0 = tu_now_ms();
    ctl_server_destroy(&f->unit.server);
    assert_null(f->unit.server);
    assert_true(tu_now_ms() - t0 < 1000);
}

/* ---- holding request bytes past the handler ------------------------- */

/* A unit of `svc` (handlers get `user`) on a free loopback port, and a
 * client to call it. */
static void serve_on_loopback(const ctl_service *svc, void *user, ctl_server **s,
                              ctl_client **c, ctl_error *err)
{
    ctl_server_options so;
    ctl_server_options_init(&so);
    so.endpoint = "tcp://127.0.0.1:*";
    assert_int_equal(ctl_server_new(svc, user, &so, s, err), 0);
    assert_int_equal(ctl_client_new(NULL, c, err), 0);
}

typedef struct keeper {
    ctl_hold *held[2];
    int n;
    int outside_refused;
} keeper;

static int op_keep(void *user, const msgpack_object *args, ctl_req *req)
{
    keeper *k = user;
    ctl_str b;
    if (!ctl_obj_bin(ctl_obj_get(args, "b"), &b) || k->n == 2)
        return ctl_req_fail(req, CTL_PROTOCOL, "keep: need a bin 'b'");
    k->held[k->n++] = ctl_req_hold(req, b);
    static const char elsewhere[] = "not in the message";
    k->outside_refused = ctl_req_hold(req, (ctl_str){elsewhere, 5}) == NULL;
    return 0;
}

/* A small and a large bin held by a handler read back intact after the
 * request's message is gone; a view from outside the message is refused. */
static void test_hold_outlives_the_request(void **state)
{
    (void)state;
    static const ctl_op ops[] = {{.name = "keep", .handler = op_keep}};
    const ctl_service svc = {.name = "keeper", .ops = ops, .op_count = 1};
    keeper k = {{NULL, NULL}, 0, 0};
    ctl_server *s = NULL;
    ctl_client *c = NULL;
    ctl_error err;
    ctl_error_init(&err);
    serve_on_loopback(&svc, &k, &s, &c, &err);

    size_t sizes[2] = {7, (size_t)1 << 20};
    unsigned char *data[2];
    for (int i = 0; i < 2; i++) {
        data[i] = malloc(sizes[i]);
        for (size_t j = 0; j < sizes[i]; j++)
            data[i][j] = (unsigned char)(j * 7 + (size_t)i);
        tu_buf args;
        tu_buf_init(&args);
        msgpack_pack_map(&args.pk, 1);
        tu_pk_str(&args.pk, "b");
        msgpack_pack_bin_with_body(&args.pk, data[i], sizes[i]);
        ctl_reply *reply = NULL;
        assert_int_equal(ctl_client_call(c, ctl_server_endpoint(s), "keep", args.sb.data,
                                         args.sb.size, 5000, &reply, &err), 0);
        ctl_reply_destroy(&reply);
        tu_buf_fini(&args);
    }
    ctl_server_destroy(&s); /* every request message is gone from the unit */
    assert_int_equal(k.n, 2);
    assert_true(k.outside_refused);
    for (int i = 0; i < 2; i++) {
        assert_non_null(k.held[i]);
        ctl_str v = ctl_hold_view(k.held[i]);
        assert_int_equal(v.len, sizes[i]);
        assert_memory_equal(v.ptr, data[i], sizes[i]);
        ctl_hold_release(&k.held[i]);
        assert_null(k.held[i]);
        free(data[i]);
    }
    ctl_hold_release(NULL);
    ctl_client_destroy(&c);
    ctl_error_fini(&err);
}

/* ---- replies that carry held bytes or a blob without a copy ---------- */

typedef struct sharer {
    ctl_hold *a, *b; /* the two bins of one keep2 request */
    ctl_blob *blob;
} sharer;

static int op_keep2(void *user, const msgpack_object *args, ctl_req *req)
{
    sharer *sh = user;
    ctl_str a, b;
    if (!ctl_obj_bin(ctl_obj_get(args, "a"), &a) || !ctl_obj_bin(ctl_obj_get(args, "b"), &b))
        return ctl_req_fail(req, CTL_PROTOCOL, "keep2: need bins 'a' and 'b'");
    ctl_hold_release(&sh->a);
    ctl_hold_release(&sh->b);
    sh->a = ctl_req_hold(req, a);
    sh->b = ctl_req_hold(req, b);
    return sh->a && sh->b ? 0 : ctl_req_fail(req, CTL_PROTOCOL, "keep2: out of memory");
}

/* Answer with the bytes of hold a or b, shared with the reply. */
static int op_give(void *user, const msgpack_object *args, ctl_req *req)
{
    sharer *sh = user;
    ctl_str which;
    if (!ctl_obj_str(ctl_obj_get(args, "which"), &which) || which.len != 1)
        return ctl_req_fail(req, CTL_PROTOCOL, "give: need 'which'");
    ctl_hold *h = which.ptr[0] == 'a' ? sh->a : sh->b;
    if (!h)
        return ctl_req_fail(req, CTL_PROTOCOL, "give: nothing held");
    ctl_req_share(req, h);
    return ctl_pack_bin(ctl_req_packer(req), ctl_hold_view(h));
}

/* Answer with the whole blob, then a short string after it in an array. */
static int op_blob(void *user, const msgpack_object *args, ctl_req *req)
{
    sharer *sh = user;
    msgpack_packer *pk = ctl_req_packer(req);
    (void)args;
    return msgpack_pack_array(pk, 2) || ctl_pack_bin(pk, ctl_blob_bin(sh->blob, 0, SIZE_MAX)) ||
                   ctl_pack_cstr(pk, "after")
               ? -1
               : 0;
}

static void call_bin(ctl_client *c, const char *address, const char *op, const char *which,
                     const unsigned char *want, size_t len)
{
    tu_buf args;
    ctl_error err;
    ctl_reply *reply = NULL;
    ctl_str got;
    ctl_error_init(&err);
    tu_buf_init(&args);
    msgpack_pack_map(&args.pk, which ? 1 : 0);
    if (which) {
        tu_pk_str(&args.pk, "which");
        tu_pk_str(&args.pk, which);
    }
    int rc = ctl_client_call(c, address, op, args.sb.data, args.sb.size, 5000, &reply, &err);
    if (rc != 0)
        fail_msg("%s: %s", op, err.msg);
    const msgpack_object *r = ctl_reply_result(reply);
    if (!which) {
        assert_int_equal(r->type, MSGPACK_OBJECT_ARRAY);
        assert_int_equal(r->via.array.size, 2);
        ctl_str after;
        assert_true(ctl_obj_str(&r->via.array.ptr[1], &after));
        assert_int_equal(after.len, 5);
        assert_memory_equal(after.ptr, "after", 5);
        r = &r->via.array.ptr[0];
    }
    assert_true(ctl_obj_bin(r, &got));
    assert_int_equal(got.len, len);
    assert_memory_equal(got.ptr, want, len);
    ctl_reply_destroy(&reply);
    tu_buf_fini(&args);
    ctl_error_fini(&err);
}

/* A reply that shares a hold carries its bytes; one of two holds on the
 * same request has no room to lend (the other one's bytes lie before
 * it), so both read back intact, over and over. A handler that answers
 * with a blob's bytes, and more after them, sends them too. */
static void test_reply_shares_hold_and_blob(void **state)
{
    (void)state;
    static const ctl_op ops[] = {{.name = "blob", .handler = op_blob},
                                 {.name = "give", .handler = op_give},
                                 {.name = "keep2", .handler = op_keep2}};
    const ctl_service svc = {.name = "sharer", .ops = ops, .op_count = 3};
    sharer sh = {NULL, NULL, NULL};
    ctl_server *s = NULL;
    ctl_client *c = NULL;
    ctl_error err;
    ctl_error_init(&err);
    size_t size = (size_t)1 << 20;
    unsigned char *a = malloc(size), *b = malloc(size);
    assert_non_null(a);
    assert_non_null(b);
    for (size_t j = 0; j < size; j++) {
        a[j] = (unsigned char)(j * 7);
        b[j] = (unsigned char)(j * 13 + 1);
    }
    assert_non_null(sh.blob = ctl_blob_new(size));
    memcpy(ctl_blob_data(sh.blob), b, size);
    serve_on_loopback(&svc, &sh, &s, &c, &err);
    const char *address = ctl_server_endpoint(s);

    tu_buf args;
    tu_buf_init(&args);
    msgpack_pack_map(&args.pk, 2);
    tu_pk_str(&args.pk, "a");
    msgpack_pack_bin_with_body(&args.pk, a, size);
    tu_pk_str(&args.pk, "b");
    msgpack_pack_bin_with_body(&args.pk, b, size);
    ctl_reply *reply = NULL;
    assert_int_equal(ctl_client_call(c, address, "keep2", args.sb.data, args.sb.size, 5000,
                                     &reply, &err), 0);
    ctl_reply_destroy(&reply);
    tu_buf_fini(&args);
    for (int i = 0; i < 3; i++) {
        call_bin(c, address, "give", "b", b, size);
        call_bin(c, address, "give", "a", a, size);
        call_bin(c, address, "blob", NULL, b, size);
    }
    ctl_server_destroy(&s);
    ctl_hold_release(&sh.a);
    ctl_hold_release(&sh.b);
    ctl_blob_release(&sh.blob);
    ctl_client_destroy(&c);
    ctl_error_fini(&err);
    free(a);
    free(b);
}

typedef struct bg_call {
    const char *address;
    int sleep_ms;
    int timeout_ms;
    int rc;
    ctl_error err;
    int64_t result; /* the sleep op's result on success */
    int64_t elapsed_ms;
} bg_call;

/* Call the sleep op from a client of its own (runs on its own thread). */
static void *call_sleep(void *arg)
{
    bg_call *c = arg;
    ctl_client *cl = NULL;
    ctl_reply *rep = NULL;
    tu_buf a;
    tu_buf_init(&a);
    msgpack_pack_map(&a.pk, 1);
    tu_pk_str(&a.pk, "ms");
    msgpack_pack_int(&a.pk, c->sleep_ms);
    int64_t t0 = tu_now_ms();
    c->rc = ctl_client_new(NULL, &cl, &c->err);
    if (c->rc == 0)
        c->rc = ctl_client_call(cl, c->address, "sleep", a.sb.data, a.sb.size,
                                c->timeout_ms, &rep, &c->err);
    c->elapsed_ms = tu_now_ms() - t0;
    if (c->rc == 0 && !ctl_obj_i64(ctl_reply_result(rep), &c->result))
        c->result = -1;
    ctl_reply_destroy(&rep);
    ctl_client_destroy(&cl);
    tu_buf_fini(&a);
    return NULL;
}

static void bg_init(bg_call *c, const char *address, int sleep_ms, int timeout_ms)
{
    memset(c, 0, sizeof *c);
    c->address = address;
    c->sleep_ms = sleep_ms;
    c->timeout_ms = timeout_ms;
    ctl_error_init(&c->err);
}

/*
 * Close with one handler running (A) and one request queued behind it (B):
 * close returns once A's handler has finished, B's handler never starts,
 * B's caller gets a Transfer error within its deadline, and A's caller gets
 * its reply or a Transfer error within its deadline (the reply of a handler
 * that finished may or may not leave before the socket closes).
 */
static void test_close_while_call_in_flight(void **state)
{
    fx *f = *state;
    bg_call a, b;
    pthread_t ta, tb;
    bg_init(&a, f->unit.endpoint, 700, 2500);
    bg_init(&b, f->unit.endpoint, 700, 1500);
    assert_int_equal(pthread_create(&ta, NULL, call_sleep, &a), 0);
    if (tu_wait_atleast(&f->unit.sleeps_started, 1, REPLY_MS) < 1) {
        pthread_join(ta, NULL);
        ctl_error_fini(&a.err);
        ctl_error_fini(&b.err);
        fail_msg("the sleep handler never started");
    }
    assert_int_equal(pthread_create(&tb, NULL, call_sleep, &b), 0);
    tu_sleep_ms(150); /* B's request reaches the unit's queue */
    int64_t t0 = tu_now_ms();
    ctl_server_close(f->unit.server);
    int64_t close_ms = tu_now_ms() - t0;
    int done_at_close = atomic_load(&f->unit.sleeps_done);
    pthread_join(ta, NULL);
    pthread_join(tb, NULL);
    int started = atomic_load(&f->unit.sleeps_started);
    ctl_cause b_cause = b.err.cause;
    ctl_error_fini(&a.err);
    ctl_error_fini(&b.err);

    /* close() ran nothing after the running handler ... */
    if (started != 1)
        fail_msg("%d sleep handlers ran: close served a queued request "
                 "(close took %lld ms)", started, (long long)close_ms);
    /* ... and let that one finish before returning. */
    assert_int_equal(done_at_close, 1);
    if (close_ms > 1500)
        fail_msg("close took %lld ms with one 700 ms handler running",
                 (long long)close_ms);
    assert_int_equal(b.rc, CTL_TRANSFER);
    assert_int_not_equal(b_cause, CTL_CAUSE_NONE);
    if (b.elapsed_ms > b.timeout_ms + 1000)
        fail_msg("queued call returned after %lld ms, deadline %d ms",
                 (long long)b.elapsed_ms, b.timeout_ms);
    if (a.rc == 0)
        assert_int_equal(a.result, 700);
    else
        assert_int_equal(a.rc, CTL_TRANSFER);
    if (a.elapsed_ms > a.timeout_ms + 1000)
        fail_msg("in-flight call returned after %lld ms, deadline %d ms",
                 (long long)a.elapsed_ms, a.timeout_ms);
}

static void test_stats_count_sends(void **state)
{
    fx *f = *state;
    for (int i = 0; i < 5; i++) {
        char id[8];
        snprintf(id, sizeof id, "s%d", i);
        send_req(f, "echo", id, strlen(id));
        recv_reply(f);
        assert_id(&f->rep, id, strlen(id));
    }
    send_req(f, "nope", "s5", 2);
    recv_reply(f);
    assert_int_equal(tu_raw_send(f->dealer, "\xc1", 1), 0);
    send_req(f, "echo", "s6", 2);
    recv_reply(f);
    ctl_server_stats st;
    tu_server_stats_wait(f->unit.server, &st, 7, REPLY_MS);
    assert_int_equal(st.requests, 7);
    assert_int_equal(st.replies, 7);
    assert_int_equal(st.dropped, 1);
    assert_int_equal(st.send_failures, 0);
}

int main(void)
{
#define T(fn) cmocka_unit_test_setup_teardown(fn, setup, teardown)
    const struct CMUnitTest tests[] = {
        T(test_endpoint_is_concrete),
        T(test_new_bad_endpoint),
        T(test_new_bad_service),
        T(test_new_port_in_use),
        T(test_default_endpoint_uses_node_ip),
        T(test_echo_over_dealer),
        T(test_ids_echoed_unchanged),
        T(test_req_socket_gets_answer),
        T(test_delimiter_frame_is_echoed),
        T(test_unknown_op_names_it),
        T(test_bad_args_not_map),
        T(test_error_maps_on_the_wire),
        T(test_results_nil_and_arena),
        T(test_reply_bound),
        T(test_unread_replies_bound),
        T(test_large_payloads_in_kept_buffers),
        T(test_notify_sends_nothing),
        T(test_failing_notify_sends_nothing),
        T(test_handlers_run_under_the_lock),
        T(test_lock_excludes_handlers),
        T(test_caller_supplied_lock),
        T(test_oversize_message_refused),
        T(test_depth_limit_answered),
        T(test_close_idle_is_prompt),
        T(test_close_twice_and_destroy_null),
        T(test_drain_idle),
        T(test_destroy_without_close),
        T(test_close_while_call_in_flight),
        T(test_stats_count_sends),
        T(test_hold_outlives_the_request),
        T(test_reply_shares_hold_and_blob),
    };
#undef T
    return cmocka_run_group_tests(tests, NULL, NULL);
}
