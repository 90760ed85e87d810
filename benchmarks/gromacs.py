"""GROMACS's speed natively and through nvproxy, measured in the same run: for each configuration, mdrun of the
system of tests/gromacs/make_input.py it runs (water; methanol for bonded-gpu) alternately natively and under
`nvproxy run`, ROUNDS times each, and the ns/day mdrun reports (its own timer: the steps' wall time, start-up
excluded).

    python3 benchmarks/gromacs.py GROMACS_DIR [--steps N] [--rounds R] [--configs pme-gpu,update-gpu,...]

Configurations: tests/gromacs/mdrun.CONFIGS.  Prints one line per run and a table of medians and ratios.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))

from gromacs.make_input import gmx, make_input  # noqa: E402
from gromacs.mdrun import CONFIGS, mdrun_args, ns_per_day, system_of  # noqa: E402


def one_run(exe: Path, tpr: Path, work: Path, config: str, steps: int, through: bool, timeout: float) -> float:
    name = work / f"{config}-{'nvproxy' if through else 'native'}"
    cmd, env = mdrun_args(exe, tpr, name, config, steps)
    if through:
        cmd = [sys.executable, "-m", "nvproxy", "run", "--", *cmd]
    r = subprocess.run(cmd, env=dict(os.environ, **env), capture_output=True, text=True, timeout=timeout)
    if r.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd[:6])}... failed (exit status {r.returncode}): {r.stderr.strip()[-1500:]}")
    return ns_per_day(name.with_suffix(".log"))


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("gmx_dir", type=Path, help="GROMACS's installation (with bin/gmx)")
    ap.add_argument("--steps", type=int, default=20000)
    ap.add_argument("--rounds", type=int, default=2, help="runs of each kind per configuration (default 2)")
    ap.add_argument("--configs", default="pme-gpu,pme-cpu,update-gpu,graphs,two-ranks,bonded-gpu",
                    help=f"comma-separated, of {', '.join(CONFIGS)}")
    ap.add_argument("--timeout", type=float, default=300, help="seconds a run may take (default 300)")
    args = ap.parse_args(argv)
    configs = [c for c in args.configs.split(",") if c]
    unknown = [c for c in configs if c not in CONFIGS]
    if unknown or args.rounds < 1 or args.steps < 1:
        print(f"gromacs bench: bad arguments: configurations {unknown or configs}, rounds {args.rounds}, "
              f"steps {args.steps}", file=sys.stderr)
        return 2
    try:
        exe = gmx(args.gmx_dir)
        with tempfile.TemporaryDirectory(prefix="nvproxy-gromacs-") as tmp:
            work = Path(tmp)
            tprs: dict[str, Path] = {}
            rows = []
            for config in configs:
                system = system_of(config)
                if system not in tprs:
                    tprs[system] = make_input(args.gmx_dir, work / f"input-{system}", system=system)
                tpr = tprs[system]
                got: dict[bool, list[float]] = {False: [], True: []}
                for i in range(args.rounds):
                    for through in (False, True):
                        v = one_run(exe, tpr, work, config, args.steps, through, args.timeout)
                        got[through].append(v)
                        print(f"{config:11} round {i + 1} {'nvproxy' if through else 'native ':7} {v:9.1f} ns/day",
                              flush=True)
                native, proxied = statistics.median(got[False]), statistics.median(got[True])
                rows.append((config, native, proxied))
    except (OSError, RuntimeError, ValueError, subprocess.TimeoutExpired) as e:
        print(f"gromacs bench: {e}", file=sys.stderr)
        return 1
    print(f"\n{'configuration':14}{'native ns/day':>15}{'nvproxy ns/day':>16}{'ratio':>8}")
    for config, native, proxied in rows:
        print(f"{config:14}{native:15.1f}{proxied:16.1f}{proxied / native:8.3f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
