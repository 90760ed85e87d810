/* The driver's virtual memory management (what PyTorch's expandable segments use): address ranges reserved in
 * the proxy's arena (so a restore gives them back at the same addresses), physical allocations the proxy makes and
 * keeps under handles of the shim's own (they survive a restore), their mappings and access.  The proxy records
 * all of it (src/nvproxy/proxy/vmm.py).  A reservation is known here as an allocation (NVP_ALLOC_VMM): copies and
 * memsets into its mapped parts pass the shim's checks. */
#include "driver.h"

#include <stdlib.h>

struct vmm_rec {
    CUmemAllocationProp prop;
    uint64_t size;
};
_Static_assert(sizeof(struct vmm_rec) <= 48, "fits a handle table slot");

enum { DROPPED_MAX = 1024 };

/* a DRV_VMM request; the allocations it ended (their handles, listed by the reply) leave the handle table */
static CUresult vmm_call(uint64_t a[NVP_MAX_ARGS], const void *payload, size_t plen, uint64_t *r0)
{
    cudaError_t e = nvp_enter(); /* (a restore under way first, a sticky error, the proxy connected) */
    if (e)
        return nvp_drv_done(nvp_drv_code(e));
    uint64_t *dropped = malloc(DROPPED_MAX * sizeof *dropped);
    if (!dropped)
        return CUDA_ERROR_OUT_OF_MEMORY;
    struct nvp_reply rep = {.out = dropped, .out_cap = DROPPED_MAX * sizeof *dropped};
    e = nvp_call(NVP_OP_DRV_VMM, a, payload, plen, &rep, -1);
    if (!e) {
        /* (past DROPPED_MAX, the rest keep their slots: never reused, nothing else lost) */
        for (size_t i = 0; i < rep.out_len / sizeof *dropped; i++)
            nvp_handle_free(NVP_H_VMM, dropped[i]);
        if (r0)
            *r0 = rep.h.r[0];
    }
    free(dropped);
    return nvp_drv_done(nvp_drv_code(e));
}

static int device_location(const CUmemLocation *l) { return l->type == CU_MEM_LOCATION_TYPE_DEVICE; }

#undef cuMemAddressReserve
NVP_EXPORT CUresult CUDAAPI cuMemAddressReserve(CUdeviceptr *ptr, size_t size, size_t alignment, CUdeviceptr addr,
                                                unsigned long long flags)
{
    NVP_DRV_ENTER(1);
    if (!ptr || flags)
        return CUDA_ERROR_INVALID_VALUE;
    uint64_t a[NVP_MAX_ARGS] = {NVP_VMM_RESERVE, size, alignment, addr}, va;
    CUresult r = vmm_call(a, NULL, 0, &va);
    if (r)
        return r;
    nvp_alloc_add(va, size, NVP_ALLOC_VMM);
    *ptr = va;
    return CUDA_SUCCESS;
}

#undef cuMemAddressFree
NVP_EXPORT CUresult CUDAAPI cuMemAddressFree(CUdeviceptr ptr, size_t size)
{
    NVP_DRV_ENTER(0);
    uint64_t a[NVP_MAX_ARGS] = {NVP_VMM_FREE, ptr, size};
    CUresult r = vmm_call(a, NULL, 0, NULL);
    int tag;
    if (!r)
        nvp_alloc_remove(ptr, &tag);
    return r;
}

#undef cuMemCreate
NVP_EXPORT CUresult CUDAAPI cuMemCreate(CUmemGenericAllocationHandle *handle, size_t size,
                                        const CUmemAllocationProp *prop, unsigned long long flags)
{
    NVP_DRV_ENTER(0);
    if (!handle || !prop || flags || prop->type != CU_MEM_ALLOCATION_TYPE_PINNED)
        return CUDA_ERROR_INVALID_VALUE;
    if (!device_location(&prop->location))
        return nvp_drv_unsupported("cuMemCreate of memory other than a device's");
    if (prop->allocFlags.compressionType || prop->allocFlags.usage)
        return nvp_drv_unsupported("cuMemCreate of compressible or tile-pool memory");
    struct vmm_rec rec = {*prop, size};
    uint64_t h = nvp_handle_new(NVP_H_VMM, &rec, sizeof rec);
    if (!h)
        return CUDA_ERROR_OUT_OF_MEMORY;
    uint64_t a[NVP_MAX_ARGS] = {NVP_VMM_CREATE, h, size, (uint64_t)prop->location.id};
    CUresult r = vmm_call(a, prop, sizeof *prop, NULL);
    if (r) {
        nvp_handle_free(NVP_H_VMM, h);
        return r;
    }
    *handle = h;
    return CUDA_SUCCESS;
}

#undef cuMemRelease
NVP_EXPORT CUresult CUDAAPI cuMemRelease(CUmemGenericAllocationHandle handle)
{
    NVP_DRV_ENTER(0);
    if (nvp_handle_get(NVP_H_VMM, handle, NULL, 0))
        return CUDA_ERROR_INVALID_VALUE;
    uint64_t a[NVP_MAX_ARGS] = {NVP_VMM_RELEASE, handle};
    return vmm_call(a, NULL, 0, NULL);
}

#undef cuMemMap
NVP_EXPORT CUresult CUDAAPI cuMemMap(CUdeviceptr ptr, size_t size, size_t offset, CUmemGenericAllocationHandle handle,
                                     unsigned long long flags)
{
    NVP_DRV_ENTER(0);
    if (flags || nvp_handle_get(NVP_H_VMM, handle, NULL, 0))
        return CUDA_ERROR_INVALID_VALUE;
    uint64_t a[NVP_MAX_ARGS] = {NVP_VMM_MAP, ptr, size, offset, handle};
    return vmm_call(a, NULL, 0, NULL);
}

#undef cuMemUnmap
NVP_EXPORT CUresult CUDAAPI cuMemUnmap(CUdeviceptr ptr, size_t size)
{
    NVP_DRV_ENTER(0);
    uint64_t a[NVP_MAX_ARGS] = {NVP_VMM_UNMAP, ptr, size};
    return vmm_call(a, NULL, 0, NULL);
}

#undef cuMemSetAccess
NVP_EXPORT CUresult CUDAAPI cuMemSetAccess(CUdeviceptr ptr, size_t size, const CUmemAccessDesc *desc, size_t count)
{
    NVP_DRV_ENTER(0);
    if (!desc || !count || count > NVP_MAX_DEVICES)
        return CUDA_ERROR_INVALID_VALUE;
    uint32_t wire[NVP_MAX_DEVICES][4];
    for (size_t i = 0; i < count; i++) {
        if (!device_location(&desc[i].location))
            return nvp_drv_unsupported("cuMemSetAccess for a location other than a device");
        unsigned f = desc[i].flags;
        if (f != CU_MEM_ACCESS_FLAGS_PROT_NONE && f != CU_MEM_ACCESS_FLAGS_PROT_READ &&
            f != CU_MEM_ACCESS_FLAGS_PROT_READWRITE)
            return CUDA_ERROR_INVALID_VALUE;
        wire[i][0] = desc[i].location.type;
        wire[i][1] = (uint32_t)desc[i].location.id;
        wire[i][2] = f;
        wire[i][3] = 0;
    }
    uint64_t a[NVP_MAX_ARGS] = {NVP_VMM_ACCESS, ptr, size};
    return vmm_call(a, wire, count * sizeof wire[0], NULL);
}

#undef cuMemGetAccess
NVP_EXPORT CUresult CUDAAPI cuMemGetAccess(unsigned long long *flags, const CUmemLocation *location, CUdeviceptr ptr)
{
    NVP_DRV_ENTER(0);
    if (!flags || !location || !device_location(location) || location->id < 0)
        return CUDA_ERROR_INVALID_VALUE;
    uint64_t a[NVP_MAX_ARGS] = {NVP_VMM_GET_ACCESS, ptr, (uint64_t)location->id}, got;
    CUresult r = vmm_call(a, NULL, 0, &got);
    if (!r)
        *flags = got;
    return r;
}

#undef cuMemGetAllocationGranularity
NVP_EXPORT CUresult CUDAAPI cuMemGetAllocationGranularity(size_t *granularity, const CUmemAllocationProp *prop,
                                                          CUmemAllocationGranularity_flags option)
{
    static _Atomic uint64_t known[NVP_MAX_DEVICES]; /* asked of the proxy once per device (0: not yet) */
    NVP_DRV_ENTER(0);
    if (!granularity || !prop || prop->type != CU_MEM_ALLOCATION_TYPE_PINNED ||
        (option != CU_MEM_ALLOC_GRANULARITY_MINIMUM && option != CU_MEM_ALLOC_GRANULARITY_RECOMMENDED))
        return CUDA_ERROR_INVALID_VALUE;
    if (!device_location(&prop->location))
        return nvp_drv_unsupported("cuMemGetAllocationGranularity of memory other than a device's");
    int dev = prop->location.id;
    if (dev < 0 || dev >= nvp_device_count())
        return CUDA_ERROR_INVALID_DEVICE;
    uint64_t g = dev < NVP_MAX_DEVICES ? known[dev] : 0;
    if (!g) {
        uint64_t a[NVP_MAX_ARGS] = {NVP_VMM_GRANULARITY, (uint64_t)dev};
        CUresult r = vmm_call(a, NULL, 0, &g);
        if (r)
            return r;
        if (dev < NVP_MAX_DEVICES)
            known[dev] = g;
    }
    *granularity = g;
    return CUDA_SUCCESS;
}

#undef cuMemGetAllocationPropertiesFromHandle
NVP_EXPORT CUresult CUDAAPI cuMemGetAllocationPropertiesFromHandle(CUmemAllocationProp *prop,
                                                                   CUmemGenericAllocationHandle handle)
{
    NVP_DRV_ENTER(0);
    struct vmm_rec rec;
    if (!prop || nvp_handle_get(NVP_H_VMM, handle, &rec, sizeof rec))
        return CUDA_ERROR_INVALID_VALUE;
    *prop = rec.prop;
    return CUDA_SUCCESS;
}

#undef cuMemRetainAllocationHandle
NVP_EXPORT CUresult CUDAAPI cuMemRetainAllocationHandle(CUmemGenericAllocationHandle *handle, void *addr)
{
    NVP_DRV_ENTER(0);
    if (!handle || !addr)
        return CUDA_ERROR_INVALID_VALUE;
    uint64_t a[NVP_MAX_ARGS] = {NVP_VMM_RETAIN, (uint64_t)(uintptr_t)addr}, h;
    CUresult r = vmm_call(a, NULL, 0, &h);
    if (!r)
        *handle = h;
    return r;
}
