/*
 * matrix_unit.c - the C unit of the cross-language matrix (matrix.idl),
 * served through the generated C handlers. matrix_unit.py is its twin in
 * generated Python: the two must behave the same, byte for byte where the
 * drivers can see it (the describe line, messages, results).
 *
 *   matrix_unit [ENDPOINT]     (default tcp://127.0.0.1:0)
 *
 * Prints the bound endpoint as the first line of stdout and serves until
 * stdin reaches end of file (the driver closes it, or dies).
 */
#include <inttypes.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "matrix.ctl.h"

/* ---- describe's line ----------------------------------------------------- */

typedef struct line {
    char *buf;
    size_t len, cap;
    int failed;
} line;

static void put(line *l, const char *fmt, ...) CTL_PRINTF(2, 3);
static void put(line *l, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(l->buf + l->len, l->cap - l->len, fmt, ap);
    va_end(ap);
    if (n < 0 || (size_t)n >= l->cap - l->len) {
        l->failed = 1;
        return;
    }
    l->len += (size_t)n;
}

static void put_str(line *l, ctl_str s)
{
    put(l, "%.*s", (int)s.len, s.ptr);
}

static void put_hex(line *l, ctl_str s)
{
    for (size_t i = 0; i < s.len; i++)
        put(l, "%02x", (unsigned char)s.ptr[i]);
}

static void put_strs(line *l, matrix_list_str tags)
{
    put(l, "[");
    for (size_t i = 0; i < tags.count; i++) {
        put(l, i ? "," : "");
        put_str(l, tags.items[i]);
    }
    put(l, "]");
}

/*
 * flag=true small=-1 big=0 count=7 total=0 ratio=0.5 name=n blob=62 note=nil
 * tags=[a,b] opts={k:1} inner=nil from=0 pass=nil lambda=false address=
 * timeout=0 self=0 (one line). Doubles as %.17g, bins in hex, optional
 * strings quoted, an Inner as {label|weight|[tags]}.
 */
static int on_describe(void *ctx, const matrix_describe_args *a, ctl_str *result,
                       ctl_req *req)
{
    (void)ctx;
    line l = {ctl_req_alloc(req, 8192), 0, 8192, 0};
    if (!l.buf)
        return ctl_req_fail(req, CTL_PROTOCOL, "out of memory");
    put(&l, "flag=%s small=%" PRId32 " big=%" PRId64 " count=%" PRIu32 " total=%" PRIu64
        " ratio=%.17g name=", a->flag ? "true" : "false", a->small, a->big, a->count,
        a->total, a->ratio);
    put_str(&l, a->name);
    put(&l, " blob=");
    put_hex(&l, a->blob);
    put(&l, " note=");
    if (a->note.present) {
        put(&l, "'");
        put_str(&l, a->note.value);
        put(&l, "'");
    } else {
        put(&l, "nil");
    }
    put(&l, " tags=");
    put_strs(&l, a->tags);
    put(&l, " opts={");
    for (size_t i = 0; i < a->opts.count; i++) {
        put(&l, i ? "," : "");
        put_str(&l, a->opts.items[i].key);
        put(&l, ":%" PRIu64, a->opts.items[i].value);
    }
    put(&l, "} inner=");
    if (a->inner) {
        put(&l, "{");
        put_str(&l, a->inner->label);
        put(&l, "|%.17g|", a->inner->weight);
        put_strs(&l, a->inner->tags);
        put(&l, "}");
    } else {
        put(&l, "nil");
    }
    put(&l, " from=%" PRIu64 " pass=", a->from);
    if (a->pass.present) {
        put(&l, "'");
        put_str(&l, a->pass.value);
        put(&l, "'");
    } else {
        put(&l, "nil");
    }
    put(&l, " lambda=%s address=", a->lambda ? "true" : "false");
    put_str(&l, a->address);
    put(&l, " timeout=%" PRIu32 " self=%" PRId32, a->timeout, a->self);
    if (l.failed)
        return ctl_req_fail(req, CTL_PROTOCOL, "describe: the line is too long");
    *result = (ctl_str){l.buf, l.len};
    return 0;
}

/* ---- the other ops ------------------------------------------------------- */

static int on_echo(void *ctx, const matrix_echo_args *a, matrix_Everything *result,
                   ctl_req *req)
{
    (void)ctx;
    (void)req;
    *result = a->value;
    return 0;
}

static ctl_str label_of(ctl_req *req, ctl_str parent, const char *suffix, long i)
{
    size_t cap = parent.len + 32;
    char *buf = ctl_req_alloc(req, cap);
    if (!buf)
        return (ctl_str){NULL, 0};
    int n = i >= 0 ? snprintf(buf, cap, "%.*s%s%ld", (int)parent.len, parent.ptr, suffix, i)
                   : snprintf(buf, cap, "%.*s%s", (int)parent.len, parent.ptr, suffix);
    return (ctl_str){buf, (size_t)n};
}

static int grow(ctl_req *req, matrix_Tree *t, ctl_str label, uint32_t depth, uint32_t fanout)
{
    *t = (matrix_Tree)MATRIX_TREE_INIT;
    t->label = label;
    if (depth == 0) {
        matrix_Tree *next = ctl_req_alloc(req, sizeof *next);
        if (!next)
            return -1;
        *next = (matrix_Tree)MATRIX_TREE_INIT;
        next->label = label_of(req, label, "+", -1);
        t->next = next;
        return next->label.ptr ? 0 : -1;
    }
    matrix_Tree *kids = ctl_req_alloc(req, (fanout ? fanout : 1) * sizeof *kids);
    if (!kids)
        return -1;
    for (uint32_t i = 0; i < fanout; i++) {
        ctl_str l = label_of(req, label, ".", (long)i);
        if (!l.ptr || grow(req, &kids[i], l, depth - 1, fanout))
            return -1;
    }
    t->children = (matrix_list_Tree){.items = kids, .count = fanout};
    return 0;
}

static int on_grow(void *ctx, const matrix_grow_args *a, matrix_Tree *result, ctl_req *req)
{
    (void)ctx;
    if (a->depth > 8 || a->fanout > 8)
        return ctl_req_fail(req, CTL_PROTOCOL, "grow: at most 8 levels of 8");
    if (grow(req, result, a->label, a->depth, a->fanout))
        return ctl_req_fail(req, CTL_PROTOCOL, "out of memory");
    return 0;
}

static int on_sum(void *ctx, const matrix_sum_args *a, double *result, ctl_req *req)
{
    (void)ctx;
    (void)req;
    double s = 0;
    for (size_t i = 0; i < a->ints.count; i++)
        s += (double)a->ints.items[i];
    for (size_t i = 0; i < a->weights.count; i++)
        s += a->weights.items[i].value;
    for (size_t i = 0; i < a->extra.count; i++)
        if (a->extra.items[i].present)
            s += a->extra.items[i].value;
    *result = s * a->scale;
    return 0;
}

static int on_repeat(void *ctx, const matrix_repeat_args *a, matrix_opt_bin *result,
                     ctl_req *req)
{
    (void)ctx;
    size_t n = a->data.len * a->times;
    if (n == 0) {
        result->present = false;
        return 0;
    }
    if (a->times && n / a->times != a->data.len)
        return ctl_req_fail(req, CTL_PROTOCOL, "repeat: too long");
    char *buf = ctl_req_alloc(req, n);
    if (!buf)
        return ctl_req_fail(req, CTL_PROTOCOL, "out of memory");
    for (uint32_t i = 0; i < a->times; i++)
        memcpy(buf + i * a->data.len, a->data.ptr, a->data.len);
    result->present = true;
    result->value = (ctl_str){buf, n};
    return 0;
}

static int on_find(void *ctx, const matrix_find_args *a, const matrix_Inner **result,
                   ctl_req *req)
{
    (void)ctx;
    if (!a->name.present) {
        *result = NULL;
        return 0;
    }
    matrix_Inner *in = ctl_req_alloc(req, sizeof *in);
    if (!in)
        return ctl_req_fail(req, CTL_PROTOCOL, "out of memory");
    *in = (matrix_Inner)MATRIX_INNER_INIT;
    in->label = a->name.value;
    *result = in;
    return 0;
}

static bool is(ctl_str s, const char *c)
{
    return s.len == strlen(c) && memcmp(s.ptr, c, s.len) == 0;
}

static int on_fail(void *ctx, const matrix_fail_args *a, uint64_t *result, ctl_req *req)
{
    (void)ctx;
    static const ctl_str gone[2] = {{"a", 1}, {"b", 1}};
    char reason[256];
    snprintf(reason, sizeof reason, "%.*s", (int)a->reason.value.len, a->reason.value.ptr);
    const char *why = a->reason.present ? reason : NULL;
    int k = (int)a->kind.len;
    const char *kind = a->kind.ptr;
    if (is(a->kind, "UnitFull"))
        return ctl_req_fail(req, CTL_UNIT_FULL, "asked for %.*s", k, kind);
    if (is(a->kind, "Busy"))
        return ctl_req_busy(req, why, "asked for %.*s", k, kind);
    if (is(a->kind, "Missing"))
        return ctl_req_missing(req, gone, 2, "asked for %.*s", k, kind);
    if (is(a->kind, "NoSuchThing"))
        return matrix_fail_raise_NoSuchThing(req, why, "asked for %.*s", k, kind);
    if (is(a->kind, "Stale"))
        return matrix_fail_raise_Stale(req, why, "asked for %.*s", k, kind);
    if (is(a->kind, "Stray"))
        return ctl_req_raise(req, "Stray", why, "asked for %.*s", k, kind);
    if (is(a->kind, "Protocol"))
        return ctl_req_fail(req, CTL_PROTOCOL, "asked for %.*s", k, kind);
    *result = 42;
    return 0;
}

/* What remember was sent: handlers run one at a time, under the server's
 * lock, so no lock of our own. */
static struct {
    matrix_map_i64_entry items[256];
    size_t count;
} remembered;

static int on_remember(void *ctx, const matrix_remember_args *a, ctl_req *req)
{
    (void)ctx;
    (void)req;
    if (remembered.count == 256)
        return 0;
    char *key = malloc(a->key.len ? a->key.len : 1);
    if (!key)
        return 0;
    memcpy(key, a->key.ptr, a->key.len);
    remembered.items[remembered.count++] =
        (matrix_map_i64_entry){.key = {key, a->key.len}, .value = a->value};
    return 0;
}

static int on_remembered(void *ctx, matrix_map_i64 *result, ctl_req *req)
{
    (void)ctx;
    (void)req;
    *result = (matrix_map_i64){.items = remembered.items, .count = remembered.count};
    return 0;
}

static int on_ping(void *ctx, ctl_req *req)
{
    (void)ctx;
    (void)req;
    return 0;
}

int main(int argc, char **argv)
{
    static const matrix_handlers h = {
        .on_echo = on_echo, .on_grow = on_grow, .on_describe = on_describe,
        .on_sum = on_sum, .on_repeat = on_repeat, .on_find = on_find,
        .on_fail = on_fail, .on_remember = on_remember, .on_remembered = on_remembered,
        .on_ping = on_ping,
    };
    ctl_server_options so;
    ctl_server *server = NULL;
    ctl_error err;
    ctl_error_init(&err);
    ctl_server_options_init(&so);
    so.endpoint = argc > 1 ? argv[1] : "tcp://127.0.0.1:0";
    if (matrix_serve(&h, &so, &server, &err) != 0) {
        fprintf(stderr, "matrix_unit: %s\n", err.msg);
        return 1;
    }
    printf("%s\n", ctl_server_endpoint(server));
    fflush(stdout);
    char buf[256];
    while (fread(buf, 1, sizeof buf, stdin) > 0)
        ;
    ctl_server_destroy(&server);
    for (size_t i = 0; i < remembered.count; i++)
        free((void *)remembered.items[i].key.ptr);
    ctl_error_fini(&err);
    return 0;
}
