/* Device management: counts, selection, properties and attributes (cached
 * per device, answered locally), synchronisation, limits and versions. */
#include "shim.h"

#include <cuda_profiler_api.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static struct {
    pthread_mutex_t lock;
    struct nvp_device_info *info[NVP_MAX_DEVICES];
} D = {.lock = PTHREAD_MUTEX_INITIALIZER};

const struct nvp_device_info *nvp_device_info(int dev)
{
    if (dev < 0 || dev >= NVP_MAX_DEVICES || dev >= nvp_device_count())
        return NULL;
    struct nvp_device_info *d = __atomic_load_n(&D.info[dev], __ATOMIC_ACQUIRE);
    if (d)
        return d;
    d = calloc(1, sizeof *d);
    if (!d)
        return NULL;
    uint64_t a[NVP_MAX_ARGS] = {(uint64_t)dev};
    struct nvp_reply r = {.out = d, .out_cap = sizeof *d};
    if (nvp_call(NVP_OP_DEVICE_INFO, a, NULL, 0, &r, -1) != cudaSuccess || r.out_len != sizeof *d) {
        free(d);
        return NULL;
    }
    pthread_mutex_lock(&D.lock);
    if (D.info[dev]) {
        free(d);
        d = D.info[dev];
    } else {
        __atomic_store_n(&D.info[dev], d, __ATOMIC_RELEASE);
    }
    pthread_mutex_unlock(&D.lock);
    return d;
}

cudaError_t nvp_valid_device(int device)
{
    cudaError_t e = nvp_connect();
    if (e)
        return e;
    return device < 0 || device >= nvp_device_count() ? cudaErrorInvalidDevice : cudaSuccess;
}

NVP_EXPORT cudaError_t cudaGetDeviceCount(int *count)
{
    if (!count)
        return nvp_ret(cudaErrorInvalidValue);
    cudaError_t e = nvp_connect();
    if (e) {
        *count = 0;
        return nvp_ret(e);
    }
    *count = nvp_device_count();
    return *count ? cudaSuccess : nvp_ret(cudaErrorNoDevice);
}

NVP_EXPORT cudaError_t cudaGetDevice(int *device)
{
    if (!device)
        return nvp_ret(cudaErrorInvalidValue);
    *device = nvp_current_device();
    return cudaSuccess;
}

NVP_EXPORT cudaError_t cudaSetDevice(int device)
{
    cudaError_t e = nvp_valid_device(device);
    if (e)
        return nvp_ret(e);
    nvp_set_current_device(device);
    uint64_t a[NVP_MAX_ARGS] = {(uint64_t)device, ~0ull};
    return nvp_ret(nvp_call(NVP_OP_SET_DEVICE, a, NULL, 0, NULL, -1));
}

NVP_EXPORT cudaError_t cudaInitDevice(int device, unsigned int deviceFlags, unsigned int flags)
{
    (void)deviceFlags;
    (void)flags;
    return nvp_ret(nvp_valid_device(device));
}

NVP_EXPORT cudaError_t cudaSetDeviceFlags(unsigned int flags)
{
    cudaError_t e = nvp_enter();
    if (e)
        return nvp_ret(e);
    unsigned known = cudaDeviceScheduleMask | cudaDeviceMapHost | cudaDeviceLmemResizeToMax | cudaDeviceSyncMemops;
    if (flags & ~known)
        return nvp_ret(cudaErrorInvalidValue);
    uint64_t a[NVP_MAX_ARGS] = {(uint64_t)nvp_current_device(), flags};
    struct nvp_reply r = {0};
    return nvp_ret(nvp_call(NVP_OP_SET_DEVICE, a, NULL, 0, &r, -1));
}

NVP_EXPORT cudaError_t cudaGetDeviceFlags(unsigned int *flags)
{
    if (!flags)
        return nvp_ret(cudaErrorInvalidValue);
    *flags = cudaDeviceMapHost;
    return cudaSuccess;
}

NVP_EXPORT cudaError_t cudaDeviceGetAttribute(int *value, enum cudaDeviceAttr attr, int device)
{
    if (!value)
        return nvp_ret(cudaErrorInvalidValue);
    cudaError_t e = nvp_valid_device(device);
    if (e)
        return nvp_ret(e);
    if ((int)attr <= 0 || (int)attr >= NVP_MAX_ATTR)
        return nvp_ret(cudaErrorInvalidValue);
    const struct nvp_device_info *d = nvp_device_info(device);
    if (!d)
        return nvp_ret(cudaErrorDevicesUnavailable);
    *value = d->attr[attr];
    return cudaSuccess;
}

#define A(x) d->attr[cudaDevAttr##x]
NVP_EXPORT cudaError_t cudaGetDeviceProperties(struct cudaDeviceProp *p, int device)
{
    if (!p)
        return nvp_ret(cudaErrorInvalidValue);
    cudaError_t e = nvp_valid_device(device);
    if (e)
        return nvp_ret(e);
    const struct nvp_device_info *d = nvp_device_info(device);
    if (!d)
        return nvp_ret(cudaErrorDevicesUnavailable);
    memset(p, 0, sizeof *p);
    memcpy(p->name, d->name, sizeof p->name);
    memcpy(&p->uuid, d->uuid, sizeof p->uuid);
    p->totalGlobalMem = d->total_mem;
    p->sharedMemPerBlock = (size_t)A(MaxSharedMemoryPerBlock);
    p->regsPerBlock = A(MaxRegistersPerBlock);
    p->warpSize = A(WarpSize);
    p->memPitch = (size_t)(unsigned)A(MaxPitch);
    p->maxThreadsPerBlock = A(MaxThreadsPerBlock);
    p->maxThreadsDim[0] = A(MaxBlockDimX);
    p->maxThreadsDim[1] = A(MaxBlockDimY);
    p->maxThreadsDim[2] = A(MaxBlockDimZ);
    p->maxGridSize[0] = A(MaxGridDimX);
    p->maxGridSize[1] = A(MaxGridDimY);
    p->maxGridSize[2] = A(MaxGridDimZ);
    p->totalConstMem = (size_t)A(TotalConstantMemory);
    p->major = A(ComputeCapabilityMajor);
    p->minor = A(ComputeCapabilityMinor);
    p->textureAlignment = (size_t)A(TextureAlignment);
    p->texturePitchAlignment = (size_t)A(TexturePitchAlignment);
    p->multiProcessorCount = A(MultiProcessorCount);
    p->integrated = A(Integrated);
    p->canMapHostMemory = A(CanMapHostMemory);
    p->maxTexture1D = A(MaxTexture1DWidth);
    p->maxTexture1DMipmap = A(MaxTexture1DMipmappedWidth);
    p->maxTexture2D[0] = A(MaxTexture2DWidth);
    p->maxTexture2D[1] = A(MaxTexture2DHeight);
    p->maxTexture2DMipmap[0] = A(MaxTexture2DMipmappedWidth);
    p->maxTexture2DMipmap[1] = A(MaxTexture2DMipmappedHeight);
    p->maxTexture2DLinear[0] = A(MaxTexture2DLinearWidth);
    p->maxTexture2DLinear[1] = A(MaxTexture2DLinearHeight);
    p->maxTexture2DLinear[2] = A(MaxTexture2DLinearPitch);
    p->maxTexture2DGather[0] = A(MaxTexture2DGatherWidth);
    p->maxTexture2DGather[1] = A(MaxTexture2DGatherHeight);
    p->maxTexture3D[0] = A(MaxTexture3DWidth);
    p->maxTexture3D[1] = A(MaxTexture3DHeight);
    p->maxTexture3D[2] = A(MaxTexture3DDepth);
    p->maxTexture3DAlt[0] = A(MaxTexture3DWidthAlt);
    p->maxTexture3DAlt[1] = A(MaxTexture3DHeightAlt);
    p->maxTexture3DAlt[2] = A(MaxTexture3DDepthAlt);
    p->maxTextureCubemap = A(MaxTextureCubemapWidth);
    p->maxTexture1DLayered[0] = A(MaxTexture1DLayeredWidth);
    p->maxTexture1DLayered[1] = A(MaxTexture1DLayeredLayers);
    p->maxTexture2DLayered[0] = A(MaxTexture2DLayeredWidth);
    p->maxTexture2DLayered[1] = A(MaxTexture2DLayeredHeight);
    p->maxTexture2DLayered[2] = A(MaxTexture2DLayeredLayers);
    p->maxTextureCubemapLayered[0] = A(MaxTextureCubemapLayeredWidth);
    p->maxTextureCubemapLayered[1] = A(MaxTextureCubemapLayeredLayers);
    p->maxSurface1D = A(MaxSurface1DWidth);
    p->maxSurface2D[0] = A(MaxSurface2DWidth);
    p->maxSurface2D[1] = A(MaxSurface2DHeight);
    p->maxSurface3D[0] = A(MaxSurface3DWidth);
    p->maxSurface3D[1] = A(MaxSurface3DHeight);
    p->maxSurface3D[2] = A(MaxSurface3DDepth);
    p->maxSurface1DLayered[0] = A(MaxSurface1DLayeredWidth);
    p->maxSurface1DLayered[1] = A(MaxSurface1DLayeredLayers);
    p->maxSurface2DLayered[0] = A(MaxSurface2DLayeredWidth);
    p->maxSurface2DLayered[1] = A(MaxSurface2DLayeredHeight);
    p->maxSurface2DLayered[2] = A(MaxSurface2DLayeredLayers);
    p->maxSurfaceCubemap = A(MaxSurfaceCubemapWidth);
    p->maxSurfaceCubemapLayered[0] = A(MaxSurfaceCubemapLayeredWidth);
    p->maxSurfaceCubemapLayered[1] = A(MaxSurfaceCubemapLayeredLayers);
    p->surfaceAlignment = (size_t)A(SurfaceAlignment);
    p->concurrentKernels = A(ConcurrentKernels);
    p->ECCEnabled = A(EccEnabled);
    p->pciBusID = A(PciBusId);
    p->pciDeviceID = A(PciDeviceId);
    p->pciDomainID = A(PciDomainId);
    p->tccDriver = A(TccDriver);
    p->asyncEngineCount = A(AsyncEngineCount);
    p->unifiedAddressing = A(UnifiedAddressing);
    p->memoryBusWidth = A(GlobalMemoryBusWidth);
    p->l2CacheSize = A(L2CacheSize);
    p->persistingL2CacheMaxSize = A(MaxPersistingL2CacheSize);
    p->maxThreadsPerMultiProcessor = A(MaxThreadsPerMultiProcessor);
    p->streamPrioritiesSupported = A(StreamPrioritiesSupported);
    p->globalL1CacheSupported = A(GlobalL1CacheSupported);
    p->localL1CacheSupported = A(LocalL1CacheSupported);
    p->sharedMemPerMultiprocessor = (size_t)A(MaxSharedMemoryPerMultiprocessor);
    p->regsPerMultiprocessor = A(MaxRegistersPerMultiprocessor);
    p->managedMemory = A(ManagedMemory);
    p->isMultiGpuBoard = A(IsMultiGpuBoard);
    p->multiGpuBoardGroupID = A(MultiGpuBoardGroupID);
    p->hostNativeAtomicSupported = A(HostNativeAtomicSupported);
    p->pageableMemoryAccess = A(PageableMemoryAccess);
    p->concurrentManagedAccess = A(ConcurrentManagedAccess);
    p->computePreemptionSupported = A(ComputePreemptionSupported);
    p->canUseHostPointerForRegisteredMem = A(CanUseHostPointerForRegisteredMem);
    p->cooperativeLaunch = A(CooperativeLaunch);
    p->sharedMemPerBlockOptin = (size_t)A(MaxSharedMemoryPerBlockOptin);
    p->pageableMemoryAccessUsesHostPageTables = A(PageableMemoryAccessUsesHostPageTables);
    p->directManagedMemAccessFromHost = A(DirectManagedMemAccessFromHost);
    p->maxBlocksPerMultiProcessor = A(MaxBlocksPerMultiprocessor);
    p->accessPolicyMaxWindowSize = A(MaxAccessPolicyWindowSize);
    p->reservedSharedMemPerBlock = (size_t)A(ReservedSharedMemoryPerBlock);
    p->hostRegisterSupported = A(HostRegisterSupported);
    p->sparseCudaArraySupported = A(SparseCudaArraySupported);
    p->hostRegisterReadOnlySupported = A(HostRegisterReadOnlySupported);
    p->timelineSemaphoreInteropSupported = A(TimelineSemaphoreInteropSupported);
    p->memoryPoolsSupported = A(MemoryPoolsSupported);
    p->gpuDirectRDMASupported = A(GPUDirectRDMASupported);
    p->gpuDirectRDMAFlushWritesOptions = (unsigned)A(GPUDirectRDMAFlushWritesOptions);
    p->gpuDirectRDMAWritesOrdering = A(GPUDirectRDMAWritesOrdering);
    p->memoryPoolSupportedHandleTypes = (unsigned)A(MemoryPoolSupportedHandleTypes);
    p->deferredMappingCudaArraySupported = A(DeferredMappingCudaArraySupported);
    p->ipcEventSupported = A(IpcEventSupport);
    p->clusterLaunch = A(ClusterLaunch);
    p->deviceNumaConfig = A(NumaConfig);
    p->deviceNumaId = A(NumaId);
    p->mpsEnabled = A(MpsEnabled);
    p->hostNumaId = A(HostNumaId);
    p->gpuPciDeviceID = (unsigned)A(GpuPciDeviceId);
    p->gpuPciSubsystemID = (unsigned)A(GpuPciSubsystemId);
    p->hostNumaMultinodeIpcSupported = A(HostNumaMultinodeIpcSupported);
    return cudaSuccess;
}
#undef A

NVP_EXPORT cudaError_t cudaDeviceGetPCIBusId(char *pciBusId, int len, int device)
{
    int dom, bus, dev;
    if (!pciBusId || len <= 0)
        return nvp_ret(cudaErrorInvalidValue);
    cudaError_t e;
    if ((e = cudaDeviceGetAttribute(&dom, cudaDevAttrPciDomainId, device)) ||
        (e = cudaDeviceGetAttribute(&bus, cudaDevAttrPciBusId, device)) ||
        (e = cudaDeviceGetAttribute(&dev, cudaDevAttrPciDeviceId, device)))
        return e;
    snprintf(pciBusId, (size_t)len, "%08X:%02X:%02X.0", dom, bus, dev);
    return cudaSuccess;
}

static cudaError_t simple_wait(uint16_t op, uint64_t a0)
{
    cudaError_t e = nvp_enter();
    if (e)
        return nvp_ret(e);
    uint64_t a[NVP_MAX_ARGS] = {a0};
    struct nvp_reply r = {0};
    return nvp_ret(nvp_call(op, a, NULL, 0, &r, -1));
}

NVP_EXPORT cudaError_t cudaCtxResetPersistingL2Cache(void) { return simple_wait(NVP_OP_RESET_PERSISTING_L2, 0); }

NVP_EXPORT cudaError_t cudaDeviceSynchronize(void)
{
    uint64_t sent = nvp_async_sent();
    cudaError_t e = simple_wait(NVP_OP_DEVICE_SYNC, 0);
    if (!e) /* memory freed before this is free to use again */
        nvp_note_device_idle(nvp_current_device(), sent);
    return e;
}

NVP_EXPORT cudaError_t cudaDeviceReset(void)
{
    /* Reset is allowed to clear even sticky errors in a fresh context; nvproxy
     * cannot reset the proxy's context under the application yet. */
    cudaError_t e = nvp_connect();
    if (e)
        return nvp_ret(e);
    uint64_t a[NVP_MAX_ARGS] = {0};
    struct nvp_reply r = {0};
    e = nvp_call(NVP_OP_DEVICE_RESET, a, NULL, 0, &r, -1);
    if (!e) { /* the proxy freed every allocation of the device */
        int dev = nvp_current_device();
        const struct nvp_device_info *d = nvp_device_info(dev);
        if (d)
            nvp_alloc_forget(d->arena_base, d->arena_base + d->arena_size);
        nvp_suballoc_reset(dev);
    }
    return nvp_ret(e);
}

NVP_EXPORT cudaError_t cudaThreadSynchronize(void) { return cudaDeviceSynchronize(); }

NVP_EXPORT cudaError_t cudaDeviceSetLimit(enum cudaLimit limit, size_t value)
{
    cudaError_t e = nvp_enter();
    if (e)
        return nvp_ret(e);
    uint64_t a[NVP_MAX_ARGS] = {(uint64_t)limit, value};
    struct nvp_reply r = {0};
    return nvp_ret(nvp_call(NVP_OP_SET_LIMIT, a, NULL, 0, &r, -1));
}

NVP_EXPORT cudaError_t cudaDeviceGetLimit(size_t *value, enum cudaLimit limit)
{
    if (!value)
        return nvp_ret(cudaErrorInvalidValue);
    cudaError_t e = nvp_enter();
    if (e)
        return nvp_ret(e);
    uint64_t a[NVP_MAX_ARGS] = {(uint64_t)limit};
    struct nvp_reply r = {0};
    e = nvp_call(NVP_OP_GET_LIMIT, a, NULL, 0, &r, -1);
    if (!e)
        *value = r.h.r[0];
    return nvp_ret(e);
}

NVP_EXPORT cudaError_t cudaDeviceGetStreamPriorityRange(int *least, int *greatest)
{
    cudaError_t e = nvp_enter();
    if (e)
        return nvp_ret(e);
    uint64_t a[NVP_MAX_ARGS] = {0};
    struct nvp_reply r = {0};
    e = nvp_call(NVP_OP_STREAM_PRIORITY_RANGE, a, NULL, 0, &r, -1);
    if (!e) {
        if (least)
            *least = (int)(int32_t)r.h.r[0];
        if (greatest)
            *greatest = (int)(int32_t)r.h.r[1];
    }
    return nvp_ret(e);
}

NVP_EXPORT cudaError_t cudaDeviceSetCacheConfig(enum cudaFuncCache c)
{
    cudaError_t e = nvp_enter();
    if (e)
        return nvp_ret(e);
    uint64_t a[NVP_MAX_ARGS] = {0, (uint64_t)c};
    struct nvp_reply r = {0};
    return nvp_ret(nvp_call(NVP_OP_CACHE_CONFIG, a, NULL, 0, &r, -1));
}

NVP_EXPORT cudaError_t cudaDeviceGetCacheConfig(enum cudaFuncCache *c)
{
    if (!c)
        return nvp_ret(cudaErrorInvalidValue);
    cudaError_t e = nvp_enter();
    if (e)
        return nvp_ret(e);
    uint64_t a[NVP_MAX_ARGS] = {1};
    struct nvp_reply r = {0};
    e = nvp_call(NVP_OP_CACHE_CONFIG, a, NULL, 0, &r, -1);
    if (!e)
        *c = (enum cudaFuncCache)r.h.r[0];
    return nvp_ret(e);
}

static cudaError_t peer(int what, int device, int peer, unsigned flags, uint64_t *out)
{
    cudaError_t e = nvp_enter();
    if (e)
        return nvp_ret(e);
    if (peer < 0 || peer >= nvp_device_count() || device < 0 || device >= nvp_device_count())
        return nvp_ret(cudaErrorInvalidDevice);
    uint64_t a[NVP_MAX_ARGS] = {(uint64_t)what, (uint64_t)peer, flags, (uint64_t)device};
    struct nvp_reply r = {0};
    e = nvp_call(NVP_OP_PEER, a, NULL, 0, &r, -1);
    if (!e && out)
        *out = r.h.r[0];
    return nvp_ret(e);
}

NVP_EXPORT cudaError_t cudaDeviceCanAccessPeer(int *can, int device, int peerDevice)
{
    if (!can)
        return nvp_ret(cudaErrorInvalidValue);
    uint64_t v = 0;
    cudaError_t e = device == peerDevice ? cudaSuccess : peer(0, device, peerDevice, 0, &v);
    *can = (int)v;
    return e;
}

NVP_EXPORT cudaError_t cudaDeviceEnablePeerAccess(int peerDevice, unsigned int flags)
{
    if (flags)
        return nvp_ret(cudaErrorInvalidValue);
    return peer(1, nvp_current_device(), peerDevice, flags, NULL);
}

NVP_EXPORT cudaError_t cudaDeviceDisablePeerAccess(int peerDevice)
{
    return peer(2, nvp_current_device(), peerDevice, 0, NULL);
}

NVP_EXPORT cudaError_t cudaRuntimeGetVersion(int *v)
{
    if (!v)
        return nvp_ret(cudaErrorInvalidValue);
    *v = CUDART_VERSION;
    return cudaSuccess;
}

NVP_EXPORT cudaError_t cudaDriverGetVersion(int *v)
{
    if (!v)
        return nvp_ret(cudaErrorInvalidValue);
    *v = nvp_driver_version();
    return cudaSuccess;
}

static cudaError_t profiler(int start)
{
    cudaError_t e = nvp_enter();
    if (e)
        return nvp_ret(e);
    uint64_t a[NVP_MAX_ARGS] = {(uint64_t)start};
    struct nvp_reply r = {0};
    return nvp_ret(nvp_call(NVP_OP_PROFILER, a, NULL, 0, &r, -1));
}

NVP_EXPORT cudaError_t cudaProfilerStart(void) { return profiler(1); }
NVP_EXPORT cudaError_t cudaProfilerStop(void) { return profiler(0); }

NVP_EXPORT cudaError_t cudaChooseDevice(int *device, const struct cudaDeviceProp *prop)
{
    if (!device || !prop)
        return nvp_ret(cudaErrorInvalidValue);
    cudaError_t e = nvp_connect();
    if (e)
        return nvp_ret(e);
    *device = 0;
    return cudaSuccess;
}
