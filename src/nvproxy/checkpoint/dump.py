"""Writing a checkpoint: the state the proxy holds for its application
(compacted: only live objects), every live device mapping, module variables
and the modules themselves, into one image."""

from __future__ import annotations

import os
import sys
import time
from typing import Any

from .. import fatbin
from ..errors import CudaError
from ..proxy.state import ProcessState
from . import transfer
from .image import ImageWriter, checksum

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
    for dev in sorted(state.devices):
        before.update(state.times_before(dev))
    for dev, d in sorted(state.devices.items()):
        name, _uuid, total, attrs = d.props
        devices.append({"index": dev, "name": name, "total_mem": total, "cc": [attrs[75], attrs[76]],
                        "arena_base": d.arena.base, "arena_size": d.arena.size, "arena": d.arena.snapshot(),
                        "modules": sorted(d.modules), "kernels": sorted(d.kernels),
                        "limits": state.limits.get(dev, {})})
    return {
        "backend": state.backend.name,
        "devices": devices,
        "kernels": {str(k): [m, n] for k, (m, n) in state.kernel_names.items()},
        "kernel_attrs": {str(k): v for k, v in state.kernel_attrs.items()},
        "streams": [[w, dev, *state.stream_args[w]] for w, (dev, _s) in sorted(state.streams.items())],
        "events": [[w, dev, state.event_flags[w], before.get(w)] for w, (dev, _e) in sorted(state.events.items())],
        "host": sorted([addr, r.size] for addr, r in state.host.items() if r.channel is None),
    }


def write_image(state: ProcessState, path: str) -> dict[str, Any]:
    """Dump everything to path (the device must be idle). Returns statistics."""
    t0 = time.monotonic()
    be = state.backend
    header = describe(state)
    regions: list[dict[str, Any]] = []
    w = ImageWriter(path)
    try:
        for mod_id, image in sorted(state.images.items()):
            off = w.reserve(len(image))
            os.pwrite(w.fd, image, off)
            regions.append({"kind": "module", "id": mod_id, "size": len(image), "offset": off,
                            "crcs": [checksum(image)]})
        total = sum(n for d in state.devices.values() for _va, n in d.arena.mappings())
        done = 0
        for dev, d in sorted(state.devices.items()):
            b = transfer.Bounce(be, dev)
            try:
                for va, n in d.arena.mappings():
                    off = w.reserve(n)
                    crcs = transfer.device_to_file(b, w.fd, va, n, off)
                    regions.append({"kind": "mem", "dev": dev, "va": va, "size": n, "offset": off, "crcs": crcs})
                    done += n
                    if total > PROGRESS_OVER:
                        _progress("checkpoint", done, total, t0)
                for mod_id in sorted(d.modules):
                    for name in module_variables(state.images[mod_id]):
                        try:
                            va, n = be.global_get(d.modules[mod_id], name)
                        except CudaError:
                            continue
                        if n == 0:
                            continue
                        off = w.reserve(n)
                        crcs = transfer.device_to_file(b, w.fd, va, n, off)
                        regions.append({"kind": "var", "dev": dev, "module": mod_id, "name": name, "size": n,
                                        "va": state.original(va), "offset": off, "crcs": crcs})
            finally:
                b.close()
        header["regions"] = regions
        w.finish(header)
    except BaseException:
        w.abort()
        raise
    seconds = time.monotonic() - t0
    return {"path": str(path), "device_bytes": total, "seconds": seconds,
            "gbps": total / seconds / 1e9 if seconds > 0 else 0.0}


def _progress(what: str, done: int, total: int, t0: float) -> None:
    el = max(time.monotonic() - t0, 1e-9)
    bar = "#" * int(30 * done / total)
    print(f"\rnvproxy {what}: [{bar:<30}] {done >> 20}/{total >> 20} MiB {done / el / 1e9:.1f} GB/s",
          end="\n" if done == total else "", file=sys.stderr, flush=True)
