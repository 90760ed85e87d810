"""Binding of the native image-file loader (native/proxy/fileload.c): reader threads
read and sum chunks into pinned slots while the calling thread copies verified ones to
the device.  The call releases the GIL; Python's slot makers run meanwhile.  Check sums
chunks before the load can begin (no slots, no driver), so that the load only reads them."""

from __future__ import annotations

import os
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from .. import wire
from ..ffi_prebuilt import load
from ..proxy.fastpath import library_path
from .image import open_trusted

CDEF = wire.cdef_block(wire.header_text("fileload.h", "proxy"))
ffi = load("fileload", CDEF)
_lib = ffi.dlopen(str(library_path()))
C = wire.defines(CDEF, "NVPL_")
OK, SHORT, MISMATCH, CUDA, NO_SLOTS, THREADS, CANCELLED = (
    C[f"NVPL_{k}"] for k in ("OK", "SHORT", "MISMATCH", "CUDA", "NO_SLOTS", "THREADS", "CANCELLED"))
SLOT_MAKING, SLOT_READY, SLOT_FAILED = C["NVPL_SLOT_MAKING"], C["NVPL_SLOT_READY"], C["NVPL_SLOT_FAILED"]
DRIVER = ("memcpy_async", "event_record", "event_query", "event_sync")  # (of the backend's fast_driver())


@dataclass
class Outcome:
    why: int
    err: int
    bad_chunk: int  # the chunk why is about, or -1
    read_s: float  # summed over the readers
    slot_wait_s: float
    flight_s: float  # summed over chunks: from a copy's issue until its slot was free again


def slot_states(n: int) -> object:
    """A state per slot (SLOT_*), written by the slot makers and read by C."""
    return ffi.new("int32_t[]", n)


class Gate:
    """Holds a load's copies back until open() (its readers fill the slots meanwhile); cancel() stops it."""

    def __init__(self) -> None:
        self.cell = ffi.new("int32_t *")

    def open(self) -> None:
        self.cell[0] = 1

    def cancel(self) -> None:
        self.cell[0] = -1


def _identity(fd: int) -> tuple[int, ...]:
    st = os.fstat(fd)
    return st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns


class Check:
    """An early check of an image file's chunks (nvpl_check_* in fileload.h): threads of their own sum them,
    in the order given, from now until stop().  It never fails; a chunk it could not read or found damaged is
    only left out, for the load to read again and name."""

    def __init__(self, path: str, chunks: Sequence[tuple[int, int, int]], threads: int, piece: int,
                 nice: int = 5) -> None:
        """chunks: (file offset, size, checksum)."""
        self.fd = open_trusted(path)  # (the same rule as the restore's own open: whose file this is, is checked)
        self.identity = _identity(self.fd)
        self.chunks = list(chunks)
        self._table = ffi.new("struct nvpl_chunk[]", max(len(chunks), 1))
        for i, (off, n, crc) in enumerate(chunks):
            self._table[i].file_off, self._table[i].size, self._table[i].crc = off, n, crc
        self._good = ffi.new("uint8_t[]", max(len(chunks), 1))
        c = self._c = ffi.new("struct nvpl_check *")
        c.fd, c.chunks, c.nchunks, c.threads, c.piece, c.nice, c.good = (
            self.fd, self._table, len(chunks), threads, piece, nice, self._good)
        self.good: frozenset[tuple[int, int, int]] | None = None
        self.read_s = 0.0
        if _lib.nvpl_check_start(c) != 0:
            self.stop()  # (no thread: nothing checked)

    def stop(self) -> frozenset[tuple[int, int, int]]:
        """Stops the threads (at their next piece); the chunks found right.  Again: the same answer."""
        if self.good is None:
            _lib.nvpl_check_stop(self._c)
            self.read_s = float(self._c.read_s)
            self.good = frozenset(ch for i, ch in enumerate(self.chunks) if self._good[i])
            os.close(self.fd)
        return self.good

    def of(self, fd: int) -> bool:
        """fd is the file checked (the same inode, size and time)."""
        return _identity(fd) == self.identity

    def index(self) -> dict[tuple[int, int, int], int]:
        """Each chunk's place in good[]: by (file offset, size, checksum)."""
        return {ch: i for i, ch in enumerate(self.chunks)}

    @property
    def bytes_checked(self) -> int:
        return int(self._c.bytes_checked)

    @property
    def finished(self) -> bool:
        """Every chunk was tried (stop() changes nothing then)."""
        return self._c.started > 0 and self._c.finished == self._c.started


def run(fd: int, chunks: Sequence[tuple[int, int, int, int]], slots: int, slot_size: int, states: object,
        events: Sequence[int], streams: Sequence[int], driver: dict[str, int], readers: int, piece: int,
        progress: Callable[[int], None] | None = None, gate: Gate | None = None,
        check: Check | None = None) -> Outcome:
    """chunks: (file offset, device address, size, checksum); events: one per slot, and streams, as the
    driver's handle values; driver: its entry points' addresses.  progress(bytes verified) is called about
    four times a second from another thread while this runs, and once at the end.  gate: see Gate.
    check: an early check of this very file (Check.of), running or stopped: the chunks it finds right before a
    reader takes them are read, not summed again; it is told to stop once the gate opens (stop() it after)."""
    table = ffi.new("struct nvpl_chunk[]", len(chunks))
    where = check.index() if check is not None else {}
    check_of = ffi.new("int32_t[]", len(chunks))
    for i, (off, va, n, crc) in enumerate(chunks):
        table[i].file_off, table[i].va, table[i].size, table[i].crc = off, va, n, crc
        check_of[i] = where.get((off, n, crc), -1)
    ev = ffi.new("void *[]", [ffi.cast("void *", e) for e in events])
    st = ffi.new("void *[]", [ffi.cast("void *", s) for s in streams])
    a = ffi.new("struct nvpl_load *")
    a.fd, a.chunks, a.nchunks = fd, table, len(chunks)
    a.slots, a.slot_size, a.nslots, a.slot_state = slots, slot_size, len(events), states
    a.events, a.streams, a.nstreams, a.readers, a.piece = ev, st, len(streams), readers, piece
    a.gate = gate.cell if gate is not None else ffi.NULL
    a.check, a.check_of = (check._c, check_of) if check is not None else (ffi.NULL, ffi.NULL)
    for name in DRIVER:
        setattr(a, name, ffi.cast(ffi.typeof(getattr(a, name)), driver[name]))
    stop = threading.Event()
    watcher = None
    if progress is not None:
        def watch() -> None:
            while not stop.wait(0.25):
                progress(int(a.bytes_verified))

        watcher = threading.Thread(target=watch, name="nvproxy-progress", daemon=True)
        watcher.start()
    try:
        _lib.nvpl_run(a)
    finally:
        stop.set()
        if watcher is not None:
            watcher.join()
    if progress is not None:
        progress(int(a.bytes_verified))
    return Outcome(int(a.why), int(a.err), int(a.bad_chunk), float(a.read_s), float(a.slot_wait_s),
                   float(a.flight_s))
