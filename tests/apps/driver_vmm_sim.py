import numpy as np

from nvproxy.sim_kernels import kernel


@kernel("vmm_mix")
def vmm_mix(ctx, a, n, k):
    n = int(n)
    v = ctx.array(a, "u4", n)
    i = np.arange(n, dtype=np.uint64).astype(np.uint32)
    with np.errstate(over="ignore"):
        v[:] = v * np.uint32(2654435761) + i + np.uint32(k)
