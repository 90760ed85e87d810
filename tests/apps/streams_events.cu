// Streams (flags, priorities, per-stream order, cross-stream waits through
// events, the legacy default stream's implicit sync) and events (query, sync,
// elapsed time).
#include "check.h"

__global__ void addk(int *p, int n, int k) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) p[i] += k;
}
__global__ void mulk(int *p, int n, int k) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) p[i] *= k;
}

int main() {
    const int n = 1 << 16, S = 4;
    int *d[S], *h;
    cudaStream_t st[S];
    CHECK(cudaMallocHost(&h, S * n * sizeof(int)));
    int least, greatest;
    CHECK(cudaDeviceGetStreamPriorityRange(&least, &greatest));
    printf("priority range ordered: %s\n", greatest <= least ? "yes" : "no");
    for (int i = 0; i < S; i++) {
        CHECK(cudaMalloc(&d[i], n * sizeof(int)));
        if (i == 0) CHECK(cudaStreamCreate(&st[i]));
        else if (i == 1) CHECK(cudaStreamCreateWithFlags(&st[i], cudaStreamNonBlocking));
        else CHECK(cudaStreamCreateWithPriority(&st[i], cudaStreamDefault, greatest - 5));
    }
    unsigned flags;
    int prio;
    CHECK(cudaStreamGetFlags(st[1], &flags));
    CHECK(cudaStreamGetPriority(st[2], &prio));
    printf("stream flags=%u priority clamped=%s\n", flags, prio == greatest ? "yes" : "no");

    // per-stream order: (x + i) * 3 + 1 in each stream
    for (int i = 0; i < S; i++) {
        CHECK(cudaMemsetAsync(d[i], 0, n * sizeof(int), st[i]));
        addk<<<n / 256, 256, 0, st[i]>>>(d[i], n, i);
        mulk<<<n / 256, 256, 0, st[i]>>>(d[i], n, 3);
        addk<<<n / 256, 256, 0, st[i]>>>(d[i], n, 1);
        CHECK(cudaMemcpyAsync(h + i * n, d[i], n * sizeof(int), cudaMemcpyDeviceToHost, st[i]));
    }
    for (int i = 0; i < S; i++) CHECK(cudaStreamSynchronize(st[i]));
    for (int i = 0; i < S; i++) printf("stream %d: h[0]=%d h[n-1]=%d\n", i, h[i * n], h[i * n + n - 1]);

    // stream 1 waits for stream 0 through an event
    cudaEvent_t ev, t0, t1;
    CHECK(cudaEventCreateWithFlags(&ev, cudaEventDisableTiming));
    CHECK(cudaEventCreate(&t0));
    CHECK(cudaEventCreate(&t1));
    CHECK(cudaEventRecord(t0, st[0]));
    mulk<<<n / 256, 256, 0, st[0]>>>(d[0], n, 10);
    CHECK(cudaEventRecord(ev, st[0]));
    CHECK(cudaStreamWaitEvent(st[1], ev, 0));
    CHECK(cudaMemcpyAsync(d[1], d[0], n * sizeof(int), cudaMemcpyDeviceToDevice, st[1]));
    CHECK(cudaMemcpyAsync(h, d[1], n * sizeof(int), cudaMemcpyDeviceToHost, st[1]));
    CHECK(cudaEventRecord(t1, st[1]));
    CHECK(cudaEventSynchronize(t1));
    printf("event query after sync: %s\n", cudaGetErrorName(cudaEventQuery(t1)));
    printf("cross-stream: h[5]=%d\n", h[5]);
    float ms = -1;
    CHECK(cudaEventElapsedTime(&ms, t0, t1));
    printf("elapsed time non-negative: %s\n", ms >= 0 ? "yes" : "no");
    printf("elapsed on timing-disabled event: %s\n", cudaGetErrorName(cudaEventElapsedTime(&ms, ev, t1)));
    cudaGetLastError();

    // legacy default stream: work in a blocking stream waits for it, and it for them
    addk<<<n / 256, 256>>>(d[2], n, 100);
    addk<<<n / 256, 256, 0, st[2]>>>(d[2], n, 1000);
    CHECK(cudaMemcpy(h, d[2], n * sizeof(int), cudaMemcpyDeviceToHost));
    printf("legacy stream order: h[0]=%d\n", h[0]);
    printf("stream query idle: %s\n", cudaGetErrorName(cudaStreamQuery(st[2])));

    CHECK(cudaStreamSynchronize(cudaStreamPerThread));
    for (int i = 0; i < S; i++) { CHECK(cudaStreamDestroy(st[i])); CHECK(cudaFree(d[i])); }
    CHECK(cudaEventDestroy(ev)); CHECK(cudaEventDestroy(t0)); CHECK(cudaEventDestroy(t1));
    CHECK(cudaFreeHost(h));
    printf("Test PASSED\n");
    return 0;
}
