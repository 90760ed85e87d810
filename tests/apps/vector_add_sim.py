from nvproxy.sim_kernels import kernel


@kernel("vecAdd")
def vec_add(ctx, a, b, c, n):
    n = ctx.i32(n)
    ctx.array(c, "f4", n)[:] = ctx.array(a, "f4", n) + ctx.array(b, "f4", n)
