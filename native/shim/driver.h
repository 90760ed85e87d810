/* The driver API (libcuda.so.1) in the shim: driver.c (initialisation, devices, contexts, results, entry
 * points), driver_module.c (modules, functions, launches), driver_mem.c (what has no runtime call to map onto),
 * driver_link.c (linking at run time and tensor maps: host work only the proxy's driver can do),
 * gen_driver_forward.c (the calls that mean a runtime call, generated), gen_driver_exports.c (every other export,
 * failing loudly).  A program's driver calls go to the proxy as its runtime calls do, through the same handles:
 * a CUstream is the shim's cudaStream_t, a CUfunction the shim's kernel object, a CUcontext stands for a device's
 * primary context in the proxy. */
#ifndef NVP_DRIVER_H
#define NVP_DRIVER_H

#include "shim.h"

#include <cuda.h>
#include <cudaProfiler.h>
#include <cuda_profiler_api.h>
#include <string.h>

/* the runtime's per-thread-stream forms the CUDA headers declare only under CUDA_API_PER_THREAD_DEFAULT_STREAM
 * (the generated _ptds driver calls use them) */
cudaError_t cudaMemcpy_ptds(void *dst, const void *src, size_t count, enum cudaMemcpyKind kind);
cudaError_t cudaMemset_ptds(void *devPtr, int value, size_t count);

/* ---- driver.c ---- */
/* The common entry check: the driver is initialised (cuInit, or the runtime was used), and with need_ctx the
 * thread has a current context. */
CUresult nvp_drv_enter(int need_ctx);
#define NVP_DRV_ENTER(need_ctx)                                                                                     \
    do {                                                                                                            \
        CUresult r_ = nvp_drv_enter(need_ctx);                                                                      \
        if (r_ != CUDA_SUCCESS)                                                                                     \
            return r_;                                                                                              \
    } while (0)
/* The driver's code for a runtime result. */
CUresult nvp_drv_code(cudaError_t e);
/* A runtime call's result as the driver call's: its own failure does not stay the runtime's last error (saved:
 * the last error before it). */
CUresult nvp_drv_rt_result(cudaError_t saved, cudaError_t e);
#define NVP_DRV_RT(call)                                                                                            \
    ({                                                                                                              \
        cudaError_t saved_ = cudaPeekAtLastError();                                                                 \
        nvp_drv_rt_result(saved_, (call));                                                                          \
    })
/* Every driver call that may have sent requests returns through this (the thread's runtime use is told from its
 * driver use by the requests in between). */
CUresult nvp_drv_done(CUresult r);
/* One stderr line naming the call; CUDA_ERROR_NOT_SUPPORTED. */
CUresult nvp_drv_unsupported(const char *call);
int nvp_drv_ctx_ok(CUcontext c);                 /* a live context handle of the shim */
CUresult nvp_drv_ctx_device(CUcontext c, int *dev); /* its device (CUDA_ERROR_INVALID_CONTEXT if none) */
CUcontext nvp_drv_primary(int dev);

/* _ptsz variants: a NULL stream is the thread's per-thread stream */
static inline cudaStream_t nvp_drv_ptsz(CUstream s) { return s ? (cudaStream_t)s : cudaStreamPerThread; }

static inline cudaIpcMemHandle_t nvp_drv_ipc_mem(CUipcMemHandle h)
{
    cudaIpcMemHandle_t r;
    _Static_assert(sizeof r == sizeof h, "the same 64 bytes");
    memcpy(&r, &h, sizeof r);
    return r;
}

static inline cudaIpcEventHandle_t nvp_drv_ipc_event(CUipcEventHandle h)
{
    cudaIpcEventHandle_t r;
    _Static_assert(sizeof r == sizeof h, "the same 64 bytes");
    memcpy(&r, &h, sizeof r);
    return r;
}

/* ---- driver_mem.c ---- */
/* cuMemsetD{8,16,32}, 2D or not (height 1), on stream s (NULL: the legacy stream, or with ptds the thread's) */
CUresult nvp_drv_memset(CUdeviceptr dst, size_t pitch, unsigned value, unsigned elsize, size_t width, size_t height,
                        CUstream s, int ptds);
/* cuMemcpy2D (async or not) of host, device or unified memory, on stream s (NULL: the legacy stream, or with ptds
 * the thread's) */
CUresult nvp_drv_copy2d(const CUDA_MEMCPY2D *c, CUstream s, int async, int ptds);
/* cuStreamWriteValue32/64 and cuStreamWaitValue32/64 (kind NVP_MEMOP_*): posted on stream s, in its order */
CUresult nvp_drv_memop(CUstream s, unsigned kind, CUdeviceptr addr, uint64_t value, unsigned flags, int ptds);
CUresult nvp_drv_peer(CUcontext peer, unsigned flags, int enable);
CUresult nvp_drv_stream_ctx(CUstream s, CUcontext *pctx);

/* ---- driver_module.c ---- */
/* JIT options of a load or link: checked, and what they would return set as the proxy's compilation leaves it */
CUresult nvp_drv_jit_options(unsigned n, const CUjit_option *options, void **values);
/* a file's bytes (malloc'ed, NUL-terminated past *size) */
CUresult nvp_drv_read_file(const char *fname, char **out, size_t *size);

/* ---- launch.c: modules the program loads itself ---- */
cudaError_t nvp_module_load(const void *image, size_t size, void **out);
cudaError_t nvp_module_unload(void *mod);
int nvp_module_known(void *mod); /* a module the program loaded and has not unloaded */
cudaError_t nvp_module_function(void *mod, const char *name, void **out);
cudaError_t nvp_module_global(void *mod, const char *name, uint64_t *addr, size_t *size);
void *nvp_kernel_module(const void *func);
cudaError_t nvp_kernel_param(const void *func, size_t i, size_t *offset, size_t *size);
/* a launch whose parameters come laid out in one buffer (cuLaunchKernel's `extra`) */
cudaError_t nvp_launch_buffer(const void *func, dim3 grid, dim3 block, const void *buf, size_t size, size_t shmem,
                              cudaStream_t stream, int per_thread, unsigned flags);

/* ---- tables.c ---- */
/* the allocation or shared host region holding p: 0, or -1 if none */
int nvp_alloc_range(uint64_t p, uint64_t *base, uint64_t *size);

#endif
