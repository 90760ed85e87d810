from nvproxy.sim_kernels import kernel


@kernel("inc")
def inc(ctx, p, n):
    a = ctx.array(p, "i4", ctx.i32(n))
    a += 1
