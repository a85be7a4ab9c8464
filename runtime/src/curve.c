/*
 * curve.c - CURVE keys and key files (ctlrpc/curve.h), and the ZAP handler
 * that enforces a unit's client allowlist (curve_int.h).
 */
#include "ctlrpc/curve.h"

#include <ctype.h>
#include <stdatomic.h>
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include <zmq.h>

#include "curve_int.h"
#include "transport_int.h"

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

/* Read a small text file whole (keys and allowlists are small). */
static char *slurp(const char *path, bool secret, ctl_error *err)
{
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    struct stat st;
    if (fd < 0) {
        ctl_error_set(err, CTL_INVALID, "key file %s: %s", path, strerror(errno));
        return NULL;
    }
    if (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
        ctl_error_set(err, CTL_INVALID, "key file %s: not a regular file", path);
        close(fd);
        return NULL;
    }
    if (secret && (st.st_mode & 077)) {
        ctl_error_set(err, CTL_INVALID,
                      "key file %s is readable by others (mode %04o): a secret "
                      "key must be private (chmod 600 %s)",
                      path, (unsigned)(st.st_mode & 07777), path);
        close(fd);
        return NULL;
    }
    if (st.st_size > (1 << 20)) {
        ctl_error_set(err, CTL_INVALID, "key file %s: too large for a key file",
                      path);
        close(fd);
        return NULL;
    }
    char *text = malloc((size_t)st.st_size + 1);
    size_t n = 0;
    while (text && n < (size_t)st.st_size) {
        ssize_t r = read(fd, text + n, (size_t)st.st_size - n);
        if (r < 0 && errno == EINTR)
            continue;
        if (r <= 0)
            break;
        n += (size_t)r;
    }
    close(fd);
    if (!text) {
        ctl_error_set(err, CTL_INVALID, "key file %s: out of memory", path);
        return NULL;
    }
    text[n] = '\0';
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

int ctl_curve_read_key(const char *path, bool secret,
                       char key[CTL_CURVE_KEY_BUF], ctl_error *err)
{
    char *text = slurp(path, secret, err);
    if (!text)
        return CTL_INVALID;
    char *cursor = text, *line;
    int rc = ctl_error_set(err, CTL_INVALID, "key file %s holds no key", path);
    while ((line = next_line(&cursor)) != NULL) {
        if (!*line || *line == '#')
            continue;
        if (!ctl_curve_key_valid(line)) {
            rc = ctl_error_set(err, CTL_INVALID,
                               "key file %s: not a 40-character Z85 CURVE key",
                               path);
        } else {
            memcpy(key, line, CTL_CURVE_KEY_BUF);
            ctl_error_clear(err);
            rc = 0;
        }
        break;
    }
    memset(text, 0, strlen(text));
    free(text);
    return rc;
}

int ctl_curve_read_allowlist(const char *path, char (**keys)[CTL_CURVE_KEY_BUF],
                             size_t *count, ctl_error *err)
{
    char *text = slurp(path, false, err);
    *keys = NULL;
    *count = 0;
    if (!text)
        return CTL_INVALID;
    char *cursor = text, *line;
    size_t lineno = 0, cap = 0;
    int rc = 0;
    while (rc == 0 && (line = next_line(&cursor)) != NULL) {
        lineno++;
        if (!*line || *line == '#')
            continue;
        if (!ctl_curve_key_valid(line)) {
            rc = ctl_error_set(err, CTL_INVALID,
                               "allowlist %s:%zu: not a 40-character Z85 CURVE "
                               "public key", path, lineno);
            break;
        }
        if (*count == cap) {
            cap = cap ? cap * 2 : 8;
            char(*bigger)[CTL_CURVE_KEY_BUF] = realloc(*keys, cap * sizeof **keys);
            if (!bigger) {
                rc = ctl_error_set(err, CTL_INVALID, "allowlist %s: out of memory",
                                   path);
                break;
            }
            *keys = bigger;
        }
        memcpy((*keys)[(*count)++], line, CTL_CURVE_KEY_BUF);
    }
    free(text);
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

struct ctl_zap {
    void *sock;         /* REP, bound to inproc://zeromq.zap.01 */
    uint8_t (*keys)[32]; /* allowed client keys, binary */
    size_t count;
    _Atomic uint64_t *denied;
    char who[128]; /* the unit, for the log line of a refusal */
};

void ctl_zap_destroy(ctl_zap **zap)
{
    if (!zap || !*zap)
        return;
    if ((*zap)->sock)
        zmq_close((*zap)->sock);
    free((*zap)->keys);
    free(*zap);
    *zap = NULL;
}

int ctl_zap_new(void *ctx, const char *const *keys, size_t count,
                _Atomic uint64_t *denied, const char *who, ctl_zap **out,
                ctl_error *err)
{
    *out = NULL;
    ctl_zap *z = calloc(1, sizeof *z);
    if (z)
        z->keys = calloc(count ? count : 1, sizeof *z->keys);
    if (!z || !z->keys) {
        free(z);
        return ctl_error_transfer(err, CTL_CAUSE_NOMEM, "server %s: out of memory",
                                  who);
    }
    for (size_t i = 0; i < count; i++) {
        if (!ctl_curve_key_valid(keys[i])) {
            ctl_zap_destroy(&z);
            return ctl_error_set(err, CTL_INVALID,
                                 "server %s: allowed client key #%zu is not a "
                                 "40-character Z85 key", who, i);
        }
        zmq_z85_decode(z->keys[i], keys[i]);
    }
    z->count = count;
    z->denied = denied;
    snprintf(z->who, sizeof z->who, "%s", who ? who : "");
    z->sock = zmq_socket(ctx, ZMQ_REP);
    if (!z->sock || zmq_bind(z->sock, "inproc://zeromq.zap.01") != 0) {
        int rc = ctl_error_set(err, CTL_INVALID,
                               "server %s: cannot start the ZAP handler for the "
                               "allowlist (%s): is another unit with an "
                               "allowlist using this ZeroMQ context?", who,
                               zmq_strerror(zmq_errno()));
        ctl_zap_destroy(&z);
        return rc;
    }
    int zero = 0;
    zmq_setsockopt(z->sock, ZMQ_LINGER, &zero, sizeof zero);
    *out = z;
    return 0;
}

void *ctl_zap_socket(ctl_zap *zap)
{
    return zap->sock;
}

/* The one log line of a refused handshake (to standard error): the unit,
 * the peer's address, and the key it offered (or its mechanism). */
static void log_refusal(const ctl_zap *z, zmq_msg_t *f, int kept, uint64_t n)
{
    char peer[64] = "?", key[CTL_CURVE_KEY_BUF] = "";
    if (kept >= 4) {
        size_t len = zmq_msg_size(&f[3]) < sizeof peer - 1 ? zmq_msg_size(&f[3])
                                                           : sizeof peer - 1;
        memcpy(peer, zmq_msg_data(&f[3]), len);
        peer[len] = '\0';
    }
    if (kept >= 7 && zmq_msg_size(&f[6]) == 32)
        zmq_z85_encode(key, zmq_msg_data(&f[6]), 32);
    if (key[0])
        fprintf(stderr,
                "ctlrpc unit %s: refused a CURVE handshake from %s: client key "
                "%s is not on the allowlist (%llu refused so far)\n",
                z->who, peer, key, (unsigned long long)n);
    else
        fprintf(stderr,
                "ctlrpc unit %s: refused a handshake from %s: not a CURVE "
                "client with a key (%llu refused so far)\n",
                z->who, peer, (unsigned long long)n);
}

/* Answer one request: 200 for a CURVE client whose key is on the list,
 * 400 for anything else. Returns -1 when none was waiting. */
static int serve_zap_one(ctl_zap *z)
{
    enum { MAX_FRAMES = 8 };
    zmq_msg_t f[MAX_FRAMES];
    int n = ctl_recv_message(z->sock, f, MAX_FRAMES, ZMQ_DONTWAIT);
    if (n < 0)
        return -1;
    int kept = n < MAX_FRAMES ? n : MAX_FRAMES;
    /* [version, request id, domain, address, identity, mechanism, key] */
    int allowed = 0;
    if (kept >= 7 && zmq_msg_size(&f[5]) == 5 &&
        memcmp(zmq_msg_data(&f[5]), "CURVE", 5) == 0 && zmq_msg_size(&f[6]) == 32) {
        for (size_t i = 0; i < z->count && !allowed; i++)
            allowed = memcmp(z->keys[i], zmq_msg_data(&f[6]), 32) == 0;
    }
    if (!allowed) {
        uint64_t so_far = atomic_fetch_add_explicit(z->denied, 1,
                                               memory_order_relaxed) + 1;
        log_refusal(z, f, kept, so_far);
    }
    /* A REP socket must answer what it read; a request too short to carry
     * an id gets an answer with an empty one. */
    const char *code = allowed ? "200" : "400";
    const char *text = allowed ? "OK" : "client key not allowed";
    zmq_send(z->sock, "1.0", 3, ZMQ_SNDMORE);
    if (kept >= 2)
        zmq_send(z->sock, zmq_msg_data(&f[1]), zmq_msg_size(&f[1]), ZMQ_SNDMORE);
    else
        zmq_send(z->sock, "", 0, ZMQ_SNDMORE);
    zmq_send(z->sock, code, 3, ZMQ_SNDMORE);
    zmq_send(z->sock, text, strlen(text), ZMQ_SNDMORE);
    zmq_send(z->sock, "", 0, ZMQ_SNDMORE);
    zmq_send(z->sock, "", 0, 0);
    ctl_frames_close(f, kept);
    return 0;
}

void ctl_zap_serve(ctl_zap *zap)
{
    while (serve_zap_one(zap) == 0)
        ;
}
