"""Graphs made by stream capture.

The driver captures as usual (the proxy's streams are real streams); the proxy
also keeps the calls each capture took (state.CaptureLog), which is what a
restore replays into a new capture to make the same graph again: same kernels,
same device addresses, same host callbacks.  While any capture is on, the C
fast path hands every call to Python so that none escapes the log."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from ... import wire
from ...errors import INVALID_VALUE, CudaError
from ..state import CaptureLog, GraphRec

CAPTURE_ACTIVE = 1  # cudaStreamCaptureStatusActive
# stream work a capture takes, and which argument is its stream
CAPTURABLE = {wire.NVP_OP_LAUNCH: 5, wire.NVP_OP_MEMCPY: 3, wire.NVP_OP_MEMCPY_2D: 6, wire.NVP_OP_MEMSET: 3,
              wire.NVP_OP_MEMSET_2D: 5, wire.NVP_OP_EVENT_RECORD: 1, wire.NVP_OP_STREAM_WAIT_EVENT: 0,
              wire.NVP_OP_HOST_FUNC: 0, wire.NVP_OP_GRAPH_LAUNCH: 1}


def CAPTURE_BEGIN(p: Any, ch: Any, a: tuple[int, ...], payload: bytes) -> None:
    s = p.stream(ch, a[0])
    p.backend.begin_capture(s, a[1])
    _status, cid = p.backend.capture_status(s)
    p.state.captures[cid] = CaptureLog(ch.dev, a[0], a[1])
    p.captures_changed()


def CAPTURE_END(p: Any, ch: Any, a: tuple[int, ...], payload: bytes) -> None:
    s = p.stream(ch, a[0])
    status, cid = p.backend.capture_status(s)
    if status != CAPTURE_ACTIVE:  # an invalidated capture has no id: find it by the stream that began it
        cid = next((k for k, c in p.state.captures.items() if c.origin == a[0] and c.dev == ch.dev), None)
    log = p.state.captures.pop(cid, None) if status else None
    p.captures_changed()
    g = p.backend.end_capture(s)  # the driver's verdict: not capturing, invalidated, unjoined...
    p.state.graph_order += 1
    p.state.graphs[a[1]] = GraphRec(log or CaptureLog(ch.dev, a[0], 0), g, p.state.graph_order)


def CAPTURE_STATUS(p: Any, ch: Any, a: tuple[int, ...], payload: bytes) -> tuple[tuple[int, ...], bytes]:
    status, cid = p.backend.capture_status(p.stream(ch, a[0]))
    return (status, cid), b""


def GRAPH_INSTANTIATE(p: Any, ch: Any, a: tuple[int, ...], payload: bytes) -> None:
    g = p.state.graphs.get(a[1])
    if g is None:
        raise CudaError(INVALID_VALUE, f"graph {a[1]}")
    p.backend.activate(g.log.dev)
    x = p.backend.graph_instantiate(g.handle, a[2])
    p.state.graph_order += 1
    p.state.graph_execs[a[0]] = GraphRec(g.log, x, p.state.graph_order, a[2])


def GRAPH_LAUNCH(p: Any, ch: Any, a: tuple[int, ...], payload: bytes) -> None:
    x = p.state.graph_execs.get(a[0])
    if x is None:
        raise CudaError(INVALID_VALUE, f"executable graph {a[0]}")
    p.backend.graph_launch(x.handle, p.stream(ch, a[1]), bool(a[2]))
    if p.fast is not None:  # later launches run in C
        p.fast.learn_graph_exec(a[0], x.handle, p.backend.handle_value)


def GRAPH_DESTROY(p: Any, ch: Any, a: tuple[int, ...], payload: bytes) -> None:
    table = p.state.graph_execs if a[1] else p.state.graphs
    rec = table.pop(a[0], None)
    if rec is None:
        raise CudaError(INVALID_VALUE, f"graph {a[0]}")
    p.forget()  # (C may know the executable graph)
    (p.backend.graph_exec_destroy if a[1] else p.backend.graph_destroy)(rec.handle)


# ---- checkpoint and restore ----
def describe(state: Any) -> dict[str, Any]:
    return {"graphs": {str(k): dict(g.log.to_json(), order=g.order) for k, g in state.graphs.items()},
            "graph_execs": {str(k): dict(x.log.to_json(), order=x.order, flags=x.flags)
                            for k, x in state.graph_execs.items()},
            "captures": [c.to_json() for c in state.captures.values()]}


@dataclass
class _ReplayChannel:
    """What a handler needs of a channel, for calls replayed by a restore."""

    dev: int
    per_thread: dict[int, Any] = field(default_factory=dict)
    fast: Any = None
    staging: Any = None
    copy_events: list[Any] = field(default_factory=list)
    copy_event_next: int = 0


def _replay(p: Any, log: CaptureLog) -> Any:
    """Begin a capture on the log's stream and make its calls again; returns the stream."""
    ch = _ReplayChannel(log.dev)
    p.backend.activate(log.dev)
    s = p.stream(ch, log.origin)
    p.backend.begin_capture(s, log.mode)
    _status, cid = p.backend.capture_status(s)
    p.state.captures[cid] = CaptureLog(log.dev, log.origin, log.mode)  # (handlers see a capture is on)
    try:
        for op, a, payload in log.calls:
            p.table[op](ch, a, payload)
    finally:
        p.state.captures.pop(cid, None)
    return s


def restore(p: Any, desc: dict[str, Any]) -> None:
    """Make every graph, executable graph and capture in progress of an image again."""
    items = [(g["order"], "graph", int(k), g) for k, g in desc.get("graphs", {}).items()]
    items += [(x["order"], "exec", int(k), x) for k, x in desc.get("graph_execs", {}).items()]
    for order, kind, key, d in sorted(items):
        log = CaptureLog.from_json(d)
        g = p.backend.end_capture(_replay(p, log))
        if kind == "graph":
            p.state.graphs[key] = GraphRec(log, g, order)
        else:
            p.state.graph_execs[key] = GraphRec(log, p.backend.graph_instantiate(g, d["flags"]), order, d["flags"])
            p.backend.graph_destroy(g)
        p.state.graph_order = max(p.state.graph_order, order)
    for d in desc.get("captures", []):  # a capture that was going on at the checkpoint goes on
        log = CaptureLog.from_json(d)
        _status, cid = p.backend.capture_status(_replay(p, log))
        p.state.captures[cid] = log
    p.captures_changed()
