"""The GPU backend: the real device, through libcuda.

Everything goes through the cffi binding in cuda_driver.py: initialising the driver, the devices and their
primary contexts (the context the runtime API would use), the VMM arena (cuMemAddressReserve/Create/Map),
parameter layouts (cuFuncGetParamInfo), host functions, and the per-call hot path.  (Nothing of pycuda, nor of
numpy, which pycuda imports: their import was the longest part of a proxy's start.)
"""

from __future__ import annotations

import contextlib
import os
import sys
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

from .. import fatbin
from ..errors import INVALID_RESOURCE_HANDLE, CudaError
from ..proxy.capture import StdoutCapture
from . import cuda_driver as cd
from . import warmup

ffi = cd.ffi


@dataclass
class GpuModule:
    device: int
    handle: object
    image: bytes


@dataclass
class GpuKernel:
    name: str
    handle: object
    params: list[tuple[int, int]]
    param_size: int


@contextlib.contextmanager
def relaxed(L: Any) -> Iterator[None]:
    """Driver calls the proxy makes for its own bookkeeping (the arena's memory, registering pinned memory,
    staging) are not stream work: a global-mode capture the proxy's thread is running (a captured
    cudaMallocAsync or pageable copy comes here) must neither refuse them nor be invalidated by them."""
    mode = ffi.new("int *", cd.CU_STREAM_CAPTURE_MODE_RELAXED)
    cd.check(L.cuThreadExchangeStreamCaptureMode(mode), "cuThreadExchangeStreamCaptureMode")
    try:
        yield
    finally:
        L.cuThreadExchangeStreamCaptureMode(mode)


class GpuBacking:
    def __init__(self, dev: int) -> None:
        self.L = cd.lib()
        self.dev = dev
        self.prop = ffi.new("CUmemAllocationProp *")
        self.prop.type = cd.CU_MEM_ALLOCATION_TYPE_PINNED
        self.prop.location.type = cd.CU_MEM_LOCATION_TYPE_DEVICE
        self.prop.location.id = dev
        self.prop.requestedHandleTypes = cd.CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR  # (CUDA IPC: handlers/ipc.py)
        g = ffi.new("size_t *")
        cd.check(self.L.cuMemGetAllocationGranularity(g, self.prop, 0), "cuMemGetAllocationGranularity")
        self.granularity = max(int(g[0]), 2 << 20)
        self.peers: set[int] = set()  # other devices that may access this memory (peer access)
        self.kept: dict[int, int] = {}  # adopted handle -> the file descriptor it came as (exported again as it is)
        self._access()

    def _access(self) -> None:
        devs = [self.dev, *sorted(self.peers)]
        self.access = ffi.new("CUmemAccessDesc[]", len(devs))
        for d, dev in zip(self.access, devs, strict=True):
            d.location.type = cd.CU_MEM_LOCATION_TYPE_DEVICE
            d.location.id = dev
            d.flags = cd.CU_MEM_ACCESS_FLAGS_PROT_READWRITE

    def grant(self, dev: int, mappings: list[tuple[int, int]]) -> None:
        """Device dev may read and write this memory from now on (VMM memory: peer access does not reach it by
        itself), the mappings made so far and those to come."""
        if dev == self.dev or dev in self.peers:
            return
        self.peers.add(dev)
        self._access()
        with self._relaxed():
            for va, size in mappings:
                cd.check(self.L.cuMemSetAccess(va, size, self.access, len(self.access)), "cuMemSetAccess")

    def _relaxed(self) -> contextlib.AbstractContextManager[None]:
        return relaxed(self.L)

    def create(self, size: int) -> int:
        h = ffi.new("CUmemGenericAllocationHandle *")
        with self._relaxed():
            cd.check(self.L.cuMemCreate(h, size, self.prop, 0), "cuMemCreate")
        return int(h[0])

    def adopt(self, fd: int, size: int) -> int:
        """Memory another proxy made (a migration's, shared through CUDA IPC), imported from its descriptor."""
        h = ffi.new("CUmemGenericAllocationHandle *")
        with self._relaxed():
            cd.check(self.L.cuMemImportFromShareableHandle(h, ffi.cast("void *", fd),
                                                           cd.CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR),
                     "cuMemImportFromShareableHandle")
        self.kept[int(h[0])] = os.dup(fd)
        return int(h[0])

    def map(self, va: int, size: int, handle: object) -> None:
        with self._relaxed():
            cd.check(self.L.cuMemMap(va, size, 0, handle, 0), "cuMemMap")
            cd.check(self.L.cuMemSetAccess(va, size, self.access, len(self.access)), "cuMemSetAccess")

    def unmap(self, va: int, size: int) -> None:
        with self._relaxed():
            cd.check(self.L.cuMemUnmap(va, size), "cuMemUnmap")

    def release(self, handle: object) -> None:
        kept = self.kept.pop(handle, None)  # type: ignore[call-overload]
        if kept is not None:
            os.close(kept)
        with self._relaxed():
            cd.check(self.L.cuMemRelease(handle), "cuMemRelease")


class GpuBackend:
    name = "gpu"

    def __init__(self) -> None:
        self.L = cd.lib()
        rc = self.L.cuInit(0)
        cd.check(rc, "cuInit: CUDA_ERROR_NO_DEVICE" if rc == cd.CUDA_ERROR_NO_DEVICE else "cuInit")
        n, d = ffi.new("int *"), ffi.new("CUdevice *")
        cd.check(self.L.cuDeviceGetCount(n), "cuDeviceGetCount")
        self.devices: list[int] = []
        for i in range(n[0]):
            cd.check(self.L.cuDeviceGet(d, i), "cuDeviceGet")
            self.devices.append(int(d[0]))
        self._ctx: list[object | None] = [None] * len(self.devices)
        self._backings: dict[int, GpuBacking] = {}
        self._lock = threading.Lock()
        self._host_fns: dict[int, Callable[[int], None]] = {}
        self._next_fn = 0
        self._trampoline = ffi.callback("void(void *)", self._run_host_fn)
        self.capture = StdoutCapture()
        self._tls = threading.local()
        self._own_streams: dict[int, object] = {}  # (copy_now's, by device)

    # ---- devices and contexts ----
    def device_count(self) -> int:
        return len(self.devices)

    def driver_version(self) -> int:
        v = ffi.new("int *")
        cd.check(self.L.cuDriverGetVersion(v), "cuDriverGetVersion")
        return int(v[0])

    def _context(self, dev: int) -> object:
        with self._lock:
            if self._ctx[dev] is None:
                ctx = ffi.new("CUcontext *")
                cd.check(self.L.cuDevicePrimaryCtxRetain(ctx, self.devices[dev]), "cuDevicePrimaryCtxRetain")
                self._ctx[dev] = ctx[0]  # (retained for the proxy's life)
                warmup.spare_done()  # (the start-up's spare context of device 0 is not needed now)
            return self._ctx[dev]

    def activate(self, dev: int) -> None:
        if getattr(self._tls, "dev", None) == dev:
            return
        cd.check(self.L.cuCtxSetCurrent(self._context(dev)), "cuCtxSetCurrent")
        self._tls.dev = dev

    def device_props(self, dev: int) -> tuple[str, bytes, int, list[int]]:
        attrs = [0] * 160
        v = ffi.new("int *")
        for a in range(1, 160):
            if self.L.cuDeviceGetAttribute(v, a, dev) == 0:
                attrs[a] = int(v[0])
        uuid = ffi.new("unsigned char[16]")
        cd.check(self.L.cuDeviceGetUuid_v2(uuid, dev), "cuDeviceGetUuid")
        return self._name(dev), bytes(ffi.buffer(uuid)), self.total_memory(dev), attrs

    def _name(self, dev: int) -> str:
        name = ffi.new("char[256]")
        cd.check(self.L.cuDeviceGetName(name, 256, self.devices[dev]), "cuDeviceGetName")
        return ffi.string(name).decode(errors="replace")

    def total_memory(self, dev: int) -> int:
        size = ffi.new("size_t *")
        cd.check(self.L.cuDeviceTotalMem_v2(size, self.devices[dev]), "cuDeviceTotalMem")
        return int(size[0])

    def device_identity(self, dev: int) -> tuple[str, bytes]:
        """(name, UUID): what a restore checks, without the cost of reading all of device_props' attributes."""
        uuid = ffi.new("unsigned char[16]")
        cd.check(self.L.cuDeviceGetUuid_v2(uuid, dev), "cuDeviceGetUuid")
        return self._name(dev), bytes(ffi.buffer(uuid))

    def backing(self, dev: int) -> GpuBacking:
        if dev not in self._backings:
            self.activate(dev)
            self._backings[dev] = GpuBacking(dev)
        return self._backings[dev]

    def reserve(self, dev: int, base: int, size: int) -> int:
        self.activate(dev)
        p = ffi.new("CUdeviceptr *")
        cd.check(self.L.cuMemAddressReserve(p, size, self.backing(dev).granularity, base, 0), "cuMemAddressReserve")
        got = int(p[0])
        if got != base:
            print(f"nvproxy: device {dev} arena placed at {got:#x}, not {base:#x}: a restore needs the same "
                  "address and may fail", file=sys.stderr)
        return got

    def mem_info(self, dev: int) -> tuple[int, int]:
        self.activate(dev)
        f, t = ffi.new("size_t *"), ffi.new("size_t *")
        cd.check(self.L.cuMemGetInfo_v2(f, t), "cuMemGetInfo")
        return int(f[0]), int(t[0])

    def spare_alloc(self, dev: int, size: int) -> int:
        """Device memory outside the arena, for the proxy's own use (a concurrent checkpoint's snapshot)."""
        self.activate(dev)
        p = ffi.new("CUdeviceptr *")
        cd.check(self.L.cuMemAlloc_v2(p, size), "cuMemAlloc")
        return int(p[0])

    def spare_free(self, dev: int, ptr: int) -> None:
        self.activate(dev)
        cd.check(self.L.cuMemFree_v2(ptr), "cuMemFree")

    def check(self) -> None:
        pass

    # ---- the native fast path (proxy/fastpath.py) ----
    def fast_driver(self) -> dict[str, int]:
        """The libcuda entry points the fast path calls: the same ones this backend calls."""
        names = {"launch": "cuLaunchKernel", "launch_cooperative": "cuLaunchCooperativeKernel",
                 "memcpy_async": "cuMemcpyAsync", "memset_async": "cuMemsetD8Async",
                 "event_record": "cuEventRecordWithFlags", "event_query": "cuEventQuery",
                 "event_sync": "cuEventSynchronize", "stream_query": "cuStreamQuery",
                 "stream_sync": "cuStreamSynchronize", "stream_wait_event": "cuStreamWaitEvent",
                 "graph_launch": "cuGraphLaunch", "ctx_get_current": "cuCtxGetCurrent",
                 "ctx_set_current": "cuCtxSetCurrent"}
        return {k: int(ffi.cast("uintptr_t", getattr(self.L, v))) for k, v in names.items()}

    def watch_text(self, notify: Callable[[bool], None]) -> int:
        """The fast path hears when kernel printf text waits; returns the pipe it arrives on."""
        self.capture.notify = notify
        return self.capture.fd

    @staticmethod
    def handle_value(h: object) -> int:
        return int(ffi.cast("uintptr_t", h))

    def kernel_handle(self, k: GpuKernel) -> tuple[int, list[int]]:
        """(CUfunction, parameter offsets) for the fast path."""
        return self.handle_value(k.handle), [o for o, _ in k.params]

    def take_text(self) -> bytes:
        return self.capture.take()

    def pending_text(self) -> bytes:
        return self.capture.peek()

    def put_text(self, text: bytes) -> None:
        self.capture.put(text)

    # ---- host memory ----
    def host_register(self, addr: int, size: int, read_only: bool = False) -> None:
        flags = cd.CU_MEMHOSTREGISTER_PORTABLE | cd.CU_MEMHOSTREGISTER_DEVICEMAP
        if read_only:  # (a read-only mapping: an image file's pages)
            flags |= cd.CU_MEMHOSTREGISTER_READ_ONLY
        with relaxed(self.L):
            cd.check(self.L.cuMemHostRegister_v2(ffi.cast("void *", addr), size, flags), "cuMemHostRegister")

    def host_unregister(self, addr: int, size: int) -> None:
        with relaxed(self.L):
            cd.check(self.L.cuMemHostUnregister(ffi.cast("void *", addr)), "cuMemHostUnregister")

    def copy_now(self, dev: int, copies: list[tuple[int, int, int]]) -> None:
        """(dst, src, bytes) copies done before this returns, on a stream of the proxy's own, ordered after nothing
        the application submitted (managed memory's migrations: handlers/managed.py)."""
        self.activate(dev)  # (on the managed memory channel's thread too: its own current context, not the stream's)
        s = self._own_streams.get(dev)
        with relaxed(self.L):
            if s is None:
                s = self._own_streams[dev] = self.stream_create(dev, 1, 0)  # (CU_STREAM_NON_BLOCKING)
            for dst, src, n in copies:
                cd.check(self.L.cuMemcpyAsync(dst, src, n, s), "cuMemcpyAsync")
            cd.check(self.L.cuStreamSynchronize(s), "cuStreamSynchronize")

    # ---- copies (unified addressing: one call for every direction) ----
    def memcpy(self, dst: int, src: int, n: int, stream: object) -> None:
        cd.check(self.L.cuMemcpyAsync(dst, src, n, stream), "cuMemcpyAsync")

    def memcpy2d(self, dst: int, dpitch: int, src: int, spitch: int, width: int, height: int,
                 stream: object) -> None:
        c = ffi.new("CUDA_MEMCPY2D *")
        c.srcMemoryType = c.dstMemoryType = cd.CU_MEMORYTYPE_UNIFIED
        c.srcDevice, c.srcPitch, c.dstDevice, c.dstPitch = src, spitch, dst, dpitch
        c.WidthInBytes, c.Height = width, height
        cd.check(self.L.cuMemcpy2DAsync_v2(c, stream), "cuMemcpy2DAsync")

    def memset(self, ptr: int, value: int, n: int, stream: object) -> None:
        cd.check(self.L.cuMemsetD8Async(ptr, value, n, stream), "cuMemsetD8Async")

    def memset2d(self, ptr: int, pitch: int, value: int, width: int, height: int, stream: object) -> None:
        cd.check(self.L.cuMemsetD2D8Async(ptr, pitch, value, width, height, stream), "cuMemsetD2D8Async")

    def memset_elem(self, ptr: int, pitch: int, value: int, elsize: int, width: int, height: int,
                    stream: object) -> None:
        bits = 8 * elsize
        if height == 1:  # (a 2D memset's pitch is bounded; one row need not be)
            cd.check(getattr(self.L, f"cuMemsetD{bits}Async")(ptr, value, width, stream), f"cuMemsetD{bits}Async")
        else:
            cd.check(getattr(self.L, f"cuMemsetD2D{bits}Async")(ptr, pitch, value, width, height, stream),
                     f"cuMemsetD2D{bits}Async")

    # ---- what the driver API asks of the driver (proxy/handlers/driver.py) ----
    def stream_memop(self, kind: int, addr: int, value: int, flags: int, stream: object) -> None:
        name = ("cuStreamWriteValue32_v2", "cuStreamWriteValue64_v2", "cuStreamWaitValue32_v2",
                "cuStreamWaitValue64_v2")[kind]
        cd.check(getattr(self.L, name)(stream, addr, value, flags), name)

    def tensor_map(self, dev: int, t: Any) -> bytes:
        self.activate(dev)
        raw = ffi.new("char[]", 128 + 64)  # (the driver takes a 64-byte aligned descriptor)
        at = ffi.cast("char *", (int(ffi.cast("uintptr_t", raw)) + 63) & ~63)
        dims, strides = ffi.new("uint64_t[5]", list(t.dims)), ffi.new("uint64_t[4]", list(t.strides))
        es = ffi.new("uint32_t[5]", list(t.elem_strides))
        addr = ffi.cast("void *", t.address)
        if t.im2col:
            lo, hi = ffi.new("int[3]", list(t.lower)), ffi.new("int[3]", list(t.upper))
            rc = self.L.cuTensorMapEncodeIm2col(at, t.data_type, t.rank, addr, dims, strides, lo, hi, t.channels,
                                                t.pixels, es, t.interleave, t.swizzle, t.l2_promotion, t.oob_fill)
        else:
            box = ffi.new("uint32_t[5]", list(t.box))
            rc = self.L.cuTensorMapEncodeTiled(at, t.data_type, t.rank, addr, dims, strides, box, es, t.interleave,
                                               t.swizzle, t.l2_promotion, t.oob_fill)
        cd.check(rc, "cuTensorMapEncode")
        return bytes(ffi.buffer(at, 128))

    # ---- CUDA IPC (proxy/handlers/ipc.py) ----
    def export_fd(self, dev: int, handle: int) -> int:
        kept = self.backing(dev).kept.get(handle)
        if kept is not None:  # (taken over by a migration: the descriptor it came as names the same memory)
            return os.dup(kept)
        fd = ffi.new("int *")
        cd.check(self.L.cuMemExportToShareableHandle(fd, handle, cd.CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR, 0),
                 "cuMemExportToShareableHandle")
        return int(fd[0])

    def import_fd(self, dev: int, fd: int, size: int) -> int:
        h = ffi.new("CUmemGenericAllocationHandle *")
        cd.check(self.L.cuMemImportFromShareableHandle(h, ffi.cast("void *", fd),
                                                       cd.CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR),
                 "cuMemImportFromShareableHandle")
        return int(h[0])

    def ipc_release(self, dev: int, handle: int) -> None:
        cd.check(self.L.cuMemRelease(handle), "cuMemRelease")

    def ipc_event_handle(self, e: object) -> bytes:
        h = ffi.new("CUipcEventHandle *")
        cd.check(self.L.cuIpcGetEventHandle(h, e), "cuIpcGetEventHandle")
        return bytes(ffi.buffer(h))

    def ipc_event_open(self, dev: int, handle: bytes) -> object:
        self.activate(dev)
        h = ffi.new("CUipcEventHandle *")
        ffi.memmove(h, handle, 64)
        e = ffi.new("CUevent *")
        cd.check(self.L.cuIpcOpenEventHandle(e, h[0]), "cuIpcOpenEventHandle")
        return e[0]

    # ---- CUDA arrays, texture and surface objects ----
    def array_create(self, dev: int, width: int, height: int, depth: int, fmt: Any, flags: int) -> object:
        self.activate(dev)
        d = ffi.new("CUDA_ARRAY3D_DESCRIPTOR *")
        d.Width, d.Height, d.Depth, d.Format, d.NumChannels, d.Flags = (width, height, depth, fmt.cu_format,
                                                                        fmt.channels, flags)
        a = ffi.new("CUarray *")
        cd.check(self.L.cuArray3DCreate_v2(a, d), "cuArray3DCreate")
        return a[0]

    def array_destroy(self, a: object) -> None:
        cd.check(self.L.cuArrayDestroy(a), "cuArrayDestroy")

    @staticmethod
    def _copy_side(c: Any, at: str, side: tuple[Any, ...]) -> None:
        """One side of a CUDA_MEMCPY3D: ("array", handle, x, y, z) or ("linear", address, pitch, rows, x, y, z)."""
        if side[0] == "array":
            _k, handle, x, y, z = side
            setattr(c, at + "MemoryType", cd.CU_MEMORYTYPE_ARRAY)
            setattr(c, at + "Array", handle)
        else:
            _k, addr, pitch, rows, x, y, z = side
            setattr(c, at + "MemoryType", cd.CU_MEMORYTYPE_UNIFIED)
            setattr(c, at + "Device", addr)
            setattr(c, at + "Pitch", pitch)
            setattr(c, at + "Height", rows)
        setattr(c, at + "XInBytes", x)
        setattr(c, at + "Y", y)
        setattr(c, at + "Z", z)

    def copy3d(self, src: tuple[Any, ...], dst: tuple[Any, ...], width: int, height: int, depth: int,
               stream: object) -> None:
        c = ffi.new("CUDA_MEMCPY3D *")
        self._copy_side(c, "src", src)
        self._copy_side(c, "dst", dst)
        c.WidthInBytes, c.Height, c.Depth = width, height, depth
        cd.check(self.L.cuMemcpy3DAsync_v2(c, stream), "cuMemcpy3DAsync")

    def _array_host_copy(self, a: object, shape: tuple[int, int, int], buf: Any, to_array: bool,
                         stream: object = None) -> None:
        """stream: asynchronously on it (else synchronously)."""
        row, rows, slices = shape
        c = ffi.new("CUDA_MEMCPY3D *")
        host, arr = ("src", "dst") if to_array else ("dst", "src")
        setattr(c, arr + "MemoryType", cd.CU_MEMORYTYPE_ARRAY)
        setattr(c, arr + "Array", a)
        setattr(c, host + "MemoryType", cd.CU_MEMORYTYPE_HOST)
        setattr(c, host + "Host", ffi.from_buffer(buf))
        setattr(c, host + "Pitch", row)
        setattr(c, host + "Height", rows)
        c.WidthInBytes, c.Height, c.Depth = row, rows, slices
        if stream is not None:
            cd.check(self.L.cuMemcpy3DAsync_v2(c, stream), "cuMemcpy3DAsync")
        else:
            cd.check(self.L.cuMemcpy3D_v2(c), "cuMemcpy3D")

    def array_read(self, a: object, shape: tuple[int, int, int]) -> bytes:
        """(a checkpoint's) on a stream of its own: a capture on a blocking stream forbids the legacy stream, which a
        synchronous copy would use."""
        buf = bytearray(shape[0] * shape[1] * shape[2])
        s = ffi.new("CUstream *")
        cd.check(self.L.cuStreamCreateWithPriority(s, 1, 0), "cuStreamCreate")  # (1: CU_STREAM_NON_BLOCKING)
        try:
            self._array_host_copy(a, shape, buf, False, s[0])
            cd.check(self.L.cuStreamSynchronize(s[0]), "cuStreamSynchronize")
        finally:
            self.L.cuStreamDestroy_v2(s[0])
        return bytes(buf)

    def array_write(self, a: object, shape: tuple[int, int, int], data: bytes) -> None:
        self._array_host_copy(a, shape, data, True)

    def object_create(self, dev: int, surface: bool, res: tuple[Any, ...], tex: dict[str, Any] | None
                      ) -> tuple[int, int]:
        """(value, handle) of a new texture or surface object; res: ("array", handle, format),
        ("linear", address, format, bytes) or ("pitch2d", address, format, width, height, pitch)."""
        self.activate(dev)
        r = ffi.new("CUDA_RESOURCE_DESC *")
        fmt = res[2]
        if res[0] == "array":
            r.resType, r.res.array.hArray = cd.CU_RESOURCE_TYPE_ARRAY, res[1]
        elif res[0] == "linear":
            r.resType = cd.CU_RESOURCE_TYPE_LINEAR
            lin = r.res.linear
            lin.devPtr, lin.format, lin.numChannels, lin.sizeInBytes = res[1], fmt.cu_format, fmt.channels, res[3]
        else:
            r.resType = cd.CU_RESOURCE_TYPE_PITCH2D
            p2 = r.res.pitch2D
            p2.devPtr, p2.format, p2.numChannels = res[1], fmt.cu_format, fmt.channels
            p2.width, p2.height, p2.pitchInBytes = res[3], res[4], res[5]
        if surface or tex is None:
            o = ffi.new("CUsurfObject *")
            cd.check(self.L.cuSurfObjectCreate(o, r), "cuSurfObjectCreate")
            return int(o[0]), int(o[0])
        t = ffi.new("CUDA_TEXTURE_DESC *")
        for i in range(3):
            t.addressMode[i] = tex[f"address{i}"]
            t.borderColor[i] = tex[f"border{i}"]
        t.borderColor[3] = tex["border3"]
        t.filterMode = tex["filter"]
        flags = cd.CU_TRSF_READ_AS_INTEGER if tex["read_mode"] == 0 and fmt.integer else 0
        for key, bit in (("normalized", cd.CU_TRSF_NORMALIZED_COORDINATES), ("srgb", cd.CU_TRSF_SRGB),
                         ("no_trilinear", cd.CU_TRSF_DISABLE_TRILINEAR_OPTIMIZATION),
                         ("seamless", cd.CU_TRSF_SEAMLESS_CUBEMAP)):
            flags |= bit if tex[key] else 0
        t.flags, t.maxAnisotropy, t.mipmapFilterMode = flags, tex["max_aniso"], tex["mip_filter"]
        t.mipmapLevelBias, t.minMipmapLevelClamp = tex["mip_bias"], tex["mip_min"]
        t.maxMipmapLevelClamp = tex["mip_max"]
        o = ffi.new("CUtexObject *")
        cd.check(self.L.cuTexObjectCreate(o, r, t, ffi.NULL), "cuTexObjectCreate")
        return int(o[0]), int(o[0])

    def object_destroy(self, surface: bool, handle: int) -> None:
        if surface:
            cd.check(self.L.cuSurfObjectDestroy(handle), "cuSurfObjectDestroy")
        else:
            cd.check(self.L.cuTexObjectDestroy(handle), "cuTexObjectDestroy")

    # ---- streams ----
    def legacy_stream(self, dev: int) -> object:
        return ffi.NULL

    def stream_create(self, dev: int, flags: int, priority: int) -> object:
        self.activate(dev)
        s = ffi.new("CUstream *")
        cd.check(self.L.cuStreamCreateWithPriority(s, flags, priority), "cuStreamCreate")
        return s[0]

    def stream_destroy(self, s: object) -> None:
        cd.check(self.L.cuStreamDestroy_v2(s), "cuStreamDestroy")

    def stream_sync(self, s: object) -> None:
        cd.check(self.L.cuStreamSynchronize(s), "cuStreamSynchronize")

    def stream_set_attr(self, s: object, attr: int, value: bytes) -> None:
        cd.check(self.L.cuStreamSetAttribute(s, attr, ffi.from_buffer(value)), "cuStreamSetAttribute")

    def stream_get_attr(self, s: object, attr: int) -> bytes:
        out = ffi.new("char[64]")
        cd.check(self.L.cuStreamGetAttribute(s, attr, out), "cuStreamGetAttribute")
        return bytes(ffi.buffer(out))

    def reset_persisting_l2(self, dev: int) -> None:
        self.activate(dev)
        cd.check(self.L.cuCtxResetPersistingL2Cache(), "cuCtxResetPersistingL2Cache")

    def stream_query(self, s: object) -> bool:
        rc = self.L.cuStreamQuery(s)
        if rc == cd.CUDA_ERROR_NOT_READY:
            return False
        cd.check(rc, "cuStreamQuery")
        return True

    def stream_wait_event(self, s: object, e: object, flags: int) -> None:
        cd.check(self.L.cuStreamWaitEvent(s, e, flags), "cuStreamWaitEvent")

    def _run_host_fn(self, user: object) -> None:
        key = int(ffi.cast("uintptr_t", user))
        with self._lock:
            fn, keep = self._host_fns[key]
            if not keep:
                del self._host_fns[key]
        try:
            fn(0)
        except Exception as e:  # a driver thread must never see an exception
            print(f"nvproxy: host function failed: {e}", file=sys.stderr)

    def _host_fn_data(self, fn: Callable[[int], None], keep: bool) -> object:
        """The trampoline's user data for fn (keep: a graph's, called at each launch)."""
        with self._lock:
            self._next_fn += 1
            self._host_fns[self._next_fn] = (fn, keep)
            return ffi.cast("void *", self._next_fn)

    def host_func(self, s: object, fn: Callable[[int], None], keep: bool = False) -> None:
        """keep: captured into a graph, called at each of its launches."""
        cd.check(self.L.cuLaunchHostFunc(s, self._trampoline, self._host_fn_data(fn, keep)), "cuLaunchHostFunc")

    # ---- graphs made by stream capture ----
    def begin_capture(self, s: object, mode: int) -> None:
        cd.check(self.L.cuStreamBeginCapture_v2(s, mode), "cuStreamBeginCapture")

    def begin_capture_to_graph(self, s: object, g: object, deps: list[object], mode: int) -> None:
        cd.check(self.L.cuStreamBeginCaptureToGraph(s, g, self._deps(deps), ffi.NULL, len(deps), mode),
                 "cuStreamBeginCaptureToGraph")

    def _capture_info(self, s: object) -> tuple[object, list[object]]:
        st, g = ffi.new("int *"), ffi.new("CUgraph *")
        deps, n = ffi.new("CUgraphNode **"), ffi.new("size_t *")
        cd.check(self.L.cuStreamGetCaptureInfo_v3(s, st, ffi.NULL, g, deps, ffi.NULL, n), "cuStreamGetCaptureInfo")
        return g[0], [deps[0][i] for i in range(int(n[0]))]

    def capture_graph(self, s: object) -> object:
        """The graph a capture is making (the driver's, while it goes on)."""
        return self._capture_info(s)[0]

    def capture_deps(self, s: object) -> list[object]:
        """The nodes the capture's next work will depend on."""
        return self._capture_info(s)[1]

    def update_capture_deps(self, s: object, deps: list[object], flags: int) -> None:
        cd.check(self.L.cuStreamUpdateCaptureDependencies_v2(s, self._deps(deps), ffi.NULL, len(deps), flags),
                 "cuStreamUpdateCaptureDependencies")

    def end_capture(self, s: object) -> object:
        g = ffi.new("CUgraph *")
        cd.check(self.L.cuStreamEndCapture(s, g), "cuStreamEndCapture")
        return g[0]

    def capture_status(self, s: object) -> tuple[int, int]:
        """(cudaStreamCaptureStatus, capture id)."""
        st, cid = ffi.new("int *"), ffi.new("unsigned long long *")
        rc = self.L.cuStreamGetCaptureInfo_v3(s, st, cid, ffi.NULL, ffi.NULL, ffi.NULL, ffi.NULL)
        cd.check(rc, "cuStreamGetCaptureInfo")
        return int(st[0]), int(cid[0])

    def graph_instantiate(self, g: object, flags: int) -> object:
        x = ffi.new("CUgraphExec *")
        cd.check(self.L.cuGraphInstantiateWithFlags(x, g, flags), "cuGraphInstantiate")
        return x[0]

    def graph_launch(self, x: object, s: object, upload: bool = False) -> None:
        if upload:
            cd.check(self.L.cuGraphUpload(x, s), "cuGraphUpload")
        else:
            cd.check(self.L.cuGraphLaunch(x, s), "cuGraphLaunch")

    def graph_destroy(self, g: object) -> None:
        cd.check(self.L.cuGraphDestroy(g), "cuGraphDestroy")

    def graph_exec_destroy(self, x: object) -> None:
        cd.check(self.L.cuGraphExecDestroy(x), "cuGraphExecDestroy")

    # ---- graphs built node by node ----
    def graph_create(self, dev: int) -> object:
        self.activate(dev)
        g = ffi.new("CUgraph *")
        cd.check(self.L.cuGraphCreate(g, 0), "cuGraphCreate")
        return g[0]

    def graph_clone(self, g: object) -> object:
        c = ffi.new("CUgraph *")
        cd.check(self.L.cuGraphClone(c, g), "cuGraphClone")
        return c[0]

    @staticmethod
    def _deps(deps: list[object]) -> object:
        return ffi.new("CUgraphNode[]", deps) if deps else ffi.NULL

    def _kernel_params(self, k: GpuKernel, grid: tuple[int, int, int], block: tuple[int, int, int], shmem: int,
                       params: bytes) -> tuple[object, object]:
        """The node's parameters, and what must stay alive until the driver has taken them."""
        buf = ffi.new("char[]", params or b"\0")
        ptrs = ffi.new("void *[]", [buf + o for o, _ in k.params] or [ffi.NULL])
        kp = ffi.new("CUDA_KERNEL_NODE_PARAMS *")
        kp.func = k.handle
        kp.gridDimX, kp.gridDimY, kp.gridDimZ = grid
        kp.blockDimX, kp.blockDimY, kp.blockDimZ = block
        kp.sharedMemBytes = shmem
        kp.kernelParams = ptrs
        return kp, (buf, ptrs)

    def graph_add_kernel(self, g: object, deps: list[object], k: GpuKernel, grid: tuple[int, int, int],
                         block: tuple[int, int, int], shmem: int, params: bytes) -> object:
        n = ffi.new("CUgraphNode *")
        kp, _alive = self._kernel_params(k, grid, block, shmem, params)
        cd.check(self.L.cuGraphAddKernelNode_v2(n, g, self._deps(deps), len(deps), kp), "cuGraphAddKernelNode")
        return n[0]

    def graph_exec_kernel(self, x: object, node: object, k: GpuKernel, grid: tuple[int, int, int],
                          block: tuple[int, int, int], shmem: int, params: bytes) -> None:
        kp, _alive = self._kernel_params(k, grid, block, shmem, params)
        cd.check(self.L.cuGraphExecKernelNodeSetParams_v2(x, node, kp), "cuGraphExecKernelNodeSetParams")

    def graph_add_memcpy(self, g: object, deps: list[object], dst: int, src: int, width: int, height: int,
                         depth: int, dpitch: int, spitch: int, drows: int, srows: int) -> object:
        c = ffi.new("CUDA_MEMCPY3D *")
        c.srcMemoryType = c.dstMemoryType = cd.CU_MEMORYTYPE_UNIFIED
        c.srcDevice, c.srcPitch, c.srcHeight = src, spitch, srows
        c.dstDevice, c.dstPitch, c.dstHeight = dst, dpitch, drows
        c.WidthInBytes, c.Height, c.Depth = width, height, depth
        n = ffi.new("CUgraphNode *")
        cd.check(self.L.cuGraphAddMemcpyNode(n, g, self._deps(deps), len(deps), c, self._context(self._tls.dev)),
                 "cuGraphAddMemcpyNode")
        return n[0]

    def graph_add_memset(self, g: object, deps: list[object], dst: int, pitch: int, value: int, elsize: int,
                         width: int, height: int) -> object:
        m = ffi.new("CUDA_MEMSET_NODE_PARAMS *")
        m.dst, m.pitch, m.value, m.elementSize, m.width, m.height = dst, pitch, value, elsize, width, height
        n = ffi.new("CUgraphNode *")
        cd.check(self.L.cuGraphAddMemsetNode(n, g, self._deps(deps), len(deps), m, self._context(self._tls.dev)),
                 "cuGraphAddMemsetNode")
        return n[0]

    def graph_add_host(self, g: object, deps: list[object], fn: Callable[[int], None]) -> object:
        h = ffi.new("CUDA_HOST_NODE_PARAMS *")
        h.fn, h.userData = self._trampoline, self._host_fn_data(fn, True)
        n = ffi.new("CUgraphNode *")
        cd.check(self.L.cuGraphAddHostNode(n, g, self._deps(deps), len(deps), h), "cuGraphAddHostNode")
        return n[0]

    def graph_exec_update(self, x: object, g: object) -> int:
        """0, or the CUgraphExecUpdateResult of a failed update."""
        info = ffi.new("CUgraphExecUpdateResultInfo *")
        rc = self.L.cuGraphExecUpdate_v2(x, g, info)
        if rc == cd.CUDA_ERROR_GRAPH_EXEC_UPDATE_FAILURE:
            return int(info.result) or 1
        cd.check(rc, "cuGraphExecUpdate")
        return 0

    def graph_cond_handle(self, g: object, dev: int, default: int, flags: int) -> int:
        h = ffi.new("unsigned long long *")
        cd.check(self.L.cuGraphConditionalHandleCreate(h, g, self._context(dev), default, flags),
                 "cuGraphConditionalHandleCreate")
        return int(h[0])

    def graph_add_conditional(self, g: object, deps: list[object], dev: int, handle: int, ctype: int,
                              size: int) -> tuple[object, list[object]]:
        """A conditional node and the body graphs the driver made with it."""
        p = ffi.new("CUgraphNodeParams *")
        p.type = cd.CU_GRAPH_NODE_TYPE_CONDITIONAL
        c = p.conditional
        c.handle, c.type, c.size, c.ctx = handle, ctype, size, self._context(dev)
        n = ffi.new("CUgraphNode *")
        cd.check(self.L.cuGraphAddNode_v2(n, g, self._deps(deps), ffi.NULL, len(deps), p), "cuGraphAddNode")
        return n[0], [p.conditional.phGraph_out[i] for i in range(size)]

    def graph_nodes(self, g: object) -> list[object]:
        n = ffi.new("size_t *")
        cd.check(self.L.cuGraphGetNodes(g, ffi.NULL, n), "cuGraphGetNodes")
        nodes = ffi.new("CUgraphNode[]", max(int(n[0]), 1))
        cd.check(self.L.cuGraphGetNodes(g, nodes, n), "cuGraphGetNodes")
        return [nodes[i] for i in range(int(n[0]))]

    node_key = handle_value

    def node_in_clone(self, node: object, clone: object) -> object:
        n = ffi.new("CUgraphNode *")
        cd.check(self.L.cuGraphNodeFindInClone(n, node, clone), "cuGraphNodeFindInClone")
        return n[0]

    def graph_node_kind(self, g: object, node: object) -> int:
        """The node's NVP_NODE_* kind (0: one nvproxy does not make itself)."""
        t = ffi.new("int *")
        cd.check(self.L.cuGraphNodeGetType(node, t), "cuGraphNodeGetType")
        return {0: 1, 1: 2, 2: 3, 3: 4, 4: 9, 5: 5, 6: 8, 7: 7, 13: 6}.get(int(t[0]), 0)  # CU_GRAPH_NODE_TYPE_*

    def graph_add_event(self, g: object, deps: list[object], e: object, wait: bool) -> object:
        n = ffi.new("CUgraphNode *")
        add = self.L.cuGraphAddEventWaitNode if wait else self.L.cuGraphAddEventRecordNode
        cd.check(add(n, g, self._deps(deps), len(deps), e), "cuGraphAddEvent*Node")
        return n[0]

    def graph_add_child(self, g: object, deps: list[object], child: object) -> object:
        n = ffi.new("CUgraphNode *")
        cd.check(self.L.cuGraphAddChildGraphNode(n, g, self._deps(deps), len(deps), child), "cuGraphAddChildGraphNode")
        return n[0]

    def graph_add_empty(self, g: object, deps: list[object]) -> object:
        n = ffi.new("CUgraphNode *")
        cd.check(self.L.cuGraphAddEmptyNode(n, g, self._deps(deps), len(deps)), "cuGraphAddEmptyNode")
        return n[0]

    def device_sync(self, dev: int) -> None:
        self.activate(dev)
        cd.check(self.L.cuCtxSynchronize(), "cuCtxSynchronize")

    def capture_relaxed(self) -> contextlib.AbstractContextManager[None]:
        """The calling thread in relaxed capture mode for a while (proxy/handlers/graphs.drain)."""
        return relaxed(self.L)

    # ---- events ----
    def event_create(self, dev: int, flags: int) -> object:
        self.activate(dev)
        e = ffi.new("CUevent *")
        cd.check(self.L.cuEventCreate(e, flags), "cuEventCreate")
        return e[0]

    def event_destroy(self, e: object) -> None:
        cd.check(self.L.cuEventDestroy_v2(e), "cuEventDestroy")

    def event_record(self, e: object, s: object, flags: int) -> None:
        cd.check(self.L.cuEventRecordWithFlags(e, s, flags), "cuEventRecord")

    def event_sync(self, e: object) -> None:
        cd.check(self.L.cuEventSynchronize(e), "cuEventSynchronize")

    def event_query(self, e: object) -> bool:
        rc = self.L.cuEventQuery(e)
        if rc == cd.CUDA_ERROR_NOT_READY:
            return False
        cd.check(rc, "cuEventQuery")
        return True

    def event_elapsed(self, a: object, b: object) -> float:
        ms = ffi.new("float *")
        rc = self.L.cuEventElapsedTime_v2(ms, a, b)
        if rc == cd.CUDA_ERROR_INVALID_VALUE:
            raise CudaError(INVALID_RESOURCE_HANDLE)
        cd.check(rc, "cuEventElapsedTime")
        return float(ms[0])

    # ---- modules and kernels ----
    def module_load(self, dev: int, image: bytes) -> GpuModule:
        self.activate(dev)
        m = ffi.new("CUmodule *")
        parts = fatbin.linked_parts(image)
        rc = self.L.cuModuleLoadData(m, ffi.from_buffer(parts[0] if parts else image))
        if rc == cd.CUDA_ERROR_NO_BINARY_FOR_GPU and parts and len(parts) > 1:
            # device-linked for other GPUs: link the objects again for this one, as the runtime does
            cubin = self._jit_link(parts[1:])
            rc = self.L.cuModuleLoadData(m, ffi.from_buffer(cubin))
        cd.check(rc, "cuModuleLoadData")
        return GpuModule(dev, m[0], image)

    def module_unload(self, mod: GpuModule) -> None:
        self.activate(mod.device)
        cd.check(self.L.cuModuleUnload(mod.handle), "cuModuleUnload")

    def _jit_link(self, fatbins: list[bytes]) -> bytes:
        return self.link(None, [(cd.CU_JIT_INPUT_FATBINARY, f"object{i}", f) for i, f in enumerate(fatbins)])

    def link(self, dev: int | None, inputs: list[tuple[int, str, bytes]]) -> bytes:
        """A link at run time (cuLinkComplete of the program's, on dev; None: the device-linked module's own)."""
        what = "JIT link of a -rdc module" if dev is None else "cuLinkComplete"
        if dev is not None:
            self.activate(dev)
        log = ffi.new("char[]", 4096)
        opts = ffi.new("CUjit_option[]", [cd.CU_JIT_ERROR_LOG_BUFFER, cd.CU_JIT_ERROR_LOG_BUFFER_SIZE_BYTES])
        vals = ffi.new("void *[]", [log, ffi.cast("void *", 4096)])
        st = ffi.new("CUlinkState *")
        cd.check(self.L.cuLinkCreate_v2(2, opts, vals, st), "cuLinkCreate")
        try:
            for kind, name, data in inputs:
                rc = self.L.cuLinkAddData_v2(st[0], kind, ffi.from_buffer(data), len(data), name.encode(), 0,
                                             ffi.NULL, ffi.NULL)
                if rc:
                    self._link_failed(what, rc, log)
                    cd.check(rc, "cuLinkAddData")
            out, size = ffi.new("void **"), ffi.new("size_t *")
            rc = self.L.cuLinkComplete(st[0], out, size)
            if rc:
                self._link_failed(what, rc, log)
            cd.check(rc, "cuLinkComplete")
            return bytes(ffi.buffer(out[0], size[0]))  # (the link state owns it)
        finally:
            self.L.cuLinkDestroy(st[0])

    def _link_failed(self, what: str, rc: int, log: Any) -> None:
        """One line: the driver's error and the linker's log (the driver leaves it empty for some errors)."""
        name = ffi.new("const char **")
        code = ffi.string(name[0]).decode() if self.L.cuGetErrorName(rc, name) == 0 else f"CUresult {rc}"
        said = ffi.string(log).decode(errors="replace").strip().replace("\n", "; ")
        print(f"nvproxy: {what}: {code}" + (f": {said}" if said else ""), file=sys.stderr)

    def kernel_get(self, mod: GpuModule, name: str) -> GpuKernel:
        f = ffi.new("CUfunction *")
        cd.check(self.L.cuModuleGetFunction(f, mod.handle, name.encode()), f"cuModuleGetFunction({name})")
        params: list[tuple[int, int]] = []
        off, size = ffi.new("size_t *"), ffi.new("size_t *")
        while self.L.cuFuncGetParamInfo(f[0], len(params), off, size) == 0:
            params.append((int(off[0]), int(size[0])))
        total = max((o + s for o, s in params), default=0)
        return GpuKernel(name, f[0], params, total)

    def kernel_info(self, k: GpuKernel) -> dict[str, object]:
        v = ffi.new("int *")
        vals = []
        for a in cd.CU_FUNC_ATTRIBUTES:
            cd.check(self.L.cuFuncGetAttribute(v, a, k.handle), "cuFuncGetAttribute")
            vals.append(int(v[0]))
        names = ("max_threads", "shared_static", "const_size", "local_size", "num_regs", "ptx_version",
                 "binary_version", "cache_mode_ca", "max_dyn_shared", "preferred_carveout")
        info: dict[str, object] = dict(zip(names, vals, strict=True))
        info["params"] = k.params
        info["param_size"] = k.param_size
        return info

    def global_get(self, mod: GpuModule, name: str) -> tuple[int, int]:
        p, n = ffi.new("CUdeviceptr *"), ffi.new("size_t *")
        cd.check(self.L.cuModuleGetGlobal_v2(p, n, mod.handle, name.encode()), f"cuModuleGetGlobal({name})")
        return int(p[0]), int(n[0])

    def launch(self, k: GpuKernel, grid: tuple[int, int, int], block: tuple[int, int, int], shmem: int,
               stream: object, params: bytes, cooperative: bool) -> None:
        buf = ffi.from_buffer(params)
        if cooperative:
            ptrs = ffi.new("void *[]", [buf + o for o, _ in k.params] or [ffi.NULL])
            rc = self.L.cuLaunchCooperativeKernel(k.handle, *grid, *block, shmem, stream, ptrs)
        elif params:
            size = ffi.new("size_t *", len(params))
            extra = ffi.new("void *[5]", [ffi.cast("void *", cd.CU_LAUNCH_PARAM_BUFFER_POINTER), buf,
                                          ffi.cast("void *", cd.CU_LAUNCH_PARAM_BUFFER_SIZE), size,
                                          ffi.cast("void *", cd.CU_LAUNCH_PARAM_END)])
            rc = self.L.cuLaunchKernel(k.handle, *grid, *block, shmem, stream, ffi.NULL, extra)
        else:
            rc = self.L.cuLaunchKernel(k.handle, *grid, *block, shmem, stream, ffi.NULL, ffi.NULL)
        cd.check(rc, f"cuLaunchKernel({k.name})")

    def occupancy(self, k: GpuKernel, block: int, smem: int, flags: int) -> int:
        n = ffi.new("int *")
        cd.check(self.L.cuOccupancyMaxActiveBlocksPerMultiprocessorWithFlags(n, k.handle, block, smem, flags),
                 "cuOccupancyMaxActiveBlocksPerMultiprocessor")
        return int(n[0])

    def func_set_attr(self, k: GpuKernel, attr: int, value: int) -> None:
        cd.check(self.L.cuFuncSetAttribute(k.handle, attr, value), "cuFuncSetAttribute")

    def func_set_cache(self, k: GpuKernel, config: int) -> None:
        cd.check(self.L.cuFuncSetCacheConfig(k.handle, config), "cuFuncSetCacheConfig")

    # ---- context settings ----
    def set_limit(self, limit: int, value: int) -> None:
        cd.check(self.L.cuCtxSetLimit(limit, value), "cuCtxSetLimit")

    def get_limit(self, limit: int) -> int:
        v = ffi.new("size_t *")
        cd.check(self.L.cuCtxGetLimit(v, limit), "cuCtxGetLimit")
        return int(v[0])

    def priority_range(self) -> tuple[int, int]:
        lo, hi = ffi.new("int *"), ffi.new("int *")
        cd.check(self.L.cuCtxGetStreamPriorityRange(lo, hi), "cuCtxGetStreamPriorityRange")
        return int(lo[0]), int(hi[0])

    def set_cache_config(self, c: int) -> None:
        cd.check(self.L.cuCtxSetCacheConfig(c), "cuCtxSetCacheConfig")

    def get_cache_config(self) -> int:
        v = ffi.new("int *")
        cd.check(self.L.cuCtxGetCacheConfig(v), "cuCtxGetCacheConfig")
        return int(v[0])

    def peer(self, what: int, dev: int, peer: int) -> int:
        if what == 0:
            v = ffi.new("int *")
            cd.check(self.L.cuDeviceCanAccessPeer(v, dev, peer), "cuDeviceCanAccessPeer")
            return int(v[0])
        ctx = self._context(peer)
        if what == 1:
            cd.check(self.L.cuCtxEnablePeerAccess(ctx, 0), "cuCtxEnablePeerAccess")
        else:
            cd.check(self.L.cuCtxDisablePeerAccess(ctx), "cuCtxDisablePeerAccess")
        return 0

    def profiler(self, start: bool) -> None:
        cd.check(self.L.cuProfilerStart() if start else self.L.cuProfilerStop(), "cuProfiler")
