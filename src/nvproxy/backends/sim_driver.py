"""The sim backend's answers to driver API requests that a real driver computes (proxy/handlers/driver.py):
stream memory operations, linking at run time, tensor maps."""

from __future__ import annotations

import struct
import sys
from collections.abc import Callable

from .. import fatbin
from ..errors import INVALID_KERNEL_IMAGE, INVALID_VALUE, NOT_SUPPORTED, CudaError

INVALID_PTX = 218  # (CUDA_ERROR_INVALID_PTX, cudaErrorInvalidPtx)
INPUT_CUBIN, INPUT_PTX, INPUT_FATBINARY, INPUT_OBJECT, INPUT_LIBRARY = range(5)
MEMOPS = ("cuStreamWriteValue32", "cuStreamWriteValue64", "cuStreamWaitValue32", "cuStreamWaitValue64")


def _waited(kind: int, have: int, value: int, flags: int) -> bool:
    bits = 64 if kind == 3 else 32
    mask = (1 << bits) - 1
    how = flags & 3
    if how == 0:  # GEQ: (signed)(*addr - value) >= 0
        return ((have - value) & mask) < 1 << (bits - 1)
    if how == 1:
        return have == value
    if how == 2:
        return bool(have & value)
    return bool(~(have | value) & mask)


def stream_memop(view: Callable[[int, int], memoryview], kind: int, addr: int, value: int, flags: int) -> None:
    """Run at once, as the sim runs all stream work: a write stores; a wait finds its value there or fails (a
    later write that would release it cannot come first)."""
    fmt = "<Q" if kind in (1, 3) else "<I"
    v = view(addr, struct.calcsize(fmt))
    if kind < 2:
        v[:] = struct.pack(fmt, value)
        return
    (have,) = struct.unpack(fmt, v)
    if not _waited(kind, have, value, flags):
        print(f"nvproxy(sim): {MEMOPS[kind]} at {addr:#x} would wait: the sim backend runs stream work as it "
              "comes and cannot wait for a later write", file=sys.stderr)
        raise CudaError(NOT_SUPPORTED)


def _entry(kind: int, data: bytes) -> bytes:
    padded = data + b"\0" * (-len(data) % 8)
    head = bytearray(64)
    struct.pack_into("<HHIQ", head, 0, kind, 0x101, 64, len(padded))
    struct.pack_into("<Q", head, 56, len(data))
    return bytes(head) + padded


def link(inputs: list[tuple[int, str, bytes]]) -> bytes:
    """What a link gives the sim: the single input with code, as it is, or a fatbinary holding every input's
    cubins and PTX (the sim runs kernels by name, so linking them is only gathering them).  Libraries bring no
    code the sim could run."""
    entries: list[tuple[int, bytes]] = []
    for kind, name, data in inputs:
        try:
            if kind == INPUT_PTX:
                text = data.rstrip(b"\0")
                if b".version" not in text or b".target" not in text:
                    raise CudaError(INVALID_PTX, f"sim: {name or 'input'} is not PTX")
                entries.append((fatbin.KIND_PTX, text + b"\0"))
            elif kind in (INPUT_CUBIN, INPUT_OBJECT):
                fatbin.parse_cubin(data)
                entries.append((fatbin.KIND_ELF, data))
            elif kind == INPUT_FATBINARY:
                entries += [(e.kind, e.data) for e in fatbin.entries(data)]
            elif kind == INPUT_LIBRARY:
                if not data.startswith(b"!<arch>\n"):
                    raise CudaError(INVALID_KERNEL_IMAGE, f"sim: {name or 'input'} is not a library")
            else:
                raise CudaError(INVALID_VALUE)
        except fatbin.FatbinError as e:
            raise CudaError(INVALID_KERNEL_IMAGE, f"sim: {name or 'input'}: {e}") from None
    if not entries:
        raise CudaError(INVALID_KERNEL_IMAGE, "sim: nothing to link")
    if len(entries) == 1:
        return entries[0][1]
    body = b"".join(_entry(k, d) for k, d in entries)
    return struct.pack("<IHHQ", fatbin.FATBIN_MAGIC, 1, 16, len(body)) + body
