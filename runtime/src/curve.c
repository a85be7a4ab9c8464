/*
 * curve.c - CURVE keys and key files (ctlrpc/curve.h), and the ZAP handler
 * that enforces a unit's client allowlist (curve_int.h).
 */
#include "ctlrpc/curve.h"

#include <ctype.h>
#include <stdatomic.h>
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <arpa/inet.h>
#include <netinet/in.h>
#include <unistd.h>

#include <zmq.h>

#include "ctlrpc/log.h"
#include "ctlrpc/net.h"
#include "curve_int.h"
#include "log_int.h"
#include "transport_int.h"
#include "util_int.h"

bool ctl_curve_available(void)
{
    return zmq_has("curve") != 0;
}

bool ctl_curve_key_valid(const char *key)
{
    uint8_t bin[32];
    return key && strlen(key) == CTL_CURVE_KEY_LEN &&
           zmq_z85_decode(bin, key) != NULL;
}

int ctl_curve_keypair(char public_key[CTL_CURVE_KEY_BUF],
                      char secret_key[CTL_CURVE_KEY_BUF], ctl_error *err)
{
    if (!ctl_curve_available() || zmq_curve_keypair(public_key, secret_key) != 0)
        return ctl_error_set(err, CTL_INVALID,
                             "cannot make a CURVE key pair: this libzmq was "
                             "built without CURVE support");
    return 0;
}

int ctl_curve_public_of(const char *secret_key,
                        char public_key[CTL_CURVE_KEY_BUF], ctl_error *err)
{
    if (!ctl_curve_key_valid(secret_key))
        return ctl_error_set(err, CTL_INVALID,
                             "CURVE secret key is not a 40-character Z85 key");
    if (!ctl_curve_available() || zmq_curve_public(public_key, secret_key) != 0)
        return ctl_error_set(err, CTL_INVALID,
                             "cannot derive a CURVE public key: this libzmq "
                             "was built without CURVE support");
    return 0;
}

/* Key files and allowlists, read as ssh reads its own files: refused, with
 * the file and the mistake named, when someone else could have put keys in
 * them (a symbolic link, a file or directory others may write), when they
 * are not text (a NUL byte), or when their header says they hold the other
 * half of a key pair. The C and Python readers (ctlrpc/curve.py) refuse the
 * same files with the same words. */

#define SECRET_HEADER "ctlrpc CURVE secret key"
#define PUBLIC_HEADER "ctlrpc CURVE public key"

typedef enum { FILE_PUBLIC, FILE_SECRET, FILE_ALLOWLIST } file_kind;

static const char *file_word(file_kind kind)
{
    return kind == FILE_ALLOWLIST ? "allowlist" : "key file";
}

/* Refuse a file in a directory others may write (unless it is sticky, as
 * /tmp is, and the file is ours or root's): they could replace it. */
static int check_directory(const char *path, const struct stat *st,
                           file_kind kind, ctl_error *err)
{
    char dir[4096];
    const char *slash = strrchr(path, '/');
    size_t len = slash ? (size_t)(slash - path) : 1;
    if (len == 0)
        len = 1; /* "/name" */
    if (len >= sizeof dir)
        return 0;
    memcpy(dir, slash ? path : ".", len);
    dir[len] = '\0';
    struct stat ds;
    if (stat(dir, &ds) != 0 || !(ds.st_mode & S_IWOTH))
        return 0;
    if ((ds.st_mode & S_ISVTX) && (st->st_uid == geteuid() || st->st_uid == 0))
        return 0;
    return ctl_error_set(err, CTL_INVALID,
                         "%s %s is in a directory that others can write (%s, "
                         "mode %04o): anyone could replace it; move it, or "
                         "chmod o-w %s", file_word(kind), path, dir,
                         (unsigned)(ds.st_mode & 07777), dir);
}

/* Read a small text file whole (keys and allowlists are small), checking
 * who could have written it. *len_out is its length. */
static char *slurp(const char *path, file_kind kind, size_t *len_out,
                   struct stat *st, ctl_error *err)
{
    const char *word = file_word(kind);
    int fd = open(path, O_RDONLY | O_CLOEXEC | O_NOFOLLOW);
    if (fd < 0) {
        struct stat ls;
        if (errno == ELOOP && lstat(path, &ls) == 0 && S_ISLNK(ls.st_mode))
            ctl_error_set(err, CTL_INVALID,
                          "%s %s is a symbolic link: give the file itself (a "
                          "link can be pointed elsewhere)", word, path);
        else if (errno == ENOENT && ctl_curve_key_valid(path))
            /* A key's text where a file was wanted: not echoed, it may be a
             * secret. */
            ctl_error_set(err, CTL_INVALID,
                          "a key's text was given where a %s is wanted: give the "
                          "file (%s)%s", word,
                          kind == FILE_PUBLIC   ? "PREFIX.pub"
                          : kind == FILE_SECRET ? "PREFIX.key"
                                                : "public keys, one a line",
                          kind == FILE_SECRET ? "; a secret on the command line is "
                                                "visible to every local user, make a "
                                                "new key pair" : "");
        else
            ctl_error_set(err, CTL_INVALID, "%s %s: %s", word, path, strerror(errno));
        return NULL;
    }
    if (fstat(fd, st) != 0 || !S_ISREG(st->st_mode)) {
        ctl_error_set(err, CTL_INVALID, "%s %s: not a regular file", word, path);
        close(fd);
        return NULL;
    }
    if (st->st_mode & S_IWOTH) {
        ctl_error_set(err, CTL_INVALID,
                      "%s %s is writable by others (mode %04o): anyone could "
                      "replace its keys (chmod o-w %s)", word, path,
                      (unsigned)(st->st_mode & 07777), path);
        close(fd);
        return NULL;
    }
    if (check_directory(path, st, kind, err) != 0) {
        close(fd);
        return NULL;
    }
    if (st->st_size > (1 << 20)) {
        ctl_error_set(err, CTL_INVALID, "%s %s: too large for a %s", word, path,
                      word);
        close(fd);
        return NULL;
    }
    char *text = malloc((size_t)st->st_size + 1);
    size_t n = 0;
    while (text && n < (size_t)st->st_size) {
        ssize_t r = read(fd, text + n, (size_t)st->st_size - n);
        if (r < 0 && errno == EINTR)
            continue;
        if (r <= 0)
            break;
        n += (size_t)r;
    }
    close(fd);
    if (!text) {
        ctl_error_set(err, CTL_INVALID, "%s %s: out of memory", word, path);
        return NULL;
    }
    text[n] = '\0';
    const char *nul = memchr(text, '\0', n);
    if (nul) {
        ctl_error_set(err, CTL_INVALID,
                      "%s %s holds a NUL byte (at offset %zu): not a text file",
                      word, path, (size_t)(nul - text));
        memset(text, 0, n);
        free(text);
        return NULL;
    }
    *len_out = n;
    return text;
}

/* The next line of `*cursor` with whitespace trimmed (NUL-terminated in
 * place), or NULL at the end. */
static char *next_line(char **cursor)
{
    char *line = *cursor;
    if (!line || !*line)
        return NULL;
    char *nl = strchr(line, '\n');
    if (nl) {
        *nl = '\0';
        *cursor = nl + 1;
    } else {
        *cursor = line + strlen(line);
    }
    while (isspace((unsigned char)*line))
        line++;
    size_t len = strlen(line);
    while (len && isspace((unsigned char)line[len - 1]))
        line[--len] = '\0';
    return line;
}

/* Whether a comment line is the header keygen writes for `header`. */
static bool is_header(const char *line, const char *header)
{
    if (*line != '#')
        return false;
    line++;
    while (isspace((unsigned char)*line))
        line++;
    return strncmp(line, header, strlen(header)) == 0;
}

int ctl_curve_read_key(const char *path, bool secret,
                       char key[CTL_CURVE_KEY_BUF], ctl_error *err)
{
    size_t len = 0;
    struct stat st;
    char *text = slurp(path, secret ? FILE_SECRET : FILE_PUBLIC, &len, &st, err);
    if (!text)
        return CTL_INVALID;
    char *cursor = text, *line;
    int rc = ctl_error_set(err, CTL_INVALID, "key file %s holds no key", path);
    while ((line = next_line(&cursor)) != NULL) {
        if (secret && is_header(line, PUBLIC_HEADER)) {
            rc = ctl_error_set(err, CTL_INVALID,
                               "key file %s: this is a public key; pass the .key "
                               "file (the secret key)", path);
            break;
        }
        if (!secret && is_header(line, SECRET_HEADER)) {
            rc = ctl_error_set(err, CTL_INVALID,
                               "key file %s: this is a secret key; pass the .pub "
                               "file (the public key)", path);
            break;
        }
        if (!*line || *line == '#')
            continue;
        if (!ctl_curve_key_valid(line)) {
            rc = ctl_error_set(err, CTL_INVALID,
                               "key file %s: not a 40-character Z85 CURVE key",
                               path);
        } else if (secret && (st.st_mode & 077)) {
            rc = ctl_error_set(err, CTL_INVALID,
                               "key file %s is readable by others (mode %04o): a "
                               "secret key must be private (chmod 600 %s)",
                               path, (unsigned)(st.st_mode & 07777), path);
        } else {
            memcpy(key, line, CTL_CURVE_KEY_BUF);
            ctl_error_clear(err);
            rc = 0;
        }
        break;
    }
    memset(text, 0, len);
    free(text);
    return rc;
}

int ctl_curve_read_allowlist(const char *path, char (**keys)[CTL_CURVE_KEY_BUF],
                             size_t *count, ctl_error *err)
{
    size_t len = 0, *lines = NULL;
    struct stat st;
    char *text = slurp(path, FILE_ALLOWLIST, &len, &st, err);
    *keys = NULL;
    *count = 0;
    if (!text)
        return CTL_INVALID;
    char *cursor = text, *line;
    size_t lineno = 0, cap = 0;
    int rc = 0;
    while (rc == 0 && (line = next_line(&cursor)) != NULL) {
        lineno++;
        if (is_header(line, SECRET_HEADER)) {
            rc = ctl_error_set(err, CTL_INVALID,
                               "allowlist %s:%zu: this is a secret key file's "
                               "header: an allowlist holds public keys (the .pub "
                               "files); make a new key pair, this secret is "
                               "exposed", path, lineno);
            break;
        }
        if (!*line || *line == '#')
            continue;
        if (!ctl_curve_key_valid(line)) {
            rc = ctl_error_set(err, CTL_INVALID,
                               "allowlist %s:%zu: not a 40-character Z85 CURVE "
                               "public key", path, lineno);
            break;
        }
        for (size_t i = 0; i < *count; i++)
            if (strcmp((*keys)[i], line) == 0) {
                rc = ctl_error_set(err, CTL_INVALID,
                                   "allowlist %s:%zu: the key of line %zu again "
                                   "(a duplicate)", path, lineno, lines[i]);
                break;
            }
        if (rc)
            break;
        if (*count == cap) {
            cap = cap ? cap * 2 : 8;
            char(*bigger)[CTL_CURVE_KEY_BUF] = realloc(*keys, cap * sizeof **keys);
            if (bigger)
                *keys = bigger;
            size_t *more = bigger ? realloc(lines, cap * sizeof *lines) : NULL;
            if (!more) {
                rc = ctl_error_set(err, CTL_INVALID, "allowlist %s: out of memory",
                                   path);
                break;
            }
            lines = more;
        }
        lines[*count] = lineno;
        memcpy((*keys)[(*count)++], line, CTL_CURVE_KEY_BUF);
    }
    memset(text, 0, len);
    free(text);
    free(lines);
    if (rc != 0) {
        free(*keys);
        *keys = NULL;
        *count = 0;
    }
    return rc;
}

static int write_file(const char *path, const char *text, mode_t mode,
                      ctl_error *err)
{
    int fd = open(path, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, mode);
    if (fd < 0)
        return ctl_error_set(err, CTL_INVALID, "cannot create %s: %s", path,
                             strerror(errno));
    size_t len = strlen(text), off = 0;
    while (off < len) {
        ssize_t w = write(fd, text + off, len - off);
        if (w < 0 && errno == EINTR)
            continue;
        if (w <= 0)
            break;
        off += (size_t)w;
    }
    if (close(fd) != 0 || off < len) {
        unlink(path);
        return ctl_error_set(err, CTL_INVALID, "cannot write %s", path);
    }
    return 0;
}

int ctl_curve_write_keypair(const char *prefix, ctl_error *err)
{
    char pub[CTL_CURVE_KEY_BUF], sec[CTL_CURVE_KEY_BUF];
    char path[4096], text[128];
    size_t plen = prefix ? strlen(prefix) : 0;
    if (!plen || prefix[plen - 1] == '/')
        return ctl_error_set(err, CTL_INVALID,
                             "key file prefix '%s' names no file: give PREFIX (PREFIX.key "
                             "and PREFIX.pub are written), e.g. keys/unit",
                             prefix ? prefix : "(null)");
    int rc = ctl_curve_keypair(pub, sec, err);
    if (rc)
        return rc;
    if (snprintf(path, sizeof path, "%s.key", prefix) >= (int)sizeof path)
        return ctl_error_set(err, CTL_INVALID, "key file prefix is too long");
    snprintf(text, sizeof text, "# ctlrpc CURVE secret key: keep private\n%s\n", sec);
    rc = write_file(path, text, 0600, err);
    memset(sec, 0, sizeof sec);
    memset(text, 0, sizeof text);
    if (rc)
        return rc;
    snprintf(path, sizeof path, "%s.pub", prefix);
    snprintf(text, sizeof text, "# ctlrpc CURVE public key\n%s\n", pub);
    if ((rc = write_file(path, text, 0644, err)) != 0) {
        snprintf(path, sizeof path, "%s.key", prefix);
        unlink(path);
    }
    return rc;
}

/* ---- the allowlist's ZAP handler (RFC 27) ----------------------------- */

/*
 * One handler per ZeroMQ context: ZeroMQ asks the fixed endpoint
 * inproc://zeromq.zap.01 of a socket's context, which one socket can bind,
 * so every unit with an allowlist on one context shares it. Each unit
 * registers under a ZAP domain of its own (ZMQ_ZAP_DOMAIN on its ROUTER),
 * and the handler judges a request by the allowlist of the unit whose
 * domain it names.
 *
 * The registry (`handlers`, under `registry_lock`) holds the handlers by
 * context, each with a count of its users. The first user of a context
 * binds the endpoint and starts the handler's thread; the last one stops
 * the thread, unbinds the endpoint (zmq_unbind frees an inproc name at
 * once, where zmq_close leaves that to libzmq's reaper thread, too late
 * for the next unit binding it) and closes the socket, all under the
 * registry's lock, so the next unit on that context always finds the
 * endpoint free. The handler's thread takes only its handler's own lock
 * (`mu`, which guards the list of users), never the registry's.
 */

#define ZAP_ENDPOINT "inproc://zeromq.zap.01"

typedef struct zap_handler {
    struct zap_handler *next;
    void *ctx;
    void *sock;  /* REP bound to ZAP_ENDPOINT: the handler thread's */
    int wake[2]; /* a byte written to wake[1] stops the thread */
    pthread_t thread;
    size_t users;
    pthread_mutex_t mu; /* guards `list` and what its entries hold */
    pthread_cond_t idle; /* an entry's `busy` has dropped to zero */
    ctl_zap *list;
} zap_handler;

/* Open connections of one unit from one address (a chained hash). */
typedef struct addr_count {
    struct addr_count *next;
    unsigned count;
    char addr[INET6_ADDRSTRLEN];
} addr_count;

#define ADDR_BUCKETS 256

struct ctl_zap {
    ctl_zap *next;
    zap_handler *h;
    char domain[32];
    bool check_keys;     /* an allowlist: only these keys pass */
    uint8_t (*keys)[32]; /* allowed client keys, binary */
    size_t count;
    _Atomic uint64_t *denied;
    char endpoint[CTL_ENDPOINT_MAX]; /* for log lines */
    /* One limiter per kind of line (a client without CURVE, a key not on
     * the allowlist), so a count of lines left out is of its own kind. */
    ctl_log_limit limit[2];
    /* Connection caps (0: none) and what they count: the unit's open
     * connections, in total and by peer address, kept from its socket
     * monitor's events (ctl_zap_conn_opened/closed) and read when a
     * handshake is judged. All under h->mu. */
    ctl_zap_caps caps;
    unsigned open;
    addr_count *by_addr[ADDR_BUCKETS];
    char (*fd_addr)[INET6_ADDRSTRLEN]; /* the address of each open fd */
    size_t fd_cap;
    ctl_log_limit cap_limit;
    /* The unit's catch-up (ctl_zap_set_catch_up): reads the monitor
     * events waiting, so that the caps judge a connection with every
     * earlier accept counted. Called by the handler's thread without `mu`
     * held, while `busy` keeps the entry (and so its unit) alive:
     * ctl_zap_destroy waits for it. */
    void (*catch_up)(void *arg);
    void *catch_up_arg;
    unsigned busy;
};

static pthread_mutex_t registry_lock = PTHREAD_MUTEX_INITIALIZER;
static zap_handler *handlers;

void ctl_zap_set_endpoint(ctl_zap *zap, const char *endpoint)
{
    pthread_mutex_lock(&zap->h->mu);
    snprintf(zap->endpoint, sizeof zap->endpoint, "%s", endpoint);
    pthread_mutex_unlock(&zap->h->mu);
}

const char *ctl_zap_domain(const ctl_zap *zap)
{
    return zap->domain;
}

/* What a refused request's log line says, copied under the handler's lock
 * and written after it is let go (a log sink may do anything). */
typedef struct zap_refusal {
    bool log;
    bool cap; /* refused by a connection cap: `why` says which */
    char why[128];
    bool curve;
    uint64_t skipped;
    char endpoint[CTL_ENDPOINT_MAX];
    char addr[CTL_SHOW_BUF];
    char key[CTL_CURVE_KEY_BUF];
} zap_refusal;

static void log_denied(const zap_refusal *r)
{
    char more[80] = "";
    if (r->skipped)
        snprintf(more, sizeof more, CTL_LOG_LEFT_OUT_FMT, (unsigned long long)r->skipped);
    if (r->cap) {
        ctl_log(CTL_LOG_WARN, "server", "%s: refused a connection from %s: %s%s",
                r->endpoint[0] ? r->endpoint : "unit", r->addr, r->why, more);
        return;
    }
    ctl_log(CTL_LOG_WARN, "server", "%s: refused a CURVE handshake from %s: %s%s%s%s",
            r->endpoint[0] ? r->endpoint : "unit", r->addr,
            r->curve ? "client key " : "not a CURVE client", r->key,
            r->curve ? " is not on the allowlist" : "", more);
}

static unsigned addr_hash(const char *a)
{
    unsigned h = 5381;
    while (*a)
        h = h * 33 + (unsigned char)*a++;
    return h % ADDR_BUCKETS;
}

static addr_count *addr_find(ctl_zap *z, const char *a)
{
    addr_count *e = z->by_addr[addr_hash(a)];
    while (e && strcmp(e->addr, a) != 0)
        e = e->next;
    return e;
}

/* Whether the caps let one more connection from the address in `af` (may
 * be NULL) through; fills in the refusal's log line when not. The
 * connection being judged is normally counted already (its accept
 * reached the monitor first), hence "more than the cap". */
static bool judge_caps(ctl_zap *z, zmq_msg_t *af, zap_refusal *r)
{
    char addr[INET6_ADDRSTRLEN] = "";
    if (af && zmq_msg_size(af) < sizeof addr) {
        memcpy(addr, zmq_msg_data(af), zmq_msg_size(af));
        addr[zmq_msg_size(af)] = '\0';
    }
    const addr_count *e = addr_find(z, addr);
    unsigned from = e ? e->count : 0;
    bool total = z->caps.max_connections && z->open > z->caps.max_connections;
    bool per = z->caps.max_per_address && from > z->caps.max_per_address;
    if (!total && !per)
        return true;
    atomic_fetch_add_explicit(z->caps.refused, 1, memory_order_relaxed);
    r->cap = true;
    r->log = ctl_log_enabled(CTL_LOG_WARN) &&
             ctl_log_limit_pass(&z->cap_limit, ctl_now_ms(), &r->skipped);
    if (r->log) {
        snprintf(r->endpoint, sizeof r->endpoint, "%s", z->endpoint);
        snprintf(r->addr, sizeof r->addr, "%s", addr[0] ? addr : "an unknown address");
        if (per)
            snprintf(r->why, sizeof r->why, "%u connections from that address are open "
                     "(max_connections_per_address %u)", from, z->caps.max_per_address);
        else
            snprintf(r->why, sizeof r->why, "%u connections are open (max_connections %u)",
                     z->open, z->caps.max_connections);
    }
    return false;
}

/* Judge one request [version, request id, domain, address, identity,
 * mechanism, credentials...] (`kept` frames of it): true to allow. A
 * domain no unit registered belongs to a socket that is not a unit with an
 * allowlist (a CURVE unit without one, a socket of the program's own); it
 * is allowed, as ZeroMQ does when a context has no ZAP handler. */
static bool zap_judge(zap_handler *h, zmq_msg_t *f, int kept, zap_refusal *r)
{
    bool allowed = false;
    bool curve = kept >= 7 && zmq_msg_size(&f[5]) == 5 &&
                 memcmp(zmq_msg_data(&f[5]), "CURVE", 5) == 0 && zmq_msg_size(&f[6]) == 32;
    pthread_mutex_lock(&h->mu);
    ctl_zap *z = h->list;
    for (; z && kept >= 3; z = z->next)
        if (zmq_msg_size(&f[2]) == strlen(z->domain) &&
            memcmp(zmq_msg_data(&f[2]), z->domain, zmq_msg_size(&f[2])) == 0)
            break;
    if (!z) {
        pthread_mutex_unlock(&h->mu);
        return true;
    }
    allowed = !z->check_keys;
    for (size_t i = 0; curve && i < z->count && !allowed; i++)
        allowed = memcmp(z->keys[i], zmq_msg_data(&f[6]), 32) == 0;
    if (allowed && (z->caps.max_connections || z->caps.max_per_address)) {
        if (z->catch_up) {
            /* Its monitor's thread may not have read this connection's
             * accept yet (nor the ones before): read what is waiting. The
             * catch-up counts through ctl_zap_conn_opened, which takes
             * `mu`: let it go meanwhile, keeping the entry with `busy`. */
            void (*fn)(void *) = z->catch_up;
            void *arg = z->catch_up_arg;
            z->busy++;
            pthread_mutex_unlock(&h->mu);
            fn(arg);
            pthread_mutex_lock(&h->mu);
            if (--z->busy == 0)
                pthread_cond_broadcast(&h->idle);
        }
        allowed = judge_caps(z, kept >= 4 ? &f[3] : NULL, r);
        pthread_mutex_unlock(&h->mu);
        return allowed;
    }
    if (!allowed) {
        atomic_fetch_add_explicit(z->denied, 1, memory_order_relaxed);
        r->log = ctl_log_enabled(CTL_LOG_WARN) &&
                 ctl_log_limit_pass(&z->limit[curve], ctl_now_ms(), &r->skipped);
        if (r->log) {
            r->curve = curve;
            snprintf(r->endpoint, sizeof r->endpoint, "%s", z->endpoint);
            snprintf(r->addr, sizeof r->addr, "an unknown address");
            if (kept >= 4)
                ctl_show(r->addr, sizeof r->addr,
                         (ctl_str){zmq_msg_data(&f[3]), zmq_msg_size(&f[3])});
            if (curve)
                zmq_z85_encode(r->key, zmq_msg_data(&f[6]), 32);
        }
    }
    pthread_mutex_unlock(&h->mu);
    return allowed;
}

/* Answer one request: 200 or 400. Returns -1 when none was waiting. */
static int serve_zap_one(zap_handler *h)
{
    enum { MAX_FRAMES = 8 };
    zmq_msg_t f[MAX_FRAMES];
    int n = ctl_recv_message(h->sock, f, MAX_FRAMES, ZMQ_DONTWAIT, NULL);
    if (n < 0)
        return -1;
    int kept = n < MAX_FRAMES ? n : MAX_FRAMES;
    zap_refusal r = {0};
    bool allowed = zap_judge(h, f, kept, &r);
    /* A REP socket must answer what it read; a request too short to carry
     * an id gets an answer with an empty one. */
    /* RFC 27: 400 for a refused client. A connection over a cap gets 500
     * ("the server cannot serve it"), so that clients can tell the two
     * apart: libzmq sends the code in its ERROR command (300, "try later",
     * would suit, but libzmq sends nothing for it and leaves the client
     * waiting out its handshake). */
    const char *code = allowed ? "200" : r.cap ? "500" : "400";
    const char *text = allowed ? "OK" : r.cap ? "too many connections" : "client key not allowed";
    zmq_send(h->sock, "1.0", 3, ZMQ_SNDMORE);
    if (kept >= 2)
        zmq_send(h->sock, zmq_msg_data(&f[1]), zmq_msg_size(&f[1]), ZMQ_SNDMORE);
    else
        zmq_send(h->sock, "", 0, ZMQ_SNDMORE);
    zmq_send(h->sock, code, 3, ZMQ_SNDMORE);
    zmq_send(h->sock, text, strlen(text), ZMQ_SNDMORE);
    zmq_send(h->sock, "", 0, ZMQ_SNDMORE);
    zmq_send(h->sock, "", 0, 0);
    ctl_frames_close(f, kept);
    if (r.log)
        log_denied(&r);
    return 0;
}

/* The handler's thread: answers until woken through the pipe (the last
 * user is leaving) or the context is shut down. It waits without a
 * timeout on purpose: the pipe wakes it. */
static void *zap_main(void *arg)
{
    zap_handler *h = arg;
    zmq_pollitem_t items[2] = {{h->sock, 0, ZMQ_POLLIN, 0},
                               {NULL, h->wake[0], ZMQ_POLLIN, 0}};
    for (;;) {
        int rc = zmq_poll(items, 2, -1);
        if (rc < 0) {
            if (zmq_errno() == EINTR)
                continue;
            break; /* ETERM: the context is being shut down */
        }
        if (items[1].revents)
            break;
        while (serve_zap_one(h) == 0)
            ;
    }
    return NULL;
}

static void free_handler(zap_handler *h)
{
    if (h->sock) {
        zmq_unbind(h->sock, ZAP_ENDPOINT);
        zmq_close(h->sock);
    }
    if (h->wake[0] >= 0)
        close(h->wake[0]);
    if (h->wake[1] >= 0)
        close(h->wake[1]);
    pthread_mutex_destroy(&h->mu);
    pthread_cond_destroy(&h->idle);
    free(h);
}

/* A new handler bound in `ctx` with its thread running, in *out; returns
 * 0 or the error's kind. Called under registry_lock. */
static int start_handler(void *ctx, const char *who, zap_handler **out, ctl_error *err)
{
    int rc;
    zap_handler *h = calloc(1, sizeof *h);
    *out = NULL;
    if (!h)
        return ctl_error_transfer(err, CTL_CAUSE_NOMEM, "server %s: out of memory", who);
    h->ctx = ctx;
    h->wake[0] = h->wake[1] = -1;
    pthread_mutex_init(&h->mu, NULL);
    pthread_cond_init(&h->idle, NULL);
    if (pipe2(h->wake, O_CLOEXEC | O_NONBLOCK) != 0) {
        h->wake[0] = h->wake[1] = -1;
        rc = ctl_error_transfer(err, CTL_CAUSE_TRANSPORT,
                                "server %s: cannot create a pipe for the ZAP handler: %s",
                                who, strerror(errno));
        free_handler(h);
        return rc;
    }
    int zero = 0;
    h->sock = zmq_socket(ctx, ZMQ_REP);
    if (!h->sock) {
        rc = ctl_error_transfer(err, CTL_CAUSE_TRANSPORT,
                                "server %s: cannot create the ZAP handler's socket: %s",
                                who, zmq_strerror(zmq_errno()));
        free_handler(h);
        return rc;
    }
    zmq_setsockopt(h->sock, ZMQ_LINGER, &zero, sizeof zero);
    if (zmq_bind(h->sock, ZAP_ENDPOINT) != 0) {
        int e = zmq_errno();
        rc = ctl_error_set(err, CTL_INVALID,
                      "server %s: cannot bind the ZAP endpoint %s of its ZeroMQ "
                      "context for the allowlist: %s%s", who, ZAP_ENDPOINT,
                      zmq_strerror(e),
                      e == EADDRINUSE ? " (a ZAP handler that is not ctlrpc's, such "
                                        "as the program's own, holds it: give the "
                                        "unit a context of its own)" : "");
        zmq_close(h->sock);
        h->sock = NULL;
        free_handler(h);
        return rc;
    }
    int prc = ctl_thread_start(&h->thread, zap_main, h);
    if (prc != 0) {
        rc = ctl_error_transfer(err, CTL_CAUSE_TRANSPORT,
                                "server %s: cannot start the ZAP handler's thread: %s",
                                who, strerror(prc));
        free_handler(h);
        return rc;
    }
    *out = h;
    return 0;
}

void ctl_zap_destroy(ctl_zap **zap)
{
    if (!zap || !*zap)
        return;
    ctl_zap *z = *zap;
    zap_handler *h = z->h;
    pthread_mutex_lock(&registry_lock);
    pthread_mutex_lock(&h->mu);
    for (ctl_zap **pp = &h->list; *pp; pp = &(*pp)->next)
        if (*pp == z) {
            *pp = z->next;
            break;
        }
    while (z->busy) /* the handler's thread is in the unit's catch-up */
        pthread_cond_wait(&h->idle, &h->mu);
    pthread_mutex_unlock(&h->mu);
    if (--h->users == 0) {
        for (zap_handler **pp = &handlers; *pp; pp = &(*pp)->next)
            if (*pp == h) {
                *pp = h->next;
                break;
            }
        ssize_t w;
        do
            w = write(h->wake[1], "x", 1);
        while (w < 0 && errno == EINTR);
        pthread_join(h->thread, NULL);
        free_handler(h); /* unbinds: the next unit on ctx may bind at once */
    }
    pthread_mutex_unlock(&registry_lock);
    for (size_t b = 0; b < ADDR_BUCKETS; b++)
        for (addr_count *e = z->by_addr[b], *next; e; e = next) {
            next = e->next;
            free(e);
        }
    free(z->fd_addr);
    free(z->keys);
    free(z);
    *zap = NULL;
}

void ctl_zap_set_catch_up(ctl_zap *zap, void (*fn)(void *arg), void *arg)
{
    pthread_mutex_lock(&zap->h->mu);
    zap->catch_up = fn;
    zap->catch_up_arg = arg;
    pthread_mutex_unlock(&zap->h->mu);
}

void ctl_zap_conn_opened(ctl_zap *zap, int fd)
{
    char addr[INET6_ADDRSTRLEN] = "?";
    struct sockaddr_storage ss;
    socklen_t len = sizeof ss;
    if (fd < 0)
        return;
    /* libzmq's descriptor, read while the connection is open (the monitor
     * reads its accept event at once). */
    if (getpeername(fd, (struct sockaddr *)&ss, &len) == 0) {
        if (ss.ss_family == AF_INET)
            inet_ntop(AF_INET, &((struct sockaddr_in *)&ss)->sin_addr, addr, sizeof addr);
        else if (ss.ss_family == AF_INET6)
            inet_ntop(AF_INET6, &((struct sockaddr_in6 *)&ss)->sin6_addr, addr, sizeof addr);
    }
    pthread_mutex_lock(&zap->h->mu);
    if ((size_t)fd >= zap->fd_cap) {
        size_t cap = zap->fd_cap ? zap->fd_cap : 64;
        while (cap <= (size_t)fd)
            cap *= 2;
        char(*bigger)[INET6_ADDRSTRLEN] = realloc(zap->fd_addr, cap * sizeof *bigger);
        if (!bigger) {
            pthread_mutex_unlock(&zap->h->mu);
            return; /* not counted: the caps are looser, never stricter */
        }
        memset(bigger + zap->fd_cap, 0, (cap - zap->fd_cap) * sizeof *bigger);
        zap->fd_addr = bigger;
        zap->fd_cap = cap;
    }
    addr_count *e = addr_find(zap, addr);
    if (!e && (e = calloc(1, sizeof *e)) != NULL) {
        snprintf(e->addr, sizeof e->addr, "%s", addr);
        unsigned b = addr_hash(addr);
        e->next = zap->by_addr[b];
        zap->by_addr[b] = e;
    }
    if (e) {
        e->count++;
        zap->open++;
        snprintf(zap->fd_addr[fd], sizeof zap->fd_addr[fd], "%s", addr);
    }
    pthread_mutex_unlock(&zap->h->mu);
}

void ctl_zap_conn_closed(ctl_zap *zap, int fd)
{
    pthread_mutex_lock(&zap->h->mu);
    if (fd >= 0 && (size_t)fd < zap->fd_cap && zap->fd_addr[fd][0]) {
        char *addr = zap->fd_addr[fd];
        unsigned b = addr_hash(addr);
        for (addr_count **pp = &zap->by_addr[b]; *pp; pp = &(*pp)->next) {
            addr_count *e = *pp;
            if (strcmp(e->addr, addr) != 0)
                continue;
            if (--e->count == 0) {
                *pp = e->next;
                free(e);
            }
            break;
        }
        zap->open--;
        addr[0] = '\0';
    }
    pthread_mutex_unlock(&zap->h->mu);
}

int ctl_zap_set_keys(ctl_zap *zap, const char *const *keys, size_t count, const char *who,
                     ctl_error *err)
{
    if (!zap || !zap->check_keys)
        return ctl_error_set(err, CTL_INVALID,
                             "server %s: started without an allowlist: there is none "
                             "to replace", who);
    if (count == 0 || !keys)
        return ctl_error_set(err, CTL_INVALID,
                             "server %s: the new allowlist lists no keys", who);
    uint8_t(*fresh)[32] = calloc(count, sizeof *fresh);
    if (!fresh)
        return ctl_error_transfer(err, CTL_CAUSE_NOMEM, "server %s: out of memory", who);
    for (size_t i = 0; i < count; i++) {
        if (!keys[i] || !ctl_curve_key_valid(keys[i])) {
            free(fresh);
            return ctl_error_set(err, CTL_INVALID,
                                 "server %s: allowed client key #%zu is not a "
                                 "40-character Z85 key", who, i);
        }
        zmq_z85_decode(fresh[i], keys[i]);
    }
    pthread_mutex_lock(&zap->h->mu);
    uint8_t(*old)[32] = zap->keys;
    zap->keys = fresh;
    zap->count = count;
    pthread_mutex_unlock(&zap->h->mu);
    free(old);
    return 0;
}

bool ctl_zap_counts(const ctl_zap *zap)
{
    return zap && (zap->caps.max_connections || zap->caps.max_per_address);
}

int ctl_zap_new(void *ctx, const char *const *keys, size_t count,
                _Atomic uint64_t *denied, const ctl_zap_caps *caps, const char *who,
                ctl_zap **out, ctl_error *err)
{
    *out = NULL;
    ctl_zap *z = calloc(1, sizeof *z);
    if (z) {
        z->check_keys = keys != NULL && count > 0;
        if (caps)
            z->caps = *caps;
    }
    if (z)
        z->keys = calloc(count ? count : 1, sizeof *z->keys);
    if (!z || !z->keys) {
        free(z);
        return ctl_error_transfer(err, CTL_CAUSE_NOMEM, "server %s: out of memory",
                                  who);
    }
    for (size_t i = 0; i < count; i++) {
        if (!ctl_curve_key_valid(keys[i])) {
            free(z->keys);
            free(z);
            return ctl_error_set(err, CTL_INVALID,
                                 "server %s: allowed client key #%zu is not a "
                                 "40-character Z85 key", who, i);
        }
        zmq_z85_decode(z->keys[i], keys[i]);
    }
    z->count = count;
    z->denied = denied;
    snprintf(z->domain, sizeof z->domain, "ctlrpc-%llu",
             (unsigned long long)ctl_unique_u64());
    pthread_mutex_lock(&registry_lock);
    zap_handler *h = handlers;
    while (h && h->ctx != ctx)
        h = h->next;
    if (!h) {
        int rc = start_handler(ctx, who, &h, err);
        if (rc) {
            pthread_mutex_unlock(&registry_lock);
            free(z->keys);
            free(z);
            return rc;
        }
        h->next = handlers;
        handlers = h;
    }
    h->users++;
    z->h = h;
    pthread_mutex_lock(&h->mu);
    z->next = h->list;
    h->list = z;
    pthread_mutex_unlock(&h->mu);
    pthread_mutex_unlock(&registry_lock);
    *out = z;
    return 0;
}
