/* What the probes share: a driver-call check, a clock, a median's comparison. */
#ifndef PROBE_H
#define PROBE_H
#include <cuda.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

#define CK(x)                                                                                                      \
    do {                                                                                                           \
        CUresult r_ = (x);                                                                                         \
        if (r_) {                                                                                                  \
            fprintf(stderr, "%s:%d %s -> %d\n", __FILE__, __LINE__, #x, r_);                                       \
            exit(1);                                                                                               \
        }                                                                                                          \
    } while (0)

static inline double now_us(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec * 1e6 + t.tv_nsec / 1e3;
}

static inline int cmpd(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}
#endif
