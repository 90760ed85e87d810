from nvproxy.sim_kernels import kernel


@kernel("add_one")
def add_one(ctx, p):
    a = ctx.array(p, "i4", 1)
    a[0] += 1


@kernel("copy_one")
def copy_one(ctx, src, dst):
    ctx.array(dst, "i4", 1)[0] = ctx.array(src, "i4", 1)[0]
