"""A call channel's reply mailbox (struct nvp_mailbox in nvproxy_wire.h): a page
the application shares with the proxy, where the native fast path leaves a bare
reply while the calling thread spins for it, with no system call on either
side (a Unix socket round trip costs two system calls and a wake-up on each
side, shared memory a cache line's transfer).  Python's own replies always go over the socket."""

from __future__ import annotations

import fcntl
import os
import sys
from typing import Any

from .. import wire
from . import fastpath, libc

SIZE = wire.NVP_MAILBOX_BYTES


REPLIED = wire.ffi.offsetof("struct nvp_mailbox", "replied")


class Mailbox:
    """The mapped page and its memfd (kept: a migration hands it to the new proxy)."""

    def __init__(self, fd: int, addr: int) -> None:
        self.fd, self.addr = fd, addr
        self._replied = libc.ffi.cast("volatile uint32_t *", addr + REPLIED)

    def replied(self) -> None:
        """A reply went over the socket: the thread, spinning on the mailbox, reads its socket now.  (Python's
        waiter threads and C may count at once; a count lost so still changes the value, which is all it reads.)"""
        self._replied[0] = (self._replied[0] + 1) & 0xFFFFFFFF

    def close(self) -> None:
        libc.unmap(self.addr, SIZE)
        os.close(self.fd)


def attach(fd: int, tid: int) -> Mailbox | None:
    """Map the mailbox the application sent (fd is ours to keep or close).  Only a memfd sealed against
    shrinking is taken: touching a page past the end of a file that shrank would kill the proxy (SIGBUS)."""
    try:
        sealed = fcntl.fcntl(fd, fcntl.F_GET_SEALS) & fcntl.F_SEAL_SHRINK
        if sealed and os.fstat(fd).st_size >= SIZE:
            return Mailbox(fd, libc.map_anywhere(fd, SIZE))
    except OSError:
        pass
    print(f"nvproxy: thread {tid} sent an unusable reply mailbox; its replies go over its socket", file=sys.stderr)
    os.close(fd)
    return None


def plug(fast_chan: Any, mb: Mailbox | None) -> None:
    """Let the fast path (a struct nvpf_chan) use mb, or no mailbox."""
    if fast_chan is not None:
        fast_chan.mailbox = fastpath.ffi.cast("void *", mb.addr) if mb else fastpath.ffi.NULL
