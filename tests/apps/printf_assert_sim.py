from nvproxy.sim_kernels import kernel


@kernel("hello")
def hello(ctx, step):
    for t in range(min(3, ctx.block[0])):
        ctx.printf(f"device step {ctx.i32(step)} thread {t}\n")


@kernel("check_positive")
def check_positive(ctx, p):
    vals = ctx.array(p, "i4", ctx.block[0])
    ctx.device_assert(bool((vals > 0).all()), "p[threadIdx.x] > 0")
