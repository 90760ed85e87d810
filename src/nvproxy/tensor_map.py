"""Tensor-map descriptors (cuTensorMapEncodeTiled, cuTensorMapEncodeIm2col): their arguments as the shim sends
them, and the checks the driver makes of them, for a backend without a driver of its own (sim) to answer as the
driver would."""

from __future__ import annotations

import struct
from dataclasses import dataclass

from .errors import INVALID_VALUE, CudaError

# bytes per element, by CUtensorMapDataType (the packed 4- and 6-bit types: their 16-element groups' bytes / 16)
ELEMENT_BYTES = (1, 2, 4, 4, 8, 8, 2, 4, 8, 2, 4, 4, 4, 1, 1, 1)
FLOAT_TYPES = frozenset({6, 7, 8, 9, 10, 11, 12})
SWIZZLE_BYTES = {0: 0, 1: 32, 2: 64, 3: 128, 4: 128, 5: 128, 6: 128}
SIZE = 128


@dataclass(frozen=True)
class TensorMapArgs:
    im2col: bool
    data_type: int
    rank: int
    address: int
    dims: tuple[int, ...]
    strides: tuple[int, ...]
    box: tuple[int, ...]
    elem_strides: tuple[int, ...]
    lower: tuple[int, ...]
    upper: tuple[int, ...]
    channels: int
    pixels: int
    interleave: int
    swizzle: int
    l2_promotion: int
    oob_fill: int


def check(t: TensorMapArgs) -> None:
    """CudaError(INVALID_VALUE) where the driver documents a requirement the arguments miss."""
    r = t.rank
    ok = t.data_type < len(ELEMENT_BYTES) and t.interleave <= 2 and t.swizzle in SWIZZLE_BYTES
    ok = ok and t.l2_promotion <= 3 and t.oob_fill <= 1 and (1 if not t.im2col else 3) <= r <= 5
    ok = ok and not (t.interleave and r < 3) and not (t.oob_fill and t.data_type not in FLOAT_TYPES)
    ok = ok and t.address != 0 and t.address % (32 if t.interleave == 2 else 16) == 0
    ok = ok and all(0 < d <= 1 << 32 for d in t.dims[:r]) and all(0 < e <= 8 for e in t.elem_strides[:r])
    ok = ok and all(s % (32 if t.interleave == 2 else 16) == 0 and 0 < s < 1 << 40 for s in t.strides[: r - 1])
    if not ok:
        raise CudaError(INVALID_VALUE)
    elem = ELEMENT_BYTES[t.data_type]
    inner = (t.channels if t.im2col else t.box[0]) * elem  # (bytes of a box's innermost dimension)
    if t.im2col:
        ok = 0 < t.channels <= 256 and 0 < t.pixels <= 1024
        spatial = r - 2
        span = 1 << {1: 15, 2: 7, 3: 4}[spatial]  # (a corner's coordinates lie in [-span, span))
        ok = ok and all(-span <= c < span for c in t.lower[:spatial] + t.upper[:spatial])
    else:
        ok = all(0 < b <= 256 for b in t.box[:r])
    if t.interleave == 0:
        ok = ok and inner % 16 == 0 and (not SWIZZLE_BYTES[t.swizzle] or inner <= SWIZZLE_BYTES[t.swizzle])
    elif t.interleave == 2:
        ok = ok and t.swizzle == 1
    if not ok:
        raise CudaError(INVALID_VALUE)


def encode(t: TensorMapArgs) -> bytes:
    """A descriptor for a backend whose kernels read it themselves (sim): the arguments, checked, in 128 bytes."""
    check(t)
    body = struct.pack("<8sQ6B5Q4Q5B5B6hHH", b"NVPSIMTM", t.address, int(t.im2col), t.data_type, t.rank,
                       t.interleave, t.swizzle, t.l2_promotion * 2 + t.oob_fill, *t.dims, *t.strides,
                       *(b - 1 if b else 0 for b in t.box), *t.elem_strides, *t.lower, *t.upper, t.channels,
                       t.pixels)
    return body.ljust(SIZE, b"\0")
