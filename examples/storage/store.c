/*
 * store.c - see store.h.
 *
 * Blobs sit in a chained hash table (FNV-1a over the key bytes) that doubles
 * when it gets as full as it has buckets. The same nodes are also kept in a
 * red-black tree in key order (byte order, then length), so `list` seeks to
 * its first key and walks forward instead of scanning the table: O(log n +
 * page) whatever the unit holds, with a depth of at most 2 log2(n + 1)
 * whatever order the keys come in. The tree has parent links, so nothing
 * on it recurses or keeps a stack. Spill files live in a directory the
 * store opens once; all file operations go through that directory's
 * descriptor (openat/unlinkat) with names the store makes up, so nothing a
 * client sends ever becomes part of a path.
 */
#define _GNU_SOURCE
#include "store.h"

#include <ctype.h>
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

typedef struct node {
    struct node *next;               /* in its bucket */
    struct node *left, *right, *up; /* in the key-ordered tree */
    uint64_t hash;
    bool red;
    store_blob blob;
} node;

struct store {
    node **buckets;
    node *root; /* of the key-ordered tree */
    size_t nbuckets;
    size_t count;
    uint64_t capacity;
    uint64_t bytes; /* in memory */
    size_t max_key;
    uint32_t max_list;
    uint64_t index_capacity;
    uint64_t index_bytes; /* keys and bookkeeping: the blobs' index_cost */
    uint64_t pinned;
    uint64_t spilled;
    int spill_fd; /* -1: no spilling */
    char *spill_dir;
    uint64_t next_spill;
    uint64_t pass;
};

/* What the index charges a blob beside its key covers its node (table
 * link, tree links and colour, hash, record) with the allocator's header
 * and rounding (16 bytes on glibc), the smallest chunks the allocator makes
 * for its key copy and its bytes in memory (32 bytes each on glibc, which
 * an empty blob or a key of a few bytes still takes; longer ones are
 * charged their length: the key to the index, the bytes to the capacity)
 * and two bucket slots (the table is at most half full after it grows). */
_Static_assert(sizeof(node) + 16 + 2 * 32 + 2 * sizeof(node *) <= STORE_BLOB_OVERHEAD,
               "STORE_BLOB_OVERHEAD is too small for a node");

static uint64_t hash_key(ctl_str k)
{
    uint64_t h = 1469598103934665603ull;
    for (size_t i = 0; i < k.len; i++)
        h = (h ^ (unsigned char)k.ptr[i]) * 1099511628211ull;
    return h;
}

int store_new(uint64_t capacity, const char *spill_dir, store **out,
              ctl_error *err)
{
    *out = NULL;
    store *s = calloc(1, sizeof *s);
    if (!s)
        return ctl_error_set(err, CTL_INVALID, "store: out of memory");
    s->nbuckets = 64;
    s->buckets = calloc(s->nbuckets, sizeof *s->buckets);
    s->capacity = capacity;
    store_set_limits(s, 0, 0, 0);
    s->spill_fd = -1;
    if (!s->buckets) {
        free(s);
        return ctl_error_set(err, CTL_INVALID, "store: out of memory");
    }
    if (spill_dir) {
        if (mkdir(spill_dir, 0700) != 0 && errno != EEXIST) {
            int e = errno;
            store_destroy(&s);
            return ctl_error_set(err, CTL_INVALID,
                                 "spill directory %s: cannot create it: %s",
                                 spill_dir, strerror(e));
        }
        s->spill_fd = open(spill_dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
        s->spill_dir = strdup(spill_dir);
        if (s->spill_fd < 0 || !s->spill_dir) {
            int e = errno;
            store_destroy(&s);
            return ctl_error_set(err, CTL_INVALID,
                                 "spill directory %s: cannot open it: %s",
                                 spill_dir, strerror(e));
        }
    }
    *out = s;
    return 0;
}

void store_set_limits(store *s, size_t max_key_bytes, uint64_t index_capacity,
                      uint32_t max_list_keys)
{
    s->max_key = max_key_bytes ? max_key_bytes : STORE_DEFAULT_MAX_KEY_BYTES;
    s->index_capacity = index_capacity ? index_capacity : STORE_DEFAULT_INDEX_CAPACITY;
    s->max_list = max_list_keys ? max_list_keys : STORE_DEFAULT_MAX_LIST_KEYS;
}

uint32_t store_max_list(const store *s)
{
    return s->max_list;
}

static void spill_name(uint64_t id, char buf[40])
{
    snprintf(buf, 40, "blob-%020llu", (unsigned long long)id);
}

/* Release a blob's bytes (memory or spill file) and its counters. */
static void drop_data(store *s, store_blob *b)
{
    if (b->spilled) {
        char name[40];
        spill_name(b->spill_id, name);
        unlinkat(s->spill_fd, name, 0);
        s->spilled--;
    } else {
        s->bytes -= b->size;
        if (b->hold)
            ctl_hold_release(&b->hold);
        else
            free(b->data);
    }
    b->data = NULL;
    b->spilled = false;
}

void store_destroy(store **sp)
{
    if (!sp || !*sp)
        return;
    store *s = *sp;
    for (size_t i = 0; i < s->nbuckets && s->buckets; i++) {
        node *n = s->buckets[i];
        while (n) {
            node *next = n->next;
            drop_data(s, &n->blob);
            free((char *)n->blob.key.ptr);
            free(n);
            n = next;
        }
    }
    if (s->spill_fd >= 0)
        close(s->spill_fd);
    free(s->spill_dir);
    free(s->buckets);
    free(s);
    *sp = NULL;
}

static node **slot(store *s, ctl_str key, uint64_t h)
{
    node **p = &s->buckets[h % s->nbuckets];
    while (*p && !((*p)->hash == h && (*p)->blob.key.len == key.len &&
                   memcmp((*p)->blob.key.ptr, key.ptr, key.len) == 0))
        p = &(*p)->next;
    return p;
}

store_blob *store_find(store *s, ctl_str key)
{
    node *n = *slot(s, key, hash_key(key));
    return n ? &n->blob : NULL;
}

static void grow(store *s)
{
    size_t nb = s->nbuckets * 2;
    node **b = calloc(nb, sizeof *b);
    if (!b)
        return; /* keep the old table: slower, still correct */
    for (size_t i = 0; i < s->nbuckets; i++) {
        node *n = s->buckets[i];
        while (n) {
            node *next = n->next;
            n->next = b[n->hash % nb];
            b[n->hash % nb] = n;
            n = next;
        }
    }
    free(s->buckets);
    s->buckets = b;
    s->nbuckets = nb;
}

/* ---- the key-ordered tree ------------------------------------------------
 *
 * A red-black tree (the textbook one, with parent links and NULL leaves):
 * every path from the root to a leaf has as many black nodes, and no red
 * node has a red child, so no path is more than twice as long as another.
 * Loops only: its depth is bounded, but nothing here depends on that. */

/* Byte order, then length: the order of memcmp on keys, which is what a
 * peer in any language gets by sorting byte strings. */
static int key_cmp(ctl_str a, ctl_str b)
{
    size_t n = a.len < b.len ? a.len : b.len;
    int c = n ? memcmp(a.ptr, b.ptr, n) : 0;
    if (c)
        return c;
    return a.len < b.len ? -1 : a.len > b.len;
}

static bool has_prefix(ctl_str key, ctl_str prefix)
{
    return key.len >= prefix.len &&
           (prefix.len == 0 || memcmp(key.ptr, prefix.ptr, prefix.len) == 0);
}

static bool is_red(const node *n)
{
    return n && n->red;
}

/* Put `to` where `from` hangs (under from's parent, or as the root). */
static void replace_child(store *s, node *from, node *to)
{
    if (!from->up)
        s->root = to;
    else if (from == from->up->left)
        from->up->left = to;
    else
        from->up->right = to;
    if (to)
        to->up = from->up;
}

/* x's right child takes its place; x becomes that child's left. */
static void rotate_left(store *s, node *x)
{
    node *y = x->right;
    x->right = y->left;
    if (y->left)
        y->left->up = x;
    replace_child(s, x, y);
    y->left = x;
    x->up = y;
}

static void rotate_right(store *s, node *x)
{
    node *y = x->left;
    x->left = y->right;
    if (y->right)
        y->right->up = x;
    replace_child(s, x, y);
    y->right = x;
    x->up = y;
}

/* Add `z` (a key not in the tree yet). */
static void tree_insert(store *s, node *z)
{
    node *parent = NULL, **link = &s->root;
    while (*link) {
        parent = *link;
        link = key_cmp(z->blob.key, parent->blob.key) < 0 ? &parent->left : &parent->right;
    }
    z->up = parent;
    z->left = z->right = NULL;
    z->red = true;
    *link = z;
    /* A red node under a red parent: recolour up the tree while the
     * uncle is red, else one or two rotations end it. The parent being
     * red, it is not the root (which is black), so the grandparent
     * exists. */
    while (is_red(z->up)) {
        node *p = z->up, *g = p->up;
        if (p == g->left) {
            node *uncle = g->right;
            if (is_red(uncle)) {
                p->red = uncle->red = false;
                g->red = true;
                z = g;
                continue;
            }
            if (z == p->right) {
                rotate_left(s, p);
                z = p;
                p = z->up;
            }
            p->red = false;
            g->red = true;
            rotate_right(s, g);
        } else {
            node *uncle = g->left;
            if (is_red(uncle)) {
                p->red = uncle->red = false;
                g->red = true;
                z = g;
                continue;
            }
            if (z == p->left) {
                rotate_right(s, p);
                z = p;
                p = z->up;
            }
            p->red = false;
            g->red = true;
            rotate_left(s, g);
        }
    }
    s->root->red = false;
}

/* Take `z` out of the tree. */
static void tree_remove(store *s, node *z)
{
    node *x, *xp; /* what took the removed place (may be NULL), its parent */
    bool removed_black = !z->red;
    if (!z->left || !z->right) {
        x = z->left ? z->left : z->right;
        xp = z->up;
        replace_child(s, z, x);
    } else {
        /* Two children: z's successor (the leftmost of its right subtree,
         * which has no left child) takes z's place and colour, and the
         * successor's own place is the one that loses a node. */
        node *y = z->right;
        while (y->left)
            y = y->left;
        removed_black = !y->red;
        x = y->right;
        if (y->up == z) {
            xp = y;
        } else {
            xp = y->up;
            replace_child(s, y, y->right);
            y->right = z->right;
            y->right->up = y;
        }
        replace_child(s, z, y);
        y->left = z->left;
        y->left->up = y;
        y->red = z->red;
    }
    if (!removed_black)
        return;
    /* The paths through x lack one black node. x's sibling w exists (its
     * side has at least one black node more than x's). */
    while (x != s->root && !is_red(x)) {
        if (x == xp->left) {
            node *w = xp->right;
            if (w->red) {
                w->red = false;
                xp->red = true;
                rotate_left(s, xp);
                w = xp->right;
            }
            if (!is_red(w->left) && !is_red(w->right)) {
                w->red = true;
                x = xp;
                xp = x->up;
                continue;
            }
            if (!is_red(w->right)) {
                w->left->red = false;
                w->red = true;
                rotate_right(s, w);
                w = xp->right;
            }
            w->red = xp->red;
            xp->red = false;
            w->right->red = false;
            rotate_left(s, xp);
        } else {
            node *w = xp->left;
            if (w->red) {
                w->red = false;
                xp->red = true;
                rotate_right(s, xp);
                w = xp->left;
            }
            if (!is_red(w->left) && !is_red(w->right)) {
                w->red = true;
                x = xp;
                xp = x->up;
                continue;
            }
            if (!is_red(w->left)) {
                w->right->red = false;
                w->red = true;
                rotate_left(s, w);
                w = xp->left;
            }
            w->red = xp->red;
            xp->red = false;
            w->left->red = false;
            rotate_right(s, xp);
        }
        x = s->root;
    }
    if (x)
        x->red = false;
}

/* The node after `n` in key order, or NULL. */
static node *tree_next(const node *n)
{
    if (n->right) {
        n = n->right;
        while (n->left)
            n = n->left;
        return (node *)n;
    }
    while (n->up && n == n->up->right)
        n = n->up;
    return n->up;
}

/* The first node whose key is >= `key` (> when `strict`), or NULL. */
static node *tree_seek(const store *s, ctl_str key, bool strict)
{
    node *found = NULL;
    for (node *n = s->root; n;) {
        int c = key_cmp(n->blob.key, key);
        if (c > 0 || (c == 0 && !strict)) {
            found = n;
            n = n->left;
        } else {
            n = n->right;
        }
    }
    return found;
}

/* A spill that failed: the partial file (if any) is removed, and the put
 * fails with UnitFull naming the cause (ENOSPC, EDQUOT, EFBIG, EACCES, an
 * I/O error...): the blob does not fit anywhere, and nothing stored
 * before is touched. */
static int spill_failed(store *s, const char *name, int fd, int e, size_t len,
                        ctl_error *err)
{
    if (fd >= 0) {
        close(fd);
        unlinkat(s->spill_fd, name, 0);
    }
    return ctl_error_set(err, CTL_UNIT_FULL,
                         "%zu bytes do not fit in memory and cannot be spilled to "
                         "%s/%s: %s", len, s->spill_dir, name, strerror(e));
}

/* Write `data` to a new spill file; returns its id or sets `err`. */
static int spill_write(store *s, ctl_str data, uint64_t *id, ctl_error *err)
{
    char name[40];
    uint64_t n;
    int fd;
    /* A name already taken is not ours (a unit killed before it could
     * clean up, or another unit sharing the directory): leave that file
     * alone and take the next number. */
    do {
        n = s->next_spill++;
        spill_name(n, name);
        fd = openat(s->spill_fd, name, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0600);
    } while (fd < 0 && errno == EEXIST);
    if (fd < 0)
        return spill_failed(s, name, -1, errno, data.len, err);
    size_t off = 0;
    while (off < data.len) {
        ssize_t w = write(fd, data.ptr + off, data.len - off);
        if (w < 0 && errno == EINTR)
            continue;
        if (w <= 0) /* a write of nothing: the device is full */
            return spill_failed(s, name, fd, w == 0 ? ENOSPC : errno, data.len, err);
        off += (size_t)w;
    }
    if (close(fd) != 0) {
        int e = errno;
        unlinkat(s->spill_fd, name, 0);
        return spill_failed(s, name, -1, e, data.len, err);
    }
    *id = n;
    return 0;
}

int store_put(store *s, ctl_str key, ctl_str data, ctl_hold *hold, bool pin,
              bool *hold_taken, ctl_error *err)
{
    if (hold_taken)
        *hold_taken = false;
    if (key.len > s->max_key)
        return ctl_error_set(err, CTL_PROTOCOL,
                             "a key of %zu bytes is longer than this unit's "
                             "limit of %zu bytes (--max-key-bytes)",
                             key.len, s->max_key);
    uint64_t h = hash_key(key);
    node **p = slot(s, key, h);
    node *n = *p;
    if (n && n->blob.pinned)
        return ctl_error_busy(err, "pinned", "blob is pinned; unpin it first");
    /* What memory would hold if this put replaced the old blob in memory. */
    uint64_t old_mem = n && !n->blob.spilled ? n->blob.size : 0;
    uint64_t base = s->bytes - old_mem;
    bool fits = data.len <= s->capacity && base <= s->capacity - data.len;
    unsigned char *mem = NULL;
    uint64_t spill_id = 0;
    /* The index pays for the key, the node and, when the request message
     * is held, the rest of that message (its own copy of the key and the
     * envelope); the blob's bytes are paid for above. */
    size_t cost = key.len + STORE_BLOB_OVERHEAD + (fits && hold ? key.len + 64 : 0);
    uint64_t index_base = s->index_bytes - (n ? n->blob.index_cost : 0);
    if (cost > s->index_capacity || index_base > s->index_capacity - cost)
        return ctl_error_set(err, CTL_UNIT_FULL,
                             "no room for another key: %llu of %llu bytes of "
                             "keys and bookkeeping in use (--index-capacity)",
                             (unsigned long long)index_base,
                             (unsigned long long)s->index_capacity);
    if (fits && hold) {
        mem = (unsigned char *)ctl_hold_view(hold).ptr;
    } else if (fits) {
        hold = NULL;
        mem = malloc(data.len ? data.len : 1);
        if (!mem)
            return ctl_error_set(err, CTL_UNIT_FULL,
                                 "out of memory for %zu bytes", data.len);
        if (data.len)
            memcpy(mem, data.ptr, data.len);
    } else if (s->spill_fd >= 0) {
        int rc = spill_write(s, data, &spill_id, err);
        if (rc)
            return rc;
    } else {
        return ctl_error_set(err, CTL_UNIT_FULL,
                             "%zu bytes do not fit: %llu of %llu bytes in use",
                             data.len, (unsigned long long)base,
                             (unsigned long long)s->capacity);
    }
    if (!n) {
        n = calloc(1, sizeof *n);
        char *k = malloc(key.len ? key.len : 1);
        if (!n || !k) {
            free(n);
            free(k);
            if (!hold)
                free(mem);
            if (!fits) {
                char name[40];
                spill_name(spill_id, name);
                unlinkat(s->spill_fd, name, 0);
            }
            return ctl_error_set(err, CTL_UNIT_FULL, "out of memory for a key");
        }
        memcpy(k, key.ptr, key.len);
        n->blob.key = (ctl_str){k, key.len};
        n->hash = h;
        n->next = NULL;
        *p = n;
        tree_insert(s, n);
        s->count++;
    } else {
        drop_data(s, &n->blob);
    }
    s->index_bytes = index_base + cost;
    n->blob.index_cost = cost;
    n->blob.size = data.len;
    n->blob.data = mem;
    n->blob.hold = fits ? hold : NULL;
    if (fits && hold && hold_taken)
        *hold_taken = true;
    n->blob.spilled = !fits;
    n->blob.spill_id = spill_id;
    if (fits)
        s->bytes += data.len;
    else
        s->spilled++;
    if (pin)
        store_set_pinned(s, &n->blob, true);
    if (s->count > s->nbuckets)
        grow(s);
    return 0;
}

int store_read_spilled(store *s, const store_blob *b, void *buf, ctl_error *err)
{
    char name[40];
    spill_name(b->spill_id, name);
    int fd = openat(s->spill_fd, name, O_RDONLY | O_CLOEXEC);
    if (fd < 0)
        return ctl_error_set(err, CTL_PROTOCOL, "spill file %s/%s: %s",
                             s->spill_dir, name, strerror(errno));
    size_t off = 0;
    while (off < b->size) {
        ssize_t r = read(fd, (char *)buf + off, b->size - off);
        if (r < 0 && errno == EINTR)
            continue;
        if (r <= 0) {
            int e = r == 0 ? EIO : errno;
            close(fd);
            return ctl_error_set(err, CTL_PROTOCOL,
                                 "spill file %s/%s: %s", s->spill_dir, name,
                                 r == 0 ? "shorter than its blob" : strerror(e));
        }
        off += (size_t)r;
    }
    close(fd);
    return 0;
}

void store_set_pinned(store *s, store_blob *b, bool pinned)
{
    if (b->pinned == pinned)
        return;
    b->pinned = pinned;
    if (pinned)
        s->pinned++;
    else
        s->pinned--;
}

uint64_t store_new_pass(store *s)
{
    return ++s->pass;
}

bool store_mark(store_blob *b, uint64_t pass)
{
    if (b->mark == pass)
        return false;
    b->mark = pass;
    return true;
}

void store_remove(store *s, ctl_str key)
{
    node **p = slot(s, key, hash_key(key));
    node *n = *p;
    if (!n)
        return;
    *p = n->next;
    tree_remove(s, n);
    drop_data(s, &n->blob);
    s->index_bytes -= n->blob.index_cost;
    if (n->blob.pinned)
        s->pinned--;
    free((char *)n->blob.key.ptr);
    free(n);
    s->count--;
}

size_t store_list(store *s, ctl_str prefix, ctl_str after, size_t max,
                  void (*fn)(const store_blob *, void *), void *arg)
{
    /* The keys with `prefix` are one run in key order, starting at the
     * first key >= prefix (a key that lacks it differs from it before its
     * end, or is shorter, and so sorts wholly before or after the run):
     * seek to the first key in that run past `after`, and stop at the
     * first key without the prefix. */
    node *n = after.len && key_cmp(after, prefix) >= 0 ? tree_seek(s, after, true)
                                                       : tree_seek(s, prefix, false);
    size_t count = 0;
    for (; n && count < max && has_prefix(n->blob.key, prefix); n = tree_next(n)) {
        fn(&n->blob, arg);
        count++;
    }
    return count;
}

const char *store_check(store *s)
{
    /* Every node with a NULL child ends paths to leaves; they must all
     * have as many black nodes (counted walking up to the root). */
    size_t count = 0, black_height = 0;
    const node *prev = NULL;
    if (is_red(s->root))
        return "the root is red";
    if (s->root && s->root->up)
        return "the root has a parent";
    const node *n = s->root;
    while (n && n->left)
        n = n->left;
    for (; n; prev = n, n = tree_next(n)) {
        count++;
        if (prev && key_cmp(prev->blob.key, n->blob.key) >= 0)
            return "keys out of order";
        if ((n->left && n->left->up != n) || (n->right && n->right->up != n))
            return "a child's parent link is wrong";
        if (n->red && (is_red(n->left) || is_red(n->right)))
            return "a red node has a red child";
        if (store_find(s, n->blob.key) != &n->blob)
            return "a key in the tree is not in the table";
        if (n->left && n->right)
            continue;
        size_t blacks = 0;
        for (const node *a = n; a; a = a->up)
            blacks += !a->red;
        if (black_height == 0)
            black_height = blacks;
        else if (blacks != black_height)
            return "paths with different numbers of black nodes";
    }
    if (count != s->count)
        return "the tree and the table hold different numbers of keys";
    return NULL;
}

void store_totals_get(const store *s, store_totals *out)
{
    out->blobs = s->count;
    out->bytes = s->bytes;
    out->capacity = s->capacity;
    out->pinned = s->pinned;
    out->spilled = s->spilled;
    out->index_bytes = s->index_bytes;
    out->index_capacity = s->index_capacity;
}

int store_parse_size(const char *text, uint64_t *out)
{
    char *end = NULL;
    if (!text || !isdigit((unsigned char)*text))
        return -1;
    errno = 0;
    unsigned long long v = strtoull(text, &end, 10);
    if (errno)
        return -1;
    unsigned shift = 0;
    switch (toupper((unsigned char)*end)) {
    case '\0':
        break;
    case 'K': shift = 10; end++; break;
    case 'M': shift = 20; end++; break;
    case 'G': shift = 30; end++; break;
    case 'T': shift = 40; end++; break;
    case 'B': break;
    default:
        return -1;
    }
    if (shift && (*end == 'i' || *end == 'I'))
        end++;
    if (*end == 'B' || *end == 'b')
        end++;
    if (*end != '\0')
        return -1;
    if (shift && v > (UINT64_MAX >> shift))
        return -1;
    *out = (uint64_t)v << shift;
    return 0;
}
