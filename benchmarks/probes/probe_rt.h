/* What the runtime-API probes share: a runtime-call check, a clock, a median's comparison. */
#ifndef PROBE_RT_H
#define PROBE_RT_H
#include <cuda_runtime.h>
#include <stdio.h>
#include <stdlib.h>
#include "probe_clock.h"

#define CK(x)                                                                                                      \
    do {                                                                                                           \
        cudaError_t r_ = (x);                                                                                      \
        if (r_) {                                                                                                  \
            fprintf(stderr, "%s:%d %s -> %s\n", __FILE__, __LINE__, #x, cudaGetErrorString(r_));                  \
            exit(1);                                                                                               \
        }                                                                                                          \
    } while (0)

#endif
