import numpy as np

from nvproxy.sim_kernels import kernel


@kernel("fold")
def fold(ctx, acc, n, src, m, work):
    n, m = ctx.i32(n), ctx.i32(m)
    a = ctx.array(acc, "u4", n)
    s = np.resize(ctx.array(src, "u4", m), n)
    with np.errstate(over="ignore"):
        for _ in range(ctx.i32(work)):
            a[:] = a * np.uint32(31) + s


@kernel("bump")
def bump(ctx, acc, n, k, work):
    a = ctx.array(acc, "u4", ctx.i32(n))
    with np.errstate(over="ignore"):
        for _ in range(ctx.i32(work)):
            a[:] = a * np.uint32(3) + np.uint32(k)
