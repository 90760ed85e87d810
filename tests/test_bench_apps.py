"""`nvproxy bench --apps DIR`: every executable of DIR natively and through nvproxy, its output compared, its times
and first CUDA call reported (sim: the nvproxy runs alone; -m gpu: against native).  No timing is asserted."""

from __future__ import annotations

import json
import platform
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import APPS

BENCH = [sys.executable, "-m", "nvproxy", "bench"]
PROBE = platform.machine() == "x86_64"  # (the first-call probe is x86-64 code)


def _programs(build, names: list[str], directory: Path) -> Path:
    """directory holding the test programs names, each with its sim kernels where it has some."""
    directory.mkdir()
    for name in names:
        (directory / name).symlink_to(build(name))
        kernels = APPS / f"{name}_sim.py"
        if kernels.exists():
            (directory / f"{name}_sim.py").symlink_to(kernels)
    return directory


def _bench(directory: Path, out: Path, *options: str) -> subprocess.CompletedProcess:
    return subprocess.run([*BENCH, "--apps", str(directory), "--out", str(out), *options], capture_output=True,
                          text=True, timeout=900)


def test_apps_on_sim_runs_the_nvproxy_leg_alone(build, tmp_path: Path) -> None:
    directory = _programs(build, ["vector_add", "device_query"], tmp_path / "apps")
    r = _bench(directory, tmp_path / "out", "--reps", "2", "--backend", "sim")
    assert r.returncode == 0, r.stderr
    assert "nvproxy bench: --apps: no native runs (the sim backend has no GPU): nvproxy runs only, no ratios" \
        in r.stderr.splitlines()
    progress = [ln.split(":")[0] for ln in r.stderr.splitlines() if ln.startswith("[")]
    assert progress == [f"[{rep}/2] nvproxy {n}" for rep in (1, 2) for n in ("device_query", "vector_add")]
    got = json.loads((tmp_path / "out" / "apps.json").read_text())
    assert [p["program"] for p in got["programs"]] == ["device_query", "vector_add"]
    for p in got["programs"]:
        assert p["ok"] and p["nvproxy_wall_s"] > 0 and "ratio" not in p and "native_wall_s" not in p
        if PROBE:  # (the probe saw the first call return, through the shim, before the program ended)
            assert 0 < p["nvproxy_first_call_s"] < p["nvproxy_wall_s"] * 2
    assert got["geomean"] is None and got["failed"] == []
    assert "| vector_add |" in (tmp_path / "out" / "apps.md").read_text()


def _script(directory: Path, name: str, body: str) -> None:
    path = directory / name
    path.write_text(f"#!/bin/sh\n{body}\n")
    path.chmod(0o755)


def test_apps_compares_outputs_and_reports_native_failures(tmp_path: Path) -> None:
    """Programs that run without a GPU, natively and through nvproxy (sim): arguments from NAME.args, a program
    whose output differs is a failure, a filter leaves out the lines it matches, a native failure is left out."""
    d = tmp_path / "apps"
    d.mkdir()
    _script(d, "same", 'printf "%s|" "$@"; echo')
    (d / "same.args").write_text("one 'two words' \"three\"\n")
    _script(d, "differs", 'echo "value ${NVPROXY_SOCKET:+through nvproxy}"')
    _script(d, "filtered", 'echo "result 42"; echo "took ${NVPROXY_SOCKET:+9}1 ms"')
    (d / "filtered.filter").write_text("^took \\d+ ms$\n")
    _script(d, "broken", "echo no device >&2; exit 3")
    (d / "notes.txt").write_text("not executable: not a program\n")
    r = _bench(d, tmp_path / "out", "--reps", "1", "--backend", "sim", "--native")
    assert r.returncode == 1, r.stderr
    rows = {p["program"]: p for p in json.loads((tmp_path / "out" / "apps.json").read_text())["programs"]}
    assert sorted(rows) == ["broken", "differs", "filtered", "same"]
    assert rows["same"]["args"] == ["one", "two words", "three"] and rows["same"]["ok"]
    assert rows["same"]["ratio"] > 0 and "meets_target" in rows["same"]
    assert rows["filtered"]["ok"] and "ratio" in rows["filtered"]
    assert not rows["differs"]["ok"] and "ratio" not in rows["differs"]
    assert rows["differs"]["status"] == ("FAILED: the output differs from native (line 1: native 'value ', "
                                         "nvproxy 'value through nvproxy')")
    assert rows["broken"]["ok"] and rows["broken"]["status"] == "fails natively (exit status 3: no device): left out"
    table = r.stdout
    assert "FAILED: differs" in table and "| broken |" in table and "geomean nvproxy/native: " in table


@pytest.mark.parametrize(("files", "message"), [
    ({"a.args": "x 'unclosed"}, "a.args: No closing quotation (expected one line of arguments, quoted as in a shell)"),
    ({"a.filter": "(["}, "a.filter: "),
    ({}, "no executable files in it"),
])
def test_apps_refuses_a_bad_directory_in_one_line(tmp_path: Path, files: dict[str, str], message: str) -> None:
    d = tmp_path / "apps"
    d.mkdir()
    if files:
        _script(d, "a", "true")
    for name, text in files.items():
        (d / name).write_text(text)
    r = _bench(d, tmp_path / "out", "--backend", "sim")
    assert r.returncode != 0
    (line,) = r.stderr.strip().splitlines()
    assert line.startswith("nvproxy bench: ") and message in line and "Traceback" not in r.stderr


@pytest.mark.gpu
def test_gpu_apps_against_native(build, tmp_path: Path) -> None:
    """A few test programs natively and through nvproxy on the GPU: the same output, a ratio and both first-call
    times for each, a geomean, the table, JSON and the plot."""
    names = ["vector_add", "streams_events", "copies", "device_query"]
    directory = _programs(build, names, tmp_path / "apps")
    r = _bench(directory, tmp_path / "out", "--reps", "3", "--backend", "gpu")
    assert r.returncode == 0, r.stdout + r.stderr
    got = json.loads((tmp_path / "out" / "apps.json").read_text())
    assert sorted(p["program"] for p in got["programs"]) == sorted(names)
    for p in got["programs"]:
        assert p["ok"] and "status" not in p, p
        assert p["ratio"] > 0 and p["native_wall_s"] > 0 and isinstance(p["meets_target"], bool)
        if PROBE:
            assert 0 < p["native_first_call_s"] < p["native_wall_s"]
            assert 0 < p["nvproxy_first_call_s"] < p["nvproxy_wall_s"]
    assert got["geomean"] > 0 and isinstance(got["meets_geomean"], bool) and got["failed"] == []
    assert "geomean nvproxy/native: " in r.stdout
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        assert "nvproxy bench: matplotlib is not installed: no apps.png" in r.stderr
    else:
        assert (tmp_path / "out" / "apps.png").stat().st_size > 0
