"""The proxy's listening sockets: private (0600) and listening before their paths appear."""

from __future__ import annotations

import os
import socket


def listen_at(path: str, backlog: int) -> socket.socket:
    """A socket listening at path, 0600, bound under a temporary name and renamed once it listens: whoever sees
    the path can connect (`nvproxy run` waits for it, and an application's first connect, between the bind and
    the listen, was refused on a busy machine)."""
    tmp = f"{path}.{os.getpid()}.tmp"
    old = os.umask(0o077)
    try:
        if os.path.exists(tmp):
            os.unlink(tmp)
        s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        s.bind(tmp)
        os.chmod(tmp, 0o600)
        s.listen(backlog)
        os.replace(tmp, path)
    finally:
        os.umask(old)
    return s
