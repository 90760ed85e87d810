"""Initialising the driver, and making a restoring proxy's CUDA contexts, while the rest of the proxy starts.

Every proxy needs cuInit before its first answer, and a restore (DMTCP restart, NVPROXY_RECOVER) needs the
primary context of every device in its image before any memory can move (each as long as loading gigabytes of the
image).  Neither needs anything of the proxy, so a thread does them while the main thread imports the
proxy's modules (about as long again) and opens the image.  A proxy that is not
restoring makes device 0's primary context here too, a spare: most programs' first call needs it, and making it
is most of a native program's start.  The backend releases the spare once it holds its own first context, so a
program that chooses another device keeps no context on device 0 (spare_done).  The
backend's own cuInit and retain later find the work done (the driver serialises a retain that comes while another
is still making the context, so it is never made twice).  ctypes, not the cffi binding: it is loaded before
anything else and releases the GIL during the call.  Errors are left to the backend, which reports them where it
would.
"""

from __future__ import annotations

import ctypes
import threading
import time

COMPUTE_MODE = 20  # CU_DEVICE_ATTRIBUTE_COMPUTE_MODE (0: default, shared)
# time.monotonic() when the thread began cuInit and when it had every context (0: not yet, or never)
began = ready = 0.0
_thread: threading.Thread | None = None
_spare: tuple[ctypes.CDLL, ctypes.c_int] | None = None  # (libcuda, device) of the spare context, while retained
_spare_lock = threading.Lock()


def _retain(devices: list[int], spare: bool) -> None:
    global began, ready, _spare
    began = time.monotonic()
    try:
        cuda = ctypes.CDLL("libcuda.so.1")
    except OSError:
        return  # no driver here: the sim backend, or the backend's own error
    if cuda.cuInit(0) != 0:
        return
    for index in devices or ([0] if spare else []):
        dev, ctx, mode = ctypes.c_int(), ctypes.c_void_p(), ctypes.c_int()
        if cuda.cuDeviceGet(ctypes.byref(dev), index) != 0:
            continue
        if not devices and (cuda.cuDeviceGetAttribute(ctypes.byref(mode), COMPUTE_MODE, dev) != 0 or mode.value):
            continue  # (an exclusive or prohibited device: a spare context would keep others off it, or fail)
        if cuda.cuDevicePrimaryCtxRetain(ctypes.byref(ctx), dev) == 0 and not devices:
            _spare = (cuda, dev)  # (a restore's contexts are kept: the proxy uses them until it exits)
    ready = time.monotonic()


def start(devices: list[int], spare: bool = True) -> threading.Thread:
    """cuInit, then the primary contexts of devices (indices as this process sees them), or where there are none
    and spare, device 0's as a spare, on a thread of its own."""
    global _thread
    _thread = threading.Thread(target=_retain, args=(sorted(set(devices)), spare), name="nvproxy-context",
                               daemon=True)
    _thread.start()
    return _thread


def wait() -> None:
    """Until the thread has done its work (at once where it never started)."""
    if _thread is not None:
        _thread.join()


def spare_done() -> None:
    """The backend holds a context of its own now: the spare goes (the context stays while the backend holds it)."""
    global _spare
    wait()
    with _spare_lock:
        if _spare is not None:
            cuda, dev = _spare
            _spare = None
            cuda.cuDevicePrimaryCtxRelease(dev)
