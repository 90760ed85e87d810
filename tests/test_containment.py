"""Containment: nothing an application does reaches the GPU except through the proxy.  The driver API (reached
by dlopen and cuGetProcAddress, or through the runtime's cudaGetDriverEntryPoint) is served by the shim and the
proxy, what it does not forward fails loudly, and a CUDA runtime of the program's own (linked statically) is
refused before the program runs, or fails loudly when the shim is preloaded by hand."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import APPS, hooked, nvproxy_cmd, run

from nvproxy import shim_path
from nvproxy.containment import check_program, own_runtime

ROOT = Path(__file__).resolve().parents[1]
LIBCUDA = json.loads((ROOT / "native" / "shim" / "libcuda_api.json").read_text())
BACKENDS = ["sim", pytest.param("gpu", marks=pytest.mark.gpu)]
DRIVER = "libcuda.so.1"
RUNTIME = "libcudart.so.13"


def nvcc_build(nvcc: str, out: Path, source: str, *flags: str) -> Path:
    subprocess.run([nvcc, *flags, "-o", str(out), str(APPS / source)], check=True, cwd=APPS)
    return out


@pytest.fixture(scope="session")
def images(nvcc: str, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """driver_kernels.cu as the three kinds of module image a program loads itself."""
    out = tmp_path_factory.mktemp("images")
    return {kind: nvcc_build(nvcc, out / f"kernels.{kind}", "driver_kernels.cu", f"-{kind}", "-arch=sm_90")
            for kind in ("fatbin", "cubin", "ptx")}


@pytest.fixture(scope="session")
def static_vector_add(nvcc: str, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """vector_add as nvcc builds by default: the CUDA runtime linked in statically."""
    return nvcc_build(nvcc, tmp_path_factory.mktemp("static") / "vector_add", "vector_add.cu")


def shim_symbols() -> dict[str, str]:
    out = subprocess.run(["nm", "-D", "--defined-only", str(shim_path())], capture_output=True, text=True,
                         check=True).stdout
    return {line.split()[2]: line.split()[1] for line in out.splitlines()}


# ---- the shim exports the whole driver, and forwards onto what it implements ----


def test_every_libcuda_export_is_exported() -> None:
    syms = shim_symbols()
    assert len(LIBCUDA["exports"]) > 600
    assert not set(LIBCUDA["exports"]) - set(syms)
    for name in ("cuInit", "cuMemAlloc_v2", "cuLaunchKernel", "cuLaunchKernel_ptsz", "cuModuleLoadData",
                 "cuGetProcAddress_v2", "cuGetExportTable", "cudaGetDriverEntryPoint", "dlopen", "dlmopen"):
        assert syms.get(name) == "T", name  # (implemented: strong, not a generated stub)


def test_forwarded_calls_reach_implemented_runtime_calls() -> None:
    """Every runtime call a generated driver function makes is one the shim implements (else the driver call
    would fail naming a runtime function the program never called)."""
    syms = shim_symbols()
    calls = set(re.findall(r"\b(cuda\w+)\(", (ROOT / "native" / "shim" / "gen_driver_forward.c").read_text()))
    assert len(calls) > 60
    assert {c for c in calls if syms.get(c) != "T"} == set()


@pytest.mark.skipif(not Path("/usr/local/cuda/include/cuda.h").exists(), reason="the toolkit's cuda.h is needed")
def test_generated_driver_sources_are_current() -> None:
    r = subprocess.run([sys.executable, str(ROOT / "native" / "tools" / "gen_driver.py"), "--check"],
                       capture_output=True, text=True)
    assert r.returncode == 0, r.stdout + r.stderr


# ---- a runtime of the program's own ----


def test_a_static_runtime_is_refused(static_vector_add: Path, tmp_path: Path) -> None:
    stripped = tmp_path / "stripped"
    shutil.copy(static_vector_add, stripped)
    subprocess.run(["strip", str(stripped)], check=True)
    for exe, evidence in ((static_vector_add, "cudaMalloc"), (stripped, "libcuda.so.1")):
        msg = check_program([str(exe), "arg"])
        assert msg is not None, exe
        assert "linked statically" in msg and "no checkpoint could save" in msg and evidence in msg, msg
        assert "nvcc -cudart shared" in msg and "CMAKE_CUDA_RUNTIME_LIBRARY=Shared" in msg, msg
        assert "--allow-unprotected" in msg and "\n" not in msg, msg


def test_a_library_with_a_static_runtime_is_refused(nvcc: str, tmp_path: Path) -> None:
    lib = nvcc_build(nvcc, tmp_path / "libstatic_runtime_lib.so", "static_runtime_lib.cu", "-shared",
                     "-Xcompiler", "-fPIC")
    exe = nvcc_build(nvcc, tmp_path / "uses_static_lib", "uses_static_lib.cu", "-cudart", "shared",
                     f"-L{tmp_path}", "-lstatic_runtime_lib", "-Xlinker", "-rpath", "-Xlinker", "$ORIGIN")
    msg = check_program([str(exe)])
    assert msg is not None and str(lib) in msg and "linked statically" in msg, msg


def test_programs_nvproxy_serves_are_not_refused(build, tmp_path: Path) -> None:
    script = tmp_path / "job.sh"
    script.write_text("#!/bin/sh\nexec ./anything\n")
    script.chmod(0o755)
    for argv in ([str(build("vector_add"))], [str(build("driver_api"))], [str(script)], ["python3", "-c", "1"],
                 ["sh", "-c", "true"], [str(tmp_path / "missing")]):
        assert check_program(argv) is None, argv


def test_own_runtime_tells_a_static_runtime_from_the_shared_one(build, static_vector_add: Path) -> None:
    """What the framework tests ask of a Python extension module, asked of programs: only the static one carries
    a runtime."""
    assert own_runtime(static_vector_add) and own_runtime(build("vector_add")) is None


def test_a_static_runtime_preloaded_by_hand_fails_loudly(static_vector_add: Path) -> None:
    """Its own dlopen of libcuda.so.1 lands on the shim, whose cuGetExportTable refuses it: the program fails,
    saying why, instead of running beside nvproxy."""
    env = dict(os.environ, LD_PRELOAD=str(shim_path()), NVPROXY_BACKEND="sim", NVPROXY_PYTHON=sys.executable)
    p = subprocess.run([str(static_vector_add)], capture_output=True, text=True, env=env, timeout=120)
    assert p.returncode != 0 and "Test PASSED" not in p.stdout, p.stdout + p.stderr
    lines = [ln for ln in p.stderr.splitlines() if "cuGetExportTable" in ln]
    assert len(lines) == 1 and "its own CUDA runtime" in lines[0] and "nvcc -cudart shared" in lines[0], p.stderr
    assert f"called from {static_vector_add}:" in lines[0], p.stderr  # (the file that carries the runtime)


# ---- the driver API through the proxy ----

# what driver_api prints after its device line, natively (the same on every device)
EXPECTED = """\
out of range device: CUDA_ERROR_INVALID_DEVICE
context current: yes, on device 0
loading junk: an error
missing function: CUDA_ERROR_NOT_FOUND; the same function twice: same
global counter: 4 bytes; missing global: CUDA_ERROR_NOT_FOUND, leaving 0 bytes
sum_struct parameter 1 at 8, 36 bytes; past the last: CUDA_ERROR_INVALID_VALUE; scale_add max threads >= 256
scale_add: 0 wrong of 65536; elapsed time measured
sum_struct through a parameter buffer: 109.50
kernelParams and extra at once: CUDA_ERROR_INVALID_VALUE
no launch geometry: CUDA_ERROR_INVALID_VALUE
memset: ab 1234 1.0 deadbeef deadbeef deadbeef abababab (past: ab ab)
misaligned cuMemsetD32: CUDA_ERROR_INVALID_VALUE
2D copies: 0 wrong; a pitch narrower than the width: CUDA_ERROR_INVALID_VALUE
potential block size: whole warps
device to device copy: equal
memory types: device DEVICE, pinned host HOST, malloc'ed CUDA_ERROR_INVALID_VALUE
address range: the allocation's, 262144 bytes; memory info consistent
cuGetProcAddress of an unknown name: NULL, status 1
cuGetProcAddress of cuMemAlloc for CUDA 1.0: NULL, status 2
step 0: counter 1, sample sum 102592.0, graph's 52648.0
step 1: counter 3, sample sum 153888.0, graph's 52648.0
Test PASSED
"""

VARIANTS = [
    ("fatbin", DRIVER, "data", "primary"),
    ("cubin", DRIVER, "file", "created"),
    ("ptx", DRIVER, "ex", "primary"),
    ("cubin", RUNTIME, "data", "created"),
    ("ptx", RUNTIME, "file", "primary"),
    ("fatbin", DRIVER, "library", "created"),
]


def variant_id(v: tuple[str, ...]) -> str:
    return "-".join(x.split(".so")[0] for x in v)


def driver_args(images: dict[str, Path], image: str, library: str, load: str, context: str,
                *more: str) -> list[str]:
    return [str(images[image]), library, load, context, *more]


@pytest.mark.parametrize("variant", VARIANTS, ids=variant_id)
def test_driver_api_through_the_proxy(build, images: dict[str, Path], variant: tuple[str, ...]) -> None:
    exe = build("driver_api")
    r = run(nvproxy_cmd(exe, "sim", "driver_api", *driver_args(images, *variant, "2")))
    assert r.returncode == 0, r.stdout + r.stderr
    lines = r.stdout.splitlines(keepends=True)
    if variant[1] == DRIVER:
        assert lines.pop(0) == "dlsym(cuMemAlloc_v2) == cuGetProcAddress(cuMemAlloc)\n", r.stdout
    assert lines[0].startswith("device 0: nvproxy sim device"), r.stdout
    assert "".join(lines[1:]) == EXPECTED, r.stderr
    assert "driver functions from: libnvproxy.so" in r.stderr, r.stderr
    assert "opened a GPU device itself: no; libcuda mapped: no" in r.stderr, r.stderr


MIX_EXPECTED = """\
cuInit after the runtime: CUDA_SUCCESS
cuCtxGetCurrent: CUDA_SUCCESS
primary retain: CUDA_SUCCESS
the runtime's context is the primary one: yes
cuMemAlloc: CUDA_SUCCESS
cuMemsetD32: CUDA_SUCCESS
cuMemcpyDtoH: CUDA_SUCCESS, 3.0 3.0
pointer attribute of malloc'ed memory: CUDA_ERROR_INVALID_VALUE
cudaGetLastError after it: cudaSuccess
other thread: current none; cuMemAlloc: CUDA_ERROR_INVALID_CONTEXT
other thread: set primary: CUDA_SUCCESS; cuMemAlloc: CUDA_SUCCESS; cuMemFree: CUDA_SUCCESS
cuMemFree: CUDA_SUCCESS
primary release: CUDA_SUCCESS
Test PASSED
"""


@pytest.mark.parametrize("backend", BACKENDS)
def test_runtime_and_driver_in_one_program(build, backend: str) -> None:
    """The runtime's current context is the driver's primary one; a thread without runtime calls has none; a
    failing driver call leaves the runtime's last error alone (natively too, on the GPU)."""
    exe = build("driver_runtime_mix")
    r = run(nvproxy_cmd(exe, backend, "driver_runtime_mix"))
    assert r.returncode == 0 and r.stdout == MIX_EXPECTED, r.stdout + r.stderr
    if backend == "gpu":
        native = run([str(exe)])
        assert native.stdout == MIX_EXPECTED, native.stdout + native.stderr


def test_driver_calls_nvproxy_does_not_forward_fail_loudly(build) -> None:
    r = run(nvproxy_cmd(build("driver_unsupported"), "sim", "driver_unsupported"))
    assert r.returncode == 0, r.stdout + r.stderr
    assert r.stdout == """\
cuInit: CUDA_SUCCESS
cuMemcpy3D_v2: CUDA_ERROR_NOT_SUPPORTED
cuArrayCreate_v2: CUDA_ERROR_NOT_SUPPORTED
cuGraphAddKernelNode_v2: CUDA_ERROR_NOT_SUPPORTED
cuMemExportToShareableHandle: CUDA_ERROR_NOT_SUPPORTED
cuMemcpy3DAsync: CUDA_SUCCESS, status 0, CUDA_ERROR_NOT_SUPPORTED
cuTexObjectCreate: CUDA_SUCCESS, status 0, CUDA_ERROR_NOT_SUPPORTED
cuGetExportTable: CUDA_ERROR_NOT_SUPPORTED, table NULL
""", r.stderr
    said = r.stderr.splitlines()
    for call in ("cuMemcpy3D_v2", "cuArrayCreate_v2", "cuGraphAddKernelNode_v2", "cuMemExportToShareableHandle",
                 "cuMemcpy3DAsync_v2", "cuTexObjectCreate"):
        assert [ln for ln in said if call + " " in ln] == [
            f"nvproxy: {call} is not supported by nvproxy; returning CUDA_ERROR_NOT_SUPPORTED"], r.stderr
    assert len([ln for ln in said if "cuGetExportTable" in ln]) == 1, r.stderr


def test_python_reaching_the_driver_through_ctypes_gets_the_proxy() -> None:
    """As a framework does: ctypes.CDLL("libcuda.so.1") (this machine has no libcuda at all), then cuInit,
    cuDeviceGetCount and an allocation, served by the proxy."""
    code = """
import ctypes
cuda = ctypes.CDLL("libcuda.so.1")
n, p, free, total = ctypes.c_int(), ctypes.c_uint64(), ctypes.c_size_t(), ctypes.c_size_t()
print("init", cuda.cuInit(0), "count", cuda.cuDeviceGetCount(ctypes.byref(n)), n.value)
ctx = ctypes.c_void_p()
print("retain", cuda.cuDevicePrimaryCtxRetain(ctypes.byref(ctx), 0), "set", cuda.cuCtxSetCurrent(ctx))
print("alloc", cuda.cuMemAlloc_v2(ctypes.byref(p), 1 << 20), hex(p.value >> 40))
print("info", cuda.cuMemGetInfo_v2(ctypes.byref(free), ctypes.byref(total)), free.value <= total.value)
print("free", cuda.cuMemFree_v2(p))
"""
    r = run([sys.executable, "-m", "nvproxy", "run", "--backend", "sim", "--", sys.executable, "-c", code])
    assert r.returncode == 0, r.stdout + r.stderr
    # (device memory lies in nvproxy's arena for device 0, at 0x2000_0000_0000)
    assert r.stdout == "init 0 count 0 1\nretain 0 set 0\nalloc 0 0x20\ninfo 0 True\nfree 0\n", r.stderr


def test_cudnn_opens_as_the_shim_and_its_engines_are_refused() -> None:
    """cuDNN and its sub-libraries of public functions open as the shim, wherever they are (this machine has none);
    its engine libraries, GPU code only the real libcudnn calls, are refused with one line."""
    code = """
import ctypes
for name in ("libcudnn.so.9", "/opt/x/libcudnn_graph.so.9", "libcudnn_ops.so", "libcudnn_adv.so.9.28.1"):
    print(name, hasattr(ctypes.CDLL(name), "cudnnBackendExecute"))
for name in ("libcudnn_engines_precompiled.so.9", "libcudnn_heuristic.so.9"):
    try:
        ctypes.CDLL(name)
        print(name, "opened")
    except OSError:
        print(name, "refused")
"""
    env = dict(os.environ, LD_PRELOAD=str(shim_path()))
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=60)
    assert p.returncode == 0, p.stdout + p.stderr
    assert p.stdout.splitlines() == ["libcudnn.so.9 True", "/opt/x/libcudnn_graph.so.9 True", "libcudnn_ops.so True",
                                     "libcudnn_adv.so.9.28.1 True", "libcudnn_engines_precompiled.so.9 refused",
                                     "libcudnn_heuristic.so.9 refused"]
    assert p.stderr.count("nvproxy: dlopen(\"libcudnn_engines_precompiled.so.9\") refused: cuDNN's engines run in "
                          "the proxy") == 1, p.stderr


def test_dlopen_leaves_the_callers_search_path_alone(tmp_path: Path) -> None:
    """The shim's dlopen hands other names to the real one by a tail call, so a library found only through the
    caller's RUNPATH ($ORIGIN/lib) is still found."""
    (tmp_path / "lib").mkdir()
    src = str(APPS / "dlopen_runpath.c")
    subprocess.run(["gcc", "-shared", "-fPIC", "-DDEPENDENCY", "-o", str(tmp_path / "lib" / "libnvp_runpath_dep.so"),
                    src], check=True)
    subprocess.run(["gcc", "-o", str(tmp_path / "prog"), src, "-Wl,--enable-new-dtags,-rpath,$ORIGIN/lib", "-ldl"],
                   check=True)
    env = dict(os.environ, LD_PRELOAD=str(shim_path()))
    p = subprocess.run([str(tmp_path / "prog")], capture_output=True, text=True, env=env, timeout=60)
    assert p.returncode == 0 and p.stdout == "dependency says 42\n", p.stdout + p.stderr


# ---- state the driver API made survives checkpoints ----


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("image", ["ptx", "cubin"])
def test_driver_api_state_survives_migration(build, images: dict[str, Path], backend: str, image: str) -> None:
    """Module (and its variable), memory, stream, events and a captured graph (with a 32-bit memset) made by
    driver calls: the run goes on after a migration mid-run as if none happened."""
    from test_checkpoint import migrate_mid_run

    args = driver_args(images, image, DRIVER, "data", "created")
    migrate_mid_run(build, backend, "driver_api", (*args, "24", "150"), "step 2:", (*args, "24", "0"))


def test_driver_api_migrated_at_its_calls(build, images: dict[str, Path], tmp_path: Path) -> None:
    """Migrated at one call in eight (NVPROXY_MIGRATE_AT), among them the module's load and lookups."""
    exe = build("driver_api")
    args = driver_args(images, "cubin", DRIVER, "data", "created", "3")
    count = tmp_path / "calls"
    reference = run(nvproxy_cmd(exe, "sim", "driver_api", *args), env=hooked(NVPROXY_CALLS_OUT=str(count)))
    assert reference.returncode == 0 and "Test PASSED" in reference.stdout, reference.stdout + reference.stderr
    calls = int(count.read_text())
    assert calls > 40
    for call in range(3, calls + 1, 8):
        r = run(nvproxy_cmd(exe, "sim", "driver_api", *args), env=hooked(NVPROXY_MIGRATE_AT=str(call)))
        assert r.returncode == 0 and "migrated process" in r.stderr, f"at call {call}: {r.stdout}{r.stderr}"
        assert r.stdout == reference.stdout, f"migrated at call {call} of {calls}: {r.stderr}"


def test_driver_api_state_comes_back_in_a_new_proxy(build, images: dict[str, Path], tmp_path: Path) -> None:
    """NVPROXY_RECOVER: the proxy dies after a checkpoint; a new one starts from the image, and the program's
    driver-made module, memory, stream and events are there (the module's kernels are looked up again)."""
    from test_checkpoint import nvproxy

    from nvproxy.launcher import find_proxy

    exe = build("driver_api")
    args = driver_args(images, "fatbin", DRIVER, "data", "primary", "5")
    reference = run(nvproxy_cmd(exe, "sim", "driver_api", *args, "0"))
    image = tmp_path / "last.img"
    env = dict(os.environ, NVPROXY_RECOVER=str(image))
    env.pop("LD_PRELOAD", None)
    # (the proxy dies while the program pauses after step 1: work sent after the image would be lost with it)
    app = subprocess.Popen(nvproxy_cmd(exe, "sim", "driver_api", *args, "2500"), stdout=subprocess.PIPE,
                           stderr=subprocess.PIPE, text=True, env=env)
    assert app.stdout is not None
    lines = []
    while not lines or not lines[-1].startswith("step 1:"):
        lines.append(app.stdout.readline())
        assert lines[-1], app.communicate()[1]
    assert nvproxy("checkpoint", str(app.pid), "-o", str(image)).returncode == 0
    pid, _sock = find_proxy(app.pid)
    os.kill(pid, 9)
    out, err = app.communicate(timeout=120)
    assert "starting a new one from" in err, err
    assert "".join(lines) + out == reference.stdout, err


def test_driver_api_state_survives_a_dmtcp_restart(build, images: dict[str, Path], tmp_path: Path) -> None:
    """Under DMTCP, where DMTCP's own dlopen wrapper comes before the shim's, the driver API still reaches the
    shim, and a checkpoint mid-run and a restart give an uninterrupted run's output."""
    from test_dmtcp import Session, checkpoint_kill_restart

    session = Session(tmp_path / "dmtcp")
    exe = build("driver_api")
    args = driver_args(images, "cubin", DRIVER, "data", "created", "16")
    reference = run(nvproxy_cmd(exe, "sim", "driver_api", *args, "0")).stdout.splitlines(keepends=True)
    checkpoint_kill_restart(session, nvproxy_cmd(exe, "sim", "driver_api", *args, "150"), reference, "step 2:")


# ---- on a GPU: the same output natively and through nvproxy ----


@pytest.mark.gpu
@pytest.mark.parametrize("variant", VARIANTS, ids=variant_id)
def test_driver_api_native_against_nvproxy(build, images: dict[str, Path], variant: tuple[str, ...]) -> None:
    exe = build("driver_api")
    args = driver_args(images, *variant, "4")
    native = run([str(exe), *args])
    assert native.returncode == 0 and "Test PASSED" in native.stdout, native.stdout + native.stderr
    assert "opened a GPU device itself: yes" in native.stderr, native.stderr
    proxied = run(nvproxy_cmd(exe, "gpu", "driver_api", *args))
    assert proxied.stdout == native.stdout, proxied.stderr
    assert "driver functions from: libnvproxy.so" in proxied.stderr, proxied.stderr
    assert "opened a GPU device itself: no; libcuda mapped: no" in proxied.stderr, proxied.stderr
