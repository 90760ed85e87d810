"""cffi bindings whose C declarations are parsed when the package is built, not each time a proxy starts.

Parsing declarations (pycparser) took longer than anything else in a proxy's Python start but the interpreter.  So
each binding module asks load(NAME, its declarations) for its FFI, and setup.py writes, for every entry of
BINDINGS, an out-of-line module `nvproxy/_ffi/NAME_KEY.py` (cffi's ABI mode: the parsed types, no C compiler),
KEY being a checksum of the declarations it was made from.  load() imports the module of the text it is given,
and parses the text now where there is none (a package built without cffi, or declarations edited since the
build): an edited declaration is never served stale, only slower.
"""

from __future__ import annotations

import importlib
import zlib
from pathlib import Path
from typing import Any

PACKAGE = "nvproxy._ffi"
# each binding: the module that defines it (as CDEF) and loads it under this name
BINDINGS = {
    "wire": "nvproxy.wire",
    "fastpath": "nvproxy.proxy.fastpath",
    "libexec": "nvproxy.libs.native",
    "libc": "nvproxy.proxy.libc",
    "zstd": "nvproxy.fatbin",
    "cuda_driver": "nvproxy.backends.cuda_driver",
    "fileload": "nvproxy.checkpoint.fileload",
    "checksum": "nvproxy.checkpoint.checksum",
    "reach": "nvproxy.checkpoint.reach",
}


def key(cdef: str) -> str:
    """A checksum of the declarations and their length (it tells an edited text, not a forged one)."""
    data = cdef.encode()
    return f"{zlib.crc32(data):08x}{len(data):x}"


def module_name(name: str, cdef: str) -> str:
    return f"{name}_{key(cdef)}"


def load(name: str, cdef: str) -> Any:
    """The FFI of these declarations: the prebuilt module made from this very text, else parsed now."""
    try:
        return importlib.import_module(f"{PACKAGE}.{module_name(name, cdef)}").ffi
    except Exception:  # (absent, or made by a cffi this one cannot read: parse instead)
        import cffi

        ffi = cffi.FFI()
        ffi.cdef(cdef)
        return ffi


def emit(name: str, cdef: str, directory: Path) -> Path:
    """Write the out-of-line module of these declarations into directory (build time; needs cffi)."""
    import cffi

    builder = cffi.FFI()
    builder.cdef(cdef)
    mod = module_name(name, cdef)
    builder.set_source(f"{PACKAGE}.{mod}", None)
    path = directory / f"{mod}.py"
    builder.emit_python_code(str(path))
    return path


def emit_all(directory: Path) -> list[Path]:
    """Every binding's module into directory, which is emptied of older ones first (build time)."""
    directory.mkdir(parents=True, exist_ok=True)
    for old in directory.glob("*.py"):
        old.unlink()
    (directory / "__init__.py").write_text('"""cffi modules generated at build time (nvproxy/ffi_prebuilt.py)."""\n')
    return [emit(name, importlib.import_module(mod).CDEF, directory) for name, mod in BINDINGS.items()]
