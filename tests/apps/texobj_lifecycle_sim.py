import numpy as np

from nvproxy.sim_kernels import kernel


@kernel("fetch")
def fetch(ctx, t, out, n):
    n = ctx.i32(n)
    ctx.array(out, "f4", n)[:] = ctx.texture(t).fetch(np.arange(n)).astype(np.float32) * np.float32(2.0)
