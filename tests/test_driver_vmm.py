"""The driver's virtual memory management as PyTorch's expandable segments use it (tests/apps/driver_vmm.cu): a
reserved range grown chunk by chunk, kernels and copies across the chunks, chunks unmapped, released and mapped
again.  The same output natively and through nvproxy, after a migration at any of its calls, after incremental
checkpoints (write tracking follows writes through the program's mappings to the memory behind them) and after
the proxy died and a new one started from the last image."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import hooked, nvproxy_cmd, run
from gated import Gated, kill_and_wait

APP = "driver_vmm"
BACKENDS = ["sim", pytest.param("gpu", marks=pytest.mark.gpu)]
WRITTEN = re.compile(r"incremental: (\d+) of (\d+) MiB written from the device")

HEAD = """\
granularity: a power of two: yes; recommended a multiple of it: yes
granularity without an out pointer: CUDA_ERROR_INVALID_VALUE
create of a size not a multiple of it: CUDA_ERROR_INVALID_VALUE
reserved: aligned to the granularity: yes
"""
TAIL = """\
access: read-write
retained: the handle mapped there: yes
properties: pinned yes, device 0
"""
# (checksums of 2 MiB chunks, the granularity of the sim and of current GPUs; tests/apps/driver_vmm.cu says how
# each step changes them)
EXPECTED = """\
step 0: 1 chunks, checksum 86ee820b884d0383
step 1: 2 chunks, checksum 5b1ba9e599d26f83
step 2: 2 chunks, checksum 8b9c36d5b696b783
step 3: 3 chunks, checksum cb3b6a7671993f83
step 4: 4 chunks, checksum e8797fc4f48cfb83
step 5: 4 chunks, checksum 0e437d2bd0d52f83
step 6: 4 chunks, checksum 446d9fbcdec73b83
step 7: 4 chunks, checksum 346fe9cb96254f83
""" + HEAD + TAIL + """\
released, still mapped: checksum dfe5b8b8e9554383
Test PASSED
"""
STEPS = "8"


def nvproxy(*args: str) -> subprocess.CompletedProcess:
    return run([sys.executable, "-m", "nvproxy", *args], timeout=300)


def test_vmm_through_the_proxy(build) -> None:
    r = run(nvproxy_cmd(build(APP), "sim", APP, STEPS))
    assert r.returncode == 0 and r.stdout == EXPECTED, r.stdout + r.stderr
    assert "not supported" not in r.stderr, r.stderr


def test_vmm_migrated_at_every_call(build, tmp_path: Path) -> None:
    """Migrated at each of its calls (NVPROXY_MIGRATE_AT), among them every reservation, creation, mapping, access,
    unmapping and release: the output stays the uninterrupted run's."""
    exe = build(APP)
    count = tmp_path / "calls"
    reference = run(nvproxy_cmd(exe, "sim", APP, "3"), env=hooked(NVPROXY_CALLS_OUT=str(count)))
    assert reference.returncode == 0 and reference.stdout.endswith("Test PASSED\n"), reference.stdout
    assert HEAD + TAIL in reference.stdout and "step 2: 2 chunks" in reference.stdout, reference.stdout
    calls = int(count.read_text())
    assert calls > 20
    for call in range(1, calls + 1):
        r = run(nvproxy_cmd(exe, "sim", APP, "3"), env=hooked(NVPROXY_MIGRATE_AT=str(call)))
        assert r.returncode == 0 and "migrated process" in r.stderr, f"at call {call}: {r.stdout}{r.stderr}"
        assert r.stdout == reference.stdout, f"migrated at call {call} of {calls}: {r.stderr}"


@pytest.mark.parametrize("backend", BACKENDS)
def test_vmm_incremental_checkpoints_then_recovered(build, backend: str, tmp_path: Path) -> None:
    """Checkpointed after steps 1 (whole), 4, 5 and 6 (incremental, comparing with the image before: every chunk
    written through the program's mappings was marked by write tracking, also in steps that map nothing), its
    proxy killed after the last one: the program recovers from that image (NVPROXY_RECOVER) and prints what an
    uninterrupted run prints."""
    from nvproxy.launcher import find_proxy

    exe = build(APP)
    reference = run(nvproxy_cmd(exe, backend, APP, STEPS), stdin=subprocess.DEVNULL)
    assert reference.returncode == 0 and reference.stdout == EXPECTED, reference.stdout + reference.stderr
    image = tmp_path / "app.img"
    env = dict(os.environ, NVPROXY_RECOVER=str(image))
    env.pop("LD_PRELOAD", None)
    said = []
    with Gated(nvproxy_cmd(exe, backend, APP, STEPS, "-1"), env) as app:
        while not app.line().startswith("step 0:"):
            pass
        for i, step in enumerate((1, 4, 5, 6)):
            while not app.go().startswith(f"step {step}:"):
                pass
            r = nvproxy("checkpoint", str(app.pid), "-o", str(image), *(("--incremental",) if i else ()))
            assert r.returncode == 0, r.stdout + r.stderr
            said.append(r.stdout + r.stderr)
        pid, _sock = find_proxy(app.pid)
        kill_and_wait(pid)
        out, err = app.finish()
    assert "starting a new one from" in err, err
    assert out == reference.stdout, f"{err}\nthe checkpoints said:\n" + "\n".join(said)
    for text in said[1:]:
        assert WRITTEN.search(text) and "had not marked" not in text, text


@pytest.mark.gpu
def test_vmm_native_against_nvproxy(build) -> None:
    exe = build(APP)
    native = run([str(exe), STEPS])
    assert native.returncode == 0 and native.stdout == EXPECTED, native.stdout + native.stderr
    proxied = run(nvproxy_cmd(exe, "gpu", APP, STEPS))
    assert proxied.stdout == native.stdout, proxied.stderr


@pytest.mark.gpu
def test_vmm_state_survives_migration_on_the_gpu(build) -> None:
    from test_checkpoint import migrate_mid_run

    migrate_mid_run(build, "gpu", APP, (STEPS, "1000"), "step 2:", (STEPS, "0"))


@pytest.mark.parametrize("mode", ["snapshot", "copy-before-write"])
def test_vmm_concurrent_checkpoints_are_the_state_at_the_cut(build, mode: str, tmp_path: Path) -> None:
    """Checkpointed concurrently while it maps, unmaps, releases and writes through its mappings: the image holds
    what a stopped checkpoint holds, and a recovery from a later concurrent incremental image prints what an
    uninterrupted run prints (copy-before-write saves an allocation before a write through any of its mappings, and
    before an unmapping or release gives it back)."""
    from test_concurrent import MODES, check_program

    settings, methods = MODES[mode]
    check_program(nvproxy_cmd(build(APP), "sim", APP, "10", "-1"), dict(os.environ, **settings), tmp_path, methods)


@pytest.mark.parametrize("backend", BACKENDS)
def test_vmm_state_survives_a_dmtcp_restart(build, backend: str, tmp_path: Path) -> None:
    """Checkpointed under DMTCP after step 2 (its segment shrunk and grown again), killed and restarted: the shim's
    handles and reservations come back with the program, the proxy's allocations and mappings from the image, and
    the program prints the rest of an uninterrupted run's output."""
    from test_dmtcp import Session, checkpoint_kill_restart

    session = Session(tmp_path / "dmtcp")
    exe = build(APP)
    reference = run(nvproxy_cmd(exe, backend, APP, STEPS)).stdout.splitlines(keepends=True)
    checkpoint_kill_restart(session, nvproxy_cmd(exe, backend, APP, STEPS, "300"), reference, "step 2:")
