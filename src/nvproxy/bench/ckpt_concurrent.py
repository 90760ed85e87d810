"""Concurrent and incremental checkpoints of a program that keeps computing (ckpt_bench.cu's loop: a kernel over a
tenth of its memory, again and again): the stall (cut to release) of a stop-the-world checkpoint and of a concurrent
one, the program's rate while the concurrent one copies out against its rate before, and how much of its memory an
incremental checkpoint taken after it writes from the device (the loop touches a tenth).

    python -m nvproxy.bench.ckpt_concurrent [--sizes 1,4,16,64] [--backend gpu|sim] [--out DIR]
`nvproxy bench` runs it with the other checkpoint rows (run.py)."""

from __future__ import annotations

import argparse
import json
import re
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

from . import ckpt_run

HERE = Path(__file__).resolve().parent
STOPPED = re.compile(r"the application was stopped ([\d.]+) s")
WENT_ON = re.compile(r"the application went on after ([\d.]+) ms")
WRITTEN = re.compile(r"incremental: (\d+) of (\d+) MiB written from the device")
METHODS = re.compile(r"concurrent \(([^)]*)\)")
BEFORE_BATCHES = 20  # batches of the loop measured before the concurrent checkpoint


class Loop:
    """The program's "batch NS" lines, as they come (NS: CLOCK_MONOTONIC, the clock of time.monotonic)."""

    def __init__(self, app: subprocess.Popen) -> None:
        self.app, self.stamps, self.rest = app, [], []
        self.cond = threading.Condition()
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        assert self.app.stdout is not None
        for line in self.app.stdout:
            with self.cond:
                if line.startswith("batch "):
                    self.stamps.append(int(line.split()[1]) / 1e9)
                else:
                    self.rest.append(line)
                self.cond.notify_all()
        with self.cond:
            self.rest.append("")
            self.cond.notify_all()

    def wait_batches(self, n: int, timeout: float = 600) -> None:
        """Until n batches have ended after this call (or the program ended). Counted by their stamps, not by lines
        read: under load this reader lags, and lines of batches done before the call arrive after it."""
        since = time.monotonic()
        with self.cond:
            self.cond.wait_for(lambda: sum(1 for t in self.stamps if t >= since) >= n or "" in self.rest, timeout)

    def wait_end(self, timeout: float = 600) -> None:
        """Until the program's stdout has ended."""
        with self.cond:
            self.cond.wait_for(lambda: "" in self.rest, timeout)

    def finish(self, timeout: float = 900) -> str:
        """Let the program verify its memory and end (a line on its stdin); its stderr.  (Its stdout is this
        reader's to the end: communicate() would read the same pipe beside it.)"""
        assert self.app.stdin is not None and self.app.stderr is not None
        try:
            self.app.stdin.write("\n")
            self.app.stdin.close()
        except BrokenPipeError:
            pass
        err = self.app.stderr.read()
        self.app.wait(timeout=timeout)
        self.wait_end()
        return err

    def rate(self, t0: float, t1: float) -> float:
        """Batches per second in [t0, t1]."""
        with self.cond:
            n = sum(1 for t in self.stamps if t0 <= t <= t1)
        return n / (t1 - t0) if t1 > t0 else 0.0


def _checkpoint(app_pid: int, image: Path, *flags: str) -> tuple[str, float | None]:
    """nvproxy checkpoint's output, and when (time.monotonic) it said the application went on (concurrent)."""
    p = subprocess.Popen([sys.executable, "-m", "nvproxy", "checkpoint", str(app_pid), "-o", str(image), *flags],
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    assert p.stdout is not None
    first = p.stdout.readline()
    released = time.monotonic() if WENT_ON.search(first) else None
    # (not communicate(): it reads the pipes' descriptors and would miss what readline has buffered already; the
    # command says little on stderr, which its pipe holds meanwhile)
    assert p.stderr is not None
    out, err = p.stdout.read(), p.stderr.read()
    p.wait(timeout=900)
    if p.returncode:
        raise RuntimeError(f"nvproxy checkpoint {' '.join(flags)} failed: {err.strip()}")
    return first + out, released


def measure(exe: Path, mib: int, td: Path, backend: str) -> dict:
    app = subprocess.Popen([sys.executable, "-m", "nvproxy", "run", "--backend", backend, "--sim-kernels",
                            str(HERE / "ckpt_bench_sim.py"), "--", str(exe), str(mib), "loop"],
                           stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    assert app.stdout and app.stdin
    if app.stdout.readline().strip() != "ready":
        raise RuntimeError(app.communicate()[1])
    loop = Loop(app)
    row: dict = {"mib": mib}
    try:
        ckpt_run._wait_prepared(app.pid)
        loop.wait_batches(BEFORE_BATCHES)
        said, _ = _checkpoint(app.pid, td / "stw.img", "--no-concurrent")
        (td / "stw.img").unlink(missing_ok=True)  # (only its stop is wanted: disks hold few images of 64 GiB)
        stopped = STOPPED.search(said)
        row["stw_stall_s"] = float(stopped.group(1)) if stopped else None
        t_before = time.monotonic()
        loop.wait_batches(BEFORE_BATCHES)
        t_start = time.monotonic()
        said, released = _checkpoint(app.pid, td / "conc.img", "--concurrent")
        t_done = time.monotonic()
        went = WENT_ON.search(said)
        methods = METHODS.search(said)
        before, during = loop.rate(t_before, t_start), loop.rate(released or t_start, t_done)
        row.update(concurrent_stall_s=float(went.group(1)) / 1e3 if went else None,
                   concurrent_methods=methods.group(1) if methods else "", concurrent_total_s=t_done - t_start,
                   concurrent_copy_s=t_done - (released or t_start), rate_before=before, rate_during=during,
                   slowdown_pct=100.0 * (1 - during / before) if before else None, concurrent_out=said.strip())
        loop.wait_batches(BEFORE_BATCHES)
        said, _ = _checkpoint(app.pid, td / "inc.img", "--incremental", "--tracked")
        written = WRITTEN.search(said)
        if written:
            w, total = int(written.group(1)), int(written.group(2))
            row.update(incremental_written_mib=w, incremental_total_mib=total,
                       incremental_written_pct=100.0 * w / total if total else 0.0)
    finally:
        err = loop.finish()
    row["verified"] = "verified ok" in "".join(loop.rest)
    if not row["verified"]:
        row["error"] = err.strip()[-500:]
    return row


def add_rows(samples: dict, backend: str, sizes: list[int], out: Path, stw_native: dict[int, float]) -> None:
    """The rows run.py shows (stw_native: cuda-checkpoint's stop time by MiB, where it ran); every measurement to
    out/concurrent-runs.json."""
    exe = ckpt_run.build()
    runs = []
    for mib in sizes:
        print(f"concurrent checkpoint {mib} MiB", file=sys.stderr, flush=True)
        with tempfile.TemporaryDirectory() as images:
            row = measure(exe, mib, Path(images), backend)
        runs.append(row)
        (out / "concurrent-runs.json").write_text(json.dumps(runs, indent=1))
        if not row["verified"]:
            raise RuntimeError(f"concurrent checkpoint benchmark of {mib} MiB: the memory did not verify: {row}")
        size = mib << 20
        for bench, key, unit in (("ckpt_stall_stw", "stw_stall_s", "s"),
                                 ("ckpt_stall_concurrent", "concurrent_stall_s", "s"),
                                 ("ckpt_concurrent_slowdown", "slowdown_pct", "%"),
                                 ("ckpt_incremental_written", "incremental_written_pct", "%")):
            if row.get(key) is not None:
                samples[(bench, size, unit)]["nvproxy"].append(row[key])
            if unit == "s" and mib in stw_native:
                samples[(bench, size, unit)]["native"].append(stw_native[mib])


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--sizes", default="1,4")
    ap.add_argument("--backend", default="gpu")
    ap.add_argument("--out", default="bench-results")
    args = ap.parse_args(argv)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    exe = ckpt_run.build()
    rows = []
    for mib in ckpt_run.parse_sizes(args.sizes):
        with tempfile.TemporaryDirectory() as td:
            rows.append(measure(exe, mib, Path(td), args.backend))
        print(json.dumps(rows[-1]), flush=True)
    (out / "concurrent-runs.json").write_text(json.dumps(rows, indent=1))
    return 0 if all(r["verified"] for r in rows) else 1


if __name__ == "__main__":
    raise SystemExit(main())
