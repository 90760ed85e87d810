"""A proxy's first steps (nvproxy/boot.py): before Python's site processing, with the standard library only,
it reserves a restoring proxy's application ranges and starts the driver; then the proxy runs as usual."""

from __future__ import annotations

import os
import select
import subprocess
import sys
from pathlib import Path

from conftest import APPS, nvproxy_cmd, run
from gated import Gated, kill_and_wait

from nvproxy import boot
from nvproxy.launcher import find_proxy, proxy_argv


def test_the_boot_stage_needs_nothing_but_the_standard_library() -> None:
    """Run with -S (no site-packages), the modules boot.begin() uses import: nothing of cffi, numpy or pycuda
    comes before the driver starts."""
    code = ("import sys; sys.path.append(sys.argv.pop(1)); import nvproxy.boot, nvproxy.checkpoint.image, "
            "nvproxy.backends.warmup; print(sorted(m for m in sys.modules if m.split('.')[0] in "
            "('cffi', 'numpy', 'pycuda', 'posix_ipc')))")
    r = subprocess.run([sys.executable, "-S", "-c", code, boot.root()], capture_output=True, text=True, timeout=60)
    assert r.returncode == 0 and r.stdout.strip() == "[]", r.stdout + r.stderr


def test_proxies_start_through_the_boot_stage(build, tmp_path: Path) -> None:
    """`nvproxy run` starts its proxy with -S and BOOT, and so does the shim when it starts one itself (here:
    NVPROXY_RECOVER after the first proxy was killed); the program runs to its expected output either way.  The
    program waits between steps until the test lets it go on: the checkpoint and the kill come between the same
    two steps however long they take."""
    exe = build("ckpt_steps")
    reference = run(nvproxy_cmd(exe, "sim", "ckpt_steps", "20", "0"))
    image = tmp_path / "last.img"
    env = dict(os.environ, NVPROXY_RECOVER=str(image))
    env.pop("LD_PRELOAD", None)
    with Gated(nvproxy_cmd(exe, "sim", "ckpt_steps", "20", "-1"), env) as app:
        app.line()
        for _ in range(5):
            app.go()
        pid, _sock = find_proxy(app.pid)
        cmdlines = [Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")]
        assert run([sys.executable, "-m", "nvproxy", "checkpoint", str(app.pid), "-o", str(image)]).returncode == 0
        kill_and_wait(pid)
        app.go()  # (its first call found the proxy gone: the shim started the next one, which serves it now)
        new, _sock = find_proxy(app.pid)
        cmdlines.append(Path(f"/proc/{new}/cmdline").read_bytes().split(b"\0"))
        out, err = app.finish()
    assert out == reference.stdout, err
    assert new != pid, err
    want = [a.encode() for a in proxy_argv()[1:]]
    for argv in cmdlines:
        assert argv[1 : 1 + len(want)] == want, argv
    assert b"--restore" in cmdlines[1]


def test_the_boot_stage_reserves_a_free_range_and_only_a_free_one() -> None:
    """boot.reserve_range (ctypes: before cffi is loaded) holds a free range of address space, refuses a taken one."""
    import ctypes
    import mmap

    m = mmap.mmap(-1, 1 << 20)
    addr = ctypes.addressof(ctypes.c_char.from_buffer(m))
    m.close()  # (a range known to be free now)
    libc = ctypes.CDLL(None)
    libc.munmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t]
    assert boot.reserve_range(addr, 1 << 20)
    try:
        assert not boot.reserve_range(addr, 1 << 20)  # (taken: by the reservation above)
        assert not boot.reserve_range(addr + (1 << 19), 1 << 20)  # (partly taken)
    finally:
        libc.munmap(addr, 1 << 20)


def test_a_proxy_that_fails_to_start_under_run_is_a_clear_error(build, tmp_path: Path) -> None:
    """`nvproxy run` execs the program without waiting for its proxy; where the proxy then fails (here its sim
    kernel file raises), it says why in one line, the shim says the proxy ended, and the program's first call
    fails as with a lost proxy: no traceback, no wait for the shim's 60 s."""
    kernels = tmp_path / "broken_sim.py"
    kernels.write_text('raise RuntimeError("broken kernels")\n')
    r = run([sys.executable, "-m", "nvproxy", "run", "--backend", "sim", "--sim-kernels", str(kernels), "--",
             str(build("vector_add"))], timeout=50)
    assert r.returncode != 0, r.stdout + r.stderr
    assert r.stderr.splitlines() == ["nvproxy: the proxy cannot open its backend: RuntimeError: broken kernels",
                                     "nvproxy: the proxy exited during start-up (see its messages above)"], r.stderr
    assert r.stdout == (f"FAILED {APPS / 'vector_add.cu'}:16 cudaMalloc(&da, bytes) -> cudaErrorDevicesUnavailable "
                        "(CUDA-capable device(s) is/are busy or unavailable)\n"), r.stdout


def test_a_program_that_ends_before_its_proxy_is_up_leaves_nothing() -> None:
    """`nvproxy run` does not wait for its proxy: a program that makes no CUDA call may be done before the proxy
    listens.  The proxy (which watches the program through a pidfd that `nvproxy run` gave it, not by its pid) then
    ends without a word and leaves no socket."""
    import shutil
    import tempfile

    rt = Path(tempfile.mkdtemp(prefix="nvp-", dir="/tmp"))  # (short: socket paths)
    try:
        _ends_before_its_proxy(rt)
    finally:
        shutil.rmtree(rt, ignore_errors=True)


def _ends_before_its_proxy(rt: Path) -> None:
    env = {k: v for k, v in os.environ.items() if k != "LD_PRELOAD" and not k.startswith("NVPROXY_")}
    env["XDG_RUNTIME_DIR"] = str(rt)
    r = run([sys.executable, "-m", "nvproxy", "run", "--backend", "sim", "--", "sh", "-c", "echo $NVPROXY_PROXY_PID"],
            env=env)
    assert r.returncode == 0 and r.stderr == "", r.stderr
    proxy = int(r.stdout)
    try:
        fd = os.pidfd_open(proxy)
    except ProcessLookupError:
        fd = None  # (it has ended already)
    if fd is not None:
        try:
            assert select.select([fd], [], [], 120)[0], "the proxy outlived its program"
        finally:
            os.close(fd)
    assert os.listdir(rt / "nvproxy") == []


STARTING_PROXY = """import socket, sys, time
print("running", flush=True)
time.sleep(0.5)  # (a proxy still importing and starting its driver)
s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
s.bind(sys.argv[3] + ".%d.ctl" % __import__("os").getpid())
s.listen(1)
sys.stdin.readline()
"""


def test_a_command_that_comes_while_the_proxy_starts_waits_for_it(tmp_path: Path) -> None:
    """nvproxy run starts the program while its proxy starts, so a checkpoint or migration may come first: the
    proxy the command finds (a stand-in, with a proxy's command line, that makes its control socket only after a
    while) is handed over once it has its control socket, not before."""
    sock = str(tmp_path / f"p{os.getpid()}-1.sock")
    proxy = subprocess.Popen([sys.executable, "-c", STARTING_PROXY, "proxy", "--socket", sock, "--owner-pid",
                              str(os.getpid())], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    assert proxy.stdin is not None and proxy.stdout is not None
    try:
        assert proxy.stdout.readline() == "running\n"
        pid, found = find_proxy(os.getpid())
        assert (pid, found) == (proxy.pid, sock)
        assert os.path.exists(f"{sock}.{pid}.ctl"), "found before its control socket was made"
    finally:
        proxy.stdin.close()
        proxy.wait(timeout=60)


def test_a_restore_waits_for_a_proxy_still_writing_its_image(tmp_path: Path) -> None:
    """A restoring proxy begins only once no live process writes its image (a temporary file that names the
    writer, as checkpoint/image.py atomic_file makes it), saying so in one line; a writer's file left by a process
    that has ended is no reason to wait."""
    image = tmp_path / "app.img"
    writer = subprocess.Popen([sys.executable, "-c", "import sys; sys.stdin.read()"], stdin=subprocess.PIPE)
    ended = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    (tmp_path / f".app.img.{ended.stdout.strip()}.x.tmp").touch()  # (a writer killed mid-write left it)
    code = ("import sys; sys.path.append(sys.argv.pop(1)); from nvproxy import boot; "
            "boot.wait_for_writers(sys.argv[1]); print('began')")
    alone = subprocess.run([sys.executable, "-S", "-c", code, boot.root(), str(image)], capture_output=True,
                           text=True, timeout=60)
    assert alone.returncode == 0 and alone.stdout == "began\n" and alone.stderr == "", alone.stderr
    (tmp_path / f".app.img.{writer.pid}.y.tmp").touch()
    waits = subprocess.Popen([sys.executable, "-S", "-c", code, boot.root(), str(image)], stdout=subprocess.PIPE,
                             stderr=subprocess.PIPE, text=True)
    try:
        assert waits.stderr is not None
        said = waits.stderr.readline()
        assert said == f"nvproxy: waiting for proxy {writer.pid} to finish writing {image}\n", said
        assert waits.poll() is None
    finally:
        writer.communicate(b"")  # (the writer ends)
    out, err = waits.communicate(timeout=60)
    assert waits.returncode == 0 and out == "began\n" and err == "", err
