// Kernel printf reaches the application's stdout, in order with host output,
// after every kind of wait (the last one just before the program ends);
// a failed device assert is a sticky cudaErrorAssert.  argv[1] == "assert"
// runs the second part.
#include "check.h"
#include <cassert>
#include <cstring>

__global__ void hello(int step) {
    if (threadIdx.x < 3) printf("device step %d thread %d\n", step, threadIdx.x);
}

__global__ void check_positive(const int *p) {
    assert(p[threadIdx.x] > 0);
}

int main(int argc, char **argv) {
    if (argc > 1 && !strcmp(argv[1], "assert")) {
        int *d, h[32];
        for (int i = 0; i < 32; i++) h[i] = i == 5 ? -1 : 1;
        CHECK(cudaMalloc(&d, sizeof h));
        CHECK(cudaMemcpy(d, h, sizeof h, cudaMemcpyHostToDevice));
        check_positive<<<1, 32>>>(d);
        cudaError_t e = cudaDeviceSynchronize();
        printf("sync after assert: %s\n", cudaGetErrorName(e));
        printf("sticky, later call: %s\n", cudaGetErrorName(cudaMemcpy(h, d, sizeof h, cudaMemcpyDeviceToHost)));
        printf("last error: %s\n", cudaGetErrorName(cudaGetLastError()));
        printf("still sticky: %s\n", cudaGetErrorName(cudaGetLastError()));
        return 0;
    }
    for (int step = 0; step < 3; step++) {
        printf("host before step %d\n", step);
        hello<<<1, 32>>>(step);
        CHECK(cudaDeviceSynchronize());
        printf("host after step %d\n", step);
    }
    // each way of waiting that natively makes the driver write the text
    cudaStream_t s;
    cudaEvent_t e;
    int *d, *pinned, pageable[4];
    CHECK(cudaStreamCreate(&s));
    CHECK(cudaEventCreate(&e));
    CHECK(cudaMalloc(&d, sizeof pageable));
    CHECK(cudaMallocHost(&pinned, sizeof pageable));
    hello<<<1, 32, 0, s>>>(3);
    CHECK(cudaStreamSynchronize(s));
    printf("host after a created stream's sync\n");
    hello<<<1, 32, 0, s>>>(4);
    CHECK(cudaEventRecord(e, s));
    CHECK(cudaEventSynchronize(e));
    printf("host after an event's sync\n");
    hello<<<1, 32>>>(5);
    CHECK(cudaMemcpy(pinned, d, sizeof pageable, cudaMemcpyDeviceToHost));
    printf("host after a copy to pinned memory\n");
    hello<<<1, 32>>>(6);
    CHECK(cudaMemcpy(pageable, d, sizeof pageable, cudaMemcpyDeviceToHost));
    printf("host after a copy to pageable memory\n");
    hello<<<1, 32>>>(7);
    CHECK(cudaMemcpy(pageable, d, sizeof pageable, cudaMemcpyDeviceToHost));
    printf("Test PASSED\n");
    return 0;
}
