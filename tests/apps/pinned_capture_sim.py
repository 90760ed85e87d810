import numpy as np

from nvproxy.sim_kernels import kernel


@kernel("fill")
def fill(ctx, p, n, seed, cycles):
    n = int(n)
    ctx.array(p, "u1", n)[:] = ((np.arange(n, dtype=np.uint64) * 131 + int(seed)) & 0xFF).astype(np.uint8)
