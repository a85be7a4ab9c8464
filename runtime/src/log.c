/*
 * log.c - the runtime's log (ctlrpc/log.h) and the rate limit of repeated
 * events (log_int.h).
 */
#include "ctlrpc/log.h"

#include <errno.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdio.h>
#include <string.h>
#include <strings.h>
#include <time.h>
#include <unistd.h>

#include "log_int.h"

#define LINE_MAX_BYTES 1100
#define MSG_MAX_BYTES 1000

static atomic_int log_level = CTL_LOG_DEFAULT;
/* Serializes the sink's calls (one line at a time) and guards sink_fn and
 * sink_ctx. A sink runs under it; `in_sink` says this thread is in one, so
 * a line the sink logs itself goes to stderr instead of waiting for the
 * lock this thread holds, and ctl_log_set_sink called from a sink sets
 * the sink without taking it again. */
static pthread_mutex_t sink_lock = PTHREAD_MUTEX_INITIALIZER;
static ctl_log_fn sink_fn;
static void *sink_ctx;
static _Thread_local bool in_sink;

static const char *const level_names[] = {"error", "warn", "info", "debug"};

void ctl_log_set_level(ctl_log_level level)
{
    if (level < CTL_LOG_ERROR)
        level = CTL_LOG_ERROR;
    if (level > CTL_LOG_DEBUG)
        level = CTL_LOG_DEBUG;
    atomic_store_explicit(&log_level, (int)level, memory_order_relaxed);
}

ctl_log_level ctl_log_get_level(void)
{
    return (ctl_log_level)atomic_load_explicit(&log_level, memory_order_relaxed);
}

bool ctl_log_enabled(ctl_log_level level)
{
    return (int)level <= atomic_load_explicit(&log_level, memory_order_relaxed);
}

void ctl_log_set_sink(ctl_log_fn fn, void *ctx)
{
    if (in_sink) { /* this thread holds sink_lock: it is in the sink */
        sink_fn = fn;
        sink_ctx = ctx;
        return;
    }
    pthread_mutex_lock(&sink_lock);
    sink_fn = fn;
    sink_ctx = ctx;
    pthread_mutex_unlock(&sink_lock);
}

/* One write of `len` bytes to stderr (lines of threads and processes
 * sharing it do not interleave). */
static void write_stderr(const char *line, size_t len)
{
    ssize_t w;
    size_t off = 0;
    while (off < len && ((w = write(STDERR_FILENO, line + off, len - off)) > 0 ||
                         (w < 0 && errno == EINTR)))
        off += w > 0 ? (size_t)w : 0;
}

int ctl_log_level_parse(const char *name, ctl_log_level *out)
{
    for (int i = CTL_LOG_ERROR; name && i <= CTL_LOG_DEBUG; i++) {
        if (strcasecmp(name, level_names[i]) == 0) {
            *out = (ctl_log_level)i;
            return 0;
        }
    }
    if (name && strcasecmp(name, "warning") == 0) {
        *out = CTL_LOG_WARN;
        return 0;
    }
    return CTL_INVALID;
}

const char *ctl_log_level_name(ctl_log_level level)
{
    return level >= CTL_LOG_ERROR && level <= CTL_LOG_DEBUG ? level_names[level] : "?";
}

void ctl_log(ctl_log_level level, const char *component, const char *fmt, ...)
{
    char line[LINE_MAX_BYTES];
    struct timespec ts;
    struct tm tm;
    if (!ctl_log_enabled(level))
        return;
    clock_gettime(CLOCK_REALTIME, &ts);
    gmtime_r(&ts.tv_sec, &tm);
    int n = snprintf(line, sizeof line, "%04d-%02d-%02dT%02d:%02d:%02d.%03ldZ %s %s: ",
                     tm.tm_year + 1900, tm.tm_mon + 1, tm.tm_mday, tm.tm_hour,
                     tm.tm_min, tm.tm_sec, ts.tv_nsec / 1000000L,
                     ctl_log_level_name(level), component && *component ? component : "ctlrpc");
    if (n < 0 || (size_t)n >= sizeof line - MSG_MAX_BYTES)
        return;
    va_list ap;
    va_start(ap, fmt);
    int m = vsnprintf(line + n, MSG_MAX_BYTES, fmt, ap);
    va_end(ap);
    if (m < 0)
        return;
    size_t len = (size_t)n + ((size_t)m < MSG_MAX_BYTES ? (size_t)m : MSG_MAX_BYTES - 1);
    for (size_t i = (size_t)n; i < len; i++)
        if (line[i] == '\n' || line[i] == '\r')
            line[i] = ' ';
    if (in_sink) {
        /* Logged from inside the sink: to stderr, not to the sink again
         * (it would wait for the lock this thread holds). */
        line[len] = '\n';
        write_stderr(line, len + 1);
        return;
    }
    pthread_mutex_lock(&sink_lock);
    if (sink_fn) {
        line[len] = '\0';
        in_sink = true;
        sink_fn(sink_ctx, level, line);
        in_sink = false;
    } else {
        line[len] = '\n';
        write_stderr(line, len + 1);
    }
    pthread_mutex_unlock(&sink_lock);
}

bool ctl_log_limit_pass(ctl_log_limit *l, int64_t now_ms, uint64_t *suppressed)
{
    if (now_ms < l->next_ms) {
        l->suppressed++;
        return false;
    }
    *suppressed = l->suppressed;
    l->suppressed = 0;
    l->next_ms = now_ms + CTL_LOG_LIMIT_MS;
    return true;
}
