"""The proxy's C fast path for math-library calls (native/proxy/libexec.c through fastpath.c), against the stand-in
libraries of tests/libfakes opened by the executor and driver doubles (test_fastpath): the replies it sends itself
for waited calls (small host outputs in r3, larger ones as payload), a posted call's failure kept per library in the
channel, and generation calls it makes and counts only where they repeat their generator's record.  Host buffers
stand in for device memory: the stand-ins read and write what they are given."""

from __future__ import annotations

import ctypes
import struct
import subprocess
from pathlib import Path

import numpy as np
import pytest
from test_fastpath import req, setup  # noqa: F401  (the fixture)

from nvproxy import wire
from nvproxy.libs import native, spec
from nvproxy.libs import state as libstate
from nvproxy.proxy import fastpath

FAKES = Path(__file__).resolve().parent / "libfakes"
OUT_IN_R3 = 1 << 32
SP = spec.load()
LIBS = list(SP.libs)


@pytest.fixture(scope="module")
def fakes(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The stand-ins' directory (under their sonames)."""
    d = tmp_path_factory.mktemp("fakes")
    for name in ("cublas", "curand"):
        so = d / SP.libs[name].soname
        subprocess.run(["gcc", "-shared", "-fPIC", "-O1", "-o", str(so), str(FAKES / f"fake_{name}.c")], check=True)
    return d


@pytest.fixture(scope="module")
def exe(fakes: Path) -> native.Executor:
    x = native.Executor()
    for name in ("cublas", "curand"):
        assert x.open(LIBS.index(name), [str(fakes / SP.libs[name].soname)]) is None
    x.fast_host_only(False)
    return x


def fn(name: str) -> spec.Func:
    f = SP.named(name)
    assert f is not None
    return f


def made(exe: native.Executor, create: str, hid: int, *args: int) -> int:
    """A real object of the stand-in, made through the executor, and taught under id hid."""
    f = fn(create)
    res = exe.call(f.fid, 0, struct.pack(f"<{1 + len(args)}Q", hid, *args), 0)
    assert res.error == 0 and res.ret == 0
    exe.learn(f.params[0].kind, hid, res.created[0])
    return f.params[0].kind


def lib_req(seq: int, name: str, slots: list[int], hostmask: int = 0, inputs: bytes = b"", out: int = 0,
            reply: bool = True) -> bytes:
    f = fn(name)
    return req(wire.NVP_OP_LIB_CALL, seq, f.fid, hostmask, out, 0 if reply else 1,
               payload=struct.pack(f"<{len(slots)}Q", *slots) + inputs, reply=reply)


def reply(sock) -> tuple[tuple, bytes]:
    sock.settimeout(2)
    head = wire.REP.unpack(sock.recv(wire.REP.size))
    n = head[0] - wire.REP.size
    return head, sock.recv(n) if n else b""


def address(a: np.ndarray) -> int:
    return a.ctypes.data_as(ctypes.c_void_p).value or 0


def test_waited_calls_are_answered_from_c(setup, exe: native.Executor) -> None:  # noqa: F811
    fast, _drv, chan, peer = setup
    made(exe, "cublasCreate_v2", 0x1001)
    for name in ("cublasGetVersion_v2", "cublasZdotc_v2"):
        exe.allow_fast(fn(name).fid, native.FAST_WAITED)
    buf = bytearray(lib_req(1, "cublasGetVersion_v2", [0x1001, 4], hostmask=2, out=8))
    assert fast.run(chan, buf, 1) == (fastpath.MORE, len(buf), 2)
    head, payload = reply(peer)
    err, status, failed, r2, r3 = head[1], head[4], head[5], head[6], head[7]
    assert (err, status, failed, r2, r3, payload) == (0, 0, 0, OUT_IN_R3, 130001, b"")
    x = np.array([1 + 2j, 3 - 1j], dtype=np.complex128)
    y = np.array([2 - 1j, 1 + 1j], dtype=np.complex128)
    buf = bytearray(lib_req(2, "cublasZdotc_v2", [0x1001, 2, address(x), 1, address(y), 1, 16], hostmask=1 << 6,
                            out=16))
    assert fast.run(chan, buf, 2) == (fastpath.MORE, len(buf), 3)
    head, payload = reply(peer)
    assert head[1] == head[4] == head[5] == head[6] == 0  # (no failure; outputs in the payload)
    assert complex(*struct.unpack("<2d", payload)) == complex(np.vdot(x, y))
    # an unknown handle is Python's to answer
    assert fast.run(chan, bytearray(lib_req(3, "cublasGetVersion_v2", [0x7777, 4], hostmask=2, out=8)), 3)[:2] == \
        (fastpath.PYTHON, 0)


def test_a_posted_failure_waits_for_its_own_library(setup, exe: native.Executor) -> None:  # noqa: F811
    fast, _drv, chan, peer = setup
    made(exe, "cublasCreate_v2", 0x1002)
    saxpy = fn("cublasSaxpy_v2")
    exe.allow_fast(saxpy.fid, native.FAST_POSTED)
    exe.allow_fast(fn("curandGetVersion").fid, native.FAST_WAITED)
    exe.allow_fast(fn("cublasGetVersion_v2").fid, native.FAST_WAITED)
    alpha = struct.pack("<f", 1.0) + bytes(4)
    buf = bytearray(lib_req(1, "cublasSaxpy_v2", [0x1002, (1 << 64) - 1, 4, 0, 1, 0, 1], hostmask=4, inputs=alpha,
                            reply=False))  # (n = -1: the stand-in fails it)
    assert fast.run(chan, buf, 1) == (fastpath.MORE, len(buf), 2)
    assert chan.lib_failed[LIBS.index("cublas")] == 7
    buf = bytearray(lib_req(2, "curandGetVersion", [4], hostmask=1, out=8))
    fast.run(chan, buf, 2)
    head, _ = reply(peer)
    assert (head[4], head[5], head[6], head[7]) == (0, 0, OUT_IN_R3, 10400)  # (cuRAND's: none)
    buf = bytearray(lib_req(3, "cublasGetVersion_v2", [0x1002, 4], hostmask=2, out=8))
    fast.run(chan, buf, 3)
    head, _ = reply(peer)
    assert (head[4], head[5], head[6] & ~OUT_IN_R3, head[7]) == (0, 7, saxpy.fid, 130001)
    assert chan.lib_failed[LIBS.index("cublas")] == 0


def test_generation_calls_that_repeat_the_record_are_made_and_counted(setup, exe: native.Executor) -> None:  # noqa: F811
    fast, _drv, chan, _peer = setup
    kind = made(exe, "curandCreateGenerator", 0x2001, 100)
    gen = fn("curandGenerate")
    exe.allow_fast(gen.fid, native.FAST_GENERATE)
    out = np.zeros(4, dtype=np.uint32)
    call = [0x2001, address(out), 4]
    buf = bytearray(lib_req(1, "curandGenerate", call, reply=False))
    assert fast.run(chan, buf, 1)[:2] == (fastpath.PYTHON, 0)  # (no record taught: Python's)
    exe.teach_generation((kind, 0x2001), gen.fid, 1, 0, struct.pack("<3Q", 0x2001, 0, 4))
    for seq in (1, 2):
        buf = bytearray(lib_req(seq, "curandGenerate", call, reply=False))
        assert fast.run(chan, buf, seq) == (fastpath.MORE, len(buf), seq + 1)
    assert out.any()
    assert exe.take_generated((kind, 0x2001)) == 2
    assert exe.take_generated((kind, 0x2001)) == 0
    other = bytearray(lib_req(3, "curandGenerate", [0x2001, address(out), 3], reply=False))
    assert fast.run(chan, other, 3)[:2] == (fastpath.PYTHON, 0)  # (another count: another record)
    exe.teach_generation((kind, 0x2001), 0, 0, 0, None)
    assert fast.run(chan, bytearray(lib_req(3, "curandGenerate", call, reply=False)), 3)[:2] == (fastpath.PYTHON, 0)
    assert exe.take_generated((kind, 0x2001)) == 0


class Backend:
    """What LibState asks of a GPU backend here."""

    name = "gpu"

    def device_sync(self, dev: int) -> None:
        pass


def test_the_generations_c_made_are_in_the_records(setup, exe: native.Executor, fakes: Path,  # noqa: F811
                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    """A checkpoint's records count the generation calls C made as the same record's (a restore makes them all
    again); a configuration of the generator between them starts a new record, which C does not add to."""
    fast, _drv, chan, _peer = setup
    monkeypatch.setenv("NVPROXY_LIB_DIR", str(fakes))
    ls = libstate.LibState(Backend())
    assert ls.run(None, 0, fn("curandCreateGenerator").fid, 0, struct.pack("<2Q", 0x3001, 100), 0, int).ret == 0
    out = np.zeros(4, dtype=np.uint32)
    gen = fn("curandGenerate")
    call = [0x3001, address(out), 4]
    assert ls.run(None, 0, gen.fid, 0, struct.pack("<3Q", *call), 0, int, fast=True).ret == 0
    for seq in (1, 2, 3):
        buf = bytearray(lib_req(seq, "curandGenerate", call, reply=False))
        assert fast.run(chan, buf, seq) == (fastpath.MORE, len(buf), seq + 1)

    def generations() -> list[tuple[str, int]]:
        return [(r[0], r[5]) for r in ls.describe()["lib_records"] if r[0] == "curandGenerate"]

    assert generations() == [("curandGenerate", 4)]
    seed = fn("curandSetPseudoRandomGeneratorSeed")
    assert ls.run(None, 0, seed.fid, 0, struct.pack("<2Q", 0x3001, 5), 0, int).ret == 0
    buf = bytearray(lib_req(4, "curandGenerate", call, reply=False))
    assert fast.run(chan, buf, 4)[:2] == (fastpath.PYTHON, 0)  # (the record to add to is not made yet)
    assert ls.run(None, 0, gen.fid, 0, struct.pack("<3Q", *call), 0, int, fast=True).ret == 0
    assert fast.run(chan, buf, 4) == (fastpath.MORE, len(buf), 5)
    assert generations() == [("curandGenerate", 4), ("curandGenerate", 2)]
