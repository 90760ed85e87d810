"""The stop a DMTCP checkpoint costs a program that keeps computing (ckpt_bench.cu's loop): the longest gap between
its batches around `nvproxy checkpoint --dmtcp`, less a batch's usual time, with the GPU image written before DMTCP
writes the process's image (--no-overlap), while DMTCP writes it and after the program resumed (the default), and
so with device memory copied out after the program resumed (--concurrent); and how long the command took until
every image was complete.

    python -m nvproxy.bench.dmtcp_stop [--sizes 1,4] [--backend gpu|sim] [--ckpt-dir DIR] [--out DIR]
Needs DMTCP (dmtcp_launch on PATH or in $NVPROXY_DMTCP_DIR/bin).  `nvproxy bench` runs it with the other
checkpoint rows where DMTCP is found (run.py)."""

from __future__ import annotations

import json
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from . import ckpt_run
from .ckpt_concurrent import BEFORE_BATCHES, Loop
from .dmtcp_placement import arguments, dmtcp_bin, dmtcp_env, start_coordinator

HERE = Path(__file__).resolve().parent
# nvproxy checkpoint --dmtcp --no-overlap, its default, and --concurrent
MODES = ("serial", "overlap", "concurrent")
FLAGS = {"serial": ["--no-overlap"], "overlap": [], "concurrent": ["--concurrent"]}


def measure(exe: Path, mib: int, mode: str, backend: str, ckpt_dir: Path, dmtcp: Path) -> dict:
    d = Path(tempfile.mkdtemp(dir=ckpt_dir, prefix="nvp-stop-"))
    env = dmtcp_env(dmtcp)
    env.pop("NVPROXY_DMTCP_OVERLAP", None)  # (the command chooses; DMTCP's own checkpoints would follow this)
    row: dict = {"mib": mib, "mode": mode}
    try:
        port = start_coordinator(d, env, dmtcp)
        app = subprocess.Popen([sys.executable, "-m", "nvproxy", "run", "--backend", backend, "--sim-kernels",
                                str(HERE / "ckpt_bench_sim.py"), "--dmtcp-args",
                                f"--coord-port {port} --no-gzip --ckptdir {d}", "--", str(exe), str(mib), "loop"],
                               stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                               env=env)
        assert app.stdout and app.stdin and app.stderr
        if app.stdout.readline().strip() != "ready":
            raise RuntimeError(app.communicate()[1])
        loop = Loop(app)
        try:
            ckpt_run._wait_prepared(app.pid)
            loop.wait_batches(BEFORE_BATCHES)
            t0 = time.monotonic()
            flags = FLAGS[mode]
            ck = subprocess.run([sys.executable, "-m", "nvproxy", "checkpoint", "--dmtcp", "--coord-port", port,
                                 *flags], capture_output=True, text=True, env=env, timeout=900)
            t1 = time.monotonic()
            if ck.returncode:
                raise RuntimeError(f"nvproxy checkpoint --dmtcp {' '.join(flags)} failed: {ck.stderr.strip()}")
            loop.wait_batches(BEFORE_BATCHES)
            with loop.cond:
                stamps = list(loop.stamps)
            pairs = list(zip(stamps, stamps[1:], strict=False))
            usual = statistics.median(b - a for a, b in pairs) if pairs else 0.0
            around = [b - a for a, b in pairs if b >= t0 and a <= t1]
            row.update(stop_s=max(max(around, default=0.0) - usual, 0.0), command_s=t1 - t0, batch_s=usual,
                       files_mib={p.name: p.stat().st_size >> 20 for p in d.iterdir()
                                  if p.suffix in (".dmtcp", ".img")})
        finally:
            err = loop.finish()
            subprocess.run([str(dmtcp / "dmtcp_command"), "--coord-port", port, "-q"], env=env, capture_output=True)
        row["verified"] = "verified ok" in "".join(loop.rest)
        if not row["verified"]:
            row["error"] = err.strip()[-500:]
        return row
    finally:
        shutil.rmtree(d, ignore_errors=True)


def add_rows(samples: dict, backend: str, sizes: list[int], out: Path, ckpt_dir: Path) -> None:
    """ckpt_dmtcp_stop_MODE (the program's stop, s) and ckpt_dmtcp_command_MODE (until every image was complete, s)
    for each mode; every measurement to out/dmtcp-stop-runs.json."""
    try:
        dmtcp = dmtcp_bin()
    except SystemExit as e:
        print(f"nvproxy bench: no DMTCP checkpoint rows: {e}", file=sys.stderr)
        return
    exe = ckpt_run.build()
    runs = []
    for mib in sizes:
        for mode in MODES:
            print(f"DMTCP checkpoint {mib} MiB, {mode}", file=sys.stderr, flush=True)
            row = measure(exe, mib, mode, backend, ckpt_dir, dmtcp)
            runs.append(row)
            (out / "dmtcp-stop-runs.json").write_text(json.dumps(runs, indent=1))
            if not row["verified"]:
                raise RuntimeError(f"DMTCP checkpoint benchmark of {mib} MiB: the memory did not verify: {row}")
            for bench, key in (("ckpt_dmtcp_stop", "stop_s"), ("ckpt_dmtcp_command", "command_s")):
                samples[(f"{bench}_{mode}", mib << 20, "s")]["nvproxy"].append(row[key])


def main(argv: list[str] | None = None) -> int:
    args = arguments(__doc__).parse_args(argv)
    dmtcp = dmtcp_bin()
    exe = ckpt_run.build()
    rows = []
    for mib in ckpt_run.parse_sizes(args.sizes):
        for rep in range(args.repeat):
            for mode in MODES if rep % 2 == 0 else MODES[::-1]:  # (alternating which goes first)
                rows.append(measure(exe, mib, mode, args.backend, Path(args.ckpt_dir), dmtcp))
                print(json.dumps(rows[-1]), flush=True)
    Path(args.out).mkdir(parents=True, exist_ok=True)
    (Path(args.out) / "dmtcp-stop-runs.json").write_text(json.dumps(rows, indent=1))
    for mib in sorted({r["mib"] for r in rows}):
        for mode in MODES:
            mine = [r for r in rows if r["mib"] == mib and r["mode"] == mode and "stop_s" in r]
            if mine:
                print(f"{mib} MiB {mode}: stop {statistics.median(r['stop_s'] for r in mine):.3f} s, command "
                      f"{statistics.median(r['command_s'] for r in mine):.3f} s")
    return 0 if all(r["verified"] for r in rows) else 1


if __name__ == "__main__":
    raise SystemExit(main())
