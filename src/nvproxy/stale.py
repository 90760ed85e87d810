"""Removing the sockets of proxies that died without removing them (SIGKILL, a crash) from the user's private
directory.  A proxy sweeps as it starts; only files whose proxy is provably gone go: a control socket whose pid
runs no proxy of it and on which nobody listens, and a proxy socket on which nobody listens and which no live
proxy or starting proxy (its application still running, its control socket not made yet) holds.

Names (launcher.spawn_proxy, the shim's spawn_proxy, proxy/listen.py): `pOWNER-TIME.sock` (OWNER: the application's
pid), `pOWNER-TIME.sock.PID.ctl` (PID: the proxy's), and `NAME.PID.tmp` while a proxy binds NAME.
"""

from __future__ import annotations

import errno
import os
import re
import socket
from pathlib import Path

SOCK = re.compile(r"p(\d+)-[0-9a-f]+\.sock")
CTL = re.compile(r"(p\d+-[0-9a-f]+\.sock)\.(\d+)\.ctl")
TMP = re.compile(r"(p\d+-[0-9a-f]+\.sock(?:\.\d+\.ctl)?)\.(\d+)\.tmp")


def _alive(pid: int) -> bool:
    from .launcher import alive

    return alive(pid)


def _proxy_of(pid: int, sock: Path) -> bool:
    """Is pid a running proxy serving sock?"""
    try:
        argv = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
    except OSError:
        return False
    return _alive(pid) and b"--socket" in argv[:-1] and argv[argv.index(b"--socket") + 1] == bytes(sock)


def _nobody_listens(path: Path) -> bool:
    """A connect() to the socket at path is refused: no process has it open to listen."""
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
        s.setblocking(False)
        try:
            s.connect(str(path))
        except OSError as e:
            return e.errno == errno.ECONNREFUSED
    return False


def _remove(path: Path, removed: list[Path]) -> None:
    try:
        path.unlink()
        removed.append(path)
    except FileNotFoundError:
        pass


def _wait_for_orphans(names: list[str], seconds: float) -> None:
    """A proxy whose application has ended ends by itself: wait (up to seconds) for those still ending."""
    import select
    import time

    deadline = time.monotonic() + seconds
    for name in names:
        m = CTL.fullmatch(name)
        owner = SOCK.fullmatch(m.group(1)) if m else None
        if not m or not owner or _alive(int(owner.group(1))) or not _alive(pid := int(m.group(2))):
            continue
        try:
            fd = os.pidfd_open(pid)
        except OSError:
            continue
        try:
            select.select([fd], [], [], max(0.0, deadline - time.monotonic()))  # (readable once it has ended)
        finally:
            os.close(fd)


def sweep(directory: Path, settle: float = 0.0) -> list[Path]:
    """Remove the dead proxies' sockets in directory, having waited up to settle seconds for proxies whose
    application has ended; the paths removed."""
    try:
        names = os.listdir(directory)
    except OSError:
        return []
    if settle:
        _wait_for_orphans(names, settle)
    removed: list[Path] = []
    held, controlled = set(), set()  # proxy sockets a live proxy holds; those a control socket was found for
    for name in names:
        if m := CTL.fullmatch(name):
            sock, pid = m.group(1), int(m.group(2))
            controlled.add(sock)
            if _proxy_of(pid, directory / sock) or not _nobody_listens(directory / name):
                held.add(sock)
            else:
                _remove(directory / name, removed)
        elif (m := TMP.fullmatch(name)) and not _alive(int(m.group(2))):
            _remove(directory / name, removed)
    for name in names:
        m = SOCK.fullmatch(name)
        if not m or name in held or (name not in controlled and _alive(int(m.group(1)))):
            continue
        if _nobody_listens(directory / name):
            _remove(directory / name, removed)
    return removed


def sweep_private_dir(settle: float = 0.0) -> list[Path]:
    """sweep() of this user's private directory, where it exists and is this user's."""
    from .launcher import private_dir_path

    d = private_dir_path()
    try:
        mine = d.is_dir() and not d.is_symlink() and d.stat().st_uid == os.getuid()
    except OSError:
        mine = False
    return sweep(d, settle) if mine else []
