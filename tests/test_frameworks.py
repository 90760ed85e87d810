"""PyTorch and CuPy through nvproxy (GPU): small programs of our own (tests/frameworks), natively and through
nvproxy, and through nvproxy again while they are migrated (also onto another GPU), recovered after their proxy was
killed, and checkpointed under DMTCP mid-run.  Both programs are deterministic: every run prints the same bits as
a native one, so outputs are compared exactly.  They skip, saying so, where this Python lacks PyTorch or CuPy."""

from __future__ import annotations

import importlib.util
import os
import signal
import subprocess
import sys
import time
from functools import cache
from pathlib import Path

import pytest
from conftest import finished, gpu_count, run
from test_checkpoint import nvproxy
from test_dmtcp import Session

pytestmark = pytest.mark.gpu

HERE = Path(__file__).resolve().parent / "frameworks"
PROGRAMS = {"torch": ("torch_train.py", "torch"), "cupy": ("cupy_ops.py", "cupy")}
TIMEOUT = 600
# runs that are checkpointed: long enough to go on for seconds after the step they are caught at
LONG = {"torch": ("--steps", "40", "--step-ms", "100"), "cupy": ("--rounds", "30", "--round-ms", "100")}
AT = {"torch": "step 8 ", "cupy": "round 6 "}


def program(name: str, *args: str) -> list[str]:
    script, module = PROGRAMS[name]
    if importlib.util.find_spec(module) is None:
        pytest.skip(f"{module} is not installed in this Python ({sys.executable})")
    return [sys.executable, str(HERE / script), *args]


def through(cmd: list[str], *pre: str) -> list[str]:
    return [sys.executable, "-m", "nvproxy", "run", *pre, "--", *cmd]


@cache
def native(name: str, args: tuple[str, ...]) -> str:
    r = run(program(name, *args), timeout=TIMEOUT)
    assert r.returncode == 0, f"native {name} {args}: {r.stderr[-3000:]}"
    again = run(program(name, *args), timeout=TIMEOUT)
    assert again.stdout == r.stdout, "two native runs differ: the program is not deterministic on this machine"
    return r.stdout


@pytest.mark.parametrize("name,args", [("torch", ("--model", "mlp")), ("torch", ("--model", "cnn")),
                                       ("torch", ("--model", "mlp", "--graph")), ("cupy", ())],
                         ids=["torch-mlp", "torch-cnn", "torch-graph", "cupy"])
def test_framework_matches_native(name: str, args: tuple[str, ...]) -> None:
    want = native(name, args)
    r = run(through(program(name, *args)), timeout=TIMEOUT)
    assert r.returncode == 0, r.stderr[-4000:]
    assert r.stdout == want, f"through nvproxy:\n{r.stdout[-2000:]}\nnative:\n{want[-2000:]}\n{r.stderr[-2000:]}"


def start(cmd: list[str], out: Path, err: Path, **env: str) -> subprocess.Popen:
    with open(out, "w") as o, open(err, "w") as e:
        return subprocess.Popen(cmd, stdout=o, stderr=e, env=dict(os.environ, **env))


def wait_for(app: subprocess.Popen, out: Path, text: str) -> None:
    deadline = time.monotonic() + TIMEOUT
    while text not in out.read_text():
        assert app.poll() is None, f"it ended before printing {text!r}"
        assert time.monotonic() < deadline, f"no {text!r} within {TIMEOUT} s"
        time.sleep(0.05)


@pytest.mark.parametrize("name", ["torch", "cupy"])
@pytest.mark.parametrize("how", ["migrate", "migrate-other-gpu", "recover"])
def test_framework_checkpointed_mid_run(name: str, how: str, tmp_path: Path) -> None:
    """Caught mid-run (a training step, a round): migrated to a new proxy (on the same GPU or the other one), or
    stopped, checkpointed to a file and its proxy killed (NVPROXY_RECOVER starts a new one from the image); it goes
    on and prints exactly what a native run prints."""
    from nvproxy.launcher import find_proxy

    if how == "migrate-other-gpu" and gpu_count() < 2:
        pytest.skip("needs two GPUs (nvidia-smi -L lists fewer)")
    args = LONG[name]
    want = native(name, args)
    out, err, image = tmp_path / "out.txt", tmp_path / "err.txt", tmp_path / "last.img"
    env = {"NVPROXY_RECOVER": str(image)} if how == "recover" else {}
    app = start(through(program(name, *args)), out, err, **env)
    try:
        wait_for(app, out, AT[name])
        if how == "recover":
            os.kill(app.pid, signal.SIGSTOP)
            try:
                c = nvproxy("checkpoint", str(app.pid), "-o", str(image))
                assert c.returncode == 0, c.stdout + c.stderr
                os.kill(find_proxy(app.pid)[0], signal.SIGKILL)
            finally:
                os.kill(app.pid, signal.SIGCONT)
        else:
            m = nvproxy("migrate", str(app.pid), *(["--device", "1"] if how == "migrate-other-gpu" else []))
            assert m.returncode == 0, m.stdout + m.stderr
    finally:
        said = finished(app, err, TIMEOUT)
    if how == "recover":
        assert "starting a new one from" in said, said[-4000:]
    assert out.read_text() == want, said[-4000:]


@pytest.mark.parametrize("name", ["torch", "cupy"])
def test_framework_dmtcp_restart_mid_run(name: str, tmp_path: Path) -> None:
    """nvproxy run --dmtcp; caught mid-run, nvproxy checkpoint --dmtcp, kill, nvproxy restart: the restarted
    process goes on from the checkpoint and the whole output is a native run's.  Prints the images' sizes."""
    args = LONG[name]
    want = native(name, args)
    session = Session(tmp_path)
    app = session.launch(through(program(name, *args), "--dmtcp"))
    session.wait_for(app, AT[name], timeout=TIMEOUT)
    session.checkpoint_and_kill(app)
    r = session.restart()
    assert r.returncode == 0, r.stderr[-4000:]
    for image in [*tmp_path.glob("ckpt_*.dmtcp"), *tmp_path.glob("nvproxy-*.img")]:
        print(f"image {image.name}: {image.stat().st_size / 2**20:.1f} MiB")
    assert session.out.read_text() + r.stdout == want, r.stderr[-4000:]
