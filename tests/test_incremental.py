"""Incremental checkpoints: a program checkpointed again and again into the same directory, each image after the
first taking unchanged memory from the one before, is killed after the last and recovers from it
(NVPROXY_RECOVER); it prints what an uninterrupted run prints.  Its kernels write memory that only pointers lead
to (an array of pointers built on the device, a __device__ variable, a structure parameter, an integer); one
variant also writes through an address write tracking cannot see, which the comparing mode must catch."""

from __future__ import annotations

import os
import random
import re
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import nvproxy_cmd, run
from gated import Gated, kill_and_wait

from nvproxy.checkpoint.image import read_header

BACKENDS = ["sim", pytest.param("gpu", marks=pytest.mark.gpu)]
STEPS = 14
WRITTEN = re.compile(r"incremental: (\d+) of (\d+) MiB written from the device")


def nvproxy(*args: str) -> subprocess.CompletedProcess:
    return run([sys.executable, "-m", "nvproxy", *args], timeout=300)


def checkpoints_then_recover(build, backend: str, tmp_path: Path, args: tuple[str, ...], flags: tuple[str, ...],
                             image: Path) -> list[str]:
    """Checkpoints at three random steps a few apart (the first whole, the others with flags), then the proxy killed
    and the program recovered from the last image; asserts its output is an uninterrupted run's.  The commands'
    outputs."""
    from nvproxy.launcher import find_proxy

    exe = build("incremental")
    reference = run(nvproxy_cmd(exe, backend, "incremental", *args), stdin=subprocess.DEVNULL)
    assert reference.returncode == 0 and "Test PASSED" in reference.stdout, reference.stderr
    rng = random.Random(int(os.environ.get("NVPROXY_TEST_SEED", "0")) or None)
    # (a few steps apart: each step writes a plain buffer of 4 MiB and 16 MiB through pointers, so checkpoints 8 or
    # more steps apart would each have three quarters of the 64 MiB to write, as a whole one would, nearly)
    points = [rng.randrange(1, STEPS - 7)]
    for _ in range(2):
        points.append(points[-1] + rng.randint(1, 3))
    env = dict(os.environ, NVPROXY_RECOVER=str(image))
    env.pop("LD_PRELOAD", None)
    said = []
    with Gated(nvproxy_cmd(exe, backend, "incremental", *args), env) as app:
        step = 0
        app.line()
        for i, at in enumerate(points):
            while step < at:
                app.go()
                step += 1
            r = nvproxy("checkpoint", str(app.pid), "-o", str(image), *(("--incremental", *flags) if i else ()))
            assert r.returncode == 0, r.stdout + r.stderr
            said.append(r.stdout + r.stderr)
        pid, _sock = find_proxy(app.pid)
        kill_and_wait(pid)
        out, err = app.finish()
    assert "starting a new one from" in err, err
    assert out == reference.stdout, f"{err}\nthe checkpoints said:\n" + "\n".join(said)
    return said


@pytest.mark.parametrize("backend", BACKENDS)
def test_tracked_incremental_images_restore_exactly(build, backend: str, tmp_path: Path) -> None:
    """Only what tracking marks is copied out (a tenth of the plain buffers, and those pointers lead to)."""
    image = tmp_path / "app.img"
    said = checkpoints_then_recover(build, backend, tmp_path, (str(STEPS),), ("--tracked",), image)
    for text in said[1:]:
        m = WRITTEN.search(text)
        assert m and 0 < int(m.group(1)) < int(m.group(2)) * 3 // 4, text
        assert "taken from" in text and "had not marked" not in text, text
    fd, header = read_header(image)
    os.close(fd)
    assert header["parent"]["name"] == image.name and header["id"] != header["parent"]["id"]
    assert os.stat(image).st_mode & 0o777 == 0o600


@pytest.mark.parametrize("backend", BACKENDS)
def test_comparing_incremental_images_catch_what_tracking_cannot_see(build, backend: str, tmp_path: Path) -> None:
    """A kernel reaching another allocation by an offset past the end of its own: the default (comparing) mode
    writes the changed memory and names it; the restored program still prints what an uninterrupted run prints."""
    said = checkpoints_then_recover(build, backend, tmp_path, (str(STEPS), "defeat"), (), tmp_path / "app.img")
    for text in said[1:]:
        m = WRITTEN.search(text)
        assert m and int(m.group(1)) < int(m.group(2)), text
        assert "changed that write tracking had not marked" in text, text


def test_an_incremental_image_without_its_parent_is_whole(build, tmp_path: Path) -> None:
    """The earlier image gone, or damaged: the next incremental image says so and is whole; a
    restore of it gives exact state."""
    image = tmp_path / "app.img"
    exe = build("incremental")
    reference = run(nvproxy_cmd(exe, "sim", "incremental", "4"), stdin=subprocess.DEVNULL)
    env = dict(os.environ, NVPROXY_RECOVER=str(image))
    env.pop("LD_PRELOAD", None)
    with Gated(nvproxy_cmd(exe, "sim", "incremental", "4"), env) as app:
        app.line()
        for why, spoil in (("is gone", image.unlink), ("cannot be used", lambda: image.write_bytes(b"x"))):
            app.go()
            assert nvproxy("checkpoint", str(app.pid), "-o", str(image)).returncode == 0
            spoil()
            r = nvproxy("checkpoint", str(app.pid), "-o", str(image), "--incremental")
            assert r.returncode == 0 and why in r.stderr and "no earlier image to build on" in r.stdout, r.stderr
            m = re.search(r"(\d+) of (\d+) MiB written", r.stdout)
            assert m and m.group(1) == m.group(2), r.stdout
        from nvproxy.launcher import find_proxy

        kill_and_wait(find_proxy(app.pid)[0])
        out, err = app.finish()
    assert out == reference.stdout, err
