"""Images a restore must refuse: truncated, corrupted, owned by another user, of another format.  The restore is a
recovery (NVPROXY_RECOVER) of a program whose proxy was killed after the checkpoint."""

from __future__ import annotations

import json
import os
import signal
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import pytest

from nvproxy.checkpoint.image import PREFIX

from .scene import Snapshot, clear_error, cut_short, said

pytestmark = pytest.mark.faults
BACKENDS = ["sim", pytest.param("gpu", marks=pytest.mark.gpu)]
ARGS = ("pinned", "8", "3")  # copy_loop
NOBODY = 65534


def truncate(size: Callable[[int], int]) -> Callable[[Path], None]:
    return lambda p: os.truncate(p, size(p.stat().st_size))


def flip(where: Callable[[Path, dict], int]) -> Callable[[Path], None]:
    def damage(p: Path) -> None:
        with open(p, "r+b") as f:
            at = where(p, header_of(f.read()))
            f.seek(at)
            b = f.read(1)
            f.seek(at)
            f.write(bytes([b[0] ^ 0xFF]))
    return damage


def header_of(data: bytes) -> dict:
    _magic, off, n = PREFIX.unpack_from(data)
    return dict(json.loads(data[off : off + n]), _at=off, _len=n)


def rewrite(change: dict) -> Callable[[Path], None]:
    """The header written again with change (its length in the prefix too)."""
    def damage(p: Path) -> None:
        data = p.read_bytes()
        h = header_of(data)
        at = h.pop("_at")
        h.pop("_len")
        body = json.dumps(dict(h, **change)).encode()
        p.write_bytes(PREFIX.pack(data[:8], at, len(body)) + data[PREFIX.size : at] + body)
    return damage


def first_region(_p: Path, h: dict) -> int:
    return next(r["offset"] for r in h["regions"] if r["size"] >= 4096) + 1234


@dataclass(frozen=True)
class Damage:
    """What is done to the image, and the words (any of them) the refusal must say besides its path."""

    do: Callable[[Path], None]
    says: tuple[str, ...]
    read: str = ""  # NVPROXY_RESTORE_READ
    only_root: bool = False


TRUNCATED = ("truncated", "short", "incomplete", "ends at", "damaged")
CORRUPTED = ("checksum", "damaged", "corrupt")
DAMAGES = {
    "truncated-to-prefix": Damage(truncate(lambda n: PREFIX.size), TRUNCATED),
    "truncated-header": Damage(truncate(lambda n: n - 7), TRUNCATED),
    "empty": Damage(truncate(lambda n: 0), (*TRUNCATED, "empty", "not an nvproxy checkpoint image")),
    "flipped-data": Damage(flip(first_region), CORRUPTED),
    "flipped-data-map": Damage(flip(first_region), CORRUPTED, read="map"),
    "flipped-header": Damage(flip(lambda p, h: h["_at"] + h["_len"] // 2), CORRUPTED),
    "bad-magic": Damage(flip(lambda p, h: 0), ("not an nvproxy checkpoint image",)),
    "foreign-owner": Damage(lambda p: os.chown(p, NOBODY, NOBODY), ("owned by", "owner", "uid"), only_root=True),
    "format-99": Damage(rewrite({"format": 99}), ("format", "version")),
    "checksum-md5": Damage(rewrite({"checksum": "md5"}), ("md5",)),
}


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("damage", DAMAGES)
def test_a_damaged_image_is_refused(scene, fault_app, reference, backend: str, damage: str) -> None:
    """The new proxy refuses the image with a line naming it and what is wrong; the program's next call fails with
    cudaErrorDevicesUnavailable after what it printed before; the image stays as the damage left it (a refusal
    neither mends nor removes it); nothing of either proxy is left."""
    d = DAMAGES[damage]
    if d.only_root and os.getuid() != 0:
        pytest.skip("only root can give an image to another user")
    exe = fault_app("copy_loop")
    ref = reference(exe, *ARGS, backend=backend)
    image = scene.image_dir() / "damaged.img"
    env = {"NVPROXY_RECOVER": str(image), **({"NVPROXY_RESTORE_READ": d.read} if d.read else {})}
    app = scene.start(exe, *ARGS, "gated", env=env, stdin=True)
    app.say()
    app.line("round 0:")
    r = scene.nvproxy("checkpoint", app.pid, "-o", image)
    assert r.rc == 0, "\n".join(r.out + r.err)
    d.do(image)
    damaged = Snapshot.of(image)
    os.kill(scene.proxy_of(app), signal.SIGKILL)
    app.say()
    restored = app.reaches("round 1:", ref.bound)
    app.halt()
    app.exit(ref.bound, "the program's end after a refused recovery")
    assert not restored, "the recovery restored the damaged image:\n" + "\n".join(said(app))
    clear_error(app, str(image), d.says)
    cut_short(app, ref.out)
    damaged.intact()
    scene.conclude()
