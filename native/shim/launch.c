/* Modules, kernels and launches: the __cuda* registration entry points that
 * nvcc's host code calls, kernel handles, parameter packing and launch-time
 * checks (done here so that asynchronous launches fail where native ones do). */
#include "shim.h"

#include <stdlib.h>
#include <string.h>

#define FATBIN_WRAPPER_MAGIC 0x466243b1u
#define FATBIN_MAGIC 0xba55ed50u
#define KERNEL_MAGIC 0x6b65726eu

#define CONFIG_DEPTH 16

struct module {
    int id;
    const void *image;
    size_t size;
    const void *const *prelinked; /* -rdc=true: each object's fatbinary, for a JIT link */
    int loaded;
    cudaError_t load_err;
    int by_driver; /* loaded by the program (cuModuleLoadData...): image is the shim's copy */
    int unloaded;  /* cuModuleUnload: its kernels fail */
};

struct kernel {
    uint32_t magic;
    uint32_t id;
    struct module *mod;
    const void *hostfun;
    char *name;
    int ready;
    cudaError_t err;
    struct nvp_kernel_info info;
    struct nvp_param *params;
};

struct var {
    struct module *mod;
    char *name;
    size_t size;
    int resolved;
    uint64_t addr;
};

/* a __managed__ variable: the application's copy is nvproxy managed memory (proxy/managed_vars.py) */
struct mvar {
    struct module *mod;
    void **hostp; /* where the program's code finds the variable */
    char *name;
    size_t size;
    uint64_t addr; /* 0 until the module is loaded */
    struct mvar *next;
};

/* pointer -> object maps (host stub / kernel handle -> kernel, host var -> var) */
struct pmap {
    uintptr_t *keys;
    void **vals;
    size_t cap, n;
};

/* lock: the maps and lists, held briefly, never across a call to the proxy.
 * load: one module load / kernel or variable lookup at a time, across calls to
 * the proxy.  A call may replace a dead proxy (NVPROXY_RECOVER), which resets the
 * registry's flags under lock only: holding lock there self-deadlocked. */
static struct {
    pthread_mutex_t lock, load;
    struct module **mods;
    size_t nmods, capmods;
    uint32_t nkernels;
    struct pmap kernels, vars;
    struct mvar *mvars;
} R = {.lock = PTHREAD_MUTEX_INITIALIZER, .load = PTHREAD_MUTEX_INITIALIZER};

static size_t hash_ptr(uintptr_t k, size_t cap) { return (size_t)((k >> 3) * 0x9e3779b97f4a7c15ull) & (cap - 1); }

static void *pmap_get(struct pmap *m, const void *key)
{
    if (!m->cap)
        return NULL;
    for (size_t i = hash_ptr((uintptr_t)key, m->cap);; i = (i + 1) & (m->cap - 1)) {
        if (m->keys[i] == (uintptr_t)key)
            return m->vals[i];
        if (!m->keys[i])
            return NULL;
    }
}

static int pmap_put(struct pmap *m, const void *key, void *val)
{
    if (2 * (m->n + 1) > m->cap) {
        size_t cap = m->cap ? m->cap * 2 : 256;
        struct pmap g = {calloc(cap, sizeof(uintptr_t)), calloc(cap, sizeof(void *)), cap, 0};
        if (!g.keys || !g.vals) {
            free(g.keys);
            free(g.vals);
            return -1;
        }
        for (size_t i = 0; i < m->cap; i++)
            if (m->keys[i])
                pmap_put(&g, (void *)m->keys[i], m->vals[i]);
        free(m->keys);
        free(m->vals);
        *m = g;
    }
    size_t i = hash_ptr((uintptr_t)key, m->cap);
    while (m->keys[i] && m->keys[i] != (uintptr_t)key)
        i = (i + 1) & (m->cap - 1);
    if (!m->keys[i])
        m->n++;
    m->keys[i] = (uintptr_t)key;
    m->vals[i] = val;
    return 0;
}

/* ---- registration (runs from static constructors, before main) ---- */

static size_t fatbin_size(const unsigned char *f)
{
    uint32_t magic;
    uint16_t hsize;
    uint64_t fsize;
    memcpy(&magic, f, 4);
    memcpy(&hsize, f + 6, 2);
    memcpy(&fsize, f + 8, 8);
    return magic == FATBIN_MAGIC ? hsize + fsize : 0;
}

/* A device-linked (-rdc=true) module holds code for the architectures it was
 * linked for only; the runtime JIT-links the objects' fatbinaries (PTX and
 * relocatable code, the device runtime's among them) for other GPUs.  The proxy
 * gets them all in one bundle (the layout fatbin.py reads):
 * "NVPLINK1", u32 count, u64 size[count], then the fatbinaries, main one first. */
static void *linked_bundle(const struct module *m, size_t *size)
{
    size_t n = 1, total = 12 + 8;
    while (m->prelinked[n - 1] && n < 4096)
        n++;
    const unsigned char **part = malloc(n * sizeof *part);
    uint64_t *sz = malloc(n * sizeof *sz);
    if (!part || !sz)
        goto fail;
    for (size_t i = 0; i < n; i++) {
        part[i] = i ? m->prelinked[i - 1] : m->image;
        sz[i] = i ? fatbin_size(part[i]) : m->size;
        total += (i ? 8 : 0) + sz[i];
    }
    unsigned char *b = malloc(total), *p = b;
    if (!b)
        goto fail;
    uint32_t count = (uint32_t)n;
    memcpy(p, "NVPLINK1", 8);
    memcpy(p + 8, &count, 4);
    memcpy(p + 12, sz, n * 8);
    p += 12 + n * 8;
    for (size_t i = 0; i < n; i++) {
        memcpy(p, part[i], sz[i]);
        p += sz[i];
    }
    free(part);
    free(sz);
    *size = total;
    return b;
fail:
    free(part);
    free(sz);
    return NULL;
}

/* gives m its id (its index in the registry); -1 if out of memory */
static int module_add(struct module *m)
{
    int ok = 0;
    pthread_mutex_lock(&R.lock);
    if (R.nmods == R.capmods) {
        size_t cap = R.capmods ? R.capmods * 2 : 16;
        struct module **v = realloc(R.mods, cap * sizeof *v);
        if (v) {
            R.mods = v;
            R.capmods = cap;
        }
    }
    if (R.nmods < R.capmods) {
        m->id = (int)R.nmods;
        R.mods[R.nmods++] = m;
        ok = 1;
    }
    pthread_mutex_unlock(&R.lock);
    return ok ? 0 : -1;
}

NVP_EXPORT void **__cudaRegisterFatBinary(void *fatCubin)
{
    struct module *m = calloc(1, sizeof *m);
    if (!m)
        return NULL;
    const struct {
        uint32_t magic, version;
        const unsigned char *data;
        const void *const *prelinked; /* version 2 (nvcc -dlink): NULL-terminated */
    } *w = fatCubin;
    if (w && w->magic == FATBIN_WRAPPER_MAGIC && w->data) {
        m->size = fatbin_size(w->data);
        m->image = m->size ? w->data : NULL;
        if (w->version == 2)
            m->prelinked = w->prelinked;
    }
    module_add(m);
    return (void **)m;
}

NVP_EXPORT void __cudaRegisterFatBinaryEnd(void **handle) { (void)handle; }

NVP_EXPORT void __cudaUnregisterFatBinary(void **handle)
{
    /* At exit: the proxy unloads everything when the application goes. */
    (void)handle;
}

NVP_EXPORT void __cudaRegisterFunction(void **handle, const char *hostFun, char *deviceFun, const char *deviceName,
                                       int thread_limit, uint3 *tid, uint3 *bid, dim3 *bDim, dim3 *gDim, int *wSize)
{
    (void)deviceFun;
    (void)thread_limit;
    (void)tid;
    (void)bid;
    (void)bDim;
    (void)gDim;
    (void)wSize;
    struct kernel *k = calloc(1, sizeof *k);
    if (!k)
        return;
    k->magic = KERNEL_MAGIC;
    k->mod = (struct module *)handle;
    k->hostfun = hostFun;
    k->name = strdup(deviceName);
    pthread_mutex_lock(&R.lock);
    k->id = ++R.nkernels;
    pmap_put(&R.kernels, hostFun, k);
    pmap_put(&R.kernels, k, k);
    pthread_mutex_unlock(&R.lock);
}

NVP_EXPORT void __cudaRegisterVar(void **handle, char *hostVar, char *deviceAddress, const char *deviceName, int ext,
                                  size_t size, int constant, int global)
{
    (void)deviceAddress;
    (void)ext;
    (void)constant;
    (void)global;
    struct var *v = calloc(1, sizeof *v);
    if (!v)
        return;
    v->mod = (struct module *)handle;
    v->name = strdup(deviceName);
    v->size = size;
    pthread_mutex_lock(&R.lock);
    pmap_put(&R.vars, hostVar, v);
    pthread_mutex_unlock(&R.lock);
}

NVP_EXPORT void __cudaRegisterManagedVar(void **handle, void **hostVarPtrAddress, char *deviceAddress,
                                         const char *deviceName, int ext, size_t size, int constant, int global)
{
    (void)deviceAddress;
    (void)ext;
    (void)constant;
    (void)global;
    struct mvar *v = calloc(1, sizeof *v);
    if (!v || !(v->name = strdup(deviceName))) {
        free(v);
        nvp_log("nvproxy: out of memory registering __managed__ variable %s", deviceName);
        return;
    }
    v->mod = (struct module *)handle;
    v->hostp = hostVarPtrAddress;
    v->size = size;
    pthread_mutex_lock(&R.lock);
    v->next = R.mvars;
    R.mvars = v;
    pthread_mutex_unlock(&R.lock);
}

NVP_EXPORT void __cudaRegisterHostVar(void **handle, const char *deviceName, void *hostVar, size_t size)
{
    (void)handle;
    (void)hostVar;
    (void)size;
    nvp_log("nvproxy: __cudaRegisterHostVar (%s) is not supported by nvproxy", deviceName);
}

NVP_EXPORT void __cudaRegisterUnifiedTable(void *table) { (void)table; }

static cudaError_t module_load(struct module *m);

/* Before the program's code first touches a __managed__ variable of the module (nvcc calls this then). */
NVP_EXPORT char __cudaInitModule(void **handle)
{
    if (nvp_connect())
        return 0;
    pthread_mutex_lock(&R.load);
    cudaError_t e = module_load((struct module *)handle);
    pthread_mutex_unlock(&R.load);
    return e == cudaSuccess;
}

NVP_EXPORT cudaError_t __cudaGetProcAddress(void)
{
    return nvp_unsupported("__cudaGetProcAddress");
}

/* ---- lazy loading: a module goes to the proxy when first needed ---- */

/* The module's __managed__ variables: their memory, made once; the proxy binds them (again, after a restore). */
static cudaError_t managed_vars_bind(struct module *m)
{
    cudaError_t e = cudaSuccess;
    for (struct mvar *v = R.mvars; v && !e; v = v->next) { /* (the list only grows, at the front) */
        if (v->mod != m)
            continue;
        if (!v->addr) {
            void *p;
            if ((e = nvp_host_alloc(&p, v->size, cudaHostAllocPortable | cudaHostAllocMapped, NVP_HOST_MANAGED)))
                break;
            v->addr = (uint64_t)(uintptr_t)p;
        }
        uint64_t a[NVP_MAX_ARGS] = {(uint64_t)m->id, v->addr, v->size};
        struct nvp_reply r = {0};
        if (!(e = nvp_call(NVP_OP_MANAGED_VAR, a, v->name, strlen(v->name) + 1, &r, -1)))
            *v->hostp = (void *)(uintptr_t)v->addr; /* (with the module's initial value in it now) */
    }
    return e;
}

static cudaError_t module_load(struct module *m)
{
    if (__atomic_load_n(&m->loaded, __ATOMIC_ACQUIRE))
        return m->load_err;
    if (!m->image)
        return cudaErrorInvalidKernelImage;
    uint64_t a[NVP_MAX_ARGS] = {(uint64_t)m->id};
    struct nvp_reply r = {0};
    const void *image = m->image;
    size_t size = m->size;
    void *bundle = m->prelinked ? linked_bundle(m, &size) : NULL;
    if (m->prelinked && !bundle)
        return cudaErrorMemoryAllocation;
    cudaError_t e = nvp_call(NVP_OP_MODULE_LOAD, a, bundle ? bundle : image, size, &r, -1);
    free(bundle);
    if (!e && R.mvars)
        e = managed_vars_bind(m);
    if (e == cudaErrorDevicesUnavailable)
        return e; /* transport, not the module: leave it to retry */
    m->load_err = e;
    __atomic_store_n(&m->loaded, 1, __ATOMIC_RELEASE);
    return e;
}

static cudaError_t kernel_info(struct kernel *k)
{
    struct {
        struct nvp_kernel_info info;
        struct nvp_param params[MAX_PARAM_BYTES / 4];
    } *buf = calloc(1, sizeof *buf);
    if (!buf)
        return cudaErrorMemoryAllocation;
    uint64_t a[NVP_MAX_ARGS] = {(uint64_t)k->mod->id, k->id};
    struct nvp_reply r = {.out = buf, .out_cap = sizeof *buf};
    cudaError_t e = nvp_call(NVP_OP_KERNEL_INFO, a, k->name, strlen(k->name) + 1, &r, -1);
    if (!e) {
        k->info = buf->info;
        size_t np = buf->info.nparams;
        free(k->params);
        k->params = malloc((np ? np : 1) * sizeof *k->params);
        if (k->params && np <= MAX_PARAM_BYTES / 4)
            memcpy(k->params, buf->params, np * sizeof *k->params);
        else
            e = cudaErrorMemoryAllocation;
    }
    free(buf);
    return e;
}

static cudaError_t kernel_ready(struct kernel *k)
{
    if (__atomic_load_n(&k->ready, __ATOMIC_ACQUIRE))
        return k->err;
    cudaError_t e = nvp_connect();
    if (e)
        return e;
    pthread_mutex_lock(&R.load);
    for (int tries = 0; tries < 2 && !__atomic_load_n(&k->ready, __ATOMIC_ACQUIRE); tries++) {
        e = module_load(k->mod);
        if (!e)
            e = kernel_info(k);
        if (e == cudaErrorDevicesUnavailable)
            break; /* transport: not the kernel's fault, try again on the next launch */
        if (e && !__atomic_load_n(&k->mod->loaded, __ATOMIC_ACQUIRE))
            continue; /* a new proxy came meanwhile (the registry was reset): once more there */
        k->err = e;
        __atomic_store_n(&k->ready, 1, __ATOMIC_RELEASE);
    }
    if (__atomic_load_n(&k->ready, __ATOMIC_ACQUIRE))
        e = k->err;
    pthread_mutex_unlock(&R.load);
    return e;
}

void nvp_registry_reset(void)
{
    pthread_mutex_lock(&R.lock);
    for (size_t i = 0; i < R.nmods; i++)
        __atomic_store_n(&R.mods[i]->loaded, 0, __ATOMIC_RELEASE);
    for (size_t i = 0; i < R.kernels.cap; i++) {
        struct kernel *k = R.kernels.keys[i] ? R.kernels.vals[i] : NULL;
        if (k)
            __atomic_store_n(&k->ready, 0, __ATOMIC_RELEASE);
    }
    for (size_t i = 0; i < R.vars.cap; i++) {
        struct var *v = R.vars.keys[i] ? R.vars.vals[i] : NULL;
        if (v)
            __atomic_store_n(&v->resolved, 0, __ATOMIC_RELEASE);
    }
    pthread_mutex_unlock(&R.lock);
}

static struct kernel *kernel_of(const void *func)
{
    pthread_mutex_lock(&R.lock);
    struct kernel *k = pmap_get(&R.kernels, func);
    if (k && k->mod->unloaded) /* (cuModuleUnload) */
        k = NULL;
    pthread_mutex_unlock(&R.lock);
    return k;
}

cudaError_t nvp_var_resolve(const void *symbol, uint64_t *addr, size_t *size)
{
    cudaError_t e = nvp_connect();
    if (e)
        return e;
    if ((e = nvp_sticky_error()))
        return e;
    pthread_mutex_lock(&R.lock);
    struct var *v = pmap_get(&R.vars, symbol);
    for (struct mvar *m = R.mvars; m && !v; m = m->next)
        if (m->addr && m->addr == (uint64_t)(uintptr_t)symbol) { /* (the program's copy: copies to and from it */
            *addr = m->addr;                                     /* reach the kernels at their next launch) */
            *size = m->size;
            pthread_mutex_unlock(&R.lock);
            return cudaSuccess;
        }
    pthread_mutex_unlock(&R.lock);
    if (!v)
        return cudaErrorInvalidSymbol;
    pthread_mutex_lock(&R.load);
    if (!__atomic_load_n(&v->resolved, __ATOMIC_ACQUIRE)) {
        e = module_load(v->mod);
        if (!e) {
            uint64_t a[NVP_MAX_ARGS] = {(uint64_t)v->mod->id};
            struct nvp_reply r = {0};
            e = nvp_call(NVP_OP_VAR_INFO, a, v->name, strlen(v->name) + 1, &r, -1);
            if (!e) {
                v->addr = r.h.r[0];
                __atomic_store_n(&v->resolved, 1, __ATOMIC_RELEASE);
                nvp_symbol_add(v->addr, v->size);
            }
        }
    }
    *addr = v->addr;
    *size = v->size;
    pthread_mutex_unlock(&R.load);
    return e;
}

/* ---- call configuration (<<<...>>>) ---- */

struct config {
    dim3 grid, block;
    size_t shmem;
    void *stream;
};
static __thread struct config cfg_stack[CONFIG_DEPTH];
static __thread int cfg_depth;

NVP_EXPORT unsigned __cudaPushCallConfiguration(dim3 gridDim, dim3 blockDim, size_t sharedMem, struct CUstream_st *stream)
{
    if (cfg_depth >= CONFIG_DEPTH)
        return 1;
    cfg_stack[cfg_depth++] = (struct config){gridDim, blockDim, sharedMem, stream};
    return 0;
}

NVP_EXPORT cudaError_t __cudaPopCallConfiguration(dim3 *gridDim, dim3 *blockDim, size_t *sharedMem, void *stream)
{
    if (cfg_depth <= 0)
        return cudaErrorMissingConfiguration;
    struct config c = cfg_stack[--cfg_depth];
    *gridDim = c.grid;
    *blockDim = c.block;
    *sharedMem = c.shmem;
    *(void **)stream = c.stream;
    return cudaSuccess;
}

NVP_EXPORT cudaError_t __cudaGetKernel(cudaKernel_t *kernel, const void *hostFun)
{
    struct kernel *k = kernel_of(hostFun);
    if (!kernel || !k)
        return nvp_ret(cudaErrorInvalidDeviceFunction);
    *kernel = (cudaKernel_t)k;
    return cudaSuccess;
}

NVP_EXPORT cudaError_t cudaGetKernel(cudaKernel_t *kernel, const void *entryFuncAddr)
{
    return __cudaGetKernel(kernel, entryFuncAddr);
}

/* ---- launches ---- */

/* CUDA 13 reports impossible geometry as cudaErrorInvalidValue (as the native
 * runtime answers), no longer cudaErrorInvalidConfiguration. */
static cudaError_t check_config(const struct kernel *k, dim3 g, dim3 b, size_t shmem)
{
    const struct nvp_device_info *d = nvp_device_info(nvp_current_device());
    if (!d)
        return cudaErrorDevicesUnavailable;
    const int32_t *A = d->attr;
    if (!g.x || !g.y || !g.z || !b.x || !b.y || !b.z)
        return cudaErrorInvalidValue;
    if (b.x > (unsigned)A[cudaDevAttrMaxBlockDimX] || b.y > (unsigned)A[cudaDevAttrMaxBlockDimY] ||
        b.z > (unsigned)A[cudaDevAttrMaxBlockDimZ] || g.x > (unsigned)A[cudaDevAttrMaxGridDimX] ||
        g.y > (unsigned)A[cudaDevAttrMaxGridDimY] || g.z > (unsigned)A[cudaDevAttrMaxGridDimZ])
        return cudaErrorInvalidValue;
    uint64_t threads = (uint64_t)b.x * b.y * b.z;
    if (threads > (uint64_t)A[cudaDevAttrMaxThreadsPerBlock])
        return cudaErrorInvalidValue;
    if (k->info.max_threads > 0 && threads > (uint64_t)k->info.max_threads)
        return cudaErrorLaunchOutOfResources;
    if (shmem > (size_t)k->info.max_dyn_shared)
        return cudaErrorInvalidValue;
    return cudaSuccess;
}

static __thread unsigned char param_buf[MAX_PARAM_BYTES + 4];

/* A launch's kernel id and parameter block, checked as a launch checks them
 * (graph kernel nodes are launches made later).  After nvp_enter. */
cudaError_t nvp_pack_kernel(const void *func, dim3 grid, dim3 block, size_t shmem, void **args, uint32_t *kid,
                            unsigned char *buf, size_t cap, size_t *size)
{
    cudaError_t e;
    struct kernel *k = func ? kernel_of(func) : NULL;
    if (!k)
        return cudaErrorInvalidDeviceFunction;
    if ((e = kernel_ready(k)) || (e = check_config(k, grid, block, shmem)))
        return e;
    size_t total = k->info.param_size;
    if (total > cap || (k->info.nparams && !args))
        return cudaErrorInvalidValue;
    memset(buf, 0, total);
    for (uint32_t i = 0; i < k->info.nparams; i++) {
        const struct nvp_param *p = &k->params[i];
        if ((size_t)p->offset + p->size > total)
            return cudaErrorInvalidValue;
        memcpy(buf + p->offset, args[i], p->size);
    }
    *kid = k->id;
    *size = total;
    return cudaSuccess;
}

cudaError_t nvp_launch(const void *func, dim3 grid, dim3 block, void **args, size_t shmem, cudaStream_t stream,
                       int per_thread, unsigned flags)
{
    cudaError_t e = nvp_enter();
    if (e)
        return e;
    uint32_t kid;
    size_t total;
    if ((e = nvp_pack_kernel(func, grid, block, shmem, args, &kid, param_buf, MAX_PARAM_BYTES, &total)))
        return e;
    int64_t w = nvp_stream_wire(stream, per_thread);
    if (w < 0)
        return cudaErrorInvalidResourceHandle;
    uint64_t a[NVP_MAX_ARGS] = {
        kid,
        grid.x | (uint64_t)grid.y << 32,
        grid.z | (uint64_t)block.x << 32,
        block.y | (uint64_t)block.z << 32,
        shmem,
        (uint64_t)w,
        flags,
    };
    return nvp_call(NVP_OP_LAUNCH, a, param_buf, total, NULL, -1);
}

NVP_EXPORT cudaError_t __cudaLaunchKernel(cudaKernel_t kernel, dim3 gridDim, dim3 blockDim, void **args,
                                          size_t sharedMem, cudaStream_t stream)
{
    return nvp_ret(nvp_launch(kernel, gridDim, blockDim, args, sharedMem, stream, 0, 0));
}

NVP_EXPORT cudaError_t __cudaLaunchKernel_ptsz(cudaKernel_t kernel, dim3 gridDim, dim3 blockDim, void **args,
                                               size_t sharedMem, cudaStream_t stream)
{
    return nvp_ret(nvp_launch(kernel, gridDim, blockDim, args, sharedMem, stream, 1, 0));
}

NVP_EXPORT cudaError_t cudaLaunchKernel(const void *func, dim3 gridDim, dim3 blockDim, void **args, size_t sharedMem,
                                        cudaStream_t stream)
{
    return nvp_ret(nvp_launch(func, gridDim, blockDim, args, sharedMem, stream, 0, 0));
}

NVP_EXPORT cudaError_t cudaLaunchKernel_ptsz(const void *func, dim3 gridDim, dim3 blockDim, void **args,
                                             size_t sharedMem, cudaStream_t stream)
{
    return nvp_ret(nvp_launch(func, gridDim, blockDim, args, sharedMem, stream, 1, 0));
}

NVP_EXPORT cudaError_t cudaLaunchCooperativeKernel(const void *func, dim3 gridDim, dim3 blockDim, void **args,
                                                   size_t sharedMem, cudaStream_t stream)
{
    return nvp_ret(nvp_launch(func, gridDim, blockDim, args, sharedMem, stream, 0, NVP_LAUNCH_COOPERATIVE));
}

NVP_EXPORT cudaError_t cudaLaunchCooperativeKernel_ptsz(const void *func, dim3 gridDim, dim3 blockDim, void **args,
                                                        size_t sharedMem, cudaStream_t stream)
{
    return nvp_ret(nvp_launch(func, gridDim, blockDim, args, sharedMem, stream, 1, NVP_LAUNCH_COOPERATIVE));
}

NVP_EXPORT cudaError_t cudaLaunchKernelExC(const cudaLaunchConfig_t *config, const void *func, void **args)
{
    if (!config)
        return nvp_ret(cudaErrorInvalidValue);
    unsigned flags = 0;
    for (unsigned i = 0; i < config->numAttrs; i++) {
        const cudaLaunchAttribute *at = &config->attrs[i];
        if (at->id == cudaLaunchAttributeCooperative && at->val.cooperative)
            flags |= NVP_LAUNCH_COOPERATIVE;
        else if (at->id != cudaLaunchAttributeCooperative) {
            nvp_log("nvproxy: cudaLaunchKernelExC launch attribute %d is not supported by nvproxy", (int)at->id);
            return nvp_ret(cudaErrorNotSupported);
        }
    }
    return nvp_ret(nvp_launch(func, config->gridDim, config->blockDim, args, config->dynamicSmemBytes,
                              config->stream, 0, flags));
}

/* ---- function attributes and occupancy ---- */

static cudaError_t ready_kernel(const void *func, struct kernel **out)
{
    cudaError_t e = nvp_connect();
    if (e || (e = nvp_sticky_error()))
        return e;
    struct kernel *k = func ? kernel_of(func) : NULL;
    if (!k)
        return cudaErrorInvalidResourceHandle; /* what the runtime says of a non-kernel */
    *out = k;
    return kernel_ready(k);
}

NVP_EXPORT cudaError_t cudaFuncGetAttributes(struct cudaFuncAttributes *attr, const void *func)
{
    struct kernel *k;
    if (!attr)
        return nvp_ret(cudaErrorInvalidValue);
    cudaError_t e = ready_kernel(func, &k);
    if (e)
        return nvp_ret(e);
    memset(attr, 0, sizeof *attr);
    attr->sharedSizeBytes = (size_t)k->info.shared_static;
    attr->constSizeBytes = (size_t)k->info.const_size;
    attr->localSizeBytes = (size_t)k->info.local_size;
    attr->maxThreadsPerBlock = k->info.max_threads;
    attr->numRegs = k->info.num_regs;
    attr->ptxVersion = k->info.ptx_version;
    attr->binaryVersion = k->info.binary_version;
    attr->cacheModeCA = k->info.cache_mode_ca;
    attr->maxDynamicSharedSizeBytes = k->info.max_dyn_shared;
    attr->preferredShmemCarveout = k->info.preferred_carveout;
    return cudaSuccess;
}

NVP_EXPORT cudaError_t cudaFuncSetAttribute(const void *func, enum cudaFuncAttribute attr, int value)
{
    struct kernel *k;
    cudaError_t e = ready_kernel(func, &k);
    if (e)
        return nvp_ret(e);
    uint64_t a[NVP_MAX_ARGS] = {k->id, (uint64_t)attr, (uint64_t)(int64_t)value};
    struct nvp_reply r = {0};
    e = nvp_call(NVP_OP_FUNC_SET_ATTR, a, NULL, 0, &r, -1);
    if (!e && attr == cudaFuncAttributeMaxDynamicSharedMemorySize)
        k->info.max_dyn_shared = value;
    if (!e && attr == cudaFuncAttributePreferredSharedMemoryCarveout)
        k->info.preferred_carveout = value;
    return nvp_ret(e);
}

NVP_EXPORT cudaError_t cudaFuncSetCacheConfig(const void *func, enum cudaFuncCache cacheConfig)
{
    struct kernel *k;
    cudaError_t e = ready_kernel(func, &k);
    if (e)
        return nvp_ret(e);
    uint64_t a[NVP_MAX_ARGS] = {2, (uint64_t)cacheConfig, k->id};
    struct nvp_reply r = {0};
    return nvp_ret(nvp_call(NVP_OP_CACHE_CONFIG, a, NULL, 0, &r, -1));
}

NVP_EXPORT cudaError_t cudaFuncGetName(const char **name, const void *func)
{
    struct kernel *k = func ? kernel_of(func) : NULL;
    if (!name)
        return nvp_ret(cudaErrorInvalidValue);
    if (!k)
        return nvp_ret(cudaErrorInvalidDeviceFunction);
    *name = k->name;
    return cudaSuccess;
}

static cudaError_t occupancy(int *numBlocks, const void *func, int blockSize, size_t dynSmem, unsigned flags)
{
    struct kernel *k;
    if (!numBlocks || blockSize <= 0)
        return nvp_ret(cudaErrorInvalidValue);
    cudaError_t e = ready_kernel(func, &k);
    if (e)
        return nvp_ret(e);
    uint64_t a[NVP_MAX_ARGS] = {k->id, (uint64_t)blockSize, dynSmem, flags};
    struct nvp_reply r = {0};
    e = nvp_call(NVP_OP_OCCUPANCY, a, NULL, 0, &r, -1);
    if (!e)
        *numBlocks = (int)r.h.r[0];
    return nvp_ret(e);
}

NVP_EXPORT cudaError_t cudaOccupancyMaxActiveBlocksPerMultiprocessor(int *numBlocks, const void *func, int blockSize,
                                                                     size_t dynamicSMemSize)
{
    return occupancy(numBlocks, func, blockSize, dynamicSMemSize, 0);
}

NVP_EXPORT cudaError_t cudaOccupancyMaxActiveBlocksPerMultiprocessorWithFlags(int *numBlocks, const void *func,
                                                                              int blockSize, size_t dynamicSMemSize,
                                                                              unsigned int flags)
{
    return occupancy(numBlocks, func, blockSize, dynamicSMemSize, flags);
}

NVP_EXPORT cudaError_t cudaOccupancyAvailableDynamicSMemPerBlock(size_t *dynamicSmemSize, const void *func,
                                                                 int numBlocks, int blockSize)
{
    struct kernel *k;
    if (!dynamicSmemSize || numBlocks <= 0 || blockSize <= 0)
        return nvp_ret(cudaErrorInvalidValue);
    cudaError_t e = ready_kernel(func, &k);
    if (e)
        return nvp_ret(e);
    const struct nvp_device_info *d = nvp_device_info(nvp_current_device());
    if (!d)
        return nvp_ret(cudaErrorDevicesUnavailable);
    /* per-SM shared memory split among the blocks, less the static part,
     * capped by the per-block opt-in limit */
    int64_t per_sm = d->attr[cudaDevAttrMaxSharedMemoryPerMultiprocessor];
    int64_t per_block = per_sm / numBlocks - d->attr[cudaDevAttrReservedSharedMemoryPerBlock] - k->info.shared_static;
    int64_t cap = d->attr[cudaDevAttrMaxSharedMemoryPerBlockOptin] - k->info.shared_static;
    if (per_block > cap)
        per_block = cap;
    *dynamicSmemSize = per_block > 0 ? (size_t)per_block : 0;
    return cudaSuccess;
}

/* ---- modules the program loads itself (the driver API, driver_module.c) ----
 * They join the registry as __cudaRegisterFatBinary's do: the same ids, lazy reloading into a new proxy
 * (nvp_registry_reset), kernels launched through nvp_launch; the proxy keeps their images for checkpoints. */

static struct module *driver_module(void *h)
{
    struct module *m = NULL;
    pthread_mutex_lock(&R.lock);
    for (size_t i = 0; i < R.nmods && !m; i++)
        if (R.mods[i] == h && R.mods[i]->by_driver && !R.mods[i]->unloaded)
            m = R.mods[i];
    pthread_mutex_unlock(&R.lock);
    return m;
}

int nvp_module_known(void *h) { return driver_module(h) != NULL; }

/* the live module h names, after the common entry check */
static cudaError_t entered(void *h, struct module **out)
{
    if (!(*out = driver_module(h)))
        return cudaErrorInvalidResourceHandle;
    return nvp_enter();
}

static void module_drop(struct module *m) /* (under R.load) */
{
    uint64_t a[NVP_MAX_ARGS] = {(uint64_t)m->id};
    struct nvp_reply r = {0};
    nvp_call(NVP_OP_DRV_MODULE_UNLOAD, a, NULL, 0, &r, -1);
    pthread_mutex_lock(&R.lock);
    m->unloaded = 1;
    pthread_mutex_unlock(&R.lock);
    free((void *)m->image);
    m->image = NULL;
}

cudaError_t nvp_module_load(const void *image, size_t size, void **out)
{
    cudaError_t e = nvp_enter();
    if (e)
        return e;
    struct module *m = calloc(1, sizeof *m);
    void *copy = malloc(size ? size : 1);
    if (!m || !copy || module_add(m) != 0) {
        free(m);
        free(copy);
        return cudaErrorMemoryAllocation;
    }
    memcpy(copy, image, size);
    m->image = copy;
    m->size = size;
    m->by_driver = 1;
    pthread_mutex_lock(&R.load);
    e = module_load(m);
    if (e) /* (the proxy keeps no image it could not load: a checkpoint would fail on it) */
        module_drop(m);
    pthread_mutex_unlock(&R.load);
    if (!e)
        *out = m;
    return e;
}

cudaError_t nvp_module_unload(void *h)
{
    struct module *m;
    cudaError_t e = entered(h, &m);
    if (e)
        return e;
    pthread_mutex_lock(&R.load);
    module_drop(m);
    pthread_mutex_unlock(&R.load);
    return cudaSuccess;
}

cudaError_t nvp_module_function(void *h, const char *name, void **out)
{
    struct module *m;
    cudaError_t e = entered(h, &m);
    if (e)
        return e;
    struct kernel *k = NULL;
    pthread_mutex_lock(&R.lock);
    for (size_t i = 0; i < R.kernels.cap && !k; i++) {
        struct kernel *c = R.kernels.keys[i] ? R.kernels.vals[i] : NULL;
        if (c && c->mod == m && !strcmp(c->name, name))
            k = c;
    }
    pthread_mutex_unlock(&R.lock);
    if (k) {
        *out = k;
        return cudaSuccess;
    }
    if (!(k = calloc(1, sizeof *k)) || !(k->name = strdup(name))) {
        free(k);
        return cudaErrorMemoryAllocation;
    }
    k->magic = KERNEL_MAGIC;
    k->mod = m;
    pthread_mutex_lock(&R.lock);
    k->id = ++R.nkernels;
    pthread_mutex_unlock(&R.lock);
    if ((e = kernel_ready(k))) {
        free(k->params);
        free(k->name);
        free(k);
        return e;
    }
    pthread_mutex_lock(&R.lock);
    pmap_put(&R.kernels, k, k);
    pthread_mutex_unlock(&R.lock);
    *out = k;
    return cudaSuccess;
}

cudaError_t nvp_module_global(void *h, const char *name, uint64_t *addr, size_t *size)
{
    struct module *m;
    cudaError_t e = entered(h, &m);
    if (e)
        return e;
    pthread_mutex_lock(&R.load);
    if (!(e = module_load(m))) {
        uint64_t a[NVP_MAX_ARGS] = {(uint64_t)m->id};
        struct nvp_reply r = {0};
        if (!(e = nvp_call(NVP_OP_VAR_INFO, a, name, strlen(name) + 1, &r, -1))) {
            *addr = r.h.r[0];
            *size = r.h.r[1];
            nvp_symbol_add(*addr, *size);
        }
    }
    pthread_mutex_unlock(&R.load);
    return e;
}

void *nvp_kernel_module(const void *func)
{
    struct kernel *k = func ? kernel_of(func) : NULL;
    return k ? k->mod : NULL;
}

cudaError_t nvp_kernel_param(const void *func, size_t i, size_t *offset, size_t *size)
{
    struct kernel *k;
    cudaError_t e = ready_kernel(func, &k);
    if (e)
        return e;
    if (i >= k->info.nparams)
        return cudaErrorInvalidValue;
    *offset = k->params[i].offset;
    *size = k->params[i].size;
    return cudaSuccess;
}

cudaError_t nvp_launch_buffer(const void *func, dim3 grid, dim3 block, const void *buf, size_t size, size_t shmem,
                              cudaStream_t stream, int per_thread, unsigned flags)
{
    struct kernel *k;
    cudaError_t e = ready_kernel(func, &k);
    if (e)
        return e == cudaErrorInvalidResourceHandle ? cudaErrorInvalidDeviceFunction : e;
    if (size < k->info.param_size || (k->info.param_size && !buf))
        return cudaErrorInvalidValue;
    void *few[64], **args = k->info.nparams <= 64 ? few : malloc(k->info.nparams * sizeof *args);
    if (!args)
        return cudaErrorMemoryAllocation;
    for (uint32_t i = 0; i < k->info.nparams; i++)
        args[i] = (char *)buf + k->params[i].offset;
    e = nvp_launch(func, grid, block, args, shmem, stream, per_thread, flags);
    if (args != few)
        free(args);
    return e;
}
