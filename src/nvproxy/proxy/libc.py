"""The few libc calls the proxy needs that Python does not offer: mapping a
shared-memory fd at a fixed address (the application's), and flushing C stdio
(where the driver writes kernel printf output)."""

from __future__ import annotations

import os

from ..boot import reserve_range as reserve  # noqa: F401  (hostimage's; one implementation)
from ..ffi_prebuilt import load

CDEF = """
void *mmap(void *addr, size_t length, int prot, int flags, int fd, long offset);
int munmap(void *addr, size_t length);
int madvise(void *addr, size_t length, int advice);
void *memset(void *s, int c, size_t n);
int fflush(void *stream);
"""
ffi = load("libc", CDEF)
_c = ffi.dlopen(None)

PROT_READ, PROT_WRITE = 1, 2
MAP_SHARED, MAP_PRIVATE, MAP_FIXED, MAP_ANONYMOUS = 0x01, 0x02, 0x10, 0x20
MAP_FIXED_NOREPLACE = 0x100000
MAP_NORESERVE = 0x4000
MAP_FAILED = ffi.cast("void *", -1)


# application addresses a restoring proxy reserved at its start, before the driver and Python's libraries took
# address space of their own (boot.py): [addr, addr+size) -> reserved (adopt_holds)
_held: dict[int, int] = {}


def adopt_holds(ranges: list[tuple[int, int]]) -> None:
    """Ranges this process reserved for the application's shared memory before this module was loaded
    (boot.py): map_fixed maps it over them."""
    _held.update(ranges)


def map_fixed(fd: int, addr: int, size: int) -> bool:
    """Map fd at exactly addr; False if something is already mapped there (other than a hold of the range)."""
    if _held.get(addr) == size:
        try:
            map_over(fd, addr, size, 0)
        except OSError:
            return False
        del _held[addr]
        return True
    p = _c.mmap(ffi.cast("void *", addr), size, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_FIXED_NOREPLACE, fd, 0)
    if p == MAP_FAILED:
        return False
    if int(ffi.cast("uintptr_t", p)) != addr:  # an old kernel took it as a hint
        _c.munmap(p, size)
        return False
    return True


def map_over(fd: int, addr: int, size: int, offset: int) -> None:
    """Map fd's bytes [offset, offset+size) at addr, inside a range this process reserved."""
    p = _c.mmap(ffi.cast("void *", addr), size, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_FIXED, fd, offset)
    if p == MAP_FAILED:
        raise OSError(ffi.errno, os.strerror(ffi.errno))


MADV_POPULATE_READ, MADV_POPULATE_WRITE = 22, 23  # Linux 5.14


def populate(addr: int, size: int) -> None:
    """Make the pages of a shared mapping (and their page table entries) exist now, without the GIL held."""
    if _c.madvise(ffi.cast("void *", addr), size, MADV_POPULATE_WRITE) != 0:
        p = ffi.cast("volatile char *", addr)
        for off in range(0, size, 4096):  # older kernels: touch every page (keeping its contents)
            p[off] = p[off]


def populate_read(addr: int, size: int) -> None:
    """Page table entries for a read-only mapping of pages that exist (a file in the page cache)."""
    if _c.madvise(ffi.cast("void *", addr), size, MADV_POPULATE_READ) != 0:
        p = ffi.cast("volatile char *", addr)
        for off in range(0, size, 4096):
            p[off]


def map_anywhere(fd: int, size: int, writable: bool = True) -> int:
    prot = PROT_READ | (PROT_WRITE if writable else 0)
    p = _c.mmap(ffi.NULL, size, prot, MAP_SHARED, fd, 0)
    if p == MAP_FAILED:
        raise OSError(ffi.errno, os.strerror(ffi.errno))
    return int(ffi.cast("uintptr_t", p))


MADV_HUGEPAGE, HUGE = 14, 2 << 20


def map_private_huge(size: int) -> tuple[int, int, int]:
    """Private anonymous memory for the proxy's own use, 2 MiB aligned and advised to be made of huge pages
    (faster to make and to page-lock than 4 KiB pages).  Returns (address, mapping base, mapping size)."""
    n = size + HUGE
    p = _c.mmap(ffi.NULL, n, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0)
    if p == MAP_FAILED:
        raise OSError(ffi.errno, os.strerror(ffi.errno))
    base = int(ffi.cast("uintptr_t", p))
    addr = (base + HUGE - 1) // HUGE * HUGE
    _c.madvise(ffi.cast("void *", addr), size, MADV_HUGEPAGE)  # (advice: where it is refused, 4 KiB pages)
    return addr, base, n


def unmap(addr: int, size: int) -> None:
    _c.munmap(ffi.cast("void *", addr), size)


def reserve_anywhere(size: int) -> int:
    """size bytes of address space (no memory, no access) wherever the kernel puts them."""
    p = _c.mmap(ffi.NULL, size, 0, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0)
    if p == MAP_FAILED:
        raise OSError(ffi.errno, os.strerror(ffi.errno))
    return int(ffi.cast("uintptr_t", p))


def hole(addr: int, size: int) -> None:
    """[addr, addr+size), inside a range this process reserved, reserved again: no memory, no access."""
    p = _c.mmap(ffi.cast("void *", addr), size, 0, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE | MAP_FIXED, -1, 0)
    if p == MAP_FAILED:
        raise OSError(ffi.errno, os.strerror(ffi.errno))


def buffer(addr: int, size: int) -> memoryview:
    """A writable view of size bytes of this process's memory at addr."""
    return memoryview(ffi.buffer(ffi.cast("char *", addr), size))


def flush_stdio() -> None:
    _c.fflush(ffi.NULL)
