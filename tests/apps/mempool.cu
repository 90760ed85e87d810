// The stream-ordered allocator with the device's default pool:
// cudaMallocAsync/cudaFreeAsync in stream order, pool attributes.
#include "check.h"

__global__ void iota(int *p, int n, int base) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) p[i] = base + i;
}

int main() {
    cudaMemPool_t pool;
    CHECK(cudaDeviceGetDefaultMemPool(&pool, 0));
    unsigned long long threshold = 1 << 20, got = 0;
    CHECK(cudaMemPoolSetAttribute(pool, cudaMemPoolAttrReleaseThreshold, &threshold));
    CHECK(cudaMemPoolGetAttribute(pool, cudaMemPoolAttrReleaseThreshold, &got));
    printf("release threshold read back: %llu\n", (unsigned long long)got);
    cudaStream_t s;
    CHECK(cudaStreamCreate(&s));
    const int n = 1 << 18;
    long long total = 0;
    for (int round = 0; round < 4; round++) {
        int *d, *h;
        CHECK(cudaMallocHost(&h, n * sizeof(int)));
        CHECK(cudaMallocAsync(&d, n * sizeof(int), s));
        iota<<<n / 256, 256, 0, s>>>(d, n, round * 1000);
        CHECK(cudaMemcpyAsync(h, d, n * sizeof(int), cudaMemcpyDeviceToHost, s));
        unsigned long long used = 0;
        CHECK(cudaMemPoolGetAttribute(pool, cudaMemPoolAttrUsedMemCurrent, &used));
        if (round == 0) printf("used while allocated >= requested: %s\n", used >= n * sizeof(int) ? "yes" : "no");
        CHECK(cudaFreeAsync(d, s));
        CHECK(cudaStreamSynchronize(s));
        for (int i = 0; i < n; i += 4099) total += h[i];
        CHECK(cudaFreeHost(h));
    }
    unsigned long long used = 1;
    CHECK(cudaMemPoolGetAttribute(pool, cudaMemPoolAttrUsedMemCurrent, &used));
    printf("used after free and sync: %llu\n", (unsigned long long)used);
    printf("sum %lld\n", total);
    int *p2;
    CHECK(cudaMallocFromPoolAsync((void **)&p2, 4096, pool, s));
    CHECK(cudaFreeAsync(p2, s));
    CHECK(cudaMemPoolTrimTo(pool, 0));
    CHECK(cudaStreamSynchronize(s));
    CHECK(cudaStreamDestroy(s));
    printf("Test PASSED\n");
    return 0;
}
