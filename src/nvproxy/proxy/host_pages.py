"""The pages of the application's shared host memory in the proxy: mapped here before the driver pins them (on
several threads when many), and large ranges unmapped after the reply.

The driver pins a range by faulting in each page it finds unmapped, one write fault a page.  Read faults map a
run of the file's pages at a time (the kernel's fault-around: the shim made every page), and threads fault
disjoint pieces at once; the pinning then finds every page mapped.

Unmapping a large range (its page table entries dropped, and the pages freed when it was the last user) takes
longer than unregistering it; nothing waits for it but a later mapping at the same address (wait_unmapped)."""

from __future__ import annotations

import errno
import os
import threading

from . import libc

_c = libc.ffi.dlopen(None)

MADV_POPULATE_READ = 22  # Linux 5.14
WORTH = 256 << 10  # smaller ranges of pages that exist are left to the driver (a few faults)
PIECE = 16 << 20  # the least a thread faults in: below, a thread's start costs more than it saves
MAX_THREADS = 8
LATER = 16 << 20  # ranges from this size are unmapped after the reply
HUGE = libc.HUGE


CPUS = len(os.sched_getaffinity(0))


def _threads(size: int) -> int:
    return max(1, min(MAX_THREADS, CPUS, size // PIECE))


def _fault_in(addr: int, size: int) -> int:
    """Read faults over [addr, +size): 0, or the errno."""
    if _c.madvise(libc.ffi.cast("void *", addr), size, MADV_POPULATE_READ) == 0:
        return 0
    return libc.ffi.errno


def populate(addr: int, size: int) -> None:
    """Every page of the shared mapping [addr, +size) mapped (and made, if missing); OSError when there is no room
    for one."""
    n = _threads(size)
    share = (size // n + HUGE - 1) // HUGE * HUGE
    pieces = [(addr + off, min(share, size - off)) for off in range(0, size, share)]
    errors = [0] * len(pieces)

    def fault(i: int) -> None:
        errors[i] = _fault_in(*pieces[i])

    helpers = [threading.Thread(target=fault, args=(i,), name="nvproxy-populate") for i in range(1, len(pieces))]
    for t in helpers:
        t.start()
    fault(0)
    for t in helpers:
        t.join()
    err = next((e for e in errors if e), 0)
    if err and err != errno.EINVAL:  # (EINVAL: a kernel without MADV_POPULATE_READ; the driver faults the pages in)
        raise OSError(err, os.strerror(err))


_pending: dict[int, tuple[int, threading.Thread]] = {}  # address -> (size, the thread unmapping it)
_lock = threading.Lock()


def unmap_later(addr: int, size: int, fd: int) -> None:
    """Unmap [addr, +size) and close fd: now if small, else on a thread of its own."""
    if size < LATER:
        libc.unmap(addr, size)
        os.close(fd)
        return

    def run() -> None:
        libc.unmap(addr, size)
        os.close(fd)
        with _lock:
            if _pending.get(addr, (0, None))[1] is t:
                del _pending[addr]

    t = threading.Thread(target=run, name="nvproxy-unmap", daemon=True)
    with _lock:
        _pending[addr] = (size, t)
    t.start()


def wait_unmapped(addr: int, size: int) -> None:
    """Return once no range unmapped later overlaps [addr, +size)."""
    with _lock:
        busy = [t for a, (n, t) in _pending.items() if a < addr + size and addr < a + n]
    for t in busy:
        t.join()
