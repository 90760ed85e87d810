"""The driver API's own requests (native/shim/driver*.c): what has no runtime request to ride on.  Modules the
program loads itself come as MODULE_LOAD and KERNEL_INFO, like the runtime's, so checkpoints keep them."""

from __future__ import annotations

import struct
import sys
from typing import Any

from ... import wire
from ...errors import INVALID_VALUE, NOT_SUPPORTED, CudaError
from ...tensor_map import TensorMapArgs


def DRV_MODULE_UNLOAD(p: Any, ch: Any, a: tuple[int, ...], payload: bytes) -> None:
    """cuModuleUnload: the module and its kernels are forgotten, and no checkpoint takes them any more."""
    st = p.state
    st.images.pop(a[0], None)
    gone = [k for k, (mod, _name) in st.kernel_names.items() if mod == a[0]]
    for k in gone:
        del st.kernel_names[k]
        st.kernel_attrs.pop(k, None)
    p.forget()
    for d in st.devices.values():
        for k in gone:
            d.kernels.pop(k, None)
        mod = d.modules.pop(a[0], None)
        if mod is not None:
            p.backend.module_unload(mod)


def DRV_MEMSET(p: Any, ch: Any, a: tuple[int, ...], payload: bytes) -> None:
    """cuMemsetD16/D32 and the 2D memsets: a[3]-byte elements of value a[2], a[4] per row, a[5] rows a[1] apart."""
    if a[3] not in (1, 2, 4):
        raise CudaError(INVALID_VALUE)
    p.backend.memset_elem(p.state.translate(a[0]), a[1], a[2], a[3], a[4], a[5], p.stream(ch, a[6]))


MEMOP_NAMES = ("cuStreamWriteValue32", "cuStreamWriteValue64", "cuStreamWaitValue32", "cuStreamWaitValue64")


def DRV_STREAM_MEMOP(p: Any, ch: Any, a: tuple[int, ...], payload: bytes) -> None:
    """cuStreamWriteValue32/64 and cuStreamWaitValue32/64 on stream a[0] (posted): a[1] which, at a[2], value a[3],
    the driver's flags a[4]."""
    s = p.stream(ch, a[0])
    if a[1] >= len(MEMOP_NAMES):
        raise CudaError(INVALID_VALUE)
    if p.capturing(s):  # (a graph of the capture would hold a node kind nvproxy cannot record)
        print(f"nvproxy: {MEMOP_NAMES[a[1]]} on a capturing stream is not supported by nvproxy; "
              "returning CUDA_ERROR_NOT_SUPPORTED", file=sys.stderr)
        raise CudaError(NOT_SUPPORTED)
    p.backend.stream_memop(a[1], p.state.translate(a[2]), a[3], a[4], s)


def link_inputs(payload: bytes, count: int) -> list[tuple[int, str, bytes]]:
    """DRV_LINK's inputs: (CUjitInputType, name, data) each."""
    out, at = [], 0
    for _ in range(count):
        if at + 16 > len(payload):
            raise CudaError(INVALID_VALUE)
        kind, nlen, dlen = struct.unpack_from("<IIQ", payload, at)
        at += 16
        name = payload[at : at + nlen].decode(errors="replace")
        at += (nlen + 7) & ~7
        data = payload[at : at + dlen]
        at += (dlen + 7) & ~7
        if len(data) != dlen or at > len(payload) + 7:
            raise CudaError(INVALID_VALUE)
        out.append((kind, name, data))
    return out


def DRV_LINK(p: Any, ch: Any, a: tuple[int, ...], payload: bytes) -> tuple[tuple[int, ...], bytes]:
    """cuLinkComplete: the inputs the shim gathered are linked by the proxy's driver (which holds the JIT linker)
    for the calling thread's device, in one go: no link is ever half done in the proxy, so none is in a
    checkpoint.  The image is loaded as any other module (a record of it comes with cuModuleLoadData)."""
    image = p.backend.link(ch.dev, link_inputs(payload, a[0]))
    return (len(image),), image


def DRV_TENSOR_MAP(p: Any, ch: Any, a: tuple[int, ...], payload: bytes) -> tuple[tuple[int, ...], bytes]:
    """cuTensorMapEncodeTiled (a[0] 0) or cuTensorMapEncodeIm2col (1): host-only, but only the driver knows the
    descriptor's format, so the proxy's encodes it (at the same device address the program gave)."""
    if len(payload) != wire.TENSOR_MAP.size or a[0] > 1:
        raise CudaError(INVALID_VALUE)
    v = wire.TENSOR_MAP.unpack(payload)
    args = TensorMapArgs(im2col=bool(a[0]), data_type=v[0], rank=v[1], address=p.state.translate(v[2]),
                         dims=v[3:8], strides=v[8:12], box=v[12:17], elem_strides=v[17:22], lower=v[22:25],
                         upper=v[25:28], channels=v[28], pixels=v[29], interleave=v[30], swizzle=v[31],
                         l2_promotion=v[32], oob_fill=v[33])
    return (), p.backend.tensor_map(ch.dev, args)
