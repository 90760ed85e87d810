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
renamed (and the directory fsynced), so an image is either complete or absent;
it is created 0600, and a failed write leaves no temporary file behind.

An image says what the restoring proxy maps, loads and runs, so a restore reads
only an image the restoring user may trust, by ssh's rule for keys: a regular
file owned by that user and writable by no one else.
"""

from __future__ import annotations

import json
import os
import stat
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


class WriteError(OSError):
    """Writing an image failed: said of the user's path (never of the temporary file)."""

    def __str__(self) -> str:
        return f"cannot write {self.filename}: {self.strerror}"


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



def temp_prefix(name: str, writer_pid: int) -> str:
    """How the name of a process's temporary file for the image file name begins: a writer killed mid-write leaves
    it behind, and whoever asked for the image removes it (cli.py)."""
    return f".{name}.{writer_pid}."


def atomic_file(path: str | Path, write: Callable[[int], None]) -> None:
    """Create path, 0600, with write(fd) under a temporary name in its directory, fsynced and renamed, then the
    directory fsynced: the file is either complete or absent (an older one stays until then).  Whatever fails,
    the temporary file is removed; a failing system call raises WriteError naming path."""
    import tempfile
    from pathlib import Path  # (here: a restoring proxy reads its header before pathlib is worth importing)

    path = Path(path)
    tmp: str | None = None
    try:
        fd, tmp = tempfile.mkstemp(prefix=temp_prefix(path.name, os.getpid()), suffix=".tmp",
                                   dir=path.parent)  # (0600, O_EXCL)
        try:
            write(fd)
            os.fsync(fd)
        finally:
            os.close(fd)
        os.rename(tmp, path)
        tmp = None
        dfd = os.open(path.parent, os.O_RDONLY | os.O_DIRECTORY)
        try:
            os.fsync(dfd)
        finally:
            os.close(dfd)
    except OSError as e:
        raise WriteError(e.errno, e.strerror or str(e), str(path)) from None
    finally:
        if tmp is not None:
            try:
                os.unlink(tmp)
            except OSError:
                pass


def open_trusted(path: str | Path) -> int:
    """path opened for reading (an fd the caller closes), if it is an image this user may trust: a regular file
    of its own that neither its group nor others may write (ssh's rule for keys); else ImageError, one line
    naming path and the rule.  Checked on the open file: what is checked is what is read."""
    fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC | os.O_NONBLOCK)  # (a FIFO there must not hang the restore)
    try:
        st = os.fstat(fd)
        rule = "a restore reads only a regular file of the restoring user's own that no one else may write"
        if not stat.S_ISREG(st.st_mode):
            raise ImageError(f"{path} is not a regular file; {rule}")
        if st.st_uid != os.getuid():
            raise ImageError(f"{path} belongs to uid {st.st_uid}, not to this user (uid {os.getuid()}); {rule}")
        if st.st_mode & (stat.S_IWGRP | stat.S_IWOTH):
            who = " and ".join(w for w, bit in (("its group", stat.S_IWGRP), ("others", stat.S_IWOTH))
                               if st.st_mode & bit)
            raise ImageError(f"{path} is writable by {who} (mode {stat.S_IMODE(st.st_mode):04o}); {rule}")
        os.set_blocking(fd, True)
    except BaseException:
        os.close(fd)
        raise
    return fd


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
    fd = open_trusted(path)
    try:
        return fd, parse_header(lambda off, n: os.pread(fd, n, off), str(path))
    except BaseException:
        os.close(fd)
        raise
