"""Managed memory that migrates between the host and the device (the shim's side: native/shim/managed_pages.c).

The application's address of such memory is device memory here, so kernels, copies and library calls reach it at
device speed.  The application's host copy is a memfd it maps at that address; the proxy maps the same memfd
wherever it fits, registered, and copies chunks between the two when the shim asks: to the device (PUSH, before the
next request runs) and back (FETCH, answered once done).  A checkpoint keeps the device side as device memory and
the host side stays the application's, so both survive a migration, a restore and a recovery."""

from __future__ import annotations

import bisect
import os
import socket
import sys
import time
from array import array
from typing import Any

from ... import wire
from ...errors import INVALID_VALUE, MEMORY_ALLOCATION, NOT_SUPPORTED, UNKNOWN, CudaError
from .. import libc
from ..state import ManagedRange


def MANAGED_ALLOC(p: Any, ch: Any, a: tuple[int, ...], payload: bytes) -> tuple[tuple[int, ...], bytes]:
    """a0 size, a1 device, a2 0 (new: zeroed device memory) or the address a restored image holds (a recovery)."""
    size, dev, at = a[0], a[1], a[2]
    if not ch.fds:
        raise CudaError(INVALID_VALUE, "no file descriptor came with the request")
    fd = ch.fds.popleft()
    st = p.state
    if at and (at in st.managed or not _allocation(st, at, size)):
        os.close(fd)
        raise CudaError(INVALID_VALUE, f"managed memory at {at:#x}+{size}: no such device memory here")
    try:
        host = libc.map_anywhere(fd, size)
    except OSError:
        os.close(fd)
        raise CudaError(MEMORY_ALLOCATION, f"managed memory of {size} bytes: its host copy cannot be mapped") from None
    try:
        p.backend.host_register(host, size)
        addr = at or st.alloc(dev, size)
    except CudaError:
        libc.unmap(host, size)
        os.close(fd)
        raise
    if not at:
        p.backend.copy_now(dev, [(addr, host, size)])  # (the host copy's pages are zeros: so is the device's)
    st.managed[addr] = ManagedRange(size, fd, host, dev)
    return (addr,), b""


def _allocation(st: Any, addr: int, size: int) -> bool:
    try:
        d = st.arena_of(addr)
    except CudaError:
        return False
    return addr in d.arena.allocs and d.arena.allocs[addr][0] >= size


def _ranges(p: Any, pairs: array) -> dict[int, list[tuple[int, int, int]]]:
    """(address, bytes) pairs as (device address, host address, bytes) by device; every pair inside one region."""
    st = p.state
    bases = sorted(st.managed)
    out: dict[int, list[tuple[int, int, int]]] = {}
    for i in range(0, len(pairs) - 1, 2):
        addr, n = pairs[i], pairs[i + 1]
        k = bisect.bisect_right(bases, addr) - 1
        r = st.managed.get(bases[k]) if k >= 0 else None
        if r is None or addr + n > bases[k] + r.size:
            raise CudaError(INVALID_VALUE, f"managed memory: {addr:#x}+{n} is not inside an allocation")
        out.setdefault(r.dev, []).append((addr, r.host + addr - bases[k], n))
    return out


def MANAGED_PUSH(p: Any, ch: Any, a: tuple[int, ...], payload: bytes) -> None:
    pairs = array("Q", payload[: len(payload) // 16 * 16])
    for dev, copies in _ranges(p, pairs).items():
        p.backend.copy_now(dev, [(d, h, n) for d, h, n in copies])


def fetch(p: Any, a: tuple[int, ...]) -> None:
    for dev, copies in _ranges(p, array("Q", [a[0], a[1]])).items():
        p.backend.copy_now(dev, [(h, d, n) for d, h, n in copies])


PUSH_WAIT_S = 10.0  # (a push the call order has not reached by then is one of another proxy's: go on)


def serve(p: Any, sock: socket.socket, server: Any) -> None:
    """The shim's fault thread's channel (NVP_CHAN_PAGES), until it closes: each fetch once the request that last
    pushed its chunk has run, and otherwise beside the call order.  A fault waits for nothing else: a host
    function (which blocks its stream) or a checkpoint's drain may be what the faulting thread holds up."""
    with sock:
        while True:
            try:
                head = _read(sock, wire.REQ.size)
                length, op, _flags, _seq, *a = wire.REQ.unpack(head)
                if length < wire.REQ.size or length > wire.REQ.size + (1 << 20):
                    print("nvproxy: malformed message on the managed memory channel; closing it", file=sys.stderr)
                    return
                _read(sock, length - wire.REQ.size)
            except OSError:
                return  # (closed: the program ended, or its fault thread went with a fork)
            err = 0
            try:
                if op != wire.NVP_OP_MANAGED_FETCH:
                    raise CudaError(NOT_SUPPORTED, f"operation {op} on the managed memory channel")
                end = time.monotonic() + PUSH_WAIT_S
                while not server.ran(a[2]) and server.running and time.monotonic() < end:
                    time.sleep(0.0001)
                fetch(p, tuple(a))
            except CudaError as e:
                err = e.code
            except Exception as e:  # (answered all the same: the faulting thread waits for this reply)
                print(f"nvproxy: internal error bringing managed memory back: {e!r}", file=sys.stderr)
                err = UNKNOWN
            try:
                sock.sendall(wire.pack_reply(err))
            except OSError:
                return


def _read(sock: socket.socket, n: int) -> bytes:
    got = bytearray()
    while len(got) < n:
        part = sock.recv(n - len(got))
        if not part:
            raise OSError("closed")
        got += part
    return bytes(got)


def release(p: Any, addr: int) -> bool:
    """cudaFree of migrating managed memory (after the devices went idle): False where addr is none."""
    r = p.state.managed.pop(addr, None)
    if r is None:
        return False
    p.backend.host_unregister(r.host, r.size)
    libc.unmap(r.host, r.size)
    os.close(r.fd)
    p.state.free(addr, idle=True)
    return True
