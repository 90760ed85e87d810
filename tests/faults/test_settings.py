"""Every configuration variable with bad values.  The run is refused at once with one line naming the variable, or
it goes on, saying so in a line, to the undisturbed output (or, where the variable acts in a recovery that then
fails, to a clear failure); never a traceback, a hang or lost output.  Variables nvproxy sets itself for the
processes it starts have no effect when a user sets them."""

from __future__ import annotations

import os
import re
import signal
from pathlib import Path

import pytest

from .conftest import SETTINGS
from .scene import FAULT_APPS, HANG_S, START_S, clear_error, cut_short, nothing_said, same_output, succeeded

pytestmark = pytest.mark.faults
ROOT = Path(__file__).resolve().parents[2]
ARGS = ("pinned", "4", "3")  # copy_loop
# bad values of each kind; {dir}: a directory, {file}: a file neither Python nor executable
BAD = {
    "switch": ["banana"],
    "count": ["banana", "-5", "99999999999999999999"],
    "choice": ["banana"],
    "python-files": ["/nonexistent-nvproxy/kernels.py", "{file}"],
    "new-file": ["/nonexistent-nvproxy/out", "{dir}"],
    "image": ["/nonexistent-nvproxy/x.img", "{dir}"],
    "program": ["/nonexistent-nvproxy/python", "{file}"],
    "directory": ["/nonexistent-nvproxy/dir", "{file}"],
    "devices": ["banana"],
    "internal": ["banana"],
}
PATHS = {"python-files", "new-file", "image", "program", "directory", "table"}  # (its error may name the value)
TRIED = ["banana", "-5", "/nonexistent-nvproxy/x", "two words"]  # for a setting only the table knows


def described() -> dict[str, tuple[str, str, list[str]]]:
    """name: (kind, where it acts, bad values) of each variable: settings.py's (and its internal ones) where that
    exists, else conftest.SETTINGS's.  A setting only the table knows gets those of TRIED that its kind refuses."""
    try:
        from nvproxy import settings
    except ImportError:
        return {n: (k, where, BAD[k]) for n, (k, where) in SETTINGS.items()}
    out = {}
    for s in settings.SETTINGS:
        if s.name in SETTINGS:
            kind, where = SETTINGS[s.name]
            out[s.name] = (kind, where, BAD[kind])
        elif refused := [v for v in TRIED if s.kind.problem(v)]:
            out[s.name] = ("table", "run", refused[:2])
    out.update({n: ("internal", "run", BAD["internal"]) for n in getattr(settings, "INTERNAL", {})})
    return out


def cases() -> list:
    return [pytest.param(name, value, id=f"{name}={value}") for name, (_k, _w, bad) in described().items()
            for value in bad]


def read_in_code() -> set[str]:
    """The NVPROXY_* names the product's code reads (string literals of the whole name)."""
    files = [*ROOT.glob("src/nvproxy/**/*.py"), *ROOT.glob("native/**/*.[ch]")]
    return {m for f in files for m in re.findall(r"\"(NVPROXY_[A-Z0-9_]+)\"", f.read_text(errors="replace"))}


def test_every_variable_read_is_described() -> None:
    """A variable the code reads and no table describes has no bad values tried (and no documentation)."""
    assert sorted(read_in_code() - set(described())) == []


@pytest.mark.parametrize(("name", "value"), cases())
def test_a_bad_value(scene, fault_app, reference, name: str, value: str) -> None:
    kind, where, _bad = described()[name]
    value = value.format(dir=scene.image_dir("bad"), file=FAULT_APPS / "copy_loop.cu")
    names = (name, value) if kind in PATHS else name
    if where == "dmtcp":
        r = scene.nvproxy("checkpoint", "--dmtcp", env={name: value})
        assert r.rc != 0, "\n".join(r.out)
        clear_error(r, names, alone=True)
        scene.conclude()
        return
    exe = fault_app("copy_loop")
    ref = reference(exe, *ARGS)
    image = scene.image_dir() / "good.img"
    env = {name: value, **({"NVPROXY_RECOVER": str(image)} if where == "recover" else {})}
    app = scene.start(exe, *ARGS, "gated", env=env, stdin=True)
    app.say()
    if not app.reaches("round 0:", ref.bound):  # refused at once
        app.exit(HANG_S)
        assert app.rc != 0 and app.out == [], "\n".join(app.out)
        assert kind != "internal", f"nvproxy sets {name} itself, yet a user's value stopped the run"
        clear_error(app, names, alone=True)
        scene.conclude()
        return
    if where == "checkpoint":
        r = scene.nvproxy("checkpoint", app.pid, "-o", image)
        if r.rc != 0:
            clear_error(r, names, alone=True)
    if where == "recover":
        r = scene.nvproxy("checkpoint", app.pid, "-o", image)
        assert r.rc == 0, "\n".join(r.out + r.err)
    if where in ("recover", "image"):
        os.kill(scene.proxy_of(app), signal.SIGKILL)
    for _ in range(int(ARGS[2]) - 1):
        app.say()
    app.exit(ref.bound)
    if kind == "internal":
        succeeded(app)
        same_output(app, ref.out)
        nothing_said(app)
    elif where in ("recover", "image") and app.rc != 0:
        cut_short(app, ref.out)
        clear_error(app, names)
    else:
        succeeded(app)
        same_output(app, ref.out)
        clear_error(app, names)
    scene.conclude()


def test_sim_kernels_without_the_programs_kernels(scene, build) -> None:
    """NVPROXY_SIM_KERNELS names Python that lacks the program's kernels: their launches fail (as a kernel without
    code for the device does natively), the program's check of its launch says so and it does not pass; one line
    names the missing kernel."""
    exe = build("vector_add")
    app = scene.start(exe, env={"NVPROXY_SIM_KERNELS": str(ROOT / "tests/apps/copies_sim.py")})
    app.exit(START_S)
    assert app.rc != 0 and "Test PASSED" not in app.out, "\n".join(app.out)
    assert any(x.startswith("FAILED") for x in app.out), "\n".join(app.out)
    clear_error(app, "vecAdd")
    scene.conclude()
