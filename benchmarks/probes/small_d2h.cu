// How fast can a small copy from the device reach the host?  Natively, per copy, median of many:
// the runtime's cudaMemcpy to pageable and to pinned memory, an async copy engine copy to pinned memory waited
// for by spinning on the stream, and a copy kernel that stores into mapped pinned memory and raises a flag there
// that the host spins on (so no driver call waits).  On the GPU machine: nvcc -O2 -o small_d2h small_d2h.cu
#include "probe_rt.h"
#include <stdint.h>
#include <string.h>

// Copies n bytes (a multiple of 16) and raises *flag to seq once every block's stores are visible to the host.
__global__ void copy_flag(uint4 *dst, const uint4 *src, size_t n16, unsigned *blocks_done,
                          volatile unsigned *flag, unsigned seq)
{
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n16; i += (size_t)gridDim.x * blockDim.x)
        dst[i] = src[i];
    __threadfence_system();
    __syncthreads();
    if (threadIdx.x == 0) {
        unsigned done = atomicAdd(blocks_done, 1) + 1;
        if (done == gridDim.x) {
            *blocks_done = 0;
            __threadfence_system();
            *flag = seq;
        }
    }
}

int main(int argc, char **argv)
{
    int reps = argc > 1 ? atoi(argv[1]) : 2000;
    size_t sizes[] = {4096, 16384, 65536, 262144, 1 << 20};
    size_t maxn = 1 << 20;
    char *dev, *pin, *pag, *mapped;
    unsigned *blocks_done, *flag;
    cudaStream_t st;
    CK(cudaSetDeviceFlags(cudaDeviceMapHost));
    CK(cudaMalloc(&dev, maxn));
    CK(cudaMemset(dev, 7, maxn));
    CK(cudaMallocHost(&pin, maxn));
    CK(cudaHostAlloc(&mapped, maxn + 4096, cudaHostAllocMapped));
    CK(cudaMalloc(&blocks_done, sizeof(unsigned)));
    CK(cudaMemset(blocks_done, 0, sizeof(unsigned)));
    pag = (char *)malloc(maxn);
    memset(pag, 1, maxn);
    flag = (unsigned *)(mapped + maxn);
    *flag = 0;
    char *mapped_dev;
    CK(cudaHostGetDevicePointer((void **)&mapped_dev, mapped, 0));
    CK(cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking));
    double *t = (double *)malloc(sizeof(double) * (size_t)reps);
    unsigned seq = 0;
    const char *names[] = {"cudaMemcpy to pageable", "cudaMemcpy to pinned", "async to pinned, spin on stream",
                           "kernel to mapped, spin on flag", "kernel to mapped, spin on stream"};
    for (size_t si = 0; si < sizeof sizes / sizeof *sizes; si++) {
        size_t n = sizes[si];
        unsigned blocks = (unsigned)((n / 16 + 255) / 256);
        if (blocks > 132)
            blocks = 132;
        for (int v = 0; v < 5; v++) {
            for (int r = -50; r < reps; r++) {
                double t0 = now_us();
                switch (v) {
                case 0: CK(cudaMemcpy(pag, dev, n, cudaMemcpyDeviceToHost)); break;
                case 1: CK(cudaMemcpy(pin, dev, n, cudaMemcpyDeviceToHost)); break;
                case 2:
                    CK(cudaMemcpyAsync(pin, dev, n, cudaMemcpyDeviceToHost, st));
                    while (cudaStreamQuery(st) == cudaErrorNotReady)
                        ;
                    break;
                case 3:
                    copy_flag<<<blocks, 256, 0, st>>>((uint4 *)mapped_dev, (const uint4 *)dev, n / 16, blocks_done,
                                                      flag, ++seq);
                    while (*(volatile unsigned *)flag != seq)
                        ;
                    break;
                case 4:
                    copy_flag<<<blocks, 256, 0, st>>>((uint4 *)mapped_dev, (const uint4 *)dev, n / 16, blocks_done,
                                                      flag, ++seq);
                    while (cudaStreamQuery(st) == cudaErrorNotReady)
                        ;
                    break;
                }
                if (r >= 0)
                    t[r] = now_us() - t0;
            }
            CK(cudaStreamSynchronize(st));
            if (v >= 3 && memcmp(mapped, pin, n) != 0) {
                fprintf(stderr, "kernel copy differs at %zu bytes\n", n);
                return 1;
            }
            qsort(t, (size_t)reps, sizeof *t, cmpd);
            printf("%8zu B  %-34s median %7.2f us  p10 %7.2f  p90 %7.2f  (%.2f GB/s)\n", n, names[v], t[reps / 2],
                   t[reps / 10], t[reps * 9 / 10], n / t[reps / 2] / 1e3);
        }
    }
    return 0;
}
