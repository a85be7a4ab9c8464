/*
 * fuzz_endpoint.c - endpoint parsing (ctl_endpoint_parse), the one place
 * that decides what a unit's address may look like; servers, the pool and
 * the programs all go through it.
 *
 * Input: the endpoint text (cut at the first NUL, as a C caller would).
 * What must hold (else the target aborts): a refusal is CTL_INVALID with a
 * message; an accepted endpoint formats back (ctl_endpoint_format) into a
 * string that parses again to the same host, port and any-port flag, and
 * its host is NUL-terminated within its buffer.
 */
#define _GNU_SOURCE /* memmem in fuzz.h */
#include "ctlrpc/net.h"
#include "fuzz.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    char *text = malloc(size + 1);
    FUZZ_CHECK(text != NULL, "out of memory");
    memcpy(text, data, size);
    text[size] = '\0';

    ctl_endpoint ep, again;
    ctl_error err;
    ctl_error_init(&err);
    int rc = ctl_endpoint_parse(text, &ep, &err);
    if (rc != 0) {
        FUZZ_CHECK(rc == CTL_INVALID && err.kind == CTL_INVALID && err.msg,
                   "a refusal that is not CTL_INVALID (%d)", rc);
    } else {
        FUZZ_CHECK(memchr(ep.host, '\0', sizeof ep.host) != NULL,
                   "the host is not NUL-terminated");
        FUZZ_CHECK(ep.port <= 65535, "port %u", ep.port);
        char buf[CTL_ENDPOINT_MAX];
        rc = ctl_endpoint_format(&ep, buf, sizeof buf, &err);
        FUZZ_CHECK(rc == 0, "'%s' parses but does not format: %s", text, err.msg);
        rc = ctl_endpoint_parse(buf, &again, &err);
        FUZZ_CHECK(rc == 0, "'%s' formats as '%s', which does not parse: %s",
                   text, buf, err.msg);
        FUZZ_CHECK(strcmp(ep.host, again.host) == 0 && ep.port == again.port &&
                       ep.any_port == again.any_port,
                   "'%s' -> '%s' does not round-trip", text, buf);
    }
    ctl_error_fini(&err);
    free(text);
    return 0;
}
