/*
 * log_int.h - the rate limit of a repeated event's log lines (internal to
 * libctlrpc).
 *
 * Some events come in bursts: libzmq retries an accept() that failed for
 * want of file descriptors at once, and a client that is refused a CURVE
 * handshake reconnects every 100 ms. Such an event is logged at most once
 * a second, the next line saying how many were not logged in between (they
 * are all counted in the server's stats).
 */
#ifndef CTLRPC_LOG_INT_H
#define CTLRPC_LOG_INT_H

#include <stdbool.h>
#include <stdint.h>

#include "ctlrpc/log.h"

#define CTL_LOG_LIMIT_MS 1000

/* How a limited line ends when some of its kind were left out (the count,
 * unsigned long long). Each kind of line has a limiter of its own, so the
 * count is of the events the line names, since the last such line. */
#define CTL_LOG_LEFT_OUT_FMT " (%llu more like this since the last such line)"

/* One kind of event; zero-initialized. Used by one thread, or under a
 * lock. */
typedef struct ctl_log_limit {
    int64_t next_ms;
    uint64_t suppressed;
} ctl_log_limit;

/* Whether to log this occurrence (at monotonic time `now_ms`); when it
 * does, *suppressed is how many were not logged since the last one. */
bool ctl_log_limit_pass(ctl_log_limit *l, int64_t now_ms, uint64_t *suppressed);

#endif /* CTLRPC_LOG_INT_H */
