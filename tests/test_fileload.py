"""The native image-file loader (native/proxy/fileload.c) against a driver double
whose copies happen only when their event is asked about: a slot used again before
its copy was done would put the wrong bytes on the "device", and these tests see it.
(Restores from image files on the sim backend and the GPU run the same code.)"""

from __future__ import annotations

import ctypes
import errno
import os
import random
import threading
import time
from pathlib import Path

import pytest

from nvproxy.checkpoint import fileload
from nvproxy.checkpoint.checksum import checksum
from nvproxy.checkpoint.fileload import ffi

NOT_READY = 600
SLOT = 1024  # (chunks are up to four slots long: read and copied a slot at a time)


class Driver:
    """Copies wait in their stream until an event recorded after them is queried (the second time) or synced."""

    def __init__(self, fail_copy_at: int = -1) -> None:
        self.queued: dict[int, list[tuple[int, int, int]]] = {}
        self.events: dict[int, tuple[list[tuple[int, int, int]], int]] = {}  # event -> (copies, queries left)
        self.copies: list[tuple[int, int, int]] = []
        self.fail_copy_at = fail_copy_at
        self.lock = threading.Lock()
        self._cbs = []
        template = ffi.new("struct nvpl_load *")
        impl = {"memcpy_async": self.memcpy, "event_record": self.record, "event_query": self.query,
                "event_sync": self.sync}
        self.table = {}
        for name, fn in impl.items():
            cb = ffi.callback(ffi.typeof(getattr(template, name)), fn)
            self._cbs.append(cb)
            self.table[name] = int(ffi.cast("uintptr_t", cb))

    def memcpy(self, dst: int, src: int, n: int, stream: object) -> int:
        with self.lock:
            if len(self.copies) == self.fail_copy_at:
                return 700  # (an illegal address, say)
            self.copies.append((dst, src, n))
            self.queued.setdefault(int(ffi.cast("uintptr_t", stream)), []).append((dst, src, n))
        return 0

    def record(self, event: object, stream: object, _flags: int) -> int:
        with self.lock:
            self.events[int(ffi.cast("uintptr_t", event))] = (self.queued.pop(int(ffi.cast("uintptr_t", stream)),
                                                                                []), 1)
        return 0

    def _complete(self, e: int) -> None:
        for dst, src, n in self.events.pop(e, ([], 0))[0]:
            ctypes.memmove(dst, src, n)

    def query(self, event: object) -> int:
        e = int(ffi.cast("uintptr_t", event))
        with self.lock:
            copies, left = self.events.get(e, ([], 0))
            if left > 0:
                self.events[e] = (copies, left - 1)
                return NOT_READY
            self._complete(e)
        return 0

    def sync(self, event: object) -> int:
        with self.lock:
            self._complete(int(ffi.cast("uintptr_t", event)))
        return 0


class Setup:
    def __init__(self, tmp_path: Path, nchunks: int = 40, nslots: int = 3) -> None:
        rng = random.Random(7)
        self.sizes = [rng.choice([4 * SLOT, SLOT, 3000, 1, 33]) for _ in range(nchunks)]
        self.data = bytes(rng.getrandbits(8) for _ in range(sum(self.sizes) + 512))
        self.path = tmp_path / "image"
        self.path.write_bytes(self.data)
        self.device = ctypes.create_string_buffer(len(self.data))
        self.slots = ctypes.create_string_buffer(nslots * SLOT)
        self.states = fileload.slot_states(nslots)
        self.nslots = nslots
        base = ctypes.addressof(self.device)
        self.chunks = []
        off = 256  # (file offsets and device addresses differ: each chunk must go to its own place)
        for n in self.sizes:
            self.chunks.append((off, base + off - 256, n, checksum(self.data[off : off + n])))
            off += n

    def run(self, driver: Driver, readers: int = 4, **kw: object) -> fileload.Outcome:
        fd = os.open(self.path, os.O_RDONLY)
        try:
            return fileload.run(fd, self.chunks, ctypes.addressof(self.slots), SLOT, self.states,
                                [0x1000 + i for i in range(self.nslots)], [0x5000, 0x5001], driver.table,
                                readers, 256, **kw)  # type: ignore[arg-type]
        finally:
            os.close(fd)

    def damage(self) -> int:
        """A chunk of several slots gets a wrong checksum; its index."""
        k = next(i for i, n in enumerate(self.sizes) if n > 2 * SLOT)
        off, va, n, crc = self.chunks[k]
        self.chunks[k] = (off, va, n, crc ^ 1)
        return k

    def on_device(self) -> bytes:
        return self.device.raw[: sum(self.sizes)]

    def expected(self) -> bytes:
        return self.data[256 : 256 + sum(self.sizes)]


@pytest.mark.parametrize("readers", [1, 4])
def test_every_chunk_lands_in_its_place(tmp_path: Path, readers: int) -> None:
    s = Setup(tmp_path)
    for i in range(s.nslots):
        s.states[i] = fileload.SLOT_READY
    seen: list[int] = []
    d = Driver()
    r = s.run(d, readers, progress=seen.append)
    assert (r.why, r.bad_chunk) == (fileload.OK, -1)
    assert s.on_device() == s.expected()
    assert len(d.copies) == sum(-(-n // SLOT) for n in s.sizes)
    assert seen[-1] == sum(s.sizes)


def test_slots_made_while_it_runs_and_one_that_failed(tmp_path: Path) -> None:
    """Slots become usable as their makers finish; a slot that could not be made is left alone."""
    s = Setup(tmp_path, nslots=4)
    s.states[3] = fileload.SLOT_FAILED

    def make() -> None:
        for i in range(3):
            time.sleep(0.05)
            s.states[i] = fileload.SLOT_READY

    t = threading.Thread(target=make)
    t.start()
    d = Driver()
    r = s.run(d)
    t.join()
    assert r.why == fileload.OK
    assert s.on_device() == s.expected()
    used = {src for _dst, src, _n in d.copies}
    assert ctypes.addressof(s.slots) + 3 * SLOT not in used
    assert r.slot_wait_s > 0.04


def test_a_damaged_chunk_is_named_and_its_last_piece_never_copied(tmp_path: Path) -> None:
    s = Setup(tmp_path)
    for i in range(s.nslots):
        s.states[i] = fileload.SLOT_READY
    k = s.damage()
    _off, va, n, _crc = s.chunks[k]
    d = Driver()
    r = s.run(d)
    assert (r.why, r.bad_chunk) == (fileload.MISMATCH, k)
    assert all(dst != va + n - SLOT for dst, _src, _n in d.copies)


def test_a_file_that_ends_early(tmp_path: Path) -> None:
    s = Setup(tmp_path)
    for i in range(s.nslots):
        s.states[i] = fileload.SLOT_READY
    off, va, n, crc = s.chunks[-1]
    s.chunks[-1] = (len(s.data) - 10, va, n + 100, crc)
    r = s.run(Driver())
    assert (r.why, r.err, r.bad_chunk) == (fileload.SHORT, 0, len(s.chunks) - 1)


def test_a_read_that_fails_is_told_from_an_end_of_file(tmp_path: Path) -> None:
    s = Setup(tmp_path)
    for i in range(s.nslots):
        s.states[i] = fileload.SLOT_READY
    s.path = tmp_path  # (a directory: pread fails with EISDIR)
    r = s.run(Driver())
    assert (r.why, r.err) == (fileload.SHORT, errno.EISDIR)


def test_no_slot_could_be_made(tmp_path: Path) -> None:
    s = Setup(tmp_path)
    for i in range(s.nslots):
        s.states[i] = fileload.SLOT_FAILED
    d = Driver()
    r = s.run(d)
    assert r.why == fileload.NO_SLOTS and d.copies == []


def test_a_failed_copy_stops_the_load(tmp_path: Path) -> None:
    s = Setup(tmp_path)
    for i in range(s.nslots):
        s.states[i] = fileload.SLOT_READY
    d = Driver(fail_copy_at=5)
    r = s.run(d)
    assert (r.why, r.err) == (fileload.CUDA, 700)
    assert len(d.copies) == 5


def _gated_run(tmp_path: Path, **kw: object) -> tuple[Setup, Driver, fileload.Gate, threading.Thread,
                                                     list[fileload.Outcome]]:
    """A load behind a closed gate, on a thread of its own, every slot made."""
    return _gated_run_of(Setup(tmp_path), **kw)


def _gated_run_of(s: Setup, **kw: object) -> tuple[Setup, Driver, fileload.Gate, threading.Thread,
                                                   list[fileload.Outcome]]:
    for i in range(s.nslots):
        s.states[i] = fileload.SLOT_READY
    d, gate = Driver(), fileload.Gate()
    out: list[fileload.Outcome] = []
    t = threading.Thread(target=lambda: out.append(s.run(d, gate=gate, **kw)))
    t.start()
    return s, d, gate, t, out


def test_a_closed_gate_holds_the_copies_while_the_slots_fill(tmp_path: Path) -> None:
    """A restore starts reading before the device memory is mapped: nothing is copied until the gate opens."""
    s, d, gate, t, out = _gated_run(tmp_path)
    time.sleep(0.3)
    with d.lock:
        assert d.copies == []
    assert t.is_alive()  # (every slot is full, and none may go)
    gate.open()
    t.join(10)
    assert out and out[0].why == fileload.OK
    assert s.on_device() == s.expected()


def test_a_cancelled_gate_stops_the_load_without_a_copy(tmp_path: Path) -> None:
    s, d, gate, t, out = _gated_run(tmp_path)
    time.sleep(0.1)
    gate.cancel()
    t.join(10)
    assert not t.is_alive() and out[0].why == fileload.CANCELLED
    assert d.copies == [] and s.on_device() == bytes(sum(s.sizes))


def _check(s: Setup, threads: int = 3) -> fileload.Check:
    return fileload.Check(str(s.path), [(off, n, crc) for off, _va, n, crc in s.chunks], threads, 256)


def _until_checked(c: fileload.Check, nbytes: int) -> None:
    t = time.monotonic()
    while c.bytes_checked < nbytes and time.monotonic() - t < 20:
        time.sleep(0.01)


def test_the_early_check_finds_the_right_chunks_and_only_those(tmp_path: Path) -> None:
    s = Setup(tmp_path)
    k = s.damage()
    off, va, n, crc = s.chunks[-1]
    s.chunks[-1] = (len(s.data) - 10, va, n + 100, crc)  # (past the end of the file)
    right = [(off, n, crc) for off, _va, n, crc in s.chunks[:-1]]
    del right[k]
    c = _check(s)
    _until_checked(c, sum(n for _o, n, _c in right))
    good = c.stop()
    assert good == frozenset(right)
    assert c.stop() is good and c.read_s > 0


def _rewrite(s: Setup, k: int) -> bytes:
    """Chunk k's bytes in the file changed in place (same inode, no new sum); what the device should then hold."""
    off, _va, n, _crc = s.chunks[k]
    with open(s.path, "r+b") as f:
        f.seek(off)
        f.write(bytes(b ^ 0x5A for b in s.data[off : off + n]))
    data = bytearray(s.expected())
    data[off - 256 : off - 256 + n] = bytes(b ^ 0x5A for b in s.data[off : off + n])
    return bytes(data)


def test_a_checked_chunk_is_read_but_not_summed_again(tmp_path: Path) -> None:
    """The load takes the check's word: a chunk it found right goes through unsummed, so bytes changed after the
    check reach the device (how this test sees it); without the check the same load fails on that chunk."""
    s = Setup(tmp_path)
    for i in range(s.nslots):
        s.states[i] = fileload.SLOT_READY
    c = _check(s)
    _until_checked(c, sum(s.sizes))
    k = next(i for i, n in enumerate(s.sizes) if n > 2 * SLOT)
    want = _rewrite(s, k)
    r = s.run(Driver(), check=c)
    c.stop()
    assert (r.why, r.bad_chunk) == (fileload.OK, -1)
    assert s.on_device() == want
    r = s.run(Driver())
    assert (r.why, r.bad_chunk) == (fileload.MISMATCH, k)


def test_chunks_the_check_finds_right_while_the_gate_is_closed_are_not_summed(tmp_path: Path) -> None:
    """The check goes on while the load waits for its gate: the readers take its marks as they come to a chunk,
    not as they were when the load began.  Here the test marks a chunk itself once the load waits at the gate (as a
    check thread would), far past what three slots hold, with its bytes changed: they land unsummed."""
    s = Setup(tmp_path)
    k = max(i for i, n in enumerate(s.sizes) if n > 2 * SLOT)
    c = _check(s)
    c.stop()  # (its threads are done: good[] is the test's to write)
    c._good[k] = 0
    s, _d, gate, t, out = _gated_run_of(s, check=c)
    try:
        time.sleep(0.1)
        want = _rewrite(s, k)
        c._good[k] = 1
    finally:
        gate.open()
        t.join(10)
    assert out and (out[0].why, out[0].bad_chunk) == (fileload.OK, -1)
    assert s.on_device() == want


def test_the_check_is_told_to_stop_when_the_gate_opens(tmp_path: Path) -> None:
    """Once the copies may go, the check would only take memory bandwidth from the load."""
    big = tmp_path / "big"
    big.write_bytes(bytes(16 << 20))
    zeros = checksum(bytes(16 << 20))
    c = fileload.Check(str(big), [(0, 16 << 20, zeros)] * 1000, 1, 4096)  # (one thread: seconds of work)
    try:
        s, _d, gate, t, out = _gated_run(tmp_path, check=c)
        _until_checked(c, 2 * (16 << 20))
        gate.open()
        t.join(10)
        assert out and out[0].why == fileload.OK and s.on_device() == s.expected()
        seen = c.bytes_checked
        time.sleep(0.3)  # (a chunk takes it a few ms)
        assert c.bytes_checked == seen and not c.finished
    finally:
        c.stop()


def test_a_stopped_check_keeps_only_chunks_it_finished(tmp_path: Path) -> None:
    rng = random.Random(3)
    path = tmp_path / "big"
    data = rng.randbytes(16 << 20)
    path.write_bytes(data)
    whole = (0, len(data), checksum(data))
    mibs = [(off, 1 << 20, checksum(data[off : off + (1 << 20)])) for off in range(0, len(data), 1 << 20)]
    # Checked in order: 2000 times the whole file (32 GB, seconds for one thread) before the first MiB.
    c = fileload.Check(str(path), [whole] * 2000 + mibs, 1, 4096)
    _until_checked(c, len(data))
    good = c.stop()
    assert whole in good and not good & set(mibs)


def test_a_check_of_another_file_is_not_taken(tmp_path: Path) -> None:
    """The file the restore opens must be the one checked: replaced meanwhile, the check counts for nothing."""
    s = Setup(tmp_path)
    c = _check(s)
    _until_checked(c, sum(s.sizes))
    assert len(c.stop()) == len(s.chunks)
    fd = os.open(s.path, os.O_RDONLY)
    try:
        assert c.of(fd)
    finally:
        os.close(fd)
    fresh = tmp_path / "fresh"
    fresh.write_bytes(s.data)
    os.replace(fresh, s.path)
    fd = os.open(s.path, os.O_RDONLY)
    try:
        assert not c.of(fd)
    finally:
        os.close(fd)
