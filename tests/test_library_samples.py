"""NVIDIA's library samples (cuda-samples Samples/4_CUDA_Libraries, at NVPROXY_SAMPLES_DIR) on the GPU, built with
nvcc -cudart shared: natively and under nvproxy, and under nvproxy migrated or checkpointed under DMTCP at a call,
they give native's verdicts and output, the lines with measured times left out (test_public_samples.stable).  Those
that need a GUI, NPP, nvJPEG, several GPUs or data files the samples lack are not here; those that read
lap2D_5pt_n100.mtx, which the samples lack, read lap2D_5pt_n32.mtx of cuSolverSp_LowlevelQR."""

from __future__ import annotations

import shutil
import subprocess
import sys
from dataclasses import dataclass
from functools import cache
from pathlib import Path

import pytest
from conftest import run
from test_dmtcp import Session, calls_made
from test_libraries import migrating_at
from test_public_samples import SAMPLES, stable

CG = ("-lcublas", "-lcusparse")
SOLVERS = ("-lcusolver", "-lcusparse", "-lcublas")
LAP2D = "cuSolverSp_LowlevelQR/lap2D_5pt_n32.mtx"  # (those that default to lap2D_5pt_n100.mtx, not in the samples)


@dataclass(frozen=True)
class LibrarySample:
    name: str  # in Samples/4_CUDA_Libraries
    libs: tuple[str, ...]
    args: tuple[str, ...] = ()
    data: tuple[str, ...] = ()  # files of other samples it reads, copied beside it
    flags: tuple[str, ...] = ()
    # may fail loudly under nvproxy instead of giving native's output: cuFFT callbacks (static cuFFT linked with the
    # program's callback), cuBLAS-XT, cuSOLVER's host-side low-level and refactorisation interfaces
    loud: bool = False

    @property
    def id(self) -> str:
        return "-".join((self.name, *(a.lstrip("-").split("=")[-1] for a in self.args)))


LIBRARY_SAMPLES = [
    LibrarySample("simpleCUBLAS", ("-lcublas",)),
    LibrarySample("simpleCUBLAS_LU", ("-lcublas",)),
    LibrarySample("batchCUBLAS", ("-lcublas",)),
    LibrarySample("matrixMulCUBLAS", ("-lcublas",)),
    LibrarySample("simpleCUFFT", ("-lcufft",)),
    LibrarySample("MersenneTwisterGP11213", ("-lcurand",)),
    LibrarySample("conjugateGradient", CG),
    LibrarySample("conjugateGradientPrecond", CG),
    LibrarySample("conjugateGradientUM", CG),
    LibrarySample("conjugateGradientCudaGraphs", CG),
    LibrarySample("cuSolverDn_LinearSolver", SOLVERS),
    LibrarySample("cuSolverDn_LinearSolver", SOLVERS, ("-R=lu",)),
    LibrarySample("cuSolverDn_LinearSolver", SOLVERS, ("-R=qr",)),
    LibrarySample("cuSolverSp_LinearSolver", SOLVERS, ("-file=lap2D_5pt_n32.mtx", "-R=qr"), (LAP2D,)),
    # cuSolverSp's low-level *Host functions and cuSolverRf's host set-up are not forwarded: they fail loudly
    LibrarySample("cuSolverSp_LowlevelCholesky", SOLVERS, ("-file=lap2D_5pt_n32.mtx",), (LAP2D,), loud=True),
    LibrarySample("cuSolverSp_LowlevelQR", SOLVERS, loud=True),
    LibrarySample("cuSolverRf", SOLVERS, ("-file=lap2D_5pt_n32.mtx",), (LAP2D,), loud=True),
    LibrarySample("simpleCUFFT_callback", ("-lcufft_static", "-lculibos"), flags=("-rdc=true",), loud=True),
    LibrarySample("simpleCUBLASXT", ("-lcublas",), loud=True),
]
SAMPLE_IDS = [s.id for s in LIBRARY_SAMPLES]
# checkpointed: each sample once (its first variant), those that may fail loudly not (conjugateGradientCudaGraphs's
# middle call falls inside its global-mode stream capture)
CHECKPOINTED = list({s.name: s for s in reversed(LIBRARY_SAMPLES) if not s.loud}.values())[::-1]


@pytest.fixture(scope="session")
def sample_build(nvcc: str, tmp_path_factory: pytest.TempPathFactory):
    """A library sample built -cudart shared (with the C sources of its directory and its libraries) in a directory
    of its own, with the data files it reads: (executable, directory).  Skips where the samples are not found."""
    built: dict[str, tuple[Path, Path]] = {}

    def _build(sample: LibrarySample) -> tuple[Path, Path]:
        src = SAMPLES / "Samples" / "4_CUDA_Libraries" / sample.name
        if not src.is_dir():
            pytest.skip(f"cuda-samples not found at {SAMPLES} (set NVPROXY_SAMPLES_DIR)")
        if sample.name not in built:
            out = tmp_path_factory.mktemp(sample.name)
            files = [str(p) for ext in ("cu", "cpp", "c") for p in sorted(src.glob(f"*.{ext}"))]
            exe = out / sample.name
            r = subprocess.run([nvcc, "-cudart", "shared", "-std=c++17", *sample.flags, f"-I{SAMPLES / 'Common'}",
                                f"-I{src}", "-o", str(exe), *files, *sample.libs], capture_output=True, text=True)
            assert r.returncode == 0, f"building {sample.name}:\n{r.stdout}{r.stderr}"
            for f in [*src.glob("*.mtx"), *(src.parent / d for d in sample.data)]:
                shutil.copy(f, out)
            built[sample.name] = exe, out
        return built[sample.name]

    return _build


def sample_cmd(exe: Path, *args: str) -> list[str]:
    return [sys.executable, "-m", "nvproxy", "run", "--backend", "gpu", "--", str(exe), *args]


@cache
def native_sample(exe: Path, cwd: Path, args: tuple[str, ...]) -> subprocess.CompletedProcess:
    """The sample run natively (once per arguments): the reference; it must pass."""
    r = run([str(exe), *args], cwd=cwd)
    assert r.returncode == 0, f"{exe.name} {' '.join(args)} failed natively:\n{r.stdout}{r.stderr}"
    return r


@pytest.mark.gpu
@pytest.mark.parametrize("sample", LIBRARY_SAMPLES, ids=SAMPLE_IDS)
def test_gpu_sample_matches_native(sample_build, sample: LibrarySample) -> None:
    """Native's output and exit status; for cuFFT callbacks and cuBLAS-XT, that or a loud failure: an error status
    and a line of nvproxy's on stderr (never a run that ends well with other output)."""
    exe, cwd = sample_build(sample)
    want = native_sample(exe, cwd, sample.args)
    proxied = run(sample_cmd(exe, *sample.args), cwd=cwd)
    same = proxied.returncode == 0 and stable(proxied.stdout, exe.name) == stable(want.stdout, exe.name)
    if sample.loud and not same:
        assert proxied.returncode != 0 and "nvproxy" in proxied.stderr, proxied.stdout + proxied.stderr
        return
    assert proxied.returncode == want.returncode, proxied.stdout + proxied.stderr[-4000:]
    assert stable(proxied.stdout, exe.name) == stable(want.stdout, exe.name), proxied.stderr[-4000:]


@pytest.mark.gpu
@pytest.mark.parametrize("sample", CHECKPOINTED, ids=[s.id for s in CHECKPOINTED])
def test_gpu_sample_migrated_at_a_call(sample_build, sample: LibrarySample, tmp_path: Path) -> None:
    """Migrated at the middle one of its CUDA calls, the sample prints native's output."""
    exe, cwd = sample_build(sample)
    want = native_sample(exe, cwd, sample.args)
    cmd = sample_cmd(exe, *sample.args)
    (calls,), _out = calls_made(cmd, tmp_path, cwd=cwd)
    r = run(cmd, cwd=cwd, env=migrating_at(calls // 2))
    where = f"migrated at call {calls // 2} of {calls}"
    assert r.returncode == want.returncode and "migrated process" in r.stderr, f"{where}: {r.stderr[-4000:]}"
    assert stable(r.stdout, exe.name) == stable(want.stdout, exe.name), f"{where}: {r.stderr[-4000:]}"


@pytest.mark.gpu
@pytest.mark.parametrize("sample", CHECKPOINTED, ids=[s.id for s in CHECKPOINTED])
def test_gpu_sample_dmtcp_restart_at_a_call(sample_build, sample: LibrarySample, tmp_path: Path) -> None:
    """Checkpointed under DMTCP at the middle one of its CUDA calls, killed and restarted, the sample prints native's
    output."""
    session_dir = tmp_path / "dmtcp"
    exe, cwd = sample_build(sample)
    session = Session(session_dir, cwd=cwd)
    want = native_sample(exe, cwd, sample.args)
    cmd = sample_cmd(exe, *sample.args)
    (calls,), _out = calls_made(cmd, tmp_path, cwd=cwd)
    session.checkpoint_at_call(cmd, max(2, calls // 2))
    r = session.restart()
    assert r.returncode == want.returncode, r.stdout + r.stderr[-4000:]
    whole = session.out.read_text() + r.stdout
    assert stable(whole, exe.name) == stable(want.stdout, exe.name), r.stderr[-4000:]
    assert "restoring the GPU state" in r.stderr
