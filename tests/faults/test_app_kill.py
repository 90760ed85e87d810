"""The program killed (SIGKILL) in the middle of its copies."""

from __future__ import annotations

import os
import random
import signal

import pytest

from .scene import HANG_S, Snapshot, a_prefix, seeded, tidy

pytestmark = pytest.mark.faults
BACKENDS = ["sim", pytest.param("gpu", marks=pytest.mark.gpu)]


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("seed", seeded(2))
@pytest.mark.parametrize("memory", ["pageable", "pinned"])
def test_a_program_killed_mid_copy_takes_its_proxy_along(scene, fault_app, reference, backend: str, seed: int,
                                                        memory: str) -> None:
    """Killed at a random request of its 16 MiB copies, after a checkpoint: its proxy ends within HANG_S, saying
    nothing but one-line messages, nothing of theirs is left (sockets, shared memory), and the earlier image stays
    as it was."""
    rng = random.Random(seed)
    exe = fault_app("copy_loop")
    args = (memory, "16", "6")
    ref = reference(exe, *args, backend=backend, trace=True)
    app = scene.start(exe, *args, "gated", env={"NVPROXY_TRACE": "1"}, stdin=True)
    app.say()
    app.line("round 0:")
    image = scene.image_dir() / "earlier.img"
    ckpt = scene.nvproxy("checkpoint", app.pid, "-o", image)
    assert ckpt.rc == 0, "\n".join(ckpt.out + ckpt.err)
    before = Snapshot.of(image)
    n = rng.randrange(app.seq + 1, ref.requests * 4 // 5)
    for _ in range(5):
        app.say()
    app.request(n)
    scene.proxy_of(app)
    os.kill(app.pid, signal.SIGKILL)
    app.exit(HANG_S, f"the program's end, killed at request {n}")
    tidy(app)
    a_prefix(app, ref.out)
    before.intact()
    scene.conclude()
