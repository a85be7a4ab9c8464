/*
 * soak.c - many client threads over several real storage units for a fixed
 * time, every reply checked against a model.
 *
 *   soak --unit PATH [--seconds 20] [--threads 32] [--units 4]
 *        [--clients 4] [--sample-ms 1000] [--seed N] [--csv FILE]
 *
 * Starts `units` ctl-storage-unit processes (PATH) on 127.0.0.1 and runs
 * `threads` threads, which share `clients` ctl_clients (thread t uses
 * client t % clients, so each client is shared by several threads). Each
 * thread owns its keys ("t07/u2/k03": thread 7's slot 3 on unit 2) and a
 * model of them (bytes, pinned or not), and runs random ops of
 * idl/storage.idl against random units until the time is up:
 *
 *   put       result = the length; Busy "pinned" exactly when the key is
 *             pinned (then nothing changes); 1% of blobs are 32 KiB-256 KiB
 *             (the zero-copy reply path), most under 2 KiB
 *   get       exactly the bytes put, or Missing naming exactly the absent
 *             keys in the order asked
 *   describe  sizes and pins as modelled, or Missing as get
 *   pin       the number of keys, or Missing (and then nothing pinned)
 *   unpin     notify; the thread then polls describe until the unpin shows,
 *             and every answer must be the state before or after it
 *   abort     notify; as unpin, and the pinned keys it names must survive
 *   delete    the number of present keys, or Busy "pinned" (nothing gone)
 *   list      exactly the thread's present keys on that unit, sorted
 *   stats     answered; `requests` never goes backwards
 *
 * Notifies name at least one key they visibly change, so a thread knows
 * when its notify has been applied (a handler applies one request whole)
 * and its model is exact again before it goes on: notifies and calls
 * from different threads share sockets, so their order is not otherwise
 * promised (client.h).
 *
 * At the end: every thread's keys are read back in full (list + get), the
 * units' `requests` counters must add up to exactly the calls and
 * notifies the clients sent, with nothing dropped, no timeout and no late
 * reply anywhere. A sampler reads the open fds and RSS of this process and
 * of every unit each `sample-ms`; from the second quarter of the run to
 * the last, fds may not grow by more than FD_SLACK (unless they stay within
 * what the pools may hold: see judge_samples) and RSS by more than
 * 10% + 16 MiB (under AddressSanitizer or ThreadSanitizer, whose own
 * bookkeeping holds memory, RSS is reported but not judged).
 *
 * Exit status 0 when every check held, 1 otherwise; the summary on stdout
 * gives the figures docs/RELIABILITY.md reports, and --csv writes every
 * sample (time, ops done so far, fds and RSS of each process) to FILE.
 */
#include <errno.h>
#include <getopt.h>
#include <inttypes.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "storage.ctl.h"
#include "unitproc.h"

#define MAX_UNITS 16
#define MAX_CLIENTS 64
#define SLOTS 16          /* keys per thread per unit */
#define CALL_MS 15000     /* deadline of every call: none may time out */
#define SETTLE_MS 15000   /* how long a notify may take to show */
#define START_MS 20000
#define MAX_NAMED 4       /* keys named by one request */
/* fds a process may gain after the warm-up without being called leaky: a
 * client opens another socket (two fds: its mailbox and its connection,
 * and one more on the unit) when more of its threads than ever before call
 * one unit at once, which keeps happening, rarely, all through a run. */
#define FD_SLACK 16
/* fds of one ZeroMQ context with its threads running (the I/O and reaper
 * threads' pollers and mailboxes, the context's own), with room to spare. */
#define CTX_FDS 8
/* fds of one pooled client socket: the DEALER's mailbox and its connection,
 * and its monitor (libzmq's end and the client's reader, a mailbox each). */
#define CLIENT_SOCKET_FDS 4

static struct {
    const char *unit_bin;
    const char *csv;
    int seconds, threads, units, clients, sample_ms;
    unsigned seed;
} cfg = {NULL, NULL, 20, 32, 4, 4, 1000, 1};

static up_unit units[MAX_UNITS];
static ctl_client *clients[MAX_CLIENTS];
static atomic_int stop;
static _Atomic uint64_t ops_done; /* for the samples */

/* ---- time and randomness ----------------------------------------------- */

static int64_t now_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

static void sleep_ms(int ms)
{
    struct timespec ts = {ms / 1000, (long)(ms % 1000) * 1000000L};
    while (nanosleep(&ts, &ts) != 0 && errno == EINTR)
        ;
}

static uint64_t rnd(uint64_t *s)
{
    /* xorshift64* */
    *s ^= *s >> 12;
    *s ^= *s << 25;
    *s ^= *s >> 27;
    return *s * 2685821657736338717ull;
}

static unsigned below(uint64_t *s, unsigned n)
{
    return (unsigned)(rnd(s) % n);
}

/* ---- the model ---------------------------------------------------------- */

typedef struct slot {
    bool present, pinned;
    unsigned char *data;
    size_t len;
    char key[40];
} slot;

enum { OP_PUT, OP_GET, OP_DESCRIBE, OP_PIN, OP_UNPIN, OP_ABORT, OP_DELETE,
       OP_LIST, OP_STATS, OP_COUNT };
static const char *const op_names[OP_COUNT] = {
    "put", "get", "describe", "pin", "unpin", "abort", "delete", "list", "stats"};
/* Out of 100. */
static const unsigned op_weights[OP_COUNT] = {30, 22, 8, 7, 5, 5, 8, 8, 7};

typedef struct worker {
    int index;
    ctl_client *client;
    uint64_t rng;
    slot slots[MAX_UNITS][SLOTS];
    uint64_t last_requests[MAX_UNITS];
    ctl_error err;
    /* counters */
    uint64_t ops[OP_COUNT];
    uint64_t expected_errors; /* Busy / Missing the model predicted */
    uint64_t settle_polls;
    uint64_t lost;       /* calls without a reply (Transfer errors) */
    uint64_t mismatched; /* replies that differ from the model */
    uint64_t bytes_put, bytes_got;
} worker;

static void mismatch(worker *w, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void mismatch(worker *w, const char *fmt, ...)
{
    va_list ap;
    w->mismatched++;
    if (w->mismatched > 5)
        return;
    fprintf(stderr, "soak: thread %d: mismatch: ", w->index);
    va_start(ap, fmt);
    vfprintf(stderr, fmt, ap);
    va_end(ap);
    fputc('\n', stderr);
}

/* A failed call the model did not predict: a Transfer error is a lost
 * reply, anything else a mismatch. */
static void unexpected(worker *w, const char *op, int u, int rc)
{
    if (rc == CTL_TRANSFER) {
        w->lost++;
        if (w->lost <= 5)
            fprintf(stderr, "soak: thread %d: %s at unit %d lost: %s\n",
                    w->index, op, u, w->err.msg);
    } else {
        mismatch(w, "%s at unit %d: unexpected %s: %s", op, u,
                 ctl_kind_name((ctl_kind)rc), w->err.msg);
    }
}

static ctl_str key_of(const slot *s)
{
    return (ctl_str){s->key, strlen(s->key)};
}

static bool str_eq(ctl_str a, ctl_str b)
{
    return a.len == b.len && (a.len == 0 || memcmp(a.ptr, b.ptr, a.len) == 0);
}

/* Pick `n` distinct slots of unit `u` into idx. */
static void pick(worker *w, unsigned n, int *idx)
{
    for (unsigned i = 0; i < n; i++) {
        bool again;
        do {
            idx[i] = (int)below(&w->rng, SLOTS);
            again = false;
            for (unsigned j = 0; j < i; j++)
                again |= idx[j] == idx[i];
        } while (again);
    }
}

/* A Missing error must name exactly the absent keys of `idx`, in order. */
static void check_missing(worker *w, const char *op, int u, const int *idx,
                          unsigned n)
{
    size_t k = 0;
    bool ok = w->err.kind == CTL_MISSING;
    for (unsigned i = 0; ok && i < n; i++) {
        const slot *s = &w->slots[u][idx[i]];
        if (s->present)
            continue;
        ok = k < w->err.blob_count && str_eq(w->err.blobs[k], key_of(s));
        k++;
    }
    if (!ok || k != w->err.blob_count)
        mismatch(w, "%s at unit %d: Missing names the wrong keys (%s)", op, u,
                 w->err.msg ? w->err.msg : "");
    else
        w->expected_errors++;
}

/* ---- ops ------------------------------------------------------------------ */

static size_t blob_len(worker *w)
{
    unsigned r = below(&w->rng, 100);
    if (r == 0)
        return 32768 + below(&w->rng, 229377); /* 32 KiB .. 256 KiB */
    if (r < 10)
        return 2048 + below(&w->rng, 30721);
    return below(&w->rng, 2049);
}

static void op_put(worker *w, int u)
{
    int i = (int)below(&w->rng, SLOTS);
    slot *s = &w->slots[u][i];
    size_t len = blob_len(w);
    unsigned char *data = malloc(len ? len : 1);
    if (!data) {
        mismatch(w, "out of memory");
        return;
    }
    for (size_t j = 0; j < len; j += 8) {
        uint64_t v = rnd(&w->rng);
        memcpy(data + j, &v, len - j < 8 ? len - j : 8);
    }
    storage_put_args a;
    storage_put_args_init(&a);
    a.key = key_of(s);
    a.data = (ctl_str){(const char *)data, len};
    a.pin = below(&w->rng, 10) == 0;
    uint64_t got = 0;
    int rc = storage_put(w->client, units[u].endpoint, &a, CALL_MS, &got, &w->err);
    if (s->present && s->pinned) {
        if (rc == CTL_BUSY && w->err.reason && strcmp(w->err.reason, "pinned") == 0)
            w->expected_errors++;
        else if (rc == 0 || rc == CTL_BUSY)
            mismatch(w, "put %s over a pinned blob: %s", s->key,
                     rc ? "Busy without reason \"pinned\"" : "accepted");
        else
            unexpected(w, "put", u, rc);
        free(data);
        return;
    }
    if (rc != 0) {
        unexpected(w, "put", u, rc);
        free(data);
        return;
    }
    if (got != len)
        mismatch(w, "put %s: %zu bytes, answered %" PRIu64, s->key, len, got);
    free(s->data);
    s->data = data;
    s->len = len;
    s->present = true;
    s->pinned = a.pin;
    w->bytes_put += len;
}

static bool any_absent(worker *w, int u, const int *idx, unsigned n)
{
    for (unsigned i = 0; i < n; i++)
        if (!w->slots[u][idx[i]].present)
            return true;
    return false;
}

static void op_get(worker *w, int u)
{
    int idx[MAX_NAMED];
    ctl_str keys[MAX_NAMED];
    unsigned n = 1 + below(&w->rng, MAX_NAMED);
    pick(w, n, idx);
    for (unsigned i = 0; i < n; i++)
        keys[i] = key_of(&w->slots[u][idx[i]]);
    storage_get_args a = {.keys = {.items = keys, .count = n}};
    storage_list_bin blobs;
    ctl_reply *reply = NULL;
    int rc = storage_get(w->client, units[u].endpoint, &a, CALL_MS, &blobs, &reply,
                         &w->err);
    if (any_absent(w, u, idx, n)) {
        if (rc == CTL_MISSING)
            check_missing(w, "get", u, idx, n);
        else
            rc == 0 ? mismatch(w, "get of absent keys succeeded")
                    : unexpected(w, "get", u, rc);
    } else if (rc != 0) {
        unexpected(w, "get", u, rc);
    } else if (blobs.count != n) {
        mismatch(w, "get: %zu blobs for %u keys", blobs.count, n);
    } else {
        for (unsigned i = 0; i < n; i++) {
            const slot *s = &w->slots[u][idx[i]];
            if (!str_eq(blobs.items[i], (ctl_str){(const char *)s->data, s->len}))
                mismatch(w, "get %s: %zu bytes differ from the %zu put", s->key,
                         blobs.items[i].len, s->len);
            w->bytes_got += blobs.items[i].len;
        }
    }
    ctl_reply_destroy(&reply);
}

/* describe `n` keys; 0 and the infos, or the error kind. */
static int describe(worker *w, int u, const int *idx, unsigned n,
                    storage_list_BlobInfo *infos, ctl_reply **reply)
{
    ctl_str keys[MAX_NAMED];
    for (unsigned i = 0; i < n; i++)
        keys[i] = key_of(&w->slots[u][idx[i]]);
    storage_describe_args a = {.keys = {.items = keys, .count = n}};
    return storage_describe(w->client, units[u].endpoint, &a, CALL_MS, infos,
                            reply, &w->err);
}

static void op_describe(worker *w, int u)
{
    int idx[MAX_NAMED];
    unsigned n = 1 + below(&w->rng, MAX_NAMED);
    pick(w, n, idx);
    storage_list_BlobInfo infos;
    ctl_reply *reply = NULL;
    int rc = describe(w, u, idx, n, &infos, &reply);
    if (any_absent(w, u, idx, n)) {
        if (rc == CTL_MISSING)
            check_missing(w, "describe", u, idx, n);
        else
            rc == 0 ? mismatch(w, "describe of absent keys succeeded")
                    : unexpected(w, "describe", u, rc);
    } else if (rc != 0) {
        unexpected(w, "describe", u, rc);
    } else if (infos.count != n) {
        mismatch(w, "describe: %zu infos for %u keys", infos.count, n);
    } else {
        for (unsigned i = 0; i < n; i++) {
            const slot *s = &w->slots[u][idx[i]];
            const storage_BlobInfo *b = &infos.items[i];
            if (!str_eq(b->key, key_of(s)) || b->size != s->len ||
                b->pinned != s->pinned || b->spilled)
                mismatch(w, "describe %s: size %" PRIu64 " pinned %d, modelled "
                         "%zu %d", s->key, b->size, b->pinned, s->len, s->pinned);
        }
    }
    ctl_reply_destroy(&reply);
}

static void op_pin(worker *w, int u)
{
    int idx[MAX_NAMED];
    ctl_str keys[MAX_NAMED];
    unsigned n = 1 + below(&w->rng, 3);
    pick(w, n, idx);
    for (unsigned i = 0; i < n; i++)
        keys[i] = key_of(&w->slots[u][idx[i]]);
    storage_pin_args a = {.keys = {.items = keys, .count = n}};
    uint64_t got = 0;
    int rc = storage_pin(w->client, units[u].endpoint, &a, CALL_MS, &got, &w->err);
    if (any_absent(w, u, idx, n)) {
        if (rc == CTL_MISSING)
            check_missing(w, "pin", u, idx, n);
        else
            rc == 0 ? mismatch(w, "pin of absent keys succeeded")
                    : unexpected(w, "pin", u, rc);
        return;
    }
    if (rc != 0) {
        unexpected(w, "pin", u, rc);
        return;
    }
    if (got != n)
        mismatch(w, "pin of %u keys answered %" PRIu64, n, got);
    for (unsigned i = 0; i < n; i++)
        w->slots[u][idx[i]].pinned = true;
}

static void op_delete(worker *w, int u)
{
    int idx[MAX_NAMED];
    ctl_str keys[MAX_NAMED];
    unsigned n = 1 + below(&w->rng, 3), present = 0;
    bool pinned = false;
    pick(w, n, idx);
    for (unsigned i = 0; i < n; i++) {
        const slot *s = &w->slots[u][idx[i]];
        keys[i] = key_of(s);
        present += s->present;
        pinned |= s->present && s->pinned;
    }
    storage_delete_args a = {.keys = {.items = keys, .count = n}};
    uint64_t got = 0;
    int rc = storage_delete(w->client, units[u].endpoint, &a, CALL_MS, &got, &w->err);
    if (pinned) {
        if (rc == CTL_BUSY && w->err.reason && strcmp(w->err.reason, "pinned") == 0)
            w->expected_errors++;
        else
            rc == 0 ? mismatch(w, "delete of a pinned blob succeeded")
                    : unexpected(w, "delete", u, rc);
        return;
    }
    if (rc != 0) {
        unexpected(w, "delete", u, rc);
        return;
    }
    if (got != present)
        mismatch(w, "delete of %u present keys answered %" PRIu64, present, got);
    for (unsigned i = 0; i < n; i++) {
        slot *s = &w->slots[u][idx[i]];
        free(s->data);
        s->data = NULL;
        s->len = 0;
        s->present = s->pinned = false;
    }
}

static int cmp_keys(const void *x, const void *y)
{
    const ctl_str *a = x, *b = y;
    int c = memcmp(a->ptr, b->ptr, a->len < b->len ? a->len : b->len);
    return c ? c : (a->len > b->len) - (a->len < b->len);
}

/* list the thread's keys on unit u and compare with the model. */
static void check_list(worker *w, int u)
{
    char prefix[16];
    snprintf(prefix, sizeof prefix, "t%02d/", w->index);
    storage_list_args a;
    storage_list_args_init(&a);
    a.prefix = (ctl_str){prefix, strlen(prefix)};
    storage_list_str got;
    ctl_reply *reply = NULL;
    int rc = storage_list(w->client, units[u].endpoint, &a, CALL_MS, &got, &reply,
                          &w->err);
    if (rc != 0) {
        unexpected(w, "list", u, rc);
        return;
    }
    ctl_str want[SLOTS];
    size_t n = 0;
    for (int i = 0; i < SLOTS; i++)
        if (w->slots[u][i].present)
            want[n++] = key_of(&w->slots[u][i]);
    qsort(want, n, sizeof want[0], cmp_keys);
    bool same = got.count == n;
    for (size_t i = 0; same && i < n; i++)
        same = str_eq(got.items[i], want[i]);
    if (!same)
        mismatch(w, "list %s at unit %d: %zu keys, modelled %zu", prefix, u,
                 got.count, n);
    ctl_reply_destroy(&reply);
}

static void op_stats(worker *w, int u)
{
    storage_UnitStats st;
    ctl_reply *reply = NULL;
    int rc = storage_stats(w->client, units[u].endpoint, CALL_MS, &st, &reply, &w->err);
    if (rc != 0) {
        unexpected(w, "stats", u, rc);
        return;
    }
    if (st.requests <= w->last_requests[u] || st.dropped != 0 || st.spilled != 0)
        mismatch(w, "stats at unit %d: requests %" PRIu64 " after %" PRIu64
                 ", dropped %" PRIu64, u, st.requests, w->last_requests[u],
                 st.dropped);
    w->last_requests[u] = st.requests;
    ctl_reply_destroy(&reply);
}

/*
 * unpin or abort (notify) some keys, at least one of which it visibly
 * changes, then poll describe over the keys that were present until the
 * change shows. Every answer must be the whole state before or the whole
 * state after. Returns without doing anything when no key would change.
 */
static void op_notify(worker *w, int u, bool is_abort)
{
    int cand[SLOTS], nc = 0;
    for (int i = 0; i < SLOTS; i++) {
        const slot *s = &w->slots[u][i];
        if (s->present && (is_abort ? !s->pinned : s->pinned))
            cand[nc++] = i;
    }
    if (nc == 0)
        return;
    int idx[MAX_NAMED];
    unsigned n = 1 + below(&w->rng, 3);
    idx[0] = cand[below(&w->rng, (unsigned)nc)];
    for (unsigned i = 1; i < n; i++) {
        bool again;
        do {
            idx[i] = (int)below(&w->rng, SLOTS);
            again = false;
            for (unsigned j = 0; j < i; j++)
                again |= idx[j] == idx[i];
        } while (again);
    }
    ctl_str keys[MAX_NAMED];
    for (unsigned i = 0; i < n; i++)
        keys[i] = key_of(&w->slots[u][idx[i]]);
    int rc;
    if (is_abort) {
        storage_abort_args a = {.keys = {.items = keys, .count = n}};
        rc = storage_abort(w->client, units[u].endpoint, &a, &w->err);
    } else {
        storage_unpin_args a = {.keys = {.items = keys, .count = n}};
        rc = storage_unpin(w->client, units[u].endpoint, &a, &w->err);
    }
    if (rc != 0) {
        unexpected(w, is_abort ? "abort" : "unpin", u, rc);
        return;
    }

    /* The keys that were present; for abort, which of them go. */
    int look[MAX_NAMED];
    bool goes[MAX_NAMED];
    unsigned nl = 0, ngo = 0;
    for (unsigned i = 0; i < n; i++) {
        const slot *s = &w->slots[u][idx[i]];
        if (!s->present)
            continue;
        goes[nl] = is_abort && !s->pinned;
        ngo += goes[nl];
        look[nl++] = idx[i];
    }
    int64_t deadline = now_ms() + SETTLE_MS;
    bool applied = false;
    while (!applied) {
        storage_list_BlobInfo infos;
        ctl_reply *reply = NULL;
        rc = describe(w, u, look, nl, &infos, &reply);
        w->settle_polls++;
        if (rc == 0 && infos.count == nl) {
            /* Before (abort: nothing gone yet; unpin: pins unchanged) or,
             * for unpin, after (no pin left). */
            bool before = true, after = !is_abort;
            for (unsigned i = 0; i < nl; i++) {
                const slot *s = &w->slots[u][look[i]];
                before &= infos.items[i].pinned == s->pinned &&
                          infos.items[i].size == s->len;
                after &= !infos.items[i].pinned && infos.items[i].size == s->len;
            }
            if (after)
                applied = true;
            else if (!before) {
                mismatch(w, "%s at unit %d: half applied", is_abort ? "abort" : "unpin", u);
                applied = true;
            }
        } else if (rc == CTL_MISSING && is_abort) {
            /* After: exactly the unpinned ones are gone. */
            size_t k = 0;
            bool ok = true;
            for (unsigned i = 0; i < nl && ok; i++)
                if (goes[i])
                    ok = k < w->err.blob_count &&
                         str_eq(w->err.blobs[k++], key_of(&w->slots[u][look[i]]));
            if (!ok || k != w->err.blob_count || k != ngo)
                mismatch(w, "abort at unit %d: Missing names the wrong keys "
                         "(pinned blobs must survive)", u);
            applied = true;
        } else {
            rc == 0 ? mismatch(w, "describe after a notify: wrong count")
                    : unexpected(w, "describe", u, rc);
            applied = true;
        }
        ctl_reply_destroy(&reply);
        if (!applied && now_ms() > deadline) {
            w->lost++;
            fprintf(stderr, "soak: thread %d: %s at unit %d never applied\n",
                    w->index, is_abort ? "abort" : "unpin", u);
            break;
        }
        if (!applied)
            sleep_ms(1);
    }
    for (unsigned i = 0; i < n; i++) {
        slot *s = &w->slots[u][idx[i]];
        if (!s->present)
            continue;
        if (!is_abort) {
            s->pinned = false;
        } else if (!s->pinned) {
            free(s->data);
            s->data = NULL;
            s->len = 0;
            s->present = false;
        }
    }
}

static void *worker_main(void *arg)
{
    worker *w = arg;
    while (!atomic_load(&stop)) {
        int u = (int)below(&w->rng, (unsigned)cfg.units);
        unsigned r = below(&w->rng, 100), op = 0;
        while (r >= op_weights[op]) {
            r -= op_weights[op];
            op++;
        }
        w->ops[op]++;
        switch (op) {
        case OP_PUT: op_put(w, u); break;
        case OP_GET: op_get(w, u); break;
        case OP_DESCRIBE: op_describe(w, u); break;
        case OP_PIN: op_pin(w, u); break;
        case OP_UNPIN: op_notify(w, u, false); break;
        case OP_ABORT: op_notify(w, u, true); break;
        case OP_DELETE: op_delete(w, u); break;
        case OP_LIST: check_list(w, u); break;
        default: op_stats(w, u); break;
        }
        atomic_fetch_add_explicit(&ops_done, 1, memory_order_relaxed);
    }
    return NULL;
}

/* Read back everything the thread holds: list, then get of every key. */
static void final_check(worker *w)
{
    for (int u = 0; u < cfg.units; u++) {
        check_list(w, u);
        for (int i = 0; i < SLOTS; i++) {
            if (!w->slots[u][i].present)
                continue;
            ctl_str k = key_of(&w->slots[u][i]);
            storage_get_args a = {.keys = {.items = &k, .count = 1}};
            storage_list_bin blobs;
            ctl_reply *reply = NULL;
            int rc = storage_get(w->client, units[u].endpoint, &a, CALL_MS, &blobs,
                                 &reply, &w->err);
            if (rc != 0)
                unexpected(w, "final get", u, rc);
            else if (blobs.count != 1 ||
                     !str_eq(blobs.items[0], (ctl_str){(const char *)w->slots[u][i].data,
                                                       w->slots[u][i].len}))
                mismatch(w, "final get %s differs", w->slots[u][i].key);
            ctl_reply_destroy(&reply);
        }
    }
}

/* ---- the sampler ------------------------------------------------------- */

typedef struct sample {
    int64_t t_ms;
    uint64_t ops;
    int fds[MAX_UNITS + 1];      /* [0] this process, [1..] the units */
    size_t rss_kib[MAX_UNITS + 1];
} sample;

static sample *samples;
static size_t n_samples, cap_samples;
static int64_t t_start;

static void take_sample(void)
{
    if (n_samples == cap_samples) {
        size_t cap = cap_samples ? 2 * cap_samples : 256;
        sample *s = realloc(samples, cap * sizeof *s);
        if (!s)
            return;
        samples = s;
        cap_samples = cap;
    }
    sample *s = &samples[n_samples++];
    s->t_ms = now_ms() - t_start;
    s->ops = atomic_load_explicit(&ops_done, memory_order_relaxed);
    s->fds[0] = up_count_fds(0);
    s->rss_kib[0] = up_rss_kib(0);
    for (int u = 0; u < cfg.units; u++) {
        s->fds[u + 1] = up_count_fds(units[u].pid);
        s->rss_kib[u + 1] = up_rss_kib(units[u].pid);
    }
}

static void *sampler_main(void *arg)
{
    (void)arg;
    while (!atomic_load(&stop)) {
        for (int waited = 0; waited < cfg.sample_ms && !atomic_load(&stop); waited += 50)
            sleep_ms(50);
        if (!atomic_load(&stop))
            take_sample();
    }
    return NULL;
}

/* Max of column `p` over samples [from, to). */
static void window_max(size_t from, size_t to, int p, int *fds, size_t *rss)
{
    *fds = 0;
    *rss = 0;
    for (size_t i = from; i < to && i < n_samples; i++) {
        if (samples[i].fds[p] > *fds)
            *fds = samples[i].fds[p];
        if (samples[i].rss_kib[p] > *rss)
            *rss = samples[i].rss_kib[p];
    }
}

static void write_csv(const char *path)
{
    FILE *f = fopen(path, "w");
    if (!f) {
        fprintf(stderr, "soak: %s: %s\n", path, strerror(errno));
        return;
    }
    fprintf(f, "t_s,ops,client_fds,client_rss_kib");
    for (int u = 0; u < cfg.units; u++)
        fprintf(f, ",unit%d_fds,unit%d_rss_kib", u, u);
    fputc('\n', f);
    for (size_t i = 0; i < n_samples; i++) {
        const sample *s = &samples[i];
        fprintf(f, "%.1f,%" PRIu64, s->t_ms / 1000.0, s->ops);
        for (int p = 0; p <= cfg.units; p++)
            fprintf(f, ",%d,%zu", s->fds[p], s->rss_kib[p]);
        fputc('\n', f);
    }
    fclose(f);
}

/* Judge flatness; prints one line per process. Returns failures. */
static int judge_samples(void)
{
    int failures = 0;
    if (n_samples < 12) {
        printf("samples: only %zu, fds and RSS not judged\n", n_samples);
        return 0;
    }
    size_t q1 = n_samples / 4, q2 = n_samples / 2, q3 = (3 * n_samples) / 4;
    for (int p = 0; p <= cfg.units; p++) {
        int f_first = samples[0].fds[p], f_warm, f_end;
        size_t r_first = samples[0].rss_kib[p], r_warm, r_end;
        window_max(q1, q2, p, &f_warm, &r_warm);
        window_max(q3, n_samples, p, &f_end, &r_end);
        int fds_min = f_warm, fds_max = f_warm;
        for (size_t i = q1; i < n_samples; i++) {
            if (samples[i].fds[p] < fds_min)
                fds_min = samples[i].fds[p];
            if (samples[i].fds[p] > fds_max)
                fds_max = samples[i].fds[p];
        }
        /* The most a process can hold without leaking: per client and
         * unit at most min(threads per client, 16 idle) sockets, each
         * CLIENT_SOCKET_FDS on the client side and one on the unit's, plus
         * what each client's ZeroMQ context holds. */
        int per_pair = (cfg.threads + cfg.clients - 1) / cfg.clients;
        if (per_pair > 16)
            per_pair = 16;
        int bound = f_first + 8 +
                    (p == 0 ? cfg.clients * (CTX_FDS + CLIENT_SOCKET_FDS * cfg.units * per_pair)
                            : cfg.clients * per_pair);
        bool fds_ok = f_end <= f_warm + FD_SLACK || f_end <= bound;
        bool rss_ok = UP_SANITIZED || r_end <= r_warm + r_warm / 10 + 16 * 1024;
        printf("%-8s fds: start %d, after warm-up %d..%d (bound %d), max 2nd "
               "quarter %d, max last quarter %d %s| RSS KiB: start %zu, max 2nd "
               "quarter %zu, max last quarter %zu %s\n",
               p == 0 ? "client" : "unit", f_first, fds_min, fds_max, bound, f_warm, f_end,
               fds_ok ? "" : "(GREW) ", r_first, r_warm, r_end,
               UP_SANITIZED ? "(sanitizer: not judged)" : rss_ok ? "" : "(GREW)");
        failures += !fds_ok + !rss_ok;
    }
    return failures;
}

/* ---- main ---------------------------------------------------------------- */

static void usage(FILE *f)
{
    fprintf(f, "usage: soak --unit PATH [--seconds N] [--threads N] [--units N]\n"
               "            [--clients N] [--sample-ms N] [--seed N] [--csv FILE]\n");
}

int main(int argc, char **argv)
{
    static const struct option opts[] = {
        {"unit", required_argument, NULL, 'b'},
        {"seconds", required_argument, NULL, 's'},
        {"threads", required_argument, NULL, 't'},
        {"units", required_argument, NULL, 'u'},
        {"clients", required_argument, NULL, 'c'},
        {"sample-ms", required_argument, NULL, 'm'},
        {"seed", required_argument, NULL, 'r'},
        {"csv", required_argument, NULL, 'o'},
        {"help", no_argument, NULL, 'h'},
        {NULL, 0, NULL, 0},
    };
    int c;
    while ((c = getopt_long(argc, argv, "h", opts, NULL)) != -1) {
        switch (c) {
        case 'b': cfg.unit_bin = optarg; break;
        case 's': cfg.seconds = atoi(optarg); break;
        case 't': cfg.threads = atoi(optarg); break;
        case 'u': cfg.units = atoi(optarg); break;
        case 'c': cfg.clients = atoi(optarg); break;
        case 'm': cfg.sample_ms = atoi(optarg); break;
        case 'r': cfg.seed = (unsigned)strtoul(optarg, NULL, 10); break;
        case 'o': cfg.csv = optarg; break;
        case 'h': usage(stdout); return 0;
        default: usage(stderr); return 2;
        }
    }
    if (!cfg.unit_bin || cfg.seconds <= 0 || cfg.threads <= 0 || cfg.threads > 99 ||
        cfg.units <= 0 || cfg.units > MAX_UNITS || cfg.clients <= 0 ||
        cfg.clients > MAX_CLIENTS || cfg.sample_ms <= 0) {
        usage(stderr);
        return 2;
    }
    printf("soak: %d threads over %d units, %d shared clients, %d s, seed %u\n",
           cfg.threads, cfg.units, cfg.clients, cfg.seconds, cfg.seed);

    int rc = 1;
    worker *ws = calloc((size_t)cfg.threads, sizeof *ws);
    pthread_t *th = calloc((size_t)cfg.threads, sizeof *th);
    pthread_t sampler;
    ctl_error err;
    ctl_error_init(&err);
    if (!ws || !th)
        goto out;
    for (int u = 0; u < cfg.units; u++)
        if (up_start(&units[u], cfg.unit_bin, NULL, "1G", START_MS) != 0)
            goto out;
    for (int i = 0; i < cfg.clients; i++)
        if (ctl_client_new(NULL, &clients[i], &err) != 0) {
            fprintf(stderr, "soak: %s\n", err.msg);
            goto out;
        }
    for (int t = 0; t < cfg.threads; t++) {
        worker *w = &ws[t];
        w->index = t;
        w->client = clients[t % cfg.clients];
        w->rng = 0x9e3779b97f4a7c15ull * (uint64_t)(cfg.seed * 1000u + (unsigned)t + 1);
        ctl_error_init(&w->err);
        for (int u = 0; u < cfg.units; u++)
            for (int i = 0; i < SLOTS; i++)
                snprintf(w->slots[u][i].key, sizeof w->slots[u][i].key,
                         "t%02d/u%d/k%02d", t, u, i);
    }

    t_start = now_ms();
    take_sample();
    pthread_create(&sampler, NULL, sampler_main, NULL);
    for (int t = 0; t < cfg.threads; t++)
        pthread_create(&th[t], NULL, worker_main, &ws[t]);
    sleep_ms(cfg.seconds * 1000);
    atomic_store(&stop, 1);
    for (int t = 0; t < cfg.threads; t++)
        pthread_join(th[t], NULL);
    pthread_join(sampler, NULL);
    take_sample(); /* after the load, before the read-back */
    int64_t ran_ms = now_ms() - t_start;

    for (int t = 0; t < cfg.threads; t++)
        final_check(&ws[t]);

    /* The counters add up: each unit counted every request sent to it, its
     * own stats call included; nothing was dropped. */
    uint64_t unit_requests = 0, unit_dropped = 0;
    for (int u = 0; u < cfg.units; u++) {
        storage_UnitStats st;
        ctl_reply *reply = NULL;
        if (storage_stats(clients[0], units[u].endpoint, CALL_MS, &st, &reply, &err) != 0) {
            fprintf(stderr, "soak: final stats at unit %d: %s\n", u, err.msg);
            ws[0].lost++;
            continue;
        }
        unit_requests += st.requests;
        unit_dropped += st.dropped;
        ctl_reply_destroy(&reply);
    }
    uint64_t sent = 0, timeouts = 0, late = 0, calls = 0, notifies = 0;
    for (int i = 0; i < cfg.clients; i++) {
        ctl_client_stats cs;
        ctl_client_stats_get(clients[i], &cs);
        calls += cs.calls;
        notifies += cs.notifies;
        timeouts += cs.timeouts;
        late += cs.late_replies;
    }
    sent = calls + notifies;

    uint64_t ops[OP_COUNT] = {0}, total = 0, lost = 0, mismatched = 0, expected = 0;
    uint64_t polls = 0, bput = 0, bgot = 0;
    for (int t = 0; t < cfg.threads; t++) {
        for (int o = 0; o < OP_COUNT; o++) {
            ops[o] += ws[t].ops[o];
            total += ws[t].ops[o];
        }
        lost += ws[t].lost;
        mismatched += ws[t].mismatched;
        expected += ws[t].expected_errors;
        polls += ws[t].settle_polls;
        bput += ws[t].bytes_put;
        bgot += ws[t].bytes_got;
    }
    printf("ops: %" PRIu64 " in %.1f s (%.0f/s):", total, ran_ms / 1000.0,
           total * 1000.0 / (double)(ran_ms ? ran_ms : 1));
    for (int o = 0; o < OP_COUNT; o++)
        printf(" %s %" PRIu64, op_names[o], ops[o]);
    printf("\nrequests: %" PRIu64 " calls + %" PRIu64 " notifies sent, units "
           "counted %" PRIu64 ", dropped %" PRIu64 "; %" PRIu64 " settle polls; "
           "%" PRIu64 " Busy/Missing as modelled\n",
           calls, notifies, unit_requests, unit_dropped, polls, expected);
    printf("bytes: %.1f MiB put, %.1f MiB read back\n", bput / 1048576.0,
           bgot / 1048576.0);
    printf("replies: %" PRIu64 " lost, %" PRIu64 " mismatched; client timeouts "
           "%" PRIu64 ", late replies %" PRIu64 "\n", lost, mismatched, timeouts, late);
    int failures = judge_samples();
    if (cfg.csv)
        write_csv(cfg.csv);
    bool counted = unit_requests == sent && unit_dropped == 0;
    if (!counted)
        printf("FAIL: the units counted %" PRIu64 " requests, the clients sent "
               "%" PRIu64 "\n", unit_requests, sent);
    rc = (lost || mismatched || timeouts || late || !counted || failures) ? 1 : 0;
    printf("soak: %s\n", rc ? "FAILED" : "passed");

out:
    for (int i = 0; i < cfg.clients; i++)
        ctl_client_destroy(&clients[i]);
    for (int u = 0; u < cfg.units; u++)
        if (units[u].pid > 0 && up_stop(&units[u], 20000) != 0) {
            fprintf(stderr, "soak: unit %d did not exit cleanly\n", u);
            rc = 1;
        }
    if (ws)
        for (int t = 0; t < cfg.threads; t++) {
            for (int u = 0; u < cfg.units; u++)
                for (int i = 0; i < SLOTS; i++)
                    free(ws[t].slots[u][i].data);
            ctl_error_fini(&ws[t].err);
        }
    free(ws);
    free(th);
    free(samples);
    ctl_error_fini(&err);
    return rc;
}
