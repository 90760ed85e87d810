// Small copies to the device issued back to back, as nvproxy's posted copies are: how long the driver
// takes to issue each, and how many the device finishes per second, from pinned memory by the copy engine (with an
// event recorded after each, as the proxy does, and with a query of an earlier one's event, as the proxy learns
// which are done) and by a copy kernel reading mapped pinned memory; beside the runtime's cudaMemcpy from pageable
// memory.  On the GPU machine: nvcc -O2 -o h2d_pipeline h2d_pipeline.cu
#include "probe_rt.h"
#include <stdint.h>
#include <string.h>

__global__ void copy_in(uint4 *dst, const uint4 *src, size_t n16)
{
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n16; i += (size_t)gridDim.x * blockDim.x)
        dst[i] = src[i];
}

int main(int argc, char **argv)
{
    int reps = argc > 1 ? atoi(argv[1]) : 1000;
    size_t sizes[] = {4096, 8192, 16384, 32768, 65536, 262144};
    size_t maxn = 256 << 10;
    char *dev, *pin, *pag, *mapped, *mapped_dev;
    cudaStream_t st;
    cudaEvent_t ev[32];
    CK(cudaSetDeviceFlags(cudaDeviceMapHost));
    CK(cudaMalloc(&dev, maxn));
    CK(cudaMallocHost(&pin, maxn * 16));
    CK(cudaHostAlloc(&mapped, maxn * 16, cudaHostAllocMapped));
    CK(cudaHostGetDevicePointer((void **)&mapped_dev, mapped, 0));
    pag = (char *)malloc(maxn);
    memset(pag, 1, maxn);
    memset(pin, 2, maxn * 16);
    memset(mapped, 3, maxn * 16);
    CK(cudaStreamCreate(&st));
    for (auto &e : ev)
        CK(cudaEventCreateWithFlags(&e, cudaEventDisableTiming));
    const char *names[] = {"pageable cudaMemcpy (native)", "async from pinned", "async from pinned + event",
                           "kernel from mapped", "+ event, query the last", "+ event, query the 8th last"};
    for (size_t n : sizes) {
        for (int v = 0; v < 6; v++) {
            double issue = 0, total = 0;
            for (int round = 0; round < 2; round++) { // (the first warms up)
                CK(cudaDeviceSynchronize());
                double t0 = now_us();
                for (int r = 0; r < reps; r++) {
                    size_t off = (size_t)(r % 16) * maxn; // (16 places round, as the shim's posted copies)
                    switch (v) {
                    case 0: CK(cudaMemcpy(dev, pag, n, cudaMemcpyHostToDevice)); break;
                    case 1: CK(cudaMemcpyAsync(dev, pin + off, n, cudaMemcpyHostToDevice, st)); break;
                    case 2:
                        CK(cudaMemcpyAsync(dev, pin + off, n, cudaMemcpyHostToDevice, st));
                        CK(cudaEventRecord(ev[r % 32], st));
                        break;
                    case 4:
                    case 5: {
                        int back = v == 4 ? 1 : 8;
                        if (r >= back)
                            (void)cudaEventQuery(ev[(r - back) % 32]); /* (as the proxy learns which are done) */
                        CK(cudaMemcpyAsync(dev, pin + off, n, cudaMemcpyHostToDevice, st));
                        CK(cudaEventRecord(ev[r % 32], st));
                        break;
                    }
                    case 3:
                        copy_in<<<(unsigned)((n / 16 + 255) / 256 < 132 ? (n / 16 + 255) / 256 : 132), 256, 0,
                                  st>>>((uint4 *)dev, (const uint4 *)(mapped_dev + off), n / 16);
                        break;
                    }
                }
                double t1 = now_us();
                CK(cudaDeviceSynchronize());
                issue = (t1 - t0) / reps;
                total = (now_us() - t0) / reps;
            }
            printf("%7zu B  %-30s issue %6.2f us  done %6.2f us per copy  (%.2f GB/s)\n", n, names[v], issue, total,
                   n / total / 1e3);
        }
    }
    return 0;
}
