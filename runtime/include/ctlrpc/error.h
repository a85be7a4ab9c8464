/*
 * ctlrpc/error.h - error kinds and the error object every call fills in.
 *
 * Every fallible function in libctlrpc returns 0 on success or a negative
 * ctl_kind, and fills a caller-owned ctl_error with the details. The kinds
 * are the ones of the wire (docs/PROTOCOL.md, "Errors") plus two that never
 * cross it:
 *
 *   CTL_UNIT_FULL  remote "UnitFull": a put did not fit.
 *   CTL_BUSY       remote "Busy": retry later; `reason` says why.
 *   CTL_MISSING    remote "Missing": `blobs` lists the ids the unit lacks.
 *   CTL_PROTOCOL   "Protocol": raised by server handlers for any other
 *                  failure. A client never reports it: a remote Protocol
 *                  error arrives as CTL_TRANSFER with cause CTL_CAUSE_REMOTE.
 *   CTL_TRANSFER   the call did not complete: see `cause`.
 *   CTL_INVALID    the caller passed something unusable (a bad endpoint, a
 *                  NULL argument); never caused by a peer.
 *   CTL_DECLARED   an error kind the service declares in its IDL
 *                  (`error NotFound;`) and the op lists in `raises`: its
 *                  name is `remote_kind`, its generated constant `code`,
 *                  with an optional `reason`. On the wire it travels under
 *                  its own name (docs/PROTOCOL.md, "Errors"); a peer that
 *                  does not know it sees a Protocol error.
 *
 * The kind list is one X-macro (CTL_KIND_MAP) that yields the enum, the wire
 * names and the descriptions, so they cannot drift apart.
 *
 * Threading: a ctl_error belongs to one thread at a time; the functions here
 * are reentrant and keep no static state.
 */
#ifndef CTLRPC_ERROR_H
#define CTLRPC_ERROR_H

#include <stdarg.h>
#include <stddef.h>

#include "ctlrpc/codec.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Marks printf-style functions so the compiler checks their formats. */
#if defined(__GNUC__)
#define CTL_PRINTF(fmt_arg, first_arg)                                        \
    __attribute__((format(printf, fmt_arg, first_arg)))
#else
#define CTL_PRINTF(fmt_arg, first_arg)
#endif

/* X(ENUM, value, wire name, description). Wire names are what the error
 * map's "kind" carries; kinds that never cross the wire still have a name
 * for messages and logs. */
#define CTL_KIND_MAP(X)                                                       \
    X(OK, 0, "OK", "success")                                                 \
    X(UNIT_FULL, -1, "UnitFull", "the unit has no room for the data")         \
    X(BUSY, -2, "Busy", "the unit is busy; retry later")                      \
    X(MISSING, -3, "Missing", "the unit no longer has some blobs")            \
    X(PROTOCOL, -4, "Protocol", "the request could not be served")            \
    X(TRANSFER, -5, "Transfer", "the call did not complete")                  \
    X(INVALID, -6, "Invalid", "invalid argument")                             \
    X(DECLARED, -7, "Declared", "an error kind the service declares")

typedef enum ctl_kind {
#define CTL_KIND_ENUM_(name, value, wire, desc) CTL_##name = value,
    CTL_KIND_MAP(CTL_KIND_ENUM_)
#undef CTL_KIND_ENUM_
} ctl_kind;

/* Why a call ended in CTL_TRANSFER. REFUSED, UNRESOLVED and AUTH are found
 * while a call waits, from the events of its socket's connection, and end
 * the call well before its deadline (docs/API.md, "Failures that end a call
 * early"); TRANSPORT is any other failure of the transport. */
#define CTL_CAUSE_MAP(X)                                                      \
    X(NONE, "none", "no transfer failure")                                    \
    X(REMOTE, "remote", "the unit answered with a Protocol error")            \
    X(TIMEOUT, "timeout", "no complete reply within the deadline")            \
    X(TRANSPORT, "transport", "the transport failed")                         \
    X(BAD_REPLY, "bad-reply", "the reply could not be decoded")               \
    X(NOMEM, "nomem", "out of memory")                                        \
    X(REFUSED, "refused", "the connection was refused (nothing listens)")     \
    X(UNRESOLVED, "unresolved", "the unit's host name does not resolve")      \
    X(AUTH, "auth", "the CURVE handshake failed (keys or allowlist)")         \
    X(TOO_LARGE, "too-large", "a message was larger than the size limit")     \
    X(CANCELLED, "cancelled", "the caller cancelled the call, or destroyed "  \
                              "its client")                                   \
    X(LIMIT, "limit", "the client had max_in_flight requests in flight")

typedef enum ctl_cause {
#define CTL_CAUSE_ENUM_(name, str, desc) CTL_CAUSE_##name,
    CTL_CAUSE_MAP(CTL_CAUSE_ENUM_)
#undef CTL_CAUSE_ENUM_
    CTL_CAUSE_COUNT /* the number of causes (not a cause) */
} ctl_cause;

/* The name of a kind as it travels on the wire ("UnitFull", ...), or
 * "Unknown" for a value outside the enum. Constant string. */
CTL_API const char *ctl_kind_name(int kind);

/* A one-line description of a kind. Constant string. */
CTL_API const char *ctl_strerror(int kind);

/* The kind whose wire name is exactly `name` (only the four built-in wire
 * kinds UnitFull, Busy, Missing and Protocol match), or CTL_OK when none
 * does (a declared kind travels under its own name). */
CTL_API ctl_kind ctl_kind_from_wire(ctl_str name);

/* The name of a cause ("timeout", ...). Constant string. */
CTL_API const char *ctl_cause_name(ctl_cause cause);

/*
 * The details of a failure. Caller-owned storage: ctl_error_init() before
 * first use, ctl_error_fini() when done; a function that fills it first
 * releases what it held, so one ctl_error can be reused across calls.
 * Every string is owned by the error, NUL-terminated, and valid until the
 * next fill or ctl_error_fini().
 */
typedef struct ctl_error {
    ctl_kind kind;     /* CTL_OK when nothing failed */
    ctl_cause cause;   /* for CTL_TRANSFER; else CTL_CAUSE_NONE */
    char *msg;         /* never NULL after a failure: names the address and op */
    char *reason;      /* CTL_BUSY: why (e.g. "pinned"); CTL_DECLARED and
                          CTL_CAUSE_REMOTE: the reason the unit sent, if
                          any; else NULL */
    ctl_str *blobs;    /* CTL_MISSING: the blob ids (each NUL-terminated too) */
    size_t blob_count; /* number of entries in `blobs` */
    char *remote_kind; /* CTL_CAUSE_REMOTE: the kind the unit sent
                          ("Protocol" or one the op does not declare);
                          CTL_DECLARED: the declared kind's name; else NULL */
    int code;          /* CTL_DECLARED: the kind's generated constant
                          (<SERVICE>_ERR_<Kind>, never 0); else 0 */
} ctl_error;

CTL_API void ctl_error_init(ctl_error *err);

/* Release everything the error owns and reset it to CTL_OK. Accepts NULL. */
CTL_API void ctl_error_fini(ctl_error *err);

/* Reset to CTL_OK, releasing what it held (same as fini then init). */
CTL_API void ctl_error_clear(ctl_error *err);

/*
 * Fill `err` (if not NULL) with `kind` and a printf-style message; returns
 * `kind` so that `return ctl_error_set(err, CTL_INVALID, ...)` reads well.
 * Busy reasons and Missing blobs are added with the functions below. If the
 * message cannot be allocated, `msg` points to a constant fallback text
 * (never NULL) and the kind is kept. Every setter builds the new error
 * before it releases the old one, so its arguments may point into `err`
 * itself: ctl_error_set(err, k, "ctx: %s", err->msg) wraps a message in
 * place, and so does passing err->reason or err->blobs to the functions
 * below.
 */
CTL_API int ctl_error_set(ctl_error *err, ctl_kind kind, const char *fmt, ...) CTL_PRINTF(3, 4);
CTL_API int ctl_error_setv(ctl_error *err, ctl_kind kind, const char *fmt, va_list ap) CTL_PRINTF(3, 0);

/* As ctl_error_set with kind CTL_TRANSFER and the given cause. */
CTL_API int ctl_error_transfer(ctl_error *err, ctl_cause cause, const char *fmt, ...) CTL_PRINTF(3, 4);

/* Set a Busy error with `reason` (copied; NULL allowed) and a message. */
CTL_API int ctl_error_busy(ctl_error *err, const char *reason, const char *fmt, ...) CTL_PRINTF(3, 4);
CTL_API int ctl_error_busyv(ctl_error *err, const char *reason, const char *fmt,
                    va_list ap) CTL_PRINTF(3, 0);

/* Set a declared error kind: `kind` its name as the IDL declares it
 * (copied), `code` its generated constant, `reason` optional (copied). */
CTL_API int ctl_error_declared(ctl_error *err, const char *kind, int code, const char *reason,
                               const char *fmt, ...) CTL_PRINTF(5, 6);
CTL_API int ctl_error_declaredv(ctl_error *err, const char *kind, int code,
                                const char *reason, const char *fmt, va_list ap)
    CTL_PRINTF(5, 0);

/* Set a Missing error naming `count` blob ids (copied) and a message. */
CTL_API int ctl_error_missing(ctl_error *err, const ctl_str *blobs, size_t count,
                      const char *fmt, ...) CTL_PRINTF(4, 5);
CTL_API int ctl_error_missingv(ctl_error *err, const ctl_str *blobs, size_t count,
                       const char *fmt, va_list ap) CTL_PRINTF(4, 0);

/* ctl_error_busy and ctl_error_missing keep their kind even when the reason
 * or the blob ids cannot be copied (out of memory): the error is still the
 * unit's answer. Its message then ends with "(details lost: out of
 * memory)" and `reason` / `blobs` are left empty. */

/*
 * Copy every field of `src` into `dst` (which must be initialised; its old
 * contents are released). Returns 0; or, when any part cannot be copied,
 * CTL_TRANSFER with `dst` holding a CTL_TRANSFER / CTL_CAUSE_NOMEM error
 * whose message names what was being copied (never a partial copy).
 */
CTL_API int ctl_error_copy(ctl_error *dst, const ctl_error *src);

#ifdef __cplusplus
}
#endif

#endif /* CTLRPC_ERROR_H */
