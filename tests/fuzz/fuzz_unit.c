/*
 * fuzz_unit.c - the storage unit's request path, from the frames of one
 * received message to the frames of its reply, without a socket.
 *
 * The runtime has no socket-free entry point: a ctl_server reads and
 * answers its ROUTER on its own thread (server.c's serve_one). To drive
 * exactly that code at in-process speed, this file compiles server.c into
 * itself with the four ZeroMQ calls serve_one makes on the socket
 * (zmq_msg_recv, zmq_msg_more, zmq_msg_send, zmq_send) renamed to fakes
 * below: the fake receive hands out the frames of the fuzz input, the fake
 * sends record the reply. Everything else is the real thing: the server is
 * made by storage_serve() (the generated entry point; it binds
 * tcp://127.0.0.1:* once and is closed again at once, so its thread never
 * reads a message), requests go through the envelope decoder, the op
 * lookup, the generated args decoders of idl/storage.idl, the storage
 * unit's own handlers (examples/storage/handlers.c) over a real store, the
 * generated result encoders and the error replies.
 *
 * Input: messages separated by FUZZ_SEP (fuzz.h). The first byte of each
 * says how it is framed, the rest is the payload:
 *   0-3  [identity, payload]              the DEALER form
 *   4    [identity, "", payload]          the REQ form (delimiter echoed)
 *   5    [identity, "x", payload]         bad delimiter: dropped
 *   6    [identity]                       no payload: dropped
 *   7    [identity, "", payload, payload] too many frames: dropped
 * (higher values wrap). Each input gets a fresh store of 1 KiB without a
 * spill directory, so UnitFull is reachable with small inputs.
 *
 * What must hold for every message (else the target aborts):
 *   - a reply comes exactly when the protocol says one is due: the framing
 *     is usable, the payload has an op and an id (PROTOCOL.md "Malformed
 *     input"), and the op is not a notify; dropped messages are counted;
 *   - the reply has the request's framing and identity, is one well-formed
 *     [id, ok, body] with the request's id, an error body is a well-formed
 *     error map (the client would not call it a bad reply), and a result
 *     decodes with the client's generated result decoder of that op (the
 *     two ends of the generated code agree);
 *   - put answers the length of the data it was given.
 * AddressSanitizer and UBSan check every access on the way.
 */
#define _GNU_SOURCE

/* Only serve_one's socket calls are redirected; zmq_msg_init & co. are
 * the real ones. */
#define zmq_msg_recv fuzz_zmq_msg_recv
#define zmq_msg_more fuzz_zmq_msg_more
#define zmq_msg_send fuzz_zmq_msg_send
#define zmq_send fuzz_zmq_send
#include "server.c"
#undef zmq_msg_recv
#undef zmq_msg_more
#undef zmq_msg_send
#undef zmq_send

/* The generated client and dispatch code of storage.idl, for its static
 * result decoders (the oracle below); it also provides storage_service and
 * storage_serve to the handlers. */
#include "storage.ctl.c"

#include "handlers.h"
#include "fuzz.h"

#include <errno.h>

/* ---- the socket, faked ---------------------------------------------- */

#define MAX_FRAMES 4

static struct {
    fuzz_chunk frame[MAX_FRAMES];
    size_t n, next;
    int more;
} rx;

static struct {
    unsigned char *frame[MAX_FRAMES];
    size_t len[MAX_FRAMES];
    size_t n;        /* frames of the current reply */
    int messages;    /* complete messages sent */
} tx;

static void free_copy(void *data, void *hint)
{
    (void)hint;
    free(data);
}

int fuzz_zmq_msg_recv(zmq_msg_t *msg, void *socket, int flags)
{
    (void)socket;
    (void)flags;
    if (rx.next >= rx.n) {
        errno = EAGAIN;
        return -1;
    }
    const fuzz_chunk *f = &rx.frame[rx.next++];
    rx.more = rx.next < rx.n;
    zmq_msg_close(msg);
    if (f->len == 0)
        return zmq_msg_init(msg), 0;
    /* An exact-size heap copy, so that reading one byte past the payload
     * is an ASan report (libzmq keeps small messages inline, where an
     * overread would go unnoticed). */
    void *copy = malloc(f->len);
    FUZZ_CHECK(copy != NULL, "out of memory");
    memcpy(copy, f->data, f->len);
    FUZZ_CHECK(zmq_msg_init_data(msg, copy, f->len, free_copy, NULL) == 0,
               "zmq_msg_init_data failed");
    return (int)f->len;
}

int fuzz_zmq_msg_more(const zmq_msg_t *msg)
{
    (void)msg;
    return rx.more;
}

static void record(const void *data, size_t len, int flags)
{
    FUZZ_CHECK(tx.messages == 0, "a second reply to one request");
    FUZZ_CHECK(tx.n < MAX_FRAMES, "a reply of more than %d frames", MAX_FRAMES);
    tx.frame[tx.n] = malloc(len ? len : 1);
    FUZZ_CHECK(tx.frame[tx.n] != NULL, "out of memory");
    if (len)
        memcpy(tx.frame[tx.n], data, len);
    tx.len[tx.n++] = len;
    if (!(flags & ZMQ_SNDMORE))
        tx.messages++;
}

int fuzz_zmq_send(void *socket, const void *buf, size_t len, int flags)
{
    (void)socket;
    record(buf, len, flags);
    return (int)len;
}

int fuzz_zmq_msg_send(zmq_msg_t *msg, void *socket, int flags)
{
    (void)socket;
    size_t len = zmq_msg_size(msg);
    record(zmq_msg_data(msg), len, flags);
    /* As libzmq does on success: the message is consumed, left empty. */
    zmq_msg_close(msg);
    zmq_msg_init(msg);
    return (int)len;
}

static void tx_reset(void)
{
    for (size_t i = 0; i < tx.n; i++)
        free(tx.frame[i]);
    memset(&tx, 0, sizeof tx);
}

/* ---- the unit --------------------------------------------------------- */

static storage_unit unit = {NULL, NULL, PTHREAD_MUTEX_INITIALIZER};
static storage_handlers handlers;
static ctl_limits limits;
static int verbose; /* $FUZZ_VERBOSE: one line per message on stderr */
static int last_ok; /* the last reply checked was a success */

static void setup(void)
{
    ctl_server_options so;
    ctl_error err;
    ctl_error_init(&err);
    ctl_server_options_init(&so);
    so.endpoint = "tcp://127.0.0.1:0";
    so.lock = &unit.lock;
    storage_unit_handlers(&unit, &handlers);
    FUZZ_CHECK(storage_serve(&handlers, &so, &unit.server, &err) == 0,
               "cannot start the unit: %s", err.msg);
    /* Its thread is joined and its socket closed; serve_one is called
     * directly from here on. */
    ctl_server_close(unit.server);
    limits = ctl_limits_resolve(NULL);
    verbose = getenv("FUZZ_VERBOSE") != NULL;
    ctl_error_fini(&err);
}

/* ---- the oracle ------------------------------------------------------- */

typedef struct op_info {
    const char *name;
    ctl_dec_fn dec_result; /* NULL for notify ops */
} op_info;

static const op_info ops[] = {
    {"put", storage__dec_put_result},
    {"get", storage__dec_get_result},
    {"describe", storage__dec_describe_result},
    {"pin", storage__dec_pin_result},
    {"unpin", NULL},
    {"abort", NULL},
    {"delete", storage__dec_delete_result},
    {"list", storage__dec_list_result},
    {"stats", storage__dec_stats_result},
};

static const op_info *find_info(ctl_str name)
{
    for (size_t i = 0; i < sizeof ops / sizeof ops[0]; i++)
        if (strlen(ops[i].name) == name.len &&
            memcmp(ops[i].name, name.ptr, name.len) == 0)
            return &ops[i];
    return NULL;
}

static void *zone_alloc(void *owner, size_t size)
{
    return ctl_zone_alloc(owner, size);
}

/* The result of any op of storage.idl. */
typedef union any_result {
    uint64_t u64;
    storage_list_bin bins;
    storage_list_str strs;
    storage_list_BlobInfo infos;
    storage_UnitStats stats;
} any_result;

static void check_reply(const fuzz_chunk *payload, ctl_decode d,
                        const ctl_request_view *rq, const op_info *info)
{
    char why[160];
    msgpack_zone zone;
    ctl_reply_view v;
    FUZZ_CHECK(msgpack_zone_init(&zone, 1024), "out of memory");
    int rc = ctl_wire_decode_reply(payload->data, payload->len, &limits, &zone,
                                   &v, why, sizeof why);
    FUZZ_CHECK(rc == 0, "the unit sent a reply the client cannot decode: %s", why);
    last_ok = v.ok;
    FUZZ_CHECK(v.id.len == rq->id.len &&
                   (rq->id.len == 0 || memcmp(v.id.ptr, rq->id.ptr, rq->id.len) == 0),
               "the reply carries another id");
    if (!v.ok) {
        ctl_error err;
        ctl_error_init(&err);
        int kind = ctl_error_from_reply(&err, "fuzz", info ? info->name : "?", &v.body);
        FUZZ_CHECK(kind != CTL_OK && err.msg != NULL, "an error reply without an error");
        FUZZ_CHECK(!(kind == CTL_TRANSFER && err.cause == CTL_CAUSE_BAD_REPLY),
                   "the unit sent a malformed error map: %s", err.msg);
        ctl_error_fini(&err);
    } else {
        FUZZ_CHECK(info != NULL && d == CTL_DECODE_OK,
                   "a success reply to a request that could not be served");
        ctl_dec dec;
        any_result res;
        memset(&res, 0, sizeof res);
        ctl_dec_init_reply(&dec, NULL);
        dec.alloc = zone_alloc;
        dec.owner = &zone;
        FUZZ_CHECK(info->dec_result(&v.body, &res, &dec) == 0,
                   "the client's decoder refuses the unit's %s result: %s: %s",
                   info->name, ctl_dec_where(&dec), ctl_dec_what(&dec));
        if (strcmp(info->name, "put") == 0) {
            const msgpack_object *data = ctl_obj_get(&rq->args, "data");
            FUZZ_CHECK(data && data->type == MSGPACK_OBJECT_BIN &&
                           res.u64 == data->via.bin.size,
                       "put answered %llu for %u bytes",
                       (unsigned long long)res.u64,
                       data ? (unsigned)data->via.bin.size : 0u);
        }
    }
    msgpack_zone_destroy(&zone);
}

static void serve_message(const fuzz_chunk *msg)
{
    static const char identity[] = "\0fuzz";
    const fuzz_chunk id_frame = {(const uint8_t *)identity, sizeof identity - 1};
    const fuzz_chunk empty = {(const uint8_t *)"", 0};
    const fuzz_chunk bad_delim = {(const uint8_t *)"x", 1};
    unsigned mode = msg->len ? msg->data[0] % 8 : 0;
    fuzz_chunk payload = {msg->len ? msg->data + 1 : msg->data,
                          msg->len ? msg->len - 1 : 0};

    memset(&rx, 0, sizeof rx);
    rx.frame[rx.n++] = id_frame;
    switch (mode) {
    case 4:
        rx.frame[rx.n++] = empty;
        rx.frame[rx.n++] = payload;
        break;
    case 5:
        rx.frame[rx.n++] = bad_delim;
        rx.frame[rx.n++] = payload;
        break;
    case 6:
        break;
    case 7:
        rx.frame[rx.n++] = empty;
        rx.frame[rx.n++] = payload;
        rx.frame[rx.n++] = payload;
        break;
    default:
        rx.frame[rx.n++] = payload;
        break;
    }
    int framed = mode <= 4;

    /* What the unit should make of it, decoded separately. */
    char why[160];
    msgpack_zone zone;
    ctl_request_view rq;
    FUZZ_CHECK(msgpack_zone_init(&zone, 1024), "out of memory");
    ctl_decode d = ctl_wire_decode_request(payload.data, payload.len, &limits,
                                           &zone, &rq, why, sizeof why);
    const op_info *info = d == CTL_DECODE_DROP ? NULL : find_info(rq.op);
    int answered = framed && d != CTL_DECODE_DROP && !(info && !info->dec_result);

    ctl_server_stats before, after;
    ctl_server_stats_get(unit.server, &before);
    tx_reset();
    FUZZ_CHECK(serve_one(unit.server, ZMQ_DONTWAIT) == 0, "serve_one found no message");
    FUZZ_CHECK(rx.next == rx.n, "serve_one left %zu frames unread", rx.n - rx.next);
    ctl_server_stats_get(unit.server, &after);

    if (!framed || d == CTL_DECODE_DROP)
        FUZZ_CHECK(after.dropped == before.dropped + 1,
                   "a dropped message was not counted");
    else
        FUZZ_CHECK(after.requests == before.requests + 1,
                   "a request was not counted");
    if (!answered) {
        FUZZ_CHECK(tx.n == 0, "an answer to a message that gets none (mode %u)", mode);
    } else {
        size_t want = mode == 4 ? 3 : 2;
        FUZZ_CHECK(tx.messages == 1 && tx.n == want,
                   "expected one reply of %zu frames, got %d message(s), %zu frames",
                   want, tx.messages, tx.n);
        FUZZ_CHECK(tx.len[0] == id_frame.len &&
                       memcmp(tx.frame[0], identity, id_frame.len) == 0,
                   "the reply goes to another peer");
        if (mode == 4)
            FUZZ_CHECK(tx.len[1] == 0, "the delimiter came back non-empty");
        fuzz_chunk reply = {tx.frame[want - 1], tx.len[want - 1]};
        check_reply(&reply, d, &rq, info);
    }
    if (verbose)
        fprintf(stderr, "fuzz_unit: mode %u, %s, op '%.*s': %s\n", mode,
                d == CTL_DECODE_OK ? "decoded" : d == CTL_DECODE_BAD ? "bad" : "dropped",
                d == CTL_DECODE_DROP ? 0 : (int)rq.op.len, rq.op.ptr,
                !answered ? "no reply" : last_ok ? "ok" : "error");
    tx_reset();
    msgpack_zone_destroy(&zone);
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
    ctl_error_fini(&err);

    fuzz_chunk msgs[FUZZ_MAX_MSGS];
    size_t n = fuzz_split(data, size, msgs, FUZZ_MAX_MSGS);
    for (size_t i = 0; i < n; i++)
        serve_message(&msgs[i]);

    store_destroy(&unit.store);
    return 0;
}
