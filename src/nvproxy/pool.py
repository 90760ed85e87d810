"""A per-user pool of warm proxies: started ahead of any program, each with the driver initialised, device 0's
context made and the proxy's modules imported, waiting on a private socket for one program to take it.

`nvproxy pool start` starts them; `nvproxy run` takes one whose settings match its own (pool_key) and whose
backend is the one it asks for (serves) instead of starting a proxy, and starts another in its place, of the
backend the taken one was started with.  A warm proxy

- listens at `pool-KEY-BACKEND-ID.sock` in the user's private directory (0700; the socket 0600), BACKEND the one
  it was started with (auto, gpu or sim), and is taken only by a process of its own user (SO_PEERCRED), once: it
  closes and removes that socket before it answers; one of another backend than the taker asks for answers no,
  and waits on;
- then serves the taker's pid alone, under the usual name (`pOWNER-TIME.sock`), and ends with it, as any proxy;
- ends by itself, removing its socket, when nobody has taken it for its idle time, or when told to stop.

A pool that is not used expires whole: each replacement lives its own idle time from its start.  A socket whose
proxy was killed is removed by the next pool operation that finds nobody listening on it.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import selectors
import signal
import socket
import struct
import sys
import time
from pathlib import Path
from typing import Any, NamedTuple

NAME = re.compile(r"pool-([0-9a-f]{16})-(auto|gpu|sim)-([0-9a-f]+)\.sock")
# what a proxy's behaviour depends on, beside NVPROXY_* and CUDA_* settings: a pool proxy serves only a program
# whose values of these match those it was started with
KEYED = ("LD_LIBRARY_PATH", "PYTHONPATH", "PATH", "HOME", "XDG_CACHE_HOME", "XDG_RUNTIME_DIR", "TMPDIR")
PER_PROCESS = ("NVPROXY_SOCKET", "NVPROXY_OWNER_PID", "NVPROXY_PROXY_PID")  # (a program's own, under nvproxy run)
TAKE_TIMEOUT_S = 10.0
PEERCRED = struct.Struct("3i")
# the backends a warm proxy may have been started with to serve a program that asks for one: gpu or sim, that one
# or auto (its answer then says which it resolved to: serves); auto, auto or gpu (a proxy that opened the GPU
# proves it usable, as auto would have found), never sim
TAKES = {"auto": ("auto", "gpu"), "gpu": ("gpu", "auto"), "sim": ("sim", "auto")}


def backend_of(env: dict[str, str]) -> str:
    """The backend a proxy started with env, or a program run with it, asks for: auto, gpu or sim."""
    return env.get("NVPROXY_BACKEND") or "auto"


def serves(asked: str, started: str, resolved: str) -> bool:
    """Does a warm proxy started with backend started, that opened resolved, serve a program that asks for asked?"""
    return started in TAKES.get(asked, ()) and asked in ("auto", resolved)


def pool_key(env: dict[str, str]) -> str:
    """The settings a proxy started with env runs by, but its backend (serves decides), hashed: a program takes
    only a proxy of its own key."""
    kept = sorted((k, v) for k, v in env.items() if (k.startswith(("NVPROXY_", "CUDA_")) or k in KEYED)
                  and k not in PER_PROCESS and k != "NVPROXY_BACKEND")
    blob = json.dumps([sys.executable, kept]).encode()
    return hashlib.sha256(blob).hexdigest()[:16]


def _sockets(directory: Path, key: str | None = None, backends: tuple[str, ...] = tuple(TAKES)) -> list[Path]:
    """The pool sockets in directory (of key, where given; of a proxy started with one of backends), oldest first."""
    try:
        names = [n for n in os.listdir(directory)
                 if (m := NAME.fullmatch(n)) and key in (None, m.group(1)) and m.group(2) in backends]
    except OSError:
        return []
    paths = []
    for n in names:
        try:
            paths.append((os.lstat(directory / n).st_mtime, directory / n))
        except OSError:
            pass
    return [p for _t, p in sorted(paths)]


def _ask(path: Path, msg: dict[str, Any], fds: list[int] = ()) -> dict[str, Any] | None:
    """msg to the pool proxy at path, and its answer; None where nobody answers there (a socket nobody listens
    on is removed: its proxy was killed)."""
    from .proxy import control

    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        s.settimeout(TAKE_TIMEOUT_S)
        try:
            s.connect(str(path))
        except ConnectionRefusedError:
            path.unlink(missing_ok=True)
            return None
        control.send(s, msg, fds=fds)
        info, _blob, got = control.recv(s, time.monotonic() + TAKE_TIMEOUT_S, limit=1 << 16)
        for fd in got:
            os.close(fd)
        return info
    except (OSError, ValueError):
        return None  # (gone meanwhile, taken by another program, or expired)
    finally:
        s.close()


class Warm(NamedTuple):
    """A warm proxy a program took: the socket it serves the program at, its pid, its idle time and the backend it
    was started with (its replacement's)."""

    socket: str
    pid: int
    idle: float
    backend: str


def take(env: dict[str, str]) -> Warm | None:
    """A warm proxy for this process, if the pool has one of env's key that serves env's backend."""
    from .launcher import private_dir

    asked = backend_of(env)
    for path in _sockets(private_dir(), pool_key(env), TAKES.get(asked, ())):
        info = _ask(path, {"cmd": "take", "cwd": os.getcwd(), "backend": asked}, [2])
        if info and info.get("ok"):
            return Warm(str(info["socket"]), int(info["pid"]), float(info["idle"]), NAME.fullmatch(path.name)[2])
    return None


def spawn(env: dict[str, str], idle: float, wait: bool, backend: str | None = None) -> tuple[str, int]:
    """Start a warm proxy of env's settings, with backend (auto, gpu or sim; env's where None) (its messages,
    until it is taken: stderr's where wait, else none)."""
    from .launcher import private_dir, spawn_proxy

    backend = backend or backend_of(env)
    env = {**env, "NVPROXY_BACKEND": backend}
    path = private_dir() / f"pool-{pool_key(env)}-{backend}-{os.urandom(6).hex()}.sock"
    return spawn_proxy(0, env, ["--pool-idle", str(idle)], sock=str(path), wait=wait, quiet=not wait)


def ask_all(msg: dict[str, Any]) -> list[tuple[Path, dict[str, Any]]]:
    """msg to every pool proxy of this user: (socket, answer) of each that answered."""
    from .launcher import private_dir_path

    out = []
    for path in _sockets(private_dir_path()):
        info = _ask(path, msg)
        if info is not None:
            out.append((path, info))
    return out


# ---- the pool proxy's side ----
class Taken:
    """What a pool proxy learns from the program that took it."""

    def __init__(self, owner_pid: int, sock: str, listener: socket.socket) -> None:
        self.owner_pid, self.sock, self.listener = owner_pid, sock, listener


def _stop(_sig: int, _frame: Any) -> None:
    raise SystemExit(0)


def wait_to_be_taken(path: str, idle: float, started: str, resolved: str) -> Taken | None:
    """As a pool proxy started with backend started, that opened resolved: listen at path until a program of this
    user that asks for a backend it serves takes this proxy (its Taken), or idle seconds pass or a stop comes
    (None).  Either way the socket at path is gone on return."""
    from .backends import warmup
    from .launcher import private_dir
    from .proxy import control
    from .proxy.listen import listen_at

    warmup.wait()  # (listening says: ready, the context made)
    old = {s: signal.signal(s, _stop) for s in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP)}
    pool = listen_at(path, 8)
    born = time.monotonic()
    null = os.open(os.devnull, os.O_WRONLY)  # (the starter's stderr is let go of: it may be a pipe someone reads)
    if not os.environ.get("NVPROXY_PROXY_LOG"):
        os.dup2(null, 2)
    os.close(null)
    sel = selectors.DefaultSelector()
    sel.register(pool, selectors.EVENT_READ)
    try:
        while (left := born + idle - time.monotonic()) > 0:
            if not sel.select(left):
                continue
            try:
                conn, _ = pool.accept()
            except OSError:
                continue
            with conn:
                pid, uid, _gid = PEERCRED.unpack(conn.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED,
                                                                 PEERCRED.size))
                try:
                    msg, _blob, fds = control.recv(conn, time.monotonic() + TAKE_TIMEOUT_S, limit=1 << 16)
                except (OSError, ValueError):
                    continue  # (a bad client: the pool proxy waits on)
                try:
                    if uid != os.getuid():
                        continue
                    cmd = msg.get("cmd")
                    if cmd == "status":
                        control.send(conn, {"pid": os.getpid(), "age": time.monotonic() - born,
                                            "left": born + idle - time.monotonic(), "backend": resolved,
                                            "started": started})
                    elif cmd == "stop":
                        control.send(conn, {"ok": True, "pid": os.getpid()})
                        return None
                    elif cmd == "take" and not serves(str(msg.get("backend", "auto")), started, resolved):
                        control.send(conn, {"ok": False, "backend": resolved})  # (it waits on, for another)
                    elif cmd == "take" and len(fds) == 1:
                        os.unlink(path)  # (taken once: no other program finds it from here on)
                        pool.close()
                        if not os.environ.get("NVPROXY_PROXY_LOG"):
                            os.dup2(fds[0], 2)  # (its messages go to the program's stderr, as a proxy's do)
                        try:
                            os.chdir(str(msg.get("cwd", "/")))
                        except OSError:
                            pass
                        sock = str(private_dir() / f"p{pid}-{int(time.time())}.sock")
                        listener = listen_at(sock, 64)
                        control.send(conn, {"ok": True, "socket": sock, "pid": os.getpid(), "idle": idle})
                        return Taken(pid, sock, listener)
                finally:
                    for fd in fds:
                        os.close(fd)
        return None
    finally:
        sel.close()
        if pool.fileno() >= 0:
            pool.close()
            try:
                os.unlink(path)
            except OSError:
                pass
        for s, h in old.items():
            signal.signal(s, h)
