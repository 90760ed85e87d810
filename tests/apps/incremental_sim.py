import struct

import numpy as np

from nvproxy.sim_kernels import kernel

N = 1 << 20


@kernel("touch")
def touch(ctx, p, n, k):
    a = ctx.array(p, "u4", ctx.i32(n))
    with np.errstate(over="ignore"):
        a[:] = a * np.uint32(3) + np.uint32(k)


@kernel("build")
def build(ctx, ptrs, t, m):
    m = ctx.i32(m)
    i = np.arange(m, dtype=np.uint64)
    ctx.array(ptrs, "u8", m)[:] = np.uint64(t) + (i * np.uint64(7)) % np.uint64(N) * np.uint64(4)


@kernel("scatter")
def scatter(ctx, ptrs, m, k):
    for addr in ctx.array(ptrs, "u8", ctx.i32(m)).tolist():
        cell = ctx.array(addr, "u4", 1)
        cell[0] = (int(cell[0]) + k) & 0xFFFFFFFF


@kernel("via_global")
def via_global(ctx, m, k):
    target = int(ctx.array(ctx.symbol("g_target"), "u8", 1)[0])
    a = ctx.array(target, "u4", ctx.i32(m))
    with np.errstate(over="ignore"):
        a += np.uint32(k)


@kernel("with_struct")
def with_struct(ctx, args):
    n, _pad, out, k = struct.unpack_from("<iIQI", args)
    ctx.array(out, "u4", n)[:] ^= np.uint32(k)


@kernel("with_int")
def with_int(ctx, addr, m, k):
    a = ctx.array(addr, "u4", ctx.i32(m))
    with np.errstate(over="ignore"):
        a += np.uint32(k * 5)


@kernel("past_end")
def past_end(ctx, base, off, m, k):
    a = ctx.array(base + 4 * ctx.i64(off), "u4", ctx.i32(m))
    with np.errstate(over="ignore"):
        a += np.uint32(k)
