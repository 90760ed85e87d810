import numpy as np

from nvproxy.sim_kernels import kernel


@kernel("scale_add")
def scale_add(ctx, y, x, a, n):
    n = ctx.i32(n)
    bias = ctx.array(ctx.symbol("bias"), "f4", 1)[0]
    out = ctx.array(y, "f4", n)
    out[:] = np.float32(ctx.f32(a)) * ctx.array(x, "f4", n) + out + bias


@kernel("bump")
def bump(ctx, k):
    ctx.array(ctx.symbol("counter"), "i4", 1)[0] += ctx.i32(k)


@kernel("sum_struct")
def sum_struct(ctx, out, big):
    v = np.frombuffer(big[:32], dtype="f4")
    n = int.from_bytes(big[32:36], "little", signed=True)
    ctx.array(out, "f4", 1)[0] = np.float32(v.sum(dtype=np.float32) * n)
