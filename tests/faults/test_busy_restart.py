"""A restart while another program keeps the same device busy: a recovery from an image (NVPROXY_RECOVER) and a
migration, with a second program copying through nvproxy all along (on sim: another proxy's device; marked gpu:
the same GPU)."""

from __future__ import annotations

import os
import re
import signal

import pytest

from .scene import Watched, clear_error, same_output, succeeded, tail, tidy

pytestmark = pytest.mark.faults
BACKENDS = ["sim", pytest.param("gpu", marks=pytest.mark.gpu)]
ARGS = ("pinned", "8", "3")  # copy_loop, the program restarted
BUSY = ("pageable", "16", "100000", "gated")  # copy_loop, the other program: rounds for as long as it is fed
BUSY_ROUND = ("pageable", "16", "1")  # ... and the undisturbed run of one such round: what may be in flight at its end
ROUND = re.compile(r"round (\d+): kept ([0-9a-f]{16}), ok ([0-9a-f]{16})")


def rounds_hold(w: Watched) -> None:
    """copy_loop's rounds came in order, each checked right and keeping what the one before left on the device."""
    rounds = [ROUND.fullmatch(x) for x in w.out[:-1]]
    assert all(rounds) and w.out[-1:] == ["Test PASSED"], tail(w.out)
    assert [int(m.group(1)) for m in rounds] == list(range(len(rounds))), tail(w.out)
    assert all(b.group(2) == a.group(3) for a, b in zip(rounds, rounds[1:], strict=False)), tail(w.out)


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("restart", ["recover", "migrate"])
def test_a_restart_beside_a_busy_program(scene, fault_app, reference, backend: str, restart: str) -> None:
    """The restarted program prints what its undisturbed run prints; the busy one, copying all along, ends
    when told with every round right."""
    exe = fault_app("copy_loop")
    ref = reference(exe, *ARGS, backend=backend)
    busy_ref = reference(exe, *BUSY_ROUND, backend=backend)
    image = scene.image_dir() / "restart.img"
    busy = scene.start(exe, *BUSY, stdin=True)
    busy.feed()
    busy.line("round 0:")
    app = scene.start(exe, *ARGS, "gated", env={"NVPROXY_RECOVER": str(image)}, stdin=True)
    app.say()
    app.line("round 0:")
    if restart == "recover":
        r = scene.nvproxy("checkpoint", app.pid, "-o", image)
        assert r.rc == 0, "\n".join(r.out + r.err)
        os.kill(scene.proxy_of(app), signal.SIGKILL)
    else:
        scene.proxy_of(app)
        r = scene.nvproxy("migrate", app.pid)
        assert r.rc == 0, "\n".join(r.out + r.err)
    for _ in range(int(ARGS[2]) - 1):
        app.say()
    app.exit(ref.bound)
    busy.halt()
    succeeded(app)
    same_output(app, ref.out)
    clear_error(app, "restored")
    busy.exit(busy_ref.bound)
    succeeded(busy)
    rounds_hold(busy)
    tidy(busy)
    scene.conclude()
