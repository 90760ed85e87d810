"""Where should the GPU image go under DMTCP?  Measures, for a program holding N
GiB, the wall time of a whole DMTCP checkpoint (`nvproxy checkpoint --dmtcp`):

- device: N GiB of device memory; the proxy copies it into its host image buffer
  and writes nvproxy-PID.img beside DMTCP's images (the design in use);
- host: N GiB of pinned host memory in the application, which DMTCP writes inside
  its own image: what mapping the proxy's buffer into the application at
  PRE-CHECKPOINT would cost, less the copy into the buffer (N GiB at the
  copy-out rate `ckpt_run.py` measures).

    python -m nvproxy.bench.dmtcp_placement --sizes 1,4 [--backend gpu|sim] [--ckpt-dir /dev/shm]
Needs DMTCP (dmtcp_launch on PATH or in $NVPROXY_DMTCP_DIR/bin)."""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent


def dmtcp_bin() -> Path:
    from nvproxy.launcher import dmtcp_tool

    return Path(dmtcp_tool("dmtcp_launch")).parent


def dmtcp_env(dmtcp: Path) -> dict[str, str]:
    env = dict(os.environ, PATH=f"{dmtcp}:{os.environ['PATH']}")
    env.pop("LD_PRELOAD", None)
    return env


def start_coordinator(d: Path, env: dict[str, str], dmtcp: Path) -> str:
    """A coordinator of its own, on a free port, writing into d (it ends with its last process); its port."""
    subprocess.run([str(dmtcp / "dmtcp_coordinator"), "--daemon", "--exit-on-last", "--ckptdir", str(d),
                    "--coord-port", "0", "--port-file", str(d / "port")], check=True, env=env,
                   stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    for _ in range(100):
        if (d / "port").exists() and (d / "port").read_text().strip():
            break
        time.sleep(0.05)
    return (d / "port").read_text().strip()


def _one(exe: Path, mib: int, where: str, backend: str, ckpt_dir: Path, dmtcp: Path) -> dict:
    d = Path(tempfile.mkdtemp(dir=ckpt_dir, prefix="nvp-place-"))
    env = dmtcp_env(dmtcp)
    try:
        port = start_coordinator(d, env, dmtcp)
        sim = ["--sim-kernels", str(HERE / "ckpt_bench_sim.py")] if backend == "sim" else []
        app = subprocess.Popen([sys.executable, "-m", "nvproxy", "run", "--backend", backend, *sim, "--dmtcp-args",
                                f"--coord-port {port} --no-gzip --ckptdir {d}", "--", str(exe), str(mib),
                                where], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, env=env)
        assert app.stdout and app.stdin
        if app.stdout.readline().strip() != "ready":
            raise RuntimeError("the program did not start")
        time.sleep(2 + mib / 2048)  # the proxy prepares its host image buffer meanwhile (about 1 s per 4 GiB)
        t = time.monotonic()
        ck = subprocess.run([sys.executable, "-m", "nvproxy", "checkpoint", "--dmtcp", "--coord-port", port],
                            capture_output=True, text=True, env=env, timeout=900)
        wall = time.monotonic() - t
        app.stdin.write("\n")
        app.stdin.flush()
        out, _ = app.communicate(timeout=600)
        sizes = {p.name: p.stat().st_size for p in d.iterdir() if p.suffix in (".dmtcp", ".img")}
        subprocess.run([str(dmtcp / "dmtcp_command"), "--coord-port", port, "-q"], env=env, capture_output=True)
        return {"mib": mib, "where": where, "checkpoint_s": wall, "ok": ck.returncode == 0 and "verified ok" in out,
                "files_mib": {k: v >> 20 for k, v in sizes.items()}, "error": ck.stderr.strip()[-300:]}
    finally:
        shutil.rmtree(d, ignore_errors=True)


def arguments(doc: str | None) -> argparse.ArgumentParser:
    """The options of a DMTCP checkpoint measurement run alone (this one's and dmtcp_stop.py's)."""
    ap = argparse.ArgumentParser(description=doc)
    ap.add_argument("--sizes", default="1,4", help="GiB (\"64M\": MiB)")
    ap.add_argument("--backend", default="gpu")
    ap.add_argument("--ckpt-dir", default=tempfile.gettempdir())
    ap.add_argument("--repeat", type=int, default=2)
    ap.add_argument("--out", default="bench-results")
    return ap


def main(argv: list[str] | None = None) -> int:
    args = arguments(__doc__).parse_args(argv)
    from .ckpt_run import build, parse_sizes

    dmtcp = dmtcp_bin()
    rows = []
    exe = build()
    for mib in parse_sizes(args.sizes):
        for _ in range(args.repeat):
            for where in ("device", "host"):  # alternating, as the microbenchmarks do
                row = _one(exe, mib, where, args.backend, Path(args.ckpt_dir), dmtcp)
                print(json.dumps(row), flush=True)
                rows.append(row)
    Path(args.out).mkdir(parents=True, exist_ok=True)
    (Path(args.out) / "dmtcp_placement.json").write_text(json.dumps(rows, indent=1))
    return 0 if all(r["ok"] for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
