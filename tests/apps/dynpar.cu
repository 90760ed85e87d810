// Dynamic parallelism (-rdc=true): a parent kernel launches child kernels from
// the device.  GPU only (the sim backend runs kernels written in Python).
#include "check.h"

__global__ void child(int *p, int base, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) p[base + i] = (base + i) * 3 + 1;
}

__global__ void parent(int *p, int chunks, int per) {
    int c = blockIdx.x * blockDim.x + threadIdx.x;
    if (c < chunks) child<<<(per + 127) / 128, 128>>>(p, c * per, per);
}

int main() {
    const int chunks = 64, per = 1000, n = chunks * per;
    int *p;
    CHECK(cudaMalloc(&p, n * sizeof(int)));
    CHECK(cudaMemset(p, 0, n * sizeof(int)));
    parent<<<1, chunks>>>(p, chunks, per);
    CHECK(cudaGetLastError());
    CHECK(cudaDeviceSynchronize());
    int *h = (int *)malloc(n * sizeof(int));
    CHECK(cudaMemcpy(h, p, n * sizeof(int), cudaMemcpyDeviceToHost));
    int bad = 0;
    for (int i = 0; i < n; i++) bad += h[i] != i * 3 + 1;
    printf("dynamic parallelism: %d wrong of %d, checksum %016llx\n", bad, n, checksum(h, n * sizeof(int)));
    printf("%s\n", bad ? "Test FAILED" : "Test PASSED");
    return bad != 0;
}
