from nvproxy.sim_kernels import kernel


@kernel("add")
def add(ctx, p, n, k):
    a = ctx.array(p, "i4", ctx.i32(n))
    a[:] = a + ctx.i32(k)
