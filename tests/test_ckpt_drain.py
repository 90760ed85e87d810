"""A checkpoint holds every call the program has returned from: work it sent that the proxy had not executed yet
(requests still in the sockets or the mailboxes' slots, or waiting behind an earlier request of another thread)
runs before the image is cut.  tests/apps/drain_ckpt leaves such work behind a request that the test hooks hold
unsent in one thread (a thread stopped between numbering a request and sending it), and waits; it is stopped,
checkpointed, its proxy killed, continued and the held request let go: the calls find the proxy gone and start a
new one from the image (NVPROXY_RECOVER), and the program prints what an uninterrupted run prints."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import time
from pathlib import Path
from typing import Any

import pytest
from conftest import hooked, nvproxy_cmd, run
from gated import WAIT_S, Gated, kill_and_wait

from nvproxy.launcher import find_proxy
from nvproxy.proxy import control

# threads, rounds of three copies and a kernel, tail launches per thread, work per kernel (on a GPU the kernels
# fill the device's queues, so the proxy's launches wait and the rest stays in the sockets)
ARGS = {"sim": (3, 10, 300, 1), "gpu": (3, 10, 1500, 20000)}
MODES = {"mailbox": {}, "sockets": {"NVPROXY_DEBUG": "no-mailbox"}}


def held_request(threads: int, rounds: int, tail: int) -> int:
    """A request number in the threads' tails of launches (after every copy, whose answer would wait behind it),
    before the last third of them: numbered before all but one of the threads are done (the held one is the thread
    the program does not wait for), and followed by many of the others'."""
    setup = 4 * threads + 20  # (streams, allocations, memsets, a synchronisation, module loads and the like)
    return setup + 4 * rounds * threads + threads * tail // 3


def undisturbed(exe: Path, backend: str, args: list[str], env: dict[str, str]) -> str:
    """drain_ckpt's output when nothing holds it up: native CUDA's on the GPU, the sim backend's on sim."""
    cmd = [str(exe), *args, "0"] if backend == "gpu" else nvproxy_cmd(exe, backend, "drain_ckpt", *args, "0")
    r = run(cmd, stdin=subprocess.DEVNULL, env=env)
    assert r.returncode == 0 and "Test PASSED" in r.stdout, r.stdout + r.stderr
    return r.stdout


def held_run(build, backend: str, env: dict[str, str], tmp_path: Path) -> tuple[Path, list[str], str, Path, int]:
    """What a test of a held request starts from: drain_ckpt, its arguments, its undisturbed output, the fifo that
    lets the held request go, and that request's number."""
    exe = build("drain_ckpt")
    args = [str(a) for a in ARGS[backend]]
    fifo = tmp_path / "hold"
    os.mkfifo(fifo)
    return exe, args, undisturbed(exe, backend, args, env), fifo, held_request(*ARGS[backend][:3])


def checkpoint_now(app_pid: int, image: Path) -> dict[str, Any]:
    """nvproxy checkpoint's request, from this process."""
    pid, sock = find_proxy(app_pid)
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as c:
        c.connect(f"{sock}.{pid}.ctl")
        control.send(c, {"cmd": "checkpoint", "image": str(image)})
        reply, _blob, _fds = control.recv(c)
    return reply


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("backend", ["sim", pytest.param("gpu", marks=pytest.mark.gpu)])
def test_a_checkpoint_of_a_stopped_program_holds_everything_it_sent(build, backend: str, mode: str,
                                                                    tmp_path: Path) -> None:
    env = dict(os.environ, **MODES[mode])
    env.pop("LD_PRELOAD", None)
    exe, args, reference, fifo, held = held_run(build, backend, env, tmp_path)
    image = tmp_path / "last.img"
    env = hooked(env, NVPROXY_RECOVER=str(image), NVPROXY_TEST_HOLD_REQUEST=str(held),
                 NVPROXY_TEST_HOLD_FIFO=str(fifo))
    with Gated(nvproxy_cmd(exe, backend, "drain_ckpt", *args, "1"), env) as app:
        assert app.line() == "issued\n"
        os.kill(app.pid, signal.SIGSTOP)
        try:
            reply = checkpoint_now(app.pid, image)
            assert reply.get("ok"), reply
            assert reply["stats"]["taken_at_cut"] > 0, reply  # (the requests behind the held one ran before the cut)
            kill_and_wait(find_proxy(app.pid)[0])
        finally:
            os.kill(app.pid, signal.SIGCONT)
            with open(fifo, "wb"):  # (lets the held request go)
                pass
        out, err = app.finish()
    assert f"request {held} held" in err and "starting a new one from" in err, err
    assert out == reference, err


@pytest.mark.parametrize("backend", ["sim", pytest.param("gpu", marks=pytest.mark.gpu)])
def test_a_request_numbered_but_not_sent_holds_the_others_up_only_for_a_while(build, backend: str,
                                                                              tmp_path: Path) -> None:
    """A thread stopped between numbering a request and sending it (it may have died there): the proxy executes
    the other threads' later requests after a while, says so in one line, and runs the held request when it comes;
    the program prints what an undisturbed run prints (each thread's work is on its own stream)."""
    env = {k: v for k, v in os.environ.items() if k != "LD_PRELOAD"}
    exe, args, reference, fifo, held = held_run(build, backend, env, tmp_path)
    log = tmp_path / "proxy.log"
    env = hooked(env, NVPROXY_TEST_HOLD_REQUEST=str(held), NVPROXY_TEST_HOLD_FIFO=str(fifo),
                 NVPROXY_PROXY_LOG=str(log))
    said = f"request {held} never arrived; going on"
    with Gated(nvproxy_cmd(exe, backend, "drain_ckpt", *args, "1"), env) as app:
        try:
            assert app.line() == "issued\n"
            deadline = time.monotonic() + WAIT_S  # (a failure bound: the proxy says it within seconds)
            while said not in (log.read_text() if log.exists() else "") and time.monotonic() < deadline:
                time.sleep(0.05)
            assert said in log.read_text(), log.read_text()
        finally:
            with open(fifo, "wb"):  # (lets the held request go)
                pass
        app.p.stdin.close()
        out, err = app.finish()
    assert f"request {held} held" in err, err
    assert out == reference, err + log.read_text()
