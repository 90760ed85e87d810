"""A concurrent checkpoint (`nvproxy checkpoint --concurrent`): the application is let go as soon as the device
memory is safe, and the image is copied out while it runs.  The image is the state at the cut, whatever runs after.

At the cut (the device idle), every device mapping to be copied goes one of three ways:
- snapshot: copied device-to-device into spare device memory (free memory less a margin; NVPROXY_CKPT_SPARE caps
  it), on several streams at the device's own bandwidth, before the release; after it, drained to the host image
  buffer on the proxy's own streams, and the spare memory freed;
- copy-before-write: what did not fit stays where it is, unsaved.  Until every such mapping is saved, the proxy
  executes every request in Python (the C fast path is off) and the gate below runs first: a request that may
  write an unsaved mapping has it copied to the buffer first.  What may be written is reach.c's table: a copy's
  or memset's destination mapping, a free's mapping; anything else that writes device memory (a kernel, a library
  call, a graph, an operation the table does not list) has every unsaved mapping saved first, since a kernel's
  reach through stored or computed addresses cannot be bounded.  Meanwhile a thread saves the unsaved mappings
  one by one, so the gate finds less and less to do;
- stop-the-world: saved before the release, where copy-before-write cannot hold (NVPROXY_CKPT_COW=0, memory
  other processes write through CUDA IPC, a mapping with a free still on its way), as module variables and arrays.
A cudaMalloc that would not fit beside the spare memory waits until the snapshot is drained and freed.
"""

from __future__ import annotations

import bisect
import os
import threading
import time
from dataclasses import dataclass, field
from typing import Any

from .. import wire
from ..errors import CudaError
from . import dump, transfer
from .image import CHUNK
from .reach import _lib as _reach_lib

STREAMS = 4  # device-to-device snapshot copies in flight
PIECE = CHUNK  # bytes per snapshot copy
MARGIN_MAX = 1 << 30  # spare memory leaves free at least this much (less on a small device: a 16th of it)
# requests whose destination is their first argument word (reach.c's rule: its `copy` and memset cases)
DEST = {wire.NVP_OP_MEMCPY, wire.NVP_OP_MEMCPY_2D, wire.NVP_OP_MEMSET, wire.NVP_OP_MEMSET_2D, wire.NVP_OP_DRV_MEMSET}
# requests that write no memory themselves but let others write (or unmap) it: memory exported through CUDA IPC is
# written by other processes, past the gate; closing an import unmaps it
SAVE_ALL = {wire.NVP_OP_IPC_MEM_EXPORT, wire.NVP_OP_IPC_MEM_CLOSE}
# the driver's VMM calls that may give back physical memory (its shadow mapping goes: vmm.py)
VMM_DROPS = {wire.NVP_VMM_FREE, wire.NVP_VMM_RELEASE, wire.NVP_VMM_UNMAP}


def writes_nothing(op: int) -> bool:
    return _reach_lib is not None and bool(_reach_lib.nvpr_writes_nothing(op))


@dataclass
class Options:
    spare_cap: int | None = None  # bytes of spare device memory at most (None: free memory less the margin)
    cow: bool = True  # copy-before-write for what does not fit (else: stop-the-world for it)

    @staticmethod
    def from_env(env: dict[str, str] | os._Environ[str] = os.environ) -> Options:
        cap = env.get("NVPROXY_CKPT_SPARE", "")
        return Options(int(cap) << 20 if cap.strip() else None, env.get("NVPROXY_CKPT_COW", "1") != "0")


def margin(total: int) -> int:
    return min(MARGIN_MAX, total // 16)


@dataclass
class Counts:
    snapshot: int = 0  # bytes copied device-to-device, drained after the release
    cow: int = 0  # bytes saved by the gate, before a request that may write them
    background: int = 0  # bytes saved from live memory after the release by the drain thread
    stw: int = 0  # bytes saved before the release
    gate_s: float = 0.0  # how long requests waited in the gate
    methods: list[str] = field(default_factory=list)


class Concurrent:
    """One concurrent checkpoint: take() at the cut, gate() before each request after the release (the
    dispatcher's thread), drain() on the writer's thread."""

    def __init__(self, state: Any, himg: Any, opts: Options) -> None:
        self.state, self.himg, self.opts = state, himg, opts
        self.be = state.backend
        self.counts = Counts()
        self.cond = threading.Condition()
        self.unsaved: dict[int, dict[str, Any]] = {}  # mapping va -> region (guarded by cond)
        self.starts: list[int] = []  # sorted vas of the mappings unsaved at the release
        self.sizes: dict[int, int] = {}
        self.saving: set[int] = set()
        self.snapped: list[dict[str, Any]] = []  # regions with "snap": their copy's address in spare memory
        self.spare: dict[int, int] = {}  # device -> its spare allocation
        self.spare_freed = threading.Event()
        self.failed: BaseException | None = None
        self.gated = False
        self._mover: transfer.Mover | None = None  # the gate's (the dispatcher's thread)

    # ---- at the cut ----
    def take(self, plan: dump.Plan) -> None:
        """Before the release: module variables out; each device mapping snapshotted, left unsaved, or saved."""
        small = [r for r in plan.copied if r["kind"] != "mem"]
        dump.copy_out(self.state, self.himg, small, 0)
        mem = [r for r in plan.copied if r["kind"] == "mem"]
        pinned = self._must_save_now()
        rest: list[dict[str, Any]] = []
        for dev in sorted({r["dev"] for r in mem}):
            mine = [r for r in mem if r["dev"] == dev]
            # (what must be safe at the release first; then address order)
            mine.sort(key=lambda r: (not any(r["va"] <= p < r["va"] + r["size"] for p in pinned), r["va"]))
            rest += self._snapshot(dev, mine)
        stw = [r for r in rest if not self.opts.cow or any(r["va"] <= p < r["va"] + r["size"] for p in pinned)]
        if stw:
            dump.copy_out(self.state, self.himg, stw, 0)
            self.counts.stw = sum(r["size"] for r in stw)
        for r in rest:
            if not any(r is s for s in stw):
                self.unsaved[r["va"]] = r
        self.starts = sorted(self.unsaved)
        self.sizes = {va: r["size"] for va, r in self.unsaved.items()}
        self.counts.methods = [m for m, n in (("snapshot", self.snapshot_bytes()),
                                              ("copy-before-write", sum(self.sizes.values())),
                                              ("stop-the-world", self.counts.stw)) if n]

    def snapshot_bytes(self) -> int:
        return sum(r["size"] for r in self.snapped)

    def _must_save_now(self) -> list[int]:
        """Addresses whose mappings cannot wait: memory other processes write (CUDA IPC) and allocations whose
        free waits for the device on the reaper's thread (it may unmap them at any moment)."""
        return list(self.state.ipc_exports) + list(self.state.freeing)

    def _budget(self, dev: int) -> int:
        free, total = self.be.mem_info(dev)
        budget = max(0, free - margin(total))
        return budget if self.opts.spare_cap is None else min(budget, self.opts.spare_cap)

    def _snapshot(self, dev: int, regions: list[dict[str, Any]]) -> list[dict[str, Any]]:
        """Copy what fits into spare memory of dev; returns the regions that did not fit."""
        budget = self._budget(dev)
        while budget > 0:
            fit, used = [], 0
            for r in regions:
                if used + r["size"] <= budget:
                    fit.append(r)
                    used += r["size"]
            if not fit:
                break
            try:
                base = self.be.spare_alloc(dev, used)
            except CudaError:  # (fragmented, or taken meanwhile by another process: try for less)
                budget = used // 2
                continue
            self.spare[dev] = base
            self._copy_into(dev, base, fit)
            self.snapped += fit
            return [r for r in regions if not any(r is f for f in fit)]
        return regions

    def _copy_into(self, dev: int, base: int, regions: list[dict[str, Any]]) -> None:
        be = self.be
        be.activate(dev)
        streams = [be.stream_create(dev, 1, 0) for _ in range(STREAMS)]
        try:
            at, k = base, 0
            for r in regions:
                r["snap"] = at
                for off in range(0, r["size"], PIECE):
                    n = min(PIECE, r["size"] - off)
                    be.memcpy(at + off, r["from"] + off, n, streams[k % STREAMS])
                    k += 1
                at += r["size"]
            for s in streams:
                be.stream_sync(s)
        finally:
            for s in streams:
                be.stream_destroy(s)

    def free_spare(self) -> None:
        """The spare memory goes (drained, or the checkpoint failed before the release)."""
        for dev, base in self.spare.items():
            self.be.spare_free(dev, base)
        self.spare.clear()
        self.spare_freed.set()

    # ---- after the release: the gate ----
    def install(self, dispatch: Any) -> None:
        """On the event loop's thread, before the release."""
        if self.unsaved:
            self.gated = True
            dispatch.gated = True
            dispatch.captures_changed()  # (the C fast path off: every request comes through the gate)

    def gate(self, dispatch: Any, dev: int, op: int, a: tuple[int, ...]) -> bool:
        """Before the proxy executes request op: save what it may write.  False once nothing is left to guard
        (the caller then drops the gate)."""
        t = time.monotonic()
        try:
            if op == wire.NVP_OP_MALLOC and self.spare and not self.spare_freed.is_set():
                self._room_for(dev, a[0])
            if not self.gated:
                return bool(self.spare) and not self.spare_freed.is_set()
            if op == wire.NVP_OP_FREE:
                self._save(self._mapping_of(a[0]))
            elif op in DEST or (op == wire.NVP_OP_STAGED_COPY and not a[4]):
                self._save(self._mapping_of(a[0]))
            elif not writes_nothing(op) or op in SAVE_ALL or (op == wire.NVP_OP_DRV_VMM and a[0] in VMM_DROPS):
                self._save(list(self.starts))
        except BaseException as e:  # (the image is lost, not the application: the writer reports it)
            self.failed = self.failed or e
            with self.cond:
                self.unsaved.clear()
        finally:
            self.counts.gate_s += time.monotonic() - t
        with self.cond:
            left = bool(self.unsaved or self.saving)
        if self.gated and not left:
            self.gated = False
            dispatch.gated = False
            dispatch.captures_changed()
            if self._mover is not None:
                with self.be.capture_relaxed():
                    self._mover.close()
                self._mover = None
        return self.gated or (bool(self.spare) and not self.spare_freed.is_set())

    def _room_for(self, dev: int, size: int) -> None:
        free, total = self.be.mem_info(dev)
        if free < size + margin(total):
            self.spare_freed.wait()

    def _mapping_of(self, addr: int) -> list[int]:
        out = []
        for a in self.state.aliases(addr):  # (a VMM mapping of the program: its allocations' shadows are saved)
            i = bisect.bisect_right(self.starts, a) - 1
            va = self.starts[i] if i >= 0 else None
            if va is not None and a < va + self.sizes[va]:
                out.append(va)
        return out

    def _save(self, vas: list[int]) -> None:
        for va in vas:
            with self.cond:
                while va in self.saving:
                    self.cond.wait()
                r = self.unsaved.pop(va, None)
                if r is None:
                    continue
                self.saving.add(va)
            try:
                with self.be.capture_relaxed():  # (the program's captures must not forbid the proxy's copies)
                    if self._mover is None:
                        self._mover = transfer.Mover(self.be, r["dev"])
                    r["crcs"] = transfer.device_to_host(self._mover, self.himg, r["from"], r["size"], r["offset"])
                self.counts.cow += r["size"]
            finally:
                with self.cond:
                    self.saving.discard(va)
                    self.cond.notify_all()

    # ---- after the release: the drain (the writer's thread) ----
    def drain(self) -> float:
        """The snapshot to the buffer, the spare memory freed, then what is still unsaved from live memory.
        Returns the seconds it took; raises what made the image incomplete."""
        t = time.monotonic()
        with self.be.capture_relaxed():  # (the program's captures must not forbid the proxy's copies)
            try:
                dump.copy_out(self.state, self.himg, self.snapped, self.snapshot_bytes(), source=lambda r: r["snap"])
            finally:
                self.free_spare()
            self.counts.background = self._save_rest()
        if self.failed is not None:
            raise self.failed
        return time.monotonic() - t

    def _save_rest(self) -> int:
        done = 0
        movers: dict[int, transfer.Mover] = {}
        try:
            while True:
                with self.cond:
                    if not self.unsaved:
                        while self.saving:
                            self.cond.wait()
                        return done
                    va, r = next(iter(self.unsaved.items()))
                    del self.unsaved[va]
                    self.saving.add(va)
                try:
                    m = movers.get(r["dev"])
                    if m is None:
                        m = movers[r["dev"]] = transfer.Mover(self.be, r["dev"])
                    r["crcs"] = transfer.device_to_host(m, self.himg, r["from"], r["size"], r["offset"])
                    done += r["size"]
                finally:
                    with self.cond:
                        self.saving.discard(va)
                        self.cond.notify_all()
        finally:
            for m in movers.values():
                m.close()

    def report(self) -> dict[str, Any]:
        c = self.counts
        return {"methods": c.methods, "snapshot_bytes": self.snapshot_bytes(), "cow_bytes": c.cow,
                "background_bytes": c.background, "stw_bytes": c.stw, "gate_s": c.gate_s}

