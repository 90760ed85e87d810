"""CUDA IPC between applications that each have a proxy of their own.

A proxy serves one application only, so handles cannot simply be the driver's:
cudaIpcGetMemHandle fills the handle with the exporting application's name (a
random number its proxies keep across migrations and restarts), the allocation
and a random secret; the importing proxy finds the exporter's proxy through a
link named after it in the user's private directory (its control socket is
0600 and checks the peer's uid), shows it the secret and receives a file
descriptor of the driver's allocation, which it maps into its own arena.  Event
handles work alike: the importer receives the driver's handle of the event the
exporter's proxy has now.

Both sides can be checkpointed.  A migrated exporter hands the physical memory
it exported to its new proxy (the importers keep mapping the same memory), and
the new proxy opens the exported events from the old one's handles.  A restart
from an image file (DMTCP restarts exporter and importers together) makes the
memory and events again, registers the name once the contents are back, and the
importers' restores open them again at the same addresses, waiting for the
exporter's proxy for a while."""

from __future__ import annotations

import os
import secrets
import socket
import struct
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ... import wire
from ...checkpoint.image import ImageError
from ...errors import INVALID_RESOURCE_HANDLE, INVALID_VALUE, CudaError
from .. import control

IPC_MEM = struct.Struct("<IIIIQQQQQQ")
IPC_EVENT = struct.Struct("<IIQQQ32x")
for _s, _c in ((IPC_MEM, "struct nvp_ipc_mem"), (IPC_EVENT, "struct nvp_ipc_event")):
    if _s.size != wire.ffi.sizeof(_c) or _s.size != 64:
        raise RuntimeError(f"{_c} disagrees with the wire header")
INVALID_CONTEXT = 201  # cudaErrorDeviceUninitialized: the driver's CUDA_ERROR_INVALID_CONTEXT
MAP_FAILED = 205  # cudaErrorMapBufferObjectFailed
OPEN_WAIT_S = 5.0  # an exporter being migrated answers again within this
RESTORE_WAIT_S = 120.0  # a restarted importer waits this long for its exporters' proxies to be back
LAZY_PEER_ACCESS = 1  # cudaIpcMemLazyEnablePeerAccess


@dataclass
class Import:
    dev: int
    va: int
    size: int
    handle: Any
    refs: int = 1
    pid: int = 0  # the exporting application (its name, allocation and secret: a restore opens it again)
    base: int = 0
    token: int = 0
    exporter: int = 0

    def key(self) -> list[int]:
        return [self.dev, self.va, self.size, self.refs, self.pid, self.base, self.token, self.exporter]


# ---- the exporter's name: a link to its proxy's control socket ----
def _link(name: int) -> Path:
    from ...launcher import private_dir

    return private_dir() / f"ipc-{name:016x}"


def register(state: Any, ctl_path: str) -> None:
    """Point the application's exporter name at this proxy (after a restore: once its memory is back)."""
    if not state.ipc_name:
        return
    link = _link(state.ipc_name)
    tmp = link.with_name(f"{link.name}.{os.getpid()}")
    tmp.unlink(missing_ok=True)
    os.symlink(ctl_path, tmp)
    os.replace(tmp, link)  # (atomically: a migration's importers never find it missing)


def unregister(state: Any, ctl_path: str) -> None:
    if not state.ipc_name:
        return
    link = _link(state.ipc_name)
    try:
        if os.readlink(link) == ctl_path:
            link.unlink()
    except OSError:
        pass


def _name(p: Any) -> int:
    st = p.state
    if not st.ipc_name:
        st.ipc_name = secrets.randbits(63) + 1
        register(st, p.server.ctl_path)
    return st.ipc_name


def _ask(exporter: int, pid: int, msg: dict[str, Any], wait_s: float) -> tuple[dict[str, Any], list[int]]:
    """One request to the exporter's proxy: its reply and file descriptors.  While the exporter is being
    migrated (or, for a restore, restarted), tries again for wait_s."""
    deadline = time.monotonic() + wait_s
    while True:
        try:
            target = os.readlink(_link(exporter))
            with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
                s.settimeout(30)
                s.connect(target)
                control.send(s, msg)
                return control.recv(s)[0::2]
        except FileNotFoundError as e:  # (no such name: the exporter is gone, or not restored yet)
            why: OSError = e
            if wait_s < RESTORE_WAIT_S:
                break
        except OSError as e:
            why = e
        if time.monotonic() >= deadline:
            break
        time.sleep(0.05)
    raise CudaError(MAP_FAILED, f"the proxy of process {pid}, which exported it, does not answer: {why}")


def _fetch(exporter: int, pid: int, base: int, token: int, wait_s: float) -> tuple[int, int]:
    reply, fds = _ask(exporter, pid, {"cmd": "ipc_fd", "base": base, "token": token}, wait_s)
    if not reply.get("ok") or len(fds) != 1:
        for fd in fds:
            os.close(fd)
        raise CudaError(INVALID_RESOURCE_HANDLE, f"process {pid} does not export that memory: {reply.get('error')}")
    return fds[0], reply["size"]


def IPC_MEM_EXPORT(p: Any, ch: Any, a: tuple[int, ...], payload: bytes) -> tuple[tuple[int, ...], bytes]:
    ptr = a[0]
    d = p.state.arena_of(ptr)
    phys = d.arena.physical(ptr)
    if phys is None:
        raise CudaError(INVALID_VALUE, f"{ptr:#x} is not allocated memory")
    base, size, _h = phys
    token = p.state.ipc_exports.setdefault(base, secrets.randbits(63) + 1)
    return (), IPC_MEM.pack(wire.NVP_IPC_MAGIC, p.server.owner_pid, d.index, 0, token, base, size, ptr - base, 0,
                            _name(p))


def export_fd(state: Any, base: int, token: int) -> tuple[int, int]:
    """For another proxy that shows an exported allocation's secret: (file descriptor, size)."""
    if not token or state.ipc_exports.get(base) != token:
        raise PermissionError("no such exported allocation")
    d = state.arena_of(base)
    _b, size, handle = d.arena.physical(base)
    state.backend.activate(d.index)
    return state.backend.export_fd(d.index, handle), size


def _map_import(st: Any, dev: int, imp: Import, va: int | None, wait_s: float) -> tuple[int, int, Any]:
    """Another application's exported allocation, mapped into this arena (at va, or where there is room):
    (va, size, the driver's handle)."""
    fd, n = _fetch(imp.exporter, imp.pid, imp.base, imp.token, wait_s)
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
    magic, pid, dev, _pad, token, base, size, offset, _pool, exporter = IPC_MEM.unpack(payload)
    if magic != wire.NVP_IPC_MAGIC or offset >= size or not exporter:
        raise CudaError(INVALID_VALUE, "not an IPC memory handle of nvproxy")
    st = p.state
    if exporter == st.ipc_name:
        raise CudaError(INVALID_CONTEXT, "an IPC memory handle of this very process")
    if dev != ch.dev and a[0] & LAZY_PEER_ACCESS:
        # the memory lives on another GPU than the caller's: its device reaches it through peer access, as
        # natively (mapped into this process's arena of the memory's GPU, for that GPU and its peers; on two GPUs
        # NVIDIA's simpleIPC ran into an illegal address without it)
        st.grant_peer(ch.dev, dev)
    imp = st.ipc_imports.get((exporter, base))
    if imp is None:
        imp = Import(dev, 0, 0, None, 0, pid, base, token, exporter)
        imp.va, imp.size, imp.handle = _map_import(st, dev, imp, None, OPEN_WAIT_S)
        st.ipc_imports[(exporter, base)] = imp
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
    st = p.state
    if a[0] not in st.ipc_event_driver:
        p.backend.ipc_event_handle(p.event(a[0]))  # (refuses events made without cudaEventInterprocess)
    token = st.ipc_event_tokens.setdefault(a[0], secrets.randbits(63) + 1)
    return (), IPC_EVENT.pack(wire.NVP_IPC_EVENT_MAGIC, p.server.owner_pid, _name(p), a[0], token)


def export_event(state: Any, wire_id: int, token: int) -> bytes:
    """For another proxy that shows an exported event's secret: the driver's handle of it."""
    if not token or state.ipc_event_tokens.get(wire_id) != token or wire_id not in state.events:
        raise PermissionError("no such exported event")
    held = state.ipc_event_driver.get(wire_id)
    return held if held is not None else state.backend.ipc_event_handle(state.events[wire_id][1])


def _open_event(st: Any, dev: int, handle: bytes, wait_s: float) -> Any:
    magic, pid, exporter, wire_id, token = IPC_EVENT.unpack(handle)
    if magic != wire.NVP_IPC_EVENT_MAGIC or not exporter:
        raise CudaError(INVALID_VALUE, "not an IPC event handle of nvproxy")
    if exporter == st.ipc_name:  # (the driver says what opening one's own event does)
        return st.backend.ipc_event_open(dev, export_event(st, wire_id, token))
    reply, fds = _ask(exporter, pid, {"cmd": "ipc_event", "event": wire_id, "token": token}, wait_s)
    for fd in fds:
        os.close(fd)
    if not reply.get("ok"):
        raise CudaError(INVALID_RESOURCE_HANDLE, f"process {pid} does not export that event: {reply.get('error')}")
    return st.backend.ipc_event_open(dev, bytes.fromhex(reply["handle"]))


def IPC_EVENT_OPEN(p: Any, ch: Any, a: tuple[int, ...], payload: bytes) -> None:
    if len(payload) != IPC_EVENT.size or a[0] in p.state.events:
        raise CudaError(INVALID_VALUE, "IPC event handle")
    p.state.events[a[0]] = (ch.dev, _open_event(p.state, ch.dev, payload, OPEN_WAIT_S))
    p.state.event_flags[a[0]] = 6  # cudaEventDisableTiming | cudaEventInterprocess
    p.state.ipc_opened_events[a[0]] = payload  # (a restore opens it again)


# ---- checkpoints: what the process exported keeps its name and secrets; what it opened is opened again ----
def describe(state: Any) -> dict[str, Any]:
    live = [w for w in state.ipc_event_tokens if w in state.events]
    return {"ipc_name": state.ipc_name,
            "ipc_exports": sorted([base, token] for base, token in state.ipc_exports.items()),
            "ipc_events": {str(w): [state.ipc_event_tokens[w], export_event(state, w, state.ipc_event_tokens[w]).hex()]
                           for w in live},
            "ipc_imports": [imp.key() for imp in state.ipc_imports.values()],
            "ipc_opened_events": {str(w): h.hex() for w, h in state.ipc_opened_events.items() if w in state.events}}


def exported_bases(header: dict[str, Any]) -> list[int]:
    return [base for base, _token in header.get("ipc_exports", [])]


def restore_exports(state: Any, header: dict[str, Any], adopted: bool) -> None:
    """The exporter's name and secrets (adopted: a migration took over the exported memory itself; otherwise
    the memory was made again, and processes that had opened it keep the old unless they are restored too)."""
    state.ipc_name = header.get("ipc_name", 0)
    state.ipc_exports = dict(header.get("ipc_exports", []))
    state.ipc_event_tokens = {int(w): token for w, (token, _h) in header.get("ipc_events", {}).items()}
    if state.ipc_exports and not adopted:
        print("nvproxy: device memory this process exported through CUDA IPC is restored from the image; "
              "processes that had it open see it only if they are restored from the same checkpoint",
              file=sys.stderr)


def restore_imports(state: Any, header: dict[str, Any]) -> None:
    """Map what the process had opened at the same addresses (after its arenas are back: the addresses are free
    there), waiting a while for exporters that are being restored too; fails the restore if one is gone."""
    for dev, va, size, refs, pid, base, token, exporter in header.get("ipc_imports", []):
        imp = Import(dev, va, size, None, refs, pid, base, token, exporter)
        try:
            _va, n, imp.handle = _map_import(state, dev, imp, va, RESTORE_WAIT_S)
        except CudaError as e:
            raise ImageError(f"device memory of process {pid} opened at {va:#x} cannot be opened again: {e}") from None
        if n != size:
            raise ImageError(f"device memory of process {pid} at {va:#x} has {n} bytes now, {size} before")
        state.ipc_imports[(exporter, base)] = imp


def event(state: Any, header: dict[str, Any], wire_id: int, dev: int, adopted: bool) -> Any:
    """An event the process had opened from another's handle, opened again; or one it exported, which a
    migration takes over from the old proxy (its importers keep it); None: make it anew."""
    h = header.get("ipc_opened_events", {}).get(str(wire_id))
    if h is not None:
        handle = bytes.fromhex(h)
        state.ipc_opened_events[wire_id] = handle
        try:
            return _open_event(state, dev, handle, RESTORE_WAIT_S)
        except CudaError as e:
            raise ImageError(f"event {wire_id}, opened from another process, cannot be opened again: {e}") from None
    exported = header.get("ipc_events", {}).get(str(wire_id))
    if exported is None or not adopted:
        return None
    driver = bytes.fromhex(exported[1])
    try:
        e = state.backend.ipc_event_open(dev, driver)
    except CudaError as err:
        raise ImageError(f"event {wire_id}, exported to other processes, cannot be taken over: {err}") from None
    state.ipc_event_driver[wire_id] = driver
    return e
