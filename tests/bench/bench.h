/*
 * bench.h - what ctl-bench's cases stand on: the servers they measure (an
 * in-process storage unit, a bare ZeroMQ echo server, a unit in another
 * process), CPU time read from /proc, and the copy-counting hooks.
 *
 * Server CPU is measured the same way for every server: the utime+stime
 * (from /proc/self/task/<tid>/stat) of every thread the server brought with
 * it, i.e. its serving thread plus its ZeroMQ context's I/O and reaper
 * threads (each in-process server owns its context, as a unit process
 * would), or, for a unit in another process, the whole process's
 * (/proc/<pid>/stat). Ticks are USER_HZ (10 ms here), so a trial must run
 * for seconds for the figure to mean much.
 *
 * Threading: a bench_unit or bench_echo is started and stopped by the main
 * thread; any thread may call it in between.
 */
#ifndef CTL_BENCH_H
#define CTL_BENCH_H

#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

#include "copycount.h"
#include "handlers.h"
#include "storage.ctl.h"

#define BENCH_ENDPOINT_MAX 128

/* ---- threads and CPU ------------------------------------------------- */

/* The threads a server started (its own thread and its ZeroMQ context's). */
typedef struct tidset {
    pid_t tids[16];
    size_t n;
} tidset;

/* The ids of this process's threads now, into `out` (up to `max`). */
size_t tids_now(pid_t *out, size_t max);

/* The threads in `after` that are not in `before`, into `out`. */
void tids_new(const pid_t *before, size_t n_before, const pid_t *after,
              size_t n_after, tidset *out);

/* utime+stime, in ticks, summed over the threads of `set` / of process
 * `pid` (0 when it cannot be read). */
uint64_t tidset_cpu_ticks(const tidset *set);
uint64_t pid_cpu_ticks(pid_t pid);

/* Seconds per tick (1 / sysconf(_SC_CLK_TCK)). */
double cpu_tick_seconds(void);

/* Monotonic clock, in nanoseconds / seconds. */
/* ---- what ctl-bench and ctl-scale share -------------------------------- */

/* The rounds a case may run (--rounds). */
#define BENCH_MAX_ROUNDS 101

/* Messages on stderr, "<bench_prog>: ..." (the program sets bench_prog);
 * bench_fail also sets bench_failed, which makes the program exit 1. */
extern const char *bench_prog;
extern int bench_failed;
void bench_progress(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
void bench_fail(const char *fmt, ...) __attribute__((format(printf, 1, 2)));

/* qsort comparators, and the median of n <= BENCH_MAX_ROUNDS values. */
int bench_cmp_double(const void *a, const void *b);
int bench_cmp_u64(const void *a, const void *b);
double bench_median(const double *v, int n);

/* --case: a comma-separated list of names, each OR-ing its bit into *out.
 * -1 (after saying which) on a name not in `names`. */
typedef struct bench_case_name {
    const char *name;
    unsigned bit;
} bench_case_name;
int bench_parse_cases(const char *text, const bench_case_name *names, size_t count,
                      unsigned *out);

uint64_t now_ns(void);
double now_s(void);

/* ---- the in-process storage unit --------------------------------------- */

/* A storage unit served in this process by storage_serve with the storage
 * service's handlers and store (examples/storage/handlers.c, store.c), as
 * ctl-storage-unit serves them. */
typedef struct bench_unit bench_unit;

/* Start a unit bound to tcp://127.0.0.1:* with `capacity` bytes. 0, or -1
 * with `why` filled. */
int bench_unit_start(uint64_t capacity, bench_unit **out, char *why,
                     size_t why_len);
/* The same in a ZeroMQ context that the caller owns and terminates after
 * stopping the unit (NULL: one of the unit's own, as above); such a unit
 * polls its socket rather than blocking in the receive (server.c). */
int bench_unit_start_in(uint64_t capacity, void *zmq_context, bench_unit **out,
                        char *why, size_t why_len);
const char *bench_unit_endpoint(const bench_unit *u);
const tidset *bench_unit_threads(const bench_unit *u);
/* The unit's store, server and lock: take the lock to use the store
 * directly while the unit serves. */
storage_unit *bench_unit_storage(bench_unit *u);
/* Stop and free; accepts NULL and a pointer to NULL. */
void bench_unit_stop(bench_unit **u);

/* ---- the bare echo server -------------------------------------------- */

/* A ROUTER on its own thread (and its own ZeroMQ context) that sends every
 * message it gets straight back, frames and all, without looking inside:
 * the floor a request/reply over ZeroMQ cannot go below. */
typedef struct bench_echo bench_echo;

int bench_echo_start(bench_echo **out, char *why, size_t why_len);

/* The same server in "keeper" mode, the floor of a put then a get over
 * bare ZeroMQ: a payload of 64 bytes or more is kept (the message itself,
 * no copy) and answered with 1 byte; a smaller one is answered with the
 * kept payload (a reference to the same message, no copy). */
int bench_echo_start_mode(int keeper, bench_echo **out, char *why, size_t why_len);
const char *bench_echo_endpoint(const bench_echo *e);
const tidset *bench_echo_threads(const bench_echo *e);
void bench_echo_stop(bench_echo **e);

/* ---- programs ---------------------------------------------------------- */

/* A server in another process that prints its endpoint on the first line
 * of its stdout (ctl-storage-unit, pyunit.py). */
typedef struct bench_proc {
    pid_t pid;
    int out_fd;
    char endpoint[BENCH_ENDPOINT_MAX];
} bench_proc;

/* Start argv[0] (a path) with argv and wait up to `timeout_ms` for its
 * endpoint line. 0, or -1 with `why` filled (including what the program
 * printed). */
int bench_proc_start(bench_proc *p, char *const argv[], int timeout_ms,
                     char *why, size_t why_len);
/* SIGTERM, wait (SIGKILL after 5 s). */
void bench_proc_stop(bench_proc *p);

/* Run argv[0] with argv and environment `envp` (NULL: this process's) to
 * completion, its stdout and stderr going to `log_path`; stores the wall
 * time in *seconds. 0 when it exited 0, else -1 with `why` filled. */
int bench_run(char *const argv[], char *const envp[], const char *log_path,
              double *seconds, char *why, size_t why_len);

/* ---- copy counting ------------------------------------------------------ */

/* The shim's functions when it is preloaded, else all NULL. */
typedef struct cc_hooks {
    cc_begin_fn begin;
    cc_end_fn end;
    cc_side_fn side;
    cc_tag_fn tag;
} cc_hooks;

extern cc_hooks bench_cc;

/* Look the shim up (once, from main). */
void bench_cc_init(void);

#endif /* CTL_BENCH_H */
