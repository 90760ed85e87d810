"""The cffi bindings load the modules the build parsed (ffi_prebuilt.py), which describe the same types as their
declarations parsed now; an edited declaration is parsed at run time instead of being served stale."""

from __future__ import annotations

import importlib
import subprocess
import sys

import cffi
import pytest

from nvproxy import ffi_prebuilt


def _parsed(cdef: str) -> cffi.FFI:
    ffi = cffi.FFI()
    ffi.cdef(cdef)
    return ffi


def _layout(ffi) -> dict[str, tuple]:
    """Every named type's size, and each struct's fields with their offsets."""
    typedefs, structs, unions = ffi.list_types()
    out = {}
    for name in typedefs:
        t = ffi.typeof(name)
        if t.kind in ("primitive", "pointer", "enum"):
            out[name] = (t.kind, ffi.sizeof(t))
    for kind, names in (("struct", structs), ("union", unions)):
        for name in names:
            t = ffi.typeof(f"{kind} {name}")
            try:
                size = ffi.sizeof(t)
            except (ValueError, getattr(ffi, "error", ValueError)):  # (each kind of FFI has its own)
                continue  # (opaque: a handle's type)
            out[f"{kind} {name}"] = (size, [(f, ffi.offsetof(t, f)) for f, _ in t.fields])
    return out


@pytest.mark.parametrize("name", sorted(ffi_prebuilt.BINDINGS))
def test_each_binding_is_prebuilt_and_matches_its_declarations(name: str) -> None:
    mod = importlib.import_module(ffi_prebuilt.BINDINGS[name])
    ffi = mod.ffi if hasattr(mod, "ffi") else mod._ffi
    assert not isinstance(ffi, cffi.FFI), f"{name}: parsed at run time (the build wrote no current module)"
    assert _layout(ffi) == _layout(_parsed(mod.CDEF))


def test_an_edited_declaration_is_parsed_now() -> None:
    from nvproxy import wire

    edited = wire.CDEF + "\nstruct nvp_added_later { int a; long long b; };\n"
    ffi = ffi_prebuilt.load("wire", edited)
    assert isinstance(ffi, cffi.FFI)
    assert ffi.offsetof("struct nvp_added_later", "b") == 8
    assert ffi.sizeof("struct nvp_copy3d") == wire.ffi.sizeof("struct nvp_copy3d")


def test_the_driver_binding_loads_without_the_parser_or_a_driver() -> None:
    """Importing the libcuda binding parses nothing and opens no libcuda (this machine may have none); a missing
    libcuda is named when a call first needs it."""
    code = ("import sys; import nvproxy.backends.cuda_driver as cd; "
            "assert 'pycparser' not in sys.modules and 'cffi.cparser' not in sys.modules, sorted(sys.modules); "
            "assert cd._lib is None; print(cd.ffi.sizeof('CUDA_MEMCPY3D'))")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    from nvproxy.backends import cuda_driver

    assert int(r.stdout) == _parsed(cuda_driver.CDEF).sizeof("CUDA_MEMCPY3D")
