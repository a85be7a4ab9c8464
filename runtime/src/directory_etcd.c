/*
 * directory_etcd.c - one caller's way to etcd v3, through its HTTP/JSON
 * gateway (POST /v3/<service>/<method> with a JSON body; bytes as base64,
 * int64 as strings), with libcurl for HTTP and jansson for JSON. The code
 * here is the meaning of a call (which endpoint, the deadline, the auth
 * token, what an answer says), never its bytes.
 *
 * Endpoints are tried in the order given, starting with the last one that
 * answered; a call that cannot reach one (refused, timed out) goes on to
 * the next within the same call. An answer with an error ({"error",
 * "code", "message"}) is etcd's: it is not tried elsewhere, except an auth
 * token etcd no longer knows, which is renewed once.
 *
 * Threading: a ctl_etcd belongs to one thread at a time (the registration
 * thread, a directory's thread); ctl_etcd_abort is the exception: an
 * atomic flag read by the transfer's progress callback.
 */
#include <ctype.h>
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <time.h>
#include <unistd.h>

#include "ctlrpc/log.h"
#include "directory_int.h"
#include "util_int.h"

#define MAX_ENDPOINTS 16

struct ctl_etcd {
    char *who;
    char *endpoints_text;
    char *endpoints[MAX_ENDPOINTS];
    size_t n_endpoints;
    size_t current; /* the endpoint tried first */
    char *cacert, *cert, *key;
    char *user, *password;
    char *token; /* from /v3/auth/authenticate */
    int timeout_ms;
    atomic_int aborted;
    CURL *easy; /* reused across calls: keeps its connection */
};

static pthread_once_t curl_once = PTHREAD_ONCE_INIT;
static void curl_init_once(void)
{
    curl_global_init(CURL_GLOBAL_DEFAULT);
}

void ctl_etcd_options_init(ctl_etcd_options *opts)
{
    memset(opts, 0, sizeof *opts);
}

static void free_etcd(ctl_etcd *e)
{
    free(e->who);
    free(e->endpoints_text);
    for (size_t i = 0; i < e->n_endpoints; i++)
        free(e->endpoints[i]);
    free(e->cacert);
    free(e->cert);
    free(e->key);
    free(e->user);
    if (e->password) {
        memset(e->password, 0, strlen(e->password));
        free(e->password);
    }
    free(e->token);
    if (e->easy)
        curl_easy_cleanup(e->easy);
    free(e);
}

void ctl_etcd_destroy(ctl_etcd **e)
{
    if (!e || !*e)
        return;
    free_etcd(*e);
    *e = NULL;
}

static char *dup_or_null(const char *s, bool *oom)
{
    if (!s || !*s)
        return NULL;
    char *d = strdup(s);
    if (!d)
        *oom = true;
    return d;
}

static bool readable(const char *path)
{
    return access(path, R_OK) == 0;
}

int ctl_etcd_new(const ctl_etcd_options *opts, const char *who, ctl_etcd **out,
                 ctl_error *err)
{
    pthread_once(&curl_once, curl_init_once);
    *out = NULL;
    const char *eps = opts && opts->endpoints && *opts->endpoints ? opts->endpoints
                                                                 : getenv(CTL_ETCD_ENV);
    if (!eps || !*eps)
        return ctl_error_set(err, CTL_INVALID,
                             "%s: no etcd endpoint: give --etcd URL (or set %s)", who,
                             CTL_ETCD_ENV);
    if (opts && opts->timeout_ms < 0)
        return ctl_error_set(err, CTL_INVALID, "%s: etcd timeout %d ms is negative", who,
                             opts->timeout_ms);
    ctl_etcd *e = calloc(1, sizeof *e);
    if (!e)
        return ctl_error_transfer(err, CTL_CAUSE_NOMEM, "%s: out of memory", who);
    bool oom = false;
    e->who = strdup(who);
    e->endpoints_text = strdup(eps);
    e->timeout_ms = opts && opts->timeout_ms ? opts->timeout_ms : CTL_ETCD_TIMEOUT_DEFAULT_MS;
    if (!e->who || !e->endpoints_text) {
        free_etcd(e);
        return ctl_error_transfer(err, CTL_CAUSE_NOMEM, "%s: out of memory", who);
    }
    /* "URL[,URL...]": each http:// or https://, host and port, no path. */
    const char *p = eps;
    int rc = 0;
    while (*p && rc == 0) {
        const char *comma = strchr(p, ',');
        size_t len = comma ? (size_t)(comma - p) : strlen(p);
        while (len && isspace((unsigned char)*p)) {
            p++;
            len--;
        }
        while (len && isspace((unsigned char)p[len - 1]))
            len--;
        if (len == 0) {
            rc = ctl_error_set(err, CTL_INVALID, "%s: empty etcd endpoint in '%s'", who, eps);
            break;
        }
        char *url = ctl_strndup(p, len);
        if (!url) {
            rc = ctl_error_transfer(err, CTL_CAUSE_NOMEM, "%s: out of memory", who);
            break;
        }
        while (len > 0 && url[len - 1] == '/')
            url[--len] = '\0';
        const char *rest = strncasecmp(url, "http://", 7) == 0    ? url + 7
                           : strncasecmp(url, "https://", 8) == 0 ? url + 8
                                                                  : NULL;
        if (!rest || !*rest || strpbrk(rest, "/@") || strpbrk(url, " \t\"")) {
            rc = ctl_error_set(err, CTL_INVALID,
                               "%s: etcd endpoint '%s' is not http://host:port or "
                               "https://host:port", who, url);
            free(url);
            break;
        }
        if (e->n_endpoints == MAX_ENDPOINTS) {
            rc = ctl_error_set(err, CTL_INVALID, "%s: more than %d etcd endpoints in '%s'",
                               who, MAX_ENDPOINTS, eps);
            free(url);
            break;
        }
        e->endpoints[e->n_endpoints++] = url;
        p = comma ? comma + 1 : p + strlen(p); /* (len lost what was trimmed) */
    }
    if (rc == 0 && e->n_endpoints == 0)
        rc = ctl_error_set(err, CTL_INVALID, "%s: no etcd endpoint in '%s'", who, eps);
    if (rc) {
        free_etcd(e);
        return rc;
    }
    if (opts) {
        const char *files[3] = {opts->cacert, opts->cert, opts->key};
        const char *names[3] = {"--etcd-cacert", "--etcd-cert", "--etcd-key"};
        for (int i = 0; i < 3; i++)
            if (files[i] && *files[i] && !readable(files[i])) {
                rc = ctl_error_set(err, CTL_INVALID, "%s: %s %s: %s", who, names[i],
                                   files[i], strerror(errno));
                free_etcd(e);
                return rc;
            }
        if ((opts->cert && *opts->cert) != (opts->key && *opts->key)) {
            free_etcd(e);
            return ctl_error_set(err, CTL_INVALID,
                                 "%s: a client certificate needs both --etcd-cert and "
                                 "--etcd-key", who);
        }
        e->cacert = dup_or_null(opts->cacert, &oom);
        e->cert = dup_or_null(opts->cert, &oom);
        e->key = dup_or_null(opts->key, &oom);
        e->user = dup_or_null(opts->user, &oom);
        if (e->user) {
            const char *pw = opts->password ? opts->password : getenv(CTL_ETCD_PASSWORD_ENV);
            if (!pw) {
                free_etcd(e);
                return ctl_error_set(err, CTL_INVALID,
                                     "%s: etcd user '%s' given but no password: set %s",
                                     who, opts->user, CTL_ETCD_PASSWORD_ENV);
            }
            e->password = strdup(pw);
            oom = oom || !e->password;
        }
    }
    if (oom) {
        free_etcd(e);
        return ctl_error_transfer(err, CTL_CAUSE_NOMEM, "%s: out of memory", who);
    }
    *out = e;
    return 0;
}

const char *ctl_etcd_endpoints(const ctl_etcd *e)
{
    return e->endpoints_text;
}

int ctl_etcd_timeout_ms(const ctl_etcd *e)
{
    return e->timeout_ms;
}

void ctl_etcd_abort(ctl_etcd *e)
{
    atomic_store(&e->aborted, 1);
}

/* ---- one HTTP exchange -------------------------------------------------- */

typedef struct buf {
    char *data;
    size_t len, cap;
    bool overflow;
} buf;

static size_t buf_write(char *ptr, size_t size, size_t n, void *arg)
{
    buf *b = arg;
    size_t add = size * n;
    if (b->len + add + 1 > CTL_ETCD_RESPONSE_MAX) {
        b->overflow = true;
        return 0;
    }
    if (b->len + add + 1 > b->cap) {
        size_t cap = b->cap ? b->cap : 4096;
        while (cap < b->len + add + 1)
            cap *= 2;
        char *d = realloc(b->data, cap);
        if (!d)
            return 0;
        b->data = d;
        b->cap = cap;
    }
    memcpy(b->data + b->len, ptr, add);
    b->len += add;
    b->data[b->len] = '\0';
    return add;
}

static int on_progress(void *arg, curl_off_t dt, curl_off_t dn, curl_off_t ut, curl_off_t un)
{
    (void)dt;
    (void)dn;
    (void)ut;
    (void)un;
    const ctl_etcd *e = arg;
    return atomic_load(&e->aborted) ? 1 : 0;
}

/* Options every request to etcd has: TLS, no signals, the abort check. */
static void common_options(ctl_etcd *e, CURL *h)
{
    curl_easy_setopt(h, CURLOPT_NOSIGNAL, 1L);
    curl_easy_setopt(h, CURLOPT_CONNECTTIMEOUT_MS, (long)e->timeout_ms);
    curl_easy_setopt(h, CURLOPT_NOPROGRESS, 0L);
    curl_easy_setopt(h, CURLOPT_XFERINFOFUNCTION, on_progress);
    curl_easy_setopt(h, CURLOPT_XFERINFODATA, e);
    curl_easy_setopt(h, CURLOPT_PROTOCOLS_STR, "http,https");
    curl_easy_setopt(h, CURLOPT_TCP_NODELAY, 1L);
    if (e->cacert)
        curl_easy_setopt(h, CURLOPT_CAINFO, e->cacert);
    if (e->cert) {
        curl_easy_setopt(h, CURLOPT_SSLCERT, e->cert);
        curl_easy_setopt(h, CURLOPT_SSLKEY, e->key);
    }
}

static struct curl_slist *make_headers(const ctl_etcd *e, bool with_token)
{
    struct curl_slist *h = curl_slist_append(NULL, "Content-Type: application/json");
    if (h && with_token && e->token) {
        char *line = NULL;
        if (asprintf(&line, "Authorization: %s", e->token) < 0)
            line = NULL;
        struct curl_slist *more = line ? curl_slist_append(h, line) : NULL;
        free(line);
        if (!more) {
            curl_slist_free_all(h);
            return NULL;
        }
        h = more;
    }
    return h;
}

/* The outcome of one exchange with one endpoint. */
enum { XR_OK, XR_UNREACHABLE, XR_TIMEOUT, XR_ABORTED, XR_NOMEM, XR_OTHER };

static int exchange(ctl_etcd *e, size_t ep, const char *path, const char *body,
                    bool with_token, long *status, buf *out, char *why, size_t whylen)
{
    if (atomic_load(&e->aborted)) {
        snprintf(why, whylen, "stopped");
        return XR_ABORTED;
    }
    if (!e->easy && !(e->easy = curl_easy_init())) {
        snprintf(why, whylen, "out of memory");
        return XR_NOMEM;
    }
    CURL *h = e->easy;
    curl_easy_reset(h);
    common_options(e, h);
    char url[512];
    snprintf(url, sizeof url, "%s%s", e->endpoints[ep], path);
    struct curl_slist *headers = make_headers(e, with_token);
    if (!headers) {
        snprintf(why, whylen, "out of memory");
        return XR_NOMEM;
    }
    curl_easy_setopt(h, CURLOPT_URL, url);
    curl_easy_setopt(h, CURLOPT_HTTPHEADER, headers);
    curl_easy_setopt(h, CURLOPT_POSTFIELDS, body);
    curl_easy_setopt(h, CURLOPT_TIMEOUT_MS, (long)e->timeout_ms);
    curl_easy_setopt(h, CURLOPT_WRITEFUNCTION, buf_write);
    curl_easy_setopt(h, CURLOPT_WRITEDATA, out);
    char ebuf[CURL_ERROR_SIZE] = "";
    curl_easy_setopt(h, CURLOPT_ERRORBUFFER, ebuf);
    CURLcode cc = curl_easy_perform(h);
    curl_easy_setopt(h, CURLOPT_ERRORBUFFER, NULL);
    curl_slist_free_all(headers);
    if (cc == CURLE_OK) {
        curl_easy_getinfo(h, CURLINFO_RESPONSE_CODE, status);
        return XR_OK;
    }
    snprintf(why, whylen, "%s", *ebuf ? ebuf : curl_easy_strerror(cc));
    switch (cc) {
    case CURLE_ABORTED_BY_CALLBACK:
        snprintf(why, whylen, "stopped");
        return XR_ABORTED;
    case CURLE_OPERATION_TIMEDOUT:
        return XR_TIMEOUT;
    case CURLE_COULDNT_CONNECT:
    case CURLE_COULDNT_RESOLVE_HOST:
    case CURLE_SEND_ERROR:
    case CURLE_RECV_ERROR:
    case CURLE_GOT_NOTHING:
        return XR_UNREACHABLE;
    case CURLE_WRITE_ERROR:
        if (out->overflow)
            snprintf(why, whylen, "answer larger than %zu bytes", CTL_ETCD_RESPONSE_MAX);
        return XR_OTHER;
    default:
        return XR_OTHER; /* TLS and the like: the endpoint is there, but wrong */
    }
}

/* Parse an answer: 0 with *resp, or the error (REMOTE with *code for
 * etcd's own errors, BAD_REPLY when it is not JSON). `unauth` is set when
 * etcd says the token is not (or no longer) valid. */
static int judge(ctl_etcd *e, size_t ep, const char *path, long status, buf *b,
                 json_t **resp, int *code, bool *unauth, ctl_error *err)
{
    json_error_t jerr;
    json_t *j = b->data ? json_loadb(b->data, b->len, 0, &jerr) : NULL;
    if (!j || !json_is_object(j)) {
        json_decref(j);
        return ctl_error_transfer(err, CTL_CAUSE_BAD_REPLY,
                                  "%s: etcd %s%s answered HTTP %ld with no JSON object",
                                  e->who, e->endpoints[ep], path, status);
    }
    json_t *ejs = json_object_get(j, "error");
    if (status != 200 || ejs) {
        const char *msg = json_string_value(json_object_get(j, "message"));
        if (!msg)
            msg = json_string_value(ejs);
        if (!msg)
            msg = "(no message)";
        int c = (int)json_integer_value(json_object_get(j, "code"));
        if (code)
            *code = c;
        /* 16 Unauthenticated; 3 with "invalid auth token" in 3.4. */
        *unauth = c == 16 || strstr(msg, "auth token") != NULL ||
                  strstr(msg, "user name is empty") != NULL;
        bool denied = c == 7 || strstr(msg, "authentication failed") != NULL ||
                      strstr(msg, "permission denied") != NULL;
        int rc = ctl_error_transfer(err, denied || *unauth ? CTL_CAUSE_AUTH : CTL_CAUSE_REMOTE,
                                    "%s: etcd %s%s: %s", e->who, e->endpoints[ep], path, msg);
        json_decref(j);
        return rc;
    }
    *resp = j;
    return 0;
}

static int authenticate(ctl_etcd *e, size_t ep, ctl_error *err);

/* Add "endpoint: why" to `each` (a message's list of every endpoint's
 * failure), truncated at its end. */
static void note_failure(char *each, size_t cap, size_t *len, const char *ep, const char *why)
{
    if (*len >= cap)
        return;
    int n = snprintf(each + *len, cap - *len, "%s%s: %s", *len ? "; " : "", ep, why);
    *len = n < 0 ? cap : *len + (size_t)n;
}

int ctl_etcd_call(ctl_etcd *e, const char *path, json_t *body, json_t **resp,
                  int *code, ctl_error *err)
{
    *resp = NULL;
    if (code)
        *code = 0;
    char *text = json_dumps(body, JSON_COMPACT);
    if (!text)
        return ctl_error_transfer(err, CTL_CAUSE_NOMEM, "%s: out of memory", e->who);
    int rc = 0, worst = XR_UNREACHABLE;
    char why[CURL_ERROR_SIZE + 64] = "", first_why[CURL_ERROR_SIZE + 64] = "";
    char each[1024] = ""; /* every endpoint's failure, for the message */
    size_t each_len = 0;
    for (size_t k = 0; k < e->n_endpoints; k++) {
        size_t ep = (e->current + k) % e->n_endpoints;
        bool retried_auth = false;
    again:
        if (e->user && !e->token && (rc = authenticate(e, ep, err)) != 0) {
            if (err && err->cause == CTL_CAUSE_AUTH) {
                free(text);
                return rc; /* etcd refused the user: no other endpoint will differ */
            }
            snprintf(why, sizeof why, "%s", err ? err->msg : "cannot authenticate");
            if (!*first_why)
                snprintf(first_why, sizeof first_why, "%s", why);
            note_failure(each, sizeof each, &each_len, e->endpoints[ep], why);
            continue;
        }
        buf b = {NULL, 0, 0, false};
        long status = 0;
        int x = exchange(e, ep, path, text, true, &status, &b, why, sizeof why);
        if (x == XR_OK) {
            bool unauth = false;
            e->current = ep;
            rc = judge(e, ep, path, status, &b, resp, code, &unauth, err);
            free(b.data);
            if (rc && unauth && e->user && !retried_auth) {
                ctl_log(CTL_LOG_DEBUG, "etcd", "%s: %s: logging in again", e->who,
                        err ? err->msg : "token refused");
                free(e->token);
                e->token = NULL;
                retried_auth = true;
                ctl_error_clear(err);
                goto again;
            }
            free(text);
            return rc;
        }
        free(b.data);
        if (x == XR_ABORTED || x == XR_NOMEM) {
            free(text);
            return ctl_error_transfer(err, x == XR_NOMEM ? CTL_CAUSE_NOMEM : CTL_CAUSE_TRANSPORT,
                                      "%s: etcd %s%s: %s", e->who, e->endpoints[ep], path, why);
        }
        if (x == XR_TIMEOUT || (x == XR_OTHER && worst == XR_UNREACHABLE))
            worst = x;
        if (!*first_why || x != XR_UNREACHABLE)
            snprintf(first_why, sizeof first_why, "%s", why);
        note_failure(each, sizeof each, &each_len, e->endpoints[ep], why);
    }
    free(text);
    if (e->n_endpoints == 1)
        return ctl_error_transfer(err,
                                  worst == XR_TIMEOUT ? CTL_CAUSE_TIMEOUT
                                  : worst == XR_OTHER ? CTL_CAUSE_TRANSPORT
                                                     : CTL_CAUSE_REFUSED,
                                  "%s: cannot reach etcd at %s: %s", e->who, e->endpoints[0],
                                  first_why);
    return ctl_error_transfer(err,
                              worst == XR_TIMEOUT ? CTL_CAUSE_TIMEOUT
                              : worst == XR_OTHER ? CTL_CAUSE_TRANSPORT
                                                 : CTL_CAUSE_REFUSED,
                              "%s: cannot reach etcd at any of %s (%s)", e->who,
                              e->endpoints_text, each);
}

/* /v3/auth/authenticate on endpoint `ep`: the token for the next calls. */
static int authenticate(ctl_etcd *e, size_t ep, ctl_error *err)
{
    json_t *body = json_pack("{s:s, s:s}", "name", e->user, "password", e->password);
    char *text = body ? json_dumps(body, JSON_COMPACT) : NULL;
    json_decref(body);
    if (!text)
        return ctl_error_transfer(err, CTL_CAUSE_NOMEM, "%s: out of memory", e->who);
    buf b = {NULL, 0, 0, false};
    long status = 0;
    char why[CURL_ERROR_SIZE + 64];
    int x = exchange(e, ep, "/v3/auth/authenticate", text, false, &status, &b, why, sizeof why);
    memset(text, 0, strlen(text));
    free(text);
    if (x != XR_OK) {
        free(b.data);
        return ctl_error_transfer(err, x == XR_TIMEOUT ? CTL_CAUSE_TIMEOUT : CTL_CAUSE_REFUSED,
                                  "%s: cannot reach etcd at %s: %s", e->who,
                                  e->endpoints[ep], why);
    }
    json_t *resp = NULL;
    bool unauth = false;
    int rc = judge(e, ep, "/v3/auth/authenticate", status, &b, &resp, NULL, &unauth, err);
    free(b.data);
    if (rc) {
        if (err)
            err->cause = CTL_CAUSE_AUTH;
        return rc;
    }
    const char *tok = json_string_value(json_object_get(resp, "token"));
    if (!tok || !*tok) {
        json_decref(resp);
        return ctl_error_transfer(err, CTL_CAUSE_AUTH,
                                  "%s: etcd %s gave no token for user '%s' (is "
                                  "authentication enabled?)", e->who, e->endpoints[ep],
                                  e->user);
    }
    free(e->token);
    e->token = strdup(tok);
    json_decref(resp);
    if (!e->token)
        return ctl_error_transfer(err, CTL_CAUSE_NOMEM, "%s: out of memory", e->who);
    return 0;
}

CURL *ctl_etcd_stream(ctl_etcd *e, const char *path, const char *body, bool rotate,
                      curl_write_callback write_fn, void *arg,
                      struct curl_slist **headers, ctl_error *err)
{
    *headers = NULL;
    if (rotate)
        e->current = (e->current + 1) % e->n_endpoints;
    size_t ep = e->current;
    if (e->user && !e->token && authenticate(e, ep, err) != 0)
        return NULL;
    CURL *h = curl_easy_init();
    *headers = h ? make_headers(e, true) : NULL;
    if (!h || !*headers) {
        if (h)
            curl_easy_cleanup(h);
        ctl_error_transfer(err, CTL_CAUSE_NOMEM, "%s: out of memory", e->who);
        return NULL;
    }
    common_options(e, h);
    char url[512];
    snprintf(url, sizeof url, "%s%s", e->endpoints[ep], path);
    curl_easy_setopt(h, CURLOPT_URL, url);
    curl_easy_setopt(h, CURLOPT_HTTPHEADER, *headers);
    curl_easy_setopt(h, CURLOPT_COPYPOSTFIELDS, body);
    curl_easy_setopt(h, CURLOPT_WRITEFUNCTION, write_fn);
    curl_easy_setopt(h, CURLOPT_WRITEDATA, arg);
    return h;
}

/* ---- base64, numbers, names, backoff -------------------------------- */

static const char b64_chars[] =
    "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";

char *ctl_b64_encode(const void *data, size_t len)
{
    const unsigned char *p = data;
    char *out = malloc((len + 2) / 3 * 4 + 1), *o = out;
    if (!out)
        return NULL;
    size_t i = 0;
    for (; i + 2 < len; i += 3) {
        unsigned v = (unsigned)p[i] << 16 | (unsigned)p[i + 1] << 8 | p[i + 2];
        *o++ = b64_chars[v >> 18];
        *o++ = b64_chars[(v >> 12) & 63];
        *o++ = b64_chars[(v >> 6) & 63];
        *o++ = b64_chars[v & 63];
    }
    if (i < len) {
        unsigned v = (unsigned)p[i] << 16 | (i + 1 < len ? (unsigned)p[i + 1] << 8 : 0);
        *o++ = b64_chars[v >> 18];
        *o++ = b64_chars[(v >> 12) & 63];
        *o++ = i + 1 < len ? b64_chars[(v >> 6) & 63] : '=';
        *o++ = '=';
    }
    *o = '\0';
    return out;
}

static int b64_value(unsigned char c)
{
    if (c >= 'A' && c <= 'Z')
        return c - 'A';
    if (c >= 'a' && c <= 'z')
        return c - 'a' + 26;
    if (c >= '0' && c <= '9')
        return c - '0' + 52;
    if (c == '+' || c == '-')
        return 62;
    if (c == '/' || c == '_')
        return 63;
    return -1;
}

int ctl_b64_decode(const char *text, char **out, size_t *len)
{
    size_t n = strlen(text);
    char *d = malloc(n / 4 * 3 + 4);
    if (!d)
        return -1;
    size_t o = 0;
    unsigned acc = 0;
    int bits = 0;
    size_t i = 0;
    for (; i < n && text[i] != '='; i++) {
        int v = b64_value((unsigned char)text[i]);
        if (v < 0) {
            free(d);
            return -1;
        }
        acc = (acc << 6) | (unsigned)v;
        bits += 6;
        if (bits >= 8) {
            bits -= 8;
            d[o++] = (char)((acc >> bits) & 0xff);
        }
    }
    for (; i < n; i++)
        if (text[i] != '=') {
            free(d);
            return -1;
        }
    d[o] = '\0';
    *out = d;
    *len = o;
    return 0;
}

int64_t ctl_json_int64(const json_t *obj, const char *key, int64_t fallback)
{
    const json_t *v = json_object_get(obj, key);
    if (json_is_integer(v))
        return (int64_t)json_integer_value(v);
    const char *s = json_string_value(v);
    if (!s || !*s)
        return fallback;
    char *end = NULL;
    errno = 0;
    long long n = strtoll(s, &end, 10);
    if (errno || *end)
        return fallback;
    return (int64_t)n;
}

bool ctl_directory_name_ok(const char *name, size_t len)
{
    if (!name || len == 0 || len > CTL_DIRECTORY_NAME_MAX || name[0] == '.')
        return false;
    for (size_t i = 0; i < len; i++) {
        unsigned char c = (unsigned char)name[i];
        if (!(isalnum(c) || c == '.' || c == '_' || c == '-') || c > 127)
            return false;
    }
    return true;
}

char *ctl_directory_prefix(const char *ns, const char *service)
{
    char *p = NULL;
    if (asprintf(&p, "/ctlrpc/v1/%s/%s/", ns, service) < 0)
        return NULL;
    return p;
}

uint64_t ctl_directory_random(void)
{
    static _Atomic uint64_t state;
    uint64_t s = atomic_load(&state);
    if (s == 0) {
        uint64_t seed = 0;
        int fd = open("/dev/urandom", O_RDONLY | O_CLOEXEC);
        if (fd >= 0) {
            if (read(fd, &seed, sizeof seed) != (ssize_t)sizeof seed)
                seed = 0;
            close(fd);
        }
        struct timespec ts;
        clock_gettime(CLOCK_REALTIME, &ts);
        seed ^= (uint64_t)ts.tv_nsec ^ ((uint64_t)ts.tv_sec << 20) ^ ((uint64_t)getpid() << 40);
        uint64_t zero = 0;
        atomic_compare_exchange_strong(&state, &zero, seed | 1);
    }
    /* splitmix64 over an atomic counter: distinct values across threads. */
    uint64_t z = atomic_fetch_add(&state, 0x9e3779b97f4a7c15ULL) + 0x9e3779b97f4a7c15ULL;
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
    return z ^ (z >> 31);
}

int ctl_backoff_ms(unsigned attempt)
{
    int64_t wait = CTL_BACKOFF_MIN_MS;
    for (unsigned i = 0; i < attempt && wait < CTL_BACKOFF_MAX_MS; i++)
        wait *= 2;
    if (wait > CTL_BACKOFF_MAX_MS)
        wait = CTL_BACKOFF_MAX_MS;
    int64_t half = wait / 2;
    return (int)(half + (int64_t)(ctl_directory_random() % (uint64_t)(wait - half + 1)));
}
