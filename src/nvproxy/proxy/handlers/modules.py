"""Modules, kernels, module variables and launches."""

from __future__ import annotations

from typing import Any

from ... import wire
from ...errors import INVALID_VALUE, CudaError
from .. import managed_vars

MASK32 = 0xFFFFFFFF


def _name(payload: bytes) -> str:
    return payload.split(b"\0", 1)[0].decode()


def MODULE_LOAD(p: Any, ch: Any, a: tuple[int, ...], payload: bytes) -> None:
    if p.state.images.get(a[0]) == payload and a[0] in p.state.device(ch.dev).modules:
        return  # already here (restored from an image): keep its variables' contents
    p.state.images[a[0]] = payload
    p.forget()
    p.state.device(ch.dev).modules.pop(a[0], None)
    p.state.module(ch.dev, a[0])  # load now, so that a bad image fails here


def KERNEL_INFO(p: Any, ch: Any, a: tuple[int, ...], payload: bytes) -> tuple[tuple[int, ...], bytes]:
    mod_id, kid, name = a[0], a[1], _name(payload)
    p.state.kernel_names[kid] = (mod_id, name)
    d = p.state.device(ch.dev)
    p.forget()
    d.kernels.pop(kid, None)
    k = p.state.kernel(ch.dev, kid)
    info = p.backend.kernel_info(k)
    params = info["params"]
    head = wire.KERNEL_INFO.pack(
        len(params), info["param_size"], info["max_threads"], info["num_regs"], info["shared_static"],
        info["const_size"], info["local_size"], info["max_dyn_shared"], info["ptx_version"],
        info["binary_version"], info["cache_mode_ca"], info["preferred_carveout"],
    )
    return (), head + b"".join(wire.PARAM.pack(o, s) for o, s in params)


def VAR_INFO(p: Any, ch: Any, a: tuple[int, ...], payload: bytes) -> tuple[tuple[int, ...], bytes]:
    addr, size = p.backend.global_get(p.state.module(ch.dev, a[0]), _name(payload))
    return (addr, size), b""


def LAUNCH(p: Any, ch: Any, a: tuple[int, ...], payload: bytes) -> None:
    k = p.kernel(ch, a[0])
    grid = (a[1] & MASK32, a[1] >> 32, a[2] & MASK32)
    block = (a[2] >> 32, a[3] & MASK32, a[3] >> 32)
    s = p.stream(ch, a[5])
    if p.state.managed_vars:
        managed_vars.before_launch(p, ch.dev, s)
    p.backend.launch(k, grid, block, a[4], s, payload, bool(a[6] & wire.NVP_LAUNCH_COOPERATIVE))
    if p.state.managed_vars:
        managed_vars.after_launch(p, ch.dev, s)


def MANAGED_VAR(p: Any, ch: Any, a: tuple[int, ...], payload: bytes) -> None:
    """A __managed__ variable of module a[0], whose application copy is at a[1] (a[2] bytes): bound (once; a
    restore binds it itself), with the module's initial value copied to the application."""
    name = _name(payload)
    if any(v.dev == ch.dev and v.module == a[0] and v.name == name for v in p.state.managed_vars):
        return
    v = managed_vars.ManagedVar(ch.dev, a[0], name, a[1], a[2])
    managed_vars.bind(p.state, v)
    p.captures_changed()  # (launches through Python from now on)
    s = p.backend.legacy_stream(ch.dev)
    p.backend.memcpy(v.host, v.device, v.size, s)
    p.backend.memcpy(v.shadow, v.device, v.size, s)
    p.backend.stream_sync(s)
    v.dirty = False


def FUNC_SET_ATTR(p: Any, ch: Any, a: tuple[int, ...], payload: bytes) -> None:
    value = a[2] - (1 << 64) if a[2] >= 1 << 63 else a[2]
    p.backend.func_set_attr(p.state.kernel(ch.dev, a[0]), a[1], value)
    p.state.kernel_attrs.setdefault(a[0], {})[a[1]] = value


def OCCUPANCY(p: Any, ch: Any, a: tuple[int, ...], payload: bytes) -> tuple[tuple[int, ...], bytes]:
    if a[1] == 0:
        raise CudaError(INVALID_VALUE)
    return (p.backend.occupancy(p.state.kernel(ch.dev, a[0]), a[1], a[2], a[3]),), b""
