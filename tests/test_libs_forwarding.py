"""Library calls through the proxy on the sim backend, against stand-ins of the libraries (tests/libfakes: the
sim backend has no GPU libraries, so the proxy loads these, NVPROXY_LIB_DIR): handles and their checks, pointer
modes, host inputs and outputs, posted calls, strings, int plan handles, functions that fail loudly, a posted call's
failure reported to its own library's next waited call, a cuBLAS handle taken by cuBLASLt, and the objects rebuilt at
a migration at every call (a generator going on with its sequence)."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import numpy as np
import pytest
from conftest import hooked, nvproxy_cmd, run

FAKES = Path(__file__).resolve().parent / "libfakes"
LIBS = {"cublas": "libcublas.so.13", "cublasLt": "libcublasLt.so.13", "curand": "libcurand.so.10",
        "cufft": "libcufft.so.12"}


@pytest.fixture(scope="module")
def fakes(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """(the stand-in libraries' directory, the test program)"""
    nvcc = shutil.which("nvcc")
    if not nvcc:
        pytest.skip("nvcc is not on PATH: the test program cannot be built")
    d = tmp_path_factory.mktemp("libfakes")
    for name, soname in LIBS.items():
        subprocess.run(["gcc", "-shared", "-fPIC", "-O1", "-o", str(d / soname), str(FAKES / f"fake_{name}.c"), "-lm"],
                       check=True)
        (d / f"lib{name}.so").symlink_to(soname)
    for name in ("libs_app", "libs_failures", "libs_constant", "libs_lt"):
        subprocess.run([nvcc, "-cudart", "shared", "-o", str(d / name), str(FAKES / f"{name}.cu"), f"-L{d}",
                        "-lcublas", "-lcublasLt", "-lcurand", "-lcufft", "-Xlinker", f"-rpath={d}"], check=True)
    return d, d / "libs_app"


def lcg_values(seed: int, skip: int, n: int) -> list[int]:
    """fake_curand.c's sequence."""
    a, c, m = 6364136223846793005, 1442695040888963407, (1 << 64) - 1
    state = (seed * a + c) & m
    out = []
    for i in range(skip + n):
        state = (state * a + c) & m
        if i >= skip:
            out.append(state >> 32)
    return out


def expected() -> list[str]:
    x = np.arange(1, 9, dtype=np.float32)
    y = np.arange(0, 16, 2, dtype=np.float32) + np.float32(0.5) * x
    lines = ["stream kept: 1", "version 130001, status name CUBLAS_STATUS_SUCCESS",
             "saxpy: " + " ".join(f"{v:g}" for v in y), f"dot (host result): {float(np.dot(x, y)):g}",
             f"mode 1, dot (device result): {float(np.dot(x[::2], y[::2])):g}", "bad pointer mode: 7",
             "sgemm: 6 8 8 10", "stale handle: 1", "cublasXtCreate: 15"]
    done = {1234: 0, 777: 0}
    for r in range(8):
        seed, k = (777 if r % 2 else 1234), (4 if r % 4 < 2 else 3)
        v = lcg_values(seed, done[seed], k)
        done[seed] += k
        lines.append(f"random {r}: {v[0]} {v[1]} {v[2]}")
    lines.append(f"host generator as the device's: 1 (last {lcg_values(1234, (1 << 20) - 1, 1)[0]})")
    return lines


def run_app(fakes: tuple[Path, Path], name: str = "libs_app", **env: str) -> subprocess.CompletedProcess:
    d, _exe = fakes
    return run(nvproxy_cmd(d / name, "sim", name), env=hooked(NVPROXY_LIB_DIR=str(d), **env))


def test_library_calls_are_forwarded(fakes: tuple[Path, Path]) -> None:
    r = run_app(fakes)
    assert r.returncode == 0, r.stdout + r.stderr
    lines = r.stdout.splitlines()
    assert lines[: len(expected())] == expected()
    fft = [float(v) for v in lines[len(expected())].split()[1:]]
    assert np.allclose(fft, [10, 0, -2, 2, -2, 0, -2, -2], atol=1e-5)
    assert lines[len(expected()) + 1:] == ["destroyed plan: 1", "destroyed handle: 1", "done"]
    assert r.stderr.count("nvproxy: cublasXtCreate is not forwarded") == 1, r.stderr


@pytest.mark.parametrize("fast", ["1", "0"], ids=["c-fast-path", "python-only"])
def test_a_posted_failure_goes_to_its_own_librarys_next_waited_call(fakes: tuple[Path, Path], fast: str) -> None:
    """A cublasSaxpy that fails after it returned (posted) is reported by the thread's next waited cuBLAS call, be it
    a query or a configuration, past waited cuRAND and cuFFT calls that succeed; and by that one alone.  In rounds:
    the first runs each function in the proxy's Python, later ones in its C fast path where it may take them."""
    d, _exe = fakes
    r = run(nvproxy_cmd(d / "libs_failures", "sim", "libs_failures"),
            env=hooked(NVPROXY_LIB_DIR=str(d), NVPROXY_LIB_FAST=fast))
    assert r.returncode == 0, r.stdout + r.stderr
    want = []
    for k in range(3):
        want += [f"round {k} query: saxpy 0, curand 0, cufft 0, cublas 7, then 0 (version 130001)",
                 f"round {k} config: saxpy 0, curand 0, cublas 7, then 0"]
    assert r.stdout.splitlines() == [*want, "destroy: 0"], r.stderr
    assert r.stderr.count("nvproxy: cublasSaxpy_v2 returned status 7 after it had returned (it was posted)") == 6


def test_constant_answers_are_asked_once(fakes: tuple[Path, Path]) -> None:
    """Versions and status names never change in a process: the shim asks the proxy once per argument and answers
    the rest itself, on every thread (a query per call would cost a round trip each)."""
    d, _exe = fakes
    r = run(nvproxy_cmd(d / "libs_constant", "sim", "libs_constant"),
            env=hooked(NVPROXY_LIB_DIR=str(d), FAKE_SAY_VERSION="1"))
    assert r.returncode == 0, r.stdout + r.stderr
    assert r.stdout.splitlines() == ["versions 10400 10400 10400, failures 0",
                                     "CUBLAS_STATUS_SUCCESS (same string: 1), CUBLAS_STATUS_OTHER"], r.stderr
    assert r.stderr.count("fake curandGetVersion called") == 1, r.stderr
    assert r.stderr.count("fake cublasGetStatusName called") == 2, r.stderr  # (for status 0, and for 1)


def test_without_the_libraries_calls_fail_cleanly(fakes: tuple[Path, Path]) -> None:
    """The sim backend has no GPU libraries: a call gets the library's "not supported" status and one line."""
    _d, exe = fakes
    env = {k: v for k, v in os.environ.items() if k != "NVPROXY_LIB_DIR"}
    r = run(nvproxy_cmd(exe, "sim", "libs_app"), env=env)
    assert r.returncode == 1
    assert r.stdout.splitlines() == ["cublasCreate_v2(&h) failed: 15"]
    assert "cublasCreate_v2 is not forwarded: libcublas.so.13 cannot be opened in the proxy" in r.stderr


def lt_expected() -> list[str]:
    """What libs_lt prints: fake_cublasLt.c's C = alpha A B + C / 2 on the same C, with each handle in turn."""
    ab = [6.0, 8.0, 8.0, 10.0]
    c = [1.0] * 4
    lines = []

    def gemm(what: str, alpha: float) -> None:
        c[:] = [alpha * x + 0.5 * y for x, y in zip(ab, c, strict=True)]
        lines.append(f"{what}: 1 found (algo 42), C " + " ".join(f"{v:g}" for v in c))

    for r in range(3):
        gemm(f"round {r}, the cuBLAS handle", 1.0 + r)
        gemm(f"round {r}, a cuBLASLt handle", 1.0 + r)
    lines += ["a descriptor as the handle: heuristic 1, matmul 1", "a cuBLASLt handle to cuBLAS: 1",
              "cuBLASLt destroying the cuBLAS handle: 1", "cuBLAS after: 6 8 8 10"]
    c[:] = ab
    gemm("cuBLASLt after", 1.0)
    return [*lines, "a destroyed cuBLAS handle: 1", "done"]


def test_a_cublas_handle_is_a_cublaslt_handle(fakes: tuple[Path, Path]) -> None:
    """cuBLASLt's heuristic and matmul given a cuBLAS handle cast to a cublasLtHandle_t run with the real cuBLAS
    handle (the stand-in cuBLASLt refuses anything else), as with a cuBLASLt handle; a handle of any other kind is
    refused with CUBLAS_STATUS_NOT_INITIALIZED, and the cuBLAS handle is not cuBLASLt's to destroy."""
    r = run_app(fakes, "libs_lt")
    assert r.returncode == 0, r.stdout + r.stderr
    assert r.stdout.splitlines() == lt_expected(), r.stderr


@pytest.mark.parametrize("name", ["libs_app", "libs_lt"])
def test_library_objects_survive_migration_at_every_call(fakes: tuple[Path, Path], tmp_path: Path,
                                                          name: str) -> None:
    """Migrated at each of its calls in turn (handles, plans, a generator and their configuration made again in
    the new proxy; the generator's sequence goes on; cuBLASLt's calls with the cuBLAS handle reach the new one), the
    program prints what an uninterrupted run prints."""
    count = tmp_path / "calls"
    reference = run_app(fakes, name, NVPROXY_CALLS_OUT=str(count))
    assert reference.returncode == 0, reference.stderr
    calls = int(count.read_text())
    assert calls > 40
    for call in range(1, calls + 1):
        r = run_app(fakes, name, NVPROXY_MIGRATE_AT=str(call))
        assert r.returncode == 0 and "migrated process" in r.stderr, f"at call {call}: {r.stderr}"
        assert r.stdout == reference.stdout, f"migrated at call {call} of {calls}: {r.stderr}"
