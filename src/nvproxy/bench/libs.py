"""The math-library benchmarks (libbench.cu: cuBLAS, cuFFT, cuRAND, cuSPARSE calls): their program, or why it
cannot run here; their targets against native; the check that every run computed the same results."""

from __future__ import annotations

import re
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

from . import build

LINK = ("-lcublas", "-lcufft", "-lcurand", "-lcusparse")
# The targets: a large call keeps >= 0.98x native throughput, a small one takes <= 1.25x native time per call.
# Each benchmark's class; a row in the other kind of unit gets the same target inverted.
CLASS = {"sgemm_small": "small", "sgemm_small_sync": "small", "sgemm_large": "large", "sgemm_batched": "small",
         "fft_c2c_3d": "small", "curand_normal": "large", "spmv_csr": "small", "sdot_host": "small"}
LIMIT = {"small": 1.25, "large": 1 / 0.98}  # nvproxy/native time per call, at most
THROUGHPUT = {"GB/s", "GFLOP/s", "TFLOP/s"}


def program(backend: str) -> Path | None:
    """libbench built with the libraries linked; None, with one line on stderr saying why, where it cannot run."""
    if backend == "sim":
        return _skip("the sim backend has no GPU math libraries")
    try:
        return build.program("libbench", "-std=c++17", "-O2", *LINK)
    except build.BuildError as e:
        return _skip(_why(str(e)))


def _skip(why: str) -> None:
    print(f"nvproxy bench: library benchmarks skipped: {why}", file=sys.stderr, flush=True)
    return None


def _why(error: str) -> str:
    """nvcc's failure in one line: the libraries it could not link, else its first error."""
    missing = [f"lib{m}.so" for m in re.findall(r"cannot find -l(\w+)", error)]
    missing += re.findall(r"fatal error: (\S+\.h): No such file", error)
    if missing:
        return "the CUDA toolkit has no " + ", ".join(dict.fromkeys(missing))
    lines = [ln.strip() for ln in error.splitlines() if ln.strip()]
    return next((ln for ln in lines if "error" in ln.lower()), lines[-1] if lines else error)


def target(bench: str, unit: str) -> tuple[str, float] | None:
    """The row's target for nvproxy/native: ("<=", limit) for times, (">=", limit) for throughputs; None if it has
    none (not a library benchmark)."""
    cls = CLASS.get(bench)
    if cls is None:
        return None
    return (">=", round(1 / LIMIT[cls], 3)) if unit in THROUGHPUT else ("<=", round(LIMIT[cls], 3))


def meets(goal: tuple[str, float], ratio: float) -> bool:
    op, limit = goal
    return ratio >= limit if op == ">=" else ratio <= limit


def different_results(checks: dict[tuple[str, int], dict[str, set[str]]]) -> dict[tuple[str, int], str]:
    """The benchmarks whose runs (native, nvproxy, variants; every round) did not all compute the same result
    (libbench's "check": an exact sum of the result's bits), each with a line that says so."""
    out = {}
    for (bench, param), by_mode in sorted(checks.items()):
        if len(set().union(*by_mode.values())) > 1:
            seen = "; ".join(f"{mode} {', '.join(sorted(vals))}" for mode, vals in by_mode.items())
            out[(bench, param)] = f"{bench} {param}: the runs computed different results (checksums: {seen})"
    return out


def plot(plt: Any, rows: list[dict], path: Path, size: Callable[[dict], str]) -> None:
    """A bar per library row with a ratio: nvproxy/native, its target marked, green where met and red where not;
    size(row) labels the row's size."""
    lib = [(r, goal) for r in rows if "ratio" in r and (goal := target(r["bench"], r["unit"]))]
    if not lib:
        return
    fig, ax = plt.subplots(figsize=(8, 4))
    xs = range(len(lib))
    ax.bar(xs, [r["ratio"] for r, _ in lib], 0.6,
           color=["tab:green" if meets(goal, r["ratio"]) else "tab:red" for r, goal in lib])
    ax.scatter(xs, [goal[1] for _, goal in lib], marker="_", s=600, color="black", zorder=3, label="target")
    ax.axhline(1.0, color="grey", linewidth=0.8, linestyle="--")
    ax.set_xticks(list(xs), [f"{r['bench']} {size(r)}\n{r['unit']}" for r, _ in lib], rotation=30, ha="right",
                  fontsize=7)
    ax.set_ylabel("nvproxy / native")
    ax.set_title("math libraries, nvproxy/native (time: at most the target; throughput: at least)")
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=120)
