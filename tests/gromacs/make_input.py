"""An SPC/E water box with PME for GROMACS, made from GROMACS's own data: `gmx solvate` fills a cubic box with
its spc216.gro water, the topology takes OPLS-AA's SPC/E model, a short energy minimisation (mdrun, natively)
removes the overlaps solvate leaves at the box's faces, and `gmx grompp` makes the run input (topol.tpr) from the
.mdp written here.  A 6 nm box holds 7,029 waters (21,087 atoms).

    python3 tests/gromacs/make_input.py GROMACS_DIR OUT_DIR [--box NM]

GROMACS_DIR is GROMACS's installation (bin/gmx); the input goes to OUT_DIR/topol.tpr.
"""

from __future__ import annotations

import argparse
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


def make_input(gmx_dir: Path, out: Path, box_nm: float = 6.0) -> Path:
    """Write the water box's run input into out (made if missing); returns the path of its topol.tpr."""
    exe = gmx(gmx_dir)
    out.mkdir(parents=True, exist_ok=True)
    _tool(exe, out, "solvate", "-cs", "spc216.gro", "-box", *[f"{box_nm:g}"] * 3, "-o", "conf.gro")
    waters = sum(1 for line in (out / "conf.gro").read_text().splitlines()[2:-1] if line[10:15].strip() == "OW")
    (out / "topol.top").write_text('#include "oplsaa.ff/forcefield.itp"\n#include "oplsaa.ff/spce.itp"\n\n'
                                   f"[ system ]\nSPC/E water\n\n[ molecules ]\nSOL {waters}\n")
    (out / "em.mdp").write_text(EM_MDP)
    _tool(exe, out, "grompp", "-f", "em.mdp", "-c", "conf.gro", "-p", "topol.top", "-o", "em.tpr")
    _tool(exe, out, "mdrun", "-s", "em.tpr", "-deffnm", "em", "-ntmpi", "1", "-ntomp", "4")
    (out / "md.mdp").write_text(MDP)
    _tool(exe, out, "grompp", "-f", "md.mdp", "-c", "em.gro", "-p", "topol.top", "-o", "topol.tpr")
    return out / "topol.tpr"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("gmx_dir", type=Path, help="GROMACS's installation (with bin/gmx)")
    ap.add_argument("out", type=Path, help="where the input goes")
    ap.add_argument("--box", type=float, default=6.0, help="the cubic box's edge in nm (default 6)")
    args = ap.parse_args(argv)
    try:
        print(make_input(args.gmx_dir, args.out, args.box))
    except (OSError, RuntimeError) as e:
        print(f"make_input: {e}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
