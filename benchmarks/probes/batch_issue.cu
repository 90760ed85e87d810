/* Would issuing small copies to the device in batches cost the driver less per copy?  nvproxy's posted copies
 * are bounded by the driver's issue of each (2.9-5.7 us at 4-16 KiB: issue_cost.cu), one cuMemcpyAsync and one
 * cuEventRecord a copy.  Compared, per copy (from cudaMallocHost memory to cudaMalloc memory, an idle
 * non-blocking stream, each batch issued alone): N cudaMemcpyAsync calls against one cudaMemcpyBatchAsync of N
 * copies, its sources read in stream order or during the call (cudaMemcpySrcAccessOrderDuringApiCall: the
 * driver may copy the bytes at once, and the source is free when the call returns); then the time until done.
 *   nvcc -O2 -o batch_issue batch_issue.cu && ./batch_issue [reps] */
#include <string.h>

#include "probe_rt.h"

#define BYTES (4u << 20)

int main(int argc, char **argv)
{
    int reps = argc > 1 ? atoi(argv[1]) : 200;
    CK(cudaFree(0));
    char *src, *dst;
    CK(cudaMallocHost((void **)&src, BYTES));
    memset(src, 1, BYTES);
    CK(cudaMalloc((void **)&dst, BYTES));
    cudaStream_t st;
    CK(cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking));
    double *t = (double *)malloc(sizeof(double) * reps), *u = (double *)malloc(sizeof(double) * reps);
    static const size_t sizes[] = {4096, 16384, 65536};
    static const int counts[] = {1, 2, 4, 8};
    static const char *how_name[3] = {"cudaMemcpyAsync x N", "batch, stream order", "batch, during call"};
    printf("%-22s %5s %3s %9s %9s %9s  (us per copy to issue: median, p90; us until the batch is done)\n", "how",
           "KiB", "N", "med", "p90", "done");
    for (int how = 0; how < 3; how++)
        for (unsigned z = 0; z < 3; z++)
            for (unsigned c = 0; c < 4; c++) {
                int n = counts[c];
                void *d[8], *s[8];
                size_t len[8], idx = 0;
                for (int i = 0; i < n; i++) {
                    d[i] = dst + (size_t)i * sizes[z];
                    s[i] = src + (size_t)i * sizes[z];
                    len[i] = sizes[z];
                }
                cudaMemcpyAttributes a;
                memset(&a, 0, sizeof a);
                a.srcAccessOrder = how == 2 ? cudaMemcpySrcAccessOrderDuringApiCall : cudaMemcpySrcAccessOrderStream;
                a.srcLocHint.type = cudaMemLocationTypeHost;
                a.dstLocHint.type = cudaMemLocationTypeDevice;
                for (int r = -5; r < reps; r++) {
                    CK(cudaStreamSynchronize(st));
                    double t0 = now_us();
                    if (how == 0)
                        for (int i = 0; i < n; i++)
                            CK(cudaMemcpyAsync(d[i], s[i], len[i], cudaMemcpyHostToDevice, st));
                    else
                        CK(cudaMemcpyBatchAsync(d, s, len, (size_t)n, &a, &idx, 1, st));
                    double t1 = now_us();
                    CK(cudaStreamSynchronize(st));
                    double t2 = now_us();
                    if (r >= 0) {
                        t[r] = (t1 - t0) / n;
                        u[r] = t2 - t0;
                    }
                }
                qsort(t, reps, sizeof *t, cmpd);
                qsort(u, reps, sizeof *u, cmpd);
                printf("%-22s %5zu %3d %9.2f %9.2f %9.2f\n", how_name[how], sizes[z] >> 10, n, t[reps / 2],
                       t[reps * 9 / 10], u[reps / 2]);
            }
    return 0;
}
