import numpy as np

from nvproxy.sim_kernels import kernel


@kernel("scale")
def scale(ctx, p, n, k):
    n, k = ctx.i32(n), ctx.i32(k)
    a = ctx.array(p, "i4", n)
    with np.errstate(over="ignore"):
        a[:] = a * np.int32(k) + np.int32(1)


@kernel("add")
def add(ctx, dst, src, n):
    n = ctx.i32(n)
    d = ctx.array(dst, "i4", n)
    with np.errstate(over="ignore"):
        d += ctx.array(src, "i4", n)
