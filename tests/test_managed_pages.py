"""Managed memory that migrates between the host and the device (native/shim/managed_pages.c): tests/apps/
managed_pages (the CPU and kernels taking turns, system calls on it right after kernels, a host function, threads,
copies) moves chunks both ways and prints what it printed with zero-copy managed memory, natively on the GPU, and
across a migration and a recovery of its proxy mid-run."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from conftest import nvproxy_cmd, run
from test_checkpoint import BACKENDS, migrate_mid_run, recovered

from nvproxy import wire

EXPECTED = Path(__file__).resolve().parent / "apps" / "expected" / "sim" / "managed_pages.txt"


def _ops(stderr: str) -> dict[int, int]:
    """How many requests of each managed-memory operation NVPROXY_TRACE=1 showed."""
    ops = (wire.NVP_OP_MANAGED_ALLOC, wire.NVP_OP_MANAGED_PUSH)
    return {op: sum(f"-> op {op} seq" in line for line in stderr.splitlines()) for op in ops}


def _run(build, backend: str, mode: str, monkeypatch) -> tuple[str, dict[int, int]]:
    monkeypatch.setenv("NVPROXY_TRACE", "1")
    monkeypatch.setenv("NVPROXY_MANAGED", mode)
    exe = build("managed_pages")
    r = run(nvproxy_cmd(exe, backend, "managed_pages"))
    assert r.returncode == 0, r.stderr[-3000:]
    assert "stays in host memory" not in r.stderr, r.stderr[-3000:]
    return r.stdout, _ops(r.stderr)


@pytest.mark.parametrize("backend", BACKENDS)
def test_migrating_managed_memory_gives_the_zero_copy_output(build, backend: str, monkeypatch) -> None:
    """Migrated (as root, here and on the GPU machine: a userfaultfd may watch the kernel's accesses), every
    allocation goes to the device and chunks are pushed back and forth; the output is zero-copy's, and on sim the
    transcript's."""
    if os.geteuid() != 0:
        pytest.skip("userfaultfd for the kernel's accesses needs root here (vm.unprivileged_userfaultfd=0)")
    migrated, ops = _run(build, backend, "migrate", monkeypatch)
    assert ops[wire.NVP_OP_MANAGED_ALLOC] == 7  # (the array, the sum, the tiny one and the threads' four)
    assert ops[wire.NVP_OP_MANAGED_PUSH] > 10
    zero_copy, ops = _run(build, backend, "zero-copy", monkeypatch)
    assert ops == {wire.NVP_OP_MANAGED_ALLOC: 0, wire.NVP_OP_MANAGED_PUSH: 0}
    assert migrated == zero_copy
    if backend == "sim":
        assert migrated == EXPECTED.read_text()


def test_migrate_asked_where_it_cannot_is_said_once(build, monkeypatch) -> None:
    """NVPROXY_MANAGED=migrate with two devices (migration needs one): one line, and zero-copy's right output."""
    monkeypatch.setenv("NVPROXY_SIM_DEVICES", "2")
    monkeypatch.setenv("NVPROXY_MANAGED", "migrate")
    exe = build("managed_pages")
    r = run(nvproxy_cmd(exe, "sim", "managed_pages"))
    assert r.returncode == 0, r.stderr
    assert r.stdout == EXPECTED.read_text(), r.stderr
    said = [line for line in r.stderr.splitlines() if "stays in host memory" in line]
    assert said == ["nvproxy: NVPROXY_MANAGED=migrate: managed memory stays in host memory (the proxy has more "
                    "than one device)"], r.stderr


def test_managed_memory_larger_than_the_device_stays_on_the_host(build, monkeypatch) -> None:
    """Native managed memory may be larger than the device's memory; an allocation the proxy's device cannot hold
    (a 64 MiB modelled device, 96 MiB asked) is zero-copy managed memory instead of a failure, and computes the
    same."""
    if os.geteuid() != 0:
        pytest.skip("userfaultfd for the kernel's accesses needs root here (vm.unprivileged_userfaultfd=0)")
    monkeypatch.setenv("NVPROXY_SIM_MEMORY", "64")
    monkeypatch.setenv("NVPROXY_TRACE", "1")
    exe = build("managed_pages")
    out = {}
    for mode in ("migrate", "zero-copy"):
        monkeypatch.setenv("NVPROXY_MANAGED", mode)
        r = run(nvproxy_cmd(exe, "sim", "managed_pages", "oversubscribe"))
        assert r.returncode == 0 and "Test PASSED" in r.stdout, r.stderr[-3000:]
        ops = _ops(r.stderr)
        out[mode] = (r.stdout, ops[wire.NVP_OP_MANAGED_ALLOC], ops[wire.NVP_OP_MANAGED_PUSH])
    assert out["migrate"][1:] == (1, 0)  # (asked for, refused by the device: host memory, nothing pushed)
    assert out["zero-copy"][1:] == (0, 0)
    assert out["migrate"][0] == out["zero-copy"][0]


@pytest.mark.parametrize("backend", BACKENDS)
def test_migrating_managed_memory_survives_a_migration(build, backend: str) -> None:
    """The device side moves with the proxy's image, the host side is the program's: a migration between steps
    (some chunks on the host, some on the device) changes nothing."""
    migrate_mid_run(build, backend, "managed_pages", ("40",), "step 4:")


@pytest.mark.parametrize("backend", BACKENDS)
def test_migrating_managed_memory_survives_a_recovery(build, backend: str, tmp_path: Path) -> None:
    """NVPROXY_RECOVER: the proxy is checkpointed between two steps and killed; the new one restores the device
    side from the image and maps the host side again when the shim shares it; the program finishes as an
    uninterrupted run does."""
    exe = build("managed_pages")
    reference = run(nvproxy_cmd(exe, backend, "managed_pages", "12"))
    assert reference.returncode == 0, reference.stderr
    image = tmp_path / "last.img"
    env = dict(os.environ, NVPROXY_RECOVER=str(image))
    env.pop("LD_PRELOAD", None)
    out, err = recovered(nvproxy_cmd(exe, backend, "managed_pages", "12", "gate"), env, image, "step 0:", 3)
    assert out == reference.stdout, err
