"""PyTorch and CuPy through nvproxy (GPU): small programs of our own (tests/frameworks), natively and through
nvproxy, and through nvproxy again while they are migrated (also onto another GPU), recovered after their proxy was
killed, and checkpointed under DMTCP mid-run.  Both programs are deterministic: every run prints the same bits as
a native one, so outputs are compared exactly.  They skip, saying so, where this Python lacks PyTorch or CuPy."""

from __future__ import annotations

import importlib.util
import os
import re
import signal
import subprocess
import sys
import time
from functools import cache
from pathlib import Path

import pytest
from conftest import finished, gpu_count, run
from test_checkpoint import nvproxy
from test_dmtcp import Session, _after_restart

pytestmark = pytest.mark.gpu

HERE = Path(__file__).resolve().parent / "frameworks"
PROGRAMS = {"torch": ("torch_train.py", "torch"), "cupy": ("cupy_ops.py", "cupy")}
RUNTIME_MODULES = {"cupy": "cupy_backends.cuda.api.runtime"}  # (the module whose calls reach the runtime)
TIMEOUT = 600
# runs that are checkpointed: long enough to go on for seconds after the step they are caught at
LONG = {"torch": ("--steps", "40", "--step-ms", "100"), "cupy": ("--rounds", "30", "--round-ms", "100")}
AT = {"torch": "step 8 ", "cupy": "round 6 "}


def program(name: str, *args: str, through_nvproxy: bool = True) -> list[str]:
    script, module = PROGRAMS[name]
    if importlib.util.find_spec(module) is None:
        pytest.skip(f"{module} is not installed in this Python ({sys.executable})")
    if through_nvproxy and (carried := carried_runtime(name)):
        pytest.skip(f"{carried[0]} carries its own CUDA runtime ({carried[1]}): nvproxy refuses it, as "
                    "test_framework_with_its_own_runtime_is_refused_loudly checks")
    return [sys.executable, str(HERE / script), *args]


@cache
def carried_runtime(name: str) -> tuple[Path, str] | None:
    """The framework's runtime module and how it shows a CUDA runtime linked into it, if it does (CuPy's wheels
    link the runtime statically into each of their modules)."""
    from nvproxy.containment import own_runtime

    try:
        spec = importlib.util.find_spec(RUNTIME_MODULES[name]) if name in RUNTIME_MODULES else None
    except ModuleNotFoundError:  # (its package is not installed)
        return None
    if spec is None or not spec.origin:
        return None
    cause = own_runtime(Path(spec.origin))
    return (Path(spec.origin), cause) if cause else None


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
    process goes on from the checkpoint, printing the rest of a native run from there to the end, and leaves out
    nothing: the killed one had printed up to there at least (it runs on after the checkpoint until it is killed;
    a large image takes a while).  Prints the images' sizes."""
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
    before, lines = session.out.read_text(), want.splitlines(keepends=True)
    assert want.startswith(before), before[-2000:]
    _after_restart(lines, r)
    first = lines.index(r.stdout.splitlines(keepends=True)[0])
    assert len("".join(lines[:first])) <= len(before), (before[-2000:], r.stdout[:2000])


@pytest.mark.parametrize("name", ["cupy"])
def test_framework_with_its_own_runtime_is_refused_loudly(name: str) -> None:
    """A framework whose modules carry a CUDA runtime linked statically cannot be served: under nvproxy its first
    CUDA call fails, with one line naming the module that carries the runtime, and nothing runs on the GPU beside
    the proxy."""
    from nvproxy.containment import own_runtime

    cmd = program(name, through_nvproxy=False)
    if carried_runtime(name) is None:
        pytest.skip(f"this {name} uses the shared CUDA runtime: the tests through nvproxy serve it")
    r = run(through(cmd), timeout=TIMEOUT)
    said = [ln for ln in r.stderr.splitlines() if "cuGetExportTable called from" in ln]
    assert r.returncode != 0 and "round" not in r.stdout, r.stdout + r.stderr[-3000:]
    assert len(said) == 1 and "its own CUDA runtime" in said[0], r.stderr[-3000:]
    named = re.search(r"called from (\S+): ", said[0])  # (whichever of its modules first reached the runtime)
    assert named and own_runtime(Path(named.group(1))), said[0]
