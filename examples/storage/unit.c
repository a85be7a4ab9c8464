/*
 * unit.c - ctl-storage-unit: one storage unit serving idl/storage.idl.
 *
 *   ctl-storage-unit [--bind ENDPOINT] [--capacity BYTES] [--spill-dir DIR]
 *                    [--max-msg-bytes BYTES] [--max-reply-bytes BYTES]
 *                    [--max-queued-replies N] [--max-queued-reply-bytes BYTES]
 *                    [--max-key-bytes BYTES]
 *                    [--index-capacity BYTES] [--max-list-keys N]
 *                    [--drain-timeout MS] [--handshake-timeout MS]
 *                    [--heartbeat MS] [--deadline-skew-ms MS]
 *                    [--max-connections N]
 *                    [--max-connections-per-address N] [--no-describe]
 *                    [--log-level LEVEL]
 *                    [--curve-secret FILE
 *                    [--curve-allow FILE]]
 *                    [--etcd URL[,URL...] [--service NAME] [--namespace NS]
 *                    [--unit-id ID] [--lease-ttl SECONDS]
 *                    [--advertise tcp://HOST:PORT] [--etcd-cacert FILE]
 *                    [--etcd-cert FILE --etcd-key FILE] [--etcd-user NAME]]
 *   ctl-storage-unit --gen-keys PREFIX
 *
 * Prints its bound endpoint as the first line of stdout, serves until
 * SIGINT or SIGTERM, then shuts down cleanly (spill files are removed).
 * SIGHUP reads the --curve-allow file again for new handshakes (a file
 * that is refused leaves the old list in force, logged either way).
 * Every client connection costs the unit a file descriptor, so it raises
 * its soft RLIMIT_NOFILE to the hard limit at start (the usual soft limit
 * of 1024 would refuse clients beyond about a thousand); a connection it
 * still cannot accept is logged by the runtime (docs/OPERATIONS.md).
 *
 * Logs: one line per event on stderr, with its time and level
 * (ctlrpc/log.h); --log-level picks how much (default warn).
 *
 * With --etcd (or $CTLRPC_ETCD) the unit registers in etcd
 * (ctlrpc/directory.h; docs/OPERATIONS.md, "Running a fleet"): it serves
 * whether or not etcd answers, marks itself draining on SIGTERM and is
 * gone from etcd once it has stopped.
 *
 * The service itself is in handlers.c; this file is the program around
 * it: options, keys, signals.
 */
#define _GNU_SOURCE
#include <ctype.h>
#include <limits.h>
#include <errno.h>
#include <getopt.h>
#include <inttypes.h>
#include <pthread.h>
#include <signal.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>

#include "fleet.h"
#include "handlers.h"
#ifdef CTLRPC_WITH_ETCD
#include "ctlrpc/directory.h"
#endif

#define PROG "ctl-storage-unit"

/* Allow as many open files as the hard limit does: one per connection. */
static void raise_nofile_limit(void)
{
    struct rlimit rl;
    if (getrlimit(RLIMIT_NOFILE, &rl) != 0)
        return;
    unsigned long long soft = (unsigned long long)rl.rlim_cur;
    if (rl.rlim_cur >= rl.rlim_max) {
        ctl_log(CTL_LOG_INFO, PROG, "open-file limit %llu (the hard limit)", soft);
        return;
    }
    rl.rlim_cur = rl.rlim_max;
    if (setrlimit(RLIMIT_NOFILE, &rl) != 0)
        ctl_log(CTL_LOG_WARN, PROG, "cannot raise the open-file limit from %llu to %llu: %s",
                soft, (unsigned long long)rl.rlim_max, strerror(errno));
    else
        ctl_log(CTL_LOG_INFO, PROG, "open-file limit raised from %llu to %llu", soft,
                (unsigned long long)rl.rlim_max);
}

/* SIGHUP: read the allowlist file again, for the handshakes from now on. A
 * file that is refused leaves the old list in force. Either way a line
 * says what happened, at a level shown by default (warn for a reload, as
 * it changes who is admitted; error for a refusal). */
static void reload_allowlist(ctl_server *server, const char *allow_file)
{
    if (!allow_file) {
        ctl_log(CTL_LOG_WARN, PROG, "SIGHUP: no --curve-allow file to reload (nothing "
                "else is reloaded)");
        return;
    }
    ctl_error err;
    ctl_error_init(&err);
    char(*keys)[CTL_CURVE_KEY_BUF] = NULL;
    const char **ptrs = NULL;
    size_t count = 0;
    int rc = ctl_curve_read_allowlist(allow_file, &keys, &count, &err);
    if (rc == 0 && count == 0)
        rc = ctl_error_set(&err, CTL_INVALID, "allowlist %s lists no keys", allow_file);
    if (rc == 0 && !(ptrs = calloc(count, sizeof *ptrs)))
        rc = ctl_error_set(&err, CTL_INVALID, "out of memory");
    for (size_t i = 0; rc == 0 && i < count; i++)
        ptrs[i] = keys[i];
    if (rc == 0)
        rc = ctl_server_set_allowlist(server, ptrs, count, &err);
    if (rc == 0)
        ctl_log(CTL_LOG_WARN, PROG, "SIGHUP: reloaded the allowlist %s: %zu keys, for new "
                "handshakes (connections already admitted stay)", allow_file, count);
    else
        ctl_log(CTL_LOG_ERROR, PROG, "SIGHUP: the allowlist was not reloaded, the old one "
                "stays in force: %s", err.msg);
    free(ptrs);
    free(keys);
    ctl_error_fini(&err);
}

/* The default --max-connections: the open-file limit less a reserve for
 * the unit's own files (spill files, its sockets, connections still in their
 * handshake), so that idle connections never take the last descriptor and
 * leave the unit failing every accept. No cap when there is no limit. */
static unsigned default_max_connections(void)
{
    struct rlimit rl;
    if (getrlimit(RLIMIT_NOFILE, &rl) != 0 || rl.rlim_cur == RLIM_INFINITY ||
        rl.rlim_cur > UINT32_MAX)
        return 0;
    rlim_t reserve = rl.rlim_cur > 256 ? 64 : rl.rlim_cur / 4;
    return rl.rlim_cur > reserve ? (unsigned)(rl.rlim_cur - reserve) : 1;
}

static void usage(FILE *f)
{
    fprintf(f,
            "usage: ctl-storage-unit [--bind ENDPOINT] [--capacity BYTES]\n"
            "                        [--spill-dir DIR] [--max-msg-bytes BYTES]\n"
            "                        [--max-reply-bytes BYTES] [--max-queued-replies N]\n"
            "                        [--max-queued-reply-bytes BYTES]\n"
            "                        [--max-key-bytes BYTES] [--index-capacity BYTES]\n"
            "                        [--max-list-keys N] [--drain-timeout MS]\n"
            "                        [--handshake-timeout MS] [--heartbeat MS]\n"
            "                        [--deadline-skew-ms MS]\n"
            "                        [--max-connections N]\n"
            "                        [--max-connections-per-address N]\n"
            "                        [--no-describe] [--log-level LEVEL]\n"
            "                        [--curve-secret FILE [--curve-allow FILE]]\n"
            "                        [--etcd URL[,URL...] [--service NAME]\n"
            "                        [--namespace NS] [--unit-id ID]\n"
            "                        [--lease-ttl SECONDS] [--advertise ADDR]\n"
            "                        [--etcd-cacert FILE] [--etcd-cert FILE\n"
            "                        --etcd-key FILE] [--etcd-user NAME]]\n"
            "       ctl-storage-unit --gen-keys PREFIX\n"
            "\n"
            "Serve one storage unit (idl/storage.idl) until SIGINT or SIGTERM.\n"
            "The first line of stdout is the bound endpoint.\n"
            "\n"
            "  --bind ENDPOINT      tcp://host:port (host: an IPv4 address, [IPv6],\n"
            "                       e.g. tcp://[::1]:0, a network interface's name\n"
            "                       or *; ZeroMQ binds no host name); port 0 or *\n"
            "                       picks a free one\n"
            "                       (default tcp://<node ip>:0; the node ip can be\n"
            "                       set with $%s)\n"
            "  --capacity BYTES     bytes held in memory, e.g. 64M, 1G (default 1G)\n"
            "  --spill-dir DIR      write blobs that do not fit in memory here\n"
            "                       (created if missing; its blob files are removed\n"
            "                       at shutdown) instead of refusing them\n"
            "  --max-msg-bytes N    largest request frame accepted: a put's blob\n"
            "                       is a little smaller (default 64M)\n"
            "  --max-reply-bytes N  largest reply sent; a get asking for more is\n"
            "                       refused with a Protocol error before its reply\n"
            "                       is built (default: --max-msg-bytes)\n"
            "  --max-queued-replies N  replies held for a client that does not read\n"
            "                       them, per connection (default 1000); further\n"
            "                       ones are dropped and counted\n"
            "  --max-queued-reply-bytes N  bytes of unread replies one connection\n"
            "                       may hold (counting replies of 32K and more);\n"
            "                       its requests beyond are answered Busy\n"
            "                       \"replies_unread\" without running (default 256M)\n"
            "  --max-key-bytes N    longest key a put accepts (default 4K)\n"
            "  --index-capacity N   bytes of keys and bookkeeping kept, beside the\n"
            "                       blobs' bytes (default 64M); a put that needs\n"
            "                       more is refused with UnitFull\n"
            "  --max-list-keys N    most keys one list reply carries (default\n"
            "                       100000); callers page with after/limit\n"
            "  --drain-timeout MS   on SIGINT/SIGTERM, keep answering the requests\n"
            "                       that have arrived for at most this long\n"
            "                       (default 5000), then exit\n"
            "  --handshake-timeout MS  close a connection that has not completed its\n"
            "                       handshake by then (default 5000)\n"
            "  --heartbeat MS       send each connection a heartbeat this often and\n"
            "                       close one silent for three of them (default\n"
            "                       10000; every ZeroMQ client answers by itself)\n",
            CTL_NODE_IP_ENV);
    fputs("  --deadline-skew-ms MS  skip, unanswered, a request whose caller's\n"
          "                       deadline (carried in its id) passed more than MS\n"
          "                       ago: the clock skew allowed between hosts\n"
          "                       (default 1000; 0: the default; negative: no check)\n"
          "  --max-connections N  refuse connections beyond N open at once, during\n"
          "                       their handshake (logged, counted; default: the\n"
          "                       open-file limit less 64, less a quarter at 256\n"
          "                       or below; 0: no cap)\n"
          "  --max-connections-per-address N\n"
          "                       the same for the connections of one IP address\n"
          "  --no-describe        answer the built-in op _describe (which returns\n"
          "                       the service's IDL) with a Protocol error\n"
          "  --log-level LEVEL    error, warn, info or debug (default warn): log\n"
          "                       lines go to stderr, one per event\n"
          "  --curve-secret FILE  encrypt with CURVE: the unit's secret key (the\n"
          "                       file must not be readable by others); only\n"
          "                       clients that know its public key get through\n"
          "  --curve-allow FILE   also require clients to hold one of the public\n"
          "                       keys listed in FILE (one per line)\n"
          "  --gen-keys PREFIX    write a new key pair to PREFIX.key (secret,\n"
          "                       mode 0600) and PREFIX.pub, then exit\n"
          "\n"
          "Fleet (register in etcd while serving):\n",
          f);
    fleet_usage(f);
    fputs("  --unit-id ID         this unit's id in etcd (default\n"
          "                       <host>-<pid>-<random>, new at each start)\n"
          "  --lease-ttl SECONDS  lease of the registration (default 10, at least 2)\n"
          "  --advertise ADDR     the tcp://host:port clients dial (needed when\n"
          "                       --bind is a wildcard such as tcp://0.0.0.0:5555)\n",
          f);
}

int main(int argc, char **argv)
{
    static const struct option opts[] = {
        {"bind", required_argument, NULL, 'b'},
        {"capacity", required_argument, NULL, 'c'},
        {"spill-dir", required_argument, NULL, 's'},
        {"max-msg-bytes", required_argument, NULL, 'm'},
        {"max-reply-bytes", required_argument, NULL, 'R'},
        {"max-key-bytes", required_argument, NULL, 'K'},
        {"index-capacity", required_argument, NULL, 'I'},
        {"max-list-keys", required_argument, NULL, 'L'},
        {"drain-timeout", required_argument, NULL, 'D'},
        {"handshake-timeout", required_argument, NULL, 'H'},
        {"heartbeat", required_argument, NULL, 'B'},
        {"deadline-skew-ms", required_argument, NULL, 'W'},
        {"max-connections", required_argument, NULL, 'C'},
        {"max-queued-replies", required_argument, NULL, 'Q'},
        {"max-queued-reply-bytes", required_argument, NULL, 'Y'},
        {"max-connections-per-address", required_argument, NULL, 'P'},
        {"curve-secret", required_argument, NULL, 'k'},
        {"curve-allow", required_argument, NULL, 'A'},
        {"gen-keys", required_argument, NULL, 'g'},
        {"no-describe", no_argument, NULL, 'N'},
        {"log-level", required_argument, NULL, 'l'},
        {"help", no_argument, NULL, 'h'},
        {"unit-id", required_argument, NULL, 'U'},
        {"lease-ttl", required_argument, NULL, 'T'},
        {"advertise", required_argument, NULL, 'V'},
        FLEET_OPTIONS,
        {NULL, 0, NULL, 0},
    };
    fleet_flags fleet = {0};
    const char *unit_id = NULL, *advertise = NULL;
    int lease_ttl = 0;
    const char *bind = NULL, *spill = NULL, *secret_file = NULL, *allow_file = NULL;
    /* 64 MiB: the largest blob a put brings, and what a frame announcing
     * that much reserves (address space) for as long as it is under way. */
    uint64_t capacity = (uint64_t)1 << 30, max_msg = (uint64_t)64 << 20, max_reply = 0;
    uint64_t max_key = STORE_DEFAULT_MAX_KEY_BYTES, index_capacity = STORE_DEFAULT_INDEX_CAPACITY;
    uint64_t max_list = STORE_DEFAULT_MAX_LIST_KEYS, drain_ms = 5000;
    int handshake_ms = 0, heartbeat_ms = 0; /* 0: the runtime's defaults */
    int skew_ms = 0;                        /* 0: the runtime's default */
    uint64_t max_conns = UINT64_MAX;             /* the default: default_max_connections() */
    uint64_t max_conns_per = 0;                  /* 0: no cap */
    uint64_t max_queued = 0;                     /* 0: the runtime's default */
    uint64_t max_queued_bytes = 0;               /* 0: the runtime's default */
    bool no_describe = false;
    ctl_log_level level = CTL_LOG_DEFAULT;
    int c;
    while ((c = getopt_long(argc, argv, "h", opts, NULL)) != -1) {
        switch (c) {
        case 'b':
            bind = optarg;
            break;
        case 'c':
            if (store_parse_size(optarg, &capacity) != 0) {
                fprintf(stderr, "ctl-storage-unit: --capacity '%s' is not a "
                        "size (e.g. 1048576, 64M, 1G)\n", optarg);
                return 2;
            }
            break;
        case 's':
            spill = optarg;
            break;
        case 'm':
            if (store_parse_size(optarg, &max_msg) != 0 || max_msg == 0) {
                fprintf(stderr, "ctl-storage-unit: --max-msg-bytes '%s' is not "
                        "a positive size\n", optarg);
                return 2;
            }
            break;
        case 'Y':
            if (store_parse_size(optarg, &max_queued_bytes) != 0 || max_queued_bytes == 0 ||
                max_queued_bytes > SIZE_MAX) {
                fprintf(stderr, "ctl-storage-unit: --max-queued-reply-bytes '%s' is not "
                        "a positive size\n", optarg);
                return 2;
            }
            break;
        case 'R':
            if (store_parse_size(optarg, &max_reply) != 0 || max_reply == 0 ||
                max_reply > SIZE_MAX) {
                fprintf(stderr, "ctl-storage-unit: --max-reply-bytes '%s' is not "
                        "a positive size\n", optarg);
                return 2;
            }
            break;
        case 'C':
        case 'P':
        case 'Q': {
            uint64_t *to = c == 'C' ? &max_conns : c == 'P' ? &max_conns_per : &max_queued;
            uint64_t most = c == 'Q' ? INT_MAX : UINT32_MAX; /* ZMQ_SNDHWM is an int */
            /* --max-connections 0: no cap at all. */
            if (store_parse_size(optarg, to) != 0 || (*to == 0 && c != 'C') || *to > most) {
                fprintf(stderr, "ctl-storage-unit: %s '%s' is not a count from %d to "
                        "%llu\n", c == 'C' ? "--max-connections"
                                   : c == 'P' ? "--max-connections-per-address"
                                              : "--max-queued-replies", optarg,
                        c == 'C' ? 0 : 1, (unsigned long long)most);
                return 2;
            }
            break;
        }
        case 'K':
            if (store_parse_size(optarg, &max_key) != 0 || max_key == 0 ||
                max_key > SIZE_MAX) {
                fprintf(stderr, "ctl-storage-unit: --max-key-bytes '%s' is not "
                        "a positive size\n", optarg);
                return 2;
            }
            break;
        case 'I':
            if (store_parse_size(optarg, &index_capacity) != 0 || index_capacity == 0) {
                fprintf(stderr, "ctl-storage-unit: --index-capacity '%s' is not "
                        "a positive size\n", optarg);
                return 2;
            }
            break;
        case 'L':
            if (store_parse_size(optarg, &max_list) != 0 || max_list == 0 ||
                max_list > UINT32_MAX) {
                fprintf(stderr, "ctl-storage-unit: --max-list-keys '%s' is not "
                        "a count from 1 to 4294967295\n", optarg);
                return 2;
            }
            break;
        case 'D':
        case 'H':
        case 'B': {
            const char *flag = c == 'D' ? "--drain-timeout" : c == 'H' ? "--handshake-timeout"
                                                                      : "--heartbeat";
            char *end = NULL;
            errno = 0;
            unsigned long long v = strtoull(optarg, &end, 10);
            if (!isdigit((unsigned char)*optarg) || errno || *end || v > INT_MAX ||
                (c != 'D' && v == 0)) {
                fprintf(stderr, "ctl-storage-unit: %s '%s' is not a %snumber of "
                        "milliseconds\n", flag, optarg, c != 'D' ? "positive " : "");
                return 2;
            }
            if (c == 'D')
                drain_ms = v;
            else if (c == 'H')
                handshake_ms = (int)v;
            else
                heartbeat_ms = (int)v;
            break;
        }
        case 'W': {
            char *end = NULL;
            errno = 0;
            long long v = strtoll(optarg, &end, 10);
            if (end == optarg || errno || *end || isspace((unsigned char)*optarg) ||
                v > INT_MAX || v < INT_MIN) {
                fprintf(stderr, "ctl-storage-unit: --deadline-skew-ms '%s' is not a "
                        "number of milliseconds (negative: no check)\n", optarg);
                return 2;
            }
            skew_ms = (int)v;
            break;
        }
        case 'N':
            no_describe = true;
            break;
        case 'l':
            if (ctl_log_level_parse(optarg, &level) != 0) {
                fprintf(stderr, "ctl-storage-unit: --log-level '%s' is not one of "
                        "error, warn, info, debug\n", optarg);
                return 2;
            }
            break;
        case 'k':
            secret_file = optarg;
            break;
        case 'A':
            allow_file = optarg;
            break;
        case 'g': {
            ctl_error gerr;
            ctl_error_init(&gerr);
            int grc = ctl_curve_write_keypair(optarg, &gerr);
            if (grc)
                fprintf(stderr, "ctl-storage-unit: %s\n", gerr.msg);
            else
                printf("wrote %s.key (secret) and %s.pub\n", optarg, optarg);
            ctl_error_fini(&gerr);
            return grc ? 1 : 0;
        }
        case 'h':
            usage(stdout);
            return 0;
        case 'U':
            unit_id = optarg;
            fleet.given = true;
            break;
        case 'V':
            advertise = optarg;
            fleet.given = true;
            break;
        case 'T': {
            char *end = NULL;
            errno = 0;
            long v = strtol(optarg, &end, 10);
            if (!isdigit((unsigned char)*optarg) || errno || *end || v < 2 || v > 86400) {
                fprintf(stderr, "ctl-storage-unit: --lease-ttl '%s' is not a number of "
                        "seconds from 2 to 86400\n", optarg);
                return 2;
            }
            lease_ttl = (int)v;
            fleet.given = true;
            break;
        }
        default:
            if (fleet_take(&fleet, c, optarg))
                break;
            usage(stderr);
            return 2;
        }
    }
    bool registering = fleet_resolve(&fleet);
    if (fleet.given && !registering) {
        fprintf(stderr, "ctl-storage-unit: --service, --namespace, --unit-id, --lease-ttl, "
                "--advertise and the --etcd-* flags need --etcd URL (or $CTLRPC_ETCD)\n");
        return 2;
    }
#ifndef CTLRPC_WITH_ETCD
    if (registering) {
        fprintf(stderr, "ctl-storage-unit: --etcd (or $CTLRPC_ETCD): this build has no etcd "
                "support (configured with CTLRPC_WITH_ETCD=OFF)\n");
        return 2;
    }
#endif
    if (allow_file && !secret_file) {
        fprintf(stderr, "ctl-storage-unit: --curve-allow needs --curve-secret\n");
        return 2;
    }
    if (optind < argc) {
        fprintf(stderr, "ctl-storage-unit: unexpected argument '%s'\n", argv[optind]);
        usage(stderr);
        return 2;
    }

    ctl_log_set_level(level);
    raise_nofile_limit();

    /* Signals are taken synchronously by this thread (sigwait below); block
     * them before any thread starts so none of them gets one. */
    sigset_t stop;
    sigemptyset(&stop);
    sigaddset(&stop, SIGINT);
    sigaddset(&stop, SIGTERM);
    sigaddset(&stop, SIGHUP);
    pthread_sigmask(SIG_BLOCK, &stop, NULL);

    storage_unit u = {NULL, NULL, PTHREAD_MUTEX_INITIALIZER};
    ctl_error err;
    ctl_error_init(&err);
    char secret[CTL_CURVE_KEY_BUF] = "";
    char(*allow)[CTL_CURVE_KEY_BUF] = NULL;
    const char **allow_ptrs = NULL;
    size_t allow_count = 0;
    if ((secret_file && ctl_curve_read_key(secret_file, true, secret, &err) != 0) ||
        (allow_file &&
         ctl_curve_read_allowlist(allow_file, &allow, &allow_count, &err) != 0)) {
        fprintf(stderr, "ctl-storage-unit: %s\n", err.msg);
        ctl_error_fini(&err);
        return 2;
    }
    if (allow_file && allow_count == 0) {
        fprintf(stderr, "ctl-storage-unit: allowlist %s lists no keys\n", allow_file);
        return 2;
    }
    for (size_t i = 0; i < allow_count; i++)
        if (strcmp(allow[i], secret) == 0) {
            fprintf(stderr,
                    "ctl-storage-unit: allowlist %s: key #%zu is the unit's own "
                    "secret key (%s): an allowlist holds client public keys; make "
                    "a new key pair for the unit, this secret is exposed\n",
                    allow_file, i + 1, secret_file);
            memset(secret, 0, sizeof secret);
            free(allow);
            return 2;
        }
    allow_ptrs = calloc(allow_count ? allow_count : 1, sizeof *allow_ptrs);
    for (size_t i = 0; allow_ptrs && i < allow_count; i++)
        allow_ptrs[i] = allow[i];
    if (store_new(capacity, spill, &u.store, &err) != 0) {
        ctl_log(CTL_LOG_ERROR, PROG, "%s", err.msg);
        ctl_error_fini(&err);
        free(allow_ptrs);
        free(allow);
        return 1;
    }
    store_set_limits(u.store, (size_t)max_key, index_capacity, (uint32_t)max_list);
    storage_handlers h;
    storage_unit_handlers(&u, &h);
    ctl_server_options so;
    ctl_server_options_init(&so);
    so.endpoint = bind;
    so.lock = &u.lock;
    so.limits.max_msg_bytes = (size_t)max_msg;
    so.max_reply_bytes = (size_t)max_reply; /* 0: the message limit */
    so.curve_secret_key = secret_file ? secret : NULL;
    so.curve_allow = allow_ptrs;
    so.curve_allow_count = allow_count;
    so.describe_off = no_describe;
    so.handshake_timeout_ms = handshake_ms;
    so.heartbeat_ms = heartbeat_ms;
    so.deadline_skew_ms = skew_ms;
    so.max_connections = max_conns == UINT64_MAX ? default_max_connections() : (unsigned)max_conns;
    so.max_queued_replies = (unsigned)max_queued;
    so.max_queued_reply_bytes = (size_t)max_queued_bytes;
    so.max_connections_per_address = (unsigned)max_conns_per;

    /* Hold the lock until u.server is set: a request that arrives at once
     * waits for it instead of reading a NULL server in stats. */
    pthread_mutex_lock(&u.lock);
    int rc = storage_serve(&h, &so, &u.server, &err);
    pthread_mutex_unlock(&u.lock);
    memset(secret, 0, sizeof secret);
    free(allow_ptrs);
    free(allow);
    if (rc != 0) {
        ctl_log(CTL_LOG_ERROR, PROG, "%s", err.msg);
        store_destroy(&u.store);
        ctl_error_fini(&err);
        return 1;
    }
#ifdef CTLRPC_WITH_ETCD
    if (registering) {
        ctl_register_options ro;
        ctl_register_options_init(&ro);
        ro.etcd.endpoints = fleet.etcd;
        ro.etcd.cacert = fleet.cacert;
        ro.etcd.cert = fleet.cert;
        ro.etcd.key = fleet.key;
        ro.etcd.user = fleet.user;
        ro.namespace_name = fleet.ns;
        ro.service = fleet.service;
        ro.unit_id = unit_id;
        ro.lease_ttl_s = lease_ttl;
        ro.advertise = advertise;
        if (ctl_server_register(u.server, &ro, &err) != 0) {
            fprintf(stderr, "ctl-storage-unit: %s\n", err.msg);
            ctl_server_destroy(&u.server);
            store_destroy(&u.store);
            ctl_error_fini(&err);
            return 2;
        }
        ctl_registration_info ri;
        ctl_server_registration(u.server, &ri);
        ctl_log(CTL_LOG_INFO, PROG, "registering as %s at etcd %s", ri.key, fleet.etcd);
    }
#else
    (void)unit_id;
    (void)advertise;
    (void)lease_ttl;
#endif
    printf("%s\n", ctl_server_endpoint(u.server));
    fflush(stdout);
    ctl_log(CTL_LOG_INFO, PROG, "serving %s on %s", storage_service.name,
            ctl_server_endpoint(u.server));

    int sig = 0;
    for (;;) {
        if (sigwait(&stop, &sig) != 0)
            continue;
        if (sig != SIGHUP)
            break;
        reload_allowlist(u.server, allow_file);
    }
    ctl_log(CTL_LOG_INFO, PROG, "%s, shutting down", strsignal(sig));
    /* Answer what has arrived (bounded by --drain-timeout), then stop. */
    ctl_server_drain(u.server, (int)drain_ms);
    ctl_server_stats ss;
    ctl_server_stats_get(u.server, &ss);
    ctl_log(CTL_LOG_INFO, PROG, "stopped after %" PRIu64 " requests, %" PRIu64 " replies",
            ss.requests, ss.replies);
    ctl_server_destroy(&u.server);
    store_destroy(&u.store);
    ctl_error_fini(&err);
    return 0;
}
