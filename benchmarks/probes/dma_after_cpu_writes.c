/* Does a DMA from pinned memory that the CPU has just written (its cache lines dirty) run slower, and what avoids
 * it (streaming stores)?  On the GPU machine:
 *   gcc -O2 -mavx2 -mclflushopt -mclwb -I/usr/local/cuda/include -o dma dma_after_cpu_writes.c -lcuda */
#define _GNU_SOURCE
#include "probe.h"
#include "../../native/shim/stream_copy.h"
#include <immintrin.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <time.h>
#include <unistd.h>

static void nt_copy(void *dst, const void *src, size_t n)
{
    __m256i *d = dst;
    const __m256i *s = src;
    for (size_t i = 0; i < n / 32; i += 4) {
        __m256i a = _mm256_loadu_si256(s + i), b = _mm256_loadu_si256(s + i + 1);
        __m256i c = _mm256_loadu_si256(s + i + 2), e = _mm256_loadu_si256(s + i + 3);
        _mm256_stream_si256(d + i, a);
        _mm256_stream_si256(d + i + 1, b);
        _mm256_stream_si256(d + i + 2, c);
        _mm256_stream_si256(d + i + 3, e);
    }
    _mm_sfence();
}

static void copy_flush(void *dst, const void *src, size_t n, int wb)
{
    memcpy(dst, src, n);
    for (size_t i = 0; i < n; i += 64) {
        if (wb)
            _mm_clwb((char *)dst + i);
        else
            _mm_clflushopt((char *)dst + i);
    }
    _mm_sfence();
}

int main(void)
{
    CUstream st = probe_start();
    size_t max = 4 << 20;
    int fd = memfd_create("p", 0);
    if (ftruncate(fd, (off_t)max))
        return 1;
    char *pin = mmap(NULL, max, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_POPULATE, fd, 0);
    memset(pin, 1, max);
    CK(cuMemHostRegister(pin, max, CU_MEMHOSTREGISTER_PORTABLE | CU_MEMHOSTREGISTER_DEVICEMAP));
    char *src = aligned_alloc(4096, 64 << 20);
    memset(src, 2, 64 << 20);
    CUdeviceptr d;
    CK(cuMemAlloc(&d, max));
    size_t sizes[] = {256 << 10, 1 << 20, 4 << 20};
    const char *names[] = {"clean", "memcpy then DMA", "NT avx2 copy then DMA", "NT sse2 copy then DMA",
                           "memcpy+clflushopt then DMA", "memcpy+clwb then DMA"};
    for (int si = 0; si < 3; si++) {
        size_t n = sizes[si];
        double cp[6][41], dm[6][41];
        for (int r = 0; r < 41; r++)
            for (int v = 0; v < 6; v++) {
                const char *s = src + (size_t)(r % 8) * (8 << 20); /* (a source not in cache) */
                double t0 = now_us();
                if (v == 1)
                    memcpy(pin, s, n);
                else if (v == 2)
                    nt_copy(pin, s, n);
                else if (v == 3)
                    nvp_stream_copy(pin, s, n); /* (the shim's own loop) */
                else if (v >= 4)
                    copy_flush(pin, s, n, v == 5);
                double t1 = now_us();
                CK(cuMemcpyHtoDAsync(d, pin, n, st));
                while (cuStreamQuery(st) == CUDA_ERROR_NOT_READY)
                    ;
                double t2 = now_us();
                cp[v][r] = t1 - t0;
                dm[v][r] = t2 - t1;
            }
        for (int v = 0; v < 6; v++) {
            qsort(cp[v], 41, sizeof(double), cmpd);
            qsort(dm[v], 41, sizeof(double), cmpd);
            printf("%5zu KiB %-34s host copy %7.1f us (%5.1f GB/s)  DMA %7.1f us (%5.1f GB/s)\n", n >> 10, names[v],
                   cp[v][20], v ? n / cp[v][20] / 1e3 : 0.0, dm[v][20], n / dm[v][20] / 1e3);
        }
    }
    /* the same the other way: DMA into pinned memory, then the CPU reads it out (regular loads) */
    for (int si = 0; si < 3; si++) {
        size_t n = sizes[si];
        double cp[41], dm[41];
        for (int r = 0; r < 41; r++) {
            double t0 = now_us();
            CK(cuMemcpyDtoHAsync(pin, d, n, st));
            while (cuStreamQuery(st) == CUDA_ERROR_NOT_READY)
                ;
            double t1 = now_us();
            memcpy(src + (size_t)(r % 8) * (8 << 20), pin, n);
            cp[r] = now_us() - t1;
            dm[r] = t1 - t0;
        }
        qsort(cp, 41, sizeof(double), cmpd);
        qsort(dm, 41, sizeof(double), cmpd);
        printf("%5zu KiB D2H DMA %7.1f us (%5.1f GB/s), then memcpy out %7.1f us (%5.1f GB/s)\n", n >> 10, dm[20],
               n / dm[20] / 1e3, cp[20], n / cp[20] / 1e3);
    }
    return 0;
}
