/* The probes' clock and a median's comparison. */
#ifndef PROBE_CLOCK_H
#define PROBE_CLOCK_H
#include <time.h>

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
