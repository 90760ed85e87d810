"""The benchmark suite runs and writes its outputs (tiny sizes, sim backend).
No timing is asserted: benchmarks are not tests."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_bench_smoke(nvcc: str, tmp_path: Path) -> None:
    r = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "run.py"), "--quick", "--reps", "1",
                        "--backend", "sim", "--out", str(tmp_path), "--variant", "sockets:NVPROXY_MAILBOX=0"],
                       capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stderr
    rows = json.loads((tmp_path / "results.json").read_text())["rows"]
    assert {row["bench"] for row in rows} >= {"launch_empty", "launch_sync", "malloc_free", "h2d_pageable",
                                              "async_4streams", "launch_storm", "ckpt_dump", "ckpt_restore",
                                              "ckpt_restore_file", "ckpt_recover_file"}
    # the variant (an A/B of the transport) ran the same microbenchmarks
    assert all("sockets" in row for row in rows if row["bench"] in ("launch_empty", "h2d_pageable"))
    table = (tmp_path / "results.md").read_text()
    assert "| launch_empty |" in table and "| sockets |" in table
