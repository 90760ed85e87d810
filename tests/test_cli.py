"""The nvproxy command line: what it says and does with good and bad input (sim backend)."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from conftest import APPS, nvproxy_cmd

from nvproxy import cli
from nvproxy.checkpoint.image import read_header


def nvproxy(*args: str, **kw) -> subprocess.CompletedProcess:
    env = {k: v for k, v in kw.pop("env", os.environ).items() if k != "LD_PRELOAD"}
    return subprocess.run([sys.executable, "-m", "nvproxy", *args], capture_output=True, text=True, env=env,
                          timeout=kw.pop("timeout", 120), **kw)


@pytest.fixture
def run_dir(request: pytest.FixtureRequest) -> Path:
    """A private XDG_RUNTIME_DIR, short enough for socket paths."""
    import tempfile

    d = Path(tempfile.mkdtemp(prefix="nvp-", dir="/tmp"))
    request.addfinalizer(lambda: shutil.rmtree(d, ignore_errors=True))
    return d


@pytest.fixture
def waiting_app(build) -> Iterator[subprocess.Popen]:
    """A program under nvproxy (sim) holding device memory, waiting for a line on stdin."""
    p = subprocess.Popen(nvproxy_cmd(build("dead_proxy"), "sim", "dead_proxy"), stdin=subprocess.PIPE,
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    assert p.stdout is not None and p.stdout.readline() == "ready\n"
    yield p
    out, err = p.communicate("\n", timeout=60)
    assert p.returncode == 0, out + err


def test_help_lists_every_command_with_one_line() -> None:
    r = nvproxy("--help")
    assert r.returncode == 0
    listed = r.stdout.split("commands:\n", 1)[1].splitlines()
    for name, line in cli.COMMANDS:
        assert any(entry.split() == [name, *line.split()] for entry in listed), (name, r.stdout)
    names = {name for name, _ in cli.COMMANDS}
    assert names >= {"run", "proxy", "demo", "info", "checkpoint", "restart", "migrate", "bench", "settings"}
    assert sorted(names) == sorted(cli.parser()._subparsers._group_actions[0].choices)  # every command listed


def _no_temporary_files(*dirs: Path) -> list[str]:
    return [p.name for d in dirs for p in d.iterdir() if p.name.endswith(".tmp")]


def test_checkpoint_into_a_directory_writes_an_image_there(waiting_app: subprocess.Popen, tmp_path: Path) -> None:
    out = tmp_path / "images"
    out.mkdir()
    r = nvproxy("checkpoint", str(waiting_app.pid), "-o", str(out))
    image = out / f"nvproxy-{waiting_app.pid}.img"
    assert r.returncode == 0, r.stderr
    assert r.stderr == f"nvproxy checkpoint: {out} is a directory: writing {image}\n"
    assert r.stdout.startswith(f"{image}: ")
    os.close(read_header(str(image))[0])  # (a complete image)
    assert _no_temporary_files(out, tmp_path) == []


@pytest.mark.parametrize(("where", "why"), [("missing/x.img", "no directory {tmp}/missing"),
                                            ("fifo", "it exists and is not a regular file")])
def test_checkpoint_refuses_a_path_it_cannot_write_naming_it(waiting_app: subprocess.Popen, tmp_path: Path,
                                                              where: str, why: str) -> None:
    """(A device or a pipe is not replaced by an image: /dev/null once was.)"""
    target = str(tmp_path / where)
    if where == "fifo":
        os.mkfifo(target)
    r = nvproxy("checkpoint", str(waiting_app.pid), "-o", target)
    assert (r.returncode, r.stdout) == (2, "")
    assert r.stderr == f"nvproxy checkpoint: cannot write {target}: {why.format(tmp=tmp_path)}\n"
    assert _no_temporary_files(tmp_path) == []


@pytest.mark.parametrize("timeout", ["0", "-1", "nan", "soon"])
def test_checkpoint_refuses_a_timeout_that_is_not_positive(timeout: str) -> None:
    r = nvproxy("checkpoint", "1", "--timeout", timeout)
    assert r.returncode == 2
    assert r.stderr.splitlines()[-1] == (f"nvproxy checkpoint: error: argument --timeout: {timeout!r} is not a "
                                         "positive number of seconds")


# ---- nvproxy checkpoint --dmtcp: written means every image complete and on disk ----

SLOW_STEP_LARGE = '''
import time
from pathlib import Path

from nvproxy.sim_kernels import kernel, lookup

plain = lookup("step_large")  # (ckpt_steps_sim.py's, loaded before this file)
calls = [0]


@kernel("step_large")
def step_large(ctx, p, n, small, m):
    """ckpt_steps's kernel, which at its fourth launch runs for {seconds} s, having said so in {mark}."""
    calls[0] += 1
    if calls[0] == 4:
        Path("{mark}").touch()
        time.sleep({seconds})
    plain(ctx, p, n, small, m)
'''


def _dmtcp_session(tmp_path: Path):
    from test_dmtcp import Session

    return Session(tmp_path)


def _until(happened, app: subprocess.Popen, what: str, timeout: float = 60) -> None:
    """Wait until happened() while app runs (polling, as DMTCP's files give no event to wait on)."""
    deadline = time.monotonic() + timeout
    while not happened():
        assert app.poll() is None, f"the program ended before {what}: {app.communicate()[1]}"
        assert time.monotonic() < deadline, f"{what} never came"
        time.sleep(0.02)


def _listed(said: str) -> list[Path]:
    """The image files `nvproxy checkpoint --dmtcp` says it wrote."""
    return [Path(line.split()[0]) for line in said.splitlines() if line.startswith("  /")]


def _slow_ckpt_steps(build, tmp_path: Path, steps: int, pause_ms: int) -> tuple[list[str], Path, list[str]]:
    """(command, mark, reference lines): ckpt_steps under nvproxy (sim) whose fourth step's kernel runs for 5 s,
    having touched mark (through it DMTCP's coordinator still reads RUNNING: the checkpoint waits for the call)."""
    exe = build("ckpt_steps")
    mark = tmp_path / "slow-kernel-running"
    slow = tmp_path / "slow_sim.py"
    slow.write_text(SLOW_STEP_LARGE.format(seconds=5, mark=mark))
    cmd = nvproxy_cmd(exe, "sim", "ckpt_steps", str(steps), str(pause_ms))
    reference = subprocess.run(cmd, capture_output=True, text=True, timeout=120).stdout
    cmd[cmd.index("--"):cmd.index("--")] = ["--sim-kernels", str(slow)]
    return cmd, mark, reference.splitlines(keepends=True)


def test_dmtcp_checkpoint_is_written_when_it_says_so(build, tmp_path: Path) -> None:
    """A checkpoint asked for while the program is inside a long call is reported written only once DMTCP's
    image and the GPU image are complete: a dmtcp_command -k right after leaves both, and the restart goes on
    from there."""
    cmd, mark, reference = _slow_ckpt_steps(build, tmp_path, 12, 0)
    session = _dmtcp_session(tmp_path / "dmtcp")
    app = session.launch(cmd)
    command = [str(session.bin / "dmtcp_command"), "--coord-port", session.port]
    try:
        _until(mark.exists, app, "its slow kernel")
        r = nvproxy("checkpoint", "--dmtcp", "--coord-port", session.port, env=session.env, timeout=300)
        images = _listed(r.stdout)
        assert r.returncode == 0, r.stdout + r.stderr
        assert [p.suffix for p in images] == [".dmtcp", ".img"], r.stdout
        assert all(p.is_file() for p in images), r.stdout
        assert r.stdout.startswith("checkpoint written: 2 images, complete and synced to disk\n")
    finally:
        subprocess.run([*command, "-k"], env=session.env, capture_output=True, timeout=60)
        app.wait(timeout=120)
    assert sorted(session.dir.glob("ckpt_*.dmtcp")) == images[:1] and images[1].is_file()
    after = session.restart()
    lines = after.stdout.splitlines(keepends=True)
    assert lines and lines[0] in reference, after.stderr
    assert lines == reference[reference.index(lines[0]):], after.stderr


def test_dmtcp_checkpoint_of_a_program_that_ends_right_after(build, tmp_path: Path) -> None:
    """Checkpointed after its fourth step (the checkpoint waits for its long call, and comes in the pause after it),
    the program ends a step later, and DMTCP's coordinator with it: the command still reports the checkpoint
    written, and the restart finishes the program as an uninterrupted run does."""
    cmd, mark, reference = _slow_ckpt_steps(build, tmp_path, 5, 100)
    session = _dmtcp_session(tmp_path / "dmtcp")
    app = session.launch(cmd)
    try:
        _until(mark.exists, app, "its slow kernel")
        r = nvproxy("checkpoint", "--dmtcp", "--coord-port", session.port, env=session.env, timeout=300)
    finally:
        _out, err = app.communicate(timeout=120)
    assert r.returncode == 0, r.stdout + r.stderr
    assert len(_listed(r.stdout)) == 2 and all(p.is_file() for p in _listed(r.stdout)), r.stdout
    assert app.returncode == 0, err
    assert session.out.read_text() == "".join(reference)
    after = session.restart()
    lines = after.stdout.splitlines(keepends=True)
    assert after.returncode == 0, after.stderr
    assert lines and lines == reference[len(reference) - len(lines):], after.stderr


def test_dmtcp_checkpoint_without_a_computation_says_so(tmp_path: Path) -> None:
    import socket

    session = _dmtcp_session(tmp_path / "dmtcp")
    try:
        r = nvproxy("checkpoint", "--dmtcp", "--coord-port", session.port, env=session.env)
        assert (r.returncode, r.stdout) == (1, "")
        assert r.stderr == (f"nvproxy checkpoint: no process is connected to the DMTCP coordinator on port "
                            f"{session.port} yet: nothing to checkpoint\n")
    finally:
        subprocess.run([str(session.bin / "dmtcp_command"), "--coord-port", session.port, "-q"], env=session.env,
                       capture_output=True, timeout=60)
    with socket.socket() as s:  # (a port nothing listens on)
        s.bind(("127.0.0.1", 0))
        free = s.getsockname()[1]
    r = nvproxy("checkpoint", "--dmtcp", "--coord-port", str(free), env=session.env)
    assert (r.returncode, r.stderr) == (1, f"nvproxy checkpoint: no DMTCP coordinator answers on port {free} (is the "
                                           "program running under nvproxy run --dmtcp with this --coord-port?)\n")


# ---- the sockets of proxies killed with SIGKILL ----


def _bound(path: Path) -> None:
    """A socket file at path on which nobody listens (what a killed proxy leaves)."""
    import socket

    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
        s.bind(str(path))


def test_sweep_removes_only_the_sockets_of_dead_proxies(run_dir: Path) -> None:
    import socket

    from nvproxy import stale

    me, gone = os.getpid(), 2**22 + 1  # (above pid_max's default: no such process)
    dead = [f"p{gone}-1a.sock", f"p{gone}-1a.sock.{gone}.ctl",  # both ends dead
            f"p{gone}-2b.sock.{me}.ctl",  # its pid runs, but no proxy of it, and nobody listens
            f"p{gone}-3c.sock.{gone}.ctl.{gone}.tmp"]  # bound by a proxy that died before it listened
    starting = f"p{me}-4d.sock"  # its application runs and no control socket yet: a proxy starting
    for name in [*dead, starting]:
        _bound(run_dir / name)
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as live:  # listened on: kept, whatever its pids say
        live.bind(str(run_dir / f"p{gone}-5e.sock.{gone}.ctl"))
        live.listen(1)
        removed = stale.sweep(run_dir)
    assert sorted(p.name for p in removed) == sorted(dead)
    assert sorted(p.name for p in run_dir.iterdir()) == sorted([starting, f"p{gone}-5e.sock.{gone}.ctl"])


def test_a_starting_proxy_removes_a_killed_proxys_sockets(build, run_dir: Path) -> None:
    """A proxy killed with SIGKILL leaves its socket and control socket; the next proxy to start removes them, and
    leaves a live proxy's alone."""
    import select
    import signal

    from nvproxy.launcher import find_proxy

    env = dict({k: v for k, v in os.environ.items() if k != "LD_PRELOAD"}, XDG_RUNTIME_DIR=str(run_dir))
    private = run_dir / "nvproxy"

    def waiting() -> subprocess.Popen:
        p = subprocess.Popen(nvproxy_cmd(build("dead_proxy"), "sim", "dead_proxy"), stdin=subprocess.PIPE,
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
        assert p.stdout is not None
        line = p.stdout.readline()
        assert line == "ready\n", line + p.communicate()[1]
        return p

    killed_app, live_app = waiting(), waiting()
    try:
        killed, _sock = find_proxy(killed_app.pid)
        live, _sock = find_proxy(live_app.pid)
        pidfd = os.pidfd_open(killed)
        os.kill(killed, signal.SIGKILL)
        select.select([pidfd], [], [], 60)  # (readable once it has ended)
        os.close(pidfd)
        killed_app.kill()  # (before its next call: a program that finds its proxy lost removes the sockets itself)
        killed_app.communicate(timeout=60)
        left = sorted(p.name for p in private.iterdir() if f"p{killed_app.pid}-" in p.name)
        assert len(left) == 2, left  # (its socket and control socket)
        r = nvproxy("run", "--backend", "sim", "--sim-kernels", str(APPS / "vector_add_sim.py"), "--",
                    str(build("vector_add")), env=env)
        assert r.returncode == 0, r.stderr
        names = sorted(p.name for p in private.iterdir())
        assert not [n for n in names if f"p{killed_app.pid}-" in n], names
        assert len([n for n in names if f"p{live_app.pid}-" in n]) == 2, names  # (the live proxy's two)
    finally:
        out, err = live_app.communicate("\n", timeout=60)
    assert live_app.returncode == 0, out + err
    assert live in (int(n.split(".")[2]) for n in names if n.endswith(".ctl"))


def test_a_test_session_leaves_no_sockets_behind(tmp_path: Path, run_dir: Path) -> None:
    """A pytest session whose test kills a proxy with SIGKILL leaves none of its sockets (conftest.py)."""
    env = dict({k: v for k, v in os.environ.items() if k != "LD_PRELOAD"}, XDG_RUNTIME_DIR=str(run_dir))
    tests = Path(__file__).resolve().parent
    r = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "--basetemp", str(tmp_path),
                        str(tests / "test_robustness.py"), "-k", "dead_proxy_is_a_clear_error and sim"],
                       capture_output=True, text=True, env=env, timeout=600, cwd=tests.parent)
    assert r.returncode == 0 and "1 passed" in r.stdout, r.stdout + r.stderr
    assert sorted(p.name for p in (run_dir / "nvproxy").iterdir()) == []


# ---- programs nvproxy cannot contain (containment.check_program) ----

REFUSAL = "nvproxy run: PROGRAM links the CUDA runtime statically: rebuild it with nvcc -cudart shared"
WITH_CHECK = f"""
import sys, types
check = types.ModuleType("nvproxy.containment")
check.check_program = lambda argv: {REFUSAL!r}.replace("PROGRAM", argv[0]) if "refuse" in argv else None
sys.modules["nvproxy.containment"] = check
from nvproxy.cli import main
sys.exit(main(sys.argv[1:]))
"""


def _run_checked(run_dir: Path, *args: str) -> subprocess.CompletedProcess:
    """nvproxy with a containment check that refuses any program given the argument 'refuse'."""
    env = dict({k: v for k, v in os.environ.items() if k != "LD_PRELOAD"}, XDG_RUNTIME_DIR=str(run_dir))
    return subprocess.run([sys.executable, "-c", WITH_CHECK, *args], capture_output=True, text=True, env=env,
                          timeout=120)


def test_run_refuses_a_program_it_cannot_contain(run_dir: Path) -> None:
    r = _run_checked(run_dir, "run", "--backend", "sim", "--", "echo", "refuse")
    assert (r.returncode, r.stdout, r.stderr) == (2, "", REFUSAL.replace("PROGRAM", "echo") + "\n")
    assert not (run_dir / "nvproxy").exists()  # (no proxy was started)


def test_allow_unprotected_runs_it_plainly_and_says_so(run_dir: Path) -> None:
    r = _run_checked(run_dir, "run", "--backend", "sim", "--allow-unprotected", "--", "sh", "-c",
                     'echo "LD_PRELOAD=$LD_PRELOAD NVPROXY_SOCKET=$NVPROXY_SOCKET"', "refuse")
    assert r.returncode == 0, r.stderr
    assert r.stdout == "LD_PRELOAD= NVPROXY_SOCKET=\n"  # (no shim, no proxy)
    assert r.stderr == ("nvproxy run: sh runs UNPROTECTED, without nvproxy: no checkpoint can save its GPU "
                        "state\n")
    assert not (run_dir / "nvproxy").exists()


def test_a_program_the_check_passes_runs_through_nvproxy(build, run_dir: Path) -> None:
    r = _run_checked(run_dir, "run", "--backend", "sim", "--sim-kernels", str(APPS / "vector_add_sim.py"), "--",
                     str(build("vector_add")))
    assert r.returncode == 0 and r.stdout.endswith("Test PASSED\n"), r.stderr
    assert (run_dir / "nvproxy").is_dir()


def test_run_refuses_a_static_cuda_runtime_and_runs_it_unprotected_on_request(nvcc: str, tmp_path: Path,
                                                                            run_dir: Path) -> None:
    """vector_add built as nvcc builds by default (its CUDA runtime linked in): refused with the containment
    check's one paragraph; with --allow-unprotected it runs as it is, without shim or proxy."""
    from nvproxy.containment import check_program

    exe = tmp_path / "vector_add_static"
    subprocess.run([nvcc, "-o", str(exe), str(APPS / "vector_add.cu")], check=True, cwd=APPS)
    env = dict({k: v for k, v in os.environ.items() if k != "LD_PRELOAD"}, XDG_RUNTIME_DIR=str(run_dir))
    r = nvproxy("run", "--backend", "sim", "--", str(exe), env=env)
    assert (r.returncode, r.stdout) == (2, "")
    assert r.stderr == check_program([str(exe)]) + "\n" and r.stderr.count("\n") == 1
    assert "nvcc -cudart shared" in r.stderr and "CMAKE_CUDA_RUNTIME_LIBRARY=Shared" in r.stderr
    r = nvproxy("run", "--backend", "sim", "--allow-unprotected", "--", str(exe), env=env)
    assert r.stderr.splitlines()[0] == (f"nvproxy run: {exe} runs UNPROTECTED, without nvproxy: no checkpoint can "
                                        "save its GPU state")
    assert "nvproxy:" not in r.stdout + "\n".join(r.stderr.splitlines()[1:])  # (nothing of nvproxy's past that)
    assert not (run_dir / "nvproxy").exists()  # (no proxy)
