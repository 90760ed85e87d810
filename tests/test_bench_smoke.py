"""The benchmark suite runs and writes its outputs (tiny sizes, sim backend), from this tree and from a wheel
installed elsewhere; with -m gpu, the library benchmarks natively and through nvproxy.  No timing is asserted:
benchmarks are not tests."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
BENCH = [sys.executable, "-m", "nvproxy", "bench"]
SIM_SKIP = "nvproxy bench: library benchmarks skipped: the sim backend has no GPU math libraries"


def test_bench_smoke(nvcc: str, tmp_path: Path) -> None:
    r = subprocess.run([*BENCH, "--quick", "--reps", "1", "--backend", "sim", "--out", str(tmp_path),
                        "--variant", "sockets:NVPROXY_DEBUG=no-mailbox"], capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stderr
    assert SIM_SKIP in r.stderr.splitlines()  # (the library suite is part of the default run)
    rows = json.loads((tmp_path / "results.json").read_text())["rows"]
    assert {row["bench"] for row in rows} >= {"launch_empty", "launch_sync", "malloc_free", "h2d_pageable",
                                              "async_4streams", "launch_storm", "ckpt_dump", "ckpt_restore",
                                              "ckpt_restore_file", "ckpt_recover_file", "ckpt_stall_stw",
                                              "ckpt_stall_concurrent", "ckpt_concurrent_slowdown",
                                              "ckpt_incremental_written"}
    # the variant (an A/B of the transport) ran the same microbenchmarks
    assert all("sockets" in row for row in rows if row["bench"] in ("launch_empty", "h2d_pageable"))
    table = (tmp_path / "results.md").read_text()
    assert "| launch_empty |" in table and "| sockets |" in table
    # each checkpoint measurement as taken, a file restore's phases among them
    runs = json.loads((tmp_path / "checkpoint-runs.json").read_text())
    assert runs and all(r["verified"] and "file_restore_phases_s" in r for r in runs)
    # a concurrent checkpoint of a program that kept computing, which then verified its memory
    runs = json.loads((tmp_path / "concurrent-runs.json").read_text())
    assert runs and all(r["verified"] and r["concurrent_methods"] for r in runs)
    # DMTCP checkpoints of the same kind of program, the GPU image written before DMTCP's and beside it, where
    # DMTCP is installed; one line where it is not
    dmtcp_rows = {f"ckpt_dmtcp_{what}_{mode}" for what in ("stop", "command")
                  for mode in ("serial", "overlap", "concurrent")}
    if any(line.startswith("nvproxy bench: no DMTCP checkpoint rows") for line in r.stderr.splitlines()):
        assert not dmtcp_rows & {row["bench"] for row in rows}
    else:
        assert {row["bench"] for row in rows} >= dmtcp_rows
        runs = json.loads((tmp_path / "dmtcp-stop-runs.json").read_text())
        assert len(runs) == 3 and all(r["verified"] and r["stop_s"] >= 0 for r in runs)


@pytest.mark.parametrize("suite,skip", [("libs", SIM_SKIP),
                                        ("torch", "nvproxy bench: torch benchmarks skipped: the sim backend runs "
                                                  "no PyTorch")])
def test_bench_gpu_only_suite_alone_is_skipped_on_sim(nvcc: str, tmp_path: Path, suite: str, skip: str) -> None:
    """`--suite libs` (`torch`) runs the library (PyTorch) benchmarks only; the sim backend has no libraries (no
    PyTorch), which one line says, and nothing else runs."""
    r = subprocess.run([*BENCH, "--suite", suite, "--quick", "--reps", "1", "--backend", "sim", "--out",
                        str(tmp_path)], capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    assert [ln for ln in r.stderr.splitlines() if ln.startswith("nvproxy bench:")] == [skip], r.stderr
    assert "Traceback" not in r.stderr and not any(ln.startswith("[1/1]") for ln in r.stderr.splitlines())
    assert json.loads((tmp_path / "results.json").read_text())["rows"] == []


def test_bench_suite_selection(nvcc: str, tmp_path: Path) -> None:
    """`--suite micro` runs the microbenchmarks alone (no library line, no checkpoints); an unknown suite is
    refused in one line."""
    r = subprocess.run([*BENCH, "--suite", "micro", "--quick", "--reps", "1", "--backend", "sim", "--out",
                        str(tmp_path)], capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    assert "library benchmarks" not in r.stderr
    assert [ln for ln in r.stderr.splitlines() if ln.startswith("[1/1]")] == ["[1/1] nvproxy microbench"]
    benches = {row["bench"] for row in json.loads((tmp_path / "results.json").read_text())["rows"]}
    assert "launch_empty" in benches and not any(b.startswith("ckpt_") for b in benches)
    r = subprocess.run([*BENCH, "--suite", "micro,blas"], capture_output=True, text=True, timeout=60)
    assert r.returncode != 0
    assert r.stderr.strip().splitlines() == [
        "nvproxy bench: --suite 'micro,blas': expected a comma-separated list of micro, libs, ckpt, torch (or all)"]


def test_library_targets_and_result_checks() -> None:
    """Each library row's target follows its call's class and unit; a benchmark whose runs computed different
    results (nvproxy's checksum is not native's, or a round's is not another's) is named, and only it."""
    from nvproxy.bench import libs

    assert libs.target("sgemm_large", "TFLOP/s") == (">=", 0.98)
    assert libs.target("sgemm_small_sync", "us") == ("<=", 1.25)
    assert libs.target("sgemm_batched", "GFLOP/s") == (">=", 0.8)
    assert libs.target("launch_empty", "us") is None
    from nvproxy.bench import frameworks

    assert frameworks.target("torch resnet18 step", "ms") == ("<=", 1.05)
    assert frameworks.target("torch first tensor", "s") is None
    assert libs.meets((">=", 0.98), 0.99) and not libs.meets(("<=", 1.25), 1.27)
    checks = {("fft_c2c_3d", 128): {"native": {"00ab"}, "nvproxy": {"00ab", "00ac"}},
              ("spmv_csr", 4096): {"native": {"0f00"}, "nvproxy": {"0f00"}}}
    differs = libs.different_results(checks)
    assert list(differs) == [("fft_c2c_3d", 128)]
    assert "native 00ab; nvproxy 00ab, 00ac" in differs[("fft_c2c_3d", 128)]


@pytest.mark.gpu
def test_gpu_library_bench(nvcc: str, tmp_path: Path) -> None:
    """The library benchmarks at their quick sizes, natively and through nvproxy: every one gives a row with a
    ratio and its target (each run checks its results, and the runs computed the same ones)."""
    from nvproxy.bench import libs

    r = subprocess.run([*BENCH, "--suite", "libs", "--quick", "--reps", "1", "--backend", "gpu", "--out",
                        str(tmp_path)], capture_output=True, text=True, timeout=900)
    assert r.returncode == 0, r.stderr
    rows = json.loads((tmp_path / "results.json").read_text())["rows"]
    assert {row["bench"] for row in rows} == set(libs.CLASS)
    assert all(row["ratio"] > 0 and "target" in row and "meets_target" in row for row in rows), rows
    table = (tmp_path / "results.md").read_text()
    assert all(f"| {row['bench']} |" in table for row in rows)
    assert table.count(": pass |") + table.count(": miss |") == len(rows)


def test_bench_stopped_early_keeps_the_rounds_it_finished(nvcc: str, tmp_path: Path) -> None:
    """A run stopped in its second round (a time limit on the GPU machine ended one with nothing written) leaves
    the first round's results."""
    p = subprocess.Popen([*BENCH, "--quick", "--reps", "2", "--backend", "sim", "--out", str(tmp_path),
                          "--checkpoint-sizes", "none"], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    assert p.stderr is not None
    try:
        for line in p.stderr:
            if line.startswith("[2/2]"):
                break
    finally:
        p.kill()
        p.wait(timeout=60)
    got = json.loads((tmp_path / "results.json").read_text())
    assert got["reps"] == 1
    assert {row["bench"] for row in got["rows"]} >= {"launch_empty", "h2d_pageable", "launch_storm"}
    assert "| launch_empty |" in (tmp_path / "results.md").read_text()


def test_bench_runs_from_an_installed_wheel(nvcc: str, tmp_path: Path) -> None:
    """`pip wheel .`, installed into a directory of its own, away from this tree: `nvproxy bench --quick` builds
    its CUDA program into the user's cache on first use and runs it through that installed copy (sim: no native
    run without a GPU)."""
    wheels, site, cache, out, elsewhere = (tmp_path / d for d in ("wheels", "site", "cache", "out", "elsewhere"))
    elsewhere.mkdir()
    pip = [sys.executable, "-m", "pip", "-q", "--disable-pip-version-check"]
    r = subprocess.run([*pip, "wheel", str(ROOT), "--no-deps", "-w", str(wheels)],
                       capture_output=True, text=True, timeout=900)
    assert r.returncode == 0, r.stdout + r.stderr
    (wheel,) = wheels.glob("nvproxy-*.whl")
    r = subprocess.run([*pip, "install", "--no-deps", "--no-index", "--target", str(site), str(wheel)],
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stdout + r.stderr
    env = {k: v for k, v in os.environ.items() if not k.startswith("NVPROXY_") and k != "LD_PRELOAD"}
    env.update(PYTHONPATH=str(site), XDG_CACHE_HOME=str(cache))
    where = subprocess.run([sys.executable, "-c", "import nvproxy.bench.run as m; print(m.__file__)"],
                           capture_output=True, text=True, env=env, cwd=elsewhere, timeout=60).stdout.strip()
    assert where == str(site / "nvproxy" / "bench" / "run.py")
    r = subprocess.run([str(site / "bin" / "nvproxy"), "bench", "--quick", "--reps", "1", "--backend", "sim",
                        "--checkpoint-sizes", "none", "--out", str(out)], capture_output=True, text=True,
                       env=env, cwd=elsewhere, timeout=900)
    assert r.returncode == 0, r.stderr
    rows = json.loads((out / "results.json").read_text())["rows"]
    assert {row["bench"] for row in rows if "nvproxy" in row} >= {"launch_empty", "h2d_pageable", "launch_storm",
                                                                   "startup", "startup_pool"}
    assert sorted(p.name.split("-")[0] for p in (cache / "nvproxy" / "bench").iterdir()) == ["microbench",
                                                                                             "startup_probe"]
