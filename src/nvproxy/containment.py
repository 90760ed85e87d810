"""Before a program runs under nvproxy: would its GPU work reach the GPU without nvproxy?

A CUDA runtime linked statically into the program (nvcc's default, `-cudart static`) or into a library it loads
does not call the runtime functions the shim exports: it talks to libcuda through the driver's private tables,
inside the application process, where nvproxy sees nothing and no checkpoint saves anything.  check_program reads
the program's ELF file (and the libraries it names) and says so before it runs.  (Run by hand with the shim
preloaded, such a runtime is refused at run time instead: its dlopen of libcuda.so.1 lands on the shim, whose
cuGetExportTable fails loudly.)
"""

from __future__ import annotations

import mmap
import os
import shutil
import struct
import subprocess
from dataclasses import dataclass
from functools import cache
from pathlib import Path

# libraries whose functions the shim exports itself (native/shim/dl.c): their own copies of the runtime never run
INTERPOSED = ("libcuda.so", "libcudart.so", "libcublas.so", "libcublasLt.so", "libcufft.so", "libcurand.so",
              "libcusparse.so", "libcusolver.so", "libcudnn.so", "libcudnn_graph.so", "libcudnn_ops.so",
              "libcudnn_cnn.so", "libcudnn_adv.so")
# cuDNN's libraries of engines (runtimes of their own, linked in): only the real libcudnn loads them, in the proxy;
# the shim refuses a dlopen of one (native/shim/dl.c)
ENGINES = ("libcudnn_engines", "libcudnn_heuristic", "libcudnn_ext")
# functions every statically linked runtime defines
RUNTIME_SYMBOLS = frozenset({"cudaMalloc", "cudaMemcpy", "cudaLaunchKernel", "cudaGetDeviceCount",
                             "__cudaRegisterFatBinary"})
# what a stripped statically linked runtime still carries: the driver it opens and its own error names
RUNTIME_STRINGS = (b"libcuda.so.1", b"cudaErrorInsufficientDriver")
FATBIN_SECTIONS = (".nv_fatbin", ".nvFatBinSegment", "__nv_module_id")
MAX_LIBRARIES = 256

SHT_SYMTAB, SHT_DYNAMIC, SHT_NOBITS, SHT_DYNSYM = 2, 6, 8, 11
DT_NEEDED, DT_RPATH, DT_RUNPATH = 1, 15, 29


@dataclass
class Section:
    name: str
    type: int
    offset: int
    size: int
    link: int


class Elf:
    """The parts of an ELF file this module reads: sections, the dynamic section's strings, symbols."""

    def __init__(self, path: Path) -> None:
        self.path = path
        with open(path, "rb") as f:
            self.data = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
        d = self.data
        if d[:4] != b"\x7fELF" or d[4] not in (1, 2) or d[5] not in (1, 2):
            raise ValueError(f"{path} is not an ELF file")
        self.wide = d[4] == 2
        self.end = "<" if d[5] == 1 else ">"
        if self.wide:
            shoff, shentsize, shnum, shstrndx = self._at("Q", 0x28), self._at("H", 0x3A), self._at("H", 0x3C), \
                self._at("H", 0x3E)
        else:
            shoff, shentsize, shnum, shstrndx = self._at("I", 0x20), self._at("H", 0x2E), self._at("H", 0x30), \
                self._at("H", 0x32)
        raw = []
        for i in range(shnum if shoff and shoff + shnum * shentsize <= len(d) else 0):
            at = shoff + i * shentsize
            if self.wide:
                name, typ, _flags, _addr, off, size, link = struct.unpack_from(self.end + "IIQQQQI", d, at)
            else:
                name, typ, _flags, _addr, off, size, link = struct.unpack_from(self.end + "IIIIIII", d, at)
            raw.append((name, typ, off, size, link))
        names = raw[shstrndx] if shstrndx < len(raw) else None
        self.sections = [Section(self._cstr(names[2] + n) if names else "", t, o, s, k) for n, t, o, s, k in raw]

    def _at(self, fmt: str, offset: int) -> int:
        return struct.unpack_from(self.end + fmt, self.data, offset)[0]

    def close(self) -> None:
        self.data.close()

    def _cstr(self, offset: int, most: int = 4096) -> str:
        if not 0 <= offset < len(self.data):
            return ""
        head = self.data[offset : offset + most]
        return head[: head.find(b"\0") if b"\0" in head else len(head)].decode(errors="replace")

    def section(self, name: str) -> Section | None:
        return next((s for s in self.sections if s.name == name), None)

    def dynamic(self) -> list[tuple[int, str]]:
        """(tag, string) of the dynamic section's string entries: DT_NEEDED, DT_RPATH, DT_RUNPATH."""
        dyn = next((s for s in self.sections if s.type == SHT_DYNAMIC), None)
        if dyn is None or dyn.link >= len(self.sections):
            return []
        strtab = self.sections[dyn.link].offset
        fmt, size = (self.end + "qQ", 16) if self.wide else (self.end + "iI", 8)
        out = []
        for at in range(dyn.offset, dyn.offset + dyn.size - size + 1, size):
            tag, val = struct.unpack_from(fmt, self.data, at)
            if tag == 0:
                break
            if tag in (DT_NEEDED, DT_RPATH, DT_RUNPATH):
                out.append((tag, self._cstr(strtab + val)))
        return out

    def defined_symbols(self, wanted: frozenset[str]) -> set[str]:
        """Those of wanted that .symtab or .dynsym defines."""
        found: set[str] = set()
        longest = max(map(len, wanted)) + 1  # (longer names are not wanted: no need to read them whole)
        fmt, size = (self.end + "IBBHQQ", 24) if self.wide else (self.end + "IIIBBH", 16)
        for tab in (s for s in self.sections if s.type in (SHT_SYMTAB, SHT_DYNSYM)):
            if tab.link >= len(self.sections):
                continue
            strtab = self.sections[tab.link].offset
            for fields in struct.iter_unpack(fmt, self.data[tab.offset : tab.offset + tab.size // size * size]):
                name, shndx = fields[0], fields[3] if self.wide else fields[5]
                if name and shndx:
                    text = self._cstr(strtab + name, longest)
                    if text in wanted:
                        found.add(text)
        return found

    def carries(self, needles: tuple[bytes, ...]) -> bool:
        """Do the read-only data (the whole file, if it has no sections) hold every one of needles?"""
        areas = [(s.offset, s.offset + s.size) for s in self.sections if s.name.startswith(".rodata")
                 and s.type != SHT_NOBITS] or [(0, len(self.data))]
        return all(any(self.data.find(n, lo, hi) >= 0 for lo, hi in areas) for n in needles)


def _runtime_cause(elf: Elf, needed: list[str], library: bool) -> str | None:
    """How elf shows a CUDA runtime of its own, or None."""
    if any(n.startswith("libcudart.so") for n in needed):
        return None  # the shared runtime: the shim stands in for it
    if library and not any(elf.section(s) for s in FATBIN_SECTIONS):
        return None  # (no device code of its own: no runtime linked in by nvcc)
    defined = elf.defined_symbols(RUNTIME_SYMBOLS)
    if defined:
        return f"it defines {', '.join(sorted(defined))} itself"
    if elf.carries(RUNTIME_STRINGS):
        return "its strings name libcuda.so.1 and cudaErrorInsufficientDriver, as the runtime's do"
    return None


def own_runtime(path: Path) -> str | None:
    """How the ELF file at path (a program, or a library or Python extension module loaded by name at run time)
    shows a CUDA runtime of its own, or None."""
    try:
        elf = Elf(path)
    except (OSError, ValueError):
        return None
    try:
        return _runtime_cause(elf, [v for t, v in elf.dynamic() if t == DT_NEEDED], library=False)
    finally:
        elf.close()


def _resolve_program(name: str) -> Path | None:
    if "/" in name:
        return Path(name) if Path(name).is_file() else None
    found = shutil.which(name)
    return Path(found) if found else None


@cache
def _ld_cache() -> dict[str, str]:
    """The dynamic linker's cache: library name -> path (this machine's word size)."""
    try:
        out = subprocess.run(["ldconfig", "-p"], capture_output=True, text=True, timeout=10).stdout
    except (OSError, subprocess.TimeoutExpired):
        return {}
    found: dict[str, str] = {}
    for line in out.splitlines()[1:]:
        name, _, path = line.strip().partition(" => ")
        if path and ("x86-64" in name or "64bit" in name or "x86-64" not in out):
            found.setdefault(name.split(" (")[0], path)
    return found


def _find_library(name: str, origin: Path, dynamic: list[tuple[int, str]]) -> Path | None:
    """Where the dynamic linker finds name for an object in origin with that dynamic section (roughly its order:
    RPATH without RUNPATH, LD_LIBRARY_PATH, RUNPATH, the cache, the default directories)."""
    if "/" in name:
        return Path(name) if Path(name).is_file() else None

    def dirs(tag: int) -> list[str]:
        return [d.replace("$ORIGIN", str(origin)).replace("${ORIGIN}", str(origin))
                for t, v in dynamic if t == tag for d in v.split(":") if d]

    runpath = dirs(DT_RUNPATH)
    search = ([] if runpath else dirs(DT_RPATH)) + os.environ.get("LD_LIBRARY_PATH", "").split(":") + runpath
    for d in search:
        if d and (Path(d) / name).is_file():
            return Path(d) / name
    if name in _ld_cache():
        return Path(_ld_cache()[name])
    for d in ("/lib64", "/usr/lib64", "/lib", "/usr/lib"):
        if (Path(d) / name).is_file():
            return Path(d) / name
    return None


def _interposed(name: str) -> bool:
    """Is name a library the shim stands for (or one of cuDNN's engines, which the program never runs itself)?"""
    return any(name == n or name.startswith(n + ".") for n in INTERPOSED) or (
        ".so" in name and any(name.startswith(e) for e in ENGINES))


def _refusal(program: Path, where: str, cause: str) -> str:
    return (f"nvproxy: {where} has the CUDA runtime linked statically ({cause}): nvproxy cannot intercept its calls, "
            "and no checkpoint could save its GPU state. Rebuild it with `nvcc -cudart shared` (CMake: "
            "CMAKE_CUDA_RUNTIME_LIBRARY=Shared), or run it anyway, unprotected, with `nvproxy run "
            f"--allow-unprotected -- {program.name} ...`.")


def check_program(argv: list[str]) -> str | None:
    """A refusal (one message naming the cause and the fix) if the program argv would run has a CUDA runtime of
    its own, linked into it or into a library it loads; None if nvproxy can serve it (scripts included: their
    interpreter loads what it loads through dlopen, which the shim sees)."""
    if not argv:
        return None
    program = _resolve_program(argv[0])
    if program is None:
        return None  # (exec will say so)
    try:
        with open(program, "rb") as f:
            if f.read(4) != b"\x7fELF":
                return None
        elf = Elf(program)
    except (OSError, ValueError):
        return None
    queue = [(program, elf)]
    seen = {program.resolve()}
    while queue:
        path, obj = queue.pop(0)
        dynamic = obj.dynamic()
        needed = [v for t, v in dynamic if t == DT_NEEDED]
        cause = _runtime_cause(obj, needed, library=path != program)
        obj.close()
        if cause:
            for _path, rest in queue:
                rest.close()
            return _refusal(program, str(program) if path == program else f"{path}, which {program} loads,", cause)
        for name in needed:
            if _interposed(name) or len(seen) >= MAX_LIBRARIES:
                continue
            lib = _find_library(name, path.resolve().parent, dynamic)
            if lib is None or lib.resolve() in seen:
                continue
            seen.add(lib.resolve())
            try:
                queue.append((lib, Elf(lib)))
            except (OSError, ValueError):
                continue
    return None
