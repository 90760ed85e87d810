// nvproxy-only (NVPROXY_RECOVER): the first call after the proxy died is a pageable copy on a thread that has
// made one before (its staging buffer and mailbox belong to the dead proxy).  That copy, and what follows, run
// against the new proxy.  Waits for a line on stdin (the test checkpoints, then kills the proxy).
// argv[1]: h2d or d2h (the direction of the first call after the pause); argv[2]: bytes.
#include "check.h"
#include <cstring>
#include <vector>

static void fill(std::vector<unsigned char> &v, unsigned seed) {
    for (size_t i = 0; i < v.size(); i++) v[i] = (unsigned char)(i * 131 + seed);
}

int main(int argc, char **argv) {
    if (argc < 3) return 2;
    bool to_device = !strcmp(argv[1], "h2d");
    size_t n = strtoull(argv[2], NULL, 0);
    std::vector<unsigned char> before(n), after(n), back(n);
    fill(before, 7);
    fill(after, 91);
    unsigned char *d;
    CHECK(cudaMalloc(&d, n));
    CHECK(cudaMemcpy(d, before.data(), n, cudaMemcpyHostToDevice));  // (the thread's staging buffer)
    CHECK(cudaMemcpy(back.data(), d, n, cudaMemcpyDeviceToHost));
    CHECK(cudaDeviceSynchronize());
    printf("ready\n");
    fflush(stdout);
    char line[16];
    if (!fgets(line, sizeof line, stdin)) return 2;
    if (to_device) {
        cudaError_t e = cudaMemcpy(d, after.data(), n, cudaMemcpyHostToDevice);
        printf("first call: %s\n", cudaGetErrorName(e));
        CHECK(cudaMemcpy(back.data(), d, n, cudaMemcpyDeviceToHost));
        printf("device holds the new bytes: %s\n", back == after ? "yes" : "no");
    } else {
        std::fill(back.begin(), back.end(), 0);
        cudaError_t e = cudaMemcpy(back.data(), d, n, cudaMemcpyDeviceToHost);
        printf("first call: %s\n", cudaGetErrorName(e));
        printf("device holds the checkpointed bytes: %s\n", back == before ? "yes" : "no");
    }
    CHECK(cudaMemset(d, 0, n));
    CHECK(cudaDeviceSynchronize());
    printf("later calls: %s\n", cudaGetErrorName(cudaGetLastError()));
    return 0;
}
