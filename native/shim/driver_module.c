/* Modules the program loads itself, their functions and variables, and launches (driver API).  A module's
 * image goes to the proxy as __cudaRegisterFatBinary's do (launch.c: nvp_module_load), so it is in every
 * checkpoint and loaded again by a new proxy; a CUfunction is the shim's kernel object, launched with the
 * parameter layout the proxy reported for it. */
#include "driver.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/stat.h>
#include <unistd.h>

#define FATBIN_WRAPPER_MAGIC 0x466243b1u
#define FATBIN_MAGIC 0xba55ed50u

/* an ELF image's extent: the furthest of its headers and section contents */
static size_t elf_size(const unsigned char *e)
{
    uint64_t shoff, phoff, end;
    uint16_t phentsize, phnum, shentsize, shnum;
    memcpy(&phoff, e + 0x20, 8);
    memcpy(&shoff, e + 0x28, 8);
    memcpy(&phentsize, e + 0x36, 2);
    memcpy(&phnum, e + 0x38, 2);
    memcpy(&shentsize, e + 0x3a, 2);
    memcpy(&shnum, e + 0x3c, 2);
    end = shoff + (uint64_t)shentsize * shnum;
    if (phoff + (uint64_t)phentsize * phnum > end)
        end = phoff + (uint64_t)phentsize * phnum;
    for (uint16_t i = 0; i < shnum; i++) {
        const unsigned char *s = e + shoff + (uint64_t)i * shentsize;
        uint32_t type;
        uint64_t off, size;
        memcpy(&type, s + 4, 4);
        memcpy(&off, s + 0x18, 8);
        memcpy(&size, s + 0x20, 8);
        if (type != 8 /* SHT_NOBITS */ && off + size > end)
            end = off + size;
    }
    return (size_t)end;
}

/* How many bytes of image the driver would read: a fatbinary (or the wrapper nvcc puts around one), a cubin, or
 * PTX text (NUL-terminated).  *data: where they start. */
static size_t image_size(const void *image, const void **data)
{
    const unsigned char *p = image;
    uint32_t magic;
    memcpy(&magic, p, 4);
    if (magic == FATBIN_WRAPPER_MAGIC) {
        memcpy(&p, p + 8, sizeof p);
        if (!p)
            return 0;
        memcpy(&magic, p, 4);
    }
    *data = p;
    if (magic == FATBIN_MAGIC) {
        uint16_t hsize;
        uint64_t fsize;
        memcpy(&hsize, p + 6, 2);
        memcpy(&fsize, p + 8, 8);
        return hsize + fsize;
    }
    if (!memcmp(p, "\177ELF", 4) && p[4] == 2 /* 64-bit */)
        return elf_size(p);
    return strlen((const char *)p) + 1;
}

static CUresult load(CUmodule *module, const void *image, size_t size)
{
    NVP_DRV_ENTER(0);
    if (!module || !image || !size)
        return CUDA_ERROR_INVALID_VALUE;
    void *m = NULL;
    cudaError_t saved = cudaPeekAtLastError();
    CUresult r = nvp_drv_rt_result(saved, nvp_module_load(image, size, &m));
    if (!r)
        *module = m;
    return r;
}

static CUresult load_image(CUmodule *module, const void *image)
{
    const void *data = image;
    return load(module, data, image ? image_size(image, &data) : 0);
}

#undef cuModuleLoadData
NVP_EXPORT CUresult CUDAAPI cuModuleLoadData(CUmodule *module, const void *image)
{
    NVP_DRV_ENTER(1);
    return load_image(module, image);
}

#undef cuModuleLoadFatBinary
NVP_EXPORT CUresult CUDAAPI cuModuleLoadFatBinary(CUmodule *module, const void *fatCubin)
{
    NVP_DRV_ENTER(1);
    return load_image(module, fatCubin);
}

/* JIT options only shape the compilation of PTX: the proxy's driver compiles it its own way, and the logs the
 * program asked for come back empty */
CUresult nvp_drv_jit_options(unsigned n, const CUjit_option *options, void **values)
{
    if (n && (!options || !values))
        return CUDA_ERROR_INVALID_VALUE;
    for (unsigned i = 0; i < n; i++) {
        switch (options[i]) {
        case CU_JIT_INFO_LOG_BUFFER_SIZE_BYTES:
        case CU_JIT_ERROR_LOG_BUFFER_SIZE_BYTES:
            values[i] = NULL; /* (nothing written) */
            break;
        case CU_JIT_WALL_TIME:
            memset(&values[i], 0, sizeof(float));
            break;
        default:
            break;
        }
    }
    return CUDA_SUCCESS;
}

#undef cuModuleLoadDataEx
NVP_EXPORT CUresult CUDAAPI cuModuleLoadDataEx(CUmodule *module, const void *image, unsigned int numOptions,
                                               CUjit_option *options, void **optionValues)
{
    NVP_DRV_ENTER(1);
    CUresult r = nvp_drv_jit_options(numOptions, options, optionValues);
    return r ? r : load_image(module, image);
}

CUresult nvp_drv_read_file(const char *fname, char **out, size_t *size)
{
    int fd = open(fname, O_RDONLY | O_CLOEXEC);
    struct stat st;
    if (fd < 0 || fstat(fd, &st) != 0) {
        if (fd >= 0)
            close(fd);
        return CUDA_ERROR_FILE_NOT_FOUND;
    }
    size_t n = (size_t)st.st_size;
    char *buf = malloc(n + 1);
    size_t got = 0;
    while (buf && got < n) {
        ssize_t k = read(fd, buf + got, n - got);
        if (k <= 0 && errno != EINTR)
            break;
        got += k > 0 ? (size_t)k : 0;
    }
    close(fd);
    if (!buf || got != n) {
        free(buf);
        return buf ? CUDA_ERROR_FILE_NOT_FOUND : CUDA_ERROR_OUT_OF_MEMORY;
    }
    buf[n] = 0; /* (PTX text: terminated) */
    *out = buf;
    *size = n;
    return CUDA_SUCCESS;
}

static CUresult load_file(CUmodule *module, const char *fname)
{
    if (!module || !fname)
        return CUDA_ERROR_INVALID_VALUE;
    char *buf;
    size_t n;
    CUresult rr = nvp_drv_read_file(fname, &buf, &n);
    if (rr)
        return rr;
    const void *data = buf;
    size_t size = n >= 16 ? image_size(buf, &data) : n + 1;
    CUresult r = data != buf ? CUDA_ERROR_INVALID_IMAGE : load(module, buf, size < n + 1 ? size : n + 1);
    free(buf);
    return r;
}

#undef cuModuleLoad
NVP_EXPORT CUresult CUDAAPI cuModuleLoad(CUmodule *module, const char *fname)
{
    NVP_DRV_ENTER(1);
    return load_file(module, fname);
}

#undef cuModuleUnload
NVP_EXPORT CUresult CUDAAPI cuModuleUnload(CUmodule hmod)
{
    NVP_DRV_ENTER(0);
    return NVP_DRV_RT(nvp_module_unload(hmod));
}

#undef cuModuleGetFunction
NVP_EXPORT CUresult CUDAAPI cuModuleGetFunction(CUfunction *hfunc, CUmodule hmod, const char *name)
{
    NVP_DRV_ENTER(1);
    if (!hfunc || !name)
        return CUDA_ERROR_INVALID_VALUE;
    void *k = NULL;
    cudaError_t saved = cudaPeekAtLastError();
    cudaError_t e = nvp_module_function(hmod, name, &k);
    if (e == cudaErrorInvalidDeviceFunction) /* (no such kernel in the module) */
        e = cudaErrorSymbolNotFound;
    CUresult r = nvp_drv_rt_result(saved, e);
    if (!r)
        *hfunc = k;
    return r;
}

#undef cuModuleGetGlobal
NVP_EXPORT CUresult CUDAAPI cuModuleGetGlobal_v2(CUdeviceptr *dptr, size_t *bytes, CUmodule hmod, const char *name)
{
    NVP_DRV_ENTER(1);
    if (!name)
        return CUDA_ERROR_INVALID_VALUE;
    uint64_t addr = 0;
    size_t size = 0;
    cudaError_t saved = cudaPeekAtLastError();
    CUresult r = nvp_drv_rt_result(saved, nvp_module_global(hmod, name, &addr, &size));
    if (dptr) /* (a failed lookup leaves zeros, as natively) */
        *dptr = r ? 0 : addr;
    if (bytes)
        *bytes = r ? 0 : size;
    return r;
}

/* ---- libraries (context-independent loading): a library is a module, loaded into each device's context as it
 * is used there (the proxy loads a module on a device when one of its kernels is first used on it), and a CUkernel
 * is the kernel object a CUfunction is ---- */

#undef cuLibraryLoadData
NVP_EXPORT CUresult CUDAAPI cuLibraryLoadData(CUlibrary *library, const void *code, CUjit_option *jitOptions,
                                              void **jitOptionsValues, unsigned int numJitOptions,
                                              CUlibraryOption *libraryOptions, void **libraryOptionValues,
                                              unsigned int numLibraryOptions)
{
    (void)jitOptions, (void)jitOptionsValues, (void)numJitOptions; /* (only shape the JIT compilation of PTX) */
    (void)libraryOptions, (void)libraryOptionValues, (void)numLibraryOptions;
    NVP_DRV_ENTER(0);
    return load_image((CUmodule *)library, code);
}

#undef cuLibraryLoadFromFile
NVP_EXPORT CUresult CUDAAPI cuLibraryLoadFromFile(CUlibrary *library, const char *fileName, CUjit_option *jitOptions,
                                                  void **jitOptionsValues, unsigned int numJitOptions,
                                                  CUlibraryOption *libraryOptions, void **libraryOptionValues,
                                                  unsigned int numLibraryOptions)
{
    (void)jitOptions, (void)jitOptionsValues, (void)numJitOptions;
    (void)libraryOptions, (void)libraryOptionValues, (void)numLibraryOptions;
    NVP_DRV_ENTER(0);
    return load_file((CUmodule *)library, fileName);
}

#undef cuLibraryUnload
NVP_EXPORT CUresult CUDAAPI cuLibraryUnload(CUlibrary library) { return cuModuleUnload((CUmodule)library); }

/* a handle that is another of the shim's objects too (a library its module, a kernel its function) */
static CUresult same_object(void **out, void *h, int known)
{
    NVP_DRV_ENTER(1);
    if (!out)
        return CUDA_ERROR_INVALID_VALUE;
    if (!known)
        return CUDA_ERROR_INVALID_HANDLE;
    *out = h;
    return CUDA_SUCCESS;
}

#undef cuLibraryGetModule
NVP_EXPORT CUresult CUDAAPI cuLibraryGetModule(CUmodule *pMod, CUlibrary library)
{
    return same_object((void **)pMod, library, nvp_module_known(library));
}

#undef cuLibraryGetKernel
NVP_EXPORT CUresult CUDAAPI cuLibraryGetKernel(CUkernel *pKernel, CUlibrary library, const char *name)
{
    return cuModuleGetFunction((CUfunction *)pKernel, (CUmodule)library, name);
}

#undef cuLibraryGetGlobal
NVP_EXPORT CUresult CUDAAPI cuLibraryGetGlobal(CUdeviceptr *dptr, size_t *bytes, CUlibrary library, const char *name)
{
    return cuModuleGetGlobal_v2(dptr, bytes, (CUmodule)library, name);
}

#undef cuKernelGetFunction
NVP_EXPORT CUresult CUDAAPI cuKernelGetFunction(CUfunction *pFunc, CUkernel kernel)
{
    return same_object((void **)pFunc, kernel, nvp_kernel_module(kernel) != NULL);
}

#undef cuModuleGetLoadingMode
NVP_EXPORT CUresult CUDAAPI cuModuleGetLoadingMode(CUmoduleLoadingMode *mode)
{
    NVP_DRV_ENTER(0);
    if (!mode)
        return CUDA_ERROR_INVALID_VALUE;
    *mode = CU_MODULE_LAZY_LOADING; /* (the shim sends a registered module when it is first used) */
    return CUDA_SUCCESS;
}

/* ---- functions ---- */

#undef cuFuncGetAttribute
NVP_EXPORT CUresult CUDAAPI cuFuncGetAttribute(int *pi, CUfunction_attribute attrib, CUfunction hfunc)
{
    NVP_DRV_ENTER(1);
    if (!pi)
        return CUDA_ERROR_INVALID_VALUE;
    struct cudaFuncAttributes a;
    cudaError_t saved = cudaPeekAtLastError();
    CUresult r = nvp_drv_rt_result(saved, cudaFuncGetAttributes(&a, hfunc));
    if (r)
        return r;
    switch (attrib) {
    case CU_FUNC_ATTRIBUTE_MAX_THREADS_PER_BLOCK: *pi = a.maxThreadsPerBlock; break;
    case CU_FUNC_ATTRIBUTE_SHARED_SIZE_BYTES: *pi = (int)a.sharedSizeBytes; break;
    case CU_FUNC_ATTRIBUTE_CONST_SIZE_BYTES: *pi = (int)a.constSizeBytes; break;
    case CU_FUNC_ATTRIBUTE_LOCAL_SIZE_BYTES: *pi = (int)a.localSizeBytes; break;
    case CU_FUNC_ATTRIBUTE_NUM_REGS: *pi = a.numRegs; break;
    case CU_FUNC_ATTRIBUTE_PTX_VERSION: *pi = a.ptxVersion; break;
    case CU_FUNC_ATTRIBUTE_BINARY_VERSION: *pi = a.binaryVersion; break;
    case CU_FUNC_ATTRIBUTE_CACHE_MODE_CA: *pi = a.cacheModeCA; break;
    case CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES: *pi = a.maxDynamicSharedSizeBytes; break;
    case CU_FUNC_ATTRIBUTE_PREFERRED_SHARED_MEMORY_CARVEOUT: *pi = a.preferredShmemCarveout; break;
    default:
        return nvp_drv_unsupported("cuFuncGetAttribute of a cluster attribute");
    }
    return CUDA_SUCCESS;
}

#undef cuKernelGetAttribute
NVP_EXPORT CUresult CUDAAPI cuKernelGetAttribute(int *pi, CUfunction_attribute attrib, CUkernel kernel, CUdevice dev)
{
    (void)dev; /* (a kernel's attributes are the same on every device nvproxy serves a process on) */
    return cuFuncGetAttribute(pi, attrib, (CUfunction)kernel);
}

#undef cuKernelGetName
NVP_EXPORT CUresult CUDAAPI cuKernelGetName(const char **name, CUkernel hfunc)
{
    NVP_DRV_ENTER(0);
    return NVP_DRV_RT(cudaFuncGetName(name, (const void *)hfunc));
}

#undef cuKernelGetParamInfo
NVP_EXPORT CUresult CUDAAPI cuKernelGetParamInfo(CUkernel kernel, size_t paramIndex, size_t *paramOffset,
                                                 size_t *paramSize)
{
    return cuFuncGetParamInfo((CUfunction)kernel, paramIndex, paramOffset, paramSize);
}

/* The block size of the highest occupancy (as the runtime's cudaOccupancyMaxPotentialBlockSize finds it): each
 * size of whole warps, from the largest down, asked of the proxy. */
static CUresult potential_block(int *minGridSize, int *blockSize, CUfunction f, CUoccupancyB2DSize smem_of,
                                size_t smem, int limit, unsigned flags)
{
    NVP_DRV_ENTER(1);
    if (!minGridSize || !blockSize)
        return CUDA_ERROR_INVALID_VALUE;
    struct cudaFuncAttributes a;
    CUresult r = NVP_DRV_RT(cudaFuncGetAttributes(&a, f));
    const struct nvp_device_info *d = r ? NULL : nvp_device_info(nvp_current_device());
    if (r || !d)
        return r ? r : CUDA_ERROR_DEVICE_UNAVAILABLE;
    int warp = d->attr[CU_DEVICE_ATTRIBUTE_WARP_SIZE], most = d->attr[CU_DEVICE_ATTRIBUTE_MAX_THREADS_PER_BLOCK];
    int per_sm = d->attr[CU_DEVICE_ATTRIBUTE_MAX_THREADS_PER_MULTIPROCESSOR];
    if (a.maxThreadsPerBlock < most)
        most = a.maxThreadsPerBlock;
    if (limit > 0 && limit < most)
        most = limit;
    int best = 0, best_size = 0, best_blocks = 0;
    for (int b = (most + warp - 1) / warp * warp; b > 0 && best < per_sm; b -= warp) {
        int size = b < most ? b : most, blocks = 0;
        r = NVP_DRV_RT(cudaOccupancyMaxActiveBlocksPerMultiprocessorWithFlags(
            &blocks, (const void *)f, size, smem_of ? smem_of(size) : smem, flags));
        if (r)
            return r;
        if (blocks * size > best) {
            best = blocks * size;
            best_size = size;
            best_blocks = blocks;
        }
    }
    *minGridSize = best_blocks * d->attr[CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT];
    *blockSize = best_size;
    return CUDA_SUCCESS;
}

#undef cuOccupancyMaxPotentialBlockSize
NVP_EXPORT CUresult CUDAAPI cuOccupancyMaxPotentialBlockSize(int *minGridSize, int *blockSize, CUfunction func,
                                                             CUoccupancyB2DSize blockSizeToDynamicSMemSize,
                                                             size_t dynamicSMemSize, int blockSizeLimit)
{
    return potential_block(minGridSize, blockSize, func, blockSizeToDynamicSMemSize, dynamicSMemSize,
                           blockSizeLimit, 0);
}

#undef cuOccupancyMaxPotentialBlockSizeWithFlags
NVP_EXPORT CUresult CUDAAPI cuOccupancyMaxPotentialBlockSizeWithFlags(int *minGridSize, int *blockSize,
                                                                      CUfunction func,
                                                                      CUoccupancyB2DSize blockSizeToDynamicSMemSize,
                                                                      size_t dynamicSMemSize, int blockSizeLimit,
                                                                      unsigned int flags)
{
    return potential_block(minGridSize, blockSize, func, blockSizeToDynamicSMemSize, dynamicSMemSize,
                           blockSizeLimit, flags);
}

#undef cuFuncGetParamInfo
NVP_EXPORT CUresult CUDAAPI cuFuncGetParamInfo(CUfunction func, size_t paramIndex, size_t *paramOffset,
                                               size_t *paramSize)
{
    NVP_DRV_ENTER(1);
    size_t off, size;
    cudaError_t saved = cudaPeekAtLastError();
    CUresult r = nvp_drv_rt_result(saved, nvp_kernel_param(func, paramIndex, &off, &size));
    if (!r && paramOffset)
        *paramOffset = off;
    if (!r && paramSize)
        *paramSize = size;
    return r;
}

#undef cuFuncGetModule
NVP_EXPORT CUresult CUDAAPI cuFuncGetModule(CUmodule *hmod, CUfunction hfunc)
{
    NVP_DRV_ENTER(0);
    if (!hmod)
        return CUDA_ERROR_INVALID_VALUE;
    void *m = nvp_kernel_module(hfunc);
    if (!m)
        return CUDA_ERROR_INVALID_HANDLE;
    *hmod = m;
    return CUDA_SUCCESS;
}

#undef cuFuncIsLoaded
NVP_EXPORT CUresult CUDAAPI cuFuncIsLoaded(CUfunctionLoadingState *state, CUfunction function)
{
    NVP_DRV_ENTER(0);
    if (!state)
        return CUDA_ERROR_INVALID_VALUE;
    if (!nvp_kernel_module(function))
        return CUDA_ERROR_INVALID_HANDLE;
    *state = CU_FUNCTION_LOADING_STATE_LOADED; /* (loaded when it is first used, which the shim does for it) */
    return CUDA_SUCCESS;
}

#undef cuFuncLoad
NVP_EXPORT CUresult CUDAAPI cuFuncLoad(CUfunction function)
{
    NVP_DRV_ENTER(1);
    struct cudaFuncAttributes a;
    return NVP_DRV_RT(cudaFuncGetAttributes(&a, function)); /* (which loads it) */
}

/* ---- launches ---- */

/* kernelParams, or extra: CU_LAUNCH_PARAM_BUFFER_POINTER and _SIZE (the block laid out by the program) */
static CUresult launch(CUfunction f, dim3 grid, dim3 block, unsigned shmem, CUstream s, void **params, void **extra,
                       int ptsz, unsigned flags)
{
    NVP_DRV_ENTER(1);
    cudaError_t saved = cudaPeekAtLastError(), e;
    if (extra) {
        const void *buf = NULL;
        size_t size = 0;
        for (void **p = extra; *p != CU_LAUNCH_PARAM_END; p++) {
            if (*p == CU_LAUNCH_PARAM_BUFFER_POINTER)
                buf = *++p;
            else if (*p == CU_LAUNCH_PARAM_BUFFER_SIZE)
                size = *(size_t *)*++p;
            else
                return nvp_drv_done(CUDA_ERROR_INVALID_VALUE);
        }
        if (params)
            return nvp_drv_done(CUDA_ERROR_INVALID_VALUE);
        e = nvp_launch_buffer(f, grid, block, buf, size, shmem, (cudaStream_t)s, ptsz, flags);
    } else {
        e = nvp_launch(f, grid, block, params, shmem, (cudaStream_t)s, ptsz, flags);
    }
    return nvp_drv_rt_result(saved, e);
}

static CUresult launch_kernel(CUfunction f, unsigned gx, unsigned gy, unsigned gz, unsigned bx, unsigned by,
                              unsigned bz, unsigned shmem, CUstream s, void **params, void **extra, int ptsz)
{
    return launch(f, (dim3){gx, gy, gz}, (dim3){bx, by, bz}, shmem, s, params, extra, ptsz, 0);
}

#undef cuLaunchKernel
NVP_EXPORT CUresult CUDAAPI cuLaunchKernel(CUfunction f, unsigned int gridDimX, unsigned int gridDimY,
                                           unsigned int gridDimZ, unsigned int blockDimX, unsigned int blockDimY,
                                           unsigned int blockDimZ, unsigned int sharedMemBytes, CUstream hStream,
                                           void **kernelParams, void **extra)
{
    return launch_kernel(f, gridDimX, gridDimY, gridDimZ, blockDimX, blockDimY, blockDimZ, sharedMemBytes, hStream,
                         kernelParams, extra, 0);
}

NVP_EXPORT CUresult CUDAAPI cuLaunchKernel_ptsz(CUfunction f, unsigned int gridDimX, unsigned int gridDimY,
                                                unsigned int gridDimZ, unsigned int blockDimX, unsigned int blockDimY,
                                                unsigned int blockDimZ, unsigned int sharedMemBytes, CUstream hStream,
                                                void **kernelParams, void **extra)
{
    return launch_kernel(f, gridDimX, gridDimY, gridDimZ, blockDimX, blockDimY, blockDimZ, sharedMemBytes, hStream,
                         kernelParams, extra, 1);
}

static CUresult cooperative(CUfunction f, unsigned gx, unsigned gy, unsigned gz, unsigned bx, unsigned by,
                            unsigned bz, unsigned shmem, CUstream s, void **params, int ptsz)
{
    return launch(f, (dim3){gx, gy, gz}, (dim3){bx, by, bz}, shmem, s, params, NULL, ptsz, NVP_LAUNCH_COOPERATIVE);
}

#undef cuLaunchCooperativeKernel
NVP_EXPORT CUresult CUDAAPI cuLaunchCooperativeKernel(CUfunction f, unsigned int gridDimX, unsigned int gridDimY,
                                                      unsigned int gridDimZ, unsigned int blockDimX,
                                                      unsigned int blockDimY, unsigned int blockDimZ,
                                                      unsigned int sharedMemBytes, CUstream hStream,
                                                      void **kernelParams)
{
    return cooperative(f, gridDimX, gridDimY, gridDimZ, blockDimX, blockDimY, blockDimZ, sharedMemBytes, hStream,
                       kernelParams, 0);
}

NVP_EXPORT CUresult CUDAAPI cuLaunchCooperativeKernel_ptsz(CUfunction f, unsigned int gridDimX, unsigned int gridDimY,
                                                           unsigned int gridDimZ, unsigned int blockDimX,
                                                           unsigned int blockDimY, unsigned int blockDimZ,
                                                           unsigned int sharedMemBytes, CUstream hStream,
                                                           void **kernelParams)
{
    return cooperative(f, gridDimX, gridDimY, gridDimZ, blockDimX, blockDimY, blockDimZ, sharedMemBytes, hStream,
                       kernelParams, 1);
}

static CUresult launch_ex(const CUlaunchConfig *config, CUfunction f, void **params, void **extra, int ptsz)
{
    if (!config)
        return CUDA_ERROR_INVALID_VALUE;
    unsigned flags = 0;
    for (unsigned i = 0; i < config->numAttrs; i++) {
        const CUlaunchAttribute *at = &config->attrs[i];
        if (at->id == CU_LAUNCH_ATTRIBUTE_COOPERATIVE) {
            flags |= at->value.cooperative ? NVP_LAUNCH_COOPERATIVE : 0;
        } else {
            char what[96];
            snprintf(what, sizeof what, "cuLaunchKernelEx with launch attribute %d", (int)at->id);
            return nvp_drv_unsupported(what);
        }
    }
    return launch(f, (dim3){config->gridDimX, config->gridDimY, config->gridDimZ},
                  (dim3){config->blockDimX, config->blockDimY, config->blockDimZ}, config->sharedMemBytes,
                  config->hStream, params, extra, ptsz, flags);
}

#undef cuLaunchKernelEx
NVP_EXPORT CUresult CUDAAPI cuLaunchKernelEx(const CUlaunchConfig *config, CUfunction f, void **kernelParams,
                                             void **extra)
{
    return launch_ex(config, f, kernelParams, extra, 0);
}

NVP_EXPORT CUresult CUDAAPI cuLaunchKernelEx_ptsz(const CUlaunchConfig *config, CUfunction f, void **kernelParams,
                                                  void **extra)
{
    return launch_ex(config, f, kernelParams, extra, 1);
}
