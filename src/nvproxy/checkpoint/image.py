"""The checkpoint image: one file, written atomically, private to the user.

    0       8 bytes   magic b"NVPXIMG1"
    8       u64       offset of the header
    16      u64       length of the header
    4096    ...       regions, each at a 4 KiB-aligned offset, in chunks of CHUNK bytes
    end     header    JSON: format version, checksum algorithm, backend, devices (model, memory,
                      arena base, size and layout), modules, kernels, streams, events, limits, host
                      ranges, and for every region its kind, place, size, file offset and one
                      XXH64 checksum per chunk

The same bytes are the image whether they lie in a file or in the proxy's host
image buffer (hostimage.py), which a migration hands to the new proxy as is.

The file is written under a temporary name in the same directory, fsynced and
renamed, so an image is either complete or absent; it is created 0600.
"""

from __future__ import annotations

import json
import os
import struct
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from pathlib import Path

MAGIC = b"NVPXIMG1"
VERSION = 2
ALIGN = 4096
CHUNK = 64 << 20
ALGORITHM = "xxh64"  # (of every chunk: checksum.py)


def region_chunks(size: int) -> list[tuple[int, int]]:
    """A region's chunks: (offset in the region, size), each summed on its own."""
    return [(off, min(CHUNK, size - off)) for off in range(0, size, CHUNK)]


PREFIX = struct.Struct("<8sQQ")  # magic, header offset, header length


class ImageError(Exception):
    pass


class Layout:
    """Where each region goes: 4 KiB-aligned offsets after the prefix; the header follows the last."""

    def __init__(self) -> None:
        self.end = ALIGN

    def reserve(self, size: int) -> int:
        off = self.end
        self.end = (off + size + ALIGN - 1) // ALIGN * ALIGN
        return off


def encode_header(header: dict[str, Any], at: int) -> tuple[bytes, bytes]:
    """(prefix for offset 0, header bytes for offset at)."""
    data = json.dumps(dict(header, format=VERSION, checksum=ALGORITHM), separators=(",", ":")).encode()
    return PREFIX.pack(MAGIC, at, len(data)), data


def atomic_file(path: str | Path, write: Callable[[int], None]) -> None:
    """Create path, 0600, with write(fd) under a temporary name, fsynced and renamed:
    the file is either complete or absent (an older one stays until then)."""
    from pathlib import Path  # (here: a restoring proxy reads its header before pathlib is worth importing)

    path = Path(path)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    try:
        write(fd)
        os.fsync(fd)
    except BaseException:
        os.close(fd)
        tmp.unlink(missing_ok=True)
        raise
    os.close(fd)
    os.rename(tmp, path)
    dfd = os.open(path.parent, os.O_RDONLY)
    try:
        os.fsync(dfd)
    finally:
        os.close(dfd)


def parse_header(read: Callable[[int, int], bytes], what: str) -> dict[str, Any]:
    """The header of an image, given read(offset, length) of its bytes."""
    head = read(0, PREFIX.size)
    if len(head) != PREFIX.size or head[:8] != MAGIC:
        raise ImageError(f"{what} is not an nvproxy checkpoint image")
    _m, off, n = PREFIX.unpack(head)
    try:
        header = json.loads(read(off, n))
    except ValueError:
        raise ImageError(f"{what}: the image header is damaged") from None
    if header.get("format") != VERSION:
        raise ImageError(f"{what}: image format {header.get('format')}, this nvproxy reads {VERSION}")
    if header.get("checksum") != ALGORITHM:
        raise ImageError(f"{what} was checksummed with {header.get('checksum')}; this nvproxy uses {ALGORITHM}")
    return header


def read_header(path: str | Path) -> tuple[int, dict[str, Any]]:
    """(open fd, header); the caller closes the fd."""
    fd = os.open(path, os.O_RDONLY)
    try:
        return fd, parse_header(lambda off, n: os.pread(fd, n, off), str(path))
    except BaseException:
        os.close(fd)
        raise
