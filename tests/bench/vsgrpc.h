/*
 * vsgrpc.h - ctl-bench --vs-grpc: ctlrpc beside gRPC C++ (vsgrpc.c;
 * docs/PERFORMANCE.md, "Against gRPC").
 */
#ifndef CTL_BENCH_VSGRPC_H
#define CTL_BENCH_VSGRPC_H

typedef struct vs_grpc_options {
    int quick;            /* a smoke run: a few hundred calls a side */
    int rounds;           /* 0: 5 (quick: 1) */
    double seconds;       /* one trial; 0: 1 s */
    const char *grpc_dir; /* where ctl-bench-grpc-server and -load are; NULL: beside ctl-bench */
    const char *unit;     /* the ctl-storage-unit program; NULL: this build's */
    int per_thread_channels; /* gRPC: a channel per client thread, not one shared */
} vs_grpc_options;

/* Run the comparison and print its table. Returns the exit status: 0 when
 * every side answered every call, 1 when one failed, 2 when the gRPC
 * programs are not there (after saying so). */
int vs_grpc_main(const vs_grpc_options *o, int argc, char **argv);

/* ctl-bench --vs-grpc-echo-child: the floor's raw TCP and ZeroMQ echo
 * servers; prints "<ZeroMQ endpoint> <TCP port>" and serves until SIGTERM. */
int vs_grpc_echo_child(void);

#endif /* CTL_BENCH_VSGRPC_H */
