// Checkpoint benchmark target: fills argv[1] MiB of device memory (in
// allocations of up to 1 GiB), prints "ready", waits for a line on stdin, then
// verifies the memory and prints "verified ok" (so a migration in between is
// checked too).  argv[2] = "host": the same in pinned host memory instead (what a
// checkpointer such as DMTCP saves with the application; dmtcp_placement.py).
// argv[2] = "loop": until that line comes, a kernel adds one to every word of a
// buffer a tenth the size of the rest, over and over, and prints "batch NS" (the
// monotonic clock) after each (its rate while a checkpoint runs; what an
// incremental checkpoint after it writes: ckpt_concurrent.py).
#include <cstdio>
#include <cstdlib>
#include <ctime>
#include <poll.h>
#include <vector>
#include <cuda_runtime.h>

__global__ void fill(unsigned *p, size_t n, unsigned seed) {
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x)
        p[i] = (unsigned)i * 2654435761u + seed;
}
__global__ void bump(unsigned *p, size_t n) {
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x)
        p[i] += 1u;
}
__global__ void check(const unsigned *p, size_t n, unsigned seed, unsigned long long *bad) {
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x)
        if (p[i] != (unsigned)i * 2654435761u + seed) atomicAdd(bad, 1ull);
}

int main(int argc, char **argv) {
    size_t total = (argc > 1 ? strtoull(argv[1], NULL, 10) : 1024) << 20, piece = 1ull << 30;
    if (total < piece) piece = total;
    int count = (int)(total / piece);
    size_t n = piece / sizeof(unsigned);
    bool host = argc > 2 && argv[2][0] == 'h', loop = argc > 2 && argv[2][0] == 'l';
    std::vector<unsigned *> bufs(count);
    for (int i = 0; i < count; i++) {
        cudaError_t e = host ? cudaMallocHost(&bufs[i], piece) : cudaMalloc(&bufs[i], piece);
        if (e != cudaSuccess) { printf("alloc failed\n"); return 1; }
        fill<<<1024, 256>>>(bufs[i], n, i);
    }
    unsigned long long *bad;
    cudaMalloc(&bad, sizeof *bad);
    cudaMemset(bad, 0, sizeof *bad);
    unsigned *work = NULL;
    size_t wn = total / 10 / sizeof(unsigned);
    if (loop && (cudaMalloc(&work, wn * sizeof(unsigned)) != cudaSuccess ||
                 cudaMemset(work, 0, wn * sizeof(unsigned)) != cudaSuccess)) { printf("alloc failed\n"); return 1; }
    cudaDeviceSynchronize();
    printf("ready\n");
    fflush(stdout);
    struct pollfd in = {0, POLLIN, 0};
    while (loop && poll(&in, 1, 0) == 0) {
        bump<<<1024, 256>>>(work, wn);
        if (cudaDeviceSynchronize() != cudaSuccess) { printf("loop failed\n"); return 1; }
        struct timespec ts;
        clock_gettime(CLOCK_MONOTONIC, &ts);
        printf("batch %lld\n", ts.tv_sec * 1000000000LL + ts.tv_nsec);
        fflush(stdout);
    }
    char line[8];
    if (!fgets(line, sizeof line, stdin)) return 2;
    for (int i = 0; i < count; i++) check<<<1024, 256>>>(bufs[i], n, i, bad);
    unsigned long long h = 1;
    cudaMemcpy(&h, bad, sizeof h, cudaMemcpyDeviceToHost);
    printf(h == 0 ? "verified ok\n" : "verified BAD\n");
    return h != 0;
}
