/*
 * test_error.c - error kinds, the ctl_error object, and rebuilding errors
 * from error maps (error.h, and ctl_env_unpack_error of envelope_int.h).
 *
 * The error-map tests pack maps with the runtime (tu_pack_error_map)
 * and also by hand with msgpack-c, so both directions are checked against
 * docs/PROTOCOL.md rather than against each other only. Allocation failures are
 * injected through malloc/calloc/realloc wrappers (the executable is linked
 * with -Wl,--wrap; see the end of this file).
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>

#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "testutil.h"
#include "envelope_int.h"

#define ADDR "tcp://127.0.0.1:4242"
#define OP "put_blob"

/* ---- fixture: one error, one buffer and one zone per test --------------- */

typedef struct fx {
    ctl_error err;
    tu_buf buf;
    msgpack_zone zone;
} fx;

static int setup(void **state)
{
    fx *f = calloc(1, sizeof *f);
    if (f == NULL)
        return -1;
    ctl_error_init(&f->err);
    tu_buf_init(&f->buf);
    msgpack_zone_init(&f->zone, 4096);
    *state = f;
    return 0;
}

static int teardown(void **state)
{
    fx *f = *state;
    ctl_error_fini(&f->err);
    tu_buf_fini(&f->buf);
    msgpack_zone_destroy(&f->zone);
    free(f);
    return 0;
}

/* Unpack the bytes in f->buf into one object. */
static msgpack_object unpack_buf(fx *f)
{
    msgpack_object o;
    size_t off = 0;
    assert_int_equal(msgpack_unpack(f->buf.sb.data, f->buf.sb.size, &off,
                                    &f->zone, &o),
                     MSGPACK_UNPACK_SUCCESS);
    assert_int_equal(off, f->buf.sb.size);
    return o;
}

static void assert_names_addr_op(const ctl_error *e)
{
    assert_non_null(e->msg);
    if (strstr(e->msg, ADDR) == NULL || strstr(e->msg, OP) == NULL)
        fail_msg("message does not name address and op: \"%s\"", e->msg);
}

/* ---- kinds and causes --------------------------------------------------- */

static void test_kind_values_and_names(void **state)
{
    (void)state;
    assert_int_equal(CTL_OK, 0);
    assert_true(CTL_UNIT_FULL < 0 && CTL_BUSY < 0 && CTL_MISSING < 0 &&
                CTL_PROTOCOL < 0 && CTL_TRANSFER < 0 && CTL_INVALID < 0 && CTL_DECLARED < 0);
    assert_string_equal(ctl_kind_name(CTL_OK), "OK");
    assert_string_equal(ctl_kind_name(CTL_UNIT_FULL), "UnitFull");
    assert_string_equal(ctl_kind_name(CTL_BUSY), "Busy");
    assert_string_equal(ctl_kind_name(CTL_MISSING), "Missing");
    assert_string_equal(ctl_kind_name(CTL_PROTOCOL), "Protocol");
    assert_string_equal(ctl_kind_name(CTL_TRANSFER), "Transfer");
    assert_string_equal(ctl_kind_name(CTL_INVALID), "Invalid");
    assert_string_equal(ctl_kind_name(CTL_DECLARED), "Declared");
    assert_string_equal(ctl_kind_name(1), "Unknown");
    assert_string_equal(ctl_kind_name(-8), "Unknown");
    assert_string_equal(ctl_kind_name(-1000000), "Unknown");

    const int kinds[] = {CTL_OK, CTL_UNIT_FULL, CTL_BUSY, CTL_MISSING,
                         CTL_PROTOCOL, CTL_TRANSFER, CTL_INVALID, CTL_DECLARED};
    for (size_t i = 0; i < sizeof kinds / sizeof kinds[0]; i++) {
        const char *d = ctl_strerror(kinds[i]);
        assert_non_null(d);
        assert_true(strlen(d) > 0);
        for (size_t j = 0; j < i; j++)
            assert_string_not_equal(d, ctl_strerror(kinds[j]));
    }
    assert_non_null(ctl_strerror(42));
}

static void test_kind_from_wire(void **state)
{
    (void)state;
    assert_int_equal(ctl_kind_from_wire(ctl_str_c("UnitFull")), CTL_UNIT_FULL);
    assert_int_equal(ctl_kind_from_wire(ctl_str_c("Busy")), CTL_BUSY);
    assert_int_equal(ctl_kind_from_wire(ctl_str_c("Missing")), CTL_MISSING);
    assert_int_equal(ctl_kind_from_wire(ctl_str_c("Protocol")), CTL_PROTOCOL);
    /* Only the four wire kinds match, exactly. */
    const char *no[] = {"OK", "Transfer", "Invalid", "Unknown", "", "busy",
                        "Bus", "Busyy", "UnitFul", " Busy", "Protocol "};
    for (size_t i = 0; i < sizeof no / sizeof no[0]; i++) {
        if (ctl_kind_from_wire(ctl_str_c(no[i])) != CTL_OK)
            fail_msg("\"%s\" matched a wire kind", no[i]);
    }
    ctl_str nul = {"Busy\0x", 6};
    assert_int_equal(ctl_kind_from_wire(nul), CTL_OK);
    ctl_str prefix = {"Busy", 3};
    assert_int_equal(ctl_kind_from_wire(prefix), CTL_OK);
    ctl_str empty = {NULL, 0};
    assert_int_equal(ctl_kind_from_wire(empty), CTL_OK);
}

static void test_cause_names(void **state)
{
    (void)state;
    assert_string_equal(ctl_cause_name(CTL_CAUSE_NONE), "none");
    assert_string_equal(ctl_cause_name(CTL_CAUSE_REMOTE), "remote");
    assert_string_equal(ctl_cause_name(CTL_CAUSE_TIMEOUT), "timeout");
    assert_string_equal(ctl_cause_name(CTL_CAUSE_TRANSPORT), "transport");
    assert_string_equal(ctl_cause_name(CTL_CAUSE_BAD_REPLY), "bad-reply");
    assert_string_equal(ctl_cause_name(CTL_CAUSE_NOMEM), "nomem");
    assert_non_null(ctl_cause_name((ctl_cause)99));
}

static void test_str_c(void **state)
{
    (void)state;
    ctl_str s = ctl_str_c("abc");
    assert_int_equal(s.len, 3);
    assert_memory_equal(s.ptr, "abc", 3);
    ctl_str n = ctl_str_c(NULL);
    assert_int_equal(n.len, 0);
    ctl_str e = ctl_str_c("");
    assert_int_equal(e.len, 0);
}

/* ---- the ctl_error object ----------------------------------------------- */

static void test_error_init_is_ok(void **state)
{
    fx *f = *state;
    assert_int_equal(f->err.kind, CTL_OK);
    assert_int_equal(f->err.cause, CTL_CAUSE_NONE);
    assert_null(f->err.reason);
    assert_null(f->err.blobs);
    assert_int_equal(f->err.blob_count, 0);
    assert_null(f->err.remote_kind);
}

static void test_error_set_formats_and_returns_kind(void **state)
{
    fx *f = *state;
    assert_int_equal(ctl_error_set(&f->err, CTL_INVALID, "bad %s #%d", "thing", 7),
                     CTL_INVALID);
    assert_int_equal(f->err.kind, CTL_INVALID);
    assert_int_equal(f->err.cause, CTL_CAUSE_NONE);
    assert_string_equal(f->err.msg, "bad thing #7");
    /* Refill: the old contents are released (LSan checks the leak). */
    assert_int_equal(ctl_error_busy(&f->err, "pinned", "unit %s busy", "u1"),
                     CTL_BUSY);
    assert_int_equal(ctl_error_set(&f->err, CTL_UNIT_FULL, "full"), CTL_UNIT_FULL);
    assert_int_equal(f->err.kind, CTL_UNIT_FULL);
    assert_string_equal(f->err.msg, "full");
    assert_null(f->err.reason); /* the Busy reason did not survive */
    /* A NULL error is allowed and the kind still comes back. */
    assert_int_equal(ctl_error_set(NULL, CTL_TRANSFER, "x"), CTL_TRANSFER);
    assert_int_equal(ctl_error_transfer(NULL, CTL_CAUSE_TIMEOUT, "x"), CTL_TRANSFER);
    assert_int_equal(ctl_error_busy(NULL, "r", "x"), CTL_BUSY);
    assert_int_equal(ctl_error_missing(NULL, NULL, 0, "x"), CTL_MISSING);
}

static void test_error_long_message(void **state)
{
    fx *f = *state;
    char big[5000];
    memset(big, 'm', sizeof big - 1);
    big[sizeof big - 1] = '\0';
    ctl_error_set(&f->err, CTL_INVALID, "<%s>", big);
    assert_int_equal(strlen(f->err.msg), sizeof big + 1);
}

static void test_error_transfer_cause(void **state)
{
    fx *f = *state;
    assert_int_equal(ctl_error_transfer(&f->err, CTL_CAUSE_TIMEOUT, "after %d ms", 5),
                     CTL_TRANSFER);
    assert_int_equal(f->err.kind, CTL_TRANSFER);
    assert_int_equal(f->err.cause, CTL_CAUSE_TIMEOUT);
    assert_string_equal(f->err.msg, "after 5 ms");
    /* A later non-transfer fill resets the cause. */
    ctl_error_set(&f->err, CTL_INVALID, "x");
    assert_int_equal(f->err.cause, CTL_CAUSE_NONE);
}

static void test_error_busy_reason(void **state)
{
    fx *f = *state;
    char reason[16] = "draining";
    ctl_error_busy(&f->err, reason, "busy");
    strcpy(reason, "XXXX"); /* copied, not borrowed */
    assert_int_equal(f->err.kind, CTL_BUSY);
    assert_string_equal(f->err.reason, "draining");
    ctl_error_busy(&f->err, NULL, "busy without reason");
    assert_int_equal(f->err.kind, CTL_BUSY);
    assert_null(f->err.reason);
}

static void test_error_missing_blobs_copied(void **state)
{
    fx *f = *state;
    char b0[] = "blob-0";
    char b1[] = {'a', '\0', 'b'};
    ctl_str ids[3] = {{b0, 6}, {b1, 3}, {"", 0}};
    assert_int_equal(ctl_error_missing(&f->err, ids, 3, "%d lost", 3), CTL_MISSING);
    memset(b0, 'X', 6);
    memset(b1, 'X', 3);
    assert_int_equal(f->err.kind, CTL_MISSING);
    assert_int_equal(f->err.blob_count, 3);
    assert_int_equal(f->err.blobs[0].len, 6);
    assert_memory_equal(f->err.blobs[0].ptr, "blob-0", 6);
    assert_int_equal(f->err.blobs[0].ptr[6], '\0');
    assert_int_equal(f->err.blobs[1].len, 3);
    assert_memory_equal(f->err.blobs[1].ptr, "a\0b", 3);
    assert_int_equal(f->err.blobs[1].ptr[3], '\0');
    assert_int_equal(f->err.blobs[2].len, 0);
    assert_non_null(f->err.blobs[2].ptr);
    assert_int_equal(f->err.blobs[2].ptr[0], '\0');
    assert_string_equal(f->err.msg, "3 lost");
}

static void test_error_copy_is_deep(void **state)
{
    fx *f = *state;
    ctl_error dst, src;
    ctl_str ids[2] = {{"x1", 2}, {"y22", 3}};
    ctl_error_init(&dst);
    ctl_error_init(&src);
    ctl_error_set(&dst, CTL_INVALID, "old contents, released by copy");
    ctl_error_missing(&src, ids, 2, "missing two");
    assert_int_equal(ctl_error_copy(&dst, &src), 0);
    ctl_error_fini(&src);
    assert_int_equal(dst.kind, CTL_MISSING);
    assert_string_equal(dst.msg, "missing two");
    assert_int_equal(dst.blob_count, 2);
    assert_memory_equal(dst.blobs[1].ptr, "y22", 3);

    ctl_error_init(&src);
    ctl_error_busy(&src, "pinned", "b");
    assert_int_equal(ctl_error_copy(&dst, &src), 0);
    ctl_error_fini(&src);
    assert_int_equal(dst.kind, CTL_BUSY);
    assert_string_equal(dst.reason, "pinned");
    assert_int_equal(dst.blob_count, 0);

    /* A remote error (with remote_kind) copies too. */
    ctl_error_init(&src);
    msgpack_packer *pk = &f->buf.pk;
    msgpack_pack_map(pk, 4);
    tu_pk_str(pk, "kind");
    tu_pk_str(pk, "Weird");
    tu_pk_str(pk, "msg");
    tu_pk_str(pk, "odd");
    tu_pk_str(pk, "reason");
    msgpack_pack_nil(pk);
    tu_pk_str(pk, "blobs");
    msgpack_pack_nil(pk);
    msgpack_object body = unpack_buf(f);
    ctl_env_unpack_error(&src, ADDR, OP, &body);
    assert_int_equal(ctl_error_copy(&dst, &src), 0);
    ctl_error_fini(&src);
    assert_int_equal(dst.kind, CTL_TRANSFER);
    assert_int_equal(dst.cause, CTL_CAUSE_REMOTE);
    assert_string_equal(dst.remote_kind, "Weird");

    ctl_error_fini(&dst);
}

static void test_error_clear_and_fini(void **state)
{
    fx *f = *state;
    ctl_str ids[1] = {{"z", 1}};
    ctl_error_missing(&f->err, ids, 1, "m");
    ctl_error_clear(&f->err);
    assert_int_equal(f->err.kind, CTL_OK);
    assert_null(f->err.blobs);
    assert_int_equal(f->err.blob_count, 0);
    ctl_error_busy(&f->err, "r", "b");
    ctl_error_fini(&f->err);
    assert_int_equal(f->err.kind, CTL_OK);
    assert_null(f->err.reason);
    ctl_error_fini(&f->err); /* twice is fine */
    ctl_error_fini(NULL);
}

/* ---- error maps: pack, decode, rebuild ----------------------------------- */

static void test_error_map_roundtrip_unit_full(void **state)
{
    fx *f = *state;
    assert_int_equal(tu_pack_error_map(&f->buf.pk, CTL_UNIT_FULL,
                                             "no room for 12 bytes", NULL, NULL, 0),
                     0);
    msgpack_object body = unpack_buf(f);
    /* Exactly the four keys of docs/PROTOCOL.md. */
    assert_int_equal(body.type, MSGPACK_OBJECT_MAP);
    assert_int_equal(body.via.map.size, 4);
    assert_true(tu_obj_is_str(tu_obj_get(&body, "kind"), "UnitFull"));
    assert_true(tu_obj_is_str(tu_obj_get(&body, "msg"), "no room for 12 bytes"));
    assert_int_equal(tu_obj_get(&body, "reason")->type, MSGPACK_OBJECT_NIL);
    assert_int_equal(tu_obj_get(&body, "blobs")->type, MSGPACK_OBJECT_NIL);

    assert_int_equal(ctl_env_unpack_error(&f->err, ADDR, OP, &body), CTL_UNIT_FULL);
    assert_int_equal(f->err.kind, CTL_UNIT_FULL);
    assert_int_equal(f->err.cause, CTL_CAUSE_NONE);
    assert_names_addr_op(&f->err);
    assert_non_null(strstr(f->err.msg, "no room for 12 bytes"));
}

static void test_error_map_roundtrip_busy(void **state)
{
    fx *f = *state;
    assert_int_equal(tu_pack_error_map(&f->buf.pk, CTL_BUSY, "try later",
                                             "pinned", NULL, 0),
                     0);
    msgpack_object body = unpack_buf(f);
    assert_int_equal(body.via.map.size, 4);
    assert_true(tu_obj_is_str(tu_obj_get(&body, "kind"), "Busy"));
    assert_true(tu_obj_is_str(tu_obj_get(&body, "reason"), "pinned"));
    assert_int_equal(tu_obj_get(&body, "blobs")->type, MSGPACK_OBJECT_NIL);

    assert_int_equal(ctl_env_unpack_error(&f->err, ADDR, OP, &body), CTL_BUSY);
    assert_int_equal(f->err.kind, CTL_BUSY);
    assert_string_equal(f->err.reason, "pinned");
    assert_names_addr_op(&f->err);
    assert_non_null(strstr(f->err.msg, "try later"));
}

static void test_error_map_roundtrip_missing(void **state)
{
    fx *f = *state;
    ctl_str ids[3] = {{"b-1", 3}, {"b\0-2", 4}, {"", 0}};
    assert_int_equal(tu_pack_error_map(&f->buf.pk, CTL_MISSING, "gone",
                                             NULL, ids, 3),
                     0);
    msgpack_object body = unpack_buf(f);
    const msgpack_object *blobs = tu_obj_get(&body, "blobs");
    assert_non_null(blobs);
    assert_int_equal(blobs->type, MSGPACK_OBJECT_ARRAY);
    assert_int_equal(blobs->via.array.size, 3);
    assert_int_equal(tu_obj_get(&body, "reason")->type, MSGPACK_OBJECT_NIL);

    assert_int_equal(ctl_env_unpack_error(&f->err, ADDR, OP, &body), CTL_MISSING);
    assert_int_equal(f->err.blob_count, 3);
    for (size_t i = 0; i < 3; i++) {
        assert_int_equal(f->err.blobs[i].len, ids[i].len);
        assert_memory_equal(f->err.blobs[i].ptr, ids[i].ptr, ids[i].len);
    }
    assert_null(f->err.reason);
    assert_names_addr_op(&f->err);
}

static void test_error_map_missing_empty_list(void **state)
{
    fx *f = *state;
    msgpack_packer *pk = &f->buf.pk;
    msgpack_pack_map(pk, 4);
    tu_pk_str(pk, "kind");
    tu_pk_str(pk, "Missing");
    tu_pk_str(pk, "msg");
    tu_pk_str(pk, "none listed");
    tu_pk_str(pk, "reason");
    msgpack_pack_nil(pk);
    tu_pk_str(pk, "blobs");
    msgpack_pack_array(pk, 0);
    msgpack_object body = unpack_buf(f);
    assert_int_equal(ctl_env_unpack_error(&f->err, ADDR, OP, &body), CTL_MISSING);
    assert_int_equal(f->err.blob_count, 0);
}

static void test_error_map_roundtrip_protocol(void **state)
{
    fx *f = *state;
    assert_int_equal(tu_pack_error_map(&f->buf.pk, CTL_PROTOCOL,
                                             "missing argument 'key'", NULL, NULL, 0),
                     0);
    msgpack_object body = unpack_buf(f);
    assert_true(tu_obj_is_str(tu_obj_get(&body, "kind"), "Protocol"));

    assert_int_equal(ctl_env_unpack_error(&f->err, ADDR, OP, &body), CTL_TRANSFER);
    assert_int_equal(f->err.kind, CTL_TRANSFER);
    assert_int_equal(f->err.cause, CTL_CAUSE_REMOTE);
    assert_non_null(f->err.remote_kind);
    assert_string_equal(f->err.remote_kind, "Protocol");
    assert_names_addr_op(&f->err);
    assert_non_null(strstr(f->err.msg, "missing argument 'key'"));
}

/* Maps written by hand, in another key order, as a foreign peer might. */
static void test_error_map_foreign_key_order(void **state)
{
    fx *f = *state;
    msgpack_packer *pk = &f->buf.pk;
    msgpack_pack_map(pk, 4);
    tu_pk_str(pk, "blobs");
    msgpack_pack_nil(pk);
    tu_pk_str(pk, "reason");
    tu_pk_str(pk, "draining");
    tu_pk_str(pk, "msg");
    tu_pk_str(pk, "shutting down");
    tu_pk_str(pk, "kind");
    tu_pk_str(pk, "Busy");
    msgpack_object body = unpack_buf(f);
    assert_int_equal(ctl_env_unpack_error(&f->err, ADDR, OP, &body), CTL_BUSY);
    assert_string_equal(f->err.reason, "draining");
}

static void test_error_map_unknown_kind(void **state)
{
    fx *f = *state;
    msgpack_packer *pk = &f->buf.pk;
    msgpack_pack_map(pk, 4);
    tu_pk_str(pk, "kind");
    tu_pk_str(pk, "Exploded");
    tu_pk_str(pk, "msg");
    tu_pk_str(pk, "the unit exploded");
    tu_pk_str(pk, "reason");
    msgpack_pack_nil(pk);
    tu_pk_str(pk, "blobs");
    msgpack_pack_nil(pk);
    msgpack_object body = unpack_buf(f);
    assert_int_equal(ctl_env_unpack_error(&f->err, ADDR, OP, &body), CTL_TRANSFER);
    assert_int_equal(f->err.cause, CTL_CAUSE_REMOTE);
    assert_string_equal(f->err.remote_kind, "Exploded");
    assert_names_addr_op(&f->err);
}

/* Kinds that exist locally but never cross the wire are unknown there. */
static void test_error_map_local_kind_names_are_unknown(void **state)
{
    fx *f = *state;
    const char *names[] = {"Transfer", "Invalid", "OK"};
    for (size_t i = 0; i < 3; i++) {
        tu_buf_reset(&f->buf);
        msgpack_packer *pk = &f->buf.pk;
        msgpack_pack_map(pk, 4);
        tu_pk_str(pk, "kind");
        tu_pk_str(pk, names[i]);
        tu_pk_str(pk, "msg");
        tu_pk_str(pk, "m");
        tu_pk_str(pk, "reason");
        msgpack_pack_nil(pk);
        tu_pk_str(pk, "blobs");
        msgpack_pack_nil(pk);
        msgpack_object body = unpack_buf(f);
        assert_int_equal(ctl_env_unpack_error(&f->err, ADDR, OP, &body), CTL_TRANSFER);
        assert_int_equal(f->err.cause, CTL_CAUSE_REMOTE);
        assert_string_equal(f->err.remote_kind, names[i]);
    }
}

/* Each malformed body is built by one case of this switch. */
enum { BAD_INT, BAD_STR, BAD_NIL, BAD_ARRAY, BAD_EMPTY_MAP, BAD_NO_KIND,
       BAD_KIND_INT, BAD_KIND_BIN, BAD_BLOBS_STR, BAD_BLOB_INT, BAD_COUNT_ };

static void pack_bad_body(msgpack_packer *pk, int which)
{
    switch (which) {
    case BAD_INT:
        msgpack_pack_int(pk, 42);
        break;
    case BAD_STR:
        tu_pk_str(pk, "Protocol");
        break;
    case BAD_NIL:
        msgpack_pack_nil(pk);
        break;
    case BAD_ARRAY: /* not the earlier release's [kind, msg] either */
        msgpack_pack_array(pk, 3);
        tu_pk_str(pk, "Busy");
        tu_pk_str(pk, "m");
        msgpack_pack_nil(pk);
        break;
    case BAD_EMPTY_MAP:
        msgpack_pack_map(pk, 0);
        break;
    case BAD_NO_KIND:
        msgpack_pack_map(pk, 3);
        tu_pk_str(pk, "msg");
        tu_pk_str(pk, "m");
        tu_pk_str(pk, "reason");
        msgpack_pack_nil(pk);
        tu_pk_str(pk, "blobs");
        msgpack_pack_nil(pk);
        break;
    case BAD_KIND_INT:
    case BAD_KIND_BIN:
        msgpack_pack_map(pk, 4);
        tu_pk_str(pk, "kind");
        if (which == BAD_KIND_INT) {
            msgpack_pack_int(pk, -2);
        } else {
            msgpack_pack_bin(pk, 4);
            msgpack_pack_bin_body(pk, "Busy", 4);
        }
        tu_pk_str(pk, "msg");
        tu_pk_str(pk, "m");
        tu_pk_str(pk, "reason");
        msgpack_pack_nil(pk);
        tu_pk_str(pk, "blobs");
        msgpack_pack_nil(pk);
        break;
    case BAD_BLOBS_STR:
    case BAD_BLOB_INT:
        msgpack_pack_map(pk, 4);
        tu_pk_str(pk, "kind");
        tu_pk_str(pk, "Missing");
        tu_pk_str(pk, "msg");
        tu_pk_str(pk, "m");
        tu_pk_str(pk, "reason");
        msgpack_pack_nil(pk);
        tu_pk_str(pk, "blobs");
        if (which == BAD_BLOBS_STR) {
            tu_pk_str(pk, "b1");
        } else {
            msgpack_pack_array(pk, 2);
            tu_pk_str(pk, "b1");
            msgpack_pack_int(pk, 2);
        }
        break;
    default:
        fail();
    }
}

/* The reference design's earlier release answers [kind, msg]: each kind is
 * read as from the map, with no reason and no blobs. */
static void test_error_old_two_element_form(void **state)
{
    fx *f = *state;
    static const struct {
        const char *kind;
        int want;
    } cases[] = {{"UnitFull", CTL_UNIT_FULL}, {"Busy", CTL_BUSY},   {"Missing", CTL_MISSING},
                 {"Protocol", CTL_TRANSFER},  {"NoSuchJob", CTL_TRANSFER}};
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        tu_buf_reset(&f->buf);
        msgpack_pack_array(&f->buf.pk, 2);
        tu_pk_str(&f->buf.pk, cases[i].kind);
        tu_pk_str(&f->buf.pk, "said the old unit");
        msgpack_object body = unpack_buf(f);
        assert_int_equal(ctl_env_unpack_error(&f->err, ADDR, OP, &body), cases[i].want);
        assert_int_equal(f->err.kind, cases[i].want);
        assert_names_addr_op(&f->err);
        assert_non_null(strstr(f->err.msg, "said the old unit"));
        assert_null(f->err.reason);
        assert_int_equal(f->err.blob_count, 0);
        if (cases[i].want == CTL_TRANSFER) {
            assert_int_equal(f->err.cause, CTL_CAUSE_REMOTE);
            assert_string_equal(f->err.remote_kind, cases[i].kind);
        }
    }
    /* [kind, nil] too: no message. */
    tu_buf_reset(&f->buf);
    msgpack_pack_array(&f->buf.pk, 2);
    tu_pk_str(&f->buf.pk, "UnitFull");
    msgpack_pack_nil(&f->buf.pk);
    msgpack_object body = unpack_buf(f);
    assert_int_equal(ctl_env_unpack_error(&f->err, ADDR, OP, &body), CTL_UNIT_FULL);
}

static void test_error_map_malformed_is_bad_reply(void **state)
{
    fx *f = *state;
    for (int which = 0; which < BAD_COUNT_; which++) {
        tu_buf_reset(&f->buf);
        pack_bad_body(&f->buf.pk, which);
        msgpack_object body = unpack_buf(f);
        int rc = ctl_env_unpack_error(&f->err, ADDR, OP, &body);
        if (rc != CTL_TRANSFER || f->err.kind != CTL_TRANSFER ||
            f->err.cause != CTL_CAUSE_BAD_REPLY)
            fail_msg("malformed error map #%d gave kind %d cause %d", which,
                     rc, (int)f->err.cause);
        assert_names_addr_op(&f->err);
    }
}

/* ---- copying every field, and allocation failure -------------------------- */

/*
 * test_error is linked with -Wl,--wrap=malloc,--wrap=calloc,--wrap=realloc
 * (tests/runtime/CMakeLists.txt), so every allocation the runtime's (static)
 * objects make in this executable comes through the wrappers below. When
 * armed, the `fail_at`-th allocation from then on (1: the next) returns
 * NULL, and with `fail_rest` every later one too. Only this thread
 * allocates while armed.
 */
void *__real_malloc(size_t size);
void *__real_calloc(size_t n, size_t size);
void *__real_realloc(void *p, size_t size);
void *__wrap_malloc(size_t size);
void *__wrap_calloc(size_t n, size_t size);
void *__wrap_realloc(void *p, size_t size);

static int alloc_seen; /* allocations since armed */
static int fail_at;    /* 0: disarmed */
static bool fail_rest;

static bool inject(void)
{
    if (fail_at == 0)
        return false;
    alloc_seen++;
    return alloc_seen == fail_at || (fail_rest && alloc_seen > fail_at);
}

void *__wrap_malloc(size_t size)
{
    return inject() ? NULL : __real_malloc(size);
}

void *__wrap_calloc(size_t n, size_t size)
{
    return inject() ? NULL : __real_calloc(n, size);
}

void *__wrap_realloc(void *p, size_t size)
{
    return inject() ? NULL : __real_realloc(p, size);
}

static void arm(int at, bool rest)
{
    alloc_seen = 0;
    fail_at = at;
    fail_rest = rest;
}

/* Disarm; returns how many allocations were made while armed. */
static int disarm(void)
{
    fail_at = 0;
    return alloc_seen;
}

/* Whether the runtime's allocations come through the wrappers: not when
 * it is a shared library (BUILD_SHARED_LIBS), whose references --wrap does
 * not see. The tests that inject failures are skipped then. */
static bool injection_reaches_runtime(void)
{
    ctl_error e;
    ctl_error_init(&e);
    arm(1, false);
    ctl_error_set(&e, CTL_INVALID, "probe");
    bool reached = disarm() == 1;
    ctl_error_fini(&e);
    if (!reached)
        fprintf(stderr, "allocation failures cannot be injected into the runtime "
                        "(a shared library?): skipped\n");
    return reached;
}

/* The injection works: a wrapped allocation fails when told to. */
static void test_alloc_injection_works(void **state)
{
    (void)state;
    ctl_error e;
    if (!injection_reaches_runtime())
        skip();
    ctl_error_init(&e);
    arm(1, false);
    ctl_error_set(&e, CTL_INVALID, "a %s message", "formatted");
    assert_int_equal(disarm(), 1);
    assert_int_equal(e.kind, CTL_INVALID);
    assert_string_equal(e.msg, "out of memory while reporting an error");
    ctl_error_set(&e, CTL_INVALID, "a %s message", "formatted");
    assert_string_equal(e.msg, "a formatted message");
    ctl_error_fini(&e);
}

#define NOTE " (details lost: out of memory)"
#define FALLBACK "out of memory while reporting an error"

static bool ends_with(const char *s, const char *tail)
{
    size_t n = strlen(s), t = strlen(tail);
    return n >= t && strcmp(s + n - t, tail) == 0;
}

/* An error with every field set, each owned by it. */
static void fill_every_field(ctl_error *e)
{
    static const ctl_str ids[] = {{"x\0y", 3}, {"", 0}, {"zz", 2}};
    ctl_error_init(e);
    ctl_error_missing(e, ids, 3, "message #%d", 1);
    e->kind = CTL_TRANSFER;
    e->cause = CTL_CAUSE_REMOTE;
    e->reason = strdup("the reason");
    e->remote_kind = strdup("Weird");
    assert_non_null(e->reason);
    assert_non_null(e->remote_kind);
}

static void expect_same_fields(const ctl_error *dst, const ctl_error *src)
{
    assert_int_equal(dst->kind, src->kind);
    assert_int_equal(dst->cause, src->cause);
    assert_string_equal(dst->msg, src->msg);
    assert_ptr_not_equal(dst->msg, src->msg);
    assert_string_equal(dst->reason, src->reason);
    assert_ptr_not_equal(dst->reason, src->reason);
    assert_string_equal(dst->remote_kind, src->remote_kind);
    assert_ptr_not_equal(dst->remote_kind, src->remote_kind);
    assert_int_equal(dst->blob_count, src->blob_count);
    assert_ptr_not_equal(dst->blobs, src->blobs);
    for (size_t i = 0; i < src->blob_count; i++) {
        assert_int_equal(dst->blobs[i].len, src->blobs[i].len);
        assert_ptr_not_equal(dst->blobs[i].ptr, src->blobs[i].ptr);
        if (src->blobs[i].len)
            assert_memory_equal(dst->blobs[i].ptr, src->blobs[i].ptr, src->blobs[i].len);
        assert_int_equal(dst->blobs[i].ptr[dst->blobs[i].len], '\0');
    }
}

/* ctl_error_copy copies kind, cause, msg, reason, blobs and remote_kind,
 * each into storage of the copy's own. */
static void test_error_copy_every_field(void **state)
{
    (void)state;
    ctl_error src, dst;
    fill_every_field(&src);
    ctl_error_init(&dst);
    ctl_error_busy(&dst, "old reason", "old contents, released by the copy");
    assert_int_equal(ctl_error_copy(&dst, &src), 0);
    expect_same_fields(&dst, &src);
    assert_int_equal(dst.kind, CTL_TRANSFER);
    assert_int_equal(dst.cause, CTL_CAUSE_REMOTE);
    assert_string_equal(dst.msg, "message #1");
    assert_string_equal(dst.reason, "the reason");
    assert_string_equal(dst.remote_kind, "Weird");
    assert_int_equal(dst.blob_count, 3);
    assert_memory_equal(dst.blobs[0].ptr, "x\0y", 3);
    ctl_error_fini(&src);
    /* The copy outlives its source. */
    assert_string_equal(dst.msg, "message #1");
    assert_memory_equal(dst.blobs[2].ptr, "zz", 2);

    /* An empty error copies as empty; a copy onto itself or with NULLs
     * changes nothing. */
    ctl_error_init(&src);
    assert_int_equal(ctl_error_copy(&dst, &dst), 0);
    assert_string_equal(dst.remote_kind, "Weird");
    assert_int_equal(ctl_error_copy(NULL, &dst), 0);
    assert_int_equal(ctl_error_copy(&dst, NULL), 0);
    assert_string_equal(dst.msg, "message #1");
    assert_int_equal(ctl_error_copy(&dst, &src), 0);
    assert_int_equal(dst.kind, CTL_OK);
    assert_int_equal(dst.cause, CTL_CAUSE_NONE);
    assert_null(dst.msg);
    assert_null(dst.reason);
    assert_null(dst.blobs);
    assert_int_equal(dst.blob_count, 0);
    assert_null(dst.remote_kind);
    ctl_error_fini(&dst);
}

/* Busy and Missing keep their kind (and say what they could not keep)
 * whichever allocation fails. */
static void test_error_busy_missing_keep_kind(void **state)
{
    (void)state;
    static const ctl_str ids[] = {{"b0", 2}, {"b\0\x01", 3}, {"", 0}};
    ctl_error e;
    ctl_error_init(&e);

    /* Without failures. */
    assert_int_equal(ctl_error_busy(&e, "pinned", "busy %d", 1), CTL_BUSY);
    assert_int_equal(e.kind, CTL_BUSY);
    assert_string_equal(e.reason, "pinned");
    assert_int_equal(ctl_error_missing(&e, ids, 3, "missing %d", 3), CTL_MISSING);
    assert_int_equal(e.kind, CTL_MISSING);
    assert_int_equal(e.blob_count, 3);
    if (!injection_reaches_runtime()) {
        ctl_error_fini(&e);
        skip();
    }

    bool injected_reason = false;
    for (int at = 1;; at++) {
        arm(at, false);
        int rc = ctl_error_busy(&e, "pinned", "busy %d", 2);
        int made = disarm();
        assert_int_equal(rc, CTL_BUSY);
        assert_int_equal(e.kind, CTL_BUSY);
        assert_non_null(e.msg);
        if (at > made) { /* nothing failed */
            assert_string_equal(e.reason, "pinned");
            assert_string_equal(e.msg, "busy 2");
            break;
        }
        if (e.reason == NULL) {
            injected_reason = true;
            assert_true(ends_with(e.msg, NOTE) || strcmp(e.msg, FALLBACK) == 0);
        } else {
            assert_string_equal(e.reason, "pinned");
            assert_string_equal(e.msg, FALLBACK); /* the message was lost */
        }
    }
    assert_true(injected_reason);
    /* Everything fails: still Busy. */
    arm(1, true);
    ctl_error_busy(&e, "pinned", "busy %d", 3);
    disarm();
    assert_int_equal(e.kind, CTL_BUSY);
    assert_null(e.reason);
    assert_string_equal(e.msg, FALLBACK);

    bool injected_blobs = false;
    for (int at = 1;; at++) {
        arm(at, false);
        int rc = ctl_error_missing(&e, ids, 3, "missing %d", 4);
        int made = disarm();
        assert_int_equal(rc, CTL_MISSING);
        assert_int_equal(e.kind, CTL_MISSING);
        assert_non_null(e.msg);
        if (at > made) {
            assert_int_equal(e.blob_count, 3);
            assert_string_equal(e.msg, "missing 4");
            break;
        }
        if (e.blob_count == 0) { /* none kept, never some */
            injected_blobs = true;
            assert_null(e.blobs);
            assert_true(ends_with(e.msg, NOTE) || strcmp(e.msg, FALLBACK) == 0);
        } else {
            assert_int_equal(e.blob_count, 3);
            assert_memory_equal(e.blobs[1].ptr, "b\0\x01", 3);
            assert_string_equal(e.msg, FALLBACK);
        }
    }
    assert_true(injected_blobs);
    arm(1, true);
    ctl_error_missing(&e, ids, 3, "missing %d", 5);
    disarm();
    assert_int_equal(e.kind, CTL_MISSING);
    assert_int_equal(e.blob_count, 0);
    assert_null(e.blobs);
    assert_string_equal(e.msg, FALLBACK);

    /* And a copy of either keeps the kind. */
    ctl_error c;
    ctl_error_init(&c);
    ctl_error_busy(&e, "r", "b");
    assert_int_equal(ctl_error_copy(&c, &e), 0);
    assert_int_equal(c.kind, CTL_BUSY);
    ctl_error_missing(&e, ids, 1, "m");
    assert_int_equal(ctl_error_copy(&c, &e), 0);
    assert_int_equal(c.kind, CTL_MISSING);
    ctl_error_fini(&c);
    ctl_error_fini(&e);
}

/* A copy that runs out of memory at any step is CTL_TRANSFER /
 * CTL_CAUSE_NOMEM naming what was copied, never a partial copy. */
static void test_error_copy_nomem_never_partial(void **state)
{
    (void)state;
    ctl_error src, dst;
    int failures = 0;
    if (!injection_reaches_runtime())
        skip();
    fill_every_field(&src);
    ctl_error_init(&dst);
    for (int rest = 0; rest < 2; rest++) {
        for (int at = 1;; at++) {
            ctl_error_busy(&dst, "old reason", "old contents");
            arm(at, rest != 0);
            int rc = ctl_error_copy(&dst, &src);
            int made = disarm();
            if (at > made) { /* nothing failed: a full copy */
                assert_int_equal(rc, 0);
                expect_same_fields(&dst, &src);
                break;
            }
            failures++;
            if (rc != CTL_TRANSFER)
                fail_msg("allocation #%d%s failed, yet the copy returned %d", at,
                         rest ? " and on" : "", rc);
            assert_int_equal(dst.kind, CTL_TRANSFER);
            assert_int_equal(dst.cause, CTL_CAUSE_NOMEM);
            assert_null(dst.reason);
            assert_null(dst.remote_kind);
            assert_null(dst.blobs);
            assert_int_equal(dst.blob_count, 0);
            assert_non_null(dst.msg);
            if (rest)
                assert_string_equal(dst.msg, FALLBACK);
            else
                assert_string_equal(dst.msg,
                                    "out of memory copying an error (Transfer: message #1)");
        }
    }
    /* msg, reason, remote_kind, the blob array and 3 blobs: 7 steps, each
     * failed alone and then with all the rest. */
    assert_int_equal(failures, 14);

    /* A source whose message is the constant fallback copies as such. */
    ctl_error lost;
    ctl_error_init(&lost);
    arm(1, true);
    ctl_error_set(&lost, CTL_PROTOCOL, "never stored");
    disarm();
    assert_string_equal(lost.msg, FALLBACK);
    assert_int_equal(ctl_error_copy(&dst, &lost), 0);
    assert_int_equal(dst.kind, CTL_PROTOCOL);
    assert_string_equal(dst.msg, FALLBACK);
    ctl_error_fini(&lost);
    ctl_error_fini(&dst); /* the fallback is not freed (ASan would say) */
    ctl_error_fini(&src);
}

/* Every setter may be given pieces of the error it replaces: the new
 * error is built before the old one is released (ASan sees any read of
 * freed memory). */
static void test_error_wraps_itself(void **state)
{
    (void)state;
    ctl_error e;
    ctl_error_init(&e);
    ctl_error_set(&e, CTL_INVALID, "inner %d", 1);
    ctl_error_set(&e, CTL_INVALID, "ctx: %s", e.msg);
    assert_string_equal(e.msg, "ctx: inner 1");
    ctl_error_transfer(&e, CTL_CAUSE_TIMEOUT, "call: %s", e.msg);
    assert_string_equal(e.msg, "call: ctx: inner 1");
    assert_int_equal(e.cause, CTL_CAUSE_TIMEOUT);
    ctl_error_busy(&e, "pinned", "busy");
    ctl_error_busy(&e, e.reason, "again: %s (%s)", e.msg, e.reason);
    assert_string_equal(e.msg, "again: busy (pinned)");
    assert_string_equal(e.reason, "pinned");
    ctl_str ids[] = {{"b1", 2}, {"b2", 2}};
    ctl_error_missing(&e, ids, 2, "missing");
    ctl_error_missing(&e, e.blobs, e.blob_count, "%s: %s", e.msg, e.blobs[1].ptr);
    assert_string_equal(e.msg, "missing: b2");
    assert_int_equal(e.blob_count, 2);
    assert_string_equal(e.blobs[0].ptr, "b1");
    ctl_error_declared(&e, "NotFound", 7, "gone", "decl");
    ctl_error_declared(&e, e.remote_kind, e.code, e.reason, "%s/%s", e.msg, e.remote_kind);
    assert_string_equal(e.msg, "decl/NotFound");
    assert_string_equal(e.remote_kind, "NotFound");
    assert_string_equal(e.reason, "gone");
    assert_int_equal(e.code, 7);
    ctl_error_fini(&e);
}

int main(void)
{
#define T(fn) cmocka_unit_test_setup_teardown(fn, setup, teardown)
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_kind_values_and_names),
        cmocka_unit_test(test_kind_from_wire),
        cmocka_unit_test(test_cause_names),
        cmocka_unit_test(test_str_c),
        T(test_error_init_is_ok),
        T(test_error_set_formats_and_returns_kind),
        T(test_error_long_message),
        T(test_error_transfer_cause),
        T(test_error_busy_reason),
        T(test_error_missing_blobs_copied),
        T(test_error_copy_is_deep),
        T(test_error_clear_and_fini),
        T(test_error_map_roundtrip_unit_full),
        T(test_error_map_roundtrip_busy),
        T(test_error_map_roundtrip_missing),
        T(test_error_map_missing_empty_list),
        T(test_error_map_roundtrip_protocol),
        T(test_error_map_foreign_key_order),
        T(test_error_map_unknown_kind),
        T(test_error_map_local_kind_names_are_unknown),
        T(test_error_old_two_element_form),
        T(test_error_map_malformed_is_bad_reply),
        cmocka_unit_test(test_alloc_injection_works),
        cmocka_unit_test(test_error_copy_every_field),
        cmocka_unit_test(test_error_busy_missing_keep_kind),
        cmocka_unit_test(test_error_copy_nomem_never_partial),
        cmocka_unit_test(test_error_wraps_itself),
    };
#undef T
    return cmocka_run_group_tests(tests, NULL, NULL);
}
