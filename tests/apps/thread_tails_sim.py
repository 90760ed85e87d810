from nvproxy.sim_kernels import kernel


@kernel("fold")
def fold(ctx, v, id_, k):
    i = ctx.i32(id_)
    a = ctx.array(v, "u4", i + 1)
    a[i] = (int(a[i]) * 31 + (k & 0xFFFFFFFF)) & 0xFFFFFFFF
