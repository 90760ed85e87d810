"""CUDA IPC between applications that each have a proxy of their own.

A proxy serves one application only, so memory handles cannot simply be the
driver's: cudaIpcGetMemHandle fills the handle with the exporting
application's pid, the allocation and a random secret; the importing proxy
finds the exporter's proxy (same user: its control socket is 0600 and checks
the peer's uid), shows it the secret and receives a file descriptor of the
driver's allocation, which it maps into its own arena.  Event handles are the
driver's own and work between the proxies as between any two processes.

A process that gave its device memory or events to others cannot be
checkpointed: they would keep the old memory (state.ipc_in_use).  A process that
opened others' memory or events can: its image names them, and a restore opens
them again at the same addresses while their exporters run (a migration, a
restart of the importer alone)."""

from __future__ import annotations

import os
import secrets
import socket
import struct
from dataclasses import dataclass
from typing import Any

from ... import wire
from ...checkpoint.image import ImageError
from ...errors import INVALID_RESOURCE_HANDLE, INVALID_VALUE, CudaError
from .. import control

IPC_MEM = struct.Struct("<IIIIQQQQ16x")
if IPC_MEM.size != wire.ffi.sizeof("struct nvp_ipc_mem"):
    raise RuntimeError("struct nvp_ipc_mem disagrees with the wire header")
INVALID_CONTEXT = 201  # cudaErrorDeviceUninitialized: the driver's CUDA_ERROR_INVALID_CONTEXT
MAP_FAILED = 205  # cudaErrorMapBufferObjectFailed


@dataclass
class Import:
    dev: int
    va: int
    size: int
    handle: Any
    refs: int = 1
    pid: int = 0  # the exporting application, its allocation and secret: a restore opens it again
    base: int = 0
    token: int = 0

    def key(self) -> list[int]:
        return [self.dev, self.va, self.size, self.refs, self.pid, self.base, self.token]


def IPC_MEM_EXPORT(p: Any, ch: Any, a: tuple[int, ...], payload: bytes) -> tuple[tuple[int, ...], bytes]:
    ptr = a[0]
    d = p.state.arena_of(ptr)
    phys = d.arena.physical(ptr)
    if phys is None:
        raise CudaError(INVALID_VALUE, f"{ptr:#x} is not allocated memory")
    base, size, _h = phys
    token = p.state.ipc_exports.setdefault(base, secrets.randbits(63) + 1)
    return (), IPC_MEM.pack(wire.NVP_IPC_MAGIC, p.server.owner_pid, d.index, 0, token, base, size, ptr - base)


def export_fd(state: Any, base: int, token: int) -> tuple[int, int]:
    """For another proxy that shows an exported allocation's secret: (file descriptor, size)."""
    if not token or state.ipc_exports.get(base) != token:
        raise PermissionError("no such exported allocation")
    d = state.arena_of(base)
    _b, size, handle = d.arena.physical(base)
    state.backend.activate(d.index)
    return state.backend.export_fd(d.index, handle), size


def _fetch(pid: int, base: int, token: int) -> tuple[int, int]:
    from ...launcher import find_proxy

    try:
        proxy_pid, sock = find_proxy(pid)
    except SystemExit:
        raise CudaError(MAP_FAILED, f"process {pid}, which exported the memory, has no proxy") from None
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
        s.settimeout(30)
        try:
            s.connect(f"{sock}.{proxy_pid}.ctl")
            control.send(s, {"cmd": "ipc_fd", "base": base, "token": token})
            reply, _blob, fds = control.recv(s)
        except OSError as e:
            raise CudaError(MAP_FAILED, f"the proxy of process {pid}: {e}") from None
    if not reply.get("ok") or len(fds) != 1:
        for fd in fds:
            os.close(fd)
        raise CudaError(INVALID_RESOURCE_HANDLE, f"process {pid} does not export that memory: {reply.get('error')}")
    return fds[0], reply["size"]


def _map_import(st: Any, dev: int, pid: int, base: int, token: int, va: int | None) -> tuple[int, int, Any]:
    """Another application's exported allocation, mapped into this arena (at va, or where there is room):
    (va, size, the driver's handle)."""
    fd, n = _fetch(pid, base, token)
    try:
        d = st.device(dev)
        with st.arena_lock:
            if va is None:
                va = d.arena.vas.take(n, d.arena.backing.granularity)
            else:
                d.arena.vas.take_at(va, n)
        try:
            st.backend.activate(dev)
            handle = st.backend.import_fd(dev, fd, n)
            d.arena.backing.map(va, n, handle)
        except BaseException:
            with st.arena_lock:
                d.arena.vas.give(va, n)
            raise
    finally:
        os.close(fd)
    return va, n, handle


def IPC_MEM_OPEN(p: Any, ch: Any, a: tuple[int, ...], payload: bytes) -> tuple[tuple[int, ...], bytes]:
    if len(payload) != IPC_MEM.size:
        raise CudaError(INVALID_VALUE, "IPC memory handle")
    magic, pid, dev, _pad, token, base, size, offset = IPC_MEM.unpack(payload)
    if magic != wire.NVP_IPC_MAGIC or offset >= size:
        raise CudaError(INVALID_VALUE, "not an IPC memory handle of nvproxy")
    if pid == p.server.owner_pid:
        raise CudaError(INVALID_CONTEXT, "an IPC memory handle of this very process")
    st = p.state
    imp = st.ipc_imports.get((pid, base))
    if imp is None:
        va, n, handle = _map_import(st, dev, pid, base, token, None)
        imp = st.ipc_imports[(pid, base)] = Import(dev, va, n, handle, 0, pid, base, token)
    imp.refs += 1
    return (imp.va + offset, imp.va, imp.size), b""


def IPC_MEM_CLOSE(p: Any, ch: Any, a: tuple[int, ...], payload: bytes) -> tuple[tuple[int, ...], bytes]:
    st = p.state
    key = next((k for k, i in st.ipc_imports.items() if i.va <= a[0] < i.va + i.size), None)
    if key is None:
        raise CudaError(INVALID_VALUE, f"{a[0]:#x} was not opened with cudaIpcOpenMemHandle")
    imp = st.ipc_imports[key]
    imp.refs -= 1
    if imp.refs:
        return (0, imp.va), b""
    del st.ipc_imports[key]
    be, d = p.backend, st.devices[imp.dev]
    be.activate(imp.dev)
    be.device_sync(imp.dev)  # (no work may still use it)
    d.arena.backing.unmap(imp.va, imp.size)
    be.ipc_release(imp.dev, imp.handle)
    with st.arena_lock:
        d.arena.vas.give(imp.va, imp.size)
    return (1, imp.va), b""


def IPC_EVENT_EXPORT(p: Any, ch: Any, a: tuple[int, ...], payload: bytes) -> tuple[tuple[int, ...], bytes]:
    handle = p.backend.ipc_event_handle(p.event(a[0]))
    p.state.ipc_events.add(a[0])
    return (), handle


def IPC_EVENT_OPEN(p: Any, ch: Any, a: tuple[int, ...], payload: bytes) -> None:
    if len(payload) != 64 or a[0] in p.state.events:
        raise CudaError(INVALID_VALUE, "IPC event handle")
    p.state.events[a[0]] = (ch.dev, p.backend.ipc_event_open(ch.dev, payload))
    p.state.event_flags[a[0]] = 6  # cudaEventDisableTiming | cudaEventInterprocess
    p.state.ipc_opened_events[a[0]] = payload  # (a restore opens it again, while its exporter lives)


# ---- checkpoints of an importing process (the exporters go on running): what it opened is opened again ----
def describe(state: Any) -> dict[str, Any]:
    return {"ipc_imports": [imp.key() for imp in state.ipc_imports.values()],
            "ipc_opened_events": {str(w): h.hex() for w, h in state.ipc_opened_events.items() if w in state.events}}


def restore_imports(state: Any, header: dict[str, Any]) -> None:
    """Map what the process had opened at the same addresses (after its arenas are back: the addresses are free
    there); fails the restore if an exporter is gone."""
    for dev, va, size, refs, pid, base, token in header.get("ipc_imports", []):
        try:
            got_va, n, handle = _map_import(state, dev, pid, base, token, va)
        except CudaError as e:
            raise ImageError(f"device memory of process {pid} opened at {va:#x} cannot be opened again: {e}") from None
        if n != size:
            raise ImageError(f"device memory of process {pid} at {va:#x} has {n} bytes now, {size} before")
        state.ipc_imports[(pid, base)] = Import(dev, got_va, n, handle, refs, pid, base, token)


def opened_event(state: Any, header: dict[str, Any], wire_id: int, dev: int) -> Any:
    """An event the process had opened from another's handle, opened again (None: not such an event)."""
    h = header.get("ipc_opened_events", {}).get(str(wire_id))
    if h is None:
        return None
    handle = bytes.fromhex(h)
    state.ipc_opened_events[wire_id] = handle
    try:
        return state.backend.ipc_event_open(dev, handle)
    except CudaError as e:
        raise ImageError(f"event {wire_id}, opened from another process, cannot be opened again: {e}") from None
