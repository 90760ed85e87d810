// Calls that wait, per call (median, 10th and 90th percentiles of REPS after 200 unmeasured): a synchronous copy
// between pinned memory and the device of SIZE bytes (d2h, h2d), an empty launch then cudaStreamSynchronize(0)
// (sync), cudaEventRecord then cudaEventSynchronize (event).  Built with -DWITH_PRINTF the module also holds a
// kernel that may print (launched once, silent), which makes nvproxy's waits the driver's own (fastpath.c).
// On the GPU machine: nvcc -O2 -cudart shared -o sync_calls sync_calls.cu && ./sync_calls 4096 d2h 3000
#include "probe_rt.h"
#include <string.h>

__global__ void empty() {}
#ifdef WITH_PRINTF
__global__ void maybe(int say)
{
    if (say)
        printf("said\n");
}
#endif

int main(int argc, char **argv)
{
    if (argc < 4)
        return fprintf(stderr, "usage: %s SIZE d2h|h2d|sync|event REPS\n", argv[0]), 2;
    size_t n = strtoul(argv[1], NULL, 0);
    const char *mode = argv[2];
    int reps = atoi(argv[3]);
    void *h, *d;
    cudaEvent_t e;
    CK(cudaMallocHost(&h, n ? n : 1));
    CK(cudaMalloc(&d, n ? n : 1));
    CK(cudaEventCreateWithFlags(&e, cudaEventDisableTiming));
#ifdef WITH_PRINTF
    maybe<<<1, 1>>>(0);
#endif
    empty<<<1, 1>>>();
    CK(cudaDeviceSynchronize());
    double *t = (double *)malloc(sizeof *t * reps);
    for (int i = -200; i < reps; i++) {
        double a = now_us();
        if (!strcmp(mode, "d2h")) {
            CK(cudaMemcpy(h, d, n, cudaMemcpyDeviceToHost));
        } else if (!strcmp(mode, "h2d")) {
            CK(cudaMemcpy(d, h, n, cudaMemcpyHostToDevice));
        } else if (!strcmp(mode, "sync")) {
            empty<<<1, 1>>>();
            CK(cudaStreamSynchronize(0));
        } else {
            CK(cudaEventRecord(e, 0));
            CK(cudaEventSynchronize(e));
        }
        if (i >= 0)
            t[i] = now_us() - a;
    }
    qsort(t, reps, sizeof *t, cmpd);
    printf("%-5s %8zu median %6.2f us p10 %6.2f p90 %6.2f\n", mode, n, t[reps / 2], t[reps / 10], t[reps * 9 / 10]);
    return 0;
}
