// Bad input gets the error native CUDA returns, and errors are reported the
// way the runtime reports them (last error, peek, names and strings).
#include "check.h"

__global__ void noop(int *p) { if (p) p[0] = 1; }

#define SHOW(x) do { cudaError_t e_ = (x); printf("%-58s %s\n", #x, cudaGetErrorName(e_)); cudaGetLastError(); } while (0)

int main() {
    int *d, *freed, host[16];
    CHECK(cudaMalloc(&d, 1024));
    CHECK(cudaMalloc(&freed, 1024));
    CHECK(cudaFree(freed));
    cudaStream_t s;
    cudaEvent_t e;
    int v;
    SHOW(cudaSetDevice(999));
    SHOW(cudaFree((void *)0x1234));
    SHOW(cudaFree(freed));
    SHOW(cudaMalloc((void **)&freed, 1ull << 50));
    SHOW(cudaMemset(freed, 0, 16));
    SHOW(cudaMemcpy(host, d, 64, (cudaMemcpyKind)7));
    SHOW(cudaFreeHost(host));
    SHOW(cudaHostGetDevicePointer((void **)&freed, host, 0));
    SHOW(cudaDeviceGetAttribute(&v, (cudaDeviceAttr)9999, 0));
    SHOW(cudaStreamCreateWithFlags(&s, 0x10));
    SHOW(cudaEventCreateWithFlags(&e, 0x100));
    SHOW(cudaFuncGetAttributes(nullptr, (const void *)noop));
    cudaFuncAttributes fa;
    SHOW(cudaFuncGetAttributes(&fa, (const void *)main));
    SHOW(cudaMemcpyToSymbol((const void *)host, host, 4));

    noop<<<1, 2048>>>(d);
    cudaError_t peek = cudaPeekAtLastError(), got = cudaGetLastError(), again = cudaGetLastError();
    printf("launch with 2048 threads: peek %s, get %s, then %s\n", cudaGetErrorName(peek), cudaGetErrorName(got),
           cudaGetErrorName(again));
    noop<<<0, 1>>>(d);
    printf("launch with an empty grid: %s\n", cudaGetErrorName(cudaGetLastError()));
    noop<<<1, 1, 1 << 20>>>(d);
    printf("launch with 1 MiB of shared memory: %s\n", cudaGetErrorName(cudaGetLastError()));

    CHECK(cudaEventCreate(&e));
    printf("query of a never-recorded event: %s\n", cudaGetErrorName(cudaEventQuery(e)));
    printf("names: %s / %s / %s\n", cudaGetErrorName(cudaErrorInvalidValue), cudaGetErrorName(cudaErrorLaunchFailure),
           cudaGetErrorName((cudaError_t)12345));
    printf("strings: %s / %s\n", cudaGetErrorString(cudaErrorMemoryAllocation), cudaGetErrorString(cudaErrorNoDevice));
    noop<<<1, 1>>>(d);
    CHECK(cudaDeviceSynchronize());
    printf("after good work: %s\n", cudaGetErrorName(cudaGetLastError()));
    CHECK(cudaEventDestroy(e));
    CHECK(cudaFree(d));
    printf("Test PASSED\n");
    return 0;
}
