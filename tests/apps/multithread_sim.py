from nvproxy.sim_kernels import kernel


@kernel("work")
def work(ctx, p, n, k):
    a = ctx.array(p, "i4", ctx.i32(n))
    a[:] = a * 2 + ctx.i32(k)


@kernel("wait_flag")
def wait_flag(ctx, flag, out):
    # the sim runs work at submission and cannot wait for the flag; it only
    # models the result
    ctx.array(out, "i4", 1)[0] = 77
