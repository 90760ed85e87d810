/* The host's memory bandwidth on 1-16 threads: reading (a sum), writing (memset) and copying (memcpy), over
 * buffers far larger than the caches.  A restore from an image file moves every byte three times through host
 * memory (read out of the page cache, written into a pinned slot, read by the DMA): this bounds it.
 *   cc -O2 -pthread -o host_bandwidth host_bandwidth.c && ./host_bandwidth [MiB] */
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "probe_clock.h"

static size_t total;
static char *src, *dst;
static int nthreads, what; /* 0 read, 1 write, 2 copy */
static pthread_barrier_t start;
static volatile uint64_t sink;

static void *worker(void *arg)
{
    size_t k = (size_t)(uintptr_t)arg, share = total / (size_t)nthreads, at = k * share;
    pthread_barrier_wait(&start);
    if (what == 0) {
        const uint64_t *p = (const uint64_t *)(src + at);
        uint64_t s0 = 0, s1 = 0, s2 = 0, s3 = 0;
        for (size_t i = 0; i < share / 8; i += 4) {
            s0 += p[i];
            s1 += p[i + 1];
            s2 += p[i + 2];
            s3 += p[i + 3];
        }
        sink += s0 + s1 + s2 + s3;
    } else if (what == 1) {
        memset(dst + at, (int)k, share);
    } else {
        memcpy(dst + at, src + at, share);
    }
    return NULL;
}

static double run(int threads, int kind)
{
    pthread_t t[64];
    nthreads = threads;
    what = kind;
    pthread_barrier_init(&start, NULL, (unsigned)threads + 1);
    for (int i = 0; i < threads; i++)
        pthread_create(&t[i], NULL, worker, (void *)(uintptr_t)i);
    double t0 = now_us();
    pthread_barrier_wait(&start);
    for (int i = 0; i < threads; i++)
        pthread_join(t[i], NULL);
    double us = now_us() - t0;
    pthread_barrier_destroy(&start);
    return (double)total / us / 1e3;
}

int main(int argc, char **argv)
{
    total = (size_t)(argc > 1 ? atoi(argv[1]) : 2048) << 20;
    src = malloc(total);
    dst = malloc(total);
    memset(src, 1, total);
    memset(dst, 2, total);
    printf("threads  read GB/s  write GB/s  copy GB/s (bytes copied; memory traffic is twice that or more)\n");
    for (int threads = 1; threads <= 16; threads *= 2) {
        double best[3] = {0, 0, 0};
        for (int rep = 0; rep < 3; rep++)
            for (int kind = 0; kind < 3; kind++) {
                double g = run(threads, kind);
                best[kind] = g > best[kind] ? g : best[kind];
            }
        printf("%7d %10.1f %11.1f %10.1f\n", threads, best[0], best[1], best[2]);
    }
    return 0;
}
