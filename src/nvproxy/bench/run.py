"""Run the benchmarks natively and through nvproxy, alternating, and write
medians, nvproxy/native ratios, a markdown table and plots.

    nvproxy bench [--suite micro,libs,ckpt,torch] [--quick] [--reps N] [--backend gpu|sim] [--out DIR]
                  [--variant NAME:VAR=VALUE,...]
    nvproxy bench --apps DIR [--reps N] [--backend gpu|sim] [--no-native] [--out DIR]
(also `python -m nvproxy.bench.run`).  Suites: micro, the CUDA runtime's calls and copies (microbench.cu); libs,
math-library calls (libbench.cu: SGEMM, batched GEMM, 3D FFT, normal random numbers, SpMV, a dot product returned
to the host), each beside its target (large calls >= 0.98x native throughput, small ones <= 1.25x native time),
and skipped with one line where the libraries are absent (the sim backend among them); ckpt, checkpoints and
restores; torch, PyTorch's start-up and training steps (torch_steps.py: ResNet-18 and a small transformer, targets
<= 1.05x and <= 1.10x native time per step), skipped with one line where PyTorch is absent.  Default: all four.
--apps DIR runs whole programs instead, every executable file in DIR (bench/apps.py says how, and what DIR may hold
beside them).  Ratios are the figures to read: the machines are noisy.  A variant is
nvproxy once more with other environment settings, in the same rounds (an A/B:
`--variant sockets:NVPROXY_DEBUG=no-mailbox`).
The CUDA programs are built on first use (build.py).  `python -m nvproxy.bench.ckpt_run`,
`python -m nvproxy.bench.dmtcp_placement` and `python -m nvproxy.bench.dmtcp_stop` measure checkpoints alone.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
from collections import defaultdict
from collections.abc import Callable, Mapping
from pathlib import Path

from . import apps, build, frameworks, libs, startup

HERE = Path(__file__).resolve().parent
# for bandwidth higher is better: ratio = nvproxy/native bandwidth; for times, nvproxy/native time
HIGHER_IS_BETTER = {"GB/s"} | libs.THROUGHPUT
SUITES = ("micro", "libs", "ckpt", "torch")


class RunFailed(RuntimeError):
    """A benchmark program failed; the message says which, and its last lines of stderr."""


def run_once(cmd: list[str], env: dict[str, str]) -> list[dict]:
    r = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=1800)
    if r.returncode != 0:
        tail = "\n".join(r.stderr.strip().splitlines()[-20:])
        raise RunFailed(f"{' '.join(cmd)} failed with exit status {r.returncode}:\n{tail}")
    return [json.loads(line) for line in r.stdout.splitlines() if line.startswith("{")]


def parse_suites(text: str) -> set[str]:
    """"micro,libs" -> {"micro", "libs"}; "all" -> every suite."""
    names = {n.strip() for n in text.split(",") if n.strip()}
    if names == {"all"}:
        return set(SUITES)
    if not names or not names <= set(SUITES):
        raise SystemExit(f"nvproxy bench: --suite {text!r}: expected a comma-separated list of {', '.join(SUITES)}"
                         " (or all)")
    return names


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="nvproxy bench", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--suite", default="all", metavar="SUITE,...",
                    help="what to run, of micro, libs, ckpt and torch (default: all)")
    ap.add_argument("--quick", action="store_true", help="tiny sizes (CI smoke run on the sim backend)")
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--backend", choices=("gpu", "sim"))
    ap.add_argument("--native", action=argparse.BooleanOptionalAction, default=None,
                    help="also run natively (default: only with a GPU backend)")
    ap.add_argument("--out", default="bench-results")
    ap.add_argument("--variant", action="append", default=[], metavar="NAME:VAR=VALUE,...",
                    help="also run nvproxy with these environment settings, as column NAME (repeatable)")
    ap.add_argument("--checkpoint-sizes",
                    help="device memory to checkpoint and restore, e.g. 1,4,16,32 (GiB) or 8M (default: "
                         "1,4,16,32 on a GPU, 8M with --quick; 'none' skips)")
    ap.add_argument("--concurrent-sizes",
                    help="device memory of the concurrent and incremental checkpoint rows (default: 1,4,16,64 on a "
                         "GPU, 8M with --quick, none with --checkpoint-sizes none; 'none' skips)")
    ap.add_argument("--dmtcp-sizes",
                    help="device memory of the DMTCP checkpoint rows, the program's stop with and without the GPU "
                         "image written beside DMTCP's (default: 1,4 on a GPU, 8M with --quick, none with "
                         "--checkpoint-sizes none; 'none' skips; skipped with one line where DMTCP is absent)")
    ap.add_argument("--apps", metavar="DIR", type=Path,
                    help="run every executable file in DIR natively and through nvproxy instead of the suites")
    args = ap.parse_args(argv)
    suites = parse_suites(args.suite)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    env = {k: v for k, v in os.environ.items() if k != "LD_PRELOAD"}
    backend = args.backend or ("gpu" if shutil.which("nvidia-smi") else "sim")
    native = args.native if args.native is not None else backend == "gpu"
    if args.apps is not None:
        return apps.main(args.apps, args.reps, native, backend, out, env)
    variants = [parse_variant(v) for v in args.variant]
    programs: list[tuple[str, list[str], list[str]]] = []  # name, its command, its `nvproxy run` options
    if "micro" in suites:
        try:
            programs.append(("microbench", [str(build.program("microbench", "-std=c++17", "-O2"))],
                             ["--sim-kernels", str(HERE / "microbench_sim.py")]))
        except build.BuildError as e:
            print(f"nvproxy bench: {e}", file=sys.stderr)
            return 2
    if "libs" in suites and (exe := libs.program(backend)):
        programs.append(("libbench", [str(exe)], []))
    if "torch" in suites and (cmd := frameworks.program(backend)):
        programs.append(("torch", cmd, []))
    extra = ["--quick"] if args.quick else []
    samples: dict[tuple[str, int, str], dict[str, list[float]]] = defaultdict(lambda: defaultdict(list))
    checks: dict[tuple[str, int], dict[str, set[str]]] = defaultdict(lambda: defaultdict(set))
    failed: list[str] = []  # (a program that failed once is run no more; the others go on)
    for rep in range(args.reps if programs else 0):
        modes: list[tuple[str, dict[str, str] | None]] = [("native", None)] if native else []
        modes += [("nvproxy", {}), *variants]
        if rep % 2:
            modes.reverse()  # alternate which goes first
        for name, argv, options in programs:
            for mode, settings in modes:
                if name in failed:
                    break
                print(f"[{rep + 1}/{args.reps}] {mode} {name}", file=sys.stderr, flush=True)
                cmd = [*argv, *extra] if settings is None else [
                    sys.executable, "-m", "nvproxy", "run", "--backend", backend, *options, "--", *argv, *extra]
                try:
                    records = run_once(cmd, {**env, **(settings or {})})
                except RunFailed as e:
                    print(f"nvproxy bench: {e}", file=sys.stderr)
                    failed.append(name)
                    continue
                for rec in records:
                    samples[(rec["bench"], rec["param"], rec["unit"])][mode].append(rec["value"])
                    if "check" in rec:
                        checks[(rec["bench"], rec["param"])][mode].add(rec["check"])
        # (after every round: a run stopped early, by a time limit say, leaves the rounds it finished)
        differs = libs.different_results(checks)
        _write(samples, variants, out, backend, rep + 1, differs, quiet=True)
        if differs:
            for line in differs.values():
                print(f"nvproxy bench: {line}", file=sys.stderr)
            return 1
    if "micro" in suites:  # (bench/startup.py: from exec to a first call done)
        startup.add_rows(samples, backend, args.reps, native, env)
    if "ckpt" in suites:
        for part in _checkpoint_parts(samples, backend, args, out):
            try:
                part()
            except (RuntimeError, OSError, subprocess.SubprocessError) as e:  # (the other parts still run)
                print(f"nvproxy bench: {e}", file=sys.stderr)
                failed.append("ckpt")
            _write(samples, variants, out, backend, args.reps, quiet=True)
    rows = _write(samples, variants, out, backend, args.reps)
    _plots(rows, out)
    return 1 if failed else 0


def _checkpoint_parts(samples: dict, backend: str, args: argparse.Namespace, out: Path) -> list[Callable[[], None]]:
    """The ckpt suite, in parts that fail alone: dumps and restores, concurrent and incremental checkpoints, DMTCP
    checkpoints."""
    ckpt_sizes = args.checkpoint_sizes or ("8M" if args.quick else "1,4,16,32" if backend == "gpu" else "none")
    stops: dict[int, float] = {}  # cuda-checkpoint's stop time by MiB, once the first part has run
    parts: list[Callable[[], None]] = []
    if ckpt_sizes != "none":
        parts.append(lambda: stops.update(_checkpoint_rows(samples, backend, ckpt_sizes, out)))
    conc_sizes = args.concurrent_sizes or ("none" if args.checkpoint_sizes == "none" else "8M" if args.quick
                                           else "1,4,16,64" if backend == "gpu" else "none")
    if conc_sizes != "none":
        parts.append(lambda: _concurrent_rows(samples, backend, conc_sizes, out, stops))
    dmtcp_sizes = args.dmtcp_sizes or ("none" if args.checkpoint_sizes == "none" else "8M" if args.quick
                                       else "1,4" if backend == "gpu" else "none")
    if dmtcp_sizes != "none":
        from . import ckpt_run, dmtcp_stop

        parts.append(lambda: dmtcp_stop.add_rows(samples, backend, ckpt_run.parse_sizes(dmtcp_sizes), out,
                                                 Path(tempfile.gettempdir())))
    return parts


def _write(samples: dict, variants: list[tuple[str, dict[str, str]]], out: Path, backend: str, reps: int,
           differs: Mapping[tuple[str, int], str] | None = None, quiet: bool = False) -> list[dict]:
    """results.json and results.md from the samples so far (medians, ratios to native, the targets of the library
    benchmarks; differs: the benchmarks whose runs computed different results); the rows."""
    rows = []
    for (bench, param, unit), by_mode in samples.items():
        row = {"bench": bench, "param": param, "unit": unit}
        for mode, vals in by_mode.items():
            row[mode] = statistics.median(vals)
        if "native" in row and row["native"]:
            row["ratio"] = row["nvproxy"] / row["native"]
            for name, _env in variants:
                if name in row:
                    row[f"{name}_ratio"] = row[name] / row["native"]
        if goal := libs.target(bench, unit) or frameworks.target(bench, unit):
            row["target"] = f"{goal[0]} {goal[1]:g}"
            if "ratio" in row:
                row["meets_target"] = libs.meets(goal, row["ratio"])
        if differs and (bench, param) in differs:
            row["same_results"] = False
        rows.append(row)
    (out / "results.json").write_text(json.dumps({"backend": backend, "reps": reps, "rows": rows,
                                                  "variants": dict(variants)}, indent=1))
    names = [name for name, _env in variants]
    head = "| benchmark | size | unit | native | nvproxy | " + "".join(f"{n} | " for n in names) + "nvproxy/native |"
    lines = [head + "".join(f" {n}/native |" for n in names) + " target |",
             "|---|---:|---|" + "---:|" * (3 + 2 * len(names)) + "---|"]
    for r in rows:
        lines.append(f"| {r['bench']} | {_row_size(r)} | {r['unit']} | {_f(r.get('native'))} | "
                     f"{_f(r.get('nvproxy'))} | "
                     + "".join(f"{_f(r.get(n))} | " for n in names) + f"{_f(r.get('ratio'))} |"
                     + "".join(f" {_f(r.get(f'{n}_ratio'))} |" for n in names) + f" {_verdict(r)} |")
    (out / "results.md").write_text("\n".join(lines) + "\n")
    if not quiet and rows:
        print("\n".join(lines))
    return rows


def _verdict(row: dict) -> str:
    """A library row's target and whether nvproxy met it ("<= 1.25: pass")."""
    if row.get("same_results") is False:
        return "results differ"
    if "target" not in row:
        return ""
    if "meets_target" not in row:
        return row["target"]
    return f"{row['target']}: {'pass' if row['meets_target'] else 'miss'}"


def parse_variant(text: str) -> tuple[str, dict[str, str]]:
    """"NAME:VAR=VALUE,VAR2=VALUE2" -> (NAME, {VAR: VALUE, ...})."""
    name, _, settings = text.partition(":")
    env = dict(kv.split("=", 1) for kv in settings.split(",") if kv)
    if not name or name in ("native", "nvproxy") or not env or not all(env):
        raise SystemExit(f"--variant {text!r}: expected NAME:VAR=VALUE[,VAR=VALUE...] (NAME not native/nvproxy)")
    return name, env


def _concurrent_rows(samples: dict, backend: str, sizes: str, out: Path, stops: dict[int, float]) -> None:
    """Concurrent and incremental checkpoint rows (ckpt_concurrent.py), beside cuda-checkpoint's stop time on the
    same data where that tool is on PATH (stops)."""
    from . import ckpt_concurrent, ckpt_run

    if backend == "gpu" and not shutil.which("cuda-checkpoint"):
        print("nvproxy bench: cuda-checkpoint is not on PATH: the concurrent checkpoint rows have no native column",
              file=sys.stderr)
    mibs = []
    for mib in ckpt_run.parse_sizes(sizes):
        avail = os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
        if (mib << 20) * 3 > avail:  # the host image buffer, three image files
            print(f"concurrent checkpoint {mib} MiB: skipped, {avail >> 30} GiB of host memory free", file=sys.stderr)
        else:
            mibs.append(mib)
    ckpt_concurrent.add_rows(samples, backend, mibs, out, stops)


def _checkpoint_rows(samples: dict, backend: str, sizes: str, out: Path) -> dict[int, float]:
    """Checkpoint rows (ckpt_run.py): nvproxy's dump and restore of device memory beside the
    driver's own checkpoint (cuda-checkpoint) of the same program run natively, where the driver has it.
    Every measurement as ckpt_run took it (a restore's phases among them) goes to out/checkpoint-runs.json.
    Returns cuda-checkpoint's stop time by MiB, where the tool ran."""
    from . import ckpt_run

    runs = []
    exe = ckpt_run.build()
    for mib in ckpt_run.parse_sizes(sizes):
        avail = os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
        if (mib << 20) * 5 // 2 > avail:  # the host image buffer, its file, the driver's own copy
            print(f"checkpoint {mib} MiB: skipped, {avail >> 30} GiB of host memory free", file=sys.stderr)
            continue
        print(f"checkpoint {mib} MiB", file=sys.stderr, flush=True)
        with tempfile.TemporaryDirectory() as images:
            row = ckpt_run.measure(exe, mib, Path(images), backend, 5.0 if backend == "gpu" else 0.5)
        if backend == "gpu":
            row.update(ckpt_run._cuda_checkpoint(exe, mib))
        runs.append(row)
        (out / "checkpoint-runs.json").write_text(json.dumps(runs, indent=1))
        if not row["verified"]:
            raise RuntimeError(f"checkpoint benchmark of {mib} MiB: the memory did not verify: {row}")
        size = mib << 20
        for bench, ours, theirs in (("ckpt_dump", "ckpt_copy_gbps", "cuda_checkpoint_suspend_gbps"),
                                    ("ckpt_restore", "restore_gbps", "cuda_checkpoint_resume_gbps"),
                                    ("ckpt_restore_file", "file_restore_gbps", "cuda_checkpoint_resume_gbps"),
                                    ("ckpt_restore_file_ready", "file_restore_ready_gbps", None),
                                    ("ckpt_recover_file", "file_recover_gbps", None)):
            if row.get(ours) is not None:
                samples[(bench, size, "GB/s")]["nvproxy"].append(row[ours])
            if theirs and row.get(theirs):
                samples[(bench, size, "GB/s")]["native"].append(row[theirs])
        samples[("ckpt_stopped", size, "s")]["nvproxy"].append(row.get("ckpt_stopped_s", 0.0))
        samples[("ckpt_file", size, "s")]["nvproxy"].append(row.get("ckpt_file_s", 0.0))
    tool = shutil.which("cuda-checkpoint") is not None
    return {r["mib"]: r["cuda_checkpoint_suspend_s"] for r in runs if tool and r.get("cuda_checkpoint_ok")}


def _f(x: float | None) -> str:
    return "" if x is None else f"{x:.3g}"


def _row_size(row: dict) -> str:
    """The row's param as the table shows it: bytes for bandwidths, times of checkpoints and allocations."""
    by_bytes = row["unit"] in ("GB/s", "s") or row["bench"] == "malloc_free" or row["bench"].startswith("ckpt_")
    return _size(row["param"]) if by_bytes else str(row["param"] or "")


def _size(n: int) -> str:
    for unit, f in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if n >= f:
            return f"{n / f:g} {unit}"
    return str(n)


def _plots(rows: list[dict], out: Path) -> None:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("matplotlib is not installed: no plots", file=sys.stderr)
        return
    def lines(rows_: list[dict], benches: tuple[str, ...], who: dict[str, str], scale: float = 1.0) -> tuple:
        """One line per bench and mode (dashed: native), x = param / scale; returns (fig, ax)."""
        fig, ax = plt.subplots(figsize=(8, 5))
        for bench in benches:
            pts = sorted((r["param"], r) for r in rows_ if r["bench"] == bench)
            for mode, style in (("native", "--"), ("nvproxy", "-")):
                xs = [p / scale for p, r in pts if mode in r]
                if xs:
                    ax.plot(xs, [r[mode] for p, r in pts if mode in r], style, marker="o",
                            label=f"{bench} {who[mode]}")
        ax.set_xscale("log", base=2)
        ax.set_ylabel("GB/s")
        ax.legend(fontsize=7)
        return fig, ax

    copies = ("h2d_pinned", "d2h_pinned", "h2d_pageable", "d2h_pageable")
    if any(r["bench"] in copies for r in rows):
        fig, ax = lines(rows, copies, {"native": "native", "nvproxy": "nvproxy"})
        ax.set_xlabel("bytes per cudaMemcpy")
        ax.set_title("cudaMemcpy bandwidth, native vs nvproxy")
        fig.tight_layout()
        fig.savefig(out / "bandwidth.png", dpi=120)
    lat = [r for r in rows if r["unit"] in ("us", "us/launch") and "target" not in r]  # (libraries: libs.png)
    if lat:
        fig, ax = plt.subplots(figsize=(8, 4))
        labels = [f"{r['bench']}{'' if not r['param'] else ' ' + str(r['param'])}" for r in lat]
        xs = range(len(lat))
        ax.bar([x - 0.2 for x in xs], [r.get("native", 0) for r in lat], 0.4, label="native")
        ax.bar([x + 0.2 for x in xs], [r.get("nvproxy", 0) for r in lat], 0.4, label="nvproxy")
        ax.set_xticks(list(xs), labels, rotation=30, ha="right", fontsize=7)
        ax.set_ylabel("microseconds")
        ax.set_yscale("log")
        ax.legend()
        ax.set_title("latency per call, native vs nvproxy")
        fig.tight_layout()
        fig.savefig(out / "latency.png", dpi=120)
    if any(r["bench"] == "ckpt_dump" for r in rows):
        fig, ax = lines(rows, ("ckpt_dump", "ckpt_restore", "ckpt_restore_file", "ckpt_restore_file_ready",
                               "ckpt_recover_file"),
                        {"native": "driver checkpoint", "nvproxy": "nvproxy"},
                        scale=2**30)
        ax.set_xlabel("GiB of device memory")
        ax.set_title("checkpoint: device memory out (dump) and back (restore)")
        fig.tight_layout()
        fig.savefig(out / "checkpoint.png", dpi=120)
    libs.plot(plt, rows, out / "libs.png", _row_size)

if __name__ == "__main__":
    raise SystemExit(main())
