/*
 * fuzz_reply.c - the client's side of a reply: from the messages arriving
 * for a call to the typed result (or the error) a stub hands back.
 *
 * The runtime judges a received message in its socket-free core
 * (runtime/src/call_int.h): the transport (client.c) receives the bytes
 * into a ctl_reply and calls ctl_call_accept, which tells the call's own
 * reply (a result or an error map, rebuilt into a ctl_error) from a reply
 * for another id (a late one: counted and skipped) and from a message
 * that is no reply at all (more than one frame, an undecodable payload).
 * A stub then decodes the result with its op's descriptor
 * (ctl_stub_decode_result, ctlrpc/gen.h). This target links the runtime
 * (ctlrpc::ctlrpc) and the generated stubs of idl/storage.idl
 * (storage_stubs) and plays one call that way with plain buffers: each
 * message goes into a reply handle over an exact-size copy
 * (ctl_reply_copy_of, so an overread is an ASan report) and through
 * ctl_call_accept with the call's id, until one ends the call; a result
 * is decoded with ctl_stub_decode_result and the descriptor of the op,
 * found by name in storage_service. No client, socket or thread is made.
 *
 * Input: byte 0 picks the op (put, get, describe, pin, delete, list,
 * stats); the rest is messages separated by FUZZ_SEP (fuzz.h), each a
 * flags byte (bit 0: the message came as two frames) and a payload; empty
 * messages are skipped. The call's request id is FUZZ_ID; messages with
 * another id are late replies.
 *
 * What must hold (else the target aborts): a call that ends has either a
 * reply or an error, never both; an error has a kind the API documents and
 * a message naming the address; a Busy/Missing error's reason and blob ids
 * are readable strings; a reply carries the call's id; every view in a
 * decoded result lies in readable memory (each byte is read, walking the
 * value by the op's result type); a call that does not end has seen only
 * late replies, all counted; and nothing leaks (LeakSanitizer).
 */
#define _GNU_SOURCE /* memmem in fuzz.h */

#include <stdbool.h>

#include "call_int.h"
#include "storage.ctl.h"

#include "fuzz.h"

#define FUZZ_ID "0123456789ab"
#define FUZZ_ADDR "tcp://127.0.0.1:5555"

/* The ops a call can be made to, in the order byte 0 picks them (the ops
 * of storage.idl that are answered; make_corpus.py's OPS). */
static const char *const op_names[] = {
    "put", "get", "describe", "pin", "delete", "list", "stats",
};
#define OP_COUNT (sizeof op_names / sizeof op_names[0])

static const ctl_op_desc *descs[OP_COUNT];
static ctl_limits limits;

static void setup(void)
{
    for (size_t i = 0; i < OP_COUNT; i++) {
        for (size_t j = 0; j < storage_service.op_count; j++)
            if (strcmp(storage_service.ops[j].name, op_names[i]) == 0)
                descs[i] = storage_service.ops[j].desc;
        FUZZ_CHECK(descs[i] != NULL && descs[i]->result != NULL,
                   "storage_service has no op %s with a result", op_names[i]);
    }
    limits = ctl_limits_resolve(NULL);
}

/* ---- reading what a result holds -------------------------------------- */

static volatile unsigned sink;

/* Read every byte of a view: ASan checks it lies in live memory. */
static void touch(ctl_str s)
{
    unsigned h = 0;
    for (size_t i = 0; i < s.len; i++)
        h = h * 31 + (unsigned char)s.ptr[i];
    sink += h;
}

static void touch_bytes(const void *p, size_t n)
{
    touch((ctl_str){(const char *)p, n});
}

/* The layout of list<T> and map<str, T> values (ctlrpc/gen.h). */
typedef struct any_list {
    const void *items;
    size_t count;
} any_list;

/* Read the C value at `v` of type `t`, following every pointer in it. */
static void touch_value(const ctl_type *t, const void *v)
{
    const char *p = v;
    switch (t->kind) {
    case CTL_TYPE_BOOL:
    case CTL_TYPE_I32:
    case CTL_TYPE_I64:
    case CTL_TYPE_U32:
    case CTL_TYPE_U64:
    case CTL_TYPE_F64:
        touch_bytes(v, t->size);
        break;
    case CTL_TYPE_STR:
    case CTL_TYPE_BIN:
        touch(*(const ctl_str *)v);
        break;
    case CTL_TYPE_LIST: {
        const any_list *l = v;
        FUZZ_CHECK(l->count == 0 || l->items != NULL, "a %s with NULL items", t->idl);
        for (size_t i = 0; i < l->count; i++)
            touch_value(t->elem, (const char *)l->items + i * t->elem_size);
        break;
    }
    case CTL_TYPE_MAP: {
        const any_list *m = v;
        FUZZ_CHECK(m->count == 0 || m->items != NULL, "a %s with NULL items", t->idl);
        for (size_t i = 0; i < m->count; i++) {
            const char *e = (const char *)m->items + i * t->elem_size;
            touch(*(const ctl_str *)e);
            touch_value(t->elem, e + t->value_offset);
        }
        break;
    }
    case CTL_TYPE_OPTIONAL:
        if (t->by_pointer) {
            const void *r = *(const void *const *)v;
            if (r)
                touch_value(t->elem, r);
        } else if (*(const bool *)v) {
            touch_value(t->elem, p + t->value_offset);
        }
        break;
    case CTL_TYPE_RECORD:
        for (size_t i = 0; i < t->field_count; i++)
            touch_value(t->fields[i].type, p + t->fields[i].offset);
        break;
    }
}

/* ---- the outcome ------------------------------------------------------ */

static void check_error(const ctl_error *err)
{
    FUZZ_CHECK(err->msg != NULL, "an error without a message");
    FUZZ_CHECK(strstr(err->msg, FUZZ_ADDR) != NULL,
               "the message does not name the address: %s", err->msg);
    switch (err->kind) {
    case CTL_UNIT_FULL:
        break;
    case CTL_BUSY:
        if (err->reason)
            sink += (unsigned)strlen(err->reason);
        break;
    case CTL_MISSING:
        for (size_t i = 0; i < err->blob_count; i++) {
            touch(err->blobs[i]);
            FUZZ_CHECK(err->blobs[i].ptr[err->blobs[i].len] == '\0',
                       "a blob id is not NUL-terminated");
        }
        break;
    case CTL_TRANSFER:
        FUZZ_CHECK(err->cause == CTL_CAUSE_REMOTE ||
                       err->cause == CTL_CAUSE_BAD_REPLY ||
                       err->cause == CTL_CAUSE_NOMEM,
                   "a reply failed with cause %s", ctl_cause_name(err->cause));
        if (err->cause == CTL_CAUSE_REMOTE)
            FUZZ_CHECK(err->remote_kind != NULL, "a remote error without its kind");
        break;
    default:
        FUZZ_CHECK(0, "a reply failed with kind %d", (int)err->kind);
    }
}

/* Room for the result of any op (checked against desc->result->size). */
typedef union any_result {
    max_align_t align;
    unsigned char bytes[256];
} any_result;

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    static int ready;
    if (!ready) {
        setup();
        ready = 1;
    }
    if (size == 0)
        return 0;
    size_t pick = data[0] % OP_COUNT;
    const char *op = op_names[pick];
    const ctl_op_desc *desc = descs[pick];
    const ctl_str id = {FUZZ_ID, sizeof FUZZ_ID - 1};

    fuzz_chunk msgs[FUZZ_MAX_MSGS];
    size_t n = fuzz_split(data + 1, size - 1, msgs, FUZZ_MAX_MSGS);

    /* As the transport plays a call once its request is sent: judge each
     * message that arrives until one ends the call. */
    ctl_reply *reply = NULL;
    ctl_error err;
    ctl_error_init(&err);
    bool done = false;
    size_t messages = 0, late = 0;
    for (size_t i = 0; i < n && !done; i++) {
        if (msgs[i].len == 0)
            continue;
        messages++;
        size_t frames = (msgs[i].data[0] & 1) ? 2 : 1;
        ctl_reply *r = ctl_reply_copy_of(msgs[i].data + 1, msgs[i].len - 1);
        FUZZ_CHECK(r != NULL, "out of memory");
        ctl_match m = ctl_call_accept(r, frames, id, &limits, FUZZ_ADDR, op, &err);
        switch (m) {
        case CTL_MATCH_RESULT:
            FUZZ_CHECK(frames == 1, "a message of two frames taken as the reply");
            reply = r;
            done = true;
            break;
        case CTL_MATCH_OTHER:
            FUZZ_CHECK(err.kind == CTL_OK, "a late reply set the call's error");
            late++;
            ctl_reply_destroy(&r);
            break;
        case CTL_MATCH_ERROR:
        case CTL_MATCH_BAD:
            FUZZ_CHECK(err.kind != CTL_OK, "a call ended by message %zu without an error",
                       messages);
            ctl_reply_destroy(&r);
            done = true;
            break;
        default:
            FUZZ_CHECK(0, "ctl_call_accept answered %d", (int)m);
        }
    }

    if (!done) {
        FUZZ_CHECK(reply == NULL && err.kind == CTL_OK,
                   "a call that has not ended has an outcome");
        FUZZ_CHECK(late == messages, "%zu replies for other ids, %zu counted late",
                   messages, late);
    } else if (reply) {
        FUZZ_CHECK(err.kind == CTL_OK, "a call with both a reply and an error");
        ctl_str got = ctl_reply_id(reply);
        FUZZ_CHECK(got.len == id.len && memcmp(got.ptr, id.ptr, id.len) == 0,
                   "the reply carries another id");
        any_result res;
        memset(&res, 0, sizeof res);
        FUZZ_CHECK(desc->result->size <= sizeof res, "the result of %s does not fit",
                   op);
        if (ctl_stub_decode_result(desc, reply, FUZZ_ADDR, &res, &err) == 0)
            touch_value(desc->result, &res);
        else
            FUZZ_CHECK(err.kind == CTL_TRANSFER && err.cause == CTL_CAUSE_BAD_REPLY,
                       "a result that does not decode is not a bad reply");
    } else {
        FUZZ_CHECK(err.kind != CTL_OK, "a call that ended with neither reply nor error");
    }
    if (err.kind != CTL_OK)
        check_error(&err);
    ctl_reply_destroy(&reply);
    ctl_error_fini(&err);
    return 0;
}
