/*
 * ctlrpc/directory.h - a fleet's membership in etcd: servers register,
 * clients resolve and watch a service (docs/PROTOCOL.md, "Membership in
 * etcd", is the contract; docs/API.md, "Fleets", the guide).
 *
 * Built only with CTLRPC_WITH_ETCD (the macro of that name is defined for
 * users of such a library). It reaches etcd v3 through its HTTP/JSON
 * gateway with libcurl; nothing on the request path reads etcd: a unit's
 * calls and a client's calls go straight to units, as without it, and an
 * etcd outage degrades membership (it goes stale) and nothing else.
 *
 *   ctl_server_register   puts a running ctl_server under
 *                         /ctlrpc/v1/<namespace>/<service>/<unit_id> with a
 *                         lease kept alive from a thread of its own; the
 *                         server's drain marks it draining, its close
 *                         revokes the lease (the key is gone at once)
 *   ctl_directory         lists a service's units, then watches them; a
 *                         consistent snapshot (ctl_membership) at any time,
 *                         and a callback on change
 *
 * Every call to etcd has a deadline (ctl_etcd_options.timeout_ms) and is
 * retried with exponential backoff and jitter; endpoints are tried in the
 * order given.
 *
 * Threading: a ctl_directory's functions may be called from any thread;
 * the change callback runs on the directory's own thread. Registration is
 * driven by the owning thread of its server (ctl_server_register, drain,
 * close, destroy).
 */
#ifndef CTLRPC_DIRECTORY_H
#define CTLRPC_DIRECTORY_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "ctlrpc/error.h"
#include "ctlrpc/server.h"

#ifdef __cplusplus
extern "C" {
#endif

/* The environment variables the options fall back to. */
#define CTL_ETCD_ENV "CTLRPC_ETCD"
#define CTL_ETCD_PASSWORD_ENV "CTLRPC_ETCD_PASSWORD"

/* Defaults (docs/PROTOCOL.md, "Leases"). */
#define CTL_LEASE_TTL_DEFAULT_S 10
#define CTL_LEASE_TTL_MIN_S 2
#define CTL_NAMESPACE_DEFAULT "default"
/* Longest namespace, service or unit id. */
#define CTL_DIRECTORY_NAME_MAX 128
/* Largest value a directory accepts, and a unit writes. */
#define CTL_DIRECTORY_VALUE_MAX 4096

/* How to reach etcd. Strings are borrowed for the call they are passed to
 * (the objects copy what they keep). */
typedef struct ctl_etcd_options {
    /* "http://host:port[,URL...]", tried in order; NULL or "": the
     * environment variable CTLRPC_ETCD. */
    const char *endpoints;
    /* https: the CA file to check the server with (NULL: the system's),
     * and a client certificate and its key (PEM files) for clusters that
     * ask for one. */
    const char *cacert;
    const char *cert;
    const char *key;
    /* etcd authentication: a user, with `password`, or when that is NULL
     * the environment variable CTLRPC_ETCD_PASSWORD. */
    const char *user;
    const char *password;
    /* The deadline of each request to etcd, in milliseconds (0: 2000). */
    int timeout_ms;
} ctl_etcd_options;

/* Set `opts` to the defaults (all zero/NULL). */
CTL_API void ctl_etcd_options_init(ctl_etcd_options *opts);

/* ---- registration (units) ------------------------------------------- */

typedef struct ctl_register_options {
    ctl_etcd_options etcd;
    /* NULL: "default". */
    const char *namespace_name;
    /* NULL: the service's name (ctl_service.name). */
    const char *service;
    /* NULL: <host>-<pid>-<8 random hex digits>, new for every
     * registration. */
    const char *unit_id;
    /* The lease's TTL in seconds (0: 10; at least 2). */
    int lease_ttl_s;
    /* The address clients dial (tcp://host:port). NULL: the server's bound
     * endpoint, which must then not be a wildcard (0.0.0.0, ::, *). */
    const char *advertise;
    /* The unit's software version. NULL: the runtime's
     * (CTLRPC_VERSION_STRING). */
    const char *version;
} ctl_register_options;

/* Set `opts` to the defaults (all zero/NULL). */
CTL_API void ctl_register_options_init(ctl_register_options *opts);

/*
 * Register `server` in etcd: its key holds the value of docs/PROTOCOL.md
 * ("Value"; the curve_public_key when the server uses CURVE), under a
 * lease kept alive every TTL/3 from a thread of the registration's own.
 * This returns without waiting for etcd: a unit that cannot reach it
 * serves anyway; the registration logs that once and keeps trying with
 * backoff and jitter, and registers again whenever its lease is lost.
 * Later, ctl_server_drain first marks the key draining (waiting at most
 * 2 s for etcd to take it), and ctl_server_close revokes the lease once
 * the server has stopped (the key is gone at once). The server owns the
 * registration; ctl_server_destroy frees it.
 *
 * Returns 0, or CTL_INVALID naming the bad option (a name outside
 * [A-Za-z0-9._-], a TTL under 2, a wildcard address without `advertise`,
 * no endpoint, a server already registered or closed), or CTL_TRANSFER
 * (out of memory, no thread). Call it from the server's owning thread.
 */
CTL_API int ctl_server_register(ctl_server *server, const ctl_register_options *opts,
                                ctl_error *err);

/* What a registration is doing now. */
typedef struct ctl_registration_info {
    bool registered;        /* ctl_server_register succeeded */
    bool live;              /* etcd holds the key under a live lease */
    bool draining;          /* the key says draining */
    int64_t lease_id;       /* the current lease (0: none) */
    uint64_t registrations; /* times the key was put under a new lease */
    uint64_t keepalives;    /* keepalives etcd answered */
    uint64_t failures;      /* calls to etcd that failed */
    /* The key and unit id (NUL-terminated; "" when not registered). */
    char key[sizeof "/ctlrpc/v1///" + 3 * CTL_DIRECTORY_NAME_MAX];
    char unit_id[CTL_DIRECTORY_NAME_MAX + 1];
} ctl_registration_info;

/* Fill `out` (zero and "" when `server` is not registered). Any thread. */
CTL_API void ctl_server_registration(const ctl_server *server, ctl_registration_info *out);

/* ---- directories (clients) ------------------------------------------ */

/* One unit, as its value said (docs/PROTOCOL.md, "Value"). Strings are
 * NUL-terminated, "" when the value has none; pid and started are 0 when
 * absent. */
typedef struct ctl_unit {
    const char *unit_id;
    const char *address;
    const char *state; /* "serving", "draining", or another state */
    bool serving;      /* state is "serving" */
    const char *service;
    const char *idl_hash;
    const char *version;
    const char *host;
    int64_t pid;
    int64_t started; /* unix seconds */
    const char *curve_public_key;
    int64_t mod_revision; /* etcd's revision of the key's last change */
} ctl_unit;

/*
 * A consistent snapshot of a service's units: all of them as of one etcd
 * revision, sorted by unit id. Immutable and reference counted: valid,
 * from any thread, until ctl_membership_release.
 */
typedef struct ctl_membership {
    const ctl_unit *units;
    size_t count;
    /* The addresses of the serving units, in the order of `units`: what
     * the generated <op>_many stubs take (storage_stats_many(client,
     * m->serving, m->serving_count, ...)). */
    const char *const *serving;
    size_t serving_count;
    /* The etcd revision the snapshot is of. */
    int64_t revision;
} ctl_membership;

/* The serving addresses as the `const char **` the generated <op>_many
 * stubs take; *count (may be NULL) gets their number. Borrowed from `m`. */
CTL_API const char **ctl_membership_addresses(const ctl_membership *m, size_t *count);

/* Let go of a snapshot; sets *m to NULL. Accepts NULL and a pointer to
 * NULL. */
CTL_API void ctl_membership_release(ctl_membership **m);

typedef struct ctl_directory ctl_directory;

/* Called on the directory's thread after each change of membership (a
 * listing, or each etcd revision of the watch's events: a unit's draining
 * and its removal are two calls even when they arrive together), with the
 * new snapshot (borrowed for the call;
 * ctl_directory_snapshot gives one to keep). It must not destroy the
 * directory. */
typedef void (*ctl_directory_fn)(void *user, const ctl_membership *m);

typedef struct ctl_directory_options {
    ctl_etcd_options etcd;
    /* NULL: "default". */
    const char *namespace_name;
    /* How long ctl_directory_new waits for the first listing, in
     * milliseconds (0: 5000), retrying with backoff meanwhile. */
    int start_timeout_ms;
    /* How often the directory checks that etcd answers while its watch is
     * quiet, in milliseconds (0: 2000): a failed check makes it stale. */
    int check_interval_ms;
    /* Most units kept (0: 100000); more are counted as bad values. */
    size_t max_units;
    /* Called on change (NULL: no callback), with `user`. */
    ctl_directory_fn on_change;
    void *user;
} ctl_directory_options;

/* Set `opts` to the defaults (all zero/NULL). */
CTL_API void ctl_directory_options_init(ctl_directory_options *opts);

/*
 * Resolve `service` (NUL-terminated): list its units, waiting up to
 * start_timeout_ms for etcd, then watch them from a thread of the
 * directory's own. On success stores the directory in *out and returns 0.
 * Returns CTL_INVALID for a bad name or option, and CTL_TRANSFER (cause
 * refused, timeout, auth, transport for TLS, remote for an etcd error)
 * when no listing succeeded in time, its message naming the endpoints
 * tried and what went wrong.
 */
CTL_API int ctl_directory_new(const char *service, const ctl_directory_options *opts,
                              ctl_directory **out, ctl_error *err);

/* The current snapshot, to keep (release it with ctl_membership_release).
 * Never NULL for a directory ctl_directory_new returned, except out of
 * memory; NULL for a NULL directory. Any thread. */
CTL_API ctl_membership *ctl_directory_snapshot(ctl_directory *dir);

/* What the directory knows of its own health. */
typedef struct ctl_directory_status {
    bool stale;           /* etcd did not answer the last call: membership
                             is the last one seen */
    int64_t age_ms;       /* since the last successful contact with etcd */
    int64_t revision;     /* of the current snapshot */
    uint64_t changes;     /* snapshots published */
    uint64_t listings;    /* successful listings */
    uint64_t watches;     /* watch streams started (1 + resumptions) */
    uint64_t bad_values;  /* values skipped (docs/PROTOCOL.md, "What a
                             reader accepts") */
    uint64_t failures;    /* calls to etcd that failed */
} ctl_directory_status;

/* Fill `out`. Any thread. */
CTL_API void ctl_directory_status_get(ctl_directory *dir, ctl_directory_status *out);

/*
 * Wait until the directory has published a snapshot newer than the one
 * counted by `changes` (a ctl_directory_status.changes value) or
 * `timeout_ms` has passed. Returns true when it has. Any thread.
 */
CTL_API bool ctl_directory_wait(ctl_directory *dir, uint64_t changes, int timeout_ms);

/* Stop watching and free the directory; sets *dir to NULL. Accepts NULL
 * and a pointer to NULL. Blocking: until its thread has ended (a request
 * in flight is cut short). Not from the change callback. */
CTL_API void ctl_directory_destroy(ctl_directory **dir);

#ifdef __cplusplus
}
#endif

#endif /* CTLRPC_DIRECTORY_H */
