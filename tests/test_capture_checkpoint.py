"""Checkpoints while stream captures are on (tests/apps/capture_ckpt.cu): a global-mode capture that forks to a second
stream, begun while slow work still runs on its stream; and a thread-local capture beside a relaxed one that another
thread began.  Migrated at calls inside the captures, checkpointed there (the same proxy goes on, or it is killed and
the program recovers from the image), and checkpointed under DMTCP at such a call and restarted, the program prints
what an uninterrupted run prints (on a GPU: what it prints natively).  The driver refuses to synchronise a context
while a capture is on, and a refused call invalidates the capture: the sim backend refuses the same calls."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest
from conftest import hooked, nvproxy_cmd, run
from test_checkpoint import nvproxy
from test_dmtcp import Session

BACKENDS = ["sim", pytest.param("gpu", marks=pytest.mark.gpu)]
MODES = ["global", "threads"]
NAME = "capture_ckpt"


def reference(exe: Path, backend: str, mode: str) -> str:
    """What the program prints uninterrupted: natively on a GPU, through the sim backend on sim."""
    r = run([str(exe), mode] if backend == "gpu" else nvproxy_cmd(exe, backend, NAME, mode))
    assert r.returncode == 0 and r.stdout.endswith("Test PASSED\n"), r.stdout + r.stderr[-3000:]
    return r.stdout


def calls_before(exe: Path, backend: str, mode: str, stop: str, tmp_path: Path) -> int:
    """How many CUDA calls the program makes before it stops at `stop` (begin: every capture has begun; end: the
    first capture is about to end)."""
    out = tmp_path / f"calls-{mode}-{stop}"
    r = run(nvproxy_cmd(exe, backend, NAME, mode, stop), env=hooked(NVPROXY_CALLS_OUT=str(out)))
    assert r.returncode == 0 and out.exists(), r.stdout + r.stderr[-3000:]
    return int(out.read_text().split()[0])


def inside(exe: Path, backend: str, mode: str, tmp_path: Path) -> list[int]:
    """Calls that begin while every capture is on: the first, the middle one and the capture's end."""
    first, last = calls_before(exe, backend, mode, "begin", tmp_path), calls_before(exe, backend, mode, "end",
                                                                                      tmp_path)
    assert first < last, (first, last)
    return sorted({first + 1, (first + last) // 2 + 1, last + 1})


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("mode", MODES)
def test_migrated_inside_captures(build, backend: str, mode: str, tmp_path: Path) -> None:
    exe = build(NAME)
    want = reference(exe, backend, mode)
    for call in inside(exe, backend, mode, tmp_path):
        r = run(nvproxy_cmd(exe, backend, NAME, mode), env=hooked(NVPROXY_MIGRATE_AT=str(call)))
        where = f"migrated at call {call}"
        assert r.returncode == 0 and "migrated process" in r.stderr, f"{where}: {r.stdout[-2000:]}{r.stderr[-4000:]}"
        assert r.stdout == want, f"{where}: {r.stderr[-4000:]}"


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("then", ["go-on", "recover"])
def test_checkpointed_inside_captures(build, backend: str, mode: str, then: str, tmp_path: Path) -> None:
    """nvproxy checkpoint while the program pauses inside its captures; then the same proxy goes on (its captures
    must still be valid), or (NVPROXY_RECOVER) the proxy is killed and the program's next call starts a new one from
    the image, which begins the captures again."""
    from nvproxy.launcher import find_proxy

    exe = build(NAME)
    want = reference(exe, backend, mode)
    image = tmp_path / "inside.img"
    env = dict(os.environ, NVPROXY_RECOVER=str(image))
    env.pop("LD_PRELOAD", None)
    app = subprocess.Popen(nvproxy_cmd(exe, backend, NAME, mode, "run", "3000"), stdout=subprocess.PIPE,
                           stderr=subprocess.PIPE, text=True, env=env)
    assert app.stdout is not None
    try:
        lines = []
        while not lines or lines[-1] != "capturing\n":
            lines.append(app.stdout.readline())
            assert lines[-1], app.communicate()[1][-4000:]
        c = nvproxy("checkpoint", str(app.pid), "-o", str(image))
        assert c.returncode == 0, c.stdout + c.stderr
        if then == "recover":
            os.kill(find_proxy(app.pid)[0], 9)
        out, err = app.communicate(timeout=300)
    finally:
        if app.poll() is None:
            app.kill()
    assert ("starting a new one from" in err) == (then == "recover"), err[-4000:]
    assert "".join(lines).replace("capturing\n", "") + out == want, err[-4000:]
    assert app.returncode == 0, err[-4000:]


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("mode", MODES)
def test_dmtcp_restart_inside_captures(build, backend: str, mode: str, tmp_path: Path) -> None:
    """Checkpointed under DMTCP at the middle call inside the captures, killed and restarted: what it printed before
    and after is the uninterrupted run's output."""
    session = Session(tmp_path / "dmtcp")
    exe = build(NAME)
    want = reference(exe, backend, mode)
    call = inside(exe, backend, mode, tmp_path)[1]
    session.checkpoint_at_call(nvproxy_cmd(exe, backend, NAME, mode), call)
    r = session.restart()
    assert r.returncode == 0, r.stderr[-4000:]
    assert session.out.read_text() + r.stdout == want, f"checkpointed at call {call}: {r.stderr[-4000:]}"
    assert "restoring the GPU state" in r.stderr
