"""The host image buffer and the image checksum, without a device."""

from __future__ import annotations

import os
import stat
from pathlib import Path

from nvproxy.checkpoint import hostimage
from nvproxy.checkpoint.checksum import checksum, checksum_at
from nvproxy.checkpoint.hostimage import HostImage


class Registrar:
    """Stands in for a backend: records what is registered as pinned memory."""

    def __init__(self) -> None:
        self.ranges: dict[int, int] = {}

    def activate(self, dev: int) -> None:
        pass

    def host_register(self, addr: int, size: int) -> None:
        assert all(addr >= a + n or addr + size <= a for a, n in self.ranges.items()), "overlapping registration"
        self.ranges[addr] = size

    def host_unregister(self, addr: int, size: int) -> None:
        assert self.ranges.pop(addr) == size


def test_checksum_is_xxh64() -> None:
    """Published XXH64 values (seed 0), so images can be checked by other tools."""
    assert checksum(b"") == 0xEF46DB3751D8E999
    assert checksum(b"abc") == 0x44BC2CF5AD770999
    assert checksum(b"Nobody inspects the spammish repetition") == 0xFBCEA83C8A378BF1
    data = bytearray(os.urandom(1000))
    assert checksum(memoryview(data)[100:900]) == checksum(bytes(data[100:900]))


def test_pieces_stay_inside_one_registration(tmp_path: Path) -> None:
    reg = Registrar()
    himg = HostImage(reg, 0)
    try:
        himg.grow(100 << 20)  # pages made and registered while the application runs
        assert himg.capacity == 128 << 20 and len(reg.ranges) == 2
        himg.grow(200 << 20)  # 64 + 64 + 128 MiB segments, each registered on its own
        assert himg.capacity == 256 << 20 and len(reg.ranges) == 3
        for off, n in [(0, 64 << 20), ((64 << 20) - 4096, 8192), (1000, 250 << 20)]:
            covered = 0
            for addr, k in himg.pieces(off, n):
                assert any(a <= addr and addr + k <= a + size for a, size in reg.ranges.items())
                assert addr == himg.base + off + covered
                covered += k
            assert covered == n
        # one run of addresses: an image can be summed and written in one go
        himg.view((64 << 20) - 3, 6)[:] = b"abcdef"
        assert checksum_at(himg.base + (64 << 20) - 3, 6) == checksum(b"abcdef")
        out = tmp_path / "x.img"
        himg.write_file(out, (64 << 20) + 3)
        assert out.stat().st_size == (64 << 20) + 3 and stat.S_IMODE(out.stat().st_mode) == 0o600
        with open(out, "rb") as f:
            f.seek((64 << 20) - 3)
            assert f.read() == b"abcdef"
        assert not [p for p in tmp_path.iterdir() if p.name.endswith(".tmp")]
        # handed over: another buffer over the same memfd sees the same bytes
        other_reg = Registrar()
        other = HostImage(other_reg, 0, fd=os.dup(himg.fd))
        try:
            assert other.capacity == himg.capacity
            assert bytes(other.view((64 << 20) - 3, 6)) == b"abcdef"
            # the buffer grew before the hand-over: the new proxy maps and registers what is new
            himg.grow(300 << 20)
            himg.view(300 << 20, 3)[:] = b"xyz"
            assert other.follow(os.dup(himg.fd))
            assert other.capacity == himg.capacity == 512 << 20 and len(other_reg.ranges) == 4
            assert bytes(other.view(300 << 20, 3)) == b"xyz"
            stranger = os.memfd_create("x")
            assert not other.follow(stranger)  # another file: the caller makes a new buffer
            os.close(stranger)
        finally:
            other.close()
        assert not other_reg.ranges
    finally:
        himg.close()
    assert not reg.ranges


def test_segment_plan() -> None:
    assert hostimage.segment_starts(1) == [0]
    assert hostimage.rounded(1) == 64 << 20
    assert hostimage.rounded(3 << 30) == 3 << 30
    starts = hostimage.segment_starts(5 << 30)
    assert starts[:6] == [0, 64 << 20, 128 << 20, 256 << 20, 512 << 20, 1 << 30]
    assert all(b - a <= 1 << 30 for a, b in zip(starts, starts[1:], strict=False))
