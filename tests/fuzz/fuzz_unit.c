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
 *     input"), the op is not a notify, and the id carries no deadline
 *     passed by more than the skew allowance (docs/PROTOCOL.md
 *     "Deadlines"; built-ins excepted): a request is skipped as expired
 *     only when its deadline had passed by then, and always when it had
 *     before it was served; dropped messages are counted as dropped, the
 *     others as requests;
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
 *   - put answers the length of the data it was given;
 *   - the built-in ops (_describe, _health, _stats: docs/PROTOCOL.md,
 *     "Built-in ops") answer a well-formed request with empty args with a
 *     result of the documented shape (every key, its type, the service's
 *     name and ops, the runtime's version, the IDL files, the counters as
 *     this target's core has them), and anything else with an error.
 * AddressSanitizer and UBSan check every access on the way.
 */
#define _GNU_SOURCE /* memmem in fuzz.h */

#include <stdatomic.h>
#include <stdbool.h>
#include <time.h>

#include "ctlrpc/version.h"
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

static int64_t wall_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
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

static const char *const builtin_names[] = {"_describe", "_health", "_stats"};
enum { BUILTIN_COUNT = 3 };

/* The built-in op called `name`, or NULL. */
static const char *find_builtin(ctl_str name)
{
    for (size_t i = 0; i < BUILTIN_COUNT; i++)
        if (strlen(builtin_names[i]) == name.len &&
            memcmp(builtin_names[i], name.ptr, name.len) == 0)
            return builtin_names[i];
    return NULL;
}

static bool is_str(const msgpack_object *o, const char *s)
{
    return o && o->type == MSGPACK_OBJECT_STR && o->via.str.size == strlen(s) &&
           memcmp(o->via.str.ptr, s, o->via.str.size) == 0;
}

static bool is_map(const msgpack_object *o, uint32_t size)
{
    return o && o->type == MSGPACK_OBJECT_MAP && o->via.map.size == size;
}

static bool is_uint(const msgpack_object *o)
{
    return o && o->type == MSGPACK_OBJECT_POSITIVE_INTEGER;
}

static bool is_f64(const msgpack_object *o)
{
    return o && o->type == MSGPACK_OBJECT_FLOAT64 && o->via.f64 >= 0;
}

/* The result of _describe: {service, version, ops, idl, idl_sha256}. */
static void check_describe(const msgpack_object *r)
{
    const ctl_service *svc = &storage_service;
    FUZZ_CHECK(is_map(r, 5), "_describe: not a map of 5");
    FUZZ_CHECK(is_str(ctl_obj_get(r, "service"), svc->name), "_describe: service");
    FUZZ_CHECK(is_str(ctl_obj_get(r, "version"), ctl_version()), "_describe: version");
    const msgpack_object *ops = ctl_obj_get(r, "ops");
    FUZZ_CHECK(ops && ops->type == MSGPACK_OBJECT_ARRAY && ops->via.array.size == svc->op_count,
               "_describe: ops is not an array of the service's %zu ops", svc->op_count);
    for (size_t i = 0; i < svc->op_count; i++)
        FUZZ_CHECK(is_str(&ops->via.array.ptr[i], svc->ops[i].name),
                   "_describe: ops[%zu] is not '%s'", i, svc->ops[i].name);
    const msgpack_object *idl = ctl_obj_get(r, "idl");
    FUZZ_CHECK(idl && idl->type == MSGPACK_OBJECT_ARRAY &&
                   idl->via.array.size == svc->idl_file_count,
               "_describe: idl is not an array of the %zu IDL files", svc->idl_file_count);
    for (size_t i = 0; i < svc->idl_file_count; i++) {
        const msgpack_object *f = &idl->via.array.ptr[i];
        const msgpack_object *text = ctl_obj_get(f, "text");
        FUZZ_CHECK(is_map(f, 2) && is_str(ctl_obj_get(f, "path"), svc->idl_files[i].path) &&
                       text && text->type == MSGPACK_OBJECT_STR &&
                       text->via.str.size == svc->idl_files[i].len,
                   "_describe: idl[%zu] is not {path, text} of %s", i, svc->idl_files[i].path);
    }
    const msgpack_object *sha = ctl_obj_get(r, "idl_sha256");
    FUZZ_CHECK(svc->idl_file_count ? is_str(sha, svc->idl_sha256)
                                   : sha && sha->type == MSGPACK_OBJECT_NIL,
               "_describe: idl_sha256");
}

/* The result of _health: {status, uptime_s, in_flight, service, version};
 * this core never drains and serves one request at a time. */
static void check_health(const msgpack_object *r)
{
    FUZZ_CHECK(is_map(r, 5), "_health: not a map of 5");
    FUZZ_CHECK(is_str(ctl_obj_get(r, "status"), "serving"), "_health: status");
    FUZZ_CHECK(is_f64(ctl_obj_get(r, "uptime_s")), "_health: uptime_s");
    const msgpack_object *busy = ctl_obj_get(r, "in_flight");
    FUZZ_CHECK(is_uint(busy) && busy->via.u64 == 0, "_health: in_flight is not 0");
    FUZZ_CHECK(is_str(ctl_obj_get(r, "service"), storage_service.name), "_health: service");
    FUZZ_CHECK(is_str(ctl_obj_get(r, "version"), ctl_version()), "_health: version");
}

/* The result of _stats: {service, uptime_s, totals, ops}, the counters as
 * this target's core has them (no socket: the monitor's are zero). */
static void check_stats(const msgpack_object *r)
{
    static const char *const totals[] = {
        "requests", "replies", "dropped", "send_failures", "auth_denied", "undeclared",
        "unknown_op", "bytes_in", "bytes_out", "accept_failures", "handshake_failures",
        "conn_refused", "connections", "disconnects", "expired"};
    FUZZ_CHECK(is_map(r, 4), "_stats: not a map of 4");
    FUZZ_CHECK(is_str(ctl_obj_get(r, "service"), storage_service.name), "_stats: service");
    FUZZ_CHECK(is_f64(ctl_obj_get(r, "uptime_s")), "_stats: uptime_s");
    const msgpack_object *t = ctl_obj_get(r, "totals");
    FUZZ_CHECK(is_map(t, 16), "_stats: totals is not a map of 16");
    for (size_t i = 0; i < sizeof totals / sizeof totals[0]; i++)
        FUZZ_CHECK(is_uint(ctl_obj_get(t, totals[i])), "_stats: totals.%s", totals[i]);
    const msgpack_object *e = ctl_obj_get(t, "errors");
    FUZZ_CHECK(e && e->type == MSGPACK_OBJECT_MAP, "_stats: totals.errors");
    FUZZ_CHECK(ctl_obj_get(t, "requests")->via.u64 == counter(&core.counters.requests),
               "_stats: totals.requests is not the core's count");
    FUZZ_CHECK(ctl_obj_get(t, "connections")->via.u64 == 0 &&
                   ctl_obj_get(t, "accept_failures")->via.u64 == 0,
               "_stats: socket counters without a socket");
    const msgpack_object *ops = ctl_obj_get(r, "ops");
    size_t n = storage_service.op_count + BUILTIN_COUNT;
    FUZZ_CHECK(is_map(ops, (uint32_t)n), "_stats: ops is not a map of %zu", n);
    for (size_t i = 0; i < n; i++) {
        const char *name = i < storage_service.op_count ? storage_service.ops[i].name
                                                        : builtin_names[i - storage_service.op_count];
        const msgpack_object *o = ctl_obj_get(ops, name);
        FUZZ_CHECK(is_map(o, 8) && is_uint(ctl_obj_get(o, "calls")) &&
                       is_uint(ctl_obj_get(o, "p99_us")),
                   "_stats: ops.%s is not a map of 8 with its counters", name);
    }
    FUZZ_CHECK(ctl_obj_get(ctl_obj_get(ops, "_stats"), "calls")->via.u64 >= 1,
               "_stats: this call is not counted");
}

/* Judge a built-in's success reply. */
static void check_builtin(const char *name, const msgpack_object *result)
{
    FUZZ_CHECK(result != NULL, "%s: no result", name);
    if (strcmp(name, "_describe") == 0)
        check_describe(result);
    else if (strcmp(name, "_health") == 0)
        check_health(result);
    else
        check_stats(result);
}

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
    const char *builtin = dc == CTL_DECODE_DROP ? NULL : find_builtin(rq->op);
    const char *name = op ? op->name : builtin ? builtin : "?";
    /* A built-in serves exactly the well-formed requests with empty args. */
    bool builtin_serves = builtin && dc == CTL_DECODE_OK &&
                          rq->args.type == MSGPACK_OBJECT_MAP && rq->args.via.map.size == 0;
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
        FUZZ_CHECK(!builtin_serves, "%s refused a well-formed request: %s", name, err.msg);
    } else if (builtin) {
        FUZZ_CHECK(builtin_serves, "a success reply to %s with arguments", name);
        ctl_str id = ctl_reply_id(reply);
        FUZZ_CHECK(id.len == rq->id.len &&
                       (id.len == 0 || memcmp(id.ptr, rq->id.ptr, id.len) == 0),
                   "the reply carries another id");
        check_builtin(name, ctl_reply_result(reply));
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
    /* An op the unit does not know with the empty id: a newer client's
     * notify, dropped (PROTOCOL.md, "Malformed input"). */
    int unknown_notify = framed && dc != CTL_DECODE_DROP && !op && !find_builtin(rq.op) &&
                         rq.id.len == 0;
    int answered = framed && dc != CTL_DECODE_DROP && !notify && !unknown_notify;

    uint64_t requests = counter(&core.counters.requests);
    uint64_t dropped = counter(&core.counters.dropped);
    uint64_t expired = counter(&core.counters.expired);
    int64_t deadline = 0;
    int has_deadline = framed && dc != CTL_DECODE_DROP && !find_builtin(rq.op) &&
                       ctl_env_id_deadline(rq.id, &deadline);
    bool delimited = false;
    int64_t before = wall_ms();
    ctl_verdict v = ctl_dispatch_message(&core, &in, &delimited);
    int64_t after = wall_ms();
    int skipped = counter(&core.counters.expired) != expired;
    if (skipped) {
        FUZZ_CHECK(has_deadline && after - deadline > core.deadline_skew_ms &&
                       v == CTL_DISPATCH_SILENT && core.out.size == 0,
                   "a request skipped as expired that was not (mode %u)", mode);
        answered = 0;
    } else {
        FUZZ_CHECK(!has_deadline || before - deadline <= core.deadline_skew_ms,
                   "a request served past its deadline and the allowance (mode %u)", mode);
    }

    if (!framed || dc == CTL_DECODE_DROP) {
        FUZZ_CHECK(v == CTL_DISPATCH_DROPPED, "a message to drop was served (mode %u)", mode);
        FUZZ_CHECK(counter(&core.counters.dropped) == dropped + 1,
                   "a dropped message was not counted");
        FUZZ_CHECK(counter(&core.counters.requests) == requests,
                   "a dropped message was counted as a request");
    } else if (unknown_notify) {
        FUZZ_CHECK(v == CTL_DISPATCH_DROPPED && core.out.size == 0,
                   "a notify of an unknown op was answered (mode %u)", mode);
        FUZZ_CHECK(counter(&core.counters.dropped) == dropped + 1,
                   "a notify of an unknown op was not counted as dropped");
        FUZZ_CHECK(counter(&core.counters.requests) == requests + 1,
                   "a notify of an unknown op was not counted as a request");
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
