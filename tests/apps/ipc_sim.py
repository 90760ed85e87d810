import numpy as np

from nvproxy.sim_kernels import kernel


@kernel("fill")
def fill(ctx, p, n, k):
    n, k = ctx.i32(n), ctx.i32(k)
    ctx.array(p, "i4", n)[:] = np.arange(n, dtype="i4") * k


@kernel("bump")
def bump(ctx, p, n, k):
    n, k = ctx.i32(n), ctx.i32(k)
    a = ctx.array(p, "i4", n)
    a[:] = a * 2 + k
