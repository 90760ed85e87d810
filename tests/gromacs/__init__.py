"""GROMACS through nvproxy: the input (make_input), mdrun's command lines and its energies (mdrun)."""
