"""What the proxy holds for its application, keyed by nvproxy's own handles:
device arenas, modules and kernels per device, streams, events, shared host
ranges.  Everything the application can name lives here, so that a restore
can rebuild it under the same names."""

from __future__ import annotations

import bisect
import queue
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from .. import fatbin
from ..errors import INVALID_DEVICE, INVALID_RESOURCE_HANDLE, INVALID_VALUE, CudaError
from .arena import Arena

ARENA_BASE = 0x200000000000
ARENA_STRIDE = 1 << 40  # one TiB of address space per device
GiB = 1 << 30
REUSE_WAIT_S = 0.002  # how long a cudaMalloc waits for a pending free it could reuse


def arena_base(dev: int) -> int:
    return ARENA_BASE + dev * ARENA_STRIDE


@dataclass
class DeviceState:
    index: int
    arena: Arena
    modules: dict[int, Any] = field(default_factory=dict)  # module id -> backend module
    kernels: dict[int, Any] = field(default_factory=dict)  # kernel id -> backend kernel


@dataclass
class CaptureLog:
    """The calls a stream capture took (request arguments and payload, as they came):
    replayed into a capture on restore, they make the same graph again."""

    dev: int
    origin: int  # the wire stream that began the capture
    mode: int
    calls: list[tuple[int, tuple[int, ...], bytes]] = field(default_factory=list)  # (op, args, payload)
    graph_id: int = 0  # the wire id its graph has (cudaStreamGetCaptureInfo named it, or captured into it), or 0
    target: int = 0  # captured into an existing graph (cudaStreamBeginCaptureToGraph): its wire id
    nodes: dict[int, Any] = field(default_factory=dict)  # its graph's nodes that have wire ids (not kept)
    deps: list[int] = field(default_factory=list)  # captured into an existing graph: after these nodes of it
    hidden: dict[Any, Any] = field(default_factory=dict)  # nvproxy's own nodes it made (by node key), not listed
    # events marking the work its streams (and the legacy stream) had when they were taken into it: a checkpoint
    # waits for them, since it may not synchronise a capturing stream (graphs.drain); not kept
    fences: list[Any] = field(default_factory=list)

    def to_json(self) -> dict[str, Any]:
        return {"dev": self.dev, "origin": self.origin, "mode": self.mode, "target": self.target, "deps": self.deps,
                "calls": [[op, list(a), p.hex()] for op, a, p in self.calls]}

    @staticmethod
    def from_json(d: dict[str, Any]) -> CaptureLog:
        return CaptureLog(d["dev"], d["origin"], d["mode"],
                          [(op, tuple(a), bytes.fromhex(p)) for op, a, p in d["calls"]],
                          target=d.get("target", 0), deps=d.get("deps", []))


@dataclass
class GraphRec:
    log: CaptureLog  # the capture that made it (no calls: made by cudaGraphCreate)
    handle: Any  # the backend's graph, or executable graph
    order: int  # creation order: a graph may launch an executable graph made before it
    flags: int = 0  # executable graphs: instantiation flags
    created: bool = False  # made by cudaGraphCreate (or a clone of such a graph), not by a capture
    built: list[tuple[int, tuple[int, ...], bytes]] = field(default_factory=list)  # node additions since
    nodes: dict[int, Any] = field(default_factory=dict)  # node wire id -> the backend's node
    updates: list[tuple[int, tuple[int, ...], bytes]] = field(default_factory=list)  # executable: kernel updates
    sources: list[Any] = field(default_factory=list)  # graphs made by a restore whose nodes it names
    body_of: int = 0  # a conditional node's body graph: its root graph's wire id (it shares built and nodes)
    hidden: dict[Any, Any] = field(default_factory=dict)  # nvproxy's own nodes (staging), by node key: not listed


@dataclass
class ArrayRec:
    dev: int
    desc: dict[str, Any]  # width, height, depth, fmt [x, y, z, w, f], flags: as cudaMalloc3DArray took them
    handle: Any  # the backend's array

    def shape(self) -> tuple[int, int, int]:
        """(bytes per row, rows, slices) of its contents."""
        from .texformat import channel_format

        d = self.desc
        return d["width"] * channel_format(*d["fmt"]).elem, max(d["height"], 1), max(d["depth"], 1)


@dataclass
class ObjectRec:
    """A texture or surface object: made again at a restore with the same value."""

    dev: int
    surface: bool
    desc: dict[str, Any]  # struct nvp_tex_create's fields (res: the array id or device address)
    handle: Any


@dataclass
class HostRange:
    size: int
    fd: int  # kept open: a restore into a new proxy maps it again
    channel: object | None = None  # staging buffers belong to a channel
    dev: int = 0  # (a spare staging buffer: the device whose context registered it)


@dataclass
class ManagedRange:
    """Managed memory that migrates (handlers/managed.py): device memory at the application's address, and the
    application's host copy, mapped here at host (registered, to copy to and from)."""

    size: int
    fd: int  # the host copy's memfd, kept open: a new proxy maps it again
    host: int
    dev: int


PRINT_SCAN_BUDGET = 16 << 20  # module image bytes read for kernel printf per process; more: taken to print


class ProcessState:
    def __init__(self, backend: Any) -> None:
        self.backend = backend
        self.devices: dict[int, DeviceState] = {}  # devices the application has used
        self.broken = 0  # the sticky error that left the context unusable (every call fails with it), or 0
        self._props: dict[int, tuple[str, bytes, int, list[int]]] = {}
        self.images: dict[int, bytes] = {}  # module id -> fatbinary
        self.may_print = False  # a loaded module may print from a kernel (fatbin.may_print)
        self.print_scanned = 0  # bytes of module images read for that (PRINT_SCAN_BUDGET)
        self.printing: Callable[[], None] = lambda: None  # (told once, when may_print turns on)
        self.kernel_names: dict[int, tuple[int, str]] = {}  # kernel id -> (module id, name)
        self.streams: dict[int, tuple[int, Any]] = {}  # wire id -> (device, backend stream)
        self.stream_args: dict[int, tuple[int, int]] = {}  # wire id -> (flags, priority)
        self.stream_attrs: dict[int, dict[int, bytes]] = {}  # wire id -> cudaStreamAttrID -> value set
        self.events: dict[int, tuple[int, Any]] = {}
        self.event_flags: dict[int, int] = {}
        # events recorded before a restore: their time is t(ref) - ms, ref being an
        # event recorded when the restore finished (the time the process was stopped
        # does not count, as it did not for the application's work)
        self.event_past: dict[int, tuple[Any, float]] = {}
        self.time_refs: dict[int, Any] = {}  # device -> reference event of the last restore
        self.kernel_attrs: dict[int, dict[int, int]] = {}  # kernel id -> cudaFuncAttribute -> value
        self.limits: dict[int, dict[int, int]] = {}  # device -> cudaLimit -> value
        self.host: dict[int, HostRange] = {}  # address -> registered range
        self.managed: dict[int, ManagedRange] = {}  # the application's address -> migrating managed memory
        # staging buffers of channels that are gone, still registered: a new thread's channel takes one
        # (unregistering waits for the device, and stalled the driver behind a spinning kernel)
        self.spare_staging: dict[int, HostRange] = {}
        self.arena_lock = threading.Lock()  # the dispatcher allocates, the reaper frees
        self.freeing: set[int] = set()
        self._reaped = threading.Condition()  # notified when a free reached the arena
        # module variables the driver placed elsewhere after a restore: the
        # application may still hold the old addresses (cudaMemcpyToSymbol's cache,
        # cudaGetSymbolAddress), so copies and memsets are translated
        self.reloc_starts: list[int] = []
        self.relocs: list[tuple[int, int, int]] = []  # (old, size, new), sorted by old
        self._frees: queue.SimpleQueue[tuple[int, Any]] | None = None
        self.host_image: Any = None  # checkpoint.hostimage.HostImage, once a checkpoint needs one
        self.captures: dict[int, CaptureLog] = {}  # stream captures in progress, by the backend's capture id
        self.managed_vars: list[Any] = []  # __managed__ variables (managed_vars.ManagedVar)
        self.peer_grants: set[tuple[int, int]] = set()  # (device, device whose memory it may access)
        self.graphs: dict[int, GraphRec] = {}  # wire id -> graph made by a capture
        self.graph_execs: dict[int, GraphRec] = {}  # wire id -> executable graph
        self.graph_order = 0
        self.arrays: dict[int, ArrayRec] = {}  # wire id -> CUDA array
        self.objects: dict[tuple[bool, int], ObjectRec] = {}  # (surface, value) -> texture or surface object
        # CUDA IPC (handlers/ipc.py): the name other proxies find this one under (made at the first
        # export), allocations exported (base -> secret), memory of other processes mapped here
        # ((exporter, base) -> mapping), events exported (wire id -> secret) and the driver's handles of
        # those a migration took over (wire id -> handle), events opened from others (wire id -> handle)
        self.ipc_name = 0
        self.ipc_exports: dict[int, int] = {}
        self.ipc_imports: dict[tuple[int, int], Any] = {}
        self.ipc_event_tokens: dict[int, int] = {}
        self.ipc_event_driver: dict[int, bytes] = {}
        self.ipc_opened_events: dict[int, bytes] = {}

    def free(self, ptr: int, idle: bool = False) -> None:
        """cudaFree: the memory returns to the arena once the device has
        finished everything submitted before the free, as cudaFree waits for
        (idle: it has).  The wait happens on a reaper thread, so the application's other
        threads keep going (a thread blocked in cudaFree does not stop them)."""
        d = self.arena_of(ptr)
        if ptr not in d.arena.allocs or ptr in self.freeing:
            raise CudaError(INVALID_VALUE, f"free of {ptr:#x}, not an allocation")
        self.ipc_exports.pop(ptr, None)  # (its IPC handles name nothing now)
        if idle or not getattr(self.backend, "frees_wait_for_device", True):
            with self.arena_lock:
                d.arena.free(ptr)
            return
        self.freeing.add(ptr)
        self.later(d.index, lambda: self._free_when_idle(d.index, ptr))

    def later(self, dev: int, fn: Any) -> None:
        """Run fn on the reaper thread (with dev's context current), in order."""
        if self._frees is None:
            self._frees = queue.SimpleQueue()
            threading.Thread(target=self._reaper, name="nvproxy-reaper", daemon=True).start()
        self._frees.put((dev, fn))

    def _free_when_idle(self, dev: int, ptr: int) -> None:
        try:
            self.backend.device_sync(dev)
        except CudaError as e:  # a sticky error: the memory is gone with the context anyway
            print(f"nvproxy: device {dev} failed while freeing {ptr:#x} (CUDA error {e.code})", file=sys.stderr)
        with self.arena_lock:
            self.devices[dev].arena.free(ptr)
            self.freeing.discard(ptr)
        with self._reaped:
            self._reaped.notify_all()

    def _reaper(self) -> None:
        assert self._frees is not None
        while True:
            dev, fn = self._frees.get()
            try:
                self.backend.activate(dev)
                fn()
            except Exception as e:
                print(f"nvproxy: background work failed: {e!r}", file=sys.stderr)

    def relocate(self, old: int, size: int, new: int) -> None:
        i = bisect.bisect_left(self.reloc_starts, old)
        self.reloc_starts.insert(i, old)
        self.relocs.insert(i, (old, size, new))

    def original(self, addr: int) -> int:
        """The address the application knows for a (relocated) module variable."""
        for old, _size, new in self.relocs:
            if new == addr:
                return old
        return addr

    def translate(self, addr: int) -> int:
        if not self.relocs:
            return addr
        i = bisect.bisect_right(self.reloc_starts, addr) - 1
        if i >= 0:
            old, size, new = self.relocs[i]
            if addr < old + size:
                return new + (addr - old)
        return addr

    def alloc(self, dev: int, size: int) -> int:
        d = self.device(dev)
        with self.arena_lock:
            if not self.freeing or d.arena.reusable(size):
                return d.arena.alloc(size)
        # A free of this size may be on its way into the cache, waiting only for the
        # device to be idle (usually it already is): wait for it briefly rather than
        # map new memory, which costs more than the driver's own cudaMalloc.
        deadline = time.monotonic() + REUSE_WAIT_S
        with self._reaped:
            while self.freeing and time.monotonic() < deadline:
                with self.arena_lock:
                    if d.arena.reusable(size):
                        break
                self._reaped.wait(max(deadline - time.monotonic(), 0.0))
        with self.arena_lock:
            return d.arena.alloc(size)

    def props(self, dev: int) -> tuple[str, bytes, int, list[int]]:
        """A device's properties, without making it the process's (no context, no arena); read when first asked
        for, not by a restore (reading all their attributes is a noticeable part of one)."""
        self._valid(dev)
        if dev not in self._props:
            self._props[dev] = self.backend.device_props(dev)
        return self._props[dev]

    def _valid(self, dev: int) -> None:
        if not 0 <= dev < self.backend.device_count():
            raise CudaError(INVALID_DEVICE)

    def arena_plan(self, dev: int) -> tuple[int, int]:
        """Where the device's arena goes: a fixed base, twice the device's memory."""
        total = self.backend.total_memory(dev)
        return arena_base(dev), min(ARENA_STRIDE, max(4 * GiB, (2 * total + GiB - 1) // GiB * GiB))

    def device(self, dev: int) -> DeviceState:
        d = self.devices.get(dev)
        if d is not None:
            return d
        self._valid(dev)
        want, size = self.arena_plan(dev)
        base = self.backend.reserve(dev, want, size)
        d = DeviceState(dev, Arena(base, size, self.backend.backing(dev)))
        self.devices[dev] = d
        return d

    def grant_peer(self, dev: int, owner: int) -> None:
        """Device dev may access device owner's memory (peer access, a pool's access)."""
        d = self.device(owner)
        d.arena.backing.grant(dev, d.arena.mappings() + [(va, m.size) for va, m in d.arena.vmm.maps.items()])
        self.peer_grants.add((dev, owner))

    def aliases(self, addr: int) -> list[int]:
        """Where the memory a program's address reaches is kept: in a VMM mapping, the shadows of its allocation
        and of those mapped right after it (vmm.Vmm.run); else addr itself."""
        for d in self.devices.values():
            if d.arena.contains(addr):
                return d.arena.vmm.run(addr)
        return [addr]

    def arena_of(self, ptr: int) -> DeviceState:
        for d in self.devices.values():
            if d.arena.contains(ptr):
                return d
        raise CudaError(INVALID_VALUE, f"{ptr:#x} is not device memory of nvproxy")

    def module(self, dev: int, mod_id: int) -> Any:
        d = self.device(dev)
        m = d.modules.get(mod_id)
        if m is None:
            if mod_id not in self.images:
                raise CudaError(INVALID_RESOURCE_HANDLE, f"module {mod_id} was never loaded")
            m = d.modules[mod_id] = self.backend.module_load(dev, self.images[mod_id])
            if not self.may_print and self._may_print(self.images[mod_id]):
                self.may_print = True
                self.printing()
        return m

    def _may_print(self, image: bytes) -> bool:
        """fatbin.may_print, within a budget: reading a compressed image costs its decompression, and a program with
        many large modules (a framework's) is taken to print rather than pay that at each module's first use."""
        self.print_scanned += len(image)
        return self.print_scanned > PRINT_SCAN_BUDGET or fatbin.may_print(image)

    def kernel(self, dev: int, kid: int) -> Any:
        d = self.device(dev)
        k = d.kernels.get(kid)
        if k is None:
            if kid not in self.kernel_names:
                raise CudaError(INVALID_RESOURCE_HANDLE, f"kernel {kid} unknown")
            mod_id, name = self.kernel_names[kid]
            k = d.kernels[kid] = self.backend.kernel_get(self.module(dev, mod_id), name)
        return k

    def stream(self, wire: int, dev: int, per_thread: Any) -> Any:
        if wire == 0:
            return self.backend.legacy_stream(dev)
        if wire == 2:
            return per_thread(dev)
        try:
            return self.streams[wire][1]
        except KeyError:
            raise CudaError(INVALID_RESOURCE_HANDLE, f"stream {wire}") from None

    def event(self, wire: int) -> Any:
        try:
            return self.events[wire][1]
        except KeyError:
            raise CudaError(INVALID_RESOURCE_HANDLE, f"event {wire}") from None

    def event_time(self, wire: int) -> tuple[Any, float]:
        """(a recorded event, ms to add to its time) giving the event's time."""
        past = self.event_past.get(wire)
        return past if past is not None else (self.event(wire), 0.0)

    def elapsed(self, a: int, b: int) -> float:
        """cudaEventElapsedTime, across checkpoints too."""
        (ea, sa), (eb, sb) = self.event_time(a), self.event_time(b)
        return self.backend.event_elapsed(ea, eb) + sb - sa

    def times_before(self, dev: int, captured: set[int]) -> dict[int, float]:
        """For the device's recorded timing events: how many ms before now
        (the device idle) each was recorded.  Unrecorded ones are left out, and those recorded in a stream
        capture still on (captured: asking for their time invalidates it)."""
        be = self.backend
        ref = be.event_create(dev, 0)
        s = be.stream_create(dev, 1, 0)  # (non-blocking: a capture on a blocking stream forbids the legacy stream)
        try:
            be.event_record(ref, s, 0)
            be.event_sync(ref)
            out = {}
            for w, (d, _e) in self.events.items():
                if d != dev or self.event_flags.get(w, 0) & 2 or w in captured:  # (2: cudaEventDisableTiming)
                    continue
                e, shift = self.event_time(w)
                try:
                    out[w] = be.event_elapsed(e, ref) - shift
                except CudaError:
                    pass  # never recorded
            return out
        finally:
            be.event_destroy(ref)
            be.stream_destroy(s)

    def set_times_before(self, dev: int, before: dict[int, float]) -> None:
        """After a restore: the events recorded before it keep their distances."""
        if not before:
            return
        be = self.backend
        ref = self.time_refs.get(dev)
        if ref is None:
            ref = self.time_refs[dev] = be.event_create(dev, 0)
        be.event_record(ref, be.legacy_stream(dev), 0)
        be.event_sync(ref)
        for w, ms in before.items():
            self.event_past[w] = (ref, -ms)
