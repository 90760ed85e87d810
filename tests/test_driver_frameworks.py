"""The driver calls PyTorch, Triton and CuPy make beyond the basics (tests/apps/driver_frameworks.cu): a link at
run time, tensor maps, stream memory operations, function and pointer attributes; the same output natively and
through nvproxy, and after a migration at any of its calls."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest
from conftest import APPS, hooked, nvproxy_cmd, run

APP = "driver_frameworks"

EXPECTED = """\
cuGetErrorString: invalid argument; of code 12345: CUDA_ERROR_INVALID_VALUE
context at first: none
context device: 0
link: add nothing: CUDA_ERROR_INVALID_VALUE; a missing file: CUDA_ERROR_FILE_NOT_FOUND
link: complete without an out pointer: CUDA_ERROR_INVALID_VALUE
link: image non-empty, loaded
linked: counter 4 bytes; scale_add max threads >= 256: yes; dynamic shared memory set: 65536
device pointer attribute: itself
tensor map tiled: CUDA_SUCCESS, the same twice: yes
tensor map misaligned: CUDA_ERROR_INVALID_VALUE; stride 100: CUDA_ERROR_INVALID_VALUE; box 512: \
CUDA_ERROR_INVALID_VALUE; box wider than the swizzle: CUDA_ERROR_INVALID_VALUE
tensor map im2col: CUDA_SUCCESS; of rank 2: CUDA_ERROR_INVALID_VALUE
write value misaligned: CUDA_ERROR_INVALID_VALUE; 64-bit at 4 bytes: CUDA_ERROR_INVALID_VALUE
step 0: sum 12286.5, counter 2, add_one 1, done 0x100000007
step 1: sum 18429.0, counter 4, add_one 2, done 0x200000007
step 2: sum 24571.5, counter 6, add_one 3, done 0x300000007
Test PASSED
"""


@pytest.fixture(scope="session")
def cubin(nvcc: str, tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("frameworks") / "kernels.cubin"
    # (relocatable: the driver's linker takes no whole-program cubin)
    subprocess.run([nvcc, "-cubin", "-rdc=true", "-arch=sm_90", "-o", str(out), str(APPS / "driver_kernels.cu")],
                   check=True, cwd=APPS)
    return out


def test_framework_driver_calls_through_the_proxy(build, cubin: Path) -> None:
    r = run(nvproxy_cmd(build(APP), "sim", APP, str(cubin), "2"))
    assert r.returncode == 0 and r.stdout == EXPECTED, r.stdout + r.stderr
    assert "not supported" not in r.stderr, r.stderr


def test_framework_driver_calls_migrated_at_every_call(build, cubin: Path, tmp_path: Path) -> None:
    """Migrated at each of its calls (NVPROXY_MIGRATE_AT), among them a link's, the linked module's load and
    lookups, stream memory operations and tensor maps: the output stays the uninterrupted run's."""
    exe = build(APP)
    count = tmp_path / "calls"
    reference = run(nvproxy_cmd(exe, "sim", APP, str(cubin), "2"), env=hooked(NVPROXY_CALLS_OUT=str(count)))
    assert reference.returncode == 0 and reference.stdout == EXPECTED, reference.stdout + reference.stderr
    calls = int(count.read_text())
    assert calls > 40
    for call in range(1, calls + 1):
        r = run(nvproxy_cmd(exe, "sim", APP, str(cubin), "2"), env=hooked(NVPROXY_MIGRATE_AT=str(call)))
        assert r.returncode == 0 and "migrated process" in r.stderr, f"at call {call}: {r.stdout}{r.stderr}"
        assert r.stdout == EXPECTED, f"migrated at call {call} of {calls}: {r.stderr}"


def test_framework_driver_state_survives_migration_mid_run(build, cubin: Path) -> None:
    """The linked module (recorded as the image cuModuleLoadData loaded) and the flags the stream memory
    operations wrote come back in the new proxy."""
    from test_checkpoint import migrate_mid_run

    migrate_mid_run(build, "sim", APP, (str(cubin), "24", "150"), "step 2:", (str(cubin), "24", "0"))


@pytest.mark.gpu
def test_framework_driver_calls_native_against_nvproxy(build, cubin: Path) -> None:
    exe = build(APP)
    native = run([str(exe), str(cubin), "2"])
    assert native.returncode == 0 and native.stdout == EXPECTED, native.stdout + native.stderr
    proxied = run(nvproxy_cmd(exe, "gpu", APP, str(cubin), "2"))
    assert proxied.stdout == native.stdout, proxied.stderr


@pytest.mark.gpu
def test_framework_driver_state_survives_migration_on_the_gpu(build, cubin: Path) -> None:
    from test_checkpoint import migrate_mid_run

    migrate_mid_run(build, "gpu", APP, (str(cubin), "24", "150"), "step 2:", (str(cubin), "24", "0"))
