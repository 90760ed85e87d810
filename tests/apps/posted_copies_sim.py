from nvproxy.sim_kernels import kernel


@kernel("spin")
def spin(ctx, flag, cycles, value):
    ctx.array(flag, "i4", 1)[0] = ctx.i32(value)
