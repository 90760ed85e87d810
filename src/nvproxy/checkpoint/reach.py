"""Write tracking: which device mappings may have changed since a given checkpoint (an incremental checkpoint copies
only those).  The one owner of that knowledge; native/proxy/reach.c classifies every request (the C fast path's
and Python's alike) into a log that this module folds in at each checkpoint's cut.

The rule.  The unit is an arena mapping (a slab of small allocations, or a large allocation): module variables,
CUDA arrays and modules are small and always saved.  A memcpy, memset or pageable copy marks the mapping its
destination lies in.  A kernel launch or library call marks every mapping its reach may include: the mappings
that the aligned 64-bit words of its parameter block (or library arguments) point into, the module variables
(every kernel reaches its module's), the memory the libraries' handles were configured with (workspaces), and,
closed transitively, every mapping whose address any of those may hold.  What a mapping may hold is known from its
contents at the last checkpoint that saved it (the aligned 64-bit words that point into an arena, scanned in the
image), widened by every later write: a write from the host (which may carry any address) makes it "may point
anywhere", a kernel adds everything in its reach, a device-to-device copy whatever the source may hold.  Reaching
a mapping that may point anywhere, a graph launch, a device reset, an operation not classified, or a log that
overflowed marks every mapping.  Memory exported through CUDA IPC (other processes write it) is always marked.
The rule holds for programs that keep device pointers as pointers, in pointer-sized aligned words; a kernel that
rebuilds an address from other data (two 32-bit halves, an offset past the end of the allocation it was given)
is outside it.  So an incremental checkpoint copies everything and compares it with the earlier image, writing
what differs and reporting each mapping the rule missed; only `--tracked` trusts the rule and copies what it marks.
"""

from __future__ import annotations

import bisect
import weakref
from typing import Any

from .. import wire
from ..ffi_prebuilt import load
from ..proxy.fastpath import enabled, library_path

ANYWHERE = None  # what a mapping "may point anywhere" holds
VARS = -1  # the module variables, as one node of the graph of what may point where

CDEF = wire.cdef_block(wire.header_text("reach.h", "proxy"))
try:
    ffi = load("reach", CDEF)
    _lib: Any = ffi.dlopen(str(library_path())) if enabled() else None
    C = wire.defines(CDEF, "NVPR_")
except (OSError, ValueError, FileNotFoundError):  # (no native library: every checkpoint is taken whole)
    _lib, C = None, {}

ARENA_LO = 0x200000000000
ARENA_HI = ARENA_LO + (64 << 40)  # (64 devices' arenas: state.arena_base)
SHIFT = 21  # granules of 2 MiB: the smallest mapping
Pts = frozenset[int] | None


class Reach:
    def __init__(self, state: Any) -> None:
        self.state = state
        self.epoch = 1  # writes folded in now are marked with it; a checkpoint's cut ends it
        self.written: dict[int, int] = {}  # mapping va -> last epoch it may have been written in
        self.pts: dict[int, Pts] = {VARS: frozenset()}  # mapping va (or VARS) -> mappings whose address it may hold
        self.images: dict[str, dict[str, Any]] = {}  # directory -> the last image written there: its cut, id...
        self._scans: list[dict[int, Pts]] = []  # contents of mappings a checkpoint saved, scanned after its release
        self.usable = _lib is not None
        if self.usable:
            _lib.nvpr_config(ARENA_LO, ARENA_HI, SHIFT)

    # ---- the log ----
    def note(self, op: int, args: tuple[int, ...], payload: bytes) -> None:
        """A request Python is about to execute (C notes its own)."""
        if self.usable:
            _lib.nvpr_note(op, ffi.new("uint64_t[8]", list(args[:8])), payload, len(payload))

    def cut(self) -> int:
        """At a checkpoint's cut (the device idle): fold in what was executed since the last; returns the epoch
        the image about to be taken closes (writes after it are later)."""
        for scanned in self._scans:
            self.pts.update(scanned)
        self._scans = []
        if self.usable:
            self._fold(_lib.nvpr_take())
        cut = self.epoch
        self.epoch += 1
        return cut

    def changed_since(self, cut: int, va: int) -> bool:
        """May mapping va have been written after the image closing epoch cut?"""
        return not self.usable or self.written.get(va, 0) > cut or va in self.state.ipc_exports

    def scanned(self, found: dict[int, Pts]) -> None:
        """What the mappings a checkpoint saved hold (and VARS: the module variables), as of its cut; taken in at
        the next cut, before that epoch's log (it describes writes after this one)."""
        self._scans.append(found)

    # ---- folding ----
    def mappings(self) -> tuple[list[int], list[int]]:
        """(starts, ends) of every mapping, sorted."""
        out = sorted((va, n) for d in self.state.devices.values() for va, n in d.arena.mappings())
        return [va for va, _n in out], [va + n for va, n in out]

    def mapping_of(self, addr: int, starts: list[int], ends: list[int]) -> int | None:
        i = bisect.bisect_right(starts, addr) - 1
        return starts[i] if i >= 0 and addr < ends[i] else None

    def mappings_of(self, addr: int, starts: list[int], ends: list[int]) -> set[int]:
        """The mappings an address reaches: its own, or in the program's VMM mappings the shadows of its allocation
        and of those mapped right after it (a segment grown chunk by chunk is one buffer)."""
        found = (self.mapping_of(a, starts, ends) for a in self.state.aliases(addr))
        return {m for m in found if m is not None}

    def _keys(self, s: Any) -> list[int]:
        return [k - 1 for k in ffi.unpack(s.keys, C["NVPR_SLOTS"]) if k]

    def _fold(self, log: Any) -> None:
        starts, ends = self.mappings()
        sets = log.set

        def mappings(kind: int) -> set[int]:
            return {m for g in self._keys(sets[kind]) for m in self.mappings_of(g << SHIFT, starts, ends)}

        if log.flags & C["NVPR_ALL"] or any(sets[C[k]].overflow for k in ("NVPR_SEED", "NVPR_HOST", "NVPR_EXACT")):
            return self._everything(starts)
        if log.flags & C["NVPR_REMAP"]:  # (the addresses mappings hold may reach other memory now)
            self.pts = {m: ANYWHERE for m in [*self.pts, *starts]}
        for m in mappings(C["NVPR_HOST"]):
            self.written[m], self.pts[m] = self.epoch, ANYWHERE
        for m in mappings(C["NVPR_EXACT"]):
            self.written[m] = self.epoch
            if self.pts.get(m, frozenset()) != frozenset():  # (a partial memset may turn one address into another)
                self.pts[m] = ANYWHERE
        if log.flags & C["NVPR_VARS"] or sets[C["NVPR_OTHER"]].overflow or any(
                not self._host_memory(g << SHIFT) for g in self._keys(sets[C["NVPR_OTHER"]])):
            self.pts[VARS] = ANYWHERE  # (a copy from the host into a module variable)
        seeds = mappings(C["NVPR_SEED"])
        if log.flags & C["NVPR_KERNEL"]:
            seeds.add(VARS)
        if log.flags & C["NVPR_LIB"]:
            seeds |= self._library_memory(starts, ends)
        if not seeds:
            return
        reach = self._closure(seeds)
        if reach is None:
            return self._everything(starts)
        for m in reach:
            if m != VARS:
                self.written[m] = self.epoch
            self.pts[m] = self.pts.get(m, frozenset()) | reach  # (anything in reach may be stored there)

    def _closure(self, seeds: set[int]) -> frozenset[int] | None:
        seen, todo = set(seeds), list(seeds)
        while todo:
            p = self.pts.get(todo.pop(), frozenset())
            if p is ANYWHERE:
                return None
            for m in p - seen:
                seen.add(m)
                todo.append(m)
        return frozenset(seen)

    def _everything(self, starts: list[int]) -> None:
        for m in starts:
            self.written[m], self.pts[m] = self.epoch, ANYWHERE
        self.pts[VARS] = ANYWHERE

    def _host_memory(self, granule: int) -> bool:
        """Does the 2 MiB granule hold host memory the proxy knows (pinned, registered, staging)?"""
        end = granule + (1 << SHIFT)
        return any(addr < end and granule < addr + r.size for addr, r in self.state.host.items())

    def _library_memory(self, starts: list[int], ends: list[int]) -> set[int]:
        """Mappings the math libraries' recorded calls name (a handle's workspace is written by later calls that
        do not name it)."""
        from ..libs import state as libstate

        ls = libstate._STATES.get(self.state)  # noqa: SLF001 (its records are what a restore replays)
        out: set[int] = set()
        for r in ls.records.values() if ls is not None else ():
            for off in range(0, len(r.payload) - 7, 8):
                v = int.from_bytes(r.payload[off : off + 8], "little")
                if ARENA_LO <= v < ARENA_HI:
                    out |= self.mappings_of(v, starts, ends)
        return out


def scan_image(himg: Any, stats: dict[str, Any], reach: Reach) -> dict[int, Pts]:
    """What the regions a checkpoint copied from the device hold (stats["scan"]: (kind, va, offset in the buffer,
    size)), from the image in the buffer: the mappings their aligned 64-bit words point into; the module
    variables' together, as VARS."""
    starts, ends = stats["mappings"]
    out = ffi.new("uint64_t[]", C["NVPR_SCAN_MAX"]) if _lib is not None else None
    found: dict[int, Pts] = {VARS: frozenset()}
    for kind, va, off, n in stats["scan"]:
        k = _lib.nvpr_scan(ffi.cast("void *", himg.base + off), n, out, C["NVPR_SCAN_MAX"]) if out else -1
        key = VARS if kind == "var" else va
        if k < 0 or found.get(key, frozenset()) is ANYWHERE:
            found[key] = ANYWHERE
            continue
        maps = (m for g in ffi.unpack(out, k) for m in reach.mappings_of(g << SHIFT, starts, ends))
        found[key] = found.get(key, frozenset()) | frozenset(maps)
    return found


_REACH: weakref.WeakKeyDictionary[Any, Reach] = weakref.WeakKeyDictionary()


def of(state: Any) -> Reach:
    r = _REACH.get(state)
    if r is None:
        r = _REACH[state] = Reach(state)
    return r
