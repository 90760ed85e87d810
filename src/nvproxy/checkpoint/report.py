"""What `nvproxy checkpoint --incremental` says about an image (cli.py, the bench)."""

from __future__ import annotations

from typing import Any


def incremental_line(s: dict[str, Any]) -> str:
    """One line: the device memory copied against the whole, what came from the earlier image, what was missed."""
    total, written, reused = s["device_bytes"], s.get("written_bytes", s["device_bytes"]), s.get("reused_bytes", 0)
    share = 100.0 * written / total if total else 0.0
    line = (f"incremental: {written >> 20} of {total >> 20} MiB written from the device ({share:.1f}%); "
            f"{reused >> 20} MiB taken from {s['parent']}" if s.get("parent") else
            f"incremental: no earlier image to build on; {written >> 20} of {total >> 20} MiB written")
    if s.get("missed"):
        line += (f"; {len(s['missed'])} mapping(s) changed that write tracking had not marked "
                 f"(first at {s['missed'][0]:#x}): written from the device")
    return line
