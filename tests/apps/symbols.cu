// Module variables: __device__ and __constant__ symbols, copies to and from
// them, their addresses and sizes, and kernels that use them.
#include "check.h"

__device__ int counter[4];
__constant__ float coeff[8];
__device__ double table[1000];

__global__ void apply(float *out, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) out[i] = coeff[i % 8] * (float)i;
    if (i < 4) counter[i] += i + 1;
}

__global__ void sum_table(double *out) {
    double s = 0;
    for (int i = 0; i < 1000; i++) s += table[i];
    *out = s;
}

int main() {
    float c[8] = {0.5f, 1, 2, 3, 4, 5, 6, 7};
    CHECK(cudaMemcpyToSymbol(coeff, c, sizeof c));
    int zero[4] = {0, 0, 0, 0};
    CHECK(cudaMemcpyToSymbol(counter, zero, sizeof zero));
    double t[1000];
    for (int i = 0; i < 1000; i++) t[i] = i * 0.5;
    CHECK(cudaMemcpyToSymbol(table, t + 500, 500 * sizeof(double), 500 * sizeof(double)));
    CHECK(cudaMemcpyToSymbol(table, t, 500 * sizeof(double)));
    float *out, h[64];
    CHECK(cudaMalloc(&out, sizeof h));
    for (int r = 0; r < 3; r++) apply<<<1, 64>>>(out, 64);
    CHECK(cudaMemcpy(h, out, sizeof h, cudaMemcpyDeviceToHost));
    int cnt[4];
    CHECK(cudaMemcpyFromSymbol(cnt, counter, sizeof cnt));
    size_t size;
    CHECK(cudaGetSymbolSize(&size, table));
    double *tp, s;
    CHECK(cudaGetSymbolAddress((void **)&tp, table));
    double *ds;
    CHECK(cudaMalloc(&ds, sizeof(double)));
    sum_table<<<1, 1>>>(ds);
    CHECK(cudaMemcpy(&s, ds, sizeof s, cudaMemcpyDeviceToHost));
    double direct;
    CHECK(cudaMemcpy(&direct, tp + 999, sizeof direct, cudaMemcpyDeviceToHost));
    printf("out[9]=%.1f out[63]=%.1f counter=%d %d %d %d\n", h[9], h[63], cnt[0], cnt[1], cnt[2], cnt[3]);
    printf("table size=%zu sum=%.1f table[999] via address=%.1f\n", size, s, direct);
    printf("copy past the end: %s\n", cudaGetErrorName(cudaMemcpyToSymbol(coeff, c, sizeof c, 4)));
    cudaGetLastError();
    printf("Test PASSED\n");
    return 0;
}
