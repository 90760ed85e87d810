"""cudaError_t values the proxy reports, and the exception that carries them."""

from __future__ import annotations

SUCCESS = 0
INVALID_VALUE = 1
MEMORY_ALLOCATION = 2
INVALID_DEVICE = 101
INVALID_KERNEL_IMAGE = 200
INVALID_SYMBOL = 13
INVALID_DEVICE_FUNCTION = 98
NO_KERNEL_IMAGE = 209  # (cudaErrorNoKernelImageForDevice: a kernel with no code this device can run)
INVALID_RESOURCE_HANDLE = 400
SYMBOL_NOT_FOUND = 500
NOT_READY = 600
ILLEGAL_ADDRESS = 700
LAUNCH_OUT_OF_RESOURCES = 701
ALREADY_MAPPED = 208
ASSERT = 710
NOT_SUPPORTED = 801
HOST_MEMORY_ALREADY_REGISTERED = 712
HOST_MEMORY_NOT_REGISTERED = 713
ILLEGAL_STATE = 401
STREAM_CAPTURE_UNSUPPORTED = 900
STREAM_CAPTURE_INVALIDATED = 901
UNKNOWN = 999
# errors that leave the context unusable: every later call of the process fails with them
STICKY = frozenset({700, 702, 710, 714, 715, 716, 717, 718, 719})


class CudaError(Exception):
    """A CUDA failure, carrying the runtime's cudaError_t value."""

    def __init__(self, code: int, what: str = "") -> None:
        super().__init__(f"{what}: CUDA error {code}" if what else f"CUDA error {code}")
        self.code = code
