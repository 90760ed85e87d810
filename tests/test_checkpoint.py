"""Checkpoint and migration: a long-running program moved into a new proxy
at random points (and checkpointed while it runs) prints exactly what an
uninterrupted run prints; images are private and verified on restore."""

from __future__ import annotations

import json
import os
import random
import re
import stat
import struct
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
from conftest import APPS, MISREPORT, gpu_count, hooked, misreported_assert, nvproxy_cmd, run
from gated import Gated, kill_and_wait

from nvproxy.checkpoint import earlycheck
from nvproxy.checkpoint.image import ImageError, read_header

BACKENDS = ["sim", pytest.param("gpu", marks=pytest.mark.gpu)]
# (the last action comes at step 25-32: the program must outlast the last migration, and a new proxy on a loaded
# machine can take over a second to map the old one's image buffer)
STEPS = 56
PAUSE_MS = "150"  # a migration (a new Python process) takes a second or two: spread them out


def nvproxy(*args: str) -> subprocess.CompletedProcess:
    return run([sys.executable, "-m", "nvproxy", *args], timeout=300)


def migrate_mid_run(build, backend: str, name: str, args: tuple[str, ...], after: str,
                    reference_args: tuple[str, ...] | None = None, pause_s: float = 0.0) -> None:
    """Run tests/apps/<name>, migrate it once a line starting with `after` came, and compare the whole
    output with an uninterrupted run's (of reference_args, default args).  The program must run on for 3 s or
    more after that line: on a loaded GPU machine a new proxy can take over a second only to map the old one's
    image buffer, and nvproxy migrate fails where the program ends first."""
    exe = build(name)
    reference = run(nvproxy_cmd(exe, backend, name, *(reference_args or args)))
    assert reference.returncode == 0 and "Test PASSED" in reference.stdout, reference.stdout + reference.stderr
    app = subprocess.Popen(nvproxy_cmd(exe, backend, name, *args), stdout=subprocess.PIPE,
                           stderr=subprocess.PIPE, text=True)
    assert app.stdout is not None
    lines: list[str] = []
    while not lines or not lines[-1].startswith(after):
        lines.append(app.stdout.readline())
        assert lines[-1], app.communicate()[1]
    time.sleep(pause_s)
    r = nvproxy("migrate", str(app.pid))
    assert r.returncode == 0, r.stdout + r.stderr
    out, err = app.communicate(timeout=300)
    assert "".join(lines) + out == reference.stdout, err


@pytest.mark.parametrize("backend", BACKENDS)
def test_migrations_mid_run_change_nothing(build, backend: str, tmp_path: Path) -> None:
    exe = build("ckpt_steps")
    reference = run(nvproxy_cmd(exe, backend, "ckpt_steps", str(STEPS), "0"))
    assert reference.returncode == 0 and "event times consistent" in reference.stdout, reference.stdout
    rng = random.Random(int(os.environ.get("NVPROXY_TEST_SEED", "0")) or None)
    app = subprocess.Popen(nvproxy_cmd(exe, backend, "ckpt_steps", str(STEPS), PAUSE_MS), stdout=subprocess.PIPE,
                           stderr=subprocess.PIPE, text=True)
    assert app.stdout is not None
    lines = [app.stdout.readline()]  # the first step ran: the proxy holds state
    points = [rng.randrange(lo, lo + 8) for lo in (1, 13, 25)]  # one in each third of the run
    actions = ["migrate", "checkpoint", "migrate"]
    said = []  # (what each command printed: where the application's stderr lacks a migration's words)
    for point, action in zip(points, actions, strict=True):
        while len(lines) <= point:
            lines.append(app.stdout.readline())
        time.sleep(rng.random() * 0.15)  # anywhere in the step, also inside CUDA calls
        if action == "migrate":
            r = nvproxy("migrate", str(app.pid))
        else:
            image = tmp_path / f"step{point}.img"
            r = nvproxy("checkpoint", str(app.pid), "-o", str(image))
            if r.returncode == 0:
                assert stat.S_IMODE(image.stat().st_mode) == 0o600
                _fd, header = read_header(image)
                os.close(_fd)
                assert header["streams"] and any(rg["kind"] == "var" for rg in header["regions"])
        said.append(f"{action} at step {point}: rc {r.returncode}\n{r.stdout}{r.stderr}")
        if r.returncode != 0:
            app.kill()
            rest, err = app.communicate()
            pytest.fail(f"{action} at step {point} failed: {r.stdout}{r.stderr}\napplication:\n{rest[-2000:]}\n"
                        f"{err[-4000:]}")
    out, err = app.communicate(timeout=300)
    assert "".join(lines) + out == reference.stdout, err
    assert app.returncode == 0, err
    assert err.count("handed over to the new proxy") == 2, err + "\nthe commands printed:\n" + "\n".join(said)


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("app", ["vector_add", "printf_assert", "printf_assert-assert"])
def test_migration_at_every_call(build, backend: str, app: str, tmp_path: Path) -> None:
    """Small programs migrated at each of their CUDA calls in turn (NVPROXY_MIGRATE_AT: inside a staged copy,
    between a kernel's launch and the synchronisation that brings its printf output; after a device assert
    broke the context, whose error the new proxy keeps giving) print what an uninterrupted run prints."""
    name, *args = app.split("-")
    exe = build(name)
    count = tmp_path / "calls"
    reference = run(nvproxy_cmd(exe, backend, name, *args), env=hooked(NVPROXY_CALLS_OUT=str(count)))
    if misreported_assert(reference.stdout, reference.stdout.replace(*MISREPORT[0])):
        reference = run(nvproxy_cmd(exe, backend, name, *args), env=hooked(NVPROXY_CALLS_OUT=str(count)))
    assert reference.returncode == 0 and ("Test PASSED" in reference.stdout or args), reference.stderr
    calls = int(count.read_text())
    assert calls >= 5
    for call in range(1, calls + 1):
        r = run(nvproxy_cmd(exe, backend, name, *args), env=hooked(NVPROXY_MIGRATE_AT=str(call)))
        if misreported_assert(r.stdout, reference.stdout):
            r = run(nvproxy_cmd(exe, backend, name, *args), env=hooked(NVPROXY_MIGRATE_AT=str(call)))
        assert r.returncode == 0 and "the migration failed" not in r.stderr, f"at call {call}: {r.stderr}"
        assert "migrated process" in r.stderr, f"at call {call}: {r.stderr}"
        assert r.stdout == reference.stdout, f"migrated at call {call} of {calls}: {r.stderr}"


def _image_of_ckpt_steps(build, tmp_path: Path) -> Path:
    exe = build("ckpt_steps")
    app = subprocess.Popen(nvproxy_cmd(exe, "sim", "ckpt_steps", "8", "100"), stdout=subprocess.PIPE,
                           stderr=subprocess.PIPE, text=True)
    assert app.stdout is not None
    app.stdout.readline()
    image = tmp_path / "a.img"
    assert nvproxy("checkpoint", str(app.pid), "-o", str(image)).returncode == 0
    app.communicate(timeout=120)
    return image


def _restore_in_new_process(image: Path, read: str, patch: str = "", early: bool = False
                            ) -> subprocess.CompletedProcess:
    """restore_image of image into a fresh sim backend (patch: Python run on it, as `be`, first); prints the
    error it raised and the threads left behind.  early: with an early check of the file, through before the
    restore begins (its count of chunks found right is printed)."""
    code = f"""
import os, sys, threading, time
from nvproxy.backends.sim import SimBackend
from nvproxy.proxy.state import ProcessState
from nvproxy.checkpoint import earlycheck
from nvproxy.checkpoint.restore import restore_image
from nvproxy.checkpoint.image import read_header
fd, h = read_header({str(image)!r}); os.close(fd)
check = earlycheck.start({str(image)!r}, h) if {early} else None
while check is not None and not check.finished:
    time.sleep(0.01)
fds = {{}}
for addr, size in h["host"]:
    m = os.memfd_create("t"); os.ftruncate(m, size); fds[addr] = m
be = SimBackend()
{patch}
try:
    restore_image(ProcessState(be), {str(image)!r}, fds, check=check)
except Exception as e:
    print(type(e).__name__, e)
if check is not None:
    print("checked", len(check.stop()), "of", len(check.chunks))
print("threads", sorted(t.name for t in threading.enumerate() if t.name.startswith("nvproxy")))
"""
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120,
                          env=dict(os.environ, NVPROXY_RESTORE_READ=read))


@pytest.mark.parametrize("read", ["map", "bounce", "early"])
def test_damaged_image_is_refused(build, tmp_path: Path, read: str) -> None:
    """early: the bounce load after an early check of the file, which leaves the damaged chunk to the load."""
    image = _image_of_ckpt_steps(build, tmp_path)
    fd, header = read_header(image)
    os.close(fd)
    region = next(r for r in header["regions"] if r["kind"] == "mem" and r["size"] > 1 << 20)
    with open(image, "r+b") as f:  # flip one byte of device memory
        f.seek(region["offset"] + 12345)
        b = f.read(1)
        f.seek(region["offset"] + 12345)
        f.write(bytes([b[0] ^ 0xFF]))
    r = _restore_in_new_process(image, "bounce" if read == "early" else read, early=read == "early")
    assert "ImageError" in r.stdout and "checksum mismatch" in r.stdout, r.stdout + r.stderr
    if read == "early":
        chunks = len(earlycheck.file_chunks(header))
        assert f"checked {chunks - 1} of {chunks}" in r.stdout, r.stdout


@pytest.mark.parametrize("refusal", ["memory", "model"])
def test_a_refused_restore_stops_the_load_it_began(build, tmp_path: Path, refusal: str) -> None:
    """A file's load starts with the restore, before the devices are checked: a device the image cannot go to
    stops it (no copy, no thread left, the image untouched), with the check's own message."""
    image = _image_of_ckpt_steps(build, tmp_path)
    before = image.read_bytes()
    patch = {"memory": "be.mem_info = lambda dev: (1 << 20, 1 << 30)",
             "model": "ident = be.device_identity\nbe.device_identity = lambda dev: ('another GPU', ident(dev)[1])"}
    r = _restore_in_new_process(image, "bounce", patch[refusal])
    want = {"memory": "device 0 has 1 MiB free; the image needs", "model": "device 0 is a another GPU"}[refusal]
    assert f"ImageError {want}" in r.stdout, r.stdout + r.stderr
    assert "threads []" in r.stdout, r.stdout
    assert image.read_bytes() == before


def test_a_restore_reads_no_device_attributes(build, tmp_path: Path) -> None:
    """Reading a device's attributes is a noticeable part of a restore: a restore checks the name and UUID, sizes
    the arena from the device's memory, and leaves the attributes to whoever asks for them later."""
    image = _image_of_ckpt_steps(build, tmp_path)
    patch = "def no_props(dev):\n    raise RuntimeError('device_props was called')\nbe.device_props = no_props"
    r = _restore_in_new_process(image, "bounce", patch)
    assert "device_props was called" not in r.stdout and "Error" not in r.stdout, r.stdout + r.stderr
    assert "threads []" in r.stdout, r.stdout


def test_image_format_is_checked(tmp_path: Path) -> None:
    bad = tmp_path / "x.img"
    bad.write_bytes(b"not an image" + b"\0" * 100)
    with pytest.raises(ImageError):
        read_header(bad)
    future = tmp_path / "y.img"
    body = json.dumps({"format": 99}).encode()
    future.write_bytes(b"NVPXIMG1" + struct.pack("<QQ", 24, len(body)) + body)
    with pytest.raises(ImageError, match="format 99"):
        read_header(future)


@pytest.mark.parametrize("refusal", ["owner", "writable"])
def test_a_restore_refuses_an_image_others_could_have_written(build, tmp_path: Path, refusal: str) -> None:
    """An image says what the restoring proxy maps and runs: a proxy (as NVPROXY_RECOVER, DMTCP's restart and a
    restore from a file start one) reads only a file of the user's own that no one else may write, and says
    which rule the image broke, once."""
    image = _image_of_ckpt_steps(build, tmp_path)
    if refusal == "owner":
        if os.getuid() != 0:
            pytest.skip("giving a file to another user takes root")
        os.chown(image, 65534, -1)
        want = f"{image} belongs to uid 65534, not to this user (uid 0)"
    else:
        os.chmod(image, 0o646)
        want = f"{image} is writable by others (mode 0646)"
    sock = tmp_path / "p.sock"
    gone = subprocess.Popen(["true"])
    gone.wait()  # (an application that has ended: a proxy that did restore ends at once)
    r = run([sys.executable, "-m", "nvproxy", "proxy", "--backend", "sim", "--socket", str(sock), "--owner-pid",
             str(gone.pid), "--restore", str(image)], timeout=120)
    assert r.returncode == 1, r.stderr
    said = [line for line in r.stderr.splitlines() if str(image) in line]
    assert len(said) == 1 and want in said[0] and "no one else may write" in said[0], r.stderr
    assert not sock.exists()
    with pytest.raises(ImageError, match="no one else may write"):
        read_header(image)


def test_a_restore_refuses_what_is_not_a_file_without_waiting(tmp_path: Path) -> None:
    """A FIFO given as an image is refused at once (opening it for reading would wait for a writer)."""
    fifo = tmp_path / "f.img"
    os.mkfifo(fifo, 0o600)
    with pytest.raises(ImageError, match=f"{fifo} is not a regular file"):
        read_header(fifo)


def test_a_failed_image_write_keeps_the_older_image_and_names_the_users_path(build, tmp_path: Path) -> None:
    """A checkpoint whose file cannot be written (here the proxy may write no file over 1 MiB) says so of the
    path the user gave, leaves the image that was there as it was and no temporary file, and the application
    goes on; the next checkpoint works."""
    import resource

    from nvproxy.launcher import find_proxy

    exe = build("ckpt_steps")
    reference = run(nvproxy_cmd(exe, "sim", "ckpt_steps", "4", "0"))
    where = tmp_path / "images"
    where.mkdir()
    image = where / "a.img"
    with Gated(nvproxy_cmd(exe, "sim", "ckpt_steps", "4", "-1")) as app:
        app.line()
        assert nvproxy("checkpoint", str(app.pid), "-o", str(image)).returncode == 0  # (the buffer has grown)
        before = image.read_bytes()
        pid, _sock = find_proxy(app.pid)
        limits = resource.prlimit(pid, resource.RLIMIT_FSIZE)
        resource.prlimit(pid, resource.RLIMIT_FSIZE, (1 << 20, limits[1]))
        app.go()
        r = nvproxy("checkpoint", str(app.pid), "-o", str(image))
        assert r.returncode == 1, r.stdout + r.stderr
        assert f"cannot write {image}: File too large" in r.stderr and ".tmp" not in r.stderr, r.stderr
        assert os.listdir(where) == ["a.img"] and image.read_bytes() == before
        resource.prlimit(pid, resource.RLIMIT_FSIZE, limits)
        app.go()
        assert nvproxy("checkpoint", str(app.pid), "-o", str(image)).returncode == 0
        assert os.listdir(where) == ["a.img"] and stat.S_IMODE(image.stat().st_mode) == 0o600
        assert image.read_bytes() != before
        out, err = app.finish()
    assert out == reference.stdout, err


def test_an_image_is_written_whole_or_not_at_all(tmp_path: Path) -> None:
    """atomic_file: 0600 whatever the umask; a write that fails midway (any exception) leaves neither the file nor
    its temporary one, and an error of the system names the user's path."""
    from nvproxy.checkpoint.image import WriteError, atomic_file

    target = tmp_path / "x.img"
    old = os.umask(0)
    try:
        atomic_file(target, lambda fd: os.write(fd, b"whole"))
    finally:
        os.umask(old)
    assert target.read_bytes() == b"whole" and stat.S_IMODE(target.stat().st_mode) == 0o600

    def broken(fd: int) -> None:
        os.write(fd, b"part")
        raise RuntimeError("the copy failed")

    with pytest.raises(RuntimeError, match="the copy failed"):
        atomic_file(tmp_path / "y.img", broken)
    assert os.listdir(tmp_path) == ["x.img"]
    with pytest.raises(WriteError) as e:
        atomic_file(tmp_path / "no" / "z.img", lambda fd: None)
    assert str(e.value) == f"cannot write {tmp_path / 'no' / 'z.img'}: No such file or directory"
    (tmp_path / "d.img").mkdir()  # (written whole, then it cannot take the place of a directory)
    with pytest.raises(WriteError) as e:
        atomic_file(tmp_path / "d.img", lambda fd: os.write(fd, b"whole"))
    assert str(e.value) == f"cannot write {tmp_path / 'd.img'}: Is a directory"
    assert sorted(os.listdir(tmp_path)) == ["d.img", "x.img"]


def test_apps_dir_has_the_program() -> None:
    assert (APPS / "ckpt_steps.cu").exists() and (APPS / "ckpt_steps_sim.py").exists()


def _two_devices(backend: str, monkeypatch: Any) -> None:
    """Two GPUs, or two modelled devices on the sim backend (NVPROXY_SIM_DEVICES=2)."""
    if backend == "sim":
        monkeypatch.setenv("NVPROXY_SIM_DEVICES", "2")
    elif gpu_count() < 2:
        pytest.skip("needs two GPUs (nvidia-smi -L lists fewer)")


def _adopting_proxy_of(pid: int) -> int | None:
    """The pid of a proxy that nvproxy migrate started for program pid, if one runs (its first migration: later
    ones find the last one too)."""
    for d in Path("/proc").iterdir():
        try:
            argv = (d / "cmdline").read_bytes().split(b"\0") if d.name.isdigit() else []
        except OSError:
            continue
        if b"--adopt" in argv and b"--owner-pid" in argv and argv[argv.index(b"--owner-pid") + 1] == str(pid).encode():
            return int(d.name)
    return None


def test_migrate_fails_when_the_program_ends_before_the_hand_over(build) -> None:
    """nvproxy migrate says "migrated" only once the new proxy has taken over.  A program that ends while the new
    proxy starts takes its proxy with it, and the migration fails, saying so in one line (the old proxy's end
    alone does not mean a hand-over happened)."""
    exe = build("ckpt_steps")
    app = subprocess.Popen(nvproxy_cmd(exe, "sim", "ckpt_steps", "40", "150"), stdout=subprocess.PIPE,
                           stderr=subprocess.PIPE, text=True)
    assert app.stdout is not None
    app.stdout.readline()  # (the first step ran: the proxy holds state)
    mig = subprocess.Popen([sys.executable, "-m", "nvproxy", "migrate", str(app.pid)], stdout=subprocess.PIPE,
                           stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 60
    while _adopting_proxy_of(app.pid) is None and mig.poll() is None and time.monotonic() < deadline:
        time.sleep(0.002)
    app.kill()  # (before the new proxy, still importing, can reach the old one)
    app.communicate()
    out, err = mig.communicate(timeout=120)
    assert mig.returncode == 1, out + err
    assert "migrated" not in out, out + err
    assert len(err.splitlines()) == 1, err
    assert "before it took over" in err or "before the hand-over" in err, err
    assert f"process {app.pid} has ended" in err, err


@pytest.mark.parametrize("backend", BACKENDS)
def test_migrate_to_another_gpu(build, backend: str, monkeypatch: Any) -> None:
    _two_devices(backend, monkeypatch)
    exe = build("ckpt_steps")
    reference = run(nvproxy_cmd(exe, backend, "ckpt_steps", "20", "0"))
    app = subprocess.Popen(nvproxy_cmd(exe, backend, "ckpt_steps", "20", PAUSE_MS), stdout=subprocess.PIPE,
                           stderr=subprocess.PIPE, text=True)
    assert app.stdout is not None
    lines = [app.stdout.readline() for _ in range(3)]
    r = nvproxy("migrate", str(app.pid), "--device", "1")
    assert r.returncode == 0, r.stdout + r.stderr
    new_pid = int(r.stdout.split()[-1])
    env = Path(f"/proc/{new_pid}/environ").read_bytes().split(b"\0")
    assert b"CUDA_VISIBLE_DEVICES=1" in env
    out, err = app.communicate(timeout=300)
    assert "".join(lines) + out == reference.stdout, err


def recovered(cmd: list[str], env: dict[str, str], image: Path, ready: str, steps: int) -> tuple[str, str]:
    """A gated program under NVPROXY_RECOVER=image (in env): once a line starting with ready has come, `steps` more
    steps, then its proxy is checkpointed to image and killed; the program recovers and finishes.  (out, err)"""
    from nvproxy.launcher import find_proxy

    with Gated(cmd, env) as app:
        while not app.line().startswith(ready):
            pass
        for _ in range(steps):
            app.go()
        assert nvproxy("checkpoint", str(app.pid), "-o", str(image)).returncode == 0
        pid, _sock = find_proxy(app.pid)
        kill_and_wait(pid)
        out, err = app.finish()
    assert "starting a new one from" in err, err
    return out, err


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("steps", [20, 6], ids=["mid-run", "before-first-launch"])
def test_recover_from_image_after_the_proxy_died(build, backend: str, steps: int, tmp_path: Path) -> None:
    """NVPROXY_RECOVER: a new proxy starts from the last image; the program,
    checkpointed while it waited between steps, finishes as if nothing happened.
    With 6 steps the call that finds the proxy gone is the first launch of a
    kernel (`finish`), whose lookup self-deadlocked in the shim once; that variant
    also reads the image through bounce buffers instead of registering its pages, whose sums were all taken
    while the new proxy started (checkpoint/earlycheck.py; on sim nothing else holds the restore back that long)."""
    from conftest import run as plain_run

    exe = build("ckpt_steps")
    reference = plain_run(nvproxy_cmd(exe, backend, "ckpt_steps", str(steps), "0"))
    image = tmp_path / "last.img"
    env = dict(os.environ, NVPROXY_RECOVER=str(image), NVPROXY_RESTORE_READ="map" if steps == 20 else "bounce")
    env.pop("LD_PRELOAD", None)
    # (six steps done; the program waits until the proxy is checkpointed and dead)
    out, err = recovered(nvproxy_cmd(exe, backend, "ckpt_steps", str(steps), "-1"), env, image, "", 5)
    assert out == reference.stdout, err
    if steps == 6 and backend == "sim":
        early = re.search(r"(\d+) of its (\d+) chunks were summed while the proxy started", err)
        assert early and early.group(1) == early.group(2) != "0", err


@pytest.mark.parametrize("backend", BACKENDS)
def test_managed_memory_survives_migration(build, backend: str) -> None:
    """Managed memory lives in shared host memory: a migration mid-run keeps it (and its address)."""
    migrate_mid_run(build, backend, "managed", ("40",), "step 4:")


@pytest.mark.parametrize("mode", ["lazy", "transient"])
def test_buffer_modes_and_migrate_image(build, mode: str, tmp_path: Path) -> None:
    """NVPROXY_CKPT_BUFFER=lazy|transient: checkpoints back to back (the second waits for the first's file)
    and a migration that also writes its image; the program's output is unchanged."""
    exe = build("ckpt_steps")
    reference = run(nvproxy_cmd(exe, "sim", "ckpt_steps", "16", "0"))
    env = dict(os.environ, NVPROXY_CKPT_BUFFER=mode)
    env.pop("LD_PRELOAD", None)
    app = subprocess.Popen(nvproxy_cmd(exe, "sim", "ckpt_steps", "16", "150"), stdout=subprocess.PIPE,
                           stderr=subprocess.PIPE, text=True, env=env)
    assert app.stdout is not None
    lines = [app.stdout.readline() for _ in range(3)]
    first, second = tmp_path / "a.img", tmp_path / "b.img"
    procs = [subprocess.Popen([sys.executable, "-m", "nvproxy", "checkpoint", str(app.pid), "-o", str(p)],
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for p in (first, second)]
    for p in procs:
        out, err = p.communicate(timeout=120)
        assert p.returncode == 0 and "application was stopped" in out, out + err
    migrated = tmp_path / "m.img"
    r = nvproxy("migrate", str(app.pid), "--image", str(migrated))
    assert r.returncode == 0, r.stdout + r.stderr
    for image in (first, second, migrated):
        fd, header = read_header(image)
        os.close(fd)
        assert stat.S_IMODE(image.stat().st_mode) == 0o600 and header["checksum"] == "xxh64"
    out, err = app.communicate(timeout=300)
    assert "".join(lines) + out == reference.stdout, err


@pytest.mark.parametrize("backend", BACKENDS)
def test_stream_attributes_survive_migration(build, backend: str) -> None:
    """Attributes set on a stream (access policy window, synchronisation policy) are set again after a restore."""
    migrate_mid_run(build, backend, "stream_attrs", ("3000",), "set: sync policy", ("0",), pause_s=0.3)


@pytest.mark.parametrize("backend", BACKENDS)
def test_graphs_survive_migration(build, backend: str) -> None:
    """A graph made by stream capture (kernels on two streams, a copy, a host function) is captured again
    from the proxy's log in the new proxy, and launching it goes on giving the same results."""
    migrate_mid_run(build, backend, "graphs", ("24",), "run 2:")


@pytest.mark.parametrize("backend", BACKENDS)
def test_node_built_graphs_survive_migration(build, backend: str) -> None:
    """Graphs built node by node (copies, memset, kernels, a host node, an updated kernel node, a clone) are
    built again in the new proxy from their recorded node additions, and launches go on as before."""
    migrate_mid_run(build, backend, "graph_nodes", ("24",), "run 2:")


@pytest.mark.parametrize("backend", BACKENDS)
def test_conditional_graphs_survive_migration(build, backend: str) -> None:
    """Conditional nodes (if/else, while, switch) and their body graphs are made again, with conditional
    handles of the same values (the kernels that set the conditions hold them), and loops go on looping."""
    migrate_mid_run(build, backend, "graph_cond", ("24",), "run 2:")


@pytest.mark.parametrize("backend", BACKENDS)
def test_capture_built_graphs_survive_migration(build, backend: str) -> None:
    """Graphs with memory nodes, event and child-graph nodes, a captured cudaMallocAsync/cudaFreeAsync, and a
    conditional node added to a capture's own graph (cudaStreamGetCaptureInfo, UpdateCaptureDependencies) whose
    body was captured into (BeginCaptureToGraph) are made again in the new proxy; memory keeps its addresses."""
    migrate_mid_run(build, backend, "graph_capture", ("24",), "run 2:")


@pytest.mark.parametrize("backend", BACKENDS)
def test_peer_access_survives_migration(build, backend: str, monkeypatch: Any) -> None:
    """Device 1's kernels reach device 0's memory (peer access, a pool's access): the new proxy maps the
    arena's memory for the peer again."""
    _two_devices(backend, monkeypatch)
    migrate_mid_run(build, backend, "p2p", ("24",), "run 2:")


@pytest.mark.parametrize("backend", BACKENDS)
def test_pool_allocations_survive_migration(build, backend: str) -> None:
    """Stream-ordered allocations (a default pool's, held through the run) keep their addresses and contents
    in the new proxy, and the pools go on allocating and freeing."""
    migrate_mid_run(build, backend, "mempool", ("24",), "round 2:")


@pytest.mark.parametrize("backend", BACKENDS)
def test_managed_variables_survive_migration(build, backend: str) -> None:
    """__managed__ variables: the program's copy stays where it is, the new proxy binds the modules' variables
    to it again and kernels go on from the values the program holds."""
    migrate_mid_run(build, backend, "managed_vars", ("24",), "run 2:")


def _ipc_run(exe: Path, backend: str, mode: str, pause_s: str = "3") -> tuple[subprocess.Popen, list[str]]:
    """ipc.cu started in mode, read up to the line where it pauses ("exported" or "child: waiting <pid>")."""
    app = subprocess.Popen(nvproxy_cmd(exe, backend, "ipc", mode, pause_s), stdout=subprocess.PIPE,
                           stderr=subprocess.PIPE, text=True)
    assert app.stdout is not None
    lines: list[str] = []
    while not lines or not lines[-1].startswith(("exported", "child: waiting")):
        lines.append(app.stdout.readline())
        assert lines[-1], app.communicate()[1]
    return app, lines


def _ipc_lines(text: str) -> list[str]:
    return [ln for ln in text.splitlines() if not ln.startswith("child: waiting")]  # (a pid)


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize(("mode", "who"), [("child-wait", "importer"), ("child-wait", "exporter"),
                                           ("wait", "exporter")],
                         ids=["importer-while-open", "exporter-while-open", "exporter-before-open"])
def test_ipc_processes_migrate(build, backend: str, mode: str, who: str) -> None:
    """CUDA IPC, migrated mid-run.  The importer (it opened the other's memory and event): its new proxy gets them
    from the exporter's proxy again, at the same addresses.  The exporter, while the importer has them open: its
    new proxy takes over the very memory (the importer goes on writing it) and the event; before the importer
    opens them: the importer finds the new proxy under the exporter's name.  Either way the programs print what
    an uninterrupted run prints."""
    exe = build("ipc")
    reference = run(nvproxy_cmd(exe, backend, "ipc", mode))
    assert reference.returncode == 0 and "Test PASSED" in reference.stdout, reference.stdout + reference.stderr
    app, lines = _ipc_run(exe, backend, mode)
    r = nvproxy("migrate", lines[-1].split()[-1] if who == "importer" else str(app.pid))
    assert r.returncode == 0, r.stdout + r.stderr
    out, err = app.communicate(timeout=300)
    assert _ipc_lines("".join(lines) + out) == _ipc_lines(reference.stdout), err


@pytest.mark.parametrize("backend", BACKENDS)
def test_exporter_stays_on_its_gpu_while_shared(build, backend: str, monkeypatch: Any, tmp_path: Path) -> None:
    """Memory others opened through CUDA IPC cannot move to another GPU: that migration is refused with the
    reason and the programs go on with the old proxy; a checkpoint image of the exporter is written (a restart
    of both restores it) and the programs go on unharmed."""
    _two_devices(backend, monkeypatch)
    exe = build("ipc")
    reference = run(nvproxy_cmd(exe, backend, "ipc", "child-wait"))
    app, lines = _ipc_run(exe, backend, "child-wait", "4")
    r = nvproxy("migrate", str(app.pid), "--device", "1")
    assert r.returncode != 0 and "cannot move to another GPU" in r.stdout + r.stderr, r.stdout + r.stderr
    r = nvproxy("checkpoint", str(app.pid), "-o", str(tmp_path / "exporter.img"))
    assert r.returncode == 0, r.stdout + r.stderr
    header = read_header(str(tmp_path / "exporter.img"))[1]
    assert header["ipc_exports"] and header["ipc_events"] and header["ipc_name"]
    out, err = app.communicate(timeout=120)
    assert app.returncode == 0 and _ipc_lines("".join(lines) + out) == _ipc_lines(reference.stdout), err


@pytest.mark.parametrize("backend", BACKENDS)
def test_arrays_and_texture_objects_survive_migration(build, backend: str) -> None:
    """CUDA arrays come back with their contents, and texture and surface objects with the values the
    program's kernels hold (one destroyed between others left a gap the restore must keep)."""
    migrate_mid_run(build, backend, "textures", ("24",), "step 2:")


def staging_buffers(proxy_pid: int) -> int:
    """The threads' staging memfds the proxy holds (mapped and registered)."""
    n = 0
    for fd in Path(f"/proc/{proxy_pid}/fd").iterdir():
        try:
            n += "nvproxy-staging" in os.readlink(fd)
        except OSError:
            pass
    return n


@pytest.mark.parametrize("backend", BACKENDS)
def test_staging_buffers_outlive_threads_until_a_checkpoint(build, backend: str, tmp_path: Path) -> None:
    """A thread that ends leaves its staging buffer registered for the next one (unregistering waits for running
    kernels: in the background it once hung a program whose kernel waited for a later call, multithread.cu on two
    GPUs): rounds of three threads keep at most three buffers, not more each round; a checkpoint, with the device
    idle, lets the spare ones go (the main thread keeps its own), and after a migration too the program's output
    is unchanged."""
    from nvproxy.launcher import find_proxy

    exe = build("thread_churn")
    app = subprocess.Popen(nvproxy_cmd(exe, backend, "thread_churn", "4", str(tmp_path)), stdout=subprocess.PIPE,
                           stderr=subprocess.PIPE, text=True)
    assert app.stdout is not None
    try:
        lines, held = [], []
        for r in range(4):
            (tmp_path / f"go-{r}").touch()
            lines.append(app.stdout.readline())
            proxy = find_proxy(app.pid)[0]
            held.append(staging_buffers(proxy))
            if r == 1:
                time.sleep(0.5)  # (the proxy sees the round's channels close: their buffers become spare ones)
                c = nvproxy("checkpoint", str(app.pid), "-o", str(tmp_path / "img"))
                assert c.returncode == 0, c.stdout + c.stderr
                held.append(staging_buffers(proxy))
            if r == 2:  # the shim's spare buffers are the old proxy's: the new one refuses them, fresh ones come
                m = nvproxy("migrate", str(app.pid))
                assert m.returncode == 0, m.stdout + m.stderr
        (tmp_path / "go-end").touch()
        out, err = app.communicate(timeout=120)
    finally:
        if app.poll() is None:
            app.kill()
    # the main thread's and one to three of the workers' (one may take the buffer of one that ended in the same
    # round); after the checkpoint only the main thread's
    assert held[2] == 1 and all(2 <= n <= 4 for n in held[:2] + held[3:]), (held, err)
    assert "".join(lines) + out == (APPS / "expected" / "sim" / "thread_churn.txt").read_text(), err
    assert app.returncode == 0, err


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("when", ["starting", "restoring"])
def test_a_migration_whose_new_proxy_dies_leaves_the_program_on_its_old_proxy(build, backend: str,
                                                                              when: str) -> None:
    """The new proxy is killed (SIGKILL) while it starts, or once it has taken the image: `nvproxy migrate` says
    that it failed, and the program goes on with its old proxy to the uninterrupted output."""
    from nvproxy.launcher import find_proxy

    exe = build("ckpt_steps")
    reference = run(nvproxy_cmd(exe, backend, "ckpt_steps", "12", "0"))
    assert reference.returncode == 0, reference.stdout + reference.stderr
    # (held after its first step until the migration has failed: a loaded machine cannot let it end first)
    app = subprocess.Popen(nvproxy_cmd(exe, backend, "ckpt_steps", "12", "-1"), stdin=subprocess.PIPE,
                           stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    assert app.stdout is not None and app.stdin is not None
    first = app.stdout.readline()
    assert first, app.communicate()[1]
    old_pid, _sock = find_proxy(app.pid)
    migrate = subprocess.Popen([sys.executable, "-m", "nvproxy", "migrate", str(app.pid)], stdout=subprocess.PIPE,
                               stderr=subprocess.PIPE, text=True)
    new = None
    deadline = time.monotonic() + 60
    while new is None and time.monotonic() < deadline and migrate.poll() is None:
        pid = _adopting_proxy_of(app.pid)
        new = Path(f"/proc/{pid}") if pid else None
        time.sleep(0.002)
    killed = None
    # (restoring: once it holds one of the old proxy's sockets, the program's connections, which come with the
    # image: the very same sockets; watched alone, so the kill comes well within the restore.  A count of its
    # sockets is no sign: on the GPU the driver may open some of its own while the proxy starts)
    old_sockets = _sockets(Path(f"/proc/{old_pid}"))
    while new is not None and killed is None and time.monotonic() < deadline and migrate.poll() is None:
        if when == "starting" or _sockets(new) & old_sockets:
            os.kill(int(new.name), 9)
            killed = int(new.name)
    out_m, err_m = migrate.communicate(timeout=120)
    out, err = app.communicate(timeout=300)  # (its end of input: the program goes on)
    assert killed is not None, f"the new proxy was not seen: {err_m}"
    assert migrate.returncode == 1 and "the new proxy failed" in err_m, err_m
    assert app.returncode == 0, err
    assert first + out == reference.stdout, err
    if when == "restoring":  # (killed after the old proxy had handed its state over: it lost the connection)
        assert "nvproxy: control command failed" in err, err


def _sockets(proc: Path) -> set[str]:
    """The sockets the process holds ("socket:[inode]"; none where it is gone)."""
    out = set()
    try:
        for f in (proc / "fd").iterdir():
            try:
                link = os.readlink(f)
            except OSError:
                continue
            if link.startswith("socket:"):
                out.add(link)
    except OSError:
        pass
    return out
