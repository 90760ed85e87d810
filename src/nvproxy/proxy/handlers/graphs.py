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
from ...errors import INVALID_VALUE, CudaError
from ..state import CaptureLog, GraphRec

CAPTURE_ACTIVE = 1  # cudaStreamCaptureStatusActive
# stream work a capture takes, and which argument is its stream
CAPTURABLE = {wire.NVP_OP_LAUNCH: 5, wire.NVP_OP_MEMCPY: 3, wire.NVP_OP_MEMCPY_2D: 6, wire.NVP_OP_MEMSET: 3,
              wire.NVP_OP_MEMSET_2D: 5, wire.NVP_OP_EVENT_RECORD: 1, wire.NVP_OP_STREAM_WAIT_EVENT: 0,
              wire.NVP_OP_HOST_FUNC: 0, wire.NVP_OP_GRAPH_LAUNCH: 1, wire.NVP_OP_COPY_3D: 0}


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
    p.state.graphs[a[0]] = GraphRec(g.log, p.backend.graph_clone(g.handle), p.state.graph_order, 0, g.created,
                                    list(g.built))


def GRAPH_ADD_NODE(p: Any, ch: Any, a: tuple[int, ...], payload: bytes) -> None:
    g = _graph(p, a[0])
    bodies: dict[int, Any] = {}
    g.nodes[a[1]] = _add_node(p, g.log.dev, g.handle, g.nodes, a, payload, bodies)
    g.built.append((wire.NVP_OP_GRAPH_ADD_NODE, a, payload))  # (a body graph's go into its root's list)
    for bid, handle in bodies.items():
        p.state.graphs[bid] = GraphRec(g.log, handle, g.order, 0, True, g.built, g.nodes, body_of=g.body_of or a[0])


def GRAPH_COND_HANDLE(p: Any, ch: Any, a: tuple[int, ...], payload: bytes) -> tuple[tuple[int, ...], bytes]:
    """cudaGraphConditionalHandleCreate: kernels take the value as a parameter, so a restore must get it again."""
    g = _graph(p, a[0])
    p.backend.activate(g.log.dev)
    value = p.backend.graph_cond_handle(g.handle, g.log.dev, a[1], a[2])
    g.built.append((wire.NVP_OP_GRAPH_COND_HANDLE, a, struct.pack("<Q", value)))
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
    listed = be.graph_nodes(g.handle)
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


def _name_nodes(p: Any, g: Any, nodes: dict[int, Any], a: tuple[int, ...], payload: bytes) -> None:
    """A restore names a graph's nodes as GRAPH_GET_NODES did (the graph made the same way lists them the same)."""
    listed = p.backend.graph_nodes(g)
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
        snapshot = dict(g.log.to_json(), created=g.created, built=_calls_json(g.built))
        _log_update(x, (wire.NVP_OP_GRAPH_EXEC_UPDATE, a, json.dumps(snapshot).encode()))
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
    kind, ndeps = a[2], a[3]
    dlen = (4 * ndeps + 7) // 8 * 8
    if len(payload) < dlen:
        raise CudaError(INVALID_VALUE, "graph node dependencies")
    try:
        deps = [nodes[i] for i in struct.unpack_from(f"<{ndeps}I", payload)]
    except KeyError:
        raise CudaError(INVALID_VALUE, "a dependency is not a node of this graph") from None
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
    p.backend.graph_launch(x.handle, p.stream(ch, a[1]), bool(a[2]))
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
    header, p.pending_graphs = p.pending_graphs, None
    if header is not None:
        restore(p, header)


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


def _remake(p: Any, log: CaptureLog, d: dict[str, Any]) -> tuple[Any, dict[int, Any], list[Any], dict[int, Any]]:
    """A graph as it was: its capture replayed (or an empty one made), then its nodes added (to it or to the
    body graphs of its conditional nodes).  Returns the graph, its nodes, its calls and its body graphs."""
    created = d.get("created", False)
    g = p.backend.graph_create(log.dev) if created else p.backend.end_capture(_replay(p, log))
    built = _calls(d.get("built", []))
    nodes: dict[int, Any] = {}
    bodies: dict[int, Any] = {}
    for op, a, payload in built:
        target = bodies.get(a[0], g)
        if op == wire.NVP_OP_GRAPH_GET_NODES:
            _name_nodes(p, target, nodes, a, payload)
        elif op == wire.NVP_OP_GRAPH_COND_HANDLE:
            value, (want,) = p.backend.graph_cond_handle(target, log.dev, a[1], a[2]), struct.unpack("<Q", payload)
            if value != want:
                raise ImageError(f"a conditional handle came back as {value:#x}, not {want:#x} (kernels hold that)")
        else:
            nodes[a[1]] = _add_node(p, log.dev, target, nodes, a, payload, bodies)
    return g, nodes, built, bodies


def restore(p: Any, desc: dict[str, Any]) -> None:
    """Make every graph, executable graph and capture in progress of an image again."""
    items = [(g["order"], "graph", int(k), g) for k, g in desc.get("graphs", {}).items()]
    items += [(x["order"], "exec", int(k), x) for k, x in desc.get("graph_execs", {}).items()]
    for order, kind, key, d in sorted(items):
        log = CaptureLog.from_json(d)
        g, nodes, built, bodies = _remake(p, log, d)
        created = d.get("created", False)
        if kind == "graph":
            p.state.graphs[key] = GraphRec(log, g, order, 0, created, built, nodes)
            for bid in d.get("bodies", []):
                p.state.graphs[bid] = GraphRec(log, bodies[bid], order, 0, True, built, nodes, body_of=key)
        else:
            x = GraphRec(log, p.backend.graph_instantiate(g, d["flags"]), order, d["flags"], created, built, nodes)
            if nodes:
                x.sources.append(g)  # (its nodes name the executable graph's kernels in later updates)
            else:
                p.backend.graph_destroy(g)
            for op, a, payload in _calls(d.get("updates", [])):
                if op == wire.NVP_OP_GRAPH_EXEC_UPDATE:
                    snap = json.loads(payload)
                    g2, nodes2, _b, _bodies = _remake(p, CaptureLog.from_json(snap), snap)
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
        _status, cid = p.backend.capture_status(_replay(p, log))
        p.state.captures[cid] = log
    p.captures_changed()
