/*
 * ctlrpc/net.h - the node's address and endpoint strings.
 *
 * A unit's address is "tcp://host:port" (docs/PROTOCOL.md, "Addresses and node
 * IP"). ctl_endpoint_parse is the one place that decides what is a valid
 * endpoint; the server and the client both use it, so a bad address fails
 * early with a message naming it instead of deep inside ZeroMQ.
 *
 * Threading: reentrant; no shared state.
 */
#ifndef CTLRPC_NET_H
#define CTLRPC_NET_H

#include <stdbool.h>
#include <stddef.h>

#include "ctlrpc/error.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Environment variable that overrides ctl_node_ip() (for multi-homed hosts):
 * an IPv4 address in dotted form. */
#define CTL_NODE_IP_ENV "CTLRPC_NODE_IP"

/* Longest textual endpoint we handle, NUL included. */
#define CTL_ENDPOINT_MAX 300

/*
 * This node's routable IPv4 address, as a NUL-terminated dotted string in
 * `buf` (at least 16 bytes). In order: $CTLRPC_NODE_IP if set (it must be a
 * valid IPv4 address, else CTL_INVALID naming it); the address of the
 * interface the default route leaves by, found with a UDP "connect" to a
 * public address (no packet is sent); the first non-loopback IPv4 interface
 * address; finally "127.0.0.1". Returns 0 or CTL_INVALID.
 * Blocking: a few system calls, no network traffic.
 */
CTL_API int ctl_node_ip(char *buf, size_t buflen, ctl_error *err);

/* A parsed "tcp://host:port". `host` is a hostname, a dotted IPv4 address,
 * a bracketed IPv6 address (kept with its brackets) or "*"; `port` is
 * 0..65535, with 0 also standing for "*" (any free port). */
typedef struct ctl_endpoint {
    char host[256];
    unsigned port;
    int any_port; /* the port was written "*" or 0 */
} ctl_endpoint;

/*
 * Parse and validate `text`. Returns 0, or CTL_INVALID with a message that
 * quotes the text and says what is wrong (only tcp:// is supported, missing
 * port, port out of range, empty or bad host...).
 */
CTL_API int ctl_endpoint_parse(const char *text, ctl_endpoint *out, ctl_error *err);

/* Format `ep` back to "tcp://host:port" ("*" for any port) into `buf`.
 * Returns 0, or CTL_INVALID when `buflen` is too small. */
CTL_API int ctl_endpoint_format(const ctl_endpoint *ep, char *buf, size_t buflen,
                        ctl_error *err);

/* Whether `host` (NUL-terminated, as in ctl_endpoint.host) is an IP
 * address, which needs no name lookup: dotted IPv4, or IPv6 with or
 * without its brackets ("[::1]", "::1"). False for names, "*" and "". */
CTL_API bool ctl_endpoint_host_literal(const char *host);

/*
 * Whether a ZeroMQ socket that binds or connects `ep` must have IPv6
 * enabled (ZMQ_IPV6): true for a bracketed IPv6 host ("tcp://[::1]:4100")
 * and for a host name that has IPv6 addresses and no IPv4 one (which
 * ZeroMQ cannot resolve otherwise). False for IPv4 addresses, "*" and
 * names with an IPv4 address: ZeroMQ with IPv6 enabled would prefer a
 * name's IPv6 address, and bind IPv4 ones as IPv4-mapped IPv6, so these
 * keep plain IPv4. Blocking: for a name, one name lookup (getaddrinfo).
 */
CTL_API bool ctl_endpoint_needs_ipv6(const ctl_endpoint *ep);

#ifdef __cplusplus
}
#endif

#endif /* CTLRPC_NET_H */
