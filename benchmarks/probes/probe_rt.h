/* What the runtime-API probes share: a runtime-call check, a clock, a median's comparison. */
#ifndef PROBE_RT_H
#define PROBE_RT_H
#include <cuda_runtime.h>
#include "probe_clock.h"

#define CK(x) PROBE_CHECK(cudaError_t, x, cudaGetErrorString)

#endif
