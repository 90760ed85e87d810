from nvproxy.sim_kernels import kernel


@kernel("bump")
def bump(ctx, k):
    k = ctx.i32(k)
    ctx.array(ctx.symbol("counter"), "i4", 1)[0] += k
    t = ctx.array(ctx.symbol("table"), "f4", 4)
    t[:] = t * 2 + k
