import numpy as np

from nvproxy.sim_kernels import kernel


@kernel("jacobi")
def jacobi(ctx, u, au, f, n, diag):
    n = ctx.i32(n)
    v = ctx.array(u, "f4", n)
    v += (ctx.array(f, "f4", n) - ctx.array(au, "f4", n)) / np.float32(ctx.f32(diag))
