/*
 * stub.c - see ctlrpc/stub.h.
 */
#include "ctlrpc/stub.h"

#include <stdlib.h>
#include <string.h>

#include "client_int.h"
#include "util_int.h"

/* Pack [op, id, args] into `req`, the args straight from the typed struct
 * into the frame that will be sent (no intermediate buffer). */
static void pack_request(ctl_request *req, const char *op, bool notify,
                         ctl_enc_fn enc, const void *args)
{
    msgpack_packer pk;
    ctl_request_begin(req, op, notify);
    if (req->failed)
        return;
    msgpack_packer_init(&pk, &req->sb, msgpack_sbuffer_write);
    req->failed = (enc ? enc(&pk, args) : msgpack_pack_map(&pk, 0)) != 0;
}

/* Decode the reply's result into `result`; on failure fill `err`. */
static int take_result(ctl_reply *reply, const char *address, const char *op,
                       ctl_dec_fn dec, void *result, ctl_error *err)
{
    ctl_dec d;
    if (!dec || !result)
        return 0;
    ctl_dec_init_reply(&d, reply);
    if (dec(ctl_reply_result(reply), result, &d) == 0)
        return 0;
    /* Named like an arg on the unit's side: "result.children[1].label"
     * (a cut path reads "result ...ren[1].label"). */
    return ctl_error_transfer(err, CTL_CAUSE_BAD_REPLY,
                              "%s at %s: bad reply: result%s%s: %s", op,
                              address, d.cut ? " " : "", ctl_dec_where(&d),
                              ctl_dec_what(&d));
}

int ctl_stub_call(ctl_client *client, const char *address, const char *op,
                  ctl_enc_fn enc_args, const void *args, int timeout_ms,
                  ctl_dec_fn dec_result, void *result, ctl_reply **keep,
                  ctl_error *err)
{
    ctl_request req;
    ctl_reply *reply = NULL;
    if (keep)
        *keep = NULL;
    if (enc_args && !args)
        return ctl_error_set(err, CTL_INVALID, "%s at %s: args is NULL", op,
                             address ? address : "(null address)");
    pack_request(&req, op, false, enc_args, args);
    int rc = ctl_client_call_req(client, address, op, &req, timeout_ms, &reply,
                                 err);
    if (rc != 0)
        return rc;
    rc = take_result(reply, address, op, dec_result, result, err);
    if (rc == 0 && keep)
        *keep = reply;
    else
        ctl_reply_destroy(&reply);
    return rc;
}

#define AT(base, i, layout, member)                                           \
    ((char *)(base) + (i) * (layout)->outcome_size + (layout)->member)

int ctl_stub_call_many(ctl_client *client, const char *op,
                       const char *const *addresses, size_t count,
                       ctl_enc_fn enc_args, const void *args, int timeout_ms,
                       ctl_dec_fn dec_result, void *outcomes,
                       const ctl_stub_layout *layout)
{
    if (!outcomes || !layout)
        return CTL_INVALID;
    for (size_t i = 0; i < count; i++) {
        ctl_error_init((ctl_error *)AT(outcomes, i, layout, error_offset));
        *(ctl_reply **)AT(outcomes, i, layout, reply_offset) = NULL;
    }
    if (!client || !op || (count && (!addresses || (enc_args && !args)))) {
        for (size_t i = 0; i < count; i++)
            ctl_error_set((ctl_error *)AT(outcomes, i, layout, error_offset),
                          CTL_INVALID, "%s_many: %s is NULL",
                          op ? op : "(null op)",
                          !client ? "client" : !op ? "op"
                                             : !addresses ? "addresses"
                                                          : "args");
        return CTL_INVALID;
    }
    if (count == 0)
        return 0;

    ctl_request *reqs = calloc(count, sizeof *reqs);
    ctl_outcome *raw = calloc(count, sizeof *raw);
    size_t failed = 0;
    if (!reqs || !raw) {
        for (size_t i = 0; i < count; i++)
            ctl_error_transfer((ctl_error *)AT(outcomes, i, layout, error_offset),
                               CTL_CAUSE_NOMEM, "%s_many: out of memory", op);
        free(reqs);
        free(raw);
        return count > INT32_MAX ? INT32_MAX : (int)count;
    }
    /* One frame per target, args packed straight into it; a target whose
     * packing ran out of memory gets its own error from the fan-out. */
    for (size_t i = 0; i < count; i++)
        pack_request(&reqs[i], op, false, enc_args,
                     args ? (const char *)args + i * layout->args_size : NULL);
    ctl_client_call_many_req(client, op, addresses, reqs, count, timeout_ms, raw);
    for (size_t i = 0; i < count; i++) {
        ctl_error *e = (ctl_error *)AT(outcomes, i, layout, error_offset);
        ctl_reply **r = (ctl_reply **)AT(outcomes, i, layout, reply_offset);
        /* Move the error: its strings now belong to the typed outcome. */
        *e = raw[i].error;
        ctl_error_init(&raw[i].error);
        if (raw[i].reply &&
            take_result(raw[i].reply, addresses[i], op, dec_result,
                        dec_result ? AT(outcomes, i, layout, result_offset) : NULL,
                        e) == 0 &&
            layout->keep_reply)
            *r = raw[i].reply;
        else
            ctl_reply_destroy(&raw[i].reply);
        raw[i].reply = NULL; /* moved or freed */
        if (e->kind != CTL_OK)
            failed++;
    }
    ctl_outcomes_fini(raw, count);
    free(reqs);
    free(raw);
    return failed > INT32_MAX ? INT32_MAX : (int)failed;
}

void ctl_stub_outcomes_fini(void *outcomes, size_t count,
                            const ctl_stub_layout *layout)
{
    if (!outcomes || !layout)
        return;
    for (size_t i = 0; i < count; i++) {
        ctl_error_fini((ctl_error *)AT(outcomes, i, layout, error_offset));
        ctl_reply_destroy((ctl_reply **)AT(outcomes, i, layout, reply_offset));
    }
}

int ctl_stub_notify(ctl_client *client, const char *address, const char *op,
                    ctl_enc_fn enc_args, const void *args, ctl_error *err)
{
    ctl_request req;
    if (enc_args && !args)
        return ctl_error_set(err, CTL_INVALID, "%s at %s: args is NULL", op,
                             address ? address : "(null address)");
    pack_request(&req, op, true, enc_args, args);
    return ctl_client_notify_req(client, address, op, &req, err);
}

int ctl_stub_fail_args(ctl_req *req, const ctl_dec *d)
{
    char shown[CTL_SHOW_BUF];
    const char *where = ctl_dec_where(d);
    ctl_str op = ctl_req_op(req);
    ctl_show(shown, sizeof shown, op);
    /* "arg tree.label", not "arg .tree.label"; a cut path keeps its "...". */
    if (*where == '.' && !d->cut)
        where++;
    if (*where)
        return ctl_req_fail(req, CTL_PROTOCOL, "op '%s': arg %s: %s", shown,
                            where, ctl_dec_what(d));
    return ctl_req_fail(req, CTL_PROTOCOL, "op '%s': %s", shown,
                        ctl_dec_what(d));
}

int ctl_stub_reply(ctl_req *req, ctl_enc_fn enc, const void *result)
{
    char shown[CTL_SHOW_BUF];
    if (enc(ctl_req_packer(req), result) == 0)
        return 0;
    return ctl_req_fail(req, CTL_PROTOCOL,
                        "op '%s': out of memory packing the result",
                        ctl_show(shown, sizeof shown, ctl_req_op(req)));
}
