/*
 * fuzz_unit.c - the storage unit's request path, from one received message
 * to the reply it gets, without a socket.
 *
 * The runtime serves a message in its socket-free core, ctl_dispatch
 * (runtime/src/dispatch_int.h): the transport (server.c) only reads the
 * frames into a ctl_inbound and sends the reply payload the core leaves in
 * `out`. This target plays the transport's part with plain buffers and
 * links everything else as it is: the runtime (ctlrpc::ctlrpc), the
 * generated stubs of idl/storage.idl (storage_stubs: its args decoders,
 * result encoders and storage_service, the op table) and the storage
 * unit's handlers over a real store (storage_service library:
 * examples/storage/handlers.c, store.c). So a request goes through the
 * frame checks, the envelope decoder, the op lookup, the generated args
 * decoding, the handler, the result encoding and the error replies of the
 * real unit. No server, socket or thread is made.
 *
 * Every handler is the unit's own; stats, which has no ctl_server here,
 * reports its server counters as zero.
 *
 * Input: messages separated by FUZZ_SEP (fuzz.h). The first byte of each
 * says how it is framed, the rest is the payload:
 *   0-3  [identity, payload]              the DEALER form
 *   4    [identity, "", payload]          the REQ form (delimiter echoed)
 *   5    [identity, "x", payload]         bad delimiter: dropped
 *   6    [identity]                       no payload: dropped
 *   7    [identity, "", payload, payload] too many frames: dropped
 * (higher values wrap). Each input gets a fresh store of 1 KiB without a
 * spill directory (so UnitFull is reachable with small inputs) and a
 * fresh ctl_dispatch. The payload is handed over as an exact-size heap
 * copy, so that reading one byte past it is an ASan report.
 *
 * What must hold for every message (else the target aborts):
 *   - a reply comes exactly when the protocol says one is due: the framing
 *     is usable, the payload has an op and an id (docs/PROTOCOL.md "Malformed
 *     input"), and the op is not a notify; dropped messages are counted
 *     as dropped, the others as requests;
 *   - the reply keeps the request's framing: the core asks for the empty
 *     delimiter exactly when the request had one (the identity frame never
 *     reaches the core: the transport sends the reply back on the one it
 *     received);
 *   - the reply payload is one well-formed [id, ok, body] with the
 *     request's id, as the client judges it (ctl_call_accept); an error
 *     body is a well-formed error map (the client would not call it a bad
 *     reply), and a result decodes with the client's decoder of that op
 *     (ctl_stub_decode_result with the op's descriptor: the two ends of the
 *     generated code agree);
 *   - put answers the length of the data it was given.
 * AddressSanitizer and UBSan check every access on the way.
 */
#define _GNU_SOURCE /* memmem in fuzz.h */

#include <stdatomic.h>
#include <stdbool.h>

#include "call_int.h"
#include "dispatch_int.h"
#include "envelope_int.h"
#include "handlers.h"
#include "storage.ctl.h"

#include "fuzz.h"

/* Where the reply would come from, for the client's error messages. */
#define FUZZ_ADDR "tcp://127.0.0.1:5555"

/* ---- the unit --------------------------------------------------------- */

static storage_unit unit = {NULL, NULL, PTHREAD_MUTEX_INITIALIZER};
static storage_handlers handlers;
static ctl_dispatch core;
static ctl_limits limits;
static int verbose; /* $FUZZ_VERBOSE: one line per message on stderr */

static uint64_t counter(_Atomic uint64_t *c)
{
    return atomic_load_explicit(c, memory_order_relaxed);
}

static void setup(void)
{
    storage_unit_handlers(&unit, &handlers);
    limits = ctl_limits_resolve(NULL);
    verbose = getenv("FUZZ_VERBOSE") != NULL;
}

/* The op of storage_service called `name`, or NULL. */
static const ctl_op *find_op(ctl_str name)
{
    for (size_t i = 0; i < storage_service.op_count; i++) {
        const ctl_op *op = &storage_service.ops[i];
        if (strlen(op->name) == name.len && memcmp(op->name, name.ptr, name.len) == 0)
            return op;
    }
    return NULL;
}

/* ---- the oracle ------------------------------------------------------- */

/* Room for the result of any op (checked against desc->result->size). */
typedef union any_result {
    max_align_t align;
    uint64_t u64;
    unsigned char bytes[256];
} any_result;

/* Judge the reply payload as the client does. Returns 1 for a result. */
static int check_reply(const void *payload, size_t len, ctl_decode dc,
                       const ctl_env_request *rq, const ctl_op *op)
{
    const char *name = op ? op->name : "?";
    ctl_reply *reply = ctl_reply_copy_of(payload, len);
    FUZZ_CHECK(reply != NULL, "out of memory");
    ctl_error err;
    ctl_error_init(&err);
    ctl_match m = ctl_call_accept(reply, 1, rq->id, &limits, FUZZ_ADDR, name, &err);
    FUZZ_CHECK(m != CTL_MATCH_BAD, "the unit sent a reply the client cannot decode: %s",
               err.msg ? err.msg : "?");
    FUZZ_CHECK(m != CTL_MATCH_OTHER, "the reply carries another id");
    if (m == CTL_MATCH_ERROR) {
        FUZZ_CHECK(err.kind != CTL_OK && err.msg != NULL, "an error reply without an error");
        FUZZ_CHECK(!(err.kind == CTL_TRANSFER && err.cause == CTL_CAUSE_BAD_REPLY),
                   "the unit sent a malformed error map: %s", err.msg);
    } else {
        FUZZ_CHECK(op != NULL && op->desc != NULL && dc == CTL_DECODE_OK,
                   "a success reply to a request that could not be served");
        ctl_str id = ctl_reply_id(reply);
        FUZZ_CHECK(id.len == rq->id.len &&
                       (id.len == 0 || memcmp(id.ptr, rq->id.ptr, id.len) == 0),
                   "the reply carries another id");
        const ctl_op_desc *desc = op->desc;
        any_result res;
        memset(&res, 0, sizeof res);
        FUZZ_CHECK(!desc->result || desc->result->size <= sizeof res,
                   "the result of %s does not fit any_result", name);
        FUZZ_CHECK(ctl_stub_decode_result(desc, reply, FUZZ_ADDR, &res, &err) == 0,
                   "the client's decoder refuses the unit's %s result: %s", name,
                   err.msg);
        if (strcmp(name, "put") == 0) {
            const msgpack_object *data = ctl_obj_get(&rq->args, "data");
            FUZZ_CHECK(data && data->type == MSGPACK_OBJECT_BIN &&
                           res.u64 == data->via.bin.size,
                       "put answered %llu for %u bytes",
                       (unsigned long long)res.u64,
                       data ? (unsigned)data->via.bin.size : 0u);
        }
    }
    ctl_error_fini(&err);
    ctl_reply_destroy(&reply);
    return m == CTL_MATCH_RESULT;
}

static void serve_message(const fuzz_chunk *msg)
{
    unsigned mode = msg->len ? msg->data[0] % 8 : 0;
    fuzz_chunk payload = {msg->len ? msg->data + 1 : msg->data,
                          msg->len ? msg->len - 1 : 0};

    /* An exact-size heap copy (malloc(0) included: ASan reports any read
     * of it). */
    void *copy = malloc(payload.len);
    FUZZ_CHECK(copy != NULL || payload.len == 0, "out of memory");
    if (payload.len)
        memcpy(copy, payload.data, payload.len);

    /* The message as the transport hands it over: the frame count with
     * the identity, the middle frame's size, the last frame. */
    ctl_inbound in = {.payload = copy, .payload_len = payload.len};
    switch (mode) {
    case 4:
        in.frames = 3;
        in.delimiter_len = 0;
        break;
    case 5:
        in.frames = 3;
        in.delimiter_len = 1;
        break;
    case 6:
        in.frames = 1;
        in.payload = NULL;
        in.payload_len = 0;
        break;
    case 7:
        in.frames = 4;
        in.delimiter_len = 0;
        break;
    default:
        in.frames = 2;
        break;
    }
    int framed = mode <= 4;

    /* What the unit should make of it, decoded separately. */
    char why[160];
    msgpack_zone zone;
    ctl_env_request rq;
    FUZZ_CHECK(msgpack_zone_init(&zone, 1024), "out of memory");
    ctl_decode dc = ctl_env_decode_request(payload.data, payload.len, &limits,
                                           &zone, &rq, why, sizeof why);
    const ctl_op *op = dc == CTL_DECODE_DROP ? NULL : find_op(rq.op);
    int notify = op && (op->flags & CTL_OP_NOREPLY);
    int answered = framed && dc != CTL_DECODE_DROP && !notify;

    uint64_t requests = counter(&core.counters.requests);
    uint64_t dropped = counter(&core.counters.dropped);
    bool delimited = false;
    ctl_verdict v = ctl_dispatch_message(&core, &in, &delimited);

    if (!framed || dc == CTL_DECODE_DROP) {
        FUZZ_CHECK(v == CTL_DISPATCH_DROPPED, "a message to drop was served (mode %u)", mode);
        FUZZ_CHECK(counter(&core.counters.dropped) == dropped + 1,
                   "a dropped message was not counted");
        FUZZ_CHECK(counter(&core.counters.requests) == requests,
                   "a dropped message was counted as a request");
    } else {
        FUZZ_CHECK(v != CTL_DISPATCH_DROPPED, "a request was dropped (mode %u)", mode);
        FUZZ_CHECK(counter(&core.counters.requests) == requests + 1,
                   "a request was not counted");
        FUZZ_CHECK(counter(&core.counters.dropped) == dropped,
                   "a request was counted as dropped");
    }
    int ok = 0;
    if (!answered) {
        FUZZ_CHECK(v != CTL_DISPATCH_REPLY, "an answer to a message that gets none (mode %u)",
                   mode);
    } else {
        FUZZ_CHECK(v == CTL_DISPATCH_REPLY && core.out.size > 0,
                   "no reply to a message that is due one (mode %u, verdict %d)", mode,
                   (int)v);
        FUZZ_CHECK(delimited == (mode == 4),
                   "the reply %s an empty delimiter the request %s",
                   delimited ? "adds" : "drops", delimited ? "did not have" : "had");
        ok = check_reply(core.out.data, core.out.size, dc, &rq, op);
    }
    if (verbose)
        fprintf(stderr, "fuzz_unit: mode %u, %s, op '%.*s': %s\n", mode,
                dc == CTL_DECODE_OK ? "decoded" : dc == CTL_DECODE_BAD ? "bad" : "dropped",
                dc == CTL_DECODE_DROP ? 0 : (int)rq.op.len,
                dc == CTL_DECODE_DROP ? "" : rq.op.ptr,
                !answered ? "no reply" : ok ? "ok" : "error");
    ctl_dispatch_done(&core);
    msgpack_zone_destroy(&zone);
    free(copy);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    static int ready;
    if (!ready) {
        setup();
        ready = 1;
    }
    ctl_error err;
    ctl_error_init(&err);
    FUZZ_CHECK(store_new(1024, NULL, &unit.store, &err) == 0, "store_new: %s", err.msg);
    FUZZ_CHECK(ctl_dispatch_init(&core, &storage_service, &handlers, NULL, &limits, &err) == 0,
               "ctl_dispatch_init: %s", err.msg);
    ctl_error_fini(&err);

    fuzz_chunk msgs[FUZZ_MAX_MSGS];
    size_t n = fuzz_split(data, size, msgs, FUZZ_MAX_MSGS);
    for (size_t i = 0; i < n; i++)
        serve_message(&msgs[i]);

    ctl_dispatch_fini(&core);
    store_destroy(&unit.store);
    return 0;
}
