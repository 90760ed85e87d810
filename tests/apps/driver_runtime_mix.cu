// The runtime and the driver API in one program, as libraries mix them: the context the runtime made current
// is the device's primary context the driver sees; a thread that made no runtime call has no context until it
// sets one; a driver call that fails leaves the runtime's last error alone; memory of either API serves both.
#include "check.h"
#include <cuda.h>
#include <dlfcn.h>
#include <thread>

#define SYM(name, exported) auto p_##name = (decltype(&name))dlsym(h, exported)

__global__ void twice(float *p, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) p[i] *= 2.0f;
}

int main() {
    void *h = dlopen("libcuda.so.1", RTLD_NOW);
    if (!h) {
        printf("dlopen(libcuda.so.1): %s\n", dlerror());
        return 1;
    }
    SYM(cuInit, "cuInit");
    SYM(cuCtxGetCurrent, "cuCtxGetCurrent");
    SYM(cuCtxSetCurrent, "cuCtxSetCurrent");
    SYM(cuDevicePrimaryCtxRetain, "cuDevicePrimaryCtxRetain");
    SYM(cuDevicePrimaryCtxRelease, "cuDevicePrimaryCtxRelease_v2");
    SYM(cuMemAlloc, "cuMemAlloc_v2");
    SYM(cuMemFree, "cuMemFree_v2");
    SYM(cuMemcpyDtoH, "cuMemcpyDtoH_v2");
    SYM(cuMemsetD32, "cuMemsetD32_v2");
    SYM(cuPointerGetAttribute, "cuPointerGetAttribute");
    SYM(cuGetErrorName, "cuGetErrorName");
    auto name = [&](CUresult r) {
        const char *s = "?";
        p_cuGetErrorName(r, &s);
        return s;
    };

    CHECK(cudaSetDevice(0));
    CHECK(cudaFree(0));  // (the runtime's context, made current on this thread)
    printf("cuInit after the runtime: %s\n", name(p_cuInit(0)));
    CUcontext now = nullptr, primary = nullptr;
    printf("cuCtxGetCurrent: %s\n", name(p_cuCtxGetCurrent(&now)));
    printf("primary retain: %s\n", name(p_cuDevicePrimaryCtxRetain(&primary, 0)));
    printf("the runtime's context is the primary one: %s\n", now && now == primary ? "yes" : "no");

    // memory of one API used by the other
    const int n = 4096;
    CUdeviceptr d;
    printf("cuMemAlloc: %s\n", name(p_cuMemAlloc(&d, n * sizeof(float))));
    printf("cuMemsetD32: %s\n", name(p_cuMemsetD32(d, 0x3fc00000u, n)));  // 1.5f
    twice<<<n / 256, 256>>>((float *)d, n);
    CHECK(cudaGetLastError());
    float back[4] = {};
    CUresult copied = p_cuMemcpyDtoH(back, d + 100 * sizeof(float), sizeof back);
    printf("cuMemcpyDtoH: %s, %.1f %.1f\n", name(copied), back[0], back[3]);

    // a driver call failing leaves the runtime's last error as it was
    int plain = 0;
    unsigned type = 0;
    printf("pointer attribute of malloc'ed memory: %s\n",
           name(p_cuPointerGetAttribute(&type, CU_POINTER_ATTRIBUTE_MEMORY_TYPE, (CUdeviceptr)&plain)));
    printf("cudaGetLastError after it: %s\n", cudaGetErrorName(cudaGetLastError()));

    // a thread that made no runtime call has no context until it sets one
    std::thread([&] {
        CUcontext c = (CUcontext)1;
        CUdeviceptr p = 0;
        CUresult got = p_cuCtxGetCurrent(&c), alloc = p_cuMemAlloc(&p, 256);
        printf("other thread: current %s; cuMemAlloc: %s\n", got == CUDA_SUCCESS && !c ? "none" : "?", name(alloc));
        CUresult set = p_cuCtxSetCurrent(primary);
        alloc = p_cuMemAlloc(&p, 256);
        printf("other thread: set primary: %s; cuMemAlloc: %s; cuMemFree: %s\n", name(set), name(alloc),
               name(p_cuMemFree(p)));
    }).join();

    printf("cuMemFree: %s\n", name(p_cuMemFree(d)));
    printf("primary release: %s\n", name(p_cuDevicePrimaryCtxRelease(0)));
    CHECK(cudaDeviceSynchronize());
    printf("Test PASSED\n");
    return 0;
}
