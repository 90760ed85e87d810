"""Bad input and failure: unsupported calls, a dead proxy, foreign and
malformed connections, private sockets, and a proxy that never outlives its
application."""

from __future__ import annotations

import os
import signal
import socket
import stat
import struct
import subprocess
import sys
import time
from pathlib import Path

import pytest
from conftest import hooked, nvproxy_cmd, run
from gated import Gated

from nvproxy import shim_path, wire
from nvproxy.launcher import find_proxy

BACKENDS = ["sim", pytest.param("gpu", marks=pytest.mark.gpu)]


def proxy_of(app_pid: int) -> tuple[int, str]:
    """(pid, socket path) of the proxy serving app_pid."""
    return find_proxy(app_pid)


def start_waiting_app(build, backend: str) -> subprocess.Popen:
    p = subprocess.Popen(nvproxy_cmd(build("dead_proxy"), backend, "dead_proxy"), stdin=subprocess.PIPE,
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    assert p.stdout is not None
    assert p.stdout.readline() == "ready\n"
    return p


@pytest.mark.parametrize("backend", BACKENDS)
def test_unsupported_call_fails_loudly(build, backend: str) -> None:
    r = run(nvproxy_cmd(build("unsupported"), backend, "unsupported"))
    assert r.returncode == 0, r.stderr
    assert r.stdout.splitlines() == [
        "cudaImportExternalMemory: cudaErrorNotSupported",
        "last error: cudaErrorNotSupported",
        "pageable memcpy node: cudaSuccess",
        "pageable to pageable memcpy node: cudaErrorNotSupported",
    ]
    lines = [line for line in r.stderr.splitlines() if "not supported by nvproxy" in line]
    assert len(lines) == 2 and "cudaImportExternalMemory" in lines[0] and "cudaGraphAddMemcpyNode1D" in lines[1]


@pytest.mark.parametrize("backend", BACKENDS)
def test_dead_proxy_is_a_clear_error_not_a_hang(build, backend: str) -> None:
    p = start_waiting_app(build, backend)
    pid, _ = proxy_of(p.pid)
    os.kill(pid, signal.SIGKILL)
    out, err = p.communicate("\n", timeout=30)
    assert "after the pause: cudaErrorDevicesUnavailable, then cudaErrorDevicesUnavailable, within 2 s: yes" in out
    assert "nvproxy: lost the proxy" in err


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("direction", ["h2d", "d2h"])
@pytest.mark.parametrize("size", [4096, 1 << 20, 4 << 20])
def test_recovery_when_the_first_call_after_the_death_is_a_pageable_copy(build, backend: str, direction: str,
                                                                         size: int, tmp_path: Path) -> None:
    """NVPROXY_RECOVER: the call that finds the proxy gone is a pageable copy (several requests in flight, through
    the thread's staging buffer and mailbox), not a single request.  A new proxy starts from the image, that copy
    runs against it and returns cudaSuccess, and so do the calls after it."""
    image = tmp_path / "last.img"
    env = dict(os.environ, NVPROXY_RECOVER=str(image))
    env.pop("LD_PRELOAD", None)
    p = subprocess.Popen(nvproxy_cmd(build("recover_copy"), backend, "recover_copy", direction, str(size)),
                         stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
    assert p.stdout is not None and p.stdout.readline() == "ready\n"
    try:
        r = run([sys.executable, "-m", "nvproxy", "checkpoint", str(p.pid), "-o", str(image)])
        assert r.returncode == 0, r.stdout + r.stderr
        pid, _ = proxy_of(p.pid)
        os.kill(pid, signal.SIGKILL)
    finally:
        out, err = p.communicate("\n", timeout=120)
    assert p.returncode == 0, out + err
    held = "the new bytes" if direction == "h2d" else "the checkpointed bytes"
    assert out.splitlines() == ["first call: cudaSuccess", f"device holds {held}: yes", "later calls: cudaSuccess"], err
    assert err.count("the proxy is gone; starting a new one from") == 1, err


def test_a_program_killed_mid_call_gets_one_line_from_its_proxy(build) -> None:
    """Killed while its 32 threads have calls in flight, a program's channels are all reset at once: its proxy
    says so in one line at most (channels the C path serves end silently), then exits with it."""
    p = subprocess.Popen(nvproxy_cmd(build("busy_threads"), "sim", "busy_threads", "32"), stdout=subprocess.PIPE,
                         stderr=subprocess.PIPE, text=True)
    assert p.stdout is not None and p.stdout.readline() == "running\n"
    os.kill(p.pid, signal.SIGKILL)
    _out, err = p.communicate(timeout=60)  # (the proxy holds the same stderr: the output ends once it exits)
    assert p.returncode == -signal.SIGKILL
    lines = err.splitlines()
    assert len(lines) <= 1 and all("ended during a call (its channel was reset)" in line for line in lines), err


def _preloaded(exe: Path, extra: dict[str, str], stdin: str = "") -> subprocess.CompletedProcess:
    """exe run with the shim preloaded by hand (no `nvproxy run`, which checks settings itself), sim backend."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("NVPROXY_")}
    env.update(LD_PRELOAD=str(shim_path()), NVPROXY_BACKEND="sim", NVPROXY_PYTHON=sys.executable)
    env.update(extra)
    return subprocess.run([str(exe)], input=stdin, capture_output=True, text=True, env=env, timeout=120)


SPIN_RANGE = "expected a whole number from 0 to 200000 (microseconds)"
DEBUG_KNOWN = "(known: no-mailbox, answered-copies, no-inline)"


@pytest.mark.parametrize(("name", "value", "why"), [
    ("NVPROXY_SPIN_US", "-1", SPIN_RANGE),
    ("NVPROXY_SPIN_US", "200001", SPIN_RANGE),
    ("NVPROXY_SPIN_US", "99999999999999999999999", SPIN_RANGE),
    ("NVPROXY_SPIN_US", "10us", SPIN_RANGE),
    ("NVPROXY_COPY_THREADS", "0", "expected a whole number from 1 to 8"),
    ("NVPROXY_COPY_THREADS", "-3", "expected a whole number from 1 to 8"),
    ("NVPROXY_COPY_THREADS", "64", "expected a whole number from 1 to 8"),
    ("NVPROXY_COPY_THREADS", "2 threads", "expected a whole number from 1 to 8"),
    ("NVPROXY_DEBUG", "no-mailbox,bogus", f"unknown flag 'bogus' {DEBUG_KNOWN}"),
    ("NVPROXY_DEBUG", "no-mailbox,,answered-copies", f"unknown flag '' {DEBUG_KNOWN}"),
    ("NVPROXY_DEBUG", "NO-MAILBOX", f"unknown flag 'NO-MAILBOX' {DEBUG_KNOWN}"),
])
def test_a_bad_setting_fails_the_first_call_with_one_line(build, name: str, value: str, why: str) -> None:
    """A setting the shim reads, refused: one line naming it and what it allows, and the program's first CUDA call
    (and every later one) fails with cudaErrorInitializationError; no proxy starts."""
    r = _preloaded(build("dead_proxy"), {name: value})
    assert r.returncode == 1, r.stdout + r.stderr
    assert "cudaMalloc(&d, 64) -> cudaErrorInitializationError" in r.stdout, r.stdout + r.stderr
    assert r.stderr.splitlines() == [
        f"nvproxy: {name}={value} is not allowed: {why}; every CUDA call fails with cudaErrorInitializationError"]


@pytest.mark.parametrize("debug", ["", "answered-copies", " no-mailbox , answered-copies"])
def test_debug_flag_no_mailbox_leaves_the_mailbox_out(build, debug: str) -> None:
    """NVPROXY_DEBUG=no-mailbox: the thread's channel has no reply mailbox (its shared page is not mapped); without
    that flag it has one.  Blanks around the flags are taken."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("NVPROXY_")}
    env.update(LD_PRELOAD=str(shim_path()), NVPROXY_BACKEND="sim", NVPROXY_PYTHON=sys.executable, NVPROXY_DEBUG=debug)
    p = subprocess.Popen([str(build("dead_proxy"))], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                         stderr=subprocess.PIPE, text=True, env=env)
    assert p.stdout is not None and p.stdout.readline() == "ready\n"
    try:
        mapped = "nvproxy-mailbox" in Path(f"/proc/{p.pid}/maps").read_text()
    finally:
        out, err = p.communicate("\n", timeout=60)
    assert p.returncode == 0 and "after the pause: cudaSuccess, then cudaSuccess" in out, out + err
    assert mapped == ("no-mailbox" not in debug)


def test_settings_at_the_ends_of_their_ranges_are_taken(build) -> None:
    r = _preloaded(build("dead_proxy"), {"NVPROXY_SPIN_US": "200000", "NVPROXY_COPY_THREADS": "8"}, "\n")
    assert r.returncode == 0 and "after the pause: cudaSuccess, then cudaSuccess" in r.stdout, r.stdout + r.stderr
    r = _preloaded(build("dead_proxy"), {"NVPROXY_SPIN_US": "0", "NVPROXY_COPY_THREADS": " 1 "}, "\n")
    assert r.returncode == 0 and "after the pause: cudaSuccess, then cudaSuccess" in r.stdout, r.stdout + r.stderr


def _mappings_up_high(pid: int) -> list[str]:
    """The proxy's mappings in the top of the address space, where a program's mmap() puts memory (top-down,
    below its stack), other than its stack and the kernel's pages."""
    return [line for line in Path(f"/proc/{pid}/maps").read_text().splitlines()
            if int(line.split("-", 1)[0], 16) >= 0x7000_0000_0000
            and not any(f"[{k}]" in line for k in ("stack", "vvar", "vvar_vclock", "vdso", "vsyscall"))]


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("started_by", ["nvproxy run", "the shim"])
def test_proxy_maps_its_own_memory_far_from_the_programs(build, backend: str, started_by: str) -> None:
    """The proxy maps the program's pinned memory at the program's own addresses, and the program's mmap() took
    those top-down below its stack: so the proxy's own mappings (the driver's among them) go bottom-up, none up
    there (NVIDIA's simpleStreams once got cudaErrorHostMemoryAlreadyRegistered: its range was taken in the
    proxy).  Both ways a proxy starts: `nvproxy run` (launcher.py) and the shim alone (proxy_find.c)."""
    if started_by == "nvproxy run":
        p = start_waiting_app(build, backend)
    else:
        env = {k: v for k, v in os.environ.items() if not k.startswith("NVPROXY_")}
        env.update(LD_PRELOAD=str(shim_path()), NVPROXY_BACKEND=backend, NVPROXY_PYTHON=sys.executable)
        p = subprocess.Popen([str(build("dead_proxy"))], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                             stderr=subprocess.PIPE, text=True, env=env)
        assert p.stdout is not None and p.stdout.readline() == "ready\n"
    try:
        pid, _ = proxy_of(p.pid)
        assert _mappings_up_high(pid) == []
        libs = [line for line in Path(f"/proc/{pid}/maps").read_text().splitlines() if ".so" in line]
        assert libs  # (they would lie up there in the default layout)
    finally:
        out, err = p.communicate("\n", timeout=60)
    assert p.returncode == 0, err


@pytest.mark.parametrize("trace", [False, True])
def test_crash_trace_prints_a_crashing_programs_frames(build, trace: bool) -> None:
    """With the test hooks library loaded (tests/hooks/crash.c), a program that dies of SIGSEGV prints where first,
    and still dies of the signal; the shim alone leaves the program's signals alone."""
    exe = build("crash")
    r = run(nvproxy_cmd(exe, "sim", "crash"), env=hooked() if trace else os.environ)
    assert r.stdout == "crashing\n"
    assert r.returncode in (-signal.SIGSEGV, 128 + signal.SIGSEGV), r.stderr
    lines = [line for line in r.stderr.splitlines() if line.startswith("nvproxy: crash:")]
    if trace:
        assert lines[0].startswith("nvproxy: crash: signal 11 (code 1) at address (nil)"), r.stderr  # (SEGV_MAPERR)
        assert any(f"{exe}+0x" in line for line in lines[1:3]), r.stderr  # (the faulting frame: main)
        assert "nvproxy: crash:   fault 0 not mapped" in lines, r.stderr  # (what /proc/self/maps says of it)
    else:
        assert lines == []


def test_the_shim_holds_no_test_hooks() -> None:
    """The tests' hooks (a checkpoint or migration at a chosen call, call counts, a pause in cudaHostAlloc, crash
    traces) live in the test-only library tests/hooks/ builds; the shim has only their interface."""
    data = shim_path().read_bytes()
    for text in (b"NVPROXY_CHECKPOINT_AT", b"NVPROXY_CHECKPOINT_IN", b"NVPROXY_CHECKPOINT_WAITERS",
                 b"NVPROXY_MIGRATE_AT", b"NVPROXY_CALLS_OUT", b"NVPROXY_TEST_PAUSE_MS", b"NVPROXY_CRASH_TRACE",
                 b"nvproxy: crash:", b"nvproxy-call-reached-"):
        assert text not in data, text
    assert b"nvproxy_test_hooks" in data


def test_a_bad_test_hook_setting_stops_the_program(build) -> None:
    """The test hooks refuse a setting they cannot read in one line, before the program's first call: a test must
    not run on without the hook it asked for.  (Preloaded by hand: `nvproxy run` refuses it itself.)"""
    preload = f"{shim_path()}:{hooked()['LD_PRELOAD']}"
    r = _preloaded(build("vector_add"), {"LD_PRELOAD": preload, "NVPROXY_MIGRATE_AT": "third"})
    assert r.returncode == 2 and r.stdout == "", r.stdout + r.stderr
    assert r.stderr.splitlines() == ["nvproxy test hooks: NVPROXY_MIGRATE_AT=third: expected a whole number from 1"]


def test_pinned_memory_goes_on_where_dev_shm_is_full(build) -> None:
    """Pinned memory lives in /dev/shm (a DMTCP restart can bring it back as any user: docs/checkpoint.md), which
    has a size (64 MiB in a container, by default): what it has no room for goes into a memfd, said once on stderr,
    and the program prints what it prints anywhere."""
    mount = 'mount -t tmpfs -o size=64k tmpfs /dev/shm && exec "$@"'
    if subprocess.run(["unshare", "-m", "sh", "-c", mount, "sh", "true"], capture_output=True).returncode != 0:
        pytest.skip("no private mount namespace here (unshare -m and mount need root) for a small /dev/shm")
    exe = build("pinned_fds")
    cmd = nvproxy_cmd(exe, "sim", "pinned_fds")
    reference = run(cmd)
    assert reference.returncode == 0 and "/dev/shm has no room" not in reference.stderr, reference.stderr
    # (8 buffers of 64 KiB, served from pinned chunks of 2 MiB or more, none of which fits)
    r = run(["unshare", "-m", "sh", "-c", mount, "sh", *cmd])
    assert r.returncode == 0, r.stderr
    assert r.stdout == reference.stdout
    assert r.stderr.count("nvproxy: /dev/shm has no room for ") == 1, r.stderr


def test_proxy_socket_listens_before_its_path_appears(tmp_path) -> None:
    """Whoever sees a proxy's socket path can connect at once (`nvproxy run` waits only for the path; a first
    connect between the bind and the listen was refused on a busy GPU machine)."""
    from nvproxy.proxy.listen import listen_at

    path = str(tmp_path / "p.sock")
    listener = listen_at(path, 4)
    try:
        assert stat.S_IMODE(os.stat(path).st_mode) == 0o600
        assert os.listdir(tmp_path) == ["p.sock"]  # (the temporary name is gone)
        c = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        c.connect(path)  # (nobody accepts yet: the backlog takes it)
        c.close()
    finally:
        listener.close()


def test_proxy_is_private_and_exits_with_its_application(build) -> None:
    p = start_waiting_app(build, "sim")
    pid, sock = proxy_of(p.pid)
    assert stat.S_IMODE(os.stat(sock).st_mode) == 0o600
    assert stat.S_IMODE(os.stat(f"{sock}.{pid}.ctl").st_mode) == 0o600
    assert stat.S_IMODE(os.stat(os.path.dirname(sock)).st_mode) == 0o700
    # another process (this one) is refused
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    s.connect(sock)
    s.settimeout(10)
    assert s.recv(1) == b""
    s.close()
    out, err = p.communicate("\n", timeout=30)
    assert "after the pause: cudaSuccess, then cudaSuccess" in out, err
    for _ in range(100):
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            break
        time.sleep(0.05)
    else:
        pytest.fail("the proxy outlived its application")
    assert not os.path.exists(sock)


def _hello(s: socket.socket, tid: int = 1) -> tuple[int, ...]:
    s.sendall(wire.REQ.pack(wire.REQ.size, wire.NVP_OP_HELLO, wire.NVP_F_REPLY, 0, os.getpid(), tid,
                            wire.NVP_PROTO_VERSION, 0, 0, 0, 0, 0))
    return wire.REP.unpack(s.recv(wire.REP.size))


def _sim_proxy(sock: str) -> subprocess.Popen:
    """A proxy (sim backend) that serves this test process, listening at sock."""
    env = dict(os.environ, NVPROXY_BACKEND="sim")
    proxy = subprocess.Popen([sys.executable, "-m", "nvproxy", "proxy", "--socket", sock, "--owner-pid",
                              str(os.getpid())], env=env, stderr=subprocess.PIPE, text=True)
    for _ in range(600):
        if os.path.exists(sock):
            break
        time.sleep(0.05)
    return proxy


def _channel(sock: str, tid: int) -> socket.socket:
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    s.connect(sock)
    s.settimeout(10)
    assert _hello(s, tid)[1] == 0
    return s


def test_last_requests_of_an_ended_thread_still_run(tmp_path: Path) -> None:
    """A thread's last request may have no reply (cudaStreamAddCallback) and the thread may end at once; the
    request then waits for earlier ones of other threads while its channel is at its end.  It must still run:
    dropped, a host callback never came (tests/apps/callback_threads hung so, now and then)."""
    sock = str(tmp_path / "p.sock")
    proxy = _sim_proxy(sock)
    try:
        ended, other = _channel(sock, 1), _channel(sock, 2)
        ended.sendall(wire.REQ.pack(wire.REQ.size, wire.NVP_OP_GRAPH_CREATE, 0, 2, 5, 0, *([0] * 6)))
        ended.close()
        time.sleep(0.5)  # (the proxy has read the request and the end of the channel, and waits for seq 1)

        def call(seq: int, op: int, args: list[int]) -> int:
            other.sendall(wire.REQ.pack(wire.REQ.size, op, wire.NVP_F_REPLY, seq, *(args + [0] * (8 - len(args)))))
            rep = wire.REP.unpack(other.recv(wire.REP.size))
            return rep[1]

        assert call(1, wire.NVP_OP_GRAPH_CREATE, [4, 0]) == 0
        assert call(3, wire.NVP_OP_GRAPH_ADD_NODE, [5, 1, wire.NVP_NODE_EMPTY, 0]) == 0, "graph 5 was not made"
        other.close()
    finally:
        proxy.kill()
        proxy.communicate()


def test_malformed_messages_close_only_that_channel(tmp_path: Path) -> None:
    sock = str(tmp_path / "p.sock")
    proxy = _sim_proxy(sock)
    try:
        bad = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        bad.connect(sock)
        bad.settimeout(10)
        assert _hello(bad)[1] == 0
        bad.sendall(struct.pack("<IHHQ", 5, 1, 0, 1) + b"\0" * 64)  # impossible length
        assert bad.recv(1) == b""
        good = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        good.connect(sock)
        good.settimeout(10)
        rep = _hello(good)
        assert rep[1] == 0 and rep[4] >= 1  # still serving, one device
        # an unknown operation is an error reply, not a crash
        good.sendall(wire.REQ.pack(wire.REQ.size, 999, wire.NVP_F_REPLY, 1, *([0] * 8)))
        assert wire.REP.unpack(good.recv(wire.REP.size))[1] == 801
        # damaged graph-building requests are errors too, and the graph stays usable
        seq = 1

        def call(op: int, args: list[int], payload: bytes = b"") -> int:
            nonlocal seq
            seq += 1
            good.sendall(wire.REQ.pack(wire.REQ.size + len(payload), op, wire.NVP_F_REPLY, seq,
                                       *(args + [0] * (8 - len(args)))) + payload)
            rep = wire.REP.unpack(good.recv(wire.REP.size))
            if rep[0] > wire.REP.size:
                good.recv(rep[0] - wire.REP.size)
            return rep[1]

        assert call(wire.NVP_OP_GRAPH_CREATE, [1, 0]) == 0
        empty, kernel = wire.NVP_NODE_EMPTY, wire.NVP_NODE_KERNEL
        assert call(wire.NVP_OP_GRAPH_ADD_NODE, [1, 1, kernel, 0], b"\1\0") == 1  # a truncated kernel body
        assert call(wire.NVP_OP_GRAPH_ADD_NODE, [1, 2, empty, 1], struct.pack("<II", 77, 0)) == 1  # no node 77
        assert call(wire.NVP_OP_GRAPH_ADD_NODE, [1, 3, 99, 0]) == 1  # no such kind of node
        assert call(wire.NVP_OP_GRAPH_ADD_NODE, [9, 4, empty, 0]) == 1  # no such graph
        assert call(wire.NVP_OP_GRAPH_ADD_NODE, [1, 5, empty, 0]) == 0
        assert call(wire.NVP_OP_GRAPH_ADD_NODE, [1, 6, empty, 1], struct.pack("<II", 5, 0)) == 0
        cond = wire.NVP_NODE_COND
        assert call(wire.NVP_OP_GRAPH_ADD_NODE, [1, 7, cond, 0], struct.pack("<QII", 1, 0, 3)) == 1  # no body ids
        assert call(wire.NVP_OP_GRAPH_GET_NODES, [1, 4], b"\0" * 8) == 1  # fewer node ids than nodes wanted
        assert call(wire.NVP_OP_GRAPH_GET_NODES, [1, 2], b"\0" * 8) == 0
        # arrays and texture objects: damaged descriptions, unknown arrays and objects
        assert call(wire.NVP_OP_ARRAY_CREATE, [1], b"\0" * 7) == 1
        desc = wire.ARRAY_DESC.pack(16, 16, 0, 32, 0, 0, 0, 2, 0)
        assert call(wire.NVP_OP_ARRAY_CREATE, [1], wire.ARRAY_DESC.pack(16, 16, 0, 8, 16, 0, 0, 1, 0)) == 20
        assert call(wire.NVP_OP_ARRAY_CREATE, [1], desc) == 0
        assert call(wire.NVP_OP_ARRAY_CREATE, [1], desc) == 1  # (its id is taken)
        side = [wire.NVP_SIDE_ARRAY, 7, 0, 0, 0, 0, 0]
        assert call(wire.NVP_OP_COPY_3D, [0], wire.COPY_3D.pack(*side, *side, 4, 1, 1)) == 1  # no array 7
        assert call(wire.NVP_OP_TEX_DESTROY, [0, 12345]) == 1
        assert call(wire.NVP_OP_ARRAY_DESTROY, [1]) == 0
        assert call(wire.NVP_OP_ARRAY_DESTROY, [1]) == 1
        # IPC: handles that are not nvproxy's, memory that was never opened
        assert call(wire.NVP_OP_IPC_MEM_OPEN, [0], b"\0" * 64) == 1
        assert call(wire.NVP_OP_IPC_MEM_OPEN, [0], b"\0" * 5) == 1
        assert call(wire.NVP_OP_IPC_MEM_CLOSE, [0x200000000000]) == 1
        assert call(wire.NVP_OP_IPC_EVENT_OPEN, [99], b"\0" * 3) == 1
        # captures: not capturing, unknown graphs, streams and nodes, dependency lists longer than their payload
        assert call(wire.NVP_OP_CAPTURE_DEPS, [0, 1, 0]) == 401  # the legacy stream is not being captured
        assert call(wire.NVP_OP_CAPTURE_TO_GRAPH, [0, 0, 9, 0]) == 1  # no graph 9
        assert call(wire.NVP_OP_CAPTURE_TO_GRAPH, [12345, 0, 1, 0]) == 400  # no such stream
        assert call(wire.NVP_OP_CAPTURE_TO_GRAPH, [0, 0, 1, 3], b"\0" * 4) == 1  # 3 dependencies, 1 id
        assert call(wire.NVP_OP_CAPTURE_INFO, [0, 50, 64], b"\0" * 8) == 0  # (not capturing: status only)
        assert call(wire.NVP_OP_GRAPH_ADD_NODE, [1, 8, wire.NVP_NODE_CHILD, 0], struct.pack("<Q", 77)) == 1
        assert call(wire.NVP_OP_GRAPH_ADD_NODE, [1, 9, wire.NVP_NODE_EVENT_RECORD, 0], struct.pack("<Q", 77)) == 400
        # managed variables of a module that was never loaded
        assert call(wire.NVP_OP_MANAGED_VAR, [77, 0x300000000000, 4], b"counter\0") != 0
        good.close()
    finally:
        proxy.kill()
        _, err = proxy.communicate()
    assert "malformed message" in err


def test_proxy_takes_only_a_reply_mailbox_that_cannot_shrink(capfd) -> None:
    """A reply mailbox is application memory the proxy writes to: a memfd the application could shrink would
    kill the proxy (SIGBUS) at its next reply, so only one sealed against shrinking is mapped."""
    import fcntl

    from nvproxy.proxy import libc, mailbox

    loose = os.memfd_create("loose")
    os.ftruncate(loose, mailbox.SIZE)
    assert mailbox.attach(loose, 7) is None
    assert "thread 7 sent an unusable reply mailbox" in capfd.readouterr().err
    with pytest.raises(OSError):
        os.fstat(loose)  # closed
    sealed = os.memfd_create("sealed", os.MFD_ALLOW_SEALING)
    os.ftruncate(sealed, mailbox.SIZE)
    fcntl.fcntl(sealed, fcntl.F_ADD_SEALS, fcntl.F_SEAL_SHRINK)
    mb = mailbox.attach(sealed, 8)
    assert mb is not None
    libc.buffer(mb.addr, 4)[:] = b"full"
    assert os.pread(sealed, 4, 0) == b"full"  # the application's page itself
    mb.close()


def test_proxy_raises_its_descriptor_limit() -> None:
    """Each application thread costs the proxy a socket and a mailbox memfd: it takes the hard limit of open files
    rather than a soft 1024."""
    import resource

    from nvproxy.cli import _more_descriptors

    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    low = 256 if hard == resource.RLIM_INFINITY else min(256, hard)
    if low == hard:
        pytest.skip(f"the hard limit of open files here is {hard}: nothing to raise")
    try:
        resource.setrlimit(resource.RLIMIT_NOFILE, (low, hard))
        _more_descriptors()
        assert resource.getrlimit(resource.RLIMIT_NOFILE)[0] == (1 << 20 if hard == resource.RLIM_INFINITY else hard)
    finally:
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))


def test_migrate_says_how_a_new_proxy_ended() -> None:
    """`nvproxy migrate` reports how the new proxy ended where it can still see it (a zombie's exit code in
    /proc/PID/stat): a signal or an exit status; nothing for a process that is not a zombie."""
    from nvproxy.launcher import how_it_ended as _how_it_ended

    killed = subprocess.Popen(["sleep", "30"])
    exited = subprocess.Popen(["sh", "-c", "exit 3"])
    assert _how_it_ended(killed.pid) == ""  # (running)
    killed.send_signal(signal.SIGKILL)
    try:
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline and not all(
                Path(f"/proc/{p.pid}/stat").read_text().rsplit(") ", 1)[1][0] == "Z" for p in (killed, exited)):
            time.sleep(0.01)
        assert _how_it_ended(killed.pid) == " (killed by signal 9)"
        assert _how_it_ended(exited.pid) == " (exit status 3)"
    finally:
        killed.wait()
        exited.wait()
    assert _how_it_ended(killed.pid) == ""  # (reaped: gone)


def test_a_proxy_that_cannot_start_says_why(monkeypatch, capfd, tmp_path: Path) -> None:
    """Where the proxy's process cannot even start (here its interpreter is missing), the child says why on stderr
    and the launcher fails at once, not after its 60 s wait."""
    from nvproxy import launcher

    monkeypatch.setattr(launcher.sys, "executable", str(tmp_path / "no-python"))
    t = time.monotonic()
    with pytest.raises(SystemExit, match="exited during start-up"):
        launcher.spawn_proxy(os.getpid(), dict(os.environ), sock=str(tmp_path / "p.sock"))
    assert time.monotonic() - t < 30
    assert "nvproxy: could not start a proxy: FileNotFoundError" in capfd.readouterr().err


def test_an_incomplete_installation_is_refused_in_one_line(monkeypatch, capsys) -> None:
    """A native library missing from the installation (a build that did not finish): every command but `settings`
    refuses in one line naming it, and so does a proxy the shim starts, before it starts anything."""
    import nvproxy
    from nvproxy import boot, cli

    monkeypatch.setattr(nvproxy, "NATIVE", (*nvproxy.NATIVE, "libnvproxy_gone.so"))
    for argv in (["run", "--backend", "sim", "--", "true"], ["bench", "--reps", "1"], ["info"]):
        assert cli.main(argv) == 1
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and "this installation is incomplete (libnvproxy_gone.so missing" in err
    assert cli.main(["settings"]) == 0
    capsys.readouterr()
    monkeypatch.setattr(sys, "argv", ["nvproxy", "proxy", "--socket", "/nonexistent/p.sock", "--owner-pid", "1"])
    with pytest.raises(SystemExit) as e:
        boot.main()
    assert e.value.code == 1 and "libnvproxy_gone.so missing" in capsys.readouterr().err


def _control_client(ctl: str, send: bytes) -> socket.socket:
    c = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    c.connect(ctl)
    c.sendall(send)
    c.settimeout(120)  # (a failure bound for the recv that waits for the proxy to drop it)
    return c


def test_a_stalled_control_client_holds_up_nothing(build, tmp_path: Path) -> None:
    """A process of the user that connects to the control socket and sends one byte, or garbage, holds up neither
    the application's calls nor a real checkpoint or migration made meanwhile; the proxy drops it (the garbage at
    once, the stalled one when its time for a request is up), saying so once."""
    exe = build("ckpt_steps")
    reference = run(nvproxy_cmd(exe, "sim", "ckpt_steps", "9", "0"))
    assert reference.returncode == 0, reference.stderr
    with Gated(nvproxy_cmd(exe, "sim", "ckpt_steps", "9", "-1")) as app:
        app.line()
        pid, sock = proxy_of(app.pid)
        stalled = _control_client(f"{sock}.{pid}.ctl", b"\1")
        # (accepted before the checkpoint's connection, which came later)
        image = tmp_path / "a.img"
        r = run([sys.executable, "-m", "nvproxy", "checkpoint", str(app.pid), "-o", str(image)], timeout=60)
        assert r.returncode == 0 and image.exists(), r.stdout + r.stderr
        for _ in range(3):
            app.go()  # (the application's calls go on, the stalled client still connected)
        garbage = _control_client(f"{sock}.{pid}.ctl", b"\xff" * 16)  # (a request of 2**32 + 2**64 bytes)
        said = b""  # (an answer saying why, then the end of the connection)
        while chunk := garbage.recv(65536):
            said += chunk
        assert said == b"" or b'"ok": false' in said, said
        app.go()
        assert stalled.recv(1) == b""
        again = _control_client(f"{sock}.{pid}.ctl", b"\1")
        r = run([sys.executable, "-m", "nvproxy", "migrate", str(app.pid)], timeout=120)
        assert r.returncode == 0, r.stdout + r.stderr
        assert again.recv(1) == b""  # (the old proxy is gone)
        out, err = app.finish()
        assert out == reference.stdout, err
        assert app.p.returncode == 0, err
    dropped = [line for line in err.splitlines() if "dropped a control connection" in line]
    assert len(dropped) == 2, err
    assert "control message of" in dropped[0] and "no whole request within" in dropped[1], err
    assert "handed over to the new proxy" in err, err


def test_a_kernel_the_sim_cannot_run_fails_its_launch(build) -> None:
    """vector_add without its Python kernel: the launch fails as a kernel without code for the device fails
    natively (cudaErrorNoKernelImageForDevice, which the program's check after the launch sees), and the proxy
    names the kernel once."""
    r = run([sys.executable, "-m", "nvproxy", "run", "--backend", "sim", "--", str(build("vector_add"))])
    assert r.returncode == 1, r.stdout + r.stderr
    lines = r.stdout.splitlines()  # (nothing after the failed check)
    assert len(lines) == 1 and lines[0].startswith("FAILED ") and lines[0].endswith(
        "vector_add.cu:22 cudaGetLastError() -> cudaErrorNoKernelImageForDevice (no kernel image is available for "
        "execution on the device)"), r.stdout + r.stderr
    named = [line for line in r.stderr.splitlines() if "has no Python implementation" in line]
    assert len(named) == 1 and "kernel vecAdd (_Z6vecAddPKfS0_Pfi)" in named[0], r.stderr
