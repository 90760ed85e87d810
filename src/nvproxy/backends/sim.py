"""The sim backend: a CPU model of a CUDA device, so the whole stack runs where
there is no GPU (CI).

Device memory is host memory mapped at the arena addresses of a real device;
streams execute their work in order at submission, so every ordering rule
holds trivially; events carry host timestamps.  Kernels run only where a
Python implementation is registered (nvproxy.sim_kernels); any other launch
fails with a clear error naming the kernel.
"""

from __future__ import annotations

import bisect
import contextlib
import functools
import mmap
import os
import struct
import sys
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

from .. import fatbin, sim_kernels, tensor_map
from ..errors import (
    ASSERT,
    HOST_MEMORY_ALREADY_REGISTERED,
    ILLEGAL_ADDRESS,
    ILLEGAL_STATE,
    INVALID_DEVICE_FUNCTION,
    INVALID_KERNEL_IMAGE,
    INVALID_RESOURCE_HANDLE,
    INVALID_VALUE,
    MEMORY_ALLOCATION,
    NO_KERNEL_IMAGE,
    NOT_READY,
    STREAM_CAPTURE_INVALIDATED,
    STREAM_CAPTURE_UNSUPPORTED,
    SYMBOL_NOT_FOUND,
    UNKNOWN,
    CudaError,
)
from ..proxy import libc
from ..proxy.arena import FreeList
from ..tensor_map import TensorMapArgs
from . import sim_driver
from .sim_arrays import SimArray, SimObject

GRANULE = 2 << 20
SIM_MEMORY = int(os.environ.get("NVPROXY_SIM_MEMORY") or 16384) << 20  # (MiB: small in tests of memory limits)
# the proxy's own device memory, outside the arenas (spare_alloc): below the module variables
SPARE_BASE = 0x0A0000000000
# module variables: outside every arena and below the host image buffer (16 TiB up, checkpoint/hostimage.py),
# which a proxy registers as pinned memory: an overlap made the sim's addresses ambiguous
GLOBALS_BASE = 0x0C0000000000

# cudaDeviceAttr values of the modelled device (an H100-class part)
_ATTRS = {
    1: 1024, 2: 1024, 3: 1024, 4: 64, 5: 2147483647, 6: 65535, 7: 65535, 8: 49152, 9: 65536, 10: 32,
    11: 2147483647, 12: 65536, 13: 1980000, 14: 512, 15: 1, 16: 132, 17: 0, 18: 0, 19: 1, 20: 0,
    21: 131072, 22: 131072, 23: 65536, 24: 16384, 25: 16384, 26: 16384, 27: 32768, 28: 32768, 29: 2048,
    30: 512, 31: 1, 32: 1, 33: 0, 34: 0, 35: 0, 36: 2619000, 37: 5120, 38: 52428800, 39: 2048, 40: 3,
    41: 1, 42: 32768, 43: 2048, 45: 32768, 46: 32768, 47: 8192, 48: 8192, 49: 32768, 50: 0, 51: 32,
    52: 32768, 53: 32768, 54: 2046, 55: 32768, 56: 131072, 57: 65536, 58: 16384, 59: 16384, 60: 16384,
    61: 32768, 62: 2048, 63: 32768, 64: 32768, 65: 2048, 66: 32768, 67: 32768, 68: 2046, 69: 268435456,
    70: 131072, 71: 65000, 72: 2097120, 73: 32768, 74: 32768, 75: 9, 76: 0, 77: 32768, 78: 1, 79: 1,
    80: 1, 81: 233472, 82: 65536, 83: 1, 84: 0, 85: 0, 86: 0, 87: 2, 88: 0, 89: 1, 90: 1, 91: 1,
    95: 1, 97: 232448, 98: 0, 99: 1, 100: 0, 101: 0, 106: 32, 108: 32505856, 109: 134213632, 111: 1024,
    112: 1, 113: 1, 114: 1, 115: 1, 116: 1, 117: 1, 118: 0, 119: 9, 120: 1, 121: 1, 125: 1, 126: 4,
    130: 0, 131: -1, 133: 0, 134: -1, 139: 0x233010DE, 140: 0,
}
_LIMITS = {0: 1024, 1: 1 << 20, 2: 8 << 20, 3: 2, 4: 2048, 5: 64, 6: 0}


class SimBacking:
    """Physical memory of the modelled device: anonymous mappings."""

    granularity = GRANULE

    def __init__(self, mem: SimMemory, capacity: int, dev: int) -> None:
        self.mem, self.capacity, self.used, self.dev = mem, capacity, 0, dev
        self.fds: dict[int, int] = {}  # id(mapping) -> its memfd
        # the program's VMM reservations (vmm.py): device address -> (size, host address space standing for it),
        # where its mappings are placed side by side, as one buffer to kernels and copies
        self.windows: dict[int, tuple[int, int]] = {}

    def create(self, size: int) -> mmap.mmap:
        if self.used + size > self.capacity:
            raise CudaError(MEMORY_ALLOCATION)
        self.used += size
        fd = os.memfd_create("nvproxy-sim-device", os.MFD_CLOEXEC)  # (a memfd: CUDA IPC hands it over)
        try:
            os.ftruncate(fd, size)
            m = mmap.mmap(fd, size)
        except BaseException:
            os.close(fd)
            raise
        self.fds[id(m)] = fd
        return m

    def adopt(self, fd: int, size: int) -> mmap.mmap:
        """Memory another proxy made (a migration's, shared through CUDA IPC): the same memfd."""
        self.used += size
        m = mmap.mmap(fd, size)
        self.fds[id(m)] = os.dup(fd)
        return m

    def export_fd(self, handle: mmap.mmap) -> int:
        return os.dup(self.fds[id(handle)])

    def map(self, va: int, size: int, handle: object) -> None:
        assert isinstance(handle, mmap.mmap)
        win = self._window_of(va)
        if win is None:
            self.mem.add(va, size, memoryview(handle), owner=self.dev)
            return
        host = win + va
        libc.map_over(self.fds[id(handle)], host, size, 0)
        self.mem.add(va, size, libc.buffer(host, size), owner=self.dev, host=host)

    def _window_of(self, va: int) -> int | None:
        """The host address minus the device address of the reservation holding va (None: none does)."""
        for base, (n, host) in self.windows.items():
            if base <= va < base + n:
                return host - base
        return None

    def reserved(self, va: int, size: int) -> None:
        self.windows[va] = (size, libc.reserve_anywhere(size))

    def unreserved(self, va: int) -> None:
        size, host = self.windows.pop(va)
        libc.unmap(host, size)

    def grant(self, dev: int, mappings: list[tuple[int, int]]) -> None:
        self.mem.peers.setdefault(self.dev, set()).add(dev)  # (all of this device's mappings, as the driver's)

    def unmap(self, va: int, size: int) -> None:
        self.mem.remove(va)
        win = self._window_of(va)
        if win is not None:
            libc.hole(win + va, size)

    def release(self, handle: object) -> None:
        assert isinstance(handle, mmap.mmap)
        self.used -= len(handle)
        os.close(self.fds.pop(id(handle)))
        handle.close()


class SimMemory:
    """Every range the modelled devices can address: arena mappings, module
    variables, and host memory registered with them (mapped in this process).
    A device's memory (owner) is reached by kernels of other devices only once
    they were granted access (peer access, a pool's access, CUDA IPC), as VMM
    memory on GPUs: there the kernel faults (an illegal address)."""

    def __init__(self) -> None:
        self.bases: list[int] = []
        self.ranges: dict[int, tuple[int, memoryview, int | None]] = {}
        self.hosts: dict[int, int] = {}  # base -> host address, of ranges placed in a VMM reservation's window
        self.peers: dict[int, set[int]] = {}  # device -> other devices its kernels may reach memory of
        self.lock = threading.Lock()  # (a concurrent checkpoint copies on a thread of its own while ranges change)

    def add(self, base: int, size: int, view: memoryview, owner: int | None = None, host: int | None = None) -> None:
        """Overlapping ranges are refused (the driver's answer for host memory; a sim bug otherwise).  host: where
        view lies in this process, for ranges that adjacent ones continue (VMM mappings side by side)."""
        with self.lock:
            self._add(base, size, view, owner)
            if host is not None:
                self.hosts[base] = host

    def _add(self, base: int, size: int, view: memoryview, owner: int | None) -> None:
        i = bisect.bisect_right(self.bases, base)
        if (i > 0 and self.bases[i - 1] + self.ranges[self.bases[i - 1]][0] > base) or (
            i < len(self.bases) and self.bases[i] < base + size
        ):
            raise CudaError(HOST_MEMORY_ALREADY_REGISTERED, f"sim: {base:#x}+{size} overlaps a range it knows")
        bisect.insort(self.bases, base)
        self.ranges[base] = (size, view, owner)

    def remove(self, base: int) -> None:
        with self.lock:
            self.bases.remove(base)
            self.ranges[base][1].release()
            del self.ranges[base]
            self.hosts.pop(base, None)

    def view(self, addr: int, n: int, dev: int | None = None) -> memoryview:
        """dev: a kernel of that device reads or writes it (copies reach every device's memory)."""
        with self.lock:
            i = bisect.bisect_right(self.bases, addr) - 1
            if i >= 0:
                base = self.bases[i]
                size, v, owner = self.ranges[base]
                if dev is not None and owner is not None and owner != dev and dev not in self.peers.get(owner, ()):
                    raise CudaError(ILLEGAL_ADDRESS, f"sim: device {dev} has no access to {addr:#x} (device {owner})")
                if addr + n <= base + size:
                    return v[addr - base : addr - base + n]
                if self._continued(i, addr + n):
                    return libc.buffer(self.hosts[base] + addr - base, n)
        raise CudaError(ILLEGAL_ADDRESS, f"sim: no device-accessible memory at {addr:#x}+{n}")

    def _continued(self, i: int, end: int) -> bool:
        """Do the ranges from the i-th on continue each other, in device and host addresses alike (VMM mappings
        side by side in a reservation, one owner's), up to end?"""
        base = self.bases[i]
        owner = self.ranges[base][2]
        while base in self.hosts:
            size = self.ranges[base][0]
            if base + size >= end:
                return True
            nxt = base + size
            if nxt not in self.hosts or self.hosts[nxt] != self.hosts[base] + size or self.ranges[nxt][2] != owner:
                return False
            base = nxt
        return False


class DeviceMemory:
    """SimMemory as one device's kernels see it."""

    def __init__(self, mem: SimMemory, dev: int) -> None:
        self.mem, self.dev = mem, dev

    def view(self, addr: int, n: int) -> memoryview:
        return self.mem.view(addr, n, self.dev)


@dataclass
class SimCapture:
    """A stream capture in progress: the work submitted to it, kept instead of run."""

    id: int
    graph: SimGraph  # what it makes (a new graph, or the one captured into): its ops are the capture's
    streams: list[SimStream] = field(default_factory=list)  # the origin and the streams that joined
    invalid: bool = False
    ended: bool = False
    mode: int = 0  # cudaStreamCaptureMode (0: global)
    thread: int = 0  # the thread that began it
    deps: list[int] | None = None  # set by cudaStreamUpdateCaptureDependencies, until the next work

    @property
    def ops(self) -> list[Callable[[], None]]:
        return self.graph.ops


@dataclass
class SimStream:
    device: int
    flags: int = 0
    priority: int = 0
    attrs: dict[int, bytes] = field(default_factory=dict)
    legacy: bool = False
    capture: SimCapture | None = None


@dataclass
class SimEvent:
    device: int
    flags: int
    stamp: float | None = None
    capture: SimCapture | None = None  # recorded in a capture: a stream waiting on it joins that capture


@dataclass
class SimGraph:
    ops: list[Callable[[], None]]
    conds: dict[int, tuple[int, int]] = field(default_factory=dict)  # conditional handle -> (default, flags)
    values: dict[int, int] = field(default_factory=dict)  # an executable graph's conditional values
    root: SimGraph | None = None  # a conditional node's body: the graph the node is in, at the top


@dataclass
class SimKernel:
    name: str
    info: fatbin.Kernel
    symbols: dict[str, tuple[int, int]]
    attrs: dict[int, int] = field(default_factory=dict)
    device: int | None = None  # (its module's)


@dataclass
class SimModule:
    device: int
    parsed: fatbin.Module
    globals: dict[str, tuple[int, int]] = field(default_factory=dict)


def _pattern(value: int, elsize: int, width: int) -> bytes:
    """A row of width elements of elsize bytes, each value."""
    return (value & ((1 << (8 * elsize)) - 1)).to_bytes(elsize, "little") * width


def _sim_devices() -> list[int]:
    """NVPROXY_SIM_DEVICES modelled devices (default 1), of which CUDA_VISIBLE_DEVICES, where set, leaves the
    ones it lists (renumbered from 0, as the driver does): their indices among all."""
    n = int(os.environ.get("NVPROXY_SIM_DEVICES") or 1)
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    if visible is None:
        return list(range(n))
    return [int(d) for d in visible.split(",") if d.strip().isdigit() and int(d) < n]


class SimBackend:
    name = "sim"
    frees_wait_for_device = False  # work runs at submission: nothing can still be using it

    def __init__(self) -> None:
        sim_kernels.load_from_env()
        self.mem = SimMemory()
        self.physical = _sim_devices()  # (a device's uuid says which it is)
        self.backings = [SimBacking(self.mem, SIM_MEMORY, i) for i in range(len(self.physical))]
        # like the driver, place module variables wherever this process likes: a
        # restored process finds them elsewhere (exercises the proxy's relocation)
        self.globals_space = FreeList(GLOBALS_BASE + (os.getpid() % 1024 << 30), 1 << 30)
        self.spare_space = FreeList(SPARE_BASE, 1 << 40)
        self.spares: dict[int, tuple[int, mmap.mmap]] = {}
        self.sticky = 0
        self._captures = 0
        self._open: list[SimCapture] = []  # captures begun and not yet ended
        self._relaxed = threading.local()  # (capture_relaxed: the calling thread's capture mode is relaxed)
        self.text: list[str] = []
        self._unwritten: list[str] = []  # kernel printf text the "driver" writes at the next wait (_write_text)
        self._text_notify: Callable[[bool], None] = lambda pending: None
        self._handles: dict[int, object] = {}
        self._fast_callbacks: list[object] = []
        self.limits = dict(_LIMITS)
        self.cache_config = 0
        self.objects: dict[int, SimObject] = {}  # texture and surface objects by value
        self.cond_values: dict[int, int] = {}  # the running executable graph's conditional values
        self._next_object = 0

    # ---- devices ----
    def device_count(self) -> int:
        return len(self.backings)

    def driver_version(self) -> int:
        return 13000

    def device_props(self, dev: int) -> tuple[str, bytes, int, list[int]]:
        attrs = [0] * 160
        for k, v in _ATTRS.items():
            attrs[k] = v
        return (*self.device_identity(dev), SIM_MEMORY, attrs)

    def total_memory(self, dev: int) -> int:
        return SIM_MEMORY

    def device_identity(self, dev: int) -> tuple[str, bytes]:
        return "nvproxy sim device", bytes([self.physical[dev], *range(1, 16)])

    def activate(self, dev: int) -> None:
        pass

    def backing(self, dev: int) -> SimBacking:
        return self.backings[dev]

    def reserve(self, dev: int, base: int, size: int) -> int:
        return base

    def mem_info(self, dev: int) -> tuple[int, int]:
        b = self.backings[dev]
        return b.capacity - b.used, b.capacity

    def spare_alloc(self, dev: int, size: int) -> int:
        """Device memory outside the arena, for the proxy's own use (a concurrent checkpoint's snapshot)."""
        va = self.spare_space.take(size, GRANULE)
        try:
            m = self.backings[dev].create(size)
        except BaseException:
            self.spare_space.give(va, size)
            raise
        self.mem.add(va, size, memoryview(m), owner=dev)
        self.spares[va] = (dev, m)
        return va

    def spare_free(self, dev: int, ptr: int) -> None:
        _dev, m = self.spares.pop(ptr)
        self.mem.remove(ptr)
        self.spare_space.give(ptr, len(m))
        self.backings[dev].release(m)

    def check(self) -> None:
        if self.sticky:
            raise CudaError(self.sticky)

    def take_text(self) -> bytes:
        self._text_notify(False)
        if not self.text:
            return b""
        out = "".join(self.text).encode()
        self.text.clear()
        return out

    def pending_text(self) -> bytes:
        return "".join(self.text).encode()

    def put_text(self, text: bytes) -> None:
        if text:
            self.text.insert(0, text.decode(errors="replace"))
            self._text_notify(True)

    # ---- host memory ----
    def host_register(self, addr: int, size: int, read_only: bool = False) -> None:
        self.mem.add(addr, size, libc.buffer(addr, size))

    def host_unregister(self, addr: int, size: int) -> None:
        self.mem.remove(addr)

    # ---- copies ----
    def _copy_view(self, addr: int, n: int) -> memoryview:
        try:
            return self.mem.view(addr, n)
        except CudaError:
            raise CudaError(INVALID_VALUE, f"sim: invalid address {addr:#x}+{n}") from None

    @staticmethod
    def _kept(stream: SimStream | None, op: Callable[[], None]) -> bool:
        """Work submitted to a capturing stream goes into the capture instead of running."""
        if stream is None or stream.capture is None:
            return False
        stream.capture.ops.append(op)
        stream.capture.deps = None
        return True

    def copy_now(self, dev: int, copies: list[tuple[int, int, int]]) -> None:
        """(dst, src, bytes) copies done before this returns, ordered after nothing the application submitted."""
        for dst, src, n in copies:
            self.memcpy(dst, src, n, None)

    def memcpy(self, dst: int, src: int, n: int, stream: SimStream | None) -> None:
        if self._kept(stream, functools.partial(self.memcpy, dst, src, n, None)):
            return
        self.check()
        self._copy_view(dst, n)[:] = self._copy_view(src, n)

    def memcpy2d(self, dst: int, dpitch: int, src: int, spitch: int, width: int, height: int,
                 stream: SimStream | None) -> None:
        if self._kept(stream, functools.partial(self.memcpy2d, dst, dpitch, src, spitch, width, height, None)):
            return
        self.check()
        for row in range(height):
            self._copy_view(dst + row * dpitch, width)[:] = self._copy_view(src + row * spitch, width)

    def memset(self, ptr: int, value: int, n: int, stream: SimStream | None) -> None:
        if self._kept(stream, functools.partial(self.memset, ptr, value, n, None)):
            return
        self.check()
        v = self._copy_view(ptr, n)
        v[:] = bytes([value]) * n

    def memset2d(self, ptr: int, pitch: int, value: int, width: int, height: int, stream: SimStream) -> None:
        for row in range(height):
            self.memset(ptr + row * pitch, value, width, stream)

    def memset_elem(self, ptr: int, pitch: int, value: int, elsize: int, width: int, height: int,
                    stream: SimStream | None) -> None:
        if self._kept(stream, functools.partial(self.memset_elem, ptr, pitch, value, elsize, width, height, None)):
            return
        self.check()
        self._fill(ptr, pitch, _pattern(value, elsize, width), height)

    # ---- what the driver API asks of a driver (sim_driver.py) ----
    def stream_memop(self, kind: int, addr: int, value: int, flags: int, stream: SimStream | None) -> None:
        self.check()
        sim_driver.stream_memop(self._copy_view, kind, addr, value, flags)

    def link(self, dev: int, inputs: list[tuple[int, str, bytes]]) -> bytes:
        return sim_driver.link(inputs)

    def tensor_map(self, dev: int, args: TensorMapArgs) -> bytes:
        return tensor_map.encode(args)

    def _fill(self, dst: int, pitch: int, pattern: bytes, height: int) -> None:
        for row in range(height):
            self._copy_view(dst + row * pitch, len(pattern))[:] = pattern

    # ---- CUDA IPC: device memory is memfds, events are always complete ----
    def export_fd(self, dev: int, handle: mmap.mmap) -> int:
        return self.backings[dev].export_fd(handle)

    def import_fd(self, dev: int, fd: int, size: int) -> mmap.mmap:
        return mmap.mmap(fd, size)

    def ipc_release(self, dev: int, handle: mmap.mmap) -> None:
        handle.close()

    def ipc_event_handle(self, e: SimEvent) -> bytes:
        if not e.flags & 4:  # cudaEventInterprocess
            raise CudaError(INVALID_RESOURCE_HANDLE, "sim: not an interprocess event")
        return b"nvproxy sim event".ljust(64, b"\0")

    def ipc_event_open(self, dev: int, handle: bytes) -> SimEvent:
        if not handle.startswith(b"nvproxy sim event"):
            raise CudaError(INVALID_VALUE, "sim: not an IPC event handle of the sim")
        return SimEvent(dev, 6)

    # ---- CUDA arrays, texture and surface objects (sim_arrays.py) ----
    def array_create(self, dev: int, width: int, height: int, depth: int, fmt: Any, flags: int) -> SimArray:
        return SimArray(width, height, depth, fmt)

    def array_destroy(self, a: SimArray) -> None:
        pass

    def _side_row(self, side: tuple[Any, ...], y: int, z: int, width: int) -> memoryview:
        if side[0] == "array":
            _k, a, x, y0, z0 = side
            return a.rows(x, y0 + y, z0 + z, width)
        _k, addr, pitch, rows, x, y0, z0 = side
        return self._copy_view(addr + ((z0 + z) * rows + y0 + y) * pitch + x, width)

    def copy3d(self, src: tuple[Any, ...], dst: tuple[Any, ...], width: int, height: int, depth: int,
               stream: SimStream | None) -> None:
        if self._kept(stream, functools.partial(self.copy3d, src, dst, width, height, depth, None)):
            return
        self.check()
        for z in range(depth):
            for y in range(height):
                self._side_row(dst, y, z, width)[:] = self._side_row(src, y, z, width)

    def array_read(self, a: SimArray, shape: tuple[int, int, int]) -> bytes:
        return bytes(a.data)

    def array_write(self, a: SimArray, shape: tuple[int, int, int], data: bytes) -> None:
        a.data[:] = data

    def object_create(self, dev: int, surface: bool, res: tuple[Any, ...], tex: dict[str, Any] | None
                      ) -> tuple[int, SimObject]:
        """Values from a counter that never goes back (a restore must fill the gaps)."""
        o = SimObject(surface, res, tex, self.mem)
        self._next_object += 1
        self.objects[self._next_object] = o
        return self._next_object, o

    def object_destroy(self, surface: bool, handle: SimObject) -> None:
        for v, o in list(self.objects.items()):
            if o is handle:
                del self.objects[v]

    # ---- streams and events: work runs at submission ----
    def legacy_stream(self, dev: int) -> SimStream:
        return SimStream(dev, legacy=True)

    def stream_create(self, dev: int, flags: int, priority: int) -> SimStream:
        return SimStream(dev, flags, priority)

    STREAM_ATTRS = (1, 3, 8, 9, 10)  # access policy window, sync policy, priority, mem sync domain map/domain

    def stream_set_attr(self, s: SimStream, attr: int, value: bytes) -> None:
        if attr not in self.STREAM_ATTRS:
            raise CudaError(INVALID_VALUE)
        s.attrs[attr] = bytes(value)
        if attr == 8:
            s.priority = struct.unpack_from("<i", value)[0]

    def stream_get_attr(self, s: SimStream, attr: int) -> bytes:
        if attr not in self.STREAM_ATTRS:
            raise CudaError(INVALID_VALUE)
        if attr == 8:
            return struct.pack("<i", s.priority).ljust(64, b"\0")
        return s.attrs.get(attr, bytes(64))

    def reset_persisting_l2(self, dev: int) -> None:
        self.check()

    def stream_destroy(self, s: SimStream) -> None:
        pass

    def _not_while_capturing(self, s: SimStream) -> None:
        if s.capture is not None:  # as the driver does: the capture is invalidated
            s.capture.invalid = True
            raise CudaError(STREAM_CAPTURE_UNSUPPORTED)
        if s.legacy:  # (the legacy stream encompasses every blocking stream, capturing ones too)
            self._refuse([c for c in self._open if c.streams[0].device == s.device
                          and any(not x.flags & 1 for x in c.streams)])

    def _refuse(self, captures: list[SimCapture]) -> None:
        """As the driver does to a call that would wait for capturing work: the captures are invalidated."""
        if captures:
            for c in captures:
                c.invalid = True
            raise CudaError(STREAM_CAPTURE_UNSUPPORTED)

    @contextlib.contextmanager
    def capture_relaxed(self) -> Iterator[None]:
        before = getattr(self._relaxed, "on", False)
        self._relaxed.on = True
        try:
            yield
        finally:
            self._relaxed.on = before

    def _unsafe(self) -> None:
        """As the driver does to a wait in a thread not in relaxed mode while another thread's global-mode capture
        is on: refused, and the capture invalidated."""
        if not getattr(self._relaxed, "on", False):
            me = threading.get_ident()
            self._refuse([c for c in self._open if c.mode == 0 and c.thread != me])

    def stream_sync(self, s: SimStream) -> None:
        self._not_while_capturing(s)
        self._unsafe()
        self._write_text()
        self.check()

    def stream_query(self, s: SimStream) -> bool:
        self._not_while_capturing(s)
        self.check()
        return True

    def stream_wait_event(self, s: SimStream, e: SimEvent, flags: int) -> None:
        if e.capture is not None and not e.capture.ended and s.capture is None:
            s.capture = e.capture  # the stream joins the capture (fork)
            e.capture.streams.append(s)
            return
        self.check()

    def host_func(self, s: SimStream, fn: Callable[[int], None], keep: bool = False) -> None:
        op = lambda: fn(self.sticky)  # noqa: E731
        op.nvp_kind = 4  # type: ignore[attr-defined]  (a host node, if captured)
        if self._kept(s, op):
            return
        fn(self.sticky)

    # ---- graphs made by stream capture ----
    def begin_capture(self, s: SimStream, mode: int) -> None:
        if s.legacy:
            raise CudaError(STREAM_CAPTURE_UNSUPPORTED)
        if s.capture is not None:
            raise CudaError(ILLEGAL_STATE)
        self._captures += 1
        s.capture = SimCapture(self._captures, SimGraph([]), streams=[s], mode=mode, thread=threading.get_ident())
        self._open.append(s.capture)

    def begin_capture_to_graph(self, s: SimStream, g: SimGraph, deps: list[int], mode: int) -> None:
        self.begin_capture(s, mode)
        assert s.capture is not None
        s.capture.graph = g  # (ops run in the order they were added: after deps, which are in g already)

    def capture_graph(self, s: SimStream) -> SimGraph:
        assert s.capture is not None
        return s.capture.graph

    def capture_deps(self, s: SimStream) -> list[int]:
        """The sim runs a graph's ops in order: the last node is what the next work follows."""
        assert s.capture is not None
        c = s.capture
        if c.deps is not None:
            return list(c.deps)
        nodes = self.graph_nodes(c.graph)
        return nodes[-1:]

    def update_capture_deps(self, s: SimStream, deps: list[int], flags: int) -> None:
        assert s.capture is not None
        c = s.capture
        c.deps = sorted(set(deps) | (set(self.capture_deps(s)) if flags == 0 else set()))

    def end_capture(self, s: SimStream) -> SimGraph:
        c = s.capture
        if c is None or c.streams[0] is not s:
            raise CudaError(ILLEGAL_STATE)
        for joined in c.streams:
            joined.capture = None
        c.ended = True
        self._open.remove(c)
        if c.invalid:
            raise CudaError(STREAM_CAPTURE_INVALIDATED)
        return c.graph

    def capture_status(self, s: SimStream) -> tuple[int, int]:
        c = s.capture
        # the driver gives a capture's id only while it is active
        return (0, 0) if c is None else (2, 0) if c.invalid else (1, c.id)

    def graph_instantiate(self, g: SimGraph, flags: int) -> SimGraph:
        return SimGraph(list(g.ops), dict(g.conds), {h: default for h, (default, _f) in g.conds.items()})

    def graph_launch(self, x: SimGraph, s: SimStream, upload: bool = False) -> None:
        if upload:
            return
        for h, (default, flags) in x.conds.items():
            if flags & 1:  # cudaGraphCondAssignDefault
                x.values[h] = default
        outer, self.cond_values = self.cond_values, x.values  # (what its kernels and conditional nodes see)
        try:
            for op in x.ops:
                if not self._kept(s, op):
                    op()
        finally:
            self.cond_values = outer

    def graph_destroy(self, g: SimGraph) -> None:
        pass

    # ---- graphs built node by node: a node is its index among the graph's ops, which
    # run in the order they were added (an order that respects every dependency) ----
    def graph_create(self, dev: int) -> SimGraph:
        return SimGraph([])

    def graph_clone(self, g: SimGraph) -> SimGraph:
        return SimGraph(list(g.ops))

    def _node(self, g: SimGraph, op: Callable[[], None], kind: int = 0) -> int:
        if kind:
            op.nvp_kind = kind  # type: ignore[attr-defined]
        g.ops.append(op)
        return len(g.ops) - 1

    def graph_add_kernel(self, g: SimGraph, deps: list[int], k: SimKernel, grid: tuple[int, int, int],
                         block: tuple[int, int, int], shmem: int, params: bytes) -> int:
        return self._node(g, functools.partial(self.launch, k, grid, block, shmem, None, params, False))

    def graph_exec_kernel(self, x: SimGraph, node: int, k: SimKernel, grid: tuple[int, int, int],
                          block: tuple[int, int, int], shmem: int, params: bytes) -> None:
        x.ops[node] = functools.partial(self.launch, k, grid, block, shmem, None, params, False)

    def graph_add_memcpy(self, g: SimGraph, deps: list[int], dst: int, src: int, width: int, height: int,
                         depth: int, dpitch: int, spitch: int, drows: int, srows: int) -> int:
        for at in (dst, dst + ((depth - 1) * drows + height - 1) * dpitch + width - 1,
                   src, src + ((depth - 1) * srows + height - 1) * spitch + width - 1):
            self._copy_view(at, 1)  # (the driver checks the addresses when the node is added)

        def copy() -> None:
            for z in range(depth):
                self.memcpy2d(dst + z * drows * dpitch, dpitch, src + z * srows * spitch, spitch, width, height, None)

        return self._node(g, copy, 2)

    def graph_add_memset(self, g: SimGraph, deps: list[int], dst: int, pitch: int, value: int, elsize: int,
                         width: int, height: int) -> int:
        pattern = _pattern(value, elsize, width)
        self._copy_view(dst, len(pattern))

        def fill() -> None:
            self.check()
            self._fill(dst, pitch, pattern, height)

        return self._node(g, fill, 3)

    def graph_add_host(self, g: SimGraph, deps: list[int], fn: Callable[[int], None]) -> int:
        return self._node(g, lambda: fn(self.sticky), 4)

    def graph_add_empty(self, g: SimGraph, deps: list[int]) -> int:
        return self._node(g, lambda: None, 5)

    def graph_add_event(self, g: SimGraph, deps: list[int], e: SimEvent, wait: bool) -> int:
        if wait:
            return self._node(g, lambda: None, 8)
        return self._node(g, lambda: self.event_record(e, None, 0), 7)

    def graph_add_child(self, g: SimGraph, deps: list[int], child: SimGraph) -> int:
        ops = list(child.ops)  # (the driver copies the child into the node)

        def run() -> None:
            for op in ops:
                op()

        return self._node(g, run, 9)

    def graph_cond_handle(self, g: SimGraph, dev: int, default: int, flags: int) -> int:
        """Values count up per graph (kernels set them with ctx.set_conditional, in the executable graph
        that is running)."""
        root = g.root or g
        value = len(root.conds) + 1
        root.conds[value] = (default, flags)
        return value

    def graph_add_conditional(self, g: SimGraph, deps: list[int], dev: int, handle: int, ctype: int,
                              size: int) -> tuple[int, list[SimGraph]]:
        bodies = [SimGraph([], root=g.root or g) for _ in range(size)]

        def run(body: SimGraph) -> None:
            for op in body.ops:
                op()

        def conditional() -> None:
            v = self.cond_values.get(handle, 0)
            if ctype == 0:  # cudaGraphCondTypeIf: body 0 when true, body 1 (if any) when false
                if v or size == 2:
                    run(bodies[0 if v else 1])
            elif ctype == 1:  # cudaGraphCondTypeWhile
                for _ in range(1 << 24):
                    if not self.cond_values.get(handle, 0):
                        break
                    run(bodies[0])
            elif v < size:  # cudaGraphCondTypeSwitch
                run(bodies[v])

        return self._node(g, conditional, 6), bodies

    def graph_nodes(self, g: SimGraph) -> list[int]:
        """Captured event records are edges to the driver, not nodes."""
        return [i for i, op in enumerate(g.ops) if getattr(op, "func", None) != self.event_record]

    @staticmethod
    def node_key(node: int) -> int:
        return node

    @staticmethod
    def node_in_clone(node: int, clone: SimGraph) -> int:
        return node  # (a clone's ops are the original's, in the same order)

    # what a captured op is, by the call it repeats
    _CAPTURED_KINDS = {"launch": 1, "memcpy": 2, "memcpy2d": 2, "copy3d": 2, "memset": 3, "memset2d": 3}

    def graph_node_kind(self, g: SimGraph, node: int) -> int:
        op = g.ops[node]
        kind = getattr(op, "nvp_kind", None)
        if kind is None:
            kind = self._CAPTURED_KINDS.get(getattr(getattr(op, "func", op), "__name__", ""), 0)
        return kind

    def graph_exec_update(self, x: SimGraph, g: SimGraph) -> int:
        """0, or the cudaGraphExecUpdateResult of a failed update (the sim compares node counts only)."""
        if len(x.ops) != len(g.ops):
            return 2  # cudaGraphExecUpdateErrorTopologyChanged
        x.ops[:] = g.ops
        return 0

    def graph_exec_destroy(self, x: SimGraph) -> None:
        pass

    def device_sync(self, dev: int) -> None:
        self._refuse([c for c in self._open if c.streams[0].device == dev])  # (a context sync waits for them all)
        self._write_text()
        self.check()

    def event_create(self, dev: int, flags: int) -> SimEvent:
        return SimEvent(dev, flags)

    def event_destroy(self, e: SimEvent) -> None:
        pass

    def event_record(self, e: SimEvent, s: SimStream | None, flags: int) -> None:
        if s is not None and s.capture is not None:
            e.capture = s.capture
            s.capture.ops.append(functools.partial(self.event_record, e, None, flags))
            return
        if s is not None:
            self._not_while_capturing(s)
        e.capture = None
        self.check()
        e.stamp = time.perf_counter()

    def _captured(self, *events: SimEvent) -> None:
        """An event last recorded in a capture still on has no completion to wait for or time to give."""
        self._refuse([e.capture for e in events if e.capture is not None and not e.capture.ended])

    def event_sync(self, e: SimEvent) -> None:
        self._captured(e)
        self._unsafe()
        self._write_text()
        self.check()

    def event_query(self, e: SimEvent) -> bool:
        self._captured(e)
        self.check()
        return True

    def event_elapsed(self, a: SimEvent, b: SimEvent) -> float:
        self._captured(a, b)
        self.check()
        if a.stamp is None or b.stamp is None or (a.flags | b.flags) & 2:
            raise CudaError(INVALID_RESOURCE_HANDLE)
        return (b.stamp - a.stamp) * 1000.0

    # ---- modules and kernels ----
    def module_load(self, dev: int, image: bytes) -> SimModule:
        try:
            parsed = fatbin.parse(image)
        except fatbin.FatbinError as e:
            print(f"nvproxy(sim): {e}", file=sys.stderr)
            raise CudaError(INVALID_KERNEL_IMAGE) from None
        mod = SimModule(dev, parsed)
        for name, var in parsed.variables.items():
            size = max(var.size, 1)
            addr = self.globals_space.take((size + 255) // 256 * 256, 256)
            buf = mmap.mmap(-1, size)
            buf[: len(var.init)] = var.init
            self.mem.add(addr, size, memoryview(buf))
            mod.globals[name] = (addr, var.size)
        return mod

    def module_unload(self, mod: SimModule) -> None:
        for addr, _size in mod.globals.values():
            self.mem.remove(addr)

    def kernel_get(self, mod: SimModule, name: str) -> SimKernel:
        info = mod.parsed.kernels.get(name)
        if info is None:
            raise CudaError(INVALID_DEVICE_FUNCTION, f"sim: no kernel {name} in module")
        return SimKernel(name, info, mod.globals, device=mod.device)

    @staticmethod
    def _runnable(k: SimKernel) -> Callable[..., None]:
        """k's Python implementation; without one, k fails as a kernel without code for the device does natively
        (cudaErrorNoKernelImageForDevice from its launches and attribute queries), saying which kernel it is."""
        fn = sim_kernels.lookup(k.name)
        if fn is None:
            name = sim_kernels.plain_name(k.name)
            print(f"nvproxy(sim): kernel {name}{f' ({k.name})' if name != k.name else ''} has no Python "
                  "implementation; the sim backend cannot run it "
                  "(register one with nvproxy.sim_kernels and NVPROXY_SIM_KERNELS)", file=sys.stderr)
            raise CudaError(NO_KERNEL_IMAGE, k.name)
        return fn

    def kernel_info(self, k: SimKernel) -> dict[str, object]:
        """(what a launch asks first: a kernel the sim cannot run fails here, so the launch itself fails)"""
        self._runnable(k)
        return {
            "params": k.info.params,
            "param_size": k.info.param_size,
            "max_threads": k.info.max_threads,
            "num_regs": k.info.num_regs,
            "shared_static": k.info.shared_static,
            "const_size": 0,
            "local_size": 0,
            "max_dyn_shared": k.attrs.get(8, 49152 - k.info.shared_static),
            "ptx_version": 90,
            "binary_version": 90,
            "cache_mode_ca": 0,
            "preferred_carveout": k.attrs.get(9, -1),
        }

    def global_get(self, mod: SimModule, name: str) -> tuple[int, int]:
        if name not in mod.globals:
            raise CudaError(SYMBOL_NOT_FOUND)
        return mod.globals[name]

    def launch(self, k: SimKernel, grid: tuple[int, int, int], block: tuple[int, int, int], shmem: int,
               stream: SimStream | None, params: bytes, cooperative: bool) -> None:
        if self._kept(stream, functools.partial(self.launch, k, grid, block, shmem, None, params, cooperative)):
            return
        self.check()
        fn = self._runnable(k)
        args: list[object] = []
        for off, size in k.info.params:
            raw = params[off : off + size]
            args.append(int.from_bytes(raw, "little") if size in (1, 2, 4, 8) else raw)
        mem = self.mem if k.device is None else DeviceMemory(self.mem, k.device)
        ctx = sim_kernels.KernelContext(mem, grid, block, shmem, self._print, k.symbols, self.objects,
                                        self.cond_values)
        try:
            fn(ctx, *args)
        except sim_kernels.DeviceAssert as e:
            print(f"{k.name}: block: [0,0,0], thread: [0,0,0] Assertion `{e}` failed.", file=sys.stderr)
            self.sticky = ASSERT
        except CudaError as e:
            if e.code == ILLEGAL_ADDRESS:
                self.sticky = ILLEGAL_ADDRESS
            else:
                raise

    def occupancy(self, k: SimKernel, block: int, smem: int, flags: int) -> int:
        if block <= 0 or block > 1024:
            return 0
        by_threads = 2048 // block
        shared = smem + k.info.shared_static
        by_smem = 233472 // shared if shared else 32
        regs = max(k.info.num_regs, 1) * ((block + 31) // 32 * 32)
        by_regs = 65536 // regs
        return max(0, min(32, by_threads, by_smem, by_regs))

    def func_set_attr(self, k: SimKernel, attr: int, value: int) -> None:
        if attr == 8 and not 0 <= value <= 232448 - k.info.shared_static:
            raise CudaError(INVALID_VALUE)
        k.attrs[attr] = value

    def func_set_cache(self, k: SimKernel, config: int) -> None:
        pass

    # ---- context settings ----
    def set_limit(self, limit: int, value: int) -> None:
        if limit not in self.limits:
            raise CudaError(INVALID_VALUE)
        self.limits[limit] = value

    def get_limit(self, limit: int) -> int:
        if limit not in self.limits:
            raise CudaError(INVALID_VALUE)
        return self.limits[limit]

    def priority_range(self) -> tuple[int, int]:
        return 0, -5

    def set_cache_config(self, c: int) -> None:
        self.cache_config = c

    def get_cache_config(self) -> int:
        return self.cache_config

    def peer(self, what: int, dev: int, peer: int) -> int:
        return int(what == 0 and dev != peer)  # (one memory: every modelled device reaches every other's)

    def profiler(self, start: bool) -> None:
        pass

    def not_ready(self) -> int:
        return NOT_READY

    def _print(self, text: str) -> None:
        self._unwritten.append(text)

    def _write_text(self) -> None:
        """As the driver does: kernel printf text comes out at a wait (a synchronisation), never at a query."""
        if self._unwritten:
            self.text += self._unwritten
            self._unwritten.clear()
            self._text_notify(True)

    # ---- the native fast path, on the CPU model: C calls back into this
    # backend (slowly), so CI runs the same C code that drives the GPU ----
    def watch_text(self, notify: Callable[[bool], None]) -> int:
        self._text_notify = notify
        return -1  # no pipe: kernel printf text is kept here

    def handle_value(self, h: object) -> int:
        self._handles[id(h)] = h
        return id(h)

    def kernel_handle(self, k: SimKernel) -> tuple[int, list[int]]:
        return self.handle_value(k), [o for o, _ in k.info.params]

    def fast_driver(self) -> dict[str, int]:
        from ..proxy.fastpath import DRIVER_FIELDS, ffi

        def obj(h: object) -> object:
            return self._handles.get(int(ffi.cast("uintptr_t", h)))

        def stream(h: object) -> object:
            return obj(h) or SimStream(0)  # NULL: the legacy default stream

        def done(ok: bool) -> None:
            if not ok:
                raise CudaError(NOT_READY)

        def launch(f, gx, gy, gz, bx, by, bz, shmem, s, _params, extra) -> None:
            data = b""
            if extra != ffi.NULL:  # {BUFFER_POINTER, buf, BUFFER_SIZE, &size, END}
                data = ffi.buffer(extra[1], ffi.cast("size_t *", extra[3])[0])[:]
            self.launch(obj(f), (gx, gy, gz), (bx, by, bz), shmem, stream(s), data, False)

        def launch_cooperative(f, gx, gy, gz, bx, by, bz, shmem, s, params) -> None:
            k = obj(f)
            data = bytearray(max((o + n for o, n in k.info.params), default=0))
            for i, (o, n) in enumerate(k.info.params):
                data[o : o + n] = ffi.buffer(params[i], n)
            self.launch(k, (gx, gy, gz), (bx, by, bz), shmem, stream(s), bytes(data), True)

        impl = {
            "launch": launch,
            "launch_cooperative": launch_cooperative,
            "memcpy_async": lambda d, src, n, s: self.memcpy(d, src, n, stream(s)),
            "memset_async": lambda d, v, n, s: self.memset(d, v, n, stream(s)),
            "event_record": lambda e, s, flags: self.event_record(obj(e), stream(s), flags),
            "event_query": lambda e: done(self.event_query(obj(e))),
            "event_sync": lambda e: self.event_sync(obj(e)),
            "stream_query": lambda s: done(self.stream_query(stream(s))),
            "stream_sync": lambda s: self.stream_sync(stream(s)),
            "stream_wait_event": lambda s, e, flags: self.stream_wait_event(stream(s), obj(e), flags),
            "graph_launch": lambda x, s: self.graph_launch(obj(x), stream(s)),
        }
        template = ffi.new("struct nvpf_driver *")
        out = {}
        for name in DRIVER_FIELDS:
            cb = ffi.callback(ffi.typeof(getattr(template, name)), _as_cuda_result(impl[name]))
            self._fast_callbacks.append(cb)
            out[name] = int(ffi.cast("uintptr_t", cb))
        return out


def _as_cuda_result(fn: Callable[..., None]) -> Callable[..., int]:
    """A driver-style entry point: 0, or the CUDA error the call raised."""

    def call(*args: object) -> int:
        try:
            fn(*args)
        except CudaError as e:
            return e.code
        except Exception as e:  # C cannot take an exception: report it as the driver would an unknown failure
            print(f"nvproxy(sim): fast path call failed: {e!r}", file=sys.stderr)
            return UNKNOWN
        return 0

    return call
