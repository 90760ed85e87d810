/* What the probes share: a driver-call check, a clock, a median's comparison, device 0's context. */
#ifndef PROBE_H
#define PROBE_H
#include <cuda.h>
#include "probe_clock.h"

#define CK(x) PROBE_CHECK(CUresult, x, probe_unnamed)

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
