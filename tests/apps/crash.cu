// nvproxy-only: a program that dies of SIGSEGV after a CUDA call (NVPROXY_CRASH_TRACE prints its frames).
#include "check.h"

int main() {
    int *d;
    CHECK(cudaMalloc(&d, 64));
    printf("crashing\n");
    fflush(stdout);
    *(volatile int *)nullptr = 1;
    return 0;
}
