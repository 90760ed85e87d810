"""__managed__ variables.

The driver gives a module's managed variable storage of its own in the proxy,
which the application cannot map; kernels address that storage directly.  So
the application's view of the variable is managed memory of nvproxy's (shared
host memory at the same address in both processes, as for cudaMallocManaged),
and the two are kept coherent at the points CUDA defines: a kernel launch (or a
graph launch) first copies the application's value to the device if the
application changed it since the device's value last came back (compared with a
pinned shadow), and after the kernel, in stream order, copies the device's value
back to the application and to the shadow.  So a program sees its kernels'
writes once it synchronised with them, and kernels see its writes made before
the launch, as natively.  While a process has managed variables, every launch
goes through Python (the C fast path is off)."""

from __future__ import annotations

import ctypes
import os
from dataclasses import dataclass
from typing import Any

from ..errors import INVALID_VALUE, CudaError
from . import libc

SHADOW_PAGE = 4096


@dataclass
class ManagedVar:
    dev: int
    module: int
    name: str
    host: int  # the application's copy (managed memory of nvproxy's)
    size: int
    device: int = 0  # the driver's storage of the variable
    shadow: int = 0  # pinned: the device's value as it last came back
    dirty: bool = True  # copy the application's value to the device at the next launch, whatever the shadow says

    def key(self) -> list[Any]:
        return [self.dev, self.module, self.name, self.host, self.size]


def bind(state: Any, v: ManagedVar) -> None:
    """Find the variable's storage in its module (loaded on v.dev) and give it a shadow.  (The caller turns the
    fast path off: Dispatcher.captures_changed.)"""
    be = state.backend
    be.activate(v.dev)
    v.device, n = be.global_get(state.module(v.dev, v.module), v.name)
    if n != v.size or v.size > SHADOW_PAGE:
        raise CudaError(INVALID_VALUE, f"managed variable {v.name}: {n} bytes in the module, {v.size} registered")
    fd = os.memfd_create("nvproxy-managed-shadow", os.MFD_CLOEXEC)
    try:
        os.ftruncate(fd, SHADOW_PAGE)
        v.shadow = libc.map_anywhere(fd, SHADOW_PAGE)
    finally:
        os.close(fd)
    be.host_register(v.shadow, SHADOW_PAGE)
    state.managed_vars.append(v)


def before_launch(p: Any, dev: int, s: Any) -> None:
    """The application's changes, to the device, ahead of the work on stream s."""
    for v in p.state.managed_vars:
        if v.dev == dev and (v.dirty or ctypes.string_at(v.host, v.size) != ctypes.string_at(v.shadow, v.size)):
            p.backend.memcpy(v.device, v.host, v.size, s)
            ctypes.memmove(v.shadow, v.host, v.size)
            v.dirty = False


def after_launch(p: Any, dev: int, s: Any) -> None:
    """The device's values back, in stream order after the work on s."""
    for v in p.state.managed_vars:
        if v.dev == dev:
            p.backend.memcpy(v.host, v.device, v.size, s)
            p.backend.memcpy(v.shadow, v.device, v.size, s)


def describe(state: Any) -> dict[str, Any]:
    return {"managed_vars": [v.key() for v in state.managed_vars]}


def restore(state: Any, header: dict[str, Any]) -> None:
    """Bind a restored process's managed variables again (their modules are loaded); the application's copy,
    which it kept, goes to the device at the next launch."""
    for dev, module, name, host, size in header.get("managed_vars", []):
        bind(state, ManagedVar(dev, module, name, host, size))
