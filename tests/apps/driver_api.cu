// The driver API as programs reach it without linking libcuda: dlopen("libcuda.so.1") and cuGetProcAddress,
// or dlopen("libcudart.so.13") and cudaGetDriverEntryPointByVersion.  It loads a module it is given (a fatbinary,
// a cubin or PTX, built from driver_kernels.cu), launches its kernels both ways (kernelParams and a parameter
// buffer), copies, sets memory 8, 16 and 32 bits at a time, times with events, and runs `steps` more rounds
// (pausing `pause_ms` between them) whose output a checkpoint or migration must not change.
//
//   driver_api IMAGE LIBRARY(libcuda.so.1|libcudart.so.13) LOAD(data|file|ex|library) CONTEXT(primary|created)
//              [steps] [pause_ms]
// (library: cuLibraryLoadData, and scale_add through cuLibraryGetKernel and cuKernelGetFunction)
//
// Stdout is the same natively and through nvproxy; stderr tells where the driver's functions came from and
// whether the process opened a GPU device itself.
#include <cuda.h>
#include <dirent.h>
#include <dlfcn.h>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <unistd.h>
#include <vector>

#define FN(name) static decltype(&name) p_##name
FN(cuInit);
FN(cuDriverGetVersion);
FN(cuDeviceGetCount);
FN(cuDeviceGet);
FN(cuDeviceGetName);
FN(cuDeviceGetAttribute);
FN(cuDeviceTotalMem);
FN(cuDevicePrimaryCtxRetain);
FN(cuDevicePrimaryCtxRelease);
FN(cuCtxCreate);
FN(cuCtxDestroy);
FN(cuCtxSetCurrent);
FN(cuCtxGetCurrent);
FN(cuCtxGetDevice);
FN(cuCtxSynchronize);
FN(cuModuleLoadData);
FN(cuModuleLoadDataEx);
FN(cuModuleLoad);
FN(cuModuleUnload);
FN(cuLibraryLoadData);
FN(cuLibraryGetModule);
FN(cuLibraryGetKernel);
FN(cuLibraryUnload);
FN(cuKernelGetFunction);
FN(cuMemcpy2D);
FN(cuOccupancyMaxPotentialBlockSize);
FN(cuModuleGetFunction);
FN(cuModuleGetGlobal);
FN(cuFuncGetAttribute);
FN(cuFuncGetParamInfo);
FN(cuMemAlloc);
FN(cuMemFree);
FN(cuMemAllocHost);
FN(cuMemFreeHost);
FN(cuMemGetInfo);
FN(cuMemGetAddressRange);
FN(cuMemcpyHtoD);
FN(cuMemcpyDtoH);
FN(cuMemcpyDtoD);
FN(cuMemcpyHtoDAsync);
FN(cuMemcpyDtoHAsync);
FN(cuMemsetD8);
FN(cuMemsetD16);
FN(cuMemsetD32);
FN(cuMemsetD2D32);
FN(cuMemsetD32Async);
FN(cuStreamCreate);
FN(cuStreamDestroy);
FN(cuStreamSynchronize);
FN(cuStreamQuery);
FN(cuEventCreate);
FN(cuEventDestroy);
FN(cuEventRecord);
FN(cuEventSynchronize);
FN(cuEventQuery);
FN(cuEventElapsedTime);
FN(cuLaunchKernel);
FN(cuStreamBeginCapture);
FN(cuStreamEndCapture);
FN(cuGraphInstantiateWithFlags);
FN(cuGraphLaunch);
FN(cuGraphExecDestroy);
FN(cuGraphDestroy);
FN(cuPointerGetAttribute);
FN(cuGetErrorName);
FN(cuGetProcAddress);

#include "driver_check.h"

typedef cudaError_t (*entry_fn)(const char *, void **, unsigned, unsigned long long, int *);

// Every driver function by its base name, as CUDA_VERSION's headers mean it.
static void resolve(const char *library) {
    void *h = dlopen(library, RTLD_NOW);
    if (!h) {
        printf("FAILED dlopen(%s): %s\n", library, dlerror());
        exit(1);
    }
    entry_fn entry = nullptr;
    if (strstr(library, "cudart")) {
        entry = (entry_fn)dlsym(h, "cudaGetDriverEntryPointByVersion");
    } else {
        p_cuGetProcAddress = (decltype(p_cuGetProcAddress))dlsym(h, "cuGetProcAddress_v2");
    }
    auto get = [&](const char *name, int version) -> void * {
        void *fn = nullptr;
        int status = -1;
        int rc = entry ? (int)entry(name, &fn, version, 0, &status)
                       : (int)p_cuGetProcAddress(name, &fn, version, 0, (CUdriverProcAddressQueryResult *)&status);
        if (rc || status || !fn) {
            printf("FAILED resolving %s: %d, status %d\n", name, rc, status);
            exit(1);
        }
        return fn;
    };
#define GET(name) p_##name = (decltype(p_##name))get(#name, CUDA_VERSION)
    // (CUDA 13.0 gives the _v2 forms, which take a context, for these two: the forms cuda.h declares are 12.x's)
    p_cuCtxSynchronize = (decltype(p_cuCtxSynchronize))get("cuCtxSynchronize", 12000);
    p_cuCtxGetDevice = (decltype(p_cuCtxGetDevice))get("cuCtxGetDevice", 12000);
    GET(cuInit); GET(cuDriverGetVersion); GET(cuDeviceGetCount); GET(cuDeviceGet); GET(cuDeviceGetName);
    GET(cuDeviceGetAttribute); GET(cuDeviceTotalMem); GET(cuDevicePrimaryCtxRetain); GET(cuDevicePrimaryCtxRelease);
    GET(cuCtxCreate); GET(cuCtxDestroy); GET(cuCtxSetCurrent); GET(cuCtxGetCurrent);
    GET(cuModuleLoadData); GET(cuModuleLoadDataEx); GET(cuModuleLoad); GET(cuModuleUnload);
    GET(cuLibraryLoadData); GET(cuLibraryGetModule); GET(cuLibraryGetKernel); GET(cuLibraryUnload);
    GET(cuKernelGetFunction); GET(cuMemcpy2D); GET(cuOccupancyMaxPotentialBlockSize);
    GET(cuModuleGetFunction); GET(cuModuleGetGlobal); GET(cuFuncGetAttribute); GET(cuFuncGetParamInfo);
    GET(cuMemAlloc); GET(cuMemFree); GET(cuMemAllocHost); GET(cuMemFreeHost); GET(cuMemGetInfo);
    GET(cuMemGetAddressRange); GET(cuMemcpyHtoD); GET(cuMemcpyDtoH); GET(cuMemcpyDtoD); GET(cuMemcpyHtoDAsync);
    GET(cuMemcpyDtoHAsync); GET(cuMemsetD8); GET(cuMemsetD16); GET(cuMemsetD32); GET(cuMemsetD2D32);
    GET(cuMemsetD32Async); GET(cuStreamCreate); GET(cuStreamDestroy); GET(cuStreamSynchronize); GET(cuStreamQuery);
    GET(cuEventCreate); GET(cuEventDestroy); GET(cuEventRecord); GET(cuEventSynchronize); GET(cuEventQuery);
    GET(cuEventElapsedTime); GET(cuLaunchKernel); GET(cuStreamBeginCapture); GET(cuStreamEndCapture);
    GET(cuGraphInstantiateWithFlags); GET(cuGraphLaunch); GET(cuGraphExecDestroy); GET(cuGraphDestroy);
    GET(cuPointerGetAttribute); GET(cuGetErrorName);
    GET(cuGetProcAddress);
    Dl_info info;
    if (dladdr((void *)p_cuInit, &info) && info.dli_fname) {
        const char *base = strrchr(info.dli_fname, '/');
        fprintf(stderr, "driver functions from: %s\n", base ? base + 1 : info.dli_fname);
    }
    // by their exported names too: the same functions as cuGetProcAddress gives
    void *direct = dlsym(h, "cuMemAlloc_v2");
    if (!entry)
        printf("dlsym(cuMemAlloc_v2) %s cuGetProcAddress(cuMemAlloc)\n", direct == (void *)p_cuMemAlloc ? "==" : "!=");
}

static std::vector<char> read_file(const char *path) {
    FILE *f = fopen(path, "rb");
    if (!f) {
        printf("FAILED cannot open %s\n", path);
        exit(1);
    }
    std::vector<char> data;
    char buf[65536];
    size_t n;
    while ((n = fread(buf, 1, sizeof buf, f)) > 0) data.insert(data.end(), buf, buf + n);
    fclose(f);
    data.push_back(0);  // (PTX: NUL-terminated text)
    return data;
}

// Does this process hold a GPU device file open?
static int opened_gpu() {
    DIR *d = opendir("/proc/self/fd");
    int found = 0;
    for (struct dirent *e; d && (e = readdir(d));) {
        char link[300], target[256];
        snprintf(link, sizeof link, "/proc/self/fd/%s", e->d_name);
        ssize_t n = readlink(link, target, sizeof target - 1);
        if (n > 0) {
            target[n] = 0;
            found |= !strncmp(target, "/dev/nvidia", 11);
        }
    }
    if (d) closedir(d);
    return found;
}

static int mapped_libcuda() {
    FILE *f = fopen("/proc/self/maps", "r");
    char line[512];
    int found = 0;
    while (f && fgets(line, sizeof line, f)) found |= strstr(line, "/libcuda.so") != nullptr;
    if (f) fclose(f);
    return found;
}

struct Big {
    float v[8];
    int n;
};

int main(int argc, char **argv) {
    if (argc < 5) {
        fprintf(stderr, "usage: %s IMAGE LIBRARY data|file|ex primary|created [steps] [pause_ms]\n", argv[0]);
        return 2;
    }
    const char *image = argv[1], *library = argv[2], *how = argv[3], *context = argv[4];
    int steps = argc > 5 ? atoi(argv[5]) : 0, pause_ms = argc > 6 ? atoi(argv[6]) : 0;
    resolve(library);

    CK(p_cuInit(0));
    int count = 0, version = 0;
    CK(p_cuDriverGetVersion(&version));
    CK(p_cuDeviceGetCount(&count));
    CUdevice dev;
    CK(p_cuDeviceGet(&dev, 0));
    char name[256];
    CK(p_cuDeviceGetName(name, sizeof name, dev));
    int major = 0, sms = 0;
    size_t total = 0;
    CK(p_cuDeviceGetAttribute(&major, CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR, dev));
    CK(p_cuDeviceGetAttribute(&sms, CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT, dev));
    CK(p_cuDeviceTotalMem(&total, dev));
    printf("device 0: %s, cc %d.x, %d SMs, %zu MiB; driver %s\n", name, major, sms, total >> 20,
           version >= 12000 ? ">= 12.0" : "older");
    printf("out of range device: %s\n", cu_error_name(p_cuDeviceGet(&dev, count)));
    CK(p_cuDeviceGet(&dev, 0));

    CUcontext ctx = nullptr, now = nullptr;
    CUdevice ctx_dev = -1;
    if (!strcmp(context, "created")) {
        CK(p_cuCtxCreate(&ctx, nullptr, 0, dev));
    } else {
        CK(p_cuDevicePrimaryCtxRetain(&ctx, dev));
        CK(p_cuCtxSetCurrent(ctx));
    }
    CK(p_cuCtxGetCurrent(&now));
    CK(p_cuCtxGetDevice(&ctx_dev));
    printf("context current: %s, on device %d\n", now == ctx ? "yes" : "no", ctx_dev);

    std::vector<char> data = read_file(image);
    CUmodule mod;
    CUlibrary lib = nullptr;
    if (!strcmp(how, "library")) {
        CK(p_cuLibraryLoadData(&lib, data.data(), nullptr, nullptr, 0, nullptr, nullptr, 0));
        CK(p_cuLibraryGetModule(&mod, lib));
    } else if (!strcmp(how, "file")) {
        CK(p_cuModuleLoad(&mod, image));
    } else if (!strcmp(how, "ex")) {
        char log[256] = "";
        CUjit_option opts[] = {CU_JIT_INFO_LOG_BUFFER, CU_JIT_INFO_LOG_BUFFER_SIZE_BYTES};
        void *vals[] = {log, (void *)(size_t)sizeof log};
        CK(p_cuModuleLoadDataEx(&mod, data.data(), 2, opts, vals));
    } else {
        CK(p_cuModuleLoadData(&mod, data.data()));
    }
    char junk[64] = "this is no module";
    CUmodule bad_mod;
    CUresult bad = p_cuModuleLoadData(&bad_mod, junk);
    printf("loading junk: %s\n", bad == CUDA_SUCCESS ? "CUDA_SUCCESS" : "an error");
    CUfunction scale_add, bump, sum_struct, missing;
    if (lib) {
        CUkernel kernel;
        CK(p_cuLibraryGetKernel(&kernel, lib, "scale_add"));
        CK(p_cuKernelGetFunction(&scale_add, kernel));
    } else {
        CK(p_cuModuleGetFunction(&scale_add, mod, "scale_add"));
    }
    CK(p_cuModuleGetFunction(&bump, mod, "bump"));
    CK(p_cuModuleGetFunction(&sum_struct, mod, "sum_struct"));
    CUfunction again;
    CK(p_cuModuleGetFunction(&again, mod, "bump"));
    printf("missing function: %s; the same function twice: %s\n",
           cu_error_name(p_cuModuleGetFunction(&missing, mod, "no_such_kernel")), again == bump ? "same" : "different");
    CUdeviceptr counter;
    size_t counter_bytes = 0;
    CK(p_cuModuleGetGlobal(&counter, &counter_bytes, mod, "counter"));
    CUdeviceptr missing_ptr = 1;
    size_t missing_bytes = 1;
    CUresult miss = p_cuModuleGetGlobal(&missing_ptr, &missing_bytes, mod, "no_such_variable");
    printf("global counter: %zu bytes; missing global: %s, leaving %zu bytes\n", counter_bytes, cu_error_name(miss),
           missing_bytes);
    size_t off = 0, size = 0;
    int max_threads = 0;
    CK(p_cuFuncGetParamInfo(sum_struct, 1, &off, &size));
    CK(p_cuFuncGetAttribute(&max_threads, CU_FUNC_ATTRIBUTE_MAX_THREADS_PER_BLOCK, scale_add));
    printf("sum_struct parameter 1 at %zu, %zu bytes; past the last: %s; scale_add max threads %s\n", off, size,
           cu_error_name(p_cuFuncGetParamInfo(sum_struct, 2, &off, &size)), max_threads >= 256 ? ">= 256" : "< 256");

    const int n = 1 << 16;
    size_t bytes = n * sizeof(float);
    CUdeviceptr x, y, z;
    CK(p_cuMemAlloc(&x, bytes));
    CK(p_cuMemAlloc(&y, bytes));
    CK(p_cuMemAlloc(&z, bytes));
    float *host;
    CK(p_cuMemAllocHost((void **)&host, bytes));
    std::vector<float> hx(n), hy(n), want(n);
    for (int i = 0; i < n; i++) { hx[i] = (float)(i % 101) * 0.5f; hy[i] = (float)(i % 13) - 6.0f; }
    CK(p_cuMemcpyHtoD(x, hx.data(), bytes));
    CK(p_cuMemcpyHtoD(y, hy.data(), bytes));

    CUstream s;
    CUevent e0, e1;
    CK(p_cuStreamCreate(&s, CU_STREAM_NON_BLOCKING));
    CK(p_cuEventCreate(&e0, CU_EVENT_DEFAULT));
    CK(p_cuEventCreate(&e1, CU_EVENT_DEFAULT));
    float a = 3.0f;
    int nn = n;
    void *params[] = {&y, &x, &a, &nn};
    CK(p_cuEventRecord(e0, s));
    CK(p_cuLaunchKernel(scale_add, n / 256, 1, 1, 256, 1, 1, 0, s, params, nullptr));
    CK(p_cuEventRecord(e1, s));
    CK(p_cuMemcpyDtoHAsync(host, y, bytes, s));
    CK(p_cuStreamSynchronize(s));
    CK(p_cuStreamQuery(s));
    CK(p_cuEventSynchronize(e1));
    CK(p_cuEventQuery(e1));
    float ms = -1;
    CK(p_cuEventElapsedTime(&ms, e0, e1));
    int bad_values = 0;
    for (int i = 0; i < n; i++) bad_values += host[i] != a * hx[i] + hy[i] + 0.5f;
    printf("scale_add: %d wrong of %d; elapsed time %s\n", bad_values, n, ms >= 0 ? "measured" : "missing");

    // the `extra` form: the parameters laid out in one buffer as the kernel takes them
    Big big = {{1, 2, 3, 4, 5, 6, 7, 8.5f}, 3};
    alignas(8) unsigned char buf[48] = {};
    memcpy(buf, &z, sizeof z);
    memcpy(buf + 8, &big, sizeof big);
    size_t buf_size = 8 + sizeof big;
    void *extra[] = {CU_LAUNCH_PARAM_BUFFER_POINTER, buf, CU_LAUNCH_PARAM_BUFFER_SIZE, &buf_size, CU_LAUNCH_PARAM_END};
    CK(p_cuLaunchKernel(sum_struct, 1, 1, 1, 32, 1, 1, 0, nullptr, nullptr, extra));
    float sum = 0;
    CK(p_cuMemcpyDtoH(&sum, z, sizeof sum));
    printf("sum_struct through a parameter buffer: %.2f\n", sum);
    void *both[] = {&z, &big};
    printf("kernelParams and extra at once: %s\n",
           cu_error_name(p_cuLaunchKernel(sum_struct, 1, 1, 1, 32, 1, 1, 0, nullptr, both, extra)));
    printf("no launch geometry: %s\n", cu_error_name(p_cuLaunchKernel(bump, 0, 1, 1, 1, 1, 1, 0, nullptr, params, nullptr)));

    // memsets of each width, and a 2D one
    std::vector<unsigned char> back(bytes);
    CK(p_cuMemsetD8(z, 0xab, bytes));
    CK(p_cuMemsetD16(z + 64, 0x1234, 8));
    CK(p_cuMemsetD32(z + 128, 0x3f800000u, 16));
    CK(p_cuMemsetD2D32(z + 4096, 64, 0xdeadbeefu, 4, 3));
    CK(p_cuMemcpyDtoH(back.data(), z, bytes));
    unsigned short h16;
    unsigned v32, row0, row1, gap;
    float f32;
    memcpy(&h16, &back[64 + 14], 2);
    memcpy(&f32, &back[128 + 60], 4);
    memcpy(&row0, &back[4096 + 12], 4);
    memcpy(&row1, &back[4096 + 64], 4);
    memcpy(&gap, &back[4096 + 16], 4);
    memcpy(&v32, &back[4096 + 128 + 12], 4);
    printf("memset: %02x %04x %.1f %08x %08x %08x %08x (past: %02x %02x)\n", back[0], h16, f32, row0, row1, v32, gap,
           back[64 + 16], back[128 + 64]);
    printf("misaligned cuMemsetD32: %s\n", cu_error_name(p_cuMemsetD32(z + 2, 0, 4)));

    // a 2D copy into the middle of a pitched area and back out of it
    std::vector<float> block(8 * 64), out(8 * 16, -1);
    for (size_t i = 0; i < block.size(); i++) block[i] = (float)i;
    CUDA_MEMCPY2D c2 = {};
    c2.srcMemoryType = CU_MEMORYTYPE_HOST;
    c2.srcHost = block.data();
    c2.srcPitch = 64 * sizeof(float);
    c2.dstMemoryType = CU_MEMORYTYPE_DEVICE;
    c2.dstDevice = z;
    c2.dstXInBytes = 16;
    c2.dstY = 2;
    c2.dstPitch = 256;
    c2.WidthInBytes = 16 * sizeof(float);
    c2.Height = 8;
    CK(p_cuMemcpy2D(&c2));
    CUDA_MEMCPY2D back2 = {};
    back2.srcMemoryType = CU_MEMORYTYPE_UNIFIED;
    back2.srcDevice = z + 2 * 256 + 16;
    back2.srcPitch = 256;
    back2.dstMemoryType = CU_MEMORYTYPE_HOST;
    back2.dstHost = out.data();
    back2.dstPitch = 16 * sizeof(float);
    back2.WidthInBytes = 16 * sizeof(float);
    back2.Height = 8;
    CK(p_cuMemcpy2D(&back2));
    int bad2d = 0;
    for (int r = 0; r < 8; r++)
        for (int c = 0; c < 16; c++) bad2d += out[r * 16 + c] != block[r * 64 + c];
    CUDA_MEMCPY2D narrow = c2;
    narrow.dstPitch = 32;
    printf("2D copies: %d wrong; a pitch narrower than the width: %s\n", bad2d, cu_error_name(p_cuMemcpy2D(&narrow)));
    int min_grid = 0, block_size = 0;
    CK(p_cuOccupancyMaxPotentialBlockSize(&min_grid, &block_size, scale_add, nullptr, 0, 0));
    printf("potential block size: %s\n", block_size > 0 && block_size % 32 == 0 && min_grid > 0 ? "whole warps" : "?");

    // copies between device buffers, pointer attributes, address ranges
    CK(p_cuMemcpyDtoD(z, y, bytes));
    CK(p_cuStreamSynchronize(nullptr));  // (a device-to-device copy may return before it ends; s does not wait for it)
    CK(p_cuMemsetD32Async(y, 0, n, s));
    CK(p_cuMemcpyHtoDAsync(y, host, bytes, s));
    CK(p_cuStreamSynchronize(s));
    CK(p_cuMemcpyDtoH(hy.data(), z, bytes));
    printf("device to device copy: %s\n", !memcmp(hy.data(), host, bytes) ? "equal" : "different");
    unsigned type = 0;
    CK(p_cuPointerGetAttribute(&type, CU_POINTER_ATTRIBUTE_MEMORY_TYPE, x));
    unsigned htype = 0;
    CK(p_cuPointerGetAttribute(&htype, CU_POINTER_ATTRIBUTE_MEMORY_TYPE, (CUdeviceptr)host));
    int plain = 0;
    printf("memory types: device %s, pinned host %s, malloc'ed %s\n", type == CU_MEMORYTYPE_DEVICE ? "DEVICE" : "?",
           htype == CU_MEMORYTYPE_HOST ? "HOST" : "?",
           cu_error_name(p_cuPointerGetAttribute(&type, CU_POINTER_ATTRIBUTE_MEMORY_TYPE, (CUdeviceptr)&plain)));
    CUdeviceptr base = 0;
    size_t range = 0;
    CK(p_cuMemGetAddressRange(&base, &range, x + 100));
    size_t free_mem = 0, total_mem = 0;
    CK(p_cuMemGetInfo(&free_mem, &total_mem));
    printf("address range: %s, %zu bytes; memory info %s\n", base == x ? "the allocation's" : "elsewhere", range,
           free_mem <= total_mem && total_mem == total ? "consistent" : "inconsistent");
    void *fn = nullptr;
    CUdriverProcAddressQueryResult status;
    CK(p_cuGetProcAddress("cuNoSuchFunction", &fn, CUDA_VERSION, 0, &status));
    printf("cuGetProcAddress of an unknown name: %s, status %d\n", fn ? "a function" : "NULL", (int)status);
    CK(p_cuGetProcAddress("cuMemAlloc", &fn, 1000, 0, &status));
    printf("cuGetProcAddress of cuMemAlloc for CUDA 1.0: %s, status %d\n", fn ? "a function" : "NULL", (int)status);

    // a graph captured from driver calls: a 32-bit memset, then a kernel of the module
    CUdeviceptr w;
    CK(p_cuMemAlloc(&w, bytes));
    void *graph_params[] = {&w, &x, &a, &nn};
    CUgraph graph;
    CUgraphExec exec;
    CK(p_cuStreamBeginCapture(s, CU_STREAM_CAPTURE_MODE_GLOBAL));
    CK(p_cuMemsetD32Async(w, 0x40000000u, n, s));
    CK(p_cuLaunchKernel(scale_add, n / 256, 1, 1, 256, 1, 1, 0, s, graph_params, nullptr));
    CK(p_cuStreamEndCapture(s, &graph));
    CK(p_cuGraphInstantiateWithFlags(&exec, graph, 0));

    // rounds a checkpoint may come between: the counter, the buffers, the module and the graph all live on
    for (int step = 0; step < steps; step++) {
        int k = step + 1;
        void *bump_params[] = {&k};
        CK(p_cuLaunchKernel(bump, 1, 1, 1, 1, 1, 1, 0, nullptr, bump_params, nullptr));
        CK(p_cuLaunchKernel(scale_add, n / 256, 1, 1, 256, 1, 1, 0, s, params, nullptr));
        CK(p_cuEventRecord(e1, s));
        CK(p_cuEventSynchronize(e1));
        CK(p_cuCtxSynchronize());
        int c = 0;
        CK(p_cuMemcpyDtoH(&c, counter, sizeof c));
        CK(p_cuMemcpyDtoH(hy.data(), y, bytes));
        double acc = 0, graph_acc = 0;
        for (int i = 0; i < n; i += 97) acc += hy[i];
        CK(p_cuGraphLaunch(exec, s));
        CK(p_cuStreamSynchronize(s));
        CK(p_cuMemcpyDtoH(hy.data(), w, bytes));
        for (int i = 0; i < n; i += 97) graph_acc += hy[i];
        printf("step %d: counter %d, sample sum %.1f, graph's %.1f\n", step, c, acc, graph_acc);
        fflush(stdout);
        if (pause_ms) usleep(pause_ms * 1000);
    }

    CK(p_cuGraphExecDestroy(exec));
    CK(p_cuGraphDestroy(graph));
    CK(p_cuMemFree(w));
    CK(p_cuEventDestroy(e0));
    CK(p_cuEventDestroy(e1));
    CK(p_cuStreamDestroy(s));
    CK(p_cuMemFree(x));
    CK(p_cuMemFree(y));
    CK(p_cuMemFree(z));
    CK(p_cuMemFreeHost(host));
    if (lib)
        CK(p_cuLibraryUnload(lib));
    else
        CK(p_cuModuleUnload(mod));
    if (!strcmp(context, "created")) {
        CK(p_cuCtxDestroy(ctx));
    } else {
        CK(p_cuDevicePrimaryCtxRelease(dev));
    }
    fprintf(stderr, "opened a GPU device itself: %s; libcuda mapped: %s\n", opened_gpu() ? "yes" : "no",
            mapped_libcuda() ? "yes" : "no");
    printf(bad_values || sum != (36.5f * 3) ? "Test FAILED\n" : "Test PASSED\n");
    return bad_values != 0;
}
