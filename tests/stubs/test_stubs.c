/*
 * test_stubs.c - the generated stubs end to end: every op of
 * tests/gen/good/everything.idl served by everything_serve on
 * tcp://127.0.0.1:* and called through the typed client stubs, every kind
 * of argument default (tests/stubs/defaults.idl), and a quick round trip of
 * idl/storage.idl's stubs against a tiny in-test store.
 *
 * Values are checked field by field after a full trip (client encoder ->
 * unit decoder -> handler -> unit encoder -> client decoder): scalars at
 * their extremes, strings with NUL bytes and UTF-8, empty and nested
 * containers, optionals present and absent, recursive records. A peer the
 * generated code does not control is played by a "spy" unit written
 * with the runtime API alone (a ctl_service of its own under the same op
 * names) records the raw args map it receives and answers whatever the test
 * scripts (results of the wrong shape, records with only their required
 * fields).
 *
 * Bad input needs no sockets at all: the runtime's cores (dispatch_int.h,
 * call_int.h) are driven with plain buffers. Hand-packed requests go
 * through a ctl_dispatch serving everything_service (and storage_service),
 * and every refusal is checked byte for byte against the error map
 * docs/PROTOCOL.md describes, naming the exact spot ("arg
 * tree.children[1].label: expected str, got int"), then read back by the
 * call core as a client would. Hand-packed replies go through
 * ctl_call_accept and ctl_stub_decode_result, whose "bad reply: result..."
 * messages are checked whole. One refusal, one bad result and two bad
 * notifies still make the trip over TCP (test_bad_input_over_tcp).
 *
 * The asynchronous stubs (<op>_start, <op>_many_start) run on
 * tests/pygen/matrix.idl, whose declared error kinds everything.idl lacks:
 * each fan-out goes to answering units, a refusing one, a dead address and
 * a silent unit, blocking and asynchronous at once (completions queued for
 * ctl_client_process, and on the I/O thread), and the three outcome arrays
 * must match record for record. A large result read after its callback
 * has returned (the handle kept), and args freed as soon as the start
 * returns, are there for ASan.
 *
 * Handlers run on the unit's thread (or, for the core tests, on the test's
 * own): they only record into atomics or under a mutex; every assertion
 * runs on the test's thread.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>

#include <float.h>
#include <poll.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "defaults.ctl.h"
#include "everything.ctl.h"
#include "matrix_values.h" /* tests/pygen: matrix.ctl.h and its values */
#include "storage.ctl.h"
#include "testutil.h"

/* The runtime's socket-free cores (runtime/src). */
#include "call_int.h"
#include "dispatch_int.h"
#include "envelope_int.h"

#define CALL_MS 10000 /* deadline for calls that must succeed */
#define WAIT_MS 5000  /* how long to wait for a notify to land */

/* A view of a string literal that may hold NUL bytes. */
#define LIT(s) ((ctl_str){(s), sizeof(s) - 1})

/* ---- small helpers -------------------------------------------------- */

static void expect_bytes(ctl_str got, ctl_str want)
{
    assert_int_equal(got.len, want.len);
    if (want.len)
        assert_memory_equal(got.ptr, want.ptr, want.len);
}

static void expect_cstr(ctl_str got, const char *want)
{
    expect_bytes(got, ctl_str_c(want));
}

/* f64 compared bit for bit, so -0.0 and 0.0 differ. */
static void expect_f64(double got, double want)
{
    assert_memory_equal(&got, &want, sizeof got);
}

static void expect_substr(const char *msg, const char *want)
{
    if (msg == NULL || strstr(msg, want) == NULL)
        fail_msg("message '%s' lacks '%s'", msg ? msg : "(null)", want);
}

static bool view_is(ctl_str s, const char *c)
{
    size_t n = strlen(c);
    return s.len == n && (n == 0 || memcmp(s.ptr, c, n) == 0);
}

/* Memory that outlives a handler call: a list of blocks freed together. */
typedef struct arena {
    void **blocks;
    size_t n, cap;
} arena;

static void *arena_alloc(arena *a, size_t size)
{
    void *p;
    if (a->n == a->cap) {
        size_t cap = a->cap ? a->cap * 2 : 64;
        void **grown = realloc(a->blocks, cap * sizeof *grown);
        if (grown == NULL)
            return NULL;
        a->blocks = grown;
        a->cap = cap;
    }
    p = calloc(1, size ? size : 1);
    if (p != NULL)
        a->blocks[a->n++] = p;
    return p;
}

static void arena_free(arena *a)
{
    for (size_t i = 0; i < a->n; i++)
        free(a->blocks[i]);
    free(a->blocks);
    memset(a, 0, sizeof *a);
}

static ctl_str str_copy(arena *a, ctl_str s)
{
    char *p = arena_alloc(a, s.len + 1);
    if (p == NULL)
        return (ctl_str){"", 0};
    if (s.len)
        memcpy(p, s.ptr, s.len);
    return (ctl_str){p, s.len};
}

/* Deep copy of a decoded Node (whose views die with the request). */
static void node_copy(arena *a, everything_Node *dst, const everything_Node *src)
{
    everything_Node *kids, *next;
    everything_map_Node_entry *named;
    memset(dst, 0, sizeof *dst);
    dst->label = str_copy(a, src->label);
    kids = arena_alloc(a, src->children.count * sizeof *kids);
    for (size_t i = 0; kids && i < src->children.count; i++)
        node_copy(a, &kids[i], &src->children.items[i]);
    dst->children = (everything_list_Node){.items = kids, .count = kids ? src->children.count : 0};
    dst->parent_label.present = src->parent_label.present;
    if (src->parent_label.present)
        dst->parent_label.value = str_copy(a, src->parent_label.value);
    if (src->next && (next = arena_alloc(a, sizeof *next)) != NULL) {
        node_copy(a, next, src->next);
        dst->next = next;
    }
    named = arena_alloc(a, src->by_name.count * sizeof *named);
    for (size_t i = 0; named && i < src->by_name.count; i++) {
        named[i].key = str_copy(a, src->by_name.items[i].key);
        node_copy(a, &named[i].value, &src->by_name.items[i].value);
    }
    dst->by_name = (everything_map_Node){.items = named, .count = named ? src->by_name.count : 0};
}

static void expect_node(const everything_Node *got, const everything_Node *want)
{
    assert_non_null(got);
    expect_bytes(got->label, want->label);
    assert_int_equal(got->children.count, want->children.count);
    for (size_t i = 0; i < want->children.count; i++)
        expect_node(&got->children.items[i], &want->children.items[i]);
    assert_int_equal(got->parent_label.present, want->parent_label.present);
    if (want->parent_label.present)
        expect_bytes(got->parent_label.value, want->parent_label.value);
    if (want->next == NULL)
        assert_null(got->next);
    else
        expect_node(got->next, want->next);
    assert_int_equal(got->by_name.count, want->by_name.count);
    for (size_t i = 0; i < want->by_name.count; i++) {
        expect_bytes(got->by_name.items[i].key, want->by_name.items[i].key);
        expect_node(&got->by_name.items[i].value, &want->by_name.items[i].value);
    }
}

static void expect_scalars(const everything_Scalars *got,
                           const everything_Scalars *want)
{
    assert_int_equal(got->flag, want->flag);
    assert_int_equal(got->small, want->small);
    assert_true(got->big == want->big);
    assert_int_equal(got->count, want->count);
    assert_true(got->total == want->total);
    expect_f64(got->ratio, want->ratio);
    expect_bytes(got->name, want->name);
    expect_bytes(got->blob, want->blob);
    assert_int_equal(got->flag_d, want->flag_d);
    assert_int_equal(got->small_d, want->small_d);
    assert_true(got->big_d == want->big_d);
    assert_int_equal(got->count_d, want->count_d);
    assert_true(got->total_d == want->total_d);
    assert_int_equal(got->neg_hex, want->neg_hex);
    expect_f64(got->ratio_d, want->ratio_d);
    expect_f64(got->ratio_int, want->ratio_int);
    expect_bytes(got->name_d, want->name_d);
    expect_bytes(got->blob_d, want->blob_d);
}

/* The IDL's defaults for Scalars' defaulted fields, written out by hand
 * (independently of everything_Scalars_init); the encoder sends every
 * field of a record. */
static void scalars_defaults(everything_Scalars *s)
{
    memset(s, 0, sizeof *s);
    s->flag_d = true;
    s->small_d = INT32_MIN;
    s->big_d = INT64_MAX;
    s->count_d = UINT32_MAX;
    s->total_d = UINT64_MAX;
    s->neg_hex = -16;
    s->ratio_d = -1.5e-3;
    s->ratio_int = 2.0;
    s->name_d = LIT("tab\t, quote\", backslash\\, \xc3\xa9, newline\n");
    s->blob_d = LIT("raw");
}

/* ---- the everything unit --------------------------------------------- */

typedef struct ev_state {
    pthread_mutex_t mu;
    atomic_int echoes, pings, matrices, forgets, pokes;
    atomic_int slow_ms; /* matrix sleeps this long first */
    atomic_int stop;    /* cuts a slow sleep short */
    /* Under mu: what the last forget and echo brought. */
    char forgot[256];
    size_t forgot_count;
    bool forgot_hard;
    arena mem;
    everything_Node *tree; /* deep copy of the last echo's tree */
    bool have_tree;
} ev_state;

static void ev_state_init(ev_state *st)
{
    memset(st, 0, sizeof *st);
    pthread_mutex_init(&st->mu, NULL);
    atomic_init(&st->echoes, 0);
    atomic_init(&st->pings, 0);
    atomic_init(&st->matrices, 0);
    atomic_init(&st->forgets, 0);
    atomic_init(&st->pokes, 0);
    atomic_init(&st->slow_ms, 0);
    atomic_init(&st->stop, 0);
}

static void ev_state_fini(ev_state *st)
{
    arena_free(&st->mem);
    pthread_mutex_destroy(&st->mu);
}

/* Each handler is declared with its generated type, as units should. */
static everything_echo_handler on_echo;
static everything_ping_handler on_ping;
static everything_find_handler on_find;
static everything_matrix_handler on_matrix;
static everything_counters_handler on_counters;
static everything_size_handler on_size;
static everything_list_handler on_list;
static everything_forget_handler on_forget;
static everything_poke_handler on_poke;

/* echo: the containers come back with two entries added from the other
 * args, so one result shows every arg arrived: names gains "tag" -> tag,
 * index gains "scalars" -> `repeat` copies of scalars, and maybe = note.
 * The tree is kept (deep copy) for find("tree") to send back. Some tags
 * make it fail instead, with each error kind. */
static int on_echo(void *ctx, const everything_echo_args *a,
                   everything_Containers *r, ctl_req *req)
{
    ev_state *st = ctx;
    everything_map_str_entry *names;
    everything_map_list_Scalars_entry *index;
    everything_Scalars *copies;
    atomic_fetch_add(&st->echoes, 1);
    if (view_is(a->tag, "full"))
        return ctl_req_fail(req, CTL_UNIT_FULL, "no room for %u copies",
                            (unsigned)a->repeat);
    if (view_is(a->tag, "busy"))
        return ctl_req_busy(req, "draining", "the unit is draining");
    if (view_is(a->tag, "missing")) {
        const ctl_str blobs[] = {LIT("b1"), LIT("b\0\xc3\xa9")};
        return ctl_req_missing(req, blobs, 2, "2 blobs are gone");
    }
    if (view_is(a->tag, "protocol"))
        return ctl_req_fail(req, CTL_PROTOCOL, "echo refused tag '%s'",
                            "protocol");
    if (a->repeat > 100)
        return ctl_req_fail(req, CTL_UNIT_FULL, "repeat %u is too many",
                            (unsigned)a->repeat);

    pthread_mutex_lock(&st->mu);
    st->tree = arena_alloc(&st->mem, sizeof *st->tree);
    if (st->tree != NULL) {
        node_copy(&st->mem, st->tree, &a->tree);
        st->have_tree = true;
    }
    pthread_mutex_unlock(&st->mu);

    *r = a->containers; /* views into the args live until the reply is sent */
    r->maybe = a->note;
    names = ctl_req_alloc(req, (a->containers.names.count + 1) * sizeof *names);
    index = ctl_req_alloc(req, (a->containers.index.count + 1) * sizeof *index);
    copies = ctl_req_alloc(req, (a->repeat ? a->repeat : 1) * sizeof *copies);
    if (!names || !index || !copies)
        return ctl_req_fail(req, CTL_PROTOCOL, "out of memory");
    for (size_t i = 0; i < a->containers.names.count; i++)
        names[i] = a->containers.names.items[i];
    names[a->containers.names.count] =
        (everything_map_str_entry){.key = LIT("tag"), .value = a->tag};
    r->names = (everything_map_str){.items = names, .count = a->containers.names.count + 1};
    for (uint32_t i = 0; i < a->repeat; i++)
        copies[i] = a->scalars;
    for (size_t i = 0; i < a->containers.index.count; i++)
        index[i] = a->containers.index.items[i];
    index[a->containers.index.count] = (everything_map_list_Scalars_entry){
        .key = LIT("scalars"), .value = {.items = copies, .count = a->repeat}};
    r->index = (everything_map_list_Scalars){.items = index, .count = a->containers.index.count + 1};
    return 0;
}

static int on_ping(void *ctx, ctl_req *req)
{
    ev_state *st = ctx;
    (void)req;
    atomic_fetch_add(&st->pings, 1);
    return 0;
}

/* find: "tree" -> the last echo's tree, "leaf" -> a small node built in
 * request memory, "gone" -> Missing, anything else -> absent (nil). */
static int on_find(void *ctx, const everything_find_args *a,
                   const everything_Node **result, ctl_req *req)
{
    ev_state *st = ctx;
    if (view_is(a->name, "tree")) {
        pthread_mutex_lock(&st->mu);
        *result = st->have_tree ? st->tree : NULL;
        pthread_mutex_unlock(&st->mu);
        return 0;
    }
    if (view_is(a->name, "leaf")) {
        everything_Node *n = ctl_req_alloc(req, sizeof *n);
        if (n == NULL)
            return ctl_req_fail(req, CTL_PROTOCOL, "out of memory");
        memset(n, 0, sizeof *n);
        n->label = LIT("le\0af");
        n->parent_label = (everything_opt_str){.present = true, .value = LIT("")};
        *result = n;
        return 0;
    }
    if (view_is(a->name, "gone")) {
        const ctl_str blobs[] = {LIT("gone")};
        return ctl_req_missing(req, blobs, 1, "no node named gone");
    }
    *result = NULL;
    return 0;
}

/* matrix: rows x cols of r * 1000 + c + 0.25; rows > 1000 is Busy. */
static int on_matrix(void *ctx, const everything_matrix_args *a,
                     everything_list_list_f64 *result, ctl_req *req)
{
    ev_state *st = ctx;
    everything_list_f64 *rows;
    atomic_fetch_add(&st->matrices, 1);
    for (int slept = 0; slept < atomic_load(&st->slow_ms) && !atomic_load(&st->stop);
         slept += 5)
        tu_sleep_ms(5);
    if (a->rows > 1000)
        return ctl_req_busy(req, "too-big", "%u rows is too many",
                            (unsigned)a->rows);
    rows = ctl_req_alloc(req, (a->rows ? a->rows : 1) * sizeof *rows);
    if (rows == NULL)
        return ctl_req_fail(req, CTL_PROTOCOL, "out of memory");
    for (uint32_t r = 0; r < a->rows; r++) {
        double *cells = ctl_req_alloc(req, (a->cols ? a->cols : 1) * sizeof *cells);
        if (cells == NULL)
            return ctl_req_fail(req, CTL_PROTOCOL, "out of memory");
        for (uint32_t c = 0; c < a->cols; c++)
            cells[c] = r * 1000.0 + c + 0.25;
        rows[r] = (everything_list_f64){.items = cells, .count = a->cols};
    }
    *result = (everything_list_list_f64){.items = rows, .count = a->rows};
    return 0;
}

/* counters: {prefix + "pings": pings so far, prefix + "max": UINT64_MAX}. */
static int on_counters(void *ctx, const everything_counters_args *a,
                       everything_map_u64 *result, ctl_req *req)
{
    ev_state *st = ctx;
    static const char *const suffix[] = {"pings", "max"};
    everything_map_u64_entry *e = ctl_req_alloc(req, 2 * sizeof *e);
    if (e == NULL)
        return ctl_req_fail(req, CTL_PROTOCOL, "out of memory");
    for (int i = 0; i < 2; i++) {
        size_t n = strlen(suffix[i]);
        char *key = ctl_req_alloc(req, a->prefix.len + n);
        if (key == NULL)
            return ctl_req_fail(req, CTL_PROTOCOL, "out of memory");
        if (a->prefix.len)
            memcpy(key, a->prefix.ptr, a->prefix.len);
        memcpy(key + a->prefix.len, suffix[i], n);
        e[i].key = (ctl_str){key, a->prefix.len + n};
    }
    e[0].value = (uint64_t)atomic_load(&st->pings);
    e[1].value = UINT64_MAX;
    *result = (everything_map_u64){.items = e, .count = 2};
    return 0;
}

static int on_size(void *ctx, const everything_size_args *a, uint64_t *result,
                   ctl_req *req)
{
    (void)ctx;
    (void)req;
    *result = a->data.len;
    return 0;
}

/* list: absent `from` -> [{INT64_MIN, 0}, {INT64_MAX, 999999999}];
 * present -> [from, from one second later]. */
static int on_list(void *ctx, const everything_list_args *a,
                   everything_list_Stamp *result, ctl_req *req)
{
    everything_Stamp *s = ctl_req_alloc(req, 2 * sizeof *s);
    (void)ctx;
    if (s == NULL)
        return ctl_req_fail(req, CTL_PROTOCOL, "out of memory");
    if (a->from == NULL) {
        s[0] = (everything_Stamp){.secs = INT64_MIN, .nanos = 0};
        s[1] = (everything_Stamp){.secs = INT64_MAX, .nanos = 999999999u};
    } else {
        s[0] = *a->from;
        s[1] = (everything_Stamp){.secs = a->from->secs + 1, .nanos = a->from->nanos};
    }
    *result = (everything_list_Stamp){.items = s, .count = 2};
    return 0;
}

/* forget: records the names ("a|b") and `hard`; a name "fail" makes it
 * fail after recording, which a notify's caller never hears about. */
static int on_forget(void *ctx, const everything_forget_args *a, ctl_req *req)
{
    ev_state *st = ctx;
    bool fail = false;
    pthread_mutex_lock(&st->mu);
    st->forgot[0] = '\0';
    for (size_t i = 0; i < a->names.count; i++) {
        size_t used = strlen(st->forgot);
        snprintf(st->forgot + used, sizeof st->forgot - used, "%s%.*s",
                 i ? "|" : "", (int)a->names.items[i].len, a->names.items[i].ptr);
        fail = fail || view_is(a->names.items[i], "fail");
    }
    st->forgot_count = a->names.count;
    st->forgot_hard = a->hard;
    pthread_mutex_unlock(&st->mu);
    atomic_fetch_add(&st->forgets, 1);
    if (fail)
        return ctl_req_fail(req, CTL_PROTOCOL, "cannot forget 'fail'");
    return 0;
}

static int on_poke(void *ctx, ctl_req *req)
{
    ev_state *st = ctx;
    (void)req;
    atomic_fetch_add(&st->pokes, 1);
    return 0;
}

static const everything_handlers ev_handlers_template = {
    .ctx = NULL,
    .on_echo = on_echo,
    .on_ping = on_ping,
    .on_find = on_find,
    .on_matrix = on_matrix,
    .on_counters = on_counters,
    .on_size = on_size,
    .on_list = on_list,
    .on_forget = on_forget,
    .on_poke = on_poke,
};

/* ---- the spy: a unit written with the runtime API alone --------------- */

/* What the spy answers, whatever the op. */
typedef enum spy_mode {
    SPY_NIL,                /* nil */
    SPY_MATRIX_BAD_CELL,    /* [[1.0, 2.0], [3.0, "x"]] */
    SPY_NODE_BAD_LABEL,     /* a Node whose children[1].label is an int */
    SPY_NODE_NO_CHILDREN,   /* {label: "x"}: required fields missing */
    SPY_NODE_MINIMAL,       /* {label, children: [], by_name: {}} */
    SPY_ARRAY,              /* [] */
    SPY_NEGATIVE,           /* -1 */
    SPY_STAMPS_MINIMAL,     /* [{secs: 5}, {secs: -5, nanos: 7}] */
    SPY_CONTAINERS_MINIMAL, /* Containers with only its required fields */
    SPY_HOLES_BAD,          /* Containers whose holes[1] is a str */
} spy_mode;

typedef struct spy {
    pthread_mutex_t mu;
    char keys[512]; /* under mu: the last args map's keys, "a,b" */
    atomic_int calls;
    atomic_int mode;
} spy;

static void pack_min_node(msgpack_packer *pk, const char *label, bool int_label)
{
    msgpack_pack_map(pk, 3);
    tu_pk_str(pk, "label");
    if (int_label)
        msgpack_pack_int(pk, 5);
    else
        tu_pk_str(pk, label);
    tu_pk_str(pk, "children");
    msgpack_pack_array(pk, 0);
    tu_pk_str(pk, "by_name");
    msgpack_pack_map(pk, 0);
}

static void pack_min_containers(msgpack_packer *pk, bool bad_holes)
{
    msgpack_pack_map(pk, 7);
    tu_pk_str(pk, "ints");
    msgpack_pack_array(pk, 1);
    msgpack_pack_int64(pk, -3);
    tu_pk_str(pk, "names");
    msgpack_pack_map(pk, 0);
    tu_pk_str(pk, "holes");
    if (bad_holes) {
        msgpack_pack_array(pk, 2);
        msgpack_pack_nil(pk);
        tu_pk_str(pk, "x");
    } else {
        msgpack_pack_array(pk, 0);
    }
    tu_pk_str(pk, "sparse");
    msgpack_pack_map(pk, 0);
    tu_pk_str(pk, "grid");
    msgpack_pack_array(pk, 0);
    tu_pk_str(pk, "index");
    msgpack_pack_map(pk, 0);
    tu_pk_str(pk, "when");
    msgpack_pack_map(pk, 1);
    tu_pk_str(pk, "secs");
    msgpack_pack_int64(pk, 42);
}

/* The answer of `mode` (also packed by hand for the call core's tests). */
static void pack_answer(msgpack_packer *pk, spy_mode mode)
{
    switch (mode) {
    case SPY_NIL:
        msgpack_pack_nil(pk);
        break;
    case SPY_MATRIX_BAD_CELL:
        msgpack_pack_array(pk, 2);
        msgpack_pack_array(pk, 2);
        msgpack_pack_double(pk, 1.0);
        msgpack_pack_double(pk, 2.0);
        msgpack_pack_array(pk, 2);
        msgpack_pack_double(pk, 3.0);
        tu_pk_str(pk, "x");
        break;
    case SPY_NODE_BAD_LABEL:
        msgpack_pack_map(pk, 3);
        tu_pk_str(pk, "label");
        tu_pk_str(pk, "root");
        tu_pk_str(pk, "children");
        msgpack_pack_array(pk, 2);
        pack_min_node(pk, "c0", false);
        pack_min_node(pk, NULL, true);
        tu_pk_str(pk, "by_name");
        msgpack_pack_map(pk, 0);
        break;
    case SPY_NODE_NO_CHILDREN:
        msgpack_pack_map(pk, 1);
        tu_pk_str(pk, "label");
        tu_pk_str(pk, "x");
        break;
    case SPY_NODE_MINIMAL:
        pack_min_node(pk, "min", false);
        break;
    case SPY_ARRAY:
        msgpack_pack_array(pk, 0);
        break;
    case SPY_NEGATIVE:
        msgpack_pack_int(pk, -1);
        break;
    case SPY_STAMPS_MINIMAL:
        msgpack_pack_array(pk, 2);
        msgpack_pack_map(pk, 1);
        tu_pk_str(pk, "secs");
        msgpack_pack_int(pk, 5);
        msgpack_pack_map(pk, 3);
        tu_pk_str(pk, "secs");
        msgpack_pack_int(pk, -5);
        tu_pk_str(pk, "nanos");
        msgpack_pack_int(pk, 7);
        tu_pk_str(pk, "zone"); /* a field this side does not know */
        tu_pk_str(pk, "UTC");
        break;
    case SPY_CONTAINERS_MINIMAL:
        pack_min_containers(pk, false);
        break;
    case SPY_HOLES_BAD:
        pack_min_containers(pk, true);
        break;
    }
}

static int spy_handler(void *user, const msgpack_object *args, ctl_req *req)
{
    spy *s = user;
    pthread_mutex_lock(&s->mu);
    s->keys[0] = '\0';
    for (uint32_t i = 0; i < args->via.map.size; i++) {
        const msgpack_object *k = &args->via.map.ptr[i].key;
        size_t used = strlen(s->keys);
        if (k->type == MSGPACK_OBJECT_STR)
            snprintf(s->keys + used, sizeof s->keys - used, "%s%.*s",
                     i ? "," : "", (int)k->via.str.size, k->via.str.ptr);
    }
    pthread_mutex_unlock(&s->mu);
    atomic_fetch_add(&s->calls, 1);

    pack_answer(ctl_req_packer(req), (spy_mode)atomic_load(&s->mode));
    return 0;
}

static const ctl_op spy_ops[] = {
    {.name = "counters", .handler = spy_handler},
    {.name = "echo", .handler = spy_handler},
    {.name = "find", .handler = spy_handler},
    {.name = "forget", .handler = spy_handler, .flags = CTL_OP_NOREPLY},
    {.name = "list", .handler = spy_handler},
    {.name = "matrix", .handler = spy_handler},
    {.name = "ping", .handler = spy_handler},
    {.name = "size", .handler = spy_handler},
    {.name = "tune", .handler = spy_handler},
};

static const ctl_service spy_service = {.name = "spy", .ops = spy_ops,
    .op_count = sizeof spy_ops / sizeof spy_ops[0]};

/* ---- a tiny storage unit for idl/storage.idl ------------------------- */

#define STORE_SLOTS 8
#define STORE_CAPACITY 64

typedef struct blob {
    bool used;
    bool pinned;
    char key[32];
    size_t key_len;
    unsigned char data[STORE_CAPACITY];
    size_t len;
} blob;

typedef struct store {
    blob slot[STORE_SLOTS];
    size_t bytes;
    atomic_int requests;
} store;

static blob *store_find(store *s, ctl_str key)
{
    for (int i = 0; i < STORE_SLOTS; i++)
        if (s->slot[i].used && s->slot[i].key_len == key.len &&
            memcmp(s->slot[i].key, key.ptr, key.len) == 0)
            return &s->slot[i];
    return NULL;
}

static ctl_str blob_key(const blob *b)
{
    return (ctl_str){b->key, b->key_len};
}

/* Missing, naming every key of `keys` the store lacks; 0 when none is. */
static int store_missing(store *s, const storage_list_str *keys, ctl_req *req)
{
    ctl_str *gone = ctl_req_alloc(req, (keys->count + 1) * sizeof *gone);
    size_t n = 0;
    if (gone == NULL)
        return ctl_req_fail(req, CTL_PROTOCOL, "out of memory");
    for (size_t i = 0; i < keys->count; i++)
        if (store_find(s, keys->items[i]) == NULL)
            gone[n++] = keys->items[i];
    return n ? ctl_req_missing(req, gone, n, "%zu of %zu blobs missing", n,
                               keys->count)
             : 0;
}

static storage_put_handler st_put;
static storage_get_handler st_get;
static storage_describe_handler st_describe;
static storage_pin_handler st_pin;
static storage_unpin_handler st_unpin;
static storage_abort_handler st_abort;
static storage_delete_handler st_delete;
static storage_list_handler st_list;
static storage_stats_handler st_stats;

static int st_put(void *ctx, const storage_put_args *a, uint64_t *result,
                  ctl_req *req)
{
    store *s = ctx;
    blob *b = store_find(s, a->key);
    size_t old = b ? b->len : 0;
    atomic_fetch_add(&s->requests, 1);
    if (b && b->pinned)
        return ctl_req_busy(req, "pinned", "blob '%.*s' is pinned",
                            (int)a->key.len, a->key.ptr);
    if (a->key.len > sizeof b->key || s->bytes - old + a->data.len > STORE_CAPACITY)
        return ctl_req_fail(req, CTL_UNIT_FULL, "%zu bytes do not fit",
                            a->data.len);
    for (int i = 0; !b && i < STORE_SLOTS; i++)
        if (!s->slot[i].used)
            b = &s->slot[i];
    if (b == NULL)
        return ctl_req_fail(req, CTL_UNIT_FULL, "no free slot");
    b->used = true;
    b->pinned = a->pin;
    memcpy(b->key, a->key.ptr, a->key.len);
    b->key_len = a->key.len;
    if (a->data.len)
        memcpy(b->data, a->data.ptr, a->data.len);
    b->len = a->data.len;
    s->bytes = s->bytes - old + a->data.len;
    *result = a->data.len;
    return 0;
}

static int st_get(void *ctx, const storage_get_args *a, storage_list_bin *result,
                  ctl_req *req)
{
    store *s = ctx;
    ctl_str *out;
    int rc;
    atomic_fetch_add(&s->requests, 1);
    if ((rc = store_missing(s, &a->keys, req)) != 0)
        return rc;
    out = ctl_req_alloc(req, (a->keys.count + 1) * sizeof *out);
    if (out == NULL)
        return ctl_req_fail(req, CTL_PROTOCOL, "out of memory");
    for (size_t i = 0; i < a->keys.count; i++) {
        const blob *b = store_find(s, a->keys.items[i]);
        out[i] = (ctl_str){(const char *)b->data, b->len};
    }
    *result = (storage_list_bin){.items = out, .count = a->keys.count};
    return 0;
}

static int st_describe(void *ctx, const storage_describe_args *a,
                       storage_list_BlobInfo *result, ctl_req *req)
{
    store *s = ctx;
    storage_BlobInfo *out;
    int rc;
    atomic_fetch_add(&s->requests, 1);
    if ((rc = store_missing(s, &a->keys, req)) != 0)
        return rc;
    out = ctl_req_alloc(req, (a->keys.count + 1) * sizeof *out);
    if (out == NULL)
        return ctl_req_fail(req, CTL_PROTOCOL, "out of memory");
    for (size_t i = 0; i < a->keys.count; i++) {
        const blob *b = store_find(s, a->keys.items[i]);
        storage_BlobInfo_init(&out[i]); /* a field added later keeps its default */
        out[i].key = blob_key(b);
        out[i].size = b->len;
        out[i].pinned = b->pinned;
        out[i].spilled = false;
    }
    *result = (storage_list_BlobInfo){.items = out, .count = a->keys.count};
    return 0;
}

static int st_pin(void *ctx, const storage_pin_args *a, uint64_t *result,
                  ctl_req *req)
{
    store *s = ctx;
    int rc;
    atomic_fetch_add(&s->requests, 1);
    if ((rc = store_missing(s, &a->keys, req)) != 0)
        return rc;
    for (size_t i = 0; i < a->keys.count; i++)
        store_find(s, a->keys.items[i])->pinned = true;
    *result = 0;
    for (int i = 0; i < STORE_SLOTS; i++)
        *result += s->slot[i].used && s->slot[i].pinned;
    return 0;
}

static int st_unpin(void *ctx, const storage_unpin_args *a, ctl_req *req)
{
    store *s = ctx;
    (void)req;
    atomic_fetch_add(&s->requests, 1);
    for (size_t i = 0; i < a->keys.count; i++) {
        blob *b = store_find(s, a->keys.items[i]);
        if (b)
            b->pinned = false;
    }
    return 0;
}

static void store_drop(store *s, blob *b)
{
    s->bytes -= b->len;
    memset(b, 0, sizeof *b);
}

static int st_abort(void *ctx, const storage_abort_args *a, ctl_req *req)
{
    store *s = ctx;
    (void)req;
    atomic_fetch_add(&s->requests, 1);
    for (size_t i = 0; i < a->keys.count; i++) {
        blob *b = store_find(s, a->keys.items[i]);
        if (b && !b->pinned)
            store_drop(s, b);
    }
    return 0;
}

static int st_delete(void *ctx, const storage_delete_args *a, uint64_t *result,
                     ctl_req *req)
{
    store *s = ctx;
    atomic_fetch_add(&s->requests, 1);
    for (size_t i = 0; i < a->keys.count; i++) {
        blob *b = store_find(s, a->keys.items[i]);
        if (b && b->pinned)
            return ctl_req_busy(req, "pinned", "blob '%.*s' is pinned",
                                (int)b->key_len, b->key);
    }
    *result = 0;
    for (size_t i = 0; i < a->keys.count; i++) {
        blob *b = store_find(s, a->keys.items[i]);
        if (b) {
            store_drop(s, b);
            (*result)++;
        }
    }
    return 0;
}

static int cmp_view(const void *x, const void *y)
{
    const ctl_str *a = x, *b = y;
    size_t n = a->len < b->len ? a->len : b->len;
    int c = n ? memcmp(a->ptr, b->ptr, n) : 0;
    return c ? c : (a->len > b->len) - (a->len < b->len);
}

static int st_list(void *ctx, const storage_list_args *a, storage_list_str *result,
                   ctl_req *req)
{
    store *s = ctx;
    ctl_str *keys = ctl_req_alloc(req, STORE_SLOTS * sizeof *keys);
    size_t n = 0;
    atomic_fetch_add(&s->requests, 1);
    if (keys == NULL)
        return ctl_req_fail(req, CTL_PROTOCOL, "out of memory");
    for (int i = 0; i < STORE_SLOTS; i++)
        if (s->slot[i].used && s->slot[i].key_len >= a->prefix.len &&
            (a->prefix.len == 0 ||
             memcmp(s->slot[i].key, a->prefix.ptr, a->prefix.len) == 0))
            keys[n++] = blob_key(&s->slot[i]);
    qsort(keys, n, sizeof *keys, cmp_view);
    *result = (storage_list_str){.items = keys, .count = n};
    return 0;
}

static int st_stats(void *ctx, storage_UnitStats *result, ctl_req *req)
{
    store *s = ctx;
    (void)req;
    atomic_fetch_add(&s->requests, 1);
    memset(result, 0, sizeof *result);
    for (int i = 0; i < STORE_SLOTS; i++) {
        result->blobs += s->slot[i].used;
        result->pinned += s->slot[i].used && s->slot[i].pinned;
    }
    result->bytes = s->bytes;
    result->capacity = STORE_CAPACITY;
    result->requests = (uint64_t)atomic_load(&s->requests);
    return 0;
}

/* ---- a unit for tests/stubs/defaults.idl ------------------------------ */

static bool same_f64(double a, double b)
{
    return memcmp(&a, &b, sizeof a) == 0;
}

static defaults_tune_handler on_tune;

/* Bit i is set when arg i holds its declared default (f64 bit for bit). */
static int on_tune(void *ctx, const defaults_tune_args *a, uint64_t *result,
                   ctl_req *req)
{
    const bool at_default[] = {
        same_f64(a->ratio, -0.5),
        a->label.len == 3 && memcmp(a->label.ptr, "x\0y", 3) == 0,
        a->floor == INT64_MIN,
        a->on,
        a->limit.present && a->limit.value == 5,
        view_is(a->raw, "raw"),
        a->ids.count == 0,
        !a->note.present,
        a->knobs.count == 0,
        a->empty.present && a->empty.value.len == 0,
        a->zero.present && same_f64(a->zero.value, 0.0),
        a->knob == NULL,
    };
    (void)ctx;
    (void)req;
    *result = 0;
    for (unsigned i = 0; i < sizeof at_default / sizeof at_default[0]; i++)
        *result |= (uint64_t)at_default[i] << i;
    return 0;
}

#define TUNE_ARGS 12
#define TUNE_ALL ((UINT64_C(1) << TUNE_ARGS) - 1)

/* ---- fixture ---------------------------------------------------------- */

typedef struct fx {
    ev_state st;
    everything_handlers h;
    ctl_server *ev;
    char addr[CTL_ENDPOINT_MAX];
    ctl_client *client;
    ctl_error err;
    ctl_reply *reply;
    tu_buf args;
    /* Started by the tests that need them. */
    ev_state st2;
    everything_handlers h2;
    ctl_server *ev2;
    char addr2[CTL_ENDPOINT_MAX];
    spy spy;
    ctl_server *spy_srv;
    char spy_addr[CTL_ENDPOINT_MAX];
    store store;
    storage_handlers sh;
    ctl_server *storage;
    char storage_addr[CTL_ENDPOINT_MAX];
    defaults_handlers dh;
    ctl_server *tune;
    char tune_addr[CTL_ENDPOINT_MAX];
    /* The cores, no sockets: everything_service served by a dispatch core
     * (its handlers share `st` with the TCP unit's), the request bytes it
     * was given, and storage_service's core for the tests that start it. */
    everything_handlers ch;
    ctl_dispatch core;
    bool core_up;
    tu_buf req;
    storage_handlers csh;
    ctl_dispatch storage_core;
    bool storage_core_up;
} fx;

static int serve_everything(everything_handlers *h, ev_state *st,
                            ctl_server **out, char *addr, ctl_error *err)
{
    ctl_server_options o;
    ctl_server_options_init(&o);
    o.endpoint = "tcp://127.0.0.1:*";
    *h = ev_handlers_template;
    h->ctx = st;
    if (everything_serve(h, &o, out, err) != 0) {
        fprintf(stderr, "everything_serve failed: %s\n", err->msg ? err->msg : "?");
        return -1;
    }
    snprintf(addr, CTL_ENDPOINT_MAX, "%s", ctl_server_endpoint(*out));
    return 0;
}

/* The fixture without sockets: state, buffers and the dispatch core. */
static int setup_core(void **state)
{
    fx *f = calloc(1, sizeof *f);
    if (f == NULL)
        return -1;
    ctl_error_init(&f->err);
    tu_buf_init(&f->args);
    tu_buf_init(&f->req);
    ev_state_init(&f->st);
    ev_state_init(&f->st2);
    pthread_mutex_init(&f->spy.mu, NULL);
    atomic_init(&f->spy.calls, 0);
    atomic_init(&f->spy.mode, SPY_NIL);
    atomic_init(&f->store.requests, 0);
    *state = f;
    f->ch = ev_handlers_template;
    f->ch.ctx = &f->st;
    if (ctl_dispatch_init(&f->core, &everything_service, &f->ch, NULL, NULL,
                          &f->err) != 0) {
        fprintf(stderr, "ctl_dispatch_init failed: %s\n", f->err.msg ? f->err.msg : "?");
        return -1;
    }
    f->core_up = true;
    return 0;
}

/* The whole fixture: the core, and the everything unit on TCP with a
 * client. */
static int setup(void **state)
{
    if (setup_core(state) != 0)
        return -1;
    fx *f = *state;
    if (serve_everything(&f->h, &f->st, &f->ev, f->addr, &f->err) != 0)
        return -1;
    if (ctl_client_new(NULL, &f->client, &f->err) != 0) {
        fprintf(stderr, "ctl_client_new failed: %s\n", f->err.msg ? f->err.msg : "?");
        return -1;
    }
    return 0;
}

static int teardown(void **state)
{
    fx *f = *state;
    atomic_store(&f->st.stop, 1);
    atomic_store(&f->st2.stop, 1);
    ctl_reply_destroy(&f->reply);
    ctl_client_destroy(&f->client);
    ctl_server_destroy(&f->ev);
    ctl_server_destroy(&f->ev2);
    ctl_server_destroy(&f->spy_srv);
    ctl_server_destroy(&f->storage);
    ctl_server_destroy(&f->tune);
    if (f->core_up)
        ctl_dispatch_fini(&f->core);
    if (f->storage_core_up)
        ctl_dispatch_fini(&f->storage_core);
    ev_state_fini(&f->st);
    ev_state_fini(&f->st2);
    pthread_mutex_destroy(&f->spy.mu);
    tu_buf_fini(&f->args);
    tu_buf_fini(&f->req);
    ctl_error_fini(&f->err);
    free(f);
    return 0;
}

static void start_second(fx *f)
{
    assert_int_equal(serve_everything(&f->h2, &f->st2, &f->ev2, f->addr2, &f->err), 0);
}

static void start_spy(fx *f, spy_mode mode)
{
    ctl_server_options o;
    ctl_server_options_init(&o);
    o.endpoint = "tcp://127.0.0.1:*";
    atomic_store(&f->spy.mode, mode);
    assert_int_equal(ctl_server_new(&spy_service, &f->spy, &o, &f->spy_srv, &f->err), 0);
    snprintf(f->spy_addr, sizeof f->spy_addr, "%s", ctl_server_endpoint(f->spy_srv));
}

/* The keys of the last args map the spy received. */
static void expect_spy_keys(fx *f, int calls, const char *want)
{
    char got[sizeof f->spy.keys];
    tu_wait_atleast(&f->spy.calls, calls, WAIT_MS);
    assert_int_equal(atomic_load(&f->spy.calls), calls);
    pthread_mutex_lock(&f->spy.mu);
    memcpy(got, f->spy.keys, sizeof got);
    pthread_mutex_unlock(&f->spy.mu);
    assert_string_equal(got, want);
}

/* A remote Protocol error, seen as the client sees it. */
static void expect_remote(const ctl_error *err, int rc, const char *want)
{
    assert_int_equal(rc, CTL_TRANSFER);
    assert_int_equal(err->kind, CTL_TRANSFER);
    assert_int_equal(err->cause, CTL_CAUSE_REMOTE);
    assert_non_null(err->remote_kind);
    assert_string_equal(err->remote_kind, "Protocol");
    expect_substr(err->msg, want);
}

static void expect_bad_reply(const ctl_error *err, int rc, const char *want)
{
    assert_int_equal(rc, CTL_TRANSFER);
    assert_int_equal(err->kind, CTL_TRANSFER);
    assert_int_equal(err->cause, CTL_CAUSE_BAD_REPLY);
    expect_substr(err->msg, want);
}

/* ---- the values of the big round trip -------------------------------- */

static everything_Scalars extreme_scalars(void)
{
    everything_Scalars s;
    scalars_defaults(&s);
    s.flag = true;
    s.small = -123456789;
    s.big = INT64_MIN;
    s.count = UINT32_MAX;
    s.total = UINT64_MAX;
    s.ratio = -6.02214076e23;
    s.name = LIT("n\0ul \xc3\xa9t\xc3\xa9 \xe2\x9c\x93 \xf0\x9f\x99\x82");
    s.blob = LIT("\0\xff\x01\x80\0");
    /* Defaulted fields: some changed, some left at their defaults. */
    s.flag_d = false;
    s.small_d = INT32_MAX;
    s.big_d = INT64_MIN;
    s.count_d = 0;
    s.ratio_d = DBL_MAX;
    s.name_d = LIT("");
    return s;
}

static everything_Scalars zero_scalars(void)
{
    everything_Scalars s;
    memset(&s, 0, sizeof s);
    s.small = INT32_MIN;
    s.big = INT64_MAX;
    s.ratio = -0.0;
    s.ratio_d = DBL_MIN / 4; /* subnormal */
    s.name = LIT("");
    s.blob = LIT("");
    s.name_d = LIT("\0");
    s.blob_d = LIT("");
    return s;
}

/* Everything Containers can hold, with the arrays it points to. */
typedef struct big_containers {
    int64_t ints[5];
    everything_map_str_entry names[3];
    uint64_t maybe_list[2];
    everything_opt_u64 holes[5];
    everything_map_opt_f64_entry sparse[3];
    int32_t row0[2], row2[3];
    everything_list_i32 grid[3];
    everything_Scalars s2;
    everything_map_list_Scalars_entry index[2];
    everything_Stamp when_maybe;
    everything_map_bin_entry empty_map[1];
    everything_Containers c;
} big_containers;

static void big_containers_init(big_containers *b)
{
    static const int64_t ints[] = {INT64_MIN, -1, 0, 1, INT64_MAX};
    memset(b, 0, sizeof *b);
    memcpy(b->ints, ints, sizeof ints);
    b->names[0] = (everything_map_str_entry){.key = LIT("k\xc3\xa9y"), .value = LIT("v\0al")};
    b->names[1] = (everything_map_str_entry){.key = LIT(""), .value = LIT("empty key")};
    b->names[2] = (everything_map_str_entry){.key = LIT("empty value"), .value = LIT("")};
    b->maybe_list[0] = UINT64_MAX;
    b->maybe_list[1] = 0;
    b->holes[0] = (everything_opt_u64){.present = true, .value = 1};
    b->holes[1] = (everything_opt_u64){.present = false};
    b->holes[2] = (everything_opt_u64){.present = true, .value = UINT64_MAX};
    b->holes[3] = (everything_opt_u64){.present = false};
    b->holes[4] = (everything_opt_u64){.present = true, .value = 0};
    b->sparse[0] = (everything_map_opt_f64_entry){.key = LIT("a"), .value = {.present = true, .value = 1.5}};
    b->sparse[1] = (everything_map_opt_f64_entry){.key = LIT("b"), .value = {.present = false}};
    b->sparse[2] = (everything_map_opt_f64_entry){.key = LIT("c"), .value = {.present = true, .value = -0.0}};
    b->row0[0] = 1;
    b->row0[1] = -2;
    b->row2[0] = INT32_MIN;
    b->row2[1] = INT32_MAX;
    b->row2[2] = 0;
    b->grid[0] = (everything_list_i32){.items = b->row0, .count = 2};
    b->grid[1] = (everything_list_i32){.items = NULL, .count = 0};
    b->grid[2] = (everything_list_i32){.items = b->row2, .count = 3};
    b->s2 = zero_scalars();
    b->index[0] = (everything_map_list_Scalars_entry){.key = LIT("k"), .value = {.items = &b->s2, .count = 1}};
    b->index[1] = (everything_map_list_Scalars_entry){.key = LIT("none"), .value = {.items = NULL, .count = 0}};
    b->when_maybe = (everything_Stamp){.secs = INT64_MAX, .nanos = 0};
    b->empty_map[0] = (everything_map_bin_entry){.key = LIT("x"), .value = LIT("\0\1")};

    b->c.ints = (everything_list_i64){.items = b->ints, .count = 5};
    b->c.names = (everything_map_str){.items = b->names, .count = 3};
    b->c.maybe = (everything_opt_str){.present = false};
    b->c.maybe_list = (everything_opt_list_u64){.present = true, .value = {.items = b->maybe_list, .count = 2}};
    b->c.holes = (everything_list_opt_u64){.items = b->holes, .count = 5};
    b->c.sparse = (everything_map_opt_f64){.items = b->sparse, .count = 3};
    b->c.grid = (everything_list_list_i32){.items = b->grid, .count = 3};
    b->c.index = (everything_map_list_Scalars){.items = b->index, .count = 2};
    b->c.when = (everything_Stamp){.secs = -5, .nanos = 999999999u};
    b->c.when_maybe = &b->when_maybe;
    b->c.empty_list = (everything_list_str){.items = NULL, .count = 0};
    b->c.empty_map = (everything_map_bin){.items = b->empty_map, .count = 1};
    b->c.maybe_d = (everything_opt_str){.present = false}; /* absent, not "set" */
    b->c.maybe_null = (everything_opt_u32){.present = true, .value = 7};
}

/* A tree that uses every way a Node refers to Nodes:
 *   root: children [c0 (parent_label "root"), c1 (children [g])],
 *         next -> n1 -> n2, by_name {"x": bx (by_name {"y": by}), "": e} */
typedef struct big_tree {
    everything_Node root, kids[2], g, n1, n2, bx, by, e;
    everything_map_Node_entry root_named[2], bx_named[1];
} big_tree;

static void leaf(everything_Node *n, ctl_str label)
{
    memset(n, 0, sizeof *n);
    n->label = label;
}

static void big_tree_init(big_tree *t)
{
    leaf(&t->g, LIT("g\0nul"));
    leaf(&t->kids[0], LIT("c0"));
    t->kids[0].parent_label = (everything_opt_str){.present = true, .value = LIT("root")};
    leaf(&t->kids[1], LIT("c1"));
    t->kids[1].children = (everything_list_Node){.items = &t->g, .count = 1};
    t->kids[1].parent_label = (everything_opt_str){.present = true, .value = LIT("")};
    leaf(&t->n2, LIT("\xe2\x9c\x93 \xc3\xbcn\xc3\xaf"));
    leaf(&t->n1, LIT("n1"));
    t->n1.next = &t->n2;
    leaf(&t->by, LIT("by"));
    leaf(&t->bx, LIT("bx"));
    t->bx_named[0] = (everything_map_Node_entry){.key = LIT("y"), .value = t->by};
    t->bx.by_name = (everything_map_Node){.items = t->bx_named, .count = 1};
    leaf(&t->e, LIT(""));
    t->root_named[0] = (everything_map_Node_entry){.key = LIT("x"), .value = t->bx};
    t->root_named[1] = (everything_map_Node_entry){.key = LIT(""), .value = t->e};
    leaf(&t->root, LIT("root"));
    t->root.children = (everything_list_Node){.items = t->kids, .count = 2};
    t->root.next = &t->n1;
    t->root.by_name = (everything_map_Node){.items = t->root_named, .count = 2};
}

/* The echo result: the sent containers plus names["tag"], index["scalars"]
 * (`repeat` copies) and maybe = note. */
static void expect_echoed(const everything_Containers *r, const everything_echo_args *a)
{
    const everything_Containers *c = &a->containers;
    assert_int_equal(r->ints.count, c->ints.count);
    for (size_t i = 0; i < c->ints.count; i++)
        assert_true(r->ints.items[i] == c->ints.items[i]);

    assert_int_equal(r->names.count, c->names.count + 1);
    for (size_t i = 0; i < c->names.count; i++) {
        expect_bytes(r->names.items[i].key, c->names.items[i].key);
        expect_bytes(r->names.items[i].value, c->names.items[i].value);
    }
    expect_cstr(r->names.items[c->names.count].key, "tag");
    expect_bytes(r->names.items[c->names.count].value, a->tag);

    assert_int_equal(r->maybe.present, a->note.present);
    if (a->note.present)
        expect_bytes(r->maybe.value, a->note.value);

    assert_int_equal(r->maybe_list.present, c->maybe_list.present);
    if (c->maybe_list.present) {
        assert_int_equal(r->maybe_list.value.count, c->maybe_list.value.count);
        for (size_t i = 0; i < c->maybe_list.value.count; i++)
            assert_true(r->maybe_list.value.items[i] == c->maybe_list.value.items[i]);
    }

    assert_int_equal(r->holes.count, c->holes.count);
    for (size_t i = 0; i < c->holes.count; i++) {
        assert_int_equal(r->holes.items[i].present, c->holes.items[i].present);
        if (c->holes.items[i].present)
            assert_true(r->holes.items[i].value == c->holes.items[i].value);
    }

    assert_int_equal(r->sparse.count, c->sparse.count);
    for (size_t i = 0; i < c->sparse.count; i++) {
        expect_bytes(r->sparse.items[i].key, c->sparse.items[i].key);
        assert_int_equal(r->sparse.items[i].value.present,
                         c->sparse.items[i].value.present);
        if (c->sparse.items[i].value.present)
            expect_f64(r->sparse.items[i].value.value, c->sparse.items[i].value.value);
    }

    assert_int_equal(r->grid.count, c->grid.count);
    for (size_t i = 0; i < c->grid.count; i++) {
        assert_int_equal(r->grid.items[i].count, c->grid.items[i].count);
        for (size_t j = 0; j < c->grid.items[i].count; j++)
            assert_int_equal(r->grid.items[i].items[j], c->grid.items[i].items[j]);
    }

    assert_int_equal(r->index.count, c->index.count + 1);
    for (size_t i = 0; i < c->index.count; i++) {
        expect_bytes(r->index.items[i].key, c->index.items[i].key);
        assert_int_equal(r->index.items[i].value.count, c->index.items[i].value.count);
        for (size_t j = 0; j < c->index.items[i].value.count; j++)
            expect_scalars(&r->index.items[i].value.items[j],
                           &c->index.items[i].value.items[j]);
    }
    expect_cstr(r->index.items[c->index.count].key, "scalars");
    assert_int_equal(r->index.items[c->index.count].value.count, a->repeat);
    for (size_t j = 0; j < a->repeat; j++)
        expect_scalars(&r->index.items[c->index.count].value.items[j], &a->scalars);

    assert_true(r->when.secs == c->when.secs);
    assert_int_equal(r->when.nanos, c->when.nanos);
    if (c->when_maybe == NULL) {
        assert_null(r->when_maybe);
    } else {
        assert_non_null(r->when_maybe);
        assert_true(r->when_maybe->secs == c->when_maybe->secs);
        assert_int_equal(r->when_maybe->nanos, c->when_maybe->nanos);
    }

    assert_int_equal(r->empty_list.count, c->empty_list.count);
    for (size_t i = 0; i < c->empty_list.count; i++)
        expect_bytes(r->empty_list.items[i], c->empty_list.items[i]);
    assert_int_equal(r->empty_map.count, c->empty_map.count);
    for (size_t i = 0; i < c->empty_map.count; i++) {
        expect_bytes(r->empty_map.items[i].key, c->empty_map.items[i].key);
        expect_bytes(r->empty_map.items[i].value, c->empty_map.items[i].value);
    }
    assert_int_equal(r->maybe_d.present, c->maybe_d.present);
    if (c->maybe_d.present)
        expect_bytes(r->maybe_d.value, c->maybe_d.value);
    assert_int_equal(r->maybe_null.present, c->maybe_null.present);
    if (c->maybe_null.present)
        assert_int_equal(r->maybe_null.value, c->maybe_null.value);
}

/* ---- round trips through the typed stubs ----------------------------- */

/* <svc>_<Record>_init gives a record its IDL defaults, so a client that
 * builds one sends the defaults, not zeros. */
static void test_record_init_sets_defaults(void **state)
{
    (void)state;
    everything_Scalars s;
    memset(&s, 0xa5, sizeof s);
    everything_Scalars_init(&s);
    assert_false(s.flag);
    assert_int_equal(s.total, 0);
    assert_int_equal(s.name.len, 0);
    assert_true(s.flag_d);
    assert_true(s.small_d == INT32_MIN);
    assert_true(s.big_d == INT64_MAX);
    assert_true(s.count_d == UINT32_MAX);
    assert_true(s.total_d == UINT64_MAX);
    assert_int_equal(s.neg_hex, -16);
    assert_true(s.ratio_d == -1.5e-3);
    assert_true(s.ratio_int == 2.0);
    assert_int_equal(s.blob_d.len, 3);
    assert_memory_equal(s.blob_d.ptr, "raw", 3);

    everything_Containers c;
    memset(&c, 0xa5, sizeof c);
    everything_Containers_init(&c);
    assert_int_equal(c.ints.count, 0);
    assert_false(c.maybe.present);
    assert_null(c.when_maybe);
    assert_true(c.maybe_d.present);
    assert_int_equal(c.maybe_d.value.len, 3);
    assert_memory_equal(c.maybe_d.value.ptr, "set", 3);
    assert_false(c.maybe_null.present);
}

static void test_echo_every_type(void **state)
{
    fx *f = *state;
    big_containers b;
    big_tree t;
    everything_echo_args a;
    everything_Containers r;
    const everything_Node *node = NULL;
    ctl_reply *tree_reply = NULL;
    everything_find_args fa;

    big_containers_init(&b);
    big_tree_init(&t);
    everything_echo_args_init(&a);
    a.scalars = extreme_scalars();
    a.containers = b.c;
    a.tree = t.root;
    a.note = (everything_opt_str){.present = true, .value = LIT("a note \xe2\x80\x94 with \0 inside")};
    a.repeat = 3;
    a.tag = LIT("t\xc3\xa4g");

    assert_int_equal(everything_echo(f->client, f->addr, &a, CALL_MS, &r,
                                     &f->reply, &f->err), 0);
    assert_non_null(f->reply);
    expect_echoed(&r, &a);

    /* The tree made the trip to the unit; find sends the unit's copy back. */
    everything_find_args_init(&fa);
    fa.name = LIT("tree");
    assert_int_equal(everything_find(f->client, f->addr, &fa, CALL_MS, &node,
                                     &tree_reply, &f->err), 0);
    expect_node(node, &t.root);
    /* Views stay valid while their reply lives, independently of others. */
    ctl_reply_destroy(&f->reply);
    expect_node(node, &t.root);
    ctl_reply_destroy(&tree_reply);
    assert_null(tree_reply);
}

static void test_echo_empty_and_absent(void **state)
{
    fx *f = *state;
    everything_echo_args a;
    everything_Containers r;
    everything_find_args fa;
    const everything_Node *node = NULL;
    ctl_reply *tree_reply = NULL;

    everything_echo_args_init(&a); /* empty lists and maps, optionals absent */
    a.scalars = zero_scalars();
    a.containers.maybe_d = (everything_opt_str){.present = false};
    a.tree.label = LIT("");
    a.tag = LIT("");
    assert_int_equal(everything_echo(f->client, f->addr, &a, CALL_MS, &r,
                                     &f->reply, &f->err), 0);
    expect_echoed(&r, &a);
    assert_int_equal(r.ints.count, 0);
    assert_non_null(r.ints.items); /* empty, not missing */
    assert_false(r.maybe.present);
    assert_false(r.maybe_list.present);
    assert_null(r.when_maybe);
    assert_false(r.maybe_null.present);
    /* repeat was left at its default: the unit applied 1. */
    assert_int_equal(r.index.items[0].value.count, 1);

    everything_find_args_init(&fa);
    fa.name = LIT("tree");
    assert_int_equal(everything_find(f->client, f->addr, &fa, CALL_MS, &node,
                                     &tree_reply, &f->err), 0);
    expect_node(node, &a.tree);
    ctl_reply_destroy(&tree_reply);
}

static void test_find_absent_and_present(void **state)
{
    fx *f = *state;
    everything_find_args fa;
    static const everything_Node untouched;
    const everything_Node *node = &untouched; /* must be overwritten */

    everything_find_args_init(&fa);
    fa.name = LIT("nobody");
    assert_int_equal(everything_find(f->client, f->addr, &fa, CALL_MS, &node,
                                     &f->reply, &f->err), 0);
    assert_null(node); /* nil: no such node */
    ctl_reply_destroy(&f->reply);

    fa.name = LIT("tree"); /* no echo yet: also absent */
    assert_int_equal(everything_find(f->client, f->addr, &fa, CALL_MS, &node,
                                     &f->reply, &f->err), 0);
    assert_null(node);
    ctl_reply_destroy(&f->reply);

    fa.name = LIT("leaf");
    assert_int_equal(everything_find(f->client, f->addr, &fa, CALL_MS, &node,
                                     &f->reply, &f->err), 0);
    assert_non_null(node);
    expect_bytes(node->label, LIT("le\0af"));
    assert_true(node->parent_label.present);
    expect_cstr(node->parent_label.value, "");
    assert_int_equal(node->children.count, 0);
    assert_int_equal(node->by_name.count, 0);
    assert_null(node->next);
    ctl_reply_destroy(&f->reply);

    /* A result may be ignored: the reply is then freed by the stub. */
    assert_int_equal(everything_find(f->client, f->addr, &fa, CALL_MS, NULL,
                                     NULL, &f->err), 0);
}

static void test_scalar_and_container_results(void **state)
{
    fx *f = *state;
    everything_size_args sa;
    everything_list_args la;
    everything_counters_args ca;
    everything_list_Stamp stamps;
    everything_map_u64 counters;
    everything_Stamp from = {.secs = -1, .nanos = 123};
    uint64_t size = 0;

    everything_size_args_init(&sa);
    sa.data = LIT("\0\1\2\3\4\5\6");
    assert_int_equal(everything_size(f->client, f->addr, &sa, CALL_MS, &size, &f->err), 0);
    assert_int_equal(size, 7);
    sa.data = LIT("");
    assert_int_equal(everything_size(f->client, f->addr, &sa, CALL_MS, &size, &f->err), 0);
    assert_int_equal(size, 0);

    everything_list_args_init(&la); /* from absent */
    assert_int_equal(everything_list(f->client, f->addr, &la, CALL_MS, &stamps,
                                     &f->reply, &f->err), 0);
    assert_int_equal(stamps.count, 2);
    assert_true(stamps.items[0].secs == INT64_MIN);
    assert_int_equal(stamps.items[0].nanos, 0);
    assert_true(stamps.items[1].secs == INT64_MAX);
    assert_int_equal(stamps.items[1].nanos, 999999999);
    ctl_reply_destroy(&f->reply);
    la.from = &from;
    assert_int_equal(everything_list(f->client, f->addr, &la, CALL_MS, &stamps,
                                     &f->reply, &f->err), 0);
    assert_int_equal(stamps.count, 2);
    assert_true(stamps.items[0].secs == -1);
    assert_int_equal(stamps.items[0].nanos, 123);
    assert_true(stamps.items[1].secs == 0);
    ctl_reply_destroy(&f->reply);

    assert_int_equal(everything_ping(f->client, f->addr, CALL_MS, &f->err), 0);
    everything_counters_args_init(&ca);
    ca.prefix = LIT("p\xc3\xa9.");
    assert_int_equal(everything_counters(f->client, f->addr, &ca, CALL_MS,
                                         &counters, &f->reply, &f->err), 0);
    assert_int_equal(counters.count, 2);
    expect_bytes(counters.items[0].key, LIT("p\xc3\xa9.pings"));
    assert_int_equal(counters.items[0].value, 1);
    expect_bytes(counters.items[1].key, LIT("p\xc3\xa9.max"));
    assert_true(counters.items[1].value == UINT64_MAX);
}

/* Args left at their defaults are applied by the unit. */
static void test_defaults_applied_by_unit(void **state)
{
    fx *f = *state;
    everything_matrix_args ma;
    everything_counters_args ca;
    everything_forget_args fa;
    everything_list_list_f64 m;
    everything_map_u64 counters;
    const ctl_str names[] = {LIT("a")};

    everything_matrix_args_init(&ma);
    assert_int_equal(ma.cols, 16);
    ma.rows = 2;
    assert_int_equal(everything_matrix(f->client, f->addr, &ma, CALL_MS, &m,
                                       &f->reply, &f->err), 0);
    assert_int_equal(m.count, 2);
    for (size_t r = 0; r < 2; r++) {
        assert_int_equal(m.items[r].count, 16);
        for (size_t c = 0; c < 16; c++)
            expect_f64(m.items[r].items[c], (double)r * 1000.0 + (double)c + 0.25);
    }
    ctl_reply_destroy(&f->reply);

    ma.rows = 0; /* an empty result */
    assert_int_equal(everything_matrix(f->client, f->addr, &ma, CALL_MS, &m,
                                       &f->reply, &f->err), 0);
    assert_int_equal(m.count, 0);
    ctl_reply_destroy(&f->reply);

    everything_counters_args_init(&ca); /* prefix "" */
    assert_int_equal(everything_counters(f->client, f->addr, &ca, CALL_MS,
                                         &counters, &f->reply, &f->err), 0);
    assert_int_equal(counters.count, 2);
    expect_cstr(counters.items[0].key, "pings");
    expect_cstr(counters.items[1].key, "max");
    ctl_reply_destroy(&f->reply);

    everything_forget_args_init(&fa); /* hard = false */
    fa.names = (everything_list_str){.items = names, .count = 1};
    assert_int_equal(everything_forget(f->client, f->addr, &fa, &f->err), 0);
    assert_int_equal(tu_wait_atleast(&f->st.forgets, 1, WAIT_MS), 1);
    pthread_mutex_lock(&f->st.mu);
    assert_false(f->st.forgot_hard);
    assert_string_equal(f->st.forgot, "a");
    pthread_mutex_unlock(&f->st.mu);
}

/* Args equal to their default are not sent: the spy sees the raw map. */
static void test_default_args_not_sent(void **state)
{
    fx *f = *state;
    everything_matrix_args ma;
    everything_counters_args ca;
    everything_list_args la;
    everything_forget_args fa;
    everything_echo_args ea;
    everything_Stamp from = EVERYTHING_STAMP_INIT; /* {secs 0, nanos 0} */
    const ctl_str names[] = {LIT("n")};
    int calls = 0;

    start_spy(f, SPY_NIL);

    everything_matrix_args_init(&ma);
    ma.rows = 2;
    assert_int_equal(everything_matrix(f->client, f->spy_addr, &ma, CALL_MS,
                                       NULL, NULL, &f->err), 0);
    expect_spy_keys(f, ++calls, "rows");
    ma.cols = 17;
    assert_int_equal(everything_matrix(f->client, f->spy_addr, &ma, CALL_MS,
                                       NULL, NULL, &f->err), 0);
    expect_spy_keys(f, ++calls, "rows,cols");
    ma.rows = 0; /* required args are sent even when zero */
    ma.cols = 16;
    assert_int_equal(everything_matrix(f->client, f->spy_addr, &ma, CALL_MS,
                                       NULL, NULL, &f->err), 0);
    expect_spy_keys(f, ++calls, "rows");

    everything_counters_args_init(&ca);
    assert_int_equal(everything_counters(f->client, f->spy_addr, &ca, CALL_MS,
                                         NULL, NULL, &f->err), 0);
    expect_spy_keys(f, ++calls, "");
    ca.prefix = LIT("\0"); /* not "" although its first byte is NUL */
    assert_int_equal(everything_counters(f->client, f->spy_addr, &ca, CALL_MS,
                                         NULL, NULL, &f->err), 0);
    expect_spy_keys(f, ++calls, "prefix");

    everything_list_args_init(&la);
    assert_int_equal(everything_list(f->client, f->spy_addr, &la, CALL_MS,
                                     NULL, NULL, &f->err), 0);
    expect_spy_keys(f, ++calls, "");
    la.from = &from; /* a present optional record is sent, even all zero */
    assert_int_equal(everything_list(f->client, f->spy_addr, &la, CALL_MS,
                                     NULL, NULL, &f->err), 0);
    expect_spy_keys(f, ++calls, "from");

    everything_echo_args_init(&ea);
    assert_int_equal(everything_echo(f->client, f->spy_addr, &ea, CALL_MS,
                                     NULL, NULL, &f->err), 0);
    expect_spy_keys(f, ++calls, "scalars,containers,tree,tag");
    ea.repeat = 2;
    ea.note = (everything_opt_str){.present = true, .value = LIT("")};
    assert_int_equal(everything_echo(f->client, f->spy_addr, &ea, CALL_MS,
                                     NULL, NULL, &f->err), 0);
    expect_spy_keys(f, ++calls, "scalars,containers,tree,note,repeat,tag");

    everything_forget_args_init(&fa);
    fa.names = (everything_list_str){.items = names, .count = 1};
    assert_int_equal(everything_forget(f->client, f->spy_addr, &fa, &f->err), 0);
    expect_spy_keys(f, ++calls, "names");
    fa.hard = true;
    assert_int_equal(everything_forget(f->client, f->spy_addr, &fa, &f->err), 0);
    expect_spy_keys(f, ++calls, "names,hard");

    assert_int_equal(everything_ping(f->client, f->spy_addr, CALL_MS, &f->err), 0);
    expect_spy_keys(f, ++calls, "");
}

/* Every kind of default (defaults.idl): an arg at its default is left out
 * and the unit applies it; any other value, however close, is sent. */
static const defaults_Knob knob3 = {.turns = 3};
static const defaults_map_Knob_entry one_knob[] = {
    {.key = {"a", 1}, .value = {.turns = 3}}};
static const uint32_t one_id[] = {0};

static void tune_ratio(defaults_tune_args *a) { a->ratio = 0.5; }
static void tune_ratio_neg_zero(defaults_tune_args *a) { a->ratio = -0.0; }
static void tune_label_after_nul(defaults_tune_args *a) { a->label = LIT("x\0z"); }
static void tune_label_prefix(defaults_tune_args *a) { a->label = LIT("x"); }
static void tune_floor(defaults_tune_args *a) { a->floor = INT64_MIN + 1; }
static void tune_on(defaults_tune_args *a) { a->on = false; }
static void tune_limit_absent(defaults_tune_args *a) { a->limit.present = false; }
static void tune_limit_other(defaults_tune_args *a) { a->limit.value = 6; }
static void tune_raw(defaults_tune_args *a) { a->raw = LIT("rax"); }
static void tune_ids(defaults_tune_args *a) { a->ids = (defaults_list_u32){.items = one_id, .count = 1}; }
static void tune_note(defaults_tune_args *a) { a->note = (defaults_opt_str){.present = true, .value = LIT("")}; }
static void tune_knobs(defaults_tune_args *a) { a->knobs = (defaults_map_Knob){.items = one_knob, .count = 1}; }
static void tune_empty_absent(defaults_tune_args *a) { a->empty.present = false; }
static void tune_empty_other(defaults_tune_args *a) { a->empty.value = LIT("\0"); }
static void tune_zero_neg(defaults_tune_args *a) { a->zero.value = -0.0; }
static void tune_zero_absent(defaults_tune_args *a) { a->zero.present = false; }
static void tune_knob(defaults_tune_args *a) { a->knob = &knob3; }

static void test_every_default_kind(void **state)
{
    fx *f = *state;
    static const struct {
        void (*set)(defaults_tune_args *);
        const char *sent; /* the one arg sent */
        unsigned bit;     /* the one arg the unit does not see at its default */
    } cases[] = {
        {tune_ratio, "ratio", 0},
        {tune_ratio_neg_zero, "ratio", 0},
        {tune_label_after_nul, "label", 1},
        {tune_label_prefix, "label", 1},
        {tune_floor, "floor", 2},
        {tune_on, "on", 3},
        {tune_limit_absent, "limit", 4},
        {tune_limit_other, "limit", 4},
        {tune_raw, "raw", 5},
        {tune_ids, "ids", 6},
        {tune_note, "note", 7},
        {tune_knobs, "knobs", 8},
        {tune_empty_absent, "empty", 9},
        {tune_empty_other, "empty", 9},
        {tune_zero_neg, "zero", 10},
        {tune_zero_absent, "zero", 10},
        {tune_knob, "knob", 11},
    };
    ctl_server_options o;
    defaults_tune_args a;
    uint64_t mask = 0;
    int calls = 0;

    start_spy(f, SPY_NIL);
    f->dh = (defaults_handlers){.ctx = NULL, .on_tune = on_tune};
    ctl_server_options_init(&o);
    o.endpoint = "tcp://127.0.0.1:*";
    assert_int_equal(defaults_serve(&f->dh, &o, &f->tune, &f->err), 0);
    snprintf(f->tune_addr, sizeof f->tune_addr, "%s", ctl_server_endpoint(f->tune));

    defaults_tune_args_init(&a);
    assert_int_equal(defaults_tune(f->client, f->spy_addr, &a, CALL_MS, NULL, &f->err), 0);
    expect_spy_keys(f, ++calls, "");
    assert_int_equal(defaults_tune(f->client, f->tune_addr, &a, CALL_MS, &mask, &f->err), 0);
    assert_int_equal(mask, TUNE_ALL);

    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        defaults_tune_args_init(&a);
        cases[i].set(&a);
        assert_int_equal(defaults_tune(f->client, f->spy_addr, &a, CALL_MS, NULL,
                                       &f->err), 0);
        expect_spy_keys(f, ++calls, cases[i].sent);
        assert_int_equal(defaults_tune(f->client, f->tune_addr, &a, CALL_MS, &mask,
                                       &f->err), 0);
        if (mask != (TUNE_ALL & ~(UINT64_C(1) << cases[i].bit)))
            fail_msg("case %zu (%s): the unit saw mask %#llx", i, cases[i].sent,
                     (unsigned long long)mask);
    }
}

/* Every error kind a handler raises arrives typed. */
static void test_errors_typed(void **state)
{
    fx *f = *state;
    everything_echo_args a;
    everything_matrix_args ma;
    everything_find_args fa;
    everything_Containers r;
    everything_list_list_f64 m;
    const everything_Node *node;
    int rc;

    everything_echo_args_init(&a);
    a.tag = LIT("full");
    rc = everything_echo(f->client, f->addr, &a, CALL_MS, &r, &f->reply, &f->err);
    assert_int_equal(rc, CTL_UNIT_FULL);
    assert_int_equal(f->err.kind, CTL_UNIT_FULL);
    assert_null(f->reply);
    expect_substr(f->err.msg, "no room for 1 copies");

    a.tag = LIT("busy");
    rc = everything_echo(f->client, f->addr, &a, CALL_MS, &r, &f->reply, &f->err);
    assert_int_equal(rc, CTL_BUSY);
    assert_int_equal(f->err.kind, CTL_BUSY);
    assert_string_equal(f->err.reason, "draining");
    expect_substr(f->err.msg, "the unit is draining");

    a.tag = LIT("missing");
    rc = everything_echo(f->client, f->addr, &a, CALL_MS, &r, &f->reply, &f->err);
    assert_int_equal(rc, CTL_MISSING);
    assert_int_equal(f->err.kind, CTL_MISSING);
    assert_null(f->err.reason);
    assert_int_equal(f->err.blob_count, 2);
    expect_bytes(f->err.blobs[0], LIT("b1"));
    expect_bytes(f->err.blobs[1], LIT("b\0\xc3\xa9"));
    expect_substr(f->err.msg, "2 blobs are gone");

    a.tag = LIT("protocol");
    rc = everything_echo(f->client, f->addr, &a, CALL_MS, &r, &f->reply, &f->err);
    expect_remote(&f->err, rc, "echo refused tag 'protocol'");
    assert_int_equal(f->err.blob_count, 0);
    assert_null(f->err.reason);

    everything_matrix_args_init(&ma);
    ma.rows = 5000;
    rc = everything_matrix(f->client, f->addr, &ma, CALL_MS, &m, &f->reply, &f->err);
    assert_int_equal(rc, CTL_BUSY);
    assert_string_equal(f->err.reason, "too-big");

    everything_find_args_init(&fa);
    fa.name = LIT("gone");
    rc = everything_find(f->client, f->addr, &fa, CALL_MS, &node, &f->reply, &f->err);
    assert_int_equal(rc, CTL_MISSING);
    assert_int_equal(f->err.blob_count, 1);
    expect_cstr(f->err.blobs[0], "gone");
    assert_null(f->reply);

    /* After all that the unit still answers. */
    assert_int_equal(everything_ping(f->client, f->addr, CALL_MS, &f->err), 0);
    assert_int_equal(atomic_load(&f->st.echoes), 4);
}

static void test_stub_invalid_use(void **state)
{
    fx *f = *state;
    everything_matrix_args ma;
    everything_list_list_f64 m;
    everything_handlers h = ev_handlers_template;
    ctl_server *s = (ctl_server *)(uintptr_t)1; /* must come back NULL */
    int rc;

    everything_matrix_args_init(&ma);
    /* A result with views needs somewhere to keep its reply. */
    rc = everything_matrix(f->client, f->addr, &ma, CALL_MS, &m, NULL, &f->err);
    assert_int_equal(rc, CTL_INVALID);
    expect_substr(f->err.msg, "matrix at ");
    rc = everything_matrix(f->client, f->addr, NULL, CALL_MS, &m, &f->reply, &f->err);
    assert_int_equal(rc, CTL_INVALID);
    expect_substr(f->err.msg, "args is NULL");
    assert_null(f->reply);
    rc = everything_forget(f->client, f->addr, NULL, &f->err);
    assert_int_equal(rc, CTL_INVALID);

    /* A str, bin or list whose pointer is NULL but whose length is not:
     * refused naming the arg, nothing sent (never a copy from NULL). */
    everything_find_args fa = EVERYTHING_FIND_ARGS_INIT;
    fa.name = (ctl_str){NULL, 5};
    const everything_Node *node = NULL;
    rc = everything_find(f->client, f->addr, &fa, CALL_MS, &node, &f->reply, &f->err);
    assert_int_equal(rc, CTL_INVALID);
    expect_substr(f->err.msg, "find at ");
    expect_substr(f->err.msg, "arg name: its ptr is NULL but its len is not 0; nothing was sent");
    everything_size_args sa = {.data = {NULL, 7}};
    uint64_t size = 0;
    rc = everything_size(f->client, f->addr, &sa, CALL_MS, &size, &f->err);
    assert_int_equal(rc, CTL_INVALID);
    expect_substr(f->err.msg, "arg data: its ptr is NULL");
    ctl_str names[2] = {{"a", 1}, {NULL, 3}};
    everything_forget_args ga = EVERYTHING_FORGET_ARGS_INIT;
    ga.names.items = NULL;
    ga.names.count = 2;
    rc = everything_forget(f->client, f->addr, &ga, &f->err);
    assert_int_equal(rc, CTL_INVALID);
    expect_substr(f->err.msg, "arg names: its items are NULL but its count is not 0");
    ga.names.items = names;
    rc = everything_forget(f->client, f->addr, &ga, &f->err);
    assert_int_equal(rc, CTL_INVALID);
    expect_substr(f->err.msg, "arg names[1]: its ptr is NULL but its len is not 0");
    /* In a fan-out, the target whose args are bad fails alone. */
    const char *two[2] = {f->addr, f->addr};
    everything_size_args sas[2] = {{.data = {"ok", 2}}, {.data = {NULL, 1}}};
    everything_size_outcome so[2];
    assert_int_equal(everything_size_many(f->client, two, sas, 2, CALL_MS, so), 1);
    assert_int_equal(so[0].error.kind, CTL_OK);
    assert_int_equal(so[0].result, 2);
    assert_int_equal(so[1].error.kind, CTL_INVALID);
    expect_substr(so[1].error.msg, "arg data: its ptr is NULL");
    everything_size_outcomes_fini(so, 2);

    h.on_poke = NULL;
    rc = everything_serve(&h, NULL, &s, &f->err);
    assert_int_equal(rc, CTL_INVALID);
    assert_null(s);
    expect_substr(f->err.msg, "on_poke");
    rc = everything_serve(NULL, NULL, &s, &f->err);
    assert_int_equal(rc, CTL_INVALID);
    assert_int_equal(atomic_load(&f->st.matrices), 0);
}

/* ---- fan-out ---------------------------------------------------------- */

static void test_many_with_dead_unit(void **state)
{
    fx *f = *state;
    char dead[CTL_ENDPOINT_MAX];
    const char *addrs[3];
    everything_matrix_args ma[3];
    everything_matrix_outcome out[3];
    everything_ping_outcome pings[3];
    int64_t t0;
    int rc;

    start_second(f);
    tu_dead_address(dead, sizeof dead);
    addrs[0] = f->addr;
    addrs[1] = dead;
    addrs[2] = f->addr2;
    for (int i = 0; i < 3; i++) {
        everything_matrix_args_init(&ma[i]);
        ma[i].rows = (uint32_t)i + 1;
        ma[i].cols = (uint32_t)i + 2;
    }
    t0 = tu_now_ms();
    rc = everything_matrix_many(f->client, addrs, ma, 3, 1000, out);
    assert_true(tu_now_ms() - t0 < 5000);
    assert_int_equal(rc, 1);
    for (int i = 0; i < 3; i += 2) {
        assert_int_equal(out[i].error.kind, CTL_OK);
        assert_non_null(out[i].reply);
        assert_int_equal(out[i].result.count, (size_t)i + 1);
        for (size_t r = 0; r < out[i].result.count; r++) {
            assert_int_equal(out[i].result.items[r].count, (size_t)i + 2);
            expect_f64(out[i].result.items[r].items[1], (double)r * 1000.0 + 1.25);
        }
    }
    assert_int_equal(out[1].error.kind, CTL_TRANSFER);
    assert_int_equal(out[1].error.cause, CTL_CAUSE_REFUSED);
    assert_null(out[1].reply);
    expect_substr(out[1].error.msg, dead);
    everything_matrix_outcomes_fini(out, 3);
    for (int i = 0; i < 3; i++) {
        assert_null(out[i].reply);
        assert_int_equal(out[i].error.kind, CTL_OK);
    }
    assert_int_equal(atomic_load(&f->st.matrices), 1);
    assert_int_equal(atomic_load(&f->st2.matrices), 1);

    /* An op without args or result fans out too. */
    rc = everything_ping_many(f->client, addrs, 3, 1000, pings);
    assert_int_equal(rc, 1);
    assert_int_equal(pings[0].error.kind, CTL_OK);
    assert_int_equal(pings[1].error.kind, CTL_TRANSFER);
    assert_int_equal(pings[2].error.kind, CTL_OK);
    assert_null(pings[0].reply);
    everything_ping_outcomes_fini(pings, 3);
    assert_int_equal(atomic_load(&f->st.pings), 1);
    assert_int_equal(atomic_load(&f->st2.pings), 1);
}

static void test_many_with_slow_unit(void **state)
{
    fx *f = *state;
    const char *addrs[3];
    everything_matrix_args ma[3];
    everything_matrix_outcome out[3];
    int64_t t0, took;
    int rc;

    start_second(f);
    atomic_store(&f->st2.slow_ms, 4000);
    addrs[0] = f->addr;
    addrs[1] = f->addr2;
    addrs[2] = f->addr; /* the same unit twice: two separate requests */
    for (int i = 0; i < 3; i++) {
        everything_matrix_args_init(&ma[i]);
        ma[i].rows = 1;
        ma[i].cols = (uint32_t)i + 1;
    }
    t0 = tu_now_ms();
    rc = everything_matrix_many(f->client, addrs, ma, 3, 800, out);
    took = tu_now_ms() - t0;
    assert_true(took >= 700 && took < 3500);
    assert_int_equal(rc, 1);
    assert_int_equal(out[0].error.kind, CTL_OK);
    assert_int_equal(out[0].result.items[0].count, 1);
    assert_int_equal(out[2].error.kind, CTL_OK);
    assert_int_equal(out[2].result.items[0].count, 3);
    assert_int_equal(out[1].error.kind, CTL_TRANSFER);
    assert_int_equal(out[1].error.cause, CTL_CAUSE_TIMEOUT);
    assert_null(out[1].reply);
    everything_matrix_outcomes_fini(out, 3);
    atomic_store(&f->st2.stop, 1);
}

/* Each outcome carries its own typed error, and its own result views. */
static void test_many_typed_outcomes(void **state)
{
    fx *f = *state;
    const char *addrs[4];
    everything_echo_args ea[4];
    everything_echo_outcome eo[4];
    everything_find_args fa[3];
    everything_find_outcome fo[3];
    everything_size_args sa[2];
    everything_size_outcome so[2];
    int rc;

    start_second(f);
    start_spy(f, SPY_NODE_BAD_LABEL);
    for (int i = 0; i < 4; i++) {
        everything_echo_args_init(&ea[i]);
        addrs[i] = i % 2 ? f->addr2 : f->addr;
    }
    ea[0].tag = LIT("busy");
    ea[1].tag = LIT("missing");
    ea[2].tag = LIT("ok");
    ea[2].repeat = 2;
    ea[3].tag = LIT("protocol");
    rc = everything_echo_many(f->client, addrs, ea, 4, CALL_MS, eo);
    assert_int_equal(rc, 3);
    assert_int_equal(eo[0].error.kind, CTL_BUSY);
    assert_string_equal(eo[0].error.reason, "draining");
    assert_int_equal(eo[1].error.kind, CTL_MISSING);
    assert_int_equal(eo[1].error.blob_count, 2);
    expect_cstr(eo[1].error.blobs[0], "b1");
    assert_int_equal(eo[2].error.kind, CTL_OK);
    expect_echoed(&eo[2].result, &ea[2]);
    assert_int_equal(eo[3].error.kind, CTL_TRANSFER);
    assert_int_equal(eo[3].error.cause, CTL_CAUSE_REMOTE);
    expect_substr(eo[3].error.msg, "echo refused tag 'protocol'");
    everything_echo_outcomes_fini(eo, 4);

    /* find: absent, present, and a peer whose answer does not decode. */
    addrs[0] = f->addr;
    addrs[1] = f->addr2;
    addrs[2] = f->spy_addr;
    for (int i = 0; i < 3; i++)
        everything_find_args_init(&fa[i]);
    fa[0].name = LIT("nobody");
    fa[1].name = LIT("leaf");
    fa[2].name = LIT("any");
    rc = everything_find_many(f->client, addrs, fa, 3, CALL_MS, fo);
    assert_int_equal(rc, 1);
    assert_int_equal(fo[0].error.kind, CTL_OK);
    assert_null(fo[0].result);
    assert_int_equal(fo[1].error.kind, CTL_OK);
    assert_non_null(fo[1].result);
    expect_bytes(fo[1].result->label, LIT("le\0af"));
    assert_non_null(fo[1].reply);
    assert_int_equal(fo[2].error.kind, CTL_TRANSFER);
    assert_int_equal(fo[2].error.cause, CTL_CAUSE_BAD_REPLY);
    expect_substr(fo[2].error.msg, "result.children[1].label: expected str, got int");
    assert_null(fo[2].reply);
    everything_find_outcomes_fini(fo, 3);

    /* A result without views keeps no reply. */
    for (int i = 0; i < 2; i++) {
        everything_size_args_init(&sa[i]);
        sa[i].data = i ? LIT("four") : LIT("");
    }
    rc = everything_size_many(f->client, addrs, sa, 2, CALL_MS, so);
    assert_int_equal(rc, 0);
    assert_int_equal(so[0].result, 0);
    assert_int_equal(so[1].result, 4);
    assert_null(so[0].reply);
    assert_null(so[1].reply);
    everything_size_outcomes_fini(so, 2);

    /* Nothing to do is fine. */
    assert_int_equal(everything_size_many(f->client, addrs, sa, 0, CALL_MS, so), 0);
}

/* ---- notify ------------------------------------------------------------ */

static void test_notify_ops(void **state)
{
    fx *f = *state;
    everything_forget_args fa;
    const ctl_str names[] = {LIT("a"), LIT("\xc3\xa9"), LIT("")};
    const ctl_str failing[] = {LIT("fail")};
    ctl_server_stats before, after;

    ctl_server_stats_get(f->ev, &before);
    everything_forget_args_init(&fa);
    fa.names = (everything_list_str){.items = names, .count = 3};
    fa.hard = true;
    assert_int_equal(everything_forget(f->client, f->addr, &fa, &f->err), 0);
    assert_int_equal(everything_poke(f->client, f->addr, &f->err), 0);
    assert_int_equal(everything_poke(f->client, f->addr, &f->err), 0);
    fa.names = (everything_list_str){.items = failing, .count = 1};
    fa.hard = false;
    assert_int_equal(everything_forget(f->client, f->addr, &fa, &f->err), 0);
    /* A call after notifies from this thread reaches the unit after them. */
    assert_int_equal(everything_ping(f->client, f->addr, CALL_MS, &f->err), 0);
    assert_int_equal(atomic_load(&f->st.forgets), 2);
    assert_int_equal(atomic_load(&f->st.pokes), 2);
    pthread_mutex_lock(&f->st.mu);
    assert_string_equal(f->st.forgot, "fail");
    assert_false(f->st.forgot_hard);
    pthread_mutex_unlock(&f->st.mu);

    /* Only the ping was answered; the failing forget was not either. */
    tu_server_stats_wait(f->ev, &after, before.replies + 1, WAIT_MS);
    tu_sleep_ms(100);
    ctl_server_stats_get(f->ev, &after);
    assert_int_equal(after.requests - before.requests, 5);
    assert_int_equal(after.replies - before.replies, 1);

    /* The first forget's names arrived intact. */
    fa.names = (everything_list_str){.items = names, .count = 3};
    fa.hard = true;
    assert_int_equal(everything_forget(f->client, f->addr, &fa, &f->err), 0);
    assert_int_equal(tu_wait_atleast(&f->st.forgets, 3, WAIT_MS), 3);
    pthread_mutex_lock(&f->st.mu);
    assert_string_equal(f->st.forgot, "a|\xc3\xa9|");
    assert_int_equal(f->st.forgot_count, 3);
    assert_true(f->st.forgot_hard);
    pthread_mutex_unlock(&f->st.mu);
}

/* ---- bad input: hand-packed requests through the dispatch core --------- */

/* Where echo's otherwise valid args are broken. */
typedef enum fault {
    F_NONE,
    F_CHILD_LABEL_INT,
    F_CHILD_NO_LABEL,
    F_GRID_STR,
    F_SPARSE_STR,
    F_INDEX_COUNT_NEG,
    F_SMALL_RANGE,
    F_NAMES_INT_KEY,
    F_WHEN_TWICE,
    F_BLOB_STR,
    F_NEXT_NOT_MAP,
    F_HOLES_BAD,
    F_TAG_TWICE,
    F_UNKNOWN_ARG,
    F_NO_TAG,
    F_NONSTR_KEY,
    F_TREE_STR,
    F_NOTE_INT,
    F_WHEN_MAYBE_BAD,
    F_SCALARS_NO_NAME,
    F_LONG_PATH,
    /* Hostile values: out of range, odd keys, deep paths. */
    F_SPARSE_ODD_KEY,
    F_INTS_HUGE,
    F_NANOS_NEG,
    F_FLAG_INT,
    F_REPEAT_BIG,
    F_DEEP_NEXT,
    F_BY_NAME_INT_KEY,
    F_INDEX_NOT_LIST,
    F_GRID_NEG_HUGE,
    F_MAYBE_LIST_MAP,
    F_NOTE_BIN,
} fault;

/* Scalars with its required fields only; `bad_count` sends count = -1. */
static void pack_scalars(msgpack_packer *pk, fault f, bool bad_count)
{
    msgpack_pack_map(pk, f == F_SCALARS_NO_NAME ? 7 : 8);
    tu_pk_str(pk, "flag");
    if (f == F_FLAG_INT)
        msgpack_pack_int(pk, 1);
    else
        msgpack_pack_true(pk);
    tu_pk_str(pk, "small");
    if (f == F_SMALL_RANGE)
        msgpack_pack_int64(pk, (int64_t)INT32_MAX + 1);
    else
        msgpack_pack_int32(pk, -7);
    tu_pk_str(pk, "big");
    msgpack_pack_int64(pk, INT64_MIN);
    tu_pk_str(pk, "count");
    if (bad_count)
        msgpack_pack_int(pk, -1);
    else
        msgpack_pack_uint32(pk, 3);
    tu_pk_str(pk, "total");
    msgpack_pack_uint64(pk, UINT64_MAX);
    tu_pk_str(pk, "ratio");
    msgpack_pack_int(pk, 2); /* an integer is a fine f64 */
    if (f != F_SCALARS_NO_NAME) {
        tu_pk_str(pk, "name");
        tu_pk_str(pk, "n");
    }
    tu_pk_str(pk, "blob");
    if (f == F_BLOB_STR) {
        tu_pk_str(pk, "b");
    } else {
        msgpack_pack_bin(pk, 1);
        msgpack_pack_bin_body(pk, "b", 1);
    }
}

static void pack_containers(msgpack_packer *pk, fault f)
{
    msgpack_pack_map(pk, f == F_WHEN_MAYBE_BAD || f == F_MAYBE_LIST_MAP ? 8 : 7);
    tu_pk_str(pk, "ints");
    if (f == F_INTS_HUGE) {
        msgpack_pack_array(pk, 1);
        msgpack_pack_uint64(pk, UINT64_MAX);
    } else {
        msgpack_pack_array(pk, 0);
    }
    tu_pk_str(pk, "names");
    if (f == F_NAMES_INT_KEY) {
        msgpack_pack_map(pk, 1);
        msgpack_pack_int(pk, 1);
        tu_pk_str(pk, "x");
    } else {
        msgpack_pack_map(pk, 0);
    }
    tu_pk_str(pk, "holes");
    if (f == F_HOLES_BAD) {
        msgpack_pack_array(pk, 3);
        msgpack_pack_int(pk, 1);
        msgpack_pack_nil(pk);
        tu_pk_str(pk, "x");
    } else {
        msgpack_pack_array(pk, 0);
    }
    tu_pk_str(pk, "sparse");
    if (f == F_SPARSE_STR) {
        msgpack_pack_map(pk, 2);
        tu_pk_str(pk, "a");
        msgpack_pack_double(pk, 1.0);
        tu_pk_str(pk, "b");
        tu_pk_str(pk, "no");
    } else if (f == F_SPARSE_ODD_KEY) {
        msgpack_pack_map(pk, 1);
        tu_pk_strn(pk, "b\0\xff", 3);
        tu_pk_str(pk, "no");
    } else {
        msgpack_pack_map(pk, 0);
    }
    tu_pk_str(pk, "grid");
    if (f == F_GRID_STR) {
        msgpack_pack_array(pk, 2);
        msgpack_pack_array(pk, 1);
        msgpack_pack_int(pk, 1);
        msgpack_pack_array(pk, 1);
        tu_pk_str(pk, "x");
    } else if (f == F_GRID_NEG_HUGE) {
        msgpack_pack_array(pk, 1);
        msgpack_pack_array(pk, 1);
        msgpack_pack_int64(pk, INT64_MIN);
    } else {
        msgpack_pack_array(pk, 0);
    }
    tu_pk_str(pk, "index");
    if (f == F_INDEX_COUNT_NEG) {
        msgpack_pack_map(pk, 1);
        tu_pk_str(pk, "k");
        msgpack_pack_array(pk, 1);
        pack_scalars(pk, F_NONE, true);
    } else if (f == F_INDEX_NOT_LIST) {
        msgpack_pack_map(pk, 1);
        tu_pk_str(pk, "k");
        tu_pk_str(pk, "x");
    } else {
        msgpack_pack_map(pk, 0);
    }
    tu_pk_str(pk, "when");
    msgpack_pack_map(pk, f == F_WHEN_TWICE || f == F_NANOS_NEG ? 2 : 1);
    tu_pk_str(pk, "secs");
    msgpack_pack_int(pk, 1);
    if (f == F_NANOS_NEG) {
        tu_pk_str(pk, "nanos");
        msgpack_pack_int(pk, -1);
    }
    if (f == F_WHEN_TWICE) {
        tu_pk_str(pk, "secs");
        msgpack_pack_int(pk, 2);
    }
    if (f == F_WHEN_MAYBE_BAD) {
        tu_pk_str(pk, "when_maybe");
        msgpack_pack_map(pk, 1);
        tu_pk_str(pk, "nanos");
        msgpack_pack_int(pk, 1);
    }
    if (f == F_MAYBE_LIST_MAP) {
        tu_pk_str(pk, "maybe_list");
        msgpack_pack_map(pk, 1);
        tu_pk_str(pk, "a");
        msgpack_pack_int(pk, 1);
    }
}

/* {label, children: [], by_name: {}}, the label left out or an int. */
static void pack_leaf(msgpack_packer *pk, const char *label, fault f)
{
    bool no_label = f == F_CHILD_NO_LABEL;
    msgpack_pack_map(pk, no_label ? 2 : 3);
    if (!no_label) {
        tu_pk_str(pk, "label");
        if (f == F_CHILD_LABEL_INT)
            msgpack_pack_int(pk, 5);
        else
            tu_pk_str(pk, label);
    }
    tu_pk_str(pk, "children");
    msgpack_pack_array(pk, 0);
    tu_pk_str(pk, "by_name");
    msgpack_pack_map(pk, 0);
}

/* A 60-byte by_name key: three of them make a path too long to keep. */
static const char long_key[] =
    "k123456789012345678901234567890123456789012345678901234567890";

static void pack_long_path(msgpack_packer *pk, int level)
{
    msgpack_pack_map(pk, 3);
    tu_pk_str(pk, "label");
    if (level == 3)
        msgpack_pack_int(pk, 5);
    else
        tu_pk_str(pk, "deep");
    tu_pk_str(pk, "children");
    msgpack_pack_array(pk, 0);
    tu_pk_str(pk, "by_name");
    if (level == 3) {
        msgpack_pack_map(pk, 0);
        return;
    }
    msgpack_pack_map(pk, 1);
    tu_pk_str(pk, long_key);
    pack_long_path(pk, level + 1);
}

static void pack_tree(msgpack_packer *pk, fault f)
{
    if (f == F_TREE_STR) {
        tu_pk_str(pk, "a tree");
        return;
    }
    msgpack_pack_map(pk, f == F_NEXT_NOT_MAP || f == F_DEEP_NEXT ? 4 : 3);
    tu_pk_str(pk, "label");
    tu_pk_str(pk, "root");
    tu_pk_str(pk, "children");
    msgpack_pack_array(pk, 2);
    pack_leaf(pk, "c0", f == F_CHILD_NO_LABEL ? f : F_NONE);
    pack_leaf(pk, "c1", f == F_CHILD_LABEL_INT ? f : F_NONE);
    tu_pk_str(pk, "by_name");
    if (f == F_LONG_PATH) {
        msgpack_pack_map(pk, 1);
        tu_pk_str(pk, long_key);
        pack_long_path(pk, 1);
    } else if (f == F_BY_NAME_INT_KEY) {
        msgpack_pack_map(pk, 1);
        msgpack_pack_int(pk, 1);
        pack_leaf(pk, "k", F_NONE);
    } else {
        msgpack_pack_map(pk, 0);
    }
    if (f == F_NEXT_NOT_MAP) {
        tu_pk_str(pk, "next");
        msgpack_pack_array(pk, 1);
        msgpack_pack_int(pk, 1);
    }
    if (f == F_DEEP_NEXT) {
        /* next -> next -> next, the last one's label an int. */
        for (int level = 1; level <= 3; level++) {
            tu_pk_str(pk, "next");
            msgpack_pack_map(pk, level < 3 ? 4 : 3);
            tu_pk_str(pk, "label");
            if (level < 3)
                tu_pk_str(pk, "n");
            else
                msgpack_pack_int(pk, 5);
            tu_pk_str(pk, "children");
            msgpack_pack_array(pk, 0);
            tu_pk_str(pk, "by_name");
            msgpack_pack_map(pk, 0);
        }
    }
}

static void pack_echo(msgpack_packer *pk, fault f)
{
    size_t n = 4;
    n += f == F_TAG_TWICE || f == F_UNKNOWN_ARG || f == F_NONSTR_KEY ||
         f == F_NOTE_INT || f == F_REPEAT_BIG || f == F_NOTE_BIN;
    n -= f == F_NO_TAG;
    msgpack_pack_map(pk, n);
    tu_pk_str(pk, "scalars");
    pack_scalars(pk, f, false);
    tu_pk_str(pk, "containers");
    pack_containers(pk, f);
    tu_pk_str(pk, "tree");
    pack_tree(pk, f);
    if (f != F_NO_TAG) {
        tu_pk_str(pk, "tag");
        tu_pk_str(pk, "t");
    }
    switch (f) {
    case F_TAG_TWICE:
        tu_pk_str(pk, "tag");
        tu_pk_str(pk, "again");
        break;
    case F_UNKNOWN_ARG:
        tu_pk_str(pk, "colour");
        tu_pk_str(pk, "blue");
        break;
    case F_NONSTR_KEY:
        msgpack_pack_int(pk, 7);
        tu_pk_str(pk, "seven");
        break;
    case F_NOTE_INT:
        tu_pk_str(pk, "note");
        msgpack_pack_int(pk, 3);
        break;
    case F_REPEAT_BIG:
        tu_pk_str(pk, "repeat");
        msgpack_pack_uint64(pk, (uint64_t)UINT32_MAX + 1);
        break;
    case F_NOTE_BIN:
        tu_pk_str(pk, "note");
        msgpack_pack_bin(pk, 1);
        msgpack_pack_bin_body(pk, "n", 1);
        break;
    default:
        break;
    }
}

/* ---- the cores: requests and replies as plain buffers ------------------ */

/* The id of every request the tests hand the dispatch core (not ASCII on
 * purpose), and the address the call core's messages name: no socket is
 * involved, nothing listens there. */
#define CORE_ID "c0re-\xc3\xa9-01"
#define CORE_ADDR "tcp://192.0.2.7:5555"

/* Serve one ROUTER-style message [identity, payload] with dispatch core
 * `d`. The reply, if any, stays in d->out until the next message. */
static ctl_verdict serve_bytes(ctl_dispatch *d, const void *payload, size_t len)
{
    bool delimited = true;
    ctl_inbound in = {.frames = 2, .payload = payload, .payload_len = len};
    ctl_dispatch_done(d); /* the previous request's memory */
    ctl_verdict v = ctl_dispatch_message(d, &in, &delimited);
    assert_false(delimited);
    return v;
}

/* Serve [op, CORE_ID, <the args map in `args`>], packed by hand into
 * `req` (which must outlive the reply: its views point there). */
static ctl_verdict serve_on(ctl_dispatch *d, tu_buf *req, const char *op,
                            const tu_buf *args)
{
    tu_buf_reset(req);
    tu_pack_request(req, op, CORE_ID, strlen(CORE_ID), args->sb.data,
                    args->sb.size);
    return serve_bytes(d, req->sb.data, req->sb.size);
}

/* The descriptor of `svc`'s op `name`. */
static const ctl_op_desc *op_desc(const ctl_service *svc, const char *name)
{
    for (size_t i = 0; i < svc->op_count; i++)
        if (strcmp(svc->ops[i].name, name) == 0)
            return svc->ops[i].desc;
    fail_msg("service %s has no op %s", svc->name, name);
    return NULL;
}

/* The op flags the IDL gives: CTL_OP_NOREPLY for a notify op,
 * CTL_OP_IDEMPOTENT for an op declared `idempotent`, in both the service's
 * op table (what a unit dispatches on) and the op's descriptor (what a
 * client calls with); nothing for the other ops. */
static void test_op_flags_from_the_idl(void **state)
{
    (void)state;
    static const struct {
        const ctl_service *svc;
        const char *op;
        unsigned flags;
    } want[] = {
        {&storage_service, "put", 0},
        {&storage_service, "get", CTL_OP_IDEMPOTENT},
        {&storage_service, "describe", CTL_OP_IDEMPOTENT},
        {&storage_service, "pin", CTL_OP_IDEMPOTENT},
        {&storage_service, "unpin", CTL_OP_NOREPLY},
        {&storage_service, "abort", CTL_OP_NOREPLY},
        {&storage_service, "delete", 0},
        {&storage_service, "list", CTL_OP_IDEMPOTENT},
        {&storage_service, "stats", CTL_OP_IDEMPOTENT},
        {&everything_service, "echo", 0},
        {&everything_service, "find", CTL_OP_IDEMPOTENT},
        {&everything_service, "counters", CTL_OP_IDEMPOTENT},
        {&everything_service, "forget", CTL_OP_NOREPLY},
        {&everything_service, "poke", CTL_OP_NOREPLY},
    };
    size_t storage_ops = 0;
    for (size_t i = 0; i < sizeof want / sizeof want[0]; i++) {
        const ctl_service *svc = want[i].svc;
        const ctl_op *op = NULL;
        for (size_t k = 0; k < svc->op_count; k++)
            if (strcmp(svc->ops[k].name, want[i].op) == 0)
                op = &svc->ops[k];
        if (op == NULL)
            fail_msg("service %s has no op %s", svc->name, want[i].op);
        if (op->flags != want[i].flags || op->desc->flags != want[i].flags)
            fail_msg("%s.%s: table flags %#x, descriptor flags %#x, want %#x", svc->name,
                     want[i].op, op->flags, op->desc->flags, want[i].flags);
        storage_ops += svc == &storage_service;
    }
    assert_int_equal(storage_ops, storage_service.op_count); /* every one judged */
}

/* `op` with the args map in f->args, through everything's core. */
static ctl_verdict core_call(fx *f, const char *op)
{
    return serve_on(&f->core, &f->req, op, &f->args);
}

/* The reply in `out` must be exactly [CORE_ID, false, {kind: "Protocol",
 * msg, reason: nil, blobs: nil}] (docs/PROTOCOL.md, "Errors"): it is read and
 * packed again here with msgpack-c alone, and compared byte for byte.
 * `msg` receives the unit's message. */
static void reply_is_protocol(const msgpack_sbuffer *out, char *msg,
                              size_t msg_size)
{
    msgpack_zone zone;
    tu_reply r;
    tu_buf want;
    const msgpack_object *m;

    assert_non_null(out->data);
    msgpack_zone_init(&zone, 4096);
    assert_int_equal(tu_parse_reply(out->data, out->size, &zone, &r), 0);
    expect_bytes((ctl_str){r.id, r.id_len}, LIT(CORE_ID));
    assert_false(r.ok);
    m = tu_obj_get(&r.body, "msg");
    assert_non_null(m);
    assert_int_equal(m->type, MSGPACK_OBJECT_STR);
    assert_true(m->via.str.size < msg_size);
    memcpy(msg, m->via.str.ptr, m->via.str.size);
    msg[m->via.str.size] = '\0';
    msgpack_zone_destroy(&zone);

    tu_buf_init(&want);
    msgpack_pack_array(&want.pk, 3);
    tu_pk_str(&want.pk, CORE_ID);
    msgpack_pack_false(&want.pk);
    msgpack_pack_map(&want.pk, 4);
    tu_pk_str(&want.pk, "kind");
    tu_pk_str(&want.pk, "Protocol");
    tu_pk_str(&want.pk, "msg");
    tu_pk_str(&want.pk, msg);
    tu_pk_str(&want.pk, "reason");
    msgpack_pack_nil(&want.pk);
    tu_pk_str(&want.pk, "blobs");
    msgpack_pack_nil(&want.pk);
    bool same = out->size == want.sb.size &&
                memcmp(out->data, want.sb.data, want.sb.size) == 0;
    tu_buf_fini(&want);
    if (!same)
        fail_msg("the refusal '%s' is not packed as docs/PROTOCOL.md's error map", msg);
}

/* The call core's reading of the refusal in `out`: a remote Protocol
 * error, "<op> at <address>: Protocol error: <the unit's message>". */
static void client_sees_refusal(fx *f, const msgpack_sbuffer *out,
                                const char *op, const char *msg)
{
    char want[1024];
    ctl_reply *r = ctl_reply_copy_of(out->data, out->size);
    assert_non_null(r);
    assert_int_equal(ctl_call_accept(r, 1, LIT(CORE_ID), NULL, CORE_ADDR, op,
                                     &f->err), CTL_MATCH_ERROR);
    ctl_reply_destroy(&r);
    expect_remote(&f->err, f->err.kind, msg);
    expect_substr(f->err.msg, CORE_ADDR);
    snprintf(want, sizeof want, "%s at %s: Protocol error: %s", op, CORE_ADDR, msg);
    assert_string_equal(f->err.msg, want);
}

/* A served message whose verdict is `v` was refused with exactly `want`,
 * as the unit packed it and as a client reads it. */
static void expect_refusal(fx *f, const ctl_dispatch *d, ctl_verdict v,
                           const char *op, const char *want)
{
    char msg[1024];
    assert_int_equal(v, CTL_DISPATCH_REPLY);
    reply_is_protocol(&d->out, msg, sizeof msg);
    if (strcmp(msg, want) != 0)
        fail_msg("op %s: the unit said\n  '%s', not\n  '%s'", op, msg, want);
    client_sees_refusal(f, &d->out, op, msg);
}

/* `op` with the args map in f->args is refused with exactly `want`. */
static void expect_refused(fx *f, const char *op, const char *want)
{
    expect_refusal(f, &f->core, core_call(f, op), op, want);
}

/* The result of the reply in the core's output, as the call core accepts
 * it for `op` (the reply is kept in f->reply). */
static const msgpack_object *core_result(fx *f, const char *op)
{
    ctl_reply_destroy(&f->reply);
    f->reply = ctl_reply_copy_of(f->core.out.data, f->core.out.size);
    assert_non_null(f->reply);
    assert_int_equal(ctl_call_accept(f->reply, 1, LIT(CORE_ID), NULL, CORE_ADDR,
                                     op, &f->err), CTL_MATCH_RESULT);
    expect_bytes(ctl_reply_id(f->reply), LIT(CORE_ID));
    return ctl_reply_result(f->reply);
}

/* The reply in `out` is exactly [CORE_ID, true, <the bytes in `result`>]. */
static void expect_ok_reply(const msgpack_sbuffer *out, const tu_buf *result)
{
    tu_buf want;
    tu_buf_init(&want);
    msgpack_pack_array(&want.pk, 3);
    tu_pk_str(&want.pk, CORE_ID);
    msgpack_pack_true(&want.pk);
    msgpack_sbuffer_write(&want.sb, result->sb.data, result->sb.size);
    bool same = out->size == want.sb.size &&
                memcmp(out->data, want.sb.data, want.sb.size) == 0;
    tu_buf_fini(&want);
    assert_true(same);
}

/* A raw call of `op` with the bytes in f->args over TCP; returns its rc. */
static int raw_call(fx *f, const char *op)
{
    ctl_reply_destroy(&f->reply);
    return ctl_client_call(f->client, f->addr, op, f->args.sb.data,
                           f->args.sb.size, CALL_MS, &f->reply, &f->err);
}

/* The record defaults the unit filled in for fields the raw args left out
 * come back in the echo: index["scalars"][0] and the containers. */
static void test_core_args_take_defaults(void **state)
{
    fx *f = *state;
    const msgpack_object *res, *idx, *sc, *v;
    ctl_str name_d = LIT("tab\t, quote\", backslash\\, \xc3\xa9, newline\n");

    tu_buf_reset(&f->args);
    pack_echo(&f->args.pk, F_NONE);
    assert_int_equal(core_call(f, "echo"), CTL_DISPATCH_REPLY);
    res = core_result(f, "echo");
    assert_int_equal(res->type, MSGPACK_OBJECT_MAP);
    idx = tu_obj_get(res, "index");
    assert_non_null(idx);
    v = tu_obj_get(idx, "scalars");
    assert_non_null(v);
    assert_int_equal(v->type, MSGPACK_OBJECT_ARRAY);
    assert_int_equal(v->via.array.size, 1); /* repeat's default */
    sc = &v->via.array.ptr[0];
    assert_true(tu_obj_get(sc, "flag_d")->via.boolean);
    assert_int_equal(tu_obj_get(sc, "small_d")->via.i64, INT32_MIN);
    assert_true(tu_obj_get(sc, "big_d")->via.u64 == INT64_MAX);
    assert_int_equal(tu_obj_get(sc, "count_d")->via.u64, UINT32_MAX);
    assert_true(tu_obj_get(sc, "total_d")->via.u64 == UINT64_MAX);
    assert_int_equal(tu_obj_get(sc, "neg_hex")->via.i64, -16);
    expect_f64(tu_obj_get(sc, "ratio_d")->via.f64, -1.5e-3);
    expect_f64(tu_obj_get(sc, "ratio_int")->via.f64, 2.0);
    expect_f64(tu_obj_get(sc, "ratio")->via.f64, 2.0);
    v = tu_obj_get(sc, "name_d");
    assert_int_equal(v->type, MSGPACK_OBJECT_STR);
    expect_bytes((ctl_str){v->via.str.ptr, v->via.str.size}, name_d);
    v = tu_obj_get(sc, "blob_d");
    assert_int_equal(v->type, MSGPACK_OBJECT_BIN);
    expect_bytes((ctl_str){v->via.bin.ptr, v->via.bin.size}, LIT("raw"));
    assert_true(tu_obj_is_str(tu_obj_get(res, "maybe_d"), "set"));
    assert_int_equal(tu_obj_get(res, "maybe_null")->type, MSGPACK_OBJECT_NIL);
    assert_int_equal(tu_obj_get(res, "maybe")->type, MSGPACK_OBJECT_NIL);
    assert_int_equal(tu_obj_get(res, "when_maybe")->type, MSGPACK_OBJECT_NIL);
    assert_int_equal(tu_obj_get(res, "empty_list")->via.array.size, 0);
    assert_int_equal(tu_obj_get(res, "empty_map")->via.map.size, 0);
    assert_int_equal(tu_obj_get(tu_obj_get(res, "when"), "nanos")->via.u64, 0);
}

static void test_core_bad_args_echo(void **state)
{
    fx *f = *state;
    static const struct {
        fault f;
        const char *want;
    } cases[] = {
        {F_CHILD_LABEL_INT, "op 'echo': arg tree.children[1].label: expected str, got int"},
        {F_CHILD_NO_LABEL, "op 'echo': arg tree.children[0]: record Node: missing field 'label'"},
        {F_GRID_STR, "op 'echo': arg containers.grid[1][0]: expected i32, got str"},
        {F_SPARSE_STR, "op 'echo': arg containers.sparse.b: expected f64, got str"},
        {F_INDEX_COUNT_NEG, "op 'echo': arg containers.index.k[0].count: expected u32, got -1 (out of range)"},
        {F_SMALL_RANGE, "op 'echo': arg scalars.small: expected i32, got 2147483648 (out of range)"},
        {F_NAMES_INT_KEY, "op 'echo': arg containers.names[0]: expected a str key, got int"},
        {F_WHEN_TWICE, "op 'echo': arg containers.when.secs: field given twice"},
        {F_BLOB_STR, "op 'echo': arg scalars.blob: expected bin, got str"},
        {F_NEXT_NOT_MAP, "op 'echo': arg tree.next: expected record Node, got array"},
        {F_HOLES_BAD, "op 'echo': arg containers.holes[2]: expected u64, got str"},
        {F_TAG_TWICE, "op 'echo': arg tag: given twice"},
        {F_UNKNOWN_ARG, "op 'echo': arg colour: not an arg of echo"},
        {F_NO_TAG, "op 'echo': missing required arg 'tag'"},
        {F_NONSTR_KEY, "op 'echo': arg names must be strings, not int"},
        {F_TREE_STR, "op 'echo': arg tree: expected record Node, got str"},
        {F_NOTE_INT, "op 'echo': arg note: expected str, got int"},
        {F_WHEN_MAYBE_BAD, "op 'echo': arg containers.when_maybe: record Stamp: missing field 'secs'"},
        {F_SCALARS_NO_NAME, "op 'echo': arg scalars: record Scalars: missing field 'name'"},
        /* Hostile values. */
        {F_SPARSE_ODD_KEY, "op 'echo': arg containers.sparse.b\\x00\\xff: expected f64, got str"},
        {F_INTS_HUGE, "op 'echo': arg containers.ints[0]: expected i64, got 18446744073709551615 (out of range)"},
        {F_NANOS_NEG, "op 'echo': arg containers.when.nanos: expected u32, got -1 (out of range)"},
        {F_FLAG_INT, "op 'echo': arg scalars.flag: expected bool, got int"},
        {F_REPEAT_BIG, "op 'echo': arg repeat: expected u32, got 4294967296 (out of range)"},
        {F_DEEP_NEXT, "op 'echo': arg tree.next.next.next.label: expected str, got int"},
        {F_BY_NAME_INT_KEY, "op 'echo': arg tree.by_name[0]: expected a str key, got int"},
        {F_INDEX_NOT_LIST, "op 'echo': arg containers.index.k: expected list<Scalars>, got str"},
        {F_GRID_NEG_HUGE, "op 'echo': arg containers.grid[0][0]: expected i32, got -9223372036854775808 (out of range)"},
        {F_MAYBE_LIST_MAP, "op 'echo': arg containers.maybe_list: expected list<u64>, got map"},
        {F_NOTE_BIN, "op 'echo': arg note: expected str, got bin"},
    };
    const size_t n = sizeof cases / sizeof cases[0];
    for (size_t i = 0; i < n; i++) {
        tu_buf_reset(&f->args);
        pack_echo(&f->args.pk, cases[i].f);
        expect_refused(f, "echo", cases[i].want);
    }
    /* None reached the handler; each was counted as a request, none
     * dropped; and the core still serves. */
    assert_int_equal(atomic_load(&f->st.echoes), 0);
    assert_int_equal(atomic_load(&f->core.counters.requests), n);
    assert_int_equal(atomic_load(&f->core.counters.dropped), 0);
    tu_buf_reset(&f->args);
    pack_echo(&f->args.pk, F_NONE);
    assert_int_equal(core_call(f, "echo"), CTL_DISPATCH_REPLY);
    assert_int_equal(core_result(f, "echo")->type, MSGPACK_OBJECT_MAP);
    assert_int_equal(atomic_load(&f->st.echoes), 1);
}

/* A path longer than the decoder keeps loses its outer part, never the
 * failing spot. */
static void test_core_bad_args_long_path(void **state)
{
    fx *f = *state;
    char msg[1024], want[256];
    const char *at;
    tu_buf_reset(&f->args);
    pack_echo(&f->args.pk, F_LONG_PATH);
    assert_int_equal(core_call(f, "echo"), CTL_DISPATCH_REPLY);
    reply_is_protocol(&f->core.out, msg, sizeof msg);
    client_sees_refusal(f, &f->core.out, "echo", msg);
    /* "arg ...by_name.<key>.by_name.<key>.label: ..." */
    expect_remote(&f->err, f->err.kind, "op 'echo': arg ...by_name.");
    assert_int_equal(strncmp(msg, "op 'echo': arg ...by_name.", 26), 0);
    snprintf(want, sizeof want, ".by_name.%s.label: expected str, got int", long_key);
    expect_substr(msg, want);
    assert_string_equal(msg + strlen(msg) - strlen(want), want); /* it ends so */
    at = strstr(msg, "arg ...");
    assert_non_null(at);
    assert_null(strstr(at + 7, "..")); /* cut once */
    assert_int_equal(atomic_load(&f->st.echoes), 0);
}

static void test_core_bad_args_simple_ops(void **state)
{
    fx *f = *state;
    tu_buf *b = &f->args;

    tu_buf_reset(b);
    msgpack_pack_map(&b->pk, 0);
    expect_refused(f, "matrix", "op 'matrix': missing required arg 'rows'");

    tu_buf_reset(b);
    msgpack_pack_map(&b->pk, 2);
    tu_pk_str(&b->pk, "rows");
    msgpack_pack_int(&b->pk, 1);
    tu_pk_str(&b->pk, "bogus");
    msgpack_pack_int(&b->pk, 2);
    expect_refused(f, "matrix", "op 'matrix': arg bogus: not an arg of matrix");

    tu_buf_reset(b);
    msgpack_pack_map(&b->pk, 1);
    tu_pk_str(&b->pk, "rows");
    tu_pk_str(&b->pk, "x");
    expect_refused(f, "matrix", "op 'matrix': arg rows: expected u32, got str");

    tu_buf_reset(b);
    msgpack_pack_map(&b->pk, 1);
    tu_pk_str(&b->pk, "rows");
    msgpack_pack_int(&b->pk, -1);
    expect_refused(f, "matrix",
                   "op 'matrix': arg rows: expected u32, got -1 (out of range)");

    tu_buf_reset(b);
    msgpack_pack_map(&b->pk, 1);
    tu_pk_str(&b->pk, "rows");
    msgpack_pack_uint64(&b->pk, (uint64_t)UINT32_MAX + 1);
    expect_refused(f, "matrix",
                   "op 'matrix': arg rows: expected u32, got 4294967296 (out of range)");

    tu_buf_reset(b);
    msgpack_pack_map(&b->pk, 2);
    tu_pk_str(&b->pk, "rows");
    msgpack_pack_int(&b->pk, 1);
    tu_pk_str(&b->pk, "cols");
    msgpack_pack_double(&b->pk, 1.5);
    expect_refused(f, "matrix", "op 'matrix': arg cols: expected u32, got float");

    tu_buf_reset(b);
    msgpack_pack_map(&b->pk, 2);
    tu_pk_str(&b->pk, "rows");
    msgpack_pack_int(&b->pk, 1);
    tu_pk_str(&b->pk, "rows");
    msgpack_pack_int(&b->pk, 2);
    expect_refused(f, "matrix", "op 'matrix': arg rows: given twice");

    tu_buf_reset(b);
    msgpack_pack_map(&b->pk, 1);
    msgpack_pack_int(&b->pk, 1);
    msgpack_pack_int(&b->pk, 2);
    expect_refused(f, "matrix", "op 'matrix': arg names must be strings, not int");

    tu_buf_reset(b);
    msgpack_pack_map(&b->pk, 1);
    tu_pk_strn(&b->pk, "b\0ad\xff", 5);
    msgpack_pack_int(&b->pk, 2);
    expect_refused(f, "matrix",
                   "op 'matrix': arg b\\x00ad\\xff: not an arg of matrix");

    tu_buf_reset(b);
    msgpack_pack_map(&b->pk, 1);
    tu_pk_str(&b->pk, "x");
    msgpack_pack_int(&b->pk, 1);
    expect_refused(f, "ping", "op 'ping': arg x: not an arg of ping, which takes none");

    tu_buf_reset(b);
    msgpack_pack_map(&b->pk, 1);
    tu_pk_str(&b->pk, "data");
    tu_pk_str(&b->pk, "a str, not a bin");
    expect_refused(f, "size", "op 'size': arg data: expected bin, got str");

    tu_buf_reset(b);
    msgpack_pack_map(&b->pk, 1);
    tu_pk_str(&b->pk, "name");
    msgpack_pack_nil(&b->pk);
    expect_refused(f, "find", "op 'find': arg name: expected str, got nil");

    tu_buf_reset(b);
    msgpack_pack_map(&b->pk, 1);
    tu_pk_str(&b->pk, "from");
    msgpack_pack_map(&b->pk, 1);
    tu_pk_str(&b->pk, "nanos");
    msgpack_pack_int(&b->pk, 1);
    expect_refused(f, "list", "op 'list': arg from: record Stamp: missing field 'secs'");

    tu_buf_reset(b);
    msgpack_pack_map(&b->pk, 1);
    tu_pk_str(&b->pk, "from");
    msgpack_pack_true(&b->pk);
    expect_refused(f, "list", "op 'list': arg from: expected record Stamp, got bool");

    assert_int_equal(atomic_load(&f->st.matrices), 0);
    assert_int_equal(atomic_load(&f->st.pings), 0);

    /* Nil for an optional arg is the same as leaving it out. */
    tu_buf_reset(b);
    msgpack_pack_map(&b->pk, 1);
    tu_pk_str(&b->pk, "from");
    msgpack_pack_nil(&b->pk);
    assert_int_equal(core_call(f, "list"), CTL_DISPATCH_REPLY);
    assert_int_equal(core_result(f, "list")->via.array.size, 2);
}

/* Hostile args envelopes for a generated op: the bytes after [op, id] are
 * not a usable args map. Each is refused naming the op; a notify op is
 * never answered, whatever it was sent. */
static void test_core_hostile_args_bytes(void **state)
{
    fx *f = *state;
    static const struct {
        const char *op;
        size_t op_len;
        const char *args; /* raw bytes after [op, id] */
        size_t args_len;
        const char *want;
    } cases[] = {
#define B(s) s, sizeof(s) - 1
        {B("matrix"), B("\x90"), "op 'matrix': args must be a map, not array"},
        {B("matrix"), B("\xc0"), "op 'matrix': args must be a map, not nil"},
        {B("matrix"), B("\xa4rows"), "op 'matrix': args must be a map, not str"},
        {B("matrix"), B("\x81\xa4rows"), "op 'matrix': args: truncated"},
        {B("matrix"), B(""), "op 'matrix': args: truncated"},
        {B("matrix"), B("\x80\xc0"), "op 'matrix': 1 trailing bytes after the message"},
        {B("matrix"), B("\xdf\xff\xff\xff\xff"),
         "op 'matrix': args: container count exceeds the message size"},
        {B("matrix"), B("\x81\xa4rows\xc1"), "op 'matrix': args: invalid byte 0xc1"},
        {B("ping"), B("\x81\xa1x\xdb\xff\xff\xff\xff"), "op 'ping': args: truncated"},
        {B("nope"), B("\x80"), "unknown op 'nope' (service everything)"},
        {B("no\0pe\xff"), B("\x80"), "unknown op 'no\\x00pe\\xff' (service everything)"},
        {B(""), B("\x80"), "unknown op '' (service everything)"},
        /* An unknown op is refused before its args are looked at. */
        {B("Echo"), B("\xc1"), "unknown op 'Echo' (service everything)"},
#undef B
    };
    /* 40 nested arrays under "rows": deeper than the default max_depth. */
    char deep[64] = "\x81\xa4rows";
    size_t deep_len = 5;
    for (int i = 0; i < 40; i++)
        deep[deep_len++] = '\x91';
    deep[deep_len++] = '\x01';

    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        tu_buf_reset(&f->req);
        msgpack_pack_array(&f->req.pk, 3);
        tu_pk_strn(&f->req.pk, cases[i].op, cases[i].op_len);
        tu_pk_str(&f->req.pk, CORE_ID);
        msgpack_sbuffer_write(&f->req.sb, cases[i].args, cases[i].args_len);
        expect_refusal(f, &f->core,
                       serve_bytes(&f->core, f->req.sb.data, f->req.sb.size),
                       cases[i].op_len ? cases[i].op : "(empty)", cases[i].want);
    }
    tu_buf_reset(&f->req);
    tu_pack_request(&f->req, "matrix", CORE_ID, strlen(CORE_ID), deep, deep_len);
    expect_refusal(f, &f->core, serve_bytes(&f->core, f->req.sb.data, f->req.sb.size),
                   "matrix", "op 'matrix': args: nested too deeply");

    /* The same bytes to notify ops: silence, and no handler call. */
    for (size_t i = 0; i < 8; i++) {
        tu_buf_reset(&f->req);
        msgpack_pack_array(&f->req.pk, 3);
        tu_pk_str(&f->req.pk, i % 2 ? "poke" : "forget");
        tu_pk_str(&f->req.pk, i < 4 ? "" : CORE_ID);
        msgpack_sbuffer_write(&f->req.sb, cases[i].args, cases[i].args_len);
        assert_int_equal(serve_bytes(&f->core, f->req.sb.data, f->req.sb.size),
                         CTL_DISPATCH_SILENT);
        assert_int_equal(f->core.out.size, 0);
    }
    assert_int_equal(atomic_load(&f->core.counters.dropped), 0);
    assert_int_equal(atomic_load(&f->core.counters.requests),
                     sizeof cases / sizeof cases[0] + 1 + 8);
    assert_int_equal(atomic_load(&f->st.matrices), 0);
    assert_int_equal(atomic_load(&f->st.pings), 0);
    assert_int_equal(atomic_load(&f->st.forgets), 0);
    assert_int_equal(atomic_load(&f->st.pokes), 0);
}

/* Op `name`'s counters in dispatch core `d`. */
static ctl_op_stats core_op_stats(const ctl_dispatch *d, const char *name)
{
    ctl_op_stats os = {0};
    for (size_t i = 0; i < ctl_dispatch_op_count(d); i++) {
        ctl_dispatch_op_stats(d, i, &os);
        if (strcmp(os.name, name) == 0)
            return os;
    }
    fail_msg("no op '%s'", name);
    return os;
}

/* A notify with bad args is dropped without an answer or a handler call,
 * and counted in its op's `dropped`, not as an error; a notify whose
 * handler fails is counted as an error. */
static void test_core_bad_notify(void **state)
{
    fx *f = *state;
    tu_buf *b = &f->args;
    tu_buf nil;

    tu_buf_reset(b);
    msgpack_pack_map(&b->pk, 1);
    tu_pk_str(&b->pk, "names");
    msgpack_pack_int(&b->pk, 5);
    assert_int_equal(core_call(f, "forget"), CTL_DISPATCH_SILENT);
    assert_int_equal(f->core.out.size, 0);
    tu_buf_reset(b);
    msgpack_pack_map(&b->pk, 1);
    tu_pk_str(&b->pk, "x");
    msgpack_pack_int(&b->pk, 5);
    assert_int_equal(core_call(f, "poke"), CTL_DISPATCH_SILENT);
    assert_int_equal(f->core.out.size, 0);
    /* A failing notify handler is not answered either. */
    tu_buf_reset(b);
    msgpack_pack_map(&b->pk, 1);
    tu_pk_str(&b->pk, "names");
    msgpack_pack_array(&b->pk, 1);
    tu_pk_str(&b->pk, "fail");
    assert_int_equal(core_call(f, "forget"), CTL_DISPATCH_SILENT);
    assert_int_equal(f->core.out.size, 0);
    assert_int_equal(atomic_load(&f->st.forgets), 1);
    ctl_op_stats forget = core_op_stats(&f->core, "forget");
    assert_int_equal(forget.calls, 2);
    assert_int_equal(forget.dropped, 1);
    assert_int_equal(forget.errors, 1);
    ctl_op_stats poke = core_op_stats(&f->core, "poke");
    assert_int_equal(poke.calls, 1);
    assert_int_equal(poke.dropped, 1);
    assert_int_equal(poke.errors, 0);

    /* Then a call is answered: [id, true, nil], exactly. */
    tu_buf_reset(b);
    assert_int_equal(core_call(f, "ping"), CTL_DISPATCH_REPLY);
    tu_buf_init(&nil);
    msgpack_pack_nil(&nil.pk);
    expect_ok_reply(&f->core.out, &nil);
    tu_buf_fini(&nil);
    assert_int_equal(atomic_load(&f->core.counters.requests), 4);
    assert_int_equal(atomic_load(&f->core.counters.dropped), 0);
    assert_int_equal(atomic_load(&f->st.forgets), 1);
    assert_int_equal(atomic_load(&f->st.pokes), 0);
    assert_int_equal(atomic_load(&f->st.pings), 1);
}

/* The generated serve packs results and the handlers' typed errors exactly
 * as docs/PROTOCOL.md says, to a ROUTER peer and to a REQ peer alike. */
static void test_core_replies_exact(void **state)
{
    fx *f = *state;
    tu_buf want;
    bool delimited = false;
    const everything_Node *node = NULL;

    tu_buf_init(&want);
    tu_buf_reset(&f->args);
    msgpack_pack_map(&f->args.pk, 1);
    tu_pk_str(&f->args.pk, "data");
    msgpack_pack_bin(&f->args.pk, 4);
    msgpack_pack_bin_body(&f->args.pk, "four", 4);
    assert_int_equal(core_call(f, "size"), CTL_DISPATCH_REPLY);
    msgpack_pack_uint64(&want.pk, 4);
    expect_ok_reply(&f->core.out, &want);

    /* A REQ peer's [identity, "", payload]: the same reply, delimited. */
    ctl_inbound req_style = {.frames = 3, .delimiter_len = 0,
                             .payload = f->req.sb.data,
                             .payload_len = f->req.sb.size};
    ctl_dispatch_done(&f->core);
    assert_int_equal(ctl_dispatch_message(&f->core, &req_style, &delimited),
                     CTL_DISPATCH_REPLY);
    assert_true(delimited);
    expect_ok_reply(&f->core.out, &want);

    /* Typed errors: UnitFull, Busy with its reason, Missing with its blobs
     * (NUL and UTF-8 inside kept), each map key in docs/PROTOCOL.md's order. */
    static const struct {
        const char *tag, *kind, *msg, *reason;
        bool blobs;
    } errs[] = {
        {"full", "UnitFull", "no room for 1 copies", NULL, false},
        {"busy", "Busy", "the unit is draining", "draining", false},
        {"missing", "Missing", "2 blobs are gone", NULL, true},
        {"protocol", "Protocol", "echo refused tag 'protocol'", NULL, false},
    };
    for (size_t i = 0; i < sizeof errs / sizeof errs[0]; i++) {
        everything_echo_args a;
        msgpack_packer *pk = &want.pk;
        everything_echo_args_init(&a);
        a.tag = ctl_str_c(errs[i].tag);
        tu_buf_reset(&f->args);
        assert_int_equal(ctl_type_pack(&f->args.pk,
                                       op_desc(&everything_service, "echo")->args, &a), 0);
        assert_int_equal(core_call(f, "echo"), CTL_DISPATCH_REPLY);
        tu_buf_reset(&want);
        msgpack_pack_array(pk, 3);
        tu_pk_str(pk, CORE_ID);
        msgpack_pack_false(pk);
        msgpack_pack_map(pk, 4);
        tu_pk_str(pk, "kind");
        tu_pk_str(pk, errs[i].kind);
        tu_pk_str(pk, "msg");
        tu_pk_str(pk, errs[i].msg);
        tu_pk_str(pk, "reason");
        if (errs[i].reason)
            tu_pk_str(pk, errs[i].reason);
        else
            msgpack_pack_nil(pk);
        tu_pk_str(pk, "blobs");
        if (errs[i].blobs) {
            msgpack_pack_array(pk, 2);
            tu_pk_strn(pk, "b1", 2);
            tu_pk_strn(pk, "b\0\xc3\xa9", 4);
        } else {
            msgpack_pack_nil(pk);
        }
        assert_int_equal(f->core.out.size, want.sb.size);
        assert_memory_equal(f->core.out.data, want.sb.data, want.sb.size);
    }
    assert_int_equal(atomic_load(&f->st.echoes), 4);

    /* find "leaf": a record built in request memory, read back by the
     * call core and the stub's decoder. */
    tu_buf_reset(&f->args);
    msgpack_pack_map(&f->args.pk, 1);
    tu_pk_str(&f->args.pk, "name");
    tu_pk_str(&f->args.pk, "leaf");
    assert_int_equal(core_call(f, "find"), CTL_DISPATCH_REPLY);
    core_result(f, "find");
    assert_int_equal(ctl_stub_decode_result(op_desc(&everything_service, "find"),
                                            f->reply, CORE_ADDR, &node, &f->err), 0);
    assert_non_null(node);
    expect_bytes(node->label, LIT("le\0af"));
    assert_true(node->parent_label.present);
    expect_cstr(node->parent_label.value, "");
    tu_buf_fini(&want);
}

/* ---- bad replies: results that do not match the IDL, through the call
 * core and the stubs' decoder ------------------------------------------- */

/* Accept [CORE_ID, true, <the bytes in `value`>] as `op`'s reply with the
 * call core and decode its result into `result` (NULL: ignore it) as the
 * stub does; the reply, which owns the result's views, is kept in
 * f->reply. Returns what ctl_stub_decode_result returned. */
static int decode_result(fx *f, const char *op, const tu_buf *value, void *result)
{
    tu_buf_reset(&f->req);
    msgpack_pack_array(&f->req.pk, 3);
    tu_pk_str(&f->req.pk, CORE_ID);
    msgpack_pack_true(&f->req.pk);
    msgpack_sbuffer_write(&f->req.sb, value->sb.data, value->sb.size);
    ctl_reply_destroy(&f->reply);
    f->reply = ctl_reply_copy_of(f->req.sb.data, f->req.sb.size);
    assert_non_null(f->reply);
    assert_int_equal(ctl_call_accept(f->reply, 1, LIT(CORE_ID), NULL, CORE_ADDR,
                                     op, &f->err), CTL_MATCH_RESULT);
    return ctl_stub_decode_result(op_desc(&everything_service, op), f->reply,
                                  CORE_ADDR, result, &f->err);
}

/* decode_result of the spy's answer in `mode`. */
static int decode_answer(fx *f, const char *op, spy_mode mode, void *result)
{
    tu_buf_reset(&f->args);
    pack_answer(&f->args.pk, mode);
    return decode_result(f, op, &f->args, result);
}

/* The result did not decode: Transfer / bad reply, and the message is
 * exactly "<op> at <address>: bad reply: <want>". */
static void expect_bad_result(fx *f, int rc, const char *op, const char *want)
{
    char msg[512];
    snprintf(msg, sizeof msg, "%s at %s: bad reply: %s", op, CORE_ADDR, want);
    expect_bad_reply(&f->err, rc, msg);
    assert_string_equal(f->err.msg, msg);
}

static void test_core_bad_result_named(void **state)
{
    fx *f = *state;
    everything_list_list_f64 m;
    everything_map_u64 counters;
    everything_Containers c;
    everything_list_Stamp stamps;
    const everything_Node *node;
    uint64_t size;
    int rc;

    rc = decode_answer(f, "matrix", SPY_MATRIX_BAD_CELL, &m);
    expect_bad_result(f, rc, "matrix", "result[1][1]: expected f64, got str");
    /* The result ignored: nothing to decode, nothing wrong. */
    assert_int_equal(decode_answer(f, "matrix", SPY_MATRIX_BAD_CELL, NULL), 0);

    rc = decode_answer(f, "find", SPY_NODE_BAD_LABEL, &node);
    expect_bad_reply(&f->err, rc, "find at ");
    expect_substr(f->err.msg, ": bad reply: result.children[1].label: expected str, got int");
    expect_bad_result(f, rc, "find", "result.children[1].label: expected str, got int");

    rc = decode_answer(f, "find", SPY_NODE_NO_CHILDREN, &node);
    expect_bad_result(f, rc, "find", "result: record Node: missing field 'children'");

    rc = decode_answer(f, "counters", SPY_ARRAY, &counters);
    expect_bad_result(f, rc, "counters", "result: expected map<str, u64>, got array");
    rc = decode_answer(f, "find", SPY_ARRAY, &node);
    expect_bad_result(f, rc, "find", "result: expected record Node, got array");

    rc = decode_answer(f, "size", SPY_NEGATIVE, &size);
    expect_bad_result(f, rc, "size", "result: expected u64, got -1 (out of range)");

    rc = decode_answer(f, "echo", SPY_HOLES_BAD, &c);
    expect_bad_result(f, rc, "echo", "result.holes[1]: expected u64, got str");

    rc = decode_answer(f, "matrix", SPY_NIL, &m);
    expect_bad_result(f, rc, "matrix", "result: expected list<list<f64>>, got nil");
    /* nil is a fine answer for an optional result. */
    static const everything_Node untouched;
    node = &untouched; /* must be overwritten */
    assert_int_equal(decode_answer(f, "find", SPY_NIL, &node), 0);
    assert_null(node);

    /* More hostile results. */
    rc = decode_answer(f, "list", SPY_NEGATIVE, &stamps);
    expect_bad_result(f, rc, "list", "result: expected list<Stamp>, got int");
    rc = decode_answer(f, "list", SPY_MATRIX_BAD_CELL, &stamps);
    expect_bad_result(f, rc, "list", "result[0]: expected record Stamp, got array");
    rc = decode_answer(f, "counters", SPY_NIL, &counters);
    expect_bad_result(f, rc, "counters", "result: expected map<str, u64>, got nil");
    rc = decode_answer(f, "size", SPY_STAMPS_MINIMAL, &size);
    expect_bad_result(f, rc, "size", "result: expected u64, got array");
    tu_buf_reset(&f->args);
    msgpack_pack_map(&f->args.pk, 2);
    tu_pk_str(&f->args.pk, "p\xc3\xa9");
    msgpack_pack_uint64(&f->args.pk, 1);
    tu_pk_strn(&f->args.pk, "n\0ul", 4);
    msgpack_pack_int64(&f->args.pk, INT64_MIN);
    rc = decode_result(f, "counters", &f->args, &counters);
    expect_bad_result(f, rc, "counters",
                      "result.n\\x00ul: expected u64, got -9223372036854775808 (out of range)");
    tu_buf_reset(&f->args);
    msgpack_pack_array(&f->args.pk, 1);
    msgpack_pack_map(&f->args.pk, 2);
    tu_pk_str(&f->args.pk, "secs");
    msgpack_pack_int(&f->args.pk, 1);
    tu_pk_str(&f->args.pk, "nanos");
    msgpack_pack_uint64(&f->args.pk, (uint64_t)UINT32_MAX + 1);
    rc = decode_result(f, "list", &f->args, &stamps);
    expect_bad_result(f, rc, "list",
                      "result[0].nanos: expected u32, got 4294967296 (out of range)");
}

/* A result path longer than the decoder keeps: "result ...<inner part>". */
static void test_core_bad_result_long_path(void **state)
{
    fx *f = *state;
    const everything_Node *node;
    char want[256];
    const char *at;
    int rc;

    tu_buf_reset(&f->args);
    msgpack_pack_map(&f->args.pk, 3);
    tu_pk_str(&f->args.pk, "label");
    tu_pk_str(&f->args.pk, "root");
    tu_pk_str(&f->args.pk, "children");
    msgpack_pack_array(&f->args.pk, 0);
    tu_pk_str(&f->args.pk, "by_name");
    msgpack_pack_map(&f->args.pk, 1);
    tu_pk_str(&f->args.pk, long_key);
    pack_long_path(&f->args.pk, 1);
    rc = decode_result(f, "find", &f->args, &node);
    snprintf(want, sizeof want, "find at %s: bad reply: result ...", CORE_ADDR);
    expect_bad_reply(&f->err, rc, want);
    assert_int_equal(strncmp(f->err.msg, want, strlen(want)), 0);
    snprintf(want, sizeof want, ".by_name.%s.label: expected str, got int", long_key);
    assert_true(strlen(f->err.msg) > strlen(want));
    assert_string_equal(f->err.msg + strlen(f->err.msg) - strlen(want), want);
    at = strstr(f->err.msg, "result ...");
    assert_non_null(at);
    assert_null(strstr(at + 10, "..")); /* cut once */
}

/* A peer that sends only required fields (or fields this side does not
 * know) is decoded with the IDL's defaults. */
static void test_core_result_defaults_from_minimal_peer(void **state)
{
    fx *f = *state;
    everything_list_Stamp stamps;
    const everything_Node *node;
    everything_Containers c;

    assert_int_equal(decode_answer(f, "list", SPY_STAMPS_MINIMAL, &stamps), 0);
    assert_int_equal(stamps.count, 2);
    assert_true(stamps.items[0].secs == 5);
    assert_int_equal(stamps.items[0].nanos, 0);
    assert_true(stamps.items[1].secs == -5);
    assert_int_equal(stamps.items[1].nanos, 7);

    assert_int_equal(decode_answer(f, "find", SPY_NODE_MINIMAL, &node), 0);
    assert_non_null(node);
    expect_cstr(node->label, "min");
    assert_false(node->parent_label.present);
    assert_null(node->next);

    assert_int_equal(decode_answer(f, "echo", SPY_CONTAINERS_MINIMAL, &c), 0);
    assert_int_equal(c.ints.count, 1);
    assert_true(c.ints.items[0] == -3);
    assert_true(c.when.secs == 42);
    assert_int_equal(c.when.nanos, 0);
    assert_false(c.maybe.present);
    assert_false(c.maybe_list.present);
    assert_null(c.when_maybe);
    assert_int_equal(c.empty_list.count, 0);
    assert_int_equal(c.empty_map.count, 0);
    assert_true(c.maybe_d.present); /* its default is "set" */
    expect_cstr(c.maybe_d.value, "set");
    assert_false(c.maybe_null.present);
}

/* ---- the same over TCP, once each -------------------------------------- */

/* A refusal, a bad result and bad notifies make the real trip: the stub
 * keeps no reply after a refusal or a bad result, bad notifies get no
 * answer on the wire, and the unit serves on. */
static void test_bad_input_over_tcp(void **state)
{
    fx *f = *state;
    everything_matrix_args ma;
    everything_list_list_f64 m;
    char want[CTL_ENDPOINT_MAX + 128];
    int rc;

    tu_buf_reset(&f->args);
    pack_echo(&f->args.pk, F_CHILD_LABEL_INT);
    expect_remote(&f->err, raw_call(f, "echo"),
                  "op 'echo': arg tree.children[1].label: expected str, got int");
    snprintf(want, sizeof want, "echo at %s: Protocol error: op 'echo': arg "
             "tree.children[1].label: expected str, got int", f->addr);
    assert_string_equal(f->err.msg, want);
    assert_null(f->reply);
    assert_int_equal(atomic_load(&f->st.echoes), 0);

    start_spy(f, SPY_MATRIX_BAD_CELL);
    everything_matrix_args_init(&ma);
    ma.rows = 2;
    rc = everything_matrix(f->client, f->spy_addr, &ma, CALL_MS, &m, &f->reply, &f->err);
    snprintf(want, sizeof want, "matrix at %s: bad reply: result[1][1]: expected f64, got str",
             f->spy_addr);
    expect_bad_reply(&f->err, rc, want);
    assert_string_equal(f->err.msg, want);
    assert_null(f->reply);
    /* The result ignored: nothing to decode, nothing wrong. */
    assert_int_equal(everything_matrix(f->client, f->spy_addr, &ma, CALL_MS, NULL,
                                       NULL, &f->err), 0);

    tu_buf_reset(&f->args);
    pack_echo(&f->args.pk, F_NONE);
    assert_int_equal(raw_call(f, "echo"), 0);
    assert_int_equal(atomic_load(&f->st.echoes), 1);

    /* Notifies with bad args: counted, never answered, no handler call. */
    ctl_server_stats before, after;
    /* The two echoes were answered; the server counts a reply after it is
     * sent, so the client may hold it before the count moves: wait for it. */
    tu_server_stats_wait(f->ev, &before, 2, WAIT_MS);
    assert_int_equal(before.requests, 2);
    assert_int_equal(before.replies, 2);
    tu_buf_reset(&f->args);
    msgpack_pack_map(&f->args.pk, 1);
    tu_pk_str(&f->args.pk, "names");
    msgpack_pack_int(&f->args.pk, 5);
    assert_int_equal(ctl_client_notify(f->client, f->addr, "forget", f->args.sb.data,
                                       f->args.sb.size, &f->err), 0);
    tu_buf_reset(&f->args);
    msgpack_pack_map(&f->args.pk, 1);
    tu_pk_str(&f->args.pk, "x");
    msgpack_pack_int(&f->args.pk, 5);
    assert_int_equal(ctl_client_notify(f->client, f->addr, "poke", f->args.sb.data,
                                       f->args.sb.size, &f->err), 0);
    assert_int_equal(everything_ping(f->client, f->addr, CALL_MS, &f->err), 0);
    tu_server_stats_wait(f->ev, &after, before.replies + 1, WAIT_MS);
    tu_sleep_ms(100);
    ctl_server_stats_get(f->ev, &after);
    assert_int_equal(after.requests - before.requests, 3);
    assert_int_equal(after.replies - before.replies, 1);
    assert_int_equal(atomic_load(&f->st.forgets), 0);
    assert_int_equal(atomic_load(&f->st.pokes), 0);
}

/* ---- idl/storage.idl ------------------------------------------------- */

static void start_storage(fx *f)
{
    ctl_server_options o;
    const storage_handlers h = {
        .ctx = &f->store,
        .on_put = st_put,
        .on_get = st_get,
        .on_describe = st_describe,
        .on_pin = st_pin,
        .on_unpin = st_unpin,
        .on_abort = st_abort,
        .on_delete = st_delete,
        .on_list = st_list,
        .on_stats = st_stats,
    };
    f->sh = h;
    ctl_server_options_init(&o);
    o.endpoint = "tcp://127.0.0.1:*";
    assert_int_equal(storage_serve(&f->sh, &o, &f->storage, &f->err), 0);
    snprintf(f->storage_addr, sizeof f->storage_addr, "%s",
             ctl_server_endpoint(f->storage));
}

static void test_storage_round_trip(void **state)
{
    fx *f = *state;
    const char *at;
    storage_put_args pa;
    storage_get_args ga;
    storage_describe_args da;
    storage_list_args la;
    storage_pin_args pia;
    storage_unpin_args ua;
    storage_abort_args aa;
    storage_delete_args dla;
    storage_list_bin bins;
    storage_list_BlobInfo infos;
    storage_list_str keys;
    storage_UnitStats stats;
    uint64_t n = 0;
    unsigned char big[100];
    const ctl_str k21[] = {LIT("k2"), LIT("k1")};
    const ctl_str k12[] = {LIT("k1"), LIT("k2")};
    const ctl_str some_gone[] = {LIT("k1"), LIT("nope"), LIT("gone")};
    const ctl_str k1[] = {LIT("k1")};
    const ctl_str k2[] = {LIT("k2")};

    start_storage(f);
    at = f->storage_addr;

    storage_put_args_init(&pa);
    assert_false(pa.pin);
    pa.key = LIT("k1");
    pa.data = LIT("\0blob\xff");
    assert_int_equal(storage_put(f->client, at, &pa, CALL_MS, &n, &f->err), 0);
    assert_int_equal(n, 6);
    pa.key = LIT("k2");
    pa.data = LIT("pinned");
    pa.pin = true;
    assert_int_equal(storage_put(f->client, at, &pa, CALL_MS, &n, &f->err), 0);
    pa.data = LIT("again");
    assert_int_equal(storage_put(f->client, at, &pa, CALL_MS, &n, &f->err), CTL_BUSY);
    assert_string_equal(f->err.reason, "pinned");
    memset(big, 0xab, sizeof big);
    pa.key = LIT("k3");
    pa.data = (ctl_str){(const char *)big, sizeof big};
    assert_int_equal(storage_put(f->client, at, &pa, CALL_MS, &n, &f->err), CTL_UNIT_FULL);
    expect_substr(f->err.msg, "100 bytes do not fit");

    storage_get_args_init(&ga);
    ga.keys = (storage_list_str){.items = k21, .count = 2};
    assert_int_equal(storage_get(f->client, at, &ga, CALL_MS, &bins, &f->reply, &f->err), 0);
    assert_int_equal(bins.count, 2);
    expect_bytes(bins.items[0], LIT("pinned"));
    expect_bytes(bins.items[1], LIT("\0blob\xff"));
    ctl_reply_destroy(&f->reply);
    ga.keys = (storage_list_str){.items = some_gone, .count = 3};
    assert_int_equal(storage_get(f->client, at, &ga, CALL_MS, &bins, &f->reply, &f->err),
                     CTL_MISSING);
    assert_int_equal(f->err.blob_count, 2);
    expect_cstr(f->err.blobs[0], "nope");
    expect_cstr(f->err.blobs[1], "gone");

    storage_describe_args_init(&da);
    da.keys = (storage_list_str){.items = k12, .count = 2};
    assert_int_equal(storage_describe(f->client, at, &da, CALL_MS, &infos,
                                      &f->reply, &f->err), 0);
    assert_int_equal(infos.count, 2);
    expect_cstr(infos.items[0].key, "k1");
    assert_int_equal(infos.items[0].size, 6);
    assert_false(infos.items[0].pinned);
    assert_false(infos.items[0].spilled);
    expect_cstr(infos.items[1].key, "k2");
    assert_int_equal(infos.items[1].size, 6);
    assert_true(infos.items[1].pinned);
    ctl_reply_destroy(&f->reply);

    storage_list_args_init(&la);
    assert_int_equal(storage_list(f->client, at, &la, CALL_MS, &keys, &f->reply, &f->err), 0);
    assert_int_equal(keys.count, 2);
    expect_cstr(keys.items[0], "k1");
    expect_cstr(keys.items[1], "k2");
    ctl_reply_destroy(&f->reply);
    la.prefix = LIT("k2");
    assert_int_equal(storage_list(f->client, at, &la, CALL_MS, &keys, &f->reply, &f->err), 0);
    assert_int_equal(keys.count, 1);
    expect_cstr(keys.items[0], "k2");
    ctl_reply_destroy(&f->reply);

    assert_int_equal(storage_stats(f->client, at, CALL_MS, &stats, &f->reply, &f->err), 0);
    assert_int_equal(stats.blobs, 2);
    assert_int_equal(stats.bytes, 12);
    assert_int_equal(stats.capacity, STORE_CAPACITY);
    assert_int_equal(stats.pinned, 1);
    assert_int_equal(stats.spilled, 0);
    assert_int_equal(stats.requests, 10);
    assert_int_equal(stats.dropped, 0);
    ctl_reply_destroy(&f->reply);

    storage_pin_args_init(&pia);
    pia.keys = (storage_list_str){.items = k1, .count = 1};
    assert_int_equal(storage_pin(f->client, at, &pia, CALL_MS, &n, &f->err), 0);
    assert_int_equal(n, 2);
    storage_delete_args_init(&dla);
    dla.keys = (storage_list_str){.items = k1, .count = 1};
    assert_int_equal(storage_delete(f->client, at, &dla, CALL_MS, &n, &f->err), CTL_BUSY);
    assert_string_equal(f->err.reason, "pinned");
    storage_unpin_args_init(&ua);
    ua.keys = (storage_list_str){.items = k12, .count = 2};
    assert_int_equal(storage_unpin(f->client, at, &ua, &f->err), 0);
    assert_int_equal(storage_delete(f->client, at, &dla, CALL_MS, &n, &f->err), 0);
    assert_int_equal(n, 1);
    storage_abort_args_init(&aa);
    aa.keys = (storage_list_str){.items = k2, .count = 1};
    assert_int_equal(storage_abort(f->client, at, &aa, &f->err), 0);
    assert_int_equal(storage_stats(f->client, at, CALL_MS, &stats, &f->reply, &f->err), 0);
    assert_int_equal(stats.blobs, 0);
    assert_int_equal(stats.bytes, 0);
    assert_int_equal(stats.pinned, 0);
}

/* idl/storage.idl's generated decoders refuse bad args naming them, on a
 * core serving storage_service; the store never sees them. */
static void test_core_storage_bad_args(void **state)
{
    fx *f = *state;
    tu_buf *b = &f->args;
    static const char bin3[] = "a\0c";
    static const struct {
        const char *op;
        int shape;
        const char *want;
    } cases[] = {
        {"put", 0, "op 'put': missing required arg 'key'"},
        {"put", 1, "op 'put': arg data: expected bin, got str"},
        {"put", 2, "op 'put': arg pin: expected bool, got str"},
        {"put", 3, "op 'put': arg key: expected str, got int"},
        {"put", 4, "op 'put': missing required arg 'data'"},
        {"get", 5, "op 'get': arg keys: expected list<str>, got str"},
        {"get", 6, "op 'get': arg keys[1]: expected str, got int"},
        {"describe", 7, "op 'describe': arg keys[0]: expected str, got nil"},
        {"stats", 8, "op 'stats': arg x: not an arg of stats, which takes none"},
        {"list", 9, "op 'list': arg prefix: expected str, got bin"},
        {"delete", 10, "op 'delete': arg force: not an arg of delete"},
        {"pin", 11, "op 'pin': arg keys: given twice"},
        {"put", 12, "op 'put': arg ttl_s: not an arg of put"},
    };

    f->csh = (storage_handlers){
        .ctx = &f->store,
        .on_put = st_put,
        .on_get = st_get,
        .on_describe = st_describe,
        .on_pin = st_pin,
        .on_unpin = st_unpin,
        .on_abort = st_abort,
        .on_delete = st_delete,
        .on_list = st_list,
        .on_stats = st_stats,
    };
    assert_int_equal(ctl_dispatch_init(&f->storage_core, &storage_service, &f->csh,
                                       NULL, NULL, &f->err), 0);
    f->storage_core_up = true;

    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        tu_buf_reset(b);
        switch (cases[i].shape) {
        case 0: /* {} */
            msgpack_pack_map(&b->pk, 0);
            break;
        case 1: /* data as a str */
        case 2: /* pin as a str */
        case 3: /* key as an int */
            msgpack_pack_map(&b->pk, cases[i].shape == 2 ? 3 : 2);
            tu_pk_str(&b->pk, "key");
            if (cases[i].shape == 3)
                msgpack_pack_int(&b->pk, 7);
            else
                tu_pk_str(&b->pk, "k");
            tu_pk_str(&b->pk, "data");
            if (cases[i].shape == 1) {
                tu_pk_str(&b->pk, "abc");
            } else {
                msgpack_pack_bin(&b->pk, 3);
                msgpack_pack_bin_body(&b->pk, bin3, 3);
            }
            if (cases[i].shape == 2) {
                tu_pk_str(&b->pk, "pin");
                tu_pk_str(&b->pk, "yes");
            }
            break;
        case 4: /* no data */
            msgpack_pack_map(&b->pk, 1);
            tu_pk_str(&b->pk, "key");
            tu_pk_str(&b->pk, "k");
            break;
        case 5:
            msgpack_pack_map(&b->pk, 1);
            tu_pk_str(&b->pk, "keys");
            tu_pk_str(&b->pk, "k");
            break;
        case 6:
            msgpack_pack_map(&b->pk, 1);
            tu_pk_str(&b->pk, "keys");
            msgpack_pack_array(&b->pk, 2);
            tu_pk_str(&b->pk, "a");
            msgpack_pack_int(&b->pk, 1);
            break;
        case 7:
            msgpack_pack_map(&b->pk, 1);
            tu_pk_str(&b->pk, "keys");
            msgpack_pack_array(&b->pk, 1);
            msgpack_pack_nil(&b->pk);
            break;
        case 8:
            msgpack_pack_map(&b->pk, 1);
            tu_pk_str(&b->pk, "x");
            msgpack_pack_int(&b->pk, 1);
            break;
        case 9:
            msgpack_pack_map(&b->pk, 1);
            tu_pk_str(&b->pk, "prefix");
            msgpack_pack_bin(&b->pk, 1);
            msgpack_pack_bin_body(&b->pk, "k", 1);
            break;
        case 10:
            msgpack_pack_map(&b->pk, 2);
            tu_pk_str(&b->pk, "keys");
            msgpack_pack_array(&b->pk, 0);
            tu_pk_str(&b->pk, "force");
            msgpack_pack_true(&b->pk);
            break;
        case 11:
            msgpack_pack_map(&b->pk, 2);
            tu_pk_str(&b->pk, "keys");
            msgpack_pack_array(&b->pk, 0);
            tu_pk_str(&b->pk, "keys");
            msgpack_pack_array(&b->pk, 0);
            break;
        case 12: /* an arg a newer client might send: an old unit refuses it */
            msgpack_pack_map(&b->pk, 3);
            tu_pk_str(&b->pk, "key");
            tu_pk_str(&b->pk, "k");
            tu_pk_str(&b->pk, "data");
            msgpack_pack_bin(&b->pk, 3);
            msgpack_pack_bin_body(&b->pk, bin3, 3);
            tu_pk_str(&b->pk, "ttl_s");
            msgpack_pack_int(&b->pk, 60);
            break;
        }
        expect_refusal(f, &f->storage_core,
                       serve_on(&f->storage_core, &f->req, cases[i].op, b),
                       cases[i].op, cases[i].want);
    }
    /* Notify ops are not answered, whatever their args. */
    tu_buf_reset(b);
    msgpack_pack_map(&b->pk, 1);
    tu_pk_str(&b->pk, "keys");
    msgpack_pack_int(&b->pk, 5);
    assert_int_equal(serve_on(&f->storage_core, &f->req, "unpin", b), CTL_DISPATCH_SILENT);
    assert_int_equal(serve_on(&f->storage_core, &f->req, "abort", b), CTL_DISPATCH_SILENT);
    assert_int_equal(f->storage_core.out.size, 0);
    assert_int_equal(atomic_load(&f->store.requests), 0);

    /* Good args reach the store: put answers the bytes stored, exactly. */
    tu_buf_reset(b);
    msgpack_pack_map(&b->pk, 2);
    tu_pk_str(&b->pk, "key");
    tu_pk_str(&b->pk, "k");
    tu_pk_str(&b->pk, "data");
    msgpack_pack_bin(&b->pk, 3);
    msgpack_pack_bin_body(&b->pk, bin3, 3);
    assert_int_equal(serve_on(&f->storage_core, &f->req, "put", b), CTL_DISPATCH_REPLY);
    tu_buf_reset(b);
    msgpack_pack_uint64(&b->pk, 3);
    expect_ok_reply(&f->storage_core.out, b);
    assert_int_equal(atomic_load(&f->store.requests), 1);
}

/* ---- typed asynchronous calls (tests/pygen/matrix.idl) ----------------- */
/*
 * The generated _start and _many_start stubs against the blocking ones, on
 * matrix.idl: records, lists, maps, optionals and declared error kinds
 * (its values from matrix_values.h). The units run in this process: a
 * matrix unit (mx_unit) answers as tests/pygen/matrix_unit.c does, except
 * the one told to refuse, which fails every op (fail with its declared kind
 * Stale, the ops that declare none with Protocol); beside them, an address
 * where nothing listens and a unit that takes requests and never answers
 * (a tu_fake that stays silent).
 *
 * Each fan-out runs three ways at once under one deadline: the blocking
 * <op>_many, and <op>_many_start on a client that queues completions for
 * ctl_client_process and on one that runs them on its I/O thread. The
 * three outcome arrays must be the same, record for record: error kind,
 * cause, code, reason, message, and the typed result (compared as the
 * bytes it packs to). The callbacks only note where the call's outcomes
 * are; they are read after the callback, while the handle is kept (the
 * generated header's "Lifetimes"), which ASan checks.
 */

#define MX_TARGETS 5     /* three units, a dead address, a silent unit */
#define MX_REFUSING 2    /* the unit that fails every op */
#define MX_DEAD 3
#define MX_SILENT 4
#define FANOUT_MS 2000   /* the fan-outs' deadline (the silent unit's end) */

typedef struct mx_unit {
    matrix_handlers h;
    ctl_server *server;
    char addr[CTL_ENDPOINT_MAX];
    bool refuse;      /* set before it serves */
    atomic_int calls; /* handler entries */
} mx_unit;

static matrix_echo_handler mx_echo;
static matrix_grow_handler mx_grow;
static matrix_describe_handler mx_describe;
static matrix_sum_handler mx_sum;
static matrix_repeat_handler mx_repeat;
static matrix_find_handler mx_find;
static matrix_fail_handler mx_fail;
static matrix_remember_handler mx_remember;
static matrix_remembered_handler mx_remembered;
static matrix_ping_handler mx_ping;

/* 1 when the unit refuses, having failed the request as Protocol. */
static int mx_refused(void *ctx, ctl_req *req, const char *op, int *rc)
{
    mx_unit *u = ctx;
    atomic_fetch_add(&u->calls, 1);
    if (!u->refuse)
        return 0;
    *rc = ctl_req_fail(req, CTL_PROTOCOL, "this unit refuses %s", op);
    return 1;
}

static int mx_echo(void *ctx, const matrix_echo_args *a, matrix_Everything *result,
                   ctl_req *req)
{
    int rc;
    if (mx_refused(ctx, req, "echo", &rc))
        return rc;
    *result = a->value;
    return 0;
}

/* A leaf: the tests here do not grow trees (test_stubs' Node does). */
static int mx_grow(void *ctx, const matrix_grow_args *a, matrix_Tree *result, ctl_req *req)
{
    int rc;
    if (mx_refused(ctx, req, "grow", &rc))
        return rc;
    *result = (matrix_Tree)MATRIX_TREE_INIT;
    result->label = a->label;
    return 0;
}

static int mx_describe(void *ctx, const matrix_describe_args *a, ctl_str *result,
                       ctl_req *req)
{
    int rc;
    if (mx_refused(ctx, req, "describe", &rc))
        return rc;
    *result = a->name;
    return 0;
}

static int mx_sum(void *ctx, const matrix_sum_args *a, double *result, ctl_req *req)
{
    int rc;
    double s = 0;
    if (mx_refused(ctx, req, "sum", &rc))
        return rc;
    for (size_t i = 0; i < a->ints.count; i++)
        s += (double)a->ints.items[i];
    *result = s * a->scale;
    return 0;
}

/* `data` `times` times over (null when empty), as matrix_unit.c. */
static int mx_repeat(void *ctx, const matrix_repeat_args *a, matrix_opt_bin *result,
                     ctl_req *req)
{
    int rc;
    size_t n = a->data.len * a->times;
    char *buf;
    if (mx_refused(ctx, req, "repeat", &rc))
        return rc;
    if (n == 0) {
        result->present = false;
        return 0;
    }
    if (n / a->times != a->data.len || (buf = ctl_req_alloc(req, n)) == NULL)
        return ctl_req_fail(req, CTL_PROTOCOL, "repeat: too long");
    for (uint32_t i = 0; i < a->times; i++)
        memcpy(buf + (size_t)i * a->data.len, a->data.ptr, a->data.len);
    *result = (matrix_opt_bin){.present = true, .value = {buf, n}};
    return 0;
}

/* An Inner labelled `name`, or null, as matrix_unit.c. */
static int mx_find(void *ctx, const matrix_find_args *a, const matrix_Inner **result,
                   ctl_req *req)
{
    int rc;
    matrix_Inner *in;
    if (mx_refused(ctx, req, "find", &rc))
        return rc;
    if (!a->name.present) {
        *result = NULL;
        return 0;
    }
    if ((in = ctl_req_alloc(req, sizeof *in)) == NULL)
        return ctl_req_fail(req, CTL_PROTOCOL, "out of memory");
    *in = (matrix_Inner)MATRIX_INNER_INIT;
    in->label = a->name.value;
    *result = in;
    return 0;
}

/* The refusing unit fails with the declared kind Stale; the others as
 * `kind` asks (the declared kinds and Busy), or 42. */
static int mx_fail(void *ctx, const matrix_fail_args *a, uint64_t *result, ctl_req *req)
{
    mx_unit *u = ctx;
    const char *why = NULL;
    char reason[64];
    atomic_fetch_add(&u->calls, 1);
    if (u->refuse)
        return matrix_fail_raise_Stale(req, "refusing", "this unit refuses fail");
    if (a->reason.present) {
        snprintf(reason, sizeof reason, "%.*s", (int)a->reason.value.len,
                 a->reason.value.ptr);
        why = reason;
    }
    if (view_is(a->kind, "Stale"))
        return matrix_fail_raise_Stale(req, why, "asked for Stale");
    if (view_is(a->kind, "NoSuchThing"))
        return matrix_fail_raise_NoSuchThing(req, why, "asked for NoSuchThing");
    if (view_is(a->kind, "Busy"))
        return ctl_req_busy(req, why, "asked for Busy");
    *result = 42;
    return 0;
}

static int mx_remember(void *ctx, const matrix_remember_args *a, ctl_req *req)
{
    int rc;
    (void)a;
    if (mx_refused(ctx, req, "remember", &rc))
        return rc;
    return 0;
}

static int mx_remembered(void *ctx, matrix_map_i64 *result, ctl_req *req)
{
    int rc;
    if (mx_refused(ctx, req, "remembered", &rc))
        return rc;
    *result = (matrix_map_i64){.items = NULL, .count = 0};
    return 0;
}

static int mx_ping(void *ctx, ctl_req *req)
{
    int rc;
    if (mx_refused(ctx, req, "ping", &rc))
        return rc;
    return 0;
}

static const matrix_handlers mx_handlers_template = {
    .on_echo = mx_echo,
    .on_grow = mx_grow,
    .on_describe = mx_describe,
    .on_sum = mx_sum,
    .on_repeat = mx_repeat,
    .on_find = mx_find,
    .on_fail = mx_fail,
    .on_remember = mx_remember,
    .on_remembered = mx_remembered,
    .on_ping = mx_ping,
};

static void mx_silent(tu_fake *fake, const tu_fake_req *req, void *user)
{
    (void)fake;
    (void)req;
    (void)user;
}

typedef struct mx_fx {
    mx_unit unit[3];
    tu_fake *silent;
    char dead[CTL_ENDPOINT_MAX];
    const char *addrs[MX_TARGETS];
    ctl_client *proc; /* completions queued for ctl_client_process */
    ctl_client *io;   /* completions run on its I/O thread */
    ctl_error err;
} mx_fx;

static ctl_client *mx_client(int on_io_thread, ctl_error *err)
{
    ctl_client_options o;
    ctl_client *c = NULL;
    ctl_client_options_init(&o);
    o.callbacks_on_io_thread = on_io_thread;
    if (ctl_client_new(&o, &c, err) != 0)
        fprintf(stderr, "ctl_client_new failed: %s\n", err->msg ? err->msg : "?");
    return c;
}

static int mx_teardown(void **state)
{
    mx_fx *f = *state;
    ctl_client_destroy(&f->proc);
    ctl_client_destroy(&f->io);
    for (int i = 0; i < 3; i++)
        ctl_server_destroy(&f->unit[i].server);
    tu_fake_stop(&f->silent);
    ctl_error_fini(&f->err);
    free(f);
    return 0;
}

static int mx_setup(void **state)
{
    mx_fx *f = calloc(1, sizeof *f);
    ctl_server_options o;
    if (f == NULL)
        return -1;
    *state = f;
    ctl_error_init(&f->err);
    ctl_server_options_init(&o);
    o.endpoint = "tcp://127.0.0.1:*";
    for (int i = 0; i < 3; i++) {
        mx_unit *u = &f->unit[i];
        u->h = mx_handlers_template;
        u->h.ctx = u;
        u->refuse = i == MX_REFUSING;
        atomic_init(&u->calls, 0);
        if (matrix_serve(&u->h, &o, &u->server, &f->err) != 0) {
            fprintf(stderr, "matrix_serve failed: %s\n", f->err.msg ? f->err.msg : "?");
            mx_teardown(state);
            return -1;
        }
        snprintf(u->addr, sizeof u->addr, "%s", ctl_server_endpoint(u->server));
        f->addrs[i] = u->addr;
    }
    tu_dead_address(f->dead, sizeof f->dead);
    f->addrs[MX_DEAD] = f->dead;
    f->proc = mx_client(0, &f->err);
    f->io = mx_client(1, &f->err);
    if (tu_fake_start(&f->silent, mx_silent, NULL) != 0 || !f->proc || !f->io) {
        mx_teardown(state);
        return -1;
    }
    f->addrs[MX_SILENT] = tu_fake_endpoint(f->silent);
    return 0;
}

/* What a fan-out's completion saw. The outcomes are the call's: read after
 * the callback has returned, while the handle is kept. */
typedef struct mx_many {
    atomic_int completions;
    void *outcomes;
    size_t count;
    pthread_t thread;
} mx_many;

static void mx_many_seen(void *user, void *outcomes, size_t count)
{
    mx_many *m = user;
    m->outcomes = outcomes;
    m->count = count;
    m->thread = pthread_self();
    atomic_fetch_add(&m->completions, 1);
}

static void mx_on_echo_many(void *user, matrix_echo_outcome *o, size_t n)
{
    mx_many_seen(user, o, n);
}

static void mx_on_fail_many(void *user, matrix_fail_outcome *o, size_t n)
{
    mx_many_seen(user, o, n);
}

static void mx_on_find_many(void *user, matrix_find_outcome *o, size_t n)
{
    mx_many_seen(user, o, n);
}

/* Run `c`'s queued completions until *count reaches `want` or CALL_MS
 * passes, waiting in poll() on its event descriptor in between. */
static void mx_process_until(ctl_client *c, atomic_int *count, int want)
{
    int64_t until = tu_now_ms() + CALL_MS;
    struct pollfd p = {ctl_client_event_fd(c), POLLIN, 0};
    while (atomic_load(count) < want && tu_now_ms() < until)
        if (poll(&p, 1, 50) > 0)
            ctl_client_process(c, 0);
}

/* Both asynchronous fan-outs of one op have completed, once each, on the
 * thread each client delivers on: m[0] queued (run here by
 * ctl_client_process only), m[1] on the I/O thread. */
static void mx_wait_both(mx_fx *f, mx_many m[2], ctl_call *calls[2])
{
    assert_int_equal(ctl_call_wait(calls[0], CALL_MS), 0);
    assert_int_equal(atomic_load(&m[0].completions), 0); /* queued, not run */
    mx_process_until(f->proc, &m[0].completions, 1);
    assert_int_equal(ctl_call_wait(calls[1], CALL_MS), 0);
    for (int k = 0; k < 2; k++) {
        /* A typed call lends no untyped outcomes (its callback owns them). */
        size_t n = 1;
        assert_null(ctl_call_outcomes(calls[k], &n));
        assert_int_equal(n, 0);
        assert_int_equal(atomic_load(&m[k].completions), 1);
        assert_int_equal(m[k].count, MX_TARGETS);
        assert_non_null(m[k].outcomes);
    }
    assert_true(pthread_equal(m[0].thread, pthread_self()));
    assert_false(pthread_equal(m[1].thread, pthread_self()));
    /* Nothing more comes: each completed exactly once. */
    assert_int_equal(ctl_client_process(f->proc, 0), 0);
    assert_int_equal(ctl_client_process(f->io, 0), 0);
    assert_int_equal(atomic_load(&m[0].completions), 1);
    assert_int_equal(atomic_load(&m[1].completions), 1);
}

static bool same_cstr(const char *a, const char *b)
{
    return a == b || (a && b && strcmp(a, b) == 0);
}

/* An asynchronous outcome's error is the blocking one's, field for field. */
static void expect_same_error(const ctl_error *got, const ctl_error *want, size_t i)
{
    bool same = got->kind == want->kind && got->cause == want->cause &&
                got->code == want->code && same_cstr(got->msg, want->msg) &&
                same_cstr(got->reason, want->reason) &&
                same_cstr(got->remote_kind, want->remote_kind) &&
                got->blob_count == want->blob_count;
    for (size_t b = 0; same && b < want->blob_count; b++)
        same = got->blobs[b].len == want->blobs[b].len &&
               memcmp(got->blobs[b].ptr, want->blobs[b].ptr, want->blobs[b].len) == 0;
    if (!same)
        fail_msg("outcome %zu: %s/%s '%s' where the blocking fan-out has %s/%s '%s'", i,
                 ctl_kind_name(got->kind), ctl_cause_name(got->cause),
                 got->msg ? got->msg : "", ctl_kind_name(want->kind),
                 ctl_cause_name(want->cause), want->msg ? want->msg : "");
}

/* Two decoded values of `type` are the same when they pack to the same
 * bytes (every field, in order; doubles bit for bit). */
static void expect_same_value(const ctl_type *type, const void *got, const void *want)
{
    tu_buf a, b;
    tu_buf_init(&a);
    tu_buf_init(&b);
    assert_int_equal(ctl_type_pack(&a.pk, type, got), 0);
    assert_int_equal(ctl_type_pack(&b.pk, type, want), 0);
    assert_int_equal(a.sb.size, b.sb.size);
    assert_memory_equal(a.sb.data, b.sb.data, b.sb.size);
    tu_buf_fini(&a);
    tu_buf_fini(&b);
}

/* The blocking fan-out's errors: the first two units answered, the
 * refusing one failed as `refused_kind` says, the dead address was
 * refused, the silent unit timed out. */
static void expect_fanout_errors(mx_fx *f, const ctl_error *const e[MX_TARGETS],
                                 const char *op, bool declared)
{
    for (int i = 0; i < MX_REFUSING; i++)
        assert_int_equal(e[i]->kind, CTL_OK);
    if (declared) {
        assert_int_equal(e[MX_REFUSING]->kind, CTL_DECLARED);
        assert_int_equal(e[MX_REFUSING]->code, MATRIX_ERR_Stale);
        assert_string_equal(e[MX_REFUSING]->remote_kind, "Stale");
        assert_string_equal(e[MX_REFUSING]->reason, "refusing");
    } else {
        assert_int_equal(e[MX_REFUSING]->kind, CTL_TRANSFER);
        assert_int_equal(e[MX_REFUSING]->cause, CTL_CAUSE_REMOTE);
        assert_string_equal(e[MX_REFUSING]->remote_kind, "Protocol");
    }
    expect_substr(e[MX_REFUSING]->msg, "this unit refuses");
    expect_substr(e[MX_REFUSING]->msg, op);
    assert_int_equal(e[MX_DEAD]->kind, CTL_TRANSFER);
    assert_int_equal(e[MX_DEAD]->cause, CTL_CAUSE_REFUSED);
    expect_substr(e[MX_DEAD]->msg, f->dead);
    assert_int_equal(e[MX_SILENT]->kind, CTL_TRANSFER);
    assert_int_equal(e[MX_SILENT]->cause, CTL_CAUSE_TIMEOUT);
    expect_substr(e[MX_SILENT]->msg, f->addrs[MX_SILENT]);
}

/* Every unit ran the op three times (the blocking fan-out and both
 * asynchronous ones), and the silent one was sent it three times. */
static void expect_fanout_calls(mx_fx *f)
{
    for (int i = 0; i < 3; i++)
        assert_int_equal(atomic_load(&f->unit[i].calls), 3);
    int64_t until = tu_now_ms() + WAIT_MS;
    while (tu_fake_seen(f->silent) < 3 && tu_now_ms() < until)
        tu_sleep_ms(2);
    assert_int_equal(tu_fake_seen(f->silent), 3);
}

/* echo: every type of the IDL comes back, the same through all three. */
static void test_echo_many_start_matches_many(void **state)
{
    mx_fx *f = *state;
    const matrix_Everything sent[2] = {mv_full(), mv_sparse()};
    const ctl_type *type = op_desc(&matrix_service, "echo")->result;
    matrix_echo_args a[MX_TARGETS];
    matrix_echo_outcome bo[MX_TARGETS];
    const ctl_error *be[MX_TARGETS];
    mx_many m[2];
    ctl_call *calls[2] = {NULL, NULL};
    memset(m, 0, sizeof m);
    for (size_t i = 0; i < MX_TARGETS; i++)
        a[i] = (matrix_echo_args){.value = sent[i % 2]};

    assert_int_equal(matrix_echo_many_start(f->proc, f->addrs, a, MX_TARGETS, FANOUT_MS,
                                            mx_on_echo_many, &m[0], &calls[0]), 0);
    assert_int_equal(matrix_echo_many_start(f->io, f->addrs, a, MX_TARGETS, FANOUT_MS,
                                            mx_on_echo_many, &m[1], &calls[1]), 0);
    assert_int_equal(matrix_echo_many(f->proc, f->addrs, a, MX_TARGETS, FANOUT_MS, bo), 3);
    mx_wait_both(f, m, calls);

    for (size_t i = 0; i < MX_TARGETS; i++)
        be[i] = &bo[i].error;
    expect_fanout_errors(f, be, "echo", false);
    for (size_t i = 0; i < MX_REFUSING; i++)
        expect_same_value(type, &bo[i].result, &sent[i % 2]);
    for (int k = 0; k < 2; k++) {
        const matrix_echo_outcome *ao = m[k].outcomes;
        for (size_t i = 0; i < MX_TARGETS; i++) {
            expect_same_error(&ao[i].error, &bo[i].error, i);
            if (bo[i].error.kind != CTL_OK) {
                assert_null(ao[i].reply);
                continue;
            }
            assert_non_null(ao[i].reply);
            expect_same_value(type, &ao[i].result, &bo[i].result);
        }
    }
    matrix_echo_outcomes_fini(bo, MX_TARGETS);
    ctl_call_release(calls[0]);
    ctl_call_release(calls[1]);
    expect_fanout_calls(f);
}

/* fail: a declared kind (with its code and reason) through all three. */
static void test_fail_many_start_matches_many(void **state)
{
    mx_fx *f = *state;
    matrix_fail_args a[MX_TARGETS];
    matrix_fail_outcome bo[MX_TARGETS];
    const ctl_error *be[MX_TARGETS];
    mx_many m[2];
    ctl_call *calls[2] = {NULL, NULL};
    memset(m, 0, sizeof m);
    for (size_t i = 0; i < MX_TARGETS; i++) {
        matrix_fail_args_init(&a[i]);
        a[i].kind = LIT("ok");
    }

    assert_int_equal(matrix_fail_many_start(f->proc, f->addrs, a, MX_TARGETS, FANOUT_MS,
                                            mx_on_fail_many, &m[0], &calls[0]), 0);
    assert_int_equal(matrix_fail_many_start(f->io, f->addrs, a, MX_TARGETS, FANOUT_MS,
                                            mx_on_fail_many, &m[1], &calls[1]), 0);
    assert_int_equal(matrix_fail_many(f->proc, f->addrs, a, MX_TARGETS, FANOUT_MS, bo), 3);
    mx_wait_both(f, m, calls);

    for (size_t i = 0; i < MX_TARGETS; i++)
        be[i] = &bo[i].error;
    expect_fanout_errors(f, be, "fail", true);
    for (size_t i = 0; i < MX_REFUSING; i++)
        assert_int_equal(bo[i].result, 42);
    for (int k = 0; k < 2; k++) {
        const matrix_fail_outcome *ao = m[k].outcomes;
        for (size_t i = 0; i < MX_TARGETS; i++) {
            expect_same_error(&ao[i].error, &bo[i].error, i);
            assert_null(ao[i].reply); /* a u64 holds no views */
            if (bo[i].error.kind == CTL_OK)
                assert_int_equal(ao[i].result, bo[i].result);
        }
    }
    matrix_fail_outcomes_fini(bo, MX_TARGETS);
    ctl_call_release(calls[0]);
    ctl_call_release(calls[1]);
    expect_fanout_calls(f);
}

/* find: an optional record, present from one unit and absent from the
 * other, through all three. */
static void test_find_many_start_matches_many(void **state)
{
    mx_fx *f = *state;
    const ctl_type *type = op_desc(&matrix_service, "find")->result;
    matrix_find_args a[MX_TARGETS];
    matrix_find_outcome bo[MX_TARGETS];
    const ctl_error *be[MX_TARGETS];
    mx_many m[2];
    ctl_call *calls[2] = {NULL, NULL};
    memset(m, 0, sizeof m);
    for (size_t i = 0; i < MX_TARGETS; i++) {
        matrix_find_args_init(&a[i]);
        if (i != 1)
            a[i].name = (matrix_opt_str){.present = true, .value = LIT("f\0und")};
    }

    assert_int_equal(matrix_find_many_start(f->proc, f->addrs, a, MX_TARGETS, FANOUT_MS,
                                            mx_on_find_many, &m[0], &calls[0]), 0);
    assert_int_equal(matrix_find_many_start(f->io, f->addrs, a, MX_TARGETS, FANOUT_MS,
                                            mx_on_find_many, &m[1], &calls[1]), 0);
    assert_int_equal(matrix_find_many(f->proc, f->addrs, a, MX_TARGETS, FANOUT_MS, bo), 3);
    mx_wait_both(f, m, calls);

    for (size_t i = 0; i < MX_TARGETS; i++)
        be[i] = &bo[i].error;
    expect_fanout_errors(f, be, "find", false);
    assert_non_null(bo[0].result);
    expect_bytes(bo[0].result->label, LIT("f\0und"));
    assert_true(bo[0].result->weight == 0.5);
    assert_null(bo[1].result);
    for (int k = 0; k < 2; k++) {
        const matrix_find_outcome *ao = m[k].outcomes;
        for (size_t i = 0; i < MX_TARGETS; i++) {
            expect_same_error(&ao[i].error, &bo[i].error, i);
            if (bo[i].error.kind != CTL_OK)
                continue;
            assert_true((ao[i].result == NULL) == (bo[i].result == NULL));
            expect_same_value(type, &ao[i].result, &bo[i].result);
        }
    }
    matrix_find_outcomes_fini(bo, MX_TARGETS);
    ctl_call_release(calls[0]);
    ctl_call_release(calls[1]);
    expect_fanout_calls(f);
}

/* ---- result lifetimes (run under ASan) ---------------------------------- */
/*
 * A large bin kept past its callback without a copy, as the generated
 * header's "Lifetimes" says: the callback keeps the view, the caller keeps
 * the handle, reads the bytes after the callback has returned, then
 * releases the handle. The args (a heap struct, its blob, the address)
 * are scribbled over and freed as soon as the start returns: the start
 * copied them, and the reply must be the original bytes.
 */

#define BLOB_BYTES ((size_t)1 << 20) /* sent once... */
#define BLOB_TIMES 4u                /* ...and answered this many times over */

static unsigned char blob_byte(size_t i, unsigned seed)
{
    return (unsigned char)(i * 131u + seed * 7u + (i >> 11));
}

static char *blob_new(unsigned seed)
{
    char *b = malloc(BLOB_BYTES);
    assert_non_null(b);
    for (size_t i = 0; i < BLOB_BYTES; i++)
        b[i] = (char)blob_byte(i, seed);
    return b;
}

/* `v` holds BLOB_TIMES copies of the blob of `seed`. */
static void expect_blob(ctl_str v, unsigned seed)
{
    assert_int_equal(v.len, BLOB_BYTES * BLOB_TIMES);
    for (size_t i = 0; i < v.len; i++)
        if ((unsigned char)v.ptr[i] != blob_byte(i % BLOB_BYTES, seed))
            fail_msg("byte %zu of the result is not the blob's", i);
}

/* A repeat's args on the heap, freed with scribble_free once started. */
static matrix_repeat_args *repeat_args_new(unsigned seed)
{
    matrix_repeat_args *a = malloc(sizeof *a);
    assert_non_null(a);
    matrix_repeat_args_init(a);
    a->data = (ctl_str){blob_new(seed), BLOB_BYTES};
    a->times = BLOB_TIMES;
    return a;
}

static void repeat_args_free(matrix_repeat_args *a)
{
    memset((char *)a->data.ptr, 0xee, a->data.len);
    free((char *)a->data.ptr);
    memset(a, 0xee, sizeof *a);
    free(a);
}

static char *addr_dup(const char *addr)
{
    char *s = strdup(addr);
    assert_non_null(s);
    return s;
}

static void addr_free(char *s)
{
    memset(s, 'x', strlen(s));
    free(s);
}

/* What a single call's completion saw: the result's view, not its bytes. */
typedef struct mx_one {
    atomic_int completions;
    int kind;
    matrix_opt_bin result;
} mx_one;

static void mx_on_repeat(void *user, const ctl_error *err, const matrix_opt_bin *result)
{
    mx_one *o = user;
    o->kind = err->kind;
    if (result)
        o->result = *result;
    atomic_fetch_add(&o->completions, 1);
}

static void mx_on_repeat_many(void *user, matrix_repeat_outcome *o, size_t n)
{
    mx_many_seen(user, o, n);
}

/* Wait for a call of `c` to complete and its callback to have run. */
static void mx_wait_delivered(ctl_client *c, ctl_call *call, atomic_int *completions)
{
    assert_int_equal(ctl_call_wait(call, CALL_MS), 0);
    size_t n = 1;
    assert_null(ctl_call_outcomes(call, &n)); /* a typed call lends none */
    assert_int_equal(n, 0);
    mx_process_until(c, completions, 1); /* queued ones; none with on_io */
    assert_int_equal(atomic_load(completions), 1);
}

static void test_start_result_outlives_callback(void **state)
{
    mx_fx *f = *state;
    for (unsigned on_io = 0; on_io < 2; on_io++) {
        ctl_client *c = on_io ? f->io : f->proc;
        matrix_repeat_args *a = repeat_args_new(on_io);
        char *addr = addr_dup(f->unit[0].addr);
        ctl_call *call = NULL;
        mx_one got;
        memset(&got, 0, sizeof got);
        assert_int_equal(matrix_repeat_start(c, addr, a, CALL_MS, mx_on_repeat, &got, &call),
                         0);
        repeat_args_free(a);
        addr_free(addr);
        mx_wait_delivered(c, call, &got.completions);
        assert_int_equal(got.kind, CTL_OK);
        assert_true(got.result.present);
        expect_blob(got.result.value, on_io); /* after the callback */
        ctl_call_release(call);
        assert_int_equal(atomic_load(&got.completions), 1);
    }
}

static void test_many_start_outcomes_outlive_callback(void **state)
{
    mx_fx *f = *state;
    enum { N = 2 };
    for (unsigned on_io = 0; on_io < 2; on_io++) {
        ctl_client *c = on_io ? f->io : f->proc;
        matrix_repeat_args *each[N];
        matrix_repeat_args *a = malloc(N * sizeof *a);
        const char **addrs = malloc(N * sizeof *addrs);
        ctl_call *call = NULL;
        mx_many m;
        memset(&m, 0, sizeof m);
        assert_non_null(a);
        assert_non_null(addrs);
        for (unsigned i = 0; i < N; i++) {
            each[i] = repeat_args_new(10 + 2 * on_io + i);
            a[i] = *each[i];
            addrs[i] = addr_dup(f->unit[i].addr);
        }
        assert_int_equal(matrix_repeat_many_start(c, addrs, a, N, CALL_MS, mx_on_repeat_many,
                                                  &m, &call), 0);
        for (unsigned i = 0; i < N; i++) {
            repeat_args_free(each[i]);
            addr_free((char *)addrs[i]);
        }
        memset(a, 0xee, N * sizeof *a);
        free(a);
        free(addrs);
        mx_wait_delivered(c, call, &m.completions);
        assert_int_equal(m.count, N);
        const matrix_repeat_outcome *o = m.outcomes;
        for (unsigned i = 0; i < N; i++) {
            assert_int_equal(o[i].error.kind, CTL_OK);
            assert_non_null(o[i].reply);
            assert_true(o[i].result.present);
            expect_blob(o[i].result.value, 10 + 2 * on_io + i); /* after the callback */
        }
        ctl_call_release(call);
        assert_int_equal(atomic_load(&m.completions), 1);
    }
}

/* Where target i of test_many_over_send_chunks goes: two units that
 * answer, one that refuses, an address where nothing listens, none. */
static const char *chunk_target(const mx_fx *f, size_t i)
{
    switch (i % 5) {
    case 0: return f->unit[0].addr;
    case 1: return f->unit[1].addr;
    case 2: return f->unit[2].addr;
    case 3: return f->dead;
    default: return NULL;
    }
}

/* Target i's outcome of a repeat fan-out whose target i sent the 8 bytes
 * of `tag` (twice over: `times` 2), by where it went. */
static void expect_chunk_outcome(const mx_fx *f, size_t i, const char *tag,
                                 const matrix_repeat_outcome *o)
{
    switch (i % 5) {
    case 0:
    case 1:
        if (o->error.kind != CTL_OK)
            fail_msg("target %zu: %s", i, o->error.msg);
        assert_true(o->result.present);
        assert_int_equal(o->result.value.len, 16);
        if (memcmp(o->result.value.ptr, tag, 8) != 0 ||
            memcmp(o->result.value.ptr + 8, tag, 8) != 0)
            fail_msg("target %zu came back with another target's bytes", i);
        break;
    case 2:
        assert_int_equal(o->error.kind, CTL_TRANSFER);
        assert_int_equal(o->error.cause, CTL_CAUSE_REMOTE);
        expect_substr(o->error.msg, "this unit refuses");
        break;
    case 3:
        assert_int_equal(o->error.kind, CTL_TRANSFER);
        expect_substr(o->error.msg, f->dead);
        break;
    default:
        assert_int_equal(o->error.kind, CTL_INVALID);
        expect_substr(o->error.msg, "no address");
        break;
    }
}

/* A fan-out of a couple of hundred targets, more than the engine sets up
 * and sends at a time, each request packed from the caller's args as it
 * goes out: every target's args are its own (freed and scribbled on as
 * soon as the asynchronous start returns), and the targets cycle through
 * units that answer, one that refuses, a dead address and a missing one.
 * The blocking _many and _many_start on both clients find every outcome
 * in its place (a unit's answer carries its own target's bytes), and
 * _many returns the number that failed. Twice: cold sockets, then warm
 * ones. */
static void test_many_over_send_chunks(void **state)
{
    enum { N = 203 };
    mx_fx *f = *state;
    static char tags[N][8];
    const char *addrs[N];
    size_t failing = 0;
    for (size_t i = 0; i < N; i++) {
        snprintf(tags[i], sizeof tags[i], "t%06zu", i);
        addrs[i] = chunk_target(f, i);
        failing += i % 5 >= 2;
    }
    for (int round = 0; round < 2; round++) {
        matrix_repeat_args *a = calloc(N, sizeof *a);
        matrix_repeat_outcome *bo = calloc(N, sizeof *bo);
        assert_non_null(a);
        assert_non_null(bo);
        for (size_t i = 0; i < N; i++) {
            matrix_repeat_args_init(&a[i]);
            a[i].data = (ctl_str){tags[i], 8};
            a[i].times = 2;
        }
        assert_int_equal(matrix_repeat_many(f->proc, addrs, a, N, CALL_MS, bo), (int)failing);
        for (size_t i = 0; i < N; i++)
            expect_chunk_outcome(f, i, tags[i], &bo[i]);
        matrix_repeat_outcomes_fini(bo, N);
        free(bo);

        mx_many m[2];
        ctl_call *calls[2] = {NULL, NULL};
        memset(m, 0, sizeof m);
        for (int k = 0; k < 2; k++) {
            /* Args and addresses the caller frees right after the start. */
            matrix_repeat_args *own = malloc(N * sizeof *own);
            char *tagcopy = malloc(N * 8);
            const char **own_addrs = malloc(N * sizeof *own_addrs);
            assert_non_null(own);
            assert_non_null(tagcopy);
            assert_non_null(own_addrs);
            memcpy(tagcopy, tags, N * 8);
            for (size_t i = 0; i < N; i++) {
                own[i] = a[i];
                own[i].data.ptr = tagcopy + 8 * i;
                own_addrs[i] = addrs[i] ? addr_dup(addrs[i]) : NULL;
            }
            assert_int_equal(matrix_repeat_many_start(k ? f->io : f->proc, own_addrs, own, N,
                                                      CALL_MS, mx_on_repeat_many, &m[k],
                                                      &calls[k]),
                             0);
            for (size_t i = 0; i < N; i++)
                if (own_addrs[i])
                    addr_free((char *)own_addrs[i]);
            memset(tagcopy, 0xee, N * 8);
            memset(own, 0xee, N * sizeof *own);
            free(tagcopy);
            free(own);
            free(own_addrs);
        }
        free(a);
        mx_wait_delivered(f->proc, calls[0], &m[0].completions);
        mx_wait_delivered(f->io, calls[1], &m[1].completions);
        for (int k = 0; k < 2; k++) {
            assert_int_equal(m[k].count, N);
            for (size_t i = 0; i < N; i++)
                expect_chunk_outcome(f, i, tags[i],
                                     (const matrix_repeat_outcome *)m[k].outcomes + i);
            ctl_call_release(calls[k]);
        }
    }
}

int main(void)
{
    const struct CMUnitTest tests[] = {
#define T(fn) cmocka_unit_test_setup_teardown(fn, setup, teardown)
#define C(fn) cmocka_unit_test_setup_teardown(fn, setup_core, teardown)
#define M(fn) cmocka_unit_test_setup_teardown(fn, mx_setup, mx_teardown)
        cmocka_unit_test(test_op_flags_from_the_idl),
        T(test_record_init_sets_defaults),
        T(test_echo_every_type),
        T(test_echo_empty_and_absent),
        T(test_find_absent_and_present),
        T(test_scalar_and_container_results),
        T(test_defaults_applied_by_unit),
        T(test_default_args_not_sent),
        T(test_every_default_kind),
        T(test_errors_typed),
        T(test_stub_invalid_use),
        T(test_many_with_dead_unit),
        T(test_many_with_slow_unit),
        T(test_many_typed_outcomes),
        T(test_notify_ops),
        T(test_bad_input_over_tcp),
        T(test_storage_round_trip),
        /* The cores alone: no sockets. */
        C(test_core_args_take_defaults),
        C(test_core_bad_args_echo),
        C(test_core_bad_args_long_path),
        C(test_core_bad_args_simple_ops),
        C(test_core_hostile_args_bytes),
        C(test_core_bad_notify),
        C(test_core_replies_exact),
        C(test_core_bad_result_named),
        C(test_core_bad_result_long_path),
        C(test_core_result_defaults_from_minimal_peer),
        C(test_core_storage_bad_args),
        /* Typed asynchronous calls on matrix.idl. */
        M(test_echo_many_start_matches_many),
        M(test_fail_many_start_matches_many),
        M(test_find_many_start_matches_many),
        M(test_start_result_outlives_callback),
        M(test_many_start_outcomes_outlive_callback),
        M(test_many_over_send_chunks),
#undef M
#undef C
#undef T
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
