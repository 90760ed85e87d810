"""Concurrent checkpoints: the application goes on while its image is copied out, and the image is still the state
at the cut.  A program is checkpointed at a random step twice: stopped (the reference image), then concurrently while
it runs its next steps; both images must hold the same bytes in every region.  Then a concurrent incremental image is
taken at a later step and the program, its proxy killed, recovers from it and prints what an uninterrupted run
prints.  Each way of saving memory is forced in turn: a snapshot in spare device memory, copy-before-write, both
(spare memory too short), stop-the-world; the programs write through pointers stored in device memory (one also
through an address no analysis could see), in a captured graph, by a library call, on many streams."""

from __future__ import annotations

import os
import random
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import APPS, nvproxy_cmd, run
from gated import Gated, kill_and_wait

from nvproxy.checkpoint.image import read_header

BACKENDS = ["sim", pytest.param("gpu", marks=pytest.mark.gpu)]
STEPS = 10
FAKES = Path(__file__).resolve().parent / "libfakes"
# the proxy's settings that force each way, and the methods the checkpoint must then report
MODES = {
    "snapshot": ({}, "snapshot"),
    "copy-before-write": ({"NVPROXY_CKPT_SPARE": "0"}, "copy-before-write"),
    "spare-too-short": ({"NVPROXY_CKPT_SPARE": "16"}, "snapshot, copy-before-write"),
    "stop-the-world": ({"NVPROXY_CKPT_SPARE": "0", "NVPROXY_CKPT_COW": "0"}, "stop-the-world"),
}


@pytest.fixture(scope="module")
def programs(nvcc: str, tmp_path_factory: pytest.TempPathFactory) -> dict[str, tuple[Path, dict[str, str]]]:
    """backend -> (concurrent_ckpt built for it, the environment it runs in): on sim linked against the cuBLAS
    stand-in (tests/libfakes), which the proxy loads too; on the GPU against cuBLAS."""
    d = tmp_path_factory.mktemp("concurrent")
    subprocess.run(["gcc", "-shared", "-fPIC", "-O1", "-o", str(d / "libcublas.so.13"), str(FAKES / "fake_cublas.c"),
                    "-lm"], check=True)
    (d / "libcublas.so").symlink_to("libcublas.so.13")
    src = str(APPS / "concurrent_ckpt.cu")
    subprocess.run([nvcc, "-cudart", "shared", "-o", str(d / "sim"), src, f"-L{d}", "-lcublas", "-Xlinker",
                    f"-rpath={d}"], check=True, cwd=APPS)
    out = {"sim": (d / "sim", {"NVPROXY_LIB_DIR": str(d)})}
    if subprocess.run([nvcc, "-cudart", "shared", "-o", str(d / "gpu"), src, "-lcublas"], cwd=APPS).returncode == 0:
        out["gpu"] = (d / "gpu", {})
    return out


def nvproxy(*args: str) -> subprocess.CompletedProcess:
    return run([sys.executable, "-m", "nvproxy", *args], timeout=300)


def region_sums(image: Path) -> dict[tuple, list[int]]:
    fd, header = read_header(image)
    os.close(fd)
    return {(r["kind"], r.get("va"), r.get("id"), r.get("name")): r["crcs"] for r in header["regions"]}


def concurrent_while_running(app: Gated, image: Path, steps: int, *flags: str) -> str:
    """A concurrent checkpoint of the program (waiting for a line, between two steps), which is let go for steps
    more steps as soon as the checkpoint says it went on; the checkpoint's output."""
    p = subprocess.Popen([sys.executable, "-m", "nvproxy", "checkpoint", str(app.pid), "-o", str(image),
                          "--concurrent", *flags], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    assert p.stdout is not None
    first = p.stdout.readline()
    assert "the application went on after" in first, first + p.communicate()[1]
    for _ in range(steps):
        app.go()
    out, err = p.communicate(timeout=300)
    assert p.returncode == 0, first + out + err
    return first + out + err


def check_program(app_cmd: list[str], env: dict[str, str], tmp_path: Path, methods: str) -> None:
    reference = run(app_cmd, stdin=subprocess.DEVNULL, env=env)
    assert reference.returncode == 0 and "Test PASSED" in reference.stdout, reference.stdout + reference.stderr
    rng = random.Random(int(os.environ.get("NVPROXY_TEST_SEED", "0")) or None)
    first, second = sorted(rng.sample(range(1, STEPS - 3), 2))
    stopped, running = tmp_path / "stopped.img", tmp_path / "running.img"
    env = dict(env, NVPROXY_RECOVER=str(running))
    env.pop("LD_PRELOAD", None)
    with Gated(app_cmd, env) as app:
        app.line()
        for _ in range(first):
            app.go()
        r = nvproxy("checkpoint", str(app.pid), "-o", str(stopped), "--no-concurrent")
        assert r.returncode == 0 and "concurrent (" not in r.stdout, r.stdout + r.stderr
        said = concurrent_while_running(app, running, 2)
        assert f"concurrent ({methods})" in said, said
        assert region_sums(running) == region_sums(stopped), said
        for _ in range(second - first):
            app.go()
        said = concurrent_while_running(app, running, 0, "--incremental")
        assert f"concurrent ({methods})" in said and "incremental:" in said, said
        from nvproxy.launcher import find_proxy

        kill_and_wait(find_proxy(app.pid)[0])
        out, err = app.finish()
    assert "starting a new one from" in err, err
    assert out == reference.stdout, err


@pytest.mark.parametrize("mode", list(MODES))
@pytest.mark.parametrize("backend", BACKENDS)
def test_concurrent_images_are_the_state_at_the_cut(programs, backend: str, mode: str, tmp_path: Path) -> None:
    """Many streams, a graph, a cuBLAS call and pointers built on the device, with each way of saving memory."""
    if backend not in programs:
        pytest.fail("the program could not be built against cuBLAS")
    exe, env = programs[backend]
    settings, methods = MODES[mode]
    cmd = nvproxy_cmd(exe, backend, "concurrent_ckpt", str(STEPS))
    check_program(cmd, dict(os.environ, **env, **settings), tmp_path, methods)


@pytest.mark.parametrize("mode", ["copy-before-write", "spare-too-short"])
@pytest.mark.parametrize("backend", BACKENDS)
def test_concurrent_images_of_kernels_that_defeat_write_tracking(build, backend: str, mode: str,
                                                                  tmp_path: Path) -> None:
    """A kernel writes another allocation through an offset past the end of its own: copy-before-write does not
    trust the analysis of a kernel's reach (every kernel saves what is unsaved first), so the image is still exact."""
    settings, methods = MODES[mode]
    cmd = nvproxy_cmd(build("incremental"), backend, "incremental", str(STEPS), "defeat")
    check_program(cmd, dict(os.environ, **settings), tmp_path, methods)


def test_spare_device_memory_of_a_small_device(programs, tmp_path: Path) -> None:
    """A device whose free memory holds only part of the program's (NVPROXY_SIM_MEMORY): the snapshot takes what
    fits, copy-before-write the rest."""
    exe, env = programs["sim"]
    cmd = nvproxy_cmd(exe, "sim", "concurrent_ckpt", str(STEPS))
    check_program(cmd, dict(os.environ, **env, NVPROXY_SIM_MEMORY="96"), tmp_path, "snapshot, copy-before-write")
