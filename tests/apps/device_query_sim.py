from nvproxy.sim_kernels import kernel


@kernel("kern")
def kern(ctx, p):
    a = ctx.array(p, "f4", ctx.block[0])
    a *= 2
