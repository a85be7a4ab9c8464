/*
 * directory_int.h - the parts of ctlrpc/directory.h shared by its files
 * (internal to libctlrpc, built only with CTLRPC_WITH_ETCD):
 *
 *   directory_etcd.c   ctl_etcd: one caller's way to etcd's HTTP/JSON
 *                      gateway (endpoints in order, TLS, the auth token,
 *                      deadlines), base64, names, backoff
 *   directory_reg.c    a server's registration (lease, keepalive thread)
 *   directory.c        ctl_directory (list, watch, snapshots)
 *
 * A ctl_etcd is used by one thread at a time; ctl_etcd_abort may be called
 * from any thread and cuts the call in flight short.
 */
#ifndef CTLRPC_DIRECTORY_INT_H
#define CTLRPC_DIRECTORY_INT_H

#include <stdatomic.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include <curl/curl.h>
#include <jansson.h>

#include "ctlrpc/directory.h"

/* The request deadline when none is given. */
#define CTL_ETCD_TIMEOUT_DEFAULT_MS 2000
/* Backoff between failed calls: from this, doubling, to that. */
#define CTL_BACKOFF_MIN_MS 100
#define CTL_BACKOFF_MAX_MS 5000
/* Largest response read from etcd (a listing of many units). */
#define CTL_ETCD_RESPONSE_MAX ((size_t)256 << 20)

typedef struct ctl_etcd ctl_etcd;

/* Check and copy `opts` (the endpoints from CTLRPC_ETCD when not given,
 * the password from CTLRPC_ETCD_PASSWORD). `who` names the caller in
 * messages ("directory storage"). CTL_INVALID naming what is wrong. */
int ctl_etcd_new(const ctl_etcd_options *opts, const char *who, ctl_etcd **out,
                 ctl_error *err);
void ctl_etcd_destroy(ctl_etcd **e);

/* The endpoints as given, comma-separated (for messages). */
const char *ctl_etcd_endpoints(const ctl_etcd *e);
int ctl_etcd_timeout_ms(const ctl_etcd *e);

/* Cut the call in flight short, and every later one (they fail at once).
 * Any thread. */
void ctl_etcd_abort(ctl_etcd *e);

/*
 * POST `body` (JSON; not kept) to `path` ("/v3/kv/range") and parse the
 * answer. Tries the endpoints in order, starting with the last one that
 * answered, each with the deadline; authenticates first when a user is
 * set, and once more when etcd says the token is no longer valid. Returns
 * 0 with *resp the answer (the caller decrefs it), or CTL_TRANSFER with
 * cause REFUSED (no endpoint could be reached), TIMEOUT, AUTH (etcd
 * refused the user), REMOTE (etcd answered with an error: *code, when not
 * NULL, gets its gRPC code) or BAD_REPLY, the message naming the endpoint.
 */
int ctl_etcd_call(ctl_etcd *e, const char *path, json_t *body, json_t **resp,
                  int *code, ctl_error *err);

/*
 * A streaming POST for the watch, on the endpoint ctl_etcd_call would try
 * first (the next one after `rotate` is true): an easy handle with the
 * TLS options, the auth header (authenticating first, blocking, when
 * needed) and `write_fn`/`arg`, without a total deadline but with the
 * connect deadline. *headers must be freed with curl_slist_free_all after
 * the handle is cleaned up. NULL on failure (err set).
 */
CURL *ctl_etcd_stream(ctl_etcd *e, const char *path, const char *body, bool rotate,
                      curl_write_callback write_fn, void *arg,
                      struct curl_slist **headers, ctl_error *err);

/* base64 (the gateway's bytes). Encode: a new NUL-terminated string or
 * NULL when out of memory. Decode: 0 with a new buffer (NUL-terminated,
 * *len bytes before the NUL), -1 when not base64 or out of memory. */
char *ctl_b64_encode(const void *data, size_t len);
int ctl_b64_decode(const char *text, char **out, size_t *len);

/* The gateway writes int64 fields as strings ("ID": "758..."); read one
 * either way. `fallback` when absent or malformed. */
int64_t ctl_json_int64(const json_t *obj, const char *key, int64_t fallback);

/* A namespace, service or unit id: 1 to CTL_DIRECTORY_NAME_MAX bytes of
 * [A-Za-z0-9._-], not starting with '.'. */
bool ctl_directory_name_ok(const char *name, size_t len);

/* The prefix /ctlrpc/v1/<ns>/<service>/ into a new string, or NULL. */
char *ctl_directory_prefix(const char *ns, const char *service);

/* The wait before retry `attempt` (0, 1, ...): min(max, min * 2^attempt),
 * then a random time between half of that and all of it. */
int ctl_backoff_ms(unsigned attempt);

/* A random 64-bit value (not for keys: for jitter and unit ids). */
uint64_t ctl_directory_random(void);

#endif /* CTLRPC_DIRECTORY_INT_H */
