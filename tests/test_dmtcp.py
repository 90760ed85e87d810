"""DMTCP: a program launched with `nvproxy run --dmtcp`, checkpointed with
dmtcp_command, killed and restarted with dmtcp_restart, prints after the
restart exactly what an uninterrupted run prints from that step on.

DMTCP is in no package registry: these tests run where dmtcp_launch is on PATH
or under $NVPROXY_DMTCP_DIR/bin, and are skipped (with that reason) elsewhere."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
from conftest import EXPECTED, MISREPORT, gpu_count, hooked, misreported_assert, nvproxy_cmd, run

BACKENDS = ["sim", pytest.param("gpu", marks=pytest.mark.gpu)]


def dmtcp_bin() -> Path:
    base = os.environ.get("NVPROXY_DMTCP_DIR")
    if base and (Path(base) / "bin" / "dmtcp_launch").exists():
        return Path(base) / "bin"
    found = shutil.which("dmtcp_launch")
    if not found:
        pytest.skip("DMTCP is not installed (no dmtcp_launch on PATH or in $NVPROXY_DMTCP_DIR/bin)")
    return Path(found).parent


class CallNotReached(AssertionError):
    """The program ended before the call chosen for its checkpoint; calls: how many each process made."""

    def __init__(self, message: str, calls: list[int]) -> None:
        super().__init__(message)
        self.calls = calls


class Session:
    """A private DMTCP coordinator and checkpoint directory for one test."""

    def __init__(self, tmp_path: Path, cwd: Path | None = None) -> None:
        self.bin = dmtcp_bin()
        self.dir = tmp_path
        self.cwd = cwd or tmp_path  # the program's
        tmp_path.mkdir(exist_ok=True)
        # (the test hooks: a checkpoint at a chosen call; and a restarted program that crashes prints its frames
        # into the failure's message)
        self.env = hooked(dict(os.environ, PATH=f"{self.bin}:{os.environ['PATH']}"))
        port_file = tmp_path / "port"
        self._coordinator("--coord-port", "0", "--port-file", str(port_file))
        for _ in range(100):
            if port_file.exists() and port_file.read_text().strip():
                break
            time.sleep(0.05)
        self.port = port_file.read_text().strip()
        self.out = tmp_path / "out.txt"  # a file: DMTCP restores it, a pipe it would not

    def _coordinator(self, *args: str) -> None:
        # (a restart's coordinator takes the port of the one before, which exits once its last process has gone:
        # on a busy machine that can take a moment, and the new one exits 99 meanwhile)
        deadline = time.monotonic() + 15
        while True:
            r = subprocess.run([str(self.bin / "dmtcp_coordinator"), "--daemon", "--exit-on-last", "--ckptdir",
                                str(self.dir), *args], env=self.env, capture_output=True)
            if r.returncode == 0 or time.monotonic() > deadline:
                r.check_returncode()
                return
            time.sleep(0.2)

    def launch(self, cmd: list[str], **env: str) -> subprocess.Popen:
        cmd = list(cmd)
        cmd[cmd.index("--"):cmd.index("--")] = ["--dmtcp-args",
                                                f"--coord-port {self.port} --no-gzip --ckptdir {self.dir}"]
        return subprocess.Popen(cmd, stdout=open(self.out, "w"), stderr=subprocess.PIPE, text=True,
                                env=dict(self.env, **env), cwd=self.cwd)

    def checkpoint_at_call(self, cmd: list[str], call: int, **env: str) -> None:
        """Run cmd until its call-th CUDA call, where it waits (NVPROXY_CHECKPOINT_AT); checkpoint it there with
        dmtcp_command -c, then kill it.  (At the first call a program of one thread has no GPU state yet: the
        plugin writes no image.)"""
        made = self.dir / "calls-made.txt"
        app = self.launch(cmd, NVPROXY_CHECKPOINT_AT=str(call), NVPROXY_CALLS_OUT=str(made), **env)
        command = [str(self.bin / "dmtcp_command"), "--coord-port", self.port]
        ended = False
        try:
            deadline = time.monotonic() + 60
            while len(list(self.dir.glob("nvproxy-call-reached-*"))) < int(env.get("NVPROXY_CHECKPOINT_WAITERS", 1)):
                if app.poll() is not None:
                    ended = True
                    calls = [int(n) for n in made.read_text().split()] if made.exists() else []
                    raise CallNotReached(f"the program ended before its call {call}: {app.communicate()[1]}", calls)
                assert time.monotonic() < deadline, f"call {call} never came"
                time.sleep(0.02)
            subprocess.run([*command, "-c"], env=self.env, capture_output=True, timeout=60, check=True)
            while not list(self.dir.glob("ckpt_*.dmtcp")):
                assert time.monotonic() < deadline, "no checkpoint"
                time.sleep(0.05)
            while "RUNNING=yes" not in subprocess.run([*command, "-s"], capture_output=True, text=True,
                                                      env=self.env, timeout=30).stdout:
                assert time.monotonic() < deadline, "the checkpoint did not finish"
                time.sleep(0.05)
        finally:
            if not ended:
                self._kill(app, command, gpu_image=True if call > 1 else None)

    def _kill(self, app: subprocess.Popen, command: list[str], gpu_image: bool | None = True) -> None:
        """dmtcp_command -k, and the program must be gone; DMTCP's and the plugin's images must be there."""
        try:
            subprocess.run([*command, "-k"], env=self.env, capture_output=True, timeout=60)
            app.wait(timeout=120)
        finally:
            if app.poll() is None:
                app.kill()
        if not list(self.dir.glob("ckpt_*.dmtcp")):
            err = app.stderr.read() if app.stderr and not app.stderr.closed else ""
            raise AssertionError(f"DMTCP wrote no image; the program's stderr (exit status {app.returncode}):\n{err}")
        if gpu_image is not None:
            assert bool(list(self.dir.glob("nvproxy-*.img"))) == gpu_image, "the plugin's GPU image beside DMTCP's"

    def wait_for(self, app: subprocess.Popen, text: str, timeout: float = 60) -> None:
        deadline = time.monotonic() + timeout
        while text not in self.out.read_text():
            assert app.poll() is None and time.monotonic() < deadline, f"never printed {text!r}"
            time.sleep(0.02)

    def checkpoint_and_kill(self, app: subprocess.Popen, kill_command: bool = False) -> None:
        """nvproxy checkpoint --dmtcp then dmtcp_command -k, or dmtcp_command -kc (checkpoint, then kill)."""
        command = [str(self.bin / "dmtcp_command"), "--coord-port", self.port]
        said = ""
        try:
            if kill_command:
                # (-kc of a computation not RUNNING, e.g. one still starting, does nothing, and still prints that
                # it "was checkpointed and killed")
                status = self.wait_running(command)
                ck = subprocess.run([*command, "-kc"], env=self.env, capture_output=True, text=True, timeout=300)
                ck.stdout += f"\n(before: {status})"
                # (-kc returns as the checkpoint begins; the program exits once its image is written: a -k before
                # that killed it mid-checkpoint, once the drain took seconds)
                try:
                    app.wait(timeout=300)
                except subprocess.TimeoutExpired:
                    pass
            else:
                ck = subprocess.run([sys.executable, "-m", "nvproxy", "checkpoint", "--dmtcp", "--coord-port",
                                     self.port], env=self.env, capture_output=True, text=True, timeout=300)
            # (dmtcp_command -kc of DMTCP 4.2 exits 2 once the killed computation's coordinator is gone)
            said = ck.stdout + ck.stderr
            assert ck.returncode == 0 or "checkpointed and killed" in ck.stdout, said
        finally:
            try:
                self._kill(app, command)  # (after -kc: nothing left to kill, the images are checked)
            except AssertionError as e:
                raise AssertionError(f"{e}\nthe checkpoint command said: {said}\n"
                                     f"the program's exit status: {app.returncode}") from None

    def wait_running(self, command: list[str], timeout: float = 30) -> str:
        """dmtcp_command -s until the computation is RUNNING; returns the last status."""
        deadline = time.monotonic() + timeout
        while True:
            out = subprocess.run([*command, "-s"], capture_output=True, text=True, env=self.env, timeout=30).stdout
            if "RUNNING=yes" in out or time.monotonic() > deadline:
                return " ".join(out.split())

    def restart(self, *extra: str) -> subprocess.CompletedProcess:
        self._coordinator("--coord-port", self.port)
        return subprocess.run([sys.executable, "-m", "nvproxy", "restart", str(self.dir), "--coord-port", self.port,
                               *extra], capture_output=True, text=True, env=self.env, timeout=300)


def checkpoint_kill_restart(session: Session, cmd: list[str], reference: list[str], after: str
                            ) -> subprocess.CompletedProcess:
    """Launch cmd under DMTCP, checkpoint it once it has printed `after`, kill it and restart it: the restarted
    program prints the rest of an uninterrupted run's output (reference, by lines) and ends well.  The restart."""
    app = session.launch(cmd)
    session.wait_for(app, after)
    session.checkpoint_and_kill(app)
    r = session.restart()
    _after_restart(reference, r)
    assert r.returncode == 0, r.stderr
    return r


def _after_restart(reference: list[str], r: subprocess.CompletedProcess) -> None:
    """A restarted program printed the rest of an uninterrupted run, from some line on."""
    after = r.stdout.splitlines(keepends=True)
    assert after, r.stderr
    first = reference.index(after[0]) if after[0] in reference else -1
    assert first >= 0 and after == reference[first:], r.stderr


def calls_made(cmd: list[str], tmp_path: Path, cwd: Path | None = None) -> tuple[list[int], str]:
    """How many CUDA calls each process of cmd makes (NVPROXY_CALLS_OUT; in the order they ended), and what it
    prints."""
    count = tmp_path / "calls.txt"
    r = run(cmd, timeout=300, cwd=cwd, env=hooked(NVPROXY_CALLS_OUT=str(count)))
    assert r.returncode == 0 and count.exists(), r.stdout + r.stderr
    return [int(n) for n in count.read_text().split()], r.stdout


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("pause_ms", ["150", "0"], ids=["pausing", "busy"])
def test_dmtcp_checkpoint_kill_restart(build, backend: str, pause_ms: str, tmp_path: Path) -> None:
    """busy: the program calls CUDA without pause, so its threads call in while the restart brings
    up the new proxy (that once deadlocked the restart, in DMTCP's fork)."""
    session = Session(tmp_path)
    exe = build("ckpt_steps")
    steps = "40" if pause_ms != "0" else ("400" if backend == "sim" else "4000")
    reference = run(nvproxy_cmd(exe, backend, "ckpt_steps", steps, "0")).stdout.splitlines(keepends=True)
    r = checkpoint_kill_restart(session, nvproxy_cmd(exe, backend, "ckpt_steps", steps, pause_ms), reference,
                                "step 3:" if pause_ms != "0" else "step 20:")
    assert "restoring the GPU state" in r.stderr


@pytest.mark.parametrize("backend", BACKENDS)
def test_dmtcp_restarted_program_grows_its_heap(build, backend: str, tmp_path: Path) -> None:
    """After a restart the program's C heap grows through the program break (malloc, larger at each step), and
    glibc's program break is the kernel's, not the restart program's: where that lay above glibc's, glibc's next
    sbrk() "succeeded" into DMTCP's guard area after the heap, and the program (a PyTorch run too) died in malloc."""
    session = Session(tmp_path)
    exe = build("heap_after_restart", "-Xcompiler", "-fno-pie", "-Xlinker", "-no-pie")  # (low in memory, as python3)
    reference = run(nvproxy_cmd(exe, backend, "heap_after_restart", "12")).stdout.splitlines(keepends=True)
    assert len(reference) == 13 and all("as the kernel's" in line for line in reference[:-1]), reference
    checkpoint_kill_restart(session, nvproxy_cmd(exe, backend, "heap_after_restart", "12", "150"), reference,
                            "step 3:")


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize(("name", "args", "after"), [("graphs", ("8",), "run 2:"), ("graph_nodes", ("8",), "run 2:"),
                                                     ("managed", ("12",), "step 4:"), ("textures", ("8",), "step 2:"),
                                                     ("graph_cond", ("6",), "run 2:"),
                                                     ("graph_capture", ("6",), "run 2:"),
                                                     ("managed_vars", ("6",), "run 2:")],
                         ids=["graphs", "graph_nodes", "managed", "textures", "graph_cond", "graph_capture",
                              "managed_vars"])
def test_dmtcp_restart_keeps_features(build, backend: str, name: str, args: tuple[str, ...], after: str,
                                      tmp_path: Path) -> None:
    """Graphs (captured; built node by node, updated, cloned), managed memory, CUDA arrays and texture/surface
    objects come back from DMTCP's restart path (the image read from a file, graphs made once the program shared
    its pinned memory again), host nodes call back, and the program goes on printing what an uninterrupted run
    prints.  graph_nodes holds two pinned
    buffers: DMTCP once restored both from one file (their memfds had the same name)."""
    session = Session(tmp_path)
    exe = build(name)
    reference = run(nvproxy_cmd(exe, backend, name, *args)).stdout.splitlines(keepends=True)
    app = session.launch(nvproxy_cmd(exe, backend, name, *args))
    session.wait_for(app, after)
    session.checkpoint_and_kill(app)
    r = session.restart()
    after_lines = r.stdout.splitlines(keepends=True)  # (what the program printed from the checkpoint on)
    assert after_lines and after_lines[0] in reference, r.stderr
    assert after_lines == reference[reference.index(after_lines[0]) :] and r.returncode == 0, r.stderr


@pytest.mark.parametrize("backend", BACKENDS)
def test_dmtcp_restarts_processes_sharing_device_memory(build, backend: str, tmp_path: Path) -> None:
    """CUDA IPC under DMTCP: the parent exported memory, a pool allocation and an event; the child (each has its
    own proxy) opened them and is checkpointed with the parent while it holds them.  At the restart the parent's
    new proxy makes them again under the same name and the child's opens them again at the same addresses
    (waiting for the parent's); both go on as an uninterrupted run.  (All processes' device work ends before any
    image is written: the child's kernels write the parent's memory.)"""
    session = Session(tmp_path)
    exe = build("ipc")
    strip = lambda lines: [ln for ln in lines if not ln.startswith("child: waiting")]  # noqa: E731
    reference = strip(run(nvproxy_cmd(exe, backend, "ipc", "child-wait")).stdout.splitlines(keepends=True))
    app = session.launch(nvproxy_cmd(exe, backend, "ipc", "child-wait", "8"))
    session.wait_for(app, "child: waiting")
    session.checkpoint_and_kill(app)
    assert len(list(tmp_path.glob("nvproxy-*.img"))) == 2, "a GPU image per process"
    r = session.restart()
    after = strip(r.stdout.splitlines(keepends=True))
    assert after and after[0] in reference, r.stderr
    assert after == reference[reference.index(after[0]) :] and r.returncode == 0, r.stderr
    assert after[-1] == "Test PASSED\n", r.stderr


@pytest.mark.parametrize("backend", BACKENDS)
def test_dmtcp_restarts_parent_and_child_at_a_childs_call(build, backend: str, tmp_path: Path) -> None:
    """Two processes that share device memory and an interprocess event (tests/apps/ipc_order), checkpointed
    together in the middle of the child's calls (NVPROXY_CHECKPOINT_IN=child), killed and restarted, print what
    an uninterrupted run prints: both come back, with the memory the child opened from the parent."""
    exe = build("ipc_order")
    cmd = nvproxy_cmd(exe, backend, "ipc_order", "400")
    calls, reference = calls_made(cmd, tmp_path)
    assert len(calls) == 2, calls
    session = Session(tmp_path / "dmtcp")
    session.checkpoint_at_call(cmd, calls[0] // 2, NVPROXY_CHECKPOINT_IN="child")
    assert len(list(session.dir.glob("ckpt_*.dmtcp"))) == 2, "both processes in the checkpoint"
    r = session.restart()
    assert r.returncode == 0, r.stderr
    assert session.out.read_text() + r.stdout == reference, r.stderr


@pytest.mark.parametrize("backend", BACKENDS)
def test_dmtcp_keeps_the_programs_shared_memory(build, backend: str, tmp_path: Path) -> None:
    """A program's own POSIX shared-memory segment, made after its first CUDA call, is mapped with its contents
    when the program resumes after a checkpoint and after a restart (DMTCP once reused the number of the shim's
    closed socket for it, and died remapping it at resume: NVIDIA's simpleIPC)."""
    exe = build("shm_segment")
    cmd = nvproxy_cmd(exe, backend, "shm_segment")
    (calls,), reference = calls_made(cmd, tmp_path)
    session = Session(tmp_path / "dmtcp")
    session.checkpoint_at_call(cmd, calls // 2)
    r = session.restart()
    assert r.returncode == 0, r.stderr
    assert session.out.read_text() + r.stdout == reference, r.stderr


@pytest.mark.parametrize("backend", BACKENDS)
def test_dmtcp_checkpoint_waits_for_a_pinned_allocation(build, backend: str, tmp_path: Path) -> None:
    """A checkpoint while another thread is inside cudaHostAlloc, held there (NVPROXY_TEST_PAUSE_MS) after the
    proxy registered the memory and before the shim listed it, waits for that call: the restart shares the memory
    with the new proxy again.  (It came in between: the restart did not share it, and cudaFreeHost failed with
    cudaErrorHostMemoryNotRegistered, seen with callback_threads checkpointed at its call 27 on the GPU.)"""
    exe = build("pinned_at_checkpoint")
    cmd = nvproxy_cmd(exe, backend, "pinned_at_checkpoint")
    reference = run(cmd)
    assert reference.returncode == 0, reference.stdout + reference.stderr
    session = Session(tmp_path / "dmtcp")
    session.checkpoint_at_call(cmd, 3, NVPROXY_TEST_PAUSE_MS="800")  # (the main thread's call 3 comes at 200 ms)
    r = session.restart()
    assert r.returncode == 0, r.stdout + r.stderr
    assert session.out.read_text() + r.stdout == reference.stdout, r.stderr


@pytest.mark.parametrize("backend", BACKENDS)
def test_dmtcp_restart_gives_pinned_buffers_fresh_descriptors(build, backend: str, tmp_path: Path) -> None:
    """Pinned buffers whose memfd numbers do not rise with their addresses, checkpointed (call 16) and restarted:
    each is put into a fresh memfd, the old numbers (which name nothing after a restart) are never closed, and
    threads' channels opened after the restart survive every cudaFreeHost.  (Closing the old numbers closed
    other buffers' fresh memfds and then threads' channels: callback_threads on a GPU, "lost the proxy (Bad file
    descriptor)".)"""
    exe = build("pinned_fds")
    cmd = nvproxy_cmd(exe, backend, "pinned_fds")
    reference = run(cmd)
    assert reference.returncode == 0, reference.stdout + reference.stderr
    session = Session(tmp_path / "dmtcp")
    session.checkpoint_at_call(cmd, 16)
    r = session.restart()
    assert r.returncode == 0, r.stdout + r.stderr
    assert session.out.read_text() + r.stdout == reference.stdout, r.stderr
    assert "could not" not in r.stderr and "failed" not in r.stderr, r.stderr


@pytest.mark.parametrize("backend", BACKENDS)
def test_dmtcp_image_holds_no_memfd(build, backend: str, tmp_path: Path) -> None:
    """DMTCP brings a shared mapping of a deleted file back through a file it makes at that file's name, for a
    memfd "/memfd:NAME": in "/", which only root may write, so every other user's restart of a program with
    pinned memory ended at once (DMTCP 4.2: "JASSERT(fd != -1 || errno == EEXIST) failed").  Pinned and registered
    memory live in POSIX shared memory (a file of /dev/shm, removed at once), and a checkpoint lets go of the
    channels' memfds (staging buffers, mailboxes): DMTCP's image names no memfd of nvproxy's."""
    exe = build("pinned_fds")
    session = Session(tmp_path / "dmtcp")
    session.checkpoint_at_call(nvproxy_cmd(exe, backend, "pinned_fds"), 16)
    image = next(session.dir.glob("ckpt_*.dmtcp")).read_bytes()
    pinned_in_shm, memfds = b"/dev/shm/nvproxy-pinned-" in image, image.count(b"/memfd:nvproxy-")
    assert pinned_in_shm  # (the pinned buffers, as DMTCP lists their mappings)
    assert memfds == 0


@pytest.mark.parametrize("backend", BACKENDS)
def test_dmtcp_programs_name_their_pinned_memory_apart(build, backend: str, tmp_path: Path) -> None:
    """Two programs under DMTCP (each its own computation, both pid 40000 there) give the memfds behind their
    pinned memory names the other never has: DMTCP brings a memfd's mapping back through a file of its name that
    it makes in "/", and maps such a file as it is where one exists, so two programs restarting at the same time
    shared pinned memory (a restarted program crashed on the other program's pointer)."""
    import re

    exe = build("pinned_fds")
    names: list[set[str]] = []
    for k in range(2):
        session = Session(tmp_path / f"dmtcp{k}")
        app = session.launch(nvproxy_cmd(exe, backend, "pinned_fds"), NVPROXY_CHECKPOINT_AT="16")
        try:
            deadline = time.monotonic() + 60
            while not list(session.dir.glob("nvproxy-call-reached-*")):
                assert app.poll() is None and time.monotonic() < deadline, "call 16 never came"
                time.sleep(0.02)
            maps = Path(f"/proc/{app.pid}/maps").read_text()
            names.append(set(re.findall(r"/(?:memfd:|dev/shm/)(nvproxy-pinned-\S+)", maps)))
        finally:
            app.kill()
            app.wait(timeout=60)
    assert names[0] and names[1], names
    assert not names[0] & names[1], names


@pytest.mark.parametrize("backend", BACKENDS)
def test_dmtcp_checkpoint_lets_go_of_staging_buffers(build, backend: str, tmp_path: Path) -> None:
    """The plugin drops every thread's staging buffer at a checkpoint (DMTCP would save them) and the proxy lets
    go of its side with the device idle: a program that goes on after checkpoints holds at most as many as its
    threads use, not as many more each checkpoint, and prints what it prints without them."""
    from test_checkpoint import staging_buffers

    from nvproxy.launcher import find_proxy

    exe = build("thread_churn")
    session = Session(tmp_path / "dmtcp")
    app = session.launch(nvproxy_cmd(exe, backend, "thread_churn", "4", str(tmp_path)))
    held = []
    try:
        for r in range(4):
            (tmp_path / f"go-{r}").touch()
            session.wait_for(app, f"round {r}:")
            held.append(staging_buffers(find_proxy(app.pid)[0]))
            if r == 1:
                time.sleep(0.5)  # (the proxy sees the round's channels close)
                c = subprocess.run([sys.executable, "-m", "nvproxy", "checkpoint", "--dmtcp", "--coord-port",
                                    session.port], env=session.env, capture_output=True, text=True, timeout=300)
                assert c.returncode == 0, c.stdout + c.stderr
                held.append(staging_buffers(find_proxy(app.pid)[0]))
        (tmp_path / "go-end").touch()
        _out, err = app.communicate(timeout=120)
    finally:
        if app.poll() is None:
            app.kill()
    # the main thread's (until the checkpoint) and one to three of the workers' (one may take the buffer of one
    # that ended in the same round); none right after the checkpoint
    assert held[2] == 0 and all(1 <= n <= 4 for n in held[:2] + held[3:]), (held, session.out.read_text() + err)
    assert session.out.read_text() == (EXPECTED / "sim" / "thread_churn.txt").read_text(), err
    assert app.returncode == 0, err


@pytest.mark.parametrize("backend", BACKENDS)
def test_dmtcp_checkpoint_at_a_call(build, backend: str, tmp_path: Path) -> None:
    """A program checkpointed at a chosen call (half of the CUDA calls it makes; NVPROXY_CHECKPOINT_AT), killed
    and restarted prints what an uninterrupted run prints: deterministic, even for a program that runs for
    milliseconds."""
    exe = build("graph_capture")
    (calls,), reference = calls_made(nvproxy_cmd(exe, backend, "graph_capture"), tmp_path)
    session = Session(tmp_path / "dmtcp")
    session.checkpoint_at_call(nvproxy_cmd(exe, backend, "graph_capture"), calls // 2)
    r = session.restart()
    assert r.returncode == 0, r.stderr
    assert session.out.read_text() + r.stdout == reference, r.stderr
    assert "restoring the GPU state" in r.stderr


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("app", ["vector_add", "printf_assert", "printf_assert-assert", "callback_threads"])
def test_dmtcp_checkpoint_at_every_call(build, backend: str, app: str, tmp_path: Path) -> None:
    """Small programs checkpointed at each of their CUDA calls in turn, killed and restarted, print what an
    uninterrupted run prints: also at a staged cudaMemcpy (which holds checkpoints off until it is done: the
    self-checkpoint once deadlocked there), with kernel printf output that the checkpoint's drain brought out
    before the program's cudaDeviceSynchronize returned (the image carries it; it was once lost), and with host
    callbacks that start threads (callback_threads: the drain once waited for them for ever; and a thread's last
    request, a callback, was dropped when the thread ended before earlier requests of others ran), and after a device
    assert broke the context (the image keeps the error: NVIDIA's simpleAssert once left no image)."""
    name, *args = app.split("-")
    exe = build(name)
    cmd = nvproxy_cmd(exe, backend, name, *args)
    (calls,), reference = calls_made(cmd, tmp_path)
    if misreported_assert(reference, reference.replace(*MISREPORT[0])):
        (calls,), reference = calls_made(cmd, tmp_path)
    assert calls >= 5
    for call in range(1, calls + 1):
        for attempt in range(2):
            session = Session(tmp_path / f"at-{call}-{attempt}")
            session.checkpoint_at_call(cmd, call)
            r = session.restart()
            if attempt or not misreported_assert(session.out.read_text() + r.stdout, reference):
                break
        assert r.returncode == 0, f"checkpointed at call {call} of {calls}: {r.stderr}"
        assert session.out.read_text() + r.stdout == reference, f"checkpointed at call {call} of {calls}: {r.stderr}"


WRITER_GATE = Path(__file__).resolve().parent / "hooks" / "writer_gate"


def _gated(gate: Path, **env: str) -> dict[str, str]:
    """The settings of a program whose proxies write no image file until gate exists (hooks/writer_gate); one
    writer that waits there says so by making gate.waiting."""
    path = os.pathsep.join(filter(None, [str(WRITER_GATE), os.environ.get("PYTHONPATH", "")]))
    return {"PYTHONPATH": path, "NVPROXY_TEST_WRITER_GATE": str(gate), **env}


def _until(what: str, done, timeout: float = 120) -> None:  # noqa: ANN001
    deadline = time.monotonic() + timeout
    while not done():
        assert time.monotonic() < deadline, f"never: {what}"
        time.sleep(0.02)


def _steps(session: Session) -> int:
    return session.out.read_text().count("step ")


def _gpu_image_stamp(session: Session) -> tuple[int, int] | None:
    found = sorted(session.dir.glob("nvproxy-*.img"))
    return (found[0].stat().st_ino, found[0].stat().st_mtime_ns) if found else None


def _write_mode_checkpoint(session: Session, command: list[str]) -> None:
    """dmtcp_command -bc of a program with NVPROXY_DMTCP_OVERLAP=write, until it runs again with a new GPU image
    (DMTCP 4.2's -bc may return before the checkpoint has begun)."""
    before = _gpu_image_stamp(session)
    session.wait_running(command)
    subprocess.run([*command, "-bc"], env=session.env, capture_output=True, timeout=120, check=True)
    _until("a new GPU image", lambda: _gpu_image_stamp(session) not in (None, before))
    _until("the program's resumption", lambda: "RUNNING=yes" in session.wait_running(command, 0))


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("how", ["overlap", "concurrent", "no-overlap", "write"])
def test_dmtcp_gpu_image_beside_dmtcps_own(build, backend: str, how: str, tmp_path: Path) -> None:
    """When a DMTCP checkpoint's GPU image is written, seen with the proxy's writer held at a gate:
    - overlap (nvproxy checkpoint --dmtcp): DMTCP's image is written and the program goes on while the GPU image
      waits, and the command waits for it; the same with --concurrent, where the program's device memory is copied
      out after it goes on too (its kernels change that memory meanwhile: the image must hold the checkpoint's);
    - no-overlap: the GPU image comes first: no DMTCP image, and the program stays stopped, while it waits;
    - write (NVPROXY_DMTCP_OVERLAP=write, a checkpoint of dmtcp_command): DMTCP's image is written and the command
      returns, but the program stays stopped until the GPU image is written.
    Then a second checkpoint, a kill, and the restart goes on where the second was taken."""
    session = Session(tmp_path / "dmtcp")
    exe = build("ckpt_steps")
    reference = run(nvproxy_cmd(exe, backend, "ckpt_steps", "60", "0")).stdout.splitlines(keepends=True)
    gate = tmp_path / "gate"
    env = _gated(gate, **({"NVPROXY_DMTCP_OVERLAP": "write"} if how == "write" else {}))
    app = session.launch(nvproxy_cmd(exe, backend, "ckpt_steps", "60", "150"), **env)
    command = [str(session.bin / "dmtcp_command"), "--coord-port", session.port]
    checkpoint = [sys.executable, "-m", "nvproxy", "checkpoint", "--dmtcp", "--coord-port", session.port,
                  *{"no-overlap": ["--no-overlap"], "concurrent": ["--concurrent"]}.get(how, [])]
    images = session.dir.glob
    try:
        session.wait_for(app, "step 3:")
        if how == "write":
            session.wait_running(command)
            subprocess.run([*command, "-bc"], env=session.env, capture_output=True, timeout=120, check=True)
            _until("the proxy's writer at the gate", Path(f"{gate}.waiting").exists)
            _until("DMTCP's image", lambda: bool(list(images("ckpt_*.dmtcp"))))
            assert "RUNNING=no" in session.wait_running(command, 0)
        else:
            ck = subprocess.Popen(checkpoint, env=session.env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                  text=True)
            _until("the proxy's writer at the gate", Path(f"{gate}.waiting").exists)
            if how == "no-overlap":
                assert not list(images("ckpt_*.dmtcp")) and "RUNNING=no" in session.wait_running(command, 0)
            else:
                _until("DMTCP's image", lambda: bool(list(images("ckpt_*.dmtcp"))))
                seen = _steps(session)
                _until("a step of the resumed program", lambda: _steps(session) > seen)
                assert ck.poll() is None, "nvproxy checkpoint --dmtcp returned before the GPU image was written"
        gate.touch()
        if how == "write":
            _until("the program's resumption", lambda: "RUNNING=yes" in session.wait_running(command, 0))
        else:
            out, err = ck.communicate(timeout=300)
            assert ck.returncode == 0 and "GPU image of" in out, out + err
        session.wait_for(app, "step 6:")
        if how == "write":
            _write_mode_checkpoint(session, command)
        else:
            ck = subprocess.run(checkpoint, env=session.env, capture_output=True, text=True, timeout=300)
            assert ck.returncode == 0, ck.stdout + ck.stderr
    finally:
        gate.touch()
        session._kill(app, command)
    r = session.restart()
    _after_restart(reference, r)
    assert "restoring the GPU state" in r.stderr
    first = r.stdout.split()
    assert first[0] != "step" or int(first[1].rstrip(":")) > 6, r.stdout  # (from the second checkpoint on)


def test_dmtcp_checkpoint_after_a_restart_of_a_held_checkpoint(build, tmp_path: Path) -> None:
    """A checkpoint with NVPROXY_DMTCP_OVERLAP=write keeps the proxy's connection until RESUME; DMTCP saves the
    process meanwhile.  Restarted from it, the program takes another checkpoint as if none had been held: no word
    of a lost proxy, and it finishes as an uninterrupted run does."""
    session = Session(tmp_path)
    exe = build("ckpt_steps")
    reference = run(nvproxy_cmd(exe, "sim", "ckpt_steps", "30", "0")).stdout.splitlines(keepends=True)
    app = session.launch(nvproxy_cmd(exe, "sim", "ckpt_steps", "30", "150"), NVPROXY_DMTCP_OVERLAP="write")
    command = [str(session.bin / "dmtcp_command"), "--coord-port", session.port]
    try:
        session.wait_for(app, "step 3:")
        _write_mode_checkpoint(session, command)
    finally:
        session._kill(app, command)
    session._coordinator("--coord-port", session.port)
    restarted = subprocess.Popen([sys.executable, "-m", "nvproxy", "restart", str(session.dir), "--coord-port",
                                  session.port], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                 env=session.env)
    try:
        _until("the restarted program's checkpointable run", lambda: "RUNNING=yes" in session.wait_running(command, 0))
        ck = subprocess.run([sys.executable, "-m", "nvproxy", "checkpoint", "--dmtcp", "--coord-port", session.port],
                            env=session.env, capture_output=True, text=True, timeout=300)
        assert ck.returncode == 0, ck.stdout + ck.stderr
        out, err = restarted.communicate(timeout=300)
    finally:
        if restarted.poll() is None:
            restarted.kill()
    assert restarted.returncode == 0 and "lost the proxy" not in err, err
    _after_restart(reference, subprocess.CompletedProcess([], 0, out, err))


def test_dmtcp_restart_waits_for_a_proxy_still_writing(build, tmp_path: Path) -> None:
    """dmtcp_command -kc of a program whose GPU image is written after DMTCP's (NVPROXY_DMTCP_OVERLAP=resume): the
    program exits once DMTCP's image is written, its proxy writes on.  A restart begun meanwhile says it waits for
    that proxy, and once the image is written, restores it and goes on where the checkpoint was taken."""
    session = Session(tmp_path / "dmtcp")
    exe = build("ckpt_steps")
    reference = run(nvproxy_cmd(exe, "sim", "ckpt_steps", "30", "0")).stdout.splitlines(keepends=True)
    gate = tmp_path / "gate"
    app = session.launch(nvproxy_cmd(exe, "sim", "ckpt_steps", "30", "150"),
                         **_gated(gate, NVPROXY_DMTCP_OVERLAP="resume"))
    command = [str(session.bin / "dmtcp_command"), "--coord-port", session.port]
    try:
        session.wait_for(app, "step 3:")
        session.wait_running(command)
        subprocess.run([*command, "-kc"], env=session.env, capture_output=True, timeout=120)
        _until("the proxy's writer at the gate", Path(f"{gate}.waiting").exists)
        app.wait(timeout=120)
    finally:
        if app.poll() is None:
            app.kill()
    assert list(session.dir.glob("ckpt_*.dmtcp")) and not list(session.dir.glob("nvproxy-*.img"))
    session._coordinator("--coord-port", session.port)
    restarted = subprocess.Popen([sys.executable, "-m", "nvproxy", "restart", str(session.dir), "--coord-port",
                                  session.port], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                 env=session.env)
    err: list[str] = []
    reader = threading.Thread(target=lambda: err.extend(restarted.stderr), daemon=True)  # type: ignore[arg-type]
    reader.start()
    try:
        _until("the restart's word that it waits", lambda: any("waiting for proxy" in line for line in err))
        gate.touch()
        out = restarted.stdout.read()  # type: ignore[union-attr]
        restarted.wait(timeout=300)
        reader.join(timeout=60)
    finally:
        gate.touch()
        if restarted.poll() is None:
            restarted.kill()
    said = "".join(err)
    assert restarted.returncode == 0, said
    _after_restart(reference, subprocess.CompletedProcess([], 0, out, said))
    assert "restored" in said and "cannot restore" not in said


@pytest.mark.parametrize("damage", ["earlier", "missing", "unwritten"])
def test_dmtcp_restart_refuses_a_gpu_image_of_another_checkpoint(build, damage: str, tmp_path: Path) -> None:
    """A DMTCP image keeps the id of its GPU image: where the file beside it is an earlier checkpoint's (the program
    was ended before a GPU image written after DMTCP's own was done, say), or missing, or where the GPU image of
    that checkpoint could not be written at all (its directory was gone: an earlier checkpoint's image is there
    again by the restart), the restart says so in one line and restores nothing, rather than going on with device
    memory of another moment."""
    session = Session(tmp_path / "dmtcp")
    exe = build("ckpt_steps")
    images = tmp_path / "images"
    images.mkdir()
    app = session.launch(nvproxy_cmd(exe, "sim", "ckpt_steps", "60", "150"), NVPROXY_IMAGE_DIR=str(images))
    command = [str(session.bin / "dmtcp_command"), "--coord-port", session.port]
    checkpoint = [sys.executable, "-m", "nvproxy", "checkpoint", "--dmtcp", "--coord-port", session.port,
                  *(["--no-overlap"] if damage == "unwritten" else [])]
    saved = tmp_path / "earlier.img"
    try:
        session.wait_for(app, "step 3:")
        subprocess.run(checkpoint, env=session.env, capture_output=True, timeout=300, check=True)
        (gpu,) = images.glob("nvproxy-*.img")
        shutil.copyfile(gpu, saved)
        session.wait_for(app, "step 6:")
        if damage == "unwritten":
            images.rename(tmp_path / "away")
        second = subprocess.run(checkpoint, env=session.env, capture_output=True, text=True, timeout=300)
        assert (second.returncode == 0) == (damage != "unwritten"), second.stdout + second.stderr
        if damage == "unwritten":
            (tmp_path / "away").rename(images)
    finally:
        session._kill(app, command, gpu_image=None)
    if damage == "missing":
        gpu.unlink()
    else:
        os.replace(saved, gpu)
    r = session.restart()
    assert r.returncode != 0
    why = {"earlier": "it is the GPU image of another checkpoint", "missing": "it does not exist",
           "unwritten": "this DMTCP checkpoint's GPU image was not written"}[damage]
    said = [line for line in r.stderr.splitlines() if why in line]
    assert len(said) == 1 and f"cannot restore from {gpu}" in said[0] and "cannot be restarted" in said[0], r.stderr
    assert "nvproxy: restored" not in r.stderr
    # (beside it, only the restart's own line before and the consequence for the program's calls after)
    ours = [line for line in r.stderr.splitlines() if line.startswith("nvproxy:")]
    assert len(ours) == 3 and "restoring the GPU state" in ours[0] and "every CUDA call now fails" in ours[2], ours


def test_dmtcp_checkpoint_says_a_gpu_image_was_not_written(build, tmp_path: Path) -> None:
    """nvproxy checkpoint --dmtcp waits for GPU images written after DMTCP's own: one that cannot be written (its
    directory is gone) fails the command in one line naming the process, and the program goes on unharmed."""
    session = Session(tmp_path / "dmtcp")
    exe = build("ckpt_steps")
    reference = run(nvproxy_cmd(exe, "sim", "ckpt_steps", "12", "0")).stdout
    images = tmp_path / "images"
    images.mkdir()
    app = session.launch(nvproxy_cmd(exe, "sim", "ckpt_steps", "12", "150"), NVPROXY_IMAGE_DIR=str(images))
    try:
        session.wait_for(app, "step 3:")
        images.rmdir()
        ck = subprocess.run([sys.executable, "-m", "nvproxy", "checkpoint", "--dmtcp", "--coord-port", session.port],
                            env=session.env, capture_output=True, text=True, timeout=300)
        assert ck.returncode == 1, ck.stdout + ck.stderr
        lines = ck.stderr.splitlines()
        assert len(lines) == 1 and "the GPU image of" in lines[0] and "was not written" in lines[0], ck.stderr
        assert app.wait(timeout=120) == 0
    finally:
        if app.poll() is None:
            app.kill()
    assert session.out.read_text() == reference
    assert "the GPU image of this DMTCP checkpoint was not written" in app.stderr.read()


MATRIX_ARGS = ("-wA=8192", "-hA=8192", "-wB=8192", "-hB=8192")  # 300 products of 8192x8192 matrices: seconds


@pytest.mark.gpu
@pytest.mark.parametrize(("sample", "args", "other_gpu"), [
    ("matrixMul", MATRIX_ARGS, False), ("matrixMul", MATRIX_ARGS, True),
    ("3_CUDA_Features/jacobiCudaGraphs", (), False), ("3_CUDA_Features/graphMemoryNodes", (), False)],
    ids=["same-gpu", "other-gpu", "jacobiCudaGraphs", "graphMemoryNodes"])
def test_dmtcp_public_sample(nvcc: str, tmp_path: Path, sample: str, args: tuple[str, ...], other_gpu: bool) -> None:
    """The acceptance run: NVIDIA's samples, unmodified (built -cudart shared), under nvproxy run --dmtcp,
    checkpointed mid-run with dmtcp_command -kc (which also kills it) and restarted with nvproxy restart
    (dmtcp_restart), on the same GPU or on the other one, print what a native run prints: matrixMul, and two
    that run seconds with CUDA graphs (captured; with memory nodes)."""
    from test_public_samples import build_sample, stable

    if other_gpu and gpu_count() < 2:
        pytest.skip("needs two GPUs (nvidia-smi -L lists fewer)")
    exe = build_sample(nvcc, tmp_path, sample)
    session = Session(tmp_path)
    t = time.monotonic()
    native = run([str(exe), *args], cwd=tmp_path)
    native_s = time.monotonic() - t
    assert native.returncode == 0, native.stdout
    app = session.launch([sys.executable, "-m", "nvproxy", "run", "--backend", "gpu", "--", str(exe), *args])
    # its stdout is a file, so the sample's printf output waits in its stdio buffer
    # (DMTCP saves that too): checkpoint by the clock, well before a native run ends
    # (not later: graphMemoryNodes once ended under nvproxy before the -kc that came at 1.0 + 0.4 x)
    time.sleep(0.5 + 0.3 * native_s)
    assert app.poll() is None, f"the program ended before the checkpoint (a native run takes {native_s:.1f} s)"
    session.checkpoint_and_kill(app, kill_command=True)
    r = session.restart(*(["--device", "1"] if other_gpu else []))
    assert r.returncode == 0, r.stderr
    whole = session.out.read_text() + r.stdout
    assert stable(whole, exe.name) == stable(native.stdout, exe.name), r.stderr
    assert "restoring the GPU state" in r.stderr


def _samples() -> list[str]:
    from test_public_samples import NAMES

    return NAMES


TWO_GPU_SAMPLES = ("P2P",)  # (the P2P samples are waived on one GPU; the others run there too)


@pytest.mark.gpu
@pytest.mark.parametrize("sample", _samples())
def test_dmtcp_public_sample_at_a_call(nvcc: str, tmp_path: Path, sample: str) -> None:
    """NVIDIA's samples, unmodified, checkpointed under DMTCP halfway through their CUDA calls
    (NVPROXY_CHECKPOINT_AT: most run for milliseconds, too short to catch by the clock), killed and restarted,
    print what a native run prints.  Also those of several GPUs (simpleMultiGPU, the P2P ones: peer access is
    granted again at the restore) and of several processes (simpleIPC, streamOrderedAllocationIPC: each process
    has its proxy; every process of the computation is checkpointed and restarted, and the memory one exported
    is mapped again by the others' new proxies)."""
    from test_public_samples import build_sample, native_run, stable

    if any(k in sample for k in TWO_GPU_SAMPLES) and gpu_count() < 2:
        pytest.skip("needs two GPUs (nvidia-smi -L lists fewer)")
    exe = build_sample(nvcc, tmp_path, sample)
    native = native_run(exe, tmp_path)
    cmd = [sys.executable, "-m", "nvproxy", "run", "--backend", "gpu", "--", str(exe)]
    calls, _out = calls_made(cmd, tmp_path, cwd=tmp_path)
    # several processes (the parent ends last): in the middle of its children's calls, where all of them run
    # (half the parent's calls came before it started them; late in a child's, its sibling had ended, and DMTCP
    # cannot bring back an exited child its parent still waits for)
    # (all children wait there: DMTCP drops descriptors in flight between processes)
    env = {"NVPROXY_CHECKPOINT_IN": "child", "NVPROXY_CHECKPOINT_WAITERS": str(len(calls) - 1)}
    if len(calls) == 1:
        env = {}

    def midway(calls: list[int]) -> int:
        return max(2, min(calls[:-1] if len(calls) > 1 else calls) // 2)

    call = midway(calls)
    for attempt in range(4):
        # (a count of calls can depend on timing: asyncAPI calls cudaEventQuery until its work is done, and made
        # 288 calls in one run and fewer than 144 in the next: then halfway through that run's count)
        session = Session(tmp_path / f"try-{attempt}", cwd=tmp_path)
        try:
            session.checkpoint_at_call(cmd, call, **env)
            break
        except CallNotReached as e:
            if attempt == 3 or len(e.calls) != len(calls) or midway(e.calls) >= call:
                raise
            call = midway(e.calls)
    r = session.restart()
    assert r.returncode == native.returncode, r.stdout + r.stderr
    whole = session.out.read_text() + r.stdout
    assert stable(whole, exe.name) == stable(native.stdout, exe.name), r.stderr
    assert "restoring the GPU state" in r.stderr


def test_plugin_symbols_are_exported() -> None:
    from nvproxy import shim_path

    syms = subprocess.run(["nm", "-D", "--defined-only", str(shim_path())], capture_output=True, text=True,
                          check=True).stdout
    assert " dmtcp_initialize_plugin" in syms
    # the shim itself needs no DMTCP: its references to DMTCP are weak
    undefined = subprocess.run(["nm", "-D", "--undefined-only", str(shim_path())], capture_output=True,
                               text=True, check=True).stdout
    assert all(line.split()[0] == "w" for line in undefined.splitlines() if "dmtcp_" in line)


if __name__ == "__main__":
    sys.exit(pytest.main([__file__, "-v"]))
