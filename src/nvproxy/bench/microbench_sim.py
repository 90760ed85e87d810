"""The microbenchmark's kernels for the sim backend (CI smoke runs)."""

import numpy as np

from nvproxy.sim_kernels import kernel


@kernel("empty")
def empty(ctx):
    pass


@kernel("eight")
def eight(ctx, a, b, c, d, e, f, g, h):
    pass


@kernel("sum")
def sum_(ctx, p, n, out):
    total = int(ctx.array(p, "u4", n).astype(np.uint64).sum())
    acc = ctx.array(out, "u8", 1)
    acc[0] = np.uint64((int(acc[0]) + total) & 0xFFFFFFFFFFFFFFFF)
