"""Whole programs, natively and through nvproxy: `nvproxy bench --apps DIR`.

Every executable file directly in DIR is a program, run natively and through `nvproxy run`, alternating which goes
first, --reps rounds.  Beside a program NAME, optional files:
    NAME.args     its arguments: one line, split as a POSIX shell would (shlex), e.g.  -n 4096 --file 'a b.dat'
    NAME.filter   a regular expression (Python's); standard output lines it matches (timings, say) are left out
                  when the two runs' outputs are compared
    NAME_sim.py   its kernels for the sim backend (as nvproxy run --sim-kernels)
Per program: the median wall time of each, their ratio, the spread of the rounds ((max - min) / median), the time
from the start to the first CUDA runtime call returned (a probe preloaded in both runs: native/probe/first_call.c)
and whether the time nvproxy adds stays within ADDED_S + ADDED_FRACTION of native; over all programs, the geomean
of the ratios against TARGET_GEOMEAN.  A program whose standard output differs between the two runs is a
failure, never a figure; one that fails natively is reported and left out.  Writes apps.json and apps.md in --out,
and apps.png where matplotlib is installed.
"""

from __future__ import annotations

import json
import math
import os
import re
import shlex
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

TARGET_GEOMEAN = 1.05
ADDED_S, ADDED_FRACTION = 0.050, 0.03  # the time nvproxy may add to a program: 50 ms + 3% of its native time
PROBE_VAR = "NVP_FIRST_CALL_FILE"  # (read by the probe: the file it appends its line to)
RUN_TIMEOUT_S = 3600
SIDE_FILES = (".args", ".filter", "_sim.py")


class AppsError(SystemExit):
    """DIR or one of its side files cannot be used; the message says which and why, in one line."""


@dataclass
class App:
    name: str
    exe: Path
    args: list[str] = field(default_factory=list)
    filter: re.Pattern[str] | None = None
    sim_kernels: Path | None = None


@dataclass
class Run:
    wall: float
    first_call: float | None  # seconds from the start to the first CUDA runtime call returned; None: not seen
    output: str
    returncode: int
    stderr: str


def probe_path() -> Path | None:
    """The first-call probe built with this package (None where it is not: it is x86-64 code)."""
    p = Path(__file__).resolve().parent.parent / "_native" / "libnvproxy_firstcall.so"
    return p if p.exists() else None


def discover(directory: Path) -> list[App]:
    """The programs of directory, by name, with their side files read."""
    if not directory.is_dir():
        raise AppsError(f"nvproxy bench: --apps {directory}: not a directory")
    apps = []
    for exe in sorted(directory.iterdir()):
        if exe.name.startswith(".") or exe.name.endswith(SIDE_FILES) or not exe.is_file() \
                or not os.access(exe, os.X_OK):
            continue
        app = App(exe.name, exe.resolve())
        args = exe.with_name(exe.name + ".args")
        if args.exists():
            try:
                app.args = shlex.split(args.read_text().strip())
            except ValueError as e:
                raise AppsError(f"nvproxy bench: {args}: {e} (expected one line of arguments, quoted as in a "
                                "shell)") from None
        pattern = exe.with_name(exe.name + ".filter")
        if pattern.exists():
            try:
                app.filter = re.compile(pattern.read_text().strip())
            except re.error as e:
                raise AppsError(f"nvproxy bench: {pattern}: {e} (expected one regular expression)") from None
        kernels = exe.with_name(exe.name + "_sim.py")
        app.sim_kernels = kernels if kernels.exists() else None
        apps.append(app)
    if not apps:
        raise AppsError(f"nvproxy bench: --apps {directory}: no executable files in it")
    return apps


def command(app: App, mode: str, backend: str) -> list[str]:
    if mode == "native":
        return [str(app.exe), *app.args]
    kernels = ["--sim-kernels", str(app.sim_kernels)] if app.sim_kernels and backend == "sim" else []
    return [sys.executable, "-m", "nvproxy", "run", "--backend", backend, *kernels, "--", str(app.exe), *app.args]


def run_once(app: App, mode: str, backend: str, env: dict[str, str]) -> Run:
    """One run of app, natively or through nvproxy, with the first-call probe preloaded where there is one."""
    probe = probe_path()
    with tempfile.TemporaryDirectory(prefix="nvproxy-apps-") as tmp:
        log = Path(tmp) / "first-call"
        run_env = dict(env)
        if probe:
            pre = run_env.get("LD_PRELOAD")
            run_env.update(LD_PRELOAD=f"{probe}:{pre}" if pre else str(probe), **{PROBE_VAR: str(log)})
        t0 = time.monotonic()
        try:
            r = subprocess.run(command(app, mode, backend), capture_output=True, text=True, errors="replace",
                               env=run_env, timeout=RUN_TIMEOUT_S, cwd=app.exe.parent)
        except subprocess.TimeoutExpired:
            return Run(time.monotonic() - t0, None, "", -1, f"did not end within {RUN_TIMEOUT_S} s")
        wall = time.monotonic() - t0
        lines = log.read_text().split() if log.exists() else []
    first = float(lines[0]) - t0 if lines else None
    return Run(wall, first, r.stdout, r.returncode, r.stderr)


def _compared(app: App, output: str) -> list[str]:
    return [ln for ln in output.splitlines() if not (app.filter and app.filter.search(ln))]


def first_difference(app: App, native: str, nvproxy: str) -> str | None:
    """The first line where the outputs differ (filter applied), in words; None if they do not."""
    a, b = _compared(app, native), _compared(app, nvproxy)
    for i, (x, y) in enumerate(zip(a, b, strict=False)):
        if x != y:
            return f"line {i + 1}: native {x!r}, nvproxy {y!r}"
    if len(a) != len(b):
        return f"native printed {len(a)} lines, nvproxy {len(b)}"
    return None


def _tail(text: str) -> str:
    lines = [ln for ln in text.strip().splitlines() if ln.strip()]
    return lines[-1] if lines else "no message"


def measure(apps: list[App], reps: int, native: bool, backend: str, env: dict[str, str]) -> list[dict]:
    """Each program's runs and verdict, as a row; one progress line per run on stderr."""
    rows = {app.name: {"program": app.name, "args": app.args, "wall": {}, "first_call": {}} for app in apps}
    modes = ["native", "nvproxy"] if native else ["nvproxy"]
    for rep in range(reps):
        for app in apps:
            row = rows[app.name]
            if "status" in row:
                continue
            runs: dict[str, Run] = {}
            for mode in modes if rep % 2 == 0 else modes[::-1]:
                run = runs[mode] = run_once(app, mode, backend, env)
                print(f"[{rep + 1}/{reps}] {mode} {app.name}: {run.wall:.3f} s"
                      + (f" (exit status {run.returncode})" if run.returncode else ""), file=sys.stderr, flush=True)
                row["wall"].setdefault(mode, []).append(run.wall)
                if run.first_call is not None:
                    row["first_call"].setdefault(mode, []).append(run.first_call)
            if native and runs["native"].returncode:
                row["status"] = f"fails natively (exit status {runs['native'].returncode}: " \
                                f"{_tail(runs['native'].stderr)}): left out"
            elif runs["nvproxy"].returncode:
                row["status"] = f"FAILED through nvproxy (exit status {runs['nvproxy'].returncode}: " \
                                f"{_tail(runs['nvproxy'].stderr)})"
            elif native and (diff := first_difference(app, runs["native"].output, runs["nvproxy"].output)):
                row["status"] = f"FAILED: the output differs from native ({diff})"
    return [_verdict(row) for row in rows.values()]


def _verdict(row: dict) -> dict:
    """Medians, ratio, spread and the added-time target of a row whose runs all succeeded."""
    if "status" in row:
        row["ok"] = row["status"].endswith("left out")
        for key in ("wall", "first_call"):
            row.pop(key)
        return row
    row["ok"] = True
    for key in ("wall", "first_call"):
        for mode, vals in row.pop(key).items():
            row[f"{mode}_{key}_s"] = statistics.median(vals)
            if key == "wall":
                row[f"{mode}_spread"] = (max(vals) - min(vals)) / statistics.median(vals)
    if "native_wall_s" in row:
        native = row["native_wall_s"]
        row["ratio"] = row["nvproxy_wall_s"] / native
        row["added_s"] = row["nvproxy_wall_s"] - native
        row["allowed_s"] = ADDED_S + ADDED_FRACTION * native
        row["meets_target"] = row["added_s"] <= row["allowed_s"]
    return row


def summary(rows: list[dict]) -> dict:
    ratios = [r["ratio"] for r in rows if "ratio" in r]
    geomean = math.exp(statistics.fmean(math.log(x) for x in ratios)) if ratios else None
    failed = [r["program"] for r in rows if not r["ok"]]
    return {"geomean": geomean, "target_geomean": TARGET_GEOMEAN,
            "meets_geomean": None if geomean is None else geomean <= TARGET_GEOMEAN,
            "added_target": f"{ADDED_S * 1000:g} ms + {ADDED_FRACTION:.0%} of native",
            "programs_meeting_added_target": sum(1 for r in rows if r.get("meets_target")),
            "programs_with_ratio": len(ratios), "failed": failed}


def _s(x: float | None) -> str:
    return "" if x is None else f"{x:.3f}"


def table(rows: list[dict], total: dict) -> str:
    lines = ["| program | native s | nvproxy s | nvproxy/native | spread native, nvproxy | first call native s | "
             "first call nvproxy s | added s (allowed) | verdict |",
             "|---|---:|---:|---:|---|---:|---:|---|---|"]
    for r in rows:
        if "status" in r:
            lines.append(f"| {r['program']} | | | | | | | | {r['status']} |")
            continue
        spread = ", ".join(f"{r[f'{m}_spread']:.0%}" for m in ("native", "nvproxy") if f"{m}_spread" in r)
        added = f"{r['added_s']:+.3f} ({r['allowed_s']:.3f})" if "added_s" in r else ""
        verdict = ("meets" if r["meets_target"] else "misses") + " the added-time target" if "ratio" in r else \
            "nvproxy only"
        lines.append(f"| {r['program']} | {_s(r.get('native_wall_s'))} | {_s(r.get('nvproxy_wall_s'))} | "
                     f"{_s(r.get('ratio'))} | {spread} | {_s(r.get('native_first_call_s'))} | "
                     f"{_s(r.get('nvproxy_first_call_s'))} | {added} | {verdict} |")
    g = total["geomean"]
    lines.append("")
    lines.append(f"geomean nvproxy/native: {g:.3f} (target <= {TARGET_GEOMEAN}: "
                 f"{'met' if total['meets_geomean'] else 'missed'}); added time within {total['added_target']}: "
                 f"{total['programs_meeting_added_target']} of {total['programs_with_ratio']} programs"
                 if g is not None else "geomean: no native runs to compare with")
    if total["failed"]:
        lines.append(f"FAILED: {', '.join(total['failed'])}")
    return "\n".join(lines)


def plot(rows: list[dict], path: Path) -> None:
    """A bar per program: nvproxy/native, green where the added time is within its target, red where not; the
    geomean target as a line.  A line on stderr instead where matplotlib is missing."""
    shown = [r for r in rows if "ratio" in r]
    if not shown:
        return
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("nvproxy bench: matplotlib is not installed: no apps.png", file=sys.stderr)
        return
    fig, ax = plt.subplots(figsize=(max(6, 0.6 * len(shown) + 2), 4))
    xs = range(len(shown))
    ax.bar(xs, [r["ratio"] for r in shown], 0.6,
           color=["tab:green" if r["meets_target"] else "tab:red" for r in shown])
    ax.axhline(1.0, color="grey", linewidth=0.8, linestyle="--")
    ax.axhline(TARGET_GEOMEAN, color="black", linewidth=0.8, label=f"geomean target {TARGET_GEOMEAN}")
    ax.set_xticks(list(xs), [r["program"] for r in shown], rotation=30, ha="right", fontsize=7)
    ax.set_ylabel("wall time, nvproxy / native")
    ax.set_title("whole programs (green: added time within 50 ms + 3% of native)")
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=120)


def main(directory: Path, reps: int, native: bool, backend: str, out: Path, env: dict[str, str]) -> int:
    """Measure, then print the table and write apps.json, apps.md and apps.png; 1 if a program failed through
    nvproxy or printed other output than natively."""
    apps = discover(directory)
    if not native:
        why = "the sim backend has no GPU" if backend == "sim" else "--no-native"
        print(f"nvproxy bench: --apps: no native runs ({why}): nvproxy runs only, no ratios", file=sys.stderr,
              flush=True)
    if probe_path() is None:
        print("nvproxy bench: --apps: no first-call probe in this build (it is x86-64 code): no first-call times",
              file=sys.stderr, flush=True)
    out.mkdir(parents=True, exist_ok=True)
    rows = measure(apps, reps, native, backend, env)
    total = summary(rows)
    text = table(rows, total)
    (out / "apps.json").write_text(json.dumps({"backend": backend, "reps": reps, "native": native,
                                               "programs": rows, **total}, indent=1))
    (out / "apps.md").write_text(text + "\n")
    print(text)
    plot(rows, out / "apps.png")
    return 1 if total["failed"] else 0
