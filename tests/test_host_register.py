"""cudaHostRegister of the program's own memory (tests/apps/host_register): moved into memory shared with the proxy
in place, large ranges on several threads (native/shim/hostreg.c), small ones and a program on one core with
write(); the proxy makes every page before registering (proxy/host_pages.py).  Contents, neighbours, device access,
copies, registering again, a thread reading meanwhile, ranges that cannot be registered and large cudaMallocHost
memory: the same output on sim as its transcript, on one core as on several, and on the GPU as natively; a
registered buffer copied on several threads lives on through a migration and a recovery."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from conftest import EXPECTED, nvproxy_cmd, run
from test_checkpoint import BACKENDS, migrate_mid_run, recovered

APP = "host_register"


@pytest.mark.parametrize("cores", ["all", "one"])
def test_sim_matches_transcript(build, cores: str) -> None:
    """On one core every range is copied with write(); on more, those of 16 MiB and more by threads (where the
    machine has one core only, both runs take write())."""
    cmd = nvproxy_cmd(build(APP), "sim", APP)
    r = run(cmd if cores == "all" else ["taskset", "-c", str(min(os.sched_getaffinity(0))), *cmd])
    assert r.stdout == (EXPECTED / "sim" / f"{APP}.txt").read_text(), r.stderr
    assert r.returncode == 0, r.stderr


@pytest.mark.gpu
def test_gpu_matches_native(build) -> None:
    exe = build(APP)
    native = run([str(exe)])
    proxied = run(nvproxy_cmd(exe, "gpu", APP))
    assert proxied.stdout == native.stdout, proxied.stderr
    assert proxied.returncode == native.returncode == 0, proxied.stderr
    assert "Test PASSED" in native.stdout, native.stdout


@pytest.mark.parametrize("backend", BACKENDS)
def test_registered_buffer_survives_migration(build, backend: str) -> None:
    migrate_mid_run(build, backend, APP, ("40", "100"), "step 4:", reference_args=("40", "0"))


@pytest.mark.parametrize("backend", BACKENDS)
def test_registered_buffer_survives_a_recovery(build, backend: str, tmp_path: Path) -> None:
    """NVPROXY_RECOVER: the proxy, checkpointed between two steps, dies; its successor maps the registered buffer
    again at its address, and the kernels of the steps after go on changing it."""
    exe = build(APP)
    reference = run(nvproxy_cmd(exe, backend, APP, "12", "0"))
    assert reference.returncode == 0, reference.stderr
    image = tmp_path / "last.img"
    env = dict(os.environ, NVPROXY_RECOVER=str(image))
    env.pop("LD_PRELOAD", None)
    out, err = recovered(nvproxy_cmd(exe, backend, APP, "12", "-1"), env, image, "step 0:", 3)
    assert out == reference.stdout, err
