/*
 * stub.c - see ctlrpc/stub.h.
 */
#include "ctlrpc/stub.h"

#include <stdlib.h>
#include <string.h>

#include "util_int.h"

/* Pack args into `sb` (which the caller initialised and destroys). */
static int pack_args(msgpack_sbuffer *sb, ctl_enc_fn enc, const void *args)
{
    msgpack_packer pk;
    msgpack_packer_init(&pk, sb, msgpack_sbuffer_write);
    if (!enc)
        return msgpack_pack_map(&pk, 0) ? -1 : 0;
    return enc(&pk, args);
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
    return ctl_error_transfer(err, CTL_CAUSE_BAD_REPLY,
                              "%s at %s: bad result%s%s: %s", op, address,
                              *ctl_dec_where(&d) ? " at " : "",
                              ctl_dec_where(&d), ctl_dec_what(&d));
}

int ctl_stub_call(ctl_client *client, const char *address, const char *op,
                  ctl_enc_fn enc_args, const void *args, int timeout_ms,
                  ctl_dec_fn dec_result, void *result, ctl_reply **keep,
                  ctl_error *err)
{
    msgpack_sbuffer sb;
    ctl_reply *reply = NULL;
    if (keep)
        *keep = NULL;
    if (enc_args && !args)
        return ctl_error_set(err, CTL_INVALID, "%s at %s: args is NULL", op,
                             address ? address : "(null address)");
    msgpack_sbuffer_init(&sb);
    if (pack_args(&sb, enc_args, args) != 0) {
        msgpack_sbuffer_destroy(&sb);
        return ctl_error_transfer(err, CTL_CAUSE_NOMEM,
                                  "%s at %s: out of memory packing args", op,
                                  address ? address : "(null address)");
    }
    int rc = ctl_client_call(client, address, op, sb.data, sb.size, timeout_ms,
                             &reply, err);
    msgpack_sbuffer_destroy(&sb);
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

    /* Targets whose args could not be packed (out of memory) fail here;
     * the rest go out together: sent[k] is the outcome index of target k. */
    msgpack_sbuffer *bufs = calloc(count, sizeof *bufs);
    ctl_target *targets = calloc(count, sizeof *targets);
    ctl_outcome *raw = calloc(count, sizeof *raw);
    size_t *sent = calloc(count, sizeof *sent);
    size_t n = 0, failed = 0;
    if (!bufs || !targets || !raw || !sent) {
        for (size_t i = 0; i < count; i++)
            ctl_error_transfer((ctl_error *)AT(outcomes, i, layout, error_offset),
                               CTL_CAUSE_NOMEM, "%s_many: out of memory", op);
        failed = count;
        goto out;
    }
    for (size_t i = 0; i < count; i++) {
        const void *a = args ? (const char *)args + i * layout->args_size : NULL;
        msgpack_sbuffer_init(&bufs[i]);
        if (pack_args(&bufs[i], enc_args, a) != 0) {
            ctl_error_transfer((ctl_error *)AT(outcomes, i, layout, error_offset),
                               CTL_CAUSE_NOMEM,
                               "%s at %s: out of memory packing args", op,
                               addresses[i] ? addresses[i] : "(null address)");
            failed++;
            continue;
        }
        targets[n] = (ctl_target){addresses[i], bufs[i].data, bufs[i].size};
        sent[n++] = i;
    }
    ctl_client_call_many(client, op, targets, n, timeout_ms, raw);
    for (size_t k = 0; k < n; k++) {
        size_t i = sent[k];
        ctl_error *e = (ctl_error *)AT(outcomes, i, layout, error_offset);
        ctl_reply **r = (ctl_reply **)AT(outcomes, i, layout, reply_offset);
        /* Move the error: its strings now belong to the typed outcome. */
        *e = raw[k].error;
        ctl_error_init(&raw[k].error);
        if (raw[k].reply &&
            take_result(raw[k].reply, addresses[i], op, dec_result,
                        dec_result ? AT(outcomes, i, layout, result_offset) : NULL,
                        e) == 0 &&
            layout->keep_reply)
            *r = raw[k].reply;
        else
            ctl_reply_destroy(&raw[k].reply);
        raw[k].reply = NULL; /* moved or freed */
        if (e->kind != CTL_OK)
            failed++;
    }
out:
    if (bufs)
        for (size_t i = 0; i < count; i++)
            msgpack_sbuffer_destroy(&bufs[i]);
    if (raw)
        ctl_outcomes_fini(raw, n);
    free(bufs);
    free(targets);
    free(raw);
    free(sent);
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
    msgpack_sbuffer sb;
    if (enc_args && !args)
        return ctl_error_set(err, CTL_INVALID, "%s at %s: args is NULL", op,
                             address ? address : "(null address)");
    msgpack_sbuffer_init(&sb);
    if (pack_args(&sb, enc_args, args) != 0) {
        msgpack_sbuffer_destroy(&sb);
        return ctl_error_transfer(err, CTL_CAUSE_NOMEM,
                                  "%s at %s: out of memory packing args", op,
                                  address ? address : "(null address)");
    }
    int rc = ctl_client_notify(client, address, op, sb.data, sb.size, err);
    msgpack_sbuffer_destroy(&sb);
    return rc;
}

int ctl_stub_fail_args(ctl_req *req, const ctl_dec *d)
{
    char shown[CTL_SHOW_BUF];
    const char *where = ctl_dec_where(d);
    ctl_str op = ctl_req_op(req);
    ctl_show(shown, sizeof shown, op);
    if (*where == '.')
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
