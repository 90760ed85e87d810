"""Rebuilding a checkpointed process in a fresh proxy: the same device
addresses (arena at the same base, same layout), the same handle IDs, the
same kernels and module variables, memory contents checked against their
CRCs.  Anything that makes an exact restore impossible raises ImageError
before the application is let go on."""

from __future__ import annotations

import os
import sys
import time
from collections.abc import Callable
from typing import Any

from ..errors import CudaError
from ..libs import state as libstate
from ..proxy import libc, managed_vars, vmm
from ..proxy.handlers import arrays, ipc
from ..proxy.state import HostRange, ManagedRange, ProcessState
from . import contents, fileload, transfer
from .checksum import checksum
from .dump import PROGRESS_OVER, _progress
from .hostimage import HostImage
from .image import ImageError, parse_header, read_header


def read_mode() -> str:
    """How an image file is read: through bounce slots by the native loader, or with NVPROXY_RESTORE_READ=map
    mapped and registered, its pages going to the device as they are (registering the file's pages makes that
    the slower way)."""
    mode = os.environ.get("NVPROXY_RESTORE_READ", "bounce")
    return mode if mode in ("map", "bounce") else "bounce"


class _FileImage:
    """An image file: read through pinned bounce slots, or (NVPROXY_RESTORE_READ=map) mapped and
    registered, so that its pages go to the device as they are (where registering it fails: bounce slots)."""

    def __init__(self, path: str, check: fileload.Check | None = None) -> None:
        self.what, self.check = path, check
        self.fd, self.header = read_header(path)
        self.mapped: transfer.MappedFile | None = None
        self.reader: transfer.FileLoader | None = None

    def read(self, off: int, n: int) -> bytes:
        return os.pread(self.fd, n, off)

    def loader(self, m: transfer.Mover, progress: Callable[[int], None] | None,
               gate: fileload.Gate | None = None) -> tuple[Any, Any, Any]:
        """(load, finish, close); progress(bytes loaded by this loader so far), if given, is called now and then;
        gate holds a bounce load's copies back until the device memory exists (an early load's)."""
        if self.mapped is None and read_mode() == "map":
            try:
                self.mapped = transfer.MappedFile(m.backend, m.dev, self.fd)
            except (OSError, CudaError) as e:
                print(f"nvproxy: reading {self.what} through bounce buffers (registering it: {e})", file=sys.stderr)
        if self.mapped is not None:
            mf = self.mapped
            return (lambda va, n, off, crcs, what: transfer.host_to_device(m, mf, va, n, off, crcs, what)), (
                lambda: None), (lambda: None)
        fl = self.reader = transfer.FileLoader(m, self.fd, self.device_bytes(), progress, gate, self.check)
        return fl.load, fl.finish, fl.close

    def device_bytes(self) -> int:
        return sum(r["size"] for r in self.header["regions"] if r["kind"] in ("mem", "var"))

    def close(self) -> None:
        if self.mapped is not None:
            self.mapped.close()
        os.close(self.fd)

    def note(self, phases: dict[str, float]) -> None:
        if self.mapped is not None and self.mapped.t_done:
            phases["file_registered"] = self.mapped.t_done - self.mapped.t0
        if self.reader is not None:
            phases.update({f"threads_{k}": v for k, v in self.reader.spent.items()})
        if self.check is not None:
            self.check.stop()
            phases["threads_early_check"] = self.check.read_s


class _MemoryImage:
    def __init__(self, himg: HostImage) -> None:
        self.what, self.himg = "the image handed over", himg
        self.header = parse_header(self.read, self.what)

    def read(self, off: int, n: int) -> bytes:
        if off + n > self.himg.capacity:
            return b""
        return bytes(self.himg.view(off, n))

    def loader(self, m: transfer.Mover, progress: Callable[[int], None] | None,
               gate: object = None) -> tuple[Any, Any, Any]:
        """Copies as load() is called: never early, so gate is never given."""
        return (lambda va, n, off, crcs, what: transfer.host_to_device(m, self.himg, va, n, off, crcs, what)), (
            lambda: None), (lambda: None)

    def close(self) -> None:
        pass


def restore_image(state: ProcessState, source: str | HostImage, host_fds: dict[int, int] | None,
                  calls: Callable[[dict[str, Any]], None] | None = None,
                  exported: dict[int, int] | None = None, check: fileload.Check | None = None) -> dict[str, Any]:
    """source: an image file, or a host image buffer holding one (a migration's).
    host_fds: the pinned-memory memfds by address; None when the application
    will share them again itself (recovery after the proxy died).
    calls: makes what the image keeps as logged calls again (graphs), given the header.
    exported: a migration's: the device memory the application exported through CUDA IPC, as file
    descriptors by address; mapped as it is (other processes use it), not made again.
    check: an early check of the image file's chunks (earlycheck.py), begun when the proxy started."""
    t0 = time.monotonic()
    img = _FileImage(source, check) if isinstance(source, str) else _MemoryImage(source)
    phases: dict[str, float] = {}
    try:
        try:
            if img.header.get("broken"):
                _restore_broken(state, img)
            else:
                _replay(state, img, host_fds, t0, phases, exported)
            if img.header.get("graphs") or img.header.get("graph_execs") or img.header.get("captures"):
                if calls is None:
                    raise ImageError("the image holds CUDA graphs, which this restore cannot make again")
                t = time.monotonic()
                calls(img.header)
                phases["graphs"] = time.monotonic() - t
        except CudaError as e:
            raise ImageError(f"restoring {img.what} failed: CUDA error {e.code} ({e})") from None
    finally:
        if isinstance(img, _FileImage):
            img.note(phases)
        img.close()
    total = sum(r["size"] for r in img.header["regions"] if r["kind"] == "mem")
    seconds = time.monotonic() - t0
    return {"path": img.what, "device_bytes": total, "seconds": seconds,
            "gbps": total / seconds / 1e9 if seconds else 0, "phases": phases,
            "checked_early": (len(check.stop()), len(check.chunks)) if check is not None else (0, 0)}


def _replay(state: ProcessState, img: Any, host_fds: dict[int, int] | None, t0: float,
            phases: dict[str, float], exported: dict[int, int] | None) -> None:
    """phases: seconds each part took (device memory made, modules, objects, contents)."""
    h = img.header
    mark = [time.monotonic()]

    def phase(name: str) -> None:
        now = time.monotonic()
        phases[name] = phases.get(name, 0.0) + now - mark[0]
        mark[0] = now

    be = state.backend
    _check_backend(h, be)
    total = sum(r["size"] for r in h["regions"] if r["kind"] == "mem")

    def progress(base: int) -> contents.Progress:
        return (lambda n: _progress("restore", base + n, total, t0)) if total > PROGRESS_OVER else None

    # (a file read through bounce slots: its load starts now, its copies once the device memory is mapped)
    early = contents.EarlyLoad(img, be, h, exported, progress) if _loads_early(img) else None
    try:
        _map_devices(state, h, exported, phase)
        phase("device_memory")
        if early is not None:
            early.mapped()
        _make_modules(state, img, h)
        phase("modules")
        before = _make_objects(state, h, host_fds, exported)
        phase("objects")
        loaded = early.wait() if early is not None else {}
        if early is not None:
            phase("contents_loaded")
        _load_contents(state, img, h, exported, loaded, before, phase, progress)
        libstate.restore(state, h)  # (the math libraries' objects: after the memory they may point to)
        phase("libraries")
    finally:
        if early is not None:
            early.close()


def _not_visible(dev: int, count: int) -> str:
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    where = f" (CUDA_VISIBLE_DEVICES={visible})" if visible is not None else ""
    return f"the image uses device {dev}, and this proxy sees {count} device{'' if count == 1 else 's'}{where}"


def _map_devices(state: ProcessState, h: dict[str, Any], exported: dict[int, int] | None,
                 phase: Callable[[str], None]) -> None:
    """Each device checked against the image, its context made, its arena mapped at the image's addresses."""
    be = state.backend
    for desc in h["devices"]:
        if desc["index"] >= be.device_count():
            raise ImageError(_not_visible(desc["index"], be.device_count()))
        be.activate(desc["index"])  # (a restoring proxy's contexts are being made since it started: backends/warmup)
    phase("driver")
    for desc in h["devices"]:
        dev = desc["index"]
        name, uuid = be.device_identity(dev)
        phase("device_identity")
        if name != desc["name"]:
            raise ImageError(f"device {dev} is a {name}; the image was taken on a {desc['name']}")
        adopt = {va: fd for va, fd in (exported or {}).items()
                 if desc["arena_base"] <= va < desc["arena_base"] + desc["arena_size"]}
        if adopt and uuid.hex() != desc.get("uuid"):
            raise ImageError("device memory exported through CUDA IPC cannot move to another GPU while other "
                             "processes may use it")
        need = sum(n for va, n in _mappings(desc) if va not in adopt)
        free, _t = be.mem_info(dev)
        if need > free:
            raise ImageError(f"device {dev} has {free >> 20} MiB free; the image needs {need >> 20} MiB")
        phase("device_free")
        d = state.device(dev)
        phase("device_context")
        if d.arena.base != desc["arena_base"]:
            raise ImageError(f"device {dev}'s arena landed at {d.arena.base:#x}, not {desc['arena_base']:#x}")
        for peer, owner in h.get("peer_grants", []):  # (its memory is mapped for them too)
            if owner == dev:
                d.arena.backing.grant(peer, [])
                state.peer_grants.add((peer, owner))
        d.arena.restore(desc["arena"], adopt)
        be.activate(dev)
        for lim, v in desc["limits"].items():
            be.set_limit(int(lim), v)
            state.limits.setdefault(dev, {})[int(lim)] = v
    ipc.restore_exports(state, h, exported is not None)
    ipc.restore_imports(state, h)  # (memory opened from other processes: at the same addresses)
    for peer, owner in h.get("peer_grants", []):  # (contexts' peer access, for memory outside the arenas)
        try:
            be.activate(peer)
            be.peer(1, peer, owner)
        except CudaError:
            pass  # (already enabled, or granted only for a pool: the arena's memory is reachable either way)


def _loads_early(img: Any) -> bool:
    return isinstance(img, _FileImage) and read_mode() == "bounce"


def _make_modules(state: ProcessState, img: Any, h: dict[str, Any]) -> None:
    """Modules first: kernels and variables live in them."""
    be = state.backend
    for r in h["regions"]:
        if r["kind"] == "module":
            data = img.read(r["offset"], r["size"])
            if len(data) != r["size"] or checksum(data) != r["crcs"][0]:
                raise ImageError(f"module {r['id']}: checksum mismatch; the image is damaged")
            state.images[r["id"]] = data
    state.kernel_names.update({int(k): (m, n) for k, (m, n) in h["kernels"].items()})
    for desc in h["devices"]:
        dev = desc["index"]
        for mod_id in desc["modules"]:
            state.module(dev, mod_id)
        for kid in desc["kernels"]:
            k = state.kernel(dev, kid)
            for attr, v in h["kernel_attrs"].get(str(kid), {}).items():
                be.func_set_attr(k, int(attr), v)
                state.kernel_attrs.setdefault(kid, {})[int(attr)] = v
    managed_vars.restore(state, h)


def _make_objects(state: ProcessState, h: dict[str, Any], host_fds: dict[int, int] | None,
                  exported: dict[int, int] | None) -> dict[int, dict[int, float]]:
    """Streams, events, pinned host memory, arrays and the objects over them; returns the events' times
    before the checkpoint by device."""
    be = state.backend
    for w, dev, flags, prio in h["streams"]:
        state.streams[w] = (dev, be.stream_create(dev, flags, prio))
        state.stream_args[w] = (flags, prio)
    for w, attrs in h.get("stream_attrs", {}).items():
        for attr, value in attrs.items():
            be.stream_set_attr(state.streams[int(w)][1], int(attr), bytes.fromhex(value))
            state.stream_attrs.setdefault(int(w), {})[int(attr)] = bytes.fromhex(value)
    before: dict[int, dict[int, float]] = {}
    for w, dev, flags, *ms in h["events"]:
        opened = ipc.event(state, h, w, dev, exported is not None)
        state.events[w] = (dev, opened if opened is not None else be.event_create(dev, flags))
        state.event_flags[w] = flags
        if ms and ms[0] is not None:
            before.setdefault(dev, {})[w] = ms[0]
    for addr, size in h["host"] if host_fds is not None else []:
        hfd = host_fds.get(addr)
        if hfd is None:
            raise ImageError(f"pinned host memory at {addr:#x} was not handed over")
        if not libc.map_fixed(hfd, addr, size):
            raise ImageError(f"pinned host memory at {addr:#x} cannot be mapped at its address here")
        be.host_register(addr, size)
        state.host[addr] = HostRange(size, hfd)
    for addr, size, dev in h.get("managed", []) if host_fds is not None else []:  # (a recovery: the shim's)
        hfd = host_fds.get(addr)
        if hfd is None:
            raise ImageError(f"managed memory at {addr:#x} was not handed over")
        host = libc.map_anywhere(hfd, size)
        be.host_register(host, size)
        state.managed[addr] = ManagedRange(size, hfd, host, dev)
    arrays.make_arrays(state, h)
    arrays.make_objects(state, h)  # (after the streams and events: their values come from the same tables)
    return before


def _load_contents(state: ProcessState, img: Any, h: dict[str, Any], exported: dict[int, int] | None,
                   loaded: dict[int, contents.DeviceContents], before: dict[int, dict[int, float]],
                   phase: Callable[[str], None], progress: Callable[[int], contents.Progress]) -> None:
    """Every device's memory (unless loaded already, by an early load), variables and arrays."""
    be = state.backend
    done = 0
    for desc in h["devices"]:
        dev = desc["index"]
        early = loaded.pop(dev, None)
        c = early or contents.DeviceContents(img, be, dev, progress(done))
        try:
            if early is None:
                copies_at_once = not (isinstance(img, _FileImage) and img.mapped is None)  # (else load() lists)
                done += contents.list_memory(h, dev, c.load, exported, progress(done) if copies_at_once else None)
            contents.list_others(state, img, h, dev, c.load)
            phase("contents")
            c.finish()
            phase("contents_loaded")
        finally:
            c.close()
        be.device_sync(dev)
        phase("contents_let_go")
        state.set_times_before(dev, before.get(dev, {}))
    be.put_text(bytes.fromhex(h.get("printf_text", "")))  # (the next reply carries it, as the call it waited for)
    phase("contents_let_go")


def _check_backend(h: dict[str, Any], be: Any) -> None:
    if h["backend"] != be.name:
        raise ImageError(f"the image was taken on the {h['backend']} backend; this proxy runs {be.name}")


def _restore_broken(state: ProcessState, img: Any) -> None:
    """An image of a context broken by a sticky error (dump._dump_broken): this proxy answers with that error."""
    h = img.header
    _check_backend(h, state.backend)
    state.broken = int(h["broken"])
    for dev in h.get("used", []):  # (contexts all the same: a migration's new proxy registers staging memory)
        if dev >= state.backend.device_count():
            raise ImageError(_not_visible(dev, state.backend.device_count()))
        state.backend.activate(dev)
    print(f"nvproxy: {img.what} holds a context that CUDA error {state.broken} left unusable; every CUDA call of "
          "the application fails with it, as it did before the checkpoint", file=sys.stderr)
    state.backend.put_text(bytes.fromhex(h.get("printf_text", "")))


def _mappings(desc: dict[str, Any]) -> list[tuple[int, int]]:
    g = desc["arena"]["granularity"]
    out = [(va, g) for va in desc["arena"]["slabs"]]
    out += [(p, n) for p, n, small in desc["arena"]["allocs"] if not small]
    return out + vmm.snapshot_shadows(desc["arena"])
