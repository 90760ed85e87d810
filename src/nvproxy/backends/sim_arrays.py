"""The sim backend's CUDA arrays and texture/surface objects.

An array is its elements in row-major order; a texture object samples one with
point filtering (nearest texel) and the wrap, clamp, mirror and border address
modes, in element or normalized coordinates; a surface object is a writable
view of an array.  Linear filtering is not modelled (the hardware's 9-bit
fixed-point weights would have to be): creating such a texture fails loudly."""

from __future__ import annotations

import sys
from typing import Any

import numpy as np

from ..errors import INVALID_VALUE, NOT_SUPPORTED, CudaError

WRAP, CLAMP, MIRROR, BORDER = 0, 1, 2, 3  # cudaTextureAddressMode
POINT = 0  # cudaFilterModePoint
ELEMENT_TYPE = 0  # cudaReadModeElementType


class SimArray:
    def __init__(self, width: int, height: int, depth: int, fmt: Any) -> None:
        self.fmt = fmt
        self.dims = 1 if height == 0 else 2 if depth == 0 else 3
        self.width, self.height, self.depth = width, max(height, 1), max(depth, 1)
        self.row = width * fmt.elem
        self.data = bytearray(self.row * self.height * self.depth)

    def rows(self, x: int, y: int, z: int, width: int) -> memoryview:
        """Bytes [x, x+width) of row y of slice z."""
        if x + width > self.row or y >= self.height or z >= self.depth:
            raise CudaError(INVALID_VALUE, "sim: copy outside the CUDA array")
        off = (z * self.height + y) * self.row + x
        return memoryview(self.data)[off : off + width]

    def elements(self) -> np.ndarray:
        """A writable view: [depth, height,] width[, channels], as many axes as the array has."""
        shape = (self.depth, self.height, self.width)[3 - self.dims :]
        a = np.frombuffer(self.data, dtype=self.fmt.dtype).reshape(*shape, self.fmt.channels)
        return a[..., 0] if self.fmt.channels == 1 else a


class SimObject:
    """A texture or surface object: what it reads and how."""

    def __init__(self, surface: bool, res: tuple[Any, ...], tex: dict[str, Any] | None, mem: Any) -> None:
        self.surface, self.res, self.tex, self.mem = surface, res, tex, mem
        if tex is not None and tex["filter"] != POINT:
            print("nvproxy(sim): linear texture filtering is not modelled by the sim backend", file=sys.stderr)
            raise CudaError(NOT_SUPPORTED, "sim: linear filtering")

    def texels(self) -> np.ndarray:
        kind, fmt = self.res[0], self.res[2]
        if kind == "array":
            return self.res[1].elements()
        if kind == "linear":
            n = self.res[3] // fmt.elem
            a = np.frombuffer(self.mem.view(self.res[1], n * fmt.elem), dtype=fmt.dtype).reshape(n, fmt.channels)
        else:
            _k, addr, _f, width, height, pitch = self.res
            raw = np.frombuffer(self.mem.view(addr, pitch * height), dtype=np.uint8).reshape(height, pitch)
            a = raw[:, : width * fmt.elem].copy().view(fmt.dtype).reshape(height, width, fmt.channels)
        return a[..., 0] if fmt.channels == 1 else a

    def fetch(self, i: Any) -> np.ndarray:
        """tex1Dfetch: element i of a linear texture (0 outside it)."""
        t = self.texels()
        i = np.asarray(i, dtype=np.int64)
        ok = (i >= 0) & (i < t.shape[0])
        out = t[np.clip(i, 0, t.shape[0] - 1)]
        return self._read(np.where(ok.reshape(ok.shape + (1,) * (out.ndim - ok.ndim)), out, 0))

    def sample(self, *coords: Any) -> np.ndarray:
        """tex1D/tex2D/tex3D with point filtering at coordinates (x[, y[, z]]), arrays of any shape."""
        t = self.texels()
        dims = len(coords)
        sizes = t.shape[:dims][::-1]  # (width, height, depth)
        idx, ok = [], None
        for c, n, mode in zip(coords, sizes, (self.tex[f"address{k}"] for k in range(3)), strict=False):
            c = np.asarray(c, dtype=np.float32)
            if self.tex["normalized"]:
                c = c * np.float32(n)
            i = np.floor(c).astype(np.int64)
            if mode == WRAP and self.tex["normalized"]:
                i = np.mod(i, n)
            elif mode == MIRROR and self.tex["normalized"]:
                i = np.mod(i, 2 * n)
                i = np.where(i >= n, 2 * n - 1 - i, i)
            elif mode == BORDER:
                inside = (i >= 0) & (i < n)
                ok = inside if ok is None else ok & inside
            idx.append(np.clip(i, 0, n - 1))
        out = t[tuple(idx[::-1])]
        if ok is not None:
            border = np.array([self.tex[f"border{k}"] for k in range(4)][: t.shape[-1] if t.ndim > dims else 1],
                              dtype=out.dtype)
            out = np.where(ok.reshape(ok.shape + (1,) * (out.ndim - ok.ndim)), out, border.reshape(out.shape[ok.ndim:]))
        return self._read(out)

    def _read(self, v: np.ndarray) -> np.ndarray:
        """Integers as they are (cudaReadModeElementType) or as floats in [0, 1] / [-1, 1]."""
        fmt = self.res[2]
        if not fmt.integer or self.tex["read_mode"] == ELEMENT_TYPE:
            return v
        info = np.iinfo(np.dtype(fmt.dtype))
        return np.maximum(v.astype(np.float32) / np.float32(info.max), np.float32(-1.0))
