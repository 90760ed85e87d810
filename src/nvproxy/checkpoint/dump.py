"""Taking a checkpoint: the state the proxy holds for its application
(compacted: only live objects), every live device mapping, module variables
and the modules themselves, into one image in the host image buffer."""

from __future__ import annotations

import os
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from .. import fatbin
from ..errors import CudaError
from ..libs import state as libstate
from ..proxy import managed_vars
from ..proxy.handlers import arrays, graphs, ipc
from ..proxy.state import ProcessState
from . import hostimage, transfer
from .checksum import checksum
from .hostimage import HostImage
from .image import ALIGN, Layout, encode_header
from .parent import Parent

PROGRESS_OVER = 1 << 30


def module_variables(image: bytes) -> list[str]:
    try:
        return sorted(fatbin.parse(image).variables)
    except fatbin.FatbinError as e:
        print(f"nvproxy: cannot list the variables of a module ({e}); their contents are not saved", file=sys.stderr)
        return []


def describe(state: ProcessState) -> dict[str, Any]:
    """The image header's description of the process (no regions yet)."""
    devices = []
    before: dict[int, float] = {}  # event -> ms it was recorded before now
    captured = graphs.captured_events(state)
    for dev in sorted(state.devices):
        before.update(state.times_before(dev, captured))
    for dev, d in sorted(state.devices.items()):
        name, uuid, total, attrs = state.props(dev)
        devices.append({"index": dev, "name": name, "uuid": uuid.hex(), "total_mem": total,
                        "cc": [attrs[75], attrs[76]],
                        "arena_base": d.arena.base, "arena_size": d.arena.size, "arena": d.arena.snapshot(),
                        "modules": sorted(d.modules), "kernels": sorted(d.kernels),
                        "limits": state.limits.get(dev, {})})
    return {
        "backend": state.backend.name,
        "devices": devices,
        "kernels": {str(k): [m, n] for k, (m, n) in state.kernel_names.items()},
        "kernel_attrs": {str(k): v for k, v in state.kernel_attrs.items()},
        "streams": [[w, dev, *state.stream_args[w]] for w, (dev, _s) in sorted(state.streams.items())],
        "stream_attrs": {str(w): {str(k): v.hex() for k, v in attrs.items()}
                         for w, attrs in state.stream_attrs.items()},
        "events": [[w, dev, state.event_flags[w], before.get(w)] for w, (dev, _e) in sorted(state.events.items())],
        "host": sorted([addr, r.size] for addr, r in state.host.items() if r.channel is None),
        "managed": sorted([addr, r.size, r.dev] for addr, r in state.managed.items()),
        **graphs.describe(state),
        **arrays.describe(state),
        **managed_vars.describe(state),
        **ipc.describe(state),
        **libstate.describe(state),
        "peer_grants": sorted([dev, owner] for dev, owner in state.peer_grants),
        # kernel printf output the drain brought out that no reply has carried to the application yet
        "printf_text": state.backend.pending_text().hex(),
    }


def estimate(state: ProcessState) -> int:
    """About how many bytes an image of the state takes (for growing the buffer ahead of need)."""
    n = sum(len(img) + ALIGN for img in state.images.values())
    for d in state.devices.values():
        n += sum(size + ALIGN for _va, size in d.arena.mappings())
    n += sum(_array_bytes(r) + ALIGN for r in state.arrays.values())
    return n + (1 << 20)  # module variables and the header


def _array_bytes(rec: Any) -> int:
    row, rows, slices = rec.shape()
    return row * rows * slices


def prefault(state: ProcessState) -> None:
    """Grow the host image buffer to the state's size ahead of a checkpoint (its
    pages are made and registered now, while the application runs; see hostimage.py)."""
    if hostimage.mode() != "prefault" or not state.devices:
        return
    with state.arena_lock:
        need = estimate(state)
    himg = hostimage.of(state)
    if need > himg.capacity and himg.lock.acquire(blocking=False):
        try:
            if not himg.closed:
                himg.grow(need)
        finally:
            himg.lock.release()


def dump(state: ProcessState, himg: HostImage, parent: Parent | None = None,
         concurrent: Callable[[Plan], None] | None = None) -> dict[str, Any]:
    """Write an image of everything into the host image buffer (the device must be idle).
    Returns statistics; the image is the buffer's first stats["image_bytes"] bytes.  parent: an earlier image
    whose unchanged mappings are taken from its file (stats["reuse"]), not copied from the device.
    concurrent: instead of copying the device mappings out, hands the plan to a concurrent checkpoint
    (concurrent.py), which copies them after the release; stats then has no image yet: stats["finish"]() makes it."""
    t0 = time.monotonic()
    if state.broken:
        return _dump_broken(state, himg, t0)
    # (the proxy's thread may have begun stream captures: in global or thread-local mode they forbid it the calls
    # a checkpoint makes)
    with state.backend.capture_relaxed():
        plan = _plan(state, himg, t0, parent)
        if concurrent is None:
            plan.t_copy = copy_out(state, himg, plan.copied, plan.total)
            return finish(plan, himg)
        concurrent(plan)
        return {"finish": lambda: finish(plan, himg), "plan": plan}


@dataclass
class Plan:
    """An image being made: its header and where every region goes in the buffer."""

    header: dict[str, Any]
    layout: Layout
    regions: list[dict[str, Any]]  # every region, in header order
    copied: list[dict[str, Any]]  # the device regions to copy from the device ("from": their address now)
    reuse: list[tuple[int, int, int]]  # (offset here, offset in the parent's file, bytes)
    parent: Parent | None
    total: int  # bytes of device mappings
    t0: float
    t_grow: float
    t_copy: float = 0.0


def _plan(state: ProcessState, himg: HostImage, t0: float, parent: Parent | None) -> Plan:
    """The header at the cut, the layout, the buffer grown to it; modules and arrays copied in (arrays through
    pageable memory: they are small beside the arena); which device regions must come from the device."""
    be = state.backend
    header = describe(state)
    header["id"] = os.urandom(16).hex()
    if parent is not None:
        header["parent"] = {"name": os.path.basename(parent.path), "id": parent.id}
    layout = Layout()
    modules = []
    for mod_id, image in sorted(state.images.items()):
        modules.append(({"kind": "module", "id": mod_id, "size": len(image), "offset": layout.reserve(len(image))},
                        image))
    device_regions: list[dict[str, Any]] = []
    for dev, d in sorted(state.devices.items()):
        for va, n in d.arena.mappings():
            device_regions.append({"kind": "mem", "dev": dev, "va": va, "size": n, "offset": layout.reserve(n),
                                   "from": va})
        for mod_id in sorted(d.modules):
            for name in module_variables(state.images[mod_id]):
                try:
                    va, n = be.global_get(d.modules[mod_id], name)
                except CudaError:
                    continue
                if n:
                    device_regions.append({"kind": "var", "dev": dev, "module": mod_id, "name": name, "size": n,
                                           "va": state.original(va), "offset": layout.reserve(n), "from": va})
    array_regions = [{"kind": "array", "id": i, "dev": r.dev, "size": _array_bytes(r),
                      "offset": layout.reserve(_array_bytes(r))} for i, r in sorted(state.arrays.items())]
    t_grow = time.monotonic()
    himg.grow(layout.end + (1 << 20))  # and register what was not yet
    t_grow = time.monotonic() - t_grow
    for r, image in modules:
        himg.view(r["offset"], len(image))[:] = image
        r["crcs"] = [checksum(image)]
    for r in array_regions:
        rec = state.arrays[r["id"]]
        be.activate(rec.dev)
        data = be.array_read(rec.handle, rec.shape())
        himg.view(r["offset"], r["size"])[:] = data
        r["crcs"] = [checksum(data)]
    total = sum(r["size"] for r in device_regions if r["kind"] == "mem")
    reuse: list[tuple[int, int, int]] = []
    copied = [r for r in device_regions if parent is None or not parent.takes(r, reuse)]
    return Plan(header, layout, [r for r, _i in modules] + device_regions + array_regions, copied, reuse, parent,
                total, t0, t_grow)


def copy_out(state: ProcessState, himg: HostImage, regions: list[dict[str, Any]], total: int,
             source: Callable[[dict[str, Any]], int] = lambda r: r["from"]) -> float:
    """Copy device regions into the buffer at their offsets, with their chunks' checksums (source: where each is
    read from); returns the seconds it took."""
    done = 0
    t_copy = time.monotonic()
    for dev in sorted({r["dev"] for r in regions}):
        m = transfer.Mover(state.backend, dev)
        try:
            for r in regions:
                if r["dev"] == dev:
                    r["crcs"] = transfer.device_to_host(m, himg, source(r), r["size"], r["offset"])
                    done += r["size"] if r["kind"] == "mem" else 0
                    if total > PROGRESS_OVER and r["kind"] == "mem":
                        _progress("checkpoint", done, total, t_copy)
        finally:
            m.close()
    return time.monotonic() - t_copy


def finish(plan: Plan, himg: HostImage) -> dict[str, Any]:
    """Once every region is in the buffer: the header after them; the statistics."""
    parent, reuse, copied, total = plan.parent, plan.reuse, plan.copied, plan.total
    missed = parent.verified(copied, reuse) if parent is not None else []
    scan = [(r["kind"], r.get("va", 0), r["offset"], r["size"]) for r in copied]
    for r in plan.regions:
        r.pop("from", None)
    header, layout = plan.header, plan.layout
    header["regions"] = plan.regions
    prefix, data = encode_header(header, layout.end)
    himg.grow(layout.end + len(data))
    himg.view(layout.end, len(data))[:] = data
    himg.view(0, len(prefix))[:] = prefix
    seconds = time.monotonic() - plan.t0
    return {"device_bytes": total, "image_bytes": layout.end + len(data), "seconds": seconds,
            "gbps": total / seconds / 1e9 if seconds > 0 else 0.0, "grow_s": plan.t_grow,
            "copy_gbps": total / plan.t_copy / 1e9 if plan.t_copy > 0 else 0.0, "id": header["id"],
            "copied_bytes": sum(r["size"] for r in copied if r["kind"] == "mem"),
            "written_bytes": total - sum(n for _o, _p, n in reuse), "reused_bytes": sum(n for _o, _p, n in reuse),
            "reuse": reuse, "missed": missed, "scan": scan}


def _dump_broken(state: ProcessState, himg: HostImage, t0: float) -> dict[str, Any]:
    """The image of a context a sticky error left unusable: only the error (and the kernel printf text that came
    out before it), since nothing on the device can be read or made again; the application restored from it
    gets that error from every call, as it would have from the native context."""
    header = {"backend": state.backend.name, "broken": state.broken, "devices": [], "host": [], "regions": [],
              "used": sorted(state.devices), "printf_text": state.backend.pending_text().hex(),
              "id": os.urandom(16).hex()}
    prefix, data = encode_header(header, ALIGN)
    himg.grow(ALIGN + len(data), register=False)
    himg.view(ALIGN, len(data))[:] = data
    himg.view(0, len(prefix))[:] = prefix
    return {"device_bytes": 0, "image_bytes": ALIGN + len(data), "seconds": time.monotonic() - t0, "gbps": 0.0,
            "grow_s": 0.0, "copy_gbps": 0.0, "broken": state.broken, "id": header["id"]}


def _progress(what: str, done: int, total: int, t0: float) -> None:
    el = max(time.monotonic() - t0, 1e-9)
    done = min(done, total)  # (a restore's count may include module variables, which the total leaves out)
    bar = "#" * int(30 * done / total)
    print(f"\rnvproxy {what}: [{bar:<30}] {done >> 20}/{total >> 20} MiB {done / el / 1e9:.1f} GB/s",
          end="\n" if done == total else "", file=sys.stderr, flush=True)
