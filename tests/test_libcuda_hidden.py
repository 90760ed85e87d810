"""A program linked with -lcuda, under nvproxy run, maps no libcuda of its own: an empty library named libcuda.so.1
is preloaded after the shim (native/soname/libcuda_name.c).  On sim the libcuda it is linked with is a stand-in that
says when the loader maps it and aborts when called.  Found through the program's DT_RPATH, DT_RUNPATH or the user's
LD_LIBRARY_PATH, it is never mapped; a library linked with -lcuda too, opened with RTLD_DEEPBIND, reaches the shim;
opening that library into a namespace of its own (dlmopen), where it would find the stand-in, is refused with one
line.  On a GPU the program, linked with the toolkit's libcuda, prints native's output (less the real libcuda native
maps), also after a migration, whose new proxy loads the real libcuda."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest
from conftest import APPS, hooked, nvproxy_cmd, run
from test_checkpoint import nvproxy

from nvproxy import libcuda_name_path, shim_path
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


@pytest.mark.parametrize("how", ["rpath", "runpath", "ld_library_path"])
def test_sim_linked_program_maps_no_libcuda(linked, how: str) -> None:
    build, helper, fake = linked
    exe, env = build(how), environment(how, fake)
    alone = run([str(exe)], env=env)  # (without nvproxy: the stand-in is the libcuda the loader finds)
    assert LOADED in alone.stderr and CALLED in alone.stderr and alone.returncode != 0, alone.stdout + alone.stderr
    r = run(nvproxy_cmd(exe, "sim", NAME, str(helper)), env=env)
    assert r.returncode == 0 and r.stdout.endswith("Test PASSED\n"), r.stdout + r.stderr[-3000:]
    assert CALLED not in r.stderr, r.stderr[-3000:]
    # (mapped only into the namespace of the refused dlmopen, whose constructors the loader runs before it returns)
    lines = r.stderr.splitlines()
    assert [line for line in lines if LOADED in line] == [LOADED], r.stderr[-3000:]
    assert lines[lines.index(LOADED) + 1].startswith(f'nvproxy: dlmopen("{helper}") refused'), r.stderr[-3000:]
    assert "mapped:" not in r.stdout, r.stdout
    assert "memset: 1020304 1020304" in r.stdout and "driver answered" in r.stdout, r.stdout
    # (in a namespace of its own the library would find the stand-in: refused, with one line)
    assert "dlmopen into a new namespace: refused" in r.stdout, r.stdout
    assert len([line for line in r.stderr.splitlines() if f'dlmopen("{helper}") refused' in line]) == 1, r.stderr


def test_sim_linked_program_under_dmtcp_maps_no_libcuda(linked, tmp_path: Path) -> None:
    """Under `nvproxy run --dmtcp` the shim is a DMTCP plugin; the library named libcuda.so.1 is preloaded all the
    same, so the program, linked through a DT_RPATH to the stand-in, maps none and calls none."""
    from test_dmtcp import Session

    build, _helper, _fake = linked
    session = Session(tmp_path / "dmtcp")
    app = session.launch(nvproxy_cmd(build("rpath"), "sim", NAME))
    _out, err = app.communicate(timeout=120)
    out = session.out.read_text()
    assert app.returncode == 0 and out.endswith("Test PASSED\n"), out + err[-3000:]
    assert LOADED not in err and CALLED not in err and "mapped:" not in out, out + err[-3000:]


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


def test_sim_proxies_start_without_the_preloads(build, tmp_path: Path) -> None:
    """The program preloads the shim and the library named libcuda.so.1; its proxies (which load the real libcuda on
    a GPU) preload neither: not the one nvproxy run starts, nor the one the shim starts when the program recovers
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
        assert mine["LD_PRELOAD"].split(":")[:2] == [str(shim_path()), str(libcuda_name_path())], mine["LD_PRELOAD"]
        first = find_proxy(app.pid)[0]
        assert not environ_of(first).get("LD_PRELOAD"), environ_of(first).get("LD_PRELOAD")
        c = nvproxy("checkpoint", str(app.pid), "-o", str(image))
        assert c.returncode == 0, c.stdout + c.stderr
        os.kill(first, 9)
        app.stdin.write("\n")
        app.stdin.flush()
        assert app.stdout.readline(), app.communicate()[1][-3000:]  # (step 2, served by the new proxy)
        second = find_proxy(app.pid)[0]
        assert second != first and not environ_of(second).get("LD_PRELOAD"), environ_of(second).get("LD_PRELOAD")
        _out, err = app.communicate(timeout=120)  # (its end of file: it waits no more)
    finally:
        if app.poll() is None:
            app.kill()
    assert "starting a new one from" in err and app.returncode == 0, err[-3000:]
