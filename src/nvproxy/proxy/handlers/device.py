"""Device management, context settings and synchronisation."""

from __future__ import annotations

import struct
from typing import Any

from ... import wire
from ...errors import INVALID_DEVICE, CudaError
from ..server import Deferred
from . import memory

NO_FLAGS = (1 << 64) - 1


def DEVICE_INFO(p: Any, ch: Any, a: tuple[int, ...], payload: bytes) -> tuple[tuple[int, ...], bytes]:
    name, uuid, total, attrs = p.state.props(a[0])
    d = p.state.devices.get(a[0])
    base, size = (d.arena.base, d.arena.size) if d else p.state.arena_plan(a[0])
    return (), wire.pack_device_info(name, uuid, total, base, size, attrs)


def SET_DEVICE(p: Any, ch: Any, a: tuple[int, ...], payload: bytes) -> None:
    if not 0 <= a[0] < p.backend.device_count():
        raise CudaError(INVALID_DEVICE)
    p.state.device(a[0])
    ch.dev = a[0]
    p.backend.activate(ch.dev)
    if ch.copy_events:  # (the fast path's staged copies on the new device use its own events)
        memory.copy_ring(p, ch)


def DEVICE_SYNC(p: Any, ch: Any, a: tuple[int, ...], payload: bytes) -> Deferred:
    dev = ch.dev
    return Deferred(lambda: p.backend.device_sync(dev), lambda: p.device_idle(dev) and _synced(p, dev))


def _synced(p: Any, dev: int) -> bool:
    """The synchronisation itself, done here (the device is idle: it returns at once): it is what makes
    the driver write the kernels' printf output."""
    p.backend.device_sync(dev)
    return True


def DEVICE_RESET(p: Any, ch: Any, a: tuple[int, ...], payload: bytes) -> None:
    """Waits for the device and frees every allocation of the process on it."""
    p.backend.device_sync(ch.dev)
    p.forget()
    d = p.state.device(ch.dev)
    with p.state.arena_lock:
        for ptr in list(d.arena.allocs):
            if ptr not in p.state.freeing:
                d.arena.free(ptr)
        d.arena.trim()


def SET_LIMIT(p: Any, ch: Any, a: tuple[int, ...], payload: bytes) -> None:
    p.backend.set_limit(a[0], a[1])
    p.state.limits.setdefault(ch.dev, {})[a[0]] = a[1]


def GET_LIMIT(p: Any, ch: Any, a: tuple[int, ...], payload: bytes) -> tuple[tuple[int, ...], bytes]:
    return (p.backend.get_limit(a[0]),), b""


def STREAM_PRIORITY_RANGE(p: Any, ch: Any, a: tuple[int, ...], payload: bytes) -> tuple[tuple[int, ...], bytes]:
    least, greatest = p.backend.priority_range()
    return (least & 0xFFFFFFFF, greatest & 0xFFFFFFFF), b""


def CACHE_CONFIG(p: Any, ch: Any, a: tuple[int, ...], payload: bytes) -> tuple[tuple[int, ...], bytes] | None:
    if a[0] == 0:
        p.backend.set_cache_config(a[1])
    elif a[0] == 1:
        return (p.backend.get_cache_config(),), b""
    else:
        p.backend.func_set_cache(p.state.kernel(ch.dev, a[2]), a[1])
    return None


def PEER(p: Any, ch: Any, a: tuple[int, ...], payload: bytes) -> tuple[tuple[int, ...], bytes]:
    """Peer access: a[0] 0 can-access, 1 enable, 2 disable, 3 grant only (a pool's access: the device's arena).
    The arena's memory is the driver's VMM memory, which a context's peer access does not reach: enabling
    also grants the current device access to every mapping of the peer's arena, now and later (kept for a
    restore); disabling leaves those grants (the memory stays reachable, a lenience)."""
    dev = a[3] if a[0] in (0, 3) else ch.dev
    r = p.backend.peer(a[0], dev, a[1]) if a[0] != 3 else 0
    if a[0] in (1, 3) and dev != a[1]:
        p.state.grant_peer(dev, a[1])
    return (r,), b""


def PROFILER(p: Any, ch: Any, a: tuple[int, ...], payload: bytes) -> None:
    p.backend.profiler(bool(a[0]))


def FLUSH(p: Any, ch: Any, a: tuple[int, ...], payload: bytes) -> None:
    return None


def float_bits(x: float) -> int:
    return struct.unpack("<I", struct.pack("<f", x))[0]
