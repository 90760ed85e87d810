"""The checkpoint image: one file, written atomically, private to the user.

    0       8 bytes   magic b"NVPXIMG1"
    8       u64       offset of the header
    16      u64       length of the header
    4096    ...       regions, each at a 4 KiB-aligned offset, in chunks of CHUNK bytes
    end     header    JSON: format version, checksum algorithm, backend, devices (model, memory,
                      arena base, size and layout), modules, kernels, streams, events, limits, host
                      ranges, and for every region its kind, place, size, file offset and one
                      checksum per chunk (xxh3-64 where the xxhash package is installed: about ten
                      times faster than zlib's CRC-32, which is the fallback)

The file is written under a temporary name in the same directory, fsynced and
renamed, so an image is either complete or absent; it is created 0600.
"""

from __future__ import annotations

import json
import os
import struct
import zlib
from pathlib import Path
from typing import Any

MAGIC = b"NVPXIMG1"
VERSION = 1
ALIGN = 4096
CHUNK = 64 << 20


try:
    import xxhash

    ALGORITHM = "xxh3_64"
    checksum = xxhash.xxh3_64_intdigest
except ImportError:
    ALGORITHM = "crc32"
    checksum = zlib.crc32


class ImageError(Exception):
    pass


class ImageWriter:
    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)
        self.tmp = self.path.with_name(f".{self.path.name}.{os.getpid()}.tmp")
        self.fd = os.open(self.tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        self.end = ALIGN

    def reserve(self, size: int) -> int:
        """File offset for a region of size bytes."""
        off = self.end
        self.end = (off + size + ALIGN - 1) // ALIGN * ALIGN
        return off

    def finish(self, header: dict[str, Any]) -> None:
        header = dict(header, format=VERSION, checksum=ALGORITHM)
        data = json.dumps(header, separators=(",", ":")).encode()
        os.pwrite(self.fd, data, self.end)
        os.pwrite(self.fd, MAGIC + struct.pack("<QQ", self.end, len(data)), 0)
        os.fsync(self.fd)
        os.close(self.fd)
        os.rename(self.tmp, self.path)
        dfd = os.open(self.path.parent, os.O_RDONLY)
        try:
            os.fsync(dfd)
        finally:
            os.close(dfd)

    def abort(self) -> None:
        os.close(self.fd)
        self.tmp.unlink(missing_ok=True)


def read_header(path: str | Path) -> tuple[int, dict[str, Any]]:
    """(open fd, header); the caller closes the fd."""
    fd = os.open(path, os.O_RDONLY)
    try:
        head = os.pread(fd, 24, 0)
        if len(head) != 24 or head[:8] != MAGIC:
            raise ImageError(f"{path} is not an nvproxy checkpoint image")
        off, n = struct.unpack("<QQ", head[8:])
        header = json.loads(os.pread(fd, n, off))
        if header.get("format") != VERSION:
            raise ImageError(f"{path}: image format {header.get('format')}, this nvproxy reads {VERSION}")
        if header.get("checksum", ALGORITHM) != ALGORITHM:
            raise ImageError(f"{path} was checksummed with {header['checksum']}; this nvproxy uses {ALGORITHM} "
                             "(install or remove the xxhash package to match)")
        return fd, header
    except BaseException:
        os.close(fd)
        raise
