"""Initialising the driver, and making a restoring proxy's CUDA contexts, while the rest of the proxy starts.

Every proxy needs cuInit before its first answer, and a restore (DMTCP restart, NVPROXY_RECOVER) needs the
primary context of every device in its image before any memory can move (each as long as loading gigabytes of the
image).  Neither needs anything of the proxy, so a thread does them while the main thread imports pycuda and the
proxy's modules (about as long again) and opens the image.  A proxy that is not
restoring makes no context here: the application's first call chooses its device, as with the runtime.  The
backend's own cuInit and retain later find the work done (the driver serialises a retain that comes while another
is still making the context, so it is never made twice).  ctypes, not the cffi binding: it is loaded before
anything else and releases the GIL during the call.  Errors are left to the backend, which reports them where it
would.
"""

from __future__ import annotations

import ctypes
import threading
import time

# time.monotonic() when the thread began cuInit and when it had every context (0: not yet, or never)
began = ready = 0.0


def _retain(devices: list[int]) -> None:
    global began, ready
    began = time.monotonic()
    try:
        cuda = ctypes.CDLL("libcuda.so.1")
    except OSError:
        return  # no driver here: the sim backend, or the backend's own error
    if cuda.cuInit(0) != 0:
        return
    for index in devices:
        dev, ctx = ctypes.c_int(), ctypes.c_void_p()
        if cuda.cuDeviceGet(ctypes.byref(dev), index) == 0:
            cuda.cuDevicePrimaryCtxRetain(ctypes.byref(ctx), dev)  # (kept: the proxy uses it until it exits)
    ready = time.monotonic()


def start(devices: list[int]) -> threading.Thread:
    """cuInit, then the primary contexts of devices (indices as this process sees them), on a thread of its own."""
    t = threading.Thread(target=_retain, args=(sorted(set(devices)),), name="nvproxy-context", daemon=True)
    t.start()
    return t
