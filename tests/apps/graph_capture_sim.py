import numpy as np

from nvproxy.sim_kernels import kernel


@kernel("fill")
def fill(ctx, p, n, v):
    count = min(ctx.i32(n), ctx.threads)
    out = ctx.array(p, "i4", count)
    out[:] = ctx.i32(v) + np.arange(count, dtype=np.int32)


@kernel("accumulate")
def accumulate(ctx, dst, src, n):
    count = ctx.i32(n)
    ctx.array(dst, "i4", count)[:] += ctx.array(src, "i4", count)


@kernel("step_down")
def step_down(ctx, counter, steps, h):
    c = ctx.array(counter, "i4", 1)
    if c[0] > 0:
        c[0] -= 1
        ctx.array(steps, "i4", 1)[0] += 1
    ctx.set_conditional(h, int(c[0] > 0))
