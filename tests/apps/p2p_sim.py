from nvproxy.sim_kernels import kernel


@kernel("add_from")
def add_from(ctx, dst, src, n, k):
    n = ctx.i32(n)
    ctx.array(dst, "i4", n)[:] += ctx.array(src, "i4", n) + ctx.i32(k)
