/*
 * job.h - the small job both asynchronous examples run, written once so
 * that the two programs differ only in their event loop.
 *
 * The job: store `calls` blobs of 64 bytes spread over the given units,
 * keeping up to `window` puts in flight from one thread, then read every
 * one back the same way and check its bytes. Every call is started with a
 * generated asynchronous stub (storage_put_start, storage_get_start); its
 * callback counts it and starts the next, so the window stays full until
 * the work runs out. The loop's only duties are to run the client's
 * queued completions when its event descriptor is readable
 * (ctl_client_process) and to give up at the job's deadline.
 */
#ifndef CTL_EXAMPLE_ASYNC_JOB_H
#define CTL_EXAMPLE_ASYNC_JOB_H

#include <stddef.h>
#include <stdint.h>

#include "storage.ctl.h"

typedef struct job {
    ctl_client *client;
    const char *const *addresses;
    size_t n_addresses;
    int calls;        /* blobs to put, then to get */
    int window;       /* most calls in flight */
    int phase;        /* 0: putting, 1: getting, 2: finished */
    int started, done, failed, in_flight, most_in_flight;
    char first_error[256];
} job;

/* Parse "[--calls N] [--window K] ADDRESS..." into `j` (addresses borrowed
 * from argv). Returns 0, or 2 after printing the usage to stderr. */
int job_args(job *j, int argc, char **argv, const char *program);

/* Start as many calls as the window allows. Call once to begin; the
 * callbacks call it again. */
void job_pump(job *j);

/* Whether the job is over (finished, or a call failed). */
int job_over(const job *j);

/* Print the summary; returns the exit status (0: every call succeeded). */
int job_report(const job *j, const char *loop, double seconds);

#endif
