"""Starting a proxy for an application: a private socket, a daemonised proxy
process that knows its application's pid, and the environment the shim reads."""

from __future__ import annotations

import os
import shutil
import sys
import time
from pathlib import Path

from . import libcuda_name_path, preload, shim_path


def _private(d: Path) -> Path:
    """d, made 0700 if missing; SystemExit unless it is a real directory of this user, closed to others."""
    d.mkdir(mode=0o700, exist_ok=True)
    st = d.lstat()
    if not d.is_dir() or d.is_symlink() or st.st_uid != os.getuid() or st.st_mode & 0o077:
        raise SystemExit(f"nvproxy: {d} is not a private directory of this user")
    return d


def private_dir_path() -> Path:
    """Where this user's sockets go (also the shim's choice: transport.c's nvp_private_dir)."""
    rt = os.environ.get("XDG_RUNTIME_DIR")
    return Path(rt) / "nvproxy" if rt else Path(f"/tmp/nvproxy-{os.getuid()}")


def private_dir() -> Path:
    return _private(private_dir_path())


def proxy_argv() -> list[str]:
    """A proxy's command line up to its options: the driver starts before Python's site processing (boot.py)."""
    from . import boot

    return [sys.executable, "-S", "-c", boot.BOOT, boot.root(), "proxy"]


def proxy_env(backend: str | None, sim_kernels: list[str], base: dict[str, str] | None = None) -> dict[str, str]:
    """The environment of a proxy, and of a program run through nvproxy (from base: os.environ by default): its
    shim starts proxies as proxy_argv() does (NVPROXY_BOOT, NVPROXY_ROOT; the interpreter: NVPROXY_PYTHON)."""
    from . import boot

    base = os.environ if base is None else base
    env = {k: v for k, v in base.items() if k not in ("LD_PRELOAD", "NVPROXY_SOCKET", "NVPROXY_BOOT")}
    if env.get("NVPROXY_PYTHON", sys.executable) == sys.executable:  # (another Python may have another nvproxy)
        env.update(NVPROXY_BOOT=boot.BOOT, NVPROXY_ROOT=boot.root())
    if backend:
        env["NVPROXY_BACKEND"] = backend
    if sim_kernels:
        env["NVPROXY_SIM_KERNELS"] = os.pathsep.join(str(Path(p).resolve()) for p in sim_kernels)
    return env


def find_proxy(app_pid: int) -> tuple[int, str]:
    """(pid, socket path) of the proxy serving app_pid."""
    for d in Path("/proc").iterdir():
        if not d.name.isdigit():
            continue
        try:
            argv = (d / "cmdline").read_bytes().split(b"\0")
            st = d.stat()
        except OSError:
            continue
        if st.st_uid != os.getuid() or b"proxy" not in argv or b"--owner-pid" not in argv or b"--socket" not in argv:
            continue
        if argv[argv.index(b"--owner-pid") + 1] == str(app_pid).encode():
            pid, sock = int(d.name), argv[argv.index(b"--socket") + 1].decode()
            _wait_until_up(pid, sock)
            return pid, sock
    taken = _taken_proxy(app_pid)
    if taken:
        return taken
    raise SystemExit(f"nvproxy: no proxy of this user serves process {app_pid}")


# as long as the shim waits for a proxy that is starting (proxy_find.c)
PROXY_START_S = 60.0


def _wait_until_up(pid: int, sock: str) -> None:
    """nvproxy run starts the program while its proxy starts: a command that comes that early (a checkpoint, a
    migration) finds the proxy before it has made its control socket, which it makes once it listens.  Wait for
    that while the proxy runs; a proxy that ends first is reported by the command's own connect."""
    ctl = f"{sock}.{pid}.ctl"
    deadline = time.monotonic() + PROXY_START_S
    while not os.path.exists(ctl) and alive(pid) and time.monotonic() < deadline:
        time.sleep(0.005)


def _taken_proxy(app_pid: int) -> tuple[int, str] | None:
    """(pid, socket path) of a pool proxy serving app_pid (its command line names no owner): from its control
    socket's name, `pOWNER-TIME.sock.PID.ctl` (stale.py), where PID runs a process of this user."""
    import re

    d = private_dir_path()
    try:
        names = os.listdir(d)
    except OSError:
        return None
    for name in names:
        m = re.fullmatch(rf"(p{app_pid}-[0-9a-f]+\.sock)\.(\d+)\.ctl", name)
        if not m or not alive(pid := int(m.group(2))):
            continue
        try:
            if os.stat(f"/proc/{pid}").st_uid == os.getuid():
                return pid, str(d / m.group(1))
        except OSError:
            pass  # (it ended meanwhile)
    return None


ADDR_COMPAT_LAYOUT = 0x0200000  # (linux/personality.h)


def bottom_up_mappings() -> None:
    """For a proxy about to be exec'd: its mappings go bottom-up (the legacy layout), far from where a program's
    mmap() puts memory (top-down below its stack), since the proxy must map the program's pinned memory at the
    program's own addresses: NVIDIA's simpleStreams once found its cudaHostRegister'ed range taken in the proxy."""
    import ctypes

    try:
        libc = ctypes.CDLL(None, use_errno=True)
        pers = libc.personality(0xFFFFFFFF)
        if pers != -1:
            libc.personality(pers | ADDR_COMPAT_LAYOUT)
    except (OSError, AttributeError):
        pass


def spawn_proxy(owner_pid: int, env: dict[str, str], extra: list[str] = (), sock: str | None = None,
                wait: bool = True, quiet: bool = False) -> tuple[str, int]:
    """Start a proxy serving owner_pid (double fork: it is nobody's child);
    returns (socket path, proxy pid), once it listens if wait.  quiet: its standard streams are /dev/null."""
    sock = sock or str(private_dir() / f"p{owner_pid}-{int(time.time())}.sock")
    try:  # (the proxy watches this very process: not whatever takes its pid once it has ended)
        owner_fd = os.pidfd_open(owner_pid) if owner_pid > 0 else -1
    except OSError:
        owner_fd = -1  # (gone already: the proxy finds that out itself)
    r, w = os.pipe()
    child = os.fork()
    if child == 0:
        try:
            os.close(r)
            if owner_fd >= 0:
                os.set_inheritable(owner_fd, True)
                extra = [*extra, "--owner-pidfd", str(owner_fd)]
            os.setsid()
            if os.fork():
                os._exit(0)
            os.write(w, str(os.getpid()).encode())
            os.close(w)
            if quiet:  # (nor does it hold the spawner's pipes: whoever reads them waits for their end)
                null = os.open(os.devnull, os.O_RDWR)
                for fd in (0, 1, 2):
                    os.dup2(null, fd)
            bottom_up_mappings()
            argv = [*proxy_argv(), "--socket", sock, "--owner-pid", str(owner_pid), *extra]
            os.execve(sys.executable, argv, env)
        except BaseException as e:  # (the parent only sees that it ended: say why here)
            try:
                os.write(2, f"nvproxy: could not start a proxy: {e!r}\n".encode())
            except OSError:
                pass
        finally:
            os._exit(127)
    os.close(w)
    if owner_fd >= 0:
        os.close(owner_fd)
    os.waitpid(child, 0)
    pid = int(os.read(r, 32) or b"0")
    os.close(r)
    if not pid:  # (the fork in the child failed: it said why)
        raise SystemExit("nvproxy: could not start a proxy (see the message above)")
    deadline = time.monotonic() + 60
    while wait and not os.path.exists(sock):
        if not alive(pid):  # (gone, or a zombie nobody reaps yet)
            raise SystemExit(f"nvproxy: the proxy exited during start-up{how_it_ended(pid)} (see its messages "
                             "above)")
        if time.monotonic() > deadline:
            raise SystemExit("nvproxy: the proxy did not start within 60 s")
        time.sleep(0.01)
    return sock, pid


def _stat(pid: int) -> list[str] | None:
    """/proc/PID/stat's fields from the state on (field 3 first); None where pid is gone."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(") ", 1)[1].split()
    except (OSError, IndexError):
        return None


def alive(pid: int) -> bool:
    """Is pid running (neither gone nor a zombie)?"""
    fields = _stat(pid)
    return bool(fields) and fields[0] != "Z"


def how_it_ended(pid: int) -> str:
    """' (exit status N)' or ' (killed by signal N)' for a process that has ended but is not reaped yet (its exit
    code, field 52 of /proc/PID/stat); '' where that cannot be seen."""
    fields = _stat(pid)
    if not fields or fields[0] != "Z" or len(fields) <= 52 - 3:
        return ""
    code = int(fields[52 - 3])
    return f" (killed by signal {code & 0x7F})" if code & 0x7F else f" (exit status {code >> 8})"


def _dmtcp_path(name: str) -> str | None:
    base = os.environ.get("NVPROXY_DMTCP_DIR")
    if base and (Path(base) / "bin" / name).exists():
        return str(Path(base) / "bin" / name)
    return shutil.which(name)


def _dmtcp_missing(name: str) -> str:
    return f"nvproxy: {name} not found (install DMTCP 4.2, or set NVPROXY_DMTCP_DIR)"


def dmtcp_tool(name: str) -> str:
    """Path of a DMTCP command: $NVPROXY_DMTCP_DIR/bin, else PATH."""
    found = _dmtcp_path(name)
    if not found:
        raise SystemExit(_dmtcp_missing(name))
    return found


# nvproxy's plugin speaks DMTCP's plugin interface of DMTCP 3 and 4 (DMTCP_PLUGIN_API_VERSION "3"); a later DMTCP,
# whose interface is another, refuses the plugin with an assertion once the program has started
DMTCP_MAJOR_MAX = 4


def dmtcp_problem(name: str) -> str | None:
    """One line where the DMTCP command name cannot run nvproxy's plugin: missing, or of a DMTCP too new for it."""
    import re
    import subprocess  # (here: a plain `nvproxy run` starts without them)

    path = _dmtcp_path(name)
    if not path:
        return _dmtcp_missing(name)
    try:
        said = subprocess.run([path, "--version"], capture_output=True, text=True, timeout=30).stdout
    except (OSError, subprocess.SubprocessError):
        return None  # (running it says what is wrong)
    m = re.search(r"\(DMTCP\) (\d+)\.(\d+)", said)
    if m and int(m.group(1)) > DMTCP_MAJOR_MAX:
        return (f"nvproxy: {path} is DMTCP {m.group(1)}.{m.group(2)}, whose plugin interface nvproxy's DMTCP plugin "
                f"does not speak (it speaks DMTCP 3 and 4's; tested with DMTCP 4.2.0)")
    return None


def exec_app(argv: list[str], sock: str, proxy_pid: int, proxy_settings: dict[str, str],
             dmtcp_args: list[str] | None = None) -> None:
    """Become the application (same pid, which the proxy serves).  proxy_settings
    (backend, sim kernels, how a proxy starts) go into its environment too: a proxy the shim starts
    later (for a forked child, or to recover) runs like this one."""
    env = dict(os.environ)
    env.update({k: v for k, v in proxy_settings.items()
                if k in ("NVPROXY_BACKEND", "NVPROXY_SIM_KERNELS", "NVPROXY_BOOT", "NVPROXY_ROOT")})
    if dmtcp_args is not None:
        # under DMTCP the shim is a plugin (loaded after DMTCP's own libraries), not an LD_PRELOAD
        env["NVPROXY_DMTCP_NOCHECKPOINT"] = dmtcp_tool("dmtcp_nocheckpoint")
        argv = [dmtcp_tool("dmtcp_launch"), *dmtcp_args, "--with-plugin", str(shim_path()), *argv]
    # (libcuda.so.1 by name, after the shim: the program maps no real libcuda; native/soname/libcuda_name.c)
    ours = str(libcuda_name_path()) if dmtcp_args is not None else preload()
    pre = env.get("LD_PRELOAD", "")
    env["LD_PRELOAD"] = f"{ours}:{pre}" if pre else ours
    env["NVPROXY_SOCKET"] = sock
    env["NVPROXY_OWNER_PID"] = str(os.getpid())
    env["NVPROXY_PROXY_PID"] = str(proxy_pid)
    env.setdefault("NVPROXY_PYTHON", sys.executable)
    try:
        os.execvpe(argv[0], argv, env)
    except OSError as e:
        raise SystemExit(f"nvproxy: cannot run {argv[0]}: {e.strerror}") from None
