"""cudaHostRegister of the program's own memory (tests/apps/host_register; test_apps runs it on sim and against
native on the GPU, test_pinned_pool through a migration and a recovery): ranges of 16 MiB and more are copied into
shared memory on several threads where the program may run on several cores (native/shim/hostreg.c), with write()
on one core.  Both ways give the same output."""

from __future__ import annotations

import os

from conftest import EXPECTED, nvproxy_cmd, run

APP = "host_register"


def test_sim_on_one_core_matches_transcript(build) -> None:
    cmd = nvproxy_cmd(build(APP), "sim", APP)
    r = run(["taskset", "-c", str(min(os.sched_getaffinity(0))), *cmd])
    assert r.stdout == (EXPECTED / "sim" / f"{APP}.txt").read_text(), r.stderr
    assert r.returncode == 0, r.stderr
