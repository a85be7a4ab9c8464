/*
 * cli.c - ctl-storage: call the ops of storage units from a shell.
 *
 *   ctl-storage --address ADDR [--address ADDR...] [--timeout T] [--json] CMD ...
 *   ctl-storage --etcd URL[,URL...] [--service NAME] [--namespace NS] ... CMD ...
 *
 * One subcommand per op of idl/storage.idl, each a thin layer over the
 * generated typed stubs. Output is for people by default and JSON with
 * --json. Every error prints one line naming the op and the unit, and ends
 * the program with a status that tells the error kinds apart:
 *
 *   0 ok   1 local failure (a file)   2 usage   3 UnitFull   4 Busy
 *   5 Missing   6 Transfer (protocol error, transport, bad reply)   7 timeout
 *
 * With several addresses, `stats` and `list` fan out through call_many and
 * print one row per unit; the status is that of the first unit (in the
 * order given) that failed.
 *
 * With --etcd (or $CTLRPC_ETCD when no --address is given), the units are
 * every serving unit of the service in etcd (ctlrpc/directory.h): a
 * directory lists them once. When etcd cannot be reached the program ends
 * with status 8, naming the endpoints.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <getopt.h>
#include <inttypes.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "fleet.h"
#include "storage.ctl.h"
#ifdef CTLRPC_WITH_ETCD
#include "ctlrpc/directory.h"
#endif

enum {
    EXIT_LOCAL = 1,
    EXIT_USAGE = 2,
    EXIT_UNIT_FULL = 3,
    EXIT_BUSY = 4,
    EXIT_MISSING = 5,
    EXIT_TRANSFER = 6,
    EXIT_TIMEOUT = 7,
    EXIT_UNREACHABLE = 8,
    EXIT_AUTH = 9,
};

#define MAX_ADDRESSES 256

typedef struct cli {
    const char *given[MAX_ADDRESSES]; /* --address */
    const char **addresses;           /* given, or the serving units in etcd */
    const char **unit_ids;            /* with etcd: each address's unit id; else NULL */
    size_t n_addresses;
    int timeout_ms;
    int json;
    int verbose;                      /* --verbose: say how each unit was read */
    ctl_client *client;
} cli;

static const char usage_text[] =
    "usage: ctl-storage --address ADDR [--address ADDR...] [--timeout T] [--json]\n"
    "                   [--verbose] [--retries N] [--retry-busy] COMMAND [ARGS]\n"
    "       ctl-storage --etcd URL[,URL...] [--service NAME] [--namespace NS]\n"
    "                   [--timeout T] [--json] [--verbose] [--retries N]\n"
    "                   [--retry-busy] COMMAND [ARGS]\n"
    "\n"
    "commands (one per op of idl/storage.idl):\n"
    "  put KEY FILE|- [--pin]   store FILE (- for stdin) under KEY\n"
    "  get KEY... [-o FILE]     write the blobs, in order, to FILE or stdout\n"
    "  describe KEY...          size, pinned, spilled of each blob\n"
    "  pin KEY...               pin blobs\n"
    "  unpin KEY...             unpin blobs (notify: no reply)\n"
    "  abort KEY...             drop unpinned blobs (notify: no reply)\n"
    "  delete KEY...            delete blobs\n"
    "  list [--prefix P]        keys, sorted (one row per unit with several)\n"
    "  stats                    counters (one row per unit with several)\n"
    "\n"
    "  keygen PREFIX            write a client key pair: PREFIX.key, PREFIX.pub\n"
    "\n"
    "options:\n"
    "  --address ADDR   a unit's tcp://host:port; repeat for several units\n"
    "                   (stats and list fan out; other commands take one)\n"
    "  --timeout T      deadline per call or batch: 2.5 (seconds), 500ms, 3s\n"
    "                   (default 5s)\n"
    "  --json           print JSON instead of text\n"
    "  --verbose        say on stderr how each unit was read (list: paged, or\n"
    "                   in one call from a unit older than paging)\n"
    "  --retries N      retry a failed call up to N times within its deadline\n"
    "                   (default 0): a connection refused before anything was\n"
    "                   sent; a timeout or a dropped connection only for ops\n"
    "                   declared idempotent\n"
    "  --retry-busy     with --retries, retry Busy too (never \"draining\")\n"
    "  --curve-server-key FILE   talk CURVE to units with this public key\n"
    "  --curve-key FILE          this client's secret key (for units with an\n"
    "                   allowlist; must not be readable by others)\n"
    "\n"
    "fleet (instead of --address: every serving unit of a service in etcd):\n"
    "exit status: 0 ok, 1 local failure, 2 usage, 3 UnitFull, 4 Busy,\n"
    "5 Missing, 6 Transfer (protocol, transport, bad reply, too large),\n"
    "7 timeout, 8 unreachable (connection refused, host does not resolve),\n"
    "9 authentication failed (CURVE keys or allowlist); with --etcd, 8 also\n"
    "when etcd cannot be reached or the service has no serving unit, and 9\n"
    "when etcd refuses the user, its password or its permissions\n";

static void print_usage(FILE *f)
{
    size_t split = strstr(usage_text, "exit status:") - usage_text;
    fwrite(usage_text, 1, split, f);
    fleet_usage(f);
    fputs("\n", f);
    fputs(usage_text + split, f);
}

static int usage_error(const char *fmt, ...) CTL_PRINTF(1, 2);
static int usage_error(const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    fprintf(stderr, "ctl-storage: ");
    vfprintf(stderr, fmt, ap);
    fprintf(stderr, "\n(run ctl-storage --help for usage)\n");
    va_end(ap);
    return EXIT_USAGE;
}

/* The exit status for an error kind. */
static int status_of(const ctl_error *err)
{
    switch (err->kind) {
    case CTL_OK:
        return 0;
    case CTL_UNIT_FULL:
        return EXIT_UNIT_FULL;
    case CTL_BUSY:
        return EXIT_BUSY;
    case CTL_MISSING:
        return EXIT_MISSING;
    case CTL_INVALID:
        return EXIT_USAGE;
    case CTL_TRANSFER:
        switch (err->cause) {
        case CTL_CAUSE_TIMEOUT:
            return EXIT_TIMEOUT;
        case CTL_CAUSE_REFUSED:
        case CTL_CAUSE_UNRESOLVED:
            return EXIT_UNREACHABLE;
        case CTL_CAUSE_AUTH:
            return EXIT_AUTH;
        default:
            return EXIT_TRANSFER;
        }
    default:
        return EXIT_TRANSFER;
    }
}

/* A short word for an error, for messages and JSON. */
static const char *word_of(const ctl_error *err)
{
    if (err->kind == CTL_TRANSFER && err->cause == CTL_CAUSE_TIMEOUT)
        return "Timeout";
    if (err->kind == CTL_TRANSFER &&
        (err->cause == CTL_CAUSE_REFUSED || err->cause == CTL_CAUSE_UNRESOLVED))
        return "Unreachable";
    if (err->kind == CTL_TRANSFER && err->cause == CTL_CAUSE_AUTH)
        return "AuthFailed";
    return ctl_kind_name(err->kind);
}

/* ---- JSON ------------------------------------------------------------ */

static void json_str(FILE *f, ctl_str s)
{
    static const char hex[] = "0123456789abcdef";
    fputc('"', f);
    for (size_t i = 0; i < s.len; i++) {
        unsigned char c = (unsigned char)s.ptr[i];
        if (c == '"' || c == '\\')
            fprintf(f, "\\%c", c);
        else if (c == '\n')
            fputs("\\n", f);
        else if (c == '\t')
            fputs("\\t", f);
        else if (c < 0x20 || c == 0x7f)
            fprintf(f, "\\u00%c%c", hex[c >> 4], hex[c & 15]);
        else
            fputc(c, f);
    }
    fputc('"', f);
}

static void json_cstr(FILE *f, const char *s)
{
    json_str(f, ctl_str_c(s));
}

static void json_error(FILE *f, const ctl_error *err)
{
    fprintf(f, "{\"kind\": ");
    json_cstr(f, word_of(err));
    fprintf(f, ", \"msg\": ");
    json_cstr(f, err->msg);
    if (err->reason) {
        fprintf(f, ", \"reason\": ");
        json_cstr(f, err->reason);
    }
    if (err->kind == CTL_MISSING) {
        fprintf(f, ", \"blobs\": [");
        for (size_t i = 0; i < err->blob_count; i++) {
            fprintf(f, "%s", i ? ", " : "");
            json_str(f, err->blobs[i]);
        }
        fprintf(f, "]");
    }
    fprintf(f, "}");
}

static void base64(FILE *f, ctl_str b)
{
    static const char tbl[] =
        "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    const unsigned char *p = (const unsigned char *)b.ptr;
    size_t i = 0;
    for (; i + 2 < b.len; i += 3) {
        unsigned v = (unsigned)p[i] << 16 | (unsigned)p[i + 1] << 8 | p[i + 2];
        fputc(tbl[v >> 18], f);
        fputc(tbl[(v >> 12) & 63], f);
        fputc(tbl[(v >> 6) & 63], f);
        fputc(tbl[v & 63], f);
    }
    if (i < b.len) {
        unsigned v = (unsigned)p[i] << 16 | (i + 1 < b.len ? (unsigned)p[i + 1] << 8 : 0);
        fputc(tbl[v >> 18], f);
        fputc(tbl[(v >> 12) & 63], f);
        fputc(i + 1 < b.len ? tbl[(v >> 6) & 63] : '=', f);
        fputc('=', f);
    }
}

/* With etcd: `, "unit_id": "..."` for unit i. */
static void json_unit_id(const cli *c, size_t i)
{
    if (c->unit_ids && c->unit_ids[i]) {
        printf(", \"unit_id\": ");
        json_cstr(stdout, c->unit_ids[i]);
    }
}

/* ---- errors ---------------------------------------------------------- */

/* Report a failed call: one line (or a JSON object) and its status. */
static int fail(const cli *c, const ctl_error *err)
{
    if (c->json) {
        fprintf(stdout, "{\"error\": ");
        json_error(stdout, err);
        fprintf(stdout, "}\n");
    } else {
        fprintf(stderr, "ctl-storage: %s: %s", word_of(err), err->msg);
        if (err->kind == CTL_MISSING) {
            fprintf(stderr, " [missing:");
            for (size_t i = 0; i < err->blob_count; i++)
                fprintf(stderr, " %s", err->blobs[i].ptr);
            fprintf(stderr, "]");
        }
        fprintf(stderr, "\n");
    }
    return status_of(err);
}

/* A subcommand's option getopt refused (unknown, or missing its value);
 * opterr is 0 so this is the only message. */
static int bad_option(const char *cmd, char **argv)
{
    return usage_error("%s: unknown option, or option without its value: '%s'",
                       cmd, argv[optind - 1]);
}

static int one_address(const cli *c, const char *cmd)
{
    if (c->n_addresses == 1)
        return 0;
    if (c->addresses != c->given)
        return usage_error("%s takes exactly one unit, and the service has %zu serving "
                           "units: give --address", cmd, c->n_addresses);
    return usage_error("%s takes exactly one --address", cmd);
}

/*
 * The KEY... arguments of a command that takes keys and one address: 0
 * with *keys viewing argv through *buf (the caller frees *buf), or the
 * exit status of a usage error or a failed allocation.
 */
static int keys_of(const cli *c, int argc, char **argv, const char *cmd,
                   ctl_str **buf, storage_list_str *keys)
{
    if (argc < 2)
        return usage_error("usage: %s KEY...", cmd);
    int rc = one_address(c, cmd);
    if (rc)
        return rc;
    *buf = calloc((size_t)argc, sizeof **buf);
    if (!*buf)
        return EXIT_LOCAL;
    for (int i = 1; i < argc; i++)
        (*buf)[i - 1] = ctl_str_c(argv[i]);
    *keys = (storage_list_str){.items = *buf, .count = (size_t)(argc - 1)};
    return 0;
}

/* ---- files ----------------------------------------------------------- */

static int read_all(const char *path, char **data, size_t *len)
{
    FILE *f = strcmp(path, "-") == 0 ? stdin : fopen(path, "rb");
    if (!f) {
        fprintf(stderr, "ctl-storage: cannot open %s: %s\n", path, strerror(errno));
        return EXIT_LOCAL;
    }
    size_t cap = 1 << 16, n = 0;
    char *buf = malloc(cap);
    for (;;) {
        if (!buf) {
            fprintf(stderr, "ctl-storage: out of memory reading %s\n", path);
            if (f != stdin)
                fclose(f);
            return EXIT_LOCAL;
        }
        n += fread(buf + n, 1, cap - n, f);
        if (n < cap)
            break;
        char *bigger = realloc(buf, cap * 2);
        if (!bigger)
            free(buf);
        buf = bigger;
        cap *= 2;
    }
    int bad = ferror(f);
    if (f != stdin)
        fclose(f);
    if (bad) {
        fprintf(stderr, "ctl-storage: cannot read %s\n", path);
        free(buf);
        return EXIT_LOCAL;
    }
    *data = buf;
    *len = n;
    return 0;
}

/* A regular file of CTL_BLOB_MIN bytes or more goes into a ctl_blob of its
 * size, which the put sends without copying it (ctlrpc/blob.h). Returns 0
 * with *blob set, 0 with *blob NULL when the file is not such a file (read
 * it with read_all), or an exit status. */
static int read_blob(const char *path, ctl_blob **blob, size_t *len)
{
    struct stat st;
    *blob = NULL;
    if (strcmp(path, "-") == 0 || stat(path, &st) != 0 || !S_ISREG(st.st_mode) ||
        (uint64_t)st.st_size < CTL_BLOB_MIN || (uint64_t)st.st_size > SIZE_MAX)
        return 0;
    FILE *f = fopen(path, "rb");
    if (!f)
        return 0; /* read_all says why */
    ctl_blob *b = ctl_blob_new((size_t)st.st_size);
    if (!b) {
        fclose(f);
        fprintf(stderr, "ctl-storage: out of memory reading %s\n", path);
        return EXIT_LOCAL;
    }
    size_t n = fread(ctl_blob_data(b), 1, ctl_blob_size(b), f);
    int bad = ferror(f);
    fclose(f);
    if (bad) {
        ctl_blob_release(&b);
        fprintf(stderr, "ctl-storage: cannot read %s\n", path);
        return EXIT_LOCAL;
    }
    *blob = b;
    *len = n; /* less if the file shrank meanwhile: then the bytes are copied */
    return 0;
}

/* ---- commands -------------------------------------------------------- */

static int cmd_put(cli *c, int argc, char **argv)
{
    static const struct option opts[] = {{"pin", no_argument, NULL, 'p'},
                                         {NULL, 0, NULL, 0}};
    int pin = 0, o;
    optind = 0; /* glibc: 0 restarts getopt's scan from scratch */
    opterr = 0;
    while ((o = getopt_long(argc, argv, "", opts, NULL)) != -1) {
        if (o != 'p')
            return bad_option("put", argv);
        pin = 1;
    }
    if (argc - optind != 2)
        return usage_error("usage: put KEY FILE|- [--pin]");
    int rc = one_address(c, "put");
    if (rc)
        return rc;
    char *data = NULL;
    size_t len = 0;
    ctl_blob *blob = NULL;
    if ((rc = read_blob(argv[optind + 1], &blob, &len)) != 0 ||
        (!blob && (rc = read_all(argv[optind + 1], &data, &len)) != 0))
        return rc;
    storage_put_args a;
    storage_put_args_init(&a);
    a.key = ctl_str_c(argv[optind]);
    a.data = blob ? ctl_blob_bin(blob, 0, len) : (ctl_str){data, len};
    a.pin = pin;
    uint64_t stored = 0;
    ctl_error err;
    ctl_error_init(&err);
    rc = storage_put(c->client, c->addresses[0], &a, c->timeout_ms, &stored, &err);
    if (rc != 0)
        rc = fail(c, &err);
    else if (c->json) {
        printf("{\"key\": ");
        json_str(stdout, a.key);
        printf(", \"stored\": %" PRIu64 ", \"pinned\": %s}\n", stored, pin ? "true" : "false");
    } else {
        printf("stored %" PRIu64 " bytes under '%s'%s\n", stored, argv[optind],
               pin ? " (pinned)" : "");
    }
    free(data);
    ctl_blob_release(&blob);
    ctl_error_fini(&err);
    return rc;
}

static int cmd_get(cli *c, int argc, char **argv)
{
    static const struct option opts[] = {{"output", required_argument, NULL, 'o'},
                                         {NULL, 0, NULL, 0}};
    const char *out = NULL;
    int o;
    optind = 0; /* glibc: 0 restarts getopt's scan from scratch */
    opterr = 0;
    while ((o = getopt_long(argc, argv, "o:", opts, NULL)) != -1) {
        if (o != 'o')
            return bad_option("get", argv);
        out = optarg;
    }
    if (argc - optind < 1)
        return usage_error("usage: get KEY... [-o FILE]");
    /* getopt moved the keys to the end: argv[optind - 1] stands in for the
     * command name keys_of skips. */
    ctl_str *buf = NULL;
    storage_get_args a;
    int rc = keys_of(c, argc - optind + 1, argv + optind - 1, "get", &buf, &a.keys);
    if (rc)
        return rc;
    storage_list_bin blobs = {.items = NULL, .count = 0};
    ctl_reply *reply = NULL;
    ctl_error err;
    ctl_error_init(&err);
    rc = storage_get(c->client, c->addresses[0], &a, c->timeout_ms, &blobs, &reply, &err);
    if (rc != 0) {
        rc = fail(c, &err);
    } else if (c->json && !out) {
        printf("{\"blobs\": [");
        for (size_t i = 0; i < blobs.count; i++) {
            printf("%s{\"key\": ", i ? ", " : "");
            json_str(stdout, a.keys.items[i]);
            printf(", \"size\": %zu, \"base64\": \"", blobs.items[i].len);
            base64(stdout, blobs.items[i]);
            printf("\"}");
        }
        printf("]}\n");
    } else {
        FILE *f = out ? fopen(out, "wb") : stdout;
        size_t total = 0;
        if (!f) {
            fprintf(stderr, "ctl-storage: cannot open %s: %s\n", out, strerror(errno));
            rc = EXIT_LOCAL;
        } else {
            for (size_t i = 0; i < blobs.count; i++) {
                total += blobs.items[i].len;
                if (fwrite(blobs.items[i].ptr, 1, blobs.items[i].len, f) != blobs.items[i].len)
                    rc = EXIT_LOCAL;
            }
            if ((out ? fclose(f) : fflush(f)) != 0)
                rc = EXIT_LOCAL;
            if (rc)
                fprintf(stderr, "ctl-storage: cannot write %s\n", out ? out : "stdout");
            else if (out && c->json) {
                printf("{\"written\": %zu, \"file\": ", total);
                json_cstr(stdout, out);
                printf("}\n");
            } else if (out)
                printf("wrote %zu bytes (%zu blobs) to %s\n", total, blobs.count, out);
        }
    }
    ctl_reply_destroy(&reply);
    ctl_error_fini(&err);
    free(buf);
    return rc;
}

static int cmd_describe(cli *c, int argc, char **argv)
{
    ctl_str *buf = NULL;
    storage_describe_args a;
    int rc = keys_of(c, argc, argv, "describe", &buf, &a.keys);
    if (rc)
        return rc;
    storage_list_BlobInfo infos = {.items = NULL, .count = 0};
    ctl_reply *reply = NULL;
    ctl_error err;
    ctl_error_init(&err);
    rc = storage_describe(c->client, c->addresses[0], &a, c->timeout_ms, &infos, &reply, &err);
    if (rc != 0) {
        rc = fail(c, &err);
    } else if (c->json) {
        printf("[");
        for (size_t i = 0; i < infos.count; i++) {
            const storage_BlobInfo *b = &infos.items[i];
            printf("%s{\"key\": ", i ? ", " : "");
            json_str(stdout, b->key);
            printf(", \"size\": %" PRIu64 ", \"pinned\": %s, \"spilled\": %s}", b->size,
                   b->pinned ? "true" : "false", b->spilled ? "true" : "false");
        }
        printf("]\n");
    } else {
        printf("%-24s %12s  %-6s  %s\n", "KEY", "SIZE", "PINNED", "SPILLED");
        for (size_t i = 0; i < infos.count; i++) {
            const storage_BlobInfo *b = &infos.items[i];
            printf("%-24.*s %12" PRIu64 "  %-6s  %s\n", (int)b->key.len, b->key.ptr,
                   b->size, b->pinned ? "yes" : "no", b->spilled ? "yes" : "no");
        }
    }
    ctl_reply_destroy(&reply);
    ctl_error_fini(&err);
    free(buf);
    return rc;
}

/* pin and delete: keys in, a count out. */
static int cmd_count(cli *c, int argc, char **argv, const char *cmd)
{
    ctl_str *buf = NULL;
    storage_list_str keys;
    int rc = keys_of(c, argc, argv, cmd, &buf, &keys);
    if (rc)
        return rc;
    uint64_t n = 0;
    ctl_error err;
    ctl_error_init(&err);
    if (strcmp(cmd, "pin") == 0) {
        storage_pin_args a = STORAGE_PIN_ARGS_INIT;
        a.keys = keys;
        rc = storage_pin(c->client, c->addresses[0], &a, c->timeout_ms, &n, &err);
    } else {
        storage_delete_args a = STORAGE_DELETE_ARGS_INIT;
        a.keys = keys;
        rc = storage_delete(c->client, c->addresses[0], &a, c->timeout_ms, &n, &err);
    }
    const char *what = strcmp(cmd, "pin") == 0 ? "pinned" : "deleted";
    if (rc != 0)
        rc = fail(c, &err);
    else if (c->json)
        printf("{\"%s\": %" PRIu64 "}\n", what, n);
    else
        printf("%s %" PRIu64 " blob%s\n", what, n, n == 1 ? "" : "s");
    ctl_error_fini(&err);
    free(buf);
    return rc;
}

/* unpin and abort: notify ops, nothing comes back. */
static int cmd_notify(cli *c, int argc, char **argv, const char *cmd)
{
    ctl_str *buf = NULL;
    storage_list_str keys;
    int rc = keys_of(c, argc, argv, cmd, &buf, &keys);
    if (rc)
        return rc;
    ctl_error err;
    ctl_error_init(&err);
    if (strcmp(cmd, "unpin") == 0) {
        storage_unpin_args a = STORAGE_UNPIN_ARGS_INIT;
        a.keys = keys;
        rc = storage_unpin(c->client, c->addresses[0], &a, &err);
    } else {
        storage_abort_args a = STORAGE_ABORT_ARGS_INIT;
        a.keys = keys;
        rc = storage_abort(c->client, c->addresses[0], &a, &err);
    }
    if (rc != 0)
        rc = fail(c, &err);
    else if (c->json)
        printf("{\"sent\": \"%s\", \"keys\": %zu}\n", cmd, keys.count);
    else
        printf("sent %s for %zu key%s (notify: the unit does not reply)\n", cmd,
               keys.count, keys.count == 1 ? "" : "s");
    ctl_error_fini(&err);
    free(buf);
    return rc;
}

/* Keys a list page asks each unit for: the CLI reads every key, a page at
 * a time, so no unit builds a reply of more than this. */
#define LIST_PAGE 1000u

/* One round of list pages: the units still being read (who[k] is the
 * address index of outcome k) and their outcomes. An outcome is superseded
 * when its unit refused to page and was asked again without paging. */
typedef struct list_round {
    size_t m;
    size_t *who;
    storage_list_args *args;
    storage_list_outcome *out;
    bool *superseded;
} list_round;

/* Whether `c` may stand next to an argument's name inside a word. */
static bool name_char(char c)
{
    return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
           c == '_';
}

/* Whether `msg` holds `name` as a word of its own. */
static bool names_word(const char *msg, const char *name)
{
    size_t n = strlen(name);
    for (const char *p = msg; (p = strstr(p, name)) != NULL; p += n)
        if ((p == msg || !name_char(p[-1])) && !name_char(p[n]))
            return true;
    return false;
}

/*
 * Whether a failed first list page says the unit does not know the paging
 * args. A unit of the first release of storage.idl serves list(prefix)
 * alone and answers an argument it does not know with a Protocol error
 * naming it (docs/PROTOCOL.md): ctlrpc's units say "op 'list': arg limit:
 * not an arg of list", the reference design's Python units "list() got an
 * unexpected keyword argument 'limit'". A unit that pages has no Protocol
 * error naming either for a page with a limit (its own page limit only
 * shortens the page), so the name is what tells; a timeout, a refused
 * connection or any other error is reported as it is.
 */
static bool refuses_paging(const ctl_error *err, const char *address)
{
    if (err->kind != CTL_TRANSFER || err->cause != CTL_CAUSE_REMOTE || !err->msg)
        return false;
    /* The unit's words follow "list at ADDR": a host named "limit" is not one. */
    const char *at = strstr(err->msg, address);
    const char *said = at ? at + strlen(address) : err->msg;
    return names_word(said, "limit") || names_word(said, "after");
}

static void list_round_fini(list_round *r)
{
    storage_list_outcomes_fini(r->out, r->m);
    free(r->out);
    free(r->args);
    free(r->who);
    free(r->superseded);
}

static int cmd_list(cli *c, int argc, char **argv)
{
    static const struct option opts[] = {{"prefix", required_argument, NULL, 'p'},
                                         {NULL, 0, NULL, 0}};
    ctl_str prefix = {"", 0};
    int o, first_fail = 0;
    optind = 0; /* glibc: 0 restarts getopt's scan from scratch */
    opterr = 0;
    while ((o = getopt_long(argc, argv, "", opts, NULL)) != -1) {
        if (o != 'p')
            return bad_option("list", argv);
        prefix = ctl_str_c(optarg);
    }
    if (optind != argc)
        return usage_error("list: unexpected argument '%s'", argv[optind]);
    size_t n = c->n_addresses, nrounds = 0, cap = 0;
    list_round *rounds = NULL;
    ctl_str *after = calloc(n, sizeof *after);
    bool *active = calloc(n, sizeof *active);
    /* Units that refused to page: asked once for every key, without the
     * paging args. Remembered for the rest of the command. */
    bool *unpaged = calloc(n, sizeof *unpaged);
    size_t *pages = calloc(n, sizeof *pages);
    int rc = after && active && unpaged && pages ? 0 : EXIT_LOCAL;
    for (size_t i = 0; i < n && rc == 0; i++)
        active[i] = true;
    /* Page through every unit at once: each round asks the units not yet
     * done for their next page (after the last key they sent), with one
     * deadline per round. Replies are kept: their keys are printed last. */
    for (size_t left = n; left > 0 && rc == 0;) {
        if (nrounds == cap) {
            list_round *more = realloc(rounds, (cap ? cap * 2 : 4) * sizeof *more);
            if (!more) {
                rc = EXIT_LOCAL;
                break;
            }
            rounds = more;
            cap = cap ? cap * 2 : 4;
        }
        list_round *r = &rounds[nrounds];
        r->m = left;
        r->who = calloc(left, sizeof *r->who);
        r->args = calloc(left, sizeof *r->args);
        r->out = calloc(left, sizeof *r->out);
        r->superseded = calloc(left, sizeof *r->superseded);
        const char **addrs = calloc(left, sizeof *addrs);
        if (!r->who || !r->args || !r->out || !r->superseded || !addrs) {
            free(r->who);
            free(r->args);
            free(r->out);
            free(r->superseded);
            free(addrs);
            rc = EXIT_LOCAL;
            break;
        }
        nrounds++;
        for (size_t i = 0, k = 0; i < n; i++) {
            if (!active[i])
                continue;
            r->who[k] = i;
            addrs[k] = c->addresses[i];
            /* The stubs leave out arguments at their defaults: an unpaged
             * call sends the prefix alone, as the first release did. */
            r->args[k] = (storage_list_args)STORAGE_LIST_ARGS_INIT;
            r->args[k].prefix = prefix;
            if (!unpaged[i]) {
                r->args[k].after = after[i];
                r->args[k].limit = LIST_PAGE;
            }
            k++;
        }
        storage_list_many(c->client, addrs, r->args, r->m, c->timeout_ms, r->out);
        free(addrs);
        for (size_t k = 0; k < r->m; k++) {
            const storage_list_outcome *u = &r->out[k];
            size_t i = r->who[k];
            if (!unpaged[i] && pages[i] == 0 && refuses_paging(&u->error, c->addresses[i])) {
                unpaged[i] = true; /* ask again, in the next round, for all */
                r->superseded[k] = true;
                continue;
            }
            if (u->error.kind == CTL_OK && u->result.count > 0)
                pages[i]++;
            /* Only an empty page ends a unit's keys: a shorter one may be
             * the unit's own page limit (--max-list-keys below LIST_PAGE). */
            if (u->error.kind != CTL_OK || unpaged[i] || u->result.count == 0) {
                active[i] = false; /* failed, or past its last key */
                left--;
            } else {
                after[i] = u->result.items[u->result.count - 1];
            }
        }
    }
    if (c->json && rc == 0)
        printf("[");
    for (size_t i = 0; i < n && rc == 0; i++) {
        /* This unit's pages, in order; an error ends them. */
        const ctl_error *error = NULL;
        size_t total = 0;
        for (size_t r = 0; r < nrounds; r++)
            for (size_t k = 0; k < rounds[r].m; k++)
                if (rounds[r].who[k] == i && !rounds[r].superseded[k]) {
                    if (rounds[r].out[k].error.kind != CTL_OK)
                        error = &rounds[r].out[k].error;
                    else
                        total += rounds[r].out[k].result.count;
                }
        if (error && !first_fail)
            first_fail = status_of(error);
        if (unpaged[i])
            fprintf(stderr, "ctl-storage: unit at %s does not page list; %s everything in "
                    "one call\n", c->addresses[i], error ? "asked for" : "listed");
        else if (c->verbose && !error)
            fprintf(stderr, "ctl-storage: unit at %s pages list; listed in %zu page%s of "
                    "at most %u keys\n", c->addresses[i], pages[i], pages[i] == 1 ? "" : "s",
                    LIST_PAGE);
        if (c->json) {
            printf("%s{\"address\": ", i ? ", " : "");
            json_cstr(stdout, c->addresses[i]);
            json_unit_id(c, i);
            if (unpaged[i])
                printf(", \"paged\": false");
        }
        if (error) {
            if (c->json) {
                printf(", \"error\": ");
                json_error(stdout, error);
                printf("}");
            } else if (n > 1) {
                printf("%-28s %s: %s\n", c->addresses[i], word_of(error), error->msg);
            } else {
                fail(c, error);
            }
            continue;
        }
        if (c->json)
            printf(", \"keys\": [");
        else if (n > 1)
            printf("%-28s %zu key%s:", c->addresses[i], total, total == 1 ? "" : "s");
        size_t printed = 0;
        for (size_t r = 0; r < nrounds; r++)
            for (size_t k = 0; k < rounds[r].m; k++) {
                if (rounds[r].who[k] != i || rounds[r].superseded[k])
                    continue;
                const storage_list_str *keys = &rounds[r].out[k].result;
                for (size_t q = 0; q < keys->count; q++, printed++) {
                    if (c->json) {
                        printf("%s", printed ? ", " : "");
                        json_str(stdout, keys->items[q]);
                    } else if (n > 1) {
                        printf(" %.*s", (int)keys->items[q].len, keys->items[q].ptr);
                    } else {
                        printf("%.*s\n", (int)keys->items[q].len, keys->items[q].ptr);
                    }
                }
            }
        if (c->json)
            printf("]}");
        else if (n > 1)
            printf("\n");
    }
    if (c->json && rc == 0)
        printf("]\n");
    for (size_t r = 0; r < nrounds; r++)
        list_round_fini(&rounds[r]);
    free(rounds);
    free(after);
    free(active);
    free(unpaged);
    free(pages);
    return rc ? rc : first_fail;
}

static int cmd_stats(cli *c, int argc, char **argv)
{
    if (argc != 1)
        return usage_error("stats: unexpected argument '%s'", argv[1]);
    size_t n = c->n_addresses;
    storage_stats_outcome *out = calloc(n, sizeof *out);
    int first_fail = 0;
    if (!out)
        return EXIT_LOCAL;
    storage_stats_many(c->client, c->addresses, n, c->timeout_ms, out);
    if (c->json)
        printf("[");
    else
        printf("%-28s %8s %12s %12s %7s %8s %9s %8s %12s\n", "UNIT", "BLOBS", "BYTES",
               "CAPACITY", "PINNED", "SPILLED", "REQUESTS", "DROPPED", "INDEX_BYTES");
    for (size_t i = 0; i < n; i++) {
        const storage_stats_outcome *u = &out[i];
        const storage_UnitStats *s = &u->result;
        if (u->error.kind != CTL_OK && !first_fail)
            first_fail = status_of(&u->error);
        if (c->json) {
            printf("%s{\"address\": ", i ? ", " : "");
            json_cstr(stdout, c->addresses[i]);
            json_unit_id(c, i);
            if (u->error.kind != CTL_OK) {
                printf(", \"error\": ");
                json_error(stdout, &u->error);
            } else {
                printf(", \"blobs\": %" PRIu64 ", \"bytes\": %" PRIu64
                       ", \"capacity\": %" PRIu64 ", \"pinned\": %" PRIu64
                       ", \"spilled\": %" PRIu64 ", \"requests\": %" PRIu64
                       ", \"dropped\": %" PRIu64 ", \"index_bytes\": %" PRIu64
                       ", \"index_capacity\": %" PRIu64,
                       s->blobs, s->bytes, s->capacity, s->pinned, s->spilled,
                       s->requests, s->dropped, s->index_bytes, s->index_capacity);
            }
            printf("}");
        } else if (u->error.kind != CTL_OK) {
            printf("%-28s %s: %s\n", c->addresses[i], word_of(&u->error), u->error.msg);
        } else {
            printf("%-28s %8" PRIu64 " %12" PRIu64 " %12" PRIu64 " %7" PRIu64 " %8" PRIu64
                   " %9" PRIu64 " %8" PRIu64 " %12" PRIu64 "\n",
                   c->addresses[i], s->blobs, s->bytes, s->capacity, s->pinned,
                   s->spilled, s->requests, s->dropped, s->index_bytes);
        }
    }
    if (c->json)
        printf("]\n");
    storage_stats_outcomes_fini(out, n);
    free(out);
    return first_fail;
}

/* "2.5" (seconds), "500ms", "3s" -> milliseconds; -1 when malformed. */
static int parse_timeout(const char *text)
{
    char *end = NULL;
    errno = 0;
    double v = strtod(text, &end);
    if (errno || end == text || !(v >= 0)) /* also refuses NaN */
        return -1;
    double ms;
    if (strcmp(end, "ms") == 0)
        ms = v;
    else if (strcmp(end, "s") == 0 || *end == '\0')
        ms = v * 1000.0;
    else
        return -1;
    return ms > 86400000.0 ? -1 : (int)(ms + 0.5);
}

int main(int argc, char **argv)
{
    static const struct option opts[] = {
        {"address", required_argument, NULL, 'a'},
        {"timeout", required_argument, NULL, 't'},
        {"json", no_argument, NULL, 'j'},
        {"verbose", no_argument, NULL, 'v'},
        {"retries", required_argument, NULL, 'r'},
        {"retry-busy", no_argument, NULL, 'B'},
        {"curve-server-key", required_argument, NULL, 'S'},
        {"curve-key", required_argument, NULL, 'K'},
        {"help", no_argument, NULL, 'h'},
        FLEET_OPTIONS,
        {NULL, 0, NULL, 0},
    };
    cli c = {{NULL}, NULL, NULL, 0, 5000, 0, 0, NULL};
    fleet_flags fleet = {0};
    const char *server_key_file = NULL, *key_file = NULL;
    unsigned retries = 0;
    int retry_busy = 0;
    int o;
    /* '+': stop at the command; its own options are parsed after it. */
    while ((o = getopt_long(argc, argv, "+h", opts, NULL)) != -1) {
        switch (o) {
        case 'a':
            if (c.n_addresses == MAX_ADDRESSES)
                return usage_error("at most %d addresses", MAX_ADDRESSES);
            c.given[c.n_addresses++] = optarg;
            break;
        case 't':
            c.timeout_ms = parse_timeout(optarg);
            if (c.timeout_ms < 0)
                return usage_error("--timeout '%s' is not a duration (2.5, 500ms, 3s)", optarg);
            break;
        case 'j':
            c.json = 1;
            break;
        case 'v':
            c.verbose = 1;
            break;
        case 'r': {
            char *end = NULL;
            errno = 0;
            unsigned long n = strtoul(optarg, &end, 10);
            if (!*optarg || *end || errno || optarg[0] == '-' || n > 100)
                return usage_error("--retries '%s' is not a number of retries "
                                   "from 0 to 100", optarg);
            retries = (unsigned)n;
            break;
        }
        case 'B':
            retry_busy = 1;
            break;
        case 'S':
            server_key_file = optarg;
            break;
        case 'K':
            key_file = optarg;
            break;
        case 'h':
            print_usage(stdout);
            return 0;
        default:
            if (fleet_take(&fleet, o, optarg))
                break;
            print_usage(stderr);
            return EXIT_USAGE;
        }
    }
    c.addresses = c.given;
    if (optind >= argc)
        return usage_error("no command given");
    ctl_error err;
    ctl_error_init(&err);
    if (strcmp(argv[optind], "keygen") == 0) {
        if (argc - optind != 2)
            return usage_error("usage: keygen PREFIX");
        int krc = ctl_curve_write_keypair(argv[optind + 1], &err);
        if (krc)
            fprintf(stderr, "ctl-storage: %s\n", err.msg);
        else
            printf("wrote %s.key (secret) and %s.pub\n", argv[optind + 1],
                   argv[optind + 1]);
        ctl_error_fini(&err);
        return krc ? EXIT_LOCAL : 0;
    }
    if (c.n_addresses && fleet.given)
        return usage_error("give --address or --etcd (with --service), not both");
    bool use_etcd = c.n_addresses == 0 && fleet_resolve(&fleet);
    if (fleet.given && !use_etcd)
        return usage_error("--service, --namespace and the --etcd-* flags need --etcd URL "
                           "(or $CTLRPC_ETCD)");
    if (c.n_addresses == 0 && !use_etcd)
        return usage_error("no --address given (nor --etcd)");
#ifdef CTLRPC_WITH_ETCD
    ctl_membership *members = NULL;
    if (use_etcd) {
        ctl_directory_options dopts;
        ctl_directory_options_init(&dopts);
        dopts.etcd.endpoints = fleet.etcd;
        dopts.etcd.cacert = fleet.cacert;
        dopts.etcd.cert = fleet.cert;
        dopts.etcd.key = fleet.key;
        dopts.etcd.user = fleet.user;
        dopts.namespace_name = fleet.ns;
        /* One listing, retried for at most a second (and never past the
         * command's deadline). */
        int budget = c.timeout_ms < 1000 ? (c.timeout_ms > 0 ? c.timeout_ms : 1) : 1000;
        dopts.start_timeout_ms = budget;
        dopts.etcd.timeout_ms = budget;
        const char *service = fleet.service ? fleet.service : storage_service.name;
        ctl_directory *dir = NULL;
        if (ctl_directory_new(service, &dopts, &dir, &err) != 0) {
            fprintf(stderr, "ctl-storage: %s\n", err.msg);
            int drc = err.kind == CTL_INVALID            ? EXIT_USAGE
                      : err.cause == CTL_CAUSE_AUTH ? EXIT_AUTH
                                                    : EXIT_UNREACHABLE;
            ctl_error_fini(&err);
            return drc;
        }
        members = ctl_directory_snapshot(dir);
        ctl_directory_destroy(&dir);
        c.addresses = ctl_membership_addresses(members, &c.n_addresses);
        c.unit_ids = calloc(c.n_addresses ? c.n_addresses : 1, sizeof *c.unit_ids);
        for (size_t i = 0, k = 0; c.unit_ids && i < members->count; i++)
            if (members->units[i].serving)
                c.unit_ids[k++] = members->units[i].unit_id;
        if (c.n_addresses == 0) {
            fprintf(stderr, "ctl-storage: service '%s' (namespace %s) has no serving unit "
                    "in etcd %s\n", service, fleet.ns ? fleet.ns : "default", fleet.etcd);
            ctl_membership_release(&members);
            free(c.unit_ids);
            ctl_error_fini(&err);
            return EXIT_UNREACHABLE;
        }
    }
#else
    if (use_etcd)
        return usage_error("--etcd (or $CTLRPC_ETCD): this build has no etcd support "
                           "(configured with CTLRPC_WITH_ETCD=OFF)");
#endif
    /* Every address is checked before any command prints (a table's header
     * before a usage error would read as a result). */
    for (size_t i = 0; i < c.n_addresses; i++) {
        ctl_endpoint ep;
        if (ctl_endpoint_parse(c.addresses[i], &ep, &err) != 0) {
            int urc = usage_error("--address: %s", err.msg);
            ctl_error_fini(&err);
            return urc;
        }
    }
    if (key_file && !server_key_file)
        return usage_error("--curve-key needs --curve-server-key");

    char server_key[CTL_CURVE_KEY_BUF], secret[CTL_CURVE_KEY_BUF];
    ctl_client_options co;
    ctl_client_options_init(&co);
    if ((server_key_file &&
         ctl_curve_read_key(server_key_file, false, server_key, &err) != 0) ||
        (key_file && ctl_curve_read_key(key_file, true, secret, &err) != 0)) {
        fprintf(stderr, "ctl-storage: %s\n", err.msg);
        ctl_error_fini(&err);
        return EXIT_USAGE;
    }
    co.curve_server_key = server_key_file ? server_key : NULL;
    co.curve_secret_key = key_file ? secret : NULL;
    co.retry.max_attempts = retries + 1;
    co.retry.retry_busy = retry_busy;
    int nrc = ctl_client_new(&co, &c.client, &err);
    memset(secret, 0, sizeof secret);
    if (nrc != 0) {
        int rc = fail(&c, &err);
        ctl_error_fini(&err);
        return rc;
    }
    const char *cmd = argv[optind];
    int sub_argc = argc - optind;
    char **sub_argv = argv + optind;
    int rc;
    if (strcmp(cmd, "put") == 0)
        rc = cmd_put(&c, sub_argc, sub_argv);
    else if (strcmp(cmd, "get") == 0)
        rc = cmd_get(&c, sub_argc, sub_argv);
    else if (strcmp(cmd, "describe") == 0)
        rc = cmd_describe(&c, sub_argc, sub_argv);
    else if (strcmp(cmd, "pin") == 0 || strcmp(cmd, "delete") == 0)
        rc = cmd_count(&c, sub_argc, sub_argv, cmd);
    else if (strcmp(cmd, "unpin") == 0 || strcmp(cmd, "abort") == 0)
        rc = cmd_notify(&c, sub_argc, sub_argv, cmd);
    else if (strcmp(cmd, "list") == 0)
        rc = cmd_list(&c, sub_argc, sub_argv);
    else if (strcmp(cmd, "stats") == 0)
        rc = cmd_stats(&c, sub_argc, sub_argv);
    else
        rc = usage_error("unknown command '%s'", cmd);
    ctl_client_destroy(&c.client);
#ifdef CTLRPC_WITH_ETCD
    ctl_membership_release(&members);
    free(c.unit_ids);
#endif
    ctl_error_fini(&err);
    return rc;
}
