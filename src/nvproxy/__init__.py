"""nvproxy: transparent checkpoint/restart for unmodified CUDA applications by
proxy-process API interposition."""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from pathlib import Path

__version__ = "0.1.0"


NATIVE = ("libnvproxy.so", "libnvproxy_cuda.so", "libnvproxy_fast.so")  # the shim, libcuda.so.1's name, the proxy's C


def install_problem() -> str | None:
    """One line naming the native libraries this installation lacks (a build that did not run or did not finish);
    None where it has them all."""
    import os

    here = os.path.join(os.path.dirname(os.path.realpath(__file__)), "_native")
    missing = [n for n in NATIVE if not os.path.exists(os.path.join(here, n))]
    if not missing:
        return None
    return (f"nvproxy: this installation is incomplete ({', '.join(missing)} missing in {here}): build it again "
            f"(pip install -e . in a checkout) or reinstall nvproxy")


def shim_path() -> Path:
    """The LD_PRELOAD shim built with this package."""
    from pathlib import Path  # (here: a proxy imports this package before it starts the driver)

    p = Path(__file__).resolve().parent / "_native" / "libnvproxy.so"
    if not p.exists():
        raise FileNotFoundError(f"{p} is missing: build the package first (pip install -e .)")
    return p


def libcuda_name_path() -> Path:
    """The empty library named libcuda.so.1, preloaded after the shim (native/soname/libcuda_name.c)."""
    return shim_path().with_name("libnvproxy_cuda.so")


def preload() -> str:
    """LD_PRELOAD's entries for a program run through nvproxy: the shim, then libcuda.so.1's name."""
    return f"{shim_path()}:{libcuda_name_path()}"
