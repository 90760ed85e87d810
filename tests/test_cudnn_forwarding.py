"""cuDNN calls through the proxy on the sim backend, against a stand-in of libcudnn.so.9 (tests/libfakes/fake_cudnn.c,
loaded by the proxy from NVPROXY_LIB_DIR): the legacy API with float and double scalars, a host output, dropout
states that go on across restores, a status string, a function that fails loudly; the backend API with attributes
of several types (descriptor arrays, a handle, device pointers), descriptors filled by GetAttribute, operations
destroyed once their graph is finalized; and every object rebuilt at a migration at each call."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import numpy as np
import pytest
from conftest import hooked, nvproxy_cmd, run

FAKES = Path(__file__).resolve().parent / "libfakes"


@pytest.fixture(scope="module")
def fake(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """(the stand-in library's directory, the test program)"""
    nvcc = shutil.which("nvcc")
    if not nvcc:
        pytest.skip("nvcc is not on PATH: the test program cannot be built")
    d = tmp_path_factory.mktemp("cudnnfake")
    subprocess.run(["gcc", "-shared", "-fPIC", "-O1", "-Wall", "-Wextra", "-Werror", "-o", str(d / "libcudnn.so.9"),
                    str(FAKES / "fake_cudnn.c")], check=True)
    (d / "libcudnn.so").symlink_to("libcudnn.so.9")
    subprocess.run([nvcc, "-cudart", "shared", "-o", str(d / "libs_cudnn"), str(FAKES / "libs_cudnn.cu"), f"-L{d}",
                    "-lcudnn", "-Xlinker", f"-rpath={d}"], check=True)
    return d, d / "libs_cudnn"


def dropout_lines() -> list[str]:
    """fake_cudnn.c's dropout of 1 2 3 4 at p = 0.5, seed 1234, three times (its states going on)."""
    m = (1 << 32) - 1
    states = [(1234 * 2654435761 + i * 40503) & m for i in range(16)]
    out = []
    for r in range(3):
        vals = []
        for i, x in enumerate((1.0, 2.0, 3.0, 4.0)):
            states[i] = (states[i] * 1664525 + 1013904223) & m
            vals.append(0.0 if (states[i] >> 8) / 16777216.0 < 0.5 else x / 0.5)
        out.append(f"dropout {r}: " + " ".join(f"{v:g}" for v in vals))
    return out


def expected() -> list[str]:
    x = np.arange(1, 5, dtype=np.float32)
    runs = []
    for _ in range(2):
        x = (x + np.float32(1)) * np.float32(3) + np.float32(8) / np.float32(100)
        runs.append(" ".join(f"{v:g}" for v in x))
    return ["stream kept: 1, version 92801, CUDNN_STATUS_BAD_PARAM", "relu (float): 0.5 0.5 0.5 2.5 4.5 6.5",
            "relu (double): 0.5 0.5 0.5 2.5 4.5 6.5", "add tensor: 13 26 39 52", "workspace size: 32",
            *dropout_lines(), "cudnnSetCallback: 3000", "engine configurations: 2, the same descriptors back: 1",
            "plan's handle is ours: 1, its graph: 1, wrong type: 2000", f"execute 0: {runs[0]}",
            f"execute 1: {runs[1]}", "stale descriptor: 2000, unknown attribute type: 2000", "destroyed handle: 2000",
            "done"]


def run_app(fake: tuple[Path, Path], **env: str) -> subprocess.CompletedProcess:
    d, exe = fake
    return run(nvproxy_cmd(exe, "sim", "libs_cudnn"), env=hooked(NVPROXY_LIB_DIR=str(d), **env))


def test_cudnn_calls_are_forwarded(fake: tuple[Path, Path]) -> None:
    r = run_app(fake)
    assert r.returncode == 0, r.stdout + r.stderr
    assert r.stdout.splitlines() == expected(), r.stderr
    assert r.stderr.count("nvproxy: cudnnSetCallback is not forwarded (a callback into the application)") == 1
    assert "cudnnBackendSetAttribute: its elements' type (parameter attributeType) is not one nvproxy knows" \
        in r.stderr


def test_without_the_library_calls_fail_cleanly(fake: tuple[Path, Path]) -> None:
    _d, exe = fake
    env = {k: v for k, v in os.environ.items() if k != "NVPROXY_LIB_DIR"}
    r = run(nvproxy_cmd(exe, "sim", "libs_cudnn"), env=env)
    assert r.returncode == 1
    assert r.stdout.splitlines() == ["cudnnCreate(&h) failed: 3000"]
    assert "cudnnCreate is not forwarded: libcudnn.so.9 cannot be opened in the proxy" in r.stderr


def test_cudnn_objects_survive_migration_at_every_call(fake: tuple[Path, Path], tmp_path: Path) -> None:
    """Migrated at each of its calls in turn (handles, descriptors, the graph with its destroyed operations, the
    heuristic's engine configurations and the plan made again in the new proxy; dropout states kept as saved), the
    program prints what an uninterrupted run prints."""
    count = tmp_path / "calls"
    reference = run_app(fake, NVPROXY_CALLS_OUT=str(count))
    assert reference.returncode == 0 and reference.stdout.splitlines() == expected(), reference.stderr
    calls = int(count.read_text())
    assert calls > 60
    for call in range(1, calls + 1):
        r = run_app(fake, NVPROXY_MIGRATE_AT=str(call))
        assert r.returncode == 0 and "migrated process" in r.stderr, f"at call {call}: {r.stderr}"
        assert r.stdout == reference.stdout, f"migrated at call {call} of {calls}: {r.stderr}"
