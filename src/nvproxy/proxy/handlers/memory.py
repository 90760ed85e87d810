"""Device allocations, shared host memory, copies and memsets."""

from __future__ import annotations

import os
from typing import Any

from ... import wire
from ...errors import (
    ALREADY_MAPPED,
    HOST_MEMORY_NOT_REGISTERED,
    INVALID_VALUE,
    MEMORY_ALLOCATION,
    STREAM_CAPTURE_UNSUPPORTED,
    CudaError,
)
from .. import fastpath, host_pages, libc
from ..fastpath import COPY_EVENTS  # more than the shim ever has in flight per channel
from ..server import Deferred
from ..state import HostRange
from . import managed


def MALLOC(p: Any, ch: Any, a: tuple[int, ...], payload: bytes) -> tuple[tuple[int, ...], bytes]:
    return (p.state.alloc(ch.dev, a[0]),), b""


def FREE(p: Any, ch: Any, a: tuple[int, ...], payload: bytes) -> None:
    # (an idle device has nothing to wait for: the memory is free for the next cudaMalloc at once, without the
    # reaper's round trip, which a program that allocates and frees in a loop would pay every time)
    st = p.state
    st.free(a[0], idle=not st.freeing and p.device_idle(st.arena_of(a[0]).index, most=32))


def MEM_INFO(p: Any, ch: Any, a: tuple[int, ...], payload: bytes) -> tuple[tuple[int, ...], bytes]:
    free, total = p.backend.mem_info(ch.dev)
    return (free + p.state.device(ch.dev).arena.cached_bytes, total), b""


def take_fd(ch: Any) -> int:
    if not ch.fds:
        raise CudaError(INVALID_VALUE, "no file descriptor came with the request")
    return ch.fds.popleft()


def HOST_REGISTER(p: Any, ch: Any, a: tuple[int, ...], payload: bytes) -> None:
    addr, size = a[0], a[1]
    fd = take_fd(ch)
    host_pages.wait_unmapped(addr, size)  # (memory unregistered a moment ago, registered again)
    if addr in p.state.host or not libc.map_fixed(fd, addr, size):
        os.close(fd)  # (and nothing unmapped: what is there is this process's own; unmapping it crashed the proxy)
        raise CudaError(ALREADY_MAPPED, f"host memory at {addr:#x}+{size}: the address is taken in the proxy")
    try:
        try:
            if size >= host_pages.WORTH:
                host_pages.populate(addr, size)
        except OSError as e:
            raise CudaError(MEMORY_ALLOCATION, f"host memory at {addr:#x}+{size}: no pages for it ({e.strerror})") \
                from None
        p.backend.host_register(addr, size)
    except CudaError:
        libc.unmap(addr, size)
        os.close(fd)
        raise
    p.state.host[addr] = HostRange(size, fd)


def _sync_all(p: Any) -> None:
    for dev in p.state.devices:
        p.backend.device_sync(dev)


def HOST_UNREGISTER(p: Any, ch: Any, a: tuple[int, ...], payload: bytes) -> None:
    r = p.state.host.pop(a[0], None)
    if r is None and a[0] in p.state.managed:  # (migrating managed memory: handlers/managed.py)
        _sync_all(p)
        managed.release(p, a[0])
        return
    if r is None:
        raise CudaError(HOST_MEMORY_NOT_REGISTERED)
    _sync_all(p)  # no copy or kernel in flight may still use it (any stream, any device: mapped memory)
    p.backend.host_unregister(a[0], r.size)
    host_pages.unmap_later(a[0], r.size, r.fd)


def STAGING(p: Any, ch: Any, a: tuple[int, ...], payload: bytes) -> tuple[tuple[int, ...], bytes]:
    """A channel's staging buffer: a new memfd, or (a[1], a[2]: its address here and the memfd's inode) one that
    a thread which ended left behind (reply 0: not known here, the shim sends a new one)."""
    size = a[0]
    if len(a) > 1 and a[1]:
        return (_reuse_staging(p, ch, size, a[1], a[2]),), b""
    fd = take_fd(ch)
    try:
        addr = libc.map_anywhere(fd, size)
    except OSError:
        os.close(fd)
        raise CudaError(MEMORY_ALLOCATION) from None
    p.backend.host_register(addr, size)
    _attach_staging(p, ch, addr, HostRange(size, fd, ch))
    return (addr,), b""


def _attach_staging(p: Any, ch: Any, addr: int, r: HostRange) -> None:
    if ch.staging is not None:
        release_staging(p, ch)
    r.channel = ch
    _set_staging(ch, (addr, r.size))
    p.state.host[addr] = r


def _reuse_staging(p: Any, ch: Any, size: int, addr: int, ino: int) -> int:
    st = p.state
    r = st.spare_staging.get(addr)
    old = None
    if r is None:  # its thread's channel may not have been seen closing yet: the shim is done with it
        r = st.host.get(addr)
        old = r.channel if r is not None else None
        if old is None or old is ch or old.staging != (addr, r.size):
            return 0
    if r.size != size or os.fstat(r.fd).st_ino != ino:  # (another proxy's buffer, met after a migration)
        return 0
    if old is not None:
        _posted_drain(p, old)
        _set_staging(old, None)
    st.spare_staging.pop(addr, None)
    _attach_staging(p, ch, addr, r)
    return addr


def _set_staging(ch: Any, staging: tuple[int, int] | None) -> None:
    ch.staging = staging
    if ch.fast is not None:
        ch.fast.staging_base, ch.fast.staging_size = staging or (0, 0)


def adopt_staging(p: Any, ch: Any, fd: int, size: int) -> None:
    """A channel handed over by another proxy brings its staging memfd."""
    addr = libc.map_anywhere(fd, size)
    p.backend.host_register(addr, size)
    _set_staging(ch, (addr, size))
    p.state.host[addr] = HostRange(size, fd, ch)


def release_staging(p: Any, ch: Any) -> None:
    """A channel's thread is gone (or took another buffer).  Every staged copy of it was waited for, so nothing
    still uses the buffer; it stays registered for the next thread: unregistering waits for the device and holds
    the driver meanwhile (a kernel spinning until another thread's call would never end)."""
    addr, size = ch.staging
    _posted_drain(p, ch)
    _set_staging(ch, None)
    r = p.state.host.pop(addr, None)
    if r is not None:
        r.channel, r.dev = None, ch.dev
        p.state.spare_staging[addr] = r


def drop_staging(p: Any, channels: Any = ()) -> None:
    """Unregister and unmap the spare staging buffers, and those of channels (whose threads' shim is about to drop
    them: DMTCP's checkpoint).  Only while the device is idle and the application held: a checkpoint."""
    for ch in channels:
        if ch.staging is not None:
            release_staging(p, ch)
    st = p.state
    while st.spare_staging:
        addr, r = st.spare_staging.popitem()
        try:
            p.backend.activate(r.dev)
            p.backend.host_unregister(addr, r.size)
        except CudaError:
            pass
        libc.unmap(addr, r.size)
        os.close(r.fd)


def copy_ring(p: Any, ch: Any) -> list[Any]:
    """The channel's ring of events that mark staged copies done, on its current device (an event is recorded
    on streams of its own device only: a thread that moved to another device gets another ring; the fast path
    takes from the same ring, at the same place)."""
    ring = ch.copy_rings.get(ch.dev)
    if ring is None:
        ring = ch.copy_rings[ch.dev] = [p.backend.event_create(ch.dev, 2) for _ in range(COPY_EVENTS)]  # no timing
    if ch.copy_events is not ring:
        ch.copy_events = ring
        if ch.fast is not None:
            for i, e in enumerate(ring):
                ch.fast.copy_events[i] = fastpath.ffi.cast("void *", p.backend.handle_value(e))
    return ring


def _copy_event(p: Any, ch: Any) -> Any:
    """The next of the channel's ring of copy events."""
    fc = ch.fast
    copy_ring(p, ch)
    if fc is None:
        i = ch.copy_event_next = ch.copy_event_next + 1
    else:
        i = fc.copy_next = (fc.copy_next + 1) & 0xFFFFFFFF
    return ch.copy_events[(i - 1) % COPY_EVENTS]


def _posted_drain(p: Any, ch: Any) -> None:
    """The channel's staging buffer changes hands: its posted copies must have read it.  (They are small and
    the host waits for them here, holding the dispatcher: a thread's end, a buffer taken over.)"""
    if ch.fast is not None and p.fast is not None:
        p.fast.posted_drain(ch.fast)


def posted_ring(p: Any, ch: Any) -> None:
    """C's ring of events marking the channel's posted copies done, on its current device (switched only once
    the copies in flight on the last device are done: C waits for those copies meanwhile)."""
    fc = ch.fast
    if fc is None or (fc.posted_events[0] != fastpath.ffi.NULL and fc.posted_dev == ch.dev):
        return
    p.fast.lib.nvpf_posted_advance(fc)
    if fc.posted_count:
        return
    ring = ch.posted_rings.get(ch.dev)
    if ring is None:
        ring = ch.posted_rings[ch.dev] = [p.backend.event_create(ch.dev, 2) for _ in range(fastpath.POSTED)]
    for i, e in enumerate(ring):
        fc.posted_events[i] = fastpath.ffi.cast("void *", p.backend.handle_value(e))
    fc.posted_dev = ch.dev


def STAGED_COPY(p: Any, ch: Any, a: tuple[int, ...], payload: bytes) -> Deferred | None:
    dev_addr, off, n, wire_stream, to_host = p.state.translate(a[0]), a[1], a[2], a[3], a[4]
    if ch.staging is None or off + n > ch.staging[1]:
        raise CudaError(INVALID_VALUE, "staged copy outside the staging buffer")
    host = ch.staging[0] + off
    s = p.stream(ch, wire_stream)
    if p.capturing(s):  # a graph would copy the staging slot, not the application's memory
        raise CudaError(STREAM_CAPTURE_UNSUPPORTED, "a pageable copy in a stream capture")
    if ch.fast is not None:
        # A posted copy (a[5]) comes here when C lacks what it needs: taught now, C takes the next.  This one is
        # answered once done, as every staged copy Python does (the shim learns so from a fence, or from C).
        if a[5] and not to_host:
            posted_ring(p, ch)
            if not a[6] & wire.CONSTANTS["NVP_STAGED_ASYNC"]:
                p.teach_sync_streams(ch.dev)
        p.fast.posted_order(ch.fast, lambda: p.backend.handle_value(s))  # (it may land where they still read)
    if to_host:
        p.backend.memcpy(host, dev_addr, n, s)
    elif a[6] & wire.CONSTANTS["NVP_STAGED_CAPTURE"]:  # (from the pinned memory itself, answered once done)
        p.backend.memcpy(dev_addr, a[7], n, s)
    else:
        p.backend.memcpy(dev_addr, host, n, s)
    if a[5] and not to_host and a[6] & wire.CONSTANTS["NVP_STAGED_UNANSWERED"]:
        # No reply waits for it: in flight in C's ring, as C's own (a fence, the mailbox's posted_done)
        if ch.fast is not None:
            p.fast.posted_push(ch.fast, p.backend.handle_value(s), a[5])
        else:  # (the shim sends such copies only after C answered one: not reached)
            p.backend.stream_sync(s)
        return None
    e = _copy_event(p, ch)
    p.backend.event_record(e, s, 0)
    return Deferred(lambda: p.backend.event_sync(e), lambda: p.backend.event_query(e))


def STAGED_FENCE(p: Any, ch: Any, a: tuple[int, ...], payload: bytes) -> Deferred | None:
    """Every posted copy of the channel up to number a[0] is done once this is answered (without the fast path
    no copy is posted: Python answers each once done)."""
    if ch.fast is None or p.fast is None:
        return None
    wait = p.fast.posted_fence(ch.fast, a[0])
    return None if wait is None else Deferred(wait)


def MEMCPY(p: Any, ch: Any, a: tuple[int, ...], payload: bytes) -> Deferred:
    s = p.stream(ch, a[3])
    p.backend.memcpy(p.state.translate(a[0]), p.state.translate(a[1]), a[2], s)
    return Deferred(lambda: p.backend.stream_sync(s), lambda: p.backend.stream_query(s))


def MEMCPY_2D(p: Any, ch: Any, a: tuple[int, ...], payload: bytes) -> Deferred:
    s = p.stream(ch, a[6])
    p.backend.memcpy2d(p.state.translate(a[0]), a[1], p.state.translate(a[2]), a[3], a[4], a[5], s)
    return Deferred(lambda: p.backend.stream_sync(s), lambda: p.backend.stream_query(s))


def MEMSET(p: Any, ch: Any, a: tuple[int, ...], payload: bytes) -> None:
    p.backend.memset(p.state.translate(a[0]), a[1], a[2], p.stream(ch, a[3]))


def MEMSET_2D(p: Any, ch: Any, a: tuple[int, ...], payload: bytes) -> None:
    p.backend.memset2d(p.state.translate(a[0]), a[1], a[2], a[3], a[4], p.stream(ch, a[5]))
