/* The driver API's frame: initialisation, devices, contexts, results, error names and entry points
 * (cuGetProcAddress, cudaGetDriverEntryPoint), and cuGetExportTable's refusal.
 *
 * Contexts.  The proxy runs everything in each device's primary context; a CUcontext is a handle of the shim
 * standing for the device's: the primary one (cuDevicePrimaryCtxRetain), or one the program created (cuCtxCreate:
 * its own handle, made current, but the same proxy context underneath).  A thread's current context follows the
 * runtime as natively: cuCtxSetCurrent makes its device the runtime's current device, and a thread that made
 * runtime calls (or switched devices with cudaSetDevice) has that device's primary context current. */
#include "driver.h"
#include "driver_tables.h"

#include <dlfcn.h>
#include <stdatomic.h>
#include <stdlib.h>

#define CTX_MAGIC 0x6e767063u
#define CTX_STACK 64

struct CUctx_st {
    uint32_t magic;
    int dev;
    int primary;
    _Atomic int live;
    unsigned flags;
    unsigned long long id;
};

static struct {
    pthread_mutex_t lock;
    struct CUctx_st primary[NVP_MAX_DEVICES];
    int refs[NVP_MAX_DEVICES];  /* cuDevicePrimaryCtxRetain less Release */
    unsigned flags[NVP_MAX_DEVICES]; /* cuDevicePrimaryCtxSetFlags */
    struct CUctx_st **created; /* every context cuCtxCreate made (kept: a stale handle still reads as one) */
    size_t ncreated, capcreated;
    unsigned long long next_id;
    _Atomic int initialized;
} C = {.lock = PTHREAD_MUTEX_INITIALIZER, .next_id = NVP_MAX_DEVICES};

static __thread struct CUctx_st *cur;              /* the thread's current context (NULL: none chosen) */
static __thread struct CUctx_st *stack[CTX_STACK]; /* cuCtxPushCurrent's */
static __thread int depth;
static __thread uint64_t drv_seq; /* the thread's last request when its last driver call returned */
static __thread int bound;        /* the runtime was used on this thread since it last chose no context */

CUresult nvp_drv_unsupported(const char *call)
{
    nvp_log("nvproxy: %s is not supported by nvproxy; returning CUDA_ERROR_NOT_SUPPORTED", call);
    return CUDA_ERROR_NOT_SUPPORTED;
}

CUcontext nvp_drv_primary(int dev)
{
    if (dev < 0 || dev >= NVP_MAX_DEVICES)
        return NULL;
    struct CUctx_st *c = &C.primary[dev];
    if (c->magic != CTX_MAGIC) {
        pthread_mutex_lock(&C.lock);
        c->dev = dev;
        c->primary = 1;
        c->id = (unsigned long long)dev + 1;
        atomic_store(&c->live, 1);
        __atomic_store_n(&c->magic, CTX_MAGIC, __ATOMIC_RELEASE);
        pthread_mutex_unlock(&C.lock);
    }
    return c;
}

int nvp_drv_ctx_ok(CUcontext c)
{
    if (!c)
        return 0;
    if (c >= C.primary && c < C.primary + NVP_MAX_DEVICES)
        return c->magic == CTX_MAGIC;
    int found = 0;
    pthread_mutex_lock(&C.lock); /* (a handle is looked up, never read, until known) */
    for (size_t i = 0; i < C.ncreated && !found; i++)
        found = C.created[i] == c;
    pthread_mutex_unlock(&C.lock);
    return found && atomic_load(&c->live);
}

CUresult nvp_drv_ctx_device(CUcontext c, int *dev)
{
    if (!nvp_drv_ctx_ok(c))
        return CUDA_ERROR_INVALID_CONTEXT;
    *dev = c->dev;
    return CUDA_SUCCESS;
}

/* At a driver call's entry: did the thread make runtime calls since its last driver call returned?  (The
 * runtime makes its device's primary context current on the thread, natively.) */
static void note_runtime(void)
{
    uint64_t last = nvp_last_request();
    if (last && last != drv_seq)
        bound = 1;
}

/* the thread's current context, or NULL */
static struct CUctx_st *current(void)
{
    int dev = nvp_current_device();
    if (cur && !atomic_load(&cur->live))
        return NULL; /* (destroyed by another thread) */
    if (cur && cur->dev == dev)
        return cur;
    if (cur || bound) /* the runtime switched devices, or was used here: its context */
        cur = nvp_drv_primary(dev);
    return cur;
}

static int initialized(void)
{
    if (atomic_load(&C.initialized))
        return 1;
    if (!nvp_control_path()) /* (the runtime initialises the driver: once it was used, so was the driver) */
        return 0;
    atomic_store(&C.initialized, 1);
    return 1;
}

CUresult nvp_drv_enter(int need_ctx)
{
    note_runtime();
    if (!initialized())
        return CUDA_ERROR_NOT_INITIALIZED;
    if (need_ctx && !current())
        return CUDA_ERROR_INVALID_CONTEXT;
    return CUDA_SUCCESS;
}

CUresult nvp_drv_done(CUresult r)
{
    drv_seq = nvp_last_request();
    return r;
}

CUresult nvp_drv_code(cudaError_t e)
{
    switch ((int)e) {
    case cudaErrorInvalidDeviceFunction:
        return CUDA_ERROR_INVALID_HANDLE;
    case cudaErrorInvalidSymbol:
        return CUDA_ERROR_NOT_FOUND;
    case cudaErrorPriorLaunchFailure:
        return CUDA_ERROR_LAUNCH_FAILED;
    case cudaErrorInsufficientDriver:
        return CUDA_ERROR_SYSTEM_DRIVER_MISMATCH;
    default:
        break;
    }
    if ((int)e > 0 && (int)e <= cudaErrorMissingConfiguration) { /* the runtime's own argument checks */
        int lo = 0, hi = nvp_drv_nerrors - 1;
        while (lo <= hi) {
            int mid = (lo + hi) / 2;
            if (nvp_drv_errors[mid].code == (int)e)
                return (CUresult)e;
            if (nvp_drv_errors[mid].code < (int)e)
                lo = mid + 1;
            else
                hi = mid - 1;
        }
        return CUDA_ERROR_INVALID_VALUE;
    }
    return (CUresult)e; /* (the codes the runtime and the driver share are the same numbers) */
}

CUresult nvp_drv_rt_result(cudaError_t saved, cudaError_t e)
{
    if (e != cudaSuccess && cudaPeekAtLastError() == e) {
        cudaGetLastError();
        if (saved != cudaSuccess)
            nvp_ret(saved);
    }
    return nvp_drv_done(nvp_drv_code(e));
}

/* ---- initialisation and devices ---- */

#undef cuInit
NVP_EXPORT CUresult CUDAAPI cuInit(unsigned int Flags)
{
    note_runtime();
    if (Flags)
        return CUDA_ERROR_INVALID_VALUE;
    cudaError_t e = nvp_connect();
    if (e)
        return nvp_drv_done(nvp_drv_code(e));
    if (!nvp_device_count())
        return nvp_drv_done(CUDA_ERROR_NO_DEVICE);
    atomic_store(&C.initialized, 1);
    return nvp_drv_done(CUDA_SUCCESS);
}

#undef cuDriverGetVersion
NVP_EXPORT CUresult CUDAAPI cuDriverGetVersion(int *driverVersion)
{
    note_runtime();
    if (!driverVersion)
        return CUDA_ERROR_INVALID_VALUE;
    int v = nvp_driver_version();
    *driverVersion = v ? v : CUDA_VERSION;
    return nvp_drv_done(CUDA_SUCCESS);
}

static CUresult valid_device(CUdevice dev)
{
    CUresult r = nvp_drv_enter(0);
    if (r)
        return r;
    return dev < 0 || dev >= nvp_device_count() ? CUDA_ERROR_INVALID_DEVICE : CUDA_SUCCESS;
}

static const struct nvp_device_info *device_info(CUdevice dev, CUresult *r)
{
    const struct nvp_device_info *d = NULL;
    if (!(*r = valid_device(dev)) && !(d = nvp_device_info(dev)))
        *r = CUDA_ERROR_DEVICE_UNAVAILABLE;
    return d;
}

#undef cuDeviceGet
NVP_EXPORT CUresult CUDAAPI cuDeviceGet(CUdevice *device, int ordinal)
{
    CUresult r = nvp_drv_enter(0);
    if (r)
        return r;
    if (!device)
        return CUDA_ERROR_INVALID_VALUE;
    if (ordinal < 0 || ordinal >= nvp_device_count())
        return nvp_drv_done(CUDA_ERROR_INVALID_DEVICE);
    *device = ordinal;
    return nvp_drv_done(CUDA_SUCCESS);
}

#undef cuDeviceGetCount
NVP_EXPORT CUresult CUDAAPI cuDeviceGetCount(int *count)
{
    CUresult r = nvp_drv_enter(0);
    if (r)
        return r;
    if (!count)
        return CUDA_ERROR_INVALID_VALUE;
    *count = nvp_device_count();
    return nvp_drv_done(CUDA_SUCCESS);
}

#undef cuDeviceGetName
NVP_EXPORT CUresult CUDAAPI cuDeviceGetName(char *name, int len, CUdevice dev)
{
    CUresult r;
    const struct nvp_device_info *d = device_info(dev, &r);
    if (r)
        return nvp_drv_done(r);
    if (!name || len <= 0)
        return nvp_drv_done(CUDA_ERROR_INVALID_VALUE);
    size_t n = strnlen(d->name, sizeof d->name);
    if (n >= (size_t)len)
        n = (size_t)len - 1;
    memcpy(name, d->name, n);
    name[n] = 0;
    return nvp_drv_done(CUDA_SUCCESS);
}

#undef cuDeviceTotalMem
NVP_EXPORT CUresult CUDAAPI cuDeviceTotalMem_v2(size_t *bytes, CUdevice dev)
{
    CUresult r;
    const struct nvp_device_info *d = device_info(dev, &r);
    if (!r && !bytes)
        r = CUDA_ERROR_INVALID_VALUE;
    if (!r)
        *bytes = d->total_mem;
    return nvp_drv_done(r);
}

static CUresult uuid(CUuuid *u, CUdevice dev)
{
    CUresult r;
    const struct nvp_device_info *d = device_info(dev, &r);
    if (!r && !u)
        r = CUDA_ERROR_INVALID_VALUE;
    if (!r)
        memcpy(u->bytes, d->uuid, sizeof u->bytes);
    return nvp_drv_done(r);
}

#undef cuDeviceGetUuid
NVP_EXPORT CUresult CUDAAPI cuDeviceGetUuid(CUuuid *u, CUdevice dev) { return uuid(u, dev); }
#undef cuDeviceGetUuid_v2
NVP_EXPORT CUresult CUDAAPI cuDeviceGetUuid_v2(CUuuid *u, CUdevice dev) { return uuid(u, dev); }

#undef cuDeviceComputeCapability
NVP_EXPORT CUresult CUDAAPI cuDeviceComputeCapability(int *major, int *minor, CUdevice dev)
{
    CUresult r;
    const struct nvp_device_info *d = device_info(dev, &r);
    if (!r && (!major || !minor))
        r = CUDA_ERROR_INVALID_VALUE;
    if (!r) {
        *major = d->attr[CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR];
        *minor = d->attr[CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR];
    }
    return nvp_drv_done(r);
}

#undef cuDeviceGetProperties
NVP_EXPORT CUresult CUDAAPI cuDeviceGetProperties(CUdevprop *p, CUdevice dev)
{
    CUresult r;
    const struct nvp_device_info *d = device_info(dev, &r);
    if (!r && !p)
        r = CUDA_ERROR_INVALID_VALUE;
    if (r)
        return nvp_drv_done(r);
    const int32_t *A = d->attr;
    p->maxThreadsPerBlock = A[CU_DEVICE_ATTRIBUTE_MAX_THREADS_PER_BLOCK];
    p->maxThreadsDim[0] = A[CU_DEVICE_ATTRIBUTE_MAX_BLOCK_DIM_X];
    p->maxThreadsDim[1] = A[CU_DEVICE_ATTRIBUTE_MAX_BLOCK_DIM_Y];
    p->maxThreadsDim[2] = A[CU_DEVICE_ATTRIBUTE_MAX_BLOCK_DIM_Z];
    p->maxGridSize[0] = A[CU_DEVICE_ATTRIBUTE_MAX_GRID_DIM_X];
    p->maxGridSize[1] = A[CU_DEVICE_ATTRIBUTE_MAX_GRID_DIM_Y];
    p->maxGridSize[2] = A[CU_DEVICE_ATTRIBUTE_MAX_GRID_DIM_Z];
    p->sharedMemPerBlock = A[CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK];
    p->totalConstantMemory = A[CU_DEVICE_ATTRIBUTE_TOTAL_CONSTANT_MEMORY];
    p->SIMDWidth = A[CU_DEVICE_ATTRIBUTE_WARP_SIZE];
    p->memPitch = A[CU_DEVICE_ATTRIBUTE_MAX_PITCH];
    p->regsPerBlock = A[CU_DEVICE_ATTRIBUTE_MAX_REGISTERS_PER_BLOCK];
    p->clockRate = A[CU_DEVICE_ATTRIBUTE_CLOCK_RATE];
    p->textureAlign = A[CU_DEVICE_ATTRIBUTE_TEXTURE_ALIGNMENT];
    return nvp_drv_done(CUDA_SUCCESS);
}

/* ---- contexts ---- */

/* make c (NULL: none) the thread's current context; its device the runtime's */
static CUresult make_current(struct CUctx_st *c)
{
    cur = c;
    bound = 0; /* (no context chosen: the runtime's next call binds one again) */
    if (c && c->dev != nvp_current_device()) {
        cudaError_t saved = cudaPeekAtLastError();
        CUresult r = nvp_drv_rt_result(saved, cudaSetDevice(c->dev));
        if (r)
            return r;
    }
    return nvp_drv_done(CUDA_SUCCESS);
}

static CUresult primary_retain(CUcontext *pctx, CUdevice dev)
{
    CUresult r = valid_device(dev);
    if (!r && !pctx)
        r = CUDA_ERROR_INVALID_VALUE;
    if (r)
        return nvp_drv_done(r);
    pthread_mutex_lock(&C.lock);
    C.refs[dev]++;
    pthread_mutex_unlock(&C.lock);
    *pctx = nvp_drv_primary(dev);
    return nvp_drv_done(CUDA_SUCCESS);
}

#undef cuDevicePrimaryCtxRetain
NVP_EXPORT CUresult CUDAAPI cuDevicePrimaryCtxRetain(CUcontext *pctx, CUdevice dev)
{
    return primary_retain(pctx, dev);
}

static CUresult primary_release(CUdevice dev)
{
    CUresult r = valid_device(dev);
    if (r)
        return nvp_drv_done(r);
    pthread_mutex_lock(&C.lock);
    if (C.refs[dev] > 0)
        C.refs[dev]--;
    else
        r = CUDA_ERROR_INVALID_CONTEXT;
    pthread_mutex_unlock(&C.lock);
    return nvp_drv_done(r);
}

#undef cuDevicePrimaryCtxRelease
NVP_EXPORT CUresult CUDAAPI cuDevicePrimaryCtxRelease(CUdevice dev) { return primary_release(dev); }
#undef cuDevicePrimaryCtxRelease_v2
NVP_EXPORT CUresult CUDAAPI cuDevicePrimaryCtxRelease_v2(CUdevice dev) { return primary_release(dev); }

/* run fn on dev as the runtime's current device, then go back */
static CUresult on_device(CUdevice dev, cudaError_t (*fn)(unsigned), unsigned arg)
{
    CUresult r = valid_device(dev);
    if (r)
        return nvp_drv_done(r);
    int was = nvp_current_device();
    cudaError_t saved = cudaPeekAtLastError();
    cudaError_t e = cudaSetDevice(dev);
    if (!e)
        e = fn(arg);
    if (was != dev)
        cudaSetDevice(was);
    return nvp_drv_rt_result(saved, e);
}

static cudaError_t reset(unsigned arg)
{
    (void)arg;
    return cudaDeviceReset();
}

#undef cuDevicePrimaryCtxReset
NVP_EXPORT CUresult CUDAAPI cuDevicePrimaryCtxReset(CUdevice dev) { return on_device(dev, reset, 0); }
#undef cuDevicePrimaryCtxReset_v2
NVP_EXPORT CUresult CUDAAPI cuDevicePrimaryCtxReset_v2(CUdevice dev) { return on_device(dev, reset, 0); }

static CUresult primary_flags(CUdevice dev, unsigned flags)
{
    CUresult r = on_device(dev, cudaSetDeviceFlags, flags);
    if (!r)
        C.flags[dev] = flags;
    return r;
}

#undef cuDevicePrimaryCtxSetFlags
NVP_EXPORT CUresult CUDAAPI cuDevicePrimaryCtxSetFlags(CUdevice dev, unsigned int flags)
{
    return primary_flags(dev, flags);
}
#undef cuDevicePrimaryCtxSetFlags_v2
NVP_EXPORT CUresult CUDAAPI cuDevicePrimaryCtxSetFlags_v2(CUdevice dev, unsigned int flags)
{
    return primary_flags(dev, flags);
}

#undef cuDevicePrimaryCtxGetState
NVP_EXPORT CUresult CUDAAPI cuDevicePrimaryCtxGetState(CUdevice dev, unsigned int *flags, int *active)
{
    CUresult r = valid_device(dev);
    if (!r && (!flags || !active))
        r = CUDA_ERROR_INVALID_VALUE;
    if (r)
        return nvp_drv_done(r);
    *flags = C.flags[dev];
    /* (active as far as this process's threads show: retained, or current where the runtime is used) */
    *active = C.refs[dev] > 0 || (current() && current()->dev == dev);
    return nvp_drv_done(CUDA_SUCCESS);
}

static CUresult create(CUcontext *pctx, unsigned flags, CUdevice dev)
{
    CUresult r = valid_device(dev);
    if (!r && !pctx)
        r = CUDA_ERROR_INVALID_VALUE;
    if (r)
        return nvp_drv_done(r);
    struct CUctx_st *c = calloc(1, sizeof *c);
    if (!c)
        return nvp_drv_done(CUDA_ERROR_OUT_OF_MEMORY);
    c->dev = dev;
    c->flags = flags;
    c->magic = CTX_MAGIC;
    atomic_store(&c->live, 1);
    pthread_mutex_lock(&C.lock);
    if (C.ncreated == C.capcreated) {
        size_t cap = C.capcreated ? 2 * C.capcreated : 16;
        struct CUctx_st **v = realloc(C.created, cap * sizeof *v);
        if (v) {
            C.created = v;
            C.capcreated = cap;
        }
    }
    int added = C.ncreated < C.capcreated;
    if (added) {
        C.created[C.ncreated++] = c;
        c->id = ++C.next_id;
    }
    pthread_mutex_unlock(&C.lock);
    if (!added) {
        free(c);
        return nvp_drv_done(CUDA_ERROR_OUT_OF_MEMORY);
    }
    if (depth < CTX_STACK) /* (pushed, as cuCtxCreate does) */
        stack[depth++] = cur;
    *pctx = c;
    return make_current(c);
}

#undef cuCtxCreate_v2
NVP_EXPORT CUresult CUDAAPI cuCtxCreate_v2(CUcontext *pctx, unsigned int flags, CUdevice dev)
{
    return create(pctx, flags, dev);
}

#undef cuCtxCreate_v3
NVP_EXPORT CUresult CUDAAPI cuCtxCreate_v3(CUcontext *pctx, CUexecAffinityParam *paramsArray, int numParams,
                                           unsigned int flags, CUdevice dev)
{
    if (numParams > 0 || paramsArray)
        return nvp_drv_unsupported("cuCtxCreate_v3 with execution affinity");
    return create(pctx, flags, dev);
}

#undef cuCtxCreate_v4
NVP_EXPORT CUresult CUDAAPI cuCtxCreate_v4(CUcontext *pctx, CUctxCreateParams *params, unsigned int flags,
                                           CUdevice dev)
{
    if (params && (params->numExecAffinityParams || params->execAffinityParams || params->cigParams))
        return nvp_drv_unsupported("cuCtxCreate with execution affinity or CIG parameters");
    return create(pctx, flags, dev);
}

static CUresult destroy(CUcontext c)
{
    CUresult r = nvp_drv_enter(0);
    if (r)
        return r;
    if (!nvp_drv_ctx_ok(c) || c->primary)
        return CUDA_ERROR_INVALID_CONTEXT;
    atomic_store(&c->live, 0);
    if (cur == c) { /* (natively the context is popped where it is current) */
        cur = depth ? stack[--depth] : NULL;
        if (cur)
            return make_current(cur);
    }
    return nvp_drv_done(CUDA_SUCCESS);
}

#undef cuCtxDestroy
NVP_EXPORT CUresult CUDAAPI cuCtxDestroy(CUcontext c) { return destroy(c); }
#undef cuCtxDestroy_v2
NVP_EXPORT CUresult CUDAAPI cuCtxDestroy_v2(CUcontext c) { return destroy(c); }

#undef cuCtxGetCurrent
NVP_EXPORT CUresult CUDAAPI cuCtxGetCurrent(CUcontext *pctx)
{
    CUresult r = nvp_drv_enter(0);
    if (r)
        return r;
    if (!pctx)
        return CUDA_ERROR_INVALID_VALUE;
    *pctx = current();
    return CUDA_SUCCESS;
}

#undef cuCtxSetCurrent
NVP_EXPORT CUresult CUDAAPI cuCtxSetCurrent(CUcontext c)
{
    CUresult r = nvp_drv_enter(0);
    if (r)
        return r;
    if (c && !nvp_drv_ctx_ok(c))
        return CUDA_ERROR_INVALID_CONTEXT;
    return make_current(c);
}

static CUresult push(CUcontext c)
{
    CUresult r = nvp_drv_enter(0);
    if (r)
        return r;
    if (!nvp_drv_ctx_ok(c))
        return CUDA_ERROR_INVALID_CONTEXT;
    if (depth >= CTX_STACK)
        return nvp_drv_unsupported("cuCtxPushCurrent beyond 64 contexts");
    stack[depth++] = current();
    return make_current(c);
}

#undef cuCtxPushCurrent
NVP_EXPORT CUresult CUDAAPI cuCtxPushCurrent(CUcontext c) { return push(c); }
#undef cuCtxPushCurrent_v2
NVP_EXPORT CUresult CUDAAPI cuCtxPushCurrent_v2(CUcontext c) { return push(c); }

static CUresult pop(CUcontext *pctx)
{
    CUresult r = nvp_drv_enter(0);
    if (r)
        return r;
    struct CUctx_st *c = current();
    if (!c)
        return CUDA_ERROR_INVALID_CONTEXT;
    if (pctx)
        *pctx = c;
    return make_current(depth ? stack[--depth] : NULL);
}

#undef cuCtxPopCurrent
NVP_EXPORT CUresult CUDAAPI cuCtxPopCurrent(CUcontext *pctx) { return pop(pctx); }
#undef cuCtxPopCurrent_v2
NVP_EXPORT CUresult CUDAAPI cuCtxPopCurrent_v2(CUcontext *pctx) { return pop(pctx); }

/* the context c names (NULL: the current one) */
static CUresult context_of(CUcontext c, struct CUctx_st **out)
{
    CUresult r = nvp_drv_enter(0);
    if (r)
        return r;
    *out = c ? c : current();
    return nvp_drv_ctx_ok(*out) ? CUDA_SUCCESS : CUDA_ERROR_INVALID_CONTEXT;
}

#undef cuCtxGetDevice
NVP_EXPORT CUresult CUDAAPI cuCtxGetDevice(CUdevice *device)
{
    struct CUctx_st *c;
    CUresult r = context_of(NULL, &c);
    if (!r && !device)
        r = CUDA_ERROR_INVALID_VALUE;
    if (!r)
        *device = c->dev;
    return r;
}

#undef cuCtxGetDevice_v2
NVP_EXPORT CUresult CUDAAPI cuCtxGetDevice_v2(CUdevice *device, CUcontext ctx)
{
    struct CUctx_st *c;
    CUresult r = context_of(ctx, &c);
    if (!r && !device)
        r = CUDA_ERROR_INVALID_VALUE;
    if (!r)
        *device = c->dev;
    return r;
}

static cudaError_t synchronize(unsigned arg)
{
    (void)arg;
    return cudaDeviceSynchronize();
}

#undef cuCtxSynchronize_v2
NVP_EXPORT CUresult CUDAAPI cuCtxSynchronize_v2(CUcontext ctx)
{
    struct CUctx_st *c;
    CUresult r = context_of(ctx, &c);
    if (r)
        return r;
    return on_device(c->dev, synchronize, 0);
}

#undef cuCtxGetFlags
NVP_EXPORT CUresult CUDAAPI cuCtxGetFlags(unsigned int *flags)
{
    struct CUctx_st *c;
    CUresult r = context_of(NULL, &c);
    if (!r && !flags)
        r = CUDA_ERROR_INVALID_VALUE;
    if (!r)
        *flags = (c->primary ? C.flags[c->dev] : c->flags) | CU_CTX_MAP_HOST; /* (always mapped since CUDA 12) */
    return r;
}

#undef cuCtxSetFlags
NVP_EXPORT CUresult CUDAAPI cuCtxSetFlags(unsigned int flags)
{
    struct CUctx_st *c;
    CUresult r = context_of(NULL, &c);
    if (r)
        return r;
    if (c->primary)
        return primary_flags(c->dev, flags);
    c->flags = flags;
    return CUDA_SUCCESS;
}

#undef cuCtxGetId
NVP_EXPORT CUresult CUDAAPI cuCtxGetId(CUcontext ctx, unsigned long long *ctxId)
{
    struct CUctx_st *c;
    CUresult r = context_of(ctx, &c);
    if (!r && !ctxId)
        r = CUDA_ERROR_INVALID_VALUE;
    if (!r)
        *ctxId = c->id;
    return r;
}

/* ---- error names and strings (the driver's own, recorded from libcuda) ---- */

static const struct nvp_drv_error *error_of(CUresult e)
{
    int lo = 0, hi = nvp_drv_nerrors - 1;
    while (lo <= hi) {
        int mid = (lo + hi) / 2;
        if (nvp_drv_errors[mid].code == (int)e)
            return &nvp_drv_errors[mid];
        if (nvp_drv_errors[mid].code < (int)e)
            lo = mid + 1;
        else
            hi = mid - 1;
    }
    return NULL;
}

#undef cuGetErrorName
NVP_EXPORT CUresult CUDAAPI cuGetErrorName(CUresult error, const char **pStr)
{
    const struct nvp_drv_error *t = error_of(error);
    if (!pStr)
        return CUDA_ERROR_INVALID_VALUE;
    *pStr = t ? t->name : NULL;
    return t ? CUDA_SUCCESS : CUDA_ERROR_INVALID_VALUE;
}

#undef cuGetErrorString
NVP_EXPORT CUresult CUDAAPI cuGetErrorString(CUresult error, const char **pStr)
{
    const struct nvp_drv_error *t = error_of(error);
    if (!pStr)
        return CUDA_ERROR_INVALID_VALUE;
    *pStr = t ? t->text : NULL;
    return t ? CUDA_SUCCESS : CUDA_ERROR_INVALID_VALUE;
}

/* ---- entry points: the shim's own functions, never a real driver's ---- */

static int proc_cmp(const char *symbol, const struct nvp_drv_proc *p) { return strcmp(symbol, p->base); }

static CUresult proc_address(const char *symbol, void **pfn, int version, cuuint64_t flags,
                             CUdriverProcAddressQueryResult *status)
{
    if (!symbol || !pfn || (flags & ~(cuuint64_t)(CU_GET_PROC_ADDRESS_LEGACY_STREAM |
                                                  CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM)))
        return CUDA_ERROR_INVALID_VALUE;
    *pfn = NULL;
    note_runtime();
    int driver = nvp_driver_version();
    if (version > (driver ? driver : CUDA_VERSION))
        return nvp_drv_done(CUDA_ERROR_INVALID_VALUE);
    int want = flags & CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM ? NVP_PROC_PER_THREAD : NVP_PROC_LEGACY;
    int lo = 0, hi = nvp_drv_nprocs - 1, first = -1;
    while (lo <= hi) { /* the base's first row */
        int mid = (lo + hi) / 2, c = proc_cmp(symbol, &nvp_drv_procs[mid]);
        if (c <= 0) {
            if (!c)
                first = mid;
            hi = mid - 1;
        } else {
            lo = mid + 1;
        }
    }
    const struct nvp_drv_proc *best = NULL;
    for (int i = first; i >= 0 && i < nvp_drv_nprocs && !proc_cmp(symbol, &nvp_drv_procs[i]); i++) {
        const struct nvp_drv_proc *p = &nvp_drv_procs[i];
        if ((p->kind == NVP_PROC_ANY || p->kind == want) && p->version <= version)
            best = p;
    }
    if (best)
        *pfn = (void *)best->fn;
    if (status)
        *status = first < 0 ? CU_GET_PROC_ADDRESS_SYMBOL_NOT_FOUND
                  : *pfn    ? CU_GET_PROC_ADDRESS_SUCCESS
                            : CU_GET_PROC_ADDRESS_VERSION_NOT_SUFFICIENT;
    return nvp_drv_done(CUDA_SUCCESS);
}

#undef cuGetProcAddress_v2
NVP_EXPORT CUresult CUDAAPI cuGetProcAddress_v2(const char *symbol, void **pfn, int cudaVersion, cuuint64_t flags,
                                                CUdriverProcAddressQueryResult *symbolStatus)
{
    return proc_address(symbol, pfn, cudaVersion, flags, symbolStatus);
}

#undef cuGetProcAddress
NVP_EXPORT CUresult CUDAAPI cuGetProcAddress(const char *symbol, void **pfn, int cudaVersion, cuuint64_t flags)
{
    return proc_address(symbol, pfn, cudaVersion, flags, NULL);
}

static cudaError_t entry_point(const char *symbol, void **funcPtr, int version, unsigned long long flags,
                               enum cudaDriverEntryPointQueryResult *status)
{
    CUdriverProcAddressQueryResult st;
    CUresult r = proc_address(symbol, funcPtr, version, flags, &st);
    if (r)
        return nvp_ret(r == CUDA_ERROR_INVALID_VALUE ? cudaErrorInvalidValue : (cudaError_t)r);
    if (status)
        *status = (enum cudaDriverEntryPointQueryResult)st;
    return cudaSuccess;
}

NVP_EXPORT cudaError_t cudaGetDriverEntryPointByVersion(const char *symbol, void **funcPtr, unsigned int cudaVersion,
                                                        unsigned long long flags,
                                                        enum cudaDriverEntryPointQueryResult *driverStatus)
{
    return entry_point(symbol, funcPtr, (int)cudaVersion, flags, driverStatus);
}

NVP_EXPORT cudaError_t cudaGetDriverEntryPoint(const char *symbol, void **funcPtr, unsigned long long flags,
                                               enum cudaDriverEntryPointQueryResult *driverStatus)
{
    return entry_point(symbol, funcPtr, CUDART_VERSION, flags, driverStatus);
}

/* built with per-thread default streams: the default search is the per-thread one */
static unsigned long long ptsz_flags(unsigned long long flags)
{
    return flags == cudaEnableDefault ? cudaEnablePerThreadDefaultStream : flags;
}

NVP_EXPORT cudaError_t cudaGetDriverEntryPointByVersion_ptsz(const char *symbol, void **funcPtr,
                                                             unsigned int cudaVersion, unsigned long long flags,
                                                             enum cudaDriverEntryPointQueryResult *driverStatus)
{
    return entry_point(symbol, funcPtr, (int)cudaVersion, ptsz_flags(flags), driverStatus);
}

NVP_EXPORT cudaError_t cudaGetDriverEntryPoint_ptsz(const char *symbol, void **funcPtr, unsigned long long flags,
                                                    enum cudaDriverEntryPointQueryResult *driverStatus)
{
    return entry_point(symbol, funcPtr, CUDART_VERSION, ptsz_flags(flags), driverStatus);
}

/* The driver's private tables are how a CUDA runtime of its own (linked statically into the program, or carried
 * inside a library) talks to libcuda.  nvproxy cannot stand in for them, and such a runtime would otherwise run
 * the program's GPU work beside nvproxy, where no checkpoint saves it. */
#undef cuGetExportTable
NVP_EXPORT CUresult CUDAAPI cuGetExportTable(const void **ppExportTable, const CUuuid *pExportTableId)
{
    static _Atomic int said;
    (void)pExportTableId;
    if (ppExportTable)
        *ppExportTable = NULL;
    /* the object that carries the runtime: the user's first question is which library it is */
    Dl_info at;
    const char *who = dladdr(__builtin_return_address(0), &at) && at.dli_fname && *at.dli_fname ? at.dli_fname
                                                                                        : "this program";
    const char *base = strrchr(who, '/');
    /* NVML (PyTorch loads it) asks too, and goes on without the table: it does no GPU work through CUDA */
    if (!strncmp(base ? base + 1 : who, "libnvidia-ml.so", 15))
        return CUDA_ERROR_NOT_SUPPORTED;
    if (!atomic_exchange(&said, 1)) { /* (such a runtime asks for several tables) */
        nvp_log("nvproxy: cuGetExportTable called from %s: it carries its own CUDA runtime (linked statically), "
                "which nvproxy cannot intercept and no checkpoint could save; rebuild it with "
                "`nvcc -cudart shared` (CMake: CMAKE_CUDA_RUNTIME_LIBRARY=Shared); "
                "returning CUDA_ERROR_NOT_SUPPORTED", who);
    }
    return CUDA_ERROR_NOT_SUPPORTED;
}
