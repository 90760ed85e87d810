import numpy as np

from nvproxy.sim_kernels import kernel


@kernel("inside")
def inside(ctx, u, pairs, partial):
    pairs = ctx.i32(pairs)
    xy = ctx.array(u, "f4", 2 * pairs).reshape(pairs, 2)
    hit = xy[:, 0] * xy[:, 0] + xy[:, 1] * xy[:, 1] <= np.float32(1)
    threads, blocks = ctx.block[0], ctx.grid[0]
    block_of = np.arange(pairs) % (threads * blocks) // threads  # (each thread strides over the pairs)
    ctx.array(partial, "u4", blocks)[:] = np.bincount(block_of[hit], minlength=blocks)
