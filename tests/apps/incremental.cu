// Incremental checkpoints: each step writes a tenth of the program's plain buffers, and memory that only pointers
// lead to: an array of pointers built on the device, a pointer in a __device__ variable, a pointer inside a
// structure parameter, a pointer passed as an integer; with argv[2] "defeat", also memory reached from another
// allocation's pointer by an offset past its end (beyond what write tracking can see).  argv[1]: steps; after each,
// a line on standard input lets it go on (at its end of file it runs on).  It prints every buffer's checksum at
// the end: a run checkpointed between any steps and restored prints what an uninterrupted run prints.
#include "check.h"
#include <cstring>

const int N = 1 << 20;  // elements of 4 bytes per buffer: 4 MiB, a mapping of its own
const int PLAIN = 10, M = 4096;

__device__ unsigned *g_target;

struct Args { int n; unsigned *out; unsigned k; };

__global__ void touch(unsigned *p, int n, unsigned k) {
    for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += gridDim.x * blockDim.x) p[i] = p[i] * 3u + k;
}
__global__ void build(unsigned **ptrs, unsigned *t, int m) {
    for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < m; i += gridDim.x * blockDim.x) ptrs[i] = t + (i * 7) % N;
}
__global__ void scatter(unsigned **ptrs, int m, unsigned k) {
    for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < m; i += gridDim.x * blockDim.x) *ptrs[i] += k;
}
__global__ void via_global(int m, unsigned k) {
    for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < m; i += gridDim.x * blockDim.x) g_target[i] += k;
}
__global__ void with_struct(Args a) {
    for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < a.n; i += gridDim.x * blockDim.x) a.out[i] ^= a.k;
}
__global__ void with_int(unsigned long long addr, int m, unsigned k) {
    unsigned *p = (unsigned *)addr;
    for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < m; i += gridDim.x * blockDim.x) p[i] += k * 5u;
}
__global__ void past_end(unsigned *base, long long off, int m, unsigned k) {
    for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < m; i += gridDim.x * blockDim.x) base[off + i] += k;
}

int main(int argc, char **argv) {
    int steps = argc > 1 ? atoi(argv[1]) : 12;
    bool defeat = argc > 2 && !strcmp(argv[2], "defeat");
    unsigned *plain[PLAIN], *t, *u, *s, *in, *d, **ptrs;
    for (int i = 0; i < PLAIN; i++) {
        CHECK(cudaMalloc(&plain[i], N * sizeof(unsigned)));
        CHECK(cudaMemset(plain[i], i, N * sizeof(unsigned)));
    }
    unsigned **all[] = {&t, &u, &s, &in, &d};
    for (unsigned **p : all) {
        CHECK(cudaMalloc(p, N * sizeof(unsigned)));
        CHECK(cudaMemset(*p, 0, N * sizeof(unsigned)));
    }
    CHECK(cudaMalloc(&ptrs, N * sizeof(unsigned)));
    CHECK(cudaMemset(ptrs, 0, N * sizeof(unsigned)));
    build<<<16, 256>>>(ptrs, t, M);
    CHECK(cudaMemcpyToSymbol(g_target, &u, sizeof u));
    CHECK(cudaDeviceSynchronize());
    char line[64];
    bool gated = true;
    for (int step = 0; step < steps; step++) {
        touch<<<64, 256>>>(plain[step % PLAIN], N, step + 1);
        scatter<<<16, 256>>>(ptrs, M, step + 1);
        via_global<<<16, 256>>>(M, step + 1);
        with_struct<<<16, 256>>>(Args{M, s, (unsigned)step + 1});
        with_int<<<16, 256>>>((unsigned long long)in, M, step + 1);
        if (defeat) past_end<<<16, 256>>>(plain[0], d - plain[0], M, step + 1);
        unsigned probe[2];
        CHECK(cudaMemcpy(probe, t, sizeof probe, cudaMemcpyDeviceToHost));
        printf("step %d: %u %u\n", step, probe[0], probe[1]);
        fflush(stdout);
        if (gated && !fgets(line, sizeof line, stdin))
            gated = false;
    }
    unsigned *host = (unsigned *)malloc(N * sizeof(unsigned));
    unsigned *named[] = {t, u, s, in, d};
    for (int i = 0; i < PLAIN + 5; i++) {
        CHECK(cudaMemcpy(host, i < PLAIN ? plain[i] : named[i - PLAIN], N * sizeof(unsigned), cudaMemcpyDeviceToHost));
        printf("buffer %d: %016llx\n", i, checksum(host, N * sizeof(unsigned)));
    }
    printf("Test PASSED\n");
    return 0;
}
