// A program to checkpoint while it runs (concurrent checkpoints): every step writes buffers on many streams, through
// an array of pointers built on the device, in a captured graph, by device-to-device copies and memsets, and by a
// cuBLAS call.  argv[1]: steps; after each, a line on standard input lets it go on (at its end of file it runs on).
// It prints every buffer's checksum at the end: a run restored from an image taken between any two steps prints what
// an uninterrupted run prints.
#include "check.h"

extern "C" {  // (the two cuBLAS functions it calls, declared here: no math-library headers needed to build it)
typedef void *cublasHandle_t;
int cublasCreate_v2(cublasHandle_t *);
int cublasSaxpy_v2(cublasHandle_t, int, const float *, const float *, int, float *, int);
}

const int N = 1 << 20;  // elements of 4 bytes per buffer: 4 MiB, a mapping of its own
const int S = 8, M = 4096;

__global__ void touch(unsigned *p, int n, unsigned k) {
    for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += gridDim.x * blockDim.x) p[i] = p[i] * 3u + k;
}
__global__ void build(unsigned **ptrs, unsigned *const *bases, int m) {
    for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < m; i += gridDim.x * blockDim.x)
        ptrs[i] = bases[i % S] + (i * 7) % N;
}
__global__ void scatter(unsigned **ptrs, int m, unsigned k) {
    for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < m; i += gridDim.x * blockDim.x) *ptrs[i] += k;
}

int main(int argc, char **argv) {
    int steps = argc > 1 ? atoi(argv[1]) : 12;
    unsigned *buf[S], *g, **ptrs, **bases;
    float *x, *y;
    cudaStream_t st[S];
    for (int s = 0; s < S; s++) {
        CHECK(cudaStreamCreateWithFlags(&st[s], cudaStreamNonBlocking));
        CHECK(cudaMalloc(&buf[s], N * sizeof(unsigned)));
        CHECK(cudaMemset(buf[s], s, N * sizeof(unsigned)));
    }
    CHECK(cudaMalloc(&g, N * sizeof(unsigned)));
    CHECK(cudaMemset(g, 0, N * sizeof(unsigned)));
    CHECK(cudaMalloc(&ptrs, M * sizeof(unsigned *)));
    CHECK(cudaMalloc(&bases, S * sizeof(unsigned *)));
    CHECK(cudaMemcpy(bases, buf, sizeof buf, cudaMemcpyHostToDevice));
    build<<<16, 256>>>(ptrs, bases, M);
    float hx[1024], hy[1024];
    for (int i = 0; i < 1024; i++) { hx[i] = (float)(i % 17); hy[i] = (float)(i % 5); }
    CHECK(cudaMalloc(&x, sizeof hx));
    CHECK(cudaMalloc(&y, sizeof hy));
    CHECK(cudaMemcpy(x, hx, sizeof hx, cudaMemcpyHostToDevice));
    CHECK(cudaMemcpy(y, hy, sizeof hy, cudaMemcpyHostToDevice));
    cublasHandle_t h;
    if (cublasCreate_v2(&h)) { printf("FAILED cublasCreate\n"); return 1; }
    cudaGraph_t graph;
    cudaGraphExec_t exec;
    CHECK(cudaStreamBeginCapture(st[0], cudaStreamCaptureModeGlobal));
    touch<<<32, 256, 0, st[0]>>>(g, N, 7);
    scatter<<<16, 256, 0, st[0]>>>(ptrs, M, 3);
    CHECK(cudaStreamEndCapture(st[0], &graph));
    CHECK(cudaGraphInstantiate(&exec, graph, 0));
    CHECK(cudaDeviceSynchronize());
    char line[64];
    bool gated = true;
    for (int step = 0; step < steps; step++) {
        for (int s = 0; s < S; s++)
            touch<<<32, 256, 0, st[s]>>>(buf[s], N, step + s);
        CHECK(cudaDeviceSynchronize());
        scatter<<<16, 256, 0, st[1]>>>(ptrs, M, step + 1);
        CHECK(cudaMemcpyAsync(buf[step % S], buf[(step + 1) % S] + N / 2, N / 2 * sizeof(unsigned),
                              cudaMemcpyDeviceToDevice, st[1]));
        CHECK(cudaMemsetAsync(buf[(step + 3) % S] + N / 4, step, N / 8 * sizeof(unsigned), st[1]));
        CHECK(cudaStreamSynchronize(st[1]));
        unsigned *tmp;  // (of another size each step: new device memory, not the arena's cached mapping)
        int n = N / 2 + step % 3 * (N / 4);
        CHECK(cudaMalloc(&tmp, n * sizeof(unsigned)));
        CHECK(cudaMemcpy(tmp, buf[(step + 5) % S], n * sizeof(unsigned), cudaMemcpyDeviceToDevice));
        touch<<<32, 256>>>(tmp, n, step);
        CHECK(cudaMemcpy(g + N / 2, tmp, N / 4 * sizeof(unsigned), cudaMemcpyDeviceToDevice));
        CHECK(cudaFree(tmp));
        CHECK(cudaGraphLaunch(exec, st[0]));
        CHECK(cudaStreamSynchronize(st[0]));
        float alpha = 0.5f;
        if (cublasSaxpy_v2(h, 1024, &alpha, x, 1, y, 1)) { printf("FAILED saxpy\n"); return 1; }
        unsigned probe[2];
        CHECK(cudaMemcpy(probe, buf[step % S], sizeof probe, cudaMemcpyDeviceToHost));
        printf("step %d: %u %u\n", step, probe[0], probe[1]);
        fflush(stdout);
        if (gated && !fgets(line, sizeof line, stdin))
            gated = false;
    }
    unsigned *host = (unsigned *)malloc(N * sizeof(unsigned));
    for (int i = 0; i <= S; i++) {
        CHECK(cudaMemcpy(host, i < S ? buf[i] : g, N * sizeof(unsigned), cudaMemcpyDeviceToHost));
        printf("buffer %d: %016llx\n", i, checksum(host, N * sizeof(unsigned)));
    }
    CHECK(cudaMemcpy(hy, y, sizeof hy, cudaMemcpyDeviceToHost));
    printf("saxpy: %016llx\n", checksum(hy, sizeof hy));
    printf("Test PASSED\n");
    return 0;
}
