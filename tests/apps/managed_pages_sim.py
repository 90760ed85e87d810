import numpy as np

from nvproxy.sim_kernels import kernel


@kernel("bump")
def bump(ctx, p, n, k):
    n = ctx.i32(n)
    a = ctx.array(p, "u4", n)
    with np.errstate(over="ignore"):
        a[:] = a * np.uint32(3) + np.uint32(k & 0xFFFFFFFF) + np.arange(n, dtype=np.uint32)


@kernel("total")
def total(ctx, p, n, out):
    n = ctx.i32(n)
    with np.errstate(over="ignore"):
        ctx.array(out, "u8", 1)[0] += ctx.array(p, "u4", n).sum(dtype=np.uint64)
