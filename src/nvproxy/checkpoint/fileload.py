"""Binding of the native image-file loader (native/proxy/fileload.c): reader threads
read and sum chunks into pinned slots while the calling thread copies verified ones to
the device.  The call releases the GIL; Python's slot makers run meanwhile."""

from __future__ import annotations

import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import cffi

from .. import wire
from ..proxy.fastpath import library_path

_CDEF = wire.cdef_block(wire.header_text("fileload.h", "proxy"))
ffi = cffi.FFI()
ffi.cdef(_CDEF)
_lib = ffi.dlopen(str(library_path()))
C = wire.defines(_CDEF, "NVPL_")
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


def run(fd: int, chunks: Sequence[tuple[int, int, int, int]], slots: int, slot_size: int, states: object,
        events: Sequence[int], streams: Sequence[int], driver: dict[str, int], readers: int, piece: int,
        progress: Callable[[int], None] | None = None, gate: Gate | None = None) -> Outcome:
    """chunks: (file offset, device address, size, checksum); events: one per slot, and streams, as the
    driver's handle values; driver: its entry points' addresses.  progress(bytes verified) is called about
    four times a second from another thread while this runs, and once at the end.  gate: see Gate."""
    table = ffi.new("struct nvpl_chunk[]", len(chunks))
    for i, (off, va, n, crc) in enumerate(chunks):
        table[i].file_off, table[i].va, table[i].size, table[i].crc = off, va, n, crc
    ev = ffi.new("void *[]", [ffi.cast("void *", e) for e in events])
    st = ffi.new("void *[]", [ffi.cast("void *", s) for s in streams])
    a = ffi.new("struct nvpl_load *")
    a.fd, a.chunks, a.nchunks = fd, table, len(chunks)
    a.slots, a.slot_size, a.nslots, a.slot_state = slots, slot_size, len(events), states
    a.events, a.streams, a.nstreams, a.readers, a.piece = ev, st, len(streams), readers, piece
    a.gate = gate.cell if gate is not None else ffi.NULL
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
