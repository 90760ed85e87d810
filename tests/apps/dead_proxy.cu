// nvproxy-only: after the proxy dies, every call fails with a clear error
// quickly instead of hanging.  Waits for a line on stdin between the parts.
#include "check.h"
#include <chrono>

int main() {
    int *d;
    CHECK(cudaMalloc(&d, 64));
    printf("ready\n");
    fflush(stdout);
    char line[16];
    if (!fgets(line, sizeof line, stdin)) return 2;
    auto t0 = std::chrono::steady_clock::now();
    cudaError_t e1 = cudaDeviceSynchronize();
    cudaError_t e2 = cudaMalloc(&d, 64);
    double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    printf("after the pause: %s, then %s, within 2 s: %s\n", cudaGetErrorName(e1), cudaGetErrorName(e2),
           s < 2.0 ? "yes" : "no");
    return 0;
}
