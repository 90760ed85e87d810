"""The math libraries' calls (NVP_OP_LIB_CALL): executed against the real library by libs/state.py."""

from __future__ import annotations

import os
import struct
import sys
import weakref
from typing import Any

from ... import wire
from ...libs import state as libstate
from . import graphs

# the proxy's C fast path makes calls of functions that ran here once (NVPROXY_LIB_FAST=0: never)
FAST = os.environ.get("NVPROXY_LIB_FAST", "1") != "0"
# per channel without a C side: its posted calls that failed, per library (status, function id)
_failed: weakref.WeakKeyDictionary[Any, dict[int, tuple[int, int]]] = weakref.WeakKeyDictionary()


def LIB_CALL(p: Any, ch: Any, a: tuple[int, ...], payload: bytes) -> tuple[tuple[int, ...], bytes] | None:
    ls = libstate.of(p.state)
    fid, hostmask, out_cap, posted = a[0], a[1], a[2], a[3]
    if fid >= len(ls.spec.funcs):
        print(f"nvproxy: library call {fid} unknown to this proxy", file=sys.stderr)
        return (0xFFFFFFFF, 0, 0), b""
    f = ls.spec.func(fid)
    if f.retkind == "string":
        out_cap = max(out_cap, 1024)
    log = _capture(p, ch, ls, f, payload) if p.state.captures else None
    # (a call into a stream capture changes no library state that a restore makes again: the capture's log makes it
    # again, with the capture)
    out = ls.run(ch, ch.dev, fid, hostmask, payload, out_cap, lambda w: p.backend.handle_value(p.stream(ch, w)),
                 record=log is None, fast=FAST and p.fast is not None)
    if log is not None and out.ran:
        log.calls.append((wire.NVP_OP_LIB_CALL, a, payload))
    ret = out.ret & 0xFFFFFFFFFFFFFFFF
    lib = ls.lib_number[f.lib]
    if posted:
        if f.retkind == "status" and out.ret != 0:
            print(f"nvproxy: {f.name} returned status {out.ret} after it had returned (it was posted); the "
                  f"thread's next call of its library that waits reports it", file=sys.stderr)
            _note_failure(ch, lib, out.ret, fid)
        return None
    earlier, efid = _take_failure(ch, lib) if f.retkind == "status" else (0, 0)
    return (ret, earlier & 0xFFFFFFFF, efid), out.out


def _note_failure(ch: Any, lib: int, status: int, fid: int) -> None:
    """A posted call of library lib failed: kept (the first) for the thread's next waited call of lib, in the
    channel's C side where it has one (the C fast path reports it there too)."""
    fc = ch.fast
    if fc is None:
        _failed.setdefault(ch, {}).setdefault(lib, (status, fid))
    elif not fc.lib_failed[lib]:
        fc.lib_failed[lib], fc.lib_failed_fid[lib] = status, fid


def _take_failure(ch: Any, lib: int) -> tuple[int, int]:
    """The failed posted call of library lib kept for this waited call (0, 0: none), forgotten."""
    fc = ch.fast
    if fc is None:
        return _failed.get(ch, {}).pop(lib, (0, 0))
    status, fid = fc.lib_failed[lib], fc.lib_failed_fid[lib]
    fc.lib_failed[lib] = fc.lib_failed_fid[lib] = 0
    return status, fid


def _capture(p: Any, ch: Any, ls: Any, f: Any, payload: bytes) -> Any:
    """The capture log of the stream the call works on, where that stream is being captured (its stream parameter,
    or the stream its handle was given)."""
    n = len(f.params)
    if f.how != "forward" or len(payload) < 8 * n:
        return None
    slots = struct.unpack_from(f"<{n}Q", payload)
    streams = [slots[q.index] for q in f.params if q.role == "stream"]
    if not streams and f.owner >= 0 and f.params[f.owner].role == "handle":
        h = ls.handles.get((f.params[f.owner].kind, slots[f.owner]))
        streams = [h.stream] if h is not None else []
    for w in streams:
        try:
            s = p.stream(ch, w)
        except Exception:
            return None
        status, cid = p.backend.capture_status(s)
        if status == graphs.CAPTURE_ACTIVE:
            return p.state.captures.get(cid)
    return None
