"""Moving memory between the device and an image file, fast: pinned bounce
buffers, chunks of image.CHUNK bytes, device copies overlapped with file I/O and
CRC-32 on several threads (the GIL is released in cffi, os.pread/pwrite and
zlib.crc32)."""

from __future__ import annotations

import os
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any

from ..errors import CudaError
from ..proxy import libc
from .image import CHUNK, ImageError, checksum

SLOTS = 8
_DISABLE_TIMING = 2
_NON_BLOCKING = 1


class Bounce:
    """SLOTS pinned chunks and a stream of their own on one device."""

    def __init__(self, backend: Any, dev: int) -> None:
        self.backend, self.dev = backend, dev
        backend.activate(dev)
        self.size = SLOTS * CHUNK
        self.fd = os.memfd_create("nvproxy-bounce", os.MFD_CLOEXEC)
        os.ftruncate(self.fd, self.size)
        self.addr = libc.map_anywhere(self.fd, self.size)
        backend.host_register(self.addr, self.size)
        self.stream = backend.stream_create(dev, _NON_BLOCKING, 0)
        self.events = [backend.event_create(dev, _DISABLE_TIMING) for _ in range(SLOTS)]
        self.pool = ThreadPoolExecutor(SLOTS, thread_name_prefix="nvproxy-io")

    def slot(self, i: int) -> int:
        return self.addr + i * CHUNK

    def view(self, i: int, n: int) -> memoryview:
        return libc.buffer(self.slot(i), n)

    def close(self) -> None:
        self.pool.shutdown()
        self.backend.stream_sync(self.stream)
        for e in self.events:
            self.backend.event_destroy(e)
        self.backend.stream_destroy(self.stream)
        self.backend.host_unregister(self.addr, self.size)
        libc.unmap(self.addr, self.size)
        os.close(self.fd)


def _chunks(size: int) -> list[tuple[int, int]]:
    return [(off, min(CHUNK, size - off)) for off in range(0, size, CHUNK)]


def device_to_file(b: Bounce, fd: int, va: int, size: int, file_off: int) -> list[int]:
    """Write [va, va+size) of device memory at file_off; returns the chunks' CRCs."""
    be = b.backend
    busy: list[Future | None] = [None] * SLOTS
    futures: list[Future] = []

    def write(i: int, n: int, at: int) -> int:
        be.activate(b.dev)
        be.event_sync(b.events[i])
        v = b.view(i, n)
        done = 0
        while done < n:
            done += os.pwrite(fd, v[done:], at + done)
        return checksum(v)

    for k, (off, n) in enumerate(_chunks(size)):
        i = k % SLOTS
        if busy[i] is not None:
            busy[i].result()
        be.memcpy(b.slot(i), va + off, n, b.stream)
        be.event_record(b.events[i], b.stream, 0)
        busy[i] = b.pool.submit(write, i, n, file_off + off)
        futures.append(busy[i])
    return [f.result() for f in futures]


def file_to_device(b: Bounce, fd: int, va: int, size: int, file_off: int, crcs: list[int], what: str) -> None:
    """Load a region written by device_to_file, checking every chunk's CRC before it reaches the device."""
    be = b.backend
    chunks = _chunks(size)
    if len(chunks) != len(crcs):
        raise ImageError(f"{what}: the image lists {len(crcs)} chunks, the region has {len(chunks)}")

    def read(k: int) -> int:
        i = k % SLOTS
        be.activate(b.dev)
        be.event_sync(b.events[i])  # the slot's previous copy to the device is done
        off, n = chunks[k]
        v = b.view(i, n)
        got = os.preadv(fd, [v], file_off + off)
        if got != n:
            raise ImageError(f"{what}: the image is truncated")
        if checksum(v) != crcs[k]:
            raise ImageError(f"{what}: checksum mismatch in chunk {k}; the image is damaged")
        return i

    ahead: dict[int, Future] = {}
    for k in range(min(SLOTS - 1, len(chunks))):
        ahead[k] = b.pool.submit(read, k)
    for k, (off, n) in enumerate(chunks):
        i = ahead.pop(k).result()
        be.memcpy(va + off, b.slot(i), n, b.stream)
        be.event_record(b.events[i], b.stream, 0)
        nxt = k + SLOTS - 1
        if nxt < len(chunks):
            ahead[nxt] = b.pool.submit(read, nxt)
    try:
        be.stream_sync(b.stream)
    except CudaError as e:
        raise ImageError(f"{what}: copying to the device failed (CUDA error {e.code})") from None
