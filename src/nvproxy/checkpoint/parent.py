"""The earlier image an incremental checkpoint builds on: the last image this proxy wrote into the same directory,
if it is still there and still that image (its id).  A mapping no request may have written since that image's cut
(reach.py) is taken from its file, by copy_file_range (file to file, in the kernel; a reflink where the file system
can), and not copied from the device: so every image stays whole, restored without its parent."""

from __future__ import annotations

import os
from typing import Any

from .image import ImageError, read_header, region_chunks
from .reach import Reach


class Parent:
    def __init__(self, path: str, fd: int, header: dict[str, Any], cut: int, reach: Reach, verify: bool) -> None:
        self.path, self.fd, self.id, self.cut, self.reach, self.verify = path, fd, header["id"], cut, reach, verify
        self.mem = {r["va"]: r for r in header["regions"] if r["kind"] == "mem"}

    def _same_place(self, r: dict[str, Any]) -> dict[str, Any] | None:
        p = self.mem.get(r["va"]) if r["kind"] == "mem" else None
        return p if p is not None and p["size"] == r["size"] and p["dev"] == r["dev"] else None

    def takes(self, r: dict[str, Any], reuse: list[tuple[int, int, int]]) -> bool:
        """Is region r (of the new image) unchanged since the parent?  Then it is listed in reuse, with the
        parent's checksums, and not copied from the device (never while verifying: everything is copied)."""
        p = self._same_place(r)
        if self.verify or p is None or self.reach.changed_since(self.cut, r["va"]):
            return False
        r["crcs"] = list(p["crcs"])
        reuse.append((r["offset"], p["offset"], r["size"]))
        return True

    def verified(self, copied: list[dict[str, Any]], reuse: list[tuple[int, int, int]]) -> list[int]:
        """While verifying: the copied regions' chunks whose checksums equal the parent's are taken from its file;
        returns the addresses of those that changed although the tracking said they could not have."""
        missed = []
        for r in copied if self.verify else ():
            p = self._same_place(r)
            if p is None:
                continue
            same = [(c, n) for k, (c, n) in enumerate(region_chunks(r["size"])) if p["crcs"][k] == r["crcs"][k]]
            reuse += [(r["offset"] + c, p["offset"] + c, n) for c, n in same]
            if len(same) < len(r["crcs"]) and not self.reach.changed_since(self.cut, r["va"]):
                missed.append(r["va"])
        return missed

    def close(self) -> None:
        os.close(self.fd)


def find(reach: Reach, path: str, verify: bool) -> tuple[Parent | None, str]:
    """(the parent for an image at path, or None with why the image is whole)."""
    rec = reach.images.get(os.path.dirname(path))
    if rec is None:
        return None, "no earlier image of this process in that directory: the image is whole"
    try:
        fd, header = read_header(rec["path"])
    except FileNotFoundError:
        return None, f"the earlier image {rec['path']} is gone: the image is whole"
    except (OSError, ImageError) as e:
        return None, f"the earlier image cannot be used ({e}): the image is whole"
    if header.get("id") != rec["id"]:
        os.close(fd)
        return None, f"{rec['path']} is no longer the image this process wrote there: the image is whole"
    return Parent(rec["path"], fd, header, rec["cut"], reach, verify), ""
