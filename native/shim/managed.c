/* Managed memory (cudaMallocManaged and its hints).
 *
 * Where it can, nvproxy migrates it (managed_pages.c).  Elsewhere (and for __managed__ variables, launch.c) the
 * application reads and writes it directly as memory that both processes map at the same address: shared host
 * memory, as cudaMallocHost's, which the proxy registers as mapped pinned memory; kernels reach it over the bus
 * at the same address (unified addressing), coherent at every point, and checkpoints keep it as they keep pinned
 * memory.  Advice and prefetches (but a prefetch to the device of migrating memory) are checked as the runtime
 * checks them and otherwise do nothing.  docs/user-guide.md gives the performance model. */
#include "shim.h"

#include <stdint.h>

NVP_EXPORT cudaError_t cudaMallocManaged(void **devPtr, size_t size, unsigned int flags)
{
    if (!devPtr || (flags != cudaMemAttachGlobal && flags != cudaMemAttachHost))
        return nvp_ret(cudaErrorInvalidValue);
    cudaError_t e = nvp_enter();
    if (e)
        return nvp_ret(e);
    if (size && (e = nvp_managed_pages_alloc(devPtr, size, cudaHostAllocPortable | cudaHostAllocMapped)) !=
                    cudaErrorNotSupported)
        return nvp_ret(e);
    return nvp_host_alloc(devPtr, size, cudaHostAllocPortable | cudaHostAllocMapped, NVP_HOST_MANAGED);
}

/* [p, p+n) lies in one managed allocation */
static int managed_range(const void *p, size_t n)
{
    struct nvp_host_region h;
    return p && nvp_host_shared((uint64_t)(uintptr_t)p, n, &h) && h.kind == NVP_HOST_MANAGED;
}

static cudaError_t check_location(struct cudaMemLocation loc, int host_ok)
{
    switch (loc.type) {
    case cudaMemLocationTypeDevice:
        return loc.id >= 0 && loc.id < nvp_device_count() ? cudaSuccess : cudaErrorInvalidDevice;
    case cudaMemLocationTypeHost:
    case cudaMemLocationTypeHostNuma:
    case cudaMemLocationTypeHostNumaCurrent:
        return host_ok ? cudaSuccess : cudaErrorInvalidValue;
    default:
        return cudaErrorInvalidValue;
    }
}

NVP_EXPORT cudaError_t cudaMemPrefetchAsync(const void *devPtr, size_t count, struct cudaMemLocation location,
                                            unsigned int flags, cudaStream_t stream)
{
    int64_t w;
    cudaError_t e = nvp_enter_stream(stream, 0, &w);
    if (e)
        return nvp_ret(e);
    if (count == 0 || flags != 0 || !managed_range(devPtr, count))
        return nvp_ret(cudaErrorInvalidValue);
    if ((e = check_location(location, 1)) == cudaSuccess && location.type == cudaMemLocationTypeDevice)
        nvp_managed_prefetch();
    return nvp_ret(e);
}

NVP_EXPORT cudaError_t cudaMemAdvise(const void *devPtr, size_t count, enum cudaMemoryAdvise advice,
                                     struct cudaMemLocation location)
{
    cudaError_t e = nvp_enter();
    if (e)
        return nvp_ret(e);
    if (count == 0 || !managed_range(devPtr, count) || advice < cudaMemAdviseSetReadMostly ||
        advice > cudaMemAdviseUnsetAccessedBy)
        return nvp_ret(cudaErrorInvalidValue);
    if (advice == cudaMemAdviseSetReadMostly || advice == cudaMemAdviseUnsetReadMostly)
        return cudaSuccess; /* the location is ignored for these */
    return nvp_ret(check_location(location, 1));
}

NVP_EXPORT cudaError_t cudaStreamAttachMemAsync(cudaStream_t stream, void *devPtr, size_t length, unsigned int flags)
{
    int64_t w;
    cudaError_t e = nvp_enter_stream(stream, 0, &w);
    if (e)
        return nvp_ret(e);
    if (flags != cudaMemAttachGlobal && flags != cudaMemAttachHost && flags != cudaMemAttachSingle)
        return nvp_ret(cudaErrorInvalidValue);
    struct nvp_host_region h;
    if (!devPtr || !nvp_host_shared((uint64_t)(uintptr_t)devPtr, length ? length : 1, &h) ||
        h.kind != NVP_HOST_MANAGED || (length && (uint64_t)(uintptr_t)devPtr != h.user))
        return nvp_ret(cudaErrorInvalidValue);
    return cudaSuccess;
}
