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


def _vmm_at(p: Any, addr: int) -> Any:
    return p.state.arena_of(addr).arena.vmm


def _vmm_of_alloc(p: Any, aid: int) -> Any:
    for d in p.state.devices.values():
        if aid in d.arena.vmm.allocs:
            return d.arena.vmm
    raise CudaError(INVALID_VALUE, f"allocation handle {aid} is not live")


def _access(payload: bytes) -> list[tuple[int, int]]:
    """DRV_VMM ACCESS's descriptors: (device, flags) each."""
    if not payload or len(payload) % 16:
        raise CudaError(INVALID_VALUE)
    return [(dev, flags) for _kind, dev, flags, _z in struct.iter_unpack("<IIII", payload)]


def DRV_VMM(p: Any, ch: Any, a: tuple[int, ...], payload: bytes) -> tuple[tuple[int, ...], bytes]:
    """The driver's virtual memory management (vmm.py): a[0] says which call.  The reply's payload lists the
    allocations (ids) the call ended: the shim forgets their handles."""
    st = p.state
    with st.arena_lock:  # (the reaper frees into the same arenas)
        r0 = _vmm(p, ch, a, payload)
        dropped = [i for d in st.devices.values() for i in d.arena.vmm.dropped]
        for d in st.devices.values():
            d.arena.vmm.dropped.clear()
    return (r0,), struct.pack(f"<{len(dropped)}Q", *dropped)


def _vmm(p: Any, ch: Any, a: tuple[int, ...], payload: bytes) -> int:
    st, kind = p.state, a[0]
    if kind == wire.NVP_VMM_RESERVE:
        return st.device(ch.dev).arena.vmm.reserve(a[1], a[2], a[3])
    if kind == wire.NVP_VMM_GRANULARITY:
        return st.device(a[1]).arena.vmm.granularity
    if kind == wire.NVP_VMM_CREATE:
        st.device(a[3]).arena.vmm.create(a[1], a[2], payload)
    elif kind == wire.NVP_VMM_RELEASE:
        _vmm_of_alloc(p, a[1]).release(a[1])
    elif kind == wire.NVP_VMM_MAP:
        v = _vmm_at(p, a[1])
        if v is not _vmm_of_alloc(p, a[4]):
            print("nvproxy: cuMemMap of one device's memory into another's address range is not supported by "
                  "nvproxy; returning CUDA_ERROR_NOT_SUPPORTED", file=sys.stderr)
            raise CudaError(NOT_SUPPORTED)
        v.map(a[1], a[2], a[3], a[4])
    elif kind == wire.NVP_VMM_FREE:
        _vmm_at(p, a[1]).free(a[1], a[2])
    elif kind == wire.NVP_VMM_UNMAP:
        _vmm_at(p, a[1]).unmap(a[1], a[2])
    elif kind == wire.NVP_VMM_ACCESS:
        access = _access(payload)
        for dev, _flags in access:
            st.device(dev)  # (a valid device: its context and arena)
        _vmm_at(p, a[1]).set_access(a[1], a[2], access)
    elif kind == wire.NVP_VMM_GET_ACCESS:
        return _vmm_at(p, a[1]).get_access(a[1], a[2])
    elif kind == wire.NVP_VMM_RETAIN:
        return _vmm_at(p, a[1]).retain(a[1])
    else:
        raise CudaError(INVALID_VALUE)
    return 0
