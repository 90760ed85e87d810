// The stream-ordered allocator with the device's default pool and a pool of its own:
// cudaMallocAsync/cudaFreeAsync in stream order, pool attributes, access, the device's current pool.
// argv[1] = extra rounds, each followed by a pause (checkpoint tests: a pool allocation made before the
// first round must keep its contents).
#include "check.h"
#include <unistd.h>

__global__ void iota(int *p, int n, int base) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) p[i] = base + i;
}

int main(int argc, char **argv) {
    int long_run = argc > 1 ? atoi(argv[1]) : 0;
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
    int *kept;  // (lives through every round)
    CHECK(cudaMallocFromPoolAsync((void **)&kept, 1024 * sizeof(int), pool, s));
    iota<<<4, 256, 0, s>>>(kept, 1024, 42);
    for (int round = 0; round < 4 + long_run; round++) {
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
        CHECK(cudaMemcpyAsync(h, kept, 1024 * sizeof(int), cudaMemcpyDeviceToHost, s));
        CHECK(cudaStreamSynchronize(s));
        long long k = 0;
        for (int i = 0; i < 1024; i++) k += h[i];
        printf("round %d: sum %lld, kept %lld\n", round, total, k);
        fflush(stdout);
        CHECK(cudaFreeHost(h));
        if (long_run) usleep(150000);
    }
    CHECK(cudaFreeAsync(kept, s));
    CHECK(cudaStreamSynchronize(s));
    unsigned long long used = 1;
    CHECK(cudaMemPoolGetAttribute(pool, cudaMemPoolAttrUsedMemCurrent, &used));
    printf("used after free and sync: %llu\n", (unsigned long long)used);
    printf("sum %lld\n", total);
    int *p2;
    CHECK(cudaMallocFromPoolAsync((void **)&p2, 4096, pool, s));
    CHECK(cudaFreeAsync(p2, s));
    CHECK(cudaMemPoolTrimTo(pool, 0));
    CHECK(cudaStreamSynchronize(s));

    cudaMemPoolProps props = {};
    props.allocType = cudaMemAllocationTypePinned;
    props.location.type = cudaMemLocationTypeDevice;
    props.location.id = 0;
    cudaMemPool_t mine, cur;
    CHECK(cudaMemPoolCreate(&mine, &props));
    cudaMemAccessDesc self = {{cudaMemLocationTypeDevice, 0}, cudaMemAccessFlagsProtReadWrite};
    CHECK(cudaMemPoolSetAccess(mine, &self, 1));
    cudaMemAccessFlags flags;
    cudaMemLocation loc = {cudaMemLocationTypeDevice, 0};
    CHECK(cudaMemPoolGetAccess(&flags, mine, &loc));
    printf("own pool: distinct %d, access %d\n", mine != pool, (int)flags);
    CHECK(cudaDeviceSetMemPool(0, mine));
    CHECK(cudaDeviceGetMemPool(&cur, 0));
    int *q;
    CHECK(cudaMallocAsync((void **)&q, 1 << 20, s));
    iota<<<4, 256, 0, s>>>(q, 1024, 7);
    unsigned long long mine_used = 0, default_used = 0;
    CHECK(cudaMemPoolGetAttribute(mine, cudaMemPoolAttrUsedMemCurrent, &mine_used));
    CHECK(cudaMemPoolGetAttribute(pool, cudaMemPoolAttrUsedMemCurrent, &default_used));
    printf("current pool is it: %d; its use %s, the default's %llu\n", cur == mine,
           mine_used >= (1 << 20) ? "covers the allocation" : "too small", default_used);
    int last = 0;
    CHECK(cudaMemcpyAsync(&last, q + 1023, sizeof last, cudaMemcpyDeviceToHost, s));
    CHECK(cudaFreeAsync(q, s));
    CHECK(cudaStreamSynchronize(s));
    printf("from its pool: %d\n", last);
    CHECK(cudaMemPoolDestroy(mine));
    CHECK(cudaDeviceGetMemPool(&cur, 0));
    printf("after destroying it the device's pool is the default: %d\n", cur == pool);
    CHECK(cudaStreamDestroy(s));
    printf("Test PASSED\n");
    return 0;
}
