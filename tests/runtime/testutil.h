/*
 * testutil.h - shared helpers for the runtime tests.
 *
 * Three kinds of helper live here, each usable alone:
 *
 *   - a test unit: a ctl_server on tcp://127.0.0.1:* serving a small test
 *     service (echo, sleep, fail, notify ops; see the table in testutil.c),
 *     with counters the tests read to see what the handlers did;
 *   - raw ZeroMQ peers written with libzmq alone (a DEALER or REQ that sends
 *     arbitrary frames, a ROUTER "fake unit" that answers with whatever the
 *     test scripts), so failure paths can be driven byte by byte without
 *     trusting the runtime under test;
 *   - small msgpack and clock helpers.
 *
 * Threading: a tu_unit's counters are atomics (handlers run on the server
 * thread, tests read them on theirs). A raw socket belongs to the thread
 * that made it. A fake unit's callback runs on the fake's own thread and is
 * the only code that touches its ROUTER socket.
 *
 * Every blocking helper takes a timeout; nothing here waits unbounded.
 */
#ifndef CTLRPC_TESTUTIL_H
#define CTLRPC_TESTUTIL_H

#include <stdatomic.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include <msgpack.h>

#include "ctlrpc/ctlrpc.h"

/* ---- clock and process ------------------------------------------------ */

/* Monotonic milliseconds. */
int64_t tu_now_ms(void);
void tu_sleep_ms(int ms);
/* Resident set size of this process in bytes (from /proc/self/statm). */
size_t tu_rss_bytes(void);
/* Poll until *v >= want or timeout_ms passes; returns the last value read. */
int tu_wait_atleast(atomic_int *v, int want, int timeout_ms);

/* "tcp://127.0.0.1:<port>" where nothing listens: a connection is refused.
 * The port stays bound (not listening) for the life of the process, so no
 * other unit on the machine can take it and receive what a test sends
 * there; tu_dead_release lets it go for a test that then serves it. */
void tu_dead_address(char *buf, size_t buflen);
void tu_dead_release(const char *address);

/* ---- msgpack helpers -------------------------------------------------- */

/* An sbuffer with its packer; init/fini, reset keeps the allocation. */
typedef struct tu_buf {
    msgpack_sbuffer sb;
    msgpack_packer pk;
} tu_buf;

void tu_buf_init(tu_buf *b);
void tu_buf_fini(tu_buf *b);
void tu_buf_reset(tu_buf *b);

void tu_pk_str(msgpack_packer *pk, const char *s);
void tu_pk_strn(msgpack_packer *pk, const void *s, size_t len);

/* A request [op, id, args] packed with msgpack-c directly (not with the
 * runtime), `args` being packed map bytes or NULL for an empty map. */
void tu_pack_request(tu_buf *b, const char *op, const void *id, size_t id_len,
                     const void *args, size_t args_len);

/* An error map packed with the runtime's packer (ctl_env_pack_error),
 * from the error it stands for: `reason` goes with CTL_BUSY, `blobs` with
 * CTL_MISSING. Returns 0 or -1. */
int tu_pack_error_map(msgpack_packer *pk, ctl_kind kind, const char *msg,
                      const char *reason, const ctl_str *blobs, size_t count);

/* A decoded reply [id, ok, body] read with msgpack-c directly. The views
 * point into `data`; `zone` owns the objects. Returns 0, or -1 when the
 * payload is not an array of 3 with a str id and a bool. */
typedef struct tu_reply {
    const char *id;
    size_t id_len;
    bool ok;
    msgpack_object body;
} tu_reply;

int tu_parse_reply(const void *data, size_t len, msgpack_zone *zone,
                   tu_reply *out);

/* True when `o` is a str equal to the NUL-terminated `s`. */
bool tu_obj_is_str(const msgpack_object *o, const char *s);
/* The value under key `key` in map `o` (any position), or NULL. */
const msgpack_object *tu_obj_get(const msgpack_object *o, const char *key);
/* Pack `o` and compare with `bytes`: true when msgpack-c re-encodes the
 * object into exactly those bytes. */
bool tu_obj_packs_to(const msgpack_object *o, const void *bytes, size_t len);

/* ---- the test unit ---------------------------------------------------- */

/*
 * Ops of the test service:
 *   echo       {field?: str, ...}  -> the args map, or args[field] if given
 *   sleep      {ms: int}           -> sleeps ms, returns ms
 *   fail       {kind: str, reason?: str, blobs?: [str]} -> raises the kind:
 *              "UnitFull", "Busy" (reason), "Missing" (blobs), "Protocol",
 *              "bare" (returns -1 without ctl_req_fail*),
 *              "error-transfer" / "error-busy" (ctl_req_fail_error with a
 *              Transfer / Busy ctl_error). Packs a value before failing, so
 *              the reply also shows that partial results are discarded.
 *   whoami     {}                  -> [op, id] as the handler saw them
 *   locked     {}                  -> true when the handler's lock is held
 *   alloc      {n: int}            -> a bin of n bytes 0..255 repeating,
 *              built in ctl_req_alloc memory
 *   nothing    {}                  -> packs nothing (nil)
 *   notes      {}                  -> number of "note" calls so far
 *   note       {v: int}            notify: records the call and v
 *   note_fail  {}                  notify: records the call, then fails
 */
#define TU_MSG_MARK "tu-marker"

typedef struct tu_unit {
    ctl_server *server;
    char endpoint[CTL_ENDPOINT_MAX];
    atomic_int sleeps_started;
    atomic_int sleeps_done;
    atomic_int notes;
    atomic_int note_fails;
    atomic_llong last_note_v;
    atomic_int calls; /* every handler entry */
} tu_unit;

/* Start the test unit. `opts` may be NULL; when its endpoint is NULL the
 * unit binds tcp://127.0.0.1:*. Returns 0 or the ctl_server_new result. */
int tu_unit_start(tu_unit *u, const ctl_server_options *opts, ctl_error *err);
void tu_unit_stop(tu_unit *u);

/* Read the server's stats, waiting up to timeout_ms for `replies` to reach
 * min_replies first: a reply is counted just after it is sent, so a peer
 * may hold the reply a moment before the counter moves. */
void tu_server_stats_wait(const ctl_server *s, ctl_server_stats *out,
                          uint64_t min_replies, int timeout_ms);

/* The service table (for tests that build their own server). */
extern const ctl_service tu_service;

/* ---- raw ZeroMQ peers ------------------------------------------------- */

/* A socket of `type` connected to `endpoint`, linger 0. NULL on failure. */
void *tu_raw_connect(void *ctx, int type, const char *endpoint);

/* Send one message made of `n` frames. Returns 0 or -1. */
int tu_raw_send_frames(void *sock, const void *const *data, const size_t *len,
                       size_t n);
/* Send one single-frame message. */
int tu_raw_send(void *sock, const void *data, size_t len);

#define TU_MAX_FRAMES 8
/* One received message: up to TU_MAX_FRAMES frames (more are counted in
 * nframes but not kept). */
typedef struct tu_rx {
    size_t nframes;
    unsigned char *frame[TU_MAX_FRAMES];
    size_t len[TU_MAX_FRAMES];
} tu_rx;

/* Wait up to timeout_ms for one message. 0: received; -1: nothing came. */
int tu_raw_recv(void *sock, int timeout_ms, tu_rx *rx);
void tu_rx_free(tu_rx *rx);
/* The last frame: the payload. */
#define TU_RX_PAYLOAD(rx) ((rx)->frame[((rx)->nframes > TU_MAX_FRAMES ? TU_MAX_FRAMES : (rx)->nframes) - 1])
#define TU_RX_PAYLOAD_LEN(rx) ((rx)->len[((rx)->nframes > TU_MAX_FRAMES ? TU_MAX_FRAMES : (rx)->nframes) - 1])

/* ---- the fake unit: a raw ROUTER scripted by the test ----------------- */

typedef struct tu_fake tu_fake;

/* One request as the fake saw it. Views valid during the callback. */
typedef struct tu_fake_req {
    const unsigned char *identity;
    size_t identity_len;
    const char *op;
    size_t op_len;
    const char *id;
    size_t id_len;
    const msgpack_object *args; /* NULL when the payload did not decode */
    int seq;                    /* 0 for the first request the fake saw */
} tu_fake_req;

/* Called on the fake's thread for every request. It answers (or not) with
 * tu_fake_send, possibly several times, possibly after sleeping. */
typedef void (*tu_fake_fn)(tu_fake *fake, const tu_fake_req *req, void *user);

int tu_fake_start(tu_fake **out, tu_fake_fn fn, void *user);
const char *tu_fake_endpoint(const tu_fake *fake);
/* Send [identity, payload] to the peer of `req`. Returns 0 or -1. */
int tu_fake_send(tu_fake *fake, const tu_fake_req *req, const void *payload,
                 size_t len);
/* Answer [id, ok, body]: `body` is packed msgpack bytes (NULL: nil). */
int tu_fake_answer(tu_fake *fake, const tu_fake_req *req, const char *id,
                   size_t id_len, bool ok, const void *body, size_t body_len);
/* Requests received so far. */
int tu_fake_seen(tu_fake *fake);
void tu_fake_stop(tu_fake **fake);

/* ---- the runtime's log ------------------------------------------------ */

/* Keep the runtime's log lines (those its level lets through) for the test
 * to read, from an empty log (ctl_log_set_sink); tu_log_stop sends them to
 * stderr again. The first 8 KiB are kept. */
void tu_log_keep(void);
void tu_log_stop(void);
/* Whether a kept line holds `part`. */
bool tu_log_has(const char *part);
/* The kept lines, for a failure's message (read after tu_log_stop). */
const char *tu_log_text(void);

#endif /* CTLRPC_TESTUTIL_H */
