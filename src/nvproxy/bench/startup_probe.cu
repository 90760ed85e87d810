// Start-up probe (bench/startup.py): when main began and when its first CUDA call (cudaFree(0): the context made)
// returned, on CLOCK_MONOTONIC, which the harness that started it shares.
#include <cuda_runtime.h>
#include <stdio.h>
#include <time.h>

static double now(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + (double)t.tv_nsec * 1e-9;
}

int main(void)
{
    double entered = now();
    cudaError_t err = cudaFree(0);
    double done = now();
    printf("{\"main\": %.6f, \"done\": %.6f, \"error\": %d}\n", entered, done, (int)err);
    return err == cudaSuccess ? 0 : 1;
}
