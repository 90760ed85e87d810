"""Builds the native libraries (plain C, no Python inside, no link against
libcuda or libcudart; only the CUDA headers are needed): the LD_PRELOAD shim,
the proxy's native part (fast path, checksums, image file loading), which Python loads
with cffi, and an empty library named libcuda.so.1 that is preloaded with the shim."""

import os
import platform
import shutil
import sys
from pathlib import Path

from setuptools import Extension, setup
from setuptools.command.build_ext import build_ext

ROOT = Path(__file__).resolve().parent
SHIM = "nvproxy._native.libnvproxy"
FAST = "nvproxy._native.libnvproxy_fast"
NAME = "nvproxy._native.libnvproxy_cuda"
PROBE = "nvproxy._native.libnvproxy_firstcall"
HEADERS = [ROOT / "native" / "include" / "nvproxy_wire.h", ROOT / "native" / "proxy" / "fastpath.h",
           ROOT / "native" / "proxy" / "checksum.h", ROOT / "native" / "proxy" / "fileload.h",
           ROOT / "native" / "proxy" / "libexec.h", ROOT / "native" / "proxy" / "reach.h"]


def cuda_include() -> str:
    for env in ("CUDA_HOME", "CUDA_PATH"):
        if os.environ.get(env):
            return str(Path(os.environ[env]) / "include")
    nvcc = shutil.which("nvcc")
    if nvcc:
        inc = Path(nvcc).resolve().parent.parent / "include"
        if (inc / "cuda_runtime_api.h").exists():
            return str(inc)
    return "/usr/local/cuda/include"


class BuildShim(build_ext):
    def get_ext_filename(self, ext_name: str) -> str:
        parts = ext_name.split(".")
        # (called with the full name and with the last part)
        if parts[-1] in ("libnvproxy", "libnvproxy_fast", "libnvproxy_cuda", "libnvproxy_firstcall"):
            return os.path.join(*parts[:-1], parts[-1] + ".so")
        return super().get_ext_filename(ext_name)

    def get_export_symbols(self, ext: Extension) -> list:
        return []  # not a Python module: no PyInit_ entry point

    def run(self) -> None:
        super().run()
        # the headers travel with the package: Python reads them through cffi.  The source tree's copy is made
        # current too, and before any binding is prebuilt: prebuilt_ffi imports the bindings from the source tree,
        # which read their declarations from it once (a stale copy would key every module by old declarations)
        bases = [self.build_lib, str(ROOT / "src")] if self.inplace else [self.build_lib]
        for base in {*bases, str(ROOT / "src")}:
            dst = Path(base) / "nvproxy" / "include"
            dst.mkdir(parents=True, exist_ok=True)
            for h in HEADERS:
                shutil.copy2(h, dst / h.name)
        for base in bases:
            prebuilt_ffi(Path(base) / "nvproxy" / "_ffi")


def prebuilt_ffi(directory: Path) -> None:
    """The cffi declarations parsed now, not at each proxy start (src/nvproxy/ffi_prebuilt.py); without cffi
    here, one line says so and the package parses them at run time."""
    sys.path.insert(0, str(ROOT / "src"))
    try:
        import cffi  # noqa: F401

        from nvproxy import ffi_prebuilt
    except ImportError as e:
        print(f"nvproxy: cffi declarations left to be parsed at run time: {e}", file=sys.stderr)
        return
    finally:
        sys.path.pop(0)
    ffi_prebuilt.emit_all(directory)


shim = Extension(
    SHIM,
    sources=sorted(str(p.relative_to(ROOT)) for p in (ROOT / "native" / "shim").glob("*.c")),
    include_dirs=["native/include", "native/shim", cuda_include()],
    define_macros=[("NVP_DEFAULT_PYTHON", f'"{sys.executable}"')],
    extra_compile_args=["-std=gnu11", "-O2", "-Wall", "-Wextra", "-fvisibility=hidden"],
    libraries=["pthread", "dl", "rt"],  # (rt: shm_open, for glibc before 2.34)
)

fast = Extension(
    FAST,
    sources=sorted(str(p.relative_to(ROOT)) for p in (ROOT / "native" / "proxy").glob("*.c")),
    include_dirs=["native/include", "native/proxy"],
    extra_compile_args=["-std=gnu11", "-O2", "-Wall", "-Wextra", "-fvisibility=hidden"],
    libraries=["pthread"],
)

# libcuda.so.1 by name only: native/soname/libcuda_name.c says why
name = Extension(
    NAME,
    sources=["native/soname/libcuda_name.c"],
    extra_compile_args=["-Wall", "-Wextra"],
    extra_link_args=["-Wl,-soname,libcuda.so.1"],
)

# the first-call probe of `nvproxy bench --apps` (its trampolines are x86-64 code)
probe = Extension(
    PROBE,
    sources=["native/probe/first_call.c"],
    extra_compile_args=["-std=gnu11", "-O2", "-Wall", "-Wextra", "-fvisibility=hidden"],
    libraries=["dl"],
)
X86_64 = platform.machine() in ("x86_64", "AMD64")

setup(ext_modules=[shim, fast, name, *([probe] if X86_64 else [])], cmdclass={"build_ext": BuildShim})
