import numpy as np

from nvproxy.sim_kernels import kernel


@kernel("stamp")
def stamp(ctx, p, n, tag):
    n = ctx.i32(n)
    ctx.array(p, "u4", n)[:] = np.uint32(tag) * np.uint32(2654435761) + np.arange(n, dtype=np.uint32)
