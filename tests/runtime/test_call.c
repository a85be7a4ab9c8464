/*
 * test_call.c - the client's core without a socket (call_int.h): request
 * ids, reply handles, and the judging of a received message by the call
 * waiting for it (ctl_call_accept).
 *
 * Replies are packed here with msgpack-c by hand, as a unit (or a peer in
 * another language) would send them, and handed to the core in a reply
 * made by ctl_reply_copy_of. Every message the core writes is checked
 * whole: "<op> at <address>: ...".
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "testutil.h"
#include "call_int.h"

#define ADDR "tcp://10.1.2.3:4567"
#define OP "put_blob"
#define ID "00000000002a"

/* A view of a string literal that may hold NUL bytes. */
#define LIT(s) ((ctl_str){(s), sizeof(s) - 1})

typedef struct fx {
    ctl_error err;
    tu_buf buf;       /* the reply payload */
    ctl_reply *reply; /* the handle judged */
} fx;

static int setup(void **state)
{
    fx *f = calloc(1, sizeof *f);
    if (f == NULL)
        return -1;
    ctl_error_init(&f->err);
    tu_buf_init(&f->buf);
    *state = f;
    return 0;
}

static int teardown(void **state)
{
    fx *f = *state;
    ctl_reply_destroy(&f->reply);
    tu_buf_fini(&f->buf);
    ctl_error_fini(&f->err);
    free(f);
    return 0;
}

/* f->buf := [id, ok, ... (the caller packs the third element). */
static void head(fx *f, ctl_str id, bool ok)
{
    tu_buf_reset(&f->buf);
    msgpack_pack_array(&f->buf.pk, 3);
    tu_pk_strn(&f->buf.pk, id.ptr, id.len);
    if (ok)
        msgpack_pack_true(&f->buf.pk);
    else
        msgpack_pack_false(&f->buf.pk);
}

/* f->buf := [ID, false, {kind, msg, reason, blobs}]; NULL reason: nil;
 * blob_count < 0: nil. */
static void error_reply(fx *f, const char *kind, const char *msg,
                        const char *reason, const ctl_str *blobs, int blob_count)
{
    msgpack_packer *pk = &f->buf.pk;
    head(f, LIT(ID), false);
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
    if (blob_count < 0) {
        msgpack_pack_nil(pk);
        return;
    }
    msgpack_pack_array(pk, (uint32_t)blob_count);
    for (int i = 0; i < blob_count; i++)
        tu_pk_strn(pk, blobs[i].ptr, blobs[i].len);
}

/* Judge the bytes in f->buf (received in `frames` frames) for the call
 * with id `id`, with `limits` (NULL: the defaults). */
static ctl_match judge_as(fx *f, size_t frames, ctl_str id, const ctl_limits *limits)
{
    ctl_reply_destroy(&f->reply);
    f->reply = ctl_reply_copy_of(f->buf.sb.data, f->buf.sb.size);
    assert_non_null(f->reply);
    return ctl_call_accept(f->reply, frames, id, limits, ADDR, OP, &f->err);
}

static ctl_match judge(fx *f)
{
    return judge_as(f, 1, LIT(ID), NULL);
}

/* ---- results ---------------------------------------------------------- */

static void test_accept_result(void **state)
{
    fx *f = *state;
    head(f, LIT(ID), true);
    msgpack_pack_map(&f->buf.pk, 1);
    tu_pk_str(&f->buf.pk, "stored");
    msgpack_pack_bin(&f->buf.pk, 3);
    msgpack_pack_bin_body(&f->buf.pk, "a\0b", 3);
    assert_int_equal(judge(f), CTL_MATCH_RESULT);
    assert_int_equal(f->err.kind, CTL_OK); /* untouched */
    ctl_str id = ctl_reply_id(f->reply);
    assert_int_equal(id.len, 12);
    assert_memory_equal(id.ptr, ID, 12);
    const msgpack_object *r = ctl_reply_result(f->reply);
    assert_non_null(r);
    assert_int_equal(r->type, MSGPACK_OBJECT_MAP);
    const msgpack_object *v = tu_obj_get(r, "stored");
    assert_non_null(v);
    assert_int_equal(v->type, MSGPACK_OBJECT_BIN);
    assert_int_equal(v->via.bin.size, 3);
    assert_memory_equal(v->via.bin.ptr, "a\0b", 3);
    /* Views into the reply's own copy, not into the buffer received. */
    const char *lo = f->buf.sb.data, *hi = lo + f->buf.sb.size;
    assert_true(v->via.bin.ptr < lo || v->via.bin.ptr >= hi);
    assert_true(id.ptr < lo || id.ptr >= hi);
    memset(f->buf.sb.data, 0, f->buf.sb.size);
    assert_memory_equal(v->via.bin.ptr, "a\0b", 3);
    assert_memory_equal(ctl_reply_id(f->reply).ptr, ID, 12);
}

static void test_accept_nil_result_and_odd_ids(void **state)
{
    fx *f = *state;
    static char long_id[70000];
    memset(long_id, 'q', sizeof long_id);
    const ctl_str ids[] = {{"", 0}, {"a\0b", 3}, {"\xff\xfe", 2}, {long_id, 300},
                           {long_id, sizeof long_id}};
    for (size_t i = 0; i < sizeof ids / sizeof ids[0]; i++) {
        head(f, ids[i], true);
        msgpack_pack_nil(&f->buf.pk);
        assert_int_equal(judge_as(f, 1, ids[i], NULL), CTL_MATCH_RESULT);
        assert_int_equal(ctl_reply_result(f->reply)->type, MSGPACK_OBJECT_NIL);
        ctl_str got = ctl_reply_id(f->reply);
        assert_int_equal(got.len, ids[i].len);
        if (got.len)
            assert_memory_equal(got.ptr, ids[i].ptr, got.len);
    }
}

/* ---- error maps: one kind each ----------------------------------------- */

static void test_accept_error_unit_full(void **state)
{
    fx *f = *state;
    error_reply(f, "UnitFull", "no room for 12 bytes", NULL, NULL, -1);
    assert_int_equal(judge(f), CTL_MATCH_ERROR);
    assert_int_equal(f->err.kind, CTL_UNIT_FULL);
    assert_int_equal(f->err.cause, CTL_CAUSE_NONE);
    assert_string_equal(f->err.msg, OP " at " ADDR ": unit full: no room for 12 bytes");
    assert_null(f->err.reason);
    assert_int_equal(f->err.blob_count, 0);
    assert_null(f->err.remote_kind);
}

static void test_accept_error_busy(void **state)
{
    fx *f = *state;
    error_reply(f, "Busy", "try later", "pinned", NULL, -1);
    assert_int_equal(judge(f), CTL_MATCH_ERROR);
    assert_int_equal(f->err.kind, CTL_BUSY);
    assert_string_equal(f->err.reason, "pinned");
    assert_string_equal(f->err.msg, OP " at " ADDR ": busy (pinned): try later");

    /* Without a reason (nil, or no key at all). */
    error_reply(f, "Busy", "later", NULL, NULL, -1);
    assert_int_equal(judge(f), CTL_MATCH_ERROR);
    assert_int_equal(f->err.kind, CTL_BUSY);
    assert_null(f->err.reason);
    assert_string_equal(f->err.msg, OP " at " ADDR ": busy (no reason): later");
    head(f, LIT(ID), false);
    msgpack_pack_map(&f->buf.pk, 1);
    tu_pk_str(&f->buf.pk, "kind");
    tu_pk_str(&f->buf.pk, "Busy");
    assert_int_equal(judge(f), CTL_MATCH_ERROR);
    assert_int_equal(f->err.kind, CTL_BUSY);
    assert_string_equal(f->err.msg, OP " at " ADDR ": busy (no reason): ");
}

static void test_accept_error_missing(void **state)
{
    fx *f = *state;
    const ctl_str blobs[] = {{"b-1", 3}, {"b\0-2", 4}, {"", 0}};
    error_reply(f, "Missing", "gone", NULL, blobs, 3);
    assert_int_equal(judge(f), CTL_MATCH_ERROR);
    assert_int_equal(f->err.kind, CTL_MISSING);
    assert_string_equal(f->err.msg, OP " at " ADDR ": 3 blob(s) missing: gone");
    assert_int_equal(f->err.blob_count, 3);
    for (size_t i = 0; i < 3; i++) {
        assert_int_equal(f->err.blobs[i].len, blobs[i].len);
        assert_memory_equal(f->err.blobs[i].ptr, blobs[i].ptr, blobs[i].len);
        assert_int_equal(f->err.blobs[i].ptr[blobs[i].len], '\0');
    }
    /* The ids are the error's own: the reply may go. */
    ctl_reply_destroy(&f->reply);
    assert_memory_equal(f->err.blobs[1].ptr, "b\0-2", 4);

    error_reply(f, "Missing", "none named", NULL, NULL, -1);
    assert_int_equal(judge(f), CTL_MATCH_ERROR);
    assert_int_equal(f->err.kind, CTL_MISSING);
    assert_int_equal(f->err.blob_count, 0);
    assert_string_equal(f->err.msg, OP " at " ADDR ": 0 blob(s) missing: none named");
}

static void test_accept_error_protocol_is_remote_transfer(void **state)
{
    fx *f = *state;
    error_reply(f, "Protocol", "op 'put_blob': missing required arg 'key'", NULL, NULL, -1);
    assert_int_equal(judge(f), CTL_MATCH_ERROR);
    assert_int_equal(f->err.kind, CTL_TRANSFER);
    assert_int_equal(f->err.cause, CTL_CAUSE_REMOTE);
    assert_string_equal(f->err.remote_kind, "Protocol");
    assert_string_equal(f->err.msg, OP " at " ADDR ": Protocol error: "
                                    "op 'put_blob': missing required arg 'key'");
    assert_null(f->err.reason);
}

/* A kind this client does not know, or one that never crosses the wire,
 * is the unit's way of saying the call failed: Transfer / remote, with the
 * kind it sent in remote_kind. */
static void test_accept_error_unknown_kind(void **state)
{
    fx *f = *state;
    static const struct {
        const char *kind;
        size_t len;
        const char *msg;
    } cases[] = {
        {"Exploded", 8, OP " at " ADDR ": Exploded error: boom"},
        {"Transfer", 8, OP " at " ADDR ": Transfer error: boom"},
        {"Invalid", 7, OP " at " ADDR ": Invalid error: boom"},
        {"OK", 2, OP " at " ADDR ": OK error: boom"},
        {"busy", 4, OP " at " ADDR ": busy error: boom"},
        {"", 0, OP " at " ADDR ": (empty kind) error: boom"},
        {"Bu\0sy", 5, OP " at " ADDR ": Bu\\x00sy error: boom"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        head(f, LIT(ID), false);
        msgpack_pack_map(&f->buf.pk, 2);
        tu_pk_str(&f->buf.pk, "kind");
        tu_pk_strn(&f->buf.pk, cases[i].kind, cases[i].len);
        tu_pk_str(&f->buf.pk, "msg");
        tu_pk_str(&f->buf.pk, "boom");
        assert_int_equal(judge(f), CTL_MATCH_ERROR);
        assert_int_equal(f->err.kind, CTL_TRANSFER);
        assert_int_equal(f->err.cause, CTL_CAUSE_REMOTE);
        assert_non_null(f->err.remote_kind);
        assert_memory_equal(f->err.remote_kind, cases[i].kind, cases[i].len);
        if (strcmp(f->err.msg, cases[i].msg) != 0)
            fail_msg("kind #%zu: '%s', not '%s'", i, f->err.msg, cases[i].msg);
    }
}

/* An error body that is not an error map: Transfer / bad reply. */
static void test_accept_error_malformed_map(void **state)
{
    fx *f = *state;
    head(f, LIT(ID), false);
    tu_pk_str(&f->buf.pk, "just a string");
    assert_int_equal(judge(f), CTL_MATCH_ERROR);
    assert_int_equal(f->err.kind, CTL_TRANSFER);
    assert_int_equal(f->err.cause, CTL_CAUSE_BAD_REPLY);
    assert_string_equal(f->err.msg, OP " at " ADDR ": error reply is a str, not a map");

    head(f, LIT(ID), false);
    msgpack_pack_map(&f->buf.pk, 1);
    tu_pk_str(&f->buf.pk, "kind");
    msgpack_pack_int(&f->buf.pk, 3);
    assert_int_equal(judge(f), CTL_MATCH_ERROR);
    assert_int_equal(f->err.cause, CTL_CAUSE_BAD_REPLY);
    assert_string_equal(f->err.msg, OP " at " ADDR ": error reply has no string 'kind'");

    head(f, LIT(ID), false);
    msgpack_pack_map(&f->buf.pk, 2);
    tu_pk_str(&f->buf.pk, "kind");
    tu_pk_str(&f->buf.pk, "Missing");
    tu_pk_str(&f->buf.pk, "blobs");
    msgpack_pack_array(&f->buf.pk, 1);
    msgpack_pack_int(&f->buf.pk, 3);
    assert_int_equal(judge(f), CTL_MATCH_ERROR);
    assert_int_equal(f->err.cause, CTL_CAUSE_BAD_REPLY);
    assert_string_equal(f->err.msg,
                        OP " at " ADDR ": error reply's 'blobs' is not a list of strings");
}

/* ---- not a reply -------------------------------------------------------- */

/* Bytes that are not [str, bool, any]: Transfer / bad reply, saying why. */
static void test_accept_bad_bytes(void **state)
{
    fx *f = *state;
    static const struct {
        const char *bytes;
        size_t len;
        const char *why;
    } cases[] = {
#define B(s) s, sizeof(s) - 1
        {B(""), "not a msgpack array of 3"},
        {B("\xc0"), "not a msgpack array of 3"},
        {B("\x92\xa1x\xc3"), "not a msgpack array of 3"},
        {B("\x94\xa1x\xc3\xc0\xc0"), "not a msgpack array of 3"},
        {B("\x93\x01\xc3\xc0"), "the request id is not a string"},
        {B("\x93\xa5" "ab"), "the request id is not a string"},
        {B("\x93\xac" "00000000002a\x01\xc0"), "the ok flag is not a bool"},
        {B("\x93\xac" "00000000002a"), "the ok flag is not a bool"},
        {B("\x93\xac" "00000000002a\xc3"), "result: truncated"},
        {B("\x93\xac" "00000000002a\xc3\xa5" "ab"), "result: truncated"},
        {B("\x93\xac" "00000000002a\xc3\x92\x01"),
         "result: container count exceeds the message size"},
        {B("\x93\xac" "00000000002a\xc2\xc1"), "error: invalid byte 0xc1"},
        {B("\x93\xac" "00000000002a\xc3\xc0\xc0\xc0"), "2 trailing bytes after the message"},
        {B("\x93\xac" "00000000002a\xc3\xdd\xff\xff\xff\xff"),
         "result: container count exceeds the message size"},
#undef B
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        char want[256];
        tu_buf_reset(&f->buf);
        if (cases[i].len)
            msgpack_sbuffer_write(&f->buf.sb, cases[i].bytes, cases[i].len);
        if (judge(f) != CTL_MATCH_BAD)
            fail_msg("bytes #%zu were not judged bad", i);
        assert_int_equal(f->err.kind, CTL_TRANSFER);
        assert_int_equal(f->err.cause, CTL_CAUSE_BAD_REPLY);
        snprintf(want, sizeof want, "%s at %s: bad reply: %s", OP, ADDR, cases[i].why);
        if (strcmp(f->err.msg, want) != 0)
            fail_msg("bytes #%zu: '%s', not '%s'", i, f->err.msg, want);
    }
}

/* The limits bound what a reply may hold. */
static void test_accept_limits(void **state)
{
    fx *f = *state;
    ctl_limits lim = {.max_depth = 3, .max_items = 8};
    head(f, LIT(ID), true);
    msgpack_pack_array(&f->buf.pk, 1); /* level 2 */
    msgpack_pack_array(&f->buf.pk, 1); /* level 3 */
    msgpack_pack_int(&f->buf.pk, 1);
    assert_int_equal(judge_as(f, 1, LIT(ID), &lim), CTL_MATCH_RESULT);
    head(f, LIT(ID), true);
    msgpack_pack_array(&f->buf.pk, 1);
    msgpack_pack_array(&f->buf.pk, 1);
    msgpack_pack_array(&f->buf.pk, 0); /* level 4 */
    assert_int_equal(judge_as(f, 1, LIT(ID), &lim), CTL_MATCH_BAD);
    assert_string_equal(f->err.msg, OP " at " ADDR ": bad reply: result: nested too deeply");
    head(f, LIT(ID), true);
    msgpack_pack_array(&f->buf.pk, 6);
    for (int i = 0; i < 6; i++)
        msgpack_pack_int(&f->buf.pk, i);
    assert_int_equal(judge_as(f, 1, LIT(ID), &lim), CTL_MATCH_BAD);
    assert_string_equal(f->err.msg, OP " at " ADDR ": bad reply: result: too many objects");
    /* The same reply within the default limits. */
    assert_int_equal(judge_as(f, 1, LIT(ID), NULL), CTL_MATCH_RESULT);
}

/* A reply is one frame; a multi-frame message is not a reply, whatever its
 * bytes. */
static void test_accept_frames(void **state)
{
    fx *f = *state;
    static const size_t frames[] = {2, 3, 0, 100};
    head(f, LIT(ID), true);
    msgpack_pack_nil(&f->buf.pk);
    for (size_t i = 0; i < sizeof frames / sizeof frames[0]; i++) {
        assert_int_equal(judge_as(f, frames[i], LIT(ID), NULL), CTL_MATCH_BAD);
        assert_int_equal(f->err.kind, CTL_TRANSFER);
        assert_int_equal(f->err.cause, CTL_CAUSE_BAD_REPLY);
        assert_string_equal(f->err.msg, OP " at " ADDR ": reply has more than one frame");
    }
    assert_int_equal(judge_as(f, 1, LIT(ID), NULL), CTL_MATCH_RESULT);
}

/* A well-formed reply for another id is someone else's (a late reply):
 * neither a result nor an error of this call. */
static void test_accept_other_id(void **state)
{
    fx *f = *state;
    static const ctl_str others[] = {{"00000000002b", 12}, {"00000000002a\0", 13},
                                     {"00000000002", 11}, {"", 0},
                                     {"00000000002A", 12}};
    for (size_t i = 0; i < sizeof others / sizeof others[0]; i++) {
        head(f, others[i], true);
        msgpack_pack_nil(&f->buf.pk);
        assert_int_equal(judge(f), CTL_MATCH_OTHER);
        assert_int_equal(f->err.kind, CTL_OK);
        /* An error for another id is not this call's error either. */
        head(f, others[i], false);
        tu_pk_str(&f->buf.pk, "not even a map");
        assert_int_equal(judge(f), CTL_MATCH_OTHER);
        assert_int_equal(f->err.kind, CTL_OK);
        assert_null(f->err.msg);
    }
    /* And the empty id of a notify matches only an empty id. */
    head(f, LIT(""), true);
    msgpack_pack_nil(&f->buf.pk);
    assert_int_equal(judge_as(f, 1, LIT(""), NULL), CTL_MATCH_RESULT);
}

/* ---- ids and reply handles ------------------------------------------- */

static void test_format_id(void **state)
{
    (void)state;
    static const struct {
        uint64_t v;
        int64_t deadline;
        const char *id;
    } cases[] = {
        {0, 0, "000000000000@0000000000000"},
        {42, 1796169600123, "00000000002a@1796169600123"},
        {0xabcdef, 5, "000000abcdef@0000000000005"},
        {UINT64_C(0xffffffffffff), 1, "ffffffffffff@0000000000001"},
        {UINT64_C(0x1000000000000), 2, "000000000000@0000000000002"}, /* the low 48 bits */
        {UINT64_C(0x123456789abcdef0), 9999999999999, "56789abcdef0@9999999999999"},
        {UINT64_MAX, INT64_MAX, "ffffffffffff@9999999999999"}, /* clamped */
        {7, -5, "000000000007@0000000000000"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        char out[CTL_ID_LEN + 2];
        memset(out, 'X', sizeof out);
        ctl_call_format_id(cases[i].v, cases[i].deadline, out);
        assert_int_equal(out[CTL_ID_LEN], '\0');
        assert_int_equal(out[CTL_ID_LEN + 1], 'X'); /* nothing past the NUL */
        assert_string_equal(out, cases[i].id);
        /* What it writes, a unit reads back. */
        int64_t got = -1;
        assert_int_equal(ctl_env_id_deadline((ctl_str){out, CTL_ID_LEN}, &got), 1);
        assert_int_equal(got, cases[i].deadline < 0 ? 0
                              : cases[i].deadline > 9999999999999 ? 9999999999999
                                                                   : cases[i].deadline);
    }
    assert_int_equal(CTL_ID_UNIQUE_LEN, 12);
    assert_int_equal(CTL_ID_LEN, 26);
}

/* The id parser a unit reads deadlines with (docs/PROTOCOL.md,
 * "Deadlines"): the last '@', then 1 to 16 decimal digits and nothing
 * else. */
static void test_id_deadline(void **state)
{
    (void)state;
    static const struct {
        const char *id;
        int has;
        int64_t deadline;
    } cases[] = {
        {"3f2a9c01b2d4e5f6@1796169600123", 1, 1796169600123},
        {"abc@0", 1, 0},
        {"@7", 1, 7},
        {"a@b@12", 1, 12},                      /* the last '@' */
        {"x@1234567890123456", 1, 1234567890123456}, /* 16 digits */
        {"x@9999999999999999", 1, 9999999999999999},
        {"x@0000000000000001", 1, 1},
        {"x@12345678901234567", 0, 0},          /* 17 digits */
        {"x@99999999999999999999", 0, 0},       /* would overflow */
        {"12345678901234567", 0, 0},            /* no '@' */
        {"0123456789ab", 0, 0},                 /* the reference's ids */
        {"", 0, 0},
        {"@", 0, 0},
        {"abc@", 0, 0},
        {"abc@12a", 0, 0},
        {"abc@12 ", 0, 0},
        {"abc@+12", 0, 0},
        {"abc@-12", 0, 0},
        {"abc@1@", 0, 0},
        {"abc@12@x", 0, 0},
        {"1796169600123", 0, 0},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        int64_t got = -1;
        int has = ctl_env_id_deadline(ctl_str_c(cases[i].id), &got);
        if (has != cases[i].has)
            fail_msg("'%s': %d, expected %d", cases[i].id, has, cases[i].has);
        if (has)
            assert_int_equal(got, cases[i].deadline);
        else
            assert_int_equal(got, -1); /* untouched */
    }
    /* Bytes past the id's length are not read; a NUL inside is a byte. */
    assert_int_equal(ctl_env_id_deadline((ctl_str){"a@12x", 4}, &(int64_t){0}), 1);
    assert_int_equal(ctl_env_id_deadline((ctl_str){"a@1\0002", 5}, &(int64_t){0}), 0);
    assert_int_equal(ctl_env_id_deadline((ctl_str){NULL, 0}, &(int64_t){0}), 0);
}

static void test_reply_copy_of(void **state)
{
    (void)state;
    char src[] = "\x93\xa1x\xc3\xa3" "abc";
    ctl_reply *r = ctl_reply_copy_of(src, sizeof src - 1);
    assert_non_null(r);
    assert_int_equal(r->len, sizeof src - 1);
    assert_ptr_not_equal(r->data, src);
    assert_memory_equal(r->data, src, sizeof src - 1);
    memset(src, 0, sizeof src); /* a copy: the source may change */
    assert_memory_equal(r->data, "\x93\xa1x\xc3\xa3" "abc", sizeof src - 1);
    /* Its tail holds the bytes, aligned for any type. */
    assert_ptr_equal(r->data, ctl_reply_tail(r));
    assert_int_equal((uintptr_t)ctl_reply_tail(r) % _Alignof(max_align_t), 0);
    assert_null(r->release);
    /* Before a result is accepted: nil-like defaults, memory available. */
    void *p = ctl_reply_alloc(r, 100);
    assert_non_null(p);
    assert_int_equal((uintptr_t)p % _Alignof(max_align_t), 0);
    memset(p, 1, 100);
    ctl_reply_destroy(&r);
    assert_null(r);
    ctl_reply_destroy(&r);
    ctl_reply_destroy(NULL);

    /* Zero bytes: a usable handle, judged bad. */
    ctl_error err;
    ctl_error_init(&err);
    r = ctl_reply_copy_of(NULL, 0);
    assert_non_null(r);
    assert_int_equal(r->len, 0);
    assert_non_null(r->data);
    assert_int_equal(ctl_call_accept(r, 1, LIT(ID), NULL, ADDR, OP, &err), CTL_MATCH_BAD);
    assert_string_equal(err.msg, OP " at " ADDR ": bad reply: not a msgpack array of 3");
    ctl_reply_destroy(&r);
    ctl_error_fini(&err);

    /* NULL handles read as empty. */
    assert_null(ctl_reply_result(NULL));
    assert_int_equal(ctl_reply_id(NULL).len, 0);
    assert_non_null(ctl_reply_id(NULL).ptr);
}

/* A transport's reply: its release runs once, at destroy. */
static int releases;

static void count_release(ctl_reply *r)
{
    (void)r;
    releases++;
}

static void test_reply_new_release(void **state)
{
    (void)state;
    ctl_reply *r = ctl_reply_new(64);
    assert_non_null(r);
    assert_int_equal((uintptr_t)ctl_reply_tail(r) % _Alignof(max_align_t), 0);
    assert_int_equal(r->len, 0);
    assert_non_null(r->data);
    memset(ctl_reply_tail(r), 0xab, 64); /* all 64 bytes are ours */
    r->release = count_release;
    releases = 0;
    ctl_reply_destroy(&r);
    assert_int_equal(releases, 1);
    assert_null(ctl_reply_new(SIZE_MAX)); /* no overflow */
}

int main(void)
{
#define T(fn) cmocka_unit_test_setup_teardown(fn, setup, teardown)
    const struct CMUnitTest tests[] = {
        T(test_accept_result),
        T(test_accept_nil_result_and_odd_ids),
        T(test_accept_error_unit_full),
        T(test_accept_error_busy),
        T(test_accept_error_missing),
        T(test_accept_error_protocol_is_remote_transfer),
        T(test_accept_error_unknown_kind),
        T(test_accept_error_malformed_map),
        T(test_accept_bad_bytes),
        T(test_accept_limits),
        T(test_accept_frames),
        T(test_accept_other_id),
        cmocka_unit_test(test_format_id),
        cmocka_unit_test(test_id_deadline),
        cmocka_unit_test(test_reply_copy_of),
        cmocka_unit_test(test_reply_new_release),
    };
#undef T
    return cmocka_run_group_tests(tests, NULL, NULL);
}
