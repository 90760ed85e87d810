"""A program linked with -lcuda, under nvproxy run, maps no libcuda of its own (src/nvproxy/libdir.py): its
libcuda.so.1 is the shim.  On sim the libcuda it is linked with is a stand-in that says when the loader maps it and
aborts when called.  Found through the program's DT_RUNPATH or the user's LD_LIBRARY_PATH, it is never mapped; a
library linked with -lcuda too, opened with RTLD_DEEPBIND, reaches the shim; opening that library into a namespace
of its own (dlmopen), where it would find the stand-in, is refused with one line.  Through a DT_RPATH, which comes
before LD_LIBRARY_PATH, the stand-in is mapped, `nvproxy run` says so, and still nothing calls it.  On a GPU the
program, linked with the toolkit's libcuda, prints native's output (less the real libcuda native maps), also after
a migration, whose new proxy loads the real libcuda."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest
from conftest import APPS, hooked, nvproxy_cmd, run
from test_checkpoint import nvproxy

from nvproxy.launcher import find_proxy

NAME = "linked_libcuda"
LOADED = "nvproxy test: the stand-in libcuda was loaded"
CALLED = "was called in the application process"
STAND_IN = f"""#include <stdlib.h>
#include <unistd.h>
static void reached(const char *m, unsigned long n) {{ write(2, m, n); abort(); }}
__attribute__((constructor)) static void loaded(void)
{{
    static const char m[] = "{LOADED}\\n";
    write(2, m, sizeof m - 1);
}}
"""
LINKS = {"runpath": ["-Xlinker", "--enable-new-dtags"], "rpath": ["-Xlinker", "--disable-new-dtags"]}


@pytest.fixture(scope="module")
def linked(nvcc: str, tmp_path_factory: pytest.TempPathFactory):
    """(build(how) -> the program linked against the stand-in, found through how: runpath, rpath or
    ld_library_path; the library for RTLD_DEEPBIND; the stand-in's directory)."""
    d = tmp_path_factory.mktemp("linked-libcuda")
    fake = d / "fake"
    fake.mkdir()
    obj, lib_obj = d / f"{NAME}.o", d / "asks.o"
    subprocess.run([nvcc, "-cudart", "shared", "-c", "-o", str(obj), str(APPS / f"{NAME}.cu")], check=True)
    subprocess.run([nvcc, "-Xcompiler", "-fPIC", "-c", "-o", str(lib_obj), str(APPS / "library_asks_driver.c")],
                   check=True)
    undefined = subprocess.run(["nm", "-u", str(obj), str(lib_obj)], capture_output=True, text=True,
                               check=True).stdout.split()
    symbols = sorted({s for s in undefined if s.startswith("cu") and not s.startswith("cuda")})
    body = [STAND_IN] + [f'int {s}(void) {{ static const char m[] = "nvproxy test: {s} {CALLED}\\n"; '
                         f"reached(m, sizeof m - 1); return 0; }}\n" for s in symbols]
    (fake / "libcuda.c").write_text("".join(body))
    subprocess.run(["cc", "-shared", "-fPIC", "-Wl,-soname,libcuda.so.1", "-o", str(fake / "libcuda.so.1"),
                    str(fake / "libcuda.c")], check=True)
    (fake / "libcuda.so").symlink_to("libcuda.so.1")
    helper = d / "libasks.so"
    subprocess.run(["cc", "-shared", "-o", str(helper), str(lib_obj), f"-L{fake}", "-lcuda",
                    "-Wl,--enable-new-dtags", f"-Wl,-rpath,{fake}"], check=True)

    def build(how: str) -> Path:
        exe = d / f"{NAME}-{how}"
        if not exe.exists():
            rpath = [*LINKS[how], "-Xlinker", f"-rpath={fake}"] if how in LINKS else []
            subprocess.run([nvcc, "-cudart", "shared", "-o", str(exe), str(obj), f"-L{fake}", "-lcuda", *rpath],
                           check=True)
        return exe

    return build, helper, fake


def environment(how: str, fake: Path) -> dict[str, str]:
    env = dict(os.environ)
    if how == "ld_library_path":
        env["LD_LIBRARY_PATH"] = f"{fake}:{env.get('LD_LIBRARY_PATH', '')}"
    return env


@pytest.mark.parametrize("how", ["runpath", "ld_library_path"])
def test_sim_linked_program_maps_no_libcuda(linked, how: str) -> None:
    build, helper, fake = linked
    exe, env = build(how), environment(how, fake)
    alone = run([str(exe)], env=env)  # (without nvproxy: the stand-in is the libcuda the loader finds)
    assert LOADED in alone.stderr and CALLED in alone.stderr and alone.returncode != 0, alone.stdout + alone.stderr
    r = run(nvproxy_cmd(exe, "sim", NAME, str(helper)), env=env)
    assert r.returncode == 0 and r.stdout.endswith("Test PASSED\n"), r.stdout + r.stderr[-3000:]
    assert LOADED not in r.stderr and CALLED not in r.stderr, r.stderr[-3000:]
    assert "mapped:" not in r.stdout, r.stdout
    assert "memset: 1020304 1020304" in r.stdout and "driver answered" in r.stdout, r.stdout
    # (in a namespace of its own the library would find the stand-in: refused, with one line)
    assert "dlmopen into a new namespace: refused" in r.stdout, r.stdout
    assert len([line for line in r.stderr.splitlines() if f'dlmopen("{helper}") refused' in line]) == 1, r.stderr


def test_sim_rpath_libcuda_is_mapped_and_said(linked) -> None:
    """A DT_RPATH comes before LD_LIBRARY_PATH: the stand-in is mapped, nvproxy run says where it came from, and
    the library opened with RTLD_DEEPBIND (which nvproxy drops) still reaches the shim."""
    build, helper, fake = linked
    exe = build("rpath")
    r = run(nvproxy_cmd(exe, "sim", NAME, str(helper)))
    assert r.returncode == 0 and r.stdout.endswith("Test PASSED\n"), r.stdout + r.stderr[-3000:]
    assert f"DT_RPATH names {fake}" in r.stderr and LOADED in r.stderr, r.stderr[-3000:]
    assert CALLED not in r.stderr and "driver answered" in r.stdout, r.stdout + r.stderr[-3000:]
    assert f"mapped: {fake}/libcuda.so.1" in r.stdout, r.stdout


@pytest.mark.gpu
def test_gpu_linked_program_matches_native(nvcc: str, tmp_path: Path) -> None:
    """Linked with the toolkit's libcuda (its stub for the link; the driver's at run time): native's output but for
    the real libcuda native maps; also migrated at its middle call (the new proxy needs the real libcuda)."""
    toolkit = Path(nvcc).resolve().parents[1]
    stubs = next((p for p in (toolkit / "lib64/stubs", toolkit / "targets/x86_64-linux/lib/stubs")
                  if (p / "libcuda.so").exists()), None)
    if stubs is None:
        pytest.skip("the toolkit has no libcuda stub to link with")
    exe = tmp_path / NAME
    subprocess.run([nvcc, "-cudart", "shared", "-o", str(exe), str(APPS / f"{NAME}.cu"), f"-L{stubs}", "-lcuda"],
                   check=True)
    native = run([str(exe)])
    assert native.returncode == 0 and "mapped: " in native.stdout, native.stdout + native.stderr
    want = "".join(line for line in native.stdout.splitlines(keepends=True) if not line.startswith("mapped: "))
    count = tmp_path / "calls"
    r = run(nvproxy_cmd(exe, "gpu", NAME), env=hooked(NVPROXY_CALLS_OUT=str(count)))
    assert r.returncode == 0 and r.stdout == want, r.stdout + r.stderr[-3000:]
    calls = int(count.read_text().split()[0])
    m = run(nvproxy_cmd(exe, "gpu", NAME), env=hooked(NVPROXY_MIGRATE_AT=str(calls // 2)))
    assert m.returncode == 0 and "migrated process" in m.stderr, m.stdout + m.stderr[-3000:]
    assert m.stdout == want, m.stderr[-3000:]


def environ_of(pid: int) -> dict[str, str]:
    pairs = Path(f"/proc/{pid}/environ").read_bytes().decode(errors="replace").split("\0")
    return dict(p.split("=", 1) for p in pairs if "=" in p)


def test_sim_proxies_go_without_the_directory(build, tmp_path: Path) -> None:
    """The program's LD_LIBRARY_PATH begins with the directory; its proxies' (which load the real libcuda on a GPU)
    do not hold it: neither the one nvproxy run starts, nor the one the shim starts when the program recovers
    (NVPROXY_RECOVER) from its proxy's death."""
    exe = build("ckpt_steps")
    image = tmp_path / "last.img"
    env = dict(os.environ, NVPROXY_RECOVER=str(image))
    env.pop("LD_PRELOAD", None)
    app = subprocess.Popen(nvproxy_cmd(exe, "sim", "ckpt_steps", "3", "-1"), stdin=subprocess.PIPE,
                           stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
    assert app.stdin is not None and app.stdout is not None
    try:
        assert app.stdout.readline(), app.communicate()[1][-3000:]  # (step 1 done: it waits for a line)
        mine = environ_of(app.pid)
        d = mine["NVPROXY_LIBDIR"]
        assert mine["LD_LIBRARY_PATH"].split(":")[0] == d and Path(d, "libcuda.so.1").is_symlink()
        first = find_proxy(app.pid)[0]
        assert d not in environ_of(first).get("LD_LIBRARY_PATH", "").split(":")
        c = nvproxy("checkpoint", str(app.pid), "-o", str(image))
        assert c.returncode == 0, c.stdout + c.stderr
        os.kill(first, 9)
        app.stdin.write("\n")
        app.stdin.flush()
        assert app.stdout.readline(), app.communicate()[1][-3000:]  # (step 2, served by the new proxy)
        second = find_proxy(app.pid)[0]
        assert second != first and d not in environ_of(second).get("LD_LIBRARY_PATH", "").split(":")
        _out, err = app.communicate(timeout=120)  # (its end of file: it waits no more)
    finally:
        if app.poll() is None:
            app.kill()
    assert "starting a new one from" in err and app.returncode == 0, err[-3000:]
