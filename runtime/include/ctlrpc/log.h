/*
 * ctlrpc/log.h - the runtime's log: one line per event, leveled.
 *
 * What a unit has to tell its operator (a connection it cannot accept, a
 * refused CURVE handshake, a request it dropped, a reply it could not
 * send) is written as one line:
 *
 *   2025-01-31T09:15:02.417Z warn server: tcp://10.0.0.5:4100: cannot accept ...
 *
 * the time (UTC, milliseconds), the level, the component and the message
 * (docs/OPERATIONS.md, "Logs"). Lines go to stderr, each with one write,
 * or to a sink of the program's own. The level is process-wide; the
 * default, CTL_LOG_WARN, is quiet: errors and warnings only.
 *
 * Threading: every function may be called from any thread. Set the sink
 * before starting servers (a line being written when it changes goes to
 * the old sink or the new one, whole).
 */
#ifndef CTLRPC_LOG_H
#define CTLRPC_LOG_H

#include <stdbool.h>

#include "ctlrpc/export.h"
#include "ctlrpc/error.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Levels, most severe first: a line is written when its level is at most
 * the one set. */
typedef enum ctl_log_level {
    CTL_LOG_ERROR = 0, /* the unit cannot go on as asked */
    CTL_LOG_WARN = 1,  /* something is refused or lost: the operator should look */
    CTL_LOG_INFO = 2,  /* lifecycle and peers' doings worth a line */
    CTL_LOG_DEBUG = 3  /* every dropped message and disconnect */
} ctl_log_level;

#define CTL_LOG_DEFAULT CTL_LOG_WARN

/* A sink: receives each line that passes the level, without its newline
 * (NUL-terminated), one call per line, never two at once (calls are
 * serialized by a lock of the log's, held while the sink runs). A sink may
 * call ctl_log: that line goes to stderr, not to the sink again, and
 * nothing deadlocks; it may call ctl_log_set_sink (the new sink takes the
 * next line). What a sink must not do is wait for another thread that is
 * logging at that moment (a lock of its own that such a thread holds while
 * it calls ctl_log, or joining it): that thread waits for the sink. Called
 * on the thread that logs, which may be a unit's serving, monitor or ZAP
 * thread: a slow sink slows them. */
typedef void (*ctl_log_fn)(void *ctx, ctl_log_level level, const char *line);

CTL_API void ctl_log_set_level(ctl_log_level level);
CTL_API ctl_log_level ctl_log_get_level(void);
/* Whether a line of `level` would be written. */
CTL_API bool ctl_log_enabled(ctl_log_level level);

/* Send lines to `fn` (with `ctx`) instead of stderr; NULL: stderr again. */
CTL_API void ctl_log_set_sink(ctl_log_fn fn, void *ctx);

/* "error", "warn", "info" or "debug" (also "warning"), any case. Returns 0,
 * or CTL_INVALID for anything else (out untouched). */
CTL_API int ctl_log_level_parse(const char *name, ctl_log_level *out);
/* "error", "warn", "info", "debug" ("?" for anything else). */
CTL_API const char *ctl_log_level_name(ctl_log_level level);

/* Write one line: `component` is one word ("server", "ctl-storage-unit");
 * the message is cut at 1000 bytes and any newline in it becomes a space,
 * so one event is always one line. */
CTL_API void ctl_log(ctl_log_level level, const char *component, const char *fmt, ...)
    CTL_PRINTF(3, 4);

#ifdef __cplusplus
}
#endif

#endif /* CTLRPC_LOG_H */
