from nvproxy.sim_kernels import kernel


@kernel("decide")
def decide(ctx, flag, h):
    ctx.set_conditional(h, int(ctx.array(flag, "i4", 1)[0] != 0))


@kernel("add")
def add(ctx, p, k):
    ctx.array(p, "i4", 1)[0] += ctx.i32(k)


@kernel("countdown")
def countdown(ctx, counter, iterations, h):
    ctx.array(iterations, "i4", 1)[0] += 1
    c = ctx.array(counter, "i4", 1)
    c[0] -= 1
    ctx.set_conditional(h, int(c[0] > 0))


@kernel("choose")
def choose(ctx, which, h):
    ctx.set_conditional(h, int(ctx.array(which, "i4", 1)[0]))
