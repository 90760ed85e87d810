"""Test helpers: build the CUDA test programs with nvcc (-cudart shared) and run
them natively or through nvproxy."""

from __future__ import annotations

import atexit
import functools
import hashlib
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator, Mapping
from pathlib import Path

import pytest

APPS = Path(__file__).resolve().parent / "apps"
EXPECTED = APPS / "expected"
TIMEOUT = 180
HOOKS = Path(__file__).resolve().parent / "hooks"  # the test-only hooks library's sources
HOOKS_LIB = "libnvproxy_testhooks.so"


@pytest.fixture(scope="session", autouse=True)
def no_dead_proxies_sockets() -> Iterator[None]:
    """Tests kill proxies (SIGKILL), whose sockets the next proxy to start removes: the last ones go at the end,
    once the proxies whose programs have ended are gone."""
    yield
    from nvproxy import stale

    stale.sweep_private_dir(settle=30)


@pytest.fixture(scope="session")
def nvcc() -> str:
    path = shutil.which("nvcc")
    if not path:
        pytest.skip("nvcc is not on PATH: the CUDA test programs cannot be built")
    return path


@pytest.fixture(scope="session")
def build(nvcc: str, tmp_path_factory: pytest.TempPathFactory):
    out = tmp_path_factory.mktemp("apps")
    built: dict[tuple[str, tuple[str, ...]], Path] = {}

    def _build(name: str, *flags: str) -> Path:
        key = (name, flags)
        if key not in built:
            tag = "".join(f.replace("=", "_").replace("-", "_") for f in flags)
            if len(tag) > 40 or "/" in tag:  # (paths in the flags: a digest names the build)
                tag = "_" + hashlib.sha1("\0".join(flags).encode()).hexdigest()[:12]
            exe = out / (name + tag)
            subprocess.run([nvcc, "-cudart", "shared", *flags, "-o", str(exe), str(APPS / f"{name}.cu")],
                           check=True, cwd=APPS)
            built[key] = exe
        return built[key]

    return _build


def sim_kernels(name: str) -> list[str]:
    k = APPS / f"{name}_sim.py"
    return ["--sim-kernels", str(k)] if k.exists() else []


def nvproxy_cmd(exe: Path, backend: str, name: str, *args: str) -> list[str]:
    return [sys.executable, "-m", "nvproxy", "run", "--backend", backend, *sim_kernels(name), "--", str(exe), *args]


# The driver now and then reports a device assert as cudaErrorLaunchFailure rather than cudaErrorAssert while other
# programs use the GPU (the GPU suite runs several tests at a time), natively too (NVIDIA's simpleAssert run natively
# beside the suite has shown it); alone, assert runs give cudaErrorAssert.  A run whose output differs from the
# expected one only so is run once more (misreported_assert); the same twice fails.
MISREPORT = (("cudaErrorLaunchFailure", "cudaErrorAssert"),
             ("unspecified launch failure", "device-side assert triggered"))


def misreported_assert(got: str, want: str) -> bool:
    """got differs from want, and only where one says cudaErrorAssert and the other cudaErrorLaunchFailure."""
    def norm(text: str) -> str:
        for a, b in MISREPORT:
            text = text.replace(a, b)
        return text

    if got != want and norm(got) == norm(want):
        print("the driver reported a device assert as a launch failure (conftest.MISREPORT): once more",
              file=sys.stderr)
        return True
    return False


@functools.cache
def hooks_library() -> Path:
    """The test-only hooks library (tests/hooks/: a checkpoint or migration at a chosen call, a pause inside
    cudaHostAlloc, crash traces), built once per test run.  The shim has only the interface (test_hooks.h)."""
    out = Path(tempfile.mkdtemp(prefix="nvproxy-test-hooks-"))
    atexit.register(shutil.rmtree, out, ignore_errors=True)
    lib = out / HOOKS_LIB
    subprocess.run([os.environ.get("CC", "cc"), "-shared", "-fPIC", "-std=gnu11", "-O2", "-Wall", "-Wextra", "-Werror",
                    "-fvisibility=hidden", "-I", str(HOOKS.parent.parent / "native" / "shim"), "-o", str(lib),
                    *sorted(map(str, HOOKS.glob("*.c")))], check=True)
    return lib


def hooked(env: Mapping[str, str] | None = None, **settings: str) -> dict[str, str]:
    """env (os.environ by default) with the test hooks library preloaded (the launcher puts the shim before it)
    and the hooks' settings (NVPROXY_CHECKPOINT_AT, NVPROXY_MIGRATE_AT, ...)."""
    return dict(os.environ if env is None else env, LD_PRELOAD=str(hooks_library()), **settings)


def run(cmd: list[str], **kw) -> subprocess.CompletedProcess:
    """cmd's output and status.  Past the timeout its whole process group is killed and the test fails with what
    it printed: a program that starts others (NVIDIA's simpleIPC) left them holding its pipes, and
    subprocess.run's own timeout then waited for them for ever (two-GPU runs ended with no verdict).  LD_PRELOAD
    goes, unless it is the test hooks library (hooked)."""
    env = dict(kw.pop("env", os.environ))
    if Path(env.get("LD_PRELOAD", "")).name != HOOKS_LIB:
        env.pop("LD_PRELOAD", None)
    timeout = kw.pop("timeout", TIMEOUT)
    with subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env,
                          start_new_session=True, **kw) as p:
        try:
            out, err = p.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            where = _where_they_stand(p.pid)
            os.killpg(p.pid, signal.SIGKILL)
            out, err = p.communicate()
            pytest.fail(f"{' '.join(map(str, cmd))} did not end within {timeout} s; it printed:\n{out}\n{err}\n"
                        f"where its processes stood:\n{where}")
    return subprocess.CompletedProcess(cmd, p.returncode, out, err)


def _where_they_stand(sid: int) -> str:
    """For a run that hung: each process of its session and the proxies serving them (a session of their own),
    their threads' system calls, and (SIGUSR1: the proxy's faulthandler, cli.py) the proxies' Python stacks on
    the stderr they share with the program."""
    procs = {}
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            procs[int(pid)] = (os.getsid(int(pid)), Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0"))
        except OSError:
            continue
    ours = {pid for pid, (s, _cmd) in procs.items() if s == sid}
    proxies = {pid for pid, (_s, cmd) in procs.items()
               if b"--owner-pid" in cmd[:-1] and cmd[cmd.index(b"--owner-pid") + 1].decode().isdigit()
               and int(cmd[cmd.index(b"--owner-pid") + 1]) in ours}
    lines = []
    for pid in sorted(ours | proxies):
        lines.append(f"{pid} {b' '.join(procs[pid][1]).decode(errors='replace')[:200]}")
        try:
            for t in sorted(os.listdir(f"/proc/{pid}/task"), key=int):
                comm = Path(f"/proc/{pid}/task/{t}/comm").read_text().strip()
                call = Path(f"/proc/{pid}/task/{t}/syscall").read_text().split()[:1]
                lines.append(f"  thread {t} {comm}: system call {call}")
            if pid in proxies:
                os.kill(pid, signal.SIGUSR1)
        except OSError:
            continue
    time.sleep(1)  # (the stacks' time to reach stderr)
    return "\n".join(lines)


def gpu_count() -> int:
    """How many GPUs nvidia-smi lists (0 without it)."""
    try:
        out = subprocess.run(["nvidia-smi", "-L"], capture_output=True, text=True, timeout=30).stdout
    except (OSError, subprocess.TimeoutExpired):
        return 0
    return sum(1 for line in out.splitlines() if line.startswith("GPU "))


def finished(app: subprocess.Popen, err: Path, timeout: float) -> str:
    """What a program started with its stderr into the file err wrote there, once it ended (with status 0); killed
    if it runs past timeout."""
    try:
        app.wait(timeout=timeout)
    finally:
        if app.poll() is None:
            app.kill()
    said = err.read_text(errors="replace")
    assert app.returncode == 0, said[-4000:]
    return said
