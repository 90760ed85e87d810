"""Checkpoint and restore throughput: a program holding N GiB of device memory
is checkpointed (nvproxy checkpoint: dump while it waits, then the file is
written while it goes on) and migrated into a new proxy (dump + restore, the
image in memory), then verifies its memory.  The proxy prepares its host image
buffer after the program allocated (NVPROXY_CKPT_BUFFER=prefault): how long
that took is reported, and the checkpoint waits for it.

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


def _wait_prepared(app_pid: int, timeout: float = 300) -> float:
    """Seconds until the proxy's host image buffer holds an image of the program's state."""
    from nvproxy.cli import _control_call
    from nvproxy.launcher import find_proxy

    pid, sock = find_proxy(app_pid)
    t = time.monotonic()
    while time.monotonic() - t < timeout:
        u = _control_call(sock, pid, {"cmd": "usage"})
        if u.get("buffer_bytes", 0) >= u.get("image_estimate", 1):
            break
        time.sleep(0.1)
    return time.monotonic() - t


def _measure(exe: Path, gib: int, td: Path, backend: str) -> dict:
    """nvproxy checkpoint (the program waits, then goes on) and nvproxy migrate of a program holding gib GiB."""
    app = subprocess.Popen([sys.executable, "-m", "nvproxy", "run", "--backend", backend, "--", str(exe), str(gib)],
                           stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    assert app.stdout and app.stdin
    if app.stdout.readline().strip() != "ready":
        raise SystemExit(app.communicate()[1])
    t = time.monotonic()
    prepare_s = _wait_prepared(app.pid)
    image = td / f"c{gib}.img"
    t = time.monotonic()
    r = subprocess.run([sys.executable, "-m", "nvproxy", "checkpoint", str(app.pid), "-o", str(image)],
                       capture_output=True, text=True)
    ck_wall = time.monotonic() - t
    image.unlink(missing_ok=True)
    t = time.monotonic()
    m = subprocess.run([sys.executable, "-m", "nvproxy", "migrate", str(app.pid)], capture_output=True, text=True)
    mig_wall = time.monotonic() - t
    stdout, stderr = app.communicate("\n", timeout=600)
    restored = re.search(r"restored (\d+) MiB in ([\d.]+) s .*checkpoint took ([\d.]+) s", stderr)
    row = {"gib": gib, "checkpoint_out": r.stdout.strip(), "checkpoint_wall_s": ck_wall, "prepare_s": prepare_s,
           "migrate_wall_s": mig_wall, "verified": "verified ok" in stdout, "migrate_rc": m.returncode}
    ck = re.search(r"copied out in ([\d.]+) s \(([\d.]+) GB/s\); the application was stopped ([\d.]+) s; "
                   r"file written in ([\d.]+) s", r.stdout)
    if ck:
        row.update(ckpt_copy_s=float(ck.group(1)), ckpt_copy_gbps=float(ck.group(2)),
                   ckpt_stopped_s=float(ck.group(3)), ckpt_file_s=float(ck.group(4)))
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
