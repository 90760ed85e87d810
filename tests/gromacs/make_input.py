"""Run inputs for GROMACS, made from GROMACS's own data, with PME:
- `water`: an SPC/E water box. `gmx solvate` fills a cubic box with its spc216.gro water, the topology takes
  OPLS-AA's SPC/E model.  A 6 nm box holds 7,029 waters (21,087 atoms).  Rigid (SETTLE): no bonded terms.
- `methanol`: liquid methanol with bonded terms (a C-O bond and a C-O-H angle per molecule; O-H constrained), for
  `-bonded gpu`.  `gmx genconf` repeats GROMOS 43a1's equilibrated box of 216 methanols (2.39 nm) to fill the box:
  a 6 nm box (3 x 3 x 3 copies, 7.2 nm) holds 5,832 molecules (17,496 atoms).
A short energy minimisation (mdrun, natively) removes the overlaps at the box's faces, and `gmx grompp` makes the
run input (topol.tpr) from the .mdp written here.

    python3 tests/gromacs/make_input.py GROMACS_DIR OUT_DIR [--box NM] [--system water|methanol]

GROMACS_DIR is GROMACS's installation (bin/gmx); the input goes to OUT_DIR/topol.tpr.
"""

from __future__ import annotations

import argparse
import math
import os
import subprocess
import sys
from pathlib import Path

# Velocities from a fixed seed: every run of one input starts from the same state.  Energies are computed every 100
# steps and written to the log every NSTLOG steps (the log is flushed at each of them: tests wait for a step there).
NSTLOG = 200
MDP = f"""\
integrator      = md
dt              = 0.002
nsteps          = 5000
cutoff-scheme   = Verlet
coulombtype     = PME
rcoulomb        = 1.0
rvdw            = 1.0
fourierspacing  = 0.125
nstcalcenergy   = 100
nstenergy       = {NSTLOG}
nstlog          = {NSTLOG}
tcoupl          = v-rescale
tc-grps         = System
tau-t           = 0.1
ref-t           = 300
gen-vel         = yes
gen-temp        = 300
gen-seed        = 1993
constraints     = h-bonds
"""

EM_MDP = """\
integrator      = steep
nsteps          = 500
emtol           = 1000
cutoff-scheme   = Verlet
coulombtype     = PME
rcoulomb        = 1.0
rvdw            = 1.0
constraints     = h-bonds
"""


SYSTEMS = ("water", "methanol")


def gmx(gmx_dir: Path) -> Path:
    """GROMACS's driver program in its installation, or a one-line error."""
    exe = Path(gmx_dir) / "bin" / "gmx"
    if not os.access(exe, os.X_OK):
        raise FileNotFoundError(f"no GROMACS in {gmx_dir}: {exe} is not an executable file")
    return exe


def _tool(exe: Path, out: Path, *args: str) -> None:
    r = subprocess.run([str(exe), *args], cwd=out, capture_output=True, text=True,
                       env=dict(os.environ, GMX_MAXBACKUP="-1"))
    if r.returncode != 0:
        raise RuntimeError(f"gmx {args[0]} failed (exit status {r.returncode}): {r.stderr.strip()[-2000:]}")


def make_input(gmx_dir: Path, out: Path, box_nm: float = 6.0, system: str = "water") -> Path:
    """Write the system's run input into out (made if missing); returns the path of its topol.tpr."""
    exe = gmx(gmx_dir)
    out.mkdir(parents=True, exist_ok=True)
    if system == "water":
        _tool(exe, out, "solvate", "-cs", "spc216.gro", "-box", *[f"{box_nm:g}"] * 3, "-o", "conf.gro")
        n = sum(1 for line in (out / "conf.gro").read_text().splitlines()[2:-1] if line[10:15].strip() == "OW")
        top = ('#include "oplsaa.ff/forcefield.itp"\n#include "oplsaa.ff/spce.itp"\n\n'
               f"[ system ]\nSPC/E water\n\n[ molecules ]\nSOL {n}\n")
    elif system == "methanol":
        box = _top_dir(exe) / "gromos43a1.ff" / "methanol216.gro"
        copies = max(1, math.ceil(box_nm / float(box.read_text().splitlines()[-1].split()[0])))
        _tool(exe, out, "genconf", "-f", str(box), "-nbox", *[str(copies)] * 3, "-o", "conf.gro")
        n = 216 * copies ** 3
        top = ('#include "gromos43a1.ff/forcefield.itp"\n#include "gromos43a1.ff/methanol.itp"\n\n'
               f"[ system ]\nliquid methanol\n\n[ molecules ]\nMethanol {n}\n")
    else:
        raise ValueError(f"no system {system!r} (water or methanol)")
    # (grompp warns that GROMOS was parametrised for a twin-range cut-off: its densities may differ from the
    # intended ones, which matters to the physics of methanol, not to comparing a run with a native one)
    warns = ["-maxwarn", "1"] if system == "methanol" else []
    (out / "topol.top").write_text(top)
    (out / "em.mdp").write_text(EM_MDP)
    _tool(exe, out, "grompp", "-f", "em.mdp", "-c", "conf.gro", "-p", "topol.top", "-o", "em.tpr", *warns)
    _tool(exe, out, "mdrun", "-s", "em.tpr", "-deffnm", "em", "-ntmpi", "1", "-ntomp", "4")
    (out / "md.mdp").write_text(MDP)
    _tool(exe, out, "grompp", "-f", "md.mdp", "-c", "em.gro", "-p", "topol.top", "-o", "topol.tpr", *warns)
    return out / "topol.tpr"


def _top_dir(exe: Path) -> Path:
    """GROMACS's force-field directory (share/gromacs/top of its installation)."""
    top = exe.resolve().parents[1] / "share" / "gromacs" / "top"
    if not top.is_dir():
        raise FileNotFoundError(f"GROMACS's force fields are not in {top}")
    return top


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("gmx_dir", type=Path, help="GROMACS's installation (with bin/gmx)")
    ap.add_argument("out", type=Path, help="where the input goes")
    ap.add_argument("--box", type=float, default=6.0, help="the cubic box's edge in nm (default 6)")
    ap.add_argument("--system", choices=SYSTEMS, default="water")
    args = ap.parse_args(argv)
    try:
        print(make_input(args.gmx_dir, args.out, args.box, args.system))
    except (OSError, RuntimeError, ValueError) as e:
        print(f"make_input: {e}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
