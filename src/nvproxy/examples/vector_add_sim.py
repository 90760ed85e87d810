"""The example's kernel for the sim backend (it cannot run GPU code)."""

from nvproxy.sim_kernels import kernel


@kernel("vectorAdd")
def vector_add(ctx, a, b, c, n):
    n = ctx.i32(n)
    ctx.array(c, "f4", n)[:] = ctx.array(a, "f4", n) + ctx.array(b, "f4", n)
