/* Driver calls with no runtime call to map onto: memsets of 16- and 32-bit values (and 2D ones), stream memory
 * operations (cuStreamWriteValue, cuStreamWaitValue), pointer
 * attributes and address ranges (answered from what the shim knows of allocations), peer access between
 * contexts, and a stream's context. */
#include "driver.h"

#include <stdio.h>

CUresult nvp_drv_memset(CUdeviceptr dst, size_t pitch, unsigned value, unsigned elsize, size_t width, size_t height,
                        CUstream s, int ptds)
{
    int64_t w;
    cudaError_t e = nvp_enter_stream((cudaStream_t)s, ptds, &w);
    if (e)
        return nvp_drv_code(e);
    if (!width || !height)
        return CUDA_SUCCESS;
    size_t row = width * elsize;
    if (height > 1 && pitch < row)
        return CUDA_ERROR_INVALID_VALUE;
    uint64_t span = (height - 1) * (uint64_t)pitch + row;
    if (!dst || dst % elsize || (nvp_in_arena(dst) && !nvp_alloc_contains(dst, span)))
        return CUDA_ERROR_INVALID_VALUE;
    uint64_t a[NVP_MAX_ARGS] = {dst, height > 1 ? pitch : row, value, elsize, width, height, (uint64_t)w};
    return nvp_drv_code(nvp_call(NVP_OP_DRV_MEMSET, a, NULL, 0, NULL, -1));
}

CUresult nvp_drv_memop(CUstream s, unsigned kind, CUdeviceptr addr, uint64_t value, unsigned flags, int ptds)
{
    int wide = kind == NVP_MEMOP_WRITE64 || kind == NVP_MEMOP_WAIT64;
    int wait = kind == NVP_MEMOP_WAIT32 || kind == NVP_MEMOP_WAIT64;
    unsigned known = wait ? 0x3u | CU_STREAM_WAIT_VALUE_FLUSH : CU_STREAM_WRITE_VALUE_NO_MEMORY_BARRIER;
    int64_t w;
    cudaError_t e = nvp_enter_stream((cudaStream_t)s, ptds, &w);
    if (e)
        return nvp_drv_code(e);
    if (!addr || addr % (wide ? 8 : 4) || (flags & ~known) || (nvp_in_arena(addr) && !nvp_alloc_contains(addr, 4)))
        return CUDA_ERROR_INVALID_VALUE;
    uint64_t a[NVP_MAX_ARGS] = {(uint64_t)w, kind, addr, wide ? value : (uint32_t)value, flags};
    return nvp_drv_code(nvp_call(NVP_OP_DRV_STREAM_MEMOP, a, NULL, 0, NULL, -1));
}

/* one side of a 2D copy: where its first byte is (NULL: a kind of memory nvproxy does not copy so) */
static char *side(CUmemorytype type, const void *host, CUdeviceptr dev, size_t x, size_t y, size_t pitch)
{
    char *base = type == CU_MEMORYTYPE_HOST                                     ? (char *)host
                 : type == CU_MEMORYTYPE_DEVICE || type == CU_MEMORYTYPE_UNIFIED ? (char *)(uintptr_t)dev
                                                                                 : NULL;
    return base ? base + y * pitch + x : NULL;
}

CUresult nvp_drv_copy2d(const CUDA_MEMCPY2D *c, CUstream s, int async, int ptds)
{
    if (!c)
        return CUDA_ERROR_INVALID_VALUE;
    if (c->srcMemoryType == CU_MEMORYTYPE_ARRAY || c->dstMemoryType == CU_MEMORYTYPE_ARRAY)
        return nvp_drv_unsupported("cuMemcpy2D with a CUDA array");
    const char *src = side(c->srcMemoryType, c->srcHost, c->srcDevice, c->srcXInBytes, c->srcY, c->srcPitch);
    char *dst = side(c->dstMemoryType, c->dstHost, c->dstDevice, c->dstXInBytes, c->dstY, c->dstPitch);
    if (!src || !dst)
        return CUDA_ERROR_INVALID_VALUE;
    cudaStream_t st = ptds && !s ? cudaStreamPerThread : (cudaStream_t)s;
    if (async || ptds) { /* (a synchronous one on the thread's stream: issued there, then waited for) */
        cudaError_t saved = cudaPeekAtLastError();
        cudaError_t e = cudaMemcpy2DAsync(dst, c->dstPitch, src, c->srcPitch, c->WidthInBytes, c->Height,
                                          cudaMemcpyDefault, st);
        if (!e && !async)
            e = cudaStreamSynchronize(st);
        return nvp_drv_rt_result(saved, e);
    }
    return NVP_DRV_RT(cudaMemcpy2D(dst, c->dstPitch, src, c->srcPitch, c->WidthInBytes, c->Height,
                                   cudaMemcpyDefault));
}

CUresult nvp_drv_peer(CUcontext peer, unsigned flags, int enable)
{
    int dev;
    CUresult r = nvp_drv_ctx_device(peer, &dev);
    if (r)
        return r;
    return NVP_DRV_RT(enable ? cudaDeviceEnablePeerAccess(dev, flags) : cudaDeviceDisablePeerAccess(dev));
}

CUresult nvp_drv_stream_ctx(CUstream s, CUcontext *pctx)
{
    if (!pctx)
        return CUDA_ERROR_INVALID_VALUE;
    int dev;
    cudaError_t e = cudaStreamGetDevice((cudaStream_t)s, &dev);
    if (e)
        return nvp_drv_code(e);
    *pctx = nvp_drv_primary(dev);
    return CUDA_SUCCESS;
}

/* ---- pointer attributes ---- */

struct pointer {
    struct cudaPointerAttributes a;
    uint64_t base, size; /* the allocation (size 0: none the shim knows) */
};

/* what the shim knows of p: 0, or a driver error */
static CUresult pointer_of(CUdeviceptr p, struct pointer *out)
{
    memset(out, 0, sizeof *out);
    cudaError_t saved = cudaPeekAtLastError();
    CUresult r = nvp_drv_rt_result(saved, cudaPointerGetAttributes(&out->a, (const void *)(uintptr_t)p));
    if (!r && out->a.type != cudaMemoryTypeUnregistered && nvp_alloc_range(p, &out->base, &out->size) != 0)
        out->size = 0;
    return r;
}

/* one attribute of a known pointer into data (-1: nvproxy cannot say) */
static int attribute(const struct pointer *p, CUpointer_attribute attr, CUdeviceptr ptr, void *data)
{
    int known = p->a.type != cudaMemoryTypeUnregistered;
    switch (attr) {
    case CU_POINTER_ATTRIBUTE_CONTEXT:
        *(CUcontext *)data = known ? nvp_drv_primary(p->a.device) : NULL;
        return 0;
    case CU_POINTER_ATTRIBUTE_MEMORY_TYPE:
        *(unsigned *)data = !known ? 0 : p->a.type == cudaMemoryTypeHost ? CU_MEMORYTYPE_HOST : CU_MEMORYTYPE_DEVICE;
        return 0;
    case CU_POINTER_ATTRIBUTE_DEVICE_POINTER:
        *(CUdeviceptr *)data = (CUdeviceptr)(uintptr_t)p->a.devicePointer;
        return 0;
    case CU_POINTER_ATTRIBUTE_HOST_POINTER:
        *(void **)data = p->a.hostPointer;
        return 0;
    case CU_POINTER_ATTRIBUTE_IS_MANAGED:
        *(int *)data = p->a.type == cudaMemoryTypeManaged;
        return 0;
    case CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL:
        *(int *)data = known ? p->a.device : -2;
        return 0;
    case CU_POINTER_ATTRIBUTE_RANGE_START_ADDR:
        *(CUdeviceptr *)data = p->size ? p->base : 0;
        return p->size || !known ? 0 : -1;
    case CU_POINTER_ATTRIBUTE_RANGE_SIZE:
        *(size_t *)data = p->size;
        return p->size || !known ? 0 : -1;
    case CU_POINTER_ATTRIBUTE_MAPPED:
        *(int *)data = known;
        return 0;
    default:
        (void)ptr;
        return -1;
    }
}

static CUresult unsupported_attribute(CUpointer_attribute attr)
{
    char what[80];
    snprintf(what, sizeof what, "cuPointerGetAttribute of attribute %d", (int)attr);
    return nvp_drv_unsupported(what);
}

#undef cuPointerGetAttribute
NVP_EXPORT CUresult CUDAAPI cuPointerGetAttribute(void *data, CUpointer_attribute attribute_, CUdeviceptr ptr)
{
    NVP_DRV_ENTER(1);
    if (!data)
        return CUDA_ERROR_INVALID_VALUE;
    struct pointer p;
    CUresult r = pointer_of(ptr, &p);
    if (r)
        return r;
    if (p.a.type == cudaMemoryTypeUnregistered) /* (natively: not memory the driver knows) */
        return CUDA_ERROR_INVALID_VALUE;
    if (attribute(&p, attribute_, ptr, data) != 0)
        return unsupported_attribute(attribute_);
    if (attribute_ == CU_POINTER_ATTRIBUTE_HOST_POINTER && !p.a.hostPointer)
        return CUDA_ERROR_INVALID_VALUE; /* (device memory has no host address) */
    return CUDA_SUCCESS;
}

#undef cuPointerGetAttributes
NVP_EXPORT CUresult CUDAAPI cuPointerGetAttributes(unsigned int numAttributes, CUpointer_attribute *attributes,
                                                   void **data, CUdeviceptr ptr)
{
    NVP_DRV_ENTER(1);
    if (!numAttributes || !attributes || !data)
        return CUDA_ERROR_INVALID_VALUE;
    struct pointer p;
    CUresult r = pointer_of(ptr, &p);
    for (unsigned i = 0; i < numAttributes && !r; i++)
        if (attribute(&p, attributes[i], ptr, data[i]) != 0)
            r = unsupported_attribute(attributes[i]);
    return r;
}

#undef cuMemGetAddressRange
NVP_EXPORT CUresult CUDAAPI cuMemGetAddressRange_v2(CUdeviceptr *pbase, size_t *psize, CUdeviceptr dptr)
{
    NVP_DRV_ENTER(1);
    uint64_t base, size;
    if (nvp_alloc_range(dptr, &base, &size) != 0)
        return CUDA_ERROR_NOT_FOUND;
    if (pbase)
        *pbase = base;
    if (psize)
        *psize = size;
    return CUDA_SUCCESS;
}
