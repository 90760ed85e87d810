import numpy as np

from nvproxy.sim_kernels import kernel

N, S = 1 << 20, 8


@kernel("touch")
def touch(ctx, p, n, k):
    a = ctx.array(p, "u4", ctx.i32(n))
    with np.errstate(over="ignore"):
        a[:] = a * np.uint32(3) + np.uint32(k)


@kernel("build")
def build(ctx, ptrs, bases, m):
    m = ctx.i32(m)
    i = np.arange(m, dtype=np.uint64)
    base = ctx.array(bases, "u8", S)[i % np.uint64(S)]
    ctx.array(ptrs, "u8", m)[:] = base + (i * np.uint64(7)) % np.uint64(N) * np.uint64(4)


@kernel("scatter")
def scatter(ctx, ptrs, m, k):
    for addr in ctx.array(ptrs, "u8", ctx.i32(m)).tolist():
        cell = ctx.array(addr, "u4", 1)
        cell[0] = (int(cell[0]) + k) & 0xFFFFFFFF
