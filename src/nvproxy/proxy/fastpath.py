"""The native fast path (native/proxy/fastpath.h), seen from Python.

The dispatcher hands a channel's receive buffer to C, which executes the
hottest calls (launches, event records, copies, stream and event waits) in
call order until it meets one that Python must do.  C may only use handles
Python taught it: the handlers teach a kernel, stream or event when they use
it, and everything is forgotten whenever one is destroyed or reloaded.
"""

from __future__ import annotations

import heapq
import time
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

from .. import wire
from ..errors import CudaError
from ..ffi_prebuilt import load

TEXT = wire.header_text("fastpath.h", "proxy")
CDEF = wire.cdef_block(TEXT)
ffi = load("fastpath", CDEF)
CONSTANTS = wire.defines(CDEF, "NVPF_")
MORE, PYTHON, REPLY = CONSTANTS["NVPF_MORE"], CONSTANTS["NVPF_PYTHON"], CONSTANTS["NVPF_REPLY"]
IDLE, CLOSED, FDS = CONSTANTS["NVPF_IDLE"], CONSTANTS["NVPF_CLOSED"], CONSTANTS["NVPF_FDS"]
INLINE_DONE, INLINE_LEFT, INLINE_STOP = (CONSTANTS[f"NVPF_INLINE_{k}"] for k in ("DONE", "LEFT", "STOP"))
WAIT_NONE, WAIT_STREAM, WAIT_EVENT = (CONSTANTS[f"NVPF_WAIT_{k}"] for k in ("NONE", "STREAM", "EVENT"))
MAX_DEV = CONSTANTS["NVPF_MAX_DEV"]
COPY_EVENTS = CONSTANTS["NVPF_COPY_EVENTS"]
POSTED = CONSTANTS["NVPF_POSTED"]
SERVE_MAX = CONSTANTS["NVPF_SERVE_MAX"]
STAT_OPS = CONSTANTS["NVPF_STAT_OPS"]
WHY_NAMES = {MORE: "MORE", PYTHON: "PYTHON", REPLY: "REPLY", IDLE: "IDLE", CLOSED: "CLOSED", FDS: "FDS"}
DRIVER_FIELDS = ("launch", "launch_cooperative", "memcpy_async", "memset_async", "event_record", "event_query",
                 "event_sync", "stream_query", "stream_sync", "stream_wait_event", "graph_launch")
# without them launches are issued on the dispatcher thread alone (fastpath.c: workers)
OPTIONAL_FIELDS = ("ctx_get_current", "ctx_set_current")


def library_path() -> Path:
    return Path(__file__).resolve().parents[1] / "_native" / "libnvproxy_fast.so"


def enabled() -> bool:
    return library_path().exists()


class FastPath:
    def __init__(self, driver: dict[str, int], spin_us: int = 50, exclusive_spin_us: int = 5000,
                 launch_threads: int = 4) -> None:
        """driver: DRIVER_FIELDS -> function addresses (libcuda's, or test doubles)."""
        self.lib = ffi.dlopen(str(library_path()))
        self.drv = ffi.new("struct nvpf_driver *")
        for name in DRIVER_FIELDS + OPTIONAL_FIELDS:
            if name in driver:
                setattr(self.drv, name, ffi.cast(ffi.typeof(getattr(self.drv, name)), driver[name]))
        self.lib.nvpf_init(self.drv, spin_us, exclusive_spin_us)
        self.lib.nvpf_set_launch_threads(launch_threads)
        self.lib.nvpf_set_python(ffi.NULL)  # (C's state outlives a FastPath: no earlier one's hook)
        # Python issued work: C's next synchronous posted copy asks the streams again (nvpf_note_issue)
        self.note_issue: Callable[[], None] = self.lib.nvpf_note_issue
        self._seq = ffi.new("uint64_t *")
        self._consumed = ffi.new("size_t *")
        self._kernels: set[tuple[int, int]] = set()
        self._streams: set[int] = set()
        self._events: set[int] = set()
        self._execs: set[int] = set()
        self._translating = False
        self._python: Any = None  # (the hook's cffi callback, kept alive while C may call it)

    def set_python(self, run: Callable[[Any, bytes], int] | None) -> None:
        """Python's hook for a call C meets while serving that only Python executes: run(chan, message) executes it
        where C is, and answers INLINE_DONE, INLINE_STOP (done; C stops serving) or INLINE_LEFT (C stops for it)."""
        if run is None:
            self.lib.nvpf_set_python(ffi.NULL)
            self._python = None
            return

        def hook(chan: Any, msg: Any, n: int) -> int:
            return run(chan, bytes(ffi.buffer(msg, n)))

        # (an exception that escaped run would leave cffi's answer: LEFT, so the call is not lost)
        self._python = ffi.callback("int(struct nvpf_chan *, const uint8_t *, size_t)", hook, error=INLINE_LEFT)
        self.lib.nvpf_set_python(self._python)

    # ---- what C may use ----
    def channel(self, fd: int) -> Any:
        c = ffi.new("struct nvpf_chan *")
        c.fd = fd
        return c

    # handles come from another cffi instance (the backend's): `value` turns one
    # into an integer, called only for what C does not know yet
    def learn_kernel(self, dev: int, kid: int, k: Any, value: Callable[[Any], tuple[int, list[int]]]) -> None:
        if (dev, kid) not in self._kernels:
            handle, offsets = value(k)
            offs = ffi.new("uint32_t[]", offsets or [0])
            self.lib.nvpf_learn_kernel(dev, kid, ffi.cast("void *", handle), len(offsets), offs)
            self._kernels.add((dev, kid))

    def learn_stream(self, wire_id: int, s: Any, value: Callable[[Any], int]) -> None:
        if wire_id not in self._streams:
            self.lib.nvpf_learn_stream(wire_id, ffi.cast("void *", value(s)))
            self._streams.add(wire_id)

    def learn_event(self, wire_id: int, e: Any, value: Callable[[Any], int]) -> None:
        if wire_id not in self._events:
            self.lib.nvpf_learn_event(wire_id, ffi.cast("void *", value(e)))
            self._events.add(wire_id)

    def learn_graph_exec(self, wire_id: int, x: Any, value: Callable[[Any], int]) -> None:
        if wire_id not in self._execs:
            self.lib.nvpf_learn_graph_exec(wire_id, ffi.cast("void *", value(x)))
            self._execs.add(wire_id)

    def forget_all(self) -> None:
        self.lib.nvpf_forget_all()
        self._kernels.clear()
        self._streams.clear()
        self._events.clear()
        self._execs.clear()

    def set_translating(self, on: bool) -> None:
        if on != self._translating:
            self.lib.nvpf_set_translating(int(on))
            self._translating = on

    def set_capturing(self, on: bool) -> None:
        self.lib.nvpf_set_capturing(int(on))

    def set_text_fd(self, fd: int) -> None:
        self.lib.nvpf_set_text_fd(fd)

    def set_loop_fd(self, fd: int) -> None:
        """The event loop's descriptor (epoll), readable when the loop has work: serve() hands over only then."""
        self.lib.nvpf_set_loop_fd(fd)

    def loop_turn(self) -> bool:
        """Did the last serve end because the event loop was due a turn (whatever it answered)?"""
        return bool(self.lib.nvpf_loop_turn())

    def set_text_pending(self, on: bool) -> None:
        self.lib.nvpf_set_text_pending(int(on))

    def set_may_print(self, on: bool) -> None:
        self.lib.nvpf_set_may_print(int(on))

    def stats_report(self, wall_s: float, python_executed: int) -> str:
        """What C's serving did over a proxy's wall_s seconds of serving, beside Python's python_executed requests:
        a few lines for NVPROXY_SERVE_STATS."""
        st = self.lib.nvpf_stats()
        ended = ", ".join(f"{st.ended[code]} {name.lower()}" for code, name in WHY_NAMES.items())
        left = sorted(((st.to_python[op], wire.OP_NAMES.get(op, str(op))) for op in range(STAT_OPS)
                       if st.to_python[op]), reverse=True)
        in_c = st.serve_ns / 1e9
        return "\n".join([
            f"nvproxy: served {wall_s:.3f} s (waits included), {in_c:.4f} s of it in C "
            f"({100 * in_c / max(wall_s, 1e-9):.0f}%), in {st.serves} serves",
            f"nvproxy: the serves ended: {ended} (of them for the event loop's turn: {st.loop_turns}; for Python, "
            f"at a call C left to it {st.python_why[0]}, a message out of turn {st.python_why[1]}, a full buffer "
            f"{st.python_why[2]}); requests found in mailbox slots as serves ended {st.side_taken}",
            f"nvproxy: requests executed by C {st.executed}, by Python {python_executed}",
            "nvproxy: requests C left to Python: " + (", ".join(f"{name} {n}" for n, name in left) or "none")
            + f"; of them, executed by Python while C served on: {st.inline_runs}",
            f"nvproxy: serving several threads, C ran nothing for {st.order_ns / 1e9:.4f} s while it held later "
            f"calls but not the next, {st.room_ns / 1e9:.4f} s while the next waited for a launch worker, and "
            f"{st.quiet_ns / 1e9:.4f} s while it held none",
        ])

    def set_sync_streams(self, dev: int, handles: list[int] | None) -> None:
        """The streams a synchronous pageable copy on dev waits for (handle values), or None: not known."""
        if dev >= MAX_DEV:
            return
        if handles is None:
            self.lib.nvpf_set_sync_streams(dev, ffi.NULL, -1)
        else:
            arr = ffi.new("void *[]", [ffi.cast("void *", h) for h in handles] or [ffi.NULL])
            self.lib.nvpf_set_sync_streams(dev, arr, len(handles))

    # ---- posted copies (a channel's host-to-device copies answered before their DMA ended) ----
    def posted_order(self, chan: Any, stream: Callable[[], int]) -> None:
        """The next work on a stream goes after the channel's posted copies still in flight (stream: its handle
        value, asked for only if some are)."""
        self.lib.nvpf_posted_advance(chan)
        if chan.posted_count:
            rc = self.lib.nvpf_posted_order(chan, ffi.cast("void *", stream()))
            if rc:
                raise CudaError(rc)

    def posted_push(self, chan: Any, stream: int, num: int) -> None:
        """Put posted copy num, just issued on stream (a handle value), in flight in C's ring."""
        rc = self.lib.nvpf_posted_push(chan, ffi.cast("void *", stream), num)
        if rc:
            raise CudaError(rc)

    def posted_drain(self, chan: Any) -> None:
        """Wait for the channel's posted copies (its staging buffer is about to change hands)."""
        self.lib.nvpf_posted_drain(chan)

    def posted_fence(self, chan: Any, upto: int) -> Callable[[], None] | None:
        """For NVP_OP_STAGED_FENCE: None if the posted copies up to upto are done (published), else a wait for
        them, for a waiter thread, which publishes it."""
        self.lib.nvpf_posted_advance(chan)
        out = ffi.new("void *[]", POSTED)
        handles = [out[i] for i in range(self.lib.nvpf_posted_events(chan, upto, out))]
        if not handles:
            self.lib.nvpf_posted_publish(chan, upto)
            return None

        def wait() -> None:
            for h in handles:  # (an event since recorded again for a later copy: waited for longer, no harm)
                rc = self.drv.event_sync(h)
                if rc:
                    raise CudaError(rc)
            self.lib.nvpf_posted_publish(chan, upto)

        return wait

    # ---- running ----
    def run(self, chan: Any, buf: bytearray, next_seq: int) -> tuple[int, int, int]:
        """(why it stopped, bytes consumed, next seq) for the messages at buf's start."""
        self._seq[0] = next_seq
        view = ffi.from_buffer("uint8_t[]", buf)
        try:
            why = self.lib.nvpf_run(chan, view, len(buf), self._seq, self._consumed)
        finally:
            ffi.release(view)
        return why, int(self._consumed[0]), int(self._seq[0])

    def serve(self, chan: Any, buf: bytearray, held: int, next_seq: int, idle_us: int,
              budget_us: int) -> tuple[int, int, int]:
        """Serve chan from C (see nvpf_serve); buf[:held] was received already.
        (why it stopped, bytes left at buf's start, next seq)."""
        self._seq[0] = next_seq
        self._consumed[0] = held
        view = ffi.from_buffer("uint8_t[]", buf)
        try:
            why = self.lib.nvpf_serve(chan, view, len(buf), self._consumed, self._seq, idle_us, budget_us)
        finally:
            ffi.release(view)
        return why, int(self._consumed[0]), int(self._seq[0])

    def serve_many(self, chans: list[Any], bufs: list[bytearray], next_seq: int, idle_us: int,
                   budget_us: int, held: list[int] | None = None) -> tuple[int, int, list[int], int]:
        """Serve several channels from C at once (see nvpf_serve_many), each with its own buffer (all of one size),
        whose first held[i] bytes were received already.  (why it stopped, the channel that needs Python or -1,
        bytes left at each buffer's start, next seq)."""
        n = len(chans)
        self._seq[0] = next_seq
        lens = ffi.new("size_t[]", held or n)
        which = ffi.new("int *")
        views = [ffi.from_buffer("uint8_t[]", b) for b in bufs]
        try:
            why = self.lib.nvpf_serve_many(ffi.new("struct nvpf_chan *[]", chans), ffi.new("uint8_t *[]", views),
                                           lens, n, len(bufs[0]), self._seq, idle_us, budget_us, which)
        finally:
            for v in views:
                ffi.release(v)
        return why, int(which[0]), [int(x) for x in lens], int(self._seq[0])

    @staticmethod
    def side(chan: Any) -> bytes:
        """The request nvpf_serve left for Python from the thread's mailbox (chan.side_len bytes); clears it."""
        msg = bytes(ffi.buffer(chan.side, chan.side_len))
        chan.side_len = 0
        return msg

    def waiter(self, chan: Any) -> Any:
        """For a reply C left to Python: a function that waits as the call must, or None (reply at once)."""
        kind, h = chan.wait_kind, chan.wait_handle
        if kind == WAIT_STREAM:
            fn = self.drv.stream_sync
        elif kind == WAIT_EVENT:
            fn = self.drv.event_sync
        else:
            return None

        def wait() -> None:
            rc = fn(h)
            if rc:
                raise CudaError(rc)

        return wait


def why_name(why: int) -> str:
    """Why a serve ended, in words."""
    return WHY_NAMES.get(why, str(why)).lower()


class ServeGaps:
    """NVPROXY_SERVE_STATS: the times between two of C's serves, while Python held the channels, and the longest of
    them with why C had stopped and what Python executed meanwhile (where the serving's other share goes)."""

    KEEP = 5

    def __init__(self) -> None:
        self.count = 0
        self.total_s = 0.0
        self.longest: list[tuple[float, int, str, str]] = []  # (seconds, tiebreak, why, ops), a min-heap of KEEP
        self._left: float | None = None
        self._why = ""
        self._ops: Counter[str] = Counter()
        self._refused = ""  # why Python last kept the channels (Server._servable)
        self.kept_s: Counter[str] = Counter()  # gap time by that reason

    def left(self, why: int) -> None:
        """C's serve just ended, for why."""
        self._left = time.perf_counter()
        self._why = why_name(why)
        self._ops.clear()

    def ran(self, op: int) -> None:
        """Python executed op."""
        if self._left is not None:
            self._ops[wire.OP_NAMES.get(op, str(op))] += 1

    def refused(self, why: str) -> None:
        """Python kept the channels for why."""
        self._refused = why

    def entered(self) -> None:
        """C's next serve begins."""
        if self._left is None:
            return
        gap = time.perf_counter() - self._left
        self._left = None
        self.kept_s[self._refused or "none"] += gap
        self._refused = ""
        self.count += 1
        self.total_s += gap
        ops = ", ".join(f"{name} {n}" for name, n in self._ops.most_common(3)) or "nothing"
        entry = (gap, self.count, self._why, ops)
        if len(self.longest) < self.KEEP:
            heapq.heappush(self.longest, entry)
        else:
            heapq.heappushpop(self.longest, entry)

    def report(self) -> str:
        worst = "; ".join(f"{g * 1e3:.2f} ms after {why} ({ops})" for g, _n, why, ops in sorted(self.longest,
                                                                                             reverse=True))
        kept = ", ".join(f"{why} {t:.4f} s" for why, t in self.kept_s.most_common())
        return (f"nvproxy: between serves {self.total_s:.4f} s in {self.count} gaps"
                + (f", the longest: {worst}" if worst else "")
                + f"\nnvproxy: the gaps by what last kept the channels in Python: {kept or 'none'}")
