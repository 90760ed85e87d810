"""cudaHostRegister of the program's own memory (tests/apps/host_register; test_apps runs it on sim and against
native on the GPU, test_pinned_pool through a migration and a recovery): ranges of 16 MiB and more are copied into
shared memory on several threads where the program may run on several cores (native/shim/hostreg.c), with write()
on one core or where a seccomp filter refuses process_vm_writev.  Every way gives the same output."""

from __future__ import annotations

import os

import pytest
from conftest import EXPECTED, nvproxy_cmd, run

APP = "host_register"


@pytest.mark.parametrize("how", ["one-core", "forbid-process-vm-writev"])
def test_sim_with_write_matches_transcript(build, how: str) -> None:
    cmd = nvproxy_cmd(build(APP), "sim", APP, *(("0", "0", how) if how != "one-core" else ()))
    r = run(["taskset", "-c", str(min(os.sched_getaffinity(0))), *cmd] if how == "one-core" else cmd)
    assert r.stdout == (EXPECTED / "sim" / f"{APP}.txt").read_text(), r.stderr
    assert r.returncode == 0, r.stderr
