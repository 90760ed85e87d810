"""graph_nodes.cu runs graphs.cu's kernels (tests/apps/graph_kernels.h)."""

import runpy
from pathlib import Path

runpy.run_path(str(Path(__file__).with_name("graphs_sim.py")))
