from nvproxy.sim_kernels import kernel


@kernel("touch")
def touch(ctx, p, n, rnd):
    n = ctx.i32(n)
    a = ctx.array(p, "f4", n)
    a[:] = a * 0.5 + float(ctx.i32(rnd))
