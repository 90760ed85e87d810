"""Checkpoint and restore throughput: a program holding N GiB of device memory
is checkpointed (nvproxy checkpoint: dump while it waits, then the file is
written while it goes on) and migrated into a new proxy (dump + restore, the
image in memory), then verifies its memory.  The proxy prepares its host image
buffer after the program allocated (NVPROXY_CKPT_BUFFER=prefault): how long
that took is reported, and the checkpoint waits for it.

    python -m nvproxy.bench.ckpt_run [--sizes 1,4,16,32] [--backend gpu|sim] [--out DIR]
(sizes in GiB; "8M" means 8 MiB).  `nvproxy bench --checkpoint-sizes` runs it with the microbenchmarks.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from . import build as programs

HERE = Path(__file__).resolve().parent


def _cuda_checkpoint(exe: Path, mib: int) -> dict:
    """NVIDIA's driver checkpoint on the same program run natively: suspend moves
    device memory to host memory, resume moves it back (cuda-checkpoint --toggle
    where that tool is installed, else the same driver calls from driver_checkpoint.py)."""
    app = subprocess.Popen([str(exe), str(mib)], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    assert app.stdout and app.stdin
    app.stdout.readline()
    if shutil.which("cuda-checkpoint"):
        toggle = ["cuda-checkpoint", "--toggle", "--pid", str(app.pid)]
        t = time.monotonic()
        a = subprocess.run(toggle, capture_output=True, text=True)
        suspend = time.monotonic() - t
        t = time.monotonic()
        b = subprocess.run(toggle, capture_output=True, text=True)
        resume = time.monotonic() - t
        ok, err = a.returncode == 0 and b.returncode == 0, (a.stderr + b.stderr).strip()[-300:]
    else:
        r = subprocess.run([sys.executable, "-m", "nvproxy.bench.driver_checkpoint", str(app.pid)],
                           capture_output=True, text=True)
        got = json.loads(r.stdout.strip().splitlines()[-1]) if r.stdout.strip() else {"ok": False, "error": r.stderr}
        ok, err = got["ok"], got.get("error", "")
        suspend, resume = got.get("suspend_s", 0.0), got.get("resume_s", 0.0)
    out, _ = app.communicate("\n", timeout=600)
    ok = ok and "verified ok" in out
    return {"cuda_checkpoint_ok": ok, "cuda_checkpoint_suspend_s": suspend, "cuda_checkpoint_resume_s": resume,
            "cuda_checkpoint_suspend_gbps": mib * 2**20 / suspend / 1e9 if ok and suspend else None,
            "cuda_checkpoint_resume_gbps": mib * 2**20 / resume / 1e9 if ok and resume else None,
            "cuda_checkpoint_error": err}


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


def parse_sizes(text: str) -> list[int]:
    """"1,4,8M" -> MiB: plain numbers are GiB."""
    out = []
    for item in text.split(","):
        item = item.strip().upper()
        out.append(int(item[:-1]) if item.endswith("M") else int(item) * 1024)
    return out


def build() -> Path:
    try:
        return programs.program("ckpt_bench", "-O2")
    except programs.BuildError as e:
        raise SystemExit(f"nvproxy bench: {e}") from None


def read_mode() -> str:
    from nvproxy.checkpoint.restore import read_mode as mode

    return mode()


def _alive(pid: int) -> bool:
    """Not yet a zombie (whose memory is released)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def measure(exe: Path, mib: int, td: Path, backend: str, settle: float = 5.0) -> dict:
    """nvproxy checkpoint (the program waits, then goes on), nvproxy migrate, and a restore from
    an image file (NVPROXY_RECOVER after the proxy was killed) of a program holding mib MiB."""
    gib = mib / 1024
    image = td / f"c{mib}.img"
    env = dict(os.environ, NVPROXY_RECOVER=str(image))
    app = subprocess.Popen([sys.executable, "-m", "nvproxy", "run", "--backend", backend, "--sim-kernels",
                            str(HERE / "ckpt_bench_sim.py"), "--", str(exe), str(mib)],
                           stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
    assert app.stdout and app.stdin
    if app.stdout.readline().strip() != "ready":
        raise SystemExit(app.communicate()[1])
    t = time.monotonic()
    prepare_s = _wait_prepared(app.pid)
    t = time.monotonic()
    r = subprocess.run([sys.executable, "-m", "nvproxy", "checkpoint", str(app.pid), "-o", str(image)],
                       capture_output=True, text=True)
    ck_wall = time.monotonic() - t
    image.unlink(missing_ok=True)
    t = time.monotonic()
    m = subprocess.run([sys.executable, "-m", "nvproxy", "migrate", str(app.pid)], capture_output=True, text=True)
    mig_wall = time.monotonic() - t
    # the file path: an image, the proxy killed, and the program's next call restores from the file
    _wait_prepared(app.pid)
    subprocess.run([sys.executable, "-m", "nvproxy", "checkpoint", str(app.pid), "-o", str(image)],
                   capture_output=True, text=True)
    from nvproxy.launcher import find_proxy

    old = find_proxy(app.pid)[0]
    os.kill(old, signal.SIGKILL)
    t = time.monotonic()
    while _alive(old) and time.monotonic() - t < 60:
        time.sleep(0.01)  # (as before a DMTCP restart: the dead proxy's memory is released before the new one starts)
    gone_s = time.monotonic() - t
    time.sleep(settle)
    stdout, stderr = app.communicate("\n", timeout=600)
    image.unlink(missing_ok=True)
    from_file = re.search(r"restored (\d+) MiB from \S+ in ([\d.]+) s", stderr)
    restored = re.search(r"restored (\d+) MiB in ([\d.]+) s .*checkpoint took ([\d.]+) s", stderr)
    row = {"mib": mib, "gib": gib, "checkpoint_out": r.stdout.strip(), "checkpoint_wall_s": ck_wall,
           "prepare_s": prepare_s, "migrate_wall_s": mig_wall, "verified": "verified ok" in stdout,
           "migrate_rc": m.returncode, "killed_proxy_gone_s": gone_s, "settle_s": settle}
    if from_file:
        fs = float(from_file.group(2))
        row.update(file_restore_s=fs, file_restore_gbps=int(from_file.group(1)) * 2**20 / max(fs, 1e-3) / 1e9,
                   file_restore_read=read_mode())
        recovered = re.search(r"a new proxy started and restored \S+ in ([\d.]+) s", stderr)
        if recovered:  # what the application waited: the proxy's start, its restore, the hand-over
            rs = float(recovered.group(1))
            row.update(file_recover_s=rs, file_recover_gbps=int(from_file.group(1)) * 2**20 / max(rs, 1e-3) / 1e9)
        phases = re.search(r"from \S+ in [\d.]+ s \([\d.]+ GB/s; s per phase: ([^)]*)\)", stderr)
        early = re.search(r"(\d+) of its (\d+) chunks were summed while the proxy started", stderr)
        if early:  # (checkpoint/earlycheck.py)
            row["file_restore_summed_early"] = f"{early.group(1)}/{early.group(2)}"
        fallback = [line for line in stderr.splitlines() if "bounce buffers" in line]
        if fallback:
            row["file_restore_note"] = fallback[0]
        if phases:
            ph = {k: float(v) for k, v in (x.split() for x in phases.group(1).split(", "))}
            row["file_restore_phases_s"] = ph
            if "driver" in ph:  # (the restore less its wait for the CUDA context, made since the proxy started)
                ready = max(fs - ph["driver"], 1e-3)
                row.update(file_restore_ready_s=ready,
                           file_restore_ready_gbps=int(from_file.group(1)) * 2**20 / ready / 1e9)
    ck = re.search(r"copied out in ([\d.]+) s \(([\d.]+) GB/s\); the application was stopped ([\d.]+) s; "
                   r"file written in ([\d.]+) s", r.stdout)
    if ck:
        row.update(ckpt_copy_s=float(ck.group(1)), ckpt_copy_gbps=float(ck.group(2)),
                   ckpt_stopped_s=float(ck.group(3)), ckpt_file_s=float(ck.group(4)))
    if restored:
        got, rs, ds = int(restored.group(1)), float(restored.group(2)), float(restored.group(3))
        row.update(restore_s=rs, dump_s=ds, restore_gbps=got * 2**20 / max(rs, 1e-3) / 1e9,
                   dump_gbps=got * 2**20 / max(ds, 1e-3) / 1e9)
        phases = re.search(r"s per phase: ([^;]*); buffer prepared before in ([\d.]+) s", stderr)
        if phases:  # where a migration's restore spends its time, and what it did before the stop
            row["restore_phases_s"] = {k: float(v) for k, v in (x.split() for x in phases.group(1).split(", "))}
            row["migrate_buffer_prepared_s"] = float(phases.group(2))
    return row


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--sizes", default="1,4")
    ap.add_argument("--backend", default="gpu")
    ap.add_argument("--out", default="bench-results")
    ap.add_argument("--no-driver", action="store_true", help="leave out NVIDIA's cuda-checkpoint")
    ap.add_argument("--settle", type=float, default=5.0,
                    help="seconds between the killed proxy's end and the restore from its image file (the driver was "
                    "still tearing a killed 16 GiB proxy down 0.5 s after its end: the restore took 1.1-1.3 s longer)")
    ap.add_argument("--image-dir", action="append", default=[],
                    help="where images go; repeat to compare (default: the system's temporary directory)")
    args = ap.parse_args(argv)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    rows = []
    exe = build()
    for where in args.image_dir or [None]:
        for mib in parse_sizes(args.sizes):
            with tempfile.TemporaryDirectory(dir=where) as td:
                row = measure(exe, mib, Path(td), args.backend, args.settle)
            row["image_dir"] = where or tempfile.gettempdir()
            if args.backend == "gpu" and not args.no_driver and where == (args.image_dir or [None])[0]:
                row.update(_cuda_checkpoint(exe, mib))
            rows.append(row)
            print(json.dumps(row), flush=True)
    (out / "checkpoint.json").write_text(json.dumps(rows, indent=1))
    return 0 if all(r["verified"] and r["migrate_rc"] == 0 for r in rows) else 1


if __name__ == "__main__":
    raise SystemExit(main())
