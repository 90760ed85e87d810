"""Where a checkpoint image cannot be written: a file size limit, a full file system, read-only places, a missing
directory, a file where its directory should be."""

from __future__ import annotations

import errno
import functools
import os
import resource
import shlex
import subprocess
import tempfile
from dataclasses import dataclass
from pathlib import Path

import pytest

from .scene import Scene, Snapshot, Watched, clear_error, same_output, succeeded, tidy

pytestmark = pytest.mark.faults
ARGS = ("pinned", "8", "3")  # copy_loop


@dataclass(frozen=True)
class Target:
    """A place where an image cannot go: the reason its error must give (any of these words); mount: shell commands
    that make it in a private mount namespace of the program and its proxy (DIR: the image directory); path: the
    image's path, where it is not DIR/image.img; first: an image is written there before, and must stay as it was;
    only: "root" or "user", where only they meet the fault."""

    reason: tuple[str, ...]
    mount: str = ""
    path: str = ""
    first: bool = False
    only: str = ""


NOT_WRITABLE = ("Permission denied", "not writable", "permission")
NO_DIRECTORY = ("No such file or directory", "no directory", "does not exist", "Not a directory", "not a directory")
TARGETS = {
    "file-size-limit": Target(("File too large", "too large", "size limit"), first=True),  # (RLIMIT_FSIZE, lowered)
    "disk-full": Target(("No space left on device", "no space", "full"),
                        mount="mount -t tmpfs -o size=64m nvproxy-faults DIR", first=True),
    "read-only-mount": Target(("Read-only file system", "read-only"),
                              mount="mount --bind DIR DIR && mount -o remount,bind,ro DIR"),
    "read-only-directory": Target(NOT_WRITABLE, only="user"),  # (chmod 0500)
    "sysfs": Target(NOT_WRITABLE, path="/sys/nvproxy-faults.img"),
    "missing-directory": Target(NO_DIRECTORY, path="/nonexistent-nvproxy-faults/image.img"),
    "file-in-the-way": Target(NO_DIRECTORY),  # (DIR/file/image.img, DIR/file a file)
}


@functools.cache
def private_mounts() -> str:
    """Why a private mount namespace with a tmpfs cannot be had here ('' where it can)."""
    with tempfile.TemporaryDirectory() as d:
        r = subprocess.run(["unshare", "-m", "sh", "-c", f"mount -t tmpfs -o size=1m nvproxy-faults {d}"],
                           capture_output=True, text=True)
    return "" if r.returncode == 0 else f"no private mount namespace with a tmpfs here: {r.stderr.strip()}"


def fill(d: Path) -> None:
    """Fill the file system of d but for less than a MiB."""
    chunk = b"\0" * (1 << 20)
    with open(d / "filler", "wb", buffering=0) as f:
        try:
            while True:
                f.write(chunk)
        except OSError as e:
            if e.errno != errno.ENOSPC:
                raise


def checkpoint(scene: Scene, app: Watched, image: Path) -> Watched:
    return scene.nvproxy("checkpoint", app.pid, "-o", image)


@pytest.mark.parametrize("target", TARGETS)
def test_an_image_that_cannot_be_written(scene, fault_app, reference, target: str) -> None:
    """The checkpoint fails with one line naming the image and the reason; an image already there stays as it was
    and no temporary file is left; the proxy goes on (a later checkpoint elsewhere succeeds) and so does the program,
    to the undisturbed run's output."""
    t = TARGETS[target]
    if t.only == "user" and os.getuid() == 0:
        pytest.skip("root writes into a directory of mode 0500 all the same (read-only-mount and sysfs are read-only "
                    "for root too)")
    if t.only == "root" and os.getuid() != 0:
        pytest.skip("needs root")
    if t.mount and private_mounts():
        pytest.skip(private_mounts())
    exe = fault_app("copy_loop")
    ref = reference(exe, *ARGS)
    d = scene.image_dir("target")
    image = Path(t.path) if t.path else d / ("file/image.img" if target == "file-in-the-way" else "image.img")
    wrap = ("unshare", "-m", "sh", "-c", t.mount.replace("DIR", shlex.quote(str(d))) + ' && exec "$@"', "sh")
    app = scene.start(exe, *ARGS, "gated", stdin=True, wrap=wrap if t.mount else ())
    app.say()
    app.line("round 0:")
    proxy = scene.proxy_of(app)
    seen, seen_image = (Path(f"/proc/{app.pid}/root{p}") for p in (d, image))  # (as the program and proxy see them)
    first = None
    if t.first:
        r = checkpoint(scene, app, image)
        assert r.rc == 0, "\n".join(r.out + r.err)
        first = Snapshot.of(seen_image)
    limit = resource.prlimit(proxy, resource.RLIMIT_FSIZE)
    if target == "file-size-limit":
        resource.prlimit(proxy, resource.RLIMIT_FSIZE, (1 << 20, limit[1]))
    elif target == "disk-full":
        fill(seen)
    elif target == "read-only-directory":
        d.chmod(0o500)
    elif target == "file-in-the-way":
        image.parent.write_text("kept")
    r = checkpoint(scene, app, image)
    assert r.rc != 0, "\n".join(r.out)
    clear_error(r, str(image), t.reason, alone=True)
    if first is not None:
        first.intact()
    elif target == "file-in-the-way":
        assert image.parent.read_text() == "kept"
    else:
        assert not seen_image.exists()
    if seen_image.parent.is_dir():
        assert [p.name for p in seen_image.parent.iterdir() if p.name.endswith(".tmp")] == [], "a temporary image"
    # the fault lifted, the proxy writes an image elsewhere, and the program goes on
    resource.prlimit(proxy, resource.RLIMIT_FSIZE, limit)
    d.chmod(0o700)
    r = checkpoint(scene, app, scene.image_dir("elsewhere") / "image.img")
    assert r.rc == 0, "\n".join(r.out + r.err)
    for _ in range(int(ARGS[2]) - 1):
        app.say()
    app.exit(ref.bound)
    succeeded(app)
    same_output(app, ref.out)
    tidy(app)
    scene.conclude()
