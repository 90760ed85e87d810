"""The proxy's native fast path (native/proxy/fastpath.c) against driver
doubles: what it executes, in which order, where it stops for Python, and the
replies it sends itself.  (The sim backend's test programs run through it too.)"""

from __future__ import annotations

import os
import socket
import struct
import threading

import pytest

from nvproxy import wire
from nvproxy.proxy import fastpath
from nvproxy.proxy.fastpath import ffi

NOT_READY = 600
STREAM, EVENT, KERNEL = 0x5000, 0x6000, 0x7000  # fake driver handles


class Driver:
    """Records every driver call; queries answer from `busy`."""

    def __init__(self) -> None:
        self.calls: list[tuple] = []
        self.busy = False
        self.pending: set[int] = set()  # handles whose queries say NOT_READY (until synced)
        self.fail_launch = 0
        self._cbs = []
        template = ffi.new("struct nvpf_driver *")
        impl = {
            "launch": self.launch,
            "launch_cooperative": self.launch_cooperative,
            "memcpy_async": lambda d, s, n, st: self._rec("memcpy", d, s, n, self.h(st)),
            "memset_async": lambda d, v, n, st: self._rec("memset", d, v, n, self.h(st)),
            "event_record": lambda e, s, f: self._rec("record", self.h(e), self.h(s), f),
            "event_query": lambda e: self._query("event_query", self.h(e)),
            "event_sync": lambda e: self._sync("event_sync", self.h(e)),
            "stream_query": lambda s: self._query("stream_query", self.h(s)),
            "stream_sync": lambda s: self._rec("stream_sync", self.h(s)),
            "stream_wait_event": lambda s, e, f: self._rec("wait_event", self.h(s), self.h(e), f),
            "graph_launch": lambda x, s: self._rec("graph_launch", self.h(x), self.h(s)),
        }
        self.addresses = {}
        for name in fastpath.DRIVER_FIELDS:
            cb = ffi.callback(ffi.typeof(getattr(template, name)), impl[name])
            self._cbs.append(cb)
            self.addresses[name] = int(ffi.cast("uintptr_t", cb))

    @staticmethod
    def h(p) -> int:
        return int(ffi.cast("uintptr_t", p))

    def _rec(self, *call) -> int:
        self.calls.append(call)
        return 0

    def _query(self, what: str, h: int) -> int:
        return NOT_READY if self.busy or h in self.pending else self._rec(what, h)

    def _sync(self, what: str, h: int) -> int:
        self.pending.discard(h)
        return self._rec(what, h)

    def launch(self, f, gx, gy, gz, bx, by, bz, shmem, s, params, extra) -> int:
        data = b""
        if extra != ffi.NULL:
            data = ffi.buffer(extra[1], ffi.cast("size_t *", extra[3])[0])[:]
        self.calls.append(("launch", self.h(f), (gx, gy, gz), (bx, by, bz), shmem, self.h(s), data))
        return self.fail_launch

    def launch_cooperative(self, f, gx, gy, gz, bx, by, bz, shmem, s, params) -> int:
        self.calls.append(("coop", self.h(f), ffi.buffer(params[0], 4)[:], ffi.buffer(params[1], 8)[:]))
        return 0


def req(op: int, seq: int, *a: int, payload: bytes = b"", reply: bool = False, mailbox: bool = False) -> bytes:
    args = list(a) + [0] * (8 - len(a))
    flags = (wire.NVP_F_REPLY if reply else 0) | (wire.NVP_F_MAILBOX if mailbox else 0)
    return wire.REQ.pack(wire.REQ.size + len(payload), op, flags, seq, *args) + payload


def launch_req(seq: int, kernel: int = 1, stream: int = 0, payload: bytes = b"", coop: bool = False) -> bytes:
    grid, block = (3, 2, 1), (128, 1, 1)
    return req(wire.NVP_OP_LAUNCH, seq, kernel, grid[0] | grid[1] << 32, grid[2] | block[0] << 32,
               block[1] | block[2] << 32, 64, stream, 1 if coop else 0, payload=payload)


@pytest.fixture
def setup():
    if not fastpath.library_path().exists():
        pytest.skip("the fast path library is not built")
    drv = Driver()
    fast = fastpath.FastPath(drv.addresses, spin_us=200)
    fast.forget_all()
    fast.set_text_fd(-1)
    fast.set_loop_fd(-1)
    fast.set_text_pending(False)
    fast.set_may_print(True)  # (the tests of waits that skip the driver's wait say so)
    fast.lib.nvpf_set_translating(0)  # (C's state outlives a FastPath: an earlier test may have set it)
    fast.set_capturing(False)
    fast.learn_kernel(0, 1, KERNEL, lambda k: (k, [0, 8]))
    fast.learn_stream(3, STREAM, int)
    fast.learn_event(4, EVENT, int)
    a, b = socket.socketpair()
    a.setblocking(False)
    chan = fast.channel(a.fileno())
    yield fast, drv, chan, b
    a.close()
    b.close()


def replies(sock: socket.socket) -> list[tuple]:
    sock.settimeout(0.2)
    out = []
    try:
        while True:
            out.append(wire.REP.unpack(sock.recv(wire.REP.size)))
    except (TimeoutError, BlockingIOError):
        return out


def test_runs_launches_in_order_and_stops_where_python_must(setup) -> None:
    fast, drv, chan, _peer = setup
    params = struct.pack("<iiQ", 7, 0, 0xDEADBEEF)
    buf = bytearray(launch_req(10, payload=params) + launch_req(11, stream=3) + launch_req(12, kernel=99))
    why, used, seq = fast.run(chan, buf, 10)
    assert (why, seq) == (fastpath.PYTHON, 12)  # kernel 99 was never taught: Python's
    assert used == len(launch_req(10, payload=params)) + len(launch_req(11))
    assert drv.calls == [("launch", KERNEL, (3, 2, 1), (128, 1, 1), 64, 0, params),
                         ("launch", KERNEL, (3, 2, 1), (128, 1, 1), 64, STREAM, b"")]


def test_waits_for_its_turn_and_for_whole_messages(setup) -> None:
    fast, drv, chan, _peer = setup
    msg = launch_req(5)
    assert fast.run(chan, bytearray(msg), 4)[:2] == (fastpath.PYTHON, 0)  # another thread's call comes first
    assert fast.run(chan, bytearray(msg[:50]), 5) == (fastpath.MORE, 0, 5)
    assert fast.run(chan, bytearray(msg + msg[:10]), 5) == (fastpath.MORE, len(msg), 6)
    assert len(drv.calls) == 1


def test_unknown_stream_and_per_thread_stream_go_to_python(setup) -> None:
    fast, drv, chan, _peer = setup
    assert fast.run(chan, bytearray(launch_req(1, stream=77)), 1)[0] == fastpath.PYTHON
    assert fast.run(chan, bytearray(launch_req(1, stream=2)), 1)[0] == fastpath.PYTHON
    chan.per_thread[0] = ffi.cast("void *", 0x9000)
    assert fast.run(chan, bytearray(launch_req(1, stream=2)), 1)[0] == fastpath.MORE
    assert drv.calls[0][5] == 0x9000


def test_sync_replies_itself_with_the_async_error(setup) -> None:
    fast, drv, chan, peer = setup
    drv.fail_launch = 719
    buf = bytearray(launch_req(1) + req(wire.NVP_OP_STREAM_SYNC, 2, 3, reply=True))
    assert fast.run(chan, buf, 1) == (fastpath.MORE, len(buf), 3)
    assert drv.calls[-2:] == [("stream_query", STREAM), ("stream_sync", STREAM)]
    got = replies(peer)
    assert [(r[1], r[2]) for r in got] == [(0, 719)]  # err, async_err
    assert chan.async_err == 0


def test_replies_that_must_wait_go_to_python(setup) -> None:
    fast, drv, chan, peer = setup
    drv.busy = True  # the stream does not finish within the spin
    buf = bytearray(req(wire.NVP_OP_STREAM_SYNC, 1, 3, reply=True))
    assert fast.run(chan, buf, 1) == (fastpath.REPLY, len(buf), 2)
    assert chan.wait_kind == fastpath.WAIT_STREAM and Driver.h(chan.wait_handle) == STREAM
    drv.busy = False
    chan.pending = 1  # an earlier reply is still owed: this one must not overtake it
    assert fast.run(chan, bytearray(req(wire.NVP_OP_EVENT_SYNC, 2, 4, reply=True)), 2)[0] == fastpath.REPLY
    assert chan.wait_kind == fastpath.WAIT_EVENT
    chan.pending = 0
    fast.set_text_pending(True)  # kernel printf text must go out with the reply
    assert fast.run(chan, bytearray(req(wire.NVP_OP_FLUSH, 3, reply=True)), 3)[0] == fastpath.REPLY
    assert chan.wait_kind == fastpath.WAIT_NONE
    assert replies(peer) == []


def test_a_wait_needs_no_driver_wait_where_no_kernel_can_print(setup) -> None:
    """Where no loaded module may print, the query that found the stream done answers the wait, and no reply looks
    for kernel printf text in the pipe first; once one may, a wait is also the driver's (which flushes that text),
    and text in the pipe goes out before the reply (Python's)."""
    fast, drv, chan, peer = setup
    r, w = os.pipe()
    try:
        os.write(w, b"text")  # (text of the driver's that no kernel could have written)
        fast.set_text_fd(r)
        fast.set_may_print(False)
        buf = bytearray(req(wire.NVP_OP_STREAM_SYNC, 1, 3, reply=True) + req(wire.NVP_OP_EVENT_SYNC, 2, 4, reply=True))
        assert fast.run(chan, buf, 1) == (fastpath.MORE, len(buf), 3)
        assert drv.calls == [("stream_query", STREAM), ("event_query", EVENT)]
        assert [rep[1] for rep in replies(peer)] == [0, 0]
        fast.set_may_print(True)
        buf = bytearray(req(wire.NVP_OP_STREAM_SYNC, 3, 3, reply=True))
        assert fast.run(chan, buf, 3) == (fastpath.REPLY, len(buf), 4)  # (the text first: Python's)
        assert drv.calls[2:] == [("stream_query", STREAM), ("stream_sync", STREAM)]
        assert replies(peer) == []
    finally:
        fast.set_text_fd(-1)
        os.close(r)
        os.close(w)


def test_replies_through_the_mailbox_only_where_the_thread_spins_for_it(setup) -> None:
    """The reply mailbox (struct nvp_mailbox): a flagged request's reply lands there while it is empty; a thread
    asleep in poll (SLEEPING), a reply not read yet (FULL) or an unflagged request get the socket, and the
    mailbox is left as it was."""
    fast, drv, chan, peer = setup
    mb = wire.ffi.new("struct nvp_mailbox *")
    chan.mailbox = ffi.cast("void *", int(wire.ffi.cast("uintptr_t", mb)))
    drv.fail_launch = 719
    buf = bytearray(launch_req(1) + req(wire.NVP_OP_STREAM_SYNC, 2, 3, reply=True, mailbox=True))
    assert fast.run(chan, buf, 1) == (fastpath.MORE, len(buf), 3)
    assert mb.state == wire.NVP_MB_FULL
    assert (mb.rep.len, mb.rep.err, mb.rep.async_err, mb.rep.text_len) == (wire.REP.size, 0, 719, 0)
    assert chan.async_err == 0
    assert replies(peer) == []
    seq = 3
    for state, flagged in ((wire.NVP_MB_EMPTY, False), (wire.NVP_MB_SLEEPING, True), (wire.NVP_MB_FULL, True)):
        mb.state, mb.rep.err = state, -1
        assert fast.run(chan, bytearray(req(wire.NVP_OP_FLUSH, seq, reply=True, mailbox=flagged)), seq)[0] == \
            fastpath.MORE
        seq += 1
        assert [r[1] for r in replies(peer)] == [0]
        assert (mb.state, mb.rep.err) == (state, -1)


def test_queries_report_not_ready(setup) -> None:
    fast, drv, chan, peer = setup
    drv.busy = True
    buf = bytearray(req(wire.NVP_OP_EVENT_QUERY, 1, 4, reply=True) + req(wire.NVP_OP_STREAM_QUERY, 2, 3, reply=True))
    assert fast.run(chan, buf, 1) == (fastpath.MORE, len(buf), 3)
    assert [r[1] for r in replies(peer)] == [NOT_READY, NOT_READY]


def test_copies_records_and_cooperative_launches(setup) -> None:
    fast, drv, chan, peer = setup
    ev = [ffi.cast("void *", 0xA000 + i) for i in range(fastpath.COPY_EVENTS)]
    for i, e in enumerate(ev):
        chan.copy_events[i] = e
    chan.staging_base, chan.staging_size = 0x100000, 1 << 20
    params = struct.pack("<iiQ", 5, 0, 42)
    buf = bytearray(
        req(wire.NVP_OP_EVENT_RECORD, 1, 4, 3, 0)
        + req(wire.NVP_OP_STREAM_WAIT_EVENT, 2, 3, 4, 0)
        + req(wire.NVP_OP_MEMSET, 3, 0x2000, 0xAB, 64, 3)
        + req(wire.NVP_OP_MEMCPY, 4, 0x2000, 0x3000, 256, 3, reply=True)
        + req(wire.NVP_OP_STAGED_COPY, 5, 0x2000, 4096, 8192, 3, 1, reply=True)
        + launch_req(6, payload=params, coop=True)
    )
    assert fast.run(chan, buf, 1) == (fastpath.MORE, len(buf), 7)
    assert drv.calls == [
        ("record", EVENT, STREAM, 0), ("wait_event", STREAM, EVENT, 0), ("memset", 0x2000, 0xAB, 64, STREAM),
        ("memcpy", 0x2000, 0x3000, 256, STREAM), ("stream_query", STREAM), ("stream_sync", STREAM),
        ("memcpy", 0x100000 + 4096, 0x2000, 8192, STREAM), ("record", 0xA000, STREAM, 0),
        ("event_query", 0xA000), ("event_sync", 0xA000),
        ("coop", KERNEL, params[:4], params[8:]),
    ]
    assert chan.copy_next == 1
    assert [r[1] for r in replies(peer)] == [0, 0]
    # outside the staging buffer: Python reports the error
    assert fast.run(chan, bytearray(req(wire.NVP_OP_STAGED_COPY, 7, 0, (1 << 20) - 8, 16, 3, 0, reply=True)),
                    7)[0] == fastpath.PYTHON
    fast.set_translating(True)  # relocated module variables: copies need Python's address translation
    assert fast.run(chan, bytearray(req(wire.NVP_OP_MEMSET, 7, 0x2000, 0, 8, 3)), 7)[0] == fastpath.PYTHON


def test_forgetting_sends_everything_back_to_python(setup) -> None:
    fast, drv, chan, _peer = setup
    fast.forget_all()
    for msg in (launch_req(1), req(wire.NVP_OP_STREAM_SYNC, 1, 3, reply=True), req(wire.NVP_OP_EVENT_RECORD, 1, 4)):
        assert fast.run(chan, bytearray(msg), 1)[:2] == (fastpath.PYTHON, 0)
    assert drv.calls == []


def test_serve_receives_executes_and_replies_until_python_is_needed(setup) -> None:
    """nvpf_serve: C reads the socket itself; messages split across reads are put together."""
    fast, drv, chan, peer = setup
    a = socket.socket(fileno=chan.fd)
    try:
        msgs = launch_req(1) + req(wire.NVP_OP_STREAM_SYNC, 2, 3, reply=True) + launch_req(3, kernel=99)
        peer.sendall(msgs[:70])
        buf = bytearray(1 << 16)
        # the rest comes while C polls: it waits for whole messages
        threading.Timer(0.01, lambda: peer.sendall(msgs[70:])).start()
        why, left, seq = fast.serve(chan, buf, 0, 1, 100_000, 1_000_000)
        assert (why, seq) == (fastpath.PYTHON, 3)  # kernel 99 is Python's; it stays in the buffer
        assert bytes(buf[:left]) == launch_req(3, kernel=99)
        assert [c[0] for c in drv.calls] == ["launch", "stream_query", "stream_sync"]
        assert [r[1] for r in replies(peer)] == [0]
        # nothing more comes: back to Python after the idle time
        assert fast.serve(chan, buf, 0, 3, 1000, 1_000_000)[0] == fastpath.IDLE
        # a descriptor travels with a message: Python gets both
        r, w = socket.socketpair()
        socket.send_fds(peer, [launch_req(3)], [r.fileno()])
        why, left, seq = fast.serve(chan, buf, 0, 3, 100_000, 1_000_000)
        assert why == fastpath.FDS and chan.nfds == 1 and left == len(launch_req(3))
        os.close(chan.fds[0])
        r.close()
        w.close()
        peer.shutdown(socket.SHUT_WR)
        assert fast.serve(chan, buf, 0, 3, 100_000, 1_000_000)[0] == fastpath.CLOSED
    finally:
        a.detach()


def _serve_while_sending(fast, chan, peer, calls: int, gap_s: float, budget_us: int) -> tuple[int, float, int]:
    """Serve chan while a thread sends it a launch every gap_s; (why serve returned, when, launches sent by then)."""
    import time

    sent = [0]

    def sender() -> None:
        for seq in range(1, calls + 1):
            peer.sendall(launch_req(seq))
            sent[0] = seq
            time.sleep(gap_s)

    t = threading.Thread(target=sender)
    t0 = time.monotonic()
    t.start()
    why, _left, _seq = fast.serve(chan, bytearray(1 << 16), 0, 1, 150_000, budget_us)
    took, by_then = time.monotonic() - t0, sent[0]
    t.join()
    a = socket.socket(fileno=chan.fd)  # (what came after serve returned: not the next serve's)
    try:
        while True:
            a.recv(1 << 16)
    except BlockingIOError:
        pass
    finally:
        a.detach()
    return why, took, by_then


def test_serve_hands_over_at_its_budget_only_when_the_event_loop_has_work(setup) -> None:
    """Every budget_us, serve looks at Python's event loop (nvpf_set_loop_fd): while it has nothing ready, C goes on
    serving, and a turn is handed over once it has (a new connection, a control command)."""
    fast, drv, chan, peer = setup
    r, w = os.pipe()  # the "event loop": readable once something is written
    try:
        fast.set_loop_fd(r)
        why, took, sent = _serve_while_sending(fast, chan, peer, 25, 0.001, 2_000)
        assert why == fastpath.IDLE and sent == 25  # kept serving past 2 ms, until the calls stopped
        assert sum(c[0] == "launch" for c in drv.calls) == 25
        # (C hands over after 100 ms in any case: these serve well below that)
        threading.Timer(0.01, lambda: os.write(w, b"x")).start()
        why, took, sent = _serve_while_sending(fast, chan, peer, 100, 0.001, 2_000)
        assert why == fastpath.IDLE and took < 0.06, f"served {took:.3f} s, {sent} calls, despite the loop's work"
        os.read(r, 1)
        fast.set_loop_fd(-1)  # not known: a turn every budget
        why, took, sent = _serve_while_sending(fast, chan, peer, 100, 0.001, 2_000)
        assert why == fastpath.IDLE and took < 0.06
    finally:
        fast.set_loop_fd(-1)
        os.close(r)
        os.close(w)


def record_req(seq: int) -> bytes:
    """An event record on stream 3 whose flags are its seq (so the driver's calls show the order)."""
    return req(wire.NVP_OP_EVENT_RECORD, seq, 4, 3, seq)


@pytest.fixture
def second(setup):
    """A second calling thread's channel (and its peer) beside setup's."""
    fast = setup[0]
    a, b = socket.socketpair()
    a.setblocking(False)
    yield fast.channel(a.fileno()), b
    a.close()
    b.close()


def test_serve_many_executes_several_threads_in_call_order(setup, second) -> None:
    """nvpf_serve_many: calls are executed in seq order across the channels, whichever socket or mailbox slot they
    came through and whenever; one for Python stops C with its channel named and its bytes left there."""
    fast, drv, chan, peer = setup
    chan2, peer2 = second
    mb = wire.ffi.new("struct nvp_mailbox *")
    chan2.mailbox = ffi.cast("void *", int(wire.ffi.cast("uintptr_t", mb)))
    peer2.sendall(record_req(2) + record_req(4))  # the second thread's calls arrive before the first's

    def first() -> None:
        import time

        time.sleep(0.01)
        peer.sendall(record_req(1) + record_req(3) + record_req(5))
        _post(mb, record_req(6))  # (the slot: taken once 5 is done)
        peer.sendall(record_req(7))
        time.sleep(0.01)
        peer2.sendall(launch_req(8, kernel=99) + record_req(9))  # kernel 99 was never taught: Python's

    t = threading.Thread(target=first)
    t.start()
    bufs = [bytearray(1 << 16), bytearray(1 << 16)]
    why, which, lefts, seq = fast.serve_many([chan, chan2], bufs, 1, 200_000, 5_000_000)
    t.join()
    assert (why, which, seq) == (fastpath.PYTHON, 1, 8)
    assert [c[3] for c in drv.calls] == [1, 2, 3, 4, 5, 6, 7]
    assert lefts[0] == 0 and bytes(bufs[1][: lefts[1]]) == launch_req(8, kernel=99) + record_req(9)
    assert mb.slot == wire.NVP_SLOT_CLOSED


def test_serve_many_issues_launches_on_worker_threads_in_order_per_stream(setup, second) -> None:
    """Serving several channels, launches on streams go to worker threads (a stream's to one worker, in order);
    every other call waits until they are issued, so nothing overtakes a launch; launches on the legacy stream are
    the dispatcher's, after what the workers hold.  The workers make the dispatcher's context current."""
    fast, drv, chan, peer = setup
    chan2, peer2 = second
    ctx, threads, current = 0xC7C, set(), []

    def get_current(out) -> int:
        out[0] = ffi.cast("void *", ctx)
        return 0

    def set_current(c) -> int:
        current.append(Driver.h(c))
        return 0

    plain_launch = drv.launch

    def launch(*args) -> int:
        if Driver.h(args[8]):  # (a stream's launch, not the legacy stream's)
            threads.add(threading.get_ident())
        return plain_launch(*args)

    cbs = [ffi.callback("int(void **)", get_current), ffi.callback("int(void *)", set_current),
           ffi.callback(ffi.typeof(ffi.new("struct nvpf_driver *").launch), launch)]
    addresses = dict(drv.addresses, ctx_get_current=int(ffi.cast("uintptr_t", cbs[0])),
                     ctx_set_current=int(ffi.cast("uintptr_t", cbs[1])), launch=int(ffi.cast("uintptr_t", cbs[2])))
    fast = fastpath.FastPath(addresses, spin_us=200, launch_threads=2)
    fast.learn_stream(5, STREAM + 0x10, int)
    params = [struct.pack("<iiQ", i, 0, i) for i in range(12)]
    first = b"".join(launch_req(1 + 2 * i, stream=3, payload=params[i]) for i in range(6))
    second_ = b"".join(launch_req(2 + 2 * i, stream=5, payload=params[6 + i]) for i in range(6))
    peer.sendall(first)
    peer2.sendall(second_ + launch_req(13, payload=b"legacy") + record_req(14))
    bufs = [bytearray(1 << 16), bytearray(1 << 16)]
    why, which, lefts, seq = fast.serve_many([chan, chan2], bufs, 1, 20_000, 5_000_000)
    assert seq == 15 and lefts == [0, 0], (why, which)
    launches = [c for c in drv.calls if c[0] == "launch"]
    assert [c[6] for c in launches if c[5] == STREAM] == params[:6]  # (each stream's in order)
    assert [c[6] for c in launches if c[5] == STREAM + 0x10] == params[6:]
    assert launches[-1][5] == 0 and launches[-1][6] == b"legacy"  # (after every worker's)
    assert drv.calls[-1][0] == "record" and len(launches) == 13
    assert threads and threading.get_ident() not in threads  # (the workers issued them, not the dispatcher)
    assert set(current) == {ctx}
    fast.lib.nvpf_set_launch_threads(4)


def _recording_workers(drv: Driver) -> tuple[fastpath.FastPath, list[tuple[int, int, bytes]], list]:
    """A FastPath over drv whose launches record (thread, stream, parameters), with a context to make current."""
    issued: list[tuple[int, int, bytes]] = []
    plain_launch = drv.launch

    def launch(*args) -> int:
        rc = plain_launch(*args)
        issued.append((threading.get_ident(), Driver.h(args[8]), drv.calls[-1][6]))
        return rc

    cbs = [ffi.callback("int(void **)", lambda out: (out.__setitem__(0, ffi.cast("void *", 0xC7C)), 0)[1]),
           ffi.callback("int(void *)", lambda c: 0),
           ffi.callback(ffi.typeof(ffi.new("struct nvpf_driver *").launch), launch)]
    addresses = dict(drv.addresses, ctx_get_current=int(ffi.cast("uintptr_t", cbs[0])),
                     ctx_set_current=int(ffi.cast("uintptr_t", cbs[1])), launch=int(ffi.cast("uintptr_t", cbs[2])))
    return fastpath.FastPath(addresses, spin_us=200, launch_threads=2), issued, cbs


def test_serve_many_gives_each_thread_its_own_worker_and_keeps_a_shared_stream_in_order(setup, second) -> None:
    """Two threads launching on streams of their own, whose handles are alike in their low bits: each thread's
    launches are issued by a worker of their own (the native runtime issues them on the two threads).  Then both
    launch on one stream, alternately: its launches are issued in call order, whichever worker issues each."""
    _fast, drv, chan, peer = setup
    chan2, peer2 = second
    fast, issued, _cbs = _recording_workers(drv)
    fast.learn_stream(5, STREAM + 0x20, int)
    params = [struct.pack("<iiQ", i, 0, i) for i in range(40)]
    peer.sendall(b"".join(launch_req(1 + 2 * i, stream=3, payload=params[i]) for i in range(10)))
    peer2.sendall(b"".join(launch_req(2 + 2 * i, stream=5, payload=params[10 + i]) for i in range(10)))
    bufs = [bytearray(1 << 16), bytearray(1 << 16)]
    why, which, lefts, seq = fast.serve_many([chan, chan2], bufs, 1, 20_000, 5_000_000)
    assert seq == 21 and lefts == [0, 0], (why, which)
    by_stream = {s: {t for t, s2, _p in issued if s2 == s} for s in (STREAM, STREAM + 0x20)}
    assert [p for _t, s, p in issued if s == STREAM] == params[:10]
    assert [p for _t, s, p in issued if s == STREAM + 0x20] == params[10:20]
    assert len(by_stream[STREAM]) == 1 and len(by_stream[STREAM + 0x20]) == 1
    assert by_stream[STREAM] != by_stream[STREAM + 0x20]  # (two workers)
    issued.clear()
    peer.sendall(b"".join(launch_req(21 + 2 * i, stream=5, payload=params[20 + 2 * i]) for i in range(10)))
    peer2.sendall(b"".join(launch_req(22 + 2 * i, stream=5, payload=params[21 + 2 * i]) for i in range(10)))
    why, which, lefts, seq = fast.serve_many([chan, chan2], bufs, 21, 20_000, 5_000_000)
    assert seq == 41 and lefts == [0, 0], (why, which)
    assert [p for _t, _s, p in issued] == params[20:40]
    fast.lib.nvpf_set_launch_threads(4)


def test_serve_many_passes_a_launch_whose_worker_is_full(setup, second) -> None:
    """A launch whose worker's queue is full does not stop the other threads: their launches on other streams go
    on in its place in call order.  A launch on its stream and every other call still come after it."""
    _fast, drv, chan, peer = setup
    chan2, peer2 = second
    gate = threading.Event()
    plain_launch = drv.launch

    def launch(*args) -> int:
        if Driver.h(args[8]) == STREAM:
            gate.wait(10)  # (the first thread's worker stays busy until the other thread's launches are issued)
        return plain_launch(*args)

    drv.launch = launch
    fast, issued, _cbs = _recording_workers(drv)
    fast.learn_stream(5, STREAM + 0x20, int)
    queue = 64  # (a worker's queue: WORK_RING)
    n = queue + 3  # (one in its worker's hands, a queue full, two passed over)
    params = [struct.pack("<iiQ", i, 0, i) for i in range(n + 11)]
    peer.sendall(b"".join(launch_req(1 + i, stream=3, payload=params[i]) for i in range(n)))
    peer2.sendall(b"".join(launch_req(n + 1 + i, stream=5, payload=params[n + i]) for i in range(10))
                  + launch_req(n + 11, stream=3, payload=params[n + 10]) + record_req(n + 12))
    passed = []

    def release() -> None:
        for _ in range(1000):
            if sum(s == STREAM + 0x20 for _t, s, _p in issued) == 10:
                passed.append(True)
                break
            gate.wait(0.01)
        gate.set()

    t = threading.Thread(target=release)
    t.start()
    bufs = [bytearray(1 << 16), bytearray(1 << 16)]
    why, which, lefts, seq = fast.serve_many([chan, chan2], bufs, 1, 20_000, 5_000_000)
    t.join()
    assert seq == n + 13 and lefts == [0, 0], (why, which)
    assert passed == [True]  # (the second thread's launches were issued while the first's worker was busy)
    assert [p for _t, s, p in issued if s == STREAM] == params[:n] + [params[n + 10]]
    assert [p for _t, s, p in issued if s == STREAM + 0x20] == params[n:n + 10]
    assert drv.calls[-1] == ("record", EVENT, STREAM, n + 12) and len(drv.calls) == n + 12
    fast.lib.nvpf_set_launch_threads(4)


def test_serve_many_leaves_calls_whose_turn_never_came_to_python(setup, second) -> None:
    """A call that waits for an earlier one that never comes (a thread between taking its seq and sending) is not
    lost: C returns once idle and the bytes go back to Python; a request in a slot goes with them."""
    fast, drv, chan, _peer = setup
    chan2, peer2 = second
    mb = wire.ffi.new("struct nvp_mailbox *")
    chan.mailbox = ffi.cast("void *", int(wire.ffi.cast("uintptr_t", mb)))
    peer2.sendall(record_req(3))
    t = threading.Thread(target=_post, args=(mb, record_req(2)))
    t.start()
    bufs = [bytearray(1 << 16), bytearray(1 << 16)]
    why, which, lefts, seq = fast.serve_many([chan, chan2], bufs, 1, 20_000, 5_000_000)
    t.join()
    assert seq == 1 and drv.calls == [] and lefts == [0, len(record_req(3))]
    # (taken as the slot closed; the serve still ends for what ended it: Python takes side whatever that was)
    assert (why, which) == (fastpath.IDLE, -1) and fast.side(chan) == record_req(2)
    assert fast.serve_many([chan, chan2], bufs, 1, 1_000, 5_000_000)[:2] == (fastpath.IDLE, -1)


@pytest.mark.parametrize("answer", ["done", "stop", "left"])
def test_python_executes_what_c_leaves_while_c_serves_on(setup, second, answer: str) -> None:
    """With Python's hook, a call C leaves to Python (a kernel it was never taught) is executed where C meets it,
    in call order and after every earlier launch was issued, and C serves on; a hook that stops C has executed the
    call (C returns IDLE after it), one that leaves it gets it back as without the hook (PYTHON, its bytes left)."""
    fast, drv, chan, peer = setup
    chan2, peer2 = second
    code = {"done": fastpath.INLINE_DONE, "stop": fastpath.INLINE_STOP, "left": fastpath.INLINE_LEFT}[answer]
    fds = []

    def hook(c, msg: bytes) -> int:
        fds.append(c.fd)
        drv.calls.append(("python", wire.REQ.unpack_from(msg)[3], len(msg)))
        return code

    fast.set_python(hook)
    try:
        peer.sendall(launch_req(1, stream=3) + launch_req(2, kernel=99, stream=3) + record_req(4))
        peer2.sendall(record_req(3))
        bufs = [bytearray(1 << 16), bytearray(1 << 16)]
        why, which, lefts, seq = fast.serve_many([chan, chan2], bufs, 1, 20_000, 5_000_000)
    finally:
        fast.set_python(None)
    launched = ("launch", KERNEL, (3, 2, 1), (128, 1, 1), 64, STREAM, b"")
    python = ("python", 2, len(launch_req(2)))
    assert fds == [chan.fd]
    if answer == "done":
        assert (why, which, lefts, seq) == (fastpath.IDLE, -1, [0, 0], 5)
        assert drv.calls == [launched, python, ("record", EVENT, STREAM, 3), ("record", EVENT, STREAM, 4)]
    elif answer == "stop":
        assert (why, which, seq) == (fastpath.IDLE, 0, 3) and lefts == [len(record_req(4)), len(record_req(3))]
        assert drv.calls == [launched, python]
    else:
        assert (why, which, seq) == (fastpath.PYTHON, 0, 2)
        assert bytes(bufs[0][: lefts[0]]).startswith(launch_req(2, kernel=99, stream=3))
        assert drv.calls == [launched, python]


def test_serve_many_names_the_channel_that_closed_or_sent_descriptors(setup, second) -> None:
    """Descriptors and an end of file come back to Python with the channel they came on; what the other channel
    received meanwhile stays in its buffer."""
    fast, drv, chan, peer = setup
    chan2, peer2 = second
    bufs = [bytearray(1 << 16), bytearray(1 << 16)]
    r, w = socket.socketpair()
    try:
        peer.sendall(record_req(3))
        socket.send_fds(peer2, [record_req(2)], [r.fileno()])
        why, which, lefts, seq = fast.serve_many([chan, chan2], bufs, 1, 100_000, 5_000_000)
        assert (why, which, seq) == (fastpath.FDS, 1, 1) and chan2.nfds == 1
        os.close(chan2.fds[0])
        assert bytes(bufs[1][: lefts[1]]) == record_req(2)
        assert lefts[0] in (0, len(record_req(3)))  # (read or not yet: either way not run, not its turn)
        assert drv.calls == []
        peer.shutdown(socket.SHUT_WR)
        why, which, _lefts, _seq = fast.serve_many([chan, chan2], [bytearray(1 << 16), bytearray(1 << 16)], 1,
                                                   100_000, 5_000_000)
        assert (why, which) == (fastpath.CLOSED, 0)
    finally:
        r.close()
        w.close()


def test_serve_hands_over_only_for_sockets_it_does_not_serve(setup, second) -> None:
    """With Python's epoll as the loop descriptor, the served channels' own sockets being readable is no reason
    for a turn (C reads them itself); another socket of the loop is."""
    import select
    import time

    fast, drv, chan, peer = setup
    chan2, peer2 = second
    ep = select.epoll()
    r, w = os.pipe()
    one = record_req(1000)  # never its turn
    cap = 800 * len(one)
    try:
        for fd in (chan.fd, chan2.fd, r):
            ep.register(fd, select.EPOLLIN)
        fast.set_loop_fd(ep.fileno())
        for wake in (None, 0.01):
            drv.calls.clear()
            # the second channel's buffer is full of calls whose turn has not come: its socket stays readable
            bufs = [bytearray(cap), bytearray(one * 800)]
            lens = ffi.new("size_t[]", [0, cap])
            peer2.sendall(one)
            seq, which = ffi.new("uint64_t *", 1), ffi.new("int *")
            sender = threading.Thread(target=lambda: [(peer.sendall(launch_req(k)), time.sleep(0.001))
                                                      for k in range(1, 26)])
            if wake:
                threading.Timer(wake, lambda: os.write(w, b"x")).start()
            views = [ffi.from_buffer("uint8_t[]", b) for b in bufs]
            t0 = time.monotonic()
            sender.start()
            why = fast.lib.nvpf_serve_many(ffi.new("struct nvpf_chan *[]", [chan, chan2]),
                                           ffi.new("uint8_t *[]", views), lens, 2, cap, seq, 150_000, 2_000, which)
            took = time.monotonic() - t0
            sender.join()
            launches = sum(c[0] == "launch" for c in drv.calls)
            assert why == fastpath.IDLE
            if wake is None:  # kept serving past 2 ms, until the calls stopped
                assert launches == 25, f"handed over after {took:.3f} s, {launches} calls"
            else:
                assert took < 0.06, f"served {took:.3f} s, {launches} calls, despite the loop's work"
                os.read(r, 1)
            for fd in (chan.fd, chan2.fd):  # (what is left: not the next round's)
                a = socket.socket(fileno=fd)
                try:
                    while a.recv(1 << 16):
                        pass
                except BlockingIOError:
                    pass
                finally:
                    a.detach()
    finally:
        fast.set_loop_fd(-1)
        ep.close()
        os.close(r)
        os.close(w)


def test_graph_launches_once_taught(setup) -> None:
    fast, drv, chan, _peer = setup
    launch = req(wire.NVP_OP_GRAPH_LAUNCH, 1, 9, 3, 0)
    assert fast.run(chan, bytearray(launch), 1)[0] == fastpath.PYTHON  # unknown executable graph
    fast.learn_graph_exec(9, 0x8000, int)
    upload = req(wire.NVP_OP_GRAPH_LAUNCH, 2, 9, 3, 1)
    assert fast.run(chan, bytearray(launch + upload), 1) == (fastpath.PYTHON, len(launch), 2)  # uploads: Python
    assert drv.calls == [("graph_launch", 0x8000, STREAM)]
    fast.set_capturing(True)  # while a capture is on, Python sees (and logs) everything
    assert fast.run(chan, bytearray(req(wire.NVP_OP_GRAPH_LAUNCH, 2, 9, 3, 0)), 2)[:2] == (fastpath.PYTHON, 0)
    fast.set_capturing(False)


def _post(mb, msg: bytes, timeout: float = 5.0, length: int | None = None) -> None:
    """What the shim does (mailbox.c nvp_mailbox_post): a request into the mailbox's slot, once the proxy has it open
    (length: another slot_len than the message's)."""
    import time

    end = time.monotonic() + timeout
    while mb.slot != wire.NVP_SLOT_OPEN:
        assert time.monotonic() < end, "the slot never opened"
    ffi.memmove(wire.ffi.cast("uint8_t *", mb.req), msg, len(msg))
    mb.slot_len = len(msg) if length is None else length
    mb.slot = wire.NVP_SLOT_POSTED


def test_serve_takes_requests_posted_in_the_mailbox(setup) -> None:
    """The mailbox's request slot: C opens it while it serves, executes what is posted there in seq order
    (replying through the mailbox too), leaves a request it cannot execute to Python, and closes it."""
    fast, drv, chan, _peer = setup
    mb = wire.ffi.new("struct nvp_mailbox *")
    chan.mailbox = ffi.cast("void *", int(wire.ffi.cast("uintptr_t", mb)))

    def thread() -> None:
        _post(mb, launch_req(1))
        _post(mb, req(wire.NVP_OP_STREAM_SYNC, 2, 3, reply=True, mailbox=True))
        while mb.state != wire.NVP_MB_FULL:
            pass
        _post(mb, launch_req(3, kernel=99))  # never taught: Python's

    t = threading.Thread(target=thread)
    t.start()
    why, left, seq = fast.serve(chan, bytearray(1 << 16), 0, 1, 2_000_000, 5_000_000)
    t.join()
    assert (why, left, seq) == (fastpath.PYTHON, 0, 3)
    assert fast.side(chan) == launch_req(3, kernel=99)
    assert drv.calls[0][0] == "launch" and drv.calls[-1] == ("stream_sync", STREAM)
    assert (mb.state, mb.rep.err) == (wire.NVP_MB_FULL, 0)
    assert mb.slot == wire.NVP_SLOT_CLOSED


def test_a_posted_request_out_of_turn_goes_to_python(setup) -> None:
    """A request posted before an earlier one (of this or another thread) arrived stays posted until C stops
    polling, then goes to Python with the rest, which runs it in its turn."""
    fast, drv, chan, _peer = setup
    mb = wire.ffi.new("struct nvp_mailbox *")
    chan.mailbox = ffi.cast("void *", int(wire.ffi.cast("uintptr_t", mb)))
    t = threading.Thread(target=_post, args=(mb, launch_req(7)))
    t.start()
    why, left, seq = fast.serve(chan, bytearray(1 << 16), 0, 5, 20_000, 5_000_000)
    t.join()
    assert (why, left, seq) == (fastpath.IDLE, 0, 5)
    assert fast.side(chan) == launch_req(7) and chan.side_len == 0
    assert drv.calls == []
    assert mb.slot == wire.NVP_SLOT_CLOSED


def test_a_damaged_posted_request_reaches_python_as_malformed(setup, capsys) -> None:
    """The slot is the application's memory: a length past the slot is cut to it, a damaged header goes to Python,
    which closes that thread's channel (and only that)."""
    from types import SimpleNamespace

    from nvproxy.proxy.dispatch import Dispatcher  # noqa: F401  (the server's import order, as the proxy's)
    from nvproxy.proxy.server import Server

    fast, drv, chan, _peer = setup
    mb = wire.ffi.new("struct nvp_mailbox *")
    chan.mailbox = ffi.cast("void *", int(wire.ffi.cast("uintptr_t", mb)))
    bad = struct.pack("<IHHQ", 5, wire.NVP_OP_LAUNCH, 0, 1) + b"\0" * 64  # impossible length, seq 1

    t = threading.Thread(target=_post, args=(mb, bad), kwargs={"length": 1 << 30})
    t.start()
    why, _left, seq = fast.serve(chan, bytearray(1 << 16), 0, 1, 20_000, 5_000_000)
    t.join()
    side = fast.side(chan)
    assert (why, seq, len(side)) == (fastpath.PYTHON, 1, wire.NVP_MB_REQ_MAX) and side.startswith(bad)
    assert drv.calls == []
    dropped = []
    server = SimpleNamespace(heap=[], tiebreak=0, _drop=dropped.append, _execute_ready=lambda: None)
    ch = SimpleNamespace(tid=7, queued=0)
    Server._side(server, ch, side)
    assert dropped == [ch] and server.heap == []
    assert "malformed message in the mailbox of thread 7" in capsys.readouterr().err
    Server._side(server, ch, launch_req(2) + launch_req(3))  # two whole requests: both go to the heap, in order
    assert [e[0] for e in sorted(server.heap)] == [2, 3]


def test_what_follows_a_posted_request_goes_to_python_alone(setup) -> None:
    """A slot whose length runs past its request: the request runs once, and only the bytes after it go to Python
    (which finds them malformed)."""
    fast, drv, chan, _peer = setup
    mb = wire.ffi.new("struct nvp_mailbox *")
    chan.mailbox = ffi.cast("void *", int(wire.ffi.cast("uintptr_t", mb)))
    msg = launch_req(1) + b"\xee" * 40
    t = threading.Thread(target=_post, args=(mb, msg))
    t.start()
    why, _left, seq = fast.serve(chan, bytearray(1 << 16), 0, 1, 20_000, 5_000_000)
    t.join()
    assert (why, seq) == (fastpath.PYTHON, 2)
    assert fast.side(chan) == b"\xee" * 40
    assert [c[0] for c in drv.calls] == ["launch"]


_MAILBOXES: list = []  # (C writes to a channel's mailbox while the channel is used: none is freed under it)


def staging_channel(chan) -> object:
    """Give chan a mailbox (returned), a staging buffer at 0x100000 of 1 MiB and its copy events 0xA000..."""
    mb = wire.ffi.new("struct nvp_mailbox *")
    _MAILBOXES.append(mb)
    chan.mailbox = ffi.cast("void *", int(wire.ffi.cast("uintptr_t", mb)))
    chan.staging_base, chan.staging_size = 0x100000, 1 << 20
    for i in range(fastpath.COPY_EVENTS):
        chan.copy_events[i] = ffi.cast("void *", 0xA000 + i)
    return mb


def test_posted_copies_answer_before_their_dma_ends(setup) -> None:
    """A posted host-to-device copy (NVP_OP_STAGED_COPY, a5 its number) is answered once issued: at once for
    cudaMemcpyAsync, for cudaMemcpy once the streams it waits for are idle, else once done.  Which are done goes
    to the mailbox's posted_done, oldest first; a fence answers once they are; a copy from the device is put after
    those still in flight (it may land where they read)."""
    fast, drv, chan, peer = setup
    mb = staging_channel(chan)
    asynchronous = wire.CONSTANTS["NVP_STAGED_ASYNC"]

    def posted(seq: int, num: int, flags: int = 0, off: int = 0) -> bytearray:
        return bytearray(req(wire.NVP_OP_STAGED_COPY, seq, 0x2000, off, 4096, 3, 0, num, flags, reply=True))

    def fence(seq: int, upto: int) -> bytearray:
        return bytearray(req(wire.NVP_OP_STAGED_FENCE, seq, upto, reply=True))

    assert fast.run(chan, posted(1, 1, asynchronous), 1)[:2] == (fastpath.PYTHON, 0)  # no ring of events yet
    for i in range(fastpath.POSTED):
        chan.posted_events[i] = ffi.cast("void *", 0xB000 + i)
    chan.posted_dev = 0
    assert fast.run(chan, posted(1, 1), 1)[:2] == (fastpath.PYTHON, 0)  # which streams a cudaMemcpy waits for?
    drv.pending = {0xB000}  # (its DMA runs on)
    assert fast.run(chan, posted(1, 1, asynchronous), 1)[::2] == (fastpath.MORE, 2)
    assert drv.calls == [("memcpy", 0x2000, 0x100000, 4096, STREAM), ("record", 0xB000, STREAM, 0)]
    fast.set_sync_streams(0, [0, STREAM])
    drv.calls.clear()
    assert fast.run(chan, posted(2, 2, off=8192), 2)[::2] == (fastpath.MORE, 3)
    assert drv.calls == [("stream_query", 0), ("stream_query", STREAM),
                         ("memcpy", 0x2000, 0x100000 + 8192, 4096, STREAM), ("record", 0xB001, STREAM, 0)]
    assert [r[1] for r in replies(peer)] == [0, 0] and mb.posted_done == 0
    drv.pending = {0xB001}
    assert fast.run(chan, fence(3, 1), 3)[::2] == (fastpath.MORE, 4)  # the first is done: published
    assert mb.posted_done == 1 and [r[1] for r in replies(peer)] == [0]
    assert fast.run(chan, fence(4, 2), 4)[:2] == (fastpath.PYTHON, 0)  # still running: a waiter thread waits
    wait = fast.posted_fence(chan, 2)
    assert wait is not None and mb.posted_done == 1
    wait()
    assert mb.posted_done == 2 and ("event_sync", 0xB001) in drv.calls
    # the streams a cudaMemcpy waits for stay busy (Python issued work since): answered once the copy is done
    drv.calls.clear()
    drv.pending = {STREAM}
    fast.note_issue()
    assert fast.run(chan, posted(4, 3), 4)[::2] == (fastpath.MORE, 5)
    assert drv.calls[-3:] == [("record", 0xB002, STREAM, 0), ("event_query", 0xB002), ("event_sync", 0xB002)]
    # a copy from the device after one still in flight waits for it on the device
    drv.pending = {0xB003}
    drv.calls.clear()
    buf = posted(5, 4, asynchronous) + bytearray(req(wire.NVP_OP_STAGED_COPY, 6, 0x3000, 0, 4096, 3, 1, reply=True))
    assert fast.run(chan, buf, 5)[::2] == (fastpath.MORE, 7)
    assert drv.calls[:4] == [("event_query", 0xB002), ("memcpy", 0x2000, 0x100000, 4096, STREAM),
                             ("record", 0xB003, STREAM, 0), ("wait_event", STREAM, 0xB003, 0)]
    assert ("memcpy", 0x100000, 0x3000, 4096, STREAM) in drv.calls
    assert mb.posted_done == 3
    fast.posted_drain(chan)  # (a staging buffer changing hands)
    assert mb.posted_done == 4 and chan.posted_count == 0


def test_a_posted_copy_is_answered_before_it_is_issued(setup) -> None:
    """The driver copies a small copy's bytes into its command stream while it issues it (benchmarks/probes/
    issue_cost.cu): a posted copy is answered first, so that the thread stages its next copy meanwhile.  An issue
    that fails is reported by the next reply, as an asynchronous error."""
    fast, drv, chan, peer = setup
    staging_channel(chan)
    for i in range(fastpath.POSTED):
        chan.posted_events[i] = ffi.cast("void *", 0xB000 + i)
    chan.posted_dev = 0
    asynchronous = wire.CONSTANTS["NVP_STAGED_ASYNC"]
    record, answered = drv._rec, []

    def issue(*call):
        if call[0] != "memcpy":
            return record(*call)
        try:
            answered.append(len(peer.recv(64, socket.MSG_PEEK | socket.MSG_DONTWAIT)) > 0)
        except BlockingIOError:
            answered.append(False)
        return fail[0] or record(*call)

    fail = [0]
    drv._rec = issue
    posted = lambda seq, num: bytearray(  # noqa: E731
        req(wire.NVP_OP_STAGED_COPY, seq, 0x2000, 0, 4096, 3, 0, num, asynchronous, reply=True))
    assert fast.run(chan, posted(1, 1), 1)[::2] == (fastpath.MORE, 2)
    assert answered == [True] and [r[1:3] for r in replies(peer)] == [(0, 0)]
    fail[0] = 700  # (CUDA_ERROR_ILLEGAL_ADDRESS)
    assert fast.run(chan, posted(2, 2) + bytearray(req(wire.NVP_OP_FLUSH, 3, reply=True)), 2)[::2] == (fastpath.MORE,
                                                                                                      4)
    assert [r[1:3] for r in replies(peer)] == [(0, 0), (0, 700)]  # the copy's own reply went before the failure
    assert [c[0] for c in drv.calls].count("record") == 1  # (the failed copy is not in flight)


def test_a_captured_copy_takes_its_bytes_once_the_streams_are_idle(setup) -> None:
    """A synchronous copy from pinned memory (NVP_STAGED_CAPTURE, a7 its source): once the streams it waits for are
    idle, C copies its bytes into the staging buffer, answers, and then issues the DMA from there.  While they are
    busy (a kernel may still be writing the source), or where the source cannot be read, the DMA reads the source
    itself and the answer waits for it."""
    fast, drv, chan, peer = setup
    staging_channel(chan)
    staging = ffi.new("uint8_t[]", 1 << 16)
    chan.staging_base, chan.staging_size = int(ffi.cast("uintptr_t", staging)), 1 << 16
    for i in range(fastpath.POSTED):
        chan.posted_events[i] = ffi.cast("void *", 0xB000 + i)
    chan.posted_dev = 0
    fast.set_sync_streams(0, [0, STREAM])
    data = bytes(range(256)) * 16
    src = ffi.new("uint8_t[]", data)
    source = int(ffi.cast("uintptr_t", src))
    record, answered = drv._rec, []

    def issue(*call):
        if call[0] == "memcpy":
            try:
                answered.append(len(peer.recv(64, socket.MSG_PEEK | socket.MSG_DONTWAIT)) > 0)
            except (BlockingIOError, TimeoutError):  # (replies() left the socket with a timeout)
                answered.append(False)
        return record(*call)

    drv._rec = issue

    def captured(seq: int, num: int, off: int, source: int) -> list[tuple]:
        """Run it; the memcpy it issued, after checking that it was answered (when answered says)."""
        answered.clear()
        drv.calls.clear()
        msg = bytearray(req(wire.NVP_OP_STAGED_COPY, seq, 0x2000, off, len(data), 0, 0, num,
                            wire.CONSTANTS["NVP_STAGED_CAPTURE"], source, reply=True))
        assert fast.run(chan, msg, seq)[::2] == (fastpath.MORE, seq + 1)
        assert [r[1] for r in replies(peer)] == [0]
        return [c for c in drv.calls if c[0] == "memcpy"]

    # idle: taken, answered, then issued from the staging buffer
    assert captured(1, 1, 0, source) == [("memcpy", 0x2000, chan.staging_base, len(data), 0)]
    assert answered == [True] and bytes(ffi.buffer(staging, len(data))) == data
    # busy (other work was issued, and the stream runs on): issued from the source, answered once done
    drv.pending = {STREAM}
    fast.note_issue()
    assert captured(2, 2, 8192, source) == [("memcpy", 0x2000, source, len(data), 0)]
    assert answered == [False] and bytes(ffi.buffer(staging + 8192, len(data))) == bytes(len(data))
    # idle again, but the source is not this process's memory: issued from it (the driver says what it is)
    drv.pending = set()
    fast.note_issue()
    assert captured(3, 3, 16384, 0x10) == [("memcpy", 0x2000, 0x10, len(data), 0)]
    assert answered == [False]


def test_a_synchronous_posted_copy_waits_for_other_work_not_for_posted_copies(setup) -> None:
    """Once the streams a cudaMemcpy waits for were seen idle, later synchronous posted copies are answered at once
    while nothing but posted copies (and waits, queries, fences) was issued: no host can tell whether they waited
    for those.  Any other work, C's or Python's, or a change of those streams, makes the next one ask again."""
    fast, drv, chan, peer = setup
    staging_channel(chan)
    for i in range(fastpath.POSTED):
        chan.posted_events[i] = ffi.cast("void *", 0xB000 + i)
    chan.posted_dev = 0
    fast.set_sync_streams(0, [0, STREAM])
    seq = 1

    def copy(num: int) -> list[tuple]:
        """Run one synchronous posted copy; the driver calls it made before its memcpy, and its answer."""
        nonlocal seq
        drv.calls.clear()
        msg = bytearray(req(wire.NVP_OP_STAGED_COPY, seq, 0x2000, 4096 * num, 4096, 0, 0, num, 0, reply=True))
        assert fast.run(chan, msg, seq)[::2] == (fastpath.MORE, seq + 1)
        seq += 1
        assert [r[1] for r in replies(peer)] == [0]
        at = next(i for i, c in enumerate(drv.calls) if c[0] == "memcpy")
        return [c for c in drv.calls[:at] if c[0] == "stream_query"]

    queried = [("stream_query", 0), ("stream_query", STREAM)]
    assert copy(1) == queried  # first: the streams are asked
    for n in range(2, 6):  # then posted copies only: not asked, though the last ones' DMA runs on
        drv.pending = {0xB000 + n - 2}
        assert copy(n) == []
    drv.pending = set()
    fence = bytearray(req(wire.NVP_OP_STAGED_FENCE, seq, 5, reply=True))
    assert fast.run(chan, fence, seq)[::2] == (fastpath.MORE, seq + 1)  # a fence issues nothing
    seq += 1
    replies(peer)
    assert copy(6) == []
    assert fast.run(chan, bytearray(launch_req(seq)), seq)[::2] == (fastpath.MORE, seq + 1)  # a kernel: asked again
    seq += 1
    assert copy(7) == queried
    assert copy(8) == []
    fast.note_issue()  # Python executed a call
    assert copy(9) == queried
    fast.set_sync_streams(0, [0, STREAM])  # a stream came or went
    assert copy(10) == queried
    from_device = bytearray(req(wire.NVP_OP_STAGED_COPY, seq, 0x3000, 0, 4096, 0, 1, reply=True))
    assert fast.run(chan, from_device, seq)[::2] == (fastpath.MORE, seq + 1)
    seq += 1
    replies(peer)
    assert copy(11) == queried
    # streams seen busy: answered once the copy is done, and asked again next time
    fast.note_issue()
    drv.pending = {0}
    assert copy(12) == [] and ("event_sync", 0xB000 + 11 % fastpath.POSTED) in drv.calls
    drv.pending = set()
    assert copy(13) == queried


def test_an_unanswered_posted_copy_is_only_issued(setup) -> None:
    """A posted copy sent without a reply (NVP_STAGED_UNANSWERED: the shim knows its answer) is issued and put in
    the ring at once, whatever the streams do, and nothing is sent back; a failure to issue it goes to the next
    reply as an asynchronous error.  A copy without a reply and without that flag is not C's to take.  What lets
    the shim begin such a run: a posted copy's answer given at once says so (r0 NVP_STAGED_RUN)."""
    fast, drv, chan, peer = setup
    mb = staging_channel(chan)
    unanswered = wire.CONSTANTS["NVP_STAGED_UNANSWERED"]

    def copy(seq: int, num: int, flags: int = unanswered) -> bytearray:
        return bytearray(req(wire.NVP_OP_STAGED_COPY, seq, 0x2000, 4096 * num, 4096, 0, 0, num, flags))

    assert fast.run(chan, copy(1, 1), 1)[:2] == (fastpath.PYTHON, 0)  # no ring of events yet: Python
    for i in range(fastpath.POSTED):
        chan.posted_events[i] = ffi.cast("void *", 0xB000 + i)
    chan.posted_dev = 0
    assert fast.run(chan, copy(1, 1, 0), 1)[:2] == (fastpath.PYTHON, 0)  # (neither a reply nor the flag)
    drv.busy = True  # (every stream and event busy: nothing is asked)
    assert fast.run(chan, copy(1, 1) + copy(2, 2), 1)[::2] == (fastpath.MORE, 3)
    assert drv.calls == [("memcpy", 0x2000, 0x100000 + 4096, 4096, 0), ("record", 0xB000, 0, 0),
                         ("memcpy", 0x2000, 0x100000 + 8192, 4096, 0), ("record", 0xB001, 0, 0)]
    assert chan.posted_count == 2 and replies(peer) == []
    drv.busy = False
    # what may begin a run: an answer at once says so (r0), one given once the copy was done does not
    run = wire.CONSTANTS["NVP_STAGED_RUN"]

    def answered(seq: int, num: int) -> bytearray:
        return bytearray(req(wire.NVP_OP_STAGED_COPY, seq, 0x2000, 0, 4096, 0, 0, num, 0, reply=True))

    fast.set_sync_streams(0, [0])
    assert fast.run(chan, answered(3, 3), 3)[::2] == (fastpath.MORE, 4)
    assert [r[1:5] for r in replies(peer)] == [(0, 0, 0, run)]
    fast.note_issue()
    drv.pending = {0}  # (the legacy stream busy: this one is answered once done)
    assert fast.run(chan, answered(4, 4), 4)[::2] == (fastpath.MORE, 5)
    assert [r[1:5] for r in replies(peer)] == [(0, 0, 0, 0)]
    drv.pending = set()
    fast.posted_drain(chan)
    record, fail = drv._rec, [700]  # (CUDA_ERROR_ILLEGAL_ADDRESS)
    drv._rec = lambda *call: fail[0] if call[0] == "memcpy" else record(*call)
    buf = copy(5, 5) + bytearray(req(wire.NVP_OP_STAGED_FENCE, 6, 5, reply=True))
    assert fast.run(chan, buf, 5)[::2] == (fastpath.MORE, 7)
    assert [r[1:3] for r in replies(peer)] == [(0, 700)]  # the fence's reply carries the failure
    assert chan.posted_count == 0 and mb.posted_done == 5  # (the failed one was never in flight)


def test_copies_to_the_host_in_pieces_are_issued_at_once(setup) -> None:
    """A run of copies to the host that follow one another in the buffer (a copy in pieces: memory.c whole_d2h) is
    issued at once, each piece with its own copy event; each piece's turn then only waits for its event and
    replies, in order.  The run ends at anything else; pieces that Python executed instead are not waited for."""
    fast, drv, chan, peer = setup
    staging_channel(chan)

    def piece(seq: int, k: int, stream: int = 3) -> bytes:
        return req(wire.NVP_OP_STAGED_COPY, seq, 0x2000 + k * 4096, k * 4096, 4096, stream, 1, reply=True)

    buf = bytearray(piece(1, 0) + piece(2, 1) + piece(3, 2) + req(wire.NVP_OP_STREAM_SYNC, 4, 3, reply=True))
    assert fast.run(chan, buf, 1) == (fastpath.MORE, len(buf), 5)
    memcpy = lambda k: ("memcpy", 0x100000 + k * 4096, 0x2000 + k * 4096, 4096, STREAM)  # noqa: E731
    assert drv.calls[:6] == [memcpy(0), ("record", 0xA000, STREAM, 0), memcpy(1), ("record", 0xA001, STREAM, 0),
                             memcpy(2), ("record", 0xA002, STREAM, 0)]
    waits = [c for c in drv.calls[6:] if c[0] in ("event_sync", "memcpy", "record")]
    assert waits == [("event_sync", 0xA000), ("event_sync", 0xA001), ("event_sync", 0xA002)]
    assert [r[1] for r in replies(peer)] == [0, 0, 0, 0] and chan.copy_next == 3

    # on another stream, or not next in seq order: not part of the run
    fast.learn_stream(7, STREAM + 1, int)
    for buf, seq in ((piece(5, 0) + piece(6, 1, stream=7), 5), (piece(7, 0) + piece(9, 1), 7)):
        drv.calls.clear()
        fast.run(chan, bytearray(buf), seq)
        assert [c[0] for c in drv.calls[:4]] == ["memcpy", "record", "event_query", "event_sync"]  # waited alone
    replies(peer)

    # the first piece not done in time: Python waits for it; the next pieces' turns wait for their own events
    drv.calls.clear()
    drv.pending.add(0xA000 + chan.copy_next % fastpath.COPY_EVENTS)
    first = chan.copy_next
    buf = bytearray(piece(10, 0) + piece(11, 1))
    why, used, seq = fast.run(chan, buf, 10)
    assert (why, used, seq) == (fastpath.REPLY, len(piece(10, 0)), 11)
    assert chan.wait_handle == ffi.cast("void *", 0xA000 + first % fastpath.COPY_EVENTS)
    assert [c[0] for c in drv.calls[:4]] == ["memcpy", "record", "memcpy", "record"]
    drv.calls.clear()
    chan.pending = 1  # (Python owes the first reply)
    assert fast.run(chan, buf[used:], 11)[0] == fastpath.REPLY
    assert "memcpy" not in [c[0] for c in drv.calls]
    assert chan.wait_handle == ffi.cast("void *", 0xA000 + (first + 1) % fastpath.COPY_EVENTS)
    chan.pending = 0

    # Python executed the pieces issued ahead (say after a hand-over): a later copy is issued afresh
    drv.pending.add(0xA000 + chan.copy_next % fastpath.COPY_EVENTS)
    assert fast.run(chan, bytearray(piece(20, 0) + piece(21, 1)), 20)[:2] == (fastpath.REPLY, len(piece(20, 0)))
    drv.pending.clear()
    drv.calls.clear()
    assert fast.run(chan, bytearray(piece(30, 3)), 30)[0] == fastpath.MORE
    assert drv.calls[:2] == [memcpy(3), ("record", 0xA000 + (chan.copy_next - 1) % fastpath.COPY_EVENTS, STREAM, 0)]


def test_requests_handed_back_to_c_keep_each_threads_order() -> None:
    """What waits in Python goes back to C's buffers in each thread's order: a request taken from a mailbox's slot
    as C stopped was posted after everything the thread sent through its socket before it, some of which may still
    be in the socket; requests the socket brought later follow it.  (Out of order, C waited for a call behind a
    later one until Python parsed every buffer.)"""
    from functools import partial
    from types import SimpleNamespace

    from nvproxy.proxy.dispatch import Dispatcher  # noqa: F401  (the server's import order, as the proxy's)
    from nvproxy.proxy.server import Server

    def heap_entry(seq: int, ch) -> tuple:
        length, op, flags, s, *args = wire.REQ.unpack_from(record_req(seq))
        return (seq, seq, ch, op, flags, tuple(args), b"")

    a, b = socket.socketpair()
    try:
        a.setblocking(False)
        class Thread:  # (a Channel's fields that handing back uses; hashable, as a Channel)
            rbuf, sock, fds, closed, fast, queued = bytearray(record_req(10)), a, [], False, None, 1

        ch = Thread()
        server = SimpleNamespace(heap=[heap_entry(14, ch)])
        server._receive = partial(Server._receive, server)
        server._heap_by_channel = partial(Server._heap_by_channel, server)
        b.sendall(record_req(12) + record_req(13))  # (sent before the thread posted 14 in its slot)
        buf = bytearray(1 << 16)
        held = Server._hand_back(server, [ch], [buf])
        assert held == [4 * len(record_req(1))] and server.heap == [] and ch.rbuf == bytearray() and ch.queued == 0
        assert bytes(buf[: held[0]]) == record_req(10) + record_req(12) + record_req(13) + record_req(14)
    finally:
        a.close()
        b.close()


def test_a_request_merged_by_seq_among_a_threads_bytes() -> None:
    from nvproxy.proxy.server import _merged

    def whole(*seqs: int) -> bytes:
        return b"".join(record_req(s) for s in seqs)

    def entries(*seqs: int) -> list[tuple[int, bytes]]:
        return [(s, record_req(s)) for s in seqs]

    assert _merged(bytearray(whole(5, 9)), entries(3, 7, 11)) == whole(3, 5, 7, 9, 11)
    assert _merged(bytearray(), entries(4)) == whole(4)
    later = req(wire.NVP_OP_EVENT_RECORD, 9, 4, 3, 9, payload=bytes(16))[: wire.REQ.size + 4]  # (part of a later one)
    assert _merged(bytearray(whole(5) + later), entries(7)) == whole(5, 7) + later
    earlier = req(wire.NVP_OP_EVENT_RECORD, 6, 4, 3, 6, payload=bytes(16))[: wire.REQ.size + 4]
    assert _merged(bytearray(whole(5) + earlier), entries(7)) is None  # (7 must follow all of 6)
    assert _merged(bytearray(whole(5) + record_req(6)[:30]), entries(7)) is None  # (part of a header: seq unknown)
