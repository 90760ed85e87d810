"""Why the GPU backend cannot be used here, in words true on this machine (the proxy then uses the sim backend)."""

from __future__ import annotations

import ctypes
import os


def reason(error: BaseException | None) -> str:
    """What stands in the way: no driver, no device, or else what opening the backend raised."""
    try:
        ctypes.CDLL("libcuda.so.1")
    except OSError:
        return "no NVIDIA driver (libcuda.so.1 not found)"
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    where = f" with CUDA_VISIBLE_DEVICES={visible}" if visible is not None else ""
    if error is None:
        return f"the driver sees no GPU{where}"
    text = str(error).strip() or type(error).__name__
    if "no CUDA-capable device" in text or "CUDA_ERROR_NO_DEVICE" in text:
        return f"the driver sees no GPU{where}"
    return f"{type(error).__name__}: {text}"
