"""Kernel parameter layouts read from nvcc 13 fatbinaries without a GPU, plain
and zstd-compressed."""

from __future__ import annotations

import struct

import pytest

from nvproxy import fatbin


def fatbin_section(exe: bytes) -> bytes:
    for name, _t, off, size, *_ in fatbin._sections(exe):
        if name == ".nv_fatbin":
            return exe[off : off + size]
    raise LookupError(".nv_fatbin")


def modules(exe: bytes) -> fatbin.Module:
    data, off, merged = fatbin_section(exe), 0, fatbin.Module()
    while off + 16 <= len(data):
        magic, _v, hsize, fsize = struct.unpack_from("<IHHQ", data, off)
        if magic != fatbin.FATBIN_MAGIC:
            off += 8
            continue
        m = fatbin.parse(data[off : off + hsize + fsize])
        merged.kernels.update(m.kernels)
        merged.variables.update(m.variables)
        off += hsize + fsize
    return merged


@pytest.mark.parametrize("flags", [(), ("-Xfatbin=-compress-all",)], ids=["default", "compressed"])
def test_param_layouts(build, flags: tuple[str, ...]) -> None:
    mod = modules(build("bigparam", *flags).read_bytes())
    big = mod.kernels["_Z10big_kernel3BigPic5Smalld"]
    assert big.params == [(0, 32000), (32000, 8), (32008, 1), (32016, 16), (32032, 8)]
    assert big.param_size == 32040
    assert mod.kernels["_Z10max_kernelPi3Max"].param_size == 32764


def test_module_variables(build) -> None:
    mod = modules(build("symbols").read_bytes())
    assert mod.variables["coeff"].size == 32
    assert mod.variables["table"].size == 8000
    assert mod.kernels["_Z5applyPfi"].params == [(0, 8), (8, 4)]


def test_compressed_entries_are_compressed(build) -> None:
    data = fatbin_section(build("vector_add", "-Xfatbin=-compress-all").read_bytes())
    ents = fatbin.entries(data[: 16 + struct.unpack_from("<Q", data, 8)[0]])
    assert ents and all(e.flags & fatbin.FLAG_ZSTD for e in ents)


@pytest.mark.parametrize("flags", [(), ("-Xfatbin=-compress-all",)], ids=["default", "compressed"])
def test_which_modules_may_print(build, flags: tuple[str, ...]) -> None:
    """A module whose kernel calls printf may print, read from its cubin or from its compressed entries; one that
    does not, may not; one that cannot be read may."""
    def image(name: str) -> bytes:
        return fatbin_section(build(name, *flags).read_bytes())

    assert fatbin.may_print(image("printf_assert"))
    assert not fatbin.may_print(image("vector_add"))
    damaged = bytearray(image("vector_add"))
    struct.pack_into("<Q", damaged, 8, 1 << 40)  # (a container larger than the image)
    assert fatbin.may_print(bytes(damaged))


def test_a_process_reads_modules_for_printf_within_a_budget(build, monkeypatch) -> None:
    """The proxy reads each module it loads for printf until one may print, or until it has read its budget of
    image bytes: a program with many large modules is then taken to print, rather than pay to read each."""
    from types import SimpleNamespace

    from nvproxy.proxy import state as st

    silent = fatbin_section(build("vector_add").read_bytes())
    monkeypatch.setattr(st, "PRINT_SCAN_BUDGET", 3 * len(silent))
    ps = st.ProcessState(SimpleNamespace())
    assert [ps._may_print(silent) for _ in range(4)] == [False, False, False, True]


def test_ptx_params() -> None:
    ptx = """.visible .entry _Z1kPfi(
        .param .u64 .ptr .align 1 _Z1kPfi_param_0,
        .param .u32 _Z1kPfi_param_1,
        .param .align 8 .b8 _Z1kPfi_param_2[24]
    )"""
    k = fatbin.parse_ptx(ptx).kernels["_Z1kPfi"]
    assert k.params == [(0, 8), (8, 4), (16, 24)]


def test_not_a_fatbin() -> None:
    with pytest.raises(fatbin.FatbinError):
        fatbin.entries(b"\0" * 64)


def test_linked_bundle_parts_and_malformed_bundles() -> None:
    """The shim's bundle of a device-linked module: parts come back as sent; a
    damaged bundle is an error, never a read past its end."""
    parts = [b"A" * 5, b"", b"BC"]
    bundle = fatbin.LINKED_MAGIC + struct.pack("<I3Q", 3, 5, 0, 2) + b"".join(parts)
    assert fatbin.linked_parts(bundle) == parts
    assert fatbin.linked_parts(b"\x50\xed\x55\xba plain") is None
    for bad in (bundle[:-1], fatbin.LINKED_MAGIC + struct.pack("<I", 0),
                fatbin.LINKED_MAGIC + struct.pack("<IQ", 2, 1), fatbin.LINKED_MAGIC[:8] + b"\x01"):
        with pytest.raises(fatbin.FatbinError):
            fatbin.linked_parts(bad)
