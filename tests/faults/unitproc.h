/*
 * unitproc.h - real ctl-storage-unit processes for the fault and soak
 * tests: start one (fork/exec, as a user starts it) and read the endpoint
 * it prints, freeze and thaw it (SIGSTOP/SIGCONT), kill it (SIGKILL),
 * restart it on the same endpoint, stop it (SIGTERM), and read the open
 * file descriptors and resident memory of it or of this process.
 *
 * Units bind 127.0.0.1 only. Each unit dies with the test process
 * (PR_SET_PDEATHSIG), so a failed test leaves nothing behind. Every wait
 * is bounded.
 *
 * Threading: a up_unit belongs to the thread that started it.
 */
#ifndef CTLRPC_UNITPROC_H
#define CTLRPC_UNITPROC_H

#include <stddef.h>
#include <sys/types.h>

#include "ctlrpc/net.h"

#define UP_MAX_EXTRA 4

typedef struct up_unit {
    pid_t pid;    /* 0 when not running */
    int out_fd;   /* its stdout; -1 when not running */
    int frozen;
    char endpoint[CTL_ENDPOINT_MAX]; /* as it printed it */
    /* More arguments for the unit's command line (NULL-terminated unless
     * all UP_MAX_EXTRA are used), set before up_start. */
    const char *extra[UP_MAX_EXTRA];
} up_unit;

/* Start `bin` bound to `bind` (NULL: tcp://127.0.0.1:0) with `capacity`
 * (e.g. "64M"; NULL: the unit's default) and wait up to `timeout_ms` for
 * its endpoint. Binding an endpoint a killed unit held can fail for a
 * moment; this retries until the deadline. Returns 0, or -1 with a message
 * on stderr. */
int up_start(up_unit *u, const char *bin, const char *bind,
             const char *capacity, int timeout_ms);

/* SIGSTOP and wait until every thread of the unit has stopped (kill()
 * returns before that). */
int up_freeze(up_unit *u);
/* SIGCONT and wait until it runs again. */
int up_thaw(up_unit *u);
/* SIGKILL and reap. */
void up_kill(up_unit *u);
/* SIGTERM (after SIGCONT if frozen) and reap within `timeout_ms`, killing
 * it if it does not exit. Returns its exit status, or -1. */
int up_stop(up_unit *u, int timeout_ms);

/* Open file descriptors of `pid` (0: this process). -1 on failure. */
int up_count_fds(pid_t pid);
/* Resident memory of `pid` (0: this process) in KiB. 0 on failure. */
size_t up_rss_kib(pid_t pid);

/* 1 in a build under AddressSanitizer or ThreadSanitizer, whose own memory
 * (shadow, quarantine, history) makes a process's RSS say little about
 * the program's: tests report RSS there but do not judge it. */
#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__)
#define UP_SANITIZED 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer) || __has_feature(thread_sanitizer)
#define UP_SANITIZED 1
#endif
#endif
#ifndef UP_SANITIZED
#define UP_SANITIZED 0
#endif

#endif /* CTLRPC_UNITPROC_H */
