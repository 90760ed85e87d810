"""CUDA channel formats (cudaChannelFormatDesc) as the driver and the sim take them."""

from __future__ import annotations

from typing import NamedTuple

from ..errors import CudaError

INVALID_CHANNEL_DESCRIPTOR = 20
SIGNED, UNSIGNED, FLOAT = 0, 1, 2  # cudaChannelFormatKind
# (kind, bits) -> CUarray_format
CU_FORMAT = {(SIGNED, 8): 0x08, (SIGNED, 16): 0x09, (SIGNED, 32): 0x0A, (UNSIGNED, 8): 0x01, (UNSIGNED, 16): 0x02,
             (UNSIGNED, 32): 0x03, (FLOAT, 16): 0x10, (FLOAT, 32): 0x20}
DTYPE = {(SIGNED, 8): "i1", (SIGNED, 16): "<i2", (SIGNED, 32): "<i4", (UNSIGNED, 8): "u1", (UNSIGNED, 16): "<u2",
         (UNSIGNED, 32): "<u4", (FLOAT, 16): "<f2", (FLOAT, 32): "<f4"}


class Format(NamedTuple):
    cu_format: int
    channels: int
    elem: int  # bytes per element
    dtype: str  # numpy dtype of one channel
    integer: bool


def channel_format(x: int, y: int, z: int, w: int, f: int) -> Format:
    """The format of an element with channels of x, y, z, w bits, of kind f; as the runtime, the
    channels are the leading non-zero ones, all of one width, 1, 2 or 4 of them."""
    bits = [b for b in (x, y, z, w) if b]
    n = len(bits)
    if n not in (1, 2, 4) or any(b != bits[0] for b in bits) or any((x, y, z, w)[n:]):
        raise CudaError(INVALID_CHANNEL_DESCRIPTOR, f"channel format {x},{y},{z},{w}")
    key = (f, bits[0])
    if key not in CU_FORMAT:
        raise CudaError(INVALID_CHANNEL_DESCRIPTOR, f"channel format kind {f} of {bits[0]} bits")
    return Format(CU_FORMAT[key], n, n * bits[0] // 8, DTYPE[key], f != FLOAT)
