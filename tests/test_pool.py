"""The pool of warm proxies (nvproxy/pool.py, `nvproxy pool`): a warm proxy is taken by one program only, of its
settings and a backend it runs, is private to its user, serves its program and ends with it, is replaced by one of
its own backend, expires when unused, and leaves no files."""

from __future__ import annotations

import os
import re
import select
import signal
import stat
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from conftest import APPS, nvproxy_cmd, run
from gated import WAIT_S, Gated

from nvproxy.launcher import find_proxy
from nvproxy.pool import serves

STARTED = re.compile(r"nvproxy pool: proxy (\d+) ready at (\S+) ")
# a pool started with no backend named (auto) opens sim on a machine without a GPU, which a sim program takes
AUTO_IS_SIM = pytest.mark.skipif(Path("/dev/nvidiactl").exists(), reason="auto opens the GPU here")


@pytest.fixture
def private(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[dict[str, str], Path]]:
    """(an environment with a private XDG_RUNTIME_DIR of its own, its nvproxy directory); every warm proxy still
    there at the end is stopped."""
    import tempfile

    rt = Path(tempfile.mkdtemp(prefix="nvp-", dir="/tmp"))  # (short: socket paths)
    env = {k: v for k, v in os.environ.items() if k != "LD_PRELOAD" and not k.startswith("NVPROXY_")}
    env["XDG_RUNTIME_DIR"] = str(rt)
    yield env, rt / "nvproxy"
    nvproxy("pool", "stop", env=env)
    subprocess.run(["rm", "-rf", str(rt)], check=False)


def nvproxy(*args: str, env: dict[str, str]) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "nvproxy", *args], capture_output=True, text=True, env=env,
                          timeout=120)


def start_pool(env: dict[str, str], *args: str, app: str = "vector_add", backend: str = "sim") -> list[tuple[int, str]]:
    """`nvproxy pool start` with backend (auto: none named; it is sim where there is no GPU) and app's kernels:
    (pid, socket) of each warm proxy."""
    named = [] if backend == "auto" else ["--backend", backend]
    r = nvproxy("pool", "start", *named, "--sim-kernels", str(APPS / f"{app}_sim.py"), *args, env=env)
    assert r.returncode == 0, r.stderr
    found = [(int(m.group(1)), m.group(2)) for m in STARTED.finditer(r.stdout)]
    assert found, r.stdout
    return found


def ended(pid: int) -> bool:
    """Wait (up to WAIT_S) for pid to end: did it?"""
    try:
        fd = os.pidfd_open(pid)
    except ProcessLookupError:
        return True
    try:
        return bool(select.select([fd], [], [], WAIT_S)[0])
    finally:
        os.close(fd)


def until(cond: Callable[[], bool], what: str) -> None:
    """Until cond() holds (a failure after WAIT_S)."""
    deadline = time.monotonic() + WAIT_S
    while not cond():
        if time.monotonic() > deadline:
            pytest.fail(f"{what} did not happen within {WAIT_S} s")
        time.sleep(0.01)


def pool_sockets(d: Path) -> list[str]:
    return sorted(n for n in os.listdir(d) if n.startswith("pool-"))


@pytest.mark.parametrize("pool_backend", ["sim", pytest.param("auto", marks=AUTO_IS_SIM)])
def test_a_warm_proxy_serves_one_program_ends_with_it_and_is_replaced(build, private, monkeypatch,
                                                                      pool_backend: str) -> None:
    """A program run with --backend sim takes a warm proxy started with sim, or with none named (auto) that
    opened sim; its replacement is started with the backend the taken one was."""
    env, d = private
    monkeypatch.setenv("XDG_RUNTIME_DIR", env["XDG_RUNTIME_DIR"])  # (find_proxy looks there)
    exe = build("ckpt_steps")
    reference = run(nvproxy_cmd(exe, "sim", "ckpt_steps", "5", "0"))
    [(warm, sock)] = start_pool(env, "--idle", "300", app="ckpt_steps", backend=pool_backend)
    assert stat.S_IMODE(os.stat(d).st_mode) == 0o700 and stat.S_IMODE(os.lstat(sock).st_mode) == 0o600
    with Gated(nvproxy_cmd(exe, "sim", "ckpt_steps", "5", "-1"), env) as app:
        app.line()
        pid, serving = find_proxy(app.pid)
        assert pid == warm and Path(serving).name.startswith(f"p{app.pid}-"), (pid, serving)
        assert not os.path.exists(sock)  # (taken: no other program can find it)
        until(lambda: len(pool_sockets(d)) == 1, "a warm proxy in the taken one's place")
        out, err = app.finish()
    assert out == reference.stdout, err
    assert ended(warm), "the taken proxy outlived its program"
    assert [n for n in os.listdir(d) if not n.startswith("pool-")] == [], os.listdir(d)
    [replacement] = [info for info in nvproxy("pool", "status", env=env).stdout.split("\n") if "up" in info]
    assert f"proxy {warm} " not in replacement
    assert f"backend sim (started as {pool_backend})" in replacement, replacement


def test_a_warm_proxy_is_taken_once(build, private) -> None:
    """Two takers of a pool of one: the first gets it, the second none (nothing warm is left); the taken proxy
    serves the first taker's process alone, and ends with it."""
    env, d = private
    [(warm, _sock)] = start_pool(env, "--idle", "300")
    code = ("import os, sys\nfrom nvproxy import launcher, pool\n"
            "env = launcher.proxy_env('sim', [sys.argv[1]])\n"
            "print(pool.take(env)); print(pool.take(env))\n")
    r = subprocess.run([sys.executable, "-c", code, str(APPS / "vector_add_sim.py")], capture_output=True,
                       text=True, env=dict(env, NVPROXY_BACKEND="sim"), timeout=120)
    first, second = r.stdout.splitlines()
    assert f"pid={warm}, " in first and second == "None", r.stdout + r.stderr
    assert ended(warm), "the taken proxy outlived the process that took it"
    assert os.listdir(d) == []


@pytest.mark.parametrize(("named", "other"), [(["--backend", "sim"], {"CUDA_VISIBLE_DEVICES": "0"}), ([], {})],
                         ids=["other-cuda-settings", "auto-program-sim-pool"])
def test_a_program_of_other_settings_takes_no_warm_proxy(build, private, named: list[str],
                                                         other: dict[str, str]) -> None:
    """Nor does a program that names no backend take a proxy started with sim: auto must not depend on what
    the pool was started with (though auto finds sim on a machine without a GPU)."""
    env, d = private
    [(warm, sock)] = start_pool(env, "--idle", "300")
    r = run([sys.executable, "-m", "nvproxy", "run", *named, "--sim-kernels", str(APPS / "vector_add_sim.py"),
             "--", str(build("vector_add"))], env=dict(env, **other))
    assert r.returncode == 0, r.stderr
    assert r.stdout == (APPS / "expected" / "sim" / "vector_add.txt").read_text()
    assert os.path.exists(sock) and pool_sockets(d) == [Path(sock).name]  # (still waiting: not taken, nor another)
    assert f"proxy {warm} " in nvproxy("pool", "status", env=env).stdout


def test_a_warm_proxy_of_another_resolved_backend_says_no_and_waits_on(build, private) -> None:
    """A proxy started with auto refuses a taker that asks for the backend it did not open (gpu, on a machine
    without a GPU), keeps its socket and listens on: a taker that asks for the one it opened then gets it."""
    env, d = private
    [(warm, sock)] = start_pool(env, "--idle", "300", backend="auto")
    listed = re.search(rf"proxy {warm} at {re.escape(sock)}, backend (gpu|sim) \(started as auto\)",
                       nvproxy("pool", "status", env=env).stdout)
    assert listed, "the warm proxy is not listed with its backend"
    opened = listed.group(1)
    code = ("import sys\nfrom nvproxy import launcher, pool\n"
            "print(pool.take(launcher.proxy_env(sys.argv[1], [sys.argv[2]])))\n")
    take = [sys.executable, "-c", code]
    kernels = str(APPS / "vector_add_sim.py")
    r = subprocess.run([*take, {"gpu": "sim", "sim": "gpu"}[opened], kernels], capture_output=True, text=True,
                       env=env, timeout=120)
    assert r.stdout == "None\n", r.stdout + r.stderr
    assert pool_sockets(d) == [Path(sock).name]
    assert f"proxy {warm} at {sock}, backend {opened} " in nvproxy("pool", "status", env=env).stdout
    r = subprocess.run([*take, opened, kernels], capture_output=True, text=True, env=env, timeout=120)
    assert f"pid={warm}, " in r.stdout and "backend='auto'" in r.stdout, r.stdout + r.stderr
    assert ended(warm), "the taken proxy outlived the process that took it"


# (asked, started, resolved) -> served: asked gpu or sim, a proxy that opened it; asked auto, one started with
# auto (it resolved as the program would), or one started with gpu (the GPU proven usable), never sim
SERVES = [
    ("gpu", "gpu", "gpu", True), ("gpu", "auto", "gpu", True), ("gpu", "auto", "sim", False),
    ("gpu", "sim", "sim", False), ("sim", "sim", "sim", True), ("sim", "auto", "sim", True),
    ("sim", "auto", "gpu", False), ("sim", "gpu", "gpu", False), ("auto", "auto", "gpu", True),
    ("auto", "auto", "sim", True), ("auto", "gpu", "gpu", True), ("auto", "sim", "sim", False),
]


@pytest.mark.parametrize(("asked", "started", "resolved", "served"), SERVES)
def test_which_warm_proxy_serves_which_backend(asked: str, started: str, resolved: str, served: bool) -> None:
    assert serves(asked, started, resolved) is served


def test_an_unused_pool_expires_and_leaves_no_files(private) -> None:
    env, d = private
    [(warm, _sock)] = start_pool(env, "--idle", "2")
    assert ended(warm), "a warm proxy outlived its idle time"
    assert os.listdir(d) == []


@pytest.mark.parametrize("how", ["stop", "SIGTERM"])
def test_a_stopped_pool_leaves_no_files(private, how: str) -> None:
    env, d = private
    warm = [pid for pid, _sock in start_pool(env, "--size", "2", "--idle", "300")]
    if how == "stop":
        r = nvproxy("pool", "stop", env=env)
        assert r.returncode == 0 and r.stdout.count("stopped proxy") == 2, r.stdout + r.stderr
    else:
        for pid in warm:
            os.kill(pid, signal.SIGTERM)
    assert all(ended(pid) for pid in warm)
    assert os.listdir(d) == []


def test_a_killed_warm_proxys_socket_is_removed_by_the_next_look(private) -> None:
    env, d = private
    [(warm, _sock)] = start_pool(env, "--idle", "300")
    os.kill(warm, signal.SIGKILL)
    assert ended(warm)
    r = nvproxy("pool", "status", env=env)
    assert r.stdout == "nvproxy pool: no warm proxies\n", r.stdout + r.stderr
    assert os.listdir(d) == []


@pytest.mark.skipif(os.getuid() != 0, reason="needs root, to try as another user")
def test_another_user_cannot_reach_a_warm_proxy(private) -> None:
    env, _d = private
    [(warm, sock)] = start_pool(env, "--idle", "300")
    code = ("import os, socket, sys\nos.setgid(65534); os.setuid(65534)\n"
            "s = socket.socket(socket.AF_UNIX)\n"
            "try:\n    s.connect(sys.argv[1]); print('connected')\nexcept OSError as e:\n    print(type(e).__name__)\n")
    r = subprocess.run([sys.executable, "-S", "-c", code, sock], capture_output=True, text=True, timeout=60)
    assert r.stdout.strip() == "PermissionError", r.stdout + r.stderr
    assert f"proxy {warm} " in nvproxy("pool", "status", env=env).stdout


@pytest.mark.gpu
@pytest.mark.parametrize(("name", "pool_backend", "run_backend"),
                         [("vector_add", "gpu", "gpu"), ("device_query", "gpu", "gpu"), ("vector_add", "auto", "gpu"),
                          ("vector_add", "gpu", "auto"), ("vector_add", "auto", "auto")])
def test_gpu_a_program_a_warm_proxy_serves_matches_native(build, private, name: str, pool_backend: str,
                                                          run_backend: str) -> None:
    """A warm proxy started with gpu, or with none named (auto: it opens the GPU), serves a program that asks
    for gpu or names none."""
    env, d = private
    exe = build(name)
    native = run([str(exe)], env=env)
    r = nvproxy("pool", "start", *([] if pool_backend == "auto" else ["--backend", "gpu"]), env=env)
    [warm] = [int(m.group(1)) for m in STARTED.finditer(r.stdout)]
    proxied = run([sys.executable, "-m", "nvproxy", "run", *([] if run_backend == "auto" else ["--backend", "gpu"]),
                   "--", str(exe)], env=env)
    assert proxied.stdout == native.stdout and proxied.returncode == native.returncode, proxied.stderr
    assert ended(warm), "the warm proxy did not serve the program (or outlived it)"
    assert [n for n in os.listdir(d) if not n.startswith("pool-")] == [], os.listdir(d)
