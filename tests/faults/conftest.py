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
