"""The device arena's sub-allocator, on a fake physical backing."""

from __future__ import annotations

import pytest

from nvproxy.errors import CudaError
from nvproxy.proxy.arena import ALIGN, Arena, FreeList

G = 2 << 20


class FakeBacking:
    granularity = G

    def __init__(self, capacity: int) -> None:
        self.capacity, self.used, self.mapped = capacity, 0, {}

    def create(self, size: int) -> int:
        if self.used + size > self.capacity:
            raise CudaError(2)
        self.used += size
        return size

    def map(self, va: int, size: int, handle: object) -> None:
        self.mapped[va] = size

    def unmap(self, va: int, size: int) -> None:
        assert self.mapped.pop(va) == size

    def release(self, handle: object) -> None:
        self.used -= handle  # type: ignore[operator]


def test_small_allocations_share_slabs_and_are_aligned() -> None:
    a = Arena(0x200000000000, 1 << 40, FakeBacking(1 << 30))
    ptrs = [a.alloc(100) for _ in range(100)]
    assert all(p % ALIGN == 0 for p in ptrs) and len(set(ptrs)) == 100
    assert len(a.slabs) == 1
    for p in ptrs:
        a.free(p)
    assert a.alloc(100) == ptrs[0]  # first fit reuses the lowest address


def test_large_allocations_are_cached_and_reused() -> None:
    b = FakeBacking(1 << 30)
    a = Arena(0x200000000000, 1 << 40, b)
    p = a.alloc(16 << 20)
    a.free(p)
    assert a.cached_bytes == 16 << 20
    assert a.alloc(16 << 20) == p and a.cached_bytes == 0


def test_out_of_memory_trims_the_cache_first() -> None:
    b = FakeBacking(64 << 20)
    a = Arena(0x200000000000, 1 << 40, b)
    p = a.alloc(48 << 20)
    a.free(p)
    q = a.alloc(32 << 20)  # needs the cached 48 MiB back from the "driver"
    assert q and a.cached_bytes == 0
    with pytest.raises(CudaError) as e:
        a.alloc(48 << 20)
    assert e.value.code == 2


def test_invalid_free_and_find() -> None:
    a = Arena(0x200000000000, 1 << 40, FakeBacking(1 << 30))
    p = a.alloc(4096)
    assert a.find(p + 100) == (p, 4096)
    with pytest.raises(CudaError):
        a.free(p + 1)
    a.free(p)
    with pytest.raises(CudaError):
        a.free(p)


def test_free_list_coalesces() -> None:
    f = FreeList(0, 100)
    x, y, z = f.take(10, 1), f.take(10, 1), f.take(10, 1)
    f.give(y, 10)
    f.give(x, 10)
    f.give(z, 10)
    assert f.starts == [0] and f.sizes == [100]


def test_snapshot_restores_the_same_layout() -> None:
    a = Arena(0x200000000000, 1 << 40, FakeBacking(1 << 30))
    ptrs = [a.alloc(n) for n in (100, 5000, 3 << 20, 700, 64 << 20)]
    a.free(ptrs[1])
    b = Arena(0x200000000000, 1 << 40, FakeBacking(1 << 30))
    b.restore(a.snapshot())
    assert b.snapshot() == a.snapshot() and b.mappings() == a.mappings()
    # the restored arena goes on allocating around what it holds
    q = b.alloc(100)
    assert q not in (ptrs[0], ptrs[3]) and b.find(ptrs[2]) == (ptrs[2], 4 << 20)  # granule-rounded
