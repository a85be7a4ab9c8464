/*
 * unit.c - ctl-storage-unit: one storage unit serving idl/storage.idl.
 *
 *   ctl-storage-unit [--bind ENDPOINT] [--capacity BYTES] [--spill-dir DIR]
 *                    [--max-msg-bytes BYTES] [--max-key-bytes BYTES]
 *                    [--index-capacity BYTES] [--max-list-keys N]
 *                    [--drain-timeout MS] [--no-describe]
 *                    [--log-level LEVEL]
 *                    [--curve-secret FILE
 *                    [--curve-allow FILE]]
 *   ctl-storage-unit --gen-keys PREFIX
 *
 * Prints its bound endpoint as the first line of stdout, serves until
 * SIGINT or SIGTERM, then shuts down cleanly (spill files are removed).
 * Every client connection costs the unit a file descriptor, so it raises
 * its soft RLIMIT_NOFILE to the hard limit at start (the usual soft limit
 * of 1024 would refuse clients beyond about a thousand); a connection it
 * still cannot accept is logged by the runtime (docs/OPERATIONS.md).
 *
 * Logs: one line per event on stderr, with its time and level
 * (ctlrpc/log.h); --log-level picks how much (default warn).
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

#include "handlers.h"

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

static void usage(FILE *f)
{
    fprintf(f,
            "usage: ctl-storage-unit [--bind ENDPOINT] [--capacity BYTES]\n"
            "                        [--spill-dir DIR] [--max-msg-bytes BYTES]\n"
            "                        [--max-key-bytes BYTES] [--index-capacity BYTES]\n"
            "                        [--max-list-keys N] [--drain-timeout MS]\n"
            "                        [--no-describe] [--log-level LEVEL]\n"
            "                        [--curve-secret FILE [--curve-allow FILE]]\n"
            "       ctl-storage-unit --gen-keys PREFIX\n"
            "\n"
            "Serve one storage unit (idl/storage.idl) until SIGINT or SIGTERM.\n"
            "The first line of stdout is the bound endpoint.\n"
            "\n"
            "  --bind ENDPOINT      tcp://host:port; port 0 or * picks a free one\n"
            "                       (default tcp://<node ip>:0; the node ip can be\n"
            "                       set with $%s)\n"
            "  --capacity BYTES     bytes held in memory, e.g. 64M, 1G (default 1G)\n"
            "  --spill-dir DIR      write blobs that do not fit in memory here\n"
            "                       (created if missing; its blob files are removed\n"
            "                       at shutdown) instead of refusing them\n"
            "  --max-msg-bytes N    largest request accepted (default 256M)\n"
            "  --max-key-bytes N    longest key a put accepts (default 4K)\n"
            "  --index-capacity N   bytes of keys and bookkeeping kept, beside the\n"
            "                       blobs' bytes (default 64M); a put that needs\n"
            "                       more is refused with UnitFull\n"
            "  --max-list-keys N    most keys one list reply carries (default\n"
            "                       100000); callers page with after/limit\n"
            "  --drain-timeout MS   on SIGINT/SIGTERM, keep answering the requests\n"
            "                       that have arrived for at most this long\n"
            "                       (default 5000), then exit\n"
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
            "                       mode 0600) and PREFIX.pub, then exit\n",
            CTL_NODE_IP_ENV);
}

int main(int argc, char **argv)
{
    static const struct option opts[] = {
        {"bind", required_argument, NULL, 'b'},
        {"capacity", required_argument, NULL, 'c'},
        {"spill-dir", required_argument, NULL, 's'},
        {"max-msg-bytes", required_argument, NULL, 'm'},
        {"max-key-bytes", required_argument, NULL, 'K'},
        {"index-capacity", required_argument, NULL, 'I'},
        {"max-list-keys", required_argument, NULL, 'L'},
        {"drain-timeout", required_argument, NULL, 'D'},
        {"curve-secret", required_argument, NULL, 'k'},
        {"curve-allow", required_argument, NULL, 'A'},
        {"gen-keys", required_argument, NULL, 'g'},
        {"no-describe", no_argument, NULL, 'N'},
        {"log-level", required_argument, NULL, 'l'},
        {"help", no_argument, NULL, 'h'},
        {NULL, 0, NULL, 0},
    };
    const char *bind = NULL, *spill = NULL, *secret_file = NULL, *allow_file = NULL;
    uint64_t capacity = (uint64_t)1 << 30, max_msg = 0;
    uint64_t max_key = STORE_DEFAULT_MAX_KEY_BYTES, index_capacity = STORE_DEFAULT_INDEX_CAPACITY;
    uint64_t max_list = STORE_DEFAULT_MAX_LIST_KEYS, drain_ms = 5000;
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
        case 'D': {
            char *end = NULL;
            errno = 0;
            unsigned long long v = strtoull(optarg, &end, 10);
            if (!isdigit((unsigned char)*optarg) || errno || *end || v > INT_MAX) {
                fprintf(stderr, "ctl-storage-unit: --drain-timeout '%s' is not a "
                        "number of milliseconds\n", optarg);
                return 2;
            }
            drain_ms = v;
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
        default:
            usage(stderr);
            return 2;
        }
    }
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
    so.curve_secret_key = secret_file ? secret : NULL;
    so.curve_allow = allow_ptrs;
    so.curve_allow_count = allow_count;
    so.describe_off = no_describe;

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
    printf("%s\n", ctl_server_endpoint(u.server));
    fflush(stdout);
    ctl_log(CTL_LOG_INFO, PROG, "serving %s on %s", storage_service.name,
            ctl_server_endpoint(u.server));

    int sig = 0;
    while (sigwait(&stop, &sig) != 0)
        ;
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
