"""Backends: what actually executes CUDA work for the proxy.

gpu: the real device (libcuda, through cffi).  sim: a CPU model for machines
without a GPU.  NVPROXY_BACKEND=gpu|sim chooses; by default the GPU is used
when a device is usable, else the sim backend.
"""

from __future__ import annotations

import os
import sys
from typing import Any


def open_backend(name: str | None = None) -> Any:
    name = name or os.environ.get("NVPROXY_BACKEND") or "auto"
    if name == "sim":
        from .sim import SimBackend

        return SimBackend()
    if name == "gpu":
        from .gpu import GpuBackend

        return GpuBackend()
    if name != "auto":
        raise SystemExit(f"nvproxy: unknown backend {name!r} (NVPROXY_BACKEND=gpu|sim)")
    error = None
    try:
        from .gpu import GpuBackend

        b = GpuBackend()
        if b.device_count() > 0:
            return b
    except Exception as e:  # no driver, no device, no cffi
        error = e
    from ..nogpu import reason

    print(f"nvproxy: no usable GPU: {reason(error)}; using the sim backend", file=sys.stderr)
    from .sim import SimBackend

    return SimBackend()
