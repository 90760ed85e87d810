/* CUDA IPC of device memory between applications that each have a proxy of
 * their own (a proxy serves one application only).  The handle names the
 * exporting application and carries a secret; the importing proxy asks the
 * exporter's proxy for the memory (a file descriptor of the driver's
 * allocation, over their control socket) and maps it.  Event handles work the
 * same way (the driver's handle of the event, asked for when opened), so that
 * exporters can be migrated and restarted: the proxy does it all. */
#include "shim.h"

#include <string.h>

NVP_EXPORT cudaError_t cudaIpcGetMemHandle(cudaIpcMemHandle_t *handle, void *devPtr)
{
    cudaError_t e = nvp_enter();
    if (e)
        return nvp_ret(e);
    uint64_t p = (uint64_t)(uintptr_t)devPtr;
    if (!handle || !nvp_alloc_contains(p, 1) || nvp_alloc_tag(p) == NVP_ALLOC_IPC)
        return nvp_ret(cudaErrorInvalidValue);
    uint64_t a[NVP_MAX_ARGS] = {p};
    struct nvp_reply r = {.out = handle, .out_cap = sizeof *handle};
    if (!(e = nvp_call(NVP_OP_IPC_MEM_EXPORT, a, NULL, 0, &r, -1)) && r.out_len != sizeof *handle)
        e = cudaErrorInvalidValue;
    return nvp_ret(e);
}

NVP_EXPORT cudaError_t cudaIpcOpenMemHandle(void **devPtr, cudaIpcMemHandle_t handle, unsigned int flags)
{
    cudaError_t e = nvp_enter();
    if (e)
        return nvp_ret(e);
    if (!devPtr || (flags & ~(unsigned)cudaIpcMemLazyEnablePeerAccess))
        return nvp_ret(cudaErrorInvalidValue);
    uint64_t a[NVP_MAX_ARGS] = {flags};
    struct nvp_reply r = {0};
    if ((e = nvp_call(NVP_OP_IPC_MEM_OPEN, a, &handle, sizeof handle, &r, -1)))
        return nvp_ret(e);
    if (nvp_alloc_tag(r.h.r[1]) != NVP_ALLOC_IPC) /* (opened again: the driver counts, so does the proxy) */
        nvp_alloc_add(r.h.r[1], r.h.r[2], NVP_ALLOC_IPC);
    *devPtr = (void *)(uintptr_t)r.h.r[0];
    return cudaSuccess;
}

NVP_EXPORT cudaError_t cudaIpcCloseMemHandle(void *devPtr)
{
    cudaError_t e = nvp_enter();
    if (e)
        return nvp_ret(e);
    uint64_t a[NVP_MAX_ARGS] = {(uint64_t)(uintptr_t)devPtr};
    struct nvp_reply r = {0}; /* -> r0 1 when the last opening of the mapping closed */
    if ((e = nvp_call(NVP_OP_IPC_MEM_CLOSE, a, NULL, 0, &r, -1)))
        return nvp_ret(e);
    if (r.h.r[0]) {
        int tag;
        nvp_alloc_remove(r.h.r[1], &tag);
    }
    return cudaSuccess;
}
