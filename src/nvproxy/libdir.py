"""Keeping the real libcuda out of a program run through nvproxy.

A program linked with -lcuda names libcuda.so.1 among its needed libraries.  The shim (preloaded) exports all of
libcuda's functions, so the real library's are never called; but the loader would still map it, and a library that
binds to its own dependencies first (RTLD_DEEPBIND) could reach it.  So the program's LD_LIBRARY_PATH begins with a
private directory where libcuda.so.1 is a link to the shim: the loader finds the file there, sees that it is the
shim, which it has loaded already, and maps nothing more.  LD_LIBRARY_PATH comes before a library's DT_RUNPATH and
the system's directories, not before a DT_RPATH (`nvproxy run` says so where an executable's DT_RPATH holds a
libcuda).  Proxies must load the real library: the shim starts them without that directory (NVPROXY_LIBDIR names
it), and `nvproxy run` starts its proxy before the program's environment has it.

The directory is this user's, one per shim (0700, beside the private directory of the sockets: nvproxy-lib/HASH),
and kept: it holds only links, made again at every start, so that an upgraded or moved nvproxy is the one found.
"""

from __future__ import annotations

import hashlib
import mmap
import os
import struct
import sys
from pathlib import Path

from . import shim_path

LINKS = ("libcuda.so.1", "libcuda.so")
DT_NULL, DT_STRTAB, DT_RPATH, DT_RUNPATH = 0, 5, 15, 29


def libcuda_dir() -> Path:
    """The directory where libcuda is the shim, made (or its links made again) now."""
    from .launcher import _private, private_dir_path

    shim = shim_path().resolve()
    sockets = private_dir_path()
    base = _private(sockets.with_name(f"{sockets.name}-lib"))
    d = _private(base / hashlib.sha256(str(shim).encode()).hexdigest()[:12])
    for name in LINKS:
        link = d / name
        if not (link.is_symlink() and os.readlink(link) == str(shim)):
            tmp = d / f".{name}.{os.getpid()}"
            tmp.unlink(missing_ok=True)
            tmp.symlink_to(shim)
            tmp.replace(link)  # (atomic: a program starting meanwhile finds the old link or the new one)
    return d


def hide_libcuda(env: dict[str, str], program: str) -> None:
    """env (a program's, to be run with the shim) gets the directory first on LD_LIBRARY_PATH; one line where the
    program's DT_RPATH, which comes before LD_LIBRARY_PATH, finds a libcuda all the same."""
    d = str(libcuda_dir())
    rest = [p for p in env.get("LD_LIBRARY_PATH", "").split(":") if p and p != d]
    env["LD_LIBRARY_PATH"] = ":".join([d, *rest])
    env["NVPROXY_LIBDIR"] = d
    for where in rpath_libcuda(program):
        print(f"nvproxy: {program}'s DT_RPATH names {where}, whose libcuda.so.1 the loader maps before nvproxy's "
              "(never called: every libcuda function the program calls is nvproxy's)", file=sys.stderr)


def rpath_libcuda(program: str) -> list[str]:
    """Directories of the executable's DT_RPATH (where it has no DT_RUNPATH) that hold a libcuda.so.1."""
    try:
        with open(_which(program), "rb") as f, mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as elf:
            dyn = dynamic_strings(elf)
    except (OSError, ValueError, struct.error):  # (not a file, empty, or not a whole ELF file)
        return []
    if DT_RPATH not in dyn or DT_RUNPATH in dyn:
        return []
    origin = str(Path(_which(program)).resolve().parent)
    dirs = [p.replace("$ORIGIN", origin).replace("${ORIGIN}", origin) for p in dyn[DT_RPATH].split(":") if p]
    return [p for p in dirs if Path(p, "libcuda.so.1").exists()]


def _which(program: str) -> str:
    if "/" in program:
        return program
    for p in os.environ.get("PATH", "").split(":"):
        if p and os.access(os.path.join(p, program), os.X_OK):
            return os.path.join(p, program)
    return program


def dynamic_strings(elf: bytes | mmap.mmap) -> dict[int, str]:
    """DT_RPATH and DT_RUNPATH of a 64-bit little-endian ELF file (empty for anything else)."""
    if elf[:4] != b"\x7fELF" or elf[4] != 2 or elf[5] != 1:
        return {}
    phoff, = struct.unpack_from("<Q", elf, 0x20)
    phentsize, phnum = struct.unpack_from("<HH", elf, 0x36)
    loads, dynamic = [], None
    for i in range(phnum):
        ptype, _flags, off, vaddr, _paddr, filesz, _memsz, _align = struct.unpack_from("<IIQQQQQQ", elf,
                                                                                       phoff + i * phentsize)
        if ptype == 1:  # PT_LOAD: where an address lies in the file
            loads.append((vaddr, off, filesz))
        elif ptype == 2:  # PT_DYNAMIC
            dynamic = (off, filesz)
    if dynamic is None:
        return {}
    entries, strtab = {}, None
    for at in range(dynamic[0], dynamic[0] + dynamic[1] - 15, 16):
        tag, val = struct.unpack_from("<qQ", elf, at)
        if tag == DT_NULL:
            break
        if tag == DT_STRTAB:
            strtab = next((off + val - vaddr for vaddr, off, n in loads if vaddr <= val < vaddr + n), None)
        elif tag in (DT_RPATH, DT_RUNPATH):
            entries[tag] = val
    if strtab is None:
        return {}
    return {tag: elf[strtab + val : elf.find(b"\0", strtab + val)].decode(errors="replace")
            for tag, val in entries.items()}
