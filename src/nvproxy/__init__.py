"""nvproxy: transparent checkpoint/restart for unmodified CUDA applications by
proxy-process API interposition."""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from pathlib import Path

__version__ = "0.1.0"


def shim_path() -> Path:
    """The LD_PRELOAD shim built with this package."""
    from pathlib import Path  # (here: a proxy imports this package before it starts the driver)

    p = Path(__file__).resolve().parent / "_native" / "libnvproxy.so"
    if not p.exists():
        raise FileNotFoundError(f"{p} is missing: build the package first (pip install -e .)")
    return p


def libcuda_name_path() -> Path:
    """The empty library named libcuda.so.1, preloaded after the shim (native/soname/libcuda_name.c)."""
    return shim_path().with_name("libnvproxy_cuda.so")


def preload() -> str:
    """LD_PRELOAD's entries for a program run through nvproxy: the shim, then libcuda.so.1's name."""
    return f"{shim_path()}:{libcuda_name_path()}"
