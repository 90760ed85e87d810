"""Python implementations of kernels for the sim backend.

The sim backend cannot run GPU code.  A program's kernels run there only if a
Python implementation is registered under the kernel's name; NVPROXY_SIM_KERNELS
lists files (separated by ':') that register them:

    from nvproxy.sim_kernels import kernel

    @kernel("vecAdd")                       # plain or mangled name
    def vec_add(ctx, a, b, c, n):           # parameters as laid out in the cubin
        n = ctx.i32(n)
        ctx.array(c, "f4", n)[:] = ctx.array(a, "f4", n) + ctx.array(b, "f4", n)

Parameters of 1, 2, 4 or 8 bytes arrive as unsigned integers (pointers are
device addresses), larger ones as bytes; ctx converts and gives array views.
"""

from __future__ import annotations

import importlib.util
import os
import re
import struct
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from .errors import ILLEGAL_ADDRESS, CudaError

KernelFn = Callable[..., None]
_registry: dict[str, KernelFn] = {}
_MANGLED = re.compile(r"_Z(\d+)(\w+)")


def kernel(name: str) -> Callable[[KernelFn], KernelFn]:
    def deco(fn: KernelFn) -> KernelFn:
        _registry[name] = fn
        return fn

    return deco


def plain_name(mangled: str) -> str:
    """The identifier of a simple Itanium-mangled name (_Z6vecAddPfi -> vecAdd)."""
    m = _MANGLED.match(mangled)
    if not m:
        return mangled
    n = int(m.group(1))
    return m.group(2)[:n]


def lookup(name: str) -> KernelFn | None:
    return _registry.get(name) or _registry.get(plain_name(name))


def load_from_env() -> None:
    for i, path in enumerate(p for p in os.environ.get("NVPROXY_SIM_KERNELS", "").split(os.pathsep) if p):
        spec = importlib.util.spec_from_file_location(f"nvproxy_sim_kernels_{i}", Path(path))
        if spec is None or spec.loader is None:
            print(f"nvproxy: cannot load sim kernels from {path}", file=sys.stderr)
            continue
        mod = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(mod)


class DeviceAssert(Exception):
    pass


class KernelContext:
    """What a sim kernel sees: launch geometry and device memory."""

    def __init__(self, mem: Any, grid: tuple[int, int, int], block: tuple[int, int, int], shmem: int,
                 printf: Callable[[str], None], symbols: dict[str, tuple[int, int]],
                 objects: dict[int, Any] | None = None, conditionals: dict[int, int] | None = None) -> None:
        self._mem = mem
        self._objects = objects or {}
        self._conditionals = conditionals if conditionals is not None else {}
        self._symbols = symbols
        self.grid = grid
        self.block = block
        self.shmem = shmem
        self._printf = printf

    @property
    def threads(self) -> int:
        g, b = self.grid, self.block
        return g[0] * g[1] * g[2] * b[0] * b[1] * b[2]

    def array(self, ptr: int, dtype: str, count: int) -> np.ndarray:
        dt = np.dtype(dtype)
        return np.frombuffer(self._mem.view(ptr, count * dt.itemsize), dtype=dt)

    def symbol(self, name: str) -> int:
        """Device address of a module variable (__device__/__constant__) of the kernel's module."""
        return self._symbols[name][0]

    def set_conditional(self, handle: int, value: int) -> None:
        """cudaGraphSetConditional."""
        self._conditionals[handle] = value & 0xFFFFFFFF

    def texture(self, obj: int) -> Any:
        """A texture object: .sample(x[, y[, z]]) with arrays of coordinates (tex1D/2D/3D, point
        filtering), .fetch(i) (tex1Dfetch), .texels() (the elements it reads)."""
        o = self._objects.get(obj)
        if o is None or o.surface:
            raise CudaError(ILLEGAL_ADDRESS, f"sim: {obj:#x} is no texture object")
        return o

    def surface(self, obj: int) -> np.ndarray:
        """A surface object's array, writable: [depth, height,] width[, channels] (surf*Dwrite)."""
        o = self._objects.get(obj)
        if o is None or not o.surface:
            raise CudaError(ILLEGAL_ADDRESS, f"sim: {obj:#x} is no surface object")
        return o.res[1].elements()

    def read(self, ptr: int, n: int) -> bytes:
        return bytes(self._mem.view(ptr, n))

    def write(self, ptr: int, data: bytes) -> None:
        self._mem.view(ptr, len(data))[:] = data

    def printf(self, text: str) -> None:
        self._printf(text)

    def device_assert(self, cond: bool, message: str) -> None:
        if not cond:
            raise DeviceAssert(message)

    @staticmethod
    def i32(v: int) -> int:
        return struct.unpack("<i", struct.pack("<I", v & 0xFFFFFFFF))[0]

    @staticmethod
    def i64(v: int) -> int:
        return struct.unpack("<q", struct.pack("<Q", v))[0]

    @staticmethod
    def f32(v: int) -> float:
        return struct.unpack("<f", struct.pack("<I", v & 0xFFFFFFFF))[0]

    @staticmethod
    def f64(v: int) -> float:
        return struct.unpack("<d", struct.pack("<Q", v))[0]
