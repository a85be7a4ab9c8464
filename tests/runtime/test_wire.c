/*
 * test_wire.c - the bounded scan (ctl_wire_check), envelopes (envelope_int.h)
 * and the value readers and writers of ctlrpc/codec.h.
 *
 * Truncation tests copy each prefix into a heap block of exactly that size,
 * so under ASan a scan that reads one byte too far fails loudly instead of
 * reading the rest of a larger buffer.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>

#include <float.h>
#include <stdlib.h>
#include <limits.h>
#include <string.h>

#include "testutil.h"
#include "bigbuf_int.h"
#include "envelope_int.h"

/* Append [op, id, args] to `sb` with the runtime's one request framer. */
static int pack_request(msgpack_sbuffer *sb, ctl_str op, ctl_str id,
                        const void *args, size_t args_len)
{
    ctl_frame fr;
    ctl_payload p;
    ctl_frame_begin(&fr, op, id.len);
    ctl_frame_args(&fr, args, args_len);
    ctl_frame_set_id(&fr, id);
    int rc = ctl_frame_take(&fr, &p);
    ctl_frame_fini(&fr);
    if (rc != 0)
        return -1;
    rc = msgpack_sbuffer_write(sb, p.data, p.size);
    p.free(p.data, p.hint);
    return rc ? -1 : 0;
}

typedef struct fx {
    tu_buf buf;  /* scratch packing */
    tu_buf args; /* packed args for requests */
    msgpack_zone zone;
    ctl_limits lim; /* all defaults (zero fields) */
    char why[256];
    unsigned char *copy; /* the payload the last decode() views point into */
} fx;

static int setup(void **state)
{
    fx *f = calloc(1, sizeof *f);
    if (f == NULL)
        return -1;
    tu_buf_init(&f->buf);
    tu_buf_init(&f->args);
    msgpack_zone_init(&f->zone, 4096);
    *state = f;
    return 0;
}

static int teardown(void **state)
{
    fx *f = *state;
    tu_buf_fini(&f->buf);
    tu_buf_fini(&f->args);
    msgpack_zone_destroy(&f->zone);
    free(f->copy);
    free(f);
    return 0;
}

/* Scan `len` bytes held in a heap block of exactly that size. */
static ctl_wire_status check_exact(const void *data, size_t len,
                                   const ctl_limits *lim, size_t *items,
                                   size_t *used)
{
    unsigned char *copy = malloc(len ? len : 1);
    ctl_wire_status st;
    assert_non_null(copy);
    if (len)
        memcpy(copy, data, len);
    st = ctl_wire_check(len ? copy : NULL, len, lim, 0, items, used);
    free(copy);
    return st;
}

/* ---- limits ------------------------------------------------------------- */

static void test_limits_resolve(void **state)
{
    (void)state;
    ctl_limits d = ctl_limits_resolve(NULL);
    assert_int_equal(d.max_msg_bytes, CTL_DEFAULT_MAX_MSG_BYTES);
    assert_int_equal(d.max_depth, CTL_DEFAULT_MAX_DEPTH);
    assert_int_equal(d.max_items, CTL_DEFAULT_MAX_ITEMS);
    ctl_limits in = {0, 7, 0};
    ctl_limits r = ctl_limits_resolve(&in);
    assert_int_equal(r.max_msg_bytes, CTL_DEFAULT_MAX_MSG_BYTES);
    assert_int_equal(r.max_depth, 7);
    assert_int_equal(r.max_items, CTL_DEFAULT_MAX_ITEMS);
    ctl_limits in2 = {1000, 0, 55};
    r = ctl_limits_resolve(&in2);
    assert_int_equal(r.max_msg_bytes, 1000);
    assert_int_equal(r.max_depth, CTL_DEFAULT_MAX_DEPTH);
    assert_int_equal(r.max_items, 55);
}

static void test_status_names(void **state)
{
    (void)state;
    const ctl_wire_status all[] = {CTL_WIRE_OK, CTL_WIRE_TRUNCATED,
                                   CTL_WIRE_BAD_BYTE, CTL_WIRE_TOO_DEEP,
                                   CTL_WIRE_TOO_MANY, CTL_WIRE_BAD_COUNT};
    for (size_t i = 0; i < 6; i++) {
        const char *n = ctl_wire_status_name(all[i]);
        assert_non_null(n);
        assert_true(strlen(n) > 0);
        for (size_t j = 0; j < i; j++)
            assert_string_not_equal(n, ctl_wire_status_name(all[j]));
    }
    assert_string_equal(ctl_wire_status_name(CTL_WIRE_TRUNCATED), "truncated");
}

/* ---- valid messages: every encoding, every prefix ----------------------- */

/* Messages covering every msgpack encoding but ext (separate test). */
static void build_valid_messages(tu_buf *b, size_t *ends, size_t *count)
{
    msgpack_packer *pk = &b->pk;
    size_t n = 0;
    char big[70000];
    memset(big, 'q', sizeof big);
#define END() (ends[n++] = b->sb.size)
    msgpack_pack_nil(pk); END();
    msgpack_pack_true(pk); END();
    msgpack_pack_false(pk); END();
    msgpack_pack_int(pk, 5); END();          /* positive fixint */
    msgpack_pack_int(pk, -5); END();         /* negative fixint */
    msgpack_pack_uint8(pk, 200); END();      /* 0xcc */
    msgpack_pack_uint16(pk, 60000); END();   /* 0xcd */
    msgpack_pack_uint32(pk, 4000000000u); END();
    msgpack_pack_uint64(pk, UINT64_MAX); END();
    msgpack_pack_int8(pk, -100); END();      /* 0xd0 */
    msgpack_pack_int16(pk, -30000); END();
    msgpack_pack_int32(pk, -2000000000); END();
    msgpack_pack_int64(pk, INT64_MIN); END();
    msgpack_pack_float(pk, 1.5f); END();
    msgpack_pack_double(pk, -2.25); END();
    tu_pk_str(pk, ""); END();
    tu_pk_str(pk, "fixstr"); END();
    tu_pk_strn(pk, big, 40); END();          /* str8 */
    tu_pk_strn(pk, big, 300); END();         /* str16 */
    msgpack_pack_bin(pk, 0); END();
    msgpack_pack_bin(pk, 3); msgpack_pack_bin_body(pk, "a\0b", 3); END();
    msgpack_pack_bin(pk, 300); msgpack_pack_bin_body(pk, big, 300); END();
    msgpack_pack_array(pk, 0); END();
    msgpack_pack_map(pk, 0); END();
    /* array16 and map16 */
    msgpack_pack_array(pk, 20);
    for (int i = 0; i < 20; i++)
        msgpack_pack_int(pk, i);
    END();
    msgpack_pack_map(pk, 17);
    for (int i = 0; i < 17; i++) {
        msgpack_pack_int(pk, i);
        msgpack_pack_nil(pk);
    }
    END();
    /* A request envelope with nested args. */
    msgpack_pack_array(pk, 3);
    tu_pk_str(pk, "put");
    tu_pk_str(pk, "0123456789ab");
    msgpack_pack_map(pk, 3);
    tu_pk_str(pk, "key");
    tu_pk_str(pk, "k1");
    tu_pk_str(pk, "data");
    msgpack_pack_bin(pk, 5);
    msgpack_pack_bin_body(pk, "\x00\x01\x02\x03\x04", 5);
    tu_pk_str(pk, "tags");
    msgpack_pack_array(pk, 2);
    tu_pk_str(pk, "x");
    msgpack_pack_map(pk, 1);
    tu_pk_str(pk, "y");
    msgpack_pack_double(pk, 0.5);
    END();
#undef END
    *count = n;
}

/* Hand-written 32-bit forms the packer never chooses for small values. */
static const unsigned char raw32[][16] = {
    {0xdb, 0, 0, 0, 3, 'a', 'b', 'c'},    /* str32 */
    {0xc6, 0, 0, 0, 2, 0xff, 0x00},       /* bin32 */
    {0xdd, 0, 0, 0, 2, 0x01, 0xc0},       /* array32 */
    {0xdf, 0, 0, 0, 1, 0xa1, 'k', 0x07},  /* map32 */
    {0xda, 0, 1, 'z'},                    /* str16, short */
    {0xdc, 0, 1, 0xc3},                   /* array16 */
    {0xde, 0, 1, 0xc2, 0xc3},             /* map16 */
};
static const size_t raw32_len[] = {8, 7, 7, 8, 4, 4, 5};

static void check_all_prefixes(const unsigned char *m, size_t len)
{
    ctl_limits lim = {0, 0, 0};
    size_t used = 12345;
    for (size_t k = 0; k < len; k++) {
        /* A cut inside a container's elements leaves a count the bytes
         * cannot hold: bad-count is as right as truncated there. */
        ctl_wire_status st = check_exact(m, k, &lim, NULL, NULL);
        if (st != CTL_WIRE_TRUNCATED && st != CTL_WIRE_BAD_COUNT)
            fail_msg("prefix %zu of %zu (first byte 0x%02x): %s, expected truncated",
                     k, len, m[0], ctl_wire_status_name(st));
    }
    assert_int_equal(check_exact(m, len, &lim, NULL, &used), CTL_WIRE_OK);
    assert_int_equal(used, len);
    /* Bytes after the object are not looked at. */
    unsigned char *more = malloc(len + 3);
    memcpy(more, m, len);
    memcpy(more + len, "\xc1\xc1\xdd", 3);
    used = 0;
    assert_int_equal(ctl_wire_check(more, len + 3, &lim, 0, NULL, &used), CTL_WIRE_OK);
    assert_int_equal(used, len);
    free(more);
}

static void test_check_every_prefix_truncated(void **state)
{
    fx *f = *state;
    size_t ends[64], count = 0, start = 0;
    build_valid_messages(&f->buf, ends, &count);
    for (size_t i = 0; i < count; i++) {
        check_all_prefixes((const unsigned char *)f->buf.sb.data + start,
                           ends[i] - start);
        start = ends[i];
    }
    for (size_t i = 0; i < sizeof raw32_len / sizeof raw32_len[0]; i++)
        check_all_prefixes(raw32[i], raw32_len[i]);
}

static void test_check_ext_types(void **state)
{
    fx *f = *state;
    static const size_t sizes[] = {1, 2, 4, 8, 16, 3, 300}; /* fixext*, ext8/16 */
    char body[300];
    memset(body, 'e', sizeof body);
    for (size_t i = 0; i < sizeof sizes / sizeof sizes[0]; i++) {
        tu_buf_reset(&f->buf);
        msgpack_pack_ext(&f->buf.pk, sizes[i], 7);
        msgpack_pack_ext_body(&f->buf.pk, body, sizes[i]);
        check_all_prefixes((const unsigned char *)f->buf.sb.data, f->buf.sb.size);
    }
    static const unsigned char ext32[] = {0xc9, 0, 0, 0, 2, 0x05, 'x', 'y'};
    check_all_prefixes(ext32, sizeof ext32);
}

static void test_check_counts_items(void **state)
{
    fx *f = *state;
    ctl_limits lim = {0, 0, 0};
    size_t items = 0, used = 0;
    /* [1, [2, 3], {"a": "b"}] = 1 + 1 + (1+2) + (1+2) = 8 objects */
    msgpack_pack_array(&f->buf.pk, 3);
    msgpack_pack_int(&f->buf.pk, 1);
    msgpack_pack_array(&f->buf.pk, 2);
    msgpack_pack_int(&f->buf.pk, 2);
    msgpack_pack_int(&f->buf.pk, 3);
    msgpack_pack_map(&f->buf.pk, 1);
    tu_pk_str(&f->buf.pk, "a");
    tu_pk_str(&f->buf.pk, "b");
    assert_int_equal(ctl_wire_check(f->buf.sb.data, f->buf.sb.size, &lim, 0,
                                    &items, &used),
                     CTL_WIRE_OK);
    assert_int_equal(items, 8);
    assert_int_equal(used, f->buf.sb.size);
    /* The count accumulates across calls. */
    assert_int_equal(ctl_wire_check(f->buf.sb.data, f->buf.sb.size, &lim, 0,
                                    &items, NULL),
                     CTL_WIRE_OK);
    assert_int_equal(items, 16);
}

/* ---- hostile input -------------------------------------------------------- */

/* A depth0 near UINT_MAX must not wrap the depth sum (and so write past
 * the scan's stack): any container there is too deep. */
static void test_check_depth0_near_uint_max(void **state)
{
    (void)state;
    ctl_limits lim = {0, 0, 0};
    /* 40 nested arrays: past the stack of 32 if the check wrapped. */
    unsigned char nested[41];
    memset(nested, 0x91, 40);
    nested[40] = 0x01;
    size_t used = 0;
    const unsigned d0s[] = {UINT_MAX, UINT_MAX - 1, UINT_MAX - 31, UINT_MAX - 32,
                            CTL_DEFAULT_MAX_DEPTH, CTL_DEFAULT_MAX_DEPTH + 1};
    for (size_t i = 0; i < sizeof d0s / sizeof d0s[0]; i++) {
        assert_int_equal(ctl_wire_check(nested, sizeof nested, &lim, d0s[i], NULL, &used),
                         CTL_WIRE_TOO_DEEP);
        /* A scalar has no depth: it passes at any level. */
        assert_int_equal(ctl_wire_check(nested + 40, 1, &lim, d0s[i], NULL, &used),
                         CTL_WIRE_OK);
    }
    /* The deepest level allowed still works. */
    assert_int_equal(ctl_wire_check(nested + 39, 2, &lim, CTL_DEFAULT_MAX_DEPTH - 1, NULL,
                                    &used),
                     CTL_WIRE_OK);
    assert_int_equal(ctl_wire_check(nested + 38, 3, &lim, CTL_DEFAULT_MAX_DEPTH - 1, NULL,
                                    &used),
                     CTL_WIRE_TOO_DEEP);
}

static void test_check_c1_bad_byte(void **state)
{
    (void)state;
    ctl_limits lim = {0, 0, 0};
    static const unsigned char top[] = {0xc1};
    static const unsigned char nested[] = {0x93, 0x01, 0x91, 0xc1, 0x02};
    static const unsigned char in_map[] = {0x81, 0xa1, 'k', 0xc1};
    assert_int_equal(check_exact(top, 1, &lim, NULL, NULL), CTL_WIRE_BAD_BYTE);
    assert_int_equal(check_exact(nested, sizeof nested, &lim, NULL, NULL), CTL_WIRE_BAD_BYTE);
    assert_int_equal(check_exact(in_map, sizeof in_map, &lim, NULL, NULL), CTL_WIRE_BAD_BYTE);
}

static void test_check_huge_headers(void **state)
{
    (void)state;
    /* No item cap, so only the byte count can refuse these. */
    ctl_limits nocap = {0, 0, SIZE_MAX};
    ctl_limits dflt = {0, 0, 0};
    static const unsigned char arr32[] = {0xdd, 0xff, 0xff, 0xff, 0xff};
    static const unsigned char map32[] = {0xdf, 0xff, 0xff, 0xff, 0xff};
    static const unsigned char str32[] = {0xdb, 0xff, 0xff, 0xff, 0xff};
    static const unsigned char bin32[] = {0xc6, 0xff, 0xff, 0xff, 0xff};
    static const unsigned char ext32[] = {0xc9, 0xff, 0xff, 0xff, 0xff, 0x01};
    static const unsigned char arr16[] = {0xdc, 0xff, 0xff, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10};
    static const unsigned char inner[] = {0x92, 0x01, 0xdd, 0xff, 0xff, 0xff, 0xff, 0x01};

    assert_int_equal(check_exact(arr32, 5, &nocap, NULL, NULL), CTL_WIRE_BAD_COUNT);
    assert_int_equal(check_exact(map32, 5, &nocap, NULL, NULL), CTL_WIRE_BAD_COUNT);
    assert_int_equal(check_exact(arr16, sizeof arr16, &nocap, NULL, NULL), CTL_WIRE_BAD_COUNT);
    assert_int_equal(check_exact(inner, sizeof inner, &nocap, NULL, NULL), CTL_WIRE_BAD_COUNT);
    assert_int_equal(check_exact(str32, 5, &nocap, NULL, NULL), CTL_WIRE_TRUNCATED);
    assert_int_equal(check_exact(bin32, 5, &nocap, NULL, NULL), CTL_WIRE_TRUNCATED);
    assert_int_equal(check_exact(ext32, 6, &nocap, NULL, NULL), CTL_WIRE_TRUNCATED);

    /* With the default item cap either refusal is right; acceptance is not. */
    ctl_wire_status st = check_exact(arr32, 5, &dflt, NULL, NULL);
    assert_true(st == CTL_WIRE_BAD_COUNT || st == CTL_WIRE_TOO_MANY);
    st = check_exact(map32, 5, &dflt, NULL, NULL);
    assert_true(st == CTL_WIRE_BAD_COUNT || st == CTL_WIRE_TOO_MANY);
    assert_int_equal(check_exact(str32, 5, &dflt, NULL, NULL), CTL_WIRE_TRUNCATED);
    assert_int_equal(check_exact(bin32, 5, &dflt, NULL, NULL), CTL_WIRE_TRUNCATED);
}

/* `levels` nested arrays around nil: 0x91 0x91 ... 0xc0. */
static unsigned char *nested_arrays(size_t levels, size_t *len)
{
    unsigned char *p = malloc(levels + 1);
    assert_non_null(p);
    memset(p, 0x91, levels);
    p[levels] = 0xc0;
    *len = levels + 1;
    return p;
}

static void test_check_depth(void **state)
{
    (void)state;
    ctl_limits lim = {0, 3, 0};
    size_t len;
    unsigned char *p;

    p = nested_arrays(3, &len); /* levels 1..3 */
    assert_int_equal(check_exact(p, len, &lim, NULL, NULL), CTL_WIRE_OK);
    /* The same object one level down counts from depth0. */
    assert_int_equal(ctl_wire_check(p, len, &lim, 1, NULL, NULL), CTL_WIRE_TOO_DEEP);
    free(p);
    p = nested_arrays(2, &len);
    assert_int_equal(ctl_wire_check(p, len, &lim, 1, NULL, NULL), CTL_WIRE_OK);
    free(p);
    p = nested_arrays(4, &len);
    assert_int_equal(check_exact(p, len, &lim, NULL, NULL), CTL_WIRE_TOO_DEEP);
    free(p);

    /* Maps nest too: {"a": {"b": {"c": {"d": 1}}}} is 4 levels. */
    static const unsigned char maps[] = {0x81, 0xa1, 'a', 0x81, 0xa1, 'b', 0x81,
                                         0xa1, 'c', 0x81, 0xa1, 'd', 0x01};
    assert_int_equal(check_exact(maps, sizeof maps, &lim, NULL, NULL), CTL_WIRE_TOO_DEEP);
    ctl_limits lim4 = {0, 4, 0};
    assert_int_equal(check_exact(maps, sizeof maps, &lim4, NULL, NULL), CTL_WIRE_OK);
    /* Scalars inside the deepest container do not add a level. */
    assert_int_equal(check_exact(maps, sizeof maps, &lim4, NULL, NULL), CTL_WIRE_OK);
}

static void test_check_default_depth_and_100k_nesting(void **state)
{
    (void)state;
    ctl_limits lim = {0, 0, 0};
    size_t len;
    unsigned char *p = nested_arrays(CTL_DEFAULT_MAX_DEPTH, &len);
    assert_int_equal(check_exact(p, len, &lim, NULL, NULL), CTL_WIRE_OK);
    free(p);
    p = nested_arrays(CTL_DEFAULT_MAX_DEPTH + 1, &len);
    assert_int_equal(check_exact(p, len, &lim, NULL, NULL), CTL_WIRE_TOO_DEEP);
    free(p);
    /* Far beyond any stack: must be refused, not recursed into. */
    p = nested_arrays(100000, &len);
    assert_int_equal(check_exact(p, len, &lim, NULL, NULL), CTL_WIRE_TOO_DEEP);
    free(p);
    /* Unterminated deep nesting is refused too (deep or truncated). */
    p = malloc(100000);
    memset(p, 0x91, 100000);
    ctl_wire_status st = check_exact(p, 100000, &lim, NULL, NULL);
    assert_true(st == CTL_WIRE_TOO_DEEP || st == CTL_WIRE_TRUNCATED);
    free(p);
}

static void test_check_max_items(void **state)
{
    fx *f = *state;
    ctl_limits lim = {0, 0, 10};
    size_t items = 0;
    /* [1..9]: the array plus 9 ints = 10 objects: at the cap. */
    msgpack_pack_array(&f->buf.pk, 9);
    for (int i = 0; i < 9; i++)
        msgpack_pack_int(&f->buf.pk, i);
    assert_int_equal(check_exact(f->buf.sb.data, f->buf.sb.size, &lim, &items, NULL),
                     CTL_WIRE_OK);
    assert_int_equal(items, 10);
    tu_buf_reset(&f->buf);
    msgpack_pack_array(&f->buf.pk, 10);
    for (int i = 0; i < 10; i++)
        msgpack_pack_int(&f->buf.pk, i);
    assert_int_equal(check_exact(f->buf.sb.data, f->buf.sb.size, &lim, NULL, NULL),
                     CTL_WIRE_TOO_MANY);
    /* The shared budget: 5 + 5 fits, one more does not. */
    tu_buf_reset(&f->buf);
    msgpack_pack_array(&f->buf.pk, 4);
    for (int i = 0; i < 4; i++)
        msgpack_pack_int(&f->buf.pk, i);
    items = 0;
    assert_int_equal(ctl_wire_check(f->buf.sb.data, f->buf.sb.size, &lim, 0, &items, NULL),
                     CTL_WIRE_OK);
    assert_int_equal(ctl_wire_check(f->buf.sb.data, f->buf.sb.size, &lim, 0, &items, NULL),
                     CTL_WIRE_OK);
    assert_int_equal(items, 10);
    static const unsigned char one[] = {0x01};
    assert_int_equal(ctl_wire_check(one, 1, &lim, 0, &items, NULL), CTL_WIRE_TOO_MANY);
}

static void test_check_default_max_items(void **state)
{
    (void)state;
    ctl_limits lim = {0, 0, 0};
    /* array32 of 2^20 nils: 2^20 + 1 objects, one over the default cap. */
    size_t n = CTL_DEFAULT_MAX_ITEMS;
    size_t len = 5 + n;
    unsigned char *p = malloc(len);
    p[0] = 0xdd;
    p[1] = (unsigned char)(n >> 24);
    p[2] = (unsigned char)(n >> 16);
    p[3] = (unsigned char)(n >> 8);
    p[4] = (unsigned char)n;
    memset(p + 5, 0xc0, n);
    assert_int_equal(check_exact(p, len, &lim, NULL, NULL), CTL_WIRE_TOO_MANY);
    /* One fewer element is exactly at the cap. */
    n--;
    p[4] = (unsigned char)n;
    p[3] = (unsigned char)(n >> 8);
    p[2] = (unsigned char)(n >> 16);
    assert_int_equal(check_exact(p, len - 1, &lim, NULL, NULL), CTL_WIRE_OK);
    free(p);
}

static void test_check_random_bytes_never_overread(void **state)
{
    (void)state;
    ctl_limits lim = {0, 8, 64};
    unsigned seed = 12345;
    for (int round = 0; round < 20000; round++) {
        unsigned char m[24];
        size_t len = (size_t)(rand_r(&seed) % (int)sizeof m);
        size_t used = 0;
        for (size_t i = 0; i < len; i++)
            m[i] = (unsigned char)rand_r(&seed);
        if (check_exact(m, len, &lim, NULL, &used) == CTL_WIRE_OK)
            assert_true(used >= 1 && used <= len);
    }
}

/* ---- request envelopes ---------------------------------------------------- */

static void pack_sample_args(tu_buf *a)
{
    msgpack_pack_map(&a->pk, 4);
    tu_pk_str(&a->pk, "key");
    tu_pk_str(&a->pk, "k\0ey");
    tu_pk_str(&a->pk, "data");
    msgpack_pack_bin(&a->pk, 4);
    msgpack_pack_bin_body(&a->pk, "\xde\xad\xbe\xef", 4);
    tu_pk_str(&a->pk, "n");
    msgpack_pack_int64(&a->pk, -1234567890123LL);
    tu_pk_str(&a->pk, "list");
    msgpack_pack_array(&a->pk, 2);
    msgpack_pack_true(&a->pk);
    msgpack_pack_nil(&a->pk);
}

static void roundtrip_request(fx *f, ctl_str op, ctl_str id)
{
    ctl_env_request v;
    tu_buf_reset(&f->buf);
    msgpack_zone_clear(&f->zone);
    assert_int_equal(pack_request(&f->buf.sb, op, id, f->args.sb.data,
                                           f->args.sb.size),
                     0);
    /* Byte-exact: msgpack-c packing the same envelope gives the same bytes. */
    tu_buf ref;
    tu_buf_init(&ref);
    msgpack_pack_array(&ref.pk, 3);
    tu_pk_strn(&ref.pk, op.ptr, op.len);
    tu_pk_strn(&ref.pk, id.ptr, id.len);
    msgpack_sbuffer_write(&ref.sb, f->args.sb.data, f->args.sb.size);
    assert_int_equal(ref.sb.size, f->buf.sb.size);
    assert_memory_equal(ref.sb.data, f->buf.sb.data, ref.sb.size);
    tu_buf_fini(&ref);

    memset(&v, 0, sizeof v);
    assert_int_equal(ctl_env_decode_request(f->buf.sb.data, f->buf.sb.size, &f->lim,
                                             &f->zone, &v, f->why, sizeof f->why),
                     CTL_DECODE_OK);
    assert_int_equal(v.op.len, op.len);
    assert_memory_equal(v.op.ptr, op.ptr, op.len);
    assert_int_equal(v.id.len, id.len);
    if (id.len)
        assert_memory_equal(v.id.ptr, id.ptr, id.len);
    /* Views point into the payload (zero copy). */
    assert_true(v.op.ptr >= f->buf.sb.data &&
                v.op.ptr + v.op.len <= f->buf.sb.data + f->buf.sb.size);
    assert_int_equal(v.args.type, MSGPACK_OBJECT_MAP);
    assert_true(tu_obj_packs_to(&v.args, f->args.sb.data, f->args.sb.size));
}

static void test_request_roundtrip(void **state)
{
    fx *f = *state;
    pack_sample_args(&f->args);
    roundtrip_request(f, ctl_str_c("put"), ctl_str_c("0123456789ab"));
}

static void test_request_empty_id(void **state)
{
    fx *f = *state;
    pack_sample_args(&f->args);
    ctl_str empty = {"", 0};
    roundtrip_request(f, ctl_str_c("note"), empty);
}

static void test_request_id_with_nul_bytes(void **state)
{
    fx *f = *state;
    pack_sample_args(&f->args);
    ctl_str id = {"\0a\0b\0", 5};
    roundtrip_request(f, ctl_str_c("get"), id);
    char long_id[1000];
    for (size_t i = 0; i < sizeof long_id; i++)
        long_id[i] = (char)(i % 7 == 0 ? 0 : 'a' + i % 26);
    ctl_str lid = {long_id, 256}; /* the longest a unit takes */
    roundtrip_request(f, ctl_str_c("get"), lid);
    /* One byte longer: dropped (every reply echoes the id). */
    ctl_env_request v;
    tu_buf_reset(&f->buf);
    assert_int_equal(pack_request(&f->buf.sb, ctl_str_c("get"), (ctl_str){long_id, 257},
                                  f->args.sb.data, f->args.sb.size),
                     0);
    assert_int_equal(ctl_env_decode_request(f->buf.sb.data, f->buf.sb.size, &f->lim,
                                            &f->zone, &v, f->why, sizeof f->why),
                     CTL_DECODE_DROP);
    assert_string_equal(f->why, "the request id is 257 bytes, more than 256");
}

static void test_request_null_args_is_empty_map(void **state)
{
    fx *f = *state;
    ctl_env_request v;
    assert_int_equal(pack_request(&f->buf.sb, ctl_str_c("stats"),
                                           ctl_str_c("id1"), NULL, 0),
                     0);
    assert_int_equal(ctl_env_decode_request(f->buf.sb.data, f->buf.sb.size, &f->lim,
                                             &f->zone, &v, f->why, sizeof f->why),
                     CTL_DECODE_OK);
    assert_int_equal(v.args.type, MSGPACK_OBJECT_MAP);
    assert_int_equal(v.args.via.map.size, 0);
}

/* Build a request-like array with the given parts by hand. */
enum { P_END = 0, P_STR, P_INT, P_MAP0, P_ARR0, P_NIL, P_BIN };

static void pack_parts(tu_buf *b, size_t n, const int *parts, const char *const *strs)
{
    msgpack_pack_array(&b->pk, n);
    for (size_t i = 0; i < n; i++) {
        switch (parts[i]) {
        case P_STR: tu_pk_str(&b->pk, strs[i]); break;
        case P_INT: msgpack_pack_int(&b->pk, 7); break;
        case P_MAP0: msgpack_pack_map(&b->pk, 0); break;
        case P_ARR0: msgpack_pack_array(&b->pk, 0); break;
        case P_NIL: msgpack_pack_nil(&b->pk); break;
        case P_BIN: msgpack_pack_bin(&b->pk, 2); msgpack_pack_bin_body(&b->pk, "op", 2); break;
        default: fail();
        }
    }
}

/* Decode `len` bytes from an exact-size copy that stays alive (the views
 * in *v point into it) until the next decode() or teardown. */
static ctl_decode decode(fx *f, const void *data, size_t len, ctl_env_request *v)
{
    free(f->copy);
    f->copy = malloc(len ? len : 1);
    assert_non_null(f->copy);
    if (len)
        memcpy(f->copy, data, len);
    msgpack_zone_clear(&f->zone);
    memset(v, 0, sizeof *v);
    f->why[0] = '\0';
    return ctl_env_decode_request(len ? f->copy : NULL, len, &f->lim, &f->zone, v,
                                   f->why, sizeof f->why);
}

static void test_request_drop_cases(void **state)
{
    fx *f = *state;
    ctl_env_request v;
    struct {
        size_t n;
        int parts[4];
        const char *strs[4];
    } cases[] = {
        {2, {P_STR, P_STR}, {"echo", "id"}},                        /* array of 2 */
        {4, {P_STR, P_STR, P_MAP0, P_INT}, {"echo", "id", 0, 0}},   /* array of 4 */
        {3, {P_INT, P_STR, P_MAP0}, {0, "id", 0}},                  /* int op */
        {3, {P_BIN, P_STR, P_MAP0}, {0, "id", 0}},                  /* bin op */
        {3, {P_NIL, P_STR, P_MAP0}, {0, "id", 0}},                  /* nil op */
        {3, {P_STR, P_INT, P_MAP0}, {"echo", 0, 0}},                /* int id */
        {3, {P_STR, P_NIL, P_MAP0}, {"echo", 0, 0}},                /* nil id */
        {3, {P_STR, P_ARR0, P_MAP0}, {"echo", 0, 0}},               /* array id */
        {0, {0}, {0}},                                              /* [] */
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        tu_buf_reset(&f->buf);
        pack_parts(&f->buf, cases[i].n, cases[i].parts, cases[i].strs);
        ctl_decode d = decode(f, f->buf.sb.data, f->buf.sb.size, &v);
        if (d != CTL_DECODE_DROP)
            fail_msg("case %zu: decode gave %d, expected drop", i, (int)d);
        assert_true(strlen(f->why) > 0);
    }
    /* Not arrays at all, and broken bytes. */
    static const unsigned char *raw[] = {
        (const unsigned char *)"\x2a", (const unsigned char *)"\xc1",
        (const unsigned char *)"\xa4" "echo", (const unsigned char *)"\x80",
        (const unsigned char *)"\xdd\xff\xff\xff\xff",
        (const unsigned char *)"\x93\xa4" "ec",
    };
    static const size_t raw_len[] = {1, 1, 5, 1, 5, 4};
    for (size_t i = 0; i < sizeof raw_len / sizeof raw_len[0]; i++) {
        if (decode(f, raw[i], raw_len[i], &v) != CTL_DECODE_DROP)
            fail_msg("raw case %zu not dropped", i);
    }
    assert_int_equal(decode(f, "", 0, &v), CTL_DECODE_DROP);
}

static void test_request_truncated_head_dropped(void **state)
{
    fx *f = *state;
    ctl_env_request v;
    /* Every cut before the id is complete leaves no usable id. */
    tu_pack_request(&f->buf, "echo", "abcdef", 6, NULL, 0);
    size_t id_end = 1 + 5 + 7; /* array, "echo", "abcdef" */
    for (size_t k = 0; k < id_end; k++) {
        if (decode(f, f->buf.sb.data, k, &v) != CTL_DECODE_DROP)
            fail_msg("prefix %zu not dropped", k);
    }
}

static void test_request_bad_args_answered(void **state)
{
    fx *f = *state;
    ctl_env_request v;
    int argparts[] = {P_INT, P_ARR0, P_NIL, P_STR, P_BIN};
    for (size_t i = 0; i < sizeof argparts / sizeof argparts[0]; i++) {
        int parts[3] = {P_STR, P_STR, argparts[i]};
        const char *strs[3] = {"echo", "the-id", "x"};
        tu_buf_reset(&f->buf);
        pack_parts(&f->buf, 3, parts, strs);
        ctl_decode d = decode(f, f->buf.sb.data, f->buf.sb.size, &v);
        if (d != CTL_DECODE_BAD)
            fail_msg("args case %zu: decode gave %d, expected bad", i, (int)d);
        assert_int_equal(v.op.len, 4);
        assert_memory_equal(v.op.ptr, "echo", 4);
        assert_int_equal(v.id.len, 6);
        assert_memory_equal(v.id.ptr, "the-id", 6);
        assert_true(strlen(f->why) > 0);
    }
}

static void test_request_hostile_args_answered(void **state)
{
    fx *f = *state;
    ctl_env_request v;
    /* [echo, id, <map32 claiming 4G pairs>] */
    tu_buf_reset(&f->buf);
    msgpack_pack_array(&f->buf.pk, 3);
    tu_pk_str(&f->buf.pk, "echo");
    tu_pk_str(&f->buf.pk, "h1");
    msgpack_sbuffer_write(&f->buf.sb, "\xdf\xff\xff\xff\xff", 5);
    assert_int_equal(decode(f, f->buf.sb.data, f->buf.sb.size, &v), CTL_DECODE_BAD);
    assert_int_equal(v.id.len, 2);
    assert_memory_equal(v.id.ptr, "h1", 2);

    /* [echo, id, {"x": <nesting 100000 deep>}] */
    size_t deep = 100000;
    tu_buf_reset(&f->buf);
    msgpack_pack_array(&f->buf.pk, 3);
    tu_pk_str(&f->buf.pk, "echo");
    tu_pk_str(&f->buf.pk, "h2");
    msgpack_pack_map(&f->buf.pk, 1);
    tu_pk_str(&f->buf.pk, "x");
    unsigned char *p = malloc(deep + 1);
    memset(p, 0x91, deep);
    p[deep] = 0xc0;
    msgpack_sbuffer_write(&f->buf.sb, (const char *)p, deep + 1);
    free(p);
    assert_int_equal(decode(f, f->buf.sb.data, f->buf.sb.size, &v), CTL_DECODE_BAD);
    assert_int_equal(v.id.len, 2);
    assert_memory_equal(v.id.ptr, "h2", 2);

    /* Over a small depth limit: the envelope is level 1, args level 2. */
    f->lim.max_depth = 2;
    tu_buf_reset(&f->buf);
    msgpack_pack_array(&f->buf.pk, 3);
    tu_pk_str(&f->buf.pk, "echo");
    tu_pk_str(&f->buf.pk, "h3");
    msgpack_pack_map(&f->buf.pk, 0);
    assert_int_equal(decode(f, f->buf.sb.data, f->buf.sb.size, &v), CTL_DECODE_OK);
    tu_buf_reset(&f->buf);
    msgpack_pack_array(&f->buf.pk, 3);
    tu_pk_str(&f->buf.pk, "echo");
    tu_pk_str(&f->buf.pk, "h4");
    msgpack_pack_map(&f->buf.pk, 1);
    tu_pk_str(&f->buf.pk, "x");
    msgpack_pack_array(&f->buf.pk, 0);
    assert_int_equal(decode(f, f->buf.sb.data, f->buf.sb.size, &v), CTL_DECODE_BAD);
    assert_memory_equal(v.id.ptr, "h4", 2);

    /* Over a small item limit. */
    f->lim.max_depth = 0;
    f->lim.max_items = 8;
    tu_buf_reset(&f->buf);
    msgpack_pack_array(&f->buf.pk, 3);
    tu_pk_str(&f->buf.pk, "echo");
    tu_pk_str(&f->buf.pk, "h5");
    msgpack_pack_map(&f->buf.pk, 10);
    for (int i = 0; i < 10; i++) {
        msgpack_pack_int(&f->buf.pk, i);
        msgpack_pack_int(&f->buf.pk, i);
    }
    assert_int_equal(decode(f, f->buf.sb.data, f->buf.sb.size, &v), CTL_DECODE_BAD);
    assert_memory_equal(v.id.ptr, "h5", 2);
}

/* ---- reply envelopes ------------------------------------------------------ */

static void test_reply_roundtrip_ok(void **state)
{
    fx *f = *state;
    ctl_env_reply v;
    ctl_str id = {"r\0-1", 4};
    assert_int_equal(ctl_env_pack_reply_head(&f->buf.pk, id, true), 0);
    pack_sample_args(&f->args); /* any object as the result */
    msgpack_sbuffer_write(&f->buf.sb, f->args.sb.data, f->args.sb.size);
    /* Same bytes as a hand-packed reply. */
    tu_buf ref;
    tu_buf_init(&ref);
    msgpack_pack_array(&ref.pk, 3);
    tu_pk_strn(&ref.pk, id.ptr, id.len);
    msgpack_pack_true(&ref.pk);
    msgpack_sbuffer_write(&ref.sb, f->args.sb.data, f->args.sb.size);
    assert_int_equal(ref.sb.size, f->buf.sb.size);
    assert_memory_equal(ref.sb.data, f->buf.sb.data, ref.sb.size);
    tu_buf_fini(&ref);

    assert_int_equal(ctl_env_decode_reply(f->buf.sb.data, f->buf.sb.size, &f->lim,
                                           &f->zone, &v, f->why, sizeof f->why),
                     0);
    assert_int_equal(v.id.len, 4);
    assert_memory_equal(v.id.ptr, "r\0-1", 4);
    assert_true(v.ok);
    assert_true(tu_obj_packs_to(&v.body, f->args.sb.data, f->args.sb.size));
}

static void test_reply_roundtrip_error(void **state)
{
    fx *f = *state;
    ctl_env_reply v;
    ctl_error err;
    ctl_str blobs[2] = {{"a", 1}, {"bb", 2}};
    ctl_error_init(&err);
    assert_int_equal(ctl_env_pack_reply_head(&f->buf.pk, ctl_str_c(""), false), 0);
    assert_int_equal(tu_pack_error_map(&f->buf.pk, CTL_MISSING, "lost", NULL,
                                             blobs, 2),
                     0);
    assert_int_equal(ctl_env_decode_reply(f->buf.sb.data, f->buf.sb.size, &f->lim,
                                           &f->zone, &v, f->why, sizeof f->why),
                     0);
    assert_int_equal(v.id.len, 0);
    assert_false(v.ok);
    assert_int_equal(ctl_env_unpack_error(&err, "tcp://127.0.0.1:1", "get", &v.body),
                     CTL_MISSING);
    assert_int_equal(err.blob_count, 2);
    assert_memory_equal(err.blobs[1].ptr, "bb", 2);
    ctl_error_fini(&err);
}

static void test_reply_nil_result(void **state)
{
    fx *f = *state;
    ctl_env_reply v;
    assert_int_equal(ctl_env_pack_reply_head(&f->buf.pk, ctl_str_c("x"), true), 0);
    msgpack_pack_nil(&f->buf.pk);
    assert_int_equal(ctl_env_decode_reply(f->buf.sb.data, f->buf.sb.size, &f->lim,
                                           &f->zone, &v, f->why, sizeof f->why),
                     0);
    assert_int_equal(v.body.type, MSGPACK_OBJECT_NIL);
}

static void test_reply_malformed(void **state)
{
    fx *f = *state;
    ctl_env_reply v;
    struct {
        size_t n;
        int parts[4];
        const char *strs[4];
    } cases[] = {
        {2, {P_STR, P_NIL}, {"id", 0}},
        {4, {P_STR, P_NIL, P_NIL, P_NIL}, {"id", 0, 0, 0}},
        {3, {P_INT, P_NIL, P_NIL}, {0, 0, 0}},          /* id not str */
        {3, {P_STR, P_INT, P_NIL}, {"id", 0, 0}},        /* ok not bool */
        {3, {P_STR, P_STR, P_NIL}, {"id", "true", 0}},
        {3, {P_STR, P_NIL, P_NIL}, {"id", 0, 0}},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        tu_buf_reset(&f->buf);
        msgpack_zone_clear(&f->zone);
        pack_parts(&f->buf, cases[i].n, cases[i].parts, cases[i].strs);
        f->why[0] = '\0';
        if (ctl_env_decode_reply(f->buf.sb.data, f->buf.sb.size, &f->lim, &f->zone,
                                  &v, f->why, sizeof f->why) != -1)
            fail_msg("malformed reply %zu accepted", i);
        assert_true(strlen(f->why) > 0);
    }
    /* Truncations of a good reply, each in an exact-size block. */
    tu_buf_reset(&f->buf);
    ctl_env_pack_reply_head(&f->buf.pk, ctl_str_c("abc"), true);
    tu_pk_str(&f->buf.pk, "result");
    for (size_t k = 0; k < f->buf.sb.size; k++) {
        unsigned char *copy = malloc(k ? k : 1);
        memcpy(copy, f->buf.sb.data, k);
        msgpack_zone_clear(&f->zone);
        int rc = ctl_env_decode_reply(k ? copy : NULL, k, &f->lim, &f->zone, &v,
                                       f->why, sizeof f->why);
        free(copy);
        if (rc != -1)
            fail_msg("reply prefix %zu accepted", k);
    }
    /* Hostile bodies. */
    static const unsigned char hostile[] = {0x93, 0xa1, 'x', 0xc3, 0xdd, 0xff, 0xff, 0xff, 0xff};
    assert_int_equal(ctl_env_decode_reply(hostile, sizeof hostile, &f->lim, &f->zone, &v,
                                           f->why, sizeof f->why),
                     -1);
    static const unsigned char c1[] = {0x93, 0xa1, 'x', 0xc3, 0xc1};
    assert_int_equal(ctl_env_decode_reply(c1, sizeof c1, &f->lim, &f->zone, &v,
                                           f->why, sizeof f->why),
                     -1);
}

static void test_why_buffer_small(void **state)
{
    fx *f = *state;
    ctl_env_request v;
    char tiny[4] = {'Z', 'Z', 'Z', 'Z'};
    static const unsigned char bad[] = {0x2a};
    assert_int_equal(ctl_env_decode_request(bad, 1, &f->lim, &f->zone, &v, tiny, 4),
                     CTL_DECODE_DROP);
    assert_true(memchr(tiny, '\0', 4) != NULL); /* truncated, still terminated */
}

/* ---- value readers and writers --------------------------------------------- */

static msgpack_object one(fx *f)
{
    msgpack_object o;
    size_t off = 0;
    msgpack_zone_clear(&f->zone);
    assert_int_equal(msgpack_unpack(f->buf.sb.data, f->buf.sb.size, &off, &f->zone, &o),
                     MSGPACK_UNPACK_SUCCESS);
    return o;
}

static void test_obj_integers(void **state)
{
    fx *f = *state;
    int32_t i32;
    int64_t i64;
    uint32_t u32;
    uint64_t u64;
    msgpack_object o;

    msgpack_pack_uint64(&f->buf.pk, 7);
    o = one(f);
    assert_true(ctl_obj_i32(&o, &i32) && i32 == 7);
    assert_true(ctl_obj_u32(&o, &u32) && u32 == 7);
    assert_true(ctl_obj_i64(&o, &i64) && i64 == 7);
    assert_true(ctl_obj_u64(&o, &u64) && u64 == 7);

    tu_buf_reset(&f->buf);
    msgpack_pack_int64(&f->buf.pk, -1);
    o = one(f);
    assert_true(ctl_obj_i32(&o, &i32) && i32 == -1);
    assert_true(ctl_obj_i64(&o, &i64) && i64 == -1);
    assert_false(ctl_obj_u32(&o, &u32));
    assert_false(ctl_obj_u64(&o, &u64));

    tu_buf_reset(&f->buf);
    msgpack_pack_uint64(&f->buf.pk, (uint64_t)INT32_MAX + 1);
    o = one(f);
    assert_false(ctl_obj_i32(&o, &i32));
    assert_true(ctl_obj_u32(&o, &u32) && u32 == (uint32_t)INT32_MAX + 1);

    tu_buf_reset(&f->buf);
    msgpack_pack_uint64(&f->buf.pk, (uint64_t)UINT32_MAX + 1);
    o = one(f);
    assert_false(ctl_obj_u32(&o, &u32));
    assert_true(ctl_obj_i64(&o, &i64) && i64 == (int64_t)UINT32_MAX + 1);

    tu_buf_reset(&f->buf);
    msgpack_pack_uint64(&f->buf.pk, (uint64_t)INT64_MAX + 1);
    o = one(f);
    assert_false(ctl_obj_i64(&o, &i64));
    assert_true(ctl_obj_u64(&o, &u64) && u64 == (uint64_t)INT64_MAX + 1);

    tu_buf_reset(&f->buf);
    msgpack_pack_int64(&f->buf.pk, (int64_t)INT32_MIN - 1);
    o = one(f);
    assert_false(ctl_obj_i32(&o, &i32));
    assert_true(ctl_obj_i64(&o, &i64) && i64 == (int64_t)INT32_MIN - 1);

    tu_buf_reset(&f->buf);
    msgpack_pack_int64(&f->buf.pk, INT64_MIN);
    o = one(f);
    assert_true(ctl_obj_i64(&o, &i64) && i64 == INT64_MIN);

    /* Wrong families are refused. */
    tu_buf_reset(&f->buf);
    tu_pk_str(&f->buf.pk, "7");
    o = one(f);
    assert_false(ctl_obj_i32(&o, &i32));
    assert_false(ctl_obj_u64(&o, &u64));
    tu_buf_reset(&f->buf);
    msgpack_pack_double(&f->buf.pk, 7.0);
    o = one(f);
    assert_false(ctl_obj_i64(&o, &i64));
    tu_buf_reset(&f->buf);
    msgpack_pack_true(&f->buf.pk);
    o = one(f);
    assert_false(ctl_obj_i64(&o, &i64));
}

static void test_obj_bool_f64(void **state)
{
    fx *f = *state;
    bool b = false;
    double d = 0;
    msgpack_object o;
    msgpack_pack_true(&f->buf.pk);
    o = one(f);
    assert_true(ctl_obj_bool(&o, &b) && b);
    assert_false(ctl_obj_f64(&o, &d));
    tu_buf_reset(&f->buf);
    msgpack_pack_int(&f->buf.pk, 1);
    o = one(f);
    assert_false(ctl_obj_bool(&o, &b));
    assert_true(ctl_obj_f64(&o, &d) && d == 1.0);
    tu_buf_reset(&f->buf);
    msgpack_pack_int(&f->buf.pk, -3);
    o = one(f);
    assert_true(ctl_obj_f64(&o, &d) && d == -3.0);
    tu_buf_reset(&f->buf);
    msgpack_pack_float(&f->buf.pk, 0.25f);
    o = one(f);
    assert_true(ctl_obj_f64(&o, &d) && d == 0.25);
    tu_buf_reset(&f->buf);
    msgpack_pack_double(&f->buf.pk, DBL_MAX);
    o = one(f);
    assert_true(ctl_obj_f64(&o, &d) && d == DBL_MAX);
    tu_buf_reset(&f->buf);
    msgpack_pack_nil(&f->buf.pk);
    o = one(f);
    assert_false(ctl_obj_f64(&o, &d));
    assert_false(ctl_obj_bool(&o, &b));
}

static void test_obj_str_bin_get(void **state)
{
    fx *f = *state;
    ctl_str s;
    msgpack_object o;
    msgpack_pack_map(&f->buf.pk, 3);
    tu_pk_str(&f->buf.pk, "s");
    tu_pk_strn(&f->buf.pk, "a\0c", 3);
    tu_pk_str(&f->buf.pk, "b");
    msgpack_pack_bin(&f->buf.pk, 2);
    msgpack_pack_bin_body(&f->buf.pk, "\xff\x00", 2);
    msgpack_pack_int(&f->buf.pk, 5); /* a non-string key is skipped */
    msgpack_pack_int(&f->buf.pk, 6);
    o = one(f);
    const msgpack_object *vs = ctl_obj_get(&o, "s");
    const msgpack_object *vb = ctl_obj_get(&o, "b");
    assert_non_null(vs);
    assert_non_null(vb);
    assert_null(ctl_obj_get(&o, "missing"));
    assert_null(ctl_obj_get(&o, ""));
    assert_true(ctl_obj_str(vs, &s));
    assert_int_equal(s.len, 3);
    assert_memory_equal(s.ptr, "a\0c", 3);
    assert_true(s.ptr >= f->buf.sb.data && s.ptr < f->buf.sb.data + f->buf.sb.size);
    assert_false(ctl_obj_bin(vs, &s));
    assert_true(ctl_obj_bin(vb, &s));
    assert_int_equal(s.len, 2);
    assert_memory_equal(s.ptr, "\xff\x00", 2);
    assert_false(ctl_obj_str(vb, &s));
    /* Not a map. */
    assert_null(ctl_obj_get(vs, "s"));

    assert_string_equal(ctl_obj_type_name(vs), "str");
    assert_string_equal(ctl_obj_type_name(vb), "bin");
    assert_string_equal(ctl_obj_type_name(&o), "map");
    tu_buf_reset(&f->buf);
    msgpack_pack_array(&f->buf.pk, 0);
    o = one(f);
    assert_string_equal(ctl_obj_type_name(&o), "array");
}

static void test_pack_helpers(void **state)
{
    fx *f = *state;
    ctl_str s = {"x\0y", 3};
    assert_int_equal(ctl_pack_str(&f->buf.pk, s), 0);
    assert_int_equal(ctl_pack_bin(&f->buf.pk, s), 0);
    assert_int_equal(ctl_pack_cstr(&f->buf.pk, "hello"), 0);
    ctl_str e = {NULL, 0};
    assert_int_equal(ctl_pack_str(&f->buf.pk, e), 0);
    static const unsigned char want[] = {0xa3, 'x', 0, 'y', 0xc4, 3, 'x', 0, 'y',
                                         0xa5, 'h', 'e', 'l', 'l', 'o', 0xa0};
    assert_int_equal(f->buf.sb.size, sizeof want);
    assert_memory_equal(f->buf.sb.data, want, sizeof want);
}

/* The large buffers kept between calls: only ones of CTL_BIGBUF_MIN and
 * more, at most CTL_BIGBUF_KEEP, the smallest making way for a larger one;
 * a take gets the smallest that is large enough. A sbuffer growing past
 * CTL_BIGBUF_MIN moves into a kept one, its bytes with it. */
static void test_bigbuf_keeps_the_largest_few(void **state)
{
    (void)state;
    size_t cap = 0, big = CTL_BIGBUF_MIN;
    assert_null(ctl_bigbuf_take(1, &cap)); /* nothing kept yet */
    ctl_bigbuf_give(malloc(1024), 1024);   /* too small: freed */
    assert_null(ctl_bigbuf_take(1, &cap));
    char *a = malloc(big), *b = malloc(2 * big), *c = malloc(3 * big);
    assert_true(a && b && c);
    ctl_bigbuf_give(a, big);
    ctl_bigbuf_give(b, 2 * big);
    ctl_bigbuf_give(c, 3 * big); /* full: the smallest (a) makes way */
    assert_ptr_equal(ctl_bigbuf_take(big, &cap), b);
    assert_int_equal(cap, 2 * big);
    assert_null(ctl_bigbuf_take(3 * big + 1, &cap)); /* none large enough */
    ctl_bigbuf_give(b, 2 * big);
    /* A sbuffer written past the threshold lands in the smallest fit. */
    msgpack_sbuffer sb;
    msgpack_sbuffer_init(&sb);
    assert_int_equal(ctl_sbuffer_write(&sb, "head", 4), 0);
    char *payload = malloc(big);
    assert_non_null(payload);
    memset(payload, 'p', big);
    assert_int_equal(ctl_sbuffer_write(&sb, payload, big), 0);
    assert_ptr_equal(sb.data, b);
    assert_int_equal(sb.alloc, 2 * big);
    assert_memory_equal(sb.data, "head", 4);
    assert_memory_equal(sb.data + 4, payload, big);
    free(payload);
    ctl_bigbuf_give(msgpack_sbuffer_release(&sb), 2 * big);
    /* Leave nothing kept for the tests that follow. */
    for (char *d; (d = ctl_bigbuf_take(1, &cap)) != NULL;)
        free(d);
}

int main(void)
{
#define T(fn) cmocka_unit_test_setup_teardown(fn, setup, teardown)
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_limits_resolve),
        cmocka_unit_test(test_status_names),
        T(test_check_every_prefix_truncated),
        T(test_check_ext_types),
        T(test_check_counts_items),
        cmocka_unit_test(test_check_depth0_near_uint_max),
        cmocka_unit_test(test_check_c1_bad_byte),
        cmocka_unit_test(test_check_huge_headers),
        cmocka_unit_test(test_check_depth),
        cmocka_unit_test(test_check_default_depth_and_100k_nesting),
        T(test_check_max_items),
        cmocka_unit_test(test_check_default_max_items),
        cmocka_unit_test(test_check_random_bytes_never_overread),
        cmocka_unit_test(test_bigbuf_keeps_the_largest_few),
        T(test_request_roundtrip),
        T(test_request_empty_id),
        T(test_request_id_with_nul_bytes),
        T(test_request_null_args_is_empty_map),
        T(test_request_drop_cases),
        T(test_request_truncated_head_dropped),
        T(test_request_bad_args_answered),
        T(test_request_hostile_args_answered),
        T(test_reply_roundtrip_ok),
        T(test_reply_roundtrip_error),
        T(test_reply_nil_result),
        T(test_reply_malformed),
        T(test_why_buffer_small),
        T(test_obj_integers),
        T(test_obj_bool_f64),
        T(test_obj_str_bin_get),
        T(test_pack_helpers),
    };
#undef T
    return cmocka_run_group_tests(tests, NULL, NULL);
}
