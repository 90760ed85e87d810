import numpy as np

from nvproxy.sim_kernels import kernel


@kernel("iota")
def iota(ctx, p, n, base):
    n = ctx.i32(n)
    ctx.array(p, "i4", n)[:] = ctx.i32(base) + np.arange(n, dtype=np.int32)
