"""The benchmarks' CUDA programs, compiled with nvcc on first use into a per-user cache
($XDG_CACHE_HOME/nvproxy/bench, else ~/.cache/nvproxy/bench): one binary per source, flags and nvcc version."""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent


class BuildError(Exception):
    """A benchmark program could not be built; the message says why, for the user."""


def cache_dir() -> Path:
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "nvproxy" / "bench"


def _nvcc() -> tuple[str, str]:
    nvcc = shutil.which("nvcc")
    if not nvcc:
        raise BuildError("nvcc is not on PATH: the benchmarks are CUDA programs, built on first use")
    version = subprocess.run([nvcc, "--version"], capture_output=True, text=True, timeout=60).stdout
    return nvcc, version


def program(name: str, *flags: str) -> Path:
    """The binary of HERE/name.cu built with nvcc -cudart shared and flags, from the cache or built now."""
    nvcc, version = _nvcc()
    source = HERE / f"{name}.cu"
    key = hashlib.sha256(b"\0".join([source.read_bytes(), " ".join(flags).encode(), version.encode()]))
    exe = cache_dir() / f"{name}-{key.hexdigest()[:16]}"
    if exe.exists():
        return exe
    exe.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{name}-", dir=exe.parent)
    os.close(fd)
    try:
        r = subprocess.run([nvcc, "-cudart", "shared", *flags, "-o", tmp, str(source)], capture_output=True,
                           text=True)
        if r.returncode != 0:
            raise BuildError(f"nvcc could not build {source}:\n{r.stderr.strip()}")
        os.chmod(tmp, 0o755)
        os.replace(tmp, exe)  # (complete or absent: another run may build it at the same time)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)
    return exe
