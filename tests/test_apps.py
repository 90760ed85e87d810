"""The CUDA test programs in tests/apps, built with nvcc -cudart shared.

On the sim backend (CI) each program's output must equal its expected
transcript in tests/apps/expected/sim.  With -m gpu each program runs natively
and through nvproxy on the real device and the two outputs must be identical.
"""

from __future__ import annotations

import re

import pytest
from conftest import EXPECTED, gpu_count, hooked, misreported_assert, nvproxy_cmd, run

from nvproxy import wire
from nvproxy.proxy import fastpath

PROGRAMS = [
    ("vector_add", ()),
    ("copies", ()),
    ("posted_copies", ()),
    ("streams_events", ()),
    ("callbacks", ()),
    ("multithread", ()),
    ("late_thread", ()),
    ("printf_assert", ()),
    ("printf_assert", ("assert",)),
    ("symbols", ()),
    ("bigparam", ()),
    ("errors", ()),
    ("device_query", ()),
    ("mempool", ()),
    ("pitched3d", ()),
    ("small_allocs", ()),
    ("managed", ()),
    ("managed_pages", ()),
    ("stream_attrs", ()),
    ("graphs", ()),
    ("graph_nodes", ()),
    ("textures", ()),
    ("ipc", ()),
    ("ipc_order", ()),
    ("graph_cond", ()),
    ("graph_capture", ()),
    ("managed_vars", ()),
    ("p2p", ()),
    ("thread_churn", ()),
    ("thread_tails", ()),
    ("pinned_at_checkpoint", ()),
    ("pinned_fds", ()),
    ("texobj_lifecycle", ()),
    ("host_register", ()),
    ("pinned_capture", ()),
]
IDS = ["-".join((n, *a)) for n, a in PROGRAMS]


@pytest.mark.parametrize(("name", "args"), PROGRAMS, ids=IDS)
def test_sim(build, name: str, args: tuple[str, ...]) -> None:
    exe = build(name)
    r = run(nvproxy_cmd(exe, "sim", name, *args))
    expected = (EXPECTED / "sim" / f"{'-'.join((name, *args))}.txt").read_text()
    assert r.stdout == expected, r.stderr
    assert r.returncode == 0, r.stderr


@pytest.mark.parametrize("name", ["copies", "posted_copies", "multithread", "streams_events"])
def test_sim_threads_that_sleep_for_replies(build, monkeypatch, name: str) -> None:
    """NVPROXY_SPIN_US=0: every thread sleeps in poll(2) at once instead of spinning on its reply mailbox, so
    the proxy's fast path must find it asleep and answer over the socket (nvproxy_wire.h, struct nvp_mailbox)."""
    monkeypatch.setenv("NVPROXY_SPIN_US", "0")
    exe = build(name)
    r = run(nvproxy_cmd(exe, "sim", name))
    assert r.stdout == (EXPECTED / "sim" / f"{name}.txt").read_text(), r.stderr
    assert r.returncode == 0, r.stderr


def test_sim_the_proxy_reports_how_it_served(build, monkeypatch) -> None:
    """NVPROXY_SERVE_STATS=1: at its end the proxy says how its serving went, and its counts add up: every request
    the program sent (NVPROXY_TRACE) was executed once, by C or by Python (some of Python's while C served on), each
    serve ended for one reason (those for Python by what C met), and the gaps between serves, Python's, are timed."""
    monkeypatch.setenv("NVPROXY_SERVE_STATS", "1")
    monkeypatch.setenv("NVPROXY_TRACE", "1")
    exe = build("multithread")
    r = run(nvproxy_cmd(exe, "sim", "multithread"))
    assert r.stdout == (EXPECTED / "sim" / "multithread.txt").read_text(), r.stderr[-3000:]
    sent = sum(1 for line in r.stderr.splitlines() if re.search(r"-> op \d+ seq [1-9]", line))
    m = re.search(r"nvproxy: served ([\d.]+) s \(waits included\), ([\d.]+) s of it in C \(\d+%\), in (\d+) serves\n"
                  r"nvproxy: the serves ended: (.*) \(of them for the event loop's turn: (\d+); for Python, at a call "
                  r"C left to it (\d+), a message out of turn (\d+), a full buffer (\d+)\); requests found in mailbox "
                  r"slots as serves ended (\d+)\n"
                  r"nvproxy: requests executed by C (\d+), by Python (\d+)\n"
                  r"nvproxy: requests C left to Python: (.*); of them, executed by Python while C served on: (\d+)\n"
                  r"nvproxy: serving several threads, C ran nothing for ([\d.]+) s while it held later calls but not "
                  r"the next, ([\d.]+) s while the next waited for a launch worker, and ([\d.]+) s while it held none\n"
                  r"nvproxy: between serves ([\d.]+) s in (\d+) gaps(, the longest: .*)?\n"
                  r"nvproxy: the gaps by what last kept the channels in Python: (.*)\n", r.stderr)
    assert m, r.stderr[-3000:]
    wall, in_c, serves = float(m[1]), float(m[2]), int(m[3])
    ended = [int(part.split()[0]) for part in m[4].split(", ")]
    assert 0 <= in_c <= wall and sum(ended) == serves > 0 and int(m[5]) <= ended[fastpath.IDLE]
    assert int(m[6]) + int(m[7]) + int(m[8]) == ended[fastpath.PYTHON]
    by_c, by_python, inline = int(m[10]), int(m[11]), int(m[13])
    assert by_c + by_python == sent > 100 and by_c > 0 and 0 < inline <= by_python
    assert "LAUNCH" in m[12]  # (the sim backend's kernels are Python's)
    assert float(m[14]) + float(m[15]) + float(m[16]) <= in_c  # (C's turns that ran nothing, within its time)
    # (a gap between each two serves, outside C's share; the longest say why C stopped and what Python executed;
    # the gaps' time, split by what kept the channels in Python, adds up)
    gaps_s = float(m[17])
    assert int(m[18]) == serves - 1 and 0 <= gaps_s <= wall - in_c
    longest = m[19].removeprefix(", the longest: ").split("; ")
    assert len(longest) == min(serves - 1, 5)
    assert all(re.fullmatch(r"[\d.]+ ms after [a-z]+ \(.+\)", g) for g in longest)
    kept = [float(x) for x in re.findall(r" ([\d.]+) s(?:,|$)", m[20])]
    assert kept and abs(sum(kept) - gaps_s) < 1e-3 * len(kept)


def _unanswered_setting(monkeypatch, setting: str) -> None:
    if setting == "default":
        monkeypatch.delenv("NVPROXY_DEBUG", raising=False)
    else:
        monkeypatch.setenv("NVPROXY_DEBUG", setting)


@pytest.mark.parametrize("unanswered", ["default", "answered-copies"])
def test_sim_runs_of_posted_copies_go_unanswered(build, monkeypatch, unanswered: str) -> None:
    """Small pageable copies to the device back to back, with nothing else between them, go without waiting for
    answers (shim memory.c, "a run"): most of posted_copies' copies, and the same output.  With
    NVPROXY_DEBUG=answered-copies every one is answered."""
    monkeypatch.setenv("NVPROXY_TRACE", "1")
    _unanswered_setting(monkeypatch, unanswered)
    exe = build("posted_copies")
    r = run(nvproxy_cmd(exe, "sim", "posted_copies"))
    assert r.stdout == (EXPECTED / "sim" / "posted_copies.txt").read_text(), r.stderr[-3000:]
    assert r.returncode == 0, r.stderr[-3000:]
    copies = [line for line in r.stderr.splitlines() if f"-> op {wire.NVP_OP_STAGED_COPY} seq" in line]
    quiet = sum(line.endswith("(no reply)") for line in copies)
    assert len(copies) > 2000
    assert (quiet > 0.9 * len(copies)) if unanswered == "default" else quiet == 0


def test_sim_ipc_from_another_device(build, monkeypatch) -> None:
    """CUDA IPC across modelled devices: the child runs on device 1, opens device 0's memory with
    cudaIpcMemLazyEnablePeerAccess and a pool with cudaMemPoolSetAccess for its device, and its kernels change
    them (the sim backend faults a kernel that reaches another device's memory without access, as a GPU does:
    NVIDIA's simpleIPC hit an illegal address on two GPUs before the proxy granted it)."""
    monkeypatch.setenv("NVPROXY_SIM_DEVICES", "2")
    exe = build("ipc")
    r = run(nvproxy_cmd(exe, "sim", "ipc", "other-device"))
    assert r.stdout == (EXPECTED / "sim" / "ipc.txt").read_text(), r.stderr
    assert r.returncode == 0, r.stderr


def test_sim_two_devices(build, monkeypatch) -> None:
    """Peer access between two modelled devices (NVPROXY_SIM_DEVICES=2): kernels on device 1 use device 0's
    memory, cudaMalloc'd and from its pool, after cudaDeviceEnablePeerAccess and cudaMemPoolSetAccess."""
    monkeypatch.setenv("NVPROXY_SIM_DEVICES", "2")
    exe = build("p2p")
    r = run(nvproxy_cmd(exe, "sim", "p2p"))
    assert r.stdout == (EXPECTED / "sim" / "p2p-2devices.txt").read_text(), r.stderr
    assert r.returncode == 0, r.stderr


@pytest.mark.gpu
@pytest.mark.parametrize(("name", "args"), PROGRAMS, ids=IDS)
def test_gpu_matches_native(build, name: str, args: tuple[str, ...]) -> None:
    exe = build(name)
    native = run([str(exe), *args])
    proxied = run(nvproxy_cmd(exe, "gpu", name, *args))
    if misreported_assert(proxied.stdout, native.stdout):
        native = run([str(exe), *args])
        proxied = run(nvproxy_cmd(exe, "gpu", name, *args))
    assert proxied.stdout == native.stdout, proxied.stderr
    assert proxied.returncode == native.returncode, proxied.stderr
    assert "PASSED" in native.stdout or args, native.stdout


@pytest.mark.gpu
@pytest.mark.parametrize("unanswered", ["default", "answered-copies"])
@pytest.mark.parametrize("name", ["posted_copies", "copies", "multithread"])
def test_gpu_unanswered_copies_match_native(build, monkeypatch, name: str, unanswered: str) -> None:
    """Runs of posted copies without answers (on by default; NVPROXY_DEBUG=answered-copies turns them off): the
    programs that copy small pageable buffers to the device give native's output either way, and most of
    posted_copies' copies went unanswered where the runs are on, none where they are off."""
    _unanswered_setting(monkeypatch, unanswered)
    monkeypatch.setenv("NVPROXY_TRACE", "1")
    exe = build(name)
    native = run([str(exe)])
    proxied = run(nvproxy_cmd(exe, "gpu", name))
    assert proxied.stdout == native.stdout, proxied.stderr[-3000:]
    assert proxied.returncode == native.returncode == 0, proxied.stderr[-3000:]
    copies = [line for line in proxied.stderr.splitlines() if f"-> op {wire.NVP_OP_STAGED_COPY} seq" in line]
    if name == "posted_copies":
        quiet = sum(line.endswith("(no reply)") for line in copies)
        assert (quiet > 0.9 * len(copies) > 1800) if unanswered == "default" else (quiet == 0 and len(copies) > 2000)


@pytest.mark.gpu
def test_gpu_ipc_from_another_device(build) -> None:
    """CUDA IPC between processes on two GPUs (the child on device 1 reaches device 0's memory), natively and
    through nvproxy."""
    if gpu_count() < 2:
        pytest.skip("needs two GPUs (nvidia-smi -L lists fewer)")
    exe = build("ipc")
    native = run([str(exe), "other-device"])
    proxied = run(nvproxy_cmd(exe, "gpu", "ipc", "other-device"))
    assert "Test PASSED" in native.stdout, native.stdout + native.stderr
    assert proxied.stdout == native.stdout and proxied.returncode == 0, proxied.stderr


def test_relocatable_device_code_registers(build) -> None:
    """-rdc=true programs register through nvcc's linked-binary stubs; the sim runs one."""
    exe = build("vector_add", "-rdc=true")
    r = run(nvproxy_cmd(exe, "sim", "vector_add"))
    assert r.stdout == (EXPECTED / "sim" / "vector_add.txt").read_text(), r.stderr
    assert r.returncode == 0, r.stderr


@pytest.mark.gpu
def test_gpu_dynamic_parallelism(build) -> None:
    """Kernels launching kernels (-rdc=true, device runtime), natively and through nvproxy."""
    exe = build("dynpar", "-rdc=true", "-lcudadevrt")
    native = run([str(exe)])
    proxied = run(nvproxy_cmd(exe, "gpu", "dynpar"))
    assert "Test PASSED" in native.stdout, native.stdout + native.stderr
    assert proxied.stdout == native.stdout and proxied.returncode == 0, proxied.stderr


@pytest.mark.parametrize("name", ["copies"])
def test_sim_a_reply_in_the_mailbox_before_later_ones_on_the_socket(build, name: str) -> None:
    """A copy from the device in pieces sends every piece's request at once: the proxy answers the first through
    the thread's mailbox and the rest through its socket.  Here the thread waits before each look at its socket
    (the test hook NVPROXY_TEST_SOCKET_LOOK_US), so all of them have come by then: it must take the first from the
    mailbox, not the second from the socket in its place (it then waited for ever for a last one)."""
    exe = build(name)
    r = run(nvproxy_cmd(exe, "sim", name), env=hooked(NVPROXY_TEST_SOCKET_LOOK_US="2000"), timeout=120)
    assert r.stdout == (EXPECTED / "sim" / f"{name}.txt").read_text(), r.stderr
    assert r.returncode == 0, r.stderr
