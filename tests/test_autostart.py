"""Without `nvproxy run`: the shim alone (LD_PRELOAD) starts a proxy on the
first CUDA call, and a forked child gets a proxy of its own."""

from __future__ import annotations

import os
import subprocess
import sys

from conftest import APPS

from nvproxy import shim_path


def test_shim_starts_its_own_proxy(build) -> None:
    exe = build("vector_add")
    env = {k: v for k, v in os.environ.items() if not k.startswith("NVPROXY_")}
    env.update(LD_PRELOAD=str(shim_path()), NVPROXY_BACKEND="sim", NVPROXY_PYTHON=sys.executable,
               NVPROXY_SIM_KERNELS=str(APPS / "vector_add_sim.py"))
    r = subprocess.run([str(exe)], capture_output=True, text=True, env=env, timeout=120)
    assert r.returncode == 0, r.stderr
    assert r.stdout == (APPS / "expected" / "sim" / "vector_add.txt").read_text()
