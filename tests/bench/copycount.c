/*
 * copycount.c - ctl-bench's copy-counting shim (see copycount.h).
 *
 * Preloaded into a child run of the bench, it sits in front of glibc's
 * memcpy family and realloc. Every call goes straight to the real function;
 * while a counting window is open, a call that copies at least `min_bytes`
 * bytes is also counted, by side (the thread's registered side) and by
 * origin (the object, executable or library, that made the call, from
 * dladdr on the return address; calls a thread makes while tagged as the
 * application count as the application's).
 *
 * realloc is counted when it moves a block of at least `min_bytes`: glibc
 * then copies the old contents internally, where the memcpy hook cannot
 * see it. (A block glibc got from mmap may move by mremap, without copying
 * bytes; such a move is still counted, so the figure is an upper bound.)
 *
 * Threading: counters are atomics, sides and tags are looked up per thread;
 * the window is opened and closed by one thread while the others run.
 *
 * This file is compiled with -fno-builtin and without loop-to-memcpy
 * conversion, so that nothing here turns back into a call to memcpy.
 */
#define _GNU_SOURCE
#undef _FORTIFY_SOURCE
#include "copycount.h"

#include <dlfcn.h>
#include <malloc.h>
#include <stdatomic.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/syscall.h>
#include <unistd.h>

/* The hooks this file defines (the public ones' prototypes come from
 * string.h and stdlib.h; these are the ones no header declares here). */
void *__memcpy_chk(void *dst, const void *src, size_t n, size_t dstlen);
void *__memmove_chk(void *dst, const void *src, size_t n, size_t dstlen);
void *__mempcpy_chk(void *dst, const void *src, size_t n, size_t dstlen);
void *realloc(void *ptr, size_t size);
void ctl_copycount_begin(size_t min_bytes, const void *exe_addr);
void ctl_copycount_end(cc_result *out);
void ctl_copycount_side(pid_t tid, int side);
void ctl_copycount_tag(int app);

typedef void *(*copy_fn)(void *, const void *, size_t);
typedef void *(*chk_fn)(void *, const void *, size_t, size_t);
typedef void *(*realloc_fn)(void *, size_t);

static copy_fn real_memcpy, real_memmove, real_mempcpy;
static chk_fn real_memcpy_chk, real_memmove_chk, real_mempcpy_chk;
static realloc_fn real_realloc;

static atomic_int active;
static int trace;
static size_t min_bytes = (size_t)-1;
static void *base_exe, *base_zmq, *base_msgpack;

#define MAX_TIDS 256
static pid_t side_tid[MAX_TIDS];
static int side_of[MAX_TIDS];
static atomic_int n_tids;

static _Atomic uint64_t bytes[CC_SIDES][CC_ORIGINS];
static _Atomic uint64_t copies[CC_SIDES][CC_ORIGINS];

static _Thread_local int thread_tag;
static _Thread_local int in_hook;

/* dlsym into a function pointer without the object-to-function pointer
 * conversion ISO C does not define. */
static void *next_sym(const char *name)
{
    return dlsym(RTLD_NEXT, name);
}

#define RESOLVE(var, type, name)                                              \
    do {                                                                      \
        if (!(var)) {                                                         \
            union { void *obj; type fn; } u_;                                 \
            u_.obj = next_sym(name);                                          \
            (var) = u_.fn;                                                    \
        }                                                                     \
    } while (0)

/* A plain byte copy for the moment before the real functions are known
 * (dlsym itself may copy). Volatile so it is never turned into memcpy. */
static void *byte_copy(void *dst, const void *src, size_t n)
{
    volatile unsigned char *d = dst;
    const volatile unsigned char *s = src;
    if (d < s || d >= s + n) {
        for (size_t i = 0; i < n; i++)
            d[i] = s[i];
    } else {
        for (size_t i = n; i > 0; i--)
            d[i - 1] = s[i - 1];
    }
    return dst;
}

static int side_of_thread(void)
{
    pid_t tid = (pid_t)syscall(SYS_gettid);
    int n = atomic_load_explicit(&n_tids, memory_order_acquire);
    for (int i = 0; i < n && i < MAX_TIDS; i++)
        if (side_tid[i] == tid)
            return side_of[i];
    return CC_CLIENT;
}

static void *object_base(const void *addr)
{
    Dl_info info;
    if (!addr || !dladdr(addr, &info))
        return NULL;
    return info.dli_fbase;
}

static void count(size_t n, const void *caller)
{
    if (!atomic_load_explicit(&active, memory_order_acquire) || n < min_bytes ||
        in_hook)
        return;
    in_hook = 1;
    int origin = CC_OTHER;
    if (thread_tag) {
        origin = CC_APP;
    } else {
        void *base = object_base(caller);
        if (base && base == base_exe)
            origin = CC_RPC;
        else if (base && base == base_zmq)
            origin = CC_ZMQ;
        else if (base && base == base_msgpack)
            origin = CC_MSGPACK;
    }
    int side = side_of_thread();
    if (trace) {
        /* CTL_COPYCOUNT_TRACE=1: one line per counted copy on stderr. */
        Dl_info info;
        char line[256];
        int len;
        if (!dladdr(caller, &info))
            memset(&info, 0, sizeof info);
        len = snprintf(line, sizeof line, "copycount: %s %zu bytes from %s(%s+%#lx)\n",
                       side == CC_SERVER ? "server" : "client", n,
                       info.dli_fname ? info.dli_fname : "?",
                       info.dli_sname ? info.dli_sname : "",
                       (unsigned long)((const char *)caller -
                                       (const char *)(info.dli_saddr ? info.dli_saddr
                                                                     : info.dli_fbase)));
        if (len > 0 && write(2, line, (size_t)len < sizeof line ? (size_t)len : sizeof line - 1) < 0)
            trace = 0;
    }
    atomic_fetch_add_explicit(&bytes[side][origin], n, memory_order_relaxed);
    atomic_fetch_add_explicit(&copies[side][origin], 1, memory_order_relaxed);
    in_hook = 0;
}

/* Bootstrap guard: while resolving, copies fall back to byte_copy. */
static _Thread_local int resolving;

static copy_fn get_copy(copy_fn *slot, const char *name)
{
    if (!*slot && !resolving) {
        resolving = 1;
        union { void *obj; copy_fn fn; } u;
        u.obj = next_sym(name);
        *slot = u.fn;
        resolving = 0;
    }
    return *slot ? *slot : byte_copy;
}

void *memcpy(void *dst, const void *src, size_t n)
{
    count(n, __builtin_return_address(0));
    return get_copy(&real_memcpy, "memcpy")(dst, src, n);
}

void *memmove(void *dst, const void *src, size_t n)
{
    count(n, __builtin_return_address(0));
    return get_copy(&real_memmove, "memmove")(dst, src, n);
}

void *mempcpy(void *dst, const void *src, size_t n)
{
    count(n, __builtin_return_address(0));
    copy_fn f = get_copy(&real_mempcpy, "mempcpy");
    if (f == byte_copy)
        return (char *)byte_copy(dst, src, n) + n;
    return f(dst, src, n);
}

void *__memcpy_chk(void *dst, const void *src, size_t n, size_t dstlen)
{
    count(n, __builtin_return_address(0));
    RESOLVE(real_memcpy_chk, chk_fn, "__memcpy_chk");
    return real_memcpy_chk(dst, src, n, dstlen);
}

void *__memmove_chk(void *dst, const void *src, size_t n, size_t dstlen)
{
    count(n, __builtin_return_address(0));
    RESOLVE(real_memmove_chk, chk_fn, "__memmove_chk");
    return real_memmove_chk(dst, src, n, dstlen);
}

void *__mempcpy_chk(void *dst, const void *src, size_t n, size_t dstlen)
{
    count(n, __builtin_return_address(0));
    RESOLVE(real_mempcpy_chk, chk_fn, "__mempcpy_chk");
    return real_mempcpy_chk(dst, src, n, dstlen);
}

void *realloc(void *ptr, size_t size)
{
    RESOLVE(real_realloc, realloc_fn, "realloc");
    size_t old = ptr ? malloc_usable_size(ptr) : 0;
    void *out = real_realloc(ptr, size);
    if (out && ptr && out != ptr)
        count(old < size ? old : size, __builtin_return_address(0));
    return out;
}

void ctl_copycount_begin(size_t min, const void *exe_addr)
{
    atomic_store_explicit(&active, 0, memory_order_release);
    for (int s = 0; s < CC_SIDES; s++)
        for (int o = 0; o < CC_ORIGINS; o++) {
            atomic_store(&bytes[s][o], 0);
            atomic_store(&copies[s][o], 0);
        }
    base_exe = object_base(exe_addr);
    base_zmq = object_base(dlsym(RTLD_DEFAULT, "zmq_msg_send"));
    base_msgpack = object_base(dlsym(RTLD_DEFAULT, "msgpack_zone_init"));
    min_bytes = min ? min : 1;
    const char *t = getenv("CTL_COPYCOUNT_TRACE");
    trace = t && *t && *t != '0';
    atomic_store_explicit(&active, 1, memory_order_release);
}

void ctl_copycount_end(cc_result *out)
{
    atomic_store_explicit(&active, 0, memory_order_release);
    for (int s = 0; s < CC_SIDES; s++)
        for (int o = 0; o < CC_ORIGINS; o++) {
            out->bytes[s][o] = atomic_load(&bytes[s][o]);
            out->copies[s][o] = atomic_load(&copies[s][o]);
        }
}

void ctl_copycount_side(pid_t tid, int side)
{
    int n = atomic_load(&n_tids);
    for (int i = 0; i < n; i++) {
        if (side_tid[i] == tid) {
            side_of[i] = side;
            return;
        }
    }
    if (n >= MAX_TIDS)
        return;
    side_tid[n] = tid;
    side_of[n] = side;
    atomic_store_explicit(&n_tids, n + 1, memory_order_release);
}

void ctl_copycount_tag(int app)
{
    thread_tag = app;
}
