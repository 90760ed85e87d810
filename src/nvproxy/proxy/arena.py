"""The device virtual-address arena and its sub-allocator.

Every cudaMalloc result lies in one reserved range per device at a fixed base,
so a restored process finds its allocations at the same addresses.  Physical
memory comes in granules (2 MiB on current GPUs): allocations under
SMALL_LIMIT share slabs of one granule, larger ones get their own mapping.
Freed large mappings are kept (by size) and handed out again before asking
the driver, which is what makes malloc+free cheaper than the driver's own.
"""

from __future__ import annotations

import bisect
from collections import defaultdict
from dataclasses import dataclass, field
from typing import Protocol

from ..errors import INVALID_VALUE, MEMORY_ALLOCATION, CudaError
from .vmm import Vmm

ALIGN = 512  # cudaMalloc alignment on current GPUs
SMALL_LIMIT = 1 << 20


class Backing(Protocol):
    """Physical memory of one device, as the backend provides it."""

    granularity: int

    def create(self, size: int) -> object: ...
    def adopt(self, fd: int, size: int) -> object: ...
    def map(self, va: int, size: int, handle: object) -> None: ...
    def unmap(self, va: int, size: int) -> None: ...
    def release(self, handle: object) -> None: ...
    def grant(self, dev: int, mappings: list[tuple[int, int]]) -> None: ...


class FreeList:
    """First-fit free ranges of an address interval, coalescing on free."""

    def __init__(self, base: int, size: int) -> None:
        self.starts = [base]
        self.sizes = [size]

    def take(self, size: int, align: int) -> int:
        for i, (s, n) in enumerate(zip(self.starts, self.sizes, strict=True)):
            a = (s + align - 1) // align * align
            if a + size <= s + n:
                tail = s + n - (a + size)
                if a > s:
                    self.sizes[i] = a - s
                    if tail:
                        self.starts.insert(i + 1, a + size)
                        self.sizes.insert(i + 1, tail)
                elif tail:
                    self.starts[i], self.sizes[i] = a + size, tail
                else:
                    del self.starts[i], self.sizes[i]
                return a
        raise CudaError(MEMORY_ALLOCATION, "arena exhausted")

    def take_at(self, start: int, size: int) -> None:
        """Take exactly [start, start+size): how a restore puts things back."""
        i = bisect.bisect_right(self.starts, start) - 1
        if i < 0 or start + size > self.starts[i] + self.sizes[i]:
            raise CudaError(MEMORY_ALLOCATION, f"{start:#x}+{size} is not free")
        s, n = self.starts[i], self.sizes[i]
        del self.starts[i], self.sizes[i]
        if start + size < s + n:
            self.starts.insert(i, start + size)
            self.sizes.insert(i, s + n - start - size)
        if start > s:
            self.starts.insert(i, s)
            self.sizes.insert(i, start - s)

    def give(self, start: int, size: int) -> None:
        i = bisect.bisect_left(self.starts, start)
        if i > 0 and self.starts[i - 1] + self.sizes[i - 1] == start:
            i -= 1
            self.sizes[i] += size
        else:
            self.starts.insert(i, start)
            self.sizes.insert(i, size)
        if i + 1 < len(self.starts) and self.starts[i] + self.sizes[i] == self.starts[i + 1]:
            self.sizes[i] += self.sizes[i + 1]
            del self.starts[i + 1], self.sizes[i + 1]

    def used_by_nobody(self, base: int, size: int) -> bool:
        i = bisect.bisect_right(self.starts, base) - 1
        return i >= 0 and self.starts[i] <= base and base + size <= self.starts[i] + self.sizes[i]


@dataclass
class Slab:
    va: int
    handle: object
    free: FreeList
    live: int = 0


@dataclass
class Arena:
    base: int
    size: int
    backing: Backing
    vas: FreeList = field(init=False)
    slabs: dict[int, Slab] = field(default_factory=dict)  # slab va -> slab
    allocs: dict[int, tuple[int, object]] = field(default_factory=dict)  # ptr -> (size, slab va or handle)
    cache: dict[int, list[tuple[int, object]]] = field(default_factory=lambda: defaultdict(list))
    cached_bytes: int = 0
    vmm: Vmm = field(init=False)  # the program's own reservations and mappings (the driver's VMM API)

    def __post_init__(self) -> None:
        self.vas = FreeList(self.base, self.size)
        self.vmm = Vmm(self)

    def _round(self, n: int) -> int:
        g = self.backing.granularity
        return (n + g - 1) // g * g

    def _map_new(self, size: int) -> tuple[int, object]:
        va = self.vas.take(size, self.backing.granularity)
        try:
            try:
                handle = self.backing.create(size)
            except CudaError as e:
                if e.code != MEMORY_ALLOCATION or not self.cached_bytes:
                    raise
                self.trim()
                handle = self.backing.create(size)
            self.backing.map(va, size, handle)
        except BaseException:
            self.vas.give(va, size)
            raise
        return va, handle

    def alloc(self, size: int) -> int:
        if size <= 0:
            raise CudaError(INVALID_VALUE)
        n = (size + ALIGN - 1) // ALIGN * ALIGN
        if n <= SMALL_LIMIT:
            for slab in self.slabs.values():
                try:
                    p = slab.free.take(n, ALIGN)
                except CudaError:
                    continue
                slab.live += 1
                self.allocs[p] = (n, slab.va)
                return p
            g = self.backing.granularity
            va, handle = self._map_new(g)
            slab = Slab(va, handle, FreeList(va, g))
            self.slabs[va] = slab
            p = slab.free.take(n, ALIGN)
            slab.live = 1
            self.allocs[p] = (n, va)
            return p
        n = self._round(n)
        if self.cache.get(n):
            va, handle = self.cache[n].pop()
            self.cached_bytes -= n
        else:
            va, handle = self._map_new(n)
        self.allocs[va] = (n, handle)
        return va

    def reusable(self, size: int) -> bool:
        """Can alloc(size) do without new physical memory?  (Slab allocations: nearly always.)"""
        n = (size + ALIGN - 1) // ALIGN * ALIGN
        return n <= SMALL_LIMIT or bool(self.cache.get(self._round(n)))

    def free(self, ptr: int) -> None:
        try:
            n, owner = self.allocs.pop(ptr)
        except KeyError:
            raise CudaError(INVALID_VALUE, f"free of {ptr:#x}, not an allocation") from None
        slab = self.slabs.get(owner) if isinstance(owner, int) and n <= SMALL_LIMIT else None
        if slab is not None and ptr in range(slab.va, slab.va + self.backing.granularity):
            slab.free.give(ptr, n)
            slab.live -= 1
            if slab.live == 0 and len(self.slabs) > 1:
                del self.slabs[slab.va]
                self._unmap(slab.va, self.backing.granularity, slab.handle)
            return
        self.cache[n].append((ptr, owner))
        self.cached_bytes += n

    def _unmap(self, va: int, size: int, handle: object) -> None:
        self.backing.unmap(va, size)
        self.backing.release(handle)
        self.vas.give(va, size)

    def trim(self) -> None:
        """Give every cached mapping back to the driver."""
        for n, entries in self.cache.items():
            for va, handle in entries:
                self._unmap(va, n, handle)
        self.cache.clear()
        self.cached_bytes = 0

    # ---- checkpoint/restore: the layout, and the mappings whose contents matter ----
    def snapshot(self) -> dict:
        g = self.backing.granularity
        return {
            "granularity": g,
            "slabs": sorted(self.slabs),
            "allocs": sorted([p, n, n <= SMALL_LIMIT] for p, (n, _o) in self.allocs.items()),
            "vmm": self.vmm.snapshot(),
        }

    def mappings(self) -> list[tuple[int, int]]:
        """(va, size) of every mapping holding live data: slabs, large allocations and the shadows of VMM
        allocations."""
        g = self.backing.granularity
        out = [(va, g) for va in self.slabs]
        out += [(p, n) for p, (n, _o) in self.allocs.items() if n > SMALL_LIMIT]
        out += self.vmm.shadows()
        return sorted(out)

    def restore(self, snap: dict, adopt: dict[int, int] | None = None) -> None:
        """Rebuild a snapshot's layout in this (empty) arena: same addresses.  adopt: physical memory to map
        as it is rather than make (file descriptors by address: a migration's memory shared through CUDA IPC)."""
        g = self.backing.granularity
        if snap["granularity"] != g:
            raise CudaError(MEMORY_ALLOCATION, f"allocation granularity {g} differs from the image's")
        adopt = adopt or {}

        def make(va: int, n: int) -> object:
            return self.backing.adopt(adopt[va], n) if va in adopt else self.backing.create(n)

        for va in snap["slabs"]:
            self.vas.take_at(va, g)
            handle = make(va, g)
            self.backing.map(va, g, handle)
            self.slabs[va] = Slab(va, handle, FreeList(va, g))
        for p, n, small in snap["allocs"]:
            if small:
                slab_va = max(va for va in self.slabs if va <= p)
                slab = self.slabs[slab_va]
                slab.free.take_at(p, n)
                slab.live += 1
                self.allocs[p] = (n, slab_va)
            else:
                self.vas.take_at(p, n)
                handle = make(p, n)
                self.backing.map(p, n, handle)
                self.allocs[p] = (n, handle)
        if "vmm" in snap:
            self.vmm.restore(snap["vmm"], make)

    def find(self, ptr: int) -> tuple[int, int] | None:
        """(base, size) of the live allocation containing ptr."""
        bases = sorted(self.allocs)
        i = bisect.bisect_right(bases, ptr) - 1
        if i >= 0:
            b = bases[i]
            if ptr < b + self.allocs[b][0]:
                return b, self.allocs[b][0]
        return None

    def physical(self, ptr: int) -> tuple[int, int, object] | None:
        """(base, size, backing handle) of the physical memory under a live allocation's ptr."""
        found = self.find(ptr)
        if found is None:
            return None
        base, n = found
        owner = self.allocs[base][1]
        if n <= SMALL_LIMIT and owner in self.slabs:
            slab = self.slabs[owner]
            return slab.va, self.backing.granularity, slab.handle
        return base, n, owner

    def contains(self, ptr: int) -> bool:
        return self.base <= ptr < self.base + self.size
