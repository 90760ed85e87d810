"""mdrun's command lines for the configurations users run on a GPU, and the energies it writes into its log.

GPU nonbonded and PME kernels add forces with atomics, so two native runs of one input are not bitwise alike: they
agree closely at the start and drift apart as the dynamics amplify the rounding.  A run through nvproxy is judged
against native runs of the same input by physics that do not depend on that rounding (compare())."""

from __future__ import annotations

import math
import re
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

# The configurations: mdrun's options and environment.  -ntomp 4 leaves the machine's other cores to the proxy and
# to a second run.  -notunepme: PP/PME load balancing picks the Coulomb cut-off and PME grid from timings, so two
# runs (a stall such as a checkpoint's starts it again) may split the electrostatics differently between
# Coulomb (SR) and Coul. recip.; fixed settings keep every run's physics the same, and timed runs do equal work.
CONFIGS: dict[str, tuple[tuple[str, ...], dict[str, str]]] = {
    "pme-gpu": (("-nb", "gpu", "-pme", "gpu", "-ntmpi", "1", "-ntomp", "4"), {}),
    "pme-cpu": (("-nb", "gpu", "-pme", "cpu", "-ntmpi", "1", "-ntomp", "4"), {}),
    "update-gpu": (("-nb", "gpu", "-pme", "gpu", "-update", "gpu", "-ntmpi", "1", "-ntomp", "4"), {}),
    "graphs": (("-nb", "gpu", "-pme", "gpu", "-update", "gpu", "-ntmpi", "1", "-ntomp", "4"),
               {"GMX_CUDA_GRAPH": "1"}),
    "two-ranks": (("-nb", "gpu", "-pme", "gpu", "-ntmpi", "2", "-npme", "1", "-ntomp", "2"), {}),
    "two-gpus": (("-nb", "gpu", "-pme", "gpu", "-ntmpi", "2", "-npme", "1", "-ntomp", "2", "-gpu_id", "01"), {}),
    "bonded-gpu": (("-nb", "gpu", "-pme", "gpu", "-bonded", "gpu", "-update", "gpu", "-ntmpi", "1", "-ntomp", "4"),
                   {}),
}
# the system each configuration runs (make_input.SYSTEMS); water unless named here (water has no bonded terms)
SYSTEM_OF = {"bonded-gpu": "methanol"}


def system_of(config: str) -> str:
    return SYSTEM_OF.get(config, "water")


def mdrun_args(gmx: Path, tpr: Path, name: Path, config: str, steps: int) -> tuple[list[str], dict[str, str]]:
    """The command line of an mdrun of tpr for `steps` steps writing name.log (and name.edr...), and the settings it
    needs in its environment."""
    options, env = CONFIGS[config]
    return ([str(gmx), "mdrun", "-s", str(tpr), "-deffnm", str(name), "-nsteps", str(steps), "-noconfout",
             "-notunepme", *options],
            {"GMX_MAXBACKUP": "-1", **env})


# ---------------------------------------------------------------------------------------------------------------
# the log

@dataclass
class Energies:
    """The energy records of one run's log: step -> {term: value}; its performance line (ns/day) if it ended."""

    records: dict[int, dict[str, float]]
    ns_per_day: float | None


_STEP = re.compile(r"^\s+Step\s+Time\s*\n\s+(\d+)\s+\S+\s*\n\s*\n\s+Energies \(kJ/mol\)\n((?:.*\S.*\n)+)", re.M)


def read_log(log: Path) -> Energies:
    """The energies mdrun wrote into its log at each logging step (names and values in columns of 15)."""
    text = log.read_text(errors="replace")
    records: dict[int, dict[str, float]] = {}
    for m in _STEP.finditer(text):
        lines = m.group(2).splitlines()
        terms: dict[str, float] = {}
        for names, values in zip(lines[0::2], lines[1::2], strict=False):
            cols = [names[i:i + 15].strip() for i in range(0, len(names), 15)]
            terms.update(zip(cols, map(float, values.split()), strict=True))
        records[int(m.group(1))] = terms
    perf = re.search(r"^Performance:\s+(\S+)", text, re.M)
    return Energies(records, float(perf.group(1)) if perf else None)


def last_step(log: Path) -> int:
    """The last step whose energies the log holds (-1 if none yet)."""
    return max(read_log(log).records, default=-1) if log.exists() else -1


# ---------------------------------------------------------------------------------------------------------------
# the comparison

# The terms compared.  Pressure is left out: its instantaneous fluctuations (hundreds of bar in 21,000 atoms) swamp
# any mean a few thousand steps can give.
TERMS = ("LJ (SR)", "Coulomb (SR)", "Coul. recip.", "Potential", "Kinetic En.", "Temperature")
BONDED = ("Bond", "Angle")  # (compared too where the log has them)
# At step 0 every run starts from the same coordinates and velocities: energies differ only by the order of float
# additions (relative 1e-7 to 1e-6 in sums over 21,000 atoms).  10x that is allowed, or 3x the native spread.
START_REL = 1e-5


def block_error(values: Sequence[float], blocks: int = 5) -> float:
    """The standard error of the mean of a correlated series, from the spread of its block means."""
    n = len(values) // blocks
    means = [sum(values[i * n:(i + 1) * n]) / n for i in range(blocks)] if n else [0.0]
    mean = sum(means) / len(means)
    return math.sqrt(sum((m - mean) ** 2 for m in means) / max(len(means) - 1, 1) / len(means))


def compare(run: Energies, natives: Sequence[Energies], *, steps: int) -> list[str]:
    """What is wrong with run, judged against two native runs of the same input over the same steps; [] if
    nothing.  Four checks:
    - every logging step up to `steps` is there (the run finished, and a restarted one missed none);
    - step 0 matches native within START_REL (or 3x the two native runs' difference);
    - each term's mean over the run is within 4x the larger of the two native runs' difference and the
      statistical error of a mean (block averages): independent trajectories from one start differ by about
      sqrt(2) statistical errors, so a correct run passes with a wide margin while a wrong force, a lost update
      or a restore from stale memory moves a mean by far more;
    - the conserved energy (the thermostat's work included) changes from one record to the next by no more than
      3x the largest such change of the native runs (plus 0.1% of the kinetic energy): a restore that lost or
      mixed up state shows as a jump in it, wherever the mean may end up."""
    problems = []
    a, b = natives
    want = sorted(a.records)
    missing = [s for s in want if s not in run.records]
    if missing or want[-1] != steps:
        problems.append(f"steps missing from the log: {missing[:5]} (native's last: {want[-1]}, expected {steps})")
        return problems
    for term in TERMS + tuple(t for t in BONDED if t in a.records[0]):
        x0, a0, b0 = run.records[0][term], a.records[0][term], b.records[0][term]
        tol = max(START_REL * abs(a0), 3 * abs(a0 - b0))
        if abs(x0 - a0) > tol:
            problems.append(f"step 0 {term}: {x0:g} against native {a0:g} (allowed {tol:.3g})")
        xs, as_, bs = ([e.records[s][term] for s in want] for e in (run, a, b))
        mx, ma, mb = (sum(v) / len(v) for v in (xs, as_, bs))
        tol = 4 * max(abs(ma - mb), block_error(as_), block_error(bs))
        if abs(mx - ma) > tol:
            problems.append(f"mean {term}: {mx:g} against native {ma:g} and {mb:g} (allowed {tol:.3g})")
    # (from the second record on: over the first interval the conserved energy moves by hundreds of kJ/mol in every
    # run, as the generated velocities meet the constraints)
    jumps = [max(abs(q - p) for p, q in zip(v, v[1:], strict=False)) for v in
             ([e.records[s]["Conserved En."] for s in want[1:]] for e in (run, a, b))]
    allowed = 3 * max(jumps[1:]) + 1e-3 * abs(a.records[0]["Kinetic En."])
    if jumps[0] > allowed:
        problems.append(f"the conserved energy jumps by {jumps[0]:g} kJ/mol (native at most {max(jumps[1:]):g}, "
                        f"allowed {allowed:.3g})")
    return problems


def ns_per_day(log: Path) -> float:
    perf = read_log(log).ns_per_day
    if perf is None:
        raise ValueError(f"{log} holds no Performance line: the run did not finish")
    return perf

