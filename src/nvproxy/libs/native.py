"""The proxy's executor of library calls (native/proxy/libexec.h), seen from Python."""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .. import wire
from ..ffi_prebuilt import load
from ..proxy import fastpath
from . import spec

TEXT = wire.header_text("libexec.h", "proxy")
CDEF = wire.cdef_block(TEXT)
ffi = load("libexec", CDEF)
CONSTANTS = wire.defines(CDEF, "NVPL_")
E_NOLIB, E_NOSYM, E_HANDLE = CONSTANTS["NVPL_E_NOLIB"], CONSTANTS["NVPL_E_NOSYM"], CONSTANTS["NVPL_E_HANDLE"]
E_BAD, E_OUT = CONSTANTS["NVPL_E_BAD"], CONSTANTS["NVPL_E_OUT"]
FAST_POSTED, FAST_WAITED = CONSTANTS["NVPL_FAST_POSTED"], CONSTANTS["NVPL_FAST_WAITED"]
FAST_GENERATE = CONSTANTS["NVPL_FAST_GENERATE"]
NULL_SLOT = (1 << 64) - 1
STRING_CAP = 4096  # the longest string a function's answer carries


@dataclass
class Result:
    error: int  # NVPL_E_* (0: the function ran)
    param: int
    ret: int
    out: bytes
    created: list[int]


def candidates(soname: str, sim: bool) -> list[str]:
    """Where the proxy looks for a library: NVPROXY_LIB_DIR first, then (not on sim) the loader's search path, the
    toolkit's directories, and NVIDIA's pip wheels in this Python (PyTorch's cuDNN: site-packages/nvidia/cudnn/lib)."""
    out = []
    d = os.environ.get("NVPROXY_LIB_DIR")
    if d:
        out.append(str(Path(d) / soname))
    if not sim:
        out.append(soname)
        cuda = Path(os.environ.get("CUDA_HOME") or "/usr/local/cuda")
        out += [str(cuda / "lib64" / soname), str(cuda / "targets" / "x86_64-linux" / "lib" / soname)]
        out += [str(p) for p in wheel_libraries(soname)]
    return out


def wheel_libraries(soname: str) -> list[Path]:
    """soname in the `lib` directory of a package of NVIDIA's `nvidia` namespace in this Python's site-packages
    (nvidia-cudnn-cu13: nvidia/cudnn/lib/libcudnn.so.9), found by the namespace's own search path."""
    import importlib.util

    try:
        found = importlib.util.find_spec("nvidia")
    except (ImportError, ValueError):
        return []
    roots = list(found.submodule_search_locations or []) if found is not None else []
    return sorted(p for r in roots for p in Path(r).glob(f"*/lib/{soname}") if p.is_file())


class Executor:
    def __init__(self) -> None:
        self.lib: Any = ffi.dlopen(str(fastpath.library_path()))
        n = self.lib.nvpl_table_count()
        if n != len(spec.load().funcs):
            raise RuntimeError(f"the proxy's library table has {n} functions, the description "
                               f"{len(spec.load().funcs)}: rebuild nvproxy")
        self.res = ffi.new("struct nvpl_result *")
        self.cap = 0
        self.out: Any = None

    def open(self, lib: int, paths: list[str]) -> str | None:
        """Open library number lib from the first path that works; None, or why none did."""
        why = []
        for p in paths:
            if self.lib.nvpl_open(lib, p.encode()) == 0:
                return None
            why.append(ffi.string(self.lib.nvpl_error()).decode(errors="replace"))
        return "; ".join(why) or "no place to look for it"

    def allow_fast(self, fid: int, how: int) -> None:
        """The fast path may make calls of fid itself from now on (how: FAST_POSTED | FAST_WAITED)."""
        self.lib.nvpl_allow_fast(fid, how)

    def fast_host_only(self, on: bool) -> None:
        """The fast path takes only calls that give the library no device memory (the sim backend's)."""
        self.lib.nvpl_fast_host_only(int(on))

    def teach_generation(self, owner: tuple[int, int], fid: int, out: int, hostmask: int,
                         payload: bytes | None) -> None:
        """The generator's latest generation record (None: none), whose like the fast path makes and counts."""
        buf = ffi.from_buffer(payload) if payload is not None else ffi.NULL
        self.lib.nvpl_teach_generation(owner[0], owner[1], fid, out, hostmask, buf, len(payload or b""))

    def take_generated(self, owner: tuple[int, int]) -> int:
        """How many calls like its record the fast path made for the generator since it was last asked."""
        return int(self.lib.nvpl_take_generated(owner[0], owner[1]))

    def handle_slow(self, kind: int, hid: int, slow: bool) -> None:
        self.lib.nvpl_handle_slow(kind, hid, int(slow))

    def learn(self, kind: int, hid: int, real: int) -> None:
        self.lib.nvpl_learn(kind, hid, real)

    def forget(self, kind: int, hid: int) -> None:
        self.lib.nvpl_forget(kind, hid)

    def call(self, fid: int, hostmask: int, payload: bytes | bytearray, out_cap: int,
             before_reading: Any = None) -> Result:
        """before_reading, if given, runs between the call and the reading of its outputs (a wait for the device,
        where the library may still write host memory it was given)."""
        if out_cap > self.cap:
            self.cap = max(out_cap, 2 * self.cap, 4096)
            self.out = ffi.new("uint8_t[]", self.cap)
        elif self.out is None:
            self.cap = 4096
            self.out = ffi.new("uint8_t[]", self.cap)
        r = self.res
        self.lib.nvpl_call(fid, hostmask, ffi.from_buffer(payload), len(payload), self.out, out_cap, r)
        if before_reading is not None and not r.error:
            before_reading()
        out = bytes(ffi.buffer(self.out, r.out_len)) if r.out_len else b""
        return Result(r.error, r.param, r.ret, out, [r.created[i] for i in range(4)])
