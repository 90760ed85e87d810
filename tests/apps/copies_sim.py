from nvproxy.sim_kernels import kernel


@kernel("scale")
def scale(ctx, p, n, k):
    n, k = ctx.i32(n), ctx.i32(k)
    a = ctx.array(p, "i4", n)
    a[:] = a * k + 1
