"""The proxy's control socket: checkpoint and hand-over to another proxy.

Next to the application's socket, `<socket>.<proxy pid>.ctl` (0600) takes
commands from processes of the same user: nvproxy checkpoint, and the new
proxy of nvproxy migrate.  Messages are a u32 JSON length, a u64 blob length,
the JSON and the blob; file descriptors travel with SCM_RIGHTS, in batches.
"""

from __future__ import annotations

import json
import socket
import struct
from typing import Any

HEAD = struct.Struct("<IQ")
FDS_PER_MESSAGE = 200


def send(sock: socket.socket, obj: dict[str, Any], blob: bytes = b"", fds: list[int] = ()) -> None:
    data = json.dumps(obj).encode()
    fds = list(fds)
    batches = [fds[i : i + FDS_PER_MESSAGE] for i in range(0, len(fds), FDS_PER_MESSAGE)] or [[]]
    head = HEAD.pack(len(data), len(blob)) + struct.pack("<I", len(batches))
    socket.send_fds(sock, [head], batches[0]) if batches[0] else sock.sendall(head)
    for b in batches[1:]:
        socket.send_fds(sock, [b"F"], b)
    sock.sendall(data + blob)


def _exact(sock: socket.socket, n: int) -> bytes:
    out = bytearray()
    while len(out) < n:
        chunk = sock.recv(min(n - len(out), 1 << 20))
        if not chunk:
            raise ConnectionError("control connection closed")
        out += chunk
    return bytes(out)


def recv(sock: socket.socket) -> tuple[dict[str, Any], bytes, list[int]]:
    size = HEAD.size + 4
    head, fds, _flags, _addr = socket.recv_fds(sock, size, FDS_PER_MESSAGE)
    if len(head) < size:
        head += _exact(sock, size - len(head))
    n, blob_len = HEAD.unpack(head[: HEAD.size])
    (batches,) = struct.unpack("<I", head[HEAD.size :])
    fds = list(fds)
    for _ in range(batches - 1):
        _m, more, _f, _a = socket.recv_fds(sock, 1, FDS_PER_MESSAGE)
        fds += more
    body = _exact(sock, n + blob_len)
    return json.loads(body[:n]), body[n:], fds
