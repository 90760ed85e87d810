"""Pinned host memory of every kind and size (tests/apps/pinned_alloc): small cudaMallocHost/cudaHostAlloc blocks
come from chunks the shim shares once (native/shim/pinned_pool.c).  The program's output equals native's on the
GPU and its transcript on sim, and a program holding such blocks, freeing and allocating more at every step, prints
the same after a migration or a recovery from an image as an uninterrupted run."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from conftest import EXPECTED, nvproxy_cmd, run
from test_checkpoint import BACKENDS, migrate_mid_run, recovered

APP = "pinned_alloc"


def test_sim_matches_transcript(build) -> None:
    r = run(nvproxy_cmd(build(APP), "sim", APP))
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


# host_register holds a registered buffer of 24 MiB (copied on several threads where there are cores) through its
# steps, and a kernel changes it at each
@pytest.mark.parametrize("app", [APP, "host_register"])
@pytest.mark.parametrize("backend", BACKENDS)
def test_live_blocks_survive_migration(build, backend: str, app: str) -> None:
    migrate_mid_run(build, backend, app, ("40", "100"), "step 4:", reference_args=("40", "0"))


@pytest.mark.parametrize("app", [APP, "host_register"])
@pytest.mark.parametrize("backend", BACKENDS)
def test_live_blocks_survive_a_recovery(build, backend: str, app: str, tmp_path: Path) -> None:
    """NVPROXY_RECOVER: the proxy, checkpointed between two steps, dies; its successor maps the chunks (and the
    registered buffer) again at their addresses and the program goes on with the blocks it holds, frees and
    allocates."""
    exe = build(app)
    reference = run(nvproxy_cmd(exe, backend, app, "12", "0"))
    assert reference.returncode == 0, reference.stderr
    image = tmp_path / "last.img"
    env = dict(os.environ, NVPROXY_RECOVER=str(image))
    env.pop("LD_PRELOAD", None)
    out, err = recovered(nvproxy_cmd(exe, backend, app, "12", "-1"), env, image, "step 0:", 3)
    assert out == reference.stdout, err


@pytest.mark.parametrize("backend", BACKENDS)
def test_live_blocks_survive_a_dmtcp_restart(build, backend: str, tmp_path: Path) -> None:
    """DMTCP: the chunks come back in fresh shared memory at their addresses, the block lists with the program."""
    from test_dmtcp import test_dmtcp_restart_keeps_features as restart_keeps_features

    restart_keeps_features(build, backend, APP, ("20", "100"), "step 4:", tmp_path)


@pytest.mark.parametrize("backend", BACKENDS)
def test_a_forked_child_has_blocks_of_its_own(build, backend: str) -> None:
    """A child forked after its parent allocated pinned memory: the chunks it inherits are the parent's shared
    memory, so its blocks come from chunks of its own (the runtime supports no CUDA in such a child: no native run
    to compare with)."""
    r = run(nvproxy_cmd(build("pinned_fork"), backend, "pinned_fork"))
    assert r.stdout == ("child: its own blocks kept their contents: 1\n"
                        "parent: its blocks kept their contents: 1, child exit status 0\nTest PASSED\n"), r.stderr
    assert r.returncode == 0, r.stderr
