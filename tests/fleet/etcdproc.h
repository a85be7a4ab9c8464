/*
 * etcdproc.h - a private etcd server for the fleet tests, and unit
 * processes started with any arguments.
 *
 * Each etcd listens on 127.0.0.1 on two free ports (client, peer) with a
 * data directory of its own under a temporary directory; it is stopped by
 * its pid (never the packaged service on 2379), dies with the test process
 * (PR_SET_PDEATHSIG), and can be frozen (SIGSTOP), thawed, restarted on
 * the same ports with the same or an empty data directory, served over
 * https with a CA the harness makes (openssl), and given a user with a
 * password (etcdctl). Every wait is bounded.
 *
 * Threading: an ep_etcd and an ep_unit belong to the thread that made
 * them.
 */
#ifndef CTLRPC_ETCDPROC_H
#define CTLRPC_ETCDPROC_H

#include <stdbool.h>
#include <stddef.h>
#include <sys/types.h>

typedef struct ep_etcd {
    pid_t pid;
    char dir[256];      /* the temporary directory (data, log, certs) */
    int client_port, peer_port;
    bool tls;
    char url[128];      /* http(s)://127.0.0.1:<client_port> */
    char cacert[300];   /* with tls: the CA's certificate */
    char client_cert[300], client_key[300]; /* with client_auth: a pair the CA signed */
    bool client_auth;   /* https that asks for a client certificate */
    int token_ttl_s;    /* etcd's --auth-token-ttl (0: its default) */
    char log[300];
} ep_etcd;

typedef struct ep_options {
    bool tls;
    bool client_auth; /* with tls */
    int token_ttl_s;
} ep_options;

/* Start an etcd (tls: https with a new CA and a server certificate for
 * 127.0.0.1) and wait up to `timeout_ms` until it answers. 0, or -1 with
 * a message on stderr (and the server gone). */
int ep_start(ep_etcd *e, bool tls, int timeout_ms);
/* The same with more options. */
int ep_start_with(ep_etcd *e, const ep_options *o, int timeout_ms);
/* SIGTERM, reap (SIGKILL after 5 s). Keeps the directory. */
void ep_stop(ep_etcd *e);
/* Stop, and remove the temporary directory. */
void ep_destroy(ep_etcd *e);
/* Start again on the same ports, on the same data (wipe false) or an
 * empty data directory. */
int ep_restart(ep_etcd *e, bool wipe, int timeout_ms);
int ep_freeze(ep_etcd *e);
int ep_thaw(ep_etcd *e);

/* Run etcdctl against it with the given arguments (NULL-terminated), with
 * a deadline of 10 s; its stdout into `out` (may be NULL). Exit status,
 * or -1. */
int ep_etcdctl(ep_etcd *e, char *out, size_t outlen, const char *arg, ...);

/* A unit process: argv[0] is the program; its first line of stdout is
 * read as its endpoint. */
typedef struct ep_unit {
    pid_t pid;
    int out_fd;
    char endpoint[300];
} ep_unit;

int ep_unit_start(ep_unit *u, const char *const *argv, int timeout_ms);
/* The same, with the unit's stderr written to the file `err_path`
 * (created or truncated) instead of the test's. */
int ep_unit_start_err(ep_unit *u, const char *const *argv, const char *err_path,
                      int timeout_ms);
/* SIGKILL and reap. */
void ep_unit_kill(ep_unit *u);
/* SIGTERM and reap within `timeout_ms` (then SIGKILL). Exit status or -1. */
int ep_unit_stop(ep_unit *u, int timeout_ms);
/* Send a signal without reaping. */
void ep_unit_signal(ep_unit *u, int sig);
/* Reap within `timeout_ms`: exit status, or -1 (still running). */
int ep_unit_wait(ep_unit *u, int timeout_ms);

/* Run a program (NULL-terminated argv) with a deadline; its stdout into
 * `out` (may be NULL). Exit status, or -1. */
int ep_run(char *out, size_t outlen, int timeout_ms, const char *const *argv);

/* A free TCP port on 127.0.0.1 (bound, then closed: nothing listens on
 * it). */
int ep_free_port(void);

/* Monotonic milliseconds; sleep a little (for polling loops with a
 * deadline). */
long long ep_now_ms(void);
void ep_sleep_ms(int ms);

/* A TCP forwarder to an etcd (to cut a directory off without touching
 * etcd): listens on 127.0.0.1:<port>; while paused it closes every
 * connection and refuses new ones (accepts and closes them). */
typedef struct ep_proxy ep_proxy;
ep_proxy *ep_proxy_new(int target_port);
const char *ep_proxy_url(const ep_proxy *p); /* http://127.0.0.1:<port> */
void ep_proxy_pause(ep_proxy *p, bool paused);
/* How many connections it has accepted and closed at once while paused:
 * with a paused proxy as a program's etcd, one per call the program
 * tried. */
int ep_proxy_refused(ep_proxy *p);
void ep_proxy_destroy(ep_proxy **p);

#endif
