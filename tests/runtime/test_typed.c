/*
 * test_typed.c - the interpreter of type descriptors (ctlrpc/gen.h), on
 * descriptors written by hand rather than generated: records wider than
 * one word of "seen" bits, args left out when they equal their defaults
 * (bit for bit), optionals held by value and by pointer, and the paths of
 * decoding failures. The generated descriptors are exercised end to end by
 * tests/stubs/.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "ctlrpc/gen.h"
#include "testutil.h"

/* Decoding memory for the tests: one zone, freed at the end. */
typedef struct fx {
    msgpack_zone zone;
    msgpack_sbuffer sb;
    msgpack_packer pk;
    ctl_dec d;
} fx;

static void *zone_alloc(void *owner, size_t size)
{
    /* Over-allocate and align by hand, as the runtime's own allocator does. */
    const size_t align = _Alignof(max_align_t);
    char *p = msgpack_zone_malloc_no_align(owner, size + align);
    return p ? p + (align - (uintptr_t)p % align) % align : NULL;
}

static int setup(void **state)
{
    fx *f = calloc(1, sizeof *f);
    if (!f || !msgpack_zone_init(&f->zone, 1024))
        return -1;
    msgpack_sbuffer_init(&f->sb);
    msgpack_packer_init(&f->pk, &f->sb, msgpack_sbuffer_write);
    ctl_dec_init(&f->d, zone_alloc, &f->zone);
    *state = f;
    return 0;
}

static int teardown(void **state)
{
    fx *f = *state;
    msgpack_sbuffer_destroy(&f->sb);
    msgpack_zone_destroy(&f->zone);
    free(f);
    return 0;
}

/* Unpack what was packed into f->sb. */
static msgpack_object unpacked(fx *f)
{
    msgpack_object o;
    size_t off = 0;
    assert_int_equal(msgpack_unpack(f->sb.data, f->sb.size, &off, &f->zone, &o),
                     MSGPACK_UNPACK_SUCCESS);
    return o;
}

/* ---- a record of 70 fields: "seen" spans two words ------------------ */

#define WIDE 70
typedef struct wide {
    uint32_t v[WIDE];
} wide;

static ctl_field wide_fields[WIDE];
static char wide_names[WIDE][8];
static const ctl_type wide_type = {
    .kind = CTL_TYPE_RECORD, .idl = "record Wide", .size = sizeof(wide),
    .name = "Wide", .fields = wide_fields, .field_count = WIDE,
};

static void wide_init(void)
{
    for (size_t i = 0; i < WIDE; i++) {
        int n = snprintf(wide_names[i], sizeof wide_names[i], "f%zu", i);
        wide_fields[i] = (ctl_field){.name = wide_names[i], .name_len = (size_t)n,
                                     .type = &ctl_type_u32,
                                     .offset = offsetof(wide, v) + i * sizeof(uint32_t),
                                     .required = true};
    }
}

/* Pack a Wide map of fields [0, n) except `skip`, then `extra` again. */
static void pack_wide(fx *f, size_t n, size_t skip, size_t extra)
{
    size_t count = n - (skip < n) + (extra < n);
    msgpack_pack_map(&f->pk, count);
    for (size_t i = 0; i < n; i++) {
        if (i == skip)
            continue;
        tu_pk_str(&f->pk, wide_names[i]);
        msgpack_pack_uint32(&f->pk, (uint32_t)(i * 3));
    }
    if (extra < n) {
        tu_pk_str(&f->pk, wide_names[extra]);
        msgpack_pack_uint32(&f->pk, 7);
    }
}

static void test_wide_record(void **state)
{
    fx *f = *state;
    wide w;
    wide_init();
    pack_wide(f, WIDE, SIZE_MAX, SIZE_MAX);
    msgpack_object o = unpacked(f);
    assert_int_equal(ctl_type_decode(&o, &wide_type, &w, &f->d), 0);
    for (size_t i = 0; i < WIDE; i++)
        assert_int_equal(w.v[i], i * 3);
    /* And back: the same map, field for field. */
    msgpack_sbuffer_clear(&f->sb);
    assert_int_equal(ctl_type_pack(&f->pk, &wide_type, &w), 0);
    msgpack_object again = unpacked(f);
    assert_true(msgpack_object_equal(o, again));
}

static void test_wide_record_missing_and_repeated(void **state)
{
    fx *f = *state;
    wide w;
    wide_init();
    /* Field 66 lives in the second word of seen bits. */
    pack_wide(f, WIDE, 66, SIZE_MAX);
    msgpack_object o = unpacked(f);
    assert_int_equal(ctl_type_decode(&o, &wide_type, &w, &f->d), -1);
    assert_string_equal(ctl_dec_what(&f->d), "record Wide: missing field 'f66'");

    msgpack_sbuffer_clear(&f->sb);
    ctl_dec_init(&f->d, zone_alloc, &f->zone);
    pack_wide(f, WIDE, SIZE_MAX, 67);
    o = unpacked(f);
    assert_int_equal(ctl_type_decode(&o, &wide_type, &w, &f->d), -1);
    assert_string_equal(ctl_dec_where(&f->d), ".f67");
    assert_string_equal(ctl_dec_what(&f->d), "field given twice");
}

/* ---- args: defaults left out, bit for bit ---------------------------- */

typedef struct opt_f64 {
    bool present;
    double value;
} opt_f64;

typedef struct knobs {
    double ratio;  /* default -0.0 */
    ctl_str label; /* default "x" */
    opt_f64 limit; /* default 2.5 */
    bool on;       /* default true */
} knobs;

static const ctl_type opt_f64_type = {
    .kind = CTL_TYPE_OPTIONAL, .idl = "f64?", .size = sizeof(opt_f64),
    .elem = &ctl_type_f64, .value_offset = offsetof(opt_f64, value),
};
static const knobs knobs_defaults = {
    .ratio = -0.0, .label = {"x", 1}, .limit = {true, 2.5}, .on = true};
static const ctl_field knobs_fields[] = {
    {.name = "ratio", .name_len = 5, .type = &ctl_type_f64, .offset = offsetof(knobs, ratio)},
    {.name = "label", .name_len = 5, .type = &ctl_type_str, .offset = offsetof(knobs, label)},
    {.name = "limit", .name_len = 5, .type = &opt_f64_type, .offset = offsetof(knobs, limit)},
    {.name = "on", .name_len = 2, .type = &ctl_type_bool, .offset = offsetof(knobs, on)},
};
static const ctl_type knobs_args = {
    .kind = CTL_TYPE_RECORD, .idl = "args of tune", .size = sizeof(knobs),
    .name = "tune", .flags = CTL_RECORD_ARGS, .fields = knobs_fields,
    .field_count = 4, .defaults = &knobs_defaults,
};

/* The keys packed for `k`, in order, joined by ','. */
static void sent_keys(fx *f, const knobs *k, char *out, size_t outlen)
{
    msgpack_sbuffer_clear(&f->sb);
    assert_int_equal(ctl_type_pack(&f->pk, &knobs_args, k), 0);
    msgpack_object o = unpacked(f);
    assert_int_equal(o.type, MSGPACK_OBJECT_MAP);
    out[0] = '\0';
    for (uint32_t i = 0; i < o.via.map.size; i++) {
        const msgpack_object *key = &o.via.map.ptr[i].key;
        if (i)
            strncat(out, ",", outlen - strlen(out) - 1);
        strncat(out, key->via.str.ptr, key->via.str.size < outlen - strlen(out) - 1
                                           ? key->via.str.size
                                           : outlen - strlen(out) - 1);
    }
}

static void test_args_defaults_not_sent(void **state)
{
    fx *f = *state;
    char keys[64];
    knobs k = knobs_defaults;
    sent_keys(f, &k, keys, sizeof keys);
    assert_string_equal(keys, "");
    /* +0.0 is not -0.0: compared bit for bit. */
    k.ratio = 0.0;
    sent_keys(f, &k, keys, sizeof keys);
    assert_string_equal(keys, "ratio");
    k = knobs_defaults;
    k.ratio = nan("");
    sent_keys(f, &k, keys, sizeof keys);
    assert_string_equal(keys, "ratio");
    /* Same bytes elsewhere are the default; another length is not. */
    k = knobs_defaults;
    k.label = (ctl_str){"xy", 1};
    sent_keys(f, &k, keys, sizeof keys);
    assert_string_equal(keys, "");
    k.label = (ctl_str){"xy", 2};
    sent_keys(f, &k, keys, sizeof keys);
    assert_string_equal(keys, "label");
    /* An optional: absent is not its default 2.5, nor is 2.0. */
    k = knobs_defaults;
    k.limit.present = false;
    sent_keys(f, &k, keys, sizeof keys);
    assert_string_equal(keys, "limit");
    k.limit = (opt_f64){true, 2.0};
    k.on = false;
    sent_keys(f, &k, keys, sizeof keys);
    assert_string_equal(keys, "limit,on");
}

static void test_args_refuse_unknown_and_non_string_keys(void **state)
{
    fx *f = *state;
    knobs k;
    msgpack_pack_map(&f->pk, 1);
    tu_pk_str(&f->pk, "speed");
    msgpack_pack_true(&f->pk);
    msgpack_object o = unpacked(f);
    assert_int_equal(ctl_type_decode(&o, &knobs_args, &k, &f->d), -1);
    assert_string_equal(ctl_dec_where(&f->d), ".speed");
    assert_string_equal(ctl_dec_what(&f->d), "not an arg of tune");

    msgpack_sbuffer_clear(&f->sb);
    ctl_dec_init(&f->d, zone_alloc, &f->zone);
    msgpack_pack_map(&f->pk, 1);
    msgpack_pack_int(&f->pk, 1);
    msgpack_pack_true(&f->pk);
    o = unpacked(f);
    assert_int_equal(ctl_type_decode(&o, &knobs_args, &k, &f->d), -1);
    assert_string_equal(ctl_dec_what(&f->d), "arg names must be strings, not int");

    /* Absent args take their defaults. */
    msgpack_sbuffer_clear(&f->sb);
    ctl_dec_init(&f->d, zone_alloc, &f->zone);
    msgpack_pack_map(&f->pk, 1);
    tu_pk_str(&f->pk, "on");
    msgpack_pack_false(&f->pk);
    o = unpacked(f);
    assert_int_equal(ctl_type_decode(&o, &knobs_args, &k, &f->d), 0);
    assert_false(k.on);
    assert_true(k.limit.present);
    assert_true(k.limit.value == 2.5);
    assert_int_equal(k.label.len, 1);
    assert_true(signbit(k.ratio));
}

/* ---- optionals by pointer, lists and maps, failure paths ------------- */

typedef struct node node;
typedef struct node_list {
    const node *items;
    size_t count;
} node_list;
struct node {
    int64_t id;
    const node *next; /* node? */
    node_list kids;   /* list<node> */
};

static const ctl_type node_type;
static const ctl_type opt_node_type = {
    .kind = CTL_TYPE_OPTIONAL, .idl = "Node?", .size = sizeof(const node *),
    .elem = &node_type, .by_pointer = true,
};
static const ctl_type node_list_type = {
    .kind = CTL_TYPE_LIST, .idl = "list<Node>", .size = sizeof(node_list),
    .elem = &node_type, .elem_size = sizeof(node),
};
static const ctl_field node_fields[] = {
    {.name = "id", .name_len = 2, .type = &ctl_type_i64, .offset = offsetof(node, id),
     .required = true},
    {.name = "next", .name_len = 4, .type = &opt_node_type, .offset = offsetof(node, next)},
    {.name = "kids", .name_len = 4, .type = &node_list_type, .offset = offsetof(node, kids)},
};
static const ctl_type node_type = {
    .kind = CTL_TYPE_RECORD, .idl = "record Node", .size = sizeof(node), .name = "Node",
    .fields = node_fields, .field_count = 3,
};

static void test_recursive_values_round_trip(void **state)
{
    fx *f = *state;
    node leaf = {.id = -5};
    node kids[2] = {{.id = 1}, {.id = 2, .next = &leaf}};
    node root = {.id = INT64_MIN, .next = &leaf, .kids = {.items = kids, .count = 2}};
    node back;
    assert_int_equal(ctl_type_pack(&f->pk, &node_type, &root), 0);
    msgpack_object o = unpacked(f);
    assert_int_equal(ctl_type_decode(&o, &node_type, &back, &f->d), 0);
    assert_true(back.id == INT64_MIN);
    assert_non_null(back.next);
    assert_true(back.next->id == -5);
    assert_null(back.next->next);
    assert_int_equal(back.kids.count, 2);
    assert_null(back.kids.items[0].next);
    assert_true(back.kids.items[1].next->id == -5);
    assert_int_equal(back.kids.items[1].kids.count, 0);
}

/* ctl_type_packed_size says exactly what ctl_type_pack writes: every
 * integer width and sign, str and bin headers at their edges, nested
 * records, optionals, lists and a map header of 70 fields. */
static size_t packed_len(fx *f, const ctl_type *t, const void *v)
{
    msgpack_sbuffer_clear(&f->sb);
    assert_int_equal(ctl_type_pack(&f->pk, t, v), 0);
    return f->sb.size;
}

static void test_packed_size_is_exact(void **state)
{
    fx *f = *state;
    static const int64_t i64s[] = {0, 1, 127, 128, 255, 256, 65535, 65536, 4294967295LL,
                                   4294967296LL, INT64_MAX, -1, -32, -33, -128, -129,
                                   -32768, -32769, INT32_MIN, (int64_t)INT32_MIN - 1,
                                   INT64_MIN};
    for (size_t i = 0; i < sizeof i64s / sizeof i64s[0]; i++) {
        assert_int_equal(ctl_type_packed_size(&ctl_type_i64, &i64s[i]),
                         packed_len(f, &ctl_type_i64, &i64s[i]));
        int32_t v32 = (int32_t)i64s[i];
        assert_int_equal(ctl_type_packed_size(&ctl_type_i32, &v32),
                         packed_len(f, &ctl_type_i32, &v32));
        uint64_t u = (uint64_t)i64s[i];
        assert_int_equal(ctl_type_packed_size(&ctl_type_u64, &u),
                         packed_len(f, &ctl_type_u64, &u));
        uint32_t u32 = (uint32_t)u;
        assert_int_equal(ctl_type_packed_size(&ctl_type_u32, &u32),
                         packed_len(f, &ctl_type_u32, &u32));
    }
    double d = 0.5;
    bool b = true;
    assert_int_equal(ctl_type_packed_size(&ctl_type_f64, &d), packed_len(f, &ctl_type_f64, &d));
    assert_int_equal(ctl_type_packed_size(&ctl_type_bool, &b), packed_len(f, &ctl_type_bool, &b));
    static char bytes[70000];
    static const size_t lens[] = {0, 1, 31, 32, 255, 256, 65535, 65536, 70000};
    for (size_t i = 0; i < sizeof lens / sizeof lens[0]; i++) {
        ctl_str v = {bytes, lens[i]};
        assert_int_equal(ctl_type_packed_size(&ctl_type_str, &v),
                         packed_len(f, &ctl_type_str, &v));
        assert_int_equal(ctl_type_packed_size(&ctl_type_bin, &v),
                         packed_len(f, &ctl_type_bin, &v));
    }
    node leaf = {.id = -5};
    node kids[2] = {{.id = 1}, {.id = 2, .next = &leaf}};
    node root = {.id = INT64_MIN, .next = &leaf, .kids = {.items = kids, .count = 2}};
    assert_int_equal(ctl_type_packed_size(&node_type, &root), packed_len(f, &node_type, &root));
    wide w;
    wide_init();
    for (size_t i = 0; i < WIDE; i++)
        w.v[i] = (uint32_t)(i * 1000003u);
    assert_int_equal(ctl_type_packed_size(&wide_type, &w), packed_len(f, &wide_type, &w));
    knobs k = knobs_defaults;
    assert_int_equal(ctl_type_packed_size(&knobs_args, &k), packed_len(f, &knobs_args, &k));
}

static void test_failure_paths_name_the_spot(void **state)
{
    fx *f = *state;
    node back;
    /* {"id": 1, "kids": [{"id": 2}, {"id": "x"}]} */
    msgpack_pack_map(&f->pk, 2);
    tu_pk_str(&f->pk, "id");
    msgpack_pack_int(&f->pk, 1);
    tu_pk_str(&f->pk, "kids");
    msgpack_pack_array(&f->pk, 2);
    msgpack_pack_map(&f->pk, 1);
    tu_pk_str(&f->pk, "id");
    msgpack_pack_int(&f->pk, 2);
    msgpack_pack_map(&f->pk, 1);
    tu_pk_str(&f->pk, "id");
    tu_pk_str(&f->pk, "x");
    msgpack_object o = unpacked(f);
    assert_int_equal(ctl_type_decode(&o, &node_type, &back, &f->d), -1);
    assert_string_equal(ctl_dec_where(&f->d), ".kids[1].id");
    assert_string_equal(ctl_dec_what(&f->d), "expected i64, got str");

    /* A u32 that does not fit is named with its value. */
    uint32_t u;
    msgpack_sbuffer_clear(&f->sb);
    ctl_dec_init(&f->d, zone_alloc, &f->zone);
    msgpack_pack_int64(&f->pk, -1);
    o = unpacked(f);
    assert_int_equal(ctl_type_decode(&o, &ctl_type_u32, &u, &f->d), -1);
    assert_string_equal(ctl_dec_what(&f->d), "expected u32, got -1 (out of range)");

    /* A list that claims items but has none cannot be packed. */
    node bad = {.id = 1, .kids = {.items = NULL, .count = 3}};
    msgpack_sbuffer_clear(&f->sb);
    assert_int_equal(ctl_type_pack(&f->pk, &node_type, &bad), -1);
}

int main(void)
{
#define T(fn) cmocka_unit_test_setup_teardown(fn, setup, teardown)
    const struct CMUnitTest tests[] = {
        T(test_wide_record),
        T(test_wide_record_missing_and_repeated),
        T(test_args_defaults_not_sent),
        T(test_args_refuse_unknown_and_non_string_keys),
        T(test_recursive_values_round_trip),
        T(test_packed_size_is_exact),
        T(test_failure_paths_name_the_spot),
    };
#undef T
    return cmocka_run_group_tests(tests, NULL, NULL);
}
