/*
 * runtime_demo.c - a short tour of libctlrpc's untyped API, the layer the
 * generated stubs sit on: start two units serving a tiny "kv" service, then
 * call, fan out, notify, and watch each error kind come back.
 *
 * Everything here is what a generated stub does for you; a real program
 * declares its ops in an IDL file and calls typed functions instead.
 */
#define _POSIX_C_SOURCE 200809L

#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <ctlrpc/ctlrpc.h>

/* The unit's state: one counter, guarded by the server's lock. */
typedef struct unit {
    uint64_t hits;
} unit;

static int op_echo(void *user, const msgpack_object *args, ctl_req *req)
{
    unit *u = user;
    u->hits++;
    return msgpack_pack_object(ctl_req_packer(req), *args) ? -1 : 0;
}

static int op_put(void *user, const msgpack_object *args, ctl_req *req)
{
    (void)user;
    uint64_t size = 0;
    if (!ctl_obj_u64(ctl_obj_get(args, "size"), &size))
        return ctl_req_fail(req, CTL_PROTOCOL, "put: arg 'size' must be a u64");
    if (size > 1000)
        return ctl_req_fail(req, CTL_UNIT_FULL,
                            "%" PRIu64 " bytes do not fit in 1000", size);
    return msgpack_pack_uint64(ctl_req_packer(req), size) ? -1 : 0;
}

static int op_delete(void *user, const msgpack_object *args, ctl_req *req)
{
    (void)user;
    (void)args;
    return ctl_req_busy(req, "pinned", "key 'a' is pinned");
}

static int op_get(void *user, const msgpack_object *args, ctl_req *req)
{
    (void)user;
    (void)args;
    ctl_str lost[] = {{"b", 1}, {"c", 1}};
    return ctl_req_missing(req, lost, 2, "2 keys are not here");
}

static int op_slow(void *user, const msgpack_object *args, ctl_req *req)
{
    (void)user;
    (void)args;
    struct timespec ts = {0, 300 * 1000 * 1000};
    nanosleep(&ts, NULL);
    return msgpack_pack_true(ctl_req_packer(req)) ? -1 : 0;
}

static int op_touch(void *user, const msgpack_object *args, ctl_req *req)
{
    (void)args;
    (void)req;
    ((unit *)user)->hits++;
    return 0;
}

static const ctl_op kv_ops[] = {
    {.name = "echo", .handler = op_echo},
    {.name = "put", .handler = op_put},
    {.name = "delete", .handler = op_delete},
    {.name = "get", .handler = op_get},
    {.name = "slow", .handler = op_slow},
    {.name = "touch", .handler = op_touch, .flags = CTL_OP_NOREPLY},
};
static const ctl_service kv = {.name = "kv", .ops = kv_ops,
    .op_count = sizeof kv_ops / sizeof kv_ops[0]};

/* Pack {"size": n} into `sb`. */
static void pack_size(msgpack_sbuffer *sb, uint64_t n)
{
    msgpack_packer pk;
    msgpack_sbuffer_clear(sb);
    msgpack_packer_init(&pk, sb, msgpack_sbuffer_write);
    msgpack_pack_map(&pk, 1);
    ctl_pack_cstr(&pk, "size");
    msgpack_pack_uint64(&pk, n);
}

static void show(const char *what, int rc, const ctl_reply *reply,
                 const ctl_error *err)
{
    printf("  %-28s ", what);
    if (rc == 0) {
        msgpack_object_print(stdout, *ctl_reply_result(reply));
        printf("\n");
        return;
    }
    printf("%s", ctl_kind_name(rc));
    if (err->kind == CTL_TRANSFER)
        printf("/%s", ctl_cause_name(err->cause));
    if (err->reason)
        printf(" reason=%s", err->reason);
    for (size_t i = 0; i < err->blob_count; i++)
        printf("%s%s", i ? "," : " blobs=", err->blobs[i].ptr);
    printf("\n  %-28s   %s\n", "", err->msg);
}

int main(void)
{
    unit u1 = {0}, u2 = {0};
    ctl_server *s1 = NULL, *s2 = NULL;
    ctl_client *client = NULL;
    ctl_error err;
    ctl_server_options so;
    ctl_error_init(&err);
    ctl_server_options_init(&so);
    so.endpoint = "tcp://127.0.0.1:*";

    if (ctl_server_new(&kv, &u1, &so, &s1, &err) ||
        ctl_server_new(&kv, &u2, &so, &s2, &err) ||
        ctl_client_new(NULL, &client, &err)) {
        fprintf(stderr, "runtime_demo: %s\n", err.msg);
        return 1;
    }
    const char *a1 = ctl_server_endpoint(s1), *a2 = ctl_server_endpoint(s2);
    printf("two units serving service 'kv': %s and %s\n\n", a1, a2);

    msgpack_sbuffer args;
    msgpack_sbuffer_init(&args);
    ctl_reply *reply = NULL;
    int rc;

    printf("call:\n");
    pack_size(&args, 42);
    rc = ctl_client_call(client, a1, "echo", args.data, args.size, 1000, &reply, &err);
    show("echo {size: 42}", rc, reply, &err);
    ctl_reply_destroy(&reply);
    rc = ctl_client_call(client, a1, "put", args.data, args.size, 1000, &reply, &err);
    show("put {size: 42}", rc, reply, &err);
    ctl_reply_destroy(&reply);

    printf("\nfan-out (call_many, one deadline for the batch):\n");
    ctl_target targets[2] = {{a1, args.data, args.size}, {a2, args.data, args.size}};
    ctl_outcome outcomes[2];
    int failed = ctl_client_call_many(client, "echo", targets, 2, 1000, outcomes);
    for (int i = 0; i < 2; i++)
        show(targets[i].address, outcomes[i].reply ? 0 : outcomes[i].error.kind,
             outcomes[i].reply, &outcomes[i].error);
    printf("  %d of 2 failed\n", failed);
    ctl_outcomes_fini(outcomes, 2);

    printf("\nnotify (no reply is sent, none is awaited):\n");
    rc = ctl_client_notify(client, a2, "touch", NULL, 0, &err);
    rc = ctl_client_call(client, a2, "echo", NULL, 0, 1000, &reply, &err);
    ctl_reply_destroy(&reply);
    pthread_mutex_lock(ctl_server_lock(s2));
    printf("  unit 2 handled %" PRIu64 " requests: the fan-out echo, the notify\n"
           "  and an echo sent after it on the same connection\n", u2.hits);
    pthread_mutex_unlock(ctl_server_lock(s2));

    printf("\nevery error kind:\n");
    pack_size(&args, 5000);
    rc = ctl_client_call(client, a1, "put", args.data, args.size, 1000, &reply, &err);
    show("put {size: 5000}", rc, reply, &err);
    rc = ctl_client_call(client, a1, "delete", NULL, 0, 1000, &reply, &err);
    show("delete", rc, reply, &err);
    rc = ctl_client_call(client, a1, "get", NULL, 0, 1000, &reply, &err);
    show("get", rc, reply, &err);
    rc = ctl_client_call(client, a1, "frobnicate", NULL, 0, 1000, &reply, &err);
    show("frobnicate (unknown op)", rc, reply, &err);
    rc = ctl_client_call(client, a1, "slow", NULL, 0, 100, &reply, &err);
    show("slow, 100 ms deadline", rc, reply, &err);
    rc = ctl_client_call(client, "tcp://127.0.0.1", "echo", NULL, 0, 100, &reply, &err);
    show("echo at a bad address", rc, reply, &err);

    ctl_server_stats st;
    ctl_server_stats_get(s1, &st);
    printf("\nunit 1: %" PRIu64 " requests, %" PRIu64 " replies, %" PRIu64
           " dropped\n", st.requests, st.replies, st.dropped);

    msgpack_sbuffer_destroy(&args);
    ctl_error_fini(&err);
    ctl_client_destroy(&client);
    ctl_server_destroy(&s1);
    ctl_server_destroy(&s2);
    return 0;
}
