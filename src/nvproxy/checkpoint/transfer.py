"""Moving image chunks (image.CHUNK bytes) between the device and host memory.

- device_to_host / host_to_device: straight between device memory and the
  pinned host image buffer, on two streams, checksums on a pool of threads
  (the C checksum releases the GIL) overlapping the copies.
- MappedFile + host_to_device: an image file mapped read-only and registered
  as pinned memory piece by piece, ahead of the copies (no copy on the host:
  the file's page-cache or tmpfs pages go to the device as they are).
- FileLoader: from an image file, through pinned bounce slots, reading and
  verifying on native threads while earlier pieces go to the device.
Every chunk's checksum is verified before the chunk reaches the device, except through
the FileLoader, where a chunk's sum is known once its last piece is read (a mismatch then
fails the restore, which never lets the application go on)."""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Callable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any

from ..proxy import libc
from . import fileload
from .checksum import READ_PIECE, checksum_at
from .image import ImageError, region_chunks

SLOTS = 16
STREAMS = 2
_DISABLE_TIMING = 2
_NON_BLOCKING = 1


class Mover:
    """Streams, a ring of events and threads of its own, on one device."""

    def __init__(self, backend: Any, dev: int) -> None:
        self.backend, self.dev = backend, dev
        backend.activate(dev)
        self.streams = [backend.stream_create(dev, _NON_BLOCKING, 0) for _ in range(STREAMS)]
        self.events = [backend.event_create(dev, _DISABLE_TIMING) for _ in range(2 * SLOTS)]
        self.pool = ThreadPoolExecutor(min(16, os.cpu_count() or 4), thread_name_prefix="nvproxy-io")

    def sync(self) -> None:
        for s in self.streams:
            self.backend.stream_sync(s)

    def close(self) -> None:
        self.pool.shutdown()
        self.sync()
        for e in self.events:
            self.backend.event_destroy(e)
        for s in self.streams:
            self.backend.stream_destroy(s)


def _copy(m: Mover, himg: Any, off: int, n: int, va: int, to_host: bool, stream: Any) -> None:
    for addr, k in himg.pieces(off, n):
        dev_at = va + (addr - himg.base - off)
        if to_host:
            m.backend.memcpy(addr, dev_at, k, stream)
        else:
            m.backend.memcpy(dev_at, addr, k, stream)


def device_to_host(m: Mover, himg: Any, va: int, size: int, off: int) -> list[int]:
    """Copy [va, va+size) of device memory to the host image at off; returns the chunks' checksums."""
    be = m.backend
    ring = len(m.events)
    busy: list[Future | None] = [None] * ring
    futures: list[Future] = []

    def summed(i: int, at: int, n: int) -> int:
        be.activate(m.dev)
        with be.capture_relaxed():  # (a global-mode capture on another thread forbids the wait otherwise)
            be.event_sync(m.events[i])
        return checksum_at(himg.base + at, n)

    for k, (c, n) in enumerate(region_chunks(size)):
        i = k % ring
        if busy[i] is not None:
            busy[i].result()
        s = m.streams[k % len(m.streams)]
        _copy(m, himg, off + c, n, va + c, True, s)
        be.event_record(m.events[i], s, 0)
        busy[i] = m.pool.submit(summed, i, off + c, n)
        futures.append(busy[i])
    return [f.result() for f in futures]


def host_to_device(m: Mover, himg: Any, va: int, size: int, off: int, crcs: list[int], what: str) -> None:
    """Load a region of the host image into device memory, each chunk verified first."""
    chunks = region_chunks(size)
    if len(chunks) != len(crcs):
        raise ImageError(f"{what}: the image lists {len(crcs)} chunks, the region has {len(chunks)}")
    def summed(c: int, n: int) -> int:
        for _ in himg.pieces(off + c, n):  # (a mapped file: wait until its pages are mapped and registered,
            pass  # rather than fault them in here, one 4 KiB page at a time, competing with the registrars)
        return checksum_at(himg.base + off + c, n)

    sums = [m.pool.submit(summed, c, n) for c, n in chunks]
    for k, (c, n) in enumerate(chunks):
        if sums[k].result() != crcs[k]:
            for f in sums:
                f.cancel()
            raise ImageError(f"{what}: checksum mismatch in chunk {k}; the image is damaged")
        _copy(m, himg, off + c, n, va + c, False, m.streams[k % len(m.streams)])


class MappedFile:
    """An image file mapped read-only and registered as pinned memory in PIECE
    pieces, on REGISTRARS threads, in file order, while earlier pieces are checked and
    copied (two threads map and register existing pages faster than one; more do not).
    Raises OSError/CudaError at once if the first piece cannot be registered (a file
    system or driver that does not allow it): the caller reads through bounce slots instead."""

    PIECE = 256 << 20
    REGISTRARS = 2

    def __init__(self, backend: Any, dev: int, fd: int) -> None:
        self.backend, self.dev = backend, dev
        self.size = os.fstat(fd).st_size
        self.base = libc.map_anywhere(fd, self.size, writable=False)
        self.ready = [threading.Event() for _ in range(0, self.size, self.PIECE)]
        self.failed: BaseException | None = None
        self.registered: list[int] = []
        self._lock = threading.Lock()
        self._pool: ThreadPoolExecutor | None = None
        self.t0, self.t_done = time.monotonic(), 0.0  # (reported: registration is what limits this path)
        try:
            self._register(0)
        except BaseException:
            libc.unmap(self.base, self.size)
            raise
        self._pool = ThreadPoolExecutor(self.REGISTRARS, thread_name_prefix="nvproxy-register")
        for i in range(1, len(self.ready)):
            self._pool.submit(self._register_noting, i)

    def _span(self, i: int) -> tuple[int, int]:
        return self.base + i * self.PIECE, min(self.PIECE, self.size - i * self.PIECE)

    def _register(self, i: int) -> None:
        addr, n = self._span(i)
        self.backend.activate(self.dev)
        libc.populate_read(addr, n)  # (page tables on this thread: registration alone faults them one by one)
        self.backend.host_register(addr, n, read_only=True)
        with self._lock:
            self.registered.append(i)
            self.t_done = max(self.t_done, time.monotonic())
        self.ready[i].set()

    def _register_noting(self, i: int) -> None:
        try:
            if self.failed is None:
                self._register(i)
        except BaseException as e:
            self.failed = e
        finally:
            self.ready[i].set()

    def pieces(self, off: int, n: int) -> Iterator[tuple[int, int]]:
        """(address, length) pieces of [off, off+n), each inside one registration, once it is made."""
        while n > 0:
            i = off // self.PIECE
            self.ready[i].wait()
            if i not in self.registered:
                raise ImageError(f"registering the image file as pinned memory failed: {self.failed}")
            k = min(n, (i + 1) * self.PIECE - off)
            yield self.base + off, k
            off, n = off + k, n - k

    def close(self) -> None:
        if self._pool is not None:
            self._pool.shutdown(wait=True, cancel_futures=True)
        self.backend.activate(self.dev)
        for i in self.registered:
            self.backend.host_unregister(*self._span(i))
        libc.unmap(self.base, self.size)


class Bounce:
    """Pinned bounce slots of SLOT bytes, for images that come from a file: enough for every reader
    to read into one while earlier pieces go to the device.  Their pages are new (what a fresh
    proxy is slowest to get, above all in a VM while an image is read), so there are few, made
    and registered on MAKERS threads of their own while the loader runs, which uses each slot
    once its state says it is made."""

    MAKERS = 2  # (populating and registering new memory: two threads do it faster than one)
    SLOT = 4 << 20  # (loads faster than smaller or larger slots)

    def __init__(self, m: Mover, image_bytes: int, readers: int) -> None:
        """image_bytes: no more slots than the image has pieces."""
        self.m = m
        self.slots = max(2, min(2 * readers + 8, -(-image_bytes // self.SLOT)))
        self.size = self.slots * self.SLOT
        self.addr, self._base, self._mapped = libc.map_private_huge(self.size)
        self.state = fileload.slot_states(self.slots)
        self.registered: list[int] = []
        self.failed: BaseException | None = None
        self._makers = [threading.Thread(target=self._make, args=(k,), name="nvproxy-bounce", daemon=True)
                        for k in range(self.MAKERS)]
        for t in self._makers:
            t.start()

    def _make(self, first: int) -> None:
        mine = range(first, self.slots, self.MAKERS)
        made = 0
        try:
            self.m.backend.activate(self.m.dev)
            for i in mine:
                if self.failed is not None:
                    break
                libc.populate(self.slot(i), self.SLOT)
                self.m.backend.host_register(self.slot(i), self.SLOT)
                self.registered.append(i)
                self.state[i] = fileload.SLOT_READY
                made += 1
        except BaseException as e:  # (the loader goes on with the slots made, or reports that none could be)
            self.failed = e
        finally:
            for i in mine[made:]:
                self.state[i] = fileload.SLOT_FAILED

    def slot(self, i: int) -> int:
        return self.addr + i * self.SLOT

    def close(self) -> None:
        self.failed = self.failed or ImageError("closed")
        for t in self._makers:
            t.join()
        self.m.backend.activate(self.m.dev)  # (no copy from a slot is still running: the loader waited for all)
        for i in self.registered:
            self.m.backend.host_unregister(self.slot(i), self.SLOT)
        libc.unmap(self._base, self._mapped)


READERS = min(16, os.cpu_count() or 4)


class FileLoader:
    """Regions of an image file to the device through bounce slots, by the native loader
    (fileload.py): READERS threads read and sum chunks into free slots, a piece at a time (pread
    of a tmpfs file into pinned memory is bound by one core's copy, so many readers go faster), and this
    thread issues the pieces' copies.  load() lists a region's chunks; finish() moves them all."""

    def __init__(self, m: Mover, fd: int, image_bytes: int, progress: Callable[[int], None] | None = None,
                 gate: fileload.Gate | None = None, check: fileload.Check | None = None) -> None:
        """gate: holds the copies back (fileload.Gate) until the device memory exists; check: the early check of
        this file's chunks (earlycheck.py): it goes on until the copies may go, and is stopped after the load."""
        self.b = Bounce(m, image_bytes, READERS)
        self.fd, self.progress, self.gate, self.check = fd, progress, gate, check
        self.events = [m.backend.event_create(m.dev, _DISABLE_TIMING) for _ in range(self.b.slots)]
        self.chunks: list[tuple[int, int, int, int]] = []  # (file offset, device address, size, checksum)
        self.names: list[tuple[str, int]] = []  # (region, chunk in it): for messages
        self.spent: dict[str, float] = {}
        self.verified = 0  # (bytes moved by earlier finish() calls)

    def load(self, va: int, size: int, file_off: int, crcs: list[int], what: str) -> None:
        chunks = region_chunks(size)
        if len(chunks) != len(crcs):
            raise ImageError(f"{what}: the image lists {len(crcs)} chunks, the region has {len(chunks)}")
        for k, (off, n) in enumerate(chunks):
            self.chunks.append((file_off + off, va + off, n, crcs[k]))
            self.names.append((what, k))

    def finish(self) -> None:
        """Moves the chunks listed since the last finish() (a restore lists memory, then variables)."""
        if not self.chunks:
            return
        m, be = self.b.m, self.b.m.backend
        be.activate(m.dev)
        t = time.monotonic()
        before, progress = self.verified, self.progress
        check = self.check if self.check is not None and self.check.of(self.fd) else None
        if check is not None and os.environ.get("NVPROXY_EARLY_CHECK") == "load":
            check.stop()  # (stopped as the load begins, not as its copies may go: to compare the two)
        try:
            r = fileload.run(self.fd, self.chunks, self.b.addr, self.b.SLOT, self.b.state,
                             [be.handle_value(e) for e in self.events], [be.handle_value(s) for s in m.streams],
                             be.fast_driver(), READERS, READ_PIECE,
                             (lambda n: progress(before + n)) if progress is not None else None, self.gate, check)
        finally:
            if self.check is not None:
                self.check.stop()
        for k, v in (("load", time.monotonic() - t), ("read_and_sum", r.read_s), ("slot_wait", r.slot_wait_s),
                     ("copies_in_flight", r.flight_s)):
            self.spent[k] = self.spent.get(k, 0.0) + v
        self.verified += sum(n for _o, _va, n, _c in self.chunks)
        names, self.chunks, self.names = self.names, [], []
        what, k = names[r.bad_chunk] if r.bad_chunk >= 0 else ("the image", 0)
        if r.why == fileload.SHORT:
            raise ImageError(f"{what}: reading the image failed ({os.strerror(r.err)})" if r.err
                             else f"{what}: the image is truncated")
        if r.why == fileload.MISMATCH:
            raise ImageError(f"{what}: checksum mismatch in chunk {k}; the image is damaged")
        if r.why == fileload.CUDA:
            raise ImageError(f"copying the image to the device failed (CUDA error {r.err})")
        if r.why == fileload.CANCELLED:
            raise ImageError("the restore stopped before its device memory was loaded")
        if r.why == fileload.NO_SLOTS:
            raise ImageError(f"pinned bounce memory for the restore could not be made: {self.b.failed}")
        if r.why != fileload.OK:
            raise ImageError(f"reading the image: no reader thread could start ({os.strerror(r.err)})")

    def close(self) -> None:
        """After finish(), or instead of it: the slots and their events go."""
        self.b.close()
        for e in self.events:
            self.b.m.backend.event_destroy(e)
        self.events = []
