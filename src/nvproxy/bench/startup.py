"""Start-up rows of the benchmark: seconds from a program's exec to its first CUDA call done (cudaFree(0): the
context made), natively and through `nvproxy run`, alternating; `startup` starts a proxy for each run,
`startup_pool` takes a warm one from a pool (nvproxy pool) started for the rows and stopped after them.

    python -m nvproxy.bench.startup [--reps N] [--backend gpu|sim]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from collections import defaultdict

from . import build

POOL_WAIT_S = 60.0


def _first_call(cmd: list[str], env: dict[str, str]) -> float:
    """Seconds from starting cmd to its probe's first call done (the probe prints CLOCK_MONOTONIC times)."""
    t0 = time.monotonic()
    r = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=300)
    rec = next((json.loads(line) for line in r.stdout.splitlines() if line.startswith("{")), None)
    if r.returncode != 0 or rec is None:
        raise RuntimeError(f"{' '.join(cmd)} failed:\n{r.stdout}{r.stderr}")
    return float(rec["done"]) - t0


def _pool_ready(env: dict[str, str]) -> None:
    """Until a warm proxy of env's settings listens (the replacement of the last one taken)."""
    from ..launcher import private_dir, proxy_env
    from ..pool import pool_key

    prefix = f"pool-{pool_key(proxy_env(env.get('NVPROXY_BACKEND'), [], env))}-"
    deadline = time.monotonic() + POOL_WAIT_S
    while not any(n.startswith(prefix) for n in os.listdir(private_dir())):
        if time.monotonic() > deadline:
            raise RuntimeError(f"no warm proxy of the pool within {POOL_WAIT_S:g} s")
        time.sleep(0.005)


def add_rows(samples: dict, backend: str, reps: int, native: bool, env: dict[str, str]) -> None:
    """The start-up rows' samples, into samples[(bench, 0, "s")][mode] (as bench/run.py keeps them)."""
    exe = str(build.program("startup_probe", "-O2"))
    nv = [sys.executable, "-m", "nvproxy"]
    env = {**env, "NVPROXY_BACKEND": backend}
    for bench, pooled in (("startup", False), ("startup_pool", True)):
        if pooled:
            subprocess.run([*nv, "pool", "start", "--idle", "300"], env=env, check=True, capture_output=True)
        try:
            for rep in range(reps):
                modes = (["native"] if native else []) + ["nvproxy"]
                for mode in modes if rep % 2 == 0 else modes[::-1]:
                    if mode == "nvproxy" and pooled:
                        _pool_ready(env)
                    cmd = [exe] if mode == "native" else [*nv, "run", "--", exe]
                    samples[(bench, 0, "s")][mode].append(_first_call(cmd, env))
        finally:
            if pooled:
                subprocess.run([*nv, "pool", "stop"], env=env, capture_output=True)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m nvproxy.bench.startup", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--reps", type=int, default=10)
    ap.add_argument("--backend", choices=("gpu", "sim"), default="gpu")
    args = ap.parse_args(argv)
    samples: dict = defaultdict(lambda: defaultdict(list))
    env = {k: v for k, v in os.environ.items() if k != "LD_PRELOAD"}
    add_rows(samples, args.backend, args.reps, args.backend == "gpu", env)
    for (bench, _param, _unit), by_mode in samples.items():
        line = "  ".join(f"{m} {statistics.median(v):.3f} s [{min(v):.3f}-{max(v):.3f}]" for m, v in by_mode.items())
        print(f"{bench:14s} {line}  ({args.reps} runs each, medians)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
