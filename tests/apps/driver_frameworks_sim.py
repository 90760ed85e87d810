# driver_frameworks' kernels: driver_kernels.cu's (driver_api_sim.py registers them) and its own PTX add_one
import importlib.util
from pathlib import Path

from nvproxy.sim_kernels import kernel

_spec = importlib.util.spec_from_file_location("driver_api_sim", Path(__file__).with_name("driver_api_sim.py"))
_spec.loader.exec_module(importlib.util.module_from_spec(_spec))


@kernel("add_one")
def add_one(ctx, p):
    ctx.array(p, "i4", 1)[0] += 1
