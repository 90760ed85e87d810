"""Checksums of image chunks: XXH64 from the proxy's native library
(native/proxy/checksum.c).  A call releases the GIL, so chunks are summed
on several threads at once."""

from __future__ import annotations

from .. import wire
from ..ffi_prebuilt import load
from ..proxy.fastpath import library_path

CDEF = wire.cdef_block(wire.header_text("checksum.h", "proxy"))
ffi = load("checksum", CDEF)
_lib = ffi.dlopen(str(library_path()))


def checksum(data: bytes | bytearray | memoryview) -> int:
    return int(_lib.nvp_xxh64(ffi.from_buffer(data), len(memoryview(data).cast("B")), 0))


def checksum_at(addr: int, n: int) -> int:
    """The checksum of n bytes of this process's memory at addr."""
    return int(_lib.nvp_xxh64(ffi.cast("void *", addr), n, 0))


READ_PIECE = 256 << 10  # an image file is read and summed this much at a time, while it is in a core's L2
