// Small synchronous copies to the device from pinned memory, which return once the bytes are taken (the proxy
// answers before their DMA ends): the host buffer changes right after each call and must not reach the device, and a
// kernel still writing that memory through its mapping when the copy is called (on the legacy stream, or on a
// blocking stream) has ended before the copy takes the bytes, since the copy waits for it as the runtime's does.
#include "check.h"
#include <cstring>
#include <vector>

// Spins for `cycles`, then writes byte i of p as i * 131 + seed.
__global__ void fill(unsigned char *p, size_t n, unsigned seed, long long cycles) {
    long long t0 = clock64();
    while (clock64() - t0 < cycles) {}
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x)
        p[i] = (unsigned char)(i * 131u + seed);
    __threadfence_system();
}

static const long long SPIN = 40000000LL;  // ~20 ms on an H100/H200

int main() {
    const size_t max = 256 << 10, dev_bytes = 16 << 20;
    unsigned char *pin, *dpin, *back, *d;
    CHECK(cudaHostAlloc(&pin, max, cudaHostAllocMapped));
    CHECK(cudaHostGetDevicePointer((void **)&dpin, pin, 0));
    CHECK(cudaMallocHost(&back, max));
    CHECK(cudaMalloc(&d, dev_bytes));
    CHECK(cudaMemset(d, 0, dev_bytes));
    std::vector<unsigned char> expect(dev_bytes, 0), all(dev_bytes);

    // 1. back to back, 1 B - 256 KiB, the pinned buffer rewritten after each call
    const size_t sizes[] = {1, 100, 4096, 65536, 131072, 131073, 262144};
    size_t at = 0;
    for (unsigned k = 0; k < 3000; k++) {
        size_t n = sizes[k % 7] > k % 3 ? sizes[k % 7] - k % 3 : 1;
        if (at + n > dev_bytes) at = (k * 4099u) % 4096;
        pattern(pin, n, k);
        CHECK(cudaMemcpy(d + at, pin, n, cudaMemcpyHostToDevice));
        memcpy(expect.data() + at, pin, n);
        memset(pin, 0xee, n);  // (taken already: this must not reach the device)
        at += n;
    }
    CHECK(cudaMemcpy(all.data(), d, dev_bytes, cudaMemcpyDeviceToHost));
    printf("back to back: %s (%016llx)\n", memcmp(all.data(), expect.data(), dev_bytes) ? "WRONG" : "ok",
           checksum(all.data(), dev_bytes));

    // 2. after a kernel that writes the pinned memory, still running when the copy is called
    cudaStream_t blocking;
    CHECK(cudaStreamCreate(&blocking));
    int wrong = 0;
    for (int way = 0; way < 2; way++) {
        for (size_t n : {(size_t)4096, (size_t)131072}) {
            unsigned seed = 7 + way * 10 + (unsigned)(n >> 12);
            memset(pin, 0, n);
            fill<<<4, 256, 0, way ? blocking : 0>>>(dpin, n, seed, SPIN);
            CHECK(cudaGetLastError());
            CHECK(cudaMemcpy(d, pin, n, cudaMemcpyHostToDevice));
            CHECK(cudaMemcpy(back, d, n, cudaMemcpyDeviceToHost));
            int bad = 0;
            for (size_t i = 0; i < n; i++) bad |= back[i] != (unsigned char)(i * 131u + seed);
            printf("after a kernel on the %s stream, %zu bytes: %s\n", way ? "blocking" : "legacy", n,
                   bad ? "WRONG" : "ok");
            wrong |= bad;
        }
    }
    CHECK(cudaStreamDestroy(blocking));
    CHECK(cudaFreeHost(pin));
    CHECK(cudaFreeHost(back));
    CHECK(cudaFree(d));
    printf(wrong ? "Test FAILED\n" : "Test PASSED\n");
    return wrong;
}
