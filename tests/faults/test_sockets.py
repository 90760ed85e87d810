"""Garbage on the proxy's sockets: its application's socket (from the application itself, and from another
process) and its control socket; and a control client that connects, sends a byte and stalls."""

from __future__ import annotations

import json
import os
import random
import socket
import struct
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

from nvproxy.proxy import control

from .scene import FAULT_APPS, HANG_S, START_S, Scene, Watched, clear_error, same_output, seeded, succeeded, tidy

pytestmark = pytest.mark.faults
ARGS = ("pinned", "4", "3")  # copy_loop

# what apps/garbage.py must see of its garbage; and what the proxy's one line must name (None: it need say nothing)
CALL_GARBAGE = {
    # (random bytes may end inside a header, or declare a payload still to come: the channel then waits, as it
    # should; either way a well-formed channel is served)
    "random": ("", None),
    "random-requests": ("", None),  # (any: random operations may be answered, or close the channel)
    "truncated-header": ("garbage: sent", None),
    "absurd-length": ("garbage: closed", "channel"),
    "short-length": ("garbage: closed", "channel"),
    "bad-hello": ("garbage: closed", "channel"),
    "silent": ("garbage: open", None),
    "unknown-op": ("garbage: answered 801", None),
    # (the call that waits carries the failure as an asynchronous one; the proxy's line names the posted call)
    "posted-unregister": ("garbage: answered 0 after 713", "cudaHostUnregister(0x7e57000) failed"),
}


@pytest.mark.parametrize("seed", seeded(1))
@pytest.mark.parametrize("garbage", CALL_GARBAGE)
def test_garbage_from_the_application(scene, garbage: str, seed: int) -> None:
    """The proxy closes (or answers) the channel that carried garbage, saying so in one line, and goes on
    serving a well-formed one."""
    saw, says = CALL_GARBAGE[garbage]
    app = scene.start(Path(sys.executable), FAULT_APPS / "garbage.py", garbage, seed)
    app.exit(START_S)
    assert app.out[-1:] == ["good: served"], "\n".join(app.out + app.err)
    if saw:
        assert app.out[0] == saw, "\n".join(app.out)
    if says:
        clear_error(app, says)
    tidy(app)
    scene.conclude()


def gated(scene: Scene, fault_app) -> Watched:
    """copy_loop, waiting after its first round."""
    app = scene.start(fault_app("copy_loop"), *ARGS, "gated", stdin=True)
    app.say()
    app.line("round 0:")
    return app


def finish(app: Watched, ref) -> None:
    for _ in range(int(ARGS[2]) - 1):
        app.say()
    app.exit(ref.bound)
    succeeded(app)
    same_output(app, ref.out)


def checkpoint_within(scene: Scene, app: Watched, within: float) -> None:
    r = scene.nvproxy("checkpoint", app.pid, "-o", scene.image_dir() / "after.img", within=within)
    assert r.rc == 0, "\n".join(r.out + r.err)


def test_garbage_from_another_process(scene, fault_app, reference) -> None:
    """The proxy refuses a connection of any other process at once, saying so in one line that names it, whatever
    it sends; its program goes on undisturbed."""
    ref = reference(fault_app("copy_loop"), *ARGS)
    app = gated(scene, fault_app)
    _pid, sock = scene.socket_of(app)
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
        s.connect(sock)
        s.settimeout(HANG_S)
        try:
            s.sendall(random.Random(1).randbytes(512))
        except BrokenPipeError:
            pass
        try:
            assert s.recv(1) == b""
        except ConnectionResetError:
            pass  # (closed with the garbage unread)
    finish(app, ref)
    clear_error(app, "refused", f"pid {os.getpid()}")
    scene.conclude()


def framed(body: bytes, n: int | None = None, blob_len: int = 0, batches: int = 1) -> bytes:
    """A control message's bytes (control.py): lengths, the count of descriptor batches, the JSON."""
    return control.HEAD.pack(len(body) if n is None else n, blob_len) + struct.pack("<I", batches) + body


# what is sent on the control socket; then the client closes its end ("close": the proxy must say so in one line
# naming the control connection) or waits for the answer ("reply": an error, a sentence rather than an exception's
# bare text, naming one of the words given)
CONTROL_GARBAGE = {
    "random": (lambda rng: rng.randbytes(rng.randrange(1, 512)), "close", ("control",)),
    "truncated-header": (lambda rng: framed(b"{}")[: rng.randrange(1, 16)], "close", ("control",)),
    "absurd-length": (lambda rng: framed(b"{}", n=0xFFFFFFFF, blob_len=1 << 60), "close", ("control",)),
    "absurd-descriptor-batches": (lambda rng: framed(b"{}", batches=0xFFFFFFF0), "close", ("control",)),
    "not-json": (lambda rng: framed(b"{nope"), "reply", ("JSON", "json")),
    "not-an-object": (lambda rng: framed(b"[1, 2]"), "reply", ("JSON", "json", "command")),
    "unknown-command": (lambda rng: framed(json.dumps({"cmd": "explode"}).encode()), "reply", ("explode",)),
    "checkpoint-without-image": (lambda rng: framed(b'{"cmd": "checkpoint"}'), "reply", ("image",)),
}


@contextmanager
def control_client(scene: Scene, fault_app) -> Iterator[tuple[Watched, socket.socket, float]]:
    """copy_loop after its first round, how long an undisturbed checkpoint of it took, and a connection to its
    proxy's control socket."""
    app = gated(scene, fault_app)
    pid, sock = scene.socket_of(app)
    t = time.monotonic()
    checkpoint_within(scene, app, START_S)
    took = time.monotonic() - t
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as c:
        c.connect(f"{sock}.{pid}.ctl")
        yield app, c, took


@pytest.mark.parametrize("seed", seeded(1))
@pytest.mark.parametrize("garbage", CONTROL_GARBAGE)
def test_garbage_on_the_control_socket(scene, fault_app, reference, garbage: str, seed: int) -> None:
    """The proxy answers with an error naming what is wrong, or (the client gone) says in one line that the
    control command failed; it goes on: a checkpoint afterwards takes no longer than one before (HANG_S aside),
    and the program prints what the undisturbed run prints."""
    make, then, words = CONTROL_GARBAGE[garbage]
    ref = reference(fault_app("copy_loop"), *ARGS)
    with control_client(scene, fault_app) as (app, c, before):
        c.settimeout(HANG_S)
        c.sendall(make(random.Random(seed)))
        if then == "reply":
            answer, _blob, _fds = control.recv(c)
            assert answer.get("ok") is False and "\n" not in answer.get("error", "\n"), answer
            assert any(w in answer["error"] for w in words) and len(answer["error"].split()) > 2, answer
    checkpoint_within(scene, app, 2 * before + HANG_S)
    finish(app, ref)
    if then == "close":
        clear_error(app, words)
    tidy(app)
    scene.conclude()


STALLS = {"silent": b"", "one-byte": b"\0", "half-a-message": framed(b'{"cmd": "usage"}')[:20]}


@pytest.mark.parametrize("stall", STALLS)
def test_a_stalled_control_client_holds_nothing_up(scene, fault_app, reference, stall: str) -> None:
    """A control client connects, sends a little and then nothing, and stays: the program goes on, and a checkpoint
    meanwhile takes no longer than one before (HANG_S aside)."""
    ref = reference(fault_app("copy_loop"), *ARGS)
    with control_client(scene, fault_app) as (app, c, before):
        c.sendall(STALLS[stall])
        checkpoint_within(scene, app, 2 * before + HANG_S)
        finish(app, ref)
    tidy(app)
    scene.conclude()
