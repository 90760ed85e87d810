import struct

from nvproxy.sim_kernels import kernel


@kernel("big_kernel")
def big_kernel(ctx, b, out, c, sm, x):
    h = 0
    for byte in b:
        h = (h * 31 + byte) & 0xFFFFFFFFFFFFFFFF
    cc, s, i, d = struct.unpack("<bxhid", sm)
    o = ctx.array(out, "i4", 4)
    o[0] = h & 0x7FFFFFFF
    o[1] = c if c < 128 else c - 256
    o[2] = cc + s + i + int(d)
    o[3] = int(ctx.f64(x) * 1000)


@kernel("max_kernel")
def max_kernel(ctx, out, m):
    ctx.array(out, "i4", 1)[0] = sum(m)
