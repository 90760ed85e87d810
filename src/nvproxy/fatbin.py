"""Reading nvcc fatbinaries without a GPU: kernels, their parameter layouts and
module variables.

A fatbinary is one or more containers (magic 0xBA55ED50); each holds entries
that are cubins (ELF) or PTX text, optionally zstd-compressed (flag 0x8000,
nvcc 13's default for PTX).  Parameter layouts come from each kernel's
`.nv.info.<kernel>` section (EIATTR_KPARAM_INFO records), or from the PTX
`.entry` declaration when there is no cubin.
"""

from __future__ import annotations

import re
import struct
from dataclasses import dataclass, field

from .ffi_prebuilt import load

FATBIN_MAGIC = 0xBA55ED50
KIND_PTX, KIND_ELF = 1, 2
FLAG_ZSTD = 0x8000
FLAG_LZ4 = 0x2000

# .nv.info attribute formats and the attributes read here
EIFMT_NVAL, EIFMT_BVAL, EIFMT_HVAL, EIFMT_SVAL = 1, 2, 3, 4
EIATTR_KPARAM_INFO = 0x17
EIATTR_CBANK_PARAM_SIZE = 0x19
EIATTR_MAX_THREADS = 0x05
EIATTR_KPARAM_INFO_V2 = 0x45

SHT_SYMTAB, SHT_NOBITS = 2, 8
STT_OBJECT, STT_FUNC = 1, 2
STT_CUDA_OBJECT = 13  # (a variable of a relocatable cubin, -rdc=true)


class FatbinError(Exception):
    pass


@dataclass
class Entry:
    kind: int
    arch: int
    flags: int
    data: bytes


@dataclass
class Kernel:
    name: str
    params: list[tuple[int, int]]  # (offset, size) in parameter order
    param_size: int
    num_regs: int = 0
    shared_static: int = 0
    max_threads: int = 1024


@dataclass
class Variable:
    name: str
    size: int
    init: bytes


@dataclass
class Module:
    kernels: dict[str, Kernel] = field(default_factory=dict)
    variables: dict[str, Variable] = field(default_factory=dict)


CDEF = ("size_t ZSTD_decompress(void *dst, size_t dstCapacity, const void *src, size_t compressedSize);"
        "unsigned ZSTD_isError(size_t code);")
_ffi = load("zstd", CDEF)
_zstd = None


def _unzstd(data: bytes, size: int) -> bytes:
    global _zstd
    if _zstd is None:
        try:
            _zstd = _ffi.dlopen("libzstd.so.1")
        except OSError as e:
            raise FatbinError("this fatbinary is zstd-compressed and libzstd.so.1 is not installed") from e
    out = _ffi.new("char[]", size)
    n = _zstd.ZSTD_decompress(out, size, data, len(data))
    if _zstd.ZSTD_isError(n):
        raise FatbinError("corrupt zstd-compressed fatbinary entry")
    return _ffi.buffer(out, n)[:]


def entries(image: bytes) -> list[Entry]:
    """All entries of all containers in image, decompressed."""
    out: list[Entry] = []
    off = 0
    while off + 16 <= len(image):
        magic, _ver, hsize, fsize = struct.unpack_from("<IHHQ", image, off)
        if magic != FATBIN_MAGIC:
            if out:
                break
            raise FatbinError(f"not a fatbinary (magic {magic:#x})")
        p, end = off + hsize, off + hsize + fsize
        if end > len(image):
            raise FatbinError("truncated fatbinary")
        while p + 64 <= end:
            kind, _v, ehsize, psize = struct.unpack_from("<HHIQ", image, p)
            (csize,) = struct.unpack_from("<I", image, p + 16)
            (arch,) = struct.unpack_from("<I", image, p + 28)
            (flags,) = struct.unpack_from("<Q", image, p + 40)
            (dsize,) = struct.unpack_from("<Q", image, p + 56)
            payload = image[p + ehsize : p + ehsize + psize]
            if flags & FLAG_ZSTD:
                payload = _unzstd(payload[:csize] if csize else payload, dsize)
            elif flags & FLAG_LZ4:
                raise FatbinError("LZ4-compressed fatbinary entries (flag 0x2000) are not supported; "
                                  "rebuild with nvcc 13")
            out.append(Entry(kind, arch, flags, payload))
            p += ehsize + psize
        off = (end + 7) & ~7
    return out


# ---- cubin (ELF) ----


def _sections(elf: bytes) -> list[tuple[str, int, int, int, int, int, int]]:
    if elf[:4] != b"\x7fELF":
        raise FatbinError("cubin is not an ELF image")
    (shoff,) = struct.unpack_from("<Q", elf, 0x28)
    shentsize, shnum, shstrndx = struct.unpack_from("<HHH", elf, 0x3A)
    raw = [struct.unpack_from("<IIQQQQIIQQ", elf, shoff + i * shentsize) for i in range(shnum)]
    stroff = raw[shstrndx][4]

    def name(o: int) -> str:
        return elf[stroff + o : elf.index(b"\0", stroff + o)].decode()

    # (name, type, offset, size, link, info, entsize)
    return [(name(s[0]), s[1], s[4], s[5], s[6], s[7], s[9]) for s in raw]


def _nv_info(data: bytes) -> list[tuple[int, int, bytes]]:
    recs, p = [], 0
    while p + 4 <= len(data):
        fmt, attr = data[p], data[p + 1]
        if fmt == EIFMT_SVAL:
            (size,) = struct.unpack_from("<H", data, p + 2)
            recs.append((fmt, attr, data[p + 4 : p + 4 + size]))
            p += 4 + size
        else:
            recs.append((fmt, attr, data[p + 2 : p + 4]))
            p += 4
    return recs


def _kernel_from_info(name: str, data: bytes) -> Kernel:
    params: dict[int, tuple[int, int]] = {}
    param_size = None
    max_threads = 1024
    for fmt, attr, val in _nv_info(data):
        if attr == EIATTR_KPARAM_INFO and len(val) >= 12:
            _idx, ordinal, offset, bits = struct.unpack_from("<IHHI", val)
            params[ordinal] = (offset, (bits >> 18) & 0x3FFF)
        elif attr == EIATTR_KPARAM_INFO_V2 and len(val) >= 12:
            _idx, ordinal, offset, size = struct.unpack_from("<IHHI", val)
            params[ordinal] = (offset, size)
        elif attr == EIATTR_CBANK_PARAM_SIZE and fmt == EIFMT_HVAL:
            (param_size,) = struct.unpack_from("<H", val)
        elif attr == EIATTR_MAX_THREADS and len(val) >= 12:
            x, y, z = struct.unpack_from("<III", val)
            max_threads = x * y * z
    ordered = [params[i] for i in sorted(params)]
    if param_size is None:
        param_size = max((o + s for o, s in ordered), default=0)
    return Kernel(name, ordered, param_size, max_threads=max_threads)


def parse_cubin(elf: bytes) -> Module:
    secs = _sections(elf)
    mod = Module()
    for name, _t, off, size, _l, _i, _e in secs:
        if name.startswith(".nv.info."):
            kname = name[len(".nv.info.") :]
            mod.kernels[kname] = _kernel_from_info(kname, elf[off : off + size])
    for name, _t, _off, _size, _l, info, _e in secs:
        if name.startswith(".text.") and name[6:] in mod.kernels:
            mod.kernels[name[6:]].num_regs = info >> 24
        if name.startswith(".nv.shared.") and name[11:] in mod.kernels:
            mod.kernels[name[11:]].shared_static = _size
    for _name, typ, off, size, link, _i, entsize in secs:
        if typ != SHT_SYMTAB:
            continue
        stroff = secs[link][2]
        for p in range(off, off + size, entsize or 24):
            st_name, st_info, _other, shndx, value, ssize = struct.unpack_from("<IBBHQQ", elf, p)
            if st_info & 0xF not in (STT_OBJECT, STT_CUDA_OBJECT) or not st_name or shndx == 0 or shndx >= len(secs):
                continue
            sname = elf[stroff + st_name : elf.index(b"\0", stroff + st_name)].decode()
            sec = secs[shndx]
            if not (sec[0].startswith(".nv.global") or sec[0].startswith(".nv.constant")):
                continue
            init = b"\0" * ssize if sec[1] == SHT_NOBITS else elf[sec[2] + value : sec[2] + value + ssize]
            mod.variables[sname] = Variable(sname, ssize, init)
    return mod


# ---- PTX ----

_PTX_SIZES = {"b8": 1, "u8": 1, "s8": 1, "b16": 2, "u16": 2, "s16": 2, "f16": 2, "b32": 4, "u32": 4, "s32": 4,
              "f32": 4, "b64": 8, "u64": 8, "s64": 8, "f64": 8}
_ENTRY = re.compile(r"\.entry\s+(\w+)\s*\(([^)]*)\)", re.S)
_PARAM = re.compile(r"\.param\b([^,)]*?)(\w+)(?:\[(\d+)\])?\s*(?:,|$)")


_VARIABLE = re.compile(r"^\s*(?:\.visible\s+|\.weak\s+)?\.(?:global|const)\s+(?:\.align\s+\d+\s+)?\.(\w+)\s+(\w+)"
                       r"(?:\[(\d+)\])?\s*(?:=\s*\{?([^;}]*)\}?)?\s*;", re.M)


def _ptx_value(token: str, size: int) -> bytes:
    """One initialiser of a PTX variable: 0fXXXXXXXX / 0dXXXXXXXXXXXXXXXX (float bits) or an integer."""
    t = token.strip()
    try:
        bits = int(t[2:], 16) if t[:2] in ("0f", "0d", "0F", "0D") else int(t, 0)
    except ValueError:  # (an address of another symbol: left to the driver)
        bits = 0
    return (bits & ((1 << (8 * size)) - 1)).to_bytes(size, "little")


def parse_ptx(text: str) -> Module:
    mod = Module()
    for m in _VARIABLE.finditer(text):
        elem = _PTX_SIZES.get(m.group(1), 1)
        count = int(m.group(3) or 1)
        init = b"".join(_ptx_value(v, elem) for v in (m.group(4) or "").split(",") if v.strip())
        mod.variables[m.group(2)] = Variable(m.group(2), elem * count, init[: elem * count])
    for m in _ENTRY.finditer(text):
        params, off = [], 0
        for p in _PARAM.finditer(m.group(2).strip()):
            # e.g. ".u64 .ptr .align 1 name", ".align 8 .b8 name[24]"
            types = [t for t in re.findall(r"\.(\w+)", p.group(1)) if t in _PTX_SIZES]
            elem = _PTX_SIZES[types[0]] if types else 8
            size = elem * int(p.group(3) or 1)
            explicit = re.search(r"\.align\s+(\d+)", p.group(1))
            # a pointer's ".ptr .align N" states the pointee's alignment, not the parameter's
            align = int(explicit.group(1)) if explicit and ".ptr" not in p.group(1) else elem
            off = (off + align - 1) // align * align
            params.append((off, size))
            off += size
        mod.kernels[m.group(1)] = Kernel(m.group(1), params, off)
    return mod


LINKED_MAGIC = b"NVPLINK1"


def linked_parts(image: bytes) -> list[bytes] | None:
    """The fatbinaries of a device-linked (-rdc=true) module as the shim bundles them
    (native/shim/launch.c): the linked one first, then every object's, for a JIT
    link where the linked code does not fit the GPU; None for a plain fatbinary."""
    if not image.startswith(LINKED_MAGIC):
        return None
    if len(image) < 12:
        raise FatbinError("truncated linked module")
    (count,) = struct.unpack_from("<I", image, 8)
    if not 1 <= count <= 4096 or len(image) < 12 + 8 * count:
        raise FatbinError("malformed linked module")
    sizes = struct.unpack_from(f"<{count}Q", image, 12)
    parts, at = [], 12 + 8 * count
    for n in sizes:
        if at + n > len(image):
            raise FatbinError("truncated linked module")
        parts.append(image[at : at + n])
        at += n
    return parts


PRINTF_SYMBOL = b"vprintf"  # the driver's entry that kernel printf calls: named in every cubin or PTX that prints
SCAN_LIMIT = 64 << 20  # compressed entries beyond this are not decompressed to look: such an image may print


def may_print(image: bytes) -> bool:
    """Whether a module image may call printf from a kernel (the driver then writes text at each wait): its printf
    entry named in it, or in one of its compressed entries; True where that cannot be told."""
    if PRINTF_SYMBOL in image:
        return True
    try:
        parts = linked_parts(image) or [image]
        if not all(p[:4] == struct.pack("<I", FATBIN_MAGIC) for p in parts):
            return False  # (a cubin or PTX text, read whole above)
        if sum(len(p) for p in parts) > SCAN_LIMIT:
            return True
        return any(PRINTF_SYMBOL in e.data for p in parts for e in entries(p) if e.flags & (FLAG_ZSTD | FLAG_LZ4))
    except FatbinError:
        return True


def parse(image: bytes) -> Module:
    """Kernels and variables of the best entry in a fatbinary (of the linked one
    for a device-linked module), or of a cubin or PTX text (a module the program loads itself)."""
    if image[:4] == b"\x7fELF":  # a cubin the program loaded itself (cuModuleLoadData)
        return parse_cubin(image)
    if image[:4] not in (struct.pack("<I", FATBIN_MAGIC), LINKED_MAGIC[:4]) and b".entry" in image:  # PTX text
        return parse_ptx(image.rstrip(b"\0").decode(errors="replace"))
    parts = linked_parts(image)
    if parts is not None:
        image = parts[0]
    ents = entries(image)
    elfs = sorted((e for e in ents if e.kind == KIND_ELF), key=lambda e: e.arch)
    mod = Module()
    for e in elfs:  # every cubin contributes (a fatbin may split kernels across them)
        m = parse_cubin(e.data)
        mod.kernels.update(m.kernels)
        mod.variables.update(m.variables)
    for e in ents:
        if e.kind == KIND_PTX:
            for k, v in parse_ptx(e.data.decode(errors="replace")).kernels.items():
                mod.kernels.setdefault(k, v)
    return mod
