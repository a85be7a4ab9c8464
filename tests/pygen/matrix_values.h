/*
 * matrix_values.h - the values the C side of the matrix sends: the two
 * Everything records that echo carries, and the arguments of the golden
 * vectors. matrix_values.py builds the same values in Python; the golden
 * vectors (golden/matrix_args.txt) prove both pack them to the same bytes.
 */
#ifndef MATRIX_VALUES_H
#define MATRIX_VALUES_H

#include <stdint.h>
#include <string.h>

#include "matrix.ctl.h"

/* A ctl_str of a literal: SI in static initializers, S in expressions. */
#define SI(lit) {.ptr = (lit), .len = sizeof(lit) - 1}
#define S(lit) ((ctl_str)SI(lit))

static const ctl_str mv_tag_t[] = {SI("t")};
static const ctl_str mv_tags_xy[] = {SI("x"), SI("y")};
static const matrix_Inner mv_index_i[] = {
    {.label = SI("l1"), .weight = 0.25, .tags = {.items = mv_tag_t, .count = 1}},
    {.label = SI("l2"), .weight = 0.5},
};
static const matrix_map_list_Inner_entry mv_index[] = {
    {.key = SI("i"), .value = {.items = mv_index_i, .count = 2}},
    {.key = SI("e"), .value = {.items = NULL, .count = 0}},
};
static const int64_t mv_ints[] = {1, -2, INT64_C(3) << 33};
static const matrix_map_str_entry mv_names[] = {{SI("a"), SI("x")}, {SI("b"), SI("")}};
static const int32_t mv_row0[] = {1, 2};
static const int32_t mv_row2[] = {-3};
static const matrix_list_i32 mv_grid[] = {
    {.items = mv_row0, .count = 2}, {.items = NULL, .count = 0}, {.items = mv_row2, .count = 1}};
static const matrix_opt_u64 mv_holes[] = {{true, 1}, {false, 0}, {true, 3}};
static const matrix_Inner mv_inner_maybe = {.label = SI("im"), .weight = 0.5};
static const double mv_maybe_list[] = {0.5, -1};

/* Every field set, most away from their defaults. */
static matrix_Everything mv_full(void)
{
    matrix_Everything e = MATRIX_EVERYTHING_INIT;
    e.flag = true;
    e.small = -5;
    e.big = INT64_C(1) << 40;
    e.count = 70000;
    e.total = UINT64_MAX;
    e.ratio = 3.25;
    e.name = S("name");
    e.bytes = S("\x00\x01\xff");
    e.pass = S("k");
    e.ints = (matrix_list_i64){.items = mv_ints, .count = 3};
    e.names = (matrix_map_str){.items = mv_names, .count = 2};
    e.maybe = (matrix_opt_str){.present = true, .value = S("m")};
    e.grid = (matrix_list_list_i32){.items = mv_grid, .count = 3};
    e.holes = (matrix_list_opt_u64){.items = mv_holes, .count = 3};
    e.index = (matrix_map_list_Inner){.items = mv_index, .count = 2};
    e.inner = (matrix_Inner)MATRIX_INNER_INIT;
    e.inner.label = S("in");
    e.inner.weight = 1.5;
    e.inner.tags = (matrix_list_str){.items = mv_tags_xy, .count = 2};
    e.inner_maybe = &mv_inner_maybe;
    e.maybe_list = (matrix_opt_list_f64){.present = true,
                                         .value = {.items = mv_maybe_list, .count = 2}};
    e.flag_d = false;
    e.count_d = 8;
    e.name_d = S("n");
    e.blob_d = S("b");
    e.ratio_d = -0.5;
    e.maybe_d = (matrix_opt_str){.present = false};
    return e;
}

/* Empty containers, absent optionals, the defaults where there are some. */
static matrix_Everything mv_sparse(void)
{
    matrix_Everything e = MATRIX_EVERYTHING_INIT;
    return e;
}

#endif
