"""CUDA graphs, made by stream capture or node by node.

The driver captures as usual (the proxy's streams are real streams); the proxy
also keeps the calls each capture took (state.CaptureLog), which is what a
restore replays into a new capture to make the same graph again: same kernels,
same device addresses, same host callbacks.  While any capture is on, the C
fast path hands every call to Python so that none escapes the log.  A graph
built node by node keeps its node additions (GraphRec.built), an executable
graph those of its graph when it was instantiated and its kernel-node updates;
a restore makes them again in that order."""

from __future__ import annotations

import json
import struct
from dataclasses import dataclass, field
from typing import Any

from ... import wire
from ...checkpoint.image import ImageError
from ...errors import ILLEGAL_STATE, INVALID_VALUE, CudaError
from .. import managed_vars
from ..state import CaptureLog, GraphRec

CAPTURE_ACTIVE = 1  # cudaStreamCaptureStatusActive
# stream work a capture takes, and which argument is its stream
CAPTURABLE = {wire.NVP_OP_LAUNCH: 5, wire.NVP_OP_MEMCPY: 3, wire.NVP_OP_MEMCPY_2D: 6, wire.NVP_OP_MEMSET: 3,
              wire.NVP_OP_MEMSET_2D: 5, wire.NVP_OP_EVENT_RECORD: 1, wire.NVP_OP_STREAM_WAIT_EVENT: 0,
              wire.NVP_OP_HOST_FUNC: 0, wire.NVP_OP_GRAPH_LAUNCH: 1, wire.NVP_OP_COPY_3D: 0,
              wire.NVP_OP_DRV_MEMSET: 6}
EVENT_ARG = {wire.NVP_OP_EVENT_RECORD: 0, wire.NVP_OP_STREAM_WAIT_EVENT: 1}  # (which argument is the event)
NON_BLOCKING = 1  # cudaStreamNonBlocking
PER_THREAD = 2  # the wire id of the calling thread's per-thread default stream


def CAPTURE_BEGIN(p: Any, ch: Any, a: tuple[int, ...], payload: bytes) -> None:
    s = p.stream(ch, a[0])
    fences = _fences(p, ch, a[0], s)
    try:
        p.backend.begin_capture(s, a[1])
    except CudaError:
        _drop(p, fences)
        raise
    _status, cid = p.backend.capture_status(s)
    p.state.captures[cid] = CaptureLog(ch.dev, a[0], a[1], fences=fences)
    p.captures_changed()


def CAPTURE_TO_GRAPH(p: Any, ch: Any, a: tuple[int, ...], payload: bytes) -> None:
    """cudaStreamBeginCaptureToGraph: what the capture takes goes into graph a[2], after nodes of it."""
    s, g = p.stream(ch, a[0]), _graph(p, a[2])
    ids = _ids(payload, a[3])
    fences = _fences(p, ch, a[0], s)
    try:
        p.backend.begin_capture_to_graph(s, g.handle, _nodes_of(g.nodes, ids), a[1])
    except CudaError:
        _drop(p, fences)
        raise
    _status, cid = p.backend.capture_status(s)
    p.state.captures[cid] = CaptureLog(ch.dev, a[0], a[1], graph_id=a[2], target=a[2], nodes=g.nodes, deps=ids,
                                       fences=fences)
    p.captures_changed()


# ---- checkpoints while captures are on ----
# The driver refuses, and invalidates the captures for, a synchronisation of the context, of a capturing stream, of
# the legacy stream while a blocking stream captures (it encompasses them) and of an event recorded in a capture.
# So a stream's work from before it was taken into a capture is marked by an event (a fence) as it is taken, and a
# checkpoint waits for those and synchronises only the streams that are not capturing.

def _blocking(p: Any, wire_stream: int) -> bool:
    """Does the program's stream synchronise with the legacy stream (not made cudaStreamNonBlocking)?"""
    return wire_stream == PER_THREAD or not p.state.stream_args.get(wire_stream, (0, 0))[0] & NON_BLOCKING


def _legacy_captured(p: Any, dev: int) -> bool:
    """Is a blocking stream of dev capturing (the legacy stream may not be used then)?"""
    be = p.backend
    return any(be.capture_status(s)[0] for s in p._streams_of(dev, blocking_only=True))


def _fences(p: Any, ch: Any, wire_stream: int, s: Any) -> list[Any]:
    """Fences for stream s as a capture is about to take it: its work so far, and where it is a blocking stream and
    the legacy stream still has work (which nothing may wait for once s captures), the legacy stream's.  The legacy
    fence is recorded only then: as any work on the legacy stream, it waits for the blocking streams' work."""
    be, dev = p.backend, ch.dev
    with be.capture_relaxed():
        fences = [_mark(be, dev, s)]
        legacy = be.legacy_stream(dev)
        if _blocking(p, wire_stream) and not _legacy_captured(p, dev) and not be.stream_query(legacy):
            fences.append(_mark(be, dev, legacy))
    return fences


def _mark(be: Any, dev: int, s: Any) -> Any:
    e = be.event_create(dev, 2)  # (cudaEventDisableTiming)
    be.event_record(e, s, 0)
    return e


def _drop(p: Any, fences: list[Any]) -> None:
    for e in fences:
        p.backend.event_destroy(e)


def fenced(p: Any, op: int, fn: Any) -> Any:
    """The handler of op while captures are on: a stream that joins a capture (cudaStreamWaitEvent on an event
    recorded in one) gets its fences first."""
    if op != wire.NVP_OP_STREAM_WAIT_EVENT:
        return fn

    def wait_event(ch: Any, a: tuple[int, ...], payload: bytes) -> Any:
        s = p.stream(ch, a[0])
        if p.capturing(s):
            return fn(ch, a, payload)
        fences = _fences(p, ch, a[0], s)
        try:
            result = fn(ch, a, payload)
        finally:
            _status, _cid, log = _active_log(p, s)
            if log is not None:
                log.fences += fences
            else:
                _drop(p, fences)
        return result

    return wait_event


def drain(p: Any, dev: int) -> None:
    """Let dev's work finish while captures are on there: its streams that are not capturing are synchronised, the
    legacy stream too unless a blocking stream captures, and the captures' fences are waited for; every call in
    relaxed mode (the proxy's thread began the captures: in global or thread-local mode they forbid it more)."""
    be = p.backend
    with be.capture_relaxed():
        for s in p._streams_of(dev, blocking_only=False):
            if not be.capture_status(s)[0]:
                be.stream_sync(s)
        if not _legacy_captured(p, dev):
            be.stream_sync(be.legacy_stream(dev))
        for log in list(p.state.captures.values()):
            if log.dev == dev:
                for e in log.fences:
                    be.event_sync(e)


def captured_events(state: Any) -> set[int]:
    """The events recorded in captures still on: they have no time to give (asking invalidates the capture)."""
    return {a[EVENT_ARG[op]] for log in state.captures.values() for op, a, _pl in log.calls
            if op == wire.NVP_OP_EVENT_RECORD}


def CAPTURE_END(p: Any, ch: Any, a: tuple[int, ...], payload: bytes) -> tuple[tuple[int, ...], bytes]:
    """Replies with the graph's wire id: a[1] (new), or the one it already had."""
    s = p.stream(ch, a[0])
    status, cid = p.backend.capture_status(s)
    if status != CAPTURE_ACTIVE:  # an invalidated capture has no id: find it by the stream that began it
        cid = next((k for k, c in p.state.captures.items() if c.origin == a[0] and c.dev == ch.dev), None)
    log = p.state.captures.get(cid) if status else None
    if len(a) > 2 and a[2] and (log is None or not log.target):
        raise CudaError(INVALID_VALUE, "cudaStreamEndCapture without a place for the new graph")
    try:
        g = p.backend.end_capture(s)  # the driver's verdict: not capturing, invalidated, unjoined...
    except CudaError:
        if log is not None and p.backend.capture_status(s)[0] == 0:  # (ended all the same: its graph is gone)
            _end_log(p, cid, log, failed=True)
        raise
    _end_log(p, cid, log, failed=False)
    if log is not None and log.target:
        t = p.state.graphs.get(log.target)
        if t is not None:  # (a restore captures into it again, in the same place among its node additions)
            t.hidden.update(log.hidden)
            args = (log.target, log.origin, log.mode, len(log.deps))
            t.built.append((wire.NVP_OP_CAPTURE_TO_GRAPH, args, json.dumps(log.to_json()).encode()))
        return (log.target,), b""
    p.state.graph_order += 1
    gid = log.graph_id if log is not None and log.graph_id else a[1]
    rec = GraphRec(log or CaptureLog(ch.dev, a[0], 0), g, p.state.graph_order, nodes=log.nodes if log else {},
                   hidden=log.hidden if log else {})
    p.state.graphs[gid] = rec
    for body in p.state.graphs.values():  # (node additions to its conditional nodes' bodies go with it from now)
        if body.body_of == gid:
            body.built, body.nodes, body.hidden = rec.built, rec.nodes, rec.hidden
    return (gid,), b""


def _end_log(p: Any, cid: Any, log: CaptureLog | None, failed: bool) -> None:
    p.state.captures.pop(cid, None)
    p.captures_changed()
    if log is not None:
        _drop(p, log.fences)
        log.fences.clear()
    if failed and log is not None and log.graph_id and not log.target:  # (cudaStreamGetCaptureInfo's graph)
        for k in [k for k, r in p.state.graphs.items() if k == log.graph_id or r.body_of == log.graph_id]:
            del p.state.graphs[k]


def _active_log(p: Any, s: Any) -> tuple[int, int, CaptureLog | None]:
    status, cid = p.backend.capture_status(s)
    return status, cid, p.state.captures.get(cid) if status == CAPTURE_ACTIVE else None


def CAPTURE_INFO(p: Any, ch: Any, a: tuple[int, ...], payload: bytes) -> tuple[tuple[int, ...], bytes]:
    """cudaStreamGetCaptureInfo's graph and dependencies: the graph gets wire id a[1] unless it has one, and
    dependencies without one get the ids offered, in order.  Kept in the capture's log when it named anything
    (a restore names them again at the same point)."""
    s = p.stream(ch, a[0])
    status, cid, log = _active_log(p, s)
    if log is None:
        return (status, cid, 0, 0), b""
    fresh = list(struct.unpack_from(f"<{min(a[2], len(payload) // 4)}I", payload))
    offered, new_graph, be = len(fresh), not log.graph_id, p.backend
    if new_graph:
        log.graph_id = a[1]
        p.state.graphs[a[1]] = GraphRec(log, be.capture_graph(s), 0, nodes=log.nodes, hidden=log.hidden)
    known = {be.node_key(n): i for i, n in log.nodes.items()}
    ids = []
    for n in be.capture_deps(s):
        nid = known.get(be.node_key(n))
        if nid is None:
            if not fresh:
                raise CudaError(INVALID_VALUE, f"a capture with more than {offered} new dependencies at once")
            nid = known[be.node_key(n)] = fresh.pop(0)
            log.nodes[nid] = n
        ids.append(nid)
    used = offered - len(fresh)
    if new_graph or used:
        log.calls.append((wire.NVP_OP_CAPTURE_INFO, (a[0], a[1], used), payload[: 4 * used]))
    return (status, cid, log.graph_id, len(ids)), struct.pack(f"<{len(ids)}I", *ids)


def CAPTURE_DEPS(p: Any, ch: Any, a: tuple[int, ...], payload: bytes) -> None:
    """cudaStreamUpdateCaptureDependencies, with nodes of the capture's graph."""
    s = p.stream(ch, a[0])
    _status, _cid, log = _active_log(p, s)
    if log is None:
        raise CudaError(ILLEGAL_STATE, "the stream is not being captured")
    p.backend.update_capture_deps(s, _nodes_of(log.nodes, _ids(payload, a[2])), a[1])
    log.calls.append((wire.NVP_OP_CAPTURE_DEPS, a, payload))


def _ids(payload: bytes, n: int) -> list[int]:
    if n > 4096 or len(payload) < 4 * n:
        raise CudaError(INVALID_VALUE, "graph node ids")
    return list(struct.unpack_from(f"<{n}I", payload))


def _nodes_of(nodes: dict[int, Any], ids: list[int]) -> list[Any]:
    try:
        return [nodes[i] for i in ids]
    except KeyError:
        raise CudaError(INVALID_VALUE, "a dependency is not a node of this graph") from None


def CAPTURE_STATUS(p: Any, ch: Any, a: tuple[int, ...], payload: bytes) -> tuple[tuple[int, ...], bytes]:
    status, cid = p.backend.capture_status(p.stream(ch, a[0]))
    return (status, cid), b""


def GRAPH_INSTANTIATE(p: Any, ch: Any, a: tuple[int, ...], payload: bytes) -> None:
    g = _graph(p, a[1])
    p.backend.activate(g.log.dev)
    x = p.backend.graph_instantiate(g.handle, a[2])
    p.state.graph_order += 1
    p.state.graph_execs[a[0]] = GraphRec(g.log, x, p.state.graph_order, a[2], g.created, list(g.built), dict(g.nodes))


def _graph(p: Any, wire_id: int) -> Any:
    g = p.state.graphs.get(wire_id)
    if g is None:
        raise CudaError(INVALID_VALUE, f"graph {wire_id}")
    return g


# ---- graphs built node by node ----
def GRAPH_CREATE(p: Any, ch: Any, a: tuple[int, ...], payload: bytes) -> None:
    p.state.graph_order += 1
    p.state.graphs[a[0]] = GraphRec(CaptureLog(ch.dev, 0, 0), p.backend.graph_create(ch.dev), p.state.graph_order,
                                    created=True)


def GRAPH_CLONE(p: Any, ch: Any, a: tuple[int, ...], payload: bytes) -> None:
    g = _graph(p, a[1])
    p.state.graph_order += 1
    # (the clone's nodes are the driver's: the application cannot name them through nvproxy)
    c = p.backend.graph_clone(g.handle)
    hidden = {p.backend.node_key(n): n for n in (p.backend.node_in_clone(h, c) for h in g.hidden.values())}
    p.state.graphs[a[0]] = GraphRec(g.log, c, p.state.graph_order, 0, g.created, list(g.built), hidden=hidden)


def GRAPH_ADD_NODE(p: Any, ch: Any, a: tuple[int, ...], payload: bytes) -> None:
    g = _graph(p, a[0])
    bodies: dict[int, Any] = {}
    node = g.nodes[a[1]] = _add_node(p, g.log.dev, g.handle, g.nodes, a, payload, bodies)
    if a[2] & wire.NVP_NODE_HIDDEN:
        _hidden_of(p, a[0], g)[p.backend.node_key(node)] = node
    if a[2] == wire.NVP_NODE_CHILD:  # (the node holds a copy of the child, which may go: keep how it was made)
        child = _graph(p, struct.unpack_from("<Q", payload, (4 * a[3] + 7) // 8 * 8)[0])
        payload += json.dumps(_snapshot(child)).encode()
    _calls_of(p, a[0], g).append((wire.NVP_OP_GRAPH_ADD_NODE, a, payload))
    for bid, handle in bodies.items():
        p.state.graphs[bid] = GraphRec(g.log, handle, g.order, 0, True, g.built, g.nodes, body_of=g.body_of or a[0],
                                       hidden=g.hidden)


def _hidden_of(p: Any, gid: int, g: GraphRec) -> dict[Any, Any]:
    for log in p.state.captures.values():
        if log.graph_id and log.graph_id in (gid, g.body_of):
            return log.hidden
    return g.hidden


def _calls_of(p: Any, gid: int, g: GraphRec) -> list[tuple[int, tuple[int, ...], bytes]]:
    """Where a call that adds to graph gid is kept: in the log of a capture making that graph (a restore makes
    it at the same point of the capture), else with the graph (a body graph's: with the graph at its top)."""
    for log in p.state.captures.values():
        if log.graph_id and log.graph_id in (gid, g.body_of):
            return log.calls
    return g.built


def _snapshot(g: GraphRec) -> dict[str, Any]:
    return dict(g.log.to_json(), created=g.created, built=_calls_json(g.built))


def GRAPH_COND_HANDLE(p: Any, ch: Any, a: tuple[int, ...], payload: bytes) -> tuple[tuple[int, ...], bytes]:
    """cudaGraphConditionalHandleCreate: kernels take the value as a parameter, so a restore must get it again
    (a capture's replay comes here with the value it must get)."""
    g = _graph(p, a[0])
    p.backend.activate(g.log.dev)
    value = p.backend.graph_cond_handle(g.handle, g.log.dev, a[1], a[2])
    if len(payload) == 8 and struct.unpack("<Q", payload)[0] != value:
        raise ImageError(f"a conditional handle came back as {value:#x}, not {payload.hex()} (kernels hold that)")
    _calls_of(p, a[0], g).append((wire.NVP_OP_GRAPH_COND_HANDLE, a, struct.pack("<Q", value)))
    return (value,), b""


def GRAPH_GET_NODES(p: Any, ch: Any, a: tuple[int, ...], payload: bytes) -> tuple[tuple[int, ...], bytes]:
    """cudaGraphGetNodes: every node of the graph, the ones it has no wire id for yet (captured or cloned
    graphs) named with the ids that came along; that naming is kept, so a restore names them again."""
    g, want = _graph(p, a[0]), a[1]
    if len(payload) < 4 * want:
        raise CudaError(INVALID_VALUE, "graph node ids")
    fresh = list(struct.unpack_from(f"<{want}I", payload))
    be = p.backend
    be.activate(g.log.dev)
    listed = _listed(p, g.handle, g.hidden)
    known = {be.node_key(n): i for i, n in g.nodes.items()}
    out, named = [], []
    for index, n in enumerate(listed[:want]):
        nid = known.get(be.node_key(n))
        if nid is None:
            nid = fresh.pop(0)
            g.nodes[nid] = n
            named.append((index, nid))
        out += [nid, be.graph_node_kind(g.handle, n)]
    if named:
        g.built.append((wire.NVP_OP_GRAPH_GET_NODES, (a[0], len(listed)), _pairs(named)))
    return (len(listed),), struct.pack(f"<{len(out)}I", *out)


def _pairs(named: list[tuple[int, int]]) -> bytes:
    return b"".join(struct.pack("<II", index, nid) for index, nid in named)


def _listed(p: Any, g: Any, hidden: dict[Any, Any]) -> list[Any]:
    """A graph's nodes as the application sees them (not nvproxy's own)."""
    return [n for n in p.backend.graph_nodes(g) if p.backend.node_key(n) not in hidden]


def _name_nodes(p: Any, g: Any, nodes: dict[int, Any], a: tuple[int, ...], payload: bytes,
                hidden: dict[Any, Any]) -> None:
    """A restore names a graph's nodes as GRAPH_GET_NODES did (the graph made the same way lists them the same)."""
    listed = _listed(p, g, hidden)
    if len(listed) != a[1]:
        raise CudaError(INVALID_VALUE, f"the graph made again has {len(listed)} nodes, not {a[1]}")
    for index, nid in struct.iter_unpack("<II", payload):
        nodes[nid] = listed[index]


def GRAPH_EXEC_KERNEL(p: Any, ch: Any, a: tuple[int, ...], payload: bytes) -> None:
    x = p.state.graph_execs.get(a[0])
    node = x.nodes.get(a[1]) if x is not None else None
    if node is None:
        raise CudaError(INVALID_VALUE, f"kernel node {a[1]} of executable graph {a[0]}")
    p.backend.activate(x.log.dev)
    p.backend.graph_exec_kernel(x.handle, node, *_kernel(p, x.log.dev, payload))
    _log_update(x, (wire.NVP_OP_GRAPH_EXEC_KERNEL, a, payload))


def GRAPH_EXEC_UPDATE(p: Any, ch: Any, a: tuple[int, ...], payload: bytes) -> tuple[tuple[int, ...], bytes]:
    x, g = p.state.graph_execs.get(a[0]), _graph(p, a[1])
    if x is None:
        raise CudaError(INVALID_VALUE, f"executable graph {a[0]}")
    p.backend.activate(x.log.dev)
    result = p.backend.graph_exec_update(x.handle, g.handle)
    if result == 0:  # a restore updates it again from the graph as it is now
        _log_update(x, (wire.NVP_OP_GRAPH_EXEC_UPDATE, a, json.dumps(_snapshot(g)).encode()))
        x.nodes.update(g.nodes)
    return (result,), b""


def _log_update(x: GraphRec, call: tuple[int, tuple[int, ...], bytes]) -> None:
    """Keep an executable graph's updates compact (a program may update a node before every launch): a whole-graph
    update supersedes every earlier one, a kernel-node update the earlier ones of that node since then."""
    op, a, _payload = call
    if op == wire.NVP_OP_GRAPH_EXEC_UPDATE:
        x.updates[:] = [call]
    else:
        x.updates[:] = [u for u in x.updates if u[0] != op or u[1][1] != a[1]] + [call]


def _kernel(p: Any, dev: int, body: bytes) -> tuple[Any, tuple[int, ...], tuple[int, ...], int, bytes]:
    if len(body) < 36:
        raise CudaError(INVALID_VALUE, "kernel node body")
    kid, gx, gy, gz, bx, by, bz, shmem, n = struct.unpack_from("<9I", body)
    if len(body) < 36 + n:
        raise CudaError(INVALID_VALUE, "kernel node parameters")
    return p.state.kernel(dev, kid), (gx, gy, gz), (bx, by, bz), shmem, body[36 : 36 + n]


def _add_node(p: Any, dev: int, g: Any, nodes: dict[int, Any], a: tuple[int, ...], payload: bytes,
              bodies: dict[int, Any]) -> Any:
    """The backend's new node of graph g for a GRAPH_ADD_NODE request (nodes: the graph's, by wire id;
    bodies: where a conditional node's body graphs go, by their wire ids)."""
    kind, ndeps = a[2] & ~wire.NVP_NODE_HIDDEN, a[3]
    dlen = (4 * ndeps + 7) // 8 * 8
    if len(payload) < dlen:
        raise CudaError(INVALID_VALUE, "graph node dependencies")
    deps = _nodes_of(nodes, _ids(payload, ndeps))
    body = payload[dlen:]
    be = p.backend
    be.activate(dev)
    if kind == wire.NVP_NODE_KERNEL:
        return be.graph_add_kernel(g, deps, *_kernel(p, dev, body))
    if kind == wire.NVP_NODE_MEMCPY and len(body) >= 72:
        dst, src, width, height, depth, dpitch, spitch, drows, srows = struct.unpack_from("<9Q", body)
        t = p.state.translate
        return be.graph_add_memcpy(g, deps, t(dst), t(src), width, height, depth, dpitch, spitch, drows, srows)
    if kind == wire.NVP_NODE_MEMSET and len(body) >= 40:
        dst, pitch, value, elsize, width, height = struct.unpack_from("<QQIIQQ", body)
        return be.graph_add_memset(g, deps, p.state.translate(dst), pitch, value, elsize, width, height)
    if kind == wire.NVP_NODE_HOST and len(body) >= 8:
        (cb_id,) = struct.unpack_from("<Q", body)
        return be.graph_add_host(g, deps, lambda status: p.server.run_callback(cb_id, status, True))
    if kind == wire.NVP_NODE_EMPTY:
        return be.graph_add_empty(g, deps)
    if kind in (wire.NVP_NODE_EVENT_RECORD, wire.NVP_NODE_EVENT_WAIT) and len(body) >= 8:
        return be.graph_add_event(g, deps, p.event(struct.unpack_from("<Q", body)[0]),
                                  kind == wire.NVP_NODE_EVENT_WAIT)
    if kind == wire.NVP_NODE_CHILD and len(body) >= 8:
        if len(body) == 8:
            return be.graph_add_child(g, deps, _graph(p, struct.unpack_from("<Q", body)[0]).handle)
        snap = json.loads(body[8:])  # (a restore: the child as it was when the node was added)
        child = _remake(p, CaptureLog.from_json(snap), snap)[0]
        try:
            be.activate(dev)
            return be.graph_add_child(g, deps, child)
        finally:
            be.graph_destroy(child)
    if kind == wire.NVP_NODE_COND and len(body) >= 16:
        handle, ctype, size = struct.unpack_from("<QII", body)
        if not 0 < size <= 256 or len(body) < 16 + 4 * size:
            raise CudaError(INVALID_VALUE, "conditional node body graphs")
        node, graphs = be.graph_add_conditional(g, deps, dev, handle, ctype, size)
        bodies.update(zip(struct.unpack_from(f"<{size}I", body, 16), graphs, strict=True))
        return node
    raise CudaError(INVALID_VALUE, f"graph node kind {kind}")


def GRAPH_LAUNCH(p: Any, ch: Any, a: tuple[int, ...], payload: bytes) -> None:
    x = p.state.graph_execs.get(a[0])
    if x is None:
        raise CudaError(INVALID_VALUE, f"executable graph {a[0]}")
    s = p.stream(ch, a[1])
    if p.state.managed_vars and not a[2]:
        managed_vars.before_launch(p, x.log.dev, s)
    p.backend.graph_launch(x.handle, s, bool(a[2]))
    if p.state.managed_vars and not a[2]:
        managed_vars.after_launch(p, x.log.dev, s)
    if p.fast is not None:  # later launches run in C
        p.fast.learn_graph_exec(a[0], x.handle, p.backend.handle_value)


def GRAPH_DESTROY(p: Any, ch: Any, a: tuple[int, ...], payload: bytes) -> None:
    table = p.state.graph_execs if a[1] else p.state.graphs
    rec = table.get(a[0])
    if rec is None or rec.body_of:  # (a conditional node's body goes with its graph)
        raise CudaError(INVALID_VALUE, f"graph {a[0]}")
    del table[a[0]]
    if not a[1]:
        for bid in [k for k, r in table.items() if r.body_of == a[0]]:
            del table[bid]
    p.forget()  # (C may know the executable graph)
    (p.backend.graph_exec_destroy if a[1] else p.backend.graph_destroy)(rec.handle)
    for g in rec.sources:  # (graphs a restore made for this executable graph go with it)
        p.backend.graph_destroy(g)


# ---- checkpoint and restore ----
def defer_restore(p: Any, header: dict[str, Any]) -> None:
    """A restore from an image file, whose application will share its pinned memory again only once this
    proxy runs: graphs (their nodes may copy to or from that memory) are made at RESTORE_DONE."""
    p.pending_graphs = header


def RESTORE_DONE(p: Any, ch: Any, a: tuple[int, ...], payload: bytes) -> None:
    header = p.pending_graphs
    if header is not None:
        try:
            restore(p, header)
        finally:
            p.pending_graphs = None


def _calls_json(calls: list[tuple[int, tuple[int, ...], bytes]]) -> list[Any]:
    return [[op, list(a), pl.hex()] for op, a, pl in calls]


def _calls(d: list[Any]) -> list[tuple[int, tuple[int, ...], bytes]]:
    return [(op, tuple(a), bytes.fromhex(pl)) for op, a, pl in d]


def describe(state: Any) -> dict[str, Any]:
    def rec(g: Any, **more: Any) -> dict[str, Any]:
        return dict(g.log.to_json(), order=g.order, created=g.created, built=_calls_json(g.built), **more)

    bodies: dict[int, list[int]] = {}
    for k, g in state.graphs.items():
        if g.body_of:
            bodies.setdefault(g.body_of, []).append(k)
    return {"graphs": {str(k): rec(g, bodies=bodies.get(k, [])) for k, g in state.graphs.items() if not g.body_of},
            "graph_execs": {str(k): rec(x, flags=x.flags, updates=_calls_json(x.updates))
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
    copy_rings: dict[int, list[Any]] = field(default_factory=dict)
    copy_event_next: int = 0
    posted_rings: dict[int, list[Any]] = field(default_factory=dict)


_Into = tuple[Any, list[Any], int, dict[int, Any], dict[Any, Any]]


def _replay(p: Any, log: CaptureLog, into: _Into | None = None, end: bool = True
            ) -> tuple[Any, CaptureLog, dict[int, Any]]:
    """Begin a capture on the log's stream (into: (graph, dependencies, its wire id, its nodes, its hidden
    nodes): into that graph), make its calls again and (end) end it.  Returns the graph (not end: the stream,
    still capturing), the capture's own log (graph id and nodes it named) and the conditional nodes' body graphs
    it made, by wire id.  Graph records made on the way are dropped."""
    ch = _ReplayChannel(log.dev)
    be = p.backend
    be.activate(log.dev)
    # streams and events the capture used that the program has destroyed since (it may, even during the
    # capture: NVIDIA's graphMemoryNodes does): stand-ins make the same dependencies
    used = {log.origin} | {a[CAPTURABLE[op]] for op, a, _pl in log.calls if op in CAPTURABLE}
    gone = [w for w in sorted(used) if w not in (0, 2) and w not in p.state.streams] if end else []
    events = {a[EVENT_ARG[op]] for op, a, _pl in log.calls if op in EVENT_ARG}
    gone_events = [w for w in sorted(events) if w not in p.state.events] if end else []
    for w in gone:
        p.state.streams[w] = (log.dev, be.stream_create(log.dev, 1, 0))
    for w in gone_events:
        p.state.events[w] = (log.dev, be.event_create(log.dev, 2))  # (cudaEventDisableTiming)
    try:
        s, mine, bodies = _replay_on(p, ch, log, into)
        return (be.end_capture(s) if end else s), mine, bodies
    finally:
        for w in gone:
            be.stream_destroy(p.state.streams.pop(w)[1])
        for w in gone_events:
            be.event_destroy(p.state.events.pop(w)[1])
        if gone or gone_events:
            p.forget()  # (C may have learnt them)


def _replay_on(p: Any, ch: Any, log: CaptureLog, into: _Into | None) -> tuple[Any, CaptureLog, dict[int, Any]]:
    be = p.backend
    s = p.stream(ch, log.origin)
    saved = dict(p.state.graphs)
    mine = CaptureLog(log.dev, log.origin, log.mode)  # (handlers see a capture is on)
    if into is not None:
        graph, deps, gid, nodes, hidden = into
        be.begin_capture_to_graph(s, graph, deps, log.mode)
        mine.graph_id, mine.target, mine.nodes, mine.hidden = gid, gid, nodes, hidden
        p.state.graphs[gid] = GraphRec(mine, graph, 0, created=True, nodes=nodes, hidden=hidden)
    else:
        be.begin_capture(s, log.mode)
    _status, cid = be.capture_status(s)
    p.state.captures[cid] = mine
    try:
        for op, a, payload in log.calls:
            p.table[op](ch, a, payload)
    finally:
        p.state.captures.pop(cid, None)
        # (made by this replay: a graph restored before it, made the same way, may have a body of that wire id)
        bodies = {k: r.handle for k, r in p.state.graphs.items()
                  if mine.graph_id and r.body_of == mine.graph_id and saved.get(k) is not r}
        p.state.graphs.clear()
        p.state.graphs.update(saved)
    return s, mine, bodies


def _remake(p: Any, log: CaptureLog, d: dict[str, Any]
            ) -> tuple[Any, dict[int, Any], list[Any], dict[int, Any], dict[Any, Any]]:
    """A graph as it was: its capture replayed (or an empty one made), then its nodes added (to it or to the
    body graphs of its conditional nodes) and captures into it made again.  Returns the graph, its nodes, its
    calls, its body graphs and nvproxy's own nodes in it."""
    nodes: dict[int, Any] = {}
    bodies: dict[int, Any] = {}
    hidden: dict[Any, Any] = {}
    if d.get("created", False):
        g = p.backend.graph_create(log.dev)
    else:
        g, mine, made = _replay(p, log)
        nodes.update(mine.nodes)
        bodies.update(made)
        hidden.update(mine.hidden)
    built = _calls(d.get("built", []))
    for op, a, payload in built:
        target = bodies.get(a[0], g)
        if op == wire.NVP_OP_GRAPH_GET_NODES:
            _name_nodes(p, target, nodes, a, payload, hidden)
        elif op == wire.NVP_OP_GRAPH_COND_HANDLE:
            value, (want,) = p.backend.graph_cond_handle(target, log.dev, a[1], a[2]), struct.unpack("<Q", payload)
            if value != want:
                raise ImageError(f"a conditional handle came back as {value:#x}, not {want:#x} (kernels hold that)")
        elif op == wire.NVP_OP_CAPTURE_TO_GRAPH:
            inner = CaptureLog.from_json(json.loads(payload))
            _g, _mine, made = _replay(p, inner, (target, _nodes_of(nodes, inner.deps), a[0], nodes, hidden))
            bodies.update(made)
        else:
            node = nodes[a[1]] = _add_node(p, log.dev, target, nodes, a, payload, bodies)
            if a[2] & wire.NVP_NODE_HIDDEN:
                hidden[p.backend.node_key(node)] = node
    return g, nodes, built, bodies, hidden


def restore(p: Any, desc: dict[str, Any]) -> None:
    """Make every graph, executable graph and capture in progress of an image again."""
    items = [(g["order"], "graph", int(k), g) for k, g in desc.get("graphs", {}).items()]
    items += [(x["order"], "exec", int(k), x) for k, x in desc.get("graph_execs", {}).items()]
    for order, kind, key, d in sorted(items):
        log = CaptureLog.from_json(d)
        g, nodes, built, bodies, hidden = _remake(p, log, d)
        created = d.get("created", False)
        if kind == "graph":
            p.state.graphs[key] = GraphRec(log, g, order, 0, created, built, nodes, hidden=hidden)
            for bid in d.get("bodies", []):
                p.state.graphs[bid] = GraphRec(log, bodies[bid], order, 0, True, built, nodes, body_of=key,
                                               hidden=hidden)
        else:
            x = GraphRec(log, p.backend.graph_instantiate(g, d["flags"]), order, d["flags"], created, built, nodes)
            if nodes:
                x.sources.append(g)  # (its nodes name the executable graph's kernels in later updates)
            else:
                p.backend.graph_destroy(g)
            for op, a, payload in _calls(d.get("updates", [])):
                if op == wire.NVP_OP_GRAPH_EXEC_UPDATE:
                    snap = json.loads(payload)
                    g2, nodes2, _b, _bodies, _h = _remake(p, CaptureLog.from_json(snap), snap)
                    x.sources.append(g2)
                    if p.backend.graph_exec_update(x.handle, g2) != 0:
                        raise CudaError(INVALID_VALUE, f"updating executable graph {key} again failed")
                    nodes.update(nodes2)
                else:
                    p.backend.graph_exec_kernel(x.handle, nodes[a[1]], *_kernel(p, log.dev, payload))
                x.updates.append((op, a, payload))
            p.state.graph_execs[key] = x
        p.state.graph_order = max(p.state.graph_order, order)
    for d in desc.get("captures", []):  # a capture that was going on at the checkpoint goes on
        log = CaptureLog.from_json(d)
        into = None
        if log.target:
            t = p.state.graphs.get(log.target)
            if t is None:
                raise ImageError(f"a capture into graph {log.target}, which the image does not hold")
            into = (t.handle, _nodes_of(t.nodes, log.deps), log.target, t.nodes, t.hidden)
        s, mine, made = _replay(p, log, into, end=False)
        log.graph_id, log.nodes, log.hidden = mine.graph_id, mine.nodes, mine.hidden
        if mine.graph_id and not log.target:  # (cudaStreamGetCaptureInfo named its graph: the program holds it)
            rec = p.state.graphs[mine.graph_id] = GraphRec(log, p.backend.capture_graph(s), 0, nodes=log.nodes,
                                                           hidden=log.hidden)
            for bid, handle in made.items():
                p.state.graphs[bid] = GraphRec(log, handle, 0, 0, True, rec.built, rec.nodes, body_of=mine.graph_id,
                                               hidden=rec.hidden)
        _status, cid = p.backend.capture_status(s)
        p.state.captures[cid] = log
    p.captures_changed()
