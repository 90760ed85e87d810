"""Streams, events and host functions."""

from __future__ import annotations

from typing import Any

from ... import wire
from ...errors import INVALID_VALUE, NOT_READY, CudaError
from ..server import Deferred
from .device import float_bits


def _signed(x: int) -> int:
    return x - (1 << 64) if x >= 1 << 63 else x


def STREAM_CREATE(p: Any, ch: Any, a: tuple[int, ...], payload: bytes) -> None:
    p.state.streams[a[0]] = (ch.dev, p.backend.stream_create(ch.dev, a[1], _signed(a[2])))
    p.state.stream_args[a[0]] = (a[1], _signed(a[2]))
    if not a[1] & 1:  # (a blocking stream: a synchronous copy waits for it too)
        p.sync_streams_changed()


def STREAM_DESTROY(p: Any, ch: Any, a: tuple[int, ...], payload: bytes) -> None:
    s = p.state.stream(a[0], ch.dev, None)
    p.forget()
    del p.state.streams[a[0]]
    p.state.stream_args.pop(a[0], None)
    p.state.stream_attrs.pop(a[0], None)
    p.backend.stream_destroy(s)


def STREAM_ATTR(p: Any, ch: Any, a: tuple[int, ...], payload: bytes) -> tuple[tuple[int, ...], bytes] | None:
    s = p.stream(ch, a[0])
    if a[2]:
        return (), p.backend.stream_get_attr(s, a[1])
    if len(payload) != wire.NVP_STREAM_ATTR_BYTES:
        raise CudaError(INVALID_VALUE)
    p.backend.stream_set_attr(s, a[1], payload)
    if a[0] in p.state.streams:  # kept, and set again after a restore
        p.state.stream_attrs.setdefault(a[0], {})[a[1]] = payload


def RESET_PERSISTING_L2(p: Any, ch: Any, a: tuple[int, ...], payload: bytes) -> None:
    p.backend.reset_persisting_l2(ch.dev)


def STREAM_SYNC(p: Any, ch: Any, a: tuple[int, ...], payload: bytes) -> Deferred:
    s = p.stream(ch, a[0])
    return Deferred(lambda: p.backend.stream_sync(s), lambda: p.backend.stream_query(s))


def STREAM_QUERY(p: Any, ch: Any, a: tuple[int, ...], payload: bytes) -> None:
    if not p.backend.stream_query(p.stream(ch, a[0])):
        raise CudaError(NOT_READY)


def STREAM_WAIT_EVENT(p: Any, ch: Any, a: tuple[int, ...], payload: bytes) -> None:
    p.backend.stream_wait_event(p.stream(ch, a[0]), p.event(a[1]), a[2])


def HOST_FUNC(p: Any, ch: Any, a: tuple[int, ...], payload: bytes) -> None:
    cb_id, s = a[1], p.stream(ch, a[0])
    keep = p.capturing(s)  # a graph's host node runs at every launch of the graph
    p.backend.host_func(s, lambda status: p.server.run_callback(cb_id, status, keep), keep)
    if keep and len(a) > 2 and a[2]:  # (nvproxy's own, staging a copy: the graph does not list it)
        _status, cid = p.backend.capture_status(s)
        log, deps = p.state.captures.get(cid), p.backend.capture_deps(s)
        if log is not None and deps:
            log.hidden[p.backend.node_key(deps[0])] = deps[0]


def EVENT_CREATE(p: Any, ch: Any, a: tuple[int, ...], payload: bytes) -> None:
    p.state.events[a[0]] = (ch.dev, p.backend.event_create(ch.dev, a[1]))
    p.state.event_flags[a[0]] = a[1]


def EVENT_DESTROY(p: Any, ch: Any, a: tuple[int, ...], payload: bytes) -> None:
    e = p.state.event(a[0])
    p.forget()
    del p.state.events[a[0]]
    p.state.event_flags.pop(a[0], None)
    p.state.event_past.pop(a[0], None)
    for held in (p.state.ipc_opened_events, p.state.ipc_event_tokens, p.state.ipc_event_driver):
        held.pop(a[0], None)
    p.backend.event_destroy(e)


def EVENT_RECORD(p: Any, ch: Any, a: tuple[int, ...], payload: bytes) -> None:
    p.state.event_past.pop(a[0], None)  # (the fast path records it from now on)
    p.backend.event_record(p.event(a[0]), p.stream(ch, a[1]), a[2])


def EVENT_SYNC(p: Any, ch: Any, a: tuple[int, ...], payload: bytes) -> Deferred:
    e = p.event(a[0])
    return Deferred(lambda: p.backend.event_sync(e), lambda: p.backend.event_query(e))


def EVENT_QUERY(p: Any, ch: Any, a: tuple[int, ...], payload: bytes) -> None:
    if not p.backend.event_query(p.event(a[0])):
        raise CudaError(NOT_READY)


def EVENT_ELAPSED(p: Any, ch: Any, a: tuple[int, ...], payload: bytes) -> tuple[tuple[int, ...], bytes]:
    ms = p.state.elapsed(a[0], a[1])
    return (float_bits(ms),), b""
