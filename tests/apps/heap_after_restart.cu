// The C heap after a DMTCP restart: the program computes on the GPU in steps, printing each, and after each step
// it grows its heap through the program break (malloc with no mmap threshold below 64 MiB) and says whether glibc's
// program break is the kernel's.  Where the kernel's break after a restart is the restart program's and lies above
// glibc's, glibc's next sbrk() "succeeds" into DMTCP's guard area after the heap, and the program dies in malloc.
// Built not position-independent (its heap low, as python3's), the program meets that layout.
#include "check.h"
#include <malloc.h>
#include <string.h>
#include <sys/syscall.h>
#include <unistd.h>

__global__ void add(int *p, int n, int k) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) p[i] += k;
}

int main(int argc, char **argv) {
    int steps = argc > 1 ? atoi(argv[1]) : 8, pause_ms = argc > 2 ? atoi(argv[2]) : 0;
    mallopt(M_MMAP_THRESHOLD, 64 << 20);
    const int n = 1 << 16;
    int *d, *h = (int *)malloc(n * sizeof(int));
    CHECK(cudaMalloc(&d, n * sizeof(int)));
    CHECK(cudaMemset(d, 0, n * sizeof(int)));
    for (int s = 0; s < steps; s++) {
        add<<<n / 256, 256>>>(d, n, s + 1);
        CHECK(cudaMemcpy(h, d, n * sizeof(int), cudaMemcpyDeviceToHost));
        size_t big = (size_t)(s + 1) << 20;  // (larger each step: the heap's top must grow)
        char *p = (char *)malloc(big);
        memset(p, s, big);
        long sum = 0;
        for (size_t i = 0; i < big; i += 4096) sum += p[i];
        free(p);
        int same = sbrk(0) == (void *)syscall(SYS_brk, 0);
        printf("step %d: %d, %ld, program break %s\n", s, h[n - 1], sum, same ? "as the kernel's" : "NOT the kernel's");
        fflush(stdout);
        if (pause_ms) usleep(pause_ms * 1000);
    }
    CHECK(cudaFree(d));
    free(h);
    printf("PASSED\n");
    return 0;
}
