"""Device memory contents from an image into a restoring proxy.

From an image file read through bounce slots, the device memory's load starts with the restore, on a thread of
its own: its slots are made and its readers fill them while the main thread checks the devices and maps the
arenas, and its copies begin once those exist (a fileload.Gate), while the main thread makes modules, streams,
events and the rest (the native loader releases the GIL): those other parts take a small share of a restore,
whose load takes most of it.  Module variables and CUDA arrays follow once their modules exist.
A migration's image (in memory) and a mapped file load in order, each region's copy issued as it is listed.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

from ..proxy.state import ProcessState
from . import fileload, transfer
from .checksum import checksum
from .image import ImageError

Progress = Callable[[int], None] | None


class DeviceContents:
    """One device's: its mover (streams, events) and the image's loader for it."""

    def __init__(self, img: Any, be: Any, dev: int, progress: Progress, gate: fileload.Gate | None = None) -> None:
        self.dev = dev
        self.m = transfer.Mover(be, dev)
        try:
            self.load, self.finish, self._close = img.loader(self.m, progress, gate)
        except BaseException:
            self.m.close()
            raise

    def close(self) -> None:
        try:
            self._close()
        finally:
            self.m.close()


def list_memory(h: dict[str, Any], dev: int, load: Callable[..., None], exported: dict[int, int] | None,
                progress: Progress = None) -> int:
    """The device's memory regions to load(), with progress(bytes so far) after each; returns their bytes.
    Memory exported through CUDA IPC came over as it is (others may be writing it): not loaded, but counted."""
    listed = 0
    for r in h["regions"]:
        if r.get("dev") != dev or r["kind"] != "mem":
            continue
        if r["va"] not in (exported or {}):
            load(r["va"], r["size"], r["offset"], r["crcs"], f"memory {r['va']:#x}")
        listed += r["size"]
        if progress is not None:
            progress(listed)
    return listed


def list_others(state: ProcessState, img: Any, h: dict[str, Any], dev: int, load: Callable[..., None]) -> None:
    """The device's module variables to load() (their modules are made), and its CUDA arrays written."""
    be = state.backend
    for r in h["regions"]:
        if r.get("dev") != dev:
            continue
        if r["kind"] == "var":
            va, n = be.global_get(state.module(dev, r["module"]), r["name"])
            if n != r["size"]:
                raise ImageError(f"variable {r['name']} has {n} bytes; the image holds {r['size']}")
            load(va, n, r["offset"], r["crcs"], f"variable {r['name']}")
            if va != r["va"]:  # the driver placed the module elsewhere this time
                state.relocate(r["va"], n, va)
        elif r["kind"] == "array":
            data = img.read(r["offset"], r["size"])
            if len(data) != r["size"] or checksum(data) != r["crcs"][0]:
                raise ImageError(f"CUDA array {r['id']}: checksum mismatch; the image is damaged")
            rec = state.arrays[r["id"]]
            be.array_write(rec.handle, rec.shape(), data)


class EarlyLoad:
    """Every device's memory regions loading on a thread of their own, one device after another, their copies
    held back until mapped().  wait() returns each device's contents (its loader free for the variables);
    close() after it, always (before mapped(), it stops the load)."""

    def __init__(self, img: Any, be: Any, h: dict[str, Any], exported: dict[int, int] | None,
                 progress: Callable[[int], Progress]) -> None:
        """progress(bytes of the devices before this one): the device's progress callback."""
        self.contents: dict[int, DeviceContents] = {}
        self.error: BaseException | None = None
        self.gate = fileload.Gate()
        self._args = img, be, h, exported, progress
        self._thread = threading.Thread(target=self._run, name="nvproxy-restore-load", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        img, be, h, exported, progress = self._args
        base = 0
        try:
            for desc in h["devices"]:
                dev = desc["index"]
                c = self.contents[dev] = DeviceContents(img, be, dev, progress(base), self.gate)
                base += list_memory(h, dev, c.load, exported)
                c.finish()
        except BaseException as e:  # (raised in the restoring thread by wait())
            self.error = e

    def mapped(self) -> None:
        """Every device's memory is mapped at its addresses: the copies may go."""
        self.gate.open()

    def wait(self) -> dict[int, DeviceContents]:
        self._thread.join()
        if self.error is not None:
            raise self.error
        return self.contents

    def close(self) -> None:
        if self.gate.cell[0] == 0:
            self.gate.cancel()
        self._thread.join()
        for c in self.contents.values():
            c.close()
        self.contents = {}
