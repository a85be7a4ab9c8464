/*
 * fuzz_reply.c - the client's side of a reply: from the frames arriving on
 * a DEALER socket to the typed result (or the error) a stub hands back.
 *
 * As in fuzz_unit.c, the runtime's own code is compiled into this file so
 * that it can run without a socket: client.c with zmq_msg_recv and
 * zmq_msg_more renamed to fakes that hand out the fuzz input, stub.c (its
 * take_result is what every generated stub runs on a reply), and the
 * generated storage.ctl.c (its static result decoders). One call is then
 * played as a stub's call plays it once the request is sent: recv_one()
 * reads the frames as a fan-out does on a readable socket (skipping and
 * counting replies for other ids, failing on multi-frame messages and
 * undecodable payloads, turning error maps into ctl_errors with
 * ctl_error_from_reply), and take_result() decodes the result with the
 * op's generated decoder.
 *
 * Input: byte 0 picks the op (put, get, describe, pin, delete, list,
 * stats); the rest is messages separated by FUZZ_SEP (fuzz.h), each a
 * flags byte (bit 0: send this message as two frames) and a payload. The
 * call's request id is FUZZ_ID; messages with another id are late replies.
 *
 * What must hold (else the target aborts): a call that ends has either a
 * reply or an error, never both; an error has a kind the API documents and
 * a message naming the address; a Busy/Missing error's reason and blob ids
 * are readable strings; a reply carries the call's id; every view in a
 * decoded result lies in readable memory (each byte is read); replies for
 * other ids are counted as late; and nothing leaks (LeakSanitizer).
 */
#define _GNU_SOURCE

#define zmq_msg_recv fuzz_zmq_msg_recv
#define zmq_msg_more fuzz_zmq_msg_more
#include "client.c"
#undef zmq_msg_recv
#undef zmq_msg_more

#include "stub.c"

#include "storage.ctl.c"

#include "fuzz.h"

#include <errno.h>

#define FUZZ_ID "0123456789ab"
#define FUZZ_ADDR "tcp://127.0.0.1:5555"

/* ---- the socket, faked ---------------------------------------------- */

#define MAX_FRAMES (2 * FUZZ_MAX_MSGS)

static struct {
    fuzz_chunk frame[MAX_FRAMES];
    int more[MAX_FRAMES];
    size_t n, next;
    int last_more;
} rx;

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
    size_t i = rx.next++;
    const fuzz_chunk *f = &rx.frame[i];
    rx.last_more = rx.more[i];
    zmq_msg_close(msg);
    if (f->len == 0)
        return zmq_msg_init(msg), 0;
    /* An exact-size heap copy: an overread is an ASan report. */
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
    return rx.last_more;
}

/* ---- the call --------------------------------------------------------- */

typedef struct op_info {
    const char *name;
    ctl_dec_fn dec;
} op_info;

static const op_info ops[] = {
    {"put", storage__dec_put_result},
    {"get", storage__dec_get_result},
    {"describe", storage__dec_describe_result},
    {"pin", storage__dec_pin_result},
    {"delete", storage__dec_delete_result},
    {"list", storage__dec_list_result},
    {"stats", storage__dec_stats_result},
};

typedef union any_result {
    uint64_t u64;
    storage_list_bin bins;
    storage_list_str strs;
    storage_list_BlobInfo infos;
    storage_UnitStats stats;
} any_result;

static volatile unsigned sink;

/* Read every byte of a view: ASan checks it lies in live memory. */
static void touch(ctl_str s)
{
    unsigned h = 0;
    for (size_t i = 0; i < s.len; i++)
        h = h * 31 + (unsigned char)s.ptr[i];
    sink += h;
}

static void touch_result(const op_info *op, const any_result *r)
{
    const char *n = op->name;
    if (strcmp(n, "get") == 0) {
        for (size_t i = 0; i < r->bins.count; i++)
            touch(r->bins.items[i]);
    } else if (strcmp(n, "list") == 0) {
        for (size_t i = 0; i < r->strs.count; i++)
            touch(r->strs.items[i]);
    } else if (strcmp(n, "describe") == 0) {
        for (size_t i = 0; i < r->infos.count; i++) {
            touch(r->infos.items[i].key);
            sink += (unsigned)r->infos.items[i].size + r->infos.items[i].pinned +
                    r->infos.items[i].spilled;
        }
    } else if (strcmp(n, "stats") == 0) {
        sink += (unsigned)(r->stats.blobs + r->stats.requests);
    } else {
        sink += (unsigned)r->u64;
    }
}

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

static ctl_client *client;

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (!client) {
        ctl_error e;
        ctl_error_init(&e);
        FUZZ_CHECK(ctl_client_new(NULL, &client, &e) == 0, "ctl_client_new: %s", e.msg);
        ctl_error_fini(&e);
    }
    if (size == 0)
        return 0;
    const op_info *op = &ops[data[0] % (sizeof ops / sizeof ops[0])];

    fuzz_chunk msgs[FUZZ_MAX_MSGS];
    size_t n = fuzz_split(data + 1, size - 1, msgs, FUZZ_MAX_MSGS);
    memset(&rx, 0, sizeof rx);
    size_t messages = 0;
    for (size_t i = 0; i < n; i++) {
        if (msgs[i].len == 0)
            continue;
        fuzz_chunk payload = {msgs[i].data + 1, msgs[i].len - 1};
        if (msgs[i].data[0] & 1) {
            rx.more[rx.n] = 1;
            rx.frame[rx.n++] = payload;
        }
        rx.frame[rx.n++] = payload;
        messages++;
    }

    ctl_client_stats before, after;
    ctl_client_stats_get(client, &before);
    ctl_reply *reply = NULL;
    ctl_error err;
    ctl_error_init(&err);
    pending p;
    memset(&p, 0, sizeof p);
    p.address = FUZZ_ADDR;
    p.reply = &reply;
    p.err = &err;
    memcpy(p.id, FUZZ_ID, sizeof p.id);
    /* As a fan-out does on a readable socket. p.sock stays NULL: finish()
     * then has no socket to return or retire. */
    while (!p.done && recv_one(client, &p, op->name, ZMQ_DONTWAIT) == 0)
        ;
    ctl_client_stats_get(client, &after);

    if (!p.done) {
        FUZZ_CHECK(reply == NULL && err.kind == CTL_OK,
                   "a call that has not ended has an outcome");
        FUZZ_CHECK(rx.next == rx.n, "frames left unread by an unfinished call");
        FUZZ_CHECK(after.late_replies - before.late_replies == messages,
                   "%zu replies for other ids, %llu counted late", messages,
                   (unsigned long long)(after.late_replies - before.late_replies));
    } else if (reply) {
        FUZZ_CHECK(err.kind == CTL_OK, "a call with both a reply and an error");
        ctl_str id = ctl_reply_id(reply);
        FUZZ_CHECK(id.len == 12 && memcmp(id.ptr, FUZZ_ID, 12) == 0,
                   "the reply carries another id");
        any_result res;
        memset(&res, 0, sizeof res);
        if (take_result(reply, FUZZ_ADDR, op->name, op->dec, &res, &err) == 0)
            touch_result(op, &res);
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
