"""cudaHostRegister of the program's own memory (tests/apps/host_register; test_apps runs it on sim and against
native on the GPU, test_pinned_pool through a migration and a recovery): ranges of 16 MiB and more are copied into
shared memory on several threads where the program may run on several cores (native/shim/hostreg.c), with write()
on one core or where a seccomp filter refuses process_vm_writev.  Every way gives the same output.  cudaHostUnregister
is posted (no reply) where every device is known idle, and waits for the devices where one may not be."""

from __future__ import annotations

import os
import re

import pytest
from conftest import EXPECTED, nvproxy_cmd, run

from nvproxy import wire

APP = "host_register"


@pytest.mark.parametrize("how", ["one-core", "forbid-process-vm-writev"])
def test_sim_with_write_matches_transcript(build, how: str) -> None:
    cmd = nvproxy_cmd(build(APP), "sim", APP, *(("0", "0", how) if how != "one-core" else ()))
    r = run(["taskset", "-c", str(min(os.sched_getaffinity(0))), *cmd] if how == "one-core" else cmd)
    assert r.stdout == (EXPECTED / "sim" / f"{APP}.txt").read_text(), r.stderr
    assert r.returncode == 0, r.stderr


def _unregisters(stderr: str) -> tuple[int, int]:
    """(posted, answered) HOST_UNREGISTER requests in a trace (NVPROXY_TRACE)."""
    sent = re.findall(rf"-> op {wire.NVP_OP_HOST_UNREGISTER} seq \d+( \(no reply\))?$", stderr, re.M)
    return sum(1 for s in sent if s), sum(1 for s in sent if not s)


def test_sim_unregister_after_a_synchronisation_is_posted(build) -> None:
    """Each of the program's 14 cudaHostUnregister calls comes after a cudaDeviceSynchronize or with no work sent
    since one: nothing to wait for, so posted; cudaFreeHost of its 3 large cudaMallocHost buffers still waits.  The
    output is the transcript's, the buffers registered again at once among it."""
    r = run(nvproxy_cmd(build(APP), "sim", APP), env={**os.environ, "NVPROXY_TRACE": "1"})
    assert r.stdout == (EXPECTED / "sim" / f"{APP}.txt").read_text(), r.stderr[-3000:]
    assert r.returncode == 0, r.stderr[-3000:]
    assert _unregisters(r.stderr) == (14, 3)


def test_sim_unregister_with_work_in_flight_waits_for_it(build) -> None:
    """A kernel that writes the registered buffer, then cudaHostUnregister at once: the call is answered once the
    devices are done, and the program then reads the kernel's writes."""
    r = run(nvproxy_cmd(build(APP), "sim", APP, "0", "0", "unregister-unsynced"),
            env={**os.environ, "NVPROXY_TRACE": "1"})
    assert r.stdout == "unregistered while its kernel may run: the kernel's writes seen 1\n", r.stderr[-3000:]
    assert r.returncode == 0, r.stderr[-3000:]
    assert _unregisters(r.stderr) == (0, 1)
