"""The shim exports the whole CUDA 13 runtime, never links the real one, and
what it does not implement fails loudly."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from nvproxy import shim_path

ROOT = Path(__file__).resolve().parents[1]


def symbols() -> dict[str, str]:
    out = subprocess.run(["nm", "-D", "--defined-only", str(shim_path())], capture_output=True, text=True,
                         check=True).stdout
    return {line.split()[2]: line.split()[1] for line in out.splitlines()}


def test_every_runtime_symbol_is_exported() -> None:
    wanted = (ROOT / "native" / "shim" / "cudart_symbols.txt").read_text().split()
    assert len(wanted) > 400
    missing = set(wanted) - set(symbols())
    assert not missing


def test_census_symbols_are_implemented() -> None:
    syms = symbols()
    census = (ROOT / "tests" / "data" / "api_census.txt").read_text().split()
    for name in census:
        # strong definitions are implementations; weak ones are the generated loud failures
        assert syms.get(name) == "T", f"{name}: {syms.get(name)}"


def test_shim_needs_neither_libcuda_nor_libcudart() -> None:
    out = subprocess.run(["ldd", str(shim_path())], capture_output=True, text=True).stdout
    assert "libcuda" not in out and "libcudart" not in out


@pytest.mark.skipif(not Path("/usr/local/cuda/lib64/libcudart.so.13").exists() or not shutil.which("nm"),
                    reason="the CUDA 13 toolkit's libcudart is needed to regenerate the stubs")
def test_generated_sources_are_current() -> None:
    r = subprocess.run([sys.executable, str(ROOT / "native" / "tools" / "gen_shim.py"), "--check"],
                       capture_output=True, text=True)
    assert r.returncode == 0, r.stdout + r.stderr
