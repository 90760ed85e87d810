import numpy as np

from nvproxy.sim_kernels import kernel


@kernel("apply")
def apply(ctx, out, n):
    n = ctx.i32(n)
    coeff = ctx.array(ctx.symbol("coeff"), "f4", 8)
    counter = ctx.array(ctx.symbol("counter"), "i4", 4)
    i = np.arange(n)
    ctx.array(out, "f4", n)[:] = coeff[i % 8] * i.astype(np.float32)
    counter += np.arange(1, 5, dtype=np.int32)


@kernel("sum_table")
def sum_table(ctx, out):
    ctx.array(out, "f8", 1)[0] = ctx.array(ctx.symbol("table"), "f8", 1000).sum()
