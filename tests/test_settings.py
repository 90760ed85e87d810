"""The table of settings (nvproxy/settings.py): complete, rendered, and enforced with one-line errors by
`nvproxy run` and by a proxy as it starts (sim backend)."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import APPS

from nvproxy import nogpu, settings, shim_path

ROOT = Path(__file__).resolve().parents[1]


def _names_in_code() -> set[str]:
    """Every NVPROXY_* name the product's code (Python and C) and the tests' hook library mention, header guards
    aside."""
    names: set[str] = set()
    for base, pattern in (("src", "*.py"), ("native", "*.[ch]"), ("tests/hooks", "*.[ch]")):
        for path in (ROOT / base).rglob(pattern):
            if path.name != "settings.py":
                names |= set(re.findall(r"\bNVPROXY_[A-Z0-9_]*[A-Z0-9]\b", path.read_text(errors="replace")))
    return {n for n in names if not n.endswith("_H")}


def test_every_setting_the_code_reads_is_in_the_table() -> None:
    in_code = _names_in_code()
    table = {s.name for s in settings.SETTINGS if s.name.startswith("NVPROXY_")}
    assert in_code - table - set(settings.INTERNAL) == set()
    assert table - in_code == set(), "settings no code reads any more"
    assert len({s.name for s in settings.SETTINGS}) == len(settings.SETTINGS)


@pytest.mark.parametrize(("name", "value", "message"), [
    ("NVPROXY_SIM_DEVICES", "abc", "NVPROXY_SIM_DEVICES=abc: expected a whole number from 1 to 16"),
    ("NVPROXY_SIM_DEVICES", "0", "NVPROXY_SIM_DEVICES=0: 0 is out of range: expected a whole number from 1 to 16"),
    ("NVPROXY_BACKEND", "cuda", "NVPROXY_BACKEND=cuda: expected auto, gpu or sim"),
    ("NVPROXY_SPIN_US", "-5", "NVPROXY_SPIN_US=-5: expected a whole number from 0 to 200000 (microseconds)"),
    ("NVPROXY_COPY_THREADS", "1000",
     "NVPROXY_COPY_THREADS=1000: 1000 is out of range: expected a whole number from 1 to 8"),
    ("NVPROXY_CKPT_BUFFER", "eager", "NVPROXY_CKPT_BUFFER=eager: expected prefault, lazy or transient"),
    ("NVPROXY_DEBUG", "a b", "NVPROXY_DEBUG=a b: 'a b' is not a word (expected debug flags separated by commas)"),
    ("NVPROXY_PYTHON", "/nonexistent", "NVPROXY_PYTHON=/nonexistent: no such file (expected a Python interpreter "
     "with nvproxy installed: a path, or a name on PATH)"),
    ("NVPROXY_SIM_KERNELS", "/nonexistent.py", "NVPROXY_SIM_KERNELS=/nonexistent.py: /nonexistent.py: No such file "
     "or directory (expected Python files, separated by ':')"),
    ("NVPROXY_PROXY_LOG", "/nonexistent/proxy.log", "NVPROXY_PROXY_LOG=/nonexistent/proxy.log: its directory "
     "/nonexistent does not exist (expected a file this user may create or append to)"),
    ("NVPROXY_IMAGE_DIR", "/nonexistent", "NVPROXY_IMAGE_DIR=/nonexistent: no such directory (expected a writable "
     "directory)"),
    ("NVPROXY_RECOVER", "/nonexistent/a.img", "NVPROXY_RECOVER=/nonexistent/a.img: its directory /nonexistent does "
     "not exist (expected a checkpoint image file; it may be written later, but its directory must exist)"),
    ("NVPROXY_DEVICES", "0,x", "NVPROXY_DEVICES=0,x: 'x' is neither a device number nor a UUID (expected device "
     "numbers or UUIDs separated by commas, as CUDA_VISIBLE_DEVICES)"),
    ("NVPROXY_DMTCP_DIR", "/nonexistent", "NVPROXY_DMTCP_DIR=/nonexistent: no /nonexistent/bin/dmtcp_launch "
     "(expected a DMTCP installation: the directory holding bin/dmtcp_launch)"),
    ("NVPROXY_TRACE", "yes", "NVPROXY_TRACE=yes: expected 1"),
    ("XDG_RUNTIME_DIR", "/tmp/" + "d" * 50, f"XDG_RUNTIME_DIR=/tmp/{'d' * 50}: 55 characters long (expected a "
     "directory whose path has at most 50 characters, for socket paths)"),
])
def test_a_refused_setting_is_named_with_what_it_allows(name: str, value: str, message: str) -> None:
    assert settings.problems({name: value}) == [message]


@pytest.mark.parametrize(("name", "value"), [
    ("NVPROXY_BACKEND", "sim"), ("NVPROXY_SIM_DEVICES", "2"), ("NVPROXY_SPIN_US", "0"),
    ("NVPROXY_COPY_THREADS", "8"), ("NVPROXY_DEBUG", "no-mailbox,answered-copies"),
    ("NVPROXY_DEVICES", "1,GPU-5d2c-01ab"),
    ("NVPROXY_PYTHON", "python3"), ("NVPROXY_SIM_KERNELS", f"{APPS / 'vector_add_sim.py'}:{APPS / 'copies_sim.py'}"),
    ("NVPROXY_CKPT_BUFFER", "transient"), ("NVPROXY_EARLY_CHECK", "load"), ("NVPROXY_TRACE", "1"),
])
def test_allowed_values_pass(name: str, value: str) -> None:
    assert settings.problems({name: value}) == []


def test_image_and_log_paths_may_be_files_yet_to_be_written(tmp_path: Path) -> None:
    assert settings.problems({"NVPROXY_RECOVER": str(tmp_path / "later.img"),
                              "NVPROXY_PROXY_LOG": str(tmp_path / "proxy.log"),
                              "NVPROXY_IMAGE_DIR": str(tmp_path)}) == []
    assert settings.problems({"NVPROXY_PROXY_LOG": str(tmp_path)}) == [
        f"NVPROXY_PROXY_LOG={tmp_path}: is a directory (expected a file this user may create or append to)"]


def _run(args: list[str], **env: str) -> subprocess.CompletedProcess:
    full = {k: v for k, v in os.environ.items() if not k.startswith("NVPROXY_") and k != "LD_PRELOAD"}
    return subprocess.run([sys.executable, "-m", "nvproxy", *args], capture_output=True, text=True,
                          env=dict(full, **env), timeout=120)


@pytest.mark.parametrize(("env", "line"), [
    ({"NVPROXY_SIM_DEVICES": "abc"}, "nvproxy run: NVPROXY_SIM_DEVICES=abc: expected a whole number from 1 to 16"),
    ({"NVPROXY_PYTHON": "/nonexistent"}, "nvproxy run: NVPROXY_PYTHON=/nonexistent: no such file (expected a Python "
     "interpreter with nvproxy installed: a path, or a name on PATH)"),
    ({"NVPROXY_PROXY_LOG": "/proc/self/nonexistent/log"}, "nvproxy run: NVPROXY_PROXY_LOG=/proc/self/nonexistent/log:"
     " its directory /proc/self/nonexistent does not exist (expected a file this user may create or append to)"),
    ({"NVPROXY_COPY_THREADS": "-1"}, "nvproxy run: NVPROXY_COPY_THREADS=-1: expected a whole number from 1 to 8"),
])
def test_run_refuses_a_bad_setting_in_one_line(build, env: dict[str, str], line: str) -> None:
    r = _run(["run", "--backend", "sim", "--sim-kernels", str(APPS / "vector_add_sim.py"), "--",
              str(build("vector_add"))], **env)
    assert (r.returncode, r.stdout, r.stderr) == (2, "", line + "\n")


def test_run_names_a_sim_kernels_option_that_is_no_file(build) -> None:
    r = _run(["run", "--sim-kernels", "/nonexistent.py", "--", str(build("vector_add"))])
    assert (r.returncode, r.stderr) == (2, "nvproxy run: --sim-kernels /nonexistent.py: No such file or directory\n")


def test_run_checks_dmtcp_settings_only_for_dmtcp(build) -> None:
    exe = str(build("vector_add"))
    kernels = ["--sim-kernels", str(APPS / "vector_add_sim.py")]
    r = _run(["run", "--backend", "sim", *kernels, "--dmtcp", "--", exe], NVPROXY_DMTCP_DIR="/nonexistent")
    assert (r.returncode, r.stderr) == (2, "nvproxy run: NVPROXY_DMTCP_DIR=/nonexistent: no /nonexistent/bin/"
                                           "dmtcp_launch (expected a DMTCP installation: the directory holding "
                                           "bin/dmtcp_launch)\n")
    r = _run(["run", "--backend", "sim", *kernels, "--", exe], NVPROXY_DMTCP_DIR="/nonexistent")
    assert r.returncode == 0 and r.stdout.endswith("Test PASSED\n"), r.stderr


def test_run_and_restart_refuse_a_dmtcp_too_new_for_the_plugin(build, tmp_path: Path) -> None:
    """DMTCP 5 changed its plugin interface: `run --dmtcp` and `restart` say so in one line, before anything starts
    (DMTCP itself would stop the program with an assertion once it had started)."""
    (tmp_path / "bin").mkdir()
    for tool in ("dmtcp_launch", "dmtcp_restart"):
        (tmp_path / "bin" / tool).write_text(f"#!/bin/sh\necho '{tool} (DMTCP) 5.0.1'\n")
        (tmp_path / "bin" / tool).chmod(0o755)
    (tmp_path / "ckpt").mkdir()
    (tmp_path / "ckpt" / "ckpt_a.dmtcp").write_bytes(b"")
    exe = str(build("vector_add"))
    for argv, tool in ((["run", "--backend", "sim", "--dmtcp", "--", exe], "dmtcp_launch"),
                       (["restart", str(tmp_path / "ckpt")], "dmtcp_restart")):
        r = _run(argv, NVPROXY_DMTCP_DIR=str(tmp_path))
        assert (r.returncode, r.stdout) == (2, "")
        assert r.stderr == (f"nvproxy: {tmp_path}/bin/{tool} is DMTCP 5.0, whose plugin interface nvproxy's DMTCP "
                            "plugin does not speak (it speaks DMTCP 3 and 4's; tested with DMTCP 4.2.0)\n")


def test_a_proxy_the_shim_starts_refuses_a_bad_setting_in_one_line(build) -> None:
    """No `nvproxy run` to check first: the proxy itself says what is wrong, and the program's call fails."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("NVPROXY_")}
    env.update(LD_PRELOAD=str(shim_path()), NVPROXY_BACKEND="sim", NVPROXY_PYTHON=sys.executable,
               NVPROXY_SIM_DEVICES="abc")
    r = subprocess.run([str(build("vector_add"))], capture_output=True, text=True, env=env, timeout=120)
    assert r.returncode != 0
    assert "nvproxy proxy: NVPROXY_SIM_DEVICES=abc: expected a whole number from 1 to 16\n" in r.stderr
    assert "Traceback" not in r.stderr


def test_settings_command_prints_the_table_and_flags_bad_values() -> None:
    r = _run(["settings"])
    assert r.returncode == 0, r.stderr
    assert all(f"  {s.name}\n" in r.stdout for s in settings.SETTINGS)
    r = _run(["settings"], NVPROXY_SPIN_US="-1")
    assert r.returncode == 2
    assert "set here: -1  <- NOT ALLOWED: expected a whole number from 0 to 200000 (microseconds)" in r.stdout
    md = _run(["settings", "--markdown"]).stdout
    assert md == settings.markdown_table() + "\n"
    assert all((f"| `{s.name}` |" in md) == (s.group != "testing") for s in settings.SETTINGS)


def test_user_guide_holds_the_current_table() -> None:
    guide = ROOT / "docs" / "user-guide.md"
    if not guide.exists():
        pytest.skip("docs/user-guide.md does not exist in this tree")
    text = guide.read_text()
    begin, end = "<!-- settings-table-begin -->\n", "\n<!-- settings-table-end -->"
    assert begin in text and end in text, f"docs/user-guide.md has no table between {begin.strip()} and {end.strip()}"
    table = text.split(begin, 1)[1].split(end, 1)[0]
    assert table == settings.markdown_table(), "put the output of `nvproxy settings --markdown` between the markers"


def test_why_no_gpu_names_the_missing_driver(monkeypatch) -> None:
    def no_lib(name: str):
        raise OSError(f"{name}: cannot open shared object file")

    monkeypatch.setattr(nogpu.ctypes, "CDLL", no_lib)
    assert nogpu.reason(RuntimeError("cuInit failed")) == \
        "no NVIDIA driver (libcuda.so.1 not found)"


def test_why_no_gpu_names_the_devices(monkeypatch) -> None:
    monkeypatch.setattr(nogpu.ctypes, "CDLL", lambda name: object())
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "7")
    assert nogpu.reason(None) == "the driver sees no GPU with CUDA_VISIBLE_DEVICES=7"
    assert nogpu.reason(RuntimeError("cuInit failed: no CUDA-capable device is detected")) == \
        "the driver sees no GPU with CUDA_VISIBLE_DEVICES=7"


def test_run_without_a_driver_says_so(build) -> None:
    import ctypes

    try:
        ctypes.CDLL("libcuda.so.1")
        pytest.skip("this machine has an NVIDIA driver")
    except OSError:
        pass
    r = _run(["run", "--sim-kernels", str(APPS / "vector_add_sim.py"), "--", str(build("vector_add"))])
    assert r.returncode == 0, r.stderr
    assert r.stderr == "nvproxy: no usable GPU: no NVIDIA driver (libcuda.so.1 not found); using the sim backend\n"
