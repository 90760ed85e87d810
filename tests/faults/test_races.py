"""A checkpoint or a migration racing the program's end: its normal exit, or its death (SIGKILL)."""

from __future__ import annotations

import os
import random
import signal
import time

import pytest

from nvproxy.checkpoint.image import read_header

from .scene import HANG_S, START_S, a_prefix, clear_error, same_output, seeded, succeeded, tidy

pytestmark = pytest.mark.faults
STEPS = 10
ARGS = (str(STEPS), "20")  # ckpt_steps: 10 steps, 20 ms apart: the program ends while a command starts


@pytest.mark.parametrize("seed", seeded(2))
@pytest.mark.parametrize("command", ["checkpoint", "migrate"])
@pytest.mark.parametrize("end", ["exit", "kill"])
def test_a_command_racing_the_programs_end(scene, build, reference, seed: int, command: str, end: str) -> None:
    """The command is given at a random step near the end (exit: the program ends by itself; kill: it is killed a
    random while later).  The command succeeds (a readable image; a migration said so) or fails with one line
    that names the process; either way within its bound, leaving no temporary image and no proxy, and the
    program's output is the undisturbed run's (up to its death)."""
    rng = random.Random(seed)
    exe = build("ckpt_steps")
    ref = reference(exe, *ARGS)
    app = scene.start(exe, *ARGS)
    app.line(f"step {rng.randrange(STEPS // 2, STEPS)}:")
    scene.proxy_of(app)
    image = scene.image_dir() / "racing.img"
    cmd = scene.nvproxy(command, app.pid, *(["-o", image] if command == "checkpoint" else []), wait=False)
    if end == "kill":
        time.sleep(rng.uniform(0, 0.6))  # (the fault's moment, within the command's start and its work)
        os.kill(app.pid, signal.SIGKILL)
        app.exit(HANG_S, "the killed program's end")
        a_prefix(app, ref.out)
    else:
        app.exit(ref.bound)
        succeeded(app)
        same_output(app, ref.out)
    cmd.exit(START_S, f"nvproxy {command}")
    tidy(app)
    if cmd.rc == 0:
        assert command == "migrate" or read_header(image)[1]["regions"], "\n".join(cmd.out)
    else:
        clear_error(cmd, str(app.pid), alone=True)
        assert not image.exists(), f"a failed checkpoint left {image}"
    scene.conclude()
