/* What the shim knows without asking the proxy: live device allocations,
 * shared host regions, and the stream/event handle space it owns. */
#include "shim.h"

#include <stdlib.h>
#include <string.h>

/* ---- ranges: sorted arrays, bisected; few entries, rare updates ---- */
struct range {
    uint64_t base, size;
    int tag; /* allocations: who carved it (nvp_alloc_add) */
    struct nvp_host_region host;
};
struct ranges {
    pthread_mutex_t lock;
    struct range *v;
    size_t n, cap;
};
static struct ranges allocs = {PTHREAD_MUTEX_INITIALIZER, NULL, 0, 0};
static struct ranges hosts = {PTHREAD_MUTEX_INITIALIZER, NULL, 0, 0};
static struct ranges symbols = {PTHREAD_MUTEX_INITIALIZER, NULL, 0, 0};

/* index of the last range with base <= p, or -1 */
static long floor_index(const struct ranges *r, uint64_t p)
{
    long lo = 0, hi = (long)r->n - 1, best = -1;
    while (lo <= hi) {
        long mid = (lo + hi) / 2;
        if (r->v[mid].base <= p) {
            best = mid;
            lo = mid + 1;
        } else {
            hi = mid - 1;
        }
    }
    return best;
}

static void ranges_add(struct ranges *r, const struct range *x)
{
    pthread_mutex_lock(&r->lock);
    if (r->n == r->cap) {
        size_t cap = r->cap ? r->cap * 2 : 64;
        struct range *v = realloc(r->v, cap * sizeof *v);
        if (!v) {
            pthread_mutex_unlock(&r->lock);
            return;
        }
        r->v = v;
        r->cap = cap;
    }
    long i = floor_index(r, x->base) + 1;
    memmove(&r->v[i + 1], &r->v[i], (r->n - (size_t)i) * sizeof *r->v);
    r->v[i] = *x;
    r->n++;
    pthread_mutex_unlock(&r->lock);
}

static int ranges_remove(struct ranges *r, uint64_t base, struct range *out)
{
    pthread_mutex_lock(&r->lock);
    long i = floor_index(r, base);
    if (i < 0 || r->v[i].base != base) {
        pthread_mutex_unlock(&r->lock);
        return -1;
    }
    if (out)
        *out = r->v[i];
    memmove(&r->v[i], &r->v[i + 1], (r->n - (size_t)i - 1) * sizeof *r->v);
    r->n--;
    pthread_mutex_unlock(&r->lock);
    return 0;
}

static int ranges_find(struct ranges *r, uint64_t p, uint64_t n, struct range *out)
{
    pthread_mutex_lock(&r->lock);
    long i = floor_index(r, p);
    int ok = i >= 0 && p - r->v[i].base <= r->v[i].size && n <= r->v[i].size - (p - r->v[i].base);
    if (ok && out)
        *out = r->v[i];
    pthread_mutex_unlock(&r->lock);
    return ok;
}

void nvp_alloc_add(uint64_t base, uint64_t size, int tag)
{
    struct range x = {.base = base, .size = size, .tag = tag};
    ranges_add(&allocs, &x);
}

int nvp_alloc_tag(uint64_t base)
{
    struct range x;
    return ranges_find(&allocs, base, 1, &x) && x.base == base ? x.tag : NVP_ALLOC_PROXY;
}

int nvp_alloc_remove(uint64_t base, int *tag)
{
    struct range x;
    if (ranges_remove(&allocs, base, &x) != 0)
        return -1;
    if (tag)
        *tag = x.tag;
    return 0;
}

void nvp_alloc_forget(uint64_t lo, uint64_t hi)
{
    pthread_mutex_lock(&allocs.lock);
    size_t k = 0;
    for (size_t i = 0; i < allocs.n; i++)
        if (allocs.v[i].base < lo || allocs.v[i].base >= hi)
            allocs.v[k++] = allocs.v[i];
    allocs.n = k;
    pthread_mutex_unlock(&allocs.lock);
}

int nvp_in_arena(uint64_t p)
{
    int dev = nvp_current_device();
    const struct nvp_device_info *d = nvp_device_info(dev);
    if (d && p >= d->arena_base && p - d->arena_base < d->arena_size)
        return 1;
    /* pointers of other devices' arenas */
    for (int i = 0; i < nvp_device_count(); i++) {
        if (i == dev)
            continue;
        d = nvp_device_info(i);
        if (d && p >= d->arena_base && p - d->arena_base < d->arena_size)
            return 1;
    }
    return 0;
}

int nvp_alloc_contains(uint64_t p, uint64_t n) { return ranges_find(&allocs, p, n, NULL); }

/* (declared in driver.h: cuMemGetAddressRange, cuPointerGetAttribute) */
int nvp_alloc_range(uint64_t p, uint64_t *base, uint64_t *size)
{
    struct range x;
    if (!ranges_find(&allocs, p, 1, &x) && !ranges_find(&hosts, p, 1, &x))
        return -1;
    if (x.host.kind == NVP_HOST_POOL) /* (a block of a chunk: the block's range) */
        return nvp_pinned_block(p, 1, NULL, base, size) ? 0 : -1;
    *base = x.base;
    *size = x.size;
    return 0;
}

void nvp_symbol_add(uint64_t base, uint64_t size)
{
    struct range x = {.base = base, .size = size};
    if (!ranges_find(&symbols, base, size, NULL))
        ranges_add(&symbols, &x);
}

int nvp_is_device_ptr(uint64_t p) { return nvp_in_arena(p) || ranges_find(&symbols, p, 1, NULL); }

void nvp_host_add(const struct nvp_host_region *h)
{
    struct range x = {.base = h->user, .size = h->user_size, .host = *h};
    ranges_add(&hosts, &x);
}

int nvp_host_remove(uint64_t user, struct nvp_host_region *out)
{
    struct range x;
    if (ranges_remove(&hosts, user, &x) != 0)
        return -1;
    if (out)
        *out = x.host;
    return 0;
}

void nvp_host_foreach(void (*fn)(struct nvp_host_region *r, void *arg), void *arg)
{
    pthread_mutex_lock(&hosts.lock);
    for (size_t i = 0; i < hosts.n; i++)
        fn(&hosts.v[i].host, arg);
    pthread_mutex_unlock(&hosts.lock);
}

/* Does any of [p, p+n) lie in shared host memory?  (The ranges are sorted and disjoint: only the last one that
 * begins in it or before it can reach into it.) */
int nvp_host_overlaps(uint64_t p, uint64_t n)
{
    pthread_mutex_lock(&hosts.lock);
    long i = n ? floor_index(&hosts, p + n - 1) : -1;
    int hit = i >= 0 && hosts.v[i].base + hosts.v[i].size > p;
    pthread_mutex_unlock(&hosts.lock);
    return hit;
}

int nvp_host_shared(uint64_t p, uint64_t n, struct nvp_host_region *out)
{
    struct range x;
    if (!ranges_find(&hosts, p, n, &x))
        return 0;
    if (out)
        *out = x.host;
    return 1;
}

/* ---- handles: value = tag | type << 40 | index; index 0 is never used ---- */
#define H_TAG 0x5e00000000000000ull
#define H_MAX 1048576u
#define REC_MAX 48
struct slot {
    int live;
    char rec[REC_MAX];
};
static struct {
    pthread_mutex_t lock;
    struct slot *v;
    uint32_t n, cap;
    uint32_t free_head; /* reuse: a simple stack of freed indices */
    uint32_t *freed;
    uint32_t nfreed;
} tables[NVP_H_TYPES]; /* (zeroed: glibc's PTHREAD_MUTEX_INITIALIZER) */

uint64_t nvp_handle_new(int type, const void *rec, size_t rec_size)
{
    typeof(&tables[0]) t = &tables[type];
    pthread_mutex_lock(&t->lock);
    uint32_t idx;
    if (t->nfreed) {
        idx = t->freed[--t->nfreed];
    } else {
        if (t->n == 0)
            t->n = 1;
        if (t->n >= t->cap) {
            uint32_t cap = t->cap ? t->cap * 2 : 256;
            struct slot *v = cap <= H_MAX ? realloc(t->v, cap * sizeof *v) : NULL;
            uint32_t *f = v ? realloc(t->freed, cap * sizeof *f) : NULL;
            if (!v || !f) {
                if (v)
                    t->v = v;
                pthread_mutex_unlock(&t->lock);
                return 0;
            }
            t->v = v;
            t->freed = f;
            t->cap = cap;
        }
        idx = t->n++;
    }
    t->v[idx].live = 1;
    memcpy(t->v[idx].rec, rec, rec_size < REC_MAX ? rec_size : REC_MAX);
    pthread_mutex_unlock(&t->lock);
    return H_TAG | ((uint64_t)type << 40) | idx;
}

static struct slot *slot_of(int type, uint64_t h)
{
    if ((h & 0xff00000000000000ull) != H_TAG || ((h >> 40) & 0xffff) != (uint64_t)type)
        return NULL;
    uint32_t idx = (uint32_t)(h & 0xffffffffu);
    if (idx == 0 || idx >= tables[type].n || !tables[type].v[idx].live)
        return NULL;
    return &tables[type].v[idx];
}

int nvp_handle_get(int type, uint64_t h, void *rec, size_t rec_size)
{
    pthread_mutex_lock(&tables[type].lock);
    struct slot *s = slot_of(type, h);
    if (s && rec)
        memcpy(rec, s->rec, rec_size < REC_MAX ? rec_size : REC_MAX);
    pthread_mutex_unlock(&tables[type].lock);
    return s ? 0 : -1;
}

int nvp_handle_set(int type, uint64_t h, const void *rec, size_t rec_size)
{
    pthread_mutex_lock(&tables[type].lock);
    struct slot *s = slot_of(type, h);
    if (s)
        memcpy(s->rec, rec, rec_size < REC_MAX ? rec_size : REC_MAX);
    pthread_mutex_unlock(&tables[type].lock);
    return s ? 0 : -1;
}

int nvp_handle_free(int type, uint64_t h)
{
    pthread_mutex_lock(&tables[type].lock);
    struct slot *s = slot_of(type, h);
    if (s) {
        s->live = 0;
        tables[type].freed[tables[type].nfreed++] = (uint32_t)(h & 0xffffffffu);
    }
    pthread_mutex_unlock(&tables[type].lock);
    return s ? 0 : -1;
}

uint32_t nvp_handle_id(uint64_t h) { return (uint32_t)(h & 0xffffffffu); }

uint64_t nvp_handle_of(int type, uint32_t id)
{
    uint64_t h = H_TAG | ((uint64_t)type << 40) | id;
    return nvp_handle_get(type, h, NULL, 0) ? 0 : h;
}
