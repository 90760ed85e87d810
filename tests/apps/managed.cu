// Managed memory: the CPU and kernels share one allocation, with prefetches,
// advice and stream attachment; memset, copies and pointer attributes on it;
// error cases.  argv[1] = "steps": a long run (checkpoint tests).
#include "check.h"
#include <cstring>
#include <unistd.h>

__global__ void bump(unsigned *p, int n, unsigned k) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) p[i] = p[i] * 3u + k + (unsigned)i;
}

static unsigned long long fold(const unsigned *p, int n) {
    unsigned long long s = 0;
    for (int i = 0; i < n; i++) s = s * 1000003ull + p[i];
    return s;
}

int main(int argc, char **argv) {
    const int n = 1 << 20;
    const size_t bytes = n * sizeof(unsigned);
    int steps = argc > 1 ? atoi(argv[1]) : 0;
    unsigned *m;
    CHECK(cudaMallocManaged(&m, bytes));
    for (int i = 0; i < n; i++) m[i] = (unsigned)i;  // the CPU writes it directly
    cudaPointerAttributes attr;
    CHECK(cudaPointerGetAttributes(&attr, m));
    printf("type managed: %d\n", attr.type == cudaMemoryTypeManaged);
    cudaStream_t s;
    CHECK(cudaStreamCreate(&s));
    CHECK(cudaStreamAttachMemAsync(s, m, 0, cudaMemAttachGlobal));
    cudaMemLocation dev0 = {cudaMemLocationTypeDevice, 0}, host = {cudaMemLocationTypeHost, 0};
    CHECK(cudaMemAdvise(m, bytes, cudaMemAdviseSetPreferredLocation, dev0));
    CHECK(cudaMemAdvise(m, bytes, cudaMemAdviseSetReadMostly, dev0));
    CHECK(cudaMemAdvise(m, bytes, cudaMemAdviseUnsetReadMostly, dev0));
    CHECK(cudaMemPrefetchAsync(m, bytes, dev0, 0, s));
    bump<<<(n + 255) / 256, 256, 0, s>>>(m, n, 7);
    CHECK(cudaMemPrefetchAsync(m, bytes, host, 0, s));
    CHECK(cudaStreamSynchronize(s));
    printf("after kernel: %016llx\n", fold(m, n));  // the CPU reads what the kernel wrote
    m[5] = 12345;                                   // and writes again before the next launch
    bump<<<(n + 255) / 256, 256>>>(m, n, 1);
    CHECK(cudaDeviceSynchronize());
    printf("m[5] %u, fold %016llx\n", m[5], fold(m, n));
    // copies and memsets reach it like device memory
    unsigned *d;
    CHECK(cudaMalloc(&d, bytes));
    CHECK(cudaMemcpy(d, m, bytes, cudaMemcpyDefault));
    CHECK(cudaMemset(m, 0, bytes / 2));
    CHECK(cudaDeviceSynchronize());
    printf("half zero: %d %d\n", m[0] == 0 && m[n / 2 - 1] == 0, m[n / 2] != 0);
    CHECK(cudaMemcpy(m, d, bytes, cudaMemcpyDeviceToDevice));
    printf("copied back: %016llx\n", fold(m, n));
    // a second allocation, attached to the host only
    unsigned *h;
    CHECK(cudaMallocManaged(&h, 4096, cudaMemAttachHost));
    memset(h, 0xab, 4096);
    CHECK(cudaMemcpy(d, h, 4096, cudaMemcpyHostToDevice));
    unsigned back = 0;
    CHECK(cudaMemcpy(&back, d, sizeof back, cudaMemcpyDeviceToHost));
    printf("host-attached: %08x\n", back);
    // what the runtime refuses
    void *bad;
    printf("size 0: %s\n", cudaGetErrorName(cudaMallocManaged(&bad, 0)));
    printf("flags 0: %s\n", cudaGetErrorName(cudaMallocManaged(&bad, 64, 0)));
    cudaMemLocation nodev = {cudaMemLocationTypeDevice, 999};
    printf("prefetch to device 999: %s\n", cudaGetErrorName(cudaMemPrefetchAsync(m, bytes, nodev, 0, s)));
    printf("free host-attached with cudaFreeHost: %s\n", cudaGetErrorName(cudaFreeHost(h)));
    cudaGetLastError();
    for (int step = 0; step < steps; step++) {  // a long run: the state must survive checkpoints
        bump<<<(n + 255) / 256, 256, 0, s>>>(m, n, step);
        CHECK(cudaStreamSynchronize(s));
        m[step % n] ^= 0x5a5a5a5au;
        printf("step %d: %016llx\n", step, fold(m, n));
        fflush(stdout);
        usleep(100000);
    }
    CHECK(cudaFree(h));
    CHECK(cudaFree(m));
    CHECK(cudaFree(d));
    printf("Test PASSED\n");
    return 0;
}
