"""NVIDIA's math libraries (cuBLAS, cuBLASLt, cuFFT, cuRAND, cuSPARSE, cuSOLVER) and cuDNN under nvproxy.

With -m gpu: the programs tests/apps/lib_*.cu (each uses one library as HPC codes do, in numbered steps whose lines
end in checksums of the results) run natively and through nvproxy; through nvproxy again while they are migrated at
chosen calls and mid-run, recovered from an image after their proxy was killed, and checkpointed under DMTCP mid-run
and at a call, then restarted.  Every run must print exactly what the native run prints.

NVIDIA's library samples: test_library_samples.py.

On sim (CI, where the libraries are not installed): a program that reaches the libraries through dlopen/dlsym, and
the test programs linked against stand-ins of the libraries that abort when called, find every entry point in the
shim; each call runs there or fails cleanly, with the library's own status for "not supported" and one stderr line
naming the call.  Where the shim does not export a library's functions yet, those tests are skipped, saying so.
"""

from __future__ import annotations

import os
import re
import subprocess
from functools import cache
from pathlib import Path

import pytest
from conftest import APPS, gpu_count, hooked, nvproxy_cmd, run
from test_checkpoint import migrate_mid_run, nvproxy
from test_dmtcp import Session, calls_made

ROOT = Path(__file__).resolve().parents[1]

# the programs and the libraries each links
PROGRAMS = {"lib_cublas": ("-lcublas",), "lib_cublaslt": ("-lcublasLt", "-lcublas"), "lib_cufft": ("-lcufft",),
            "lib_curand": ("-lcurand",), "lib_cusparse": ("-lcusparse",), "lib_cusolver": ("-lcusolver",),
            "lib_cudnn": ("-lcudnn",)}
# each library's soname, its status for "not supported" (cuRAND has none: any failure status) and the prefix of its
# functions (cublasLt before cublas: the longest prefix names the library)
LIBRARIES = {"cublasLt": ("libcublasLt.so.13", 15), "cublas": ("libcublas.so.13", 15), "cufft": ("libcufft.so.12", 16),
             "curand": ("libcurand.so.10", None), "cusparse": ("libcusparse.so.12", 10),
             "cusolver": ("libcusolver.so.12", 9), "cudnn": ("libcudnn.so.9", 3000)}
MID_STEPS = "40"  # (a run of 40 steps, 150 ms apart, goes on for 3 s and more after its step 3: migrate_mid_run)
PAUSE_MS = "150"


def library_of(symbol: str) -> str | None:
    return max((lib for lib in LIBRARIES if symbol.startswith(lib)), key=len, default=None)


def migrating_at(call: int) -> dict[str, str]:
    """The environment of a run that `nvproxy migrate` moves to a new proxy at its call-th CUDA call (the shim's test
    hook NVPROXY_MIGRATE_AT); the DMTCP tests' hooks are test_dmtcp's (Session.checkpoint_at_call, calls_made)."""
    return hooked(NVPROXY_MIGRATE_AT=str(call))


def cudnn_dirs() -> tuple[Path, Path | None] | None:
    """(include, lib) of cuDNN 9: NVPROXY_CUDNN_DIR, or the nvidia-cudnn wheel of this Python (PyTorch's), or the
    toolkit's directories; (.cuda-libs/include, None): its headers alone, copied here; None: not found."""
    import importlib.util

    roots = [Path(d) for d in [os.environ.get("NVPROXY_CUDNN_DIR")] if d]
    try:
        spec = importlib.util.find_spec("nvidia.cudnn")
        roots += [Path(d) for d in (spec.submodule_search_locations or [])] if spec else []
    except (ImportError, ValueError):
        pass
    toolkit = Path(os.environ.get("CUDA_HOME") or "/usr/local/cuda")
    roots += [toolkit, toolkit / "targets" / "x86_64-linux"]
    for r in roots:
        lib = next((d for d in (r / "lib", r / "lib64") if (d / "libcudnn.so.9").exists()), None)
        if (r / "include" / "cudnn.h").exists() and lib is not None:
            return r / "include", lib
    local = ROOT / ".cuda-libs" / "include"
    return (local, None) if (local / "cudnn.h").exists() else None


def cudnn_flags(need_library: bool) -> list[str]:
    """nvcc's flags for cuDNN's headers (and library, with an RPATH to it); skips, saying why, where it is not
    found."""
    found = cudnn_dirs()
    if found is None or (need_library and found[1] is None):
        pytest.skip("cuDNN 9 is not found (NVPROXY_CUDNN_DIR, `python3 -c 'import nvidia.cudnn'`, $CUDA_HOME)")
    include, lib = found
    return [f"-I{include}"] + ([f"-L{lib}", "-Xlinker", f"-rpath={lib}"] if need_library and lib else [])


@pytest.fixture(scope="session")
def lib_build(build):
    """A library program built -cudart shared and linked against its library (the toolkit's headers; cuDNN's where
    cudnn_dirs finds it)."""
    return lambda name: build(name, *(cudnn_flags(True) if name == "lib_cudnn" else []), *PROGRAMS.get(name, ()))


@cache
def native(exe: Path, *args: str) -> str:
    """What the program prints natively (one run per build and arguments); it must pass."""
    r = run([str(exe), *args])
    assert r.returncode == 0, f"{exe.name} {' '.join(args)} failed natively:\n{r.stdout}{r.stderr}"
    assert r.stdout.endswith("Test PASSED\n") or exe.name.startswith("lib_dlopen"), r.stdout
    return r.stdout


# ---------------------------------------------------------------------------------------------------------------
# GPU: the library programs


@pytest.mark.gpu
@pytest.mark.parametrize("name", [*PROGRAMS, "lib_dlopen"])
def test_gpu_program_matches_native(lib_build, name: str) -> None:
    exe = lib_build(name)
    want = native(exe)
    if name == "lib_dlopen":  # (natively every library was found and every call succeeded)
        assert re.findall(r"status (\d+)", want) and set(re.findall(r"status (\d+)", want)) == {"0"}, want
    proxied = run(nvproxy_cmd(exe, "gpu", name))
    assert proxied.stdout == want, proxied.stderr[-4000:]
    assert proxied.returncode == 0, proxied.stderr[-4000:]


@pytest.mark.gpu
@pytest.mark.parametrize("name", PROGRAMS)
def test_gpu_program_migrated_at_calls(lib_build, name: str, tmp_path: Path) -> None:
    """Migrated (NVPROXY_MIGRATE_AT) at a quarter, half and three quarters of its CUDA calls: the new proxy makes the
    library's handles, plans, descriptors and generators again and the program goes on to native's output."""
    exe = lib_build(name)
    want = native(exe)
    cmd = nvproxy_cmd(exe, "gpu", name)
    (calls,), out = calls_made(cmd, tmp_path)
    assert out == want
    for call in sorted({calls // 4, calls // 2, 3 * calls // 4}):
        r = run(cmd, env=migrating_at(call))
        where = f"migrated at call {call} of {calls}"
        assert r.returncode == 0 and "migrated process" in r.stderr, f"{where}: {r.stdout[-2000:]}{r.stderr[-4000:]}"
        assert r.stdout == want, f"{where}: {r.stderr[-4000:]}"


@pytest.mark.gpu
@pytest.mark.parametrize("name", PROGRAMS)
def test_gpu_program_migrated_mid_run(lib_build, name: str) -> None:
    """nvproxy migrate while the program runs (after its step 3, wherever it is then)."""
    migrate_mid_run(lib_build, "gpu", name, (MID_STEPS, PAUSE_MS), "step 3:", (MID_STEPS,))


@pytest.mark.gpu
@pytest.mark.parametrize("name", PROGRAMS)
def test_gpu_program_migrated_to_another_gpu(lib_build, name: str) -> None:
    """nvproxy migrate --device 1 after step 2: the library's state is made again on the other GPU (of the same
    model: the same results) and the program goes on to native's output."""
    if gpu_count() < 2:
        pytest.skip("needs two GPUs (nvidia-smi -L lists fewer)")
    exe = lib_build(name)
    want = native(exe, MID_STEPS)
    app = subprocess.Popen(nvproxy_cmd(exe, "gpu", name, MID_STEPS, PAUSE_MS), stdout=subprocess.PIPE,
                           stderr=subprocess.PIPE, text=True)
    assert app.stdout is not None
    try:
        lines = [app.stdout.readline() for _ in range(3)]
        r = nvproxy("migrate", str(app.pid), "--device", "1")
        assert r.returncode == 0, r.stdout + r.stderr
        out, err = app.communicate(timeout=300)
    finally:
        if app.poll() is None:
            app.kill()
    assert "".join(lines) + out == want and app.returncode == 0, err[-4000:]


@pytest.mark.gpu
@pytest.mark.parametrize("name", PROGRAMS)
def test_gpu_program_recovered_after_its_proxy_died(lib_build, name: str, tmp_path: Path) -> None:
    """NVPROXY_RECOVER: checkpointed while it pauses after step 1, its proxy killed, the program's next call starts
    a new proxy from the image and it finishes as native."""
    from nvproxy.launcher import find_proxy

    exe = lib_build(name)
    want = native(exe, "5")
    image = tmp_path / "last.img"
    env = dict(os.environ, NVPROXY_RECOVER=str(image))
    env.pop("LD_PRELOAD", None)
    app = subprocess.Popen(nvproxy_cmd(exe, "gpu", name, "5", "2000"), stdout=subprocess.PIPE,
                           stderr=subprocess.PIPE, text=True, env=env)
    assert app.stdout is not None
    try:
        lines: list[str] = []  # (up to its step 1, after which it pauses 2 s; some print a header first)
        while len(lines) < 20 and not (lines and lines[-1].startswith("step 1:")):
            if not (line := app.stdout.readline()):
                break
            lines.append(line)
        assert lines and lines[-1].startswith("step 1:"), "".join(lines)
        c = nvproxy("checkpoint", str(app.pid), "-o", str(image))
        assert c.returncode == 0, c.stdout + c.stderr
        os.kill(find_proxy(app.pid)[0], 9)
        out, err = app.communicate(timeout=300)
    finally:
        if app.poll() is None:
            app.kill()
    assert "starting a new one from" in err, err[-4000:]
    assert "".join(lines) + out == want, err[-4000:]
    assert app.returncode == 0, err[-4000:]


@pytest.mark.gpu
@pytest.mark.parametrize("name", PROGRAMS)
def test_gpu_program_dmtcp_restart_mid_run(lib_build, name: str, tmp_path: Path) -> None:
    """Under DMTCP: checkpointed (nvproxy checkpoint --dmtcp) after step 3, killed and restarted; the restarted
    program prints the rest of native's output."""
    session = Session(tmp_path)
    exe = lib_build(name)
    want = native(exe, "16").splitlines(keepends=True)
    app = session.launch(nvproxy_cmd(exe, "gpu", name, "16", "300"))
    session.wait_for(app, "step 3:")
    session.checkpoint_and_kill(app)
    r = session.restart()
    after = r.stdout.splitlines(keepends=True)
    assert after and after[0] in want, r.stderr[-4000:]
    assert after == want[want.index(after[0]) :] and r.returncode == 0, r.stderr[-4000:]
    assert "restoring the GPU state" in r.stderr


@pytest.mark.gpu
@pytest.mark.parametrize("name", PROGRAMS)
def test_gpu_program_dmtcp_restart_at_a_call(lib_build, name: str, tmp_path: Path) -> None:
    """Under DMTCP: checkpointed at the middle one of its CUDA calls (NVPROXY_CHECKPOINT_AT), killed and restarted:
    what it printed before and after is native's output, line for line."""
    session = Session(tmp_path / "dmtcp")
    exe = lib_build(name)
    want = native(exe)
    cmd = nvproxy_cmd(exe, "gpu", name)
    (calls,), _out = calls_made(cmd, tmp_path)
    session.checkpoint_at_call(cmd, calls // 2)
    r = session.restart()
    assert r.returncode == 0, r.stderr[-4000:]
    where = f"checkpointed at call {calls // 2} of {calls}"
    assert session.out.read_text() + r.stdout == want, f"{where}: {r.stderr[-4000:]}"
    assert "restoring the GPU state" in r.stderr


# ---------------------------------------------------------------------------------------------------------------
# sim: every entry point is the shim's, and each call runs or fails cleanly


def shim_exports() -> set[str]:
    from nvproxy import shim_path

    out = subprocess.run(["nm", "-D", "--defined-only", str(shim_path())], capture_output=True, text=True,
                         check=True).stdout
    return {line.split()[-1].split("@")[0] for line in out.splitlines() if line.strip()}


def not_yet_in_the_shim(symbols: set[str]) -> None:
    """Skip, naming them, where the shim exports none of these functions: the library layer has not landed."""
    if symbols and not symbols & shim_exports():
        pytest.skip(f"the shim exports none of {', '.join(sorted(symbols)[:4])}... yet (nm -D libnvproxy.so)")


def check_clean_failures(r: subprocess.CompletedProcess, failed: dict[str, int]) -> None:
    """Each call that failed (its name: its status) gave its library's status for "not supported" (cuRAND: any
    failure status) and one stderr line that names it."""
    for call, status in failed.items():
        want = LIBRARIES[library_of(call) or ""][1]
        assert status == want or (want is None and status != 0), f"{call} -> status {status}:\n{r.stderr[-3000:]}"
        naming = [line for line in r.stderr.splitlines() if re.search(rf"\b{call}(_v2)?\b", line)]
        assert len(naming) == 1, f"{call} failed with status {status}; stderr lines that name it: {naming}\n" \
                                 f"{r.stderr[-3000:]}"


DLOPEN_CALLS = {"cublas": {"cublasCreate_v2", "cublasGetVersion_v2", "cublasSgemm_v2", "cublasDestroy_v2"},
                "cublasLt": {"cublasLtCreate", "cublasLtGetVersion", "cublasLtDestroy"},
                "cufft": {"cufftGetVersion", "cufftPlan1d", "cufftExecC2C", "cufftDestroy"},
                "curand": {"curandCreateGenerator", "curandSetPseudoRandomGeneratorSeed", "curandGenerateUniform",
                           "curandDestroyGenerator"},
                "cusparse": {"cusparseCreate", "cusparseGetVersion", "cusparseDestroy"},
                "cusolver": {"cusolverDnCreate", "cusolverDnDestroy"}}


@pytest.mark.parametrize("lib", DLOPEN_CALLS)
def test_sim_libraries_reached_through_dlopen(build, lib: str) -> None:
    """dlopen of the library's soname is answered by the shim (the library is not installed here), dlsym finds
    every entry point, and each call runs on sim or fails cleanly."""
    not_yet_in_the_shim(DLOPEN_CALLS[lib])
    exe = build("lib_dlopen")
    r = run(nvproxy_cmd(exe, "sim", "lib_dlopen", lib))
    assert "failed" not in r.stdout and r.returncode == 0, r.stdout + r.stderr[-3000:]
    statuses = dict(re.findall(rf"^{lib} (\w+): status (\d+)", r.stdout, re.M))
    assert statuses and set(statuses) <= DLOPEN_CALLS[lib], r.stdout
    check_clean_failures(r, {call: int(s) for call, s in statuses.items() if s != "0"})
    assert r.stdout.endswith("done\n"), r.stdout


def library_headers(nvcc: str) -> list[str]:
    """The -I that finds the libraries' headers: none where the toolkit has them; NVPROXY_CUDA_LIBS_INCLUDE or this
    repository's .cuda-libs/include (copied from a GPU machine, not committed); skips where none has them."""
    toolkit = Path(nvcc).resolve().parents[1]
    if any((d / "cublas_v2.h").exists() for d in (toolkit / "include", toolkit / "targets/x86_64-linux/include")):
        return []
    for d in (os.environ.get("NVPROXY_CUDA_LIBS_INCLUDE"), ROOT / ".cuda-libs" / "include"):
        if d and (Path(d) / "cublas_v2.h").exists():
            return [f"-I{d}"]
    pytest.skip("the math libraries' headers are not here (set NVPROXY_CUDA_LIBS_INCLUDE)")


STUB = """#include <stdlib.h>
#include <unistd.h>
static void reached(const char *m, unsigned long n) { write(2, m, n); abort(); }
"""


def stand_in(lib: str, symbols: list[str], out: Path) -> None:
    """lib<lib>.so.N in out: every function a stand-in that says it was called in the application process and
    aborts, under the real library's soname and symbol version (the program's references carry that version)."""
    soname = LIBRARIES[lib][0]
    src, script = out / f"{lib}.c", out / f"{lib}.map"
    body = [STUB]
    for s in symbols:
        msg = f"nvproxy test: {s} was called in the application process\\n"
        body.append(f'void {s}(void) {{ static const char m[] = "{msg}"; reached(m, sizeof m - 1); }}\n')
    src.write_text("".join(body))
    script.write_text(f"{soname} {{\n  global: *;\n}};\n")
    subprocess.run(["cc", "-shared", "-fPIC", f"-Wl,-soname,{soname}", f"-Wl,--version-script={script}", "-o",
                    str(out / soname), str(src)], check=True)
    link = out / f"lib{lib}.so"
    if not link.exists():
        link.symlink_to(soname)


@pytest.mark.parametrize("name", PROGRAMS)
def test_sim_linked_programs_reach_only_the_shim(nvcc: str, name: str, tmp_path: Path) -> None:
    """The program compiles against the libraries' headers and is linked against stand-ins that abort when called:
    under nvproxy every library call is the shim's (no stand-in is reached), and the program either passes (the sim
    backend models the library) or stops at a call that failed cleanly."""
    obj = tmp_path / f"{name}.o"
    headers = cudnn_flags(False) if name == "lib_cudnn" else library_headers(nvcc)
    subprocess.run([nvcc, "-cudart", "shared", *headers, "-c", "-o", str(obj), str(APPS / f"{name}.cu")],
                   check=True, cwd=APPS)
    undefined = subprocess.run(["nm", "-u", str(obj)], capture_output=True, text=True, check=True).stdout.split()
    used = {s for s in undefined if library_of(s)}
    assert used, f"{name} uses no library function"
    not_yet_in_the_shim(used)
    for lib in {library_of(s) for s in used}:
        stand_in(lib or "", sorted(s for s in used if library_of(s) == lib), tmp_path)
    exe = tmp_path / name
    subprocess.run([nvcc, "-cudart", "shared", "-o", str(exe), str(obj), f"-L{tmp_path}", *PROGRAMS[name]],
                   check=True)
    r = run(nvproxy_cmd(exe, "sim", name), env=dict(os.environ, LD_LIBRARY_PATH=str(tmp_path)))
    assert "was called in the application process" not in r.stderr, r.stderr[-3000:]
    if r.returncode == 0 and r.stdout.endswith("Test PASSED\n"):
        return
    last = r.stdout.splitlines()[-1] if r.stdout else ""
    failed = re.fullmatch(r"FAILED \S+ (\w+)\(.*\) -> status (\d+)", last)
    assert r.returncode == 1 and failed, r.stdout[-2000:] + r.stderr[-3000:]
    check_clean_failures(r, {failed.group(1): int(failed.group(2))})
