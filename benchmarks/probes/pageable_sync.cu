// What the runtime's own pageable cudaMemcpy waits for: after a kernel on the legacy, a blocking or
// a non-blocking stream, and how long back-to-back copies take (and whether the DMA had ended when one returned).
// Native only.  On the GPU machine: nvcc -cudart shared -o pageable_sync pageable_sync.cu && ./pageable_sync
#include <cstdio>
#include <cstdlib>
#include <chrono>
#include <cuda_runtime.h>
__global__ void spin(long long cycles) { long long t0 = clock64(); while (clock64() - t0 < cycles) {} }
static double now() { return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count(); }
int main() {
    char *d; cudaMalloc(&d, 64 << 20);
    char *h = (char *)malloc(64 << 20);
    for (int i = 0; i < (64 << 20); i++) h[i] = (char)i;
    cudaStream_t blocking; cudaStreamCreate(&blocking);
    cudaStream_t nb; cudaStreamCreateWithFlags(&nb, cudaStreamNonBlocking);
    for (int w = 0; w < 10; w++) cudaMemcpy(d, h, 4096, cudaMemcpyHostToDevice);
    size_t sizes[] = {4096, 65536, 262144, 1 << 20, 4 << 20};
    for (size_t n : sizes) {
        spin<<<1, 1>>>(40000000LL);
        double t = now(); cudaMemcpy(d, h, n, cudaMemcpyHostToDevice); double a = now() - t;
        cudaDeviceSynchronize(); double b = now() - t;
        spin<<<1, 1, 0, blocking>>>(40000000LL);
        t = now(); cudaMemcpy(d, h, n, cudaMemcpyHostToDevice); double c = now() - t;
        cudaDeviceSynchronize();
        spin<<<1, 1, 0, nb>>>(40000000LL);
        t = now(); cudaMemcpy(d, h, n, cudaMemcpyHostToDevice); double e = now() - t;
        cudaDeviceSynchronize();
        // idle: back to back
        int reps = 200; t = now();
        for (int r = 0; r < reps; r++) cudaMemcpy(d, h, n, cudaMemcpyHostToDevice);
        double f = (now() - t) / reps;
        t = now(); cudaDeviceSynchronize(); double g = now() - t;
        t = now();
        for (int r = 0; r < reps; r++) cudaMemcpy(h, d, n, cudaMemcpyDeviceToHost);
        double k = (now() - t) / reps;
        printf("n=%zu after legacy-stream kernel: memcpy returned %.3f ms (all done %.3f ms); after blocking-stream "
               "kernel %.3f ms; after non-blocking-stream kernel %.3f ms; idle back-to-back H2D %.2f us (sync after %.1f us), D2H %.2f us\n",
               n, a * 1e3, b * 1e3, c * 1e3, e * 1e3, f * 1e6, g * 1e6, k * 1e6);
    }
    printf("err %s\n", cudaGetErrorString(cudaGetLastError()));
}
