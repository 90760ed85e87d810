"""The proxy killed (SIGKILL) or stopped (SIGSTOP) at a random request of a running program."""

from __future__ import annotations

import os
import random
import signal
import time

import pytest

from .scene import (
    HANG_S,
    Scene,
    Snapshot,
    appears,
    clear_error,
    cut_short,
    nothing_said,
    same_output,
    seeded,
    succeeded,
)

pytestmark = pytest.mark.faults
BACKENDS = ["sim", pytest.param("gpu", marks=pytest.mark.gpu)]
ARGS = ("8", "40")  # ckpt_steps: 8 steps, 40 ms apart
TRACE = {"NVPROXY_TRACE": "1"}


def strike(rng: random.Random, requests: int) -> int:
    """A request in the first four fifths of the run's (the program goes on for a step's pause or more after it,
    longer than the test takes to react)."""
    return rng.randrange(3, requests * 4 // 5)


def struck(scene: Scene, build, reference, backend: str, seed: int) -> tuple:
    """ckpt_steps, its trace on, run to a random request: (the seed's random numbers, the undisturbed run, the
    program, its proxy, that request)."""
    rng = random.Random(seed)
    exe = build("ckpt_steps")
    ref = reference(exe, *ARGS, backend=backend, trace=True)
    n = strike(rng, ref.requests)
    app = scene.start(exe, *ARGS, env=TRACE)
    app.request(n)
    return rng, ref, app, scene.proxy_of(app), n


def stopped_for(rng: random.Random, pid: int) -> None:
    """pid stopped for a random while: the fault's own length (nothing is waited for)."""
    os.kill(pid, signal.SIGSTOP)
    time.sleep(rng.uniform(0.05, 0.5))


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("seed", seeded(2))
@pytest.mark.parametrize("how", ["kill", "stop-kill"])
def test_a_killed_proxy_is_a_clear_error(scene, build, reference, backend: str, seed: int, how: str) -> None:
    """The program's next call fails with cudaErrorDevicesUnavailable and one line says the proxy was lost; what
    it printed before is the undisturbed run's; it ends at once; nothing of its proxy is left."""
    rng, ref, app, proxy, n = struck(scene, build, reference, backend, seed)
    if how == "stop-kill":
        stopped_for(rng, proxy)
    os.kill(proxy, signal.SIGKILL)
    app.exit(ref.bound, f"the program's end after its proxy was killed at request {n}")
    clear_error(app, "lost the proxy")
    cut_short(app, ref.out)
    scene.conclude()


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("seed", seeded(2))
def test_a_stopped_proxy_that_goes_on_loses_nothing(scene, build, reference, backend: str, seed: int) -> None:
    """SIGSTOP, then SIGCONT: the program waits, then prints what the undisturbed run prints, and nothing else."""
    rng, ref, app, proxy, n = struck(scene, build, reference, backend, seed)
    stopped_for(rng, proxy)
    os.kill(proxy, signal.SIGCONT)
    app.exit(ref.bound, f"the program's end after its proxy was stopped at request {n}")
    succeeded(app)
    nothing_said(app)
    same_output(app, ref.out)
    scene.conclude()


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("seed", seeded(2))
@pytest.mark.parametrize("memory", ["pageable", "pinned"])
def test_a_killed_proxy_recovers_from_an_image_of_that_moment(scene, fault_app, reference, backend: str, seed: int,
                                                              memory: str) -> None:
    """NVPROXY_RECOVER: a program of copies stopped (SIGSTOP) at a random request, checkpointed, its proxy killed,
    the program let go on: a new proxy restores the image and the program prints what the undisturbed run prints;
    the image stays as it was.  (A program with host functions cannot be checkpointed while stopped: a pending host
    function waits for it.)"""
    rng = random.Random(seed)
    exe = fault_app("copy_loop")
    args = (memory, "8", "6")
    ref = reference(exe, *args, backend=backend, trace=True)
    n = strike(rng, ref.requests)
    image = scene.image_dir() / "at-request.img"
    app = scene.start(exe, *args, env=dict(TRACE, NVPROXY_RECOVER=str(image)))
    app.request(n)
    os.kill(app.pid, signal.SIGSTOP)
    proxy = scene.proxy_of(app)
    ckpt = scene.nvproxy("checkpoint", app.pid, "-o", image)
    assert ckpt.rc == 0, "\n".join(ckpt.out + ckpt.err)
    before = Snapshot.of(image)
    os.kill(proxy, signal.SIGKILL)
    os.kill(app.pid, signal.SIGCONT)
    app.exit(ref.bound, f"the program's end after a recovery at request {n}")
    succeeded(app)
    clear_error(app, "restored", str(image))
    same_output(app, ref.out)
    before.intact()
    scene.conclude()


@pytest.mark.parametrize("backend", BACKENDS)
def test_a_proxy_killed_while_it_writes_an_image(scene, fault_app, reference, backend: str) -> None:
    """Killed once its temporary image file appears: the checkpoint fails with one line naming the process or the
    image; the image written before at that path stays as it was and no temporary file is left; the program's next
    call fails clearly."""
    exe = fault_app("copy_loop")
    args = ("pinned", "64", "2")
    ref = reference(exe, *args, backend=backend)
    d = scene.image_dir()
    image = d / "image.img"
    app = scene.start(exe, *args, "gated", stdin=True)
    app.say()
    app.line("round 0:")
    proxy = scene.proxy_of(app)
    r = scene.nvproxy("checkpoint", app.pid, "-o", image)
    assert r.rc == 0, "\n".join(r.out + r.err)
    before = Snapshot.of(image)
    ckpt = scene.nvproxy("checkpoint", app.pid, "-o", image, wait=False)
    assert appears(d, ".*.tmp"), "no temporary image file appeared"
    os.kill(proxy, signal.SIGKILL)
    ckpt.exit(HANG_S, "the checkpoint's end after the proxy was killed")
    assert ckpt.rc != 0, "the image was written before the kill came: the case tested nothing"
    clear_error(ckpt, (str(app.pid), str(image)), alone=True)
    before.intact()
    app.say()
    app.exit(ref.bound)
    clear_error(app, "lost the proxy")
    cut_short(app, ref.out)
    scene.conclude()
