"""GROMACS through nvproxy (GPU): mdrun of an SPC/E water box with PME (tests/gromacs/make_input.py; liquid methanol
where bonded terms run on the GPU) in the
configurations users run on a GPU, natively and through nvproxy, and through nvproxy again while it is checkpointed
mid-run under DMTCP, migrated, and recovered after its proxy was killed.

GROMACS is not part of nvproxy: point NVPROXY_GROMACS_DIR at its installation (bin/gmx), built with
CMAKE_CUDA_RUNTIME_LIBRARY=Shared (CONTRIBUTING.md has the command).  GPU kernels add forces with atomics, so no
two runs are bitwise alike: every run through nvproxy is judged against two native runs of the same input by
tests/gromacs/mdrun.compare (same start, same means within the native spread and the statistical error, no jump
in the conserved energy).  No bitwise comparison: GROMACS refuses -reprod with nonbonded interactions on the GPU
("Nonbonded interactions on the GPU and binary reproducibility were required. These requirements are not
compatible."), and PME on the GPU needs them there.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from functools import cache
from pathlib import Path

import pytest
from conftest import finished, gpu_count, run
from gromacs.make_input import make_input
from gromacs.mdrun import Energies, compare, last_step, mdrun_args, read_log, system_of
from test_checkpoint import nvproxy
from test_dmtcp import Session

pytestmark = pytest.mark.gpu

GMX_DIR = os.environ.get("NVPROXY_GROMACS_DIR", "")
# 30,000 steps (60 ps) take about 5 s on one GPU (PME on the CPU: 10,000); a run is checkpointed, migrated or
# recovered once it logged step AT, and goes on for seconds after it (nvproxy migrate fails where the program ends
# first).
LONG, SHORT = 30000, 10000
AT = 2000
TIMEOUT = 300


def gmx() -> Path:
    exe = Path(GMX_DIR) / "bin" / "gmx"
    if not GMX_DIR or not os.access(exe, os.X_OK):
        pytest.skip("GROMACS is not installed: set NVPROXY_GROMACS_DIR to its installation (with bin/gmx)")
    return exe


@pytest.fixture(scope="module")
def inputs(tmp_path_factory: pytest.TempPathFactory) -> Callable[[str], Path]:
    """system -> its run input, made on first use (make_input.SYSTEMS)."""
    gmx()
    return cache(lambda system: make_input(Path(GMX_DIR), tmp_path_factory.mktemp(f"gromacs-{system}"),
                                           system=system))


@pytest.fixture(scope="module")
def tpr(inputs: Callable[[str], Path]) -> Path:
    return inputs("water")


def nvproxy_run(cmd: list[str]) -> list[str]:
    return [sys.executable, "-m", "nvproxy", "run", "--", *cmd]


@cache
def natives(tpr: Path, config: str) -> tuple[Energies, Energies]:
    """Two native runs of config, one after the other (their difference is the native spread)."""
    runs = []
    for i in range(2):
        name = tpr.parent / f"native-{config}-{i}"
        cmd, env = mdrun_args(gmx(), tpr, name, config, steps(config))
        r = run(cmd, env=dict(os.environ, **env), timeout=TIMEOUT)
        assert r.returncode == 0, f"native {config}: {r.stderr[-3000:]}"
        runs.append(read_log(name.with_suffix(".log")))
    return runs[0], runs[1]


def check(log: Path, tpr: Path, config: str, stderr: str = "") -> None:
    problems = compare(read_log(log), natives(tpr, config), steps=steps(config))
    assert not problems, "\n".join(problems) + f"\nstderr: {stderr[-3000:]}"


def steps(config: str) -> int:
    return SHORT if config == "pme-cpu" else LONG


def need_gpus(config: str) -> None:
    if config == "two-gpus" and gpu_count() < 2:
        pytest.skip("needs two GPUs (nvidia-smi -L lists fewer)")


@pytest.mark.parametrize("config", ["pme-gpu", "pme-cpu", "update-gpu", "graphs", "two-ranks", "two-gpus",
                                    "bonded-gpu"])
def test_gromacs_matches_native(inputs: Callable[[str], Path], config: str, tmp_path: Path) -> None:
    """-nb gpu with PME on the GPU (cuFFT) and on the CPU; GPU-resident steps (-update gpu); CUDA graphs
    (GMX_CUDA_GRAPH=1); two thread-MPI ranks sharing a GPU (-npme 1); two GPUs; bonded terms on the GPU (-bonded
    gpu, liquid methanol)."""
    need_gpus(config)
    tpr = inputs(system_of(config))
    natives(tpr, config)
    cmd, env = mdrun_args(gmx(), tpr, tmp_path / "md", config, steps(config))
    r = run(nvproxy_run(cmd), env=dict(os.environ, **env), timeout=TIMEOUT)
    assert r.returncode == 0, r.stderr[-4000:]
    check(tmp_path / "md.log", tpr, config, r.stderr)


def report(said: str, *images: Path) -> None:
    """nvproxy's lines on a checkpoint, a restore or a hand-over (times, sizes) and the images' sizes, into the
    test's output (pytest -rA shows it)."""
    for line in said.splitlines():
        if line.startswith("nvproxy:") or "written" in line:
            print(line[:400])
    for image in images:
        print(f"image {image.name}: {image.stat().st_size / 2**20:.1f} MiB")


def start(cmd: list[str], env: dict[str, str], err: Path) -> subprocess.Popen:
    """cmd through nvproxy, its stderr into err (a pipe nobody reads while the test waits could fill and stop it)."""
    with open(err, "w") as f:
        return subprocess.Popen(nvproxy_run(cmd), stdout=subprocess.DEVNULL, stderr=f, env=dict(os.environ, **env))


def wait_for_step(app: subprocess.Popen, log: Path, step: int) -> None:
    """Until the log holds step's energies (mdrun flushes it at each logging step)."""
    deadline = time.monotonic() + TIMEOUT
    while last_step(log) < step:
        assert app.poll() is None, f"mdrun ended before its step {step}"
        assert time.monotonic() < deadline, f"no step {step} within {TIMEOUT} s"
        time.sleep(0.05)


@pytest.mark.parametrize("config", ["pme-gpu", "update-gpu", "graphs"])
def test_gromacs_dmtcp_restart_mid_run(tpr: Path, config: str, tmp_path: Path) -> None:
    """nvproxy run --dmtcp; at step AT, nvproxy checkpoint --dmtcp, then kill; nvproxy restart: the run finishes
    with the energies of an uninterrupted one (the log, a file DMTCP restores, goes on from the checkpoint)."""
    natives(tpr, config)
    session = Session(tmp_path)
    log = tmp_path / "md.log"
    cmd, env = mdrun_args(gmx(), tpr, tmp_path / "md", config, steps(config))
    app = session.launch(nvproxy_run(cmd), **env)
    wait_for_step(app, log, AT)
    session.checkpoint_and_kill(app)
    r = session.restart()
    assert r.returncode == 0 and "restoring the GPU state" in r.stderr, r.stderr[-4000:]
    report(r.stderr, *tmp_path.glob("nvproxy-*.img"), *tmp_path.glob("ckpt_*.dmtcp"))
    check(log, tpr, config, r.stderr)


@pytest.mark.parametrize("device", ["same", "other"])
def test_gromacs_migrated_mid_run(tpr: Path, device: str, tmp_path: Path) -> None:
    """nvproxy migrate at step AT, to a new proxy on the same GPU or on the other one: the run goes on and
    finishes with the energies of an uninterrupted one."""
    if device == "other" and gpu_count() < 2:
        pytest.skip("needs two GPUs (nvidia-smi -L lists fewer)")
    natives(tpr, "pme-gpu")
    cmd, env = mdrun_args(gmx(), tpr, tmp_path / "md", "pme-gpu", LONG)
    app = start(cmd, env, tmp_path / "stderr.txt")
    try:
        wait_for_step(app, tmp_path / "md.log", AT)
        m = nvproxy("migrate", str(app.pid), *(["--device", "1"] if device == "other" else []))
        assert m.returncode == 0, m.stdout + m.stderr
    finally:
        err = finished(app, tmp_path / "stderr.txt", TIMEOUT)
    report(err)
    check(tmp_path / "md.log", tpr, "pme-gpu", err)


def test_gromacs_recovered_after_its_proxy_died(tpr: Path, tmp_path: Path) -> None:
    """NVPROXY_RECOVER: at step AT mdrun is stopped (SIGSTOP: the image then holds the GPU state its CPU state
    expects), checkpointed to a file, its proxy killed, and continued; its next call starts a new proxy from the
    image, and the run finishes with the energies of an uninterrupted one."""
    from nvproxy.launcher import find_proxy

    natives(tpr, "pme-gpu")
    image = tmp_path / "last.img"
    cmd, env = mdrun_args(gmx(), tpr, tmp_path / "md", "pme-gpu", LONG)
    app = start(cmd, dict(env, NVPROXY_RECOVER=str(image)), tmp_path / "stderr.txt")
    try:
        wait_for_step(app, tmp_path / "md.log", AT)
        os.kill(app.pid, signal.SIGSTOP)
        try:
            c = nvproxy("checkpoint", str(app.pid), "-o", str(image))
            assert c.returncode == 0, c.stdout + c.stderr
            report(c.stdout + c.stderr, image)
            os.kill(find_proxy(app.pid)[0], signal.SIGKILL)
        finally:
            os.kill(app.pid, signal.SIGCONT)
    finally:
        err = finished(app, tmp_path / "stderr.txt", TIMEOUT)
    assert "starting a new one from" in err, err[-4000:]
    report(err)
    check(tmp_path / "md.log", tpr, "pme-gpu", err)

