/*
 * test_curve.c - CURVE encryption and authentication (ctlrpc/curve.h).
 *
 * A unit with a secret key serves only clients that know its public key;
 * with an allowlist, only listed clients. Everyone else fails its handshake
 * and is told so well before its deadline (CTL_CAUSE_AUTH), while the unit
 * keeps serving the others. Key files: written with the right modes, a secret
 * key readable by others refused, malformed keys refused with the file
 * named; the other half of a pair, links, files or directories others can
 * write, NUL bytes, duplicate or secret allowlist entries refused, each
 * with the file and the mistake named.
 */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <cmocka.h>

#include <stdatomic.h>
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
    /* An allowlist without a secret key would admit every peer: refused. */
    allow[0] = f->alice_pub;
    so.curve_secret_key = NULL;
    assert_int_equal(ctl_server_new(&(ctl_service){.name = "x"}, NULL, &so, &s, &f->err),
                     CTL_INVALID);
    assert_non_null(strstr(f->err.msg, "curve_allow needs curve_secret_key"));
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
    /* A prefix that names no file: refused, nothing written. */
    assert_int_equal(ctl_curve_write_keypair(NULL, &f->err), CTL_INVALID);
    assert_non_null(strstr(f->err.msg, "names no file"));
    assert_int_equal(ctl_curve_write_keypair("", &f->err), CTL_INVALID);
    snprintf(path, sizeof path, "%s/", f->dir);
    assert_int_equal(ctl_curve_write_keypair(path, &f->err), CTL_INVALID);
    snprintf(path, sizeof path, "%s/.key", f->dir);
    assert_int_not_equal(stat(path, &st), 0);

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

/* Write `len` bytes to `dir`/`name` with `mode`; the path into `path`. */
static void put_file(const char *dir, const char *name, const char *text, size_t len,
                     mode_t mode, char *path, size_t cap)
{
    snprintf(path, cap, "%s/%s", dir, name);
    unlink(path);
    FILE *fp = fopen(path, "w");
    assert_non_null(fp);
    assert_int_equal(fwrite(text, 1, len, fp), len);
    fclose(fp);
    assert_int_equal(chmod(path, mode), 0);
}

/* Expect `rc` CTL_INVALID with a message holding `path` and `words`. */
static void refused(int rc, const ctl_error *err, const char *path, const char *words)
{
    assert_int_equal(rc, CTL_INVALID);
    if (!strstr(err->msg, path) || !strstr(err->msg, words))
        fail_msg("expected '%s' and '%s' in: %s", path, words, err->msg);
}

/* The other half of a pair, a link, files others could write, a NUL byte:
 * each refused with the file and the mistake named. */
static void test_key_file_mistakes(void **state)
{
    fx *f = *state;
    char prefix[128], sec[160], pub[160], path[192], link[192], key[CTL_CURVE_KEY_BUF];
    snprintf(prefix, sizeof prefix, "%s/alice", f->dir);
    assert_int_equal(ctl_curve_write_keypair(prefix, &f->err), 0);
    snprintf(sec, sizeof sec, "%s.key", prefix);
    snprintf(pub, sizeof pub, "%s.pub", prefix);

    /* A public key where the secret is wanted: said so, not "chmod 600"
     * (nor after a chmod 600 of the .pub). */
    refused(ctl_curve_read_key(pub, true, key, &f->err), &f->err, pub,
            "this is a public key; pass the .key file");
    assert_null(strstr(f->err.msg, "chmod"));
    assert_int_equal(chmod(pub, 0600), 0);
    refused(ctl_curve_read_key(pub, true, key, &f->err), &f->err, pub,
            "this is a public key; pass the .key file");
    assert_int_equal(chmod(pub, 0644), 0);
    /* The reverse: the secret key given as a peer's public key. */
    refused(ctl_curve_read_key(sec, false, key, &f->err), &f->err, sec,
            "this is a secret key; pass the .pub file");

    /* A symbolic link. */
    snprintf(link, sizeof link, "%s/link.key", f->dir);
    assert_int_equal(symlink(sec, link), 0);
    refused(ctl_curve_read_key(link, true, key, &f->err), &f->err, link, "symbolic link");

    /* Writable by others, or in a directory others can write. */
    assert_int_equal(chmod(pub, 0666), 0);
    refused(ctl_curve_read_key(pub, false, key, &f->err), &f->err, pub,
            "writable by others (mode 0666)");
    assert_int_equal(chmod(pub, 0644), 0);
    char open_dir[160];
    snprintf(open_dir, sizeof open_dir, "%s/open", f->dir);
    assert_int_equal(mkdir(open_dir, 0700), 0);
    put_file(open_dir, "x.pub", f->bob_pub, strlen(f->bob_pub), 0644, path, sizeof path);
    assert_int_equal(chmod(open_dir, 0777), 0);
    refused(ctl_curve_read_key(path, false, key, &f->err), &f->err, path,
            "in a directory that others can write");
    assert_non_null(strstr(f->err.msg, "mode 0777"));
    assert_int_equal(chmod(open_dir, 0700), 0);
    assert_int_equal(ctl_curve_read_key(path, false, key, &f->err), 0);
    assert_string_equal(key, f->bob_pub);

    /* Text after a NUL byte is not ignored: the file is refused. */
    char text[128];
    int n = snprintf(text, sizeof text, "%s", f->bob_pub);
    memcpy(text + n, "\0junk\n", 6);
    put_file(f->dir, "nul.pub", text, (size_t)n + 6, 0644, path, sizeof path);
    refused(ctl_curve_read_key(path, false, key, &f->err), &f->err, path,
            "holds a NUL byte (at offset 40)");
}

static void test_allowlist_mistakes(void **state)
{
    fx *f = *state;
    char text[512], path[192], link[192];
    char(*keys)[CTL_CURVE_KEY_BUF] = NULL;
    size_t n = 0;

    /* A key listed twice: both lines named. */
    int len = snprintf(text, sizeof text, "%s\n# bob\n%s\n%s\n", f->alice_pub, f->bob_pub,
                       f->alice_pub);
    put_file(f->dir, "dup.allow", text, (size_t)len, 0644, path, sizeof path);
    refused(ctl_curve_read_allowlist(path, &keys, &n, &f->err), &f->err, path,
            ":4: the key of line 1 again (a duplicate)");
    assert_null(keys);

    /* A secret key file pasted in. */
    len = snprintf(text, sizeof text, "%s\n# ctlrpc CURVE secret key: keep private\n%s\n",
                   f->alice_pub, f->bob_sec);
    put_file(f->dir, "pasted.allow", text, (size_t)len, 0644, path, sizeof path);
    refused(ctl_curve_read_allowlist(path, &keys, &n, &f->err), &f->err, path,
            ":2: this is a secret key file's header");

    /* Writable by others, a link, a NUL byte. */
    len = snprintf(text, sizeof text, "%s\n", f->alice_pub);
    put_file(f->dir, "ok.allow", text, (size_t)len, 0666, path, sizeof path);
    refused(ctl_curve_read_allowlist(path, &keys, &n, &f->err), &f->err, path,
            "allowlist");
    assert_non_null(strstr(f->err.msg, "writable by others"));
    assert_int_equal(chmod(path, 0644), 0);
    assert_int_equal(ctl_curve_read_allowlist(path, &keys, &n, &f->err), 0);
    assert_int_equal(n, 1);
    free(keys);
    snprintf(link, sizeof link, "%s/link.allow", f->dir);
    assert_int_equal(symlink(path, link), 0);
    refused(ctl_curve_read_allowlist(link, &keys, &n, &f->err), &f->err, link,
            "is a symbolic link");
    memcpy(text + len, "\0", 1);
    put_file(f->dir, "nul.allow", text, (size_t)len + 1, 0644, path, sizeof path);
    refused(ctl_curve_read_allowlist(path, &keys, &n, &f->err), &f->err, path,
            "holds a NUL byte");

    /* The unit's own secret key on its allowlist. */
    ctl_server_options so;
    ctl_server *s = NULL;
    const char *allow[] = {f->alice_pub, f->unit_sec};
    ctl_server_options_init(&so);
    so.endpoint = "tcp://127.0.0.1:*";
    so.curve_secret_key = f->unit_sec;
    so.curve_allow = allow;
    so.curve_allow_count = 2;
    assert_int_equal(ctl_server_new(&(ctl_service){.name = "x"}, NULL, &so, &s, &f->err),
                     CTL_INVALID);
    assert_non_null(strstr(f->err.msg, "allowed client key #1 is the unit's own secret key"));
    assert_null(s);
}

/* Refused handshakes of two kinds: each is logged with its own line (a
 * client that retries one mistake does not hide the other), and a count of
 * lines left out says what it counts. A plaintext client's refusal is seen
 * by the unit only when its greeting arrives before its connection closes,
 * so it is tried until seen (under a deadline). */
static _Atomic int mechanism_lines, curve_lines, mixed_counts;

static void count_lines(void *ctx, ctl_log_level level, const char *line)
{
    (void)ctx;
    (void)level;
    if (strstr(line, "refused a connection's handshake: the client's security mechanism"))
        atomic_fetch_add(&mechanism_lines, 1);
    else if (strstr(line, "refused a connection's handshake: CURVE authentication failed"))
        atomic_fetch_add(&curve_lines, 1);
    if (strstr(line, "more since the last line") ||
        (strstr(line, " more ") && !strstr(line, "more like this since the last such line")))
        atomic_fetch_add(&mixed_counts, 1);
}

static void test_refusals_logged_per_kind(void **state)
{
    fx *f = *state;
    ctl_log_set_sink(count_lines, NULL); /* before the unit starts, as log.h asks */
    start_unit(f, NULL, 0);
    int64_t deadline = tu_now_ms() + LONG_MS;
    while (atomic_load(&curve_lines) < 1 && tu_now_ms() < deadline)
        expect_auth_failure(f, f->bob_pub, NULL, "wrong server key");
    while (atomic_load(&mechanism_lines) < 1 && tu_now_ms() < deadline)
        expect_auth_failure(f, NULL, NULL, "no server key");
    ctl_log_set_sink(NULL, NULL);
    assert_true(atomic_load(&curve_lines) >= 1);
    assert_true(atomic_load(&mechanism_lines) >= 1);
    assert_int_equal(atomic_load(&mixed_counts), 0);
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
        T(test_key_file_mistakes),
        T(test_allowlist_mistakes),
        T(test_refusals_logged_per_kind),
    };
#undef T
    return cmocka_run_group_tests(tests, NULL, NULL);
}
