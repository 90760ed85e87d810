"""The math libraries' objects in the proxy, and how a restore makes them again.

Handles are nvproxy's ids (the shim hands them out); this module owns the table from id to the library's real
handle (and teaches it to the executor) and a record of every call that made or configured one: its creation,
the configuration kept (the last call per function and key: SetStream, SetPointerMode, SetAttribute(attr),
cufftMakePlan*, curandSetPseudoRandomGeneratorSeed...), analyses done for it, and for cuRAND generators their
generation calls.  A restore runs the records again in their order, after device memory is back, so every
handle gets a real object configured as before (library workspaces are made by the library again).  A
generator's generation calls are run again into scratch memory, which leaves it where the old one was: the
random sequence goes on as an uninterrupted run's would.  Records hold the requests as they came (wire
streams, nvproxy's ids), so they are translated again by the proxy that replays them.
"""

from __future__ import annotations

import struct
import sys
import weakref
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from ..checkpoint.image import ImageError
from ..errors import CudaError
from . import spec

PER_THREAD = 2  # the wire id of cudaStreamPerThread
NULL_SLOT = (1 << 64) - 1  # a host buffer given as NULL


@dataclass
class Handle:
    kind: int
    hid: int
    real: int
    dev: int
    stream: int = 0  # the wire stream a stream setter gave it
    setter: int = -1  # that setter's record
    bound: Any = None  # with the per-thread stream: the channel whose stream the library was given


@dataclass
class Record:
    fid: int
    hostmask: int
    payload: bytes
    out_cap: int
    dev: int
    owner: tuple[int, int] | None
    refs: set[tuple[int, int]] = field(default_factory=set)
    count: int = 1  # generation calls: how many times in a row


@dataclass
class Outcome:
    ret: int
    out: bytes
    ran: bool  # the function ran (ret is its status or value)


class LibState:
    def __init__(self, backend: Any) -> None:
        self.backend = backend
        self.spec = spec.load()
        self.lib_number = {name: i for i, name in enumerate(self.spec.libs)}  # (the executor's and the shim's)
        self.exe: Any = None  # native.Executor, made when a library is first opened
        self.opened: dict[str, str | None] = {}  # library -> None (open), or why it cannot be
        self.handles: dict[tuple[int, int], Handle] = {}
        self.records: dict[int, Record] = {}  # in call order
        self.keys: dict[tuple[Any, ...], int] = {}  # a configuration's key -> its record
        self.last_generation: dict[tuple[int, int], int] = {}  # a generator -> its latest generation record
        self.serial = 0
        self.told: set[str] = set()
        self.fast: set[int] = set()  # functions the fast path may call
        self.zombies: set[tuple[int, int]] = set()  # destroyed, but recorded while others' records name them

    # ---- serving ----
    def tell_once(self, name: str, text: str) -> None:
        if name not in self.told:
            self.told.add(name)
            print(f"nvproxy: {text}", file=sys.stderr)

    def _open(self, f: spec.Func) -> str | None:
        lib = self.spec.libs[f.lib]
        if f.lib not in self.opened:
            from . import native  # (cffi and the executor: only once a library is used)

            sim = self.backend.name == "sim"
            paths = native.candidates(lib.soname, sim)
            if not paths:
                self.opened[f.lib] = "the sim backend has no GPU libraries (NVPROXY_LIB_DIR names none)"
            else:
                if self.exe is None:
                    self.exe = native.Executor()
                    self.exe.fast_host_only(sim)
                self.opened[f.lib] = self.exe.open(self.lib_number[f.lib], paths)
        return self.opened[f.lib]

    def run(self, ch: Any, dev: int, fid: int, hostmask: int, payload: bytes, out_cap: int,
            stream_of: Callable[[int], int], record: bool = True, fast: bool = False) -> Outcome:
        """Execute a request; its status (or value) and host outputs.  stream_of: a wire stream's real handle.
        fast: the proxy's C fast path may make later calls of this function itself (_fast_how), once one ran
        here."""
        f = self.spec.func(fid)
        lib = self.spec.libs[f.lib]
        if f.how != "forward":
            self.tell_once(f.name, f"{f.name} is not forwarded ({f.why})")
            return Outcome(lib.status("not_supported"), b"", False)
        why = self._open(f)
        if why is not None:
            self.tell_once(f.name, f"{f.name} is not forwarded: {lib.soname} cannot be opened in the proxy ({why})")
            return Outcome(lib.status("not_supported"), b"", False)
        assert self.exe is not None
        n = len(f.params)
        if len(payload) < 8 * n:
            return Outcome(lib.status("invalid_value"), b"", False)
        slots = struct.unpack_from(f"<{n}Q", payload)
        body: bytes | bytearray = payload
        streams = [p.index for p in f.params if p.role == "stream"]
        sim = self.backend.name == "sim"
        devs = [p.index for p in f.params if p.role == "dev" or (p.role in spec.MODE_ROLES and not hostmask >> p.index
                                                                 & 1)] if sim else []
        dev_elems = [at for at, what in self._elements(f, slots, hostmask, payload) if what == "dev"] if sim else []
        if streams or devs or dev_elems:
            body = bytearray(payload)
            for i in streams:
                struct.pack_into("<Q", body, 8 * i, stream_of(slots[i]))
            for at in [8 * i for i in devs] + dev_elems:  # (the sim backend's device memory lies elsewhere in the
                # proxy: test doubles need it)
                struct.pack_into("<Q", body, at, _sim_address(self.backend, struct.unpack_from("<Q", body, at)[0]))
        if ch is not None:
            self._bind(f, slots, ch, stream_of)
        sync = (lambda: self.backend.device_sync(dev)) if f.sync and _host_buffers(f, slots, hostmask) else None
        res = self.exe.call(fid, hostmask, body, out_cap, sync)
        if res.error:
            return self._refused(f, res)
        ok = f.retkind != "status" or res.ret == 0
        if ok and record:
            self._note(f, slots, hostmask, payload, out_cap, res, ch, dev, fast)
        if fast and fid not in self.fast:
            how = _fast_how(f)
            if how:
                self.exe.allow_fast(fid, how)
            self.fast.add(fid)
        return Outcome(res.ret, res.out, True)

    def _refused(self, f: spec.Func, res: Any) -> Outcome:
        from . import native

        lib = self.spec.libs[f.lib]
        if res.error == native.E_HANDLE:
            return Outcome(lib.status("invalid_handle"), b"", False)
        if res.error == native.E_NOSYM:
            self.tell_once(f.name, f"{f.name} is not forwarded: {lib.soname} has no such function")
            return Outcome(lib.status("not_supported"), b"", False)
        if 0 <= res.param < len(f.params) and f.params[res.param].role in spec.ELEMENT_ROLES:
            print(f"nvproxy: {f.name}: its elements' type (parameter {f.params[f.params[res.param].typed].name}) is "
                  "not one nvproxy knows; refused", file=sys.stderr)
            return Outcome(lib.status("invalid_value"), b"", False)
        print(f"nvproxy: a malformed request for {f.name} (parameter {res.param}); refused", file=sys.stderr)
        return Outcome(lib.status("invalid_value"), b"", False)

    def _bind(self, f: spec.Func, slots: tuple[int, ...], ch: Any, stream_of: Callable[[int], int]) -> None:
        """A handle given cudaStreamPerThread works on the calling thread's stream: where another thread calls
        with it, the library is given that thread's per-thread stream first.  (A handle its parameter takes for
        another kind is not bound: that handle's stream is not the call's.)"""
        if f.owner < 0 or f.params[f.owner].role != "handle":
            return
        p = f.params[f.owner]
        h = self.handles.get((p.kind, slots[f.owner]))
        if h is None or h.stream != PER_THREAD or h.bound is ch or h.setter not in self.records:
            return
        r = self.records[h.setter]
        self.run(ch, h.dev, r.fid, r.hostmask, r.payload, r.out_cap, stream_of, record=False)
        h.bound = ch

    # ---- records ----
    def _refs(self, f: spec.Func, slots: tuple[int, ...], hostmask: int = 0, payload: bytes = b"") -> set[
            tuple[int, int]]:
        """The handles a call names: as parameters, and among its typed elements."""
        refs = {self._held(p, slots[p.index]) for p in f.params if p.role in ("handle", "destroy", "create")}
        for at, what in self._elements(f, slots, hostmask, payload):
            if what not in ("", "dev"):
                hid = struct.unpack_from("<Q", payload, at)[0]
                if hid:
                    refs.add((self.spec.kind_of(self.spec.types[what].tag), hid))
        return refs

    def _held(self, p: spec.Param, hid: int) -> tuple[int, int]:
        """The handle a parameter names, as the handles table holds it: a used handle may be of another kind its
        parameter takes (a cuBLAS handle given to cuBLASLt), whose records it belongs to."""
        kinds = self.spec.accepted(p.kind) if p.role == "handle" else (p.kind,)
        return next(((k, hid) for k in kinds if (k, hid) in self.handles), (p.kind, hid))

    def _elements(self, f: spec.Func, slots: tuple[int, ...], hostmask: int, payload: bytes) -> list[
            tuple[int, str]]:
        """Where in the request each typed element of the call lies, and what it is (the annotations'
        ELEMENT_TYPES: "" plain data, "dev" a device pointer, or a handle type)."""
        if not any(p.role in spec.ELEMENT_ROLES for p in f.params):
            return []
        types = self.spec.libs[f.lib].ann.ELEMENT_TYPES
        out = []
        for p in f.params:
            at = _input_offsets(f, slots, hostmask).get(p.index)
            size, what = types.get(slots[p.typed], (0, "")) if p.role in spec.ELEMENT_ROLES else (0, "")
            if at is not None and size == 8 and what:
                out += [(at + k, what) for k in range(0, min(slots[p.index], len(payload) - at) - 7, 8)]
        return out

    def _add(self, rec: Record) -> int:
        self.serial += 1
        self.records[self.serial] = rec
        return self.serial

    def _note(self, f: spec.Func, slots: tuple[int, ...], hostmask: int, payload: bytes, out_cap: int,
              res: Any, ch: Any, dev: int, fast: bool = False) -> None:
        assert self.exe is not None
        owner = self._held(f.params[f.owner], slots[f.owner]) if f.owner >= 0 else None
        if f.state == "create":
            created = [p for p in f.params if p.role == "create"]
            for p, real in zip(created, res.created, strict=False):
                self.handles[(p.kind, slots[p.index])] = Handle(p.kind, slots[p.index], real, dev)
                self.exe.learn(p.kind, slots[p.index], real)
            self._add(Record(f.fid, hostmask, payload, out_cap, dev, owner, self._refs(f, slots)))
        elif f.state == "destroy" and owner is not None:
            self._drop(owner, Record(f.fid, hostmask, payload, out_cap, dev, owner, {owner}))
        elif f.state == "config" and owner is not None and owner in self.handles:
            key = (owner, f.fid, tuple(slots[k] for k in f.key))
            old = self.keys.pop(key, None)
            if old is not None:
                self.records.pop(old, None)
            n = self.keys[key] = self._add(Record(f.fid, hostmask, payload, out_cap, dev, owner,
                                                  self._refs(f, slots, hostmask, payload)))
            if old is not None:
                self._collect()
            self._took_generated(owner, forget=True)
            self.last_generation.pop(owner, None)
            if f.stream_setter:
                h = self.handles[owner]
                h.stream = next(slots[p.index] for p in f.params if p.role == "stream")
                h.setter, h.bound = n, ch
                self.exe.handle_slow(owner[0], owner[1], h.stream == PER_THREAD)
        elif f.state == "generate" and owner is not None and owner in self.handles:
            self._generated(f, slots, hostmask, payload, out_cap, dev, owner, fast)

    def _generated(self, f: spec.Func, slots: tuple[int, ...], hostmask: int, payload: bytes, out_cap: int,
                   dev: int, owner: tuple[int, int], fast: bool) -> None:
        """A generation call: counted into the generator's latest record when it is the same call (its output
        pointer aside: a replay writes scratch memory).  fast: the C fast path makes and counts the posted calls
        like it that follow."""
        out = _output_param(f)
        body = bytearray(payload)
        device = not hostmask >> out & 1
        if device:  # (device memory: a replay writes scratch; host memory: its length stays)
            struct.pack_into("<Q", body, 8 * out, 0)
        self._took_generated(owner)
        last = self.records.get(self.last_generation.get(owner, -1))
        if last is not None and last.fid == f.fid and last.payload == bytes(body) and last.hostmask == hostmask:
            last.count += 1
        else:
            self.last_generation[owner] = self._add(Record(f.fid, hostmask, bytes(body), out_cap, dev, owner,
                                                           self._refs(f, slots)))
        if fast and self.exe is not None:
            self.exe.teach_generation(owner, f.fid, out, hostmask, bytes(body) if device else None)

    def _took_generated(self, owner: tuple[int, int], forget: bool = False) -> None:
        """The generation calls the C fast path made for owner since it was last asked, counted into the
        generator's latest record (they were the same call); forget: C makes no more of them."""
        if self.exe is None:
            return
        n = self.exe.take_generated(owner)
        last = self.records.get(self.last_generation.get(owner, -1))
        if n and last is not None:
            last.count += n
        if forget:
            self.exe.teach_generation(owner, 0, 0, 0, None)

    def _drop(self, h: tuple[int, int], destroyed: Record) -> None:
        """A handle destroyed: its records, and those naming it, go; but where its library keeps what another
        object's configuration names (KEEP_REFERENCED: a finalized cuDNN graph keeps its operations), it stays
        recorded while it is named, with its destruction, so that a restore makes it, configures the other, then
        destroys it."""
        gone = self.handles.pop(h, None)
        if gone is not None and self.exe is not None:
            self.exe.forget(*h)
        lib = self.spec.libs[self.spec.func(destroyed.fid).lib]
        if getattr(lib.ann, "KEEP_REFERENCED", False) and self._named_by_others(h):
            self._add(destroyed)
            self.zombies.add(h)
            return
        self._forget_records(h)

    def _named_by_others(self, h: tuple[int, int]) -> bool:
        return any(h in r.refs and r.owner != h for r in self.records.values())

    def _forget_records(self, h: tuple[int, int]) -> None:
        for n in [n for n, r in self.records.items() if h in r.refs or r.owner == h]:
            del self.records[n]
        for k in [k for k, n in self.keys.items() if n not in self.records]:
            del self.keys[k]
        self.last_generation.pop(h, None)
        self.zombies.discard(h)
        self._collect()

    def _collect(self) -> None:
        """Destroyed objects kept for others' records that no record names any more: their records go."""
        for z in [z for z in self.zombies if not self._named_by_others(z)]:
            if z in self.zombies:
                self._forget_records(z)

    # ---- checkpoint and restore ----
    def describe(self) -> dict[str, Any]:
        for owner in list(self.last_generation):
            self._took_generated(owner)
        recs = []
        for r in self.records.values():
            f = self.spec.func(r.fid)
            recs.append([f.name, r.hostmask, r.payload.hex(), r.out_cap, r.dev, r.count])
        return {"lib_records": recs} if recs else {}

    def restore(self, state: Any, records: list[list[Any]]) -> None:
        """Make every recorded object again (device memory is back; streams exist), in call order."""
        parsed = []
        for name, hostmask, payload_hex, out_cap, dev, count in records:
            f = self.spec.named(name)
            if f is not None:  # (a setter that would initialise device memory the image restored: REPLAY_AS)
                f = self.spec.named(getattr(self.spec.libs[f.lib].ann, "REPLAY_AS", {}).get(name, name))
            if f is None:
                raise ImageError(f"the image holds a call of {name}, which this nvproxy does not know")
            parsed.append((f, hostmask, bytes.fromhex(payload_hex), out_cap, dev, count))
        skip = _skip_ahead(self.spec, parsed)
        skipped: set[tuple[int, int]] = set()
        for f, hostmask, payload, out_cap, dev, count in parsed:
            self.backend.activate(dev)

            def stream_of(w: int, dev: int = dev) -> int:
                try:
                    s = state.stream(w, dev, lambda d: self.backend.legacy_stream(d))
                except CudaError:  # (destroyed since it was given: natively the handle kept a dangling stream)
                    s = self.backend.legacy_stream(dev)
                return int(self.backend.handle_value(s))

            if f.state == "generate":
                owner = _owner(f, payload)
                if owner in skip:  # (at its first generation record: an offset past every value it made)
                    self._skip(owner, skip.pop(owner), dev, stream_of)
                    skipped.add(owner)
                if owner in skipped:
                    self.last_generation[owner] = self._add(Record(f.fid, hostmask, payload, out_cap, dev, owner,
                                                                   {owner}, count))
                    continue
                self._replay_generation(state, f, hostmask, payload, out_cap, dev, count, stream_of)
                continue
            out = self.run(None, dev, f.fid, hostmask, payload, out_cap, stream_of)
            if not out.ran or (f.retkind == "status" and out.ret != 0):
                raise ImageError(f"{f.name} failed making a library object again (status {out.ret})")

    def _skip(self, owner: tuple[int, int], offset: int, dev: int, stream_of: Callable[[int], int]) -> None:
        """A generator set to go on from offset (its values made so far: _skip_ahead)."""
        setter = self.spec.named(self.spec.libs["curand"].ann.SKIP_AHEAD_BY[1])
        assert setter is not None
        payload = struct.pack("<QQ", owner[1], offset)
        res = self.run(None, dev, setter.fid, 0, payload, 0, stream_of, record=False)
        if not res.ran or res.ret != 0:
            raise ImageError(f"{setter.name} failed setting a generator's offset again (status {res.ret})")

    def _replay_generation(self, state: Any, f: spec.Func, hostmask: int, payload: bytes, out_cap: int, dev: int,
                           count: int, stream_of: Callable[[int], int]) -> None:
        out = _output_param(f)
        slots = struct.unpack_from(f"<{len(f.params)}Q", payload)
        host = hostmask >> out & 1  # (a host generator: its output comes back, to be dropped)
        nbytes = max(_count(f, slots) * f.params[out].elem(self.spec.types), 1)
        scratch = 0 if host else state.alloc(dev, nbytes)
        try:
            body = bytearray(payload)
            if not host:
                struct.pack_into("<Q", body, 8 * out, scratch)
            for _ in range(count):
                res = self.run(None, dev, f.fid, hostmask, bytes(body), out_cap, stream_of, record=False)
                if not res.ran or res.ret != 0:
                    raise ImageError(f"{f.name} failed advancing a generator again (status {res.ret})")
            self.backend.device_sync(dev)
        finally:
            if scratch:
                state.free(scratch, idle=True)
        owner = (f.params[f.owner].kind, slots[f.owner])
        self.last_generation[owner] = self._add(Record(f.fid, hostmask, payload, out_cap, dev, owner,
                                                       self._refs(f, slots), count))


def _input_offsets(f: spec.Func, slots: tuple[int, ...], hostmask: int) -> dict[int, int]:
    """Where each host input of a request lies in its payload (after the slots, each padded to 8 bytes), by
    parameter."""
    out, at = {}, 8 * len(slots)
    for p in f.params:
        takes = p.role in ("in", "inout", "str", "sval", "elems", "elemsout") or (
            p.role in ("scalar", "both") and hostmask >> p.index & 1)
        if takes and slots[p.index] != NULL_SLOT:
            out[p.index] = at
            at += (slots[p.index] + 7) & ~7
    return out


def _fast_how(f: spec.Func) -> int:
    """Which calls of f the proxy's C fast path may make (native.FAST_*): none of a function that creates,
    configures or destroys what a restore makes again (its records are Python's) but posted generation calls that
    repeat their generator's latest record, nor waited ones whose host outputs need a wait for the device (sync) or
    are a string."""
    from . import native

    if f.state == "generate" and f.posted_possible:
        return native.FAST_GENERATE  # (counted into the generator's record: _generated)
    if f.state:
        return 0
    waited = native.FAST_WAITED if not f.sync and f.retkind in ("status", "value") else 0
    return (native.FAST_POSTED if f.posted_possible else 0) | waited


def _sim_address(backend: Any, va: int) -> int:
    """Where the sim backend keeps the device memory at va (va itself where it knows none: pinned host memory is
    at the same address, and a library stand-in can be given other values)."""
    from . import native

    try:
        view = backend.mem.view(va, 1)
    except Exception:
        return va
    return int(native.ffi.cast("uintptr_t", native.ffi.from_buffer(view)))


def _host_buffers(f: spec.Func, slots: tuple[int, ...], hostmask: int) -> bool:
    """Does the call give the library host memory (not NULL, not empty)?"""
    return any((p.role in ("in", "out", "inout") or (p.role in spec.MODE_ROLES and hostmask >> p.index & 1))
               and slots[p.index] not in (0, NULL_SLOT) for p in f.params)


def _owner(f: spec.Func, payload: bytes) -> tuple[int, int]:
    return f.params[f.owner].kind, struct.unpack_from("<Q", payload, 8 * f.owner)[0]


def _skip_ahead(sp: spec.Spec, parsed: list[tuple[Any, ...]]) -> dict[tuple[int, int], int]:
    """The generators a restore sets to an offset instead of making their numbers again (the curand annotations'
    SKIP_AHEAD: device generators that made their numbers with one function only), each with that offset: its own
    offset, plus every value it made."""
    ann = sp.libs["curand"].ann
    create, offset_setter, ordering = ann.SKIP_AHEAD_BY
    kinds: dict[tuple[int, int], int] = {}  # generator -> curandRngType_t
    base: dict[tuple[int, int], int] = {}
    made: dict[tuple[int, int], int] = {}
    used: dict[tuple[int, int], str] = {}  # generator -> the one generation function it used
    bad: set[tuple[int, int]] = set()
    for f, _hostmask, payload, _out_cap, _dev, count in parsed:
        if f.lib != "curand" or f.owner < 0:
            continue
        owner = _owner(f, payload)
        slots = struct.unpack_from(f"<{len(f.params)}Q", payload)
        if f.name == create:
            kinds[owner] = slots[1]
        elif f.state == "generate":
            allowed = ann.SKIP_AHEAD.get(kinds.get(owner, -1), ())
            if (allowed is not None and f.name not in allowed) or used.setdefault(owner, f.name) != f.name:
                bad.add(owner)  # (a function not measured, or a second one: runs of several were not all alike)
            made[owner] = made.get(owner, 0) + _count(f, slots) * count
        elif owner in made or f.name == ordering:  # (configured once it had begun, or another ordering)
            bad.add(owner)
        elif f.name == offset_setter:
            base[owner] = slots[1]
    return {g: base.get(g, 0) + n for g, n in made.items() if g not in bad and g in kinds}


def _output_param(f: spec.Func) -> int:
    return next(p.index for p in f.params if p.role in ("dev", "result"))


def _count(f: spec.Func, slots: tuple[int, ...]) -> int:
    """How many values a generation call makes (its first size_t parameter)."""
    return next(slots[p.index] for p in f.params if p.role == "val" and p.type.kind == "u8")


_STATES: weakref.WeakKeyDictionary[Any, LibState] = weakref.WeakKeyDictionary()


def of(state: Any) -> LibState:
    """The process state's library objects (made on first use)."""
    ls = _STATES.get(state)
    if ls is None:
        ls = _STATES[state] = LibState(state.backend)
    return ls


def describe(state: Any) -> dict[str, Any]:
    """The image header's part for the libraries (dump.describe)."""
    ls = _STATES.get(state)
    return ls.describe() if ls is not None else {}


def restore(state: Any, header: dict[str, Any]) -> None:
    """After a restore's device memory and streams: the libraries' objects (restore._replay)."""
    records = header.get("lib_records")
    if records:
        of(state).restore(state, records)
