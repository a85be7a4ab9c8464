/*
 * testutil.c - the test unit, raw ZeroMQ peers and the fake unit.
 *
 * The raw peers and the fake unit deliberately use libzmq and msgpack-c
 * directly, never the runtime's envelope code, so a bug in the runtime's
 * packing cannot hide itself by agreeing with its own decoder.
 */
#include "testutil.h"

#include "envelope_int.h"

#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include <zmq.h>

/* ---- clock and process ------------------------------------------------ */

int64_t tu_now_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

void tu_sleep_ms(int ms)
{
    struct timespec ts = {ms / 1000, (long)(ms % 1000) * 1000000L};
    while (nanosleep(&ts, &ts) != 0 && errno == EINTR) {
    }
}

size_t tu_rss_bytes(void)
{
    FILE *f = fopen("/proc/self/statm", "r");
    unsigned long size = 0, resident = 0;
    if (f == NULL)
        return 0;
    if (fscanf(f, "%lu %lu", &size, &resident) != 2)
        resident = 0;
    fclose(f);
    return (size_t)resident * (size_t)sysconf(_SC_PAGESIZE);
}

int tu_wait_atleast(atomic_int *v, int want, int timeout_ms)
{
    int64_t end = tu_now_ms() + timeout_ms;
    int got = atomic_load(v);
    while (got < want && tu_now_ms() < end) {
        tu_sleep_ms(2);
        got = atomic_load(v);
    }
    return got;
}

/* The ports tu_dead_address holds: bound, never listening. A port bound
 * and closed again would be free for the next bind on the machine, and a
 * request a test sends there could reach another test's unit (the kernel
 * picks ports at random, and from fewer when many wait in TIME_WAIT). */
#define TU_DEAD_MAX 64
static struct {
    pthread_mutex_t mu;
    int fd[TU_DEAD_MAX];
    unsigned port[TU_DEAD_MAX];
    size_t next; /* the slot taken next (the oldest once all are) */
} tu_dead = {.mu = PTHREAD_MUTEX_INITIALIZER};

void tu_dead_address(char *buf, size_t buflen)
{
    struct sockaddr_in sa;
    socklen_t sl = sizeof sa;
    int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    memset(&sa, 0, sizeof sa);
    sa.sin_family = AF_INET;
    sa.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    sa.sin_port = 0;
    if (fd < 0 || bind(fd, (struct sockaddr *)&sa, sizeof sa) != 0 ||
        getsockname(fd, (struct sockaddr *)&sa, &sl) != 0) {
        /* Port 9 (discard) is practically never served on a test host. */
        snprintf(buf, buflen, "tcp://127.0.0.1:9");
        if (fd >= 0)
            close(fd);
        return;
    }
    unsigned port = ntohs(sa.sin_port);
    snprintf(buf, buflen, "tcp://127.0.0.1:%u", port);
    pthread_mutex_lock(&tu_dead.mu);
    size_t i = tu_dead.next++ % TU_DEAD_MAX;
    if (tu_dead.port[i])
        close(tu_dead.fd[i]); /* the oldest of TU_DEAD_MAX goes */
    tu_dead.fd[i] = fd;
    tu_dead.port[i] = port;
    pthread_mutex_unlock(&tu_dead.mu);
}

void tu_dead_release(const char *address)
{
    const char *colon = strrchr(address, ':');
    unsigned port = colon ? (unsigned)strtoul(colon + 1, NULL, 10) : 0;
    pthread_mutex_lock(&tu_dead.mu);
    for (size_t i = 0; port && i < TU_DEAD_MAX; i++) {
        if (tu_dead.port[i] == port) {
            close(tu_dead.fd[i]);
            tu_dead.port[i] = 0;
        }
    }
    pthread_mutex_unlock(&tu_dead.mu);
}

/* ---- msgpack helpers -------------------------------------------------- */

void tu_buf_init(tu_buf *b)
{
    msgpack_sbuffer_init(&b->sb);
    msgpack_packer_init(&b->pk, &b->sb, msgpack_sbuffer_write);
}

void tu_buf_fini(tu_buf *b)
{
    msgpack_sbuffer_destroy(&b->sb);
}

void tu_buf_reset(tu_buf *b)
{
    msgpack_sbuffer_clear(&b->sb);
}

void tu_pk_str(msgpack_packer *pk, const char *s)
{
    tu_pk_strn(pk, s, strlen(s));
}

void tu_pk_strn(msgpack_packer *pk, const void *s, size_t len)
{
    msgpack_pack_str(pk, len);
    msgpack_pack_str_body(pk, s, len);
}

void tu_pack_request(tu_buf *b, const char *op, const void *id, size_t id_len,
                     const void *args, size_t args_len)
{
    msgpack_pack_array(&b->pk, 3);
    tu_pk_str(&b->pk, op);
    tu_pk_strn(&b->pk, id, id_len);
    if (args == NULL || args_len == 0)
        msgpack_pack_map(&b->pk, 0);
    else
        msgpack_sbuffer_write(&b->sb, args, args_len);
}

int tu_pack_error_map(msgpack_packer *pk, ctl_kind kind, const char *msg,
                      const char *reason, const ctl_str *blobs, size_t count)
{
    ctl_error e;
    ctl_error_init(&e);
    if (kind == CTL_BUSY)
        ctl_error_busy(&e, reason, "%s", msg);
    else if (kind == CTL_MISSING)
        ctl_error_missing(&e, blobs, count, "%s", msg);
    else
        ctl_error_set(&e, kind, "%s", msg);
    int rc = ctl_env_pack_error(pk, &e);
    ctl_error_fini(&e);
    return rc;
}

int tu_parse_reply(const void *data, size_t len, msgpack_zone *zone,
                   tu_reply *out)
{
    msgpack_object o;
    size_t off = 0;
    if (msgpack_unpack(data, len, &off, zone, &o) != MSGPACK_UNPACK_SUCCESS)
        return -1;
    if (o.type != MSGPACK_OBJECT_ARRAY || o.via.array.size != 3)
        return -1;
    if (o.via.array.ptr[0].type != MSGPACK_OBJECT_STR ||
        o.via.array.ptr[1].type != MSGPACK_OBJECT_BOOLEAN)
        return -1;
    out->id = o.via.array.ptr[0].via.str.ptr;
    out->id_len = o.via.array.ptr[0].via.str.size;
    out->ok = o.via.array.ptr[1].via.boolean;
    out->body = o.via.array.ptr[2];
    return 0;
}

bool tu_obj_is_str(const msgpack_object *o, const char *s)
{
    size_t n = strlen(s);
    return o != NULL && o->type == MSGPACK_OBJECT_STR &&
           o->via.str.size == n && memcmp(o->via.str.ptr, s, n) == 0;
}

const msgpack_object *tu_obj_get(const msgpack_object *o, const char *key)
{
    if (o == NULL || o->type != MSGPACK_OBJECT_MAP)
        return NULL;
    for (uint32_t i = 0; i < o->via.map.size; i++) {
        if (tu_obj_is_str(&o->via.map.ptr[i].key, key))
            return &o->via.map.ptr[i].val;
    }
    return NULL;
}

bool tu_obj_packs_to(const msgpack_object *o, const void *bytes, size_t len)
{
    tu_buf b;
    bool same;
    tu_buf_init(&b);
    msgpack_pack_object(&b.pk, *o);
    same = b.sb.size == len && memcmp(b.sb.data, bytes, len) == 0;
    tu_buf_fini(&b);
    return same;
}

/* ---- the test service --------------------------------------------------- */

static bool arg_i64(const msgpack_object *args, const char *key, int64_t *v)
{
    const msgpack_object *o = tu_obj_get(args, key);
    if (o == NULL)
        return false;
    if (o->type == MSGPACK_OBJECT_POSITIVE_INTEGER) {
        *v = (int64_t)o->via.u64;
        return true;
    }
    if (o->type == MSGPACK_OBJECT_NEGATIVE_INTEGER) {
        *v = o->via.i64;
        return true;
    }
    return false;
}

static int op_echo(void *user, const msgpack_object *args, ctl_req *req)
{
    tu_unit *u = user;
    const msgpack_object *field = tu_obj_get(args, "field");
    atomic_fetch_add(&u->calls, 1);
    if (field != NULL && field->type == MSGPACK_OBJECT_STR) {
        const msgpack_object *v = NULL;
        for (uint32_t i = 0; i < args->via.map.size; i++) {
            const msgpack_object *k = &args->via.map.ptr[i].key;
            if (k->type == MSGPACK_OBJECT_STR &&
                k->via.str.size == field->via.str.size &&
                memcmp(k->via.str.ptr, field->via.str.ptr, k->via.str.size) == 0)
                v = &args->via.map.ptr[i].val;
        }
        if (v == NULL)
            msgpack_pack_nil(ctl_req_packer(req));
        else
            msgpack_pack_object(ctl_req_packer(req), *v);
        return 0;
    }
    msgpack_pack_object(ctl_req_packer(req), *args);
    return 0;
}

static int op_sleep(void *user, const msgpack_object *args, ctl_req *req)
{
    tu_unit *u = user;
    int64_t ms = 0;
    atomic_fetch_add(&u->calls, 1);
    if (!arg_i64(args, "ms", &ms) || ms < 0 || ms > 60000)
        return ctl_req_fail(req, CTL_PROTOCOL, "sleep: bad 'ms'");
    atomic_fetch_add(&u->sleeps_started, 1);
    tu_sleep_ms((int)ms);
    atomic_fetch_add(&u->sleeps_done, 1);
    msgpack_pack_int64(ctl_req_packer(req), ms);
    return 0;
}

static int op_fail(void *user, const msgpack_object *args, ctl_req *req)
{
    tu_unit *u = user;
    const msgpack_object *kind = tu_obj_get(args, "kind");
    const msgpack_object *reason = tu_obj_get(args, "reason");
    const msgpack_object *blobs = tu_obj_get(args, "blobs");
    char rbuf[128] = "";
    atomic_fetch_add(&u->calls, 1);

    /* Something packed before failing must not leak into the reply. */
    tu_pk_str(ctl_req_packer(req), "partial result");

    if (reason != NULL && reason->type == MSGPACK_OBJECT_STR &&
        reason->via.str.size < sizeof rbuf) {
        memcpy(rbuf, reason->via.str.ptr, reason->via.str.size);
        rbuf[reason->via.str.size] = '\0';
    }
    if (tu_obj_is_str(kind, "UnitFull"))
        return ctl_req_fail(req, CTL_UNIT_FULL, "no room (%s)", TU_MSG_MARK);
    if (tu_obj_is_str(kind, "Busy"))
        return ctl_req_busy(req, rbuf, "busy (%s)", TU_MSG_MARK);
    if (tu_obj_is_str(kind, "Missing")) {
        ctl_str ids[16];
        size_t n = 0;
        if (blobs != NULL && blobs->type == MSGPACK_OBJECT_ARRAY) {
            for (uint32_t i = 0; i < blobs->via.array.size && n < 16; i++) {
                const msgpack_object *b = &blobs->via.array.ptr[i];
                if (b->type == MSGPACK_OBJECT_STR) {
                    ids[n].ptr = b->via.str.ptr;
                    ids[n].len = b->via.str.size;
                    n++;
                }
            }
        }
        return ctl_req_missing(req, ids, n, "lost %zu blobs (%s)", n,
                               TU_MSG_MARK);
    }
    if (tu_obj_is_str(kind, "Protocol"))
        return ctl_req_fail(req, CTL_PROTOCOL, "refused (%s)", TU_MSG_MARK);
    if (tu_obj_is_str(kind, "bare"))
        return -1;
    if (tu_obj_is_str(kind, "error-transfer") ||
        tu_obj_is_str(kind, "error-busy")) {
        ctl_error e;
        int rc;
        ctl_error_init(&e);
        if (tu_obj_is_str(kind, "error-busy"))
            ctl_error_busy(&e, "draining", "prebuilt busy (%s)", TU_MSG_MARK);
        else
            ctl_error_transfer(&e, CTL_CAUSE_TIMEOUT,
                               "prebuilt transfer (%s)", TU_MSG_MARK);
        rc = ctl_req_fail_error(req, &e);
        ctl_error_fini(&e);
        return rc;
    }
    return ctl_req_fail(req, CTL_PROTOCOL, "fail: unknown kind");
}

static int op_whoami(void *user, const msgpack_object *args, ctl_req *req)
{
    tu_unit *u = user;
    msgpack_packer *pk = ctl_req_packer(req);
    ctl_str op = ctl_req_op(req);
    ctl_str id = ctl_req_id(req);
    (void)args;
    atomic_fetch_add(&u->calls, 1);
    msgpack_pack_array(pk, 2);
    tu_pk_strn(pk, op.ptr, op.len);
    tu_pk_strn(pk, id.ptr, id.len);
    return 0;
}

static int op_locked(void *user, const msgpack_object *args, ctl_req *req)
{
    tu_unit *u = user;
    pthread_mutex_t *lock = ctl_server_lock(u->server);
    int rc = pthread_mutex_trylock(lock);
    (void)args;
    atomic_fetch_add(&u->calls, 1);
    if (rc == 0)
        pthread_mutex_unlock(lock);
    if (rc == 0)
        msgpack_pack_false(ctl_req_packer(req));
    else
        msgpack_pack_true(ctl_req_packer(req));
    return 0;
}

static int op_alloc(void *user, const msgpack_object *args, ctl_req *req)
{
    tu_unit *u = user;
    int64_t n = 0;
    unsigned char *p;
    atomic_fetch_add(&u->calls, 1);
    if (!arg_i64(args, "n", &n) || n < 0 || n > (64 << 20))
        return ctl_req_fail(req, CTL_PROTOCOL, "alloc: bad 'n'");
    p = ctl_req_alloc(req, (size_t)n);
    if (p == NULL && n > 0)
        return ctl_req_fail(req, CTL_PROTOCOL, "alloc: out of memory");
    for (int64_t i = 0; i < n; i++)
        p[i] = (unsigned char)(i & 0xff);
    msgpack_pack_bin(ctl_req_packer(req), (size_t)n);
    msgpack_pack_bin_body(ctl_req_packer(req), p, (size_t)n);
    return 0;
}

static int op_nothing(void *user, const msgpack_object *args, ctl_req *req)
{
    tu_unit *u = user;
    (void)args;
    (void)req;
    atomic_fetch_add(&u->calls, 1);
    return 0;
}

static int op_notes(void *user, const msgpack_object *args, ctl_req *req)
{
    tu_unit *u = user;
    (void)args;
    atomic_fetch_add(&u->calls, 1);
    msgpack_pack_int(ctl_req_packer(req), atomic_load(&u->notes));
    return 0;
}

static int op_note(void *user, const msgpack_object *args, ctl_req *req)
{
    tu_unit *u = user;
    int64_t v = -1;
    (void)req;
    atomic_fetch_add(&u->calls, 1);
    if (arg_i64(args, "v", &v))
        atomic_store(&u->last_note_v, v);
    atomic_fetch_add(&u->notes, 1);
    msgpack_pack_true(ctl_req_packer(req)); /* must never be sent */
    return 0;
}

static int op_note_fail(void *user, const msgpack_object *args, ctl_req *req)
{
    tu_unit *u = user;
    (void)args;
    atomic_fetch_add(&u->calls, 1);
    atomic_fetch_add(&u->note_fails, 1);
    return ctl_req_fail(req, CTL_PROTOCOL, "note_fail always fails");
}

static const ctl_op tu_ops[] = {
    {.name = "echo", .handler = op_echo},
    {.name = "sleep", .handler = op_sleep},
    {.name = "fail", .handler = op_fail},
    {.name = "whoami", .handler = op_whoami},
    {.name = "locked", .handler = op_locked},
    {.name = "alloc", .handler = op_alloc},
    {.name = "nothing", .handler = op_nothing},
    {.name = "notes", .handler = op_notes},
    {.name = "note", .handler = op_note, .flags = CTL_OP_NOREPLY},
    {.name = "note_fail", .handler = op_note_fail, .flags = CTL_OP_NOREPLY},
};

const ctl_service tu_service = {.name = "test", .ops = tu_ops,
    .op_count = sizeof tu_ops / sizeof tu_ops[0]};

int tu_unit_start(tu_unit *u, const ctl_server_options *opts, ctl_error *err)
{
    ctl_server_options o;
    int rc;
    memset(u, 0, sizeof *u);
    atomic_init(&u->sleeps_started, 0);
    atomic_init(&u->sleeps_done, 0);
    atomic_init(&u->notes, 0);
    atomic_init(&u->note_fails, 0);
    atomic_init(&u->last_note_v, -1);
    atomic_init(&u->calls, 0);
    if (opts != NULL)
        o = *opts;
    else
        ctl_server_options_init(&o);
    if (o.endpoint == NULL)
        o.endpoint = "tcp://127.0.0.1:*";
    rc = ctl_server_new(&tu_service, u, &o, &u->server, err);
    if (rc == 0)
        snprintf(u->endpoint, sizeof u->endpoint, "%s",
                 ctl_server_endpoint(u->server));
    return rc;
}

void tu_server_stats_wait(const ctl_server *s, ctl_server_stats *out,
                          uint64_t min_replies, int timeout_ms)
{
    int64_t end = tu_now_ms() + timeout_ms;
    ctl_server_stats_get(s, out);
    while (out->replies < min_replies && tu_now_ms() < end) {
        tu_sleep_ms(2);
        ctl_server_stats_get(s, out);
    }
}

void tu_unit_stop(tu_unit *u)
{
    if (u != NULL)
        ctl_server_destroy(&u->server);
}

/* ---- raw ZeroMQ peers ------------------------------------------------- */

void *tu_raw_connect(void *ctx, int type, const char *endpoint)
{
    void *s = zmq_socket(ctx, type);
    int zero = 0, sndtimeo = 2000;
    if (s == NULL)
        return NULL;
    zmq_setsockopt(s, ZMQ_LINGER, &zero, sizeof zero);
    /* A send to a peer that went away fails instead of blocking forever. */
    zmq_setsockopt(s, ZMQ_SNDTIMEO, &sndtimeo, sizeof sndtimeo);
    if (zmq_connect(s, endpoint) != 0) {
        zmq_close(s);
        return NULL;
    }
    return s;
}

int tu_raw_send_frames(void *sock, const void *const *data, const size_t *len,
                       size_t n)
{
    for (size_t i = 0; i < n; i++) {
        int flags = i + 1 < n ? ZMQ_SNDMORE : 0;
        if (zmq_send(sock, len[i] ? data[i] : "", len[i], flags) < 0)
            return -1;
    }
    return 0;
}

int tu_raw_send(void *sock, const void *data, size_t len)
{
    return tu_raw_send_frames(sock, &data, &len, 1);
}

int tu_raw_recv(void *sock, int timeout_ms, tu_rx *rx)
{
    zmq_pollitem_t it = {sock, 0, ZMQ_POLLIN, 0};
    int more = 0;
    size_t msz = sizeof more;
    memset(rx, 0, sizeof *rx);
    if (zmq_poll(&it, 1, timeout_ms) <= 0 || !(it.revents & ZMQ_POLLIN))
        return -1;
    do {
        zmq_msg_t m;
        zmq_msg_init(&m);
        if (zmq_msg_recv(&m, sock, 0) < 0) {
            zmq_msg_close(&m);
            return rx->nframes ? 0 : -1;
        }
        if (rx->nframes < TU_MAX_FRAMES) {
            size_t n = zmq_msg_size(&m);
            rx->frame[rx->nframes] = malloc(n ? n : 1);
            memcpy(rx->frame[rx->nframes], zmq_msg_data(&m), n);
            rx->len[rx->nframes] = n;
        }
        rx->nframes++;
        zmq_getsockopt(sock, ZMQ_RCVMORE, &more, &msz);
        zmq_msg_close(&m);
    } while (more);
    return 0;
}

void tu_rx_free(tu_rx *rx)
{
    for (size_t i = 0; i < TU_MAX_FRAMES; i++) {
        free(rx->frame[i]);
        rx->frame[i] = NULL;
    }
    rx->nframes = 0;
}

/* ---- the fake unit ---------------------------------------------------- */

struct tu_fake {
    void *ctx;
    void *router;
    char endpoint[CTL_ENDPOINT_MAX];
    tu_fake_fn fn;
    void *user;
    pthread_t thread;
    atomic_int stop;
    atomic_int seen;
};

static void fake_handle(tu_fake *f, tu_rx *rx)
{
    tu_fake_req req;
    msgpack_zone zone;
    msgpack_object o;
    size_t off = 0;
    size_t nf = rx->nframes > TU_MAX_FRAMES ? TU_MAX_FRAMES : rx->nframes;
    memset(&req, 0, sizeof req);
    if (nf < 2)
        return;
    req.identity = rx->frame[0];
    req.identity_len = rx->len[0];
    req.seq = atomic_fetch_add(&f->seen, 1);
    msgpack_zone_init(&zone, 2048);
    if (msgpack_unpack((const char *)rx->frame[nf - 1], rx->len[nf - 1], &off,
                       &zone, &o) == MSGPACK_UNPACK_SUCCESS &&
        o.type == MSGPACK_OBJECT_ARRAY && o.via.array.size == 3 &&
        o.via.array.ptr[0].type == MSGPACK_OBJECT_STR &&
        o.via.array.ptr[1].type == MSGPACK_OBJECT_STR) {
        req.op = o.via.array.ptr[0].via.str.ptr;
        req.op_len = o.via.array.ptr[0].via.str.size;
        req.id = o.via.array.ptr[1].via.str.ptr;
        req.id_len = o.via.array.ptr[1].via.str.size;
        req.args = &o.via.array.ptr[2];
    }
    f->fn(f, &req, f->user);
    msgpack_zone_destroy(&zone);
}

static void *fake_main(void *arg)
{
    tu_fake *f = arg;
    while (!atomic_load(&f->stop)) {
        tu_rx rx;
        if (tu_raw_recv(f->router, 20, &rx) != 0)
            continue;
        fake_handle(f, &rx);
        tu_rx_free(&rx);
    }
    return NULL;
}

int tu_fake_start(tu_fake **out, tu_fake_fn fn, void *user)
{
    tu_fake *f = calloc(1, sizeof *f);
    size_t sz;
    int zero = 0;
    *out = NULL;
    if (f == NULL)
        return -1;
    f->fn = fn;
    f->user = user;
    atomic_init(&f->stop, 0);
    atomic_init(&f->seen, 0);
    f->ctx = zmq_ctx_new();
    f->router = f->ctx ? zmq_socket(f->ctx, ZMQ_ROUTER) : NULL;
    if (f->router == NULL)
        goto fail;
    zmq_setsockopt(f->router, ZMQ_LINGER, &zero, sizeof zero);
    if (zmq_bind(f->router, "tcp://127.0.0.1:*") != 0)
        goto fail;
    sz = sizeof f->endpoint;
    zmq_getsockopt(f->router, ZMQ_LAST_ENDPOINT, f->endpoint, &sz);
    if (pthread_create(&f->thread, NULL, fake_main, f) != 0)
        goto fail;
    *out = f;
    return 0;
fail:
    if (f->router)
        zmq_close(f->router);
    if (f->ctx)
        zmq_ctx_term(f->ctx);
    free(f);
    return -1;
}

const char *tu_fake_endpoint(const tu_fake *fake)
{
    return fake->endpoint;
}

int tu_fake_send(tu_fake *fake, const tu_fake_req *req, const void *payload,
                 size_t len)
{
    const void *data[2] = {req->identity, payload};
    size_t lens[2] = {req->identity_len, len};
    return tu_raw_send_frames(fake->router, data, lens, 2);
}

int tu_fake_answer(tu_fake *fake, const tu_fake_req *req, const char *id,
                   size_t id_len, bool ok, const void *body, size_t body_len)
{
    tu_buf b;
    int rc;
    tu_buf_init(&b);
    msgpack_pack_array(&b.pk, 3);
    tu_pk_strn(&b.pk, id, id_len);
    if (ok)
        msgpack_pack_true(&b.pk);
    else
        msgpack_pack_false(&b.pk);
    if (body == NULL)
        msgpack_pack_nil(&b.pk);
    else
        msgpack_sbuffer_write(&b.sb, body, body_len);
    rc = tu_fake_send(fake, req, b.sb.data, b.sb.size);
    tu_buf_fini(&b);
    return rc;
}

int tu_fake_seen(tu_fake *fake)
{
    return atomic_load(&fake->seen);
}

void tu_fake_stop(tu_fake **fake)
{
    tu_fake *f;
    if (fake == NULL || *fake == NULL)
        return;
    f = *fake;
    atomic_store(&f->stop, 1);
    pthread_join(f->thread, NULL);
    zmq_close(f->router);
    zmq_ctx_term(f->ctx);
    free(f);
    *fake = NULL;
}

/* ---- the runtime's log ---------------------------------------------------- */

static struct {
    pthread_mutex_t mu;
    char text[8192];
} tu_log = {.mu = PTHREAD_MUTEX_INITIALIZER};

static void tu_log_sink(void *ctx, ctl_log_level level, const char *line)
{
    (void)ctx;
    (void)level;
    pthread_mutex_lock(&tu_log.mu);
    size_t n = strlen(tu_log.text);
    snprintf(tu_log.text + n, sizeof tu_log.text - n, "%s\n", line);
    pthread_mutex_unlock(&tu_log.mu);
}

void tu_log_keep(void)
{
    pthread_mutex_lock(&tu_log.mu);
    tu_log.text[0] = '\0';
    pthread_mutex_unlock(&tu_log.mu);
    ctl_log_set_sink(tu_log_sink, NULL);
}

void tu_log_stop(void)
{
    ctl_log_set_sink(NULL, NULL);
}

bool tu_log_has(const char *part)
{
    pthread_mutex_lock(&tu_log.mu);
    bool has = strstr(tu_log.text, part) != NULL;
    pthread_mutex_unlock(&tu_log.mu);
    return has;
}

const char *tu_log_text(void)
{
    return tu_log.text;
}
