/* Small device allocations without a round trip: cudaMalloc of up to 2 MiB
 * carves blocks out of chunks that the proxy allocates in its arena, one free list per power-of-two size class and device.
 *
 * The proxy sees only the chunks: they are ordinary allocations of its
 * arena, so checkpoints save them whole and restores put them back at the
 * same addresses; these lists live in the application's memory and come
 * back with it.  Chunks are 4 MiB, 32 MiB for blocks of 512 KiB and more.
 *
 * cudaFree waits for the device before the memory can be used again.  Here a
 * freed block waits in quarantine, stamped with the count of asynchronous
 * requests sent so far, until the device is known to have finished them (a
 * cudaDeviceSynchronize that started after them succeeded).  An allocation
 * that finds its list empty synchronises the device once to recycle them when
 * a chunk's worth waits, and otherwise takes another chunk. */
#include "shim.h"

#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>

#define MIN_SHIFT 9  /* 512 B: CUDA promises 256-byte alignment */
#define MAX_SHIFT 21 /* 2 MiB; larger allocations go to the proxy */
#define NCLASS (MAX_SHIFT - MIN_SHIFT + 1)
#define QUARANTINE_LIMIT (256ull << 20) /* bytes per device before a recycling sync */
#define MAX_DEV 64

struct block {
    uint64_t addr;
    uint64_t ready_after; /* async requests sent before it was freed */
    struct block *next;
};

struct pool {
    struct block *free, *quarantine;
    uint64_t quarantined; /* bytes */
};

static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;
static struct pool pools[MAX_DEV][NCLASS];
static struct block *spare; /* unused list nodes */

/* the allocation table's tag of a block: its device and class, never NVP_ALLOC_PROXY */
static int tag_of(int dev, int cls) { return 1 + dev * NCLASS + cls; }

static _Atomic uint64_t async_sent;       /* fire-and-forget requests written so far */
static _Atomic uint64_t idle_after[MAX_DEV]; /* device d finished everything up to this count */

void nvp_note_async_sent(void) { atomic_fetch_add(&async_sent, 1); }
uint64_t nvp_async_sent(void) { return atomic_load(&async_sent); }

void nvp_note_device_idle(int dev, uint64_t sent_before)
{
    if (dev < 0 || dev >= MAX_DEV)
        return;
    uint64_t cur = atomic_load(&idle_after[dev]);
    while (cur < sent_before && !atomic_compare_exchange_weak(&idle_after[dev], &cur, sent_before))
        ;
}

int nvp_device_known_idle(int dev)
{
    return dev >= 0 && dev < MAX_DEV && atomic_load(&idle_after[dev]) >= atomic_load(&async_sent);
}

int nvp_devices_known_idle(void)
{
    int n = nvp_device_count();
    for (int d = 0; d < n; d++)
        if (!nvp_device_known_idle(d))
            return 0;
    return n > 0;
}

void nvp_note_devices_idle(uint64_t sent_before)
{
    int n = nvp_device_count();
    for (int d = 0; d < n; d++)
        nvp_note_device_idle(d, sent_before);
}

static int class_of(size_t size)
{
    int c = MIN_SHIFT;
    while (((size_t)1 << c) < size)
        c++;
    return c - MIN_SHIFT;
}

static struct block *node(void)
{
    struct block *b = spare;
    if (b)
        spare = b->next;
    else
        b = malloc(sizeof *b);
    return b;
}

/* quarantined blocks the device has finished with go back to the free list */
static void recycle(struct pool *p, int c, uint64_t idle)
{
    struct block **q = &p->quarantine;
    while (*q) {
        struct block *b = *q;
        if (b->ready_after <= idle) {
            p->quarantined -= (uint64_t)1 << (c + MIN_SHIFT);
            *q = b->next;
            b->next = p->free;
            p->free = b;
        } else {
            q = &b->next;
        }
    }
}

static uint64_t quarantined(int dev)
{
    uint64_t n = 0;
    for (int c = 0; c < NCLASS; c++)
        n += pools[dev][c].quarantined;
    return n;
}

/* A new chunk for class c from the proxy, cut into blocks (lock held). */
static size_t chunk_size(int c) { return c + MIN_SHIFT >= 19 ? 32u << 20 : 4u << 20; }

static cudaError_t grow(int dev, int c)
{
    size_t bsize = (size_t)1 << (c + MIN_SHIFT);
    size_t chunk = chunk_size(c);
    uint64_t a[NVP_MAX_ARGS] = {chunk};
    struct nvp_reply r = {0};
    cudaError_t e = nvp_call(NVP_OP_MALLOC, a, NULL, 0, &r, -1);
    if (e)
        return e;
    for (size_t off = chunk; off >= bsize; off -= bsize) {
        struct block *b = node();
        if (!b)
            return cudaErrorMemoryAllocation;
        b->addr = r.h.r[0] + off - bsize;
        b->ready_after = 0;
        b->next = pools[dev][c].free;
        pools[dev][c].free = b;
    }
    return cudaSuccess;
}

cudaError_t nvp_suballoc(size_t size, uint64_t *out, int *tag)
{
    int dev = nvp_current_device();
    if (size > ((size_t)1 << MAX_SHIFT) || dev < 0 || dev >= MAX_DEV)
        return cudaErrorNotSupported; /* not ours: the proxy allocates it */
    int c = class_of(size);
    pthread_mutex_lock(&lock);
    struct pool *p = &pools[dev][c];
    cudaError_t e = cudaSuccess;
    if (!p->free)
        recycle(p, c, atomic_load(&idle_after[dev]));
    /* a chunk's worth waiting (or too much on the device): one synchronisation
     * recycles it for less than a new chunk would cost */
    if (!p->free && p->quarantine && (p->quarantined >= chunk_size(c) || quarantined(dev) >= QUARANTINE_LIMIT)) {
        /* synchronise once, as the cudaFree calls would have, and reuse */
        uint64_t sent = nvp_async_sent();
        uint64_t a[NVP_MAX_ARGS] = {0};
        struct nvp_reply r = {0};
        if ((e = nvp_call(NVP_OP_DEVICE_SYNC, a, NULL, 0, &r, -1)) == cudaSuccess) {
            nvp_note_device_idle(dev, sent);
            recycle(p, c, sent);
        }
    }
    if (!e && !p->free)
        e = grow(dev, c);
    if (!e) {
        struct block *b = p->free;
        p->free = b->next;
        *out = b->addr;
        *tag = tag_of(dev, c);
        b->next = spare;
        spare = b;
    }
    pthread_mutex_unlock(&lock);
    return e;
}

void nvp_subfree(uint64_t addr, int tag)
{
    int dev = (tag - 1) / NCLASS, cls = (tag - 1) % NCLASS;
    pthread_mutex_lock(&lock);
    struct block *b = node();
    if (b) { /* (without a node the block is lost, not misused) */
        struct pool *p = &pools[dev][cls];
        b->addr = addr;
        b->ready_after = nvp_async_sent();
        b->next = p->quarantine;
        p->quarantine = b;
        p->quarantined += (uint64_t)1 << (cls + MIN_SHIFT);
    }
    pthread_mutex_unlock(&lock);
}

/* cudaDeviceReset: the proxy freed the chunks (and device.c forgets the allocations) */
void nvp_suballoc_reset(int dev)
{
    if (dev < 0 || dev >= MAX_DEV)
        return;
    pthread_mutex_lock(&lock);
    for (int c = 0; c < NCLASS; c++) {
        struct pool *p = &pools[dev][c];
        struct block *lists[2] = {p->free, p->quarantine};
        for (int k = 0; k < 2; k++)
            while (lists[k]) {
                struct block *b = lists[k];
                lists[k] = b->next;
                b->next = spare;
                spare = b;
            }
        p->free = p->quarantine = NULL;
        p->quarantined = 0;
    }
    pthread_mutex_unlock(&lock);
}
