"""Fixtures of the fault suite: a scene per case, the undisturbed runs its programs are compared with, and the
programs of tests/faults/apps."""

from __future__ import annotations

import subprocess
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import pytest

from .scene import FAULT_APPS, HANG_S, START_S, Scene


@pytest.fixture
def scene(request: pytest.FixtureRequest):
    """The case's scene, on the backend its `backend` parameter names (sim without one)."""
    params = getattr(request.node, "callspec", None)
    s = Scene(params.params.get("backend", "sim") if params else "sim")
    try:
        yield s
    finally:
        s.close()


@pytest.fixture(scope="session")
def fault_app(nvcc: str, tmp_path_factory: pytest.TempPathFactory) -> Callable[[str], Path]:
    """A program of tests/faults/apps, built as tests/apps' are (nvcc -cudart shared)."""
    out = tmp_path_factory.mktemp("fault-apps")

    def get(name: str) -> Path:
        exe = out / name
        if not exe.exists():
            subprocess.run([nvcc, "-cudart", "shared", "-o", str(exe), f"{name}.cu"], check=True, cwd=FAULT_APPS)
        return exe

    return get


@dataclass(frozen=True)
class Reference:
    """An undisturbed run: its output, how long it took, and how many requests it sent (with its trace on)."""

    out: list[str]
    seconds: float
    requests: int

    @property
    def bound(self) -> float:
        """The bound on a program's end after a fault: HANG_S beyond twice the undisturbed run (what is left of the
        run, or a new proxy's start, on a loaded machine)."""
        return HANG_S + 2 * self.seconds


@pytest.fixture(scope="session")
def reference() -> Callable[..., Reference]:
    """The undisturbed run of a program with arguments (on a backend; with the shim's trace), made once."""
    made: dict[tuple, Reference] = {}

    def get(exe: Path, *args: object, backend: str = "sim", trace: bool = False) -> Reference:
        key = (exe, args, backend, trace)
        if key not in made:
            s = Scene(backend)
            try:
                t = time.monotonic()
                w = s.start(exe, *args, env={"NVPROXY_TRACE": "1"} if trace else None)
                rc = w.exit(START_S, "the undisturbed run")
                seconds = time.monotonic() - t
                assert rc == 0 and "Test PASSED" in w.out, "the undisturbed run failed:\n" + "\n".join(w.out + w.err)
                s.conclude()
            finally:
                s.close()
            made[key] = Reference(list(w.out), seconds, w.seq)
        return made[key]

    return get


# Every NVPROXY_* variable the product reads: the kind of value it takes (which picks the bad values of
# test_settings.py) and where it acts (the scene that exercises it: "run" the program; "checkpoint" it too;
# "recover" its proxy killed after a checkpoint and recovered from the image, NVPROXY_RECOVER; "image": the value
# is the image that recovery reads; "dmtcp": `nvproxy checkpoint --dmtcp`, which needs no program).  "internal":
# set by nvproxy itself for the processes it starts, where a value of the user's is replaced.
# src/nvproxy/settings.py, where it exists, says which variables there are (test_settings.described); this table
# the kinds and places of those it knows.
SETTINGS: dict[str, tuple[str, str]] = {
    "NVPROXY_BACKEND": ("choice", "run"),
    "NVPROXY_SIM_DEVICES": ("count", "run"),
    "NVPROXY_SIM_KERNELS": ("python-files", "run"),
    "NVPROXY_PROXY_LOG": ("new-file", "run"),
    "NVPROXY_RECOVER": ("image", "image"),
    "NVPROXY_PYTHON": ("program", "recover"),
    "NVPROXY_DMTCP_DIR": ("directory", "dmtcp"),
    "NVPROXY_IMAGE_DIR": ("directory", "run"),
    "NVPROXY_DEVICES": ("devices", "run"),
    "NVPROXY_SPIN_US": ("count", "run"),
    "NVPROXY_COPY_THREADS": ("count", "run"),
    "NVPROXY_CKPT_BUFFER": ("choice", "checkpoint"),
    "NVPROXY_RESTORE_READ": ("choice", "recover"),
    "NVPROXY_EARLY_CHECK": ("choice", "recover"),
    "NVPROXY_EARLY_CONTEXT": ("switch", "run"),
    "NVPROXY_TRACE": ("switch", "run"),
    "NVPROXY_CHECKPOINT_AT": ("count", "run"),
    "NVPROXY_CHECKPOINT_IN": ("choice", "run"),
    "NVPROXY_CHECKPOINT_WAITERS": ("count", "run"),
    "NVPROXY_MIGRATE_AT": ("count", "run"),
    "NVPROXY_CALLS_OUT": ("new-file", "run"),
    "NVPROXY_TEST_PAUSE_MS": ("count", "run"),
    "NVPROXY_LIB_DIR": ("directory", "run"),
    "NVPROXY_LIB_SYNC": ("switch", "run"),
    "NVPROXY_SOCKET": ("internal", "run"),
    "NVPROXY_OWNER_PID": ("internal", "run"),
    "NVPROXY_PROXY_PID": ("internal", "run"),
    "NVPROXY_BOOT": ("internal", "run"),
    "NVPROXY_ROOT": ("internal", "run"),
    "NVPROXY_DMTCP_NOCHECKPOINT": ("internal", "run"),
}
