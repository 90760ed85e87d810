"""Request -> handler.  Handlers live in proxy/handlers/, one module per API
area; each is `def OPNAME(p, ch, a, payload)` where p is this Dispatcher, ch the
calling channel, a the request's argument words.  A handler returns None, a
(results, payload) pair, or a Deferred; it raises CudaError to fail."""

from __future__ import annotations

import functools
from typing import Any

from .. import wire
from .handlers import device, memory, modules, streams
from .state import ProcessState


class Dispatcher:
    def __init__(self, backend: Any) -> None:
        self.backend = backend
        self.state = ProcessState(backend)
        self.server: Any = None
        self.table: dict[int, Any] = {}
        for mod in (device, memory, modules, streams):
            for name, op in wire.CONSTANTS.items():
                fn = getattr(mod, name[len("NVP_OP_") :], None) if name.startswith("NVP_OP_") else None
                if fn is not None:
                    self.table[op] = functools.partial(fn, self)

    def per_thread_stream(self, ch: Any) -> Any:
        """The per-thread default stream of the channel's application thread:
        a blocking stream, as the runtime makes it."""

        def get(dev: int) -> Any:
            s = ch.per_thread.get(dev)
            if s is None:
                s = ch.per_thread[dev] = self.backend.stream_create(dev, 0, 0)
            return s

        return get

    def stream(self, ch: Any, wire_id: int) -> Any:
        return self.state.stream(wire_id, ch.dev, self.per_thread_stream(ch))

    def channel_closed(self, ch: Any) -> None:
        if ch.staging is not None:
            memory.release_staging(self, ch)
