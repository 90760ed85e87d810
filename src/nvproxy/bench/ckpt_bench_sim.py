"""ckpt_bench.cu's kernels for the sim backend (CI smoke runs of the checkpoint benchmark)."""

import numpy as np

from nvproxy.sim_kernels import kernel


def _pattern(n: int, seed: int) -> np.ndarray:
    i = np.arange(n, dtype=np.uint64)
    return ((i * np.uint64(2654435761) + np.uint64(seed)) & np.uint64(0xFFFFFFFF)).astype(np.uint32)


@kernel("fill")
def fill(ctx, p, n, seed):
    ctx.array(p, "u4", n)[:] = _pattern(n, seed & 0xFFFFFFFF)


@kernel("check")
def check(ctx, p, n, seed, bad):
    wrong = int(np.count_nonzero(ctx.array(p, "u4", n) != _pattern(n, seed & 0xFFFFFFFF)))
    ctx.array(bad, "u8", 1)[0] += np.uint64(wrong)


@kernel("bump")
def bump(ctx, p, n):
    a = ctx.array(p, "u4", n)
    a += np.uint32(1)
