"""The driver's virtual memory management (cuMemAddressReserve, cuMemCreate, cuMemMap...) inside a device's arena.

Reservations are address ranges taken from the arena, so a restore finds them at the same addresses.  Each
physical allocation the program creates is also mapped once at an address of the proxy's own in the arena (its
shadow): that mapping is what a checkpoint saves and a restore fills, once however often the program maps it, and
it keeps the contents of an allocation the program has unmapped but not released.  The program's mappings are
records (address, size, allocation id, access) replayed on the restored physical memory.
"""

from __future__ import annotations

import bisect
import mmap
import sys
from dataclasses import dataclass, field
from typing import Any

from ..errors import INVALID_VALUE, NOT_SUPPORTED, CudaError

ACCESS_NONE = 0  # CU_MEM_ACCESS_FLAGS_PROT_NONE


@dataclass
class Allocation:
    size: int
    shadow: int  # the proxy's own mapping of it
    handle: object  # the backend's
    props: bytes  # the CUmemAllocationProp it was created with
    refs: int = 1  # cuMemCreate and cuMemRetainAllocationHandle, less cuMemRelease
    maps: int = 0  # the program's mappings of it


@dataclass
class Mapping:
    size: int
    alloc: int  # allocation id
    access: dict[int, int] = field(default_factory=dict)  # device -> CUmemAccess_flags set by cuMemSetAccess


@dataclass
class Vmm:
    arena: Any  # arena.Arena: the address space and the physical memory
    reservations: dict[int, tuple[int, int]] = field(default_factory=dict)  # address -> (size, alignment)
    allocs: dict[int, Allocation] = field(default_factory=dict)  # id -> physical allocation
    maps: dict[int, Mapping] = field(default_factory=dict)  # address -> the program's mapping
    starts: list[int] = field(default_factory=list)  # sorted addresses of maps
    dropped: list[int] = field(default_factory=list)  # ids of allocations gone, for the reply to tell the shim

    @property
    def granularity(self) -> int:
        return int(self.arena.backing.granularity)

    def _whole(self, n: int) -> None:
        if n <= 0 or n % self.granularity:
            raise CudaError(INVALID_VALUE, f"size {n} is not a multiple of the granularity {self.granularity}")

    # ---- address ranges ----
    def _span(self, size: int) -> int:
        """The arena's address space a reservation of size takes: whole granules (its mappings' unit)."""
        g = self.granularity
        return (size + g - 1) // g * g

    def reserve(self, size: int, align: int, want: int) -> int:
        if size <= 0 or size % mmap.PAGESIZE or want % mmap.PAGESIZE or align & (align - 1):
            raise CudaError(INVALID_VALUE, f"reservation of {size} bytes aligned to {align} at {want:#x}")
        align = max(align, self.granularity)
        vas, n = self.arena.vas, self._span(size)
        if want and want % align == 0 and vas.used_by_nobody(want, n):
            vas.take_at(want, n)
            va = want
        else:  # (the address is a hint, as the driver's)
            va = vas.take(n, align)
        self._reserved(va, n)
        self.reservations[va] = (size, align)
        return va

    def _reserved(self, va: int, n: int) -> None:
        hook = getattr(self.arena.backing, "reserved", None)  # (the sim lays a reservation's mappings side by side)
        if hook is not None:
            hook(va, n)

    def reservation_of(self, va: int, size: int) -> bool:
        return any(r <= va and va + size <= r + n for r, (n, _a) in self.reservations.items())

    def free(self, va: int, size: int) -> None:
        if self.reservations.get(va, (None,))[0] != size:
            raise CudaError(INVALID_VALUE, f"{va:#x}+{size} is not a reserved range")
        inside = [m for m in self.starts if va <= m < va + size]
        for m in inside:  # (mappings left in it go with it)
            self._unmap_one(m)
        del self.reservations[va]
        hook = getattr(self.arena.backing, "unreserved", None)
        if hook is not None:
            hook(va)
        self.arena.vas.give(va, self._span(size))

    # ---- physical memory ----
    def create(self, aid: int, size: int, props: bytes) -> None:
        self._whole(size)
        if aid in self.allocs:
            raise CudaError(INVALID_VALUE, f"allocation id {aid} is taken")
        shadow, handle = self.arena._map_new(size)  # noqa: SLF001 (the arena's way to new mapped memory)
        self.allocs[aid] = Allocation(size, shadow, handle, props)

    def release(self, aid: int) -> None:
        a = self.allocs.get(aid)
        if a is None or a.refs == 0:
            raise CudaError(INVALID_VALUE, f"allocation handle {aid} is not live")
        a.refs -= 1
        self._drop_if_unused(aid)

    def _drop_if_unused(self, aid: int) -> None:
        a = self.allocs[aid]
        if a.refs == 0 and a.maps == 0:
            del self.allocs[aid]
            self.dropped.append(aid)
            self.arena._unmap(a.shadow, a.size, a.handle)  # noqa: SLF001

    # ---- the program's mappings ----
    def map(self, va: int, size: int, offset: int, aid: int) -> None:
        a = self.allocs.get(aid)
        if a is None or a.refs == 0:
            raise CudaError(INVALID_VALUE, f"allocation handle {aid} is not live")
        if offset or size != a.size:
            print("nvproxy: cuMemMap of part of an allocation is not supported by nvproxy; "
                  "returning CUDA_ERROR_NOT_SUPPORTED", file=sys.stderr)
            raise CudaError(NOT_SUPPORTED)
        if va % self.granularity or not self.reservation_of(va, size) or self._overlaps(va, size):
            raise CudaError(INVALID_VALUE, f"{va:#x}+{size} is not a free part of a reserved range")
        self.arena.backing.map(va, size, a.handle)
        self._add(va, Mapping(size, aid))

    def _add(self, va: int, m: Mapping) -> None:
        bisect.insort(self.starts, va)
        self.maps[va] = m
        self.allocs[m.alloc].maps += 1

    def _overlaps(self, va: int, size: int) -> bool:
        i = bisect.bisect_left(self.starts, va + size) - 1
        return i >= 0 and self.starts[i] + self.maps[self.starts[i]].size > va

    def covering(self, va: int, size: int) -> list[int]:
        """The mappings that make up exactly [va, va+size), in order (INVALID_VALUE if they do not)."""
        out, at = [], va
        i = bisect.bisect_left(self.starts, va)
        while at < va + size:
            if i >= len(self.starts) or self.starts[i] != at:
                raise CudaError(INVALID_VALUE, f"{va:#x}+{size} is not wholly mapped")
            out.append(at)
            at += self.maps[at].size
            i += 1
        if at != va + size or size <= 0:
            raise CudaError(INVALID_VALUE, f"{va:#x}+{size} does not end where a mapping ends")
        return out

    def unmap(self, va: int, size: int) -> None:
        for m in self.covering(va, size):
            self._unmap_one(m)

    def _unmap_one(self, va: int) -> None:
        m = self.maps.pop(va)
        self.starts.remove(va)
        self.arena.backing.unmap(va, m.size)
        self.allocs[m.alloc].maps -= 1
        self._drop_if_unused(m.alloc)

    def set_access(self, va: int, size: int, access: list[tuple[int, int]]) -> None:
        """access: (device, flags) each."""
        ms = self.covering(va, size)
        for dev, flags in access:
            if flags != ACCESS_NONE:
                self.arena.backing.grant(dev, [(va, size)])
            for m in ms:
                self.maps[m].access[dev] = flags

    def mapping_at(self, addr: int) -> int | None:
        """The address of the program's mapping holding addr."""
        i = bisect.bisect_right(self.starts, addr) - 1
        if i >= 0 and addr < self.starts[i] + self.maps[self.starts[i]].size:
            return self.starts[i]
        return None

    def get_access(self, addr: int, dev: int) -> int:
        m = self.mapping_at(addr)
        if m is None:
            raise CudaError(INVALID_VALUE, f"{addr:#x} is not mapped")
        return self.maps[m].access.get(dev, ACCESS_NONE)

    def retain(self, addr: int) -> int:
        m = self.mapping_at(addr)
        if m is None:
            raise CudaError(INVALID_VALUE, f"{addr:#x} is not mapped")
        aid = self.maps[m].alloc
        self.allocs[aid].refs += 1
        return aid

    def alias(self, addr: int) -> int:
        """The shadow address of what the program's address addr reaches (addr itself outside its mappings)."""
        m = self.mapping_at(addr)
        return addr if m is None else self.allocs[self.maps[m].alloc].shadow + addr - m

    def run(self, addr: int) -> list[int]:
        """Where a write from the program's address addr onwards may land: the shadow address of addr and those
        of the mappings that follow its mapping without a gap (a segment grown chunk by chunk is one buffer to the
        program); [addr] outside the program's mappings."""
        m = self.mapping_at(addr)
        if m is None:
            return [addr]
        out = [self.alias(addr)]
        at = m + self.maps[m].size
        while at in self.maps:
            out.append(self.allocs[self.maps[at].alloc].shadow)
            at += self.maps[at].size
        return out

    # ---- checkpoint/restore ----
    def shadows(self) -> list[tuple[int, int]]:
        return [(a.shadow, a.size) for a in self.allocs.values()]

    def snapshot(self) -> dict[str, Any]:
        return {
            "reservations": sorted([va, n, al] for va, (n, al) in self.reservations.items()),
            "allocs": sorted([aid, a.size, a.shadow, a.props.hex(), a.refs] for aid, a in self.allocs.items()),
            "maps": [[va, m.size, m.alloc, sorted(m.access.items())] for va, m in sorted(self.maps.items())],
        }

    def restore(self, snap: dict[str, Any], make: Any) -> None:
        """make(address, size): new (or adopted) physical memory for the shadow at address."""
        vas, backing = self.arena.vas, self.arena.backing
        for va, n, al in snap["reservations"]:
            vas.take_at(va, self._span(n))
            self._reserved(va, self._span(n))
            self.reservations[va] = (n, al)
        for aid, n, shadow, props, refs in snap["allocs"]:
            vas.take_at(shadow, n)
            handle = make(shadow, n)
            backing.map(shadow, n, handle)
            self.allocs[aid] = Allocation(n, shadow, handle, bytes.fromhex(props), refs)
        for va, n, aid, access in snap["maps"]:
            for dev, flags in access:
                if flags != ACCESS_NONE:
                    backing.grant(dev, [])  # (before the mapping: the backing maps with its grants)
            backing.map(va, n, self.allocs[aid].handle)
            self._add(va, Mapping(n, aid, {int(d): f for d, f in access}))


def snapshot_shadows(snap: dict[str, Any]) -> list[tuple[int, int]]:
    """The shadows an arena snapshot's VMM part has: (address, size) each."""
    return [(shadow, n) for _aid, n, shadow, _p, _r in snap.get("vmm", {}).get("allocs", [])]
