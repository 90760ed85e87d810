"""The proxy's control socket: checkpoint and hand-over to another proxy.

Next to the application's socket, `<socket>.<proxy pid>.ctl` (0600) takes
commands from processes of the same user: nvproxy checkpoint, and the new
proxy of nvproxy migrate.  Messages are a u32 JSON length, a u64 blob length,
the JSON and the blob; file descriptors travel with SCM_RIGHTS, in batches.
"""

from __future__ import annotations

import json
import os
import socket
import struct
import time
from typing import Any

HEAD = struct.Struct("<IQ")
FDS_PER_MESSAGE = 200


class BadMessage(ValueError):
    """A control message that breaks the format or a reader's limits."""


def send(sock: socket.socket, obj: dict[str, Any], blob: bytes = b"", fds: list[int] = ()) -> None:
    data = json.dumps(obj).encode()
    fds = list(fds)
    batches = [fds[i : i + FDS_PER_MESSAGE] for i in range(0, len(fds), FDS_PER_MESSAGE)] or [[]]
    head = HEAD.pack(len(data), len(blob)) + struct.pack("<I", len(batches))
    socket.send_fds(sock, [head], batches[0]) if batches[0] else sock.sendall(head)
    for b in batches[1:]:
        socket.send_fds(sock, [b"F"], b)
    sock.sendall(data + blob)


def _bounded(sock: socket.socket, deadline: float | None) -> None:
    """Let sock's next read wait no later than deadline (a monotonic time; None: as the socket is set)."""
    if deadline is not None:
        left = deadline - time.monotonic()
        if left <= 0:
            raise TimeoutError("the control message did not arrive in time")
        sock.settimeout(left)


def _exact(sock: socket.socket, n: int, deadline: float | None = None) -> bytes:
    out = bytearray()
    while len(out) < n:
        _bounded(sock, deadline)
        chunk = sock.recv(min(n - len(out), 1 << 20))
        if not chunk:
            raise ConnectionError("control connection closed")
        out += chunk
    return bytes(out)


def recv(sock: socket.socket, deadline: float | None = None, limit: int | None = None
         ) -> tuple[dict[str, Any], bytes, list[int]]:
    """One message.  deadline: a monotonic time by which all of it must have come (else TimeoutError); limit:
    the most bytes of JSON and blob, and of descriptor batches, to accept (else BadMessage).  Descriptors that
    came with a message that is then refused are closed."""
    size = HEAD.size + 4
    fds: list[int] = []
    try:
        _bounded(sock, deadline)
        head, got, _flags, _addr = socket.recv_fds(sock, size, FDS_PER_MESSAGE)
        fds += got
        if not head:
            raise ConnectionError("control connection closed")
        if len(head) < size:
            head += _exact(sock, size - len(head), deadline)
        n, blob_len = HEAD.unpack(head[: HEAD.size])
        (batches,) = struct.unpack("<I", head[HEAD.size :])
        if limit is not None and (n + blob_len > limit or batches > 1 + limit // FDS_PER_MESSAGE):
            raise BadMessage(f"a control message of {n + blob_len} bytes in {batches} parts; at most {limit}")
        for _ in range(batches - 1):
            _bounded(sock, deadline)
            _m, more, _f, _a = socket.recv_fds(sock, 1, FDS_PER_MESSAGE)
            fds += more
        body = _exact(sock, n + blob_len, deadline)
        try:
            obj = json.loads(body[:n])
        except ValueError:
            raise BadMessage("a control message that is not JSON") from None
        if not isinstance(obj, dict):
            raise BadMessage("a control message that is not a JSON object")
    except BaseException:
        for fd in fds:
            _close(fd)
        raise
    return obj, body[n:], fds


def _close(fd: int) -> None:
    try:
        os.close(fd)
    except OSError:
        pass
