"""host_register.cu's kernel."""

from nvproxy.sim_kernels import kernel


@kernel("add_one")
def add_one(ctx, p, n):
    a = ctx.array(p, "u4", n)
    a += 1  # (wrapping, as on the device)
