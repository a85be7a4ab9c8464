/*
 * copycount.h - the interface between ctl-bench and its copy-counting shim
 * (copycount.c, built as ctl-bench-copycount.so).
 *
 * The shim is preloaded (LD_PRELOAD) into a child run of ctl-bench. It
 * interposes memcpy, memmove, mempcpy, their _chk variants and realloc, and
 * while a window is open (ctl_copycount_begin .. ctl_copycount_end) it
 * counts every copy of at least `min_bytes` bytes: how many bytes, by which
 * side (client or server, by thread id) and from where (the code that
 * called memcpy, found with dladdr on the return address). The bench sets
 * `min_bytes` to half the payload size, so each count is one copy of the
 * payload (or of most of it), and small copies of headers never count.
 *
 * Not counted: copies inside glibc that do not go through the dynamic
 * symbol (realloc's own move is counted by the realloc wrapper instead),
 * and the kernel's copies in send/recv, which a bare ZeroMQ echo pays too.
 *
 * The bench looks the functions up with dlsym(RTLD_DEFAULT, ...): when they
 * are absent, the shim is not loaded and nothing is counted.
 *
 * With CTL_COPYCOUNT_TRACE=1 in the environment, the shim also prints one
 * line per counted copy on stderr: side, size, and the calling object and
 * nearest exported symbol (map a bare offset onto `nm -n ctl-bench`).
 */
#ifndef CTL_BENCH_COPYCOUNT_H
#define CTL_BENCH_COPYCOUNT_H

#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

/* Sides: threads default to the client side; the bench registers the
 * threads of its in-process servers as the server side. */
enum { CC_CLIENT = 0, CC_SERVER = 1, CC_SIDES = 2 };

/* Where a copy was made. */
enum {
    CC_RPC = 0,   /* our code in the executable: runtime, generated stubs */
    CC_APP,       /* code the bench tagged as the application (the store) */
    CC_MSGPACK,   /* libmsgpackc */
    CC_ZMQ,       /* libzmq */
    CC_OTHER,     /* anything else (libstdc++, libc through its PLT, ...) */
    CC_ORIGINS
};

typedef struct cc_result {
    uint64_t bytes[CC_SIDES][CC_ORIGINS];
    uint64_t copies[CC_SIDES][CC_ORIGINS];
} cc_result;

/* Open a counting window: from now on copies of >= min_bytes count.
 * `exe_addr` is any address inside the executable (to tell our code from
 * the libraries). Clears the counters. */
typedef void (*cc_begin_fn)(size_t min_bytes, const void *exe_addr);
/* Close the window and store the counts in *out. */
typedef void (*cc_end_fn)(cc_result *out);
/* Put thread `tid` on `side`. */
typedef void (*cc_side_fn)(pid_t tid, int side);
/* Tag the calling thread's copies as the application's (1) or not (0). */
typedef void (*cc_tag_fn)(int app);

#define CC_BEGIN_SYM "ctl_copycount_begin"
#define CC_END_SYM "ctl_copycount_end"
#define CC_SIDE_SYM "ctl_copycount_side"
#define CC_TAG_SYM "ctl_copycount_tag"

#endif /* CTL_BENCH_COPYCOUNT_H */
