/* What the probes share: a driver-call check, a clock, a median's comparison, device 0's context. */
#ifndef PROBE_H
#define PROBE_H
#include <cuda.h>
#include <stdio.h>
#include <stdlib.h>
#include "probe_clock.h"

#define CK(x)                                                                                                      \
    do {                                                                                                           \
        CUresult r_ = (x);                                                                                         \
        if (r_) {                                                                                                  \
            fprintf(stderr, "%s:%d %s -> %d\n", __FILE__, __LINE__, #x, r_);                                       \
            exit(1);                                                                                               \
        }                                                                                                          \
    } while (0)

/* Device 0's primary context, made current, and a stream on it. */
static inline CUstream probe_start(void)
{
    CUdevice dev;
    CUcontext ctx;
    CUstream st;
    CK(cuInit(0));
    CK(cuDeviceGet(&dev, 0));
    CK(cuDevicePrimaryCtxRetain(&ctx, dev));
    CK(cuCtxSetCurrent(ctx));
    CK(cuStreamCreate(&st, CU_STREAM_DEFAULT));
    return st;
}
#endif
