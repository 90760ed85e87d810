#!/usr/bin/env python3
"""Record what the real libcuda.so.1 says about itself, for the shim's driver API (run on a GPU machine).

    python native/tools/probe_libcuda.py [-o native/shim/libcuda_api.json]

Writes: the functions it exports, its error names and strings (cuGetErrorName/String), and which exported
function cuGetProcAddress hands out for every base name, CUDA version and stream flag (legacy or per-thread).
native/tools/gen_driver.py builds the shim's weak stubs, its cuGetProcAddress table and its error tables from
that file, so that a program asking the shim gets the same answers it would get from the driver.
"""

from __future__ import annotations

import argparse
import ctypes
import json
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

OUT = Path(__file__).resolve().parents[1] / "shim" / "libcuda_api.json"
SUFFIX = re.compile(r"(_v\d+|_ptds|_ptsz)+$")
# versions a program may ask for: every release that introduced a new ABI of some function lies among them
VERSIONS = [1000, 2000, 2010, 2020, 2030, 2050, 3000, 3010, 3020, 3030, 3050, 4000, 4010, 4020, 5000, 5050, 6000,
            6050, 6500, 7000, 7050, 8000, 9000, 9010, 9020, 10000, 10010, 10020, 11000, 11010, 11020, 11030, 11040,
            11050, 11060, 11070, 11080, 12000, 12010, 12020, 12030, 12040, 12050, 12060, 12080, 12090, 13000]
LEGACY, PER_THREAD = 0, 2  # CU_GET_PROC_ADDRESS_LEGACY_STREAM is the same as DEFAULT for a program built without
FOUND = 0  # CU_GET_PROC_ADDRESS_SUCCESS


def libcuda() -> str:
    out = subprocess.run(["ldconfig", "-p"], capture_output=True, text=True, check=True).stdout
    for line in out.splitlines():
        if "libcuda.so.1" in line:
            return line.split()[-1]
    raise SystemExit("libcuda.so.1 is not installed here")


def exports(lib: str) -> list[str]:
    nm = subprocess.run(["nm", "-D", "--defined-only", lib], capture_output=True, text=True, check=True).stdout
    return sorted({ln.split()[2].split("@")[0] for ln in nm.splitlines() if len(ln.split()) == 3
                   and ln.split()[1] in "Tt"})


def errors(L: Any) -> list[list[Any]]:
    out = []
    s = ctypes.c_char_p()
    for code in range(1200):
        if L.cuGetErrorName(code, ctypes.byref(s)) == 0:
            name = s.value.decode()
            L.cuGetErrorString(code, ctypes.byref(s))
            out.append([code, name, s.value.decode()])
    return out


def procs(L: Any, names: list[str]) -> dict[str, dict[str, list[list[Any]]]]:
    """base name -> {"legacy": [[first version, exported name], ...], "ptds": [...] where it differs}."""
    by_addr = {ctypes.cast(getattr(L, n), ctypes.c_void_p).value: n for n in names}
    gpa = L.cuGetProcAddress_v2
    gpa.argtypes = [ctypes.c_char_p, ctypes.POINTER(ctypes.c_void_p), ctypes.c_int, ctypes.c_uint64,
                    ctypes.POINTER(ctypes.c_int)]
    table: dict[str, dict[str, list[list[Any]]]] = {}
    for base in sorted({SUFFIX.sub("", n) for n in names if n.startswith("cu")}):
        rows = {}
        for key, flags in (("legacy", LEGACY), ("ptds", PER_THREAD)):
            seq: list[list[Any]] = []
            for ver in VERSIONS:
                fp, status = ctypes.c_void_p(), ctypes.c_int(-1)
                if gpa(base.encode(), ctypes.byref(fp), ver, flags, ctypes.byref(status)) != 0:
                    raise SystemExit(f"cuGetProcAddress({base}, {ver}) failed")
                name = by_addr[fp.value] if status.value == FOUND else None
                if (seq[-1][1] if seq else None) != name:
                    seq.append([ver, name])
            rows[key] = seq
        if rows["legacy"] or rows["ptds"]:
            table[base] = {k: v for k, v in rows.items() if k == "legacy" or v != rows["legacy"]}
    return table


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("-o", "--out", type=Path, default=OUT)
    args = ap.parse_args()
    lib = str(Path(libcuda()).resolve())
    L = ctypes.CDLL(lib)
    if L.cuInit(0) != 0:
        raise SystemExit("cuInit failed")
    v = ctypes.c_int()
    L.cuDriverGetVersion(ctypes.byref(v))
    names = exports(lib)
    doc = {"source": Path(lib).name, "driver_version": v.value, "exports": names, "errors": errors(L),
           "procs": procs(L, names)}
    args.out.write_text(json.dumps(doc, indent=1) + "\n")
    print(f"{lib}: {len(names)} exports, {len(doc['procs'])} base names, {len(doc['errors'])} error codes")
    return 0


if __name__ == "__main__":
    sys.exit(main())
