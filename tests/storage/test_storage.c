/*
 * test_storage.c - the storage service end to end: the real ctl-storage-unit
 * binary (UNIT_BIN), started with fork/exec as a user starts it, called
 * through the generated stubs of idl/storage.idl (storage.ctl.h).
 *
 * Every op and every error kind is exercised: byte-exact put/get, the
 * capacity accounting, Busy "pinned", UnitFull, Missing naming exactly the
 * absent keys, the notify ops, list order, the stats counters (including
 * payloads dropped as malformed, sent with a raw DEALER), spilling to disk
 * with hostile keys, a unit frozen (timeout) or killed (SIGKILL) under a
 * live client, and a clean shutdown on SIGTERM.
 *
 * Each test owns a fixture: a fresh temporary directory, one unit (its
 * working directory is that temporary directory, so a path escaping the
 * spill directory would show up next to it) and one client. Units bind
 * tcp://127.0.0.1:0 and the test reads the endpoint they print as their
 * first line, so nothing waits on a guessed delay. Deadlines are generous:
 * a loaded 2-core machine under ASan must not flake them.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <ftw.h>
#include <limits.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/types.h>
#include <sys/wait.h>
#include <unistd.h>

#include <zmq.h>

#include "storage.ctl.h"
#include "store.h" /* STORE_BLOB_OVERHEAD */
#include "testutil.h"
#include "unitproc.h"

#ifndef UNIT_BIN
#error "UNIT_BIN (the path of ctl-storage-unit) must be defined"
#endif

/* The unit under test: UNIT_BIN, or the command in $CTL_UNIT_CMD (words
 * separated by spaces, e.g. "/usr/bin/python3 .../unit.py --module-dir DIR"),
 * to which the test appends its options. With $CTL_UNIT_IS_PYTHON set (to
 * anything but "" or "0"), the unit is the Python one (examples/storage/unit.py):
 * the index charges each blob PY_BLOB_OVERHEAD instead of the C store's
 * STORE_BLOB_OVERHEAD (so fewer blobs fit in an index: the million-blob
 * flood stores about 800 000, and "at least a million" is not asserted).
 * Everything else, RSS bounds included, is asserted alike (docs/PYTHON.md). */
#define UNIT_CMD_MAX_WORDS 16
static const char *unit_cmd[UNIT_CMD_MAX_WORDS + 1] = {UNIT_BIN, NULL};
static size_t unit_cmd_words = 1;
static bool unit_is_python = false;
/* What examples/storage/unit.py charges a blob beside its key (its
 * PY_BLOB_OVERHEAD: keep the two equal). */
#define PY_BLOB_OVERHEAD 320u
#define BLOB_OVERHEAD ((size_t)(unit_is_python ? PY_BLOB_OVERHEAD : STORE_BLOB_OVERHEAD))

static void unit_cmd_init(void)
{
    static char buf[4096];
    const char *cmd = getenv("CTL_UNIT_CMD");
    const char *py = getenv("CTL_UNIT_IS_PYTHON");
    unit_is_python = py && *py && strcmp(py, "0") != 0;
    if (!cmd || !*cmd)
        return;
    snprintf(buf, sizeof buf, "%s", cmd);
    unit_cmd_words = 0;
    for (char *save = NULL, *w = strtok_r(buf, " ", &save); w; w = strtok_r(NULL, " ", &save)) {
        if (unit_cmd_words == UNIT_CMD_MAX_WORDS) {
            fprintf(stderr, "CTL_UNIT_CMD has more than %d words\n", UNIT_CMD_MAX_WORDS);
            exit(2);
        }
        unit_cmd[unit_cmd_words++] = w;
    }
    unit_cmd[unit_cmd_words] = NULL;
    fprintf(stderr, "storage tests against: %s%s\n", cmd,
            unit_is_python ? " (a Python unit)" : "");
}

#define CALL_MS 10000   /* deadline for calls that must succeed */
#define START_MS 20000  /* how long a unit may take to print its endpoint */
#define STOP_MS 20000   /* how long a unit may take to exit after SIGTERM */
#define RAW_MS 5000     /* wait for a raw reply */

/* A ctl_str for a literal, NUL bytes included. */
#define S(lit) ((ctl_str){(lit), sizeof(lit) - 1})
#define N_OF(a) (sizeof(a) / sizeof((a)[0]))

typedef struct fx {
    pid_t pid;                       /* the unit; 0 when not running */
    int out_fd;                      /* the unit's stdout (kept open) */
    char endpoint[CTL_ENDPOINT_MAX]; /* as the unit printed it */
    char tmp[PATH_MAX];              /* fresh directory, removed at teardown */
    char spill[PATH_MAX + 8];        /* tmp/spill */
    ctl_client *client;
    ctl_error err;
    void *zctx; /* for raw sockets */
    const char *index; /* --index-capacity (NULL: 64M) */
    rlim_t fsize;      /* RLIMIT_FSIZE of the unit (0: unlimited) */
} fx;

/* ---- the unit process ------------------------------------------------ */

/* Start UNIT_BIN with `capacity` (text, e.g. "64M"), spilling to f->spill
 * if `spill`, bound to `bind` (NULL: tcp://127.0.0.1:0), and read the
 * endpoint it prints. Returns 0, or -1 (with a message on stderr). */
static int unit_start(fx *f, const char *capacity, bool spill, const char *bind)
{
    /* The command line, built before fork (nothing but async-signal-safe
     * calls after it). */
    const char *opts[] = {"--bind", bind ? bind : "tcp://127.0.0.1:0",
                          "--capacity", capacity, "--max-key-bytes", "16K",
                          "--index-capacity", f->index ? f->index : "64M",
                          "--max-list-keys", "20", "--drain-timeout", "1000",
                          spill ? "--spill-dir" : NULL, f->spill, NULL};
    const char *argv[UNIT_CMD_MAX_WORDS + sizeof opts / sizeof opts[0]];
    size_t argc = 0;
    for (size_t i = 0; i < unit_cmd_words; i++)
        argv[argc++] = unit_cmd[i];
    for (size_t i = 0; i < sizeof opts / sizeof opts[0]; i++)
        argv[argc++] = opts[i];
    int p[2];
    if (pipe2(p, O_CLOEXEC) != 0)
        return -1;
    pid_t pid = fork();
    if (pid < 0) {
        close(p[0]);
        close(p[1]);
        return -1;
    }
    if (pid == 0) {
        /* Only async-signal-safe calls between fork and exec. */
        /* Die with the test: an orphaned unit would hold ctest's pipes. */
        if (prctl(PR_SET_PDEATHSIG, SIGKILL) != 0 ||
            dup2(p[1], STDOUT_FILENO) < 0 || chdir(f->tmp) != 0)
            _exit(127);
        if (f->fsize) {
            /* Files may not grow past f->fsize: a write beyond fails with
             * EFBIG (SIGXFSZ ignored), as on a full or quota'd disk. */
            struct rlimit rl = {f->fsize, f->fsize};
            struct sigaction ign;
            memset(&ign, 0, sizeof ign);
            ign.sa_handler = SIG_IGN;
            if (setrlimit(RLIMIT_FSIZE, &rl) != 0 || sigaction(SIGXFSZ, &ign, NULL) != 0)
                _exit(127);
        }
        /* Keys of up to 10 KiB are sent on purpose (hostile keys);
         * f->index sets a small index capacity for the bound tests. */
        execv(argv[0], (char *const *)argv);
        _exit(127);
    }
    close(p[1]);
    f->pid = pid;
    f->out_fd = p[0];

    size_t n = 0;
    int64_t deadline = tu_now_ms() + START_MS;
    while (n == 0 || f->endpoint[n - 1] != '\n') {
        int64_t left = deadline - tu_now_ms();
        struct pollfd pfd = {p[0], POLLIN, 0};
        if (left <= 0 || n + 1 >= sizeof f->endpoint) {
            fprintf(stderr, "unit did not print its endpoint in time\n");
            return -1;
        }
        int r = poll(&pfd, 1, (int)left);
        if (r < 0 && errno == EINTR)
            continue;
        if (r <= 0)
            continue;
        ssize_t got = read(p[0], f->endpoint + n, 1);
        if (got <= 0) {
            fprintf(stderr, "unit exited before printing its endpoint\n");
            return -1;
        }
        n += (size_t)got;
    }
    f->endpoint[n - 1] = '\0';
    return 0;
}

/* Wait up to `ms` for the unit to exit; returns its wait status or -1. */
static int unit_reap(fx *f, int ms)
{
    int64_t deadline = tu_now_ms() + ms;
    int status = 0;
    for (;;) {
        pid_t r = waitpid(f->pid, &status, WNOHANG);
        if (r == f->pid)
            break;
        if (r < 0 && errno != EINTR)
            return -1;
        if (tu_now_ms() > deadline)
            return -1;
        tu_sleep_ms(10);
    }
    f->pid = 0;
    close(f->out_fd);
    f->out_fd = -1;
    return status;
}

/* SIGSTOP the unit and wait until every thread of it has stopped: kill()
 * returns before that, and a thread still running could answer a call. */
static void unit_freeze(fx *f)
{
    int status = 0;
    assert_int_equal(kill(f->pid, SIGSTOP), 0);
    assert_int_equal(waitpid(f->pid, &status, WUNTRACED), f->pid);
    assert_true(WIFSTOPPED(status));
}

/* SIGTERM the unit and return its exit code (-1 if it did not exit
 * normally in time; it is then killed). */
static int unit_stop(fx *f)
{
    if (f->pid <= 0)
        return -1;
    kill(f->pid, SIGCONT); /* in case a failed test left it frozen */
    kill(f->pid, SIGTERM);
    int status = unit_reap(f, STOP_MS);
    if (status < 0) {
        kill(f->pid, SIGKILL);
        unit_reap(f, STOP_MS);
        return -1;
    }
    return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
}

/* ---- fixtures -------------------------------------------------------- */

static int teardown(void **state);

static int fx_new_limited(void **state, const char *capacity, bool spill,
                          const char *index, rlim_t fsize)
{
    fx *f = calloc(1, sizeof *f);
    if (!f)
        return -1;
    *state = f;
    f->index = index;
    f->fsize = fsize;
    f->out_fd = -1;
    ctl_error_init(&f->err);
    const char *base = getenv("TMPDIR");
    snprintf(f->tmp, sizeof f->tmp, "%s/ctl-storage-test.XXXXXX",
             base && *base ? base : "/tmp");
    if (!mkdtemp(f->tmp))
        f->tmp[0] = '\0';
    snprintf(f->spill, sizeof f->spill, "%s/spill", f->tmp);
    if (!f->tmp[0] || unit_start(f, capacity, spill, NULL) != 0 ||
        ctl_client_new(NULL, &f->client, &f->err) != 0 ||
        (f->zctx = zmq_ctx_new()) == NULL) {
        teardown(state);
        *state = NULL;
        return -1;
    }
    return 0;
}

static int fx_new_index(void **state, const char *capacity, bool spill,
                        const char *index)
{
    return fx_new_limited(state, capacity, spill, index, 0);
}

static int fx_new(void **state, const char *capacity, bool spill)
{
    return fx_new_index(state, capacity, spill, NULL);
}

static int setup_big(void **state) { return fx_new(state, "64M", false); }
/* A unit whose keys and bookkeeping may take 64 KiB. */
static int setup_small_index(void **state) { return fx_new_index(state, "64M", false, "64K"); }
/* A unit of 1000 bytes spilling to a directory where no file may grow past
 * 64 KiB. */
static int setup_spill_fsize(void **state)
{
    return fx_new_limited(state, "1000", true, NULL, 64 * 1024);
}
/* A small unit: 1 MiB of blobs, 8 MiB of keys and bookkeeping. */
static int setup_flood(void **state) { return fx_new_index(state, "1M", false, "8M"); }
/* Room in the index for about 1.5 million tiny blobs (a tenth under a
 * sanitizer, whose allocator makes each one several times slower). */
#define MILLION_INDEX (UP_SANITIZED ? "24M" : "256M")
#define MILLION_INDEX_BYTES ((uint64_t)(UP_SANITIZED ? 24 : 256) << 20)
static int setup_million(void **state)
{
    return fx_new_index(state, "1M", false, MILLION_INDEX);
}
static int setup_small(void **state) { return fx_new(state, "1000", false); }
static int setup_spill(void **state) { return fx_new(state, "1000", true); }

static int rm_entry(const char *path, const struct stat *st, int flag,
                    struct FTW *ftw)
{
    (void)st;
    (void)flag;
    (void)ftw;
    remove(path);
    return 0;
}

static int teardown(void **state)
{
    fx *f = *state;
    if (!f)
        return 0;
    ctl_client_destroy(&f->client);
    int code = f->pid > 0 ? unit_stop(f) : 0;
    if (f->zctx)
        zmq_ctx_term(f->zctx);
    ctl_error_fini(&f->err);
    if (f->tmp[0])
        nftw(f->tmp, rm_entry, 16, FTW_DEPTH | FTW_PHYS);
    free(f);
    /* A unit that crashed, leaked (LeakSanitizer) or hung fails the test. */
    if (code != 0)
        fprintf(stderr, "unit exit status %d at teardown\n", code);
    return code == 0 ? 0 : -1;
}

/* ---- call helpers ---------------------------------------------------- */

static const char *why(const fx *f)
{
    return f->err.msg ? f->err.msg : "(no message)";
}

static int put(fx *f, ctl_str key, ctl_str data, bool pin)
{
    storage_put_args a;
    storage_put_args_init(&a);
    a.key = key;
    a.data = data;
    a.pin = pin;
    uint64_t stored = UINT64_MAX;
    int rc = storage_put(f->client, f->endpoint, &a, CALL_MS, &stored, &f->err);
    if (rc == 0)
        assert_int_equal(stored, data.len);
    return rc;
}

static void put_ok(fx *f, ctl_str key, ctl_str data, bool pin)
{
    int rc = put(f, key, data, pin);
    if (rc != 0)
        fail_msg("put '%.*s': %s", (int)key.len, key.ptr, why(f));
}

static storage_list_str keys_of(const ctl_str *k, size_t n)
{
    return (storage_list_str){.items = k, .count = n};
}

static storage_UnitStats stats(fx *f)
{
    storage_UnitStats s;
    memset(&s, 0xab, sizeof s);
    ctl_reply *reply = NULL;
    int rc = storage_stats(f->client, f->endpoint, CALL_MS, &s, &reply, &f->err);
    if (rc != 0)
        fail_msg("stats: %s", why(f));
    ctl_reply_destroy(&reply);
    return s;
}

/* Get `n` keys and compare with `want` (NULL: only check the call works). */
static void get_expect(fx *f, const ctl_str *keys, size_t n, const ctl_str *want)
{
    storage_get_args a = {.keys = keys_of(keys, n)};
    storage_list_bin blobs = {.items = NULL, .count = 0};
    ctl_reply *reply = NULL;
    int rc = storage_get(f->client, f->endpoint, &a, CALL_MS, &blobs, &reply, &f->err);
    if (rc != 0)
        fail_msg("get: %s", why(f));
    assert_int_equal(blobs.count, n);
    for (size_t i = 0; want && i < n; i++) {
        assert_int_equal(blobs.items[i].len, want[i].len);
        if (want[i].len)
            assert_memory_equal(blobs.items[i].ptr, want[i].ptr, want[i].len);
    }
    ctl_reply_destroy(&reply);
}

/* The keys list returns, compared with `want` (in order). */
static void list_expect(fx *f, const char *prefix, const ctl_str *want, size_t n)
{
    storage_list_args a;
    storage_list_args_init(&a);
    if (prefix)
        a.prefix = ctl_str_c(prefix);
    storage_list_str keys = {.items = NULL, .count = 0};
    ctl_reply *reply = NULL;
    int rc = storage_list(f->client, f->endpoint, &a, CALL_MS, &keys, &reply, &f->err);
    if (rc != 0)
        fail_msg("list: %s", why(f));
    assert_int_equal(keys.count, n);
    for (size_t i = 0; i < n; i++) {
        assert_int_equal(keys.items[i].len, want[i].len);
        assert_memory_equal(keys.items[i].ptr, want[i].ptr, want[i].len);
    }
    ctl_reply_destroy(&reply);
}

static storage_BlobInfo describe_one(fx *f, ctl_str key)
{
    storage_describe_args a = {.keys = keys_of(&key, 1)};
    storage_list_BlobInfo infos = {.items = NULL, .count = 0};
    ctl_reply *reply = NULL;
    int rc = storage_describe(f->client, f->endpoint, &a, CALL_MS, &infos, &reply, &f->err);
    if (rc != 0)
        fail_msg("describe: %s", why(f));
    assert_int_equal(infos.count, 1);
    storage_BlobInfo b = infos.items[0];
    assert_int_equal(b.key.len, key.len);
    assert_memory_equal(b.key.ptr, key.ptr, key.len);
    b.key = key; /* the view dies with the reply */
    ctl_reply_destroy(&reply);
    return b;
}

/* The error of the last call is Missing naming exactly `want`, in order. */
static void assert_missing(fx *f, int rc, const ctl_str *want, size_t n)
{
    assert_int_equal(rc, CTL_MISSING);
    assert_int_equal(f->err.kind, CTL_MISSING);
    assert_null(f->err.reason);
    assert_int_equal(f->err.blob_count, n);
    for (size_t i = 0; i < n; i++) {
        assert_int_equal(f->err.blobs[i].len, want[i].len);
        assert_memory_equal(f->err.blobs[i].ptr, want[i].ptr, want[i].len);
    }
}

static void assert_busy_pinned(fx *f, int rc)
{
    assert_int_equal(rc, CTL_BUSY);
    assert_int_equal(f->err.kind, CTL_BUSY);
    assert_non_null(f->err.reason);
    assert_string_equal(f->err.reason, "pinned");
    assert_int_equal(f->err.blob_count, 0);
}

static void fill_random(unsigned char *p, size_t n, unsigned seed)
{
    uint32_t x = seed * 2654435761u + 1;
    for (size_t i = 0; i < n; i++) {
        x ^= x << 13;
        x ^= x >> 17;
        x ^= x << 5;
        p[i] = (unsigned char)x;
    }
}

/* Names in `dir`, other than . and ..; -1 if it cannot be read. Each entry
 * must be a regular file unless `any_type`. */
static int count_entries(const char *dir, bool any_type)
{
    DIR *d = opendir(dir);
    if (!d)
        return -1;
    int n = 0;
    struct dirent *e;
    while ((e = readdir(d)) != NULL) {
        if (strcmp(e->d_name, ".") == 0 || strcmp(e->d_name, "..") == 0)
            continue;
        if (!any_type) {
            struct stat st;
            if (fstatat(dirfd(d), e->d_name, &st, AT_SYMLINK_NOFOLLOW) != 0 ||
                !S_ISREG(st.st_mode)) {
                closedir(d);
                fail_msg("%s/%s is not a regular file", dir, e->d_name);
            }
        }
        n++;
    }
    closedir(d);
    return n;
}

/* `dir` holds exactly one entry, named `name`. */
static void assert_only_entry(const char *dir, const char *name)
{
    DIR *d = opendir(dir);
    assert_non_null(d);
    struct dirent *e;
    int n = 0;
    while ((e = readdir(d)) != NULL) {
        if (strcmp(e->d_name, ".") == 0 || strcmp(e->d_name, "..") == 0)
            continue;
        if (strcmp(e->d_name, name) != 0) {
            closedir(d);
            fail_msg("unexpected entry %s/%s", dir, e->d_name);
        }
        n++;
    }
    closedir(d);
    assert_int_equal(n, 1);
}

/* ---- put / get ------------------------------------------------------- */

static void test_put_get_exact(void **state)
{
    fx *f = *state;
    static unsigned char nuls[4096];
    for (size_t i = 0; i < sizeof nuls; i++)
        nuls[i] = (unsigned char)(i % 3 == 0 ? 0 : i);
    size_t mib = (size_t)1 << 20;
    unsigned char *big = malloc(mib);
    assert_non_null(big);
    fill_random(big, mib, 7);

    ctl_str empty = {"", 0};
    ctl_str bin = {(const char *)nuls, sizeof nuls};
    ctl_str large = {(const char *)big, mib};
    put_ok(f, S("empty"), empty, false);
    put_ok(f, S("nuls"), bin, false);
    put_ok(f, S("mib"), large, false);
    /* A key with a NUL byte inside is a different key from its prefix. */
    put_ok(f, S("k\0x"), S("after-nul"), false);
    put_ok(f, S("k"), S("plain"), false);

    const ctl_str keys[] = {S("mib"), S("empty"), S("nuls"), S("k\0x"), S("k"), S("nuls")};
    const ctl_str want[] = {large, empty, bin, S("after-nul"), S("plain"), bin};
    get_expect(f, keys, N_OF(keys), want);

    /* get of nothing is an empty list, not an error. */
    get_expect(f, NULL, 0, NULL);

    storage_UnitStats s = stats(f);
    assert_int_equal(s.blobs, 5);
    assert_int_equal(s.bytes, mib + sizeof nuls + 9 + 5);
    assert_int_equal(s.capacity, (uint64_t)64 << 20);
    assert_int_equal(s.pinned, 0);
    assert_int_equal(s.spilled, 0);
    free(big);
}

static void test_overwrite_replaces_size(void **state)
{
    fx *f = *state;
    static const char hundred[100] = {1};
    put_ok(f, S("k"), (ctl_str){hundred, sizeof hundred}, false);
    assert_int_equal(stats(f).bytes, 100);
    put_ok(f, S("k"), S("thirty bytes of data, exactly."), false);
    storage_UnitStats s = stats(f);
    assert_int_equal(s.blobs, 1);
    assert_int_equal(s.bytes, 30);
    assert_int_equal(describe_one(f, S("k")).size, 30);
    const ctl_str k[] = {S("k")};
    const ctl_str want[] = {S("thirty bytes of data, exactly.")};
    get_expect(f, k, 1, want);
    /* Overwriting with pin=true pins the new blob. */
    put_ok(f, S("k"), S(""), true);
    s = stats(f);
    assert_int_equal(s.bytes, 0);
    assert_int_equal(s.pinned, 1);
}

static void test_put_pinned_is_busy(void **state)
{
    fx *f = *state;
    put_ok(f, S("p"), S("original"), true);
    assert_busy_pinned(f, put(f, S("p"), S("replacement"), false));
    assert_busy_pinned(f, put(f, S("p"), S("replacement"), true));
    const ctl_str k[] = {S("p")};
    const ctl_str want[] = {S("original")};
    get_expect(f, k, 1, want);
    storage_BlobInfo b = describe_one(f, S("p"));
    assert_true(b.pinned);
    assert_int_equal(b.size, 8);

    /* Pinned by the pin op rather than by put: the same. */
    put_ok(f, S("q"), S("v1"), false);
    const ctl_str q[] = {S("q")};
    storage_pin_args pa = {.keys = keys_of(q, 1)};
    uint64_t n = 0;
    assert_int_equal(storage_pin(f->client, f->endpoint, &pa, CALL_MS, &n, &f->err), 0);
    assert_int_equal(n, 1);
    assert_busy_pinned(f, put(f, S("q"), S("v2"), false));
    storage_UnitStats s = stats(f);
    assert_int_equal(s.pinned, 2);
    assert_int_equal(s.bytes, 8 + 2);
}

static void test_unit_full(void **state)
{
    fx *f = *state; /* capacity 1000, no spill directory */
    static const char b600[600], b400[400], b1000[1000], b2000[2000];
    put_ok(f, S("a"), (ctl_str){b600, 600}, false);
    int rc = put(f, S("b"), (ctl_str){b600, 600}, false);
    assert_int_equal(rc, CTL_UNIT_FULL);
    assert_int_equal(f->err.kind, CTL_UNIT_FULL);
    assert_null(f->err.reason);
    assert_non_null(strstr(f->err.msg, "put"));
    assert_int_equal(put(f, S("huge"), (ctl_str){b2000, 2000}, false), CTL_UNIT_FULL);

    storage_UnitStats s = stats(f);
    assert_int_equal(s.blobs, 1);
    assert_int_equal(s.bytes, 600);
    assert_int_equal(s.capacity, 1000);
    assert_int_equal(s.spilled, 0);

    /* Exactly full is allowed; one byte more is not; an empty blob always fits. */
    put_ok(f, S("b"), (ctl_str){b400, 400}, false);
    assert_int_equal(put(f, S("c"), S("x"), false), CTL_UNIT_FULL);
    put_ok(f, S("c"), S(""), false);
    /* Overwriting frees the old size first: a 1000-byte "a" does not fit next
     * to "b", a 600-byte one does (it replaces the old 600). */
    assert_int_equal(put(f, S("a"), (ctl_str){b1000, 1000}, false), CTL_UNIT_FULL);
    put_ok(f, S("a"), (ctl_str){b600, 600}, false);
    s = stats(f);
    assert_int_equal(s.blobs, 3);
    assert_int_equal(s.bytes, 1000);
    /* After a delete there is room again. */
    const ctl_str del[] = {S("b")};
    storage_delete_args da = {.keys = keys_of(del, 1)};
    uint64_t n = 0;
    assert_int_equal(storage_delete(f->client, f->endpoint, &da, CALL_MS, &n, &f->err), 0);
    assert_int_equal(n, 1);
    put_ok(f, S("d"), (ctl_str){b400, 400}, false);
    assert_int_equal(stats(f).bytes, 1000);
}

/* ---- Missing --------------------------------------------------------- */

static void test_missing_names_absent_keys(void **state)
{
    fx *f = *state;
    put_ok(f, S("a"), S("1"), false);
    put_ok(f, S("b"), S("2"), false);
    const ctl_str ask[] = {S("a"), S("x"), S("b"), S("y\0z"), S("")};
    const ctl_str absent[] = {S("x"), S("y\0z"), S("")};
    storage_list_str keys = keys_of(ask, N_OF(ask));
    ctl_reply *reply = NULL;

    storage_get_args ga = {.keys = keys};
    storage_list_bin blobs = {.items = NULL, .count = 0};
    int rc = storage_get(f->client, f->endpoint, &ga, CALL_MS, &blobs, &reply, &f->err);
    assert_missing(f, rc, absent, N_OF(absent));
    assert_null(reply);
    assert_non_null(strstr(f->err.msg, "get"));

    storage_describe_args da = {.keys = keys};
    storage_list_BlobInfo infos = {.items = NULL, .count = 0};
    rc = storage_describe(f->client, f->endpoint, &da, CALL_MS, &infos, &reply, &f->err);
    assert_missing(f, rc, absent, N_OF(absent));
    assert_null(reply);

    storage_pin_args pa = {.keys = keys};
    uint64_t n = 99;
    rc = storage_pin(f->client, f->endpoint, &pa, CALL_MS, &n, &f->err);
    assert_missing(f, rc, absent, N_OF(absent));
    /* Nothing was pinned. */
    assert_int_equal(stats(f).pinned, 0);
    assert_false(describe_one(f, S("a")).pinned);
    assert_false(describe_one(f, S("b")).pinned);

    /* Only one absent key among many. */
    const ctl_str ask2[] = {S("b"), S("a"), S("gone"), S("a")};
    const ctl_str absent2[] = {S("gone")};
    ga.keys = keys_of(ask2, N_OF(ask2));
    rc = storage_get(f->client, f->endpoint, &ga, CALL_MS, &blobs, &reply, &f->err);
    assert_missing(f, rc, absent2, 1);
}

/* ---- describe, pin, unpin, abort, delete ----------------------------- */

static void test_describe(void **state)
{
    fx *f = *state;
    put_ok(f, S("one"), S("1"), false);
    put_ok(f, S("three"), S("333"), true);
    const ctl_str ask[] = {S("three"), S("one"), S("three")};
    storage_describe_args a = {.keys = keys_of(ask, N_OF(ask))};
    storage_list_BlobInfo infos = {.items = NULL, .count = 0};
    ctl_reply *reply = NULL;
    assert_int_equal(storage_describe(f->client, f->endpoint, &a, CALL_MS, &infos,
                                      &reply, &f->err), 0);
    assert_int_equal(infos.count, 3);
    const uint64_t sizes[] = {3, 1, 3};
    const bool pinned[] = {true, false, true};
    for (size_t i = 0; i < 3; i++) {
        assert_int_equal(infos.items[i].key.len, ask[i].len);
        assert_memory_equal(infos.items[i].key.ptr, ask[i].ptr, ask[i].len);
        assert_int_equal(infos.items[i].size, sizes[i]);
        assert_int_equal(infos.items[i].pinned, pinned[i]);
        assert_false(infos.items[i].spilled);
    }
    ctl_reply_destroy(&reply);
}

static void test_pin_counts_distinct(void **state)
{
    fx *f = *state;
    put_ok(f, S("a"), S("1"), false);
    put_ok(f, S("b"), S("2"), true);
    put_ok(f, S("c"), S("3"), false);
    const ctl_str ask[] = {S("a"), S("b"), S("a")};
    storage_pin_args a = {.keys = keys_of(ask, N_OF(ask))};
    uint64_t n = 0;
    assert_int_equal(storage_pin(f->client, f->endpoint, &a, CALL_MS, &n, &f->err), 0);
    assert_int_equal(n, 2); /* a and b are now pinned (b already was) */
    assert_int_equal(stats(f).pinned, 2);
    assert_false(describe_one(f, S("c")).pinned);
    /* pin of nothing pins nothing. */
    a.keys = keys_of(NULL, 0);
    assert_int_equal(storage_pin(f->client, f->endpoint, &a, CALL_MS, &n, &f->err), 0);
    assert_int_equal(n, 0);
}

static void test_unpin_abort_notify(void **state)
{
    fx *f = *state;
    put_ok(f, S("kept"), S("pinned"), true);
    put_ok(f, S("dropped"), S("unpinned"), false);
    put_ok(f, S("other"), S("x"), false);

    /* A notify and a later call from this thread reach the unit in order
     * (client.h), so the list right after it sees its effect. */
    const ctl_str ab[] = {S("kept"), S("dropped"), S("never-there")};
    storage_abort_args aa = {.keys = keys_of(ab, N_OF(ab))};
    assert_int_equal(storage_abort(f->client, f->endpoint, &aa, &f->err), 0);
    const ctl_str after_abort[] = {S("kept"), S("other")};
    list_expect(f, NULL, after_abort, 2);
    storage_UnitStats s = stats(f);
    assert_int_equal(s.blobs, 2);
    assert_int_equal(s.bytes, 6 + 1);
    assert_int_equal(s.pinned, 1);

    const ctl_str up[] = {S("kept"), S("unknown"), S("kept")};
    storage_unpin_args ua = {.keys = keys_of(up, N_OF(up))};
    assert_int_equal(storage_unpin(f->client, f->endpoint, &ua, &f->err), 0);
    assert_false(describe_one(f, S("kept")).pinned);
    assert_int_equal(stats(f).pinned, 0);

    /* Unpinned now, so abort drops it. */
    assert_int_equal(storage_abort(f->client, f->endpoint, &aa, &f->err), 0);
    const ctl_str after_second[] = {S("other")};
    list_expect(f, NULL, after_second, 1);

    /* Unpinning an unpinned blob is harmless. */
    const ctl_str o[] = {S("other")};
    ua.keys = keys_of(o, 1);
    assert_int_equal(storage_unpin(f->client, f->endpoint, &ua, &f->err), 0);
    assert_int_equal(stats(f).pinned, 0);

    /* No reply ever came back for the notifies: the client counted them as
     * notifies, and no reply arrived late on any of its sockets. */
    ctl_client_stats cs;
    ctl_client_stats_get(f->client, &cs);
    assert_int_equal(cs.notifies, 4);
    assert_int_equal(cs.late_replies, 0);
    assert_int_equal(cs.timeouts, 0);
}

static void test_delete(void **state)
{
    fx *f = *state;
    put_ok(f, S("a"), S("1"), false);
    put_ok(f, S("b"), S("22"), true);
    put_ok(f, S("c"), S("333"), false);
    const ctl_str ask[] = {S("a"), S("b"), S("c")};
    storage_delete_args a = {.keys = keys_of(ask, N_OF(ask))};
    uint64_t n = 99;
    assert_busy_pinned(f, storage_delete(f->client, f->endpoint, &a, CALL_MS, &n, &f->err));
    /* Nothing was deleted. */
    list_expect(f, NULL, ask, 3);
    assert_int_equal(stats(f).bytes, 6);

    const ctl_str ask2[] = {S("a"), S("c"), S("absent"), S("a")};
    a.keys = keys_of(ask2, N_OF(ask2));
    assert_int_equal(storage_delete(f->client, f->endpoint, &a, CALL_MS, &n, &f->err), 0);
    assert_int_equal(n, 2);
    const ctl_str left[] = {S("b")};
    list_expect(f, NULL, left, 1);
    storage_UnitStats s = stats(f);
    assert_int_equal(s.blobs, 1);
    assert_int_equal(s.bytes, 2);
    assert_int_equal(s.pinned, 1);

    /* Deleting only absent keys deletes nothing and is no error. */
    const ctl_str none[] = {S("nope")};
    a.keys = keys_of(none, 1);
    assert_int_equal(storage_delete(f->client, f->endpoint, &a, CALL_MS, &n, &f->err), 0);
    assert_int_equal(n, 0);
}

static void test_list_prefix_sorted(void **state)
{
    fx *f = *state;
    const ctl_str put_order[] = {S("b/2"), S("a"), S("b/10"), S("ab"), S("b"),
                                 S("b/1"), S(""), S("B"), S("b/1\0z"), S("c")};
    for (size_t i = 0; i < N_OF(put_order); i++)
        put_ok(f, put_order[i], S("v"), false);
    const ctl_str all[] = {S(""), S("B"), S("a"), S("ab"), S("b"), S("b/1"),
                           S("b/1\0z"), S("b/10"), S("b/2"), S("c")};
    list_expect(f, NULL, all, N_OF(all));
    list_expect(f, "", all, N_OF(all));
    const ctl_str under_b[] = {S("b/1"), S("b/1\0z"), S("b/10"), S("b/2")};
    list_expect(f, "b/", under_b, N_OF(under_b));
    const ctl_str a[] = {S("a"), S("ab")};
    list_expect(f, "a", a, 2);
    list_expect(f, "zzz", NULL, 0);
    list_expect(f, "b/10/", NULL, 0);
}

/* ---- stats: requests and dropped ------------------------------------- */

static void test_stats_requests(void **state)
{
    fx *f = *state;
    storage_UnitStats s0 = stats(f);
    assert_true(s0.requests >= 1); /* this stats call itself */
    assert_int_equal(s0.dropped, 0);
    put_ok(f, S("k"), S("v"), false);
    const ctl_str k[] = {S("k")};
    get_expect(f, k, 1, NULL);
    list_expect(f, NULL, k, 1);
    get_expect(f, (const ctl_str[]){S("k"), S("k")}, 2, NULL);
    storage_UnitStats s1 = stats(f);
    assert_int_equal(s1.requests, s0.requests + 5);
    /* Failed calls are served requests too. */
    const ctl_str gone[] = {S("gone")};
    storage_get_args ga = {.keys = keys_of(gone, 1)};
    ctl_reply *reply = NULL;
    storage_list_bin blobs;
    assert_int_equal(storage_get(f->client, f->endpoint, &ga, CALL_MS, &blobs, &reply,
                                 &f->err), CTL_MISSING);
    storage_UnitStats s2 = stats(f);
    assert_int_equal(s2.requests, s1.requests + 2);
    assert_int_equal(s2.dropped, 0);
}

/* A raw request [op, id, args] over `sock`; the reply body's map is
 * decoded into `zone`. Returns the ok flag; fails the test on no reply. */
static bool raw_call(void *sock, const char *op, const char *id,
                     const void *args, size_t args_len, msgpack_zone *zone,
                     tu_rx *rx, tu_reply *r)
{
    tu_buf b;
    tu_buf_init(&b);
    tu_pack_request(&b, op, id, strlen(id), args, args_len);
    assert_int_equal(tu_raw_send(sock, b.sb.data, b.sb.size), 0);
    tu_buf_fini(&b);
    if (tu_raw_recv(sock, RAW_MS, rx) != 0)
        fail_msg("no reply to raw %s", op);
    assert_int_equal(tu_parse_reply(TU_RX_PAYLOAD(rx), TU_RX_PAYLOAD_LEN(rx), zone, r), 0);
    assert_int_equal(r->id_len, strlen(id));
    assert_memory_equal(r->id, id, r->id_len);
    return r->ok;
}

static uint64_t u64_field(const msgpack_object *map, const char *key)
{
    const msgpack_object *v = tu_obj_get(map, key);
    assert_non_null(v);
    assert_int_equal(v->type, MSGPACK_OBJECT_POSITIVE_INTEGER);
    return v->via.u64;
}

static void test_stats_dropped(void **state)
{
    fx *f = *state;
    void *sock = tu_raw_connect(f->zctx, ZMQ_DEALER, f->endpoint);
    assert_non_null(sock);
    msgpack_zone zone;
    msgpack_zone_init(&zone, 4096);
    tu_rx rx;
    tu_reply r;

    assert_true(raw_call(sock, "stats", "s0", NULL, 0, &zone, &rx, &r));
    uint64_t req0 = u64_field(&r.body, "requests");
    uint64_t drop0 = u64_field(&r.body, "dropped");
    tu_rx_free(&rx);

    /* Payloads with no usable request id: not msgpack, not an array, an
     * array of 2, an int op, an int id, a 0xc1 byte, a truncated array. */
    static const unsigned char garbage[][8] = {
        {'h', 'e', 'l', 'l', 'o'},
        {0x2a},
        {0x92, 0xa1, 'x', 0xa1, 'y'},
        {0x93, 0x01, 0xa1, 'i', 0x80},
        {0x93, 0xa1, 'o', 0x07, 0x80},
        {0xc1},
        {0x93, 0xa5, 's', 't'},
    };
    static const size_t glen[] = {5, 1, 5, 5, 5, 1, 4};
    for (size_t i = 0; i < N_OF(garbage); i++)
        assert_int_equal(tu_raw_send(sock, garbage[i], glen[i]), 0);
    /* An empty payload and a three-frame message whose middle frame is not
     * an empty delimiter: dropped too. */
    assert_int_equal(tu_raw_send(sock, "", 0), 0);
    const void *frames[] = {"x", "y"};
    const size_t flen[] = {1, 1};
    assert_int_equal(tu_raw_send_frames(sock, frames, flen, 2), 0);
    uint64_t sent_garbage = N_OF(garbage) + 2;

    /* Nothing comes back for them; the next request on the same connection
     * is served after all of them, so its counters are exact. */
    assert_true(raw_call(sock, "stats", "s1", NULL, 0, &zone, &rx, &r));
    assert_int_equal(u64_field(&r.body, "dropped"), drop0 + sent_garbage);
    assert_int_equal(u64_field(&r.body, "requests"), req0 + 1);
    tu_rx_free(&rx);

    /* And the typed stub sees the same. */
    storage_UnitStats s = stats(f);
    assert_int_equal(s.dropped, drop0 + sent_garbage);

    zmq_close(sock);
    msgpack_zone_destroy(&zone);
}

/* An error map has exactly kind, msg, reason, blobs. */
static void assert_error_map(const msgpack_object *m, const char *kind)
{
    assert_int_equal(m->type, MSGPACK_OBJECT_MAP);
    assert_int_equal(m->via.map.size, 4);
    assert_true(tu_obj_is_str(tu_obj_get(m, "kind"), kind));
    assert_int_equal(tu_obj_get(m, "msg")->type, MSGPACK_OBJECT_STR);
    assert_non_null(tu_obj_get(m, "reason"));
    assert_non_null(tu_obj_get(m, "blobs"));
}

static void pack_map1_str(tu_buf *b, const char *key, const char *val)
{
    msgpack_pack_map(&b->pk, 1);
    tu_pk_str(&b->pk, key);
    tu_pk_str(&b->pk, val);
}

/* Requests with an id but bad args or an unknown op get a Protocol error
 * map; the raw wire shows the exact map the unit sends for each kind. */
static void test_raw_error_maps(void **state)
{
    fx *f = *state;
    void *sock = tu_raw_connect(f->zctx, ZMQ_DEALER, f->endpoint);
    assert_non_null(sock);
    msgpack_zone zone;
    msgpack_zone_init(&zone, 4096);
    tu_rx rx;
    tu_reply r;
    tu_buf a;
    tu_buf_init(&a);

    /* Unknown op. */
    assert_false(raw_call(sock, "nosuchop", "e1", NULL, 0, &zone, &rx, &r));
    assert_error_map(&r.body, "Protocol");
    assert_int_equal(tu_obj_get(&r.body, "reason")->type, MSGPACK_OBJECT_NIL);
    assert_int_equal(tu_obj_get(&r.body, "blobs")->type, MSGPACK_OBJECT_NIL);
    tu_rx_free(&rx);

    /* put with a missing required argument, naming it. */
    pack_map1_str(&a, "key", "k");
    assert_false(raw_call(sock, "put", "e2", a.sb.data, a.sb.size, &zone, &rx, &r));
    assert_error_map(&r.body, "Protocol");
    const msgpack_object *msg = tu_obj_get(&r.body, "msg");
    assert_non_null(memmem(msg->via.str.ptr, msg->via.str.size, "data", 4));
    tu_rx_free(&rx);

    /* A value of the wrong type (keys must be a list). */
    tu_buf_reset(&a);
    pack_map1_str(&a, "keys", "not-a-list");
    assert_false(raw_call(sock, "get", "e3", a.sb.data, a.sb.size, &zone, &rx, &r));
    assert_error_map(&r.body, "Protocol");
    msg = tu_obj_get(&r.body, "msg");
    assert_non_null(memmem(msg->via.str.ptr, msg->via.str.size, "keys", 4));
    tu_rx_free(&rx);

    /* An unknown argument. */
    tu_buf_reset(&a);
    pack_map1_str(&a, "bogus", "x");
    assert_false(raw_call(sock, "list", "e4", a.sb.data, a.sb.size, &zone, &rx, &r));
    assert_error_map(&r.body, "Protocol");
    msg = tu_obj_get(&r.body, "msg");
    assert_non_null(memmem(msg->via.str.ptr, msg->via.str.size, "bogus", 5));
    tu_rx_free(&rx);

    /* Missing: blobs is the list, reason nil. */
    tu_buf_reset(&a);
    msgpack_pack_map(&a.pk, 1);
    tu_pk_str(&a.pk, "keys");
    msgpack_pack_array(&a.pk, 1);
    tu_pk_str(&a.pk, "absent");
    assert_false(raw_call(sock, "get", "e5", a.sb.data, a.sb.size, &zone, &rx, &r));
    assert_error_map(&r.body, "Missing");
    const msgpack_object *blobs = tu_obj_get(&r.body, "blobs");
    assert_int_equal(blobs->type, MSGPACK_OBJECT_ARRAY);
    assert_int_equal(blobs->via.array.size, 1);
    assert_true(tu_obj_is_str(&blobs->via.array.ptr[0], "absent"));
    assert_int_equal(tu_obj_get(&r.body, "reason")->type, MSGPACK_OBJECT_NIL);
    tu_rx_free(&rx);

    /* A notify is never answered, not even with bad args or a request id:
     * the stats reply is the next thing on the socket. */
    tu_buf_reset(&a);
    pack_map1_str(&a, "keys", "not-a-list");
    tu_buf b;
    tu_buf_init(&b);
    tu_pack_request(&b, "unpin", "n1", 2, a.sb.data, a.sb.size);
    assert_int_equal(tu_raw_send(sock, b.sb.data, b.sb.size), 0);
    tu_buf_reset(&b);
    tu_pack_request(&b, "abort", "", 0, NULL, 0);
    assert_int_equal(tu_raw_send(sock, b.sb.data, b.sb.size), 0);
    tu_buf_fini(&b);
    assert_true(raw_call(sock, "stats", "after-notify", NULL, 0, &zone, &rx, &r));
    tu_rx_free(&rx);
    assert_int_equal(tu_raw_recv(sock, 300, &rx), -1);

    /* The empty request id is echoed too. */
    assert_true(raw_call(sock, "list", "", NULL, 0, &zone, &rx, &r));
    tu_rx_free(&rx);

    tu_buf_fini(&a);
    zmq_close(sock);
    msgpack_zone_destroy(&zone);
}

/* A REQ-style peer ([identity, "", payload] at the ROUTER) gets its reply
 * with the delimiter; a real REQ socket only accepts it that way. */
static void test_req_peer(void **state)
{
    fx *f = *state;
    void *sock = tu_raw_connect(f->zctx, ZMQ_REQ, f->endpoint);
    assert_non_null(sock);
    msgpack_zone zone;
    msgpack_zone_init(&zone, 4096);
    tu_rx rx;
    tu_reply r;
    assert_true(raw_call(sock, "stats", "req-1", NULL, 0, &zone, &rx, &r));
    assert_int_equal(u64_field(&r.body, "capacity"), (uint64_t)64 << 20);
    tu_rx_free(&rx);
    assert_false(raw_call(sock, "nosuchop", "req-2", NULL, 0, &zone, &rx, &r));
    assert_error_map(&r.body, "Protocol");
    tu_rx_free(&rx);
    zmq_close(sock);
    msgpack_zone_destroy(&zone);
}

/* A remote Protocol error reaches a caller as CTL_TRANSFER, cause REMOTE. */
static void test_protocol_error_is_transfer(void **state)
{
    fx *f = *state;
    ctl_reply *reply = NULL;
    int rc = ctl_client_call(f->client, f->endpoint, "nosuchop", NULL, 0, CALL_MS,
                             &reply, &f->err);
    assert_int_equal(rc, CTL_TRANSFER);
    assert_int_equal(f->err.cause, CTL_CAUSE_REMOTE);
    assert_non_null(f->err.remote_kind);
    assert_string_equal(f->err.remote_kind, "Protocol");
    assert_null(reply);
    /* The client still works. */
    assert_int_equal(stats(f).blobs, 0);
}

/* ---- spilling -------------------------------------------------------- */

static void test_spill_beyond_capacity(void **state)
{
    fx *f = *state; /* capacity 1000, spill directory tmp/spill */
    enum { N = 12, SZ = 700 };
    static unsigned char data[N][SZ];
    char names[N][16];
    ctl_str keys[N], want[N];
    for (int i = 0; i < N; i++) {
        fill_random(data[i], SZ, (unsigned)i + 1);
        snprintf(names[i], sizeof names[i], "blob-%02d", i);
        keys[i] = ctl_str_c(names[i]);
        want[i] = (ctl_str){(const char *)data[i], SZ};
        put_ok(f, keys[i], want[i], false);
    }
    storage_UnitStats s = stats(f);
    assert_int_equal(s.blobs, N);
    assert_int_equal(s.bytes, SZ); /* only the first fits in memory */
    assert_int_equal(s.spilled, N - 1);
    assert_true(s.blobs * SZ > s.capacity);
    get_expect(f, keys, N, want);
    assert_false(describe_one(f, keys[0]).spilled);
    assert_true(describe_one(f, keys[1]).spilled);
    assert_int_equal(describe_one(f, keys[1]).size, SZ);

    /* Spilled blobs do not count against memory: 300 more bytes still fit. */
    static const char b300[300] = {3};
    put_ok(f, S("small"), (ctl_str){b300, 300}, false);
    assert_false(describe_one(f, S("small")).spilled);
    s = stats(f);
    assert_int_equal(s.bytes, SZ + 300);
    assert_int_equal(s.spilled, N - 1);

    /* The spill directory holds one regular file per spilled blob, and the
     * unit's working directory holds only the spill directory. */
    assert_int_equal(count_entries(f->spill, false), N - 1);
    assert_only_entry(f->tmp, "spill");

    /* Overwriting a spilled blob with a small one brings it into memory (its
     * file goes); deleting and aborting spilled blobs removes their files. */
    put_ok(f, keys[1], S(""), false);
    assert_false(describe_one(f, keys[1]).spilled);
    storage_delete_args da = {.keys = keys_of(keys + 2, 3)};
    uint64_t n = 0;
    assert_int_equal(storage_delete(f->client, f->endpoint, &da, CALL_MS, &n, &f->err), 0);
    assert_int_equal(n, 3);
    storage_abort_args aa = {.keys = keys_of(keys + 5, 2)};
    assert_int_equal(storage_abort(f->client, f->endpoint, &aa, &f->err), 0);
    s = stats(f);
    assert_int_equal(s.blobs, N + 1 - 5);
    assert_int_equal(s.spilled, N - 1 - 6);
    assert_int_equal(count_entries(f->spill, false), (int)s.spilled);
    get_expect(f, keys + 7, N - 7, want + 7);

    /* Pins hold for spilled blobs too. */
    put_ok(f, S("big-pinned"), (ctl_str){(const char *)data[0], SZ}, true);
    assert_true(describe_one(f, S("big-pinned")).spilled);
    assert_busy_pinned(f, put(f, S("big-pinned"), S("x"), false));
}

/* A spill file that vanished under the unit: get fails with a Protocol error
 * (a Transfer for the caller), the unit keeps serving. */
/* Files in the spill directory in `f->spill` (the store's own). */
static int spill_files(fx *f)
{
    DIR *d = opendir(f->spill);
    int n = 0;
    struct dirent *e;
    if (!d)
        return -1;
    while ((e = readdir(d)) != NULL)
        n += e->d_name[0] != '.';
    closedir(d);
    return n;
}

/* A spill that cannot be written (here: EFBIG, as a full disk or a quota
 * would give ENOSPC or EDQUOT) is UnitFull naming the cause; the partial
 * file is removed and what was stored before is untouched. */
static void test_spill_write_fails(void **state)
{
    fx *f = *state; /* capacity 1000; no file may grow past 64 KiB */
    static unsigned char mid[10000], big[100000], small[500];
    fill_random(mid, sizeof mid, 7);
    fill_random(big, sizeof big, 8);
    fill_random(small, sizeof small, 9);
    put_ok(f, S("small"), (ctl_str){(const char *)small, sizeof small}, false);
    put_ok(f, S("mid"), (ctl_str){(const char *)mid, sizeof mid}, false);
    assert_true(describe_one(f, S("mid")).spilled);
    assert_int_equal(spill_files(f), 1);

    assert_int_equal(put(f, S("big"), (ctl_str){(const char *)big, sizeof big}, false),
                     CTL_UNIT_FULL);
    assert_non_null(strstr(f->err.msg, "100000 bytes do not fit in memory and cannot be "
                                       "spilled to "));
    assert_non_null(strstr(f->err.msg, strerror(EFBIG)));
    assert_int_equal(spill_files(f), 1); /* no partial file left */
    /* Replacing a stored blob with one that cannot be spilled keeps the old. */
    assert_int_equal(put(f, S("mid"), (ctl_str){(const char *)big, sizeof big}, false),
                     CTL_UNIT_FULL);

    const ctl_str keys[] = {S("small"), S("mid")};
    const ctl_str want[] = {{(const char *)small, sizeof small}, {(const char *)mid, sizeof mid}};
    get_expect(f, keys, 2, want);
    storage_UnitStats st = stats(f);
    assert_int_equal(st.blobs, 2);
    assert_int_equal(st.spilled, 1);
    assert_int_equal(st.bytes, sizeof small);
    /* The unit goes on spilling what fits. */
    put_ok(f, S("mid2"), (ctl_str){(const char *)mid, sizeof mid}, false);
    assert_int_equal(spill_files(f), 2);
}

static void test_spill_file_lost(void **state)
{
    fx *f = *state;
    static unsigned char big[5000];
    fill_random(big, sizeof big, 42);
    put_ok(f, S("spilled"), (ctl_str){(const char *)big, sizeof big}, false);
    assert_true(describe_one(f, S("spilled")).spilled);
    DIR *d = opendir(f->spill);
    assert_non_null(d);
    struct dirent *e;
    int removed = 0;
    while ((e = readdir(d)) != NULL)
        if (e->d_name[0] != '.')
            removed += unlinkat(dirfd(d), e->d_name, 0) == 0;
    closedir(d);
    assert_int_equal(removed, 1);

    const ctl_str k[] = {S("spilled")};
    storage_get_args ga = {.keys = keys_of(k, 1)};
    storage_list_bin blobs;
    ctl_reply *reply = NULL;
    int rc = storage_get(f->client, f->endpoint, &ga, CALL_MS, &blobs, &reply, &f->err);
    assert_int_equal(rc, CTL_TRANSFER);
    assert_int_equal(f->err.cause, CTL_CAUSE_REMOTE);
    assert_string_equal(f->err.remote_kind, "Protocol");
    /* Still listed, still deletable, and the unit still serves. */
    storage_delete_args da = {.keys = keys_of(k, 1)};
    uint64_t n = 0;
    assert_int_equal(storage_delete(f->client, f->endpoint, &da, CALL_MS, &n, &f->err), 0);
    assert_int_equal(n, 1);
    assert_int_equal(stats(f).blobs, 0);
}

/* ---- memory bounds under a flood ----------------------------------- */

/* One client thread of a flood: puts empty blobs under distinct keys of
 * `key_len` bytes until a put fails or `max_puts` have been stored. */
typedef struct flooder {
    const fx *f;
    int id;
    size_t key_len;
    size_t max_puts;
    size_t stored;
    int rc;          /* the failure that ended it (0: none) */
    char msg[256];
} flooder;

static void *flood(void *arg)
{
    flooder *fl = arg;
    ctl_error err;
    char *key = malloc(fl->key_len);
    ctl_error_init(&err);
    if (!key)
        return NULL;
    memset(key, 'k', fl->key_len);
    for (size_t i = 0; i < fl->max_puts; i++) {
        char head[32];
        int n = snprintf(head, sizeof head, "%d-%zu-", fl->id, i);
        memcpy(key, head, (size_t)n < fl->key_len ? (size_t)n : fl->key_len);
        storage_put_args a = STORAGE_PUT_ARGS_INIT;
        a.key = (ctl_str){key, fl->key_len};
        a.data = (ctl_str){"", 0};
        fl->rc = storage_put(fl->f->client, fl->f->endpoint, &a, CALL_MS, NULL, &err);
        if (fl->rc != 0) {
            snprintf(fl->msg, sizeof fl->msg, "%s", err.msg);
            break;
        }
        fl->stored++;
    }
    ctl_error_fini(&err);
    free(key);
    return NULL;
}

/* Flood the unit of `f` with `threads` clients putting empty blobs under
 * keys of `key_len` bytes until the index is full; check that every
 * flooder was stopped by UnitFull naming the index, that stats account for
 * exactly what was stored within the bound, and (without a sanitizer)
 * that the unit's RSS grew by no more than its two bounds and a slack. */
static void flood_until_full(fx *f, size_t key_len, uint64_t index_capacity)
{
    enum { THREADS = 4 };
    storage_UnitStats st;
    ctl_reply *reply = NULL;
    assert_int_equal(storage_stats(f->client, f->endpoint, CALL_MS, &st, &reply, &f->err), 0);
    ctl_reply_destroy(&reply);
    uint64_t rss_before = (uint64_t)up_rss_kib(f->pid) * 1024;
    /* Each blob costs its key and at least its bookkeeping: no more than
     * this many can fit, and a unit that did not count keys would take
     * them all. */
    size_t most = (size_t)(index_capacity / (key_len + BLOB_OVERHEAD)) + 1;
    flooder fl[THREADS];
    pthread_t t[THREADS];
    for (int i = 0; i < THREADS; i++) {
        fl[i] = (flooder){.f = f, .id = i, .key_len = key_len, .max_puts = most};
        assert_int_equal(pthread_create(&t[i], NULL, flood, &fl[i]), 0);
    }
    size_t stored = 0;
    for (int i = 0; i < THREADS; i++) {
        pthread_join(t[i], NULL);
        stored += fl[i].stored;
        if (fl[i].rc != CTL_UNIT_FULL || !strstr(fl[i].msg, "no room for another key"))
            fail_msg("flooder %d ended with %d: %s", i, fl[i].rc, fl[i].msg);
    }
    assert_int_equal(storage_stats(f->client, f->endpoint, CALL_MS, &st, &reply, &f->err), 0);
    ctl_reply_destroy(&reply);
    assert_int_equal(st.blobs, stored);
    assert_int_equal(st.bytes, 0);
    assert_int_equal(st.index_capacity, index_capacity);
    assert_true(st.index_bytes <= index_capacity);
    /* Full: not even one more key fits. */
    assert_true(st.index_bytes + key_len + BLOB_OVERHEAD > index_capacity);
    assert_true(st.index_bytes >= stored * (key_len + BLOB_OVERHEAD));
    uint64_t rss_after = (uint64_t)up_rss_kib(f->pid) * 1024;
    print_message("flood: %zu blobs under %zu-byte keys, index %" PRIu64 " of %" PRIu64
                  " bytes; unit RSS %" PRIu64 " -> %" PRIu64 " bytes\n", stored, key_len,
                  st.index_bytes, index_capacity, rss_before, rss_after);
    if (!UP_SANITIZED && rss_before && rss_after) {
        uint64_t slack = (uint64_t)16 << 20;
        if (rss_after > rss_before + st.capacity + index_capacity + slack)
            fail_msg("unit RSS grew from %" PRIu64 " to %" PRIu64 " bytes: more than "
                     "capacity %" PRIu64 " + index %" PRIu64 " + 16 MiB", rss_before,
                     rss_after, st.capacity, index_capacity);
    }
}

/* Many tiny blobs: the bookkeeping alone fills the index. */
static void test_flood_tiny_blobs(void **state)
{
    flood_until_full(*state, 12, (uint64_t)8 << 20);
}

/* Millions of tiny blobs, sent as fast as the unit takes them (a window of
 * pipelined raw puts on one socket): the unit stores them until its index
 * is full, refuses every one after that with UnitFull, and its memory
 * stays within capacity + index capacity. */
static void test_flood_million_tiny_blobs(void **state)
{
    enum { WINDOW = 256 };
    fx *f = *state;
    storage_UnitStats st;
    ctl_reply *reply = NULL;
    uint64_t index_capacity = MILLION_INDEX_BYTES;
    uint64_t rss_before = (uint64_t)up_rss_kib(f->pid) * 1024;
    /* Each blob costs its 8-byte key and its bookkeeping: send a tenth
     * more than can fit. */
    uint64_t fit = index_capacity / (8 + BLOB_OVERHEAD);
    uint64_t attempts = fit + fit / 10;
    void *sock = tu_raw_connect(f->zctx, ZMQ_DEALER, f->endpoint);
    assert_non_null(sock);
    msgpack_zone zone;
    msgpack_zone_init(&zone, 4096);
    tu_buf req, args;
    tu_buf_init(&req);
    tu_buf_init(&args);
    uint64_t sent = 0, stored = 0, full = 0, first_full = 0;
    while (sent < attempts) {
        uint64_t batch = attempts - sent < WINDOW ? attempts - sent : WINDOW;
        for (uint64_t i = 0; i < batch; i++) {
            char key[9];
            snprintf(key, sizeof key, "%08" PRIx64, sent + i);
            tu_buf_reset(&args);
            msgpack_pack_map(&args.pk, 2);
            tu_pk_str(&args.pk, "key");
            tu_pk_strn(&args.pk, key, 8);
            tu_pk_str(&args.pk, "data");
            msgpack_pack_bin(&args.pk, 0);
            tu_buf_reset(&req);
            tu_pack_request(&req, "put", key, 8, args.sb.data, args.sb.size);
            assert_int_equal(tu_raw_send(sock, req.sb.data, req.sb.size), 0);
        }
        for (uint64_t i = 0; i < batch; i++) {
            tu_rx rx;
            tu_reply r;
            if (tu_raw_recv(sock, RAW_MS, &rx) != 0)
                fail_msg("no reply to put %" PRIu64 " of %" PRIu64, sent + i, attempts);
            msgpack_zone_clear(&zone);
            assert_int_equal(tu_parse_reply(TU_RX_PAYLOAD(&rx), TU_RX_PAYLOAD_LEN(&rx),
                                            &zone, &r), 0);
            if (r.ok) {
                stored++;
                if (full)
                    fail_msg("put %" PRIu64 " stored after %" PRIu64 " refusals",
                             sent + i, full);
            } else {
                assert_error_map(&r.body, "UnitFull");
                if (!full++)
                    first_full = sent + i;
            }
            tu_rx_free(&rx);
        }
        sent += batch;
    }
    tu_buf_fini(&req);
    tu_buf_fini(&args);
    msgpack_zone_destroy(&zone);
    zmq_close(sock);
    assert_int_equal(stored + full, attempts);
    assert_int_equal(first_full, stored);
    assert_true(full > 0);
    assert_int_equal(stored, fit);
    /* A million at the C store's charge a blob; a Python unit charges more
     * (PY_BLOB_OVERHEAD), so fewer fit: it stores exactly `fit` all the same. */
    if (!UP_SANITIZED && !unit_is_python)
        assert_true(stored >= 1000000);
    assert_int_equal(storage_stats(f->client, f->endpoint, CALL_MS, &st, &reply, &f->err), 0);
    ctl_reply_destroy(&reply);
    assert_int_equal(st.blobs, stored);
    assert_int_equal(st.index_capacity, index_capacity);
    assert_true(st.index_bytes <= index_capacity);
    uint64_t rss_after = (uint64_t)up_rss_kib(f->pid) * 1024;
    print_message("flood: %" PRIu64 " tiny blobs stored, %" PRIu64 " refused; index %" PRIu64
                  " of %" PRIu64 " bytes; unit RSS %" PRIu64 " -> %" PRIu64 " bytes\n", stored,
                  full, st.index_bytes, index_capacity, rss_before, rss_after);
    if (!UP_SANITIZED && rss_before && rss_after &&
        rss_after > rss_before + st.capacity + index_capacity + ((uint64_t)16 << 20))
        fail_msg("unit RSS grew from %" PRIu64 " to %" PRIu64 " bytes: more than capacity "
                 "%" PRIu64 " + index %" PRIu64 " + 16 MiB", rss_before, rss_after,
                 st.capacity, index_capacity);
}

/* Long keys with empty blobs (the hole a hostile client could use): they
 * fill the index too, and keys over the limit never get in. */
static void test_flood_long_keys(void **state)
{
    fx *f = *state;
    size_t huge = (size_t)1 << 20;
    char *key = malloc(huge);
    assert_non_null(key);
    memset(key, 'h', huge);
    for (int i = 0; i < 16; i++) {
        key[0] = (char)('a' + i);
        assert_int_equal(put(f, (ctl_str){key, huge}, S(""), false), CTL_TRANSFER);
        assert_non_null(strstr(f->err.msg, "(--max-key-bytes)"));
    }
    free(key);
    flood_until_full(f, 16 * 1024, (uint64_t)8 << 20);
}

/* list a page at a time: sorted, after `after`, at most `limit`; without a
 * limit, more keys than the unit's page limit (20 in these tests) is a
 * Protocol error saying how to page. */
static void test_list_paging(void **state)
{
    fx *f = *state;
    char names[25][8];
    for (int i = 0; i < 25; i++) {
        snprintf(names[i], sizeof names[i], "p%02d", 24 - i); /* put out of order */
        put_ok(f, ctl_str_c(names[i]), S("v"), false);
    }
    put_ok(f, S("q"), S("v"), false);
    storage_list_args a = STORAGE_LIST_ARGS_INIT;
    storage_list_str got;
    ctl_reply *reply = NULL;
    a.prefix = S("p");
    a.limit = 10;
    char want[32];
    size_t seen = 0;
    for (int page = 0; page < 4; page++) {
        assert_int_equal(storage_list(f->client, f->endpoint, &a, CALL_MS, &got, &reply,
                                      &f->err), 0);
        assert_int_equal(got.count, page < 2 ? 10 : page == 2 ? 5 : 0);
        for (size_t k = 0; k < got.count; k++, seen++) {
            snprintf(want, sizeof want, "p%02zu", seen);
            assert_int_equal(got.items[k].len, 3);
            assert_memory_equal(got.items[k].ptr, want, 3);
        }
        snprintf(want, sizeof want, "p%02zu", seen ? seen - 1 : 0);
        a.after = ctl_str_c(want); /* the last key received (a copy) */
        ctl_reply_destroy(&reply);
    }
    assert_int_equal(seen, 25);
    /* A limit above the unit's page limit gets a full page of 20. */
    a.after = S("");
    a.limit = 1000;
    assert_int_equal(storage_list(f->client, f->endpoint, &a, CALL_MS, &got, &reply, &f->err), 0);
    assert_int_equal(got.count, 20);
    ctl_reply_destroy(&reply);
    /* No limit and more than 20 match: refused, saying how to page. */
    a.limit = 0;
    assert_int_equal(storage_list(f->client, f->endpoint, &a, CALL_MS, &got, &reply, &f->err),
                     CTL_TRANSFER);
    assert_non_null(strstr(f->err.msg, "more than 20 keys match, and this unit lists at "
                                       "most that many at once (--max-list-keys): page with "
                                       "'after' and 'limit'"));
    /* ... and fewer are all listed, as an old caller expects. */
    a.prefix = S("p2");
    assert_int_equal(storage_list(f->client, f->endpoint, &a, CALL_MS, &got, &reply, &f->err), 0);
    assert_int_equal(got.count, 5);
    ctl_reply_destroy(&reply);
}

static int cmp_str_bytes(const void *x, const void *y)
{
    const ctl_str *a = x, *b = y;
    int c = memcmp(a->ptr, b->ptr, a->len < b->len ? a->len : b->len);
    return c ? c : (a->len > b->len) - (a->len < b->len);
}

/* Paging through keys that are prefixes of each other, hold NUL bytes and
 * bytes above 0x7f yields every key once, in byte order then length, for
 * every page size: the unit's page is chosen, not sorted from everything. */
static void test_list_pages_in_byte_order(void **state)
{
    fx *f = *state;
    enum { N = 120 };
    static const char alphabet[] = {'a', 'b', '\0', (char)0xe9};
    char bytes[N][6];
    ctl_str keys[N];
    size_t n = 0;
    unsigned seed = 12345;
    while (n < N) {
        size_t len = 1 + (seed = seed * 1103515245u + 12345u) % 5;
        for (size_t i = 0; i < len; i++)
            bytes[n][i] = alphabet[(seed = seed * 1103515245u + 12345u) >> 16 & 3];
        ctl_str k = {bytes[n], len};
        int dup = 0;
        for (size_t j = 0; j < n && !dup; j++)
            dup = cmp_str_bytes(&keys[j], &k) == 0;
        if (!dup) {
            put_ok(f, k, S("v"), false);
            keys[n++] = k;
        }
    }
    qsort(keys, N, sizeof keys[0], cmp_str_bytes);
    static const uint32_t limits[] = {1, 3, 7, 19, 20, 1000};
    for (size_t l = 0; l < sizeof limits / sizeof limits[0]; l++) {
        storage_list_args a = STORAGE_LIST_ARGS_INIT;
        char last[6];
        size_t seen = 0;
        a.limit = limits[l];
        for (;;) {
            storage_list_str got;
            ctl_reply *reply = NULL;
            assert_int_equal(storage_list(f->client, f->endpoint, &a, CALL_MS, &got, &reply,
                                          &f->err), 0);
            uint32_t page = limits[l] < 20 ? limits[l] : 20; /* --max-list-keys 20 */
            assert_true(got.count <= page);
            for (size_t k = 0; k < got.count; k++, seen++) {
                assert_true(seen < N);
                assert_int_equal(got.items[k].len, keys[seen].len);
                assert_memory_equal(got.items[k].ptr, keys[seen].ptr, keys[seen].len);
            }
            size_t count = got.count;
            if (count) {
                memcpy(last, got.items[count - 1].ptr, got.items[count - 1].len);
                a.after = (ctl_str){last, got.items[count - 1].len};
            }
            ctl_reply_destroy(&reply);
            if (count < page)
                break;
        }
        assert_int_equal(seen, N);
    }
}

/* A key longer than --max-key-bytes is refused, naming the limit; one at
 * the limit is stored. */
static void test_key_limit(void **state)
{
    fx *f = *state;
    size_t limit = 16 * 1024;
    char *key = malloc(limit + 1);
    assert_non_null(key);
    memset(key, 'k', limit + 1);
    assert_int_equal(put(f, (ctl_str){key, limit + 1}, S("x"), false), CTL_TRANSFER);
    assert_int_equal(f->err.cause, CTL_CAUSE_REMOTE);
    assert_non_null(strstr(f->err.msg, "a key of 16385 bytes is longer than this unit's "
                                       "limit of 16384 bytes (--max-key-bytes)"));
    put_ok(f, (ctl_str){key, limit}, S("x"), false);
    free(key);
}

/* Keys and bookkeeping count against --index-capacity, whatever the blobs'
 * sizes: empty blobs under long keys fill it, a put past it is UnitFull,
 * stats reports it, and deleting gives the room back. */
static void test_index_capacity(void **state)
{
    fx *f = *state;
    enum { KEY = 4096 };
    char key[KEY];
    storage_UnitStats st;
    ctl_reply *reply = NULL;
    size_t stored = 0;
    int rc = 0;
    memset(key, 'a', sizeof key);
    for (; stored < 64; stored++) {
        snprintf(key, 16, "%08zu", stored);
        key[8] = 'a'; /* keep the key KEY bytes long */
        rc = put(f, (ctl_str){key, KEY}, S(""), false);
        if (rc != 0)
            break;
    }
    assert_int_equal(rc, CTL_UNIT_FULL);
    assert_non_null(strstr(f->err.msg, "no room for another key"));
    assert_non_null(strstr(f->err.msg, "of 65536 bytes of keys and bookkeeping in use "
                                       "(--index-capacity)"));
    /* 64 KiB of index holds fewer than 16 keys of 4 KiB (each costs its
     * bookkeeping too), and at least 14. */
    assert_in_range(stored, 14, 15);
    assert_int_equal(storage_stats(f->client, f->endpoint, CALL_MS, &st, &reply, &f->err), 0);
    assert_int_equal(st.blobs, stored);
    assert_int_equal(st.bytes, 0);
    assert_int_equal(st.index_capacity, 65536);
    assert_in_range(st.index_bytes, stored * KEY, 65536);
    ctl_reply_destroy(&reply);
    /* Deleting one gives its room back. */
    snprintf(key, 16, "%08zu", (size_t)0);
    key[8] = 'a';
    const ctl_str gone = {key, KEY};
    storage_delete_args da = {.keys = keys_of(&gone, 1)};
    uint64_t deleted = 0;
    assert_int_equal(storage_delete(f->client, f->endpoint, &da, CALL_MS, &deleted, &f->err), 0);
    assert_int_equal(deleted, 1);
    snprintf(key, 16, "%08zu", stored);
    key[8] = 'a';
    put_ok(f, (ctl_str){key, KEY}, S(""), false);
}

static void test_spill_hostile_keys(void **state)
{
    fx *f = *state;
    char escape[64], escape_abs[64];
    /* Names that would land next to the temporary directory or at the root
     * if a key ever became a path. */
    snprintf(escape, sizeof escape, "../../ctl-hostile-%d", (int)getpid());
    snprintf(escape_abs, sizeof escape_abs, "/tmp/ctl-hostile-abs-%d", (int)getpid());
    size_t long_len = 10 * 1024;
    char *long_key = malloc(long_len);
    assert_non_null(long_key);
    for (size_t i = 0; i < long_len; i++)
        long_key[i] = "../"[i % 3];

    const ctl_str keys[] = {
        ctl_str_c(escape), S("../../etc/passwd"), ctl_str_c(escape_abs), S("/abs/path"),
        S("a/b/c"), S(".."), S("."), S("nul\0/../x"), S("spill"), S("blob-00000000000000000000"),
        {long_key, long_len}, S(""),
    };
    enum { N = sizeof keys / sizeof keys[0], SZ = 1500 };
    static unsigned char data[N][SZ];
    ctl_str want[N];
    for (size_t i = 0; i < N; i++) {
        fill_random(data[i], SZ, (unsigned)i + 100);
        want[i] = (ctl_str){(const char *)data[i], SZ};
        put_ok(f, keys[i], want[i], false); /* each exceeds capacity: spilled */
    }
    storage_UnitStats s = stats(f);
    assert_int_equal(s.blobs, N);
    assert_int_equal(s.spilled, N);
    assert_int_equal(s.bytes, 0);
    get_expect(f, keys, N, want);
    for (size_t i = 0; i < N; i++) {
        storage_BlobInfo b = describe_one(f, keys[i]);
        assert_true(b.spilled);
        assert_int_equal(b.size, SZ);
    }

    /* Every key comes back from list exactly as sent. */
    storage_list_args la;
    storage_list_args_init(&la);
    storage_list_str listed = {.items = NULL, .count = 0};
    ctl_reply *reply = NULL;
    assert_int_equal(storage_list(f->client, f->endpoint, &la, CALL_MS, &listed, &reply,
                                  &f->err), 0);
    assert_int_equal(listed.count, N);
    for (size_t i = 0; i < N; i++) {
        bool found = false;
        for (size_t j = 0; j < listed.count && !found; j++)
            found = listed.items[j].len == keys[i].len &&
                    (keys[i].len == 0 ||
                     memcmp(listed.items[j].ptr, keys[i].ptr, keys[i].len) == 0);
        assert_true(found);
    }
    ctl_reply_destroy(&reply);

    /* Nothing left the spill directory: it holds N regular files (no
     * subdirectories), its parent holds only it, and the escape targets do
     * not exist. */
    assert_int_equal(count_entries(f->spill, false), N);
    assert_only_entry(f->tmp, "spill");
    char path[PATH_MAX + 80];
    snprintf(path, sizeof path, "%s/%s", f->spill, escape);
    assert_int_equal(access(path, F_OK), -1);
    snprintf(path, sizeof path, "/tmp/ctl-hostile-%d", (int)getpid());
    assert_int_equal(access(path, F_OK), -1);
    assert_int_equal(access(escape_abs, F_OK), -1);
    assert_int_equal(access("/abs/path", F_OK), -1);

    /* Deleting them all leaves the spill directory empty. */
    storage_delete_args da = {.keys = keys_of(keys, N)};
    uint64_t n = 0;
    assert_int_equal(storage_delete(f->client, f->endpoint, &da, CALL_MS, &n, &f->err), 0);
    assert_int_equal(n, N);
    assert_int_equal(count_entries(f->spill, true), 0);
    free(long_key);
}

/* A unit killed with SIGKILL leaves its spill files behind. A new unit on
 * the same spill directory must neither fail on nor overwrite them, and
 * removes only its own at shutdown. */
static void test_spill_dir_reused_after_kill(void **state)
{
    fx *f = *state;
    static unsigned char old_blob[2000], new_blob[3000];
    fill_random(old_blob, sizeof old_blob, 11);
    fill_random(new_blob, sizeof new_blob, 12);
    put_ok(f, S("old"), (ctl_str){(const char *)old_blob, sizeof old_blob}, false);
    assert_int_equal(count_entries(f->spill, false), 1);
    ctl_client_destroy(&f->client);
    assert_int_equal(kill(f->pid, SIGKILL), 0);
    assert_true(unit_reap(f, STOP_MS) >= 0);

    assert_int_equal(unit_start(f, "1000", true, NULL), 0);
    assert_int_equal(ctl_client_new(NULL, &f->client, &f->err), 0);
    put_ok(f, S("new1"), (ctl_str){(const char *)new_blob, sizeof new_blob}, false);
    put_ok(f, S("new2"), (ctl_str){(const char *)old_blob, sizeof old_blob}, false);
    const ctl_str k[] = {S("new1"), S("new2")};
    const ctl_str want[] = {{(const char *)new_blob, sizeof new_blob},
                            {(const char *)old_blob, sizeof old_blob}};
    get_expect(f, k, 2, want);
    assert_int_equal(stats(f).spilled, 2);
    assert_int_equal(count_entries(f->spill, false), 3);

    /* The file left behind still holds the old blob, byte for byte. */
    char path[PATH_MAX + 80];
    snprintf(path, sizeof path, "%s/blob-00000000000000000000", f->spill);
    FILE *fp = fopen(path, "rb");
    assert_non_null(fp);
    static unsigned char back[sizeof old_blob + 1];
    assert_int_equal(fread(back, 1, sizeof back, fp), sizeof old_blob);
    fclose(fp);
    assert_memory_equal(back, old_blob, sizeof old_blob);

    ctl_client_destroy(&f->client);
    assert_int_equal(unit_stop(f), 0);
    assert_int_equal(count_entries(f->spill, false), 1);
    assert_int_equal(access(path, F_OK), 0);
}

/* ---- process lifecycle ----------------------------------------------- */

static void test_sigterm_clean_shutdown(void **state)
{
    fx *f = *state;
    static unsigned char big[3000];
    fill_random(big, sizeof big, 9);
    put_ok(f, S("mem"), S("in memory"), true);
    put_ok(f, S("disk1"), (ctl_str){(const char *)big, sizeof big}, false);
    put_ok(f, S("disk2"), (ctl_str){(const char *)big, sizeof big}, true);
    assert_int_equal(count_entries(f->spill, false), 2);
    ctl_client_destroy(&f->client);
    /* Exit status 0 (also: no leak reported under LeakSanitizer). */
    assert_int_equal(unit_stop(f), 0);
    assert_int_equal(count_entries(f->spill, true), 0);
}

/* One of the callers of the drain test: puts until a call fails, noting
 * when its last reply came. */
typedef struct drain_caller {
    const fx *f;
    int id;
    size_t ok;
    int rc;
    ctl_cause cause;
    char reason[32];
} drain_caller;

static void *put_until_refused(void *arg)
{
    drain_caller *c = arg;
    ctl_error err;
    ctl_error_init(&err);
    for (size_t i = 0; i < 1000000; i++) {
        char key[32];
        int n = snprintf(key, sizeof key, "c%d-%zu", c->id, i % 64);
        storage_put_args a = STORAGE_PUT_ARGS_INIT;
        a.key = (ctl_str){key, (size_t)n};
        a.data = S("v");
        c->rc = storage_put(c->f->client, c->f->endpoint, &a, 3000, NULL, &err);
        if (c->rc != 0) {
            c->cause = err.cause;
            snprintf(c->reason, sizeof c->reason, "%s", err.reason ? err.reason : "");
            break;
        }
        c->ok++;
    }
    ctl_error_fini(&err);
    return NULL;
}

/* SIGTERM under the load of 32 calling threads: the unit drains. The
 * request of every caller gets an answer, its reply or Busy "draining"
 * (so each caller stops at a Busy it can act on, and none waits out its
 * deadline), and the unit exits 0 once they have stopped, well within its
 * drain timeout (1 s here). A caller that the machine kept off the CPU
 * from its last reply until the unit had gone (the unit leaves once no
 * request has come for 50 ms) finds nothing listening: its next request is
 * refused before it is sent, which is as good as Busy; every other ending
 * fails the test, and at least one caller must have met the drain. */
static void test_sigterm_drains_under_load(void **state)
{
    enum { CALLERS = 32 };
    fx *f = *state;
    drain_caller c[CALLERS];
    pthread_t t[CALLERS];
    for (int i = 0; i < CALLERS; i++) {
        c[i] = (drain_caller){.f = f, .id = i};
        assert_int_equal(pthread_create(&t[i], NULL, put_until_refused, &c[i]), 0);
    }
    tu_sleep_ms(500);
    int64_t t_term = tu_now_ms();
    assert_int_equal(kill(f->pid, SIGTERM), 0);
    int status = unit_reap(f, STOP_MS);
    int64_t took = tu_now_ms() - t_term;
    /* Every caller ends within its 3 s deadline once the unit is gone:
     * joined before any check, so no failure leaves one calling on the
     * fixture's client while teardown destroys it. A unit that did not
     * exit is killed first, so that they end. */
    if (status < 0 && f->pid > 0) {
        kill(f->pid, SIGKILL);
        unit_reap(f, STOP_MS);
    }
    for (int i = 0; i < CALLERS; i++)
        pthread_join(t[i], NULL);
    assert_true(status >= 0 && WIFEXITED(status));
    assert_int_equal(WEXITSTATUS(status), 0);
    assert_true(took < 1000 + 3000);
    size_t ok = 0, busy = 0, refused = 0;
    for (int i = 0; i < CALLERS; i++) {
        ok += c[i].ok;
        if (c[i].rc == CTL_BUSY && strcmp(c[i].reason, "draining") == 0)
            busy++;
        else if (c[i].rc == CTL_TRANSFER && c[i].cause == CTL_CAUSE_REFUSED)
            refused++;
        else
            fail_msg("caller %d: its last call ended with kind %d cause %d reason '%s', "
                     "not Busy \"draining\" (nor refused, unsent, after the unit left)", i,
                     c[i].rc, (int)c[i].cause, c[i].reason);
    }
    assert_true(busy >= 1);
    print_message("drain: %zu puts answered; %zu callers ended at Busy \"draining\", %zu "
                  "refused after the unit left; unit exited %" PRId64 " ms after SIGTERM\n",
                  ok, busy, refused, took);
}

/* A unit frozen (SIGSTOP) does not answer: the call ends at its deadline
 * with a timeout, and the same client works once the unit runs again. */
static void test_timeout_frozen_unit(void **state)
{
    fx *f = *state;
    put_ok(f, S("k"), S("v"), false);
    unit_freeze(f);
    const ctl_str k[] = {S("k")};
    storage_get_args ga = {.keys = keys_of(k, 1)};
    storage_list_bin blobs;
    ctl_reply *reply = NULL;
    int64_t t0 = tu_now_ms();
    int rc = storage_get(f->client, f->endpoint, &ga, 400, &blobs, &reply, &f->err);
    int64_t took = tu_now_ms() - t0;
    assert_int_equal(kill(f->pid, SIGCONT), 0);
    assert_int_equal(rc, CTL_TRANSFER);
    assert_int_equal(f->err.cause, CTL_CAUSE_TIMEOUT);
    assert_true(took >= 350);
    assert_true(took < 400 + 3000);
    const ctl_str want[] = {S("v")};
    get_expect(f, k, 1, want);
}

/* ---- ctl_blob: bins sent without a copy ------------------------------ */

/* What an asynchronous call left for its test: the outcome, and for a get
 * whether its one bin equals `want`. */
typedef struct blob_done {
    int calls;          /* completions seen */
    int kind;           /* the last one's error kind */
    ctl_cause cause;
    bool equal;         /* a get's bin matched `want` */
    ctl_str want;
} blob_done;

static void on_blob_put(void *user, const ctl_error *err, const uint64_t *result)
{
    blob_done *d = user;
    d->calls++;
    d->kind = err->kind;
    d->cause = err->cause;
    d->equal = result && *result == d->want.len;
}

static void on_blob_get(void *user, const ctl_error *err, const storage_list_bin *result)
{
    blob_done *d = user;
    d->calls++;
    d->kind = err->kind;
    d->cause = err->cause;
    d->equal = result && result->count == 1 && result->items[0].len == d->want.len &&
               memcmp(result->items[0].ptr, d->want.ptr, d->want.len) == 0;
}

/* Wait (up to `ms`) for the call, then run the queued completions, its
 * own among them (or already run by an earlier wait): it ran once. */
static void blob_wait(ctl_client *client, ctl_call *call, int ms, const blob_done *d)
{
    assert_int_equal(ctl_call_wait(call, ms), 0);
    ctl_client_process(client, 0);
    assert_int_equal(d->calls, 1);
    ctl_call_release(call);
}

/* Puts from a ctl_blob (the whole blob, sent without a copy; a range of
 * it at an odd offset and its first bytes, which the put's `pin` follows:
 * copied, since the room must not cover the caller's bytes around them;
 * the blob's bytes left as they were), gets that answer from the
 * held put requests, two gets of one blob in flight at once (the second
 * reply cannot borrow the room the first is being sent from, so it is
 * copied), and a put of one blob twice at once: every byte comes back. */
static void test_blob_put_get(void **state)
{
    fx *f = *state;
    size_t size = (size_t)3 << 20, off = 4097, part = (size_t)1 << 20;
    ctl_blob *b = ctl_blob_new(size);
    assert_non_null(b);
    assert_int_equal(ctl_blob_size(b), size);
    fill_random(ctl_blob_data(b), size, 11);
    ctl_str whole = ctl_blob_bin(b, 0, size), range = ctl_blob_bin(b, off, part);
    assert_int_equal(range.len, part);
    /* Clamped to the blob. */
    assert_int_equal(ctl_blob_bin(b, size - 10, 100).len, 10);
    assert_int_equal(ctl_blob_bin(b, size + 10, 100).len, 0);

    unsigned char *copy = malloc(size);
    assert_non_null(copy);
    memcpy(copy, whole.ptr, size);
    put_ok(f, S("whole"), whole, true);
    put_ok(f, S("range"), range, false);
    put_ok(f, S("first"), ctl_blob_bin(b, 0, part), false);
    assert_memory_equal(whole.ptr, copy, size);
    free(copy);

    /* Over a client's message limit, a put from a blob is refused before
     * anything is sent, and lets the blob go. */
    ctl_client_options lo;
    ctl_client_options_init(&lo);
    lo.limits.max_msg_bytes = part;
    ctl_client *limited = NULL;
    assert_int_equal(ctl_client_new(&lo, &limited, &f->err), 0);
    storage_put_args big;
    storage_put_args_init(&big);
    big.key = S("too-big");
    big.data = whole;
    uint64_t stored = 0;
    assert_int_equal(storage_put(limited, f->endpoint, &big, CALL_MS, &stored, &f->err),
                     CTL_TRANSFER);
    assert_int_equal(f->err.cause, CTL_CAUSE_TOO_LARGE);
    assert_false(ctl_blob_sending(b));
    ctl_client_destroy(&limited);
    const ctl_str first[] = {S("first")}, first_want = ctl_blob_bin(b, 0, part);
    get_expect(f, first, 1, &first_want);
    const ctl_str one[] = {S("whole")}, two[] = {S("range")};
    get_expect(f, one, 1, &whole);
    get_expect(f, two, 1, &range);
    const ctl_str both[] = {S("whole"), S("range")}, want[] = {whole, range};
    get_expect(f, both, 2, want);
    get_expect(f, both, 2, want); /* again, from the same holds */

    blob_done g1 = {.want = whole}, g2 = {.want = whole};
    storage_get_args ga = {.keys = keys_of(one, 1)};
    ctl_call *c1 = NULL, *c2 = NULL;
    assert_int_equal(storage_get_start(f->client, f->endpoint, &ga, CALL_MS, on_blob_get, &g1,
                                       &c1), 0);
    assert_int_equal(storage_get_start(f->client, f->endpoint, &ga, CALL_MS, on_blob_get, &g2,
                                       &c2), 0);
    blob_wait(f->client, c1, CALL_MS + 2000, &g1);
    blob_wait(f->client, c2, CALL_MS + 2000, &g2);
    assert_true(g1.equal);
    assert_true(g2.equal);

    blob_done p1 = {.want = whole}, p2 = {.want = whole};
    storage_put_args pa;
    storage_put_args_init(&pa);
    pa.key = S("twice-1");
    pa.data = whole;
    assert_int_equal(storage_put_start(f->client, f->endpoint, &pa, CALL_MS, on_blob_put, &p1,
                                       &c1), 0);
    pa.key = S("twice-2");
    assert_int_equal(storage_put_start(f->client, f->endpoint, &pa, CALL_MS, on_blob_put, &p2,
                                       &c2), 0);
    /* The args were copied at start: the blob may go now; the calls keep
     * what they send. */
    ctl_blob_release(&b);
    assert_null(b);
    ctl_blob_release(&b); /* NULL is accepted */
    blob_wait(f->client, c1, CALL_MS + 2000, &p1);
    blob_wait(f->client, c2, CALL_MS + 2000, &p2);
    assert_int_equal(p1.kind, CTL_OK);
    assert_int_equal(p2.kind, CTL_OK);
    assert_true(p1.equal && p2.equal);
    storage_UnitStats st = stats(f);
    assert_int_equal(st.blobs, 5);
    assert_int_equal(st.bytes, 3 * size + 2 * part);
}

typedef struct blob_thread {
    fx *f;
    ctl_blob *blob;
    int id;
    int failures;
} blob_thread;

/* Put one shared blob under keys of its own and read each back. */
static void *blob_put_get_loop(void *arg)
{
    blob_thread *t = arg;
    ctl_client *client = NULL;
    ctl_error err;
    ctl_error_init(&err);
    ctl_str data = ctl_blob_bin(t->blob, 0, ctl_blob_size(t->blob));
    if (ctl_client_new(NULL, &client, &err) != 0) {
        t->failures++;
        ctl_error_fini(&err);
        return NULL;
    }
    for (int i = 0; i < 12; i++) {
        char key[32];
        snprintf(key, sizeof key, "t%d-%d", t->id, i % 3);
        storage_put_args pa;
        storage_put_args_init(&pa);
        pa.key = ctl_str_c(key);
        pa.data = data;
        uint64_t stored = 0;
        const ctl_str keys[] = {pa.key};
        storage_get_args ga = {.keys = keys_of(keys, 1)};
        storage_list_bin got = {NULL, 0};
        ctl_reply *reply = NULL;
        if (storage_put(client, t->f->endpoint, &pa, CALL_MS, &stored, &err) != 0 ||
            stored != data.len ||
            storage_get(client, t->f->endpoint, &ga, CALL_MS, &got, &reply, &err) != 0 ||
            got.count != 1 || got.items[0].len != data.len ||
            memcmp(got.items[0].ptr, data.ptr, data.len) != 0)
            t->failures++;
        ctl_reply_destroy(&reply);
    }
    ctl_client_destroy(&client);
    ctl_error_fini(&err);
    return NULL;
}

/* Four threads, each with its own client, put one blob and get it back
 * at once: one message at a time borrows the blob's room, the others copy
 * it, and the unit answers each get from its held put. */
static void test_blob_shared_by_threads(void **state)
{
    fx *f = *state;
    enum { THREADS = 4 };
    ctl_blob *b = ctl_blob_new((size_t)256 << 10);
    assert_non_null(b);
    fill_random(ctl_blob_data(b), ctl_blob_size(b), 3);
    blob_thread t[THREADS];
    pthread_t th[THREADS];
    for (int i = 0; i < THREADS; i++) {
        t[i] = (blob_thread){f, b, i, 0};
        assert_int_equal(pthread_create(&th[i], NULL, blob_put_get_loop, &t[i]), 0);
    }
    for (int i = 0; i < THREADS; i++) {
        pthread_join(th[i], NULL);
        assert_int_equal(t[i].failures, 0);
    }
    ctl_blob_release(&b);
    assert_int_equal(stats(f).blobs, 3 * THREADS);
}

/* A put from a blob to a frozen unit: while its request waits in ZeroMQ,
 * the blob is being sent (its memory is the message); a second put of
 * the same blob meanwhile is sent from a copy. The first times out and
 * its socket is closed at once (late_grace_ms 0), which lets the blob go;
 * once the unit runs again, the second put lands whole, and the blob can
 * be sent again. */
static void test_blob_sending_until_dropped(void **state)
{
    fx *f = *state;
    size_t size = (size_t)32 << 20; /* more than the kernel's buffers take */
    ctl_client_options o;
    ctl_client_options_init(&o);
    o.late_grace_ms = 0;
    ctl_client *client = NULL;
    assert_int_equal(ctl_client_new(&o, &client, &f->err), 0);
    ctl_blob *b = ctl_blob_new(size);
    assert_non_null(b);
    fill_random(ctl_blob_data(b), size, 5);
    ctl_str data = ctl_blob_bin(b, 0, size);
    assert_false(ctl_blob_sending(b));

    unit_freeze(f);
    blob_done p1 = {.want = data}, p2 = {.want = data};
    storage_put_args pa;
    storage_put_args_init(&pa);
    pa.key = S("first");
    pa.data = data;
    ctl_call *c1 = NULL, *c2 = NULL;
    assert_int_equal(storage_put_start(client, f->endpoint, &pa, 300, on_blob_put, &p1, &c1), 0);
    int64_t deadline = tu_now_ms() + 5000;
    while (!ctl_blob_sending(b) && tu_now_ms() < deadline)
        tu_sleep_ms(1);
    assert_true(ctl_blob_sending(b));
    pa.key = S("second");
    assert_int_equal(storage_put_start(client, f->endpoint, &pa, CALL_MS + 5000, on_blob_put,
                                       &p2, &c2), 0);
    blob_wait(client, c1, 5000, &p1);
    assert_int_equal(p1.kind, CTL_TRANSFER);
    assert_int_equal(p1.cause, CTL_CAUSE_TIMEOUT);
    deadline = tu_now_ms() + 5000;
    while (ctl_blob_sending(b) && tu_now_ms() < deadline)
        tu_sleep_ms(1);
    assert_false(ctl_blob_sending(b));

    assert_int_equal(kill(f->pid, SIGCONT), 0);
    blob_wait(client, c2, CALL_MS + 5000, &p2);
    assert_int_equal(p2.kind, CTL_OK);
    assert_true(p2.equal);
    const ctl_str second[] = {S("second")};
    get_expect(f, second, 1, &data);
    put_ok(f, S("first"), data, false);
    const ctl_str first[] = {S("first")};
    get_expect(f, first, 1, &data);
    ctl_blob_release(&b);
    ctl_client_destroy(&client);
}

typedef struct caller {
    fx *f;
    atomic_int ok_calls;
    int rc;
    ctl_cause cause;
    int64_t took_ms;
} caller;

#define KILL_CALL_MS 3000

/* Call get in a loop until one fails; record that failure and its time. */
static void *call_until_failure(void *arg)
{
    caller *c = arg;
    const ctl_str k[] = {S("big")};
    storage_get_args ga = {.keys = keys_of(k, 1)};
    ctl_error err;
    ctl_error_init(&err);
    for (;;) {
        storage_list_bin blobs;
        ctl_reply *reply = NULL;
        int64_t t0 = tu_now_ms();
        int rc = storage_get(c->f->client, c->f->endpoint, &ga, KILL_CALL_MS, &blobs,
                             &reply, &err);
        c->took_ms = tu_now_ms() - t0;
        ctl_reply_destroy(&reply);
        if (rc != 0) {
            c->rc = rc;
            c->cause = err.cause;
            break;
        }
        atomic_fetch_add(&c->ok_calls, 1);
    }
    ctl_error_fini(&err);
    return NULL;
}

static void test_sigkill_mid_call(void **state)
{
    fx *f = *state;
    size_t mib = (size_t)1 << 20;
    unsigned char *big = malloc(mib);
    assert_non_null(big);
    fill_random(big, mib, 3);
    put_ok(f, S("big"), (ctl_str){(const char *)big, mib}, false);

    caller c = {.f = f};
    atomic_init(&c.ok_calls, 0);
    pthread_t t;
    assert_int_equal(pthread_create(&t, NULL, call_until_failure, &c), 0);
    int64_t deadline = tu_now_ms() + CALL_MS;
    while (atomic_load(&c.ok_calls) < 3 && tu_now_ms() < deadline)
        tu_sleep_ms(5);
    assert_true(atomic_load(&c.ok_calls) >= 3);
    assert_int_equal(kill(f->pid, SIGKILL), 0);
    int status = unit_reap(f, STOP_MS);
    assert_true(status >= 0 && WIFSIGNALED(status) && WTERMSIG(status) == SIGKILL);
    pthread_join(t, NULL);

    /* The call under way failed as a transfer, within its deadline. */
    assert_int_equal(c.rc, CTL_TRANSFER);
    /* Usually it ends early: the reconnection to the dead unit is refused. */
    assert_true(c.cause == CTL_CAUSE_TIMEOUT || c.cause == CTL_CAUSE_TRANSPORT ||
                c.cause == CTL_CAUSE_REFUSED);
    assert_true(c.took_ms <= KILL_CALL_MS + 2000);

    /* A new unit on the same endpoint (same port): the same client works
     * again. It is a new unit, so the old blobs are gone. */
    char endpoint[CTL_ENDPOINT_MAX];
    snprintf(endpoint, sizeof endpoint, "%s", f->endpoint);
    int started = -1;
    for (int attempt = 0; attempt < 20 && started != 0; attempt++) {
        started = unit_start(f, "64M", false, endpoint);
        if (started != 0) {
            if (f->pid > 0)
                unit_reap(f, STOP_MS);
            tu_sleep_ms(250); /* the port may take a moment to be free */
        }
    }
    assert_int_equal(started, 0);
    assert_string_equal(f->endpoint, endpoint);
    const ctl_str k[] = {S("big")};
    storage_get_args ga = {.keys = keys_of(k, 1)};
    storage_list_bin blobs;
    ctl_reply *reply = NULL;
    assert_int_equal(storage_get(f->client, f->endpoint, &ga, CALL_MS, &blobs, &reply,
                                 &f->err), CTL_MISSING);
    put_ok(f, S("big"), (ctl_str){(const char *)big, mib}, false);
    const ctl_str want[] = {{(const char *)big, mib}};
    get_expect(f, k, 1, want);
    free(big);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup_teardown(test_put_get_exact, setup_big, teardown),
        cmocka_unit_test_setup_teardown(test_overwrite_replaces_size, setup_big, teardown),
        cmocka_unit_test_setup_teardown(test_put_pinned_is_busy, setup_big, teardown),
        cmocka_unit_test_setup_teardown(test_unit_full, setup_small, teardown),
        cmocka_unit_test_setup_teardown(test_missing_names_absent_keys, setup_big, teardown),
        cmocka_unit_test_setup_teardown(test_describe, setup_big, teardown),
        cmocka_unit_test_setup_teardown(test_pin_counts_distinct, setup_big, teardown),
        cmocka_unit_test_setup_teardown(test_unpin_abort_notify, setup_big, teardown),
        cmocka_unit_test_setup_teardown(test_delete, setup_big, teardown),
        cmocka_unit_test_setup_teardown(test_list_prefix_sorted, setup_big, teardown),
        cmocka_unit_test_setup_teardown(test_stats_requests, setup_big, teardown),
        cmocka_unit_test_setup_teardown(test_stats_dropped, setup_big, teardown),
        cmocka_unit_test_setup_teardown(test_raw_error_maps, setup_big, teardown),
        cmocka_unit_test_setup_teardown(test_req_peer, setup_big, teardown),
        cmocka_unit_test_setup_teardown(test_protocol_error_is_transfer, setup_big, teardown),
        cmocka_unit_test_setup_teardown(test_spill_beyond_capacity, setup_spill, teardown),
        cmocka_unit_test_setup_teardown(test_spill_file_lost, setup_spill, teardown),
        cmocka_unit_test_setup_teardown(test_spill_hostile_keys, setup_spill, teardown),
        cmocka_unit_test_setup_teardown(test_spill_write_fails, setup_spill_fsize, teardown),
        cmocka_unit_test_setup_teardown(test_key_limit, setup_big, teardown),
        cmocka_unit_test_setup_teardown(test_list_paging, setup_big, teardown),
        cmocka_unit_test_setup_teardown(test_list_pages_in_byte_order, setup_big, teardown),
        cmocka_unit_test_setup_teardown(test_index_capacity, setup_small_index, teardown),
        cmocka_unit_test_setup_teardown(test_flood_tiny_blobs, setup_flood, teardown),
        cmocka_unit_test_setup_teardown(test_flood_long_keys, setup_flood, teardown),
        cmocka_unit_test_setup_teardown(test_flood_million_tiny_blobs, setup_million,
                                        teardown),
        cmocka_unit_test_setup_teardown(test_spill_dir_reused_after_kill, setup_spill, teardown),
        cmocka_unit_test_setup_teardown(test_sigterm_clean_shutdown, setup_spill, teardown),
        cmocka_unit_test_setup_teardown(test_sigterm_drains_under_load, setup_big, teardown),
        cmocka_unit_test_setup_teardown(test_timeout_frozen_unit, setup_big, teardown),
        cmocka_unit_test_setup_teardown(test_blob_put_get, setup_big, teardown),
        cmocka_unit_test_setup_teardown(test_blob_shared_by_threads, setup_big, teardown),
        cmocka_unit_test_setup_teardown(test_blob_sending_until_dropped, setup_big, teardown),
        cmocka_unit_test_setup_teardown(test_sigkill_mid_call, setup_big, teardown),
    };
    /* A unit that dies under a test must not take the test with it. */
    signal(SIGPIPE, SIG_IGN);
    unit_cmd_init();
    return cmocka_run_group_tests_name("storage", tests, NULL, NULL);
}
