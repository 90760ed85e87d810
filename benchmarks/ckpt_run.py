"""Checkpoint and restore throughput: a program holding N GiB of device memory
is checkpointed (nvproxy checkpoint: dump while it waits) and migrated into a
new proxy (dump + restore), then verifies its memory.

    python benchmarks/ckpt_run.py [--sizes 1,4,16,32] [--backend gpu|sim] [--out DIR]
"""

from __future__ import annotations

import argparse
import json
import re
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent


def _cuda_checkpoint(exe: Path, gib: int) -> dict:
    """NVIDIA's cuda-checkpoint on the same program run natively: --toggle moves
    device memory to host memory (suspend) and back (resume)."""
    app = subprocess.Popen([str(exe), str(gib)], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    assert app.stdout and app.stdin
    app.stdout.readline()
    t = time.monotonic()
    a = subprocess.run(["cuda-checkpoint", "--toggle", "--pid", str(app.pid)], capture_output=True, text=True)
    suspend = time.monotonic() - t
    t = time.monotonic()
    b = subprocess.run(["cuda-checkpoint", "--toggle", "--pid", str(app.pid)], capture_output=True, text=True)
    resume = time.monotonic() - t
    out, _ = app.communicate("\n", timeout=600)
    ok = a.returncode == 0 and b.returncode == 0 and "verified ok" in out
    return {"cuda_checkpoint_ok": ok, "cuda_checkpoint_suspend_s": suspend, "cuda_checkpoint_resume_s": resume,
            "cuda_checkpoint_suspend_gbps": gib * 2**30 / suspend / 1e9 if ok else None,
            "cuda_checkpoint_error": (a.stderr + b.stderr).strip()[-300:]}


def _measure(exe: Path, gib: int, td: Path, backend: str) -> dict:
    """nvproxy checkpoint (the program waits, then goes on) and nvproxy migrate of a program holding gib GiB."""
    app = subprocess.Popen([sys.executable, "-m", "nvproxy", "run", "--backend", backend, "--", str(exe), str(gib)],
                           stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    assert app.stdout and app.stdin
    if app.stdout.readline().strip() != "ready":
        raise SystemExit(app.communicate()[1])
    image = td / f"c{gib}.img"
    t = time.monotonic()
    r = subprocess.run([sys.executable, "-m", "nvproxy", "checkpoint", str(app.pid), "-o", str(image)],
                       capture_output=True, text=True)
    ck_wall = time.monotonic() - t
    image.unlink(missing_ok=True)
    t = time.monotonic()
    m = subprocess.run([sys.executable, "-m", "nvproxy", "migrate", str(app.pid), "--image", str(td / f"m{gib}.img")],
                       capture_output=True, text=True)
    mig_wall = time.monotonic() - t
    stdout, stderr = app.communicate("\n", timeout=600)
    restored = re.search(r"restored (\d+) MiB in ([\d.]+) s .*checkpoint took ([\d.]+) s", stderr)
    row = {"gib": gib, "checkpoint_out": r.stdout.strip(), "checkpoint_wall_s": ck_wall,
           "migrate_wall_s": mig_wall, "verified": "verified ok" in stdout, "migrate_rc": m.returncode}
    if restored:
        mib, rs, ds = int(restored.group(1)), float(restored.group(2)), float(restored.group(3))
        row.update(restore_s=rs, dump_s=ds, restore_gbps=mib * 2**20 / rs / 1e9, dump_gbps=mib * 2**20 / ds / 1e9)
    return row


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--sizes", default="1,4")
    ap.add_argument("--backend", default="gpu")
    ap.add_argument("--out", default="bench-results")
    ap.add_argument("--image-dir", action="append", default=[],
                    help="where images go; repeat to compare (default: the system's temporary directory)")
    args = ap.parse_args(argv)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    rows = []
    with tempfile.TemporaryDirectory() as build_dir:
        exe = Path(build_dir) / "ckpt_bench"
        subprocess.run(["nvcc", "-cudart", "shared", "-O2", "-o", str(exe), str(HERE / "ckpt_bench.cu")], check=True)
        for where in args.image_dir or [None]:
            for gib in (int(x) for x in args.sizes.split(",")):
                with tempfile.TemporaryDirectory(dir=where) as td:
                    row = _measure(exe, gib, Path(td), args.backend)
                row["image_dir"] = where or tempfile.gettempdir()
                if shutil.which("cuda-checkpoint") and where == (args.image_dir or [None])[0]:
                    row.update(_cuda_checkpoint(exe, gib))
                rows.append(row)
                print(json.dumps(row), flush=True)
    (out / "checkpoint.json").write_text(json.dumps(rows, indent=1))
    return 0 if all(r["verified"] and r["migrate_rc"] == 0 for r in rows) else 1


if __name__ == "__main__":
    raise SystemExit(main())
