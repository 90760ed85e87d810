from nvproxy.sim_kernels import kernel


@kernel("addk")
def addk(ctx, p, n, k):
    a = ctx.array(p, "i4", ctx.i32(n))
    a += ctx.i32(k)


@kernel("mulk")
def mulk(ctx, p, n, k):
    a = ctx.array(p, "i4", ctx.i32(n))
    a *= ctx.i32(k)
