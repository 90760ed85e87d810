"""Acceptance on the GPU: unmodified public CUDA programs (NVIDIA's cuda-samples:
0_Introduction, and the graph and stream-ordered allocator ones), built with
nvcc -cudart shared, give the same verdicts and output under nvproxy as natively.

The samples are not part of nvproxy: point NVPROXY_SAMPLES_DIR at a checkout of
github.com/NVIDIA/cuda-samples (default: .samples in this repository).  Lines
with measured times or rates differ from run to run and are left out of the
comparison; everything else must be identical.
"""

from __future__ import annotations

import itertools
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import run

ROOT = Path(__file__).resolve().parents[1]
SAMPLES = Path(os.environ.get("NVPROXY_SAMPLES_DIR", ROOT / ".samples"))
NAMES = ["vectorAdd", "asyncAPI", "clock", "matrixMul", "simpleAssert", "simpleAtomicIntrinsics", "simpleCallback",
         "simpleMultiCopy", "simpleOccupancy", "simplePrintf", "simpleStreams", "simpleTemplates",
         "simpleVoteIntrinsics", "simpleZeroCopy", "template", "simpleCooperativeGroups", "simpleAWBarrier",
         "simpleMultiGPU", "simpleTexture", "simpleSurfaceWrite", "simplePitchLinearTexture", "simpleCubemapTexture",
         "simpleLayeredTexture", "simpleIPC", "3_CUDA_Features/graphConditionalNodes",
         "3_CUDA_Features/graphMemoryNodes", "3_CUDA_Features/simpleCudaGraphs", "3_CUDA_Features/jacobiCudaGraphs",
         "3_CUDA_Features/StreamPriorities", "2_Concepts_and_Techniques/streamOrderedAllocation",
         "2_Concepts_and_Techniques/streamOrderedAllocationIPC", "simpleP2P",
         "2_Concepts_and_Techniques/streamOrderedAllocationP2P"]
# sources a sample needs from Common/
EXTRA_SOURCES = {"simpleIPC": ["helper_multiprocess.cpp"], "streamOrderedAllocationIPC": ["helper_multiprocess.cpp"]}
# libraries a sample links besides the runtime (streamOrderedAllocationIPC calls cuDeviceGet, without cuInit: it
# fails there without touching the GPU, and the sample does not look at its result)
EXTRA_LIBS = {"streamOrderedAllocationIPC": ["-lcuda"]}
# lines that vary natively from run to run: measurements, and how long the CPU waited
TIMING = re.compile(r"\d+\.\d+|time|msec|GFlop|GB/s|Throughput|while waiting|lshmName", re.I)  # (+ a pid)
# samples whose lines come in no fixed order: device printf from many blocks, or several processes whose output
# goes out as each ends (streamOrderedAllocationIPC's children ended in either order natively and under nvproxy)
UNORDERED = {"simplePrintf", "simpleIPC", "streamOrderedAllocationIPC"}
# samples whose kernels of one launch print in no fixed order: graphConditionalNodes adds each conditional node
# with its upstream kernel as pDependencies but numDependencies 0 (CUDA 13's cudaGraphAddNode), so the kernel that
# sets the condition and the conditional's body are both roots and run at once, natively too: rarely, its body
# prints first.
UNORDERED_WITHIN_LAUNCH = {"graphConditionalNodes"}


def stable(text: str, name: str) -> list[str]:
    lines = [line for line in text.splitlines() if not TIMING.search(line)]
    if name in UNORDERED:
        return sorted(lines)
    if name in UNORDERED_WITHIN_LAUNCH:  # (each run of device printf lines sorted, the host's lines in place)
        out: list[str] = []
        for device, group in itertools.groupby(lines, key=lambda line: line.startswith("GPU: ")):
            part = list(group)
            out += sorted(part) if device else part
        return out
    return lines


def build_sample(nvcc: str, tmp_path: Path, name: str) -> Path:
    """NVIDIA's sample `[group/]name`, built -cudart shared in tmp_path (its data beside it); skips where the
    samples are not found."""
    group, _, name = name.rpartition("/")  # (0_Introduction unless named)
    src = SAMPLES / "Samples" / (group or "0_Introduction") / name
    if not src.is_dir():
        pytest.skip(f"cuda-samples not found at {SAMPLES} (set NVPROXY_SAMPLES_DIR)")
    exe = tmp_path / name
    files = [str(p) for p in sorted(src.glob("*.cu")) + sorted(src.glob("*.cpp"))]
    files += [str(SAMPLES / "Common" / f) for f in EXTRA_SOURCES.get(name, [])]
    subprocess.run([nvcc, "-cudart", "shared", "-std=c++17", f"-I{SAMPLES / 'Common'}", f"-I{src}", "-o", str(exe),
                    *files, *EXTRA_LIBS.get(name, [])], check=True)
    if (src / "data").is_dir():  # (input images and reference results, found relative to the working directory)
        shutil.copytree(src / "data", tmp_path / "data")
    return exe


def native_run(exe: Path, cwd: Path) -> subprocess.CompletedProcess:
    """The sample run natively: the reference.  A native run that fails is run once more: simpleAssert's native
    run beside the whole GPU suite once found no cudaErrorAssert after its device assert (conftest.MISREPORT)."""
    native = run([str(exe)], cwd=cwd)
    if native.returncode != 0:
        print(f"{exe.name} failed natively (status {native.returncode}): once more", file=sys.stderr)
        native = run([str(exe)], cwd=cwd)
    return native


@pytest.mark.gpu
@pytest.mark.parametrize("name", NAMES)
def test_sample_matches_native(nvcc: str, tmp_path: Path, name: str) -> None:
    exe = build_sample(nvcc, tmp_path, name)
    name = exe.name
    native = native_run(exe, tmp_path)
    proxied = run([sys.executable, "-m", "nvproxy", "run", "--backend", "gpu", "--", str(exe)], cwd=tmp_path)
    assert proxied.returncode == native.returncode, proxied.stdout + proxied.stderr
    assert stable(proxied.stdout, name) == stable(native.stdout, name), proxied.stderr
