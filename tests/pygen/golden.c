/*
 * golden.c - the golden vectors of the matrix: the args map each case's
 * request carries, as the C stubs pack it (the same ctl_type_pack that
 * frames a request), in hex.
 *
 *   golden --print          print the vectors (the file's format)
 *   golden --check FILE     compare with FILE; exit 1 naming each case that
 *                           differs or is missing
 *
 * tests/golden/matrix_args.txt is `golden --print` (regenerate it with
 * scripts/golden.sh after changing a case); test_golden.py builds every case
 * with the generated Python client and must produce the same bytes. The
 * cases cover each msgpack integer width, float64, str and bin lengths, nil,
 * args left out at their defaults (bit for bit: -0.0 is sent where the
 * default is 0.0), records with all their fields, nested containers and maps
 * in the order given.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "matrix_values.h"

typedef struct vec {
    const char *name;
    const char *op;
    const void *args; /* NULL: an op without args */
} vec;

static const ctl_op_desc *desc_of(const char *op)
{
    for (size_t i = 0; i < matrix_service.op_count; i++)
        if (strcmp(matrix_service.ops[i].name, op) == 0)
            return matrix_service.ops[i].desc;
    return NULL;
}

/* The args map of `v` in hex (malloc'd), or NULL. */
static char *pack_hex(const vec *v)
{
    const ctl_op_desc *d = desc_of(v->op);
    if (!d)
        return NULL;
    msgpack_sbuffer sb;
    msgpack_packer pk;
    msgpack_sbuffer_init(&sb);
    msgpack_packer_init(&pk, &sb, msgpack_sbuffer_write);
    int rc = d->args ? ctl_type_pack(&pk, d->args, v->args) : msgpack_pack_map(&pk, 0);
    char *hex = rc ? NULL : malloc(sb.size * 2 + 1);
    if (hex) {
        for (size_t i = 0; i < sb.size; i++)
            snprintf(hex + 2 * i, 3, "%02x", (unsigned char)sb.data[i]);
        hex[sb.size * 2] = '\0';
    }
    msgpack_sbuffer_destroy(&sb);
    return hex;
}

static char bin300[300];

int main(int argc, char **argv)
{
    for (size_t i = 0; i < sizeof bin300; i++)
        bin300[i] = (char)i;
    static const ctl_str tags_a[] = {SI("a"), SI("")};
    static const matrix_map_u64_entry opts[] = {{SI("z"), 0}, {SI("a"), 300}};
    static const matrix_Inner inner_in = {.label = SI("in"), .weight = 0.5};
    static const int64_t sum_ints[] = {0, -1, INT64_C(1) << 62};
    static const matrix_map_f64_entry weights[] = {{SI("b"), 0.1}, {SI("a"), 1e300}};
    static const matrix_opt_f64 extra[] = {{false, 0}, {true, 1.5}};

    matrix_describe_args d_defaults = MATRIX_DESCRIBE_ARGS_INIT;
    matrix_describe_args d_all = MATRIX_DESCRIBE_ARGS_INIT;
    d_all.flag = true;
    d_all.small = -100000;
    d_all.big = INT64_MIN;
    d_all.count = UINT32_MAX;
    d_all.total = UINT64_MAX;
    d_all.ratio = -0.25;
    d_all.name = S("\xc3\xbcn\xc3\xaf");
    d_all.blob = S("\x00\xff");
    d_all.note = (matrix_opt_str){true, S("n")};
    d_all.tags = (matrix_list_str){.items = tags_a, .count = 2};
    d_all.opts = (matrix_map_u64){.items = opts, .count = 2};
    d_all.inner = &inner_in;
    d_all.from = 1;
    d_all.pass = (matrix_opt_str){true, S("k")};
    d_all.lambda = true;
    d_all.address = S("tcp://x");
    d_all.timeout = 65536;
    d_all.self = -32;
    /* Explicit values equal to the defaults: nothing is sent. */
    matrix_describe_args d_same = MATRIX_DESCRIBE_ARGS_INIT;
    d_same.ratio = 0.5;
    d_same.name = S("n");
    d_same.note = (matrix_opt_str){false, S("")};
    /* Each integer width. */
    matrix_describe_args d_ints_a = MATRIX_DESCRIBE_ARGS_INIT;
    d_ints_a.small = -32;       /* negative fixint */
    d_ints_a.big = -33;         /* int8 */
    d_ints_a.total = 128;       /* uint8 */
    d_ints_a.count = 256;       /* uint16 */
    d_ints_a.from = 65536;      /* uint32 */
    d_ints_a.self = 127;        /* positive fixint */
    matrix_describe_args d_ints_b = MATRIX_DESCRIBE_ARGS_INIT;
    d_ints_b.small = -129;              /* int16 */
    d_ints_b.big = -32769;              /* int32 */
    d_ints_b.total = UINT64_C(1) << 32; /* uint64 */
    d_ints_b.from = UINT64_C(1) << 63;
    d_ints_b.count = 0;
    matrix_describe_args d_ints_c = MATRIX_DESCRIBE_ARGS_INIT;
    d_ints_c.small = INT32_MIN;
    d_ints_c.big = -(INT64_C(1) << 31) - 1; /* int64 */
    d_ints_c.self = INT32_MAX;
    /* -0.0 is not the default 0.5, nor is 0.0; long str and bin. */
    matrix_describe_args d_floats = MATRIX_DESCRIBE_ARGS_INIT;
    d_floats.ratio = -0.0;
    d_floats.name = S("0123456789012345678901234567890123456789");
    d_floats.blob = (ctl_str){bin300, sizeof bin300};

    matrix_echo_args e_full = {.value = mv_full()};
    matrix_echo_args e_sparse = {.value = mv_sparse()};
    matrix_grow_args g = MATRIX_GROW_ARGS_INIT;
    g.depth = 3;
    matrix_sum_args s1 = MATRIX_SUM_ARGS_INIT;
    s1.ints = (matrix_list_i64){.items = sum_ints, .count = 3};
    s1.weights = (matrix_map_f64){.items = weights, .count = 2};
    s1.extra = (matrix_list_opt_f64){.items = extra, .count = 2};
    matrix_sum_args s2 = MATRIX_SUM_ARGS_INIT;
    s2.scale = 2;
    matrix_repeat_args r = MATRIX_REPEAT_ARGS_INIT;
    matrix_find_args f_null = MATRIX_FIND_ARGS_INIT;
    matrix_find_args f_name = MATRIX_FIND_ARGS_INIT;
    f_name.name = (matrix_opt_str){true, S("x")};
    matrix_fail_args fl = MATRIX_FAIL_ARGS_INIT;
    fl.kind = S("Busy");
    matrix_remember_args m1 = MATRIX_REMEMBER_ARGS_INIT;
    m1.key = S("k");
    matrix_remember_args m2 = MATRIX_REMEMBER_ARGS_INIT;
    m2.key = S("k");
    m2.value = -1;

    const vec vecs[] = {
        {"describe_defaults", "describe", &d_defaults},
        {"describe_all", "describe", &d_all},
        {"describe_same_as_defaults", "describe", &d_same},
        {"describe_ints_a", "describe", &d_ints_a},
        {"describe_ints_b", "describe", &d_ints_b},
        {"describe_ints_c", "describe", &d_ints_c},
        {"describe_floats_long", "describe", &d_floats},
        {"echo_full", "echo", &e_full},
        {"echo_sparse", "echo", &e_sparse},
        {"grow_required_only", "grow", &g},
        {"sum_all", "sum", &s1},
        {"sum_scale_int", "sum", &s2},
        {"repeat_empty", "repeat", &r},
        {"find_null", "find", &f_null},
        {"find_name", "find", &f_name},
        {"fail_busy", "fail", &fl},
        {"remember_default", "remember", &m1},
        {"remember_value", "remember", &m2},
        {"ping", "ping", NULL},
        {"remembered", "remembered", NULL},
    };
    size_t n = sizeof vecs / sizeof vecs[0];

    if (argc == 2 && strcmp(argv[1], "--print") == 0) {
        printf("# The golden vectors of tests/pygen/matrix.idl: <case> <op> <args map in hex>,\n"
               "# as the C stubs pack them (tests/pygen/golden.c --print; regenerate with\n"
               "# scripts/golden.sh). test_golden.py checks the Python client against them.\n");
        for (size_t i = 0; i < n; i++) {
            char *hex = pack_hex(&vecs[i]);
            if (!hex) {
                fprintf(stderr, "golden: cannot pack %s\n", vecs[i].name);
                return 1;
            }
            printf("%s %s %s\n", vecs[i].name, vecs[i].op, hex);
            free(hex);
        }
        return 0;
    }
    if (argc != 3 || strcmp(argv[1], "--check") != 0) {
        fprintf(stderr, "usage: golden --print | golden --check FILE\n");
        return 2;
    }
    FILE *f = fopen(argv[2], "r");
    if (!f) {
        perror(argv[2]);
        return 1;
    }
    static char lines[64][8192];
    size_t nlines = 0;
    while (nlines < 64 && fgets(lines[nlines], sizeof lines[0], f))
        if (lines[nlines][0] != '#')
            nlines++;
    fclose(f);
    int failed = 0;
    for (size_t i = 0; i < n; i++) {
        char *hex = pack_hex(&vecs[i]);
        char want[8400];
        snprintf(want, sizeof want, "%s %s %s\n", vecs[i].name, vecs[i].op, hex ? hex : "?");
        int found = 0;
        for (size_t j = 0; j < nlines && !found; j++)
            found = strcmp(lines[j], want) == 0;
        if (!found) {
            fprintf(stderr, "golden: %s differs from %s or is missing there: C packs %s\n",
                    vecs[i].name, argv[2], hex ? hex : "(nothing)");
            failed = 1;
        }
        free(hex);
    }
    if (nlines != n) {
        fprintf(stderr, "golden: %s has %zu vectors, the C side %zu\n", argv[2], nlines, n);
        failed = 1;
    }
    if (!failed)
        printf("golden: %zu vectors match %s\n", n, argv[2]);
    return failed;
}
