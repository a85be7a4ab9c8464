/*
 * test_net.c - endpoint parsing and formatting, and the node IP with and
 * without the CTLRPC_NODE_IP override (net.h).
 *
 * The fixture saves and restores CTLRPC_NODE_IP so the tests do not leak
 * the override into one another or depend on the caller's environment.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>

#include <arpa/inet.h>
#include <stdlib.h>
#include <string.h>

#include "testutil.h"

typedef struct fx {
    ctl_error err;
    ctl_endpoint ep;
    char *saved_env; /* CTLRPC_NODE_IP on entry, or NULL */
} fx;

static int setup(void **state)
{
    fx *f = calloc(1, sizeof *f);
    const char *e = getenv(CTL_NODE_IP_ENV);
    if (f == NULL)
        return -1;
    ctl_error_init(&f->err);
    f->saved_env = e ? strdup(e) : NULL;
    unsetenv(CTL_NODE_IP_ENV);
    *state = f;
    return 0;
}

static int teardown(void **state)
{
    fx *f = *state;
    if (f->saved_env) {
        setenv(CTL_NODE_IP_ENV, f->saved_env, 1);
        free(f->saved_env);
    } else {
        unsetenv(CTL_NODE_IP_ENV);
    }
    ctl_error_fini(&f->err);
    free(f);
    return 0;
}

/* ---- ctl_endpoint_parse: valid ------------------------------------------ */

static void expect_ok(fx *f, const char *text, const char *host, unsigned port,
                      int any)
{
    memset(&f->ep, 0x5a, sizeof f->ep);
    int rc = ctl_endpoint_parse(text, &f->ep, &f->err);
    if (rc != 0)
        fail_msg("\"%s\" refused: %s", text, f->err.msg ? f->err.msg : "(no message)");
    assert_string_equal(f->ep.host, host);
    assert_int_equal(f->ep.port, port);
    assert_int_equal(!!f->ep.any_port, any);
}

static void test_parse_valid(void **state)
{
    fx *f = *state;
    expect_ok(f, "tcp://127.0.0.1:5555", "127.0.0.1", 5555, 0);
    expect_ok(f, "tcp://127.0.0.1:1", "127.0.0.1", 1, 0);
    expect_ok(f, "tcp://127.0.0.1:65535", "127.0.0.1", 65535, 0);
    expect_ok(f, "tcp://127.0.0.1:0", "127.0.0.1", 0, 1);
    expect_ok(f, "tcp://127.0.0.1:*", "127.0.0.1", 0, 1);
    expect_ok(f, "tcp://*:*", "*", 0, 1);
    expect_ok(f, "tcp://*:7000", "*", 7000, 0);
    expect_ok(f, "tcp://localhost:80", "localhost", 80, 0);
    expect_ok(f, "tcp://unit-7.rack2.example:9000", "unit-7.rack2.example", 9000, 0);
    expect_ok(f, "tcp://[::1]:9000", "[::1]", 9000, 0);
    expect_ok(f, "tcp://[fe80::1:2]:*", "[fe80::1:2]", 0, 1);
}

/* ---- ctl_endpoint_parse: each invalid form --------------------------------- */

static void expect_invalid(fx *f, const char *text)
{
    int rc = ctl_endpoint_parse(text, &f->ep, &f->err);
    if (rc != CTL_INVALID)
        fail_msg("\"%s\" gave %d, expected CTL_INVALID", text, rc);
    assert_int_equal(f->err.kind, CTL_INVALID);
    assert_non_null(f->err.msg);
    if (text[0] != '\0' && strstr(f->err.msg, text) == NULL)
        fail_msg("message for \"%s\" does not quote it: \"%s\"", text, f->err.msg);
}

static void test_parse_invalid_forms(void **state)
{
    fx *f = *state;
    const char *bad[] = {
        "",                          /* empty */
        "127.0.0.1:5555",            /* no scheme */
        "udp://127.0.0.1:5555",      /* other transports */
        "ipc:///tmp/sock",
        "inproc://x",
        "TCP//127.0.0.1:1",
        "tcp://127.0.0.1",           /* missing port */
        "tcp://127.0.0.1:",          /* empty port */
        "tcp://127.0.0.1:65536",     /* out of range */
        "tcp://127.0.0.1:99999999999999999999",
        "tcp://127.0.0.1:-1",
        "tcp://127.0.0.1:12ab",      /* not a number */
        "tcp://127.0.0.1:+80",
        "tcp://127.0.0.1: 80",
        "tcp://127.0.0.1:**",
        "tcp://:5555",               /* empty host */
        "tcp://",
        "tcp://[::1:5555",           /* unclosed bracket */
        "tcp://[]:5555",             /* empty brackets */
        "tcp://bad host:5555",       /* space in host */
        "tcp://ho/st:5555",
        "tcp://127.0.0.1:5555/path",
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++)
        expect_invalid(f, bad[i]);
}

static void test_parse_overlong(void **state)
{
    fx *f = *state;
    char text[CTL_ENDPOINT_MAX + 100];
    /* A host longer than ctl_endpoint can hold. */
    strcpy(text, "tcp://");
    memset(text + 6, 'h', 280);
    strcpy(text + 286, ":5555");
    assert_int_equal(ctl_endpoint_parse(text, &f->ep, &f->err), CTL_INVALID);
    assert_non_null(f->err.msg);
    /* A whole text longer than CTL_ENDPOINT_MAX. */
    memset(text, 'x', sizeof text - 1);
    text[sizeof text - 1] = '\0';
    memcpy(text, "tcp://", 6);
    assert_int_equal(ctl_endpoint_parse(text, &f->ep, &f->err), CTL_INVALID);
}

static void test_parse_null_arguments(void **state)
{
    fx *f = *state;
    assert_int_equal(ctl_endpoint_parse(NULL, &f->ep, &f->err), CTL_INVALID);
    assert_int_equal(f->err.kind, CTL_INVALID);
    assert_non_null(f->err.msg);
    assert_int_equal(ctl_endpoint_parse("tcp://127.0.0.1:1", NULL, &f->err), CTL_INVALID);
    /* A NULL error is allowed. */
    assert_int_equal(ctl_endpoint_parse("nope", &f->ep, NULL), CTL_INVALID);
    assert_int_equal(ctl_endpoint_parse("tcp://127.0.0.1:1", &f->ep, NULL), 0);
}

/* ---- ctl_endpoint_format ----------------------------------------------------- */

static void test_format_roundtrip(void **state)
{
    fx *f = *state;
    const char *texts[] = {"tcp://127.0.0.1:5555", "tcp://*:*", "tcp://[::1]:9000",
                           "tcp://localhost:80"};
    char buf[CTL_ENDPOINT_MAX];
    for (size_t i = 0; i < sizeof texts / sizeof texts[0]; i++) {
        assert_int_equal(ctl_endpoint_parse(texts[i], &f->ep, &f->err), 0);
        assert_int_equal(ctl_endpoint_format(&f->ep, buf, sizeof buf, &f->err), 0);
        assert_string_equal(buf, texts[i]);
    }
    /* Port 0 formats as "*" (any port). */
    assert_int_equal(ctl_endpoint_parse("tcp://127.0.0.1:0", &f->ep, &f->err), 0);
    assert_int_equal(ctl_endpoint_format(&f->ep, buf, sizeof buf, &f->err), 0);
    assert_string_equal(buf, "tcp://127.0.0.1:*");
}

static void test_format_small_buffer(void **state)
{
    fx *f = *state;
    char buf[64];
    assert_int_equal(ctl_endpoint_parse("tcp://127.0.0.1:5555", &f->ep, &f->err), 0);
    size_t need = strlen("tcp://127.0.0.1:5555") + 1;
    assert_int_equal(ctl_endpoint_format(&f->ep, buf, need, &f->err), 0);
    assert_string_equal(buf, "tcp://127.0.0.1:5555");
    memset(buf, 'Z', sizeof buf);
    assert_int_equal(ctl_endpoint_format(&f->ep, buf, need - 1, &f->err), CTL_INVALID);
    assert_int_equal(f->err.kind, CTL_INVALID);
    /* Nothing written past the given size. */
    assert_int_equal(buf[need - 1], 'Z');
    assert_int_equal(ctl_endpoint_format(&f->ep, buf, 0, &f->err), CTL_INVALID);
}

/* ---- ctl_node_ip ------------------------------------------------------------- */

static void test_node_ip_override(void **state)
{
    fx *f = *state;
    char buf[16];
    setenv(CTL_NODE_IP_ENV, "10.1.2.3", 1);
    assert_int_equal(ctl_node_ip(buf, sizeof buf, &f->err), 0);
    assert_string_equal(buf, "10.1.2.3");
    setenv(CTL_NODE_IP_ENV, "255.255.255.255", 1);
    assert_int_equal(ctl_node_ip(buf, sizeof buf, &f->err), 0);
    assert_string_equal(buf, "255.255.255.255");
    setenv(CTL_NODE_IP_ENV, "127.0.0.1", 1);
    assert_int_equal(ctl_node_ip(buf, sizeof buf, &f->err), 0);
    assert_string_equal(buf, "127.0.0.1");
}

static void test_node_ip_override_invalid(void **state)
{
    fx *f = *state;
    char buf[64];
    const char *bad[] = {"300.1.1.1", "not-an-ip", "10.1.2", "10.1.2.3.4",
                         "::1", "10.1.2.3 ", " 10.1.2.3", "10.1.2.3/24"};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        setenv(CTL_NODE_IP_ENV, bad[i], 1);
        int rc = ctl_node_ip(buf, sizeof buf, &f->err);
        if (rc != CTL_INVALID)
            fail_msg("%s=\"%s\" gave %d", CTL_NODE_IP_ENV, bad[i], rc);
        assert_non_null(f->err.msg);
        if (strstr(f->err.msg, bad[i]) == NULL)
            fail_msg("message does not name \"%s\": \"%s\"", bad[i], f->err.msg);
    }
}

static void test_node_ip_discovered(void **state)
{
    fx *f = *state;
    char buf[16];
    struct in_addr a;
    assert_int_equal(ctl_node_ip(buf, sizeof buf, &f->err), 0);
    assert_int_equal(inet_pton(AF_INET, buf, &a), 1);
    /* An empty override counts as unset or as invalid, never as an address. */
    setenv(CTL_NODE_IP_ENV, "", 1);
    int rc = ctl_node_ip(buf, sizeof buf, &f->err);
    if (rc == 0)
        assert_int_equal(inet_pton(AF_INET, buf, &a), 1);
    else
        assert_int_equal(rc, CTL_INVALID);
}

static void test_node_ip_null_buffer(void **state)
{
    fx *f = *state;
    assert_int_equal(ctl_node_ip(NULL, 16, &f->err), CTL_INVALID);
}

int main(void)
{
#define T(fn) cmocka_unit_test_setup_teardown(fn, setup, teardown)
    const struct CMUnitTest tests[] = {
        T(test_parse_valid),
        T(test_parse_invalid_forms),
        T(test_parse_overlong),
        T(test_parse_null_arguments),
        T(test_format_roundtrip),
        T(test_format_small_buffer),
        T(test_node_ip_override),
        T(test_node_ip_override_invalid),
        T(test_node_ip_discovered),
        T(test_node_ip_null_buffer),
    };
#undef T
    return cmocka_run_group_tests(tests, NULL, NULL);
}
