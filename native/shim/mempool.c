/* The stream-ordered allocator on nvproxy's arena: cudaMallocAsync and
 * cudaFreeAsync, the devices' default pools and pools made by cudaMemPoolCreate.
 * A pool is a record here (its device, attributes, statistics and access);
 * allocations come from the same arena as cudaMalloc (so they keep their
 * addresses across a restore); an allocation is made at once (a stronger order
 * than the stream's) and a free waits, in the proxy, for all earlier work of the
 * device (stronger than the stream's too).  Pools with POSIX file descriptor
 * handles can be shared with other nvproxy applications (pool IPC, below). */
#include "shim.h"

#include <stddef.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/random.h>
#include <unistd.h>

struct pool {
    uint32_t magic;
    int device;
    uint64_t release_threshold;
    int reuse[3]; /* cudaMemPoolReuseFollowEventDependencies .. AllowInternalDependencies */
    uint64_t used, used_high;
    int handle_types; /* what cudaMemPoolCreate asked for (cudaMemHandleTypePosixFileDescriptor: exportable) */
    int imported;     /* cudaMemPoolImportFromShareableHandle's: pointers of another process's pool */
    uint64_t secret;  /* exported or imported: what its pointers' export data carry */
    int destroyed;    /* cudaMemPoolDestroy with allocations out: goes when the last is freed */
    unsigned access[NVP_MAX_DEVICES]; /* cudaMemAccessFlags of the other devices (its own: read-write) */
    struct pool *next;                /* made by cudaMemPoolCreate */
};

#define POOL_MAGIC 0x706f6f6cu
static struct pool defaults[NVP_MAX_DEVICES], *made;
static struct pool *current[NVP_MAX_DEVICES]; /* cudaDeviceSetMemPool's, NULL: the default */
static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;

/* live pool allocations (and pointers imported from other processes' pools): few at a time in practice,
 * so a flat array */
static struct {
    uint64_t ptr, size;
    struct pool *pool;
    int imported;
} *live;
static size_t nlive, caplive, nimported;

/* where the pool's shareable-handle file is: in the private directory, named by the secret */
static int pool_path(char *path, size_t cap, uint64_t secret)
{
    char dir[4096];
    if (nvp_private_dir(dir, sizeof dir) != 0)
        return -1;
    snprintf(path, cap, "%s/pool-%016llx", dir, (unsigned long long)secret);
    return 0;
}

static int live_add(uint64_t ptr, uint64_t size, struct pool *p, int imported) /* (lock held) 1: added */
{
    if (nlive == caplive) {
        size_t cap = caplive ? caplive * 2 : 64;
        void *v = realloc(live, cap * sizeof *live);
        if (!v)
            return 0;
        live = v;
        caplive = cap;
    }
    live[nlive].ptr = ptr;
    live[nlive].size = size;
    live[nlive].pool = p;
    live[nlive].imported = imported;
    nlive++;
    return 1;
}

static void pool_init(struct pool *p, int dev)
{
    *p = (struct pool){.magic = POOL_MAGIC, .device = dev, .reuse = {1, 1, 1}};
    p->access[dev] = cudaMemAccessFlagsProtReadWrite;
}

static struct pool *pool_of_device(int dev)
{
    struct pool *p = &defaults[dev];
    if (p->magic != POOL_MAGIC)
        pool_init(p, dev);
    return p;
}

/* a live pool (lock held), or NULL */
static struct pool *pool_check(cudaMemPool_t mp)
{
    struct pool *p = (struct pool *)mp;
    for (int d = 0; d < NVP_MAX_DEVICES; d++)
        if (p == &defaults[d] && p->magic == POOL_MAGIC)
            return p;
    for (struct pool *q = made; q; q = q->next)
        if (q == p && !q->destroyed)
            return q;
    return NULL;
}

static cudaError_t device_pool(cudaMemPool_t *memPool, int device, int cur)
{
    if (!memPool)
        return nvp_ret(cudaErrorInvalidValue);
    cudaError_t e = nvp_valid_device(device);
    if (e)
        return nvp_ret(e);
    pthread_mutex_lock(&lock);
    *memPool = (cudaMemPool_t)(cur && current[device] ? current[device] : pool_of_device(device));
    pthread_mutex_unlock(&lock);
    return cudaSuccess;
}

NVP_EXPORT cudaError_t cudaDeviceGetDefaultMemPool(cudaMemPool_t *memPool, int device)
{
    return device_pool(memPool, device, 0);
}

NVP_EXPORT cudaError_t cudaDeviceGetMemPool(cudaMemPool_t *memPool, int device)
{
    return device_pool(memPool, device, 1);
}

NVP_EXPORT cudaError_t cudaDeviceSetMemPool(int device, cudaMemPool_t memPool)
{
    cudaError_t e = nvp_valid_device(device);
    if (e)
        return nvp_ret(e);
    pthread_mutex_lock(&lock);
    struct pool *p = pool_check(memPool);
    if (p && p->device == device)
        current[device] = p;
    pthread_mutex_unlock(&lock);
    return p && p->device == device ? cudaSuccess : nvp_ret(cudaErrorInvalidValue);
}

NVP_EXPORT cudaError_t cudaMemPoolCreate(cudaMemPool_t *memPool, const struct cudaMemPoolProps *props)
{
    cudaError_t e = nvp_enter();
    if (e)
        return nvp_ret(e);
    if (!memPool || !props || props->allocType != cudaMemAllocationTypePinned ||
        props->location.type != cudaMemLocationTypeDevice)
        return nvp_ret(cudaErrorInvalidValue);
    if ((e = nvp_valid_device(props->location.id)))
        return nvp_ret(e);
    struct pool *p = calloc(1, sizeof *p);
    if (!p)
        return nvp_ret(cudaErrorMemoryAllocation);
    pool_init(p, props->location.id);
    p->handle_types = props->handleTypes;
    pthread_mutex_lock(&lock);
    p->next = made;
    made = p;
    pthread_mutex_unlock(&lock);
    *memPool = (cudaMemPool_t)p;
    return cudaSuccess;
}

/* (the record stays, marked: a late free of one of its allocations still finds it) */
NVP_EXPORT cudaError_t cudaMemPoolDestroy(cudaMemPool_t memPool)
{
    pthread_mutex_lock(&lock);
    struct pool *p = pool_check(memPool);
    int is_default = p && p == &defaults[p->device];
    if (p && !is_default) {
        p->destroyed = 1;
        char path[4200];
        if (p->secret && !p->imported && pool_path(path, sizeof path, p->secret) == 0)
            unlink(path); /* (its shareable handle, if it gave one: descriptors of it stay readable) */
        for (int d = 0; d < NVP_MAX_DEVICES; d++)
            if (current[d] == p)
                current[d] = NULL;
    }
    pthread_mutex_unlock(&lock);
    return p && !is_default ? cudaSuccess : nvp_ret(cudaErrorInvalidValue);
}

NVP_EXPORT cudaError_t cudaMemPoolSetAccess(cudaMemPool_t memPool, const struct cudaMemAccessDesc *descs, size_t count)
{
    cudaError_t e = nvp_enter();
    if (e)
        return nvp_ret(e);
    int n = 0;
    cudaGetDeviceCount(&n);
    pthread_mutex_lock(&lock);
    struct pool *p = pool_check(memPool);
    for (size_t i = 0; p && i < count && !e; i++) {
        const struct cudaMemAccessDesc *d = &descs[i];
        if (d->location.type != cudaMemLocationTypeDevice || d->location.id < 0 || d->location.id >= n ||
            d->flags > cudaMemAccessFlagsProtReadWrite || (d->location.id == p->device && !d->flags))
            e = cudaErrorInvalidValue;
        else if (d->location.id != p->device) {
            int can = 0; /* (the proxy maps the device's memory for that device too: PEER's grant) */
            cudaDeviceCanAccessPeer(&can, d->location.id, p->device);
            uint64_t a[NVP_MAX_ARGS] = {3, (uint64_t)p->device, 0, (uint64_t)d->location.id};
            struct nvp_reply r = {0};
            if (d->flags && !can)
                e = cudaErrorInvalidDevice;
            else if (d->flags && !p->imported)
                e = nvp_call(NVP_OP_PEER, a, NULL, 0, &r, -1);
            if (!e)
                p->access[d->location.id] = d->flags;
        }
    }
    pthread_mutex_unlock(&lock);
    return nvp_ret(!p || (count && !descs) ? cudaErrorInvalidValue : e);
}

NVP_EXPORT cudaError_t cudaMemPoolGetAccess(enum cudaMemAccessFlags *flags, cudaMemPool_t memPool,
                                            struct cudaMemLocation *location)
{
    if (!flags || !location || location->type != cudaMemLocationTypeDevice || location->id < 0 ||
        location->id >= NVP_MAX_DEVICES)
        return nvp_ret(cudaErrorInvalidValue);
    pthread_mutex_lock(&lock);
    struct pool *p = pool_check(memPool);
    if (p)
        *flags = (enum cudaMemAccessFlags)p->access[location->id];
    pthread_mutex_unlock(&lock);
    return p ? cudaSuccess : nvp_ret(cudaErrorInvalidValue);
}

/* ---- pool IPC: a pool's shareable handle is a descriptor of a small file (in the private directory) naming
 * the pool by its secret; a pointer's export data is a CUDA IPC memory handle of the allocation (ipc.c) with that secret, so
 * that it imports only through its own pool.  Imported pointers are freed by closing the IPC mapping. ---- */

#define SHARE_MAGIC 0x4c4f4f50u /* "POOL" */
struct pool_share {
    uint32_t magic, pid;
    int32_t dev;
    uint32_t pad;
    uint64_t secret;
};

static uint64_t pool_secret(struct pool *p) /* (lock held) */
{
    while (!p->secret && getrandom(&p->secret, sizeof p->secret, 0) != (ssize_t)sizeof p->secret)
        ;
    return p->secret;
}

NVP_EXPORT cudaError_t cudaMemPoolExportToShareableHandle(void *handle, cudaMemPool_t memPool,
                                                          enum cudaMemAllocationHandleType type, unsigned int flags)
{
    cudaError_t e = nvp_enter();
    if (e)
        return nvp_ret(e);
    pthread_mutex_lock(&lock);
    struct pool *p = pool_check(memPool);
    int ok = p && handle && !flags && type == cudaMemHandleTypePosixFileDescriptor && !p->imported &&
             (p->handle_types & cudaMemHandleTypePosixFileDescriptor);
    struct pool_share sh = {SHARE_MAGIC, (uint32_t)nvp_real_pid(), ok ? p->device : 0, 0, ok ? pool_secret(p) : 0};
    pthread_mutex_unlock(&lock);
    if (!ok)
        return nvp_ret(cudaErrorInvalidValue);
    /* a file in the private directory rather than a memfd: DMTCP brings descriptors of files back (opened
     * again by name) but drops those of memfds nobody maps; the file goes with the pool */
    char path[4200];
    int fd = pool_path(path, sizeof path, sh.secret) == 0
                 ? open(path, O_RDWR | O_CREAT | O_CLOEXEC | O_NOFOLLOW, 0600)
                 : -1;
    if (fd < 0 || pwrite(fd, &sh, sizeof sh, 0) != (ssize_t)sizeof sh) {
        if (fd >= 0)
            close(fd);
        return nvp_ret(cudaErrorOperatingSystem);
    }
    *(int *)handle = fd;
    return cudaSuccess;
}

NVP_EXPORT cudaError_t cudaMemPoolImportFromShareableHandle(cudaMemPool_t *memPool, void *handle,
                                                            enum cudaMemAllocationHandleType type, unsigned int flags)
{
    cudaError_t e = nvp_enter();
    if (e)
        return nvp_ret(e);
    struct pool_share sh;
    int fd = (int)(intptr_t)handle;
    if (!memPool || flags || type != cudaMemHandleTypePosixFileDescriptor ||
        pread(fd, &sh, sizeof sh, 0) != (ssize_t)sizeof sh ||
        sh.magic != SHARE_MAGIC || !sh.secret)
        return nvp_ret(cudaErrorInvalidValue);
    if ((e = nvp_valid_device(sh.dev)))
        return nvp_ret(e);
    struct pool *p = calloc(1, sizeof *p);
    if (!p)
        return nvp_ret(cudaErrorMemoryAllocation);
    pool_init(p, sh.dev);
    p->handle_types = cudaMemHandleTypePosixFileDescriptor;
    p->imported = 1;
    p->secret = sh.secret;
    pthread_mutex_lock(&lock);
    p->next = made;
    made = p;
    pthread_mutex_unlock(&lock);
    *memPool = (cudaMemPool_t)p;
    return cudaSuccess;
}

/* the secret goes in the IPC handle's pool_secret field */
#define SECRET_AT offsetof(struct nvp_ipc_mem, pool_secret)

NVP_EXPORT cudaError_t cudaMemPoolExportPointer(struct cudaMemPoolPtrExportData *data, void *ptr)
{
    cudaError_t e = nvp_enter();
    if (e)
        return nvp_ret(e);
    uint64_t secret = 0;
    pthread_mutex_lock(&lock);
    for (size_t i = 0; i < nlive; i++)
        if (live[i].ptr == (uint64_t)(uintptr_t)ptr && !live[i].imported &&
            (live[i].pool->handle_types & cudaMemHandleTypePosixFileDescriptor))
            secret = pool_secret(live[i].pool);
    pthread_mutex_unlock(&lock);
    if (!data || !secret) /* (native: a pointer of a pool that can be exported) */
        return nvp_ret(cudaErrorInvalidValue);
    cudaIpcMemHandle_t h;
    _Static_assert(sizeof h == sizeof *data && SECRET_AT + 8 <= sizeof h, "export data holds an IPC handle");
    if ((e = cudaIpcGetMemHandle(&h, ptr)))
        return e;
    memcpy((char *)&h + SECRET_AT, &secret, sizeof secret);
    memcpy(data, &h, sizeof h);
    return cudaSuccess;
}

NVP_EXPORT cudaError_t cudaMemPoolImportPointer(void **ptr, cudaMemPool_t memPool,
                                                struct cudaMemPoolPtrExportData *data)
{
    cudaError_t e = nvp_enter();
    if (e)
        return nvp_ret(e);
    pthread_mutex_lock(&lock);
    struct pool *p = pool_check(memPool);
    uint64_t secret = p && p->imported ? p->secret : 0, theirs = 1;
    pthread_mutex_unlock(&lock);
    cudaIpcMemHandle_t h;
    if (data) {
        memcpy(&h, data, sizeof h);
        memcpy(&theirs, (char *)&h + SECRET_AT, sizeof theirs);
        memset((char *)&h + SECRET_AT, 0, sizeof theirs);
    }
    if (!ptr || !data || !secret || theirs != secret) /* (another pool's pointer, or no pointer at all) */
        return nvp_ret(cudaErrorInvalidValue);
    if ((e = cudaIpcOpenMemHandle(ptr, h, cudaIpcMemLazyEnablePeerAccess)))
        return e;
    pthread_mutex_lock(&lock);
    if (live_add((uint64_t)(uintptr_t)*ptr, 0, p, 1))
        __atomic_add_fetch(&nimported, 1, __ATOMIC_RELAXED);
    pthread_mutex_unlock(&lock);
    return cudaSuccess;
}

/* cudaFree of a pointer imported from another process's pool: its mapping closes (1); else 0. */
int nvp_pool_import_free(uint64_t ptr)
{
    if (!__atomic_load_n(&nimported, __ATOMIC_RELAXED)) /* (every cudaFree asks) */
        return 0;
    int found = 0;
    pthread_mutex_lock(&lock);
    for (size_t i = 0; i < nlive && !found; i++)
        if (live[i].ptr == ptr && live[i].imported) {
            live[i] = live[--nlive];
            __atomic_sub_fetch(&nimported, 1, __ATOMIC_RELAXED);
            found = 1;
        }
    pthread_mutex_unlock(&lock);
    if (found)
        cudaIpcCloseMemHandle((void *)(uintptr_t)ptr);
    return found;
}

/* from pool p (on its device, whatever the current one is) */
static cudaError_t pool_alloc(struct pool *p, void **ptr, size_t size, cudaStream_t stream, int ptds)
{
    if (!ptr)
        return nvp_ret(cudaErrorInvalidValue);
    if (nvp_stream_wire(stream, ptds) < 0)
        return nvp_ret(cudaErrorInvalidResourceHandle);
    cudaError_t got;
    if (size && nvp_graph_mem_capture_alloc(ptr, size, p->device, stream, ptds, &got)) /* (graph memory) */
        return nvp_ret(got);
    int cur = nvp_current_device();
    cudaError_t e = p->device == cur ? cudaSuccess : cudaSetDevice(p->device);
    if (!e)
        e = cudaMalloc(ptr, size);
    if (p->device != cur)
        cudaSetDevice(cur);
    if (e || !*ptr)
        return e;
    pthread_mutex_lock(&lock);
    if (live_add((uint64_t)(uintptr_t)*ptr, size, p, 0)) {
        p->used += size;
        if (p->used > p->used_high)
            p->used_high = p->used;
    }
    pthread_mutex_unlock(&lock);
    return cudaSuccess;
}

static cudaError_t malloc_async(void **devPtr, size_t size, cudaStream_t hStream, int ptds)
{
    cudaError_t e = nvp_connect();
    if (e)
        return nvp_ret(e);
    struct pool *p;
    int dev = nvp_current_device();
    pthread_mutex_lock(&lock);
    p = current[dev] ? current[dev] : pool_of_device(dev);
    pthread_mutex_unlock(&lock);
    return pool_alloc(p, devPtr, size, hStream, ptds);
}

NVP_EXPORT cudaError_t cudaMallocAsync(void **devPtr, size_t size, cudaStream_t hStream)
{
    return malloc_async(devPtr, size, hStream, 0);
}

NVP_EXPORT cudaError_t cudaMallocAsync_ptsz(void **devPtr, size_t size, cudaStream_t hStream)
{
    return malloc_async(devPtr, size, hStream, 1);
}

static cudaError_t from_pool(void **ptr, size_t size, cudaMemPool_t memPool, cudaStream_t stream, int ptds)
{
    pthread_mutex_lock(&lock);
    struct pool *p = pool_check(memPool);
    pthread_mutex_unlock(&lock);
    if (!p)
        return nvp_ret(cudaErrorInvalidValue);
    return pool_alloc(p, ptr, size, stream, ptds);
}

NVP_EXPORT cudaError_t cudaMallocFromPoolAsync(void **ptr, size_t size, cudaMemPool_t memPool, cudaStream_t stream)
{
    return from_pool(ptr, size, memPool, stream, 0);
}

NVP_EXPORT cudaError_t cudaMallocFromPoolAsync_ptsz(void **ptr, size_t size, cudaMemPool_t memPool,
                                                    cudaStream_t stream)
{
    return from_pool(ptr, size, memPool, stream, 1);
}

/* a pool allocation leaves the statistics (also when freed with cudaFree) */
void nvp_pool_forget(uint64_t ptr)
{
    pthread_mutex_lock(&lock);
    for (size_t i = 0; i < nlive; i++) {
        if (live[i].ptr == ptr && !live[i].imported) {
            live[i].pool->used -= live[i].size;
            live[i] = live[--nlive];
            break;
        }
    }
    pthread_mutex_unlock(&lock);
}

/* A capture takes the free: the graph frees the memory (graph_mem.c). */
static cudaError_t free_async(void *devPtr, cudaStream_t hStream, int ptds)
{
    if (nvp_stream_wire(hStream, ptds) < 0)
        return nvp_ret(cudaErrorInvalidResourceHandle);
    uint64_t p = (uint64_t)(uintptr_t)devPtr;
    cudaError_t e;
    if (p && nvp_is_device_ptr(p) && nvp_graph_mem_capture_free(p, hStream, ptds, &e))
        return nvp_ret(e);
    return cudaFree(devPtr);
}

NVP_EXPORT cudaError_t cudaFreeAsync(void *devPtr, cudaStream_t hStream) { return free_async(devPtr, hStream, 0); }

NVP_EXPORT cudaError_t cudaFreeAsync_ptsz(void *devPtr, cudaStream_t hStream)
{
    return free_async(devPtr, hStream, 1);
}

NVP_EXPORT cudaError_t cudaMemPoolTrimTo(cudaMemPool_t memPool, size_t minBytesToKeep)
{
    (void)minBytesToKeep; /* the proxy's arena gives cached memory back when the device runs short */
    pthread_mutex_lock(&lock);
    struct pool *p = pool_check(memPool);
    pthread_mutex_unlock(&lock);
    return p ? cudaSuccess : nvp_ret(cudaErrorInvalidValue);
}

/* get or set one attribute: the integer reuse flags, the 64-bit figures */
static cudaError_t pool_attr(cudaMemPool_t memPool, enum cudaMemPoolAttr attr, void *value, int set)
{
    pthread_mutex_lock(&lock);
    struct pool *p = pool_check(memPool);
    if (!p || !value) {
        pthread_mutex_unlock(&lock);
        return nvp_ret(cudaErrorInvalidValue);
    }
    cudaError_t e = cudaSuccess;
    uint64_t *v64 = value;
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
