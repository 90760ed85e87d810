"""The microbenchmark's kernels for the sim backend (CI smoke runs)."""

from nvproxy.sim_kernels import kernel


@kernel("empty")
def empty(ctx):
    pass


@kernel("eight")
def eight(ctx, a, b, c, d, e, f, g, h):
    pass
