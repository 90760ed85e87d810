/* The probes' clock, a median's comparison, and the check of a CUDA call's result (any API: its type and how to
 * name a code are the arguments). */
#ifndef PROBE_CLOCK_H
#define PROBE_CLOCK_H
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

#define PROBE_CHECK(type, x, name_of)                                                                              \
    do {                                                                                                           \
        type r_ = (x);                                                                                             \
        if (r_) {                                                                                                  \
            fprintf(stderr, "%s:%d %s -> %d %s\n", __FILE__, __LINE__, #x, (int)r_, name_of(r_));                 \
            exit(1);                                                                                               \
        }                                                                                                          \
    } while (0)

static inline const char *probe_unnamed(int code)
{
    (void)code;
    return "";
}

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
