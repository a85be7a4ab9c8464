/*
 * net.c - node_ip() and endpoint parsing.
 *
 * node_ip order (decided here, documented in net.h): an explicit override
 * from $CTLRPC_NODE_IP wins, because on a multi-homed host only the operator
 * knows which network the cluster uses; then the source address the kernel
 * would pick for a route to a public address (a UDP socket "connect" sends
 * nothing, it only selects a route); then the first non-loopback IPv4
 * interface that is up (hosts with no default route); then loopback.
 */
#include "ctlrpc/net.h"

#include <arpa/inet.h>
#include <ctype.h>
#include <errno.h>
#include <ifaddrs.h>
#include <netdb.h>
#include <net/if.h>
#include <netinet/in.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

static int copy_ip(char *buf, size_t buflen, const char *ip, ctl_error *err)
{
    if (strlen(ip) + 1 > buflen)
        return ctl_error_set(err, CTL_INVALID,
                             "node_ip: buffer of %zu bytes is too small for "
                             "'%s'", buflen, ip);
    memcpy(buf, ip, strlen(ip) + 1);
    return 0;
}

/* The local address of a UDP socket "connected" to a public address. */
static int probe_route(char *out, size_t outlen)
{
    int fd = socket(AF_INET, SOCK_DGRAM | SOCK_CLOEXEC, 0);
    if (fd < 0)
        return -1;
    struct sockaddr_in dst = {0};
    dst.sin_family = AF_INET;
    dst.sin_port = htons(53);
    inet_pton(AF_INET, "8.8.8.8", &dst.sin_addr);
    struct sockaddr_in local = {0};
    socklen_t len = sizeof local;
    int rc = -1;
    if (connect(fd, (struct sockaddr *)&dst, sizeof dst) == 0 &&
        getsockname(fd, (struct sockaddr *)&local, &len) == 0 &&
        local.sin_addr.s_addr != htonl(INADDR_ANY) &&
        inet_ntop(AF_INET, &local.sin_addr, out, (socklen_t)outlen))
        rc = 0;
    close(fd);
    return rc;
}

/* The first up, non-loopback IPv4 interface address. */
static int first_interface(char *out, size_t outlen)
{
    struct ifaddrs *all = NULL;
    if (getifaddrs(&all) != 0)
        return -1;
    int rc = -1;
    for (struct ifaddrs *i = all; i && rc != 0; i = i->ifa_next) {
        if (!i->ifa_addr || i->ifa_addr->sa_family != AF_INET ||
            !(i->ifa_flags & IFF_UP) || (i->ifa_flags & IFF_LOOPBACK))
            continue;
        const struct sockaddr_in *sin = (const struct sockaddr_in *)(const void *)i->ifa_addr;
        if (inet_ntop(AF_INET, &sin->sin_addr, out, (socklen_t)outlen))
            rc = 0;
    }
    freeifaddrs(all);
    return rc;
}

int ctl_node_ip(char *buf, size_t buflen, ctl_error *err)
{
    char ip[INET_ADDRSTRLEN];
    if (!buf)
        return ctl_error_set(err, CTL_INVALID, "node_ip: buffer is NULL");
    const char *env = getenv(CTL_NODE_IP_ENV);
    if (env && *env) {
        struct in_addr a;
        if (inet_pton(AF_INET, env, &a) != 1)
            return ctl_error_set(err, CTL_INVALID,
                                 "%s='%s' is not an IPv4 address",
                                 CTL_NODE_IP_ENV, env);
        return copy_ip(buf, buflen, env, err);
    }
    if (probe_route(ip, sizeof ip) == 0 || first_interface(ip, sizeof ip) == 0)
        return copy_ip(buf, buflen, ip, err);
    return copy_ip(buf, buflen, "127.0.0.1", err);
}

static int valid_hostname(const char *h, size_t n)
{
    if (n == 0 || n > 253)
        return 0;
    for (size_t i = 0; i < n; i++) {
        unsigned char c = (unsigned char)h[i];
        if (!isalnum(c) && c != '-' && c != '.' && c != '_')
            return 0;
    }
    /* ZeroMQ's own rule: it refuses '_bad-host' when it dials. */
    return isalnum((unsigned char)h[0]);
}

int ctl_endpoint_parse(const char *text, ctl_endpoint *out, ctl_error *err)
{
    static const char scheme[] = "tcp://";
    ctl_error_clear(err); /* success leaves nothing behind */
    if (!text || !*text)
        return ctl_error_set(err, CTL_INVALID, "endpoint is empty");
    if (!out)
        return ctl_error_set(err, CTL_INVALID, "endpoint '%s': no output",
                             text);
    memset(out, 0, sizeof *out);
    size_t tlen = strlen(text);
    if (tlen >= CTL_ENDPOINT_MAX)
        return ctl_error_set(err, CTL_INVALID,
                             "endpoint '%.40s...' is longer than %d bytes",
                             text, CTL_ENDPOINT_MAX - 1);
    if (strncmp(text, scheme, sizeof scheme - 1) != 0)
        return ctl_error_set(err, CTL_INVALID,
                             "endpoint '%s' is not tcp://host:port (only "
                             "tcp:// endpoints are supported)", text);
    const char *host = text + sizeof scheme - 1;
    const char *colon = strrchr(host, ':');
    if (!colon)
        return ctl_error_set(err, CTL_INVALID,
                             "endpoint '%s' has no port (write tcp://host:port,"
                             " or :0 for any free port)", text);
    size_t hlen = (size_t)(colon - host);
    if (hlen == 0)
        return ctl_error_set(err, CTL_INVALID, "endpoint '%s' has no host",
                             text);
    if (host[0] == '[') {
        /* [v6]: the brackets must close right before the port colon. */
        char v6[INET6_ADDRSTRLEN];
        struct in6_addr a6;
        if (hlen < 3 || host[hlen - 1] != ']' || hlen - 2 >= sizeof v6)
            return ctl_error_set(err, CTL_INVALID,
                                 "endpoint '%s': bad IPv6 host", text);
        memcpy(v6, host + 1, hlen - 2);
        v6[hlen - 2] = '\0';
        if (inet_pton(AF_INET6, v6, &a6) != 1)
            return ctl_error_set(err, CTL_INVALID,
                                 "endpoint '%s': '%s' is not an IPv6 address",
                                 text, v6);
    } else if (!(hlen == 1 && host[0] == '*') && !valid_hostname(host, hlen)) {
        return ctl_error_set(err, CTL_INVALID,
                             "endpoint '%s': host '%.*s' is not a hostname or "
                             "IPv4 address (a hostname starts with a letter or a digit, "
                             "then letters, digits, '-', '.' or '_')", text, (int)hlen, host);
    }
    memcpy(out->host, host, hlen);
    out->host[hlen] = '\0';

    const char *port = colon + 1;
    if (strcmp(port, "*") == 0) {
        out->any_port = 1;
        return 0;
    }
    if (!*port)
        return ctl_error_set(err, CTL_INVALID, "endpoint '%s' has no port",
                             text);
    unsigned long v = 0;
    for (const char *p = port; *p; p++) {
        if (!isdigit((unsigned char)*p) || p - port >= 5)
            return ctl_error_set(err, CTL_INVALID,
                                 "endpoint '%s': port '%s' is not a number in "
                                 "0..65535 or '*'", text, port);
        v = v * 10 + (unsigned long)(*p - '0');
    }
    if (v > 65535)
        return ctl_error_set(err, CTL_INVALID,
                             "endpoint '%s': port %lu is out of range "
                             "(0..65535)", text, v);
    out->port = (unsigned)v;
    out->any_port = v == 0;
    return 0;
}

int ctl_endpoint_format(const ctl_endpoint *ep, char *buf, size_t buflen,
                        ctl_error *err)
{
    int n;
    if (ep->any_port)
        n = snprintf(buf, buflen, "tcp://%s:*", ep->host);
    else
        n = snprintf(buf, buflen, "tcp://%s:%u", ep->host, ep->port);
    if (n < 0 || (size_t)n >= buflen)
        return ctl_error_set(err, CTL_INVALID,
                             "endpoint tcp://%s:...: buffer of %zu bytes is "
                             "too small", ep->host, buflen);
    return 0;
}

bool ctl_endpoint_host_literal(const char *host)
{
    unsigned char buf[16];
    char v6[INET6_ADDRSTRLEN];
    size_t n = host ? strlen(host) : 0;
    if (n == 0)
        return false;
    if (inet_pton(AF_INET, host, buf) == 1 || inet_pton(AF_INET6, host, buf) == 1)
        return true;
    if (host[0] != '[' || n < 3 || host[n - 1] != ']' || n - 2 >= sizeof v6)
        return false;
    memcpy(v6, host + 1, n - 2);
    v6[n - 2] = '\0';
    return inet_pton(AF_INET6, v6, buf) == 1;
}

/* Whether `host` (a name) has IPv6 addresses and no IPv4 one. */
static bool name_is_ipv6_only(const char *host)
{
    struct addrinfo hints = {0}, *res = NULL;
    hints.ai_family = AF_UNSPEC;
    hints.ai_socktype = SOCK_STREAM;
    if (getaddrinfo(host, NULL, &hints, &res) != 0)
        return false;
    bool v4 = false, v6 = false;
    for (struct addrinfo *a = res; a; a = a->ai_next) {
        v4 |= a->ai_family == AF_INET;
        v6 |= a->ai_family == AF_INET6;
    }
    freeaddrinfo(res);
    return v6 && !v4;
}

bool ctl_endpoint_needs_ipv6(const ctl_endpoint *ep)
{
    unsigned char buf[16];
    if (!ep || !ep->host[0] || strcmp(ep->host, "*") == 0 ||
        inet_pton(AF_INET, ep->host, buf) == 1)
        return false;
    if (ep->host[0] == '[')
        return true;
    return name_is_ipv6_only(ep->host);
}
