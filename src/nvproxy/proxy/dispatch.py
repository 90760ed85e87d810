"""Request -> handler.  Handlers live in proxy/handlers/, one module per API
area; each is `def OPNAME(p, ch, a, payload)` where p is this Dispatcher, ch the
calling channel, a the request's argument words.  A handler returns None, a
(results, payload) pair, or a Deferred; it raises CudaError to fail."""

from __future__ import annotations

import functools
import os
from typing import Any

from .. import wire
from . import fastpath
from .handlers import arrays, device, graphs, ipc, libs, managed, memory, modules, streams
from .handlers import driver as driver_api
from .server import SPIN_S
from .state import ProcessState


def launch_threads() -> int:
    """NVPROXY_LAUNCH_THREADS, or where it is not set 8, at most half the cores this proxy may run on: the program's
    threads that launch need cores beside them."""
    if os.environ.get("NVPROXY_LAUNCH_THREADS"):
        return int(os.environ["NVPROXY_LAUNCH_THREADS"])
    return max(1, min(8, len(os.sched_getaffinity(0)) // 2))


class Dispatcher:
    def __init__(self, backend: Any) -> None:
        self.backend = backend
        self.state = ProcessState(backend)
        self.server: Any = None
        self.pending_graphs: dict[str, Any] | None = None  # (graphs.defer_restore)
        self.fast: fastpath.FastPath | None = None
        self.gated = False  # a concurrent checkpoint guards unsaved memory: every request comes to Python
        self._sync_taught: set[int] = set()  # devices whose sync streams C knows (teach_sync_streams)
        driver = getattr(backend, "fast_driver", None)
        if driver is not None and fastpath.enabled():
            self.fast = fastpath.FastPath(driver(), spin_us=int(SPIN_S * 1e6), launch_threads=launch_threads())
            # C replies itself only while no kernel printf text waits for a reply
            self.fast.set_text_fd(backend.watch_text(self.fast.set_text_pending))
            # (where no kernel can print, C's waits need not make the driver flush printf text: fastpath.c)
            self.state.printing = lambda: self.fast.set_may_print(True)
        self.table: dict[int, Any] = {}
        for mod in (arrays, device, driver_api, graphs, ipc, libs, managed, memory, modules, streams):
            for name, op in wire.CONSTANTS.items():
                fn = getattr(mod, name[len("NVP_OP_") :], None) if name.startswith("NVP_OP_") else None
                if fn is not None:
                    self.table[op] = functools.partial(fn, self)
        # while a capture is on, stream work goes through _logged (captures_changed swaps the entries in)
        self._plain = {op: self.table[op] for op in graphs.CAPTURABLE}
        self._logging = {op: functools.partial(self._logged, op, at, graphs.fenced(self, op, self.table[op]))
                         for op, at in graphs.CAPTURABLE.items()}

    def _logged(self, op: int, at: int, fn: Any, ch: Any, a: tuple[int, ...], payload: bytes) -> Any:
        result = fn(ch, a, payload)
        if self.state.captures:
            status, cid = self.backend.capture_status(self.stream(ch, a[at]))
            log = self.state.captures.get(cid) if status == graphs.CAPTURE_ACTIVE else None
            if log is not None:
                log.calls.append((op, a, payload))
        return result

    def capturing(self, s: Any) -> bool:
        """Is stream s being captured (its work goes into a graph)?"""
        return bool(self.state.captures) and self.backend.capture_status(s)[0] == graphs.CAPTURE_ACTIVE

    def captures_changed(self) -> None:
        """While a capture is on, C executes nothing, so that Python sees every call, and logs it (so too while
        the process has __managed__ variables: launches keep them coherent, managed_vars.py; and once its
        context is broken: every call fails)."""
        on = bool(self.state.captures)
        self.table.update(self._logging if on else self._plain)
        if self.fast is not None:
            self.fast.set_capturing(on or bool(self.state.managed_vars) or bool(self.state.broken) or self.gated)

    def per_thread_stream(self, ch: Any) -> Any:
        """The per-thread default stream of the channel's application thread:
        a blocking stream, as the runtime makes it."""

        def get(dev: int) -> Any:
            s = ch.per_thread.get(dev)
            if s is None:
                s = ch.per_thread[dev] = self.backend.stream_create(dev, 0, 0)
                if ch.fast is not None and dev < fastpath.MAX_DEV:
                    ch.fast.per_thread[dev] = fastpath.ffi.cast("void *", self.backend.handle_value(s))
                self.sync_streams_changed()
            return s

        return get

    def stream(self, ch: Any, wire_id: int) -> Any:
        s = self.state.stream(wire_id, ch.dev, self.per_thread_stream(ch))
        if self.fast is not None and wire_id in self.state.streams:
            self.fast.learn_stream(wire_id, s, self.backend.handle_value)
        return s

    def event(self, wire_id: int) -> Any:
        e = self.state.event(wire_id)
        # an event timed before a restore must come here when it is recorded again
        if self.fast is not None and wire_id not in self.state.event_past:
            self.fast.learn_event(wire_id, e, self.backend.handle_value)
        return e

    def kernel(self, ch: Any, kid: int) -> Any:
        k = self.state.kernel(ch.dev, kid)
        if self.fast is not None:
            self.fast.learn_kernel(ch.dev, kid, k, self.backend.kernel_handle)
        return k

    def device_idle(self, dev: int, most: int = 1 << 30) -> bool:
        """Has every stream work can be on finished (the legacy stream, the program's streams and
        per-thread streams)?  Then a synchronisation needs no hand-off to a waiting thread.  False also
        where there are more than most streams to ask."""
        be = self.backend
        streams = self._streams_of(dev, blocking_only=False)
        if len(streams) >= most or not be.stream_query(be.legacy_stream(dev)):
            return False
        return all(be.stream_query(s) for s in streams)

    def teach_sync_streams(self, dev: int) -> None:
        """Tell C which streams a synchronous pageable copy on dev waits for, as the runtime's does: the legacy
        stream (NULL, as C names it), the program's blocking streams and every thread's per-thread stream (not
        non-blocking streams: a pageable cudaMemcpy waits for a kernel on the legacy or a blocking stream and
        not for one on a non-blocking stream)."""
        if self.fast is None or dev in self._sync_taught:
            return
        streams = self._streams_of(dev, blocking_only=True)
        self.fast.set_sync_streams(dev, [0] + [self.backend.handle_value(s) for s in streams])
        self._sync_taught.add(dev)

    def _streams_of(self, dev: int, blocking_only: bool) -> list[Any]:
        """The program's streams on dev (only those not made cudaStreamNonBlocking, if blocking_only) and every
        thread's per-thread stream there; not the legacy stream."""
        st = self.state
        streams = [s for w, (d, s) in st.streams.items()
                   if d == dev and not (blocking_only and st.stream_args.get(w, (0, 0))[0] & 1)]
        if self.server is not None:
            streams += [ch.per_thread[dev] for ch in self.server.channels if dev in ch.per_thread]
        return streams

    def sync_streams_changed(self) -> None:
        """A stream came or went: C asks Python again which streams a synchronous copy waits for."""
        if self.fast is not None:
            for dev in self._sync_taught:
                self.fast.set_sync_streams(dev, None)
        self._sync_taught.clear()

    def forget(self) -> None:
        """Handles were destroyed or reloaded: the fast path learns them again."""
        if self.fast is not None:
            self.fast.forget_all()
        self._sync_taught.clear()  # (forgotten in C too)

    def channel_closed(self, ch: Any) -> None:
        if ch.staging is not None:
            memory.release_staging(self, ch)
