"""Kernel printf capture.

The driver writes device printf output to the process's stdout at
synchronisation points.  The proxy's fd 1 is a pipe read here; whatever has
arrived is attached to the next reply, and the shim writes it to the
application's own stdout, so it interleaves with the application's output
exactly where native CUDA would put it.
"""

from __future__ import annotations

import fcntl
import os
import select
import sys
import threading
from collections.abc import Callable

from . import libc

F_SETPIPE_SZ = 1031


class StdoutCapture:
    def __init__(self) -> None:
        r, w = os.pipe()
        try:
            fcntl.fcntl(w, F_SETPIPE_SZ, 1 << 20)
        except OSError:
            pass
        sys.stdout.flush()
        os.dup2(w, 1)
        os.close(w)
        # Python's own prints must not be mistaken for kernel output
        sys.stdout = sys.stderr
        os.set_blocking(r, False)
        self._r = r
        self.fd = r
        self.notify: Callable[[bool], None] = lambda pending: None  # the fast path's "text waits" flag
        self._buf = bytearray()
        self._lock = threading.Lock()
        threading.Thread(target=self._pump, name="nvproxy-printf", daemon=True).start()

    def _drain(self) -> None:
        while True:
            try:
                chunk = os.read(self._r, 1 << 16)
            except BlockingIOError:
                return
            if not chunk:
                return
            self._buf += chunk

    def _pump(self) -> None:
        # keeps the pipe empty so a large burst never blocks the driver
        while True:
            select.select([self._r], [], [])
            self.notify(True)  # before the pipe empties: a reader always sees one or the other
            with self._lock:
                self._drain()

    def peek(self) -> bytes:
        """What waits for the application, left waiting (a checkpoint keeps it in the image)."""
        libc.flush_stdio()
        with self._lock:
            self._drain()
            return bytes(self._buf)

    def put(self, text: bytes) -> None:
        """Text a restored image held: ahead of anything the kernels print from now on."""
        if text:
            with self._lock:
                self._buf[:0] = text
                self.notify(True)

    def take(self) -> bytes:
        libc.flush_stdio()
        with self._lock:
            self._drain()
            self.notify(False)
            if not self._buf:
                return b""
            out = bytes(self._buf)
            self._buf.clear()
            return out
