import numpy as np

from nvproxy.sim_kernels import kernel


@kernel("scale")
def scale(ctx, p, n, s):
    a = ctx.array(p, "f4", 2 * ctx.i32(n))
    a *= np.float32(ctx.f32(s))


@kernel("filter3d")
def filter3d(ctx, p, n, width):
    n = ctx.i32(n)
    k = np.arange(n)
    k = np.where(k > n // 2, k - n, k)
    r2 = (k[:, None, None] ** 2 + k[None, :, None] ** 2 + k[None, None, :] ** 2).astype(np.float32)
    g = np.exp(-r2 / np.float32(ctx.f32(width))) / np.float32(n**3)
    ctx.array(p, "c8", n**3).reshape(n, n, n)[:] *= g.astype(np.float32)
