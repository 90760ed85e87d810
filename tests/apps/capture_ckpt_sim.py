import numpy as np

from nvproxy.sim_kernels import kernel


@kernel("fill")
def fill(ctx, p, n, v):
    n = ctx.i32(n)
    ctx.array(p, "i4", n)[:] = ctx.i32(v) + np.arange(n, dtype=np.int32)


@kernel("slow_add")
def slow_add(ctx, p, n, v, spins):
    ctx.array(p, "i4", ctx.i32(n))[:] += np.int32(ctx.i32(v))


@kernel("mix")
def mix(ctx, dst, src, n, k):
    n = ctx.i32(n)
    d = ctx.array(dst, "i4", n)
    s = ctx.array(src, "i4", n).astype(np.int64)
    d[:] = (d.astype(np.int64) * 3 + s + ctx.i32(k)) % 1000003
