/* Pinned host memory without a round trip: cudaMallocHost and cudaHostAlloc of up to 32 MiB carve blocks out of
 * chunks of shared memory that the proxy mapped and registered once (nvp_host_alloc of kind NVP_HOST_POOL).
 *
 * A chunk is an ordinary entry of the host-region table, so checkpoints, migrations, DMTCP restarts and
 * recoveries share it again at its address like any pinned memory; the block lists below live in the
 * application's memory and come back with it.  One free list per size class: a page and two pages, then four
 * classes per doubling from 16 KiB (16, 20, 24, 28, 32 KiB...) up to 32 MiB, so that a block wastes at most a
 * quarter of what was asked for beyond the first pages (pinned memory and /dev/shm are scarce); every class is
 * a whole number of pages.  A class's chunks double in size (2 MiB up to 64 MiB, never less than one block).  A chunk whose last block is freed
 * goes back to the proxy unless it is its class's only chunk and few such spares are kept.
 *
 * cudaFreeHost waits for the device, as the runtime's does: at once when nothing was sent since the device was
 * last seen idle, else after a device synchronisation; the block is free to reuse only then.
 *
 * A forked child starts with no chunks: the parent's are shared memory, which both would carve the same blocks
 * out of. */
#include "shim.h"

#include <stdlib.h>
#include <string.h>

#define MIN_SHIFT 12  /* a page: every block is page aligned */
#define STEP_SHIFT 14 /* from 16 KiB, four classes per doubling */
#define MAX_SHIFT 25  /* 32 MiB; larger allocations get memory of their own */
#define NCLASS ((STEP_SHIFT - MIN_SHIFT) + 4 * (MAX_SHIFT - STEP_SHIFT) + 1)
#define FIRST_CHUNK (2ull << 20)
#define MAX_CHUNK (64ull << 20)
#define SPARE_LIMIT (64ull << 20) /* bytes of empty chunks kept for the next allocations */

struct chunk {
    uint64_t base, size;
    uint32_t nblocks, nfree;
    int cls;
    uint32_t *free;  /* indices of free blocks, a stack */
    uint32_t *used;  /* per block: the bytes asked for, 0 while free */
    uint8_t *flags;  /* per block: its cudaHostAlloc flags */
    struct chunk *next;
};

static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;
static struct chunk *classes[NCLASS];
static uint64_t next_size[NCLASS]; /* the size of a class's next chunk */
static uint64_t spare_bytes;       /* empty chunks kept */

static uint64_t block_size(int cls)
{
    if (cls < STEP_SHIFT - MIN_SHIFT)
        return 1ull << (cls + MIN_SHIFT);
    int k = cls - (STEP_SHIFT - MIN_SHIFT); /* 2^shift * (4 + step) / 4 */
    return (1ull << (STEP_SHIFT + k / 4 - 2)) * (uint64_t)(4 + k % 4);
}

static int class_of(size_t size)
{
    int c = 0;
    while (block_size(c) < size)
        c++;
    return c;
}

static int empty(const struct chunk *k) { return k->nfree == k->nblocks; }

/* the chunk holding p (lock held) */
static struct chunk *chunk_of(uint64_t p)
{
    for (int c = 0; c < NCLASS; c++)
        for (struct chunk *k = classes[c]; k; k = k->next)
            if (p >= k->base && p - k->base < k->size)
                return k;
    return NULL;
}

static void forget(struct chunk *k)
{
    free(k->free);
    free(k->used);
    free(k->flags);
    free(k);
}

/* The child of a fork: the chunks stay the parent's (mapped here too, and listed, as any pinned memory the child
 * inherits); the child's blocks come from chunks of its own. */
static void after_fork_child(void)
{
    pthread_mutex_init(&lock, NULL);
    memset(classes, 0, sizeof classes);
    memset(next_size, 0, sizeof next_size);
    spare_bytes = 0;
}

static void watch_forks(void) { pthread_atfork(NULL, NULL, after_fork_child); }

/* A new chunk for class cls, shared with the proxy (lock held) */
static struct chunk *grow(int cls)
{
    uint64_t bs = block_size(cls);
    uint64_t size = next_size[cls] ? next_size[cls] : FIRST_CHUNK;
    if (size < bs)
        size = bs;
    static pthread_once_t once = PTHREAD_ONCE_INIT;
    pthread_once(&once, watch_forks);
    struct chunk *k = calloc(1, sizeof *k);
    if (!k)
        return NULL;
    k->nblocks = (uint32_t)(size / bs);
    k->free = malloc(k->nblocks * sizeof *k->free);
    k->used = calloc(k->nblocks, sizeof *k->used);
    k->flags = calloc(k->nblocks, 1);
    void *base = NULL;
    if (!k->free || !k->used || !k->flags ||
        nvp_host_alloc(&base, size, cudaHostAllocPortable | cudaHostAllocMapped, NVP_HOST_POOL) != cudaSuccess) {
        forget(k);
        return NULL;
    }
    k->base = (uint64_t)(uintptr_t)base;
    k->size = size;
    k->cls = cls;
    for (uint32_t i = 0; i < k->nblocks; i++) /* (the lowest address first) */
        k->free[i] = k->nblocks - 1 - i;
    k->nfree = k->nblocks;
    k->next = classes[cls];
    classes[cls] = k;
    spare_bytes += size;
    next_size[cls] = size * 2 < MAX_CHUNK ? size * 2 : MAX_CHUNK;
    return k;
}

cudaError_t nvp_pinned_alloc(size_t size, unsigned flags, void **out)
{
    if (size > (1ull << MAX_SHIFT))
        return cudaErrorNotSupported;
    int cls = class_of(size);
    pthread_mutex_lock(&lock);
    struct chunk *k = classes[cls];
    while (k && !k->nfree)
        k = k->next;
    if (!k)
        k = grow(cls);
    if (!k) { /* (no room for a chunk: memory of its own, or the error that says why not) */
        pthread_mutex_unlock(&lock);
        return cudaErrorNotSupported;
    }
    if (empty(k))
        spare_bytes -= k->size;
    uint32_t i = k->free[--k->nfree];
    k->used[i] = (uint32_t)size;
    k->flags[i] = (uint8_t)flags;
    *out = (void *)(uintptr_t)(k->base + i * block_size(cls));
    pthread_mutex_unlock(&lock);
    return cudaSuccess;
}

/* An empty chunk stays if it is its class's only chunk and the spares are few; else it goes (lock held: unlinked
 * here, returned to the proxy by the caller) */
static struct chunk *release(struct chunk *k)
{
    if (classes[k->cls] == k && !k->next && spare_bytes + k->size <= SPARE_LIMIT) {
        spare_bytes += k->size;
        return NULL;
    }
    struct chunk **pp = &classes[k->cls];
    while (*pp != k)
        pp = &(*pp)->next;
    *pp = k->next;
    return k;
}

static cudaError_t wait_for_device(void)
{
    int dev = nvp_current_device();
    if (nvp_device_known_idle(dev))
        return cudaSuccess;
    uint64_t sent = nvp_async_sent();
    uint64_t a[NVP_MAX_ARGS] = {0};
    struct nvp_reply r = {0};
    cudaError_t e = nvp_call(NVP_OP_DEVICE_SYNC, a, NULL, 0, &r, -1);
    if (!e)
        nvp_note_device_idle(dev, sent);
    return e;
}

cudaError_t nvp_pinned_free(uint64_t p)
{
    pthread_mutex_lock(&lock);
    struct chunk *k = chunk_of(p);
    uint64_t bs = k ? block_size(k->cls) : 0;
    uint32_t i = k ? (uint32_t)((p - k->base) / bs) : 0;
    if (!k || (p - k->base) % bs || !k->used[i]) { /* not a block's start, or freed already */
        pthread_mutex_unlock(&lock);
        return cudaErrorInvalidValue;
    }
    k->used[i] = 0; /* (a second free of it fails from here on) */
    pthread_mutex_unlock(&lock);
    cudaError_t e = wait_for_device(); /* nothing on the device may still use the block when it is reused */
    pthread_mutex_lock(&lock);
    k->free[k->nfree++] = i;
    struct chunk *gone = empty(k) ? release(k) : NULL;
    pthread_mutex_unlock(&lock);
    if (gone) {
        struct nvp_host_region h;
        if (nvp_host_shared(gone->base, gone->size, &h)) {
            cudaError_t e2 = nvp_host_free(&h);
            e = e ? e : e2;
        }
        forget(gone);
    }
    return e;
}

int nvp_pinned_block(uint64_t p, uint64_t n, unsigned *flags, uint64_t *base, uint64_t *size)
{
    pthread_mutex_lock(&lock);
    struct chunk *k = chunk_of(p);
    int live = 0;
    if (k) {
        uint64_t bs = block_size(k->cls), i = (p - k->base) / bs;
        live = k->used[i] && (p - k->base) % bs + (n ? n : 1) <= k->used[i];
        if (live && flags)
            *flags = k->flags[i];
        if (live && base)
            *base = k->base + i * bs;
        if (live && size)
            *size = k->used[i];
    }
    pthread_mutex_unlock(&lock);
    return live;
}
