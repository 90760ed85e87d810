/* The stream-ordered allocator on nvproxy's arena: cudaMallocAsync and
 * cudaFreeAsync with each device's default pool.  Allocations come from the
 * same arena as cudaMalloc (so they keep their addresses across a restore);
 * an allocation is made at once (a stronger order than the stream's) and a
 * free waits, in the proxy, for all earlier work of the device (stronger than
 * the stream's too).  Pools other than the default one, and pool IPC, are not
 * supported yet and fail loudly. */
#include "shim.h"

#include <stdlib.h>
#include <string.h>

struct pool {
    uint32_t magic;
    int device;
    uint64_t release_threshold;
    int reuse[3]; /* cudaMemPoolReuseFollowEventDependencies .. AllowInternalDependencies */
    uint64_t used, used_high;
};

#define POOL_MAGIC 0x706f6f6cu
static struct pool pools[NVP_MAX_DEVICES];
static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;

/* live pool allocations: few at a time in practice, so a flat array */
static struct {
    uint64_t ptr, size;
    int device;
} *live;
static size_t nlive, caplive;

static struct pool *pool_of_device(int dev)
{
    struct pool *p = &pools[dev];
    if (p->magic != POOL_MAGIC)
        *p = (struct pool){POOL_MAGIC, dev, 0, {1, 1, 1}, 0, 0};
    return p;
}

static struct pool *pool_check(cudaMemPool_t mp)
{
    struct pool *p = (struct pool *)mp;
    for (int d = 0; d < NVP_MAX_DEVICES; d++)
        if (p == &pools[d] && p->magic == POOL_MAGIC)
            return p;
    return NULL;
}

NVP_EXPORT cudaError_t cudaDeviceGetDefaultMemPool(cudaMemPool_t *memPool, int device)
{
    if (!memPool)
        return nvp_ret(cudaErrorInvalidValue);
    cudaError_t e = nvp_valid_device(device);
    if (e)
        return nvp_ret(e);
    pthread_mutex_lock(&lock);
    *memPool = (cudaMemPool_t)pool_of_device(device);
    pthread_mutex_unlock(&lock);
    return cudaSuccess;
}

NVP_EXPORT cudaError_t cudaDeviceGetMemPool(cudaMemPool_t *memPool, int device)
{
    return cudaDeviceGetDefaultMemPool(memPool, device);
}

NVP_EXPORT cudaError_t cudaDeviceSetMemPool(int device, cudaMemPool_t memPool)
{
    struct pool *p = pool_check(memPool);
    if (p && p->device == device)
        return cudaSuccess;
    return nvp_unsupported("cudaDeviceSetMemPool (with a pool other than the device's default)");
}

static cudaError_t pool_alloc(struct pool *p, void **ptr, size_t size, cudaStream_t stream)
{
    if (!ptr)
        return nvp_ret(cudaErrorInvalidValue);
    if (nvp_stream_wire(stream, 0) < 0)
        return nvp_ret(cudaErrorInvalidResourceHandle);
    cudaError_t e = cudaMalloc(ptr, size);
    if (e || !*ptr)
        return e;
    pthread_mutex_lock(&lock);
    if (nlive == caplive) {
        size_t cap = caplive ? caplive * 2 : 64;
        void *v = realloc(live, cap * sizeof *live);
        if (v) {
            live = v;
            caplive = cap;
        }
    }
    if (nlive < caplive) {
        live[nlive].ptr = (uint64_t)(uintptr_t)*ptr;
        live[nlive].size = size;
        live[nlive].device = p->device;
        nlive++;
        p->used += size;
        if (p->used > p->used_high)
            p->used_high = p->used;
    }
    pthread_mutex_unlock(&lock);
    return cudaSuccess;
}

NVP_EXPORT cudaError_t cudaMallocAsync(void **devPtr, size_t size, cudaStream_t hStream)
{
    cudaError_t e = nvp_connect();
    if (e)
        return nvp_ret(e);
    struct pool *p;
    pthread_mutex_lock(&lock);
    p = pool_of_device(nvp_current_device());
    pthread_mutex_unlock(&lock);
    return pool_alloc(p, devPtr, size, hStream);
}

NVP_EXPORT cudaError_t cudaMallocAsync_ptsz(void **devPtr, size_t size, cudaStream_t hStream)
{
    return cudaMallocAsync(devPtr, size, hStream);
}

NVP_EXPORT cudaError_t cudaMallocFromPoolAsync(void **ptr, size_t size, cudaMemPool_t memPool, cudaStream_t stream)
{
    struct pool *p = pool_check(memPool);
    if (!p)
        return nvp_ret(cudaErrorInvalidValue);
    return pool_alloc(p, ptr, size, stream);
}

NVP_EXPORT cudaError_t cudaMallocFromPoolAsync_ptsz(void **ptr, size_t size, cudaMemPool_t memPool,
                                                    cudaStream_t stream)
{
    return cudaMallocFromPoolAsync(ptr, size, memPool, stream);
}

/* a pool allocation leaves the statistics (also when freed with cudaFree) */
void nvp_pool_forget(uint64_t ptr)
{
    pthread_mutex_lock(&lock);
    for (size_t i = 0; i < nlive; i++) {
        if (live[i].ptr == ptr) {
            pools[live[i].device].used -= live[i].size;
            live[i] = live[--nlive];
            break;
        }
    }
    pthread_mutex_unlock(&lock);
}

NVP_EXPORT cudaError_t cudaFreeAsync(void *devPtr, cudaStream_t hStream)
{
    if (nvp_stream_wire(hStream, 0) < 0)
        return nvp_ret(cudaErrorInvalidResourceHandle);
    return cudaFree(devPtr);
}

NVP_EXPORT cudaError_t cudaFreeAsync_ptsz(void *devPtr, cudaStream_t hStream)
{
    return cudaFreeAsync(devPtr, hStream);
}

NVP_EXPORT cudaError_t cudaMemPoolTrimTo(cudaMemPool_t memPool, size_t minBytesToKeep)
{
    (void)minBytesToKeep; /* the proxy's arena gives cached memory back when the device runs short */
    return pool_check(memPool) ? cudaSuccess : nvp_ret(cudaErrorInvalidValue);
}

/* get or set one attribute: the integer reuse flags, the 64-bit figures */
static cudaError_t pool_attr(cudaMemPool_t memPool, enum cudaMemPoolAttr attr, void *value, int set)
{
    struct pool *p = pool_check(memPool);
    if (!p || !value)
        return nvp_ret(cudaErrorInvalidValue);
    cudaError_t e = cudaSuccess;
    uint64_t *v64 = value;
    pthread_mutex_lock(&lock);
    switch (attr) {
    case cudaMemPoolReuseFollowEventDependencies:
    case cudaMemPoolReuseAllowOpportunistic:
    case cudaMemPoolReuseAllowInternalDependencies:
        if (set)
            p->reuse[attr - 1] = *(int *)value;
        else
            *(int *)value = p->reuse[attr - 1];
        break;
    case cudaMemPoolAttrReleaseThreshold:
        if (set)
            p->release_threshold = *v64;
        else
            *v64 = p->release_threshold;
        break;
    /* reserved memory is the arena's business: the pool reports what it holds */
    case cudaMemPoolAttrReservedMemCurrent:
    case cudaMemPoolAttrUsedMemCurrent:
        if (set)
            e = cudaErrorInvalidValue;
        else
            *v64 = p->used;
        break;
    case cudaMemPoolAttrReservedMemHigh:
    case cudaMemPoolAttrUsedMemHigh: /* setting: only a reset to 0 is allowed */
        if (!set)
            *v64 = p->used_high;
        else if (*v64 != 0)
            e = cudaErrorInvalidValue;
        else
            p->used_high = p->used;
        break;
    default:
        e = cudaErrorInvalidValue;
    }
    pthread_mutex_unlock(&lock);
    return nvp_ret(e);
}

NVP_EXPORT cudaError_t cudaMemPoolSetAttribute(cudaMemPool_t memPool, enum cudaMemPoolAttr attr, void *value)
{
    return pool_attr(memPool, attr, value, 1);
}

NVP_EXPORT cudaError_t cudaMemPoolGetAttribute(cudaMemPool_t memPool, enum cudaMemPoolAttr attr, void *value)
{
    return pool_attr(memPool, attr, value, 0);
}
