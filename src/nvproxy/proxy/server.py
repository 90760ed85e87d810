"""The proxy's transport: the listening socket, one channel per application
thread, execution in the application's call order, and replies.

One thread (the dispatcher) reads every channel and executes submissions in
the global order the shim stamped on them (seq), so calls from different
application threads reach the device in the order they were made.  A call
that must wait for the device (a synchronisation, a synchronous copy) is
submitted by the dispatcher and then handed to its channel's waiter thread,
which waits and replies: one application thread blocked in a sync call never
stalls the others.
"""

from __future__ import annotations

import array
import errno
import fcntl
import heapq
import os
import queue
import select
import selectors
import socket
import struct
import sys
import termios
import threading
import time
from collections import deque
from collections.abc import Callable
from typing import Any

from .. import settings, wire
from ..checkpoint import reach
from ..errors import NOT_SUPPORTED, STICKY, UNKNOWN, CudaError
from . import commands, control, fastpath, mailbox
from .dmtcp_overlap import DmtcpOverlap
from .handlers import graphs, ipc, managed
from .listen import listen_at

REQ = wire.REQ
HDR = REQ.size
F_REPLY = wire.NVP_F_REPLY
# posted requests the heap hands to C first (_c_executed)
C_FIRST = {wire.NVP_OP_LAUNCH, wire.NVP_OP_EVENT_RECORD, wire.NVP_OP_STREAM_WAIT_EVENT, wire.NVP_OP_GRAPH_LAUNCH}
# what a proxy with a broken context still executes: the shim's reconnection bookkeeping (a restored proxy's
# context works; a broken one fails them natively)
BOOKKEEPING = {wire.NVP_OP_HOST_REGISTER, wire.NVP_OP_HOST_UNREGISTER, wire.NVP_OP_SET_DEVICE, wire.NVP_OP_RESTORE_DONE}
# calls C meets while serving that Python executes only after C has returned (_run_inline): they remake whole state
NOT_INLINE = {wire.NVP_OP_DEVICE_RESET, wire.NVP_OP_RESTORE_DONE}
# calls synchronous natively that the shim may send without a reply (memory.c: cudaHostUnregister where no device
# can still be using the memory): a failure is the next call's asynchronous error, so one line names the call
POSTED_SYNCHRONOUS = {wire.NVP_OP_HOST_UNREGISTER: "cudaHostUnregister"}
MAX_LEN = HDR + wire.NVP_MAX_PAYLOAD
SO_PEERCRED_FMT = "3i"
RECV_BUF = bytearray(1 << 18)  # only the dispatcher thread reads channels
RECV_VIEW = memoryview(RECV_BUF)
ANC_SPACE = socket.CMSG_SPACE(8 * 4)


SPIN_S = 50e-6  # how long the dispatcher keeps polling (a wait, its sockets) before sleeping
# the calling threads' channels (up to fastpath.SERVE_MAX of them) are served by C (fastpath.nvpf_serve,
# nvpf_serve_many): it polls their sockets for SERVE_IDLE_US after the last message, and every SERVE_BUDGET_US gives
# the event loop a turn if one of the loop's sockets is ready (a turn costs a call arriving meanwhile tens of
# microseconds)
SERVE_IDLE_US, SERVE_BUDGET_US = 200, 2000
# the control socket's requests are read off the event loop, each by a thread of its own: a client gets
# CONTROL_READ_S for its whole request (small JSON: CONTROL_LIMIT bytes at most), CONTROL_READERS at once
CONTROL_READ_S, CONTROL_LIMIT, CONTROL_READERS = 10.0, 1 << 20, 8
# before a checkpoint's cut the proxy executes what the application has sent (take_sent); a request numbered before
# some of those but not sent yet (its thread is between numbering and sending it, or stopped there) is waited for
# this long, then the cut goes on without it: its call has not returned, so it may come after the cut
GAP_WAIT_S = 0.1


def _queued(sock: socket.socket) -> int:
    """The bytes waiting in sock's receive queue."""
    n = array.array("i", [0])
    fcntl.ioctl(sock.fileno(), termios.FIONREAD, n)
    return n[0]


def _merged(buf: bytearray, entries: list[tuple[int, bytes]]) -> bytearray | None:
    """One channel's requests from the heap (seq, the whole request; in seq order) put among the bytes it sent
    after them or before them (buf), by seq; None where one would follow part of a request whose rest is still to
    come, or part of a header (whose seq is not known yet)."""
    out, off, n = bytearray(), 0, len(buf)
    for seq, msg in entries:
        start = off
        while n - off >= HDR:
            length, _op, _flags, s, *_args = REQ.unpack_from(buf, off)
            if s > seq:
                break
            if length < HDR or off + length > n:
                return None
            off += length
        if 0 < n - off < HDR:
            return None
        out += buf[start:off]
        out += msg
    out += buf[off:]
    return out


class Deferred:
    """A result that needs waiting for: wait() runs on the channel's waiter
    thread, then the reply carries what it returns.  poll(), if given, says
    without blocking whether wait() would return at once: then the dispatcher
    replies itself and spares the thread hand-off (most synchronisations
    find short work already done).  Where a kernel may print, the dispatcher
    still calls wait() then (it returns at once): the driver writes kernel
    printf text only at a wait, never at a query."""

    __slots__ = ("wait", "poll")

    def __init__(self, wait: Callable[[], Any], poll: Callable[[], bool] | None = None) -> None:
        self.wait = wait
        self.poll = poll

    def done_soon(self) -> bool:
        if self.poll is None:
            return False
        end = time.perf_counter() + SPIN_S
        try:
            while not self.poll():
                if time.perf_counter() > end:
                    return False
        except CudaError:
            return False  # let wait() report it
        return True


class Channel:
    def __init__(self, server: Server, sock: socket.socket) -> None:
        self.server = server
        self.sock = sock
        self.rbuf = bytearray()
        self.fds: deque[int] = deque()
        self.kind = -1
        self.tid = 0
        self.dev = 0
        self.async_err = 0
        self.per_thread: dict[int, Any] = {}
        self.staging: tuple[int, int] | None = None
        self.copy_events: list[Any] = []  # (of the ring of the current device, in copy_rings)
        self.copy_rings: dict[int, list[Any]] = {}
        self.copy_event_next = 0
        self.posted_rings: dict[int, list[Any]] = {}  # (memory.posted_ring)
        self._send_lock = threading.Lock()
        self._waits: queue.SimpleQueue[Any] | None = None
        self._pending = 0
        self.queued = 0  # its requests in the server's heap
        self.closed = False
        self.fast: Any = None  # its struct nvpf_chan, where the native fast path runs
        self._serve_buf: bytearray | None = None
        self.mailbox: mailbox.Mailbox | None = None

    # ---- replies, always in request order ----
    def _build(self, result: Any, err: int) -> bytes:
        r: tuple[int, ...] = ()
        payload = b""
        if isinstance(result, tuple):
            r, payload = result
        a_err, self.async_err = self.async_err, 0
        return wire.pack_reply(err, a_err, r, payload, self.server.backend.take_text())

    def _send(self, data: bytes) -> None:
        with self._send_lock:
            try:
                self._send_all(data)
            except OSError:
                self.closed = True
            mb = self.mailbox
            if mb is not None:
                mb.replied()

    def _send_all(self, data: bytes) -> None:
        """All of data, on a non-blocking socket: a reply larger than the socket's buffer (a library call's host
        outputs) waits for the thread, which is reading it, to make room."""
        view = memoryview(data)
        while view:
            try:
                view = view[self.sock.send(view) :]
            except BlockingIOError:
                select.select([], [self.sock], [], 1.0)

    def reply(self, result: Any, err: int) -> None:
        if self._pending == 0:
            self._send(self._build(result, err))
        else:
            self._queue().put((None, result, err))

    def defer(self, d: Deferred) -> None:
        self._pending += 1
        self._queue().put((d, None, 0))

    def _queue(self) -> queue.SimpleQueue[Any]:
        if self._waits is None:
            self._waits = queue.SimpleQueue()
            threading.Thread(target=self._waiter, name=f"nvproxy-wait-{self.tid}", daemon=True).start()
        return self._waits

    def _waiter(self) -> None:
        assert self._waits is not None
        while True:
            item = self._waits.get()
            if item is None:
                return
            d, result, err = item
            if d is not None:
                try:
                    self.server.backend.activate(self.dev)
                    result, err = d.wait(), 0
                except CudaError as e:
                    result, err = None, e.code
                except Exception as e:  # never leave the application waiting
                    print(f"nvproxy: internal error while waiting: {e!r}", file=sys.stderr)
                    result, err = None, UNKNOWN
            self._send(self._build(result, err))
            if d is not None:
                # only now: the dispatcher replies itself once nothing is pending,
                # and that reply must not overtake this one
                self._pending -= 1

    def serve_buffer(self) -> bytearray:
        """Where C receives this channel's requests while it serves several threads."""
        if self._serve_buf is None:
            self._serve_buf = bytearray(len(RECV_BUF))
        return self._serve_buf

    def set_mailbox(self, mb: mailbox.Mailbox | None) -> None:
        with self._send_lock:  # (a waiter thread's reply counts in the old one: not once it is unmapped)
            mailbox.plug(self.fast, mb)
            old, self.mailbox = self.mailbox, mb
        if old is not None:
            old.close()

    def close(self) -> None:
        self.closed = True
        self.set_mailbox(None)
        if self._waits is not None:
            self._waits.put(None)
        for fd in self.fds:
            os.close(fd)
        self.fds.clear()


class Server:
    def __init__(self, sock_path: str, owner_pid: int, backend: Any, dispatch: Any,
                 listener: socket.socket | None = None, owner_fd: int | None = None) -> None:
        """owner_fd: a pidfd of owner_pid from whoever started this proxy (else one is opened here)."""
        self.backend = backend
        self.dispatch = dispatch
        self.fast = dispatch.fast
        self.owner_pid = owner_pid
        self.sock_path = sock_path
        self.sel = selectors.DefaultSelector()
        if self.fast is not None:
            self.fast.set_loop_fd(self.sel.fileno() if hasattr(self.sel, "fileno") else -1)
        self.heap: list[tuple[int, int, Channel, int, int, tuple[int, ...], bytes]] = []
        self.ending: set[Channel] = set()  # channels at their end of file, with requests still to run
        self.next_seq = 1
        self.running_seq = 0  # the request _execute_ready is executing (0: none; requests count from 1)
        self.executed = 0  # requests Python executed (NVPROXY_SERVE_STATS)
        self.gaps = fastpath.ServeGaps() if os.environ.get("NVPROXY_SERVE_STATS") == "1" else None
        self.tiebreak = 0
        self.callback_channel: Channel | None = None
        self.callback_lock = threading.Lock()
        self.channels: set[Channel] = set()
        self.calling_threads = 0  # call channels open
        self.channel_failure_said = False  # (_channel_failed)
        self.running = True
        self.serve_due = False  # C is to serve the calling threads' channels after this turn of the event loop
        self.c_stalled = False  # C's last serve ran nothing: the loop reads the calling threads' sockets itself
        self.stalled_at = 0  # the call whose turn it was when a serve last ran nothing (_serve_due)
        self.handed_over = False
        self.writer: threading.Thread | None = None  # writing a checkpoint file from the host image
        self.dmtcp = DmtcpOverlap()  # when DMTCP checkpoints' GPU images are written, and what came of them
        # a concurrent checkpoint's gate (checkpoint/concurrent.py): runs before each request until it says False
        self.gate: Callable[[int, int, tuple[int, ...]], bool] | None = None
        self.serving: dict[int, Channel] = {}  # while C serves: its channels by socket (_run_inline)
        self.inline_exc: BaseException | None = None  # what interrupted _run_inline, raised once C has returned
        if self.fast is not None and not settings.debug_flag("no-inline"):
            self.fast.set_python(self._run_inline)
        if listener is None:
            listener = listen_at(sock_path, 64)
        self.listener = listener
        self.listener.setblocking(False)
        self.sel.register(self.listener, selectors.EVENT_READ, self._accept)
        self.ctl_path = f"{sock_path}.{os.getpid()}.ctl"
        self.ctl = listen_at(self.ctl_path, 4)
        self.ctl.setblocking(False)
        self.sel.register(self.ctl, selectors.EVENT_READ, self._control)
        # whole control requests, from their readers' threads; a byte on the wake socket says one came
        self.ctl_requests: queue.SimpleQueue[tuple[socket.socket, dict[str, Any]]] = queue.SimpleQueue()
        self.ctl_readers = threading.BoundedSemaphore(CONTROL_READERS)
        self.ctl_wake, wake_w = socket.socketpair()
        self.ctl_wake.setblocking(False)
        self.ctl_wake_w = wake_w
        self.sel.register(self.ctl_wake, selectors.EVENT_READ, self._control_requests)
        try:
            self.owner_fd = os.pidfd_open(owner_pid) if owner_fd is None else owner_fd
            self.sel.register(self.owner_fd, selectors.EVENT_READ, self._owner_gone)
        except (ProcessLookupError, OSError):  # (it ended before its proxy was up: nvproxy run does not wait for
            self.running = False  # its proxy, and a program without CUDA calls may be done by now)
        threading.Thread(target=commands.prefault_loop, args=(self,), name="nvproxy-prefault", daemon=True).start()

    @staticmethod
    def _accept_from(listener: socket.socket) -> tuple[socket.socket, int, int] | None:
        """A new connection and its peer's (pid, uid), from the kernel (SO_PEERCRED)."""
        try:
            s, _ = listener.accept()
        except BlockingIOError:
            return None
        pid, uid, _gid = struct.unpack(SO_PEERCRED_FMT, s.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, 12))
        return s, pid, uid

    # ---- connections ----
    def _accept(self, _key: Any) -> None:
        """Every connection waiting (threads that start together connect together: one a turn would admit the
        last of them a turn per thread later, while the calls of the others wait for its first one)."""
        while (got := self._accept_from(self.listener)) is not None:
            s, pid, uid = got
            if uid != os.getuid() or pid != self.owner_pid:
                print(f"nvproxy: refused a connection from pid {pid} uid {uid}: this proxy serves pid "
                      f"{self.owner_pid}", file=sys.stderr)
                s.close()
                continue
            self._add_channel(s)

    def _add_channel(self, s: socket.socket) -> Channel:
        s.setblocking(False)
        ch = Channel(self, s)
        if self.fast is not None:
            ch.fast = self.fast.channel(s.fileno())
        self.channels.add(ch)
        self.sel.register(s, selectors.EVENT_READ, lambda key, ch=ch: self._readable(ch))
        return ch

    def _owner_gone(self, _key: Any) -> None:
        self.running = False

    def _drop(self, ch: Channel) -> None:
        self.ending.discard(ch)
        if ch in self.channels and ch.kind == wire.NVP_CHAN_CALL:
            self.calling_threads -= 1
        self.channels.discard(ch)
        try:
            self.sel.unregister(ch.sock)
        except (KeyError, ValueError):
            pass
        ch.close()
        try:
            ch.sock.close()
        except OSError:
            pass
        self.dispatch.channel_closed(ch)

    def _channel_failed(self, ch: Channel, e: OSError) -> None:
        """One line, for the first channel that fails: an application killed mid-call resets every thread's channel
        at once (the replies it never read), and a line for each said nothing more."""
        if self.channel_failure_said:
            return
        self.channel_failure_said = True
        if e.errno == errno.ECONNRESET:
            print(f"nvproxy: the application's thread {ch.tid} ended during a call (its channel was reset)",
                  file=sys.stderr)
        else:
            print(f"nvproxy: the channel of thread {ch.tid} failed: {e}", file=sys.stderr)

    def _receive(self, ch: Channel) -> int | None:
        """Read what ch's socket holds (one buffer's worth at most) into ch.rbuf, with its descriptors: how many bytes
        (0: none yet), or None at its end (ch then ends: at once, or once its requests waiting in the heap ran)."""
        # into one reused buffer: a fresh 256 KiB bytes object per read costs an
        # mmap/munmap pair, which was most of a small call's round trip
        try:
            n, anc, _flags, _addr = ch.sock.recvmsg_into([RECV_BUF], ANC_SPACE)
        except BlockingIOError:
            return 0
        except OSError as e:
            self._channel_failed(ch, e)
            n, anc = 0, []
        for level, typ, cdata in anc:
            if level == socket.SOL_SOCKET and typ == socket.SCM_RIGHTS:
                k = len(cdata) // 4
                ch.fds.extend(struct.unpack(f"{k}i", cdata[: k * 4]))
        if not n:
            if self._holds_requests(ch):
                # the thread's last requests (say cudaStreamAddCallback, which has no reply, and then the thread
                # ended) wait for earlier ones of other threads: C serves them with the others' (it reads the socket
                # no more), then the channel is dropped
                self.sel.unregister(ch.sock)
                self.ending.add(ch)
                if ch.fast is not None:
                    ch.fast.ended = 1
            else:
                self._drop(ch)
            return None
        ch.rbuf += RECV_VIEW[:n]
        return n

    def _readable(self, ch: Channel) -> None:
        if not self.c_stalled and ch.fast is not None and ch.kind == wire.NVP_CHAN_CALL and self._servable():
            self.serve_due = True  # (C reads the socket itself, once the loop's other sockets have had their turn)
            return
        self._read(ch)

    def _read(self, ch: Channel) -> None:
        if not self._receive(ch):
            return
        if ch.fast is None:
            self._consume(ch)
            return
        self._run_fast(ch)
        self.serve_due = True

    def _serve_due(self) -> None:
        """C serves the calling threads' channels for as long as it can; then the event loop has its turn."""
        self.serve_due = False
        while (chans := self._servable()) is not None:
            before = self.next_seq
            served = self._serve(chans)
            if served is None:  # (what waits cannot go back to C in its order: Python runs it)
                break
            why, which = served
            if self.gaps is not None:
                self.gaps.refused("C stopped: " + fastpath.why_name(why))
            self._drop_ended()
            if why == fastpath.CLOSED and which >= 0:  # (its end of file, or an error: Python's read finds out which)
                self._read(chans[which])
                continue  # (C serves on: the others' buffers, and an ended thread's last requests)
            if self.fast.loop_turn():  # (whatever C answered: requests posted meanwhile may make it PYTHON)
                self.serve_due = True  # what C received and did not run waits in the channels' buffers
                if self.gaps is not None:
                    self.gaps.refused("the event loop's turn")
                return
            # With nothing run, the next call is on its way: a thread between numbering a request and sending it (its
            # core taken), or a new thread's first call.  C takes up what it received again once the loop has looked
            # at its sockets (a new connection): parsing every buffer into the heap costs far more (up to a hundred
            # milliseconds with many threads).  Where C runs nothing again for the same call, what waits needs more
            # from a socket, or a request numbered but never sent: Python takes what C received (in call order,
            # through the heap) and reads the sockets until C runs something again.
            stalled = self.next_seq == before
            if stalled and self.stalled_at != self.next_seq:
                self.stalled_at = self.next_seq
                self.serve_due = True
                if self.gaps is not None:
                    self.gaps.refused("C ran nothing once")
                return
            self.c_stalled = stalled
            if self.c_stalled and self.gaps is not None:
                self.gaps.refused("C ran nothing")
            if self.c_stalled:
                for c in chans:
                    if c.rbuf:
                        self._run_fast(c)
                return
            if why == fastpath.IDLE:
                self.serve_due = True
                return
        for ch in [c for c in self.channels if c.rbuf and c.fast is not None]:
            self._run_fast(ch)  # (what C left that it cannot be handed again: Python's to run)

    def _run_fast(self, ch: Channel) -> None:
        while ch.rbuf and not ch.closed and ch.fast is not None:  # (a callback channel's HELLO clears fast)
            if not self.heap and self._fast_run(ch):
                break  # C did everything there was
            if not self._consume(ch, one=True):
                break  # the rest of a message is still on its way
            self._execute_ready()

    def _servable(self) -> list[Channel] | None:
        """The calling threads' channels, when C may serve them all (on one device, what of theirs waits in Python
        fits their buffers in C, and one of them is free to send: the others wait for replies Python owes), else
        None."""
        chans, why = self._servable_why()
        if why and self.gaps is not None:
            self.gaps.refused(why)
        return chans

    def _servable_why(self) -> tuple[list[Channel] | None, str]:
        if not (self.running and self.fast is not None):
            return None, "stopped"
        chans = [c for c in self.channels if c.kind == wire.NVP_CHAN_CALL]
        if not chans or len(chans) > fastpath.SERVE_MAX:
            return None, "no channels or too many"
        dev = chans[0].dev
        if any(c.fast is None or c.closed or c.dev != dev for c in chans):
            return None, "a channel not ready or on another device"
        if (self.heap or any(c.rbuf for c in chans)) and not self._waiting_fits(chans):
            return None, "requests that do not fit C's buffers"
        return (None, "every thread waits for Python") if all(c._pending for c in chans) else (chans, "")

    def _waiting_fits(self, chans: list[Channel]) -> bool:
        """Can what waits in Python (the heap's requests, received bytes not parsed yet) go back to these channels'
        buffers for C, each channel's in its order?  (_hand_back reads their sockets first, and looks again.)"""
        size = {c: len(c.rbuf) for c in chans}
        for seq, _t, ch, _op, _flags, _args, payload in self.heap:
            if ch not in size or seq < self.next_seq:
                return False
            size[ch] += REQ.size + len(payload)
        return all(n <= len(RECV_BUF) for n in size.values())

    def _heap_by_channel(self, chans: list[Channel]) -> dict[Channel, list[tuple[int, bytes]]]:
        """The heap's requests by channel, in seq order, each whole; the channels' sockets read first.  A channel's
        heap requests came from its buffer (parsed from what its socket brought) or from its mailbox's slot as C
        stopped: those the thread posted after sending bytes that may still be in the socket, and after those
        bytes they must run."""
        by: dict[Channel, list[tuple[int, bytes]]] = {}
        for seq, _t, ch, op, flags, args, payload in sorted(self.heap, key=lambda e: (e[0], e[1])):
            by.setdefault(ch, []).append((seq, REQ.pack(REQ.size + len(payload), op, flags, seq, *args) + payload))
        for ch in by:
            for _ in range(4):  # (until the socket is empty: a read stops short where descriptors came)
                if ch not in chans or ch.closed or ch.fast is not None and ch.fast.ended or not self._receive(ch):
                    break
        return by

    def _hand_back(self, chans: list[Channel], bufs: list[bytearray]) -> list[int] | None:
        """What waits in Python into the channels' buffers, each in its order: their lengths; None (nothing moved)
        where it does not fit or a heap request would follow part of a request."""
        by = self._heap_by_channel(chans)
        data = {}
        for c in chans:
            d = _merged(c.rbuf, by[c]) if c in by else c.rbuf
            if d is None or len(d) > len(bufs[0]):
                return None
            data[c] = d
        self.heap.clear()
        held = []
        for c, buf in zip(chans, bufs, strict=True):
            c.queued = 0
            d = data[c]
            buf[: len(d)] = d
            held.append(len(d))
            c.rbuf.clear()
        return held

    def _serve(self, chans: list[Channel]) -> tuple[int, int] | None:
        """C serves the channels until Python is needed; then Python takes what C left (a reply, descriptors, the
        requests left in mailbox slots, in call order through the heap, and those left in buffers where C stopped
        for a call it left to Python or for descriptors: after the loop's turn, a reply or a closed socket, C takes
        them again).  (Why C stopped, the channel it stopped for or -1); None, not served, where what waits in
        Python cannot go back to the channels' buffers in its order."""
        # (several channels: each its own buffer, where what one received but could not run yet stays)
        bufs = [RECV_BUF] if len(chans) == 1 else [c.serve_buffer() for c in chans]
        held = self._hand_back(chans, bufs)
        if held is None:
            return None
        fast = self.fast
        fast.set_translating(bool(self.dispatch.state.relocs))
        self.backend.activate(chans[0].dev)
        for c in chans:
            fc = c.fast
            fc.dev, fc.pending, fc.async_err = c.dev, c._pending, c.async_err
        if self.gaps is not None:
            self.gaps.entered()
        self.serving = {c.fast.fd: c for c in chans}
        if len(chans) == 1:
            why, left, self.next_seq = fast.serve(chans[0].fast, RECV_BUF, held[0], self.next_seq, SERVE_IDLE_US,
                                                  SERVE_BUDGET_US)
            which, lefts = 0, [left]
        else:
            why, which, lefts, self.next_seq = fast.serve_many([c.fast for c in chans], bufs, self.next_seq,
                                                               SERVE_IDLE_US, SERVE_BUDGET_US, held)
        self.serving = {}
        if self.inline_exc is not None:
            exc, self.inline_exc = self.inline_exc, None
            raise exc
        if self.gaps is not None:
            self.gaps.left(why)
        for c, buf, left in zip(chans, bufs, lefts, strict=True):
            c.async_err = c.fast.async_err
            if left:
                c.rbuf += memoryview(buf)[:left]
        if which >= 0:
            ch, fc = chans[which], chans[which].fast
            if why == fastpath.FDS:
                ch.fds.extend(fc.fds[i] for i in range(fc.nfds))
            elif why == fastpath.REPLY:
                wait = fast.waiter(fc)
                if wait is None:
                    ch.reply(None, fc.reply_err)
                else:
                    ch.defer(Deferred(wait))
        for c in chans:
            if c.fast.side_len:  # requests the thread posted in its mailbox, for Python (their seq puts them in place)
                self._side(c, fast.side(c.fast))
        if why in (fastpath.IDLE, fastpath.REPLY, fastpath.CLOSED) or self.fast.loop_turn():
            # C takes up what it received again (_serve_due): parsing every buffer into the heap, to hand it all
            # back to C at once, took tens of milliseconds with many threads (thousands of calls)
            return why, which
        for c in chans:  # (a partial message waits for its socket; a whole one joins the heap, in call order)
            if c.rbuf:
                self._run_fast(c)
        return why, which

    def _run_inline(self, fc: Any, msg: bytes) -> int:
        """C's hook (fastpath.set_python): a call C met while serving that only Python executes, whose turn it is,
        executed here while C serves on.  LEFT where it needs Python's whole way (C then stops for it)."""
        try:
            ch = self.serving.get(fc.fd)
            _length, op, flags, seq, *args = REQ.unpack_from(msg, 0)
            if ch is None or ch.closed or op in NOT_INLINE or self.gate is not None or self.dispatch.gated or self.heap:
                return fastpath.INLINE_LEFT
            dev = ch.dev
            ch.async_err = fc.async_err
            self.running_seq, self.next_seq = seq, seq + 1  # (ran(), from other threads)
            try:
                self._execute(ch, op, flags, tuple(args), msg[HDR:])
            finally:
                self.running_seq = 0
            fc.pending, fc.async_err = ch._pending, ch.async_err
            if ch.dev != dev or ch.closed or self.gate is not None or self.dispatch.gated:
                return fastpath.INLINE_STOP  # (a device of its own now, or every call is Python's: the loop looks)
            self.fast.set_translating(bool(self.dispatch.state.relocs))
            self.backend.activate(dev)
            return fastpath.INLINE_DONE
        except BaseException as e:  # (an exit, a signal's exception: raised once C has returned)
            self.inline_exc = e
            return fastpath.INLINE_STOP

    def _fast_run(self, ch: Channel) -> bool:
        """Let C execute what it can at the start of ch's buffer; True when it used all complete messages."""
        fast, fc = self.fast, ch.fast
        fast.set_translating(bool(self.dispatch.state.relocs))
        self.backend.activate(ch.dev)
        while True:
            fc.dev, fc.pending, fc.async_err = ch.dev, ch._pending, ch.async_err
            fc.exclusive = self.calling_threads == 1
            why, used, self.next_seq = fast.run(fc, ch.rbuf, self.next_seq)
            ch.async_err = fc.async_err
            if used:
                del ch.rbuf[:used]
            if why != fastpath.REPLY:
                return why == fastpath.MORE
            wait = fast.waiter(fc)
            if wait is None:
                ch.reply(None, fc.reply_err)
            else:
                ch.defer(Deferred(wait))

    def _side(self, ch: Channel, msgs: bytes) -> None:
        off = 0
        while off < len(msgs):
            length, op, flags, seq, *args = REQ.unpack_from(msgs, off)
            if length < HDR or off + length > len(msgs) or seq == 0:
                print(f"nvproxy: malformed message in the mailbox of thread {ch.tid}; closing its channel",
                      file=sys.stderr)
                self._drop(ch)
                return
            self.tiebreak += 1
            heapq.heappush(self.heap, (seq, self.tiebreak, ch, op, flags, tuple(args), msgs[off + HDR : off + length]))
            ch.queued += 1
            off += length
        self._execute_ready()

    def _consume(self, ch: Channel, one: bool = False) -> bool:
        """Parse ch's complete messages (one only if one) into the heap; whether any was."""
        buf = ch.rbuf
        off = 0
        while len(buf) - off >= HDR and not (one and off):
            length, op, flags, seq, *args = REQ.unpack_from(buf, off)
            if length < HDR or length > MAX_LEN:
                print(f"nvproxy: malformed message (length {length}) from thread {ch.tid}; closing its channel",
                      file=sys.stderr)
                self._drop(ch)
                return False
            if len(buf) - off < length:
                break
            payload = bytes(buf[off + HDR : off + length])
            off += length
            if seq == 0:
                self._hello(ch, op, flags, tuple(args))
                if ch.kind in (wire.NVP_CHAN_CALLBACK, wire.NVP_CHAN_PAGES):  # (from now on the socket is theirs)
                    del buf[:off]
                    return True
            else:
                self.tiebreak += 1
                heapq.heappush(self.heap, (seq, self.tiebreak, ch, op, flags, tuple(args), payload))
                ch.queued += 1
        del buf[:off]
        return off > 0

    def _hello(self, ch: Channel, op: int, flags: int, a: tuple[int, ...]) -> None:
        if op != wire.NVP_OP_HELLO or a[0] != self.owner_pid or a[2] != wire.NVP_PROTO_VERSION:
            print("nvproxy: bad hello (wrong process or protocol version); closing the channel", file=sys.stderr)
            self._drop(ch)
            return
        ch.tid, ch.kind = a[1], a[3]
        if a[4] & wire.NVP_HELLO_MAILBOX and ch.fds:
            fd = ch.fds.popleft()
            if ch.kind == wire.NVP_CHAN_CALL:
                ch.set_mailbox(mailbox.attach(fd, ch.tid))
            else:
                os.close(fd)
        if ch.kind == wire.NVP_CHAN_CALL:
            self.calling_threads += 1
        if ch.kind == wire.NVP_CHAN_CALLBACK:
            # Installed before the reply: once the application has it, its next call may
            # launch work whose host function calls back (on the GPU from a driver thread,
            # possibly while this loop is still here).
            self.sel.unregister(ch.sock)
            ch.sock.setblocking(True)
            ch.fast = None
            self.callback_channel = ch
        if ch.kind == wire.NVP_CHAN_PAGES:  # (on a thread of its own: a fault waits for no call, handlers/managed.py)
            self.sel.unregister(ch.sock)
            self.channels.discard(ch)
            ch.sock.setblocking(True)
            ch.fast = None
            threading.Thread(target=managed.serve, args=(self.dispatch, ch.sock, self), name="nvproxy-pages",
                             daemon=True).start()
        # (no kernel printf text: the shim reads this reply bare, and the text belongs to the program's next call)
        ch._send(wire.pack_reply(0, 0, (self.backend.device_count(), 1 if self.backend.name == "sim" else 0,
                                        os.getpid(), self.backend.driver_version()), b"", b""))

    # ---- host callbacks: run in the application, in stream order ----
    def run_callback(self, cb_id: int, status: int, keep: bool = False) -> None:
        """keep: a graph's host node: the application keeps the callback for the next launch."""
        ch = self.callback_channel
        if ch is None:  # (the application registers a callback only after opening its channel)
            when = "while graphs are made again" if self.dispatch.pending_graphs is not None else "at a launch"
            print(f"nvproxy: host callback {cb_id} has no callback channel to run on ({when}, on thread "
                  f"{threading.current_thread().name}); dropped", file=sys.stderr)
            return
        with self.callback_lock:
            msg = wire.CB.pack(wire.CB.size, status, cb_id, wire.NVP_CB_KEEP if keep else 0)
            try:
                ch.sock.sendall(msg)
                got = b""
                while len(got) < wire.CB.size:
                    chunk = ch.sock.recv(wire.CB.size - len(got))
                    if not chunk:
                        print(f"nvproxy: the application closed its callback channel during host callback {cb_id}",
                              file=sys.stderr)
                        return
                    got += chunk
            except OSError as e:
                print(f"nvproxy: host callback {cb_id} not run: {e}", file=sys.stderr)
                return

    # ---- execution in call order ----
    def _execute_ready(self) -> None:
        heap = self.heap
        while heap and heap[0][0] <= self.next_seq:
            seq, _t, ch, op, flags, args, payload = heapq.heappop(heap)
            ch.queued -= 1
            self.running_seq = seq  # (before next_seq moves on: see ran)
            if seq == self.next_seq:
                self.next_seq += 1
            if not (op in C_FIRST and not flags & F_REPLY and self._c_executed(ch, seq, op, flags, args, payload)):
                self._execute(ch, op, flags, args, payload)
            self.running_seq = 0
        self._drop_ended()

    def _holds_requests(self, ch: Channel) -> bool:
        """Does a request of ch wait to run (in the heap, or whole in its buffer)?"""
        buf = ch.rbuf
        return ch.queued > 0 or len(buf) >= HDR and HDR <= REQ.unpack_from(buf, 0)[0] <= len(buf)

    def _drop_ended(self) -> None:
        """Drop the channels at their end whose last requests have run (a partial one never will)."""
        for ch in [c for c in self.ending if not self._holds_requests(c)]:
            self.ending.discard(ch)
            self._drop(ch)

    def _c_executed(self, ch: Channel, seq: int, op: int, flags: int, args: tuple[int, ...], payload: bytes) -> bool:
        """A posted request of the heap executed by C, as if it had come to C in turn (a launch in Python costs
        several times as much: with many threads sending, requests that wait in the heap for one still on its way
        would otherwise all run here, and the heap would seldom empty for C to serve again); False: Python's."""
        fc = ch.fast
        if fc is None or ch.closed or self.gate is not None or self.dispatch.gated:
            return False
        self.fast.set_translating(bool(self.dispatch.state.relocs))
        self.backend.activate(ch.dev)
        fc.dev, fc.pending, fc.async_err = ch.dev, ch._pending, ch.async_err
        fc.exclusive = 0
        msg = bytearray(REQ.pack(REQ.size + len(payload), op, flags, seq, *args) + payload)
        _why, used, _next = self.fast.run(fc, msg, seq)
        ch.async_err = fc.async_err
        return used == len(msg)

    def ran(self, seq: int) -> bool:
        """Has request seq been executed, whole?  (From another thread: next_seq is read first, so a request it has
        passed is seen as running until it is done.)"""
        passed = self.next_seq > seq
        return seq == 0 or passed and self.running_seq != seq

    def _execute(self, ch: Channel, op: int, flags: int, args: tuple[int, ...], payload: bytes) -> None:
        if ch.closed:
            return
        handler = self.dispatch.table.get(op)
        broken = self.dispatch.state.broken
        self.executed += 1
        if self.gaps is not None:
            self.gaps.ran(op)
        try:
            if broken and op not in BOOKKEEPING:
                raise CudaError(broken)
            if handler is None:
                name = wire.OP_NAMES.get(op, str(op))
                print(f"nvproxy: unknown operation {name} from thread {ch.tid}", file=sys.stderr)
                raise CudaError(NOT_SUPPORTED)
            if self.gate is not None and not self.gate(ch.dev, op, args):
                self.gate = None
            self.backend.activate(ch.dev)
            if self.dispatch.fast is not None:
                self.dispatch.fast.note_issue()
            reach.of(self.dispatch.state).note(op, args, payload)  # (what it may write: checkpoint/reach.py)
            result = handler(ch, args, payload)
        except CudaError as e:
            if flags & F_REPLY:
                ch.reply(None, e.code)
                return
            if op in POSTED_SYNCHRONOUS:  # (the program's call has returned success: say which one failed)
                print(f"nvproxy: {POSTED_SYNCHRONOUS[op]}({args[0]:#x}) failed in the proxy after the call had "
                      f"returned (error {e.code}); thread {ch.tid}'s next call reports it", file=sys.stderr)
            if not ch.async_err:
                ch.async_err = e.code
            return
        except Exception as e:
            print(f"nvproxy: internal error in {wire.OP_NAMES.get(op, op)}: {e!r}", file=sys.stderr)
            if flags & F_REPLY:
                ch.reply(None, UNKNOWN)
            elif not ch.async_err:
                ch.async_err = UNKNOWN
            return
        if flags & F_REPLY:
            if not isinstance(result, Deferred):
                ch.reply(result, 0)
            elif ch._pending == 0 and result.done_soon():
                ch.reply(None, self._flushing_wait(result))
            else:
                ch.defer(result)

    def _flushing_wait(self, d: Deferred) -> int:
        """The error of d's wait, where a loaded module may print (the work is done: it returns at once), so that
        the driver writes the kernels' printf text before the reply takes it; else 0, as the query said."""
        if not self.dispatch.state.may_print:
            return 0
        try:
            d.wait()
        except CudaError as e:
            return e.code
        return 0

    # ---- control socket: checkpoint, hand-over (commands.py) ----
    def _control(self, _key: Any) -> None:
        """A control connection: its request is read on a thread of its own, so that a client that sends part of
        one, or nothing, never holds up the application's calls; the command itself runs here, between calls."""
        got = self._accept_from(self.ctl)
        if got is None:
            return
        conn, pid, uid = got
        if uid != os.getuid():
            print(f"nvproxy: refused a control connection from pid {pid} uid {uid}: control is for the proxy's own "
                  "user", file=sys.stderr)
            conn.close()
            return
        if not self.ctl_readers.acquire(blocking=False):
            print(f"nvproxy: dropped a control connection from pid {pid}: {CONTROL_READERS} others are still "
                  "sending their requests", file=sys.stderr)
            conn.close()
            return
        threading.Thread(target=self._read_control, args=(conn, pid), name="nvproxy-control", daemon=True).start()

    def _read_control(self, conn: socket.socket, pid: int) -> None:
        """(its own thread) One request, whole within CONTROL_READ_S, for the event loop; else the connection is
        dropped, with one line."""
        try:
            try:
                msg, _blob, fds = control.recv(conn, time.monotonic() + CONTROL_READ_S, CONTROL_LIMIT)
            except TimeoutError:
                why = f"no whole request within {CONTROL_READ_S:.0f} s"
            except ConnectionError:
                why = "it closed the connection before a whole request"
            except control.BadMessage as e:  # (a whole message in the wrong form: the client hears why)
                why = str(e)
                try:
                    conn.settimeout(CONTROL_READ_S)
                    control.send(conn, {"ok": False, "error": f"refused {why}"})
                except OSError:
                    pass
            except (OSError, ValueError) as e:
                why = str(e)
            else:
                for fd in fds:
                    os.close(fd)
                self.ctl_requests.put((conn, msg))
                try:
                    self.ctl_wake_w.send(b"\0")
                except OSError:
                    pass  # (the loop has ended)
                return
            print(f"nvproxy: dropped a control connection from pid {pid}: {why}", file=sys.stderr)
            conn.close()
        finally:
            self.ctl_readers.release()

    def _control_requests(self, _key: Any) -> None:
        try:
            self.ctl_wake.recv(4096)
        except BlockingIOError:
            pass
        while True:
            try:
                conn, msg = self.ctl_requests.get_nowait()
            except queue.Empty:
                return
            self._command(conn, msg)

    def _command(self, conn: socket.socket, msg: dict[str, Any]) -> None:
        conn.settimeout(600)  # (a hand-over waits for the new proxy's verdict)
        later = False
        try:
            later = commands.handle(self, conn, msg)  # (True: a thread of its own answers, and closes conn)
        except Exception as e:  # the application goes on, whatever the controller did
            print(f"nvproxy: control command failed: {e}", file=sys.stderr)
            try:
                control.send(conn, {"ok": False, "error": str(e)})
            except OSError:
                pass
        finally:
            if not later:
                conn.close()

    def take_sent(self) -> int:
        """Execute, in call order, every request the application has sent: those its sockets held when this began
        (not what a program that goes on sending sends meanwhile), and those waiting in the heap for an earlier one
        (waited for GAP_WAIT_S at most: one numbered but not sent may never come, its thread stopped in between).
        Requests in the mailboxes' slots reached the heap when C last returned.  How many ran."""
        before, skipped = self.next_seq, 0
        for ch in [c for c in self.channels if c.rbuf and (self._receivable(c) or c in self.ending)]:
            self._take(ch)  # (received, and left to C for its next serve; an ended thread's last requests too)
        owed = {ch: _queued(ch.sock) for ch in list(self.channels) if self._receivable(ch)}
        while any(n > 0 for n in owed.values()):
            for ch, n in owed.items():
                got = self._receive(ch) if n > 0 and self._receivable(ch) else None
                owed[ch] = n - got if got else 0  # (nothing there after all, or its end: owed nothing more)
                if got:
                    self._take(ch)
        deadline = time.monotonic() + GAP_WAIT_S
        while self.heap and self.heap[0][0] > self.next_seq:
            left = deadline - time.monotonic()
            socks = {ch.sock: ch for ch in list(self.channels) if self._receivable(ch)}
            ready = select.select(list(socks), [], [], left)[0] if left > 0 and socks else []
            for sock in ready:
                ch = socks[sock]
                if self._receivable(ch) and self._receive(ch):
                    self._take(ch)
            if not ready and self.heap:
                print(f"nvproxy: request {self.next_seq} has a number but was not sent; the checkpoint goes on "
                      "without it (its call had not returned)", file=sys.stderr)
                skipped += self.heap[0][0] - self.next_seq
                self.next_seq = self.heap[0][0]
                self._execute_ready()
        return self.next_seq - before - skipped

    def _receivable(self, ch: Channel) -> bool:
        """A channel take_sent reads: a calling thread's (or one not introduced yet), open, not at its end."""
        return ch in self.channels and not ch.closed and ch.kind != wire.NVP_CHAN_CALLBACK and ch not in self.ending

    def _take(self, ch: Channel) -> None:
        """Execute what of ch's received requests their turn allows (the rest waits in the heap)."""
        if ch.fast is not None:
            self._run_fast(ch)
        else:
            self._consume(ch)
        self._execute_ready()

    def quiesce(self) -> int:
        """Everything the application sent is executed, and everything submitted is finished and replied to;
        later requests wait in the heap.  How many requests it executed (take_sent)."""
        taken = self.take_sent()
        state = self.dispatch.state
        for dev in list(state.devices):
            try:
                self.backend.activate(dev)
                if any(log.dev == dev for log in state.captures.values()):
                    graphs.drain(self.dispatch, dev)  # (the driver refuses to synchronise the context then)
                else:
                    self.backend.device_sync(dev)
            except CudaError as e:  # (its work is over: a checkpoint keeps the error, not the memory)
                if e.code not in STICKY:
                    raise
                self.broke(e.code)
        deadline = time.monotonic() + 60
        while any(ch._pending for ch in self.channels) and time.monotonic() < deadline:
            time.sleep(0.001)
        return taken

    def broke(self, code: int) -> None:
        """The context is unusable (a sticky error, or restored from an image of such a context): every request
        fails with the error, as every call of a native process would, but those that only keep the
        connection's bookkeeping (reuse of pinned memory, the end of a restore)."""
        if not self.dispatch.state.broken:
            self.dispatch.state.broken = code
            self.dispatch.captures_changed()  # (C executes nothing from now on)

    def adopt(self, info: dict[str, Any], blob: bytes, fds: list[int]) -> None:
        """Take over the connections of the proxy that handed over to us."""
        it = iter(fds[2:])
        for d in info["channels"]:
            s = socket.socket(fileno=next(it))
            ch = self._add_channel(s)
            ch.tid, ch.kind, ch.dev, ch.async_err = d["tid"], d["kind"], d["dev"], d["async_err"]
            self.calling_threads += ch.kind == wire.NVP_CHAN_CALL
            if d["staging"]:
                from .handlers.memory import adopt_staging

                adopt_staging(self.dispatch, ch, next(it), d["staging"])
            if d.get("mailbox"):
                ch.set_mailbox(mailbox.attach(next(it), ch.tid))
            off, n = d["pending"]
            ch.rbuf += blob[off : off + n]
            if ch.kind == wire.NVP_CHAN_CALLBACK:
                self.sel.unregister(ch.sock)
                ch.sock.setblocking(True)
                ch.fast = None
                self.callback_channel = ch
            else:
                self._consume(ch)
        self.next_seq = info["next_seq"]

    def serve(self) -> None:
        began = time.perf_counter()
        try:
            last = time.perf_counter()
            while self.running:
                # after activity, look again for a short while before sleeping:
                # the next request usually follows within microseconds
                events = self.sel.select(timeout=0)
                waited = False
                if events or self.serve_due:
                    last = time.perf_counter()
                elif time.perf_counter() - last < SPIN_S:
                    continue
                else:
                    events = self.sel.select(timeout=2.0 if self.heap else None)
                    last = time.perf_counter()
                    waited = True
                for key, _ in events:
                    key.data(key)
                if self.serve_due:
                    self._serve_due()
                if waited and not events and self.heap and self.heap[0][0] > self.next_seq:
                    # a stamped request never arrived (its thread died mid-call): do not stall the rest
                    print(f"nvproxy: request {self.next_seq} never arrived; going on", file=sys.stderr)
                    self.next_seq = self.heap[0][0]
                self._execute_ready()
        finally:
            if self.fast is not None and os.environ.get("NVPROXY_SERVE_STATS") == "1":
                print(self.fast.stats_report(time.perf_counter() - began, self.executed), file=sys.stderr)
                if self.gaps is not None:
                    print(self.gaps.report(), file=sys.stderr)
            if self.writer is not None:  # a checkpoint file is being written: finish it
                self.writer.join()
            if self.fast is not None:
                self.fast.set_loop_fd(-1)
            self.listener.close()
            ipc.unregister(self.dispatch.state, self.ctl_path)
            for path in (self.sock_path, self.ctl_path):
                try:
                    os.unlink(path)
                except OSError:
                    pass
