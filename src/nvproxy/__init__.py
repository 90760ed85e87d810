"""nvproxy: transparent checkpoint/restart for unmodified CUDA applications by
proxy-process API interposition."""

from __future__ import annotations

from pathlib import Path

__version__ = "0.1.0"


def shim_path() -> Path:
    """The LD_PRELOAD shim built with this package."""
    p = Path(__file__).resolve().parent / "_native" / "libnvproxy.so"
    if not p.exists():
        raise FileNotFoundError(f"{p} is missing: build the package first (pip install -e .)")
    return p
