"""The math libraries' calls (NVP_OP_LIB_CALL): executed against the real library by libs/state.py."""

from __future__ import annotations

import sys
import weakref
from typing import Any

from ...libs import state as libstate

# per channel: an earlier posted call that failed (status, function id), for the thread's next reply
_failed: weakref.WeakKeyDictionary[Any, tuple[int, int]] = weakref.WeakKeyDictionary()


def LIB_CALL(p: Any, ch: Any, a: tuple[int, ...], payload: bytes) -> tuple[tuple[int, ...], bytes] | None:
    ls = libstate.of(p.state)
    fid, hostmask, out_cap, posted = a[0], a[1], a[2], a[3]
    if fid >= len(ls.spec.funcs):
        print(f"nvproxy: library call {fid} unknown to this proxy", file=sys.stderr)
        return (0xFFFFFFFF, 0, 0), b""
    f = ls.spec.func(fid)
    if f.retkind == "string":
        out_cap = max(out_cap, 1024)
    out = ls.run(ch, ch.dev, fid, hostmask, payload, out_cap, lambda w: p.backend.handle_value(p.stream(ch, w)))
    ret = out.ret & 0xFFFFFFFFFFFFFFFF
    if posted:
        if f.retkind == "status" and out.ret != 0:
            print(f"nvproxy: {f.name} returned status {out.ret} after it had returned (it was posted); the "
                  f"thread's next {f.lib} call that waits reports it", file=sys.stderr)
            _failed.setdefault(ch, (out.ret, fid))
        return None
    earlier, efid = _failed.pop(ch, (0, 0))
    return (ret, earlier & 0xFFFFFFFF, efid), out.out
