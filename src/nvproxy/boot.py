"""A proxy's first steps, taken before Python's site processing: the driver's initialisation is started first.

cuInit and a restoring proxy's CUDA contexts take longer than anything else a proxy does before its first answer,
and nothing they need comes from the proxy.  Python's `site` processing runs before any of the proxy's code, and
takes a while where an installed package's `.pth` file imports modules.  So the
spawners (launcher.proxy_argv, the shim's spawn_proxy) start a proxy as

    python -S -c BOOT ROOT proxy ARGS...

and this module, with the standard library only, reserves a restoring proxy's application ranges, starts the
driver on a thread (backends/warmup.py), and only then runs `site.main()` and the command line as usual.  A proxy
started as `python -m nvproxy proxy` (an older spawner) takes the same steps in cli.cmd_proxy, just later.
"""

from __future__ import annotations

import os
import signal
import sys

# the command that starts a proxy through main(); the package's directory follows it (ROOT above)
# (appended: after the standard library, where site would have put it)
BOOT = "import sys; sys.path.append(sys.argv.pop(1)); from nvproxy.boot import main; main()"

header: dict | None = None  # a restoring proxy's image header ({} where unreadable); None: begin() has not run
held: list[tuple[int, int]] = []  # the application's ranges reserved (proxy/libc.py maps over them later)
notes: list[str] = []  # messages for stderr, printed by cli.cmd_proxy once its stderr is settled


def root() -> str:
    """The directory that holds the nvproxy package (sys.path's entry for it)."""
    return os.path.dirname(os.path.dirname(os.path.realpath(__file__)))


def begin(restore: str | None, backend: str) -> dict:
    """Once per process: reserve the application's pinned ranges of the image restore (before the driver and
    the libraries take address space: a restart of NVIDIA's simpleStreams found its cudaHostRegister'ed range
    taken in the new proxy), then start the driver on a thread unless backend is sim.  The image's header."""
    global header
    if header is not None:
        return header
    if restore:
        try:
            wait_for_writers(restore)
        except Exception as e:  # (a wait that fails must not keep the restore from saying what it finds)
            notes.append(f"nvproxy: could not tell whether a proxy still writes {restore}: {e}")
    header = _hold_application_ranges(restore) if restore else {}
    if backend != "sim" and os.environ.get("NVPROXY_EARLY_CONTEXT", "1") != "0":
        from .backends import warmup

        devices = [int(d["index"]) for d in header.get("devices", []) if isinstance(d, dict) and "index" in d]
        warmup.start(devices)  # (cuInit, and a restore's contexts)
    return header


WRITER_WAIT_S = 600.0


def live(pid: int) -> bool:
    """Is pid running (neither gone nor a zombie)?  (Here, for want of anything but the standard library.)"""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] not in ("Z", "X")
    except (OSError, IndexError):
        return False


def wait_for_writers(image: str) -> None:
    """Until no live process is writing image (its temporary file, checkpoint/image.py atomic_file, names the
    writer): a program ended right after a checkpoint that let it go on first (NVPROXY_DMTCP_OVERLAP, dmtcp_command
    -kc) leaves its proxy writing the image, and a restart begun meanwhile must read the finished file."""
    folder, name = os.path.split(os.path.abspath(image))
    prefix, said, deadline = f".{name}.", False, None
    while True:
        try:
            writers = {int(f[len(prefix):].split(".", 1)[0]) for f in os.listdir(folder)
                       if f.startswith(prefix) and f.endswith(".tmp") and f[len(prefix):].split(".", 1)[0].isdigit()}
        except OSError:
            return
        writing = sorted(pid for pid in writers if pid != os.getpid() and live(pid))
        if not writing:
            return
        import time

        deadline = deadline or time.monotonic() + WRITER_WAIT_S
        if time.monotonic() > deadline:
            return  # (the restore then says what it finds)
        if not said:  # (at once, in one write: the wait may be long, and the program's stderr is shared)
            os.write(2, f"nvproxy: waiting for proxy {writing[0]} to finish writing {image}\n".encode())
            said = True
        time.sleep(0.02)


def _hold_application_ranges(image: str) -> dict:
    from .checkpoint.image import ImageError, read_header

    try:
        fd, h = read_header(image)
    except (ImageError, OSError):
        return {}  # (the restore reports it)
    os.close(fd)
    for addr, size in h.get("host", []):
        if reserve_range(addr, size):
            held.append((addr, size))
        else:
            notes.append(f"nvproxy: the application's pinned memory at {addr:#x} is taken in this proxy")
    return h


def reserve_range(addr: int, size: int) -> bool:
    """[addr, addr+size) of address space, no memory; False if any of it is taken.  ctypes, since this runs before
    cffi is loaded; proxy/libc.py's reserve is this too."""
    import ctypes

    libc = ctypes.CDLL(None, use_errno=True)
    libc.mmap.restype = ctypes.c_void_p
    libc.mmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int, ctypes.c_int, ctypes.c_long]
    libc.munmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t]
    prot_none, flags = 0, 0x02 | 0x20 | 0x4000 | 0x100000  # MAP_PRIVATE|ANONYMOUS|NORESERVE|FIXED_NOREPLACE
    p = libc.mmap(addr, size, prot_none, flags, -1, 0)
    if p is None or p == ctypes.c_void_p(-1).value:
        return False
    if p != addr:  # (an old kernel took it as a hint)
        libc.munmap(p, size)
        return False
    return True


def _option(argv: list[str], name: str) -> str | None:
    for i, a in enumerate(argv):
        if a == name and i + 1 < len(argv):
            return argv[i + 1]
        if a.startswith(name + "="):
            return a.split("=", 1)[1]
    return None


def main() -> None:
    argv = sys.argv[1:]
    signal.pthread_sigmask(signal.SIG_SETMASK, [])  # (a checkpointer's hook may have blocked nearly everything)
    if argv[:1] == ["proxy"]:
        from . import install_problem

        if problem := install_problem():  # (a proxy the shim started: its program then says it could not start one)
            print(problem, file=sys.stderr)
            raise SystemExit(1)
        begin(_option(argv, "--restore"), _option(argv, "--backend") or os.environ.get("NVPROXY_BACKEND") or "auto")
    import site

    site.main()  # (what -S left out: site-packages, .pth files, sitecustomize)
    from . import cli

    sys.argv[0] = "nvproxy"
    if argv[:1] != ["proxy"]:
        raise SystemExit(cli.main(argv))
    import argparse

    cli.whole_lines()
    # (the proxy's options alone: the parser of every command takes longer to build)
    p = argparse.ArgumentParser(prog="nvproxy proxy", description=dict(cli.COMMANDS)["proxy"])
    cli._options("proxy", p)
    args = p.parse_args(argv[1:])
    raise SystemExit(int(args.fn(args) or 0))
