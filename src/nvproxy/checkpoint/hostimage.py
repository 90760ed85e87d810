"""The host image buffer: a checkpoint image in the proxy's memory (a memfd,
mapped and registered as pinned memory), kept from one checkpoint to the next.

Why: device-to-pinned copies run at the PCIe/NVLink-C2C rate, but memory the
kernel has to find first (fresh tmpfs or page-cache pages, above all in a VM)
goes far more slowly, and registering (page-locking) takes time in proportion
to the size.  So the buffer's pages are made and registered while the
application runs (NVPROXY_CKPT_BUFFER=prefault, the default), or at the first
checkpoint and kept (=lazy), or released after every checkpoint (=transient,
saves host memory).

Registering in the background: CUDA's programming guide lists page-locking
among the implicit synchronisation points, which would stall the application's
streams or, with kernels that wait on other streams' later work, hang them.
With the driver in use, cuMemHostRegister took about as
long while a kernel ran as on an idle device, returned while a kernel spun on a flag, and
the launch that set the flag was not held up; a device-to-host
copy ran on beside a registration.  This driver does not synchronise there, so
the buffer is registered in segments, in the background.

A checkpoint then copies device memory straight into it; writing a file from
it happens after the application was let go on; a migration hands the memfd
itself to the new proxy, which maps and registers it before the application
stops (the "buffer" control command), so that its restore is a copy.

The buffer grows in segments (64 MiB doubling up to 1 GiB), each registered on
its own, mapped back to back in a reserved range so that the image is one run
of addresses; copies are split at segment boundaries (a copy must lie inside
one registration).
"""

from __future__ import annotations

import bisect
import errno
import os
import threading
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from ..proxy import libc
from .image import CHUNK, atomic_file

Reuse = tuple[int, list[tuple[int, int, int]]]
BASE = 0x100000000000  # 16 TiB: below the device arenas (32 TiB up), far from where Linux puts mmaps
RESERVE = 4 << 40
FIRST, LARGEST = 64 << 20, 1 << 30
WRITERS = 8
POPULATE_PART = 256 << 20


def mode() -> str:
    m = os.environ.get("NVPROXY_CKPT_BUFFER", "prefault")
    return m if m in ("prefault", "lazy", "transient") else "prefault"


def segment_starts(size: int) -> list[int]:
    """Offsets where segments begin, for a buffer of size bytes (a segment boundary)."""
    starts, at = [], 0
    while at < size:
        starts.append(at)
        at += min(LARGEST, max(FIRST, at))
    return starts


def rounded(size: int) -> int:
    """The smallest buffer size (on a segment boundary) of at least size bytes."""
    at = 0
    while at < size:
        at += min(LARGEST, max(FIRST, at))
    return at


class HostImage:
    def __init__(self, backend: Any, dev: int, fd: int | None = None) -> None:
        """fd: a buffer handed over by another proxy (its whole size is mapped)."""
        self.backend, self.dev = backend, dev
        self.base = next((b for b in range(BASE, BASE + 4 * RESERVE, RESERVE) if libc.reserve(b, RESERVE)), 0)
        if not self.base:
            raise OSError("no address space for the host image buffer")
        self.fd = fd if fd is not None else os.memfd_create("nvproxy-image", os.MFD_CLOEXEC)
        self.starts: list[int] = []
        self.closed = False
        self.registered: set[int] = set()  # segment starts
        self.capacity = 0
        self.lock = threading.Lock()  # one checkpoint (dump, file write) or growth at a time
        if fd is not None:
            self.grow(os.fstat(fd).st_size)

    def grow(self, need: int, register: bool = True) -> None:
        """Map segments until need bytes fit, making their pages and (register) registering them (a broken
        context's image is written without: registering fails there, and nothing is copied from the device)."""
        target = rounded(need)
        if target > RESERVE:
            raise OSError(f"a checkpoint image of {need >> 30} GiB does not fit the host image buffer")
        if os.fstat(self.fd).st_size < target:
            os.ftruncate(self.fd, target)
        new = segment_starts(target)[len(self.starts) :]
        for start in new:
            libc.map_over(self.fd, self.base + start, rounded(start + 1) - start, start)
        # page tables (and, for fresh memory, the pages) made on several threads: one
        # thread's page faults are what limits this
        parts = [(self.base + at, min(POPULATE_PART, rounded(start + 1) - at))
                 for start in new for at in range(start, rounded(start + 1), POPULATE_PART)]
        with ThreadPoolExecutor(WRITERS, thread_name_prefix="nvproxy-populate") as pool:
            list(pool.map(lambda p: libc.populate(*p), parts))
        todo = [start for start in self.starts + new if start not in self.registered] if register else []
        if todo:  # (2 threads register faster than one; more did not help)
            def register(start: int) -> None:
                self.backend.activate(self.dev)
                self.backend.host_register(self.base + start, rounded(start + 1) - start)
                self.registered.add(start)

            with ThreadPoolExecutor(2, thread_name_prefix="nvproxy-register") as pool:
                list(pool.map(register, todo))
        for start in new:  # (only now: the capacity "usage" reports is memory ready for a checkpoint)
            self.starts.append(start)
            self.capacity = rounded(start + 1)

    def follow(self, fd: int) -> bool:
        """The same memfd again (a migration's hand-over after the "buffer" command):
        map what it grew by since, and close fd.  False if fd is another file."""
        a, b = os.fstat(fd), os.fstat(self.fd)
        if (a.st_dev, a.st_ino) != (b.st_dev, b.st_ino):
            return False
        os.close(fd)
        self.grow(a.st_size)
        return True

    def pieces(self, off: int, n: int) -> Iterator[tuple[int, int]]:
        """(address, length) pieces of [off, off+n), none crossing a segment."""
        while n > 0:
            i = bisect.bisect_right(self.starts, off)
            seg_end = self.starts[i] if i < len(self.starts) else self.capacity
            k = min(n, seg_end - off)
            yield self.base + off, k
            off, n = off + k, n - k

    def view(self, off: int, n: int) -> memoryview:
        return libc.buffer(self.base + off, n)

    def write_file(self, path: str | Path, size: int, reuse: Reuse | None = None) -> None:
        """The first size bytes (an image) into path, atomically, on several threads.  reuse: (a parent image's
        fd, [(offset, offset in the parent, bytes)]): those ranges come from the parent's file instead."""
        taken = sorted(reuse[1]) if reuse else []

        def write(fd: int) -> None:
            os.ftruncate(fd, size)

            def part(span: tuple[int, int]) -> None:
                off, end = span
                v, done = self.view(off, end - off), 0
                while done < len(v):
                    done += os.pwrite(fd, v[done:], off + done)

            def copied(span: tuple[int, int, int]) -> None:
                off, src, n = span
                while n > 0:
                    k = os.copy_file_range(reuse[0], fd, n, src, off)  # type: ignore[index]
                    if k <= 0:
                        raise OSError(errno.EIO, "the earlier image ended early")
                    off, src, n = off + k, src + k, n - k

            spans, at = [], 0
            for off, _src, n in taken + [(size, 0, 0)]:
                spans += [(a, min(a + CHUNK, off)) for a in range(at, off, CHUNK)]
                at = off + n
            pieces = [(off + c, src + c, min(CHUNK, n - c)) for off, src, n in taken for c in range(0, n, CHUNK)]
            with ThreadPoolExecutor(WRITERS, thread_name_prefix="nvproxy-write") as pool:
                list(pool.map(part, spans))
                list(pool.map(copied, pieces))

        atomic_file(path, write)

    def unpin(self) -> None:
        """Unregister every segment (the pages stay, for the file to be written from).  Only while the device
        is idle and the application held: cuMemHostUnregister waits for running kernels, and holds the driver
        meanwhile (docs/architecture.md)."""
        self.backend.activate(self.dev)
        for start in sorted(self.registered):
            self.backend.host_unregister(self.base + start, rounded(start + 1) - start)
        self.registered.clear()

    def close(self) -> None:
        self.unpin()
        libc.unmap(self.base, RESERVE)
        os.close(self.fd)
        self.starts, self.registered, self.capacity = [], set(), 0
        self.closed = True


_making = threading.Lock()


def of(state: Any) -> HostImage:
    """The process's host image buffer, made on first need."""
    with _making:
        if state.host_image is None:
            state.host_image = HostImage(state.backend, min(state.devices, default=0))
        return state.host_image


def locked(state: Any) -> HostImage:
    """The process's buffer, its lock held (a buffer let go meanwhile is replaced)."""
    while True:
        himg = of(state)
        himg.lock.acquire()
        if not himg.closed:
            return himg
        himg.lock.release()


def before_release(himg: HostImage) -> None:
    """The checkpoint's copies are done and the application not yet let go: a buffer that after_checkpoint will
    close is unregistered now, while nothing runs on the device."""
    if mode() == "transient":
        himg.unpin()


def after_checkpoint(state: Any, himg: HostImage) -> None:
    """Done with the buffer (its lock held): let it go where the user asked to keep no host
    memory between checkpoints; release the lock."""
    try:
        if mode() == "transient":
            with _making:
                if state.host_image is himg:
                    state.host_image = None
            himg.close()
    finally:
        himg.lock.release()
