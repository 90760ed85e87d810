"""Moving image chunks (image.CHUNK bytes) between the device and host memory.

- device_to_host / host_to_device: straight between device memory and the
  pinned host image buffer, on two streams, checksums on a pool of threads
  (the C checksum releases the GIL) overlapping the copies.
- MappedFile + host_to_device: an image file mapped read-only and registered
  as pinned memory piece by piece, ahead of the copies (no copy on the host:
  the file's page-cache or tmpfs pages go to the device as they are).
- FileLoader: from an image file, through pinned bounce slots, reading and
  verifying on the pool while earlier chunks go to the device.
Every chunk's checksum is verified before the chunk reaches the device."""

from __future__ import annotations

import os
import threading
import time
from collections import deque
from collections.abc import Iterator
from concurrent.futures import Future, ThreadPoolExecutor, wait
from typing import Any

from ..errors import CudaError
from ..proxy import libc
from .checksum import checksum_at, pread_checksum
from .image import CHUNK, ImageError

SLOTS = 16
STREAMS = 2
_DISABLE_TIMING = 2
_NON_BLOCKING = 1


def _chunks(size: int) -> list[tuple[int, int]]:
    return [(off, min(CHUNK, size - off)) for off in range(0, size, CHUNK)]


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
        be.event_sync(m.events[i])
        return checksum_at(himg.base + at, n)

    for k, (c, n) in enumerate(_chunks(size)):
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
    chunks = _chunks(size)
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
    copied (mapping and registering existing pages ran at 8.8 GB/s on one thread on the
    H200, 21.8 on two, less on more).  Raises OSError/CudaError at once if the first piece cannot be registered
    (a file system or driver that does not allow it): the caller reads through bounce
    slots instead."""

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
    """Up to SLOTS pinned chunks, for images that come from a file.  Their pages are new
    (2-3 GB/s to make in the H200's VM as 4 KiB pages; huge pages where the kernel gives them), so slots
    are made and registered on MAKERS
    threads of their own, and each is handed out as soon as it is made.  A slot whose
    chunk is being copied to the device comes back once its event says the copy is
    done: only the thread that takes slots ever waits for a copy (an event wait spins,
    and spinning threads took the CPUs the reads needed)."""

    MAKERS = 2  # (populating and registering new memory ran at 8 GB/s on one thread there, 22 on two)

    def __init__(self, m: Mover, image_bytes: int) -> None:
        """image_bytes: no more slots than the image has chunks (new pinned memory costs 0.35 s per GiB there)."""
        self.m = m
        self.slots = max(2, min(SLOTS, -(-image_bytes // CHUNK)))
        self.size = self.slots * CHUNK
        self.addr, self._base, self._mapped = libc.map_private_huge(self.size)
        self._cond = threading.Condition()
        self._free: list[int] = []  # made and unused
        self._copying: deque[int] = deque()  # in a copy to the device, whose event is m.events[slot]
        self._made = 0
        self.registered: list[int] = []
        self.failed: BaseException | None = None
        self._makers = [threading.Thread(target=self._make, args=(k,), name="nvproxy-bounce", daemon=True)
                        for k in range(self.MAKERS)]
        for t in self._makers:
            t.start()

    def _make(self, first: int) -> None:
        try:
            self.m.backend.activate(self.m.dev)
            for i in range(first, self.slots, self.MAKERS):
                if self.failed is not None:
                    break
                libc.populate(self.slot(i), CHUNK)
                self.m.backend.host_register(self.slot(i), CHUNK)
                with self._cond:
                    self.registered.append(i)
                    self._free.append(i)
                    self._cond.notify()
        except BaseException as e:  # (reported to whoever waits for a slot)
            self.failed = e
        finally:
            with self._cond:
                self._made += 1
                self._cond.notify_all()

    def slot(self, i: int) -> int:
        return self.addr + i * CHUNK

    def take(self) -> int:
        """A slot to fill: a free one, else the one whose copy began first, once that copy is done."""
        with self._cond:
            while not self._free and not self._copying:
                if self._made == self.MAKERS and not self.registered:
                    raise ImageError(f"pinned bounce memory for the restore could not be made: {self.failed}")
                self._cond.wait()
            if self._free:
                return self._free.pop()
            i = self._copying.popleft()
        self.m.backend.event_sync(self.m.events[i])
        return i

    def copying(self, i: int) -> None:
        """Slot i's copy to the device was issued (and its event recorded after it)."""
        with self._cond:
            self._copying.append(i)
            self._cond.notify()

    def give(self, i: int) -> None:
        """Slot i was not used after all."""
        with self._cond:
            self._free.append(i)
            self._cond.notify()

    def close(self) -> None:
        self.failed = self.failed or ImageError("closed")
        for t in self._makers:
            t.join()
        self.m.sync()
        self.m.backend.activate(self.m.dev)
        for i in self.registered:
            self.m.backend.host_unregister(self.slot(i), CHUNK)
        libc.unmap(self._base, self._mapped)


class FileLoader:
    """Regions of an image file to the device through the bounce slots.  Each chunk is
    one task on the pool: read the chunk into its slot and sum it (pread of a tmpfs file
    into pinned memory ran at 4 GB/s on one thread, 34 on sixteen there), check the sum
    and issue its copy to the device.  Chunks go in any order, so one slow read holds up
    nothing but itself.  load() returns with chunks in flight; finish() waits for all."""

    def __init__(self, b: Bounce, fd: int) -> None:
        self.b, self.fd = b, fd
        self.moves: list[Future] = []
        self.failed = False
        self.spent = {"slot_wait": 0.0, "read_and_sum": 0.0}
        self._spent_lock = threading.Lock()  # (the moving threads add to it)

    def _move(self, i: int, at: int, n: int, va: int, crc: int, what: str, k: int) -> None:
        m, be = self.b.m, self.b.m.backend
        t0 = time.monotonic()
        try:
            got_crc, got = pread_checksum(self.fd, self.b.slot(i), n, at)
            if got != n:
                raise ImageError(f"{what}: the image is truncated")
            if got_crc != crc:
                raise ImageError(f"{what}: checksum mismatch in chunk {k}; the image is damaged")
            be.activate(m.dev)
            s = m.streams[i % len(m.streams)]
            be.memcpy(va, self.b.slot(i), n, s)
            be.event_record(m.events[i], s, 0)
        except BaseException:
            self.failed = True
            self.b.give(i)
            raise
        self.b.copying(i)
        with self._spent_lock:  # (summed over the threads: where a restore's time goes)
            self.spent["read_and_sum"] += time.monotonic() - t0

    def load(self, va: int, size: int, file_off: int, crcs: list[int], what: str) -> None:
        chunks = _chunks(size)
        if len(chunks) != len(crcs):
            raise ImageError(f"{what}: the image lists {len(crcs)} chunks, the region has {len(chunks)}")
        for k, (off, n) in enumerate(chunks):
            if self.failed:
                break  # (finish() reports why)
            t = time.monotonic()
            i = self.b.take()
            self.spent["slot_wait"] += time.monotonic() - t
            self.moves.append(self.b.m.pool.submit(self._move, i, file_off + off, n, va + off, crcs[k], what, k))

    def finish(self) -> None:
        try:
            for f in self.moves:
                f.result()
            self.b.m.sync()
        except CudaError as e:
            raise ImageError(f"copying the image to the device failed (CUDA error {e.code})") from None
        finally:  # (after a failure: no task may still be writing a slot when the slots go)
            for f in self.moves:
                f.cancel()
            wait(self.moves)
