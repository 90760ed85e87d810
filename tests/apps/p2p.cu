// Peer access between two GPUs: device 1's kernels read and write device 0's memory
// (cudaMalloc'd and from device 0's pool, made accessible with cudaMemPoolSetAccess),
// and peer copies.  One GPU: says so and passes.  argv[1] = extra runs, each followed by
// a pause (checkpoint tests).
#include "check.h"
#include <unistd.h>

__global__ void add_from(int *dst, const int *src, int n, int k) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) dst[i] += src[i] + k;
}

static long long sum(const int *d, int n) {
    static int h[1 << 16];
    CHECK(cudaMemcpy(h, d, n * sizeof(int), cudaMemcpyDeviceToHost));
    long long s = 0;
    for (int i = 0; i < n; i++) s += h[i];
    return s;
}

int main(int argc, char **argv) {
    int long_run = argc > 1 ? atoi(argv[1]) : 0, count = 0, can = 0;
    CHECK(cudaGetDeviceCount(&count));
    if (count >= 2) CHECK(cudaDeviceCanAccessPeer(&can, 1, 0));
    if (!can) {
        printf("peer access needs two GPUs that can reach each other\nTest PASSED\n");
        return 0;
    }
    const int N = 1 << 16;
    int *a, *pooled, *b;
    CHECK(cudaSetDevice(0));
    CHECK(cudaMalloc(&a, N * sizeof(int)));
    CHECK(cudaMemset(a, 0, N * sizeof(int)));
    cudaMemPool_t pool;
    CHECK(cudaDeviceGetDefaultMemPool(&pool, 0));
    cudaMemAccessDesc d1 = {{cudaMemLocationTypeDevice, 1}, cudaMemAccessFlagsProtReadWrite};
    CHECK(cudaMemPoolSetAccess(pool, &d1, 1));
    CHECK(cudaMallocAsync(&pooled, N * sizeof(int), 0));
    CHECK(cudaMemsetAsync(pooled, 1, N * sizeof(int), 0));
    CHECK(cudaDeviceSynchronize());
    CHECK(cudaSetDevice(1));
    CHECK(cudaDeviceEnablePeerAccess(0, 0));
    CHECK(cudaMalloc(&b, N * sizeof(int)));
    CHECK(cudaMemset(b, 0, N * sizeof(int)));
    for (int r = 0; r < 3 + long_run; r++) {
        add_from<<<N / 256, 256>>>(a, pooled, N, r);  // (on device 1: both buffers are device 0's)
        add_from<<<N / 256, 256>>>(b, a, N, 1);
        CHECK(cudaDeviceSynchronize());
        CHECK(cudaMemcpyPeer(pooled, 0, b, 1, 64 * sizeof(int)));
        printf("run %d: a %lld, b %lld, pooled %lld\n", r, sum(a, N), sum(b, N), sum(pooled, N));
        fflush(stdout);
        if (long_run) usleep(150000);
    }
    CHECK(cudaFree(b));
    CHECK(cudaSetDevice(0));
    CHECK(cudaFreeAsync(pooled, 0));
    CHECK(cudaFree(a));
    CHECK(cudaDeviceSynchronize());
    printf("Test PASSED\n");
    return 0;
}
