import numpy as np

from nvproxy.sim_kernels import kernel

W, H = 64, 32


@kernel("stencil")
def stencil(ctx, tin, sout, k):
    t, k = ctx.texture(tin), ctx.i32(k)
    y, x = np.mgrid[0:H, 0:W]
    xf, yf, half = x.astype(np.float32), y.astype(np.float32), np.float32(0.5)
    c = t.sample(xf + half, yf + half)
    left, right = t.sample(xf - half, yf + half), t.sample(xf + np.float32(1.5), yf + half)
    up, down = t.sample(xf + half, yf - half), t.sample(xf + half, yf + np.float32(1.5))
    v = c * half + (((left + right) + up) + down) * np.float32(0.125) + ((x * 7 + y * 3 + k) % 11).astype(np.float32)
    ctx.surface(sout)[:, :] = np.fmod(v, np.float32(1000.0))


@kernel("paint")
def paint(ctx, sout, k):
    k = ctx.i32(k)
    y, x = np.mgrid[0:H, 0:W]
    s = ctx.surface(sout)
    for ch, v in enumerate((x + k, y * 2, (x ^ y) & 0xFF, np.full_like(x, 255 - k))):
        s[:, :, ch] = (v & 0xFF).astype(np.uint8)


@kernel("sample2d")
def sample2d(ctx, t, xs, ys, out, n):
    n = ctx.i32(n)
    ctx.array(out, "f4", n)[:] = ctx.texture(t).sample(ctx.array(xs, "f4", n), ctx.array(ys, "f4", n))


@kernel("fetch1d")
def fetch1d(ctx, t, out, n):
    n = ctx.i32(n)
    ctx.array(out, "i4", n)[:] = ctx.texture(t).fetch(np.arange(n) * 3 - 5)


@kernel("sum3d")
def sum3d(ctx, t, out, w, h, d):
    w, h, d = ctx.i32(w), ctx.i32(h), ctx.i32(d)
    z, y, x = np.mgrid[0:d, 0:h, 0:w]
    half = np.float32(0.5)
    v = ctx.texture(t).sample(x + half, y + half, z + half).astype(np.int64) * (x + 2 * y + 3 * z + 1)
    o = ctx.array(out, "i4", 1)
    o[0] = np.int32((int(o[0]) + int(v.sum()) + 2**31) % 2**32 - 2**31)
