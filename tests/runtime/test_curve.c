/*
 * test_curve.c - CURVE encryption and authentication (ctlrpc/curve.h).
 *
 * A unit with a secret key serves only clients that know its public key;
 * with an allowlist, only listed clients. Everyone else fails its handshake
 * and is told so well before its deadline (CTL_CAUSE_AUTH), while the unit
 * keeps serving the others. Key files: written with the right modes, a secret
 * key readable by others refused, malformed keys refused with the file
 * named.
 */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <cmocka.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include <ctlrpc/ctlrpc.h>

#include "testutil.h"

#define LONG_MS 30000 /* deadline of calls whose handshake must fail */
#define EARLY_MS 5000 /* they must fail well before it (a loaded machine) */
#define CALL_MS 5000

typedef struct fx {
    char unit_pub[CTL_CURVE_KEY_BUF], unit_sec[CTL_CURVE_KEY_BUF];
    char alice_pub[CTL_CURVE_KEY_BUF], alice_sec[CTL_CURVE_KEY_BUF];
    char bob_pub[CTL_CURVE_KEY_BUF], bob_sec[CTL_CURVE_KEY_BUF];
    tu_unit unit;
    ctl_error err;
    char dir[64];
} fx;

static int setup(void **state)
{
    fx *f = calloc(1, sizeof *f);
    ctl_error_init(&f->err);
    if (ctl_curve_keypair(f->unit_pub, f->unit_sec, &f->err) ||
        ctl_curve_keypair(f->alice_pub, f->alice_sec, &f->err) ||
        ctl_curve_keypair(f->bob_pub, f->bob_sec, &f->err))
        return -1;
    snprintf(f->dir, sizeof f->dir, "/tmp/ctl-curve-XXXXXX");
    if (!mkdtemp(f->dir))
        return -1;
    *state = f;
    return 0;
}

static int teardown(void **state)
{
    fx *f = *state;
    char cmd[128];
    tu_unit_stop(&f->unit);
    ctl_error_fini(&f->err);
    snprintf(cmd, sizeof cmd, "rm -rf %s", f->dir);
    if (system(cmd) != 0)
        return -1;
    free(f);
    return 0;
}

static void start_unit(fx *f, const char *const *allow, size_t n)
{
    ctl_server_options so;
    ctl_server_options_init(&so);
    so.curve_secret_key = f->unit_sec;
    so.curve_allow = allow;
    so.curve_allow_count = n;
    assert_int_equal(tu_unit_start(&f->unit, &so, &f->err), 0);
}

/* Make a client (server key and own secret key may be NULL) and call
 * `echo` once; returns the call's result code. */
static int call_as(fx *f, const char *server_key, const char *secret, int timeout_ms)
{
    ctl_client_options co;
    ctl_client *c = NULL;
    ctl_reply *reply = NULL;
    ctl_client_options_init(&co);
    co.curve_server_key = server_key;
    co.curve_secret_key = secret;
    co.late_grace_ms = 0;
    assert_int_equal(ctl_client_new(&co, &c, &f->err), 0);
    int rc = ctl_client_call(c, f->unit.endpoint, "echo", NULL, 0, timeout_ms,
                             &reply, &f->err);
    if (rc == 0)
        assert_int_equal(ctl_reply_result(reply)->type, MSGPACK_OBJECT_MAP);
    ctl_reply_destroy(&reply);
    ctl_client_destroy(&c);
    return rc;
}

static void test_right_server_key_works(void **state)
{
    fx *f = *state;
    start_unit(f, NULL, 0);
    assert_int_equal(call_as(f, f->unit_pub, NULL, CALL_MS), 0);
    assert_int_equal(call_as(f, f->unit_pub, f->alice_sec, CALL_MS), 0);
}

/* A call whose handshake must fail: an authentication failure, named,
 * well before the deadline. */
static void expect_auth_failure(fx *f, const char *server_key, const char *secret,
                                const char *says)
{
    int64_t t0 = tu_now_ms();
    assert_int_equal(call_as(f, server_key, secret, LONG_MS), CTL_TRANSFER);
    int64_t took = tu_now_ms() - t0;
    printf("auth failure after %lld ms: %s\n", (long long)took, f->err.msg);
    assert_int_equal(f->err.cause, CTL_CAUSE_AUTH);
    assert_non_null(strstr(f->err.msg, "authentication failed"));
    assert_non_null(strstr(f->err.msg, f->unit.endpoint));
    if (strstr(f->err.msg, says) == NULL)
        fail_msg("\"%s\" does not say \"%s\"", f->err.msg, says);
    if (took > EARLY_MS)
        fail_msg("a failed handshake took %lld ms to report", (long long)took);
}

static void test_strangers_are_told(void **state)
{
    fx *f = *state;
    start_unit(f, NULL, 0);
    /* No keys at all: a plain client cannot talk to a CURVE unit. */
    expect_auth_failure(f, NULL, NULL, "no server key");
    /* The wrong server key: the unit cannot read the client's hello. */
    expect_auth_failure(f, f->bob_pub, NULL, "wrong server key");
    /* The unit saw no request from either, and still serves. */
    ctl_server_stats st;
    ctl_server_stats_get(f->unit.server, &st);
    assert_int_equal(st.requests, 0);
    assert_int_equal(call_as(f, f->unit_pub, NULL, CALL_MS), 0);
}

static void test_allowlist(void **state)
{
    fx *f = *state;
    const char *allow[] = {f->alice_pub};
    start_unit(f, allow, 1);
    assert_int_equal(call_as(f, f->unit_pub, f->alice_sec, CALL_MS), 0);
    /* Bob knows the unit's key but is not on the list. */
    expect_auth_failure(f, f->unit_pub, f->bob_sec, "not on its allowlist");
    /* An ephemeral key is not on the list either. */
    expect_auth_failure(f, f->unit_pub, NULL, "not on its allowlist");
    ctl_server_stats st;
    ctl_server_stats_get(f->unit.server, &st);
    assert_true(st.auth_denied >= 2);
    assert_int_equal(st.requests, 1);
    /* Alice is still served after the refusals. */
    assert_int_equal(call_as(f, f->unit_pub, f->alice_sec, CALL_MS), 0);
}

/* A CURVE client calling a plaintext unit is told, too. */
static void test_curve_client_plain_unit(void **state)
{
    fx *f = *state;
    assert_int_equal(tu_unit_start(&f->unit, NULL, &f->err), 0);
    expect_auth_failure(f, f->unit_pub, NULL, "does not speak CURVE");
}

static void test_bad_keys_refused(void **state)
{
    fx *f = *state;
    ctl_server_options so;
    ctl_server *s = NULL;
    ctl_client *c = NULL;
    ctl_client_options co;
    const char *allow[] = {"not a key"};

    ctl_server_options_init(&so);
    so.endpoint = "tcp://127.0.0.1:*";
    so.curve_secret_key = "short";
    assert_int_equal(ctl_server_new(&(ctl_service){.name = "x"}, NULL, &so, &s, &f->err),
                     CTL_INVALID);
    assert_non_null(strstr(f->err.msg, "CURVE secret key"));
    so.curve_secret_key = f->unit_sec;
    so.curve_allow = allow;
    so.curve_allow_count = 1;
    assert_int_equal(ctl_server_new(&(ctl_service){.name = "x"}, NULL, &so, &s, &f->err),
                     CTL_INVALID);
    assert_non_null(strstr(f->err.msg, "allowed client key #0"));
    assert_null(s);

    ctl_client_options_init(&co);
    co.curve_server_key = "0123456789";
    assert_int_equal(ctl_client_new(&co, &c, &f->err), CTL_INVALID);
    assert_non_null(strstr(f->err.msg, "public key"));
    co.curve_server_key = NULL;
    co.curve_secret_key = f->alice_sec;
    assert_int_equal(ctl_client_new(&co, &c, &f->err), CTL_INVALID);
    assert_non_null(strstr(f->err.msg, "curve_server_key"));
    assert_null(c);
}

static void test_key_files(void **state)
{
    fx *f = *state;
    char prefix[128], path[160], key[CTL_CURVE_KEY_BUF], pub[CTL_CURVE_KEY_BUF];
    struct stat st;
    snprintf(prefix, sizeof prefix, "%s/unit", f->dir);
    assert_int_equal(ctl_curve_write_keypair(prefix, &f->err), 0);

    snprintf(path, sizeof path, "%s.key", prefix);
    assert_int_equal(stat(path, &st), 0);
    assert_int_equal(st.st_mode & 0777, 0600);
    assert_int_equal(ctl_curve_read_key(path, true, key, &f->err), 0);
    assert_int_equal(ctl_curve_public_of(key, pub, &f->err), 0);
    snprintf(path, sizeof path, "%s.pub", prefix);
    assert_int_equal(ctl_curve_read_key(path, false, key, &f->err), 0);
    assert_string_equal(key, pub);

    /* Never overwritten. */
    assert_int_equal(ctl_curve_write_keypair(prefix, &f->err), CTL_INVALID);
    assert_non_null(strstr(f->err.msg, "unit.key"));

    /* A secret key readable by others is refused, naming file and mode. */
    snprintf(path, sizeof path, "%s.key", prefix);
    assert_int_equal(chmod(path, 0644), 0);
    assert_int_equal(ctl_curve_read_key(path, true, key, &f->err), CTL_INVALID);
    assert_non_null(strstr(f->err.msg, path));
    assert_non_null(strstr(f->err.msg, "0644"));

    /* Malformed and missing files. */
    snprintf(path, sizeof path, "%s/bad.pub", f->dir);
    FILE *fp = fopen(path, "w");
    assert_non_null(fp);
    fputs("# comment\nnot-a-key\n", fp);
    fclose(fp);
    assert_int_equal(ctl_curve_read_key(path, false, key, &f->err), CTL_INVALID);
    assert_non_null(strstr(f->err.msg, "Z85"));
    snprintf(path, sizeof path, "%s/none.pub", f->dir);
    assert_int_equal(ctl_curve_read_key(path, false, key, &f->err), CTL_INVALID);
    assert_non_null(strstr(f->err.msg, path));
}

static void test_allowlist_file(void **state)
{
    fx *f = *state;
    char path[160];
    char(*keys)[CTL_CURVE_KEY_BUF] = NULL;
    size_t n = 0;
    snprintf(path, sizeof path, "%s/allow", f->dir);
    FILE *fp = fopen(path, "w");
    assert_non_null(fp);
    fprintf(fp, "# clients\n%s\n\n  %s  \n", f->alice_pub, f->bob_pub);
    fclose(fp);
    assert_int_equal(ctl_curve_read_allowlist(path, &keys, &n, &f->err), 0);
    assert_int_equal(n, 2);
    assert_string_equal(keys[0], f->alice_pub);
    assert_string_equal(keys[1], f->bob_pub);
    free(keys);

    fp = fopen(path, "a");
    fputs("garbage\n", fp);
    fclose(fp);
    assert_int_equal(ctl_curve_read_allowlist(path, &keys, &n, &f->err), CTL_INVALID);
    assert_non_null(strstr(f->err.msg, ":5:"));
    assert_null(keys);
}

int main(void)
{
    if (!ctl_curve_available()) {
        fprintf(stderr, "libzmq has no CURVE support: skipping\n");
        return 77;
    }
#define T(fn) cmocka_unit_test_setup_teardown(fn, setup, teardown)
    const struct CMUnitTest tests[] = {
        T(test_right_server_key_works),
        T(test_strangers_are_told),
        T(test_curve_client_plain_unit),
        T(test_allowlist),
        T(test_bad_keys_refused),
        T(test_key_files),
        T(test_allowlist_file),
    };
#undef T
    return cmocka_run_group_tests(tests, NULL, NULL);
}
