"""What `nvproxy checkpoint --incremental` and `--concurrent` say about an image (cli.py, the bench)."""

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


def concurrent_line(s: dict[str, Any]) -> str:
    """One line: how the device memory was saved, how long the application was stopped, how long until complete."""
    c = s["concurrent"]
    mib = {k: c[k] >> 20 for k in ("snapshot_bytes", "cow_bytes", "background_bytes", "stw_bytes")}
    return (f"concurrent ({', '.join(c['methods']) or 'nothing to copy'}): the application was stopped "
            f"{s['stopped_s'] * 1e3:.1f} ms; {mib['snapshot_bytes']} MiB snapshotted on the device, "
            f"{mib['cow_bytes']} MiB saved before a write, {mib['background_bytes']} MiB saved while it ran, "
            f"{mib['stw_bytes']} MiB before it went on; requests waited {c['gate_s'] * 1e3:.1f} ms; "
            f"complete after {s['seconds']:.3f} s")
