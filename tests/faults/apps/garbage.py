"""A program of the fault suite, run by `nvproxy run` in place of a CUDA program: it is the process its proxy
serves, so the proxy reads what it sends.  On a connection of its own it sends garbage (argv[1]: which; argv[2]: a
seed), then checks that a well-formed connection is still served, and prints what it saw of each:

    garbage: closed | answered ERR [after ASYNC_ERR] | open | sent      (sent: nothing to see, it closed its end)
    good: served | not served (...)
"""

from __future__ import annotations

import os
import random
import socket
import sys
import time

from nvproxy import wire

WAIT_S = 2.0  # (the suite's HANG_S: a channel neither closed nor answered within it is open)
REQ = wire.REQ


def connect() -> socket.socket:
    """A channel to the proxy, once it listens: `nvproxy run` does not wait for its proxy, and the program's first
    connect waits (as the shim's does) while the proxy runs and its socket is not there yet."""
    deadline = time.monotonic() + 60
    while True:
        s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            s.connect(os.environ["NVPROXY_SOCKET"])
            break
        except (FileNotFoundError, ConnectionRefusedError):
            s.close()
            os.kill(int(os.environ["NVPROXY_PROXY_PID"]), 0)  # (ProcessLookupError: the proxy has ended)
            if time.monotonic() > deadline:
                raise
            time.sleep(0.005)
    s.settimeout(WAIT_S)
    return s


def request(op: int, seq: int, *args: int, length: int = REQ.size, flags: int = wire.NVP_F_REPLY) -> bytes:
    return REQ.pack(length, op, flags, seq, *args, *[0] * (8 - len(args)))


def hello(tid: int, version: int = wire.NVP_PROTO_VERSION) -> bytes:
    return request(wire.NVP_OP_HELLO, 0, os.getpid(), tid, version, wire.NVP_CHAN_CALL, 0)


def reply(s: socket.socket) -> tuple[int, ...] | None:
    """The next reply's fields (its payload read too), None where the proxy closed the channel."""
    head = b""
    while len(head) < wire.REP.size:
        got = s.recv(wire.REP.size - len(head))
        if not got:
            return None
        head += got
    rep = wire.REP.unpack(head)
    left = rep[0] - wire.REP.size
    while left > 0:
        got = s.recv(left)
        if not got:
            return None
        left -= len(got)
    return rep


def random_requests(rng: random.Random) -> bytes:
    """Well-framed requests of random operations with random arguments, in sequence from 1."""
    out = b""
    for seq in range(1, 21):
        payload = rng.randbytes(rng.randrange(0, 64))
        args = [rng.getrandbits(64) for _ in range(8)]
        out += request(rng.randrange(2, 100), seq, *args, length=REQ.size + len(payload), flags=0) + payload
    return out


GARBAGE = {
    "random": lambda rng: rng.randbytes(rng.randrange(1, 4096)),
    "random-requests": lambda rng: hello(7) + random_requests(rng),
    "truncated-header": lambda rng: hello(7) + request(wire.NVP_OP_DEVICE_SYNC, 1)[: rng.randrange(1, REQ.size)],
    "absurd-length": lambda rng: hello(7) + request(wire.NVP_OP_DEVICE_SYNC, 1, length=0xFFFFFFFF),
    "short-length": lambda rng: hello(7) + request(wire.NVP_OP_DEVICE_SYNC, 1, length=5),
    "bad-hello": lambda rng: hello(7, version=wire.NVP_PROTO_VERSION + 99),
    "silent": lambda rng: b"\0",
    "unknown-op": lambda rng: hello(7) + request(999, 1),
    # (a cudaHostUnregister the shim sent without a reply, of memory never registered; then a call that waits)
    "posted-unregister": lambda rng: hello(7) + request(wire.NVP_OP_HOST_UNREGISTER, 1, 0x7E57000, flags=0)
    + request(wire.NVP_OP_GRAPH_CREATE, 2, 1, 0),
}
CLOSES_ITS_END = {"truncated-header"}
# well-formed requests the garbage carries (seq 1...)
REQUESTS = {"unknown-op": 1, "random-requests": 20, "posted-unregister": 2}


def main() -> int:
    what, seed = sys.argv[1], int(sys.argv[2])
    bad = connect()
    data = GARBAGE[what](random.Random(seed))
    bad.sendall(data)
    if what in CLOSES_ITS_END:
        bad.shutdown(socket.SHUT_WR)
        print("garbage: sent")
    else:
        try:
            if data.startswith(hello(7)):
                assert reply(bad) is not None, "the proxy closed the channel after a good hello"
            rep = reply(bad)
            after = f" after {rep[2]}" if rep is not None and rep[2] else ""  # (an earlier posted call's failure)
            print("garbage: closed" if rep is None else f"garbage: answered {rep[1]}{after}")
        except TimeoutError:
            print("garbage: open")
    sys.stdout.flush()
    good = connect()
    try:
        good.sendall(hello(8))
        rep = reply(good)
        if rep is None or rep[1] != 0:
            print(f"good: not served (hello: {rep})")
            return 1
        good.sendall(request(wire.NVP_OP_GRAPH_CREATE, 1 + REQUESTS.get(what, 0), 1, 0))
        rep = reply(good)
        print("good: served" if rep is not None and rep[1] == 0 else f"good: not served (a call: {rep})")
    except TimeoutError:
        print("good: not served (no answer)")
    bad.close()
    good.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
