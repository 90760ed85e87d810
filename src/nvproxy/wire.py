"""The wire format, read from native/include/nvproxy_wire.h through cffi.

The C header is the only definition: this module parses its CDEF block, so
message layouts and operation numbers cannot drift between shim and proxy.
Hot paths use precompiled struct.Struct objects derived from cffi's layout.
"""

from __future__ import annotations

import re
import struct
from importlib import resources
from pathlib import Path

from .ffi_prebuilt import load


def header_text(name: str = "nvproxy_wire.h", folder: str = "include") -> str:
    """A C header of native/<folder>, as packaged (or from a source checkout)."""
    packaged = resources.files("nvproxy").joinpath(f"include/{name}")
    if packaged.is_file():
        return packaged.read_text()
    return (Path(__file__).resolve().parents[2] / "native" / folder / name).read_text()


def cdef_block(text: str) -> str:
    start, end = text.index("/* CDEF-BEGIN */"), text.index("/* CDEF-END */")
    return text[start + len("/* CDEF-BEGIN */") : end]


HEADER = header_text()
CDEF = cdef_block(HEADER)
ffi = load("wire", CDEF)
_lib = ffi.dlopen(None)

def defines(block: str, prefix: str) -> dict[str, int]:
    """The integer #defines of a CDEF block whose names start with prefix."""
    return {name: int(value, 0) for name, value in re.findall(rf"#define\s+({prefix}\w+)\s+(\S+)", block)}


CONSTANTS: dict[str, int] = defines(cdef_block(HEADER), "NVP_")
globals().update(CONSTANTS)
OP_NAMES: dict[int, str] = {v: k[len("NVP_OP_") :] for k, v in CONSTANTS.items() if k.startswith("NVP_OP_")}


def _check(name: str, fmt: str) -> struct.Struct:
    s = struct.Struct(fmt)
    if s.size != ffi.sizeof(name):
        raise RuntimeError(f"wire layout of {name} disagrees with the header ({s.size} != {ffi.sizeof(name)})")
    return s


# struct nvp_req: len, op, flags, seq, a[8]
REQ = _check("struct nvp_req", "<IHHQ8Q")
# struct nvp_rep: len, err, async_err, text_len, r[4]
REP = _check("struct nvp_rep", "<IiiI4Q")
# struct nvp_cb: len, status, id, stream
CB = _check("struct nvp_cb", "<IiQQ")
PARAM = _check("struct nvp_param", "<II")
KERNEL_INFO = _check("struct nvp_kernel_info", "<II10i")
ARRAY_DESC = _check("struct nvp_array_desc", "<3Q5iI")  # width, height, depth, format x y z w f, flags
COPY_SIDE = "7Q"  # kind, addr, pitch, rows, x, y, z
COPY_3D = _check("struct nvp_copy3d", f"<{COPY_SIDE}{COPY_SIDE}3Q")
# res type, pad, res, format x y z w f, pad, size, width, height, pitch, address[3], filter, read mode, sRGB,
# border[4], normalized, max anisotropy, mipmap filter, bias, min, max, no trilinear, seamless
TEX_CREATE = _check("struct nvp_tex_create", "<iiQ5ii4Q6i4fiIi3f2i")
TEX_FIELDS = ("res_type", "_pad", "res", "x", "y", "z", "w", "f", "_pad2", "size", "width", "height", "pitch",
              "address0", "address1", "address2", "filter", "read_mode", "srgb", "border0", "border1", "border2",
              "border3", "normalized", "max_aniso", "mip_filter", "mip_bias", "mip_min", "mip_max", "no_trilinear",
              "seamless")
# data type, rank, address, dims[5], strides[4], box[5], element strides[5], lower[3], upper[3], channels, pixels,
# interleave, swizzle, L2 promotion, OOB fill
TENSOR_MAP = _check("struct nvp_tensor_map", "<IIQ5Q4Q5I5I3i3iII4I")
DEVICE_INFO_SIZE: int = ffi.sizeof("struct nvp_device_info")
MAX_ATTR: int = CONSTANTS["NVP_MAX_ATTR"]


def pack_device_info(
    name: str, uuid: bytes, total_mem: int, arena_base: int, arena_size: int, attrs: list[int]
) -> bytes:
    info = ffi.new("struct nvp_device_info *")
    raw = name.encode()[:255]
    ffi.memmove(info.name, raw, len(raw))
    ffi.memmove(info.uuid, uuid[:16], min(16, len(uuid)))
    info.total_mem = total_mem
    info.arena_base = arena_base
    info.arena_size = arena_size
    for i, v in enumerate(attrs[:MAX_ATTR]):
        info.attr[i] = v
    return bytes(ffi.buffer(info))


def pack_reply(err: int, async_err: int = 0, r: tuple[int, ...] = (), payload: bytes = b"", text: bytes = b"") -> bytes:
    rr = (tuple(x & 0xFFFFFFFFFFFFFFFF for x in r) + (0, 0, 0, 0))[:4]
    return REP.pack(REP.size + len(text) + len(payload), err, async_err, len(text), *rr) + text + payload
