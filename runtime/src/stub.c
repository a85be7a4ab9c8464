/*
 * stub.c - the calls and the serving of generated ops, driven by their
 * descriptors (ctlrpc/gen.h).
 *
 * A client stub packs its args straight into the request frame by the
 * op's args type (no intermediate buffer), calls through the client's
 * request paths (client_int.h), and decodes the result into the reply's
 * memory by the result type. A unit serves every generated op with
 * ctl_stub_serve: the args decode into the request's memory, the typed
 * handler runs through the descriptor's `invoke`, and its result is packed
 * by the result type.
 */
#include "ctlrpc/gen.h"

#include <stdlib.h>
#include <string.h>

#include "call_int.h"
#include "client_int.h"
#include "dispatch_int.h"
#include "engine_int.h"
#include "request_int.h"
#include "typed_int.h"
#include "util_int.h"

/* ---- client side ----------------------------------------------------- */

/* Frame [op, id, args], the args packed from the typed struct. */
static void frame_request(ctl_frame *f, const ctl_op_desc *op, bool notify,
                          const void *args)
{
    msgpack_packer pk;
    ctl_frame_begin(f, ctl_str_c(op->name), notify ? 0 : CTL_ID_LEN);
    if (f->failed)
        return;
    ctl_frame_packer(f, &pk);
    ctl_frame_packed(f, op->args ? ctl_type_pack(&pk, op->args, args)
                                 : msgpack_pack_map(&pk, 0));
    if (f->failed && op->args)
        f->invalid = ctl_type_invalid(op->args, args); /* NULL: out of memory */
}

static void *reply_alloc(void *owner, size_t size)
{
    return ctl_reply_alloc(owner, size);
}

int ctl_stub_decode_result(const ctl_op_desc *op, ctl_reply *reply,
                           const char *address, void *result, ctl_error *err)
{
    ctl_dec d;
    if (!op->result || !result)
        return 0;
    ctl_dec_init(&d, reply_alloc, reply);
    if (ctl_type_decode(ctl_reply_result(reply), op->result, result, &d) == 0)
        return 0;
    /* Named like an arg on the unit's side: "result.children[1].label"
     * (a cut path reads "result ...ren[1].label"). */
    return ctl_error_transfer(err, CTL_CAUSE_BAD_REPLY,
                              "%s at %s: bad reply: result%s%s: %s", op->name,
                              address, d.cut ? " " : "", ctl_dec_where(&d),
                              ctl_dec_what(&d));
}

/* The call flags of `op`: an op declared idempotent may be retried after a
 * timeout or a failure after its request left (ctl_retry_policy). */
static unsigned call_flags(const ctl_op_desc *op)
{
    return (op->flags & CTL_OP_IDEMPOTENT) ? CTL_CALL_IDEMPOTENT : 0;
}

/* The refusal of a NULL args struct for an op that takes args. */
static int null_args(const ctl_op_desc *op, const char *address, ctl_error *err)
{
    return ctl_error_set(err, CTL_INVALID, "%s at %s: args is NULL", op->name,
                         address ? address : "(null address)");
}

/* A remote error whose kind `op` declares becomes CTL_DECLARED with the
 * kind's code; other unknown kinds stay what the wire contract makes them
 * (CTL_TRANSFER, cause remote). Returns the error's kind. */
static int declared(const ctl_op_desc *op, ctl_error *err)
{
    if (!err || err->kind != CTL_TRANSFER || err->cause != CTL_CAUSE_REMOTE ||
        !err->remote_kind)
        return err ? (int)err->kind : CTL_TRANSFER;
    for (size_t i = 0; i < op->declared_count; i++) {
        if (strcmp(op->declared[i]->name, err->remote_kind) == 0) {
            err->kind = CTL_DECLARED;
            err->cause = CTL_CAUSE_NONE;
            err->code = op->declared[i]->code;
            break;
        }
    }
    return err->kind;
}

int ctl_stub_call(ctl_client *client, const char *address,
                  const ctl_op_desc *op, const void *args, int timeout_ms,
                  void *result, ctl_reply **reply, ctl_error *err)
{
    ctl_frame req;
    ctl_reply *got = NULL;
    if (reply)
        *reply = NULL;
    if (op->keep_reply && result && !reply)
        return ctl_error_set(err, CTL_INVALID,
                             "%s at %s: the result holds views into the reply: "
                             "pass `reply` to keep it", op->name,
                             address ? address : "(null address)");
    if (op->args && !args)
        return null_args(op, address, err);
    frame_request(&req, op, false, args);
    int rc = ctl_client_call_req(client, address, op->name, &req, timeout_ms,
                                 call_flags(op), &got, err);
    if (rc == CTL_TRANSFER)
        return declared(op, err);
    if (rc != 0)
        return rc;
    rc = ctl_stub_decode_result(op, got, address, result, err);
    if (rc == 0 && reply && op->keep_reply)
        *reply = got;
    else
        ctl_reply_destroy(&got);
    return rc;
}

/* The parts of the i-th outcome of `op`. */
static char *outcome(const ctl_op_desc *op, void *outcomes, size_t i)
{
    return (char *)outcomes + i * op->outcome_size;
}

static ctl_error *outcome_error(const ctl_op_desc *op, void *outcomes, size_t i)
{
    return (ctl_error *)(outcome(op, outcomes, i) + op->outcome_error);
}

static ctl_reply **outcome_reply(const ctl_op_desc *op, void *outcomes, size_t i)
{
    return (ctl_reply **)(outcome(op, outcomes, i) + op->outcome_reply);
}

/* Turn the untyped outcome raw[i] of a fan-out of `op` into its typed
 * outcome (its error and reply move; its result decodes). */
static void typed_outcome(const ctl_op_desc *op, ctl_outcome *raw,
                          const char *const *addresses, void *outcomes, size_t i)
{
    ctl_error *e = outcome_error(op, outcomes, i);
    /* Move the error: its strings now belong to the typed outcome. */
    *e = raw[i].error;
    ctl_error_init(&raw[i].error);
    declared(op, e);
    void *result = op->result ? outcome(op, outcomes, i) + op->outcome_result : NULL;
    if (raw[i].reply &&
        ctl_stub_decode_result(op, raw[i].reply, addresses[i], result, e) == 0 &&
        op->keep_reply)
        *outcome_reply(op, outcomes, i) = raw[i].reply;
    else
        ctl_reply_destroy(&raw[i].reply);
    raw[i].reply = NULL; /* moved or freed */
}

/* The engine's hook (ctl_call_ext.outcome_final): a fan-out's typed
 * outcome i, as its request ends. */
static void typed_outcome_final(ctl_call *call, size_t i)
{
    const ctl_op_desc *op = call->ext.desc;
    typed_outcome(op, call->outcomes, (const char *const *)call->addresses,
                  call->ext.typed, i);
    if (outcome_error(op, call->ext.typed, i)->kind != CTL_OK)
        call->ext.failed++;
    if (*outcome_reply(op, call->ext.typed, i))
        call->ext.kept++;
}

/* The engine's hook (ctl_call_ext.frame): pack request i of a fan-out of
 * `op` from the i-th of the caller's args, just before it is sent. */
static void typed_frame(ctl_call *call, size_t i)
{
    const ctl_op_desc *op = call->ext.desc;
    frame_request(&call->reqs[i], op, false,
                  call->ext.args ? (const char *)call->ext.args + i * op->args->size : NULL);
}

int ctl_stub_call_many(ctl_client *client, const ctl_op_desc *op,
                       const char *const *addresses, const void *args,
                       size_t count, int timeout_ms, void *outcomes)
{
    if (!op || !outcomes)
        return CTL_INVALID;
    for (size_t i = 0; i < count; i++) {
        ctl_error_init(outcome_error(op, outcomes, i));
        *outcome_reply(op, outcomes, i) = NULL;
    }
    if (!client || (count && (!addresses || (op->args && !args)))) {
        for (size_t i = 0; i < count; i++)
            ctl_error_set(outcome_error(op, outcomes, i), CTL_INVALID,
                          "%s_many: %s is NULL", op->name,
                          !client ? "client" : !addresses ? "addresses" : "args");
        return CTL_INVALID;
    }
    if (count == 0)
        return 0;

    int tmo = ctl_client_timeout(client, timeout_ms);
    ctl_call *call = ctl_call_alloc(client, op->name, addresses, count, 1, tmo);
    ctl_error err;
    ctl_error_init(&err);
    int rc;
    if (!call) {
        rc = ctl_error_transfer(&err, CTL_CAUSE_NOMEM, "%s_many: out of memory",
                                op->name);
    } else {
        /* One frame per target, args packed straight into the call as
         * each request goes out (the engine runs typed_frame); a target
         * whose packing ran out of memory gets its own error from the
         * fan-out. The engine fills the caller's outcomes as the requests
         * end; this thread reads them once the call has ended. */
        call->ext.desc = op;
        call->ext.args = args;
        call->ext.frame = typed_frame;
        call->ext.typed = outcomes;
        call->ext.outcome_final = typed_outcome_final;
        rc = ctl_client_many_run(call, call_flags(op), &err);
    }
    if (rc != 0) {
        for (size_t i = 0; i < count; i++)
            ctl_error_copy(outcome_error(op, outcomes, i), &err);
        ctl_error_fini(&err);
        return count > INT32_MAX ? INT32_MAX : (int)count;
    }
    size_t failed = call->ext.failed;
    ctl_call_release(call);
    return failed > INT32_MAX ? INT32_MAX : (int)failed;
}

void ctl_stub_outcomes_fini(const ctl_op_desc *op, void *outcomes, size_t count)
{
    if (!op || !outcomes)
        return;
    for (size_t i = 0; i < count; i++) {
        ctl_error_fini(outcome_error(op, outcomes, i));
        ctl_reply_destroy(outcome_reply(op, outcomes, i));
    }
}

int ctl_stub_notify(ctl_client *client, const char *address,
                    const ctl_op_desc *op, const void *args, ctl_error *err)
{
    ctl_frame req;
    if (op->args && !args)
        return null_args(op, address, err);
    frame_request(&req, op, true, args);
    return ctl_client_notify_req(client, address, op->name, &req, err);
}

/* ---- server side ----------------------------------------------------- */

static void *req_alloc(void *owner, size_t size)
{
    return ctl_req_alloc(owner, size);
}

/* Fail the request with the Protocol error that `d` describes ("op 'put':
 * arg keys[2]: expected str, got int"). */
static int fail_args(ctl_req *req, const ctl_dec *d)
{
    char shown[CTL_SHOW_BUF];
    const char *where = ctl_dec_where(d);
    ctl_show(shown, sizeof shown, ctl_req_op(req));
    /* "arg tree.label", not "arg .tree.label"; a cut path keeps its "...". */
    if (*where == '.' && !d->cut)
        where++;
    req->bad_args = true;
    if (*where)
        return ctl_req_fail(req, CTL_PROTOCOL, "op '%s': arg %s: %s", shown,
                            where, ctl_dec_what(d));
    return ctl_req_fail(req, CTL_PROTOCOL, "op '%s': %s", shown, ctl_dec_what(d));
}

/* An op that takes no args: any key is unknown. */
static int no_args(const ctl_op_desc *op, const msgpack_object *o, ctl_dec *d)
{
    ctl_str key = {"?", 1};
    if (o->type != MSGPACK_OBJECT_MAP)
        return ctl_dec_mismatch(d, "a map of args", o);
    if (o->via.map.size == 0)
        return 0;
    ctl_obj_str(&o->via.map.ptr[0].key, &key);
    ctl_dec_fail(d, "not an arg of %s, which takes none", op->name);
    return ctl_dec_at_key(d, key);
}

int ctl_stub_serve(void *handlers, const msgpack_object *args, ctl_req *req)
{
    const ctl_op_desc *op = ctl_req_entry(req)->desc;
    void *a = NULL, *result = NULL;
    ctl_dec d;
    char shown[CTL_SHOW_BUF];
    if (!op)
        return ctl_req_fail(req, CTL_PROTOCOL,
                            "op '%s' has no descriptor: its table entry "
                            "was not generated",
                            ctl_show(shown, sizeof shown, ctl_req_op(req)));
    ctl_dec_init(&d, req_alloc, req);
    if (op->args) {
        a = ctl_dec_alloc(&d, 1, op->args->size);
        if (!a || ctl_type_decode(args, op->args, a, &d) != 0)
            return fail_args(req, &d);
    } else if (no_args(op, args, &d) != 0) {
        return fail_args(req, &d);
    }
    if (op->result && !(result = ctl_dec_alloc(&d, 1, op->result->size)))
        return fail_args(req, &d);
    int rc = op->invoke(handlers, a, result, req);
    if (rc != 0 || !op->result)
        return rc;
    /* Refused before packing: a result over the unit's reply bound costs
     * no copy (a get of many large blobs). */
    size_t need = ctl_type_packed_size(op->result, result);
    if (need > ctl_req_reply_room(req))
        return ctl_req_fail(req, CTL_PROTOCOL,
                            "op '%s': the reply would be larger than this unit's "
                            "max_reply_bytes (%zu bytes; the result alone is %zu): ask "
                            "for less in one call",
                            ctl_show(shown, sizeof shown, ctl_req_op(req)),
                            ctl_req_max_reply(req), need);
    if (ctl_type_pack(ctl_req_packer(req), op->result, result) == 0)
        return 0;
    return ctl_req_fail(req, CTL_PROTOCOL,
                        "op '%s': out of memory packing the result",
                        ctl_show(shown, sizeof shown, ctl_req_op(req)));
}

/* ---- asynchronous calls ------------------------------------------------ */

/* Say why a typed call could not start: the typed _start functions have no
 * error argument, so the client's log carries the message (at most one
 * line a second per client and cause, with the count of those not
 * logged). */
static int start_failed(ctl_client *client, ctl_error *err)
{
    int kind = err->kind ? (int)err->kind : CTL_TRANSFER;
    if (client)
        ctl_client_log_limited(client, err->cause,
                               err->msg ? err->msg : "a call could not start");
    ctl_error_fini(err);
    return kind;
}

static void deliver_one(ctl_call *call)
{
    const ctl_op_desc *op = call->ext.desc;
    ctl_outcome *o = &call->outcomes[0];
    const void *result = NULL;
    declared(op, &o->error);
    if (o->reply && op->result) {
        void *r = ctl_reply_alloc(o->reply, op->result->size);
        if (!r)
            ctl_error_transfer(&o->error, CTL_CAUSE_NOMEM,
                               "%s at %s: out of memory for the result",
                               op->name, call->addresses[0]);
        else if (ctl_stub_decode_result(op, o->reply, call->addresses[0], r,
                                        &o->error) == 0)
            result = r;
    }
    ((ctl_stub_thunk *)call->ext.thunk)(call->ext.done, call->user, &o->error,
                                        result);
}

static void deliver_many(ctl_call *call)
{
    ((ctl_stub_many_thunk *)call->ext.thunk)(call->ext.done, call->user,
                                             call->ext.typed, call->count);
}

static void fini_many(ctl_call *call)
{
    if (!call->ext.typed)
        return;
    /* Outcomes that all succeeded with nothing kept hold nothing: a
     * thousand of them are not walked again (from the thread that
     * releases the call, whose caches the engine's thread filled). */
    if (call->ext.failed || call->ext.kept || call->finals < call->count)
        ctl_stub_outcomes_fini(call->ext.desc, call->ext.typed, call->count);
    free(call->ext.typed);
    call->ext.typed = NULL;
}

int ctl_stub_call_start(ctl_client *client, const char *address,
                        const ctl_op_desc *op, const void *args,
                        int timeout_ms, ctl_stub_thunk *thunk,
                        void (*done)(void), void *user, ctl_call **call)
{
    ctl_error err;
    ctl_error_init(&err);
    if (call)
        *call = NULL;
    if (!client || !address || !op || !thunk || !done || (op->args && !args)) {
        ctl_error_set(&err, CTL_INVALID, "%s_start at %s: %s is NULL",
                      op ? op->name : "(null op)",
                      address ? address : "(null address)",
                      !client ? "client" : !address ? "address" : !op ? "op"
                      : !done ? "done" : !thunk ? "thunk" : "args");
        return start_failed(client, &err);
    }
    int tmo = ctl_client_timeout(client, timeout_ms);
    ctl_call *c = ctl_call_alloc(client, op->name, &address, 1, 0, tmo);
    if (!c) {
        ctl_error_transfer(&err, CTL_CAUSE_NOMEM, "%s at %s: out of memory",
                           op->name, address);
        return start_failed(client, &err);
    }
    frame_request(&c->reqs[0], op, false, args);
    c->user = user;
    c->flags = call_flags(op);
    c->ext.deliver = deliver_one;
    c->ext.desc = op;
    c->ext.done = done;
    c->ext.thunk = (void (*)(void))thunk;
    if (ctl_call_submit(c, call, &err) != 0)
        return start_failed(client, &err);
    return 0;
}

int ctl_stub_call_many_start(ctl_client *client, const ctl_op_desc *op,
                             const char *const *addresses, const void *args,
                             size_t count, int timeout_ms,
                             ctl_stub_many_thunk *thunk, void (*done)(void),
                             void *user, ctl_call **call)
{
    ctl_error err;
    ctl_error_init(&err);
    if (call)
        *call = NULL;
    if (!client || !op || !thunk || !done ||
        (count && (!addresses || (op->args && !args)))) {
        ctl_error_set(&err, CTL_INVALID, "%s_many_start: %s is NULL",
                      op ? op->name : "(null op)",
                      !client ? "client" : !op ? "op" : !done ? "done"
                      : !thunk ? "thunk" : !addresses ? "addresses" : "args");
        return start_failed(client, &err);
    }
    int tmo = ctl_client_timeout(client, timeout_ms);
    ctl_call *c = ctl_call_alloc(client, op->name, addresses, count, 1, tmo);
    void *typed = calloc(count ? count : 1, op->outcome_size);
    if (!c || !typed) {
        free(typed);
        ctl_call_abandon(c);
        ctl_error_transfer(&err, CTL_CAUSE_NOMEM, "%s_many: out of memory",
                           op->name);
        return start_failed(client, &err);
    }
    /* calloc: every typed outcome starts as an initialised, empty error
     * (ctl_error_init is all zeros). The engine packs each frame as its
     * request goes out, all before ctl_call_submit returns. */
    c->user = user;
    c->flags = call_flags(op);
    c->ext.deliver = deliver_many;
    c->ext.fini = fini_many;
    c->ext.outcome_final = typed_outcome_final;
    c->ext.frame = typed_frame;
    c->ext.args = args;
    c->ext.desc = op;
    c->ext.typed = typed;
    c->ext.done = done;
    c->ext.thunk = (void (*)(void))thunk;
    c->send_on_submit = CTL_SEND_IDLE;
    if (ctl_call_submit(c, call, &err) != 0)
        return start_failed(client, &err);
    return 0;
}
