"""The driver API's own requests (native/shim/driver*.c): what has no runtime request to ride on.  Modules the
program loads itself come as MODULE_LOAD and KERNEL_INFO, like the runtime's, so checkpoints keep them."""

from __future__ import annotations

from typing import Any

from ...errors import INVALID_VALUE, CudaError


def DRV_MODULE_UNLOAD(p: Any, ch: Any, a: tuple[int, ...], payload: bytes) -> None:
    """cuModuleUnload: the module and its kernels are forgotten, and no checkpoint takes them any more."""
    st = p.state
    st.images.pop(a[0], None)
    gone = [k for k, (mod, _name) in st.kernel_names.items() if mod == a[0]]
    for k in gone:
        del st.kernel_names[k]
        st.kernel_attrs.pop(k, None)
    p.forget()
    for d in st.devices.values():
        for k in gone:
            d.kernels.pop(k, None)
        mod = d.modules.pop(a[0], None)
        if mod is not None:
            p.backend.module_unload(mod)


def DRV_MEMSET(p: Any, ch: Any, a: tuple[int, ...], payload: bytes) -> None:
    """cuMemsetD16/D32 and the 2D memsets: a[3]-byte elements of value a[2], a[4] per row, a[5] rows a[1] apart."""
    if a[3] not in (1, 2, 4):
        raise CudaError(INVALID_VALUE)
    p.backend.memset_elem(p.state.translate(a[0]), a[1], a[2], a[3], a[4], a[5], p.stream(ch, a[6]))
