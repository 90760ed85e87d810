// Device management: counts, properties and attributes agree, versions,
// limits, occupancy, function attributes and profiler calls.
#include "check.h"
#include <cuda_profiler_api.h>

__global__ void kern(float *p) { p[threadIdx.x] *= 2.0f; }

int main() {
    int n, dev, v, rt, drv;
    CHECK(cudaGetDeviceCount(&n));
    CHECK(cudaSetDevice(0));
    CHECK(cudaGetDevice(&dev));
    cudaDeviceProp p;
    CHECK(cudaGetDeviceProperties(&p, 0));
    printf("devices: %s, current %d\n", n >= 1 ? ">=1" : "none", dev);
    printf("name: %s\n", p.name);
    printf("cc %d.%d, %d SMs, warp %d, max threads %d, mem %zu MiB\n", p.major, p.minor, p.multiProcessorCount,
           p.warpSize, p.maxThreadsPerBlock, p.totalGlobalMem >> 20);
    CHECK(cudaDeviceGetAttribute(&v, cudaDevAttrMultiProcessorCount, 0));
    int agree = v == p.multiProcessorCount;
    CHECK(cudaDeviceGetAttribute(&v, cudaDevAttrMaxSharedMemoryPerBlockOptin, 0));
    agree &= (size_t)v == p.sharedMemPerBlockOptin;
    CHECK(cudaDeviceGetAttribute(&v, cudaDevAttrComputeCapabilityMajor, 0));
    agree &= v == p.major;
    printf("attributes agree with properties: %s\n", agree ? "yes" : "no");
    CHECK(cudaRuntimeGetVersion(&rt));
    CHECK(cudaDriverGetVersion(&drv));
    printf("runtime %d, driver >= runtime: %s\n", rt, drv >= rt ? "yes" : "no");
    size_t lim;
    CHECK(cudaDeviceSetLimit(cudaLimitPrintfFifoSize, 4 << 20));
    CHECK(cudaDeviceGetLimit(&lim, cudaLimitPrintfFifoSize));
    printf("printf fifo: %zu\n", lim);
    size_t fr, tot;
    CHECK(cudaMemGetInfo(&fr, &tot));
    printf("mem info sane: %s\n", fr <= tot && tot > 0 ? "yes" : "no");
    cudaFuncAttributes fa;
    CHECK(cudaFuncGetAttributes(&fa, (const void *)kern));
    printf("kernel: max threads %d, regs>0 %s\n", fa.maxThreadsPerBlock, fa.numRegs > 0 ? "yes" : "no");
    int blocks;
    CHECK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&blocks, kern, 256, 0));
    printf("occupancy at 256 threads > 0: %s\n", blocks > 0 ? "yes" : "no");
    int minGrid, bs;
    CHECK(cudaOccupancyMaxPotentialBlockSize(&minGrid, &bs, kern, 0, 0));
    printf("potential block size > 0: %s\n", bs > 0 ? "yes" : "no");
    CHECK(cudaFuncSetAttribute((const void *)kern, cudaFuncAttributeMaxDynamicSharedMemorySize, 65536));
    CHECK(cudaFuncGetAttributes(&fa, (const void *)kern));
    printf("max dynamic shared after set: %d\n", fa.maxDynamicSharedSizeBytes);
    char bus[32];
    CHECK(cudaDeviceGetPCIBusId(bus, sizeof bus, 0));
    CHECK(cudaProfilerStart());
    CHECK(cudaProfilerStop());
    CHECK(cudaDeviceSynchronize());
    printf("Test PASSED\n");
    return 0;
}
