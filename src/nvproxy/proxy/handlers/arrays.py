"""CUDA arrays, copies with an array on a side, texture and surface objects.

Arrays are named by the shim's wire ids.  Texture and surface objects are the
driver's own values, since kernels take them as plain parameters: a restore
makes every object again with the value it had (make_objects), and an image
whose values cannot be had again is refused rather than restored wrong."""

from __future__ import annotations

from typing import Any

from ... import wire
from ...checkpoint.image import ImageError
from ...errors import INVALID_VALUE, STREAM_CAPTURE_UNSUPPORTED, CudaError
from ..server import Deferred
from ..state import ArrayRec, ObjectRec
from ..texformat import channel_format

RES_ARRAY, RES_LINEAR, RES_PITCH2D = 0, 2, 3  # cudaResourceType
MAX_FILLERS = 1 << 16  # objects a restore may make and drop to reach a value


def ARRAY_CREATE(p: Any, ch: Any, a: tuple[int, ...], payload: bytes) -> None:
    if len(payload) != wire.ARRAY_DESC.size or a[0] in p.state.arrays:
        raise CudaError(INVALID_VALUE, "malformed array creation")
    w, h, d, x, y, z, ww, f, flags = wire.ARRAY_DESC.unpack(payload)
    desc = {"width": w, "height": h, "depth": d, "fmt": [x, y, z, ww, f], "flags": flags}
    p.state.arrays[a[0]] = ArrayRec(ch.dev, desc, _make_array(p.state, ch.dev, desc))


def _make_array(state: Any, dev: int, desc: dict[str, Any]) -> Any:
    return state.backend.array_create(dev, desc["width"], desc["height"], desc["depth"], channel_format(*desc["fmt"]),
                                  desc["flags"])


def ARRAY_DESTROY(p: Any, ch: Any, a: tuple[int, ...], payload: bytes) -> None:
    rec = p.state.arrays.pop(a[0], None)
    if rec is None:
        raise CudaError(INVALID_VALUE, f"array {a[0]}")
    p.backend.array_destroy(rec.handle)


def _side(p: Any, ch: Any, kind: int, addr: int, pitch: int, rows: int, x: int, y: int, z: int,
          width: int, height: int, depth: int) -> tuple[Any, ...]:
    """A copy's side for the backend: ("array", handle, x, y, z) or ("linear", address, pitch, rows, x, y, z)."""
    if kind == wire.NVP_SIDE_ARRAY:
        rec = p.state.arrays.get(addr)
        if rec is None:
            raise CudaError(INVALID_VALUE, f"array {addr}")
        return ("array", rec.handle, x, y, z)
    if kind == wire.NVP_SIDE_STAGING:
        end = ((depth - 1) * rows + height - 1) * pitch + width
        if ch.staging is None or addr + end > ch.staging[1] or x or y or z:
            raise CudaError(INVALID_VALUE, "staged array copy outside the staging buffer")
        return ("linear", ch.staging[0] + addr, pitch, rows, 0, 0, 0)
    if kind != wire.NVP_SIDE_LINEAR:
        raise CudaError(INVALID_VALUE, f"copy side kind {kind}")
    return ("linear", p.state.translate(addr), pitch, rows, x, y, z)


def COPY_3D(p: Any, ch: Any, a: tuple[int, ...], payload: bytes) -> Deferred:
    if len(payload) != wire.COPY_3D.size:
        raise CudaError(INVALID_VALUE, "malformed 3D copy")
    v = wire.COPY_3D.unpack(payload)
    width, height, depth = v[14:]
    src = _side(p, ch, *v[0:7], width, height, depth)
    dst = _side(p, ch, *v[7:14], width, height, depth)
    s = p.stream(ch, a[0])
    if wire.NVP_SIDE_STAGING in (v[0], v[7]) and p.capturing(s):
        raise CudaError(STREAM_CAPTURE_UNSUPPORTED, "a pageable copy in a stream capture")
    p.backend.copy3d(src, dst, width, height, depth, s)
    return Deferred(lambda: p.backend.stream_sync(s), lambda: p.backend.stream_query(s))


def TEX_CREATE(p: Any, ch: Any, a: tuple[int, ...], payload: bytes) -> tuple[tuple[int, ...], bytes]:
    if len(payload) != wire.TEX_CREATE.size:
        raise CudaError(INVALID_VALUE, "malformed texture object creation")
    desc = {k: v for k, v in zip(wire.TEX_FIELDS, wire.TEX_CREATE.unpack(payload), strict=True) if k[0] != "_"}
    surface = bool(a[0])
    value, handle = _make_object(p.state, ch.dev, surface, desc)
    p.state.objects[(surface, value)] = ObjectRec(ch.dev, surface, desc, handle)
    return (value,), b""


def _make_object(state: Any, dev: int, surface: bool, desc: dict[str, Any]) -> tuple[int, Any]:
    rt = desc["res_type"]
    if rt == RES_ARRAY:
        rec = state.arrays.get(desc["res"])
        if rec is None:
            raise CudaError(INVALID_VALUE, f"array {desc['res']}")
        res: tuple[Any, ...] = ("array", rec.handle, channel_format(*rec.desc["fmt"]))
    elif rt in (RES_LINEAR, RES_PITCH2D) and not surface:
        fmt = channel_format(desc["x"], desc["y"], desc["z"], desc["w"], desc["f"])
        addr = state.translate(desc["res"])
        res = (("linear", addr, fmt, desc["size"]) if rt == RES_LINEAR else
               ("pitch2d", addr, fmt, desc["width"], desc["height"], desc["pitch"]))
    else:
        raise CudaError(INVALID_VALUE, f"resource type {rt}")
    return state.backend.object_create(dev, surface, res, None if surface else desc)


def TEX_DESTROY(p: Any, ch: Any, a: tuple[int, ...], payload: bytes) -> None:
    rec = p.state.objects.pop((bool(a[0]), a[1]), None)
    if rec is None:
        raise CudaError(INVALID_VALUE, f"{'surface' if a[0] else 'texture'} object {a[1]:#x}")
    p.backend.object_destroy(rec.surface, rec.handle)


# ---- checkpoint and restore ----
def describe(state: Any) -> dict[str, Any]:
    return {"arrays": [[i, r.dev, r.desc] for i, r in sorted(state.arrays.items())],
            "objects": [[int(s), v, r.dev, r.desc]
                        for (s, v), r in sorted(state.objects.items(), key=lambda x: x[0][1])]}


def make_arrays(state: Any, header: dict[str, Any]) -> None:
    for i, dev, desc in header.get("arrays", []):
        state.backend.activate(dev)
        state.arrays[i] = ArrayRec(dev, desc, _make_array(state, dev, desc))


def make_objects(state: Any, header: dict[str, Any]) -> None:
    """Every texture and surface object again, with its value: in ascending order of
    value, objects that come out below the one wanted fill the gap and are dropped at
    the end (the driver hands out values from a table, lowest first)."""
    fillers: list[tuple[bool, Any]] = []
    try:
        for surface, value, dev, desc in sorted(header.get("objects", []), key=lambda o: o[1]):
            if desc["res_type"] == RES_ARRAY and desc["res"] not in state.arrays:
                continue  # (its array was freed before it: it cannot be used any more)
            while True:
                state.backend.activate(dev)
                got, handle = _make_object(state, dev, bool(surface), desc)
                if got == value:
                    state.objects[(bool(surface), value)] = ObjectRec(dev, bool(surface), desc, handle)
                    break
                fillers.append((bool(surface), handle))
                if got > value or len(fillers) > MAX_FILLERS:
                    raise ImageError(f"{'surface' if surface else 'texture'} object {value:#x} cannot be made "
                                     f"again with its value (the driver gave {got:#x}); kernels hold the old value")
    finally:
        for surface, handle in fillers:
            state.backend.object_destroy(surface, handle)
