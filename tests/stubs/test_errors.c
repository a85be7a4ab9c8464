/*
 * test_errors.c - declared error kinds end to end (tests/stubs/errors.idl).
 *
 *   - a handler raising a kind its op declares, through the generated
 *     <service>_<op>_raise_<Kind> helper: the error map on the wire carries
 *     the kind's name, msg and reason; the generated client reports
 *     CTL_DECLARED with the kind's constant, name and reason; so does
 *     <op>_many, per address;
 *   - a client that does not know the kind (the untyped ctl_client_call, as
 *     a peer built before the kind existed) sees a well-formed error:
 *     CTL_TRANSFER, cause remote, the kind's name and reason kept;
 *   - `raises` is enforced: a handler failing with a kind its op does not
 *     declare (declared elsewhere, never declared, or built in) is answered
 *     with a Protocol error naming the op and the kind, and counted in
 *     ctl_server_stats.undeclared; declared and Protocol errors are not.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "errors.ctl.h"
#include "testutil.h"

#define CALL_MS 10000

static bool how_is(ctl_str how, const char *s)
{
    return how.len == strlen(s) && memcmp(how.ptr, s, how.len) == 0;
}

/* The failures every handler can be asked for; 1 when `how` is "ok". */
static int fail_as(ctl_req *req, ctl_str how)
{
    static const ctl_str gone[1] = {{"j1", 2}};
    if (how_is(how, "ok"))
        return 1;
    if (how_is(how, "Busy"))
        return ctl_req_busy(req, "later", "busy now");
    if (how_is(how, "Missing"))
        return ctl_req_missing(req, gone, 1, "no blob");
    if (how_is(how, "UnitFull"))
        return ctl_req_fail(req, CTL_UNIT_FULL, "full");
    if (how_is(how, "protocol"))
        return ctl_req_fail(req, CTL_PROTOCOL, "plain failure");
    if (how.len > 6 && memcmp(how.ptr, "raise:", 6) == 0) {
        char kind[64];
        snprintf(kind, sizeof kind, "%.*s", (int)how.len - 6, how.ptr + 6);
        return ctl_req_raise(req, kind, "by name", "raised by name");
    }
    return 0;
}

static jobs_get_handler on_get;
static jobs_touch_handler on_touch;
static jobs_plain_handler on_plain;

static int on_get(void *ctx, const jobs_get_args *a, jobs_Job *result, ctl_req *req)
{
    (void)ctx;
    if (how_is(a->how, "NoSuchJob"))
        return jobs_get_raise_NoSuchJob(req, NULL, "no job %llu", (unsigned long long)a->id);
    int rc = fail_as(req, a->how);
    if (rc <= 0)
        return rc;
    result->id = a->id;
    result->name = ctl_str_c("job");
    return 0;
}

static int on_touch(void *ctx, const jobs_touch_args *a, uint64_t *result, ctl_req *req)
{
    (void)ctx;
    if (how_is(a->how, "NoSuchJob"))
        return jobs_touch_raise_NoSuchJob(req, "purged", "no job %llu",
                                          (unsigned long long)a->id);
    if (how_is(a->how, "Stale"))
        return jobs_touch_raise_Stale(req, "version 7", "job %llu changed",
                                      (unsigned long long)a->id);
    int rc = fail_as(req, a->how);
    if (rc <= 0)
        return rc;
    *result = a->id + 1;
    return 0;
}

static int on_plain(void *ctx, const jobs_plain_args *a, uint64_t *result, ctl_req *req)
{
    (void)ctx;
    int rc = fail_as(req, a->how);
    if (rc <= 0)
        return rc;
    *result = 42;
    return 0;
}

typedef struct fx {
    jobs_handlers h;
    ctl_server *server;
    ctl_client *client;
    char address[CTL_ENDPOINT_MAX];
    ctl_error err;
} fx;

static int setup(void **state)
{
    fx *f = calloc(1, sizeof *f);
    if (!f)
        return -1;
    ctl_error_init(&f->err);
    f->h = (jobs_handlers){.on_get = on_get, .on_touch = on_touch, .on_plain = on_plain};
    ctl_server_options o;
    ctl_server_options_init(&o);
    o.endpoint = "tcp://127.0.0.1:*";
    if (jobs_serve(&f->h, &o, &f->server, &f->err) != 0 ||
        ctl_client_new(NULL, &f->client, &f->err) != 0) {
        fprintf(stderr, "setup: %s\n", f->err.msg ? f->err.msg : "?");
        return -1;
    }
    snprintf(f->address, sizeof f->address, "%s", ctl_server_endpoint(f->server));
    *state = f;
    return 0;
}

static int teardown(void **state)
{
    fx *f = *state;
    ctl_client_destroy(&f->client);
    ctl_server_close(f->server);
    ctl_server_destroy(&f->server);
    ctl_error_fini(&f->err);
    free(f);
    return 0;
}

static uint64_t undeclared(const fx *f)
{
    ctl_server_stats st;
    ctl_server_stats_get(f->server, &st);
    return st.undeclared;
}

static int touch(fx *f, const char *how, uint64_t *out)
{
    jobs_touch_args a = JOBS_TOUCH_ARGS_INIT;
    a.id = 5;
    a.how = ctl_str_c(how);
    return jobs_touch(f->client, f->address, &a, CALL_MS, out, &f->err);
}

static void test_declared_kind_reaches_the_caller(void **state)
{
    fx *f = *state;
    uint64_t r = 0;
    assert_int_equal(touch(f, "ok", &r), 0);
    assert_int_equal(r, 6);

    assert_int_equal(touch(f, "Stale", &r), CTL_DECLARED);
    assert_int_equal(f->err.kind, CTL_DECLARED);
    assert_int_equal(f->err.cause, CTL_CAUSE_NONE);
    assert_int_equal(f->err.code, JOBS_ERR_Stale);
    assert_string_equal(f->err.remote_kind, "Stale");
    assert_string_equal(f->err.reason, "version 7");
    assert_non_null(strstr(f->err.msg, "job 5 changed"));

    assert_int_equal(touch(f, "NoSuchJob", &r), CTL_DECLARED);
    assert_int_equal(f->err.code, JOBS_ERR_NoSuchJob);
    assert_string_equal(f->err.reason, "purged");

    /* No reason given: none arrives. */
    jobs_get_args g = JOBS_GET_ARGS_INIT;
    jobs_Job job;
    ctl_reply *reply = NULL;
    g.id = 9;
    g.how = ctl_str_c("NoSuchJob");
    assert_int_equal(jobs_get(f->client, f->address, &g, CALL_MS, &job, &reply, &f->err),
                     CTL_DECLARED);
    assert_null(reply);
    assert_int_equal(f->err.code, JOBS_ERR_NoSuchJob);
    assert_null(f->err.reason);
    assert_non_null(strstr(f->err.msg, "no job 9"));

    /* Built-in kinds the op declares stay what they were. */
    assert_int_equal(touch(f, "Busy", &r), CTL_BUSY);
    assert_string_equal(f->err.reason, "later");
    assert_int_equal(f->err.code, 0);
    assert_int_equal(undeclared(f), 0);
}

/* The wire form, read by a client that knows no declared kind. */
static void test_unknown_kind_is_well_formed(void **state)
{
    fx *f = *state;
    unsigned char args[64];
    msgpack_sbuffer sb;
    msgpack_packer pk;
    msgpack_sbuffer_init(&sb);
    msgpack_packer_init(&pk, &sb, msgpack_sbuffer_write);
    msgpack_pack_map(&pk, 2);
    ctl_pack_cstr(&pk, "id");
    msgpack_pack_uint64(&pk, 3);
    ctl_pack_cstr(&pk, "how");
    ctl_pack_cstr(&pk, "Stale");
    assert_true(sb.size <= sizeof args);
    memcpy(args, sb.data, sb.size);
    ctl_reply *reply = NULL;
    int rc = ctl_client_call(f->client, f->address, "touch", args, sb.size, CALL_MS, &reply,
                             &f->err);
    msgpack_sbuffer_destroy(&sb);
    assert_int_equal(rc, CTL_TRANSFER);
    assert_null(reply);
    assert_int_equal(f->err.cause, CTL_CAUSE_REMOTE);
    assert_string_equal(f->err.remote_kind, "Stale");
    assert_string_equal(f->err.reason, "version 7");
    assert_non_null(strstr(f->err.msg, "Stale error: job 3 changed"));
}

static void expect_undeclared(fx *f, int rc, const char *op, const char *kind, uint64_t count)
{
    char want[128];
    assert_int_equal(rc, CTL_TRANSFER);
    assert_int_equal(f->err.cause, CTL_CAUSE_REMOTE);
    assert_string_equal(f->err.remote_kind, "Protocol");
    snprintf(want, sizeof want, "op '%s' failed with %s, which it does not declare in 'raises'",
             op, kind);
    if (!strstr(f->err.msg, want))
        fail_msg("'%s' does not say \"%s\"", f->err.msg, want);
    assert_int_equal(undeclared(f), count);
}

static void test_raises_is_enforced(void **state)
{
    fx *f = *state;
    uint64_t r;
    /* Declared by the service, not by this op. */
    jobs_plain_args p = JOBS_PLAIN_ARGS_INIT;
    p.how = ctl_str_c("raise:Stale");
    expect_undeclared(f, jobs_plain(f->client, f->address, &p, CALL_MS, &r, &f->err), "plain",
                      "Stale", 1);
    /* Declared nowhere. */
    p.how = ctl_str_c("raise:Bogus");
    expect_undeclared(f, jobs_plain(f->client, f->address, &p, CALL_MS, &r, &f->err), "plain",
                      "Bogus", 2);
    /* Built in, not listed. */
    expect_undeclared(f, touch(f, "Missing", &r), "touch", "Missing", 3);
    expect_undeclared(f, touch(f, "UnitFull", &r), "touch", "UnitFull", 4);
    p.how = ctl_str_c("Busy");
    expect_undeclared(f, jobs_plain(f->client, f->address, &p, CALL_MS, &r, &f->err), "plain",
                      "Busy", 5);
    /* Protocol is implicit everywhere, and by name a declared kind is fine. */
    p.how = ctl_str_c("protocol");
    assert_int_equal(jobs_plain(f->client, f->address, &p, CALL_MS, &r, &f->err), CTL_TRANSFER);
    assert_non_null(strstr(f->err.msg, "plain failure"));
    assert_int_equal(touch(f, "raise:Stale", &r), CTL_DECLARED);
    assert_int_equal(f->err.code, JOBS_ERR_Stale);
    assert_string_equal(f->err.reason, "by name");
    /* A built-in name is not a declared kind. */
    assert_int_equal(touch(f, "raise:Busy", &r), CTL_TRANSFER);
    assert_non_null(strstr(f->err.msg, "'Busy' is not a declared error kind"));
    assert_int_equal(undeclared(f), 5);
}

static void test_many_reports_declared_kinds(void **state)
{
    fx *f = *state;
    const char *addrs[3] = {f->address, f->address, f->address};
    jobs_touch_args a[3] = {JOBS_TOUCH_ARGS_INIT, JOBS_TOUCH_ARGS_INIT, JOBS_TOUCH_ARGS_INIT};
    a[0].how = ctl_str_c("ok");
    a[1].how = ctl_str_c("Stale");
    a[2].how = ctl_str_c("NoSuchJob");
    jobs_touch_outcome out[3];
    assert_int_equal(jobs_touch_many(f->client, addrs, a, 3, CALL_MS, out), 2);
    assert_int_equal(out[0].error.kind, CTL_OK);
    assert_int_equal(out[0].result, 1);
    assert_int_equal(out[1].error.kind, CTL_DECLARED);
    assert_int_equal(out[1].error.code, JOBS_ERR_Stale);
    assert_string_equal(out[1].error.reason, "version 7");
    assert_int_equal(out[2].error.kind, CTL_DECLARED);
    assert_int_equal(out[2].error.code, JOBS_ERR_NoSuchJob);
    jobs_touch_outcomes_fini(out, 3);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup_teardown(test_declared_kind_reaches_the_caller, setup, teardown),
        cmocka_unit_test_setup_teardown(test_unknown_kind_is_well_formed, setup, teardown),
        cmocka_unit_test_setup_teardown(test_raises_is_enforced, setup, teardown),
        cmocka_unit_test_setup_teardown(test_many_reports_declared_kinds, setup, teardown),
    };
    return cmocka_run_group_tests_name("errors", tests, NULL, NULL);
}
