"""Summing an image file's device memory while a restoring proxy starts.

A restoring proxy (DMTCP's restart, NVPROXY_RECOVER) can pin no bounce slot and copy nothing before its CUDA
context exists: cuInit and the context take longer than the proxy's imports, so the restore itself waits for
the driver.  Checking an image's sums needs no driver, and the sums are what bounds the load once it runs: readers
that also sum are markedly slower than readers that only fill slots (benchmarks/probes/image_read.c).  So threads
of their own sum the chunks from the moment the proxy has read the image's header until the load's copies may go
(its readers only fill slots before), and the readers only read the chunks they found right by the time they reach
them (a small image is summed whole in that time, a large one in part).  They run at a lower priority so as not
to slow the context or the imports, which every restore waits for.  NVPROXY_EARLY_CHECK=0 leaves the sums to the
load; =load stops the threads as the load begins (for an A/B).
"""

from __future__ import annotations

import os
from typing import Any

from . import fileload
from .checksum import READ_PIECE
from .image import ImageError, region_chunks

# (the proxy's main thread imports and the driver makes the context meanwhile: leave them a core each)
THREADS = max(1, min(16, (os.cpu_count() or 4) - 3))


def file_chunks(header: dict[str, Any]) -> list[tuple[int, int, int]]:
    """(file offset, size, checksum) of every chunk of device memory and module variables, in the image's order."""
    out: list[tuple[int, int, int]] = []
    for r in header.get("regions", []):
        if r.get("kind") not in ("mem", "var"):
            continue
        parts, crcs = region_chunks(int(r["size"])), r.get("crcs", [])
        if len(parts) == len(crcs):  # (else the load names the damage)
            out.extend((int(r["offset"]) + off, n, int(crc)) for (off, n), crc in zip(parts, crcs, strict=True))
    return out


def start(path: str, header: dict[str, Any]) -> fileload.Check | None:
    """Begins the check of path's chunks; None where it is turned off, there is nothing to check, or the file
    cannot be opened again (the restore says why)."""
    if (os.environ.get("NVPROXY_EARLY_CHECK", "1") == "0" or header.get("broken")
            or os.environ.get("NVPROXY_RESTORE_READ") == "map"):  # (restore.read_mode: that path sums as it maps)
        return None
    chunks = file_chunks(header)
    if not chunks:
        return None
    try:
        return fileload.Check(path, chunks, THREADS, READ_PIECE)
    except (OSError, ImageError):
        return None
