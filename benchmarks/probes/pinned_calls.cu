/* Per-call times of synchronous pinned copies (cudaMallocHost memory), to run natively and through nvproxy:
 * is nvproxy's loss at 4-64 MiB a constant per call, a slower copy, or now and then a slow call?
 * Prints, per size and direction: median, mean, 90th percentile and largest time per call.
 *   nvcc -O2 -cudart shared -o pinned_calls pinned_calls.cu && ./pinned_calls [calls] */
#include <string.h>

#include "probe_rt.h"

int main(int argc, char **argv)
{
    int calls = argc > 1 ? atoi(argv[1]) : 100;
    size_t maxsz = 64u << 20;
    void *host, *dev;
    CK(cudaMallocHost(&host, maxsz));
    CK(cudaMalloc(&dev, maxsz));
    memset(host, 1, maxsz);
    double *t = (double *)malloc(sizeof(double) * calls);
    static const size_t sizes[] = {1u << 20, 4u << 20, 16u << 20, 64u << 20};
    printf("%-4s %-4s %9s %9s %9s %9s  (us per call, %d calls)\n", "MiB", "dir", "median", "mean", "p90", "max",
           calls);
    for (unsigned z = 0; z < sizeof sizes / sizeof *sizes; z++)
        for (int d2h = 0; d2h < 2; d2h++) {
            void *dst = d2h ? host : dev, *src = d2h ? dev : host;
            CK(cudaMemcpy(dst, src, sizes[z], cudaMemcpyDefault));
            double sum = 0;
            for (int i = 0; i < calls; i++) {
                double t0 = now_us();
                CK(cudaMemcpy(dst, src, sizes[z], cudaMemcpyDefault));
                t[i] = now_us() - t0;
                sum += t[i];
            }
            qsort(t, calls, sizeof *t, cmpd);
            printf("%-4zu %-4s %9.1f %9.1f %9.1f %9.1f\n", sizes[z] >> 20, d2h ? "d2h" : "h2d", t[calls / 2],
                   sum / calls, t[calls * 9 / 10], t[calls - 1]);
        }
    return 0;
}
