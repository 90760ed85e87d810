from nvproxy.sim_kernels import kernel


@kernel("twice")
def twice(ctx, p, n):
    n = ctx.i32(n)
    ctx.array(p, "f4", n)[:] *= 2
