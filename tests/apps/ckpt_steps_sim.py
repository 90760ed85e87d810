import numpy as np

from nvproxy.sim_kernels import kernel


@kernel("step_small")
def step_small(ctx, p, n, k):
    a = ctx.array(p, "u4", ctx.i32(n))
    with np.errstate(over="ignore"):
        a[:] = a * np.uint32(1664525) + np.uint32(1013904223) + np.uint32(k)
    c = ctx.array(ctx.symbol("dev_counter"), "u8", 1)
    c[0] += np.uint64(k)


@kernel("step_large")
def step_large(ctx, p, n, small, m):
    n, m = ctx.i32(n), ctx.i32(m)
    a = ctx.array(p, "u4", n)
    s = ctx.array(small, "u4", m)
    i = np.arange(n, dtype=np.uint32)
    with np.errstate(over="ignore"):
        a ^= s[i % m] + i


@kernel("finish")
def finish(ctx, p):
    a = ctx.array(p, "u4", 1)
    with np.errstate(over="ignore"):
        a[0] += np.uint32(1)
