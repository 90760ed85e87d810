"""The stage of the fault suite: programs run through nvproxy's own command line in a runtime directory of their
own (XDG_RUNTIME_DIR), their output watched line by line as it comes, so that a fault strikes at an event (a line,
the Nth request in the shim's trace) and every wait is for an event, with a bound that only a failure reaches.

Every case ends with the four verdicts: a clear error (`clear_error`, `nothing_said`), nothing lost
(`same_output`, `cut_short`, `Snapshot.intact`), no hang (the bounds of `Watched.until` and `Watched.exit`), and
nothing left behind (`Scene.conclude`)."""

from __future__ import annotations

import hashlib
import os
import random
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import pytest
from conftest import _where_they_stand, sim_kernels

from nvproxy.launcher import alive, find_proxy

HANG_S = 2.0  # the most a fault may add to a program's run before the suite calls it a hang
START_S = 60.0  # bound on what comes before any fault (start-up on a loaded machine): reached only by a failure
FAULT_APPS = Path(__file__).resolve().parent / "apps"
# the shim's trace of each request (NVPROXY_TRACE=1) and of host callbacks: not messages to the user
TRACE = re.compile(r"nvproxy: (?:-> op \d+ seq (\d+)(?:\.\.(\d+))?|<- host function|callback channel)")


def seeded(n: int) -> list:
    """n seeds for the cases of one kind of fault, shown in their ids: NVPROXY_TEST_SEED=S makes the first S (a
    failing case's seed: rerun it with -k seedS), else they are new each session."""
    base = int(os.environ.get("NVPROXY_TEST_SEED") or 0) or _SESSION_SEED
    return [pytest.param(base + i, id=f"seed{base + i}") for i in range(n)]


def _session_seed() -> int:
    """New each session, and the same in each of its pytest-xdist workers (each collects the tests itself, and
    they must collect the same ids): from the run's id that xdist gives them all."""
    run = os.environ.get("PYTEST_XDIST_TESTRUNUID")
    if run:
        return int.from_bytes(hashlib.sha256(run.encode()).digest()[:4], "little") % ((1 << 20) - 1) + 1
    return random.SystemRandom().randrange(1, 1 << 20)


_SESSION_SEED = _session_seed()


def cmdline(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")[:160]
    except OSError:
        return "?"


def serving(owners: set[int]) -> set[int]:
    """The processes started to serve one of owners (proxies: `--owner-pid OWNER` on their command line)."""
    found = set()
    for d in Path("/proc").iterdir():
        if not d.name.isdigit():
            continue
        try:
            argv = (d / "cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        if b"--owner-pid" in argv[:-1] and argv[argv.index(b"--owner-pid") + 1] in {str(o).encode() for o in owners}:
            found.add(int(d.name))
    return found


class Watched:
    """A process in a session of its own, its stdout and stderr lines collected as they come (and the highest
    request number of the shim's trace on stderr: seq).  The proxy of a program shares its stderr, so stderr ends
    when the program and every proxy that served it have ended."""

    def __init__(self, argv: list[str], env: dict[str, str], stdin: bool = False) -> None:
        self.argv = [str(a) for a in argv]
        self.p = subprocess.Popen(self.argv, env=env, stdin=subprocess.PIPE if stdin else subprocess.DEVNULL,
                                  stdout=subprocess.PIPE, stderr=subprocess.PIPE, start_new_session=True)
        self.pid = self.p.pid
        self.out: list[str] = []
        self.err: list[str] = []
        self.seq = 0
        self._cond = threading.Condition()
        self._open = {"out": True, "err": True}
        self._feeding = False
        for key, stream, into in (("out", self.p.stdout, self.out), ("err", self.p.stderr, self.err)):
            threading.Thread(target=self._read, args=(key, stream, into), daemon=True).start()

    def _read(self, key: str, stream, into: list[str]) -> None:
        for raw in iter(stream.readline, b""):
            line = raw.decode(errors="replace").rstrip("\n")
            m = TRACE.match(line)
            with self._cond:
                into.append(line)
                if m and m.group(1):
                    self.seq = max(self.seq, int(m.group(2) or m.group(1)))
                if self._feeding and into is self.out:
                    self.say()
                self._cond.notify_all()
        with self._cond:
            self._open[key] = False
            self._cond.notify_all()

    @property
    def rc(self) -> int | None:
        return self.p.poll()

    def until(self, pred: Callable[[], bool], within: float, what: str) -> None:
        """Wait until pred() (checked on every line and at the end of either stream), failing after within s."""
        deadline = time.monotonic() + within
        with self._cond:
            while not pred():
                left = deadline - time.monotonic()
                if left <= 0:
                    break
                self._cond.wait(left)
            else:
                return
        self.fail(f"{what}: not within {within:.1f} s")

    def line(self, prefix: str, within: float = START_S) -> None:
        """Wait for a line of stdout that starts with prefix."""
        def seen() -> bool:
            if not self._open["out"]:
                self.fail(f"it ended before printing a line starting with {prefix!r}")
            return any(x.startswith(prefix) for x in self.out)

        self.until(seen, within, f"a line starting with {prefix!r}")

    def reaches(self, prefix: str, within: float = START_S) -> bool:
        """Wait for a line of stdout that starts with prefix: False where stdout ended first."""
        self.until(lambda: any(x.startswith(prefix) for x in self.out) or not self._open["out"], within,
                   f"a line starting with {prefix!r} or the end")
        return any(x.startswith(prefix) for x in self.out)

    def request(self, n: int, within: float = START_S) -> None:
        """Wait until the shim has sent its nth request (NVPROXY_TRACE=1)."""
        def sent() -> bool:
            if not self._open["err"]:
                self.fail(f"it ended before its request {n}")
            return self.seq >= n

        self.until(sent, within, f"request {n}")

    def say(self, line: str = "go") -> None:
        """A line on its stdin (started with stdin=True)."""
        assert self.p.stdin is not None
        self.p.stdin.write(f"{line}\n".encode())
        self.p.stdin.flush()

    def feed(self) -> None:
        """A line on stdin now and after each line of stdout, until halt()."""
        with self._cond:
            self._feeding = True
            self.say()

    def halt(self) -> None:
        """No more lines: the end of its stdin."""
        with self._cond:
            self._feeding = False
            assert self.p.stdin is not None
            self.p.stdin.close()

    def exit(self, within: float, what: str = "the program's end") -> int:
        """Wait for the process to end, and for the end of its stdout; its status."""
        try:
            self.p.wait(timeout=within)
        except subprocess.TimeoutExpired:
            self.fail(f"{what}: not within {within:.1f} s")
        self.until(lambda: not self._open["out"], HANG_S, "the end of its stdout")
        return self.p.returncode

    def drained(self, within: float) -> None:
        """Wait until its stderr has ended, or for within s (a proxy may hold it a moment longer): once the process
        has ended, so that every line it wrote has been read, not only those the reader had reached."""
        deadline = time.monotonic() + within
        with self._cond:
            while self._open["err"] and (left := deadline - time.monotonic()) > 0:
                self._cond.wait(left)

    def closed(self, within: float) -> None:
        """Wait for the end of stderr: every process that shares it (its proxies) has ended."""
        self.until(lambda: not self._open["err"], within, "the end of its proxies (its stderr stayed open)")

    def fail(self, what: str) -> None:
        where = _where_they_stand(self.pid) if self.p.poll() is None else f"(it ended with status {self.p.poll()})"
        pytest.fail(f"{what}\n$ {' '.join(self.argv)}\nstdout:\n{tail(self.out)}\nstderr:\n{tail(self.err)}\n{where}",
                    pytrace=False)

    def stop(self) -> None:
        """Kill its whole session if it still runs (a failed case's cleanup)."""
        if self.p.poll() is None:
            try:
                os.killpg(self.pid, signal.SIGKILL)
            except OSError:
                pass
            self.p.wait()


def appears(d: Path, pattern: str, within: float = START_S) -> Path | None:
    """The first file of d matching pattern, polled for until within s have passed (None then)."""
    deadline = time.monotonic() + within
    while time.monotonic() < deadline:
        found = next(d.glob(pattern), None)
        if found is not None:
            return found
        time.sleep(0.001)
    return None


def tail(lines: list[str], n: int = 40) -> str:
    return "\n".join(lines[-n:])


def said(w: Watched) -> list[str]:
    """What the process said on stderr: its lines but the shim's trace (all of them, once it has ended)."""
    if w.rc is not None:
        w.drained(HANG_S)
    return [x for x in w.err if not TRACE.match(x)]


def tidy(w: Watched) -> list[str]:
    """What w said on stderr, checked: no traceback, every line one of the product's messages (a message is one
    line)."""
    lines = said(w)
    assert not any("Traceback" in x for x in lines), "a Python traceback:\n" + tail(lines)
    # (an empty line too: the newline of a message another process's line came into; see cli.whole_lines)
    strangers = [x for x in lines if not x.startswith("nvproxy")]
    assert not strangers, "lines that are no message of nvproxy's (a message is one line):\n" + repr(strangers[-40:])
    return lines


def clear_error(w: Watched, *names: str | tuple[str, ...], alone: bool = False) -> str:
    """The error among what w said on stderr (tidy), one line that names each of names (any of a tuple's).  alone:
    nothing else was said."""
    lines = tidy(w)

    def names_all(x: str) -> bool:
        return all(any(n in x for n in (name if isinstance(name, tuple) else (name,))) for name in names)

    hits = [x for x in lines if names_all(x)]
    assert hits, f"no line names {names}:\n" + tail(lines)
    if alone:
        assert len(lines) == 1, "more than the one line of the error:\n" + tail(lines)
    return hits[0]


def succeeded(w: Watched) -> None:
    assert w.rc == 0, f"exit status {w.rc}:\n{tail(w.out)}\nstderr:\n{tail(w.err)}"


def nothing_said(w: Watched) -> None:
    """No message at all on stderr (the shim's trace aside)."""
    assert said(w) == [], "messages where nothing went wrong:\n" + tail(said(w))


def same_output(w: Watched, reference: list[str]) -> None:
    assert w.out == reference, f"output differs from the undisturbed run's:\n{tail(w.out)}\n---\n{tail(reference)}"


def a_prefix(w: Watched, reference: list[str]) -> None:
    """A program killed: what it printed is what the undisturbed run printed up to there."""
    assert w.out == reference[: len(w.out)], f"output differs:\n{tail(w.out)}\n---\n{tail(reference)}"


def cut_short(w: Watched, reference: list[str], error: str = "cudaErrorDevicesUnavailable") -> None:
    """The program printed what the undisturbed run printed up to where it failed, then its failure (a CHECK's
    FAILED line naming error), or all of it where the fault came after its last call."""
    printed = [x for x in w.out if not x.startswith("FAILED")]
    failed = w.out[len(printed):]
    assert w.out == printed + failed and len(failed) <= 1, f"output goes on after a failure:\n{tail(w.out)}"
    assert printed == reference[: len(printed)], f"output differs:\n{tail(w.out)}\n---\n{tail(reference)}"
    assert all(error in x for x in failed), f"the program failed otherwise than with {error}: {failed}"
    if not failed:
        assert printed == reference, f"no failure, and not all of the output:\n{tail(w.out)}"


@dataclass(frozen=True)
class Snapshot:
    """An image file as it was: its bytes, owner and mode."""

    path: Path
    digest: str
    uid: int
    mode: int

    @classmethod
    def of(cls, path: Path) -> Snapshot:
        st = path.stat()
        return cls(path, hashlib.blake2b(path.read_bytes()).hexdigest(), st.st_uid, st.st_mode)

    def intact(self) -> None:
        assert self.path.exists(), f"{self.path} is gone"
        assert Snapshot.of(self.path) == self, f"{self.path} changed"


class Scene:
    """The processes of one case: programs run through `nvproxy run`, and nvproxy commands, in a runtime directory
    of their own, where nothing may be left once they have ended."""

    def __init__(self, backend: str = "sim") -> None:
        self.backend = backend
        self.rundir = Path(tempfile.mkdtemp(prefix="nvpf", dir="/tmp"))  # (short: a socket's path has 108 bytes)
        self.env = {k: v for k, v in os.environ.items() if not k.startswith("NVPROXY_") and k != "LD_PRELOAD"}
        self.env["XDG_RUNTIME_DIR"] = str(self.rundir)
        self.apps: list[Watched] = []
        self.commands: list[Watched] = []
        self.proxies: set[int] = set()
        self.image_dirs: set[Path] = set()
        self.concluded = False

    def start(self, exe: Path, *args: object, env: dict[str, str] | None = None, wrap: tuple[str, ...] = (),
              name: str | None = None, stdin: bool = False) -> Watched:
        """exe run through `nvproxy run` (the sim kernels of tests/apps/<name>_sim.py; the backend and kernels
        from the command line unless env sets them); wrap: a command that execs the rest (same pid)."""
        env = dict(self.env, **(env or {}))
        opts = [] if "NVPROXY_BACKEND" in env else ["--backend", self.backend]
        opts += [] if "NVPROXY_SIM_KERNELS" in env else sim_kernels(name or exe.name)
        w = Watched([*wrap, sys.executable, "-m", "nvproxy", "run", *opts, "--", exe, *args], env, stdin)
        self.apps.append(w)
        return w

    def nvproxy(self, *args: object, within: float = START_S, wait: bool = True,
                env: dict[str, str] | None = None) -> Watched:
        """An nvproxy command (its end awaited within `within` s, unless not wait)."""
        w = Watched([sys.executable, "-m", "nvproxy", *args], dict(self.env, **(env or {})))
        self.commands.append(w)
        if wait:
            w.exit(within, f"nvproxy {args[0]}")
        return w

    def proxy_of(self, app: Watched) -> int:
        return self.socket_of(app)[0]

    def socket_of(self, app: Watched) -> tuple[int, str]:
        """The pid of app's proxy and its socket's path."""
        pid, sock = find_proxy(app.pid)
        self.proxies.add(pid)
        return pid, sock

    def image_dir(self, name: str = "images") -> Path:
        """A directory for images, checked for temporary files at the end."""
        d = self.rundir.parent / f"{self.rundir.name}-{name}"
        d.mkdir(exist_ok=True)
        self.image_dirs.add(d)
        return d

    def leftovers(self) -> list[str]:
        """What the scene's programs left once they ended: a process serving one of them (waited for, HANG_S at
        most), a file of theirs in the runtime directory (or in /tmp/nvproxy-UID, named after one), a temporary
        image file, shared memory named after one of them or their proxies."""
        owners = {w.pid for w in self.apps}
        deadline = time.monotonic() + HANG_S
        while (running := sorted(p for p in self.proxies | serving(owners) if alive(p))) and \
                time.monotonic() < deadline:
            time.sleep(0.01)
        found = [f"process {p} still runs: {cmdline(p)}" for p in running]
        found += [f"file {f}" for f in sorted(self.rundir.rglob("*")) if not f.is_dir()]
        legacy = Path(f"/tmp/nvproxy-{os.getuid()}")
        if legacy.is_dir():
            found += [f"file {f}" for f in sorted(legacy.iterdir()) if any(f.name.startswith(f"p{o}-") for o in owners)]
        for d in sorted(self.image_dirs):
            found += [f"temporary image file {f}" for f in sorted(d.glob(".*.tmp"))]
        pids = owners | self.proxies
        found += [f"shared memory /dev/shm/{f.name}" for f in sorted(Path("/dev/shm").iterdir())
                  if "nvproxy" in f.name and any(f"-{p}-" in f.name for p in pids)]
        return found

    def conclude(self) -> None:
        """Every program has ended (the case awaited that, with its bound); within HANG_S so have their proxies,
        and nothing of theirs is left."""
        for w in self.apps:
            assert w.rc is not None, f"{w.argv} still runs"
        self.proxies |= serving({w.pid for w in self.apps})
        left = self.leftovers()
        assert not left, "left behind:\n" + "\n".join(left)
        for w in self.apps:
            w.closed(HANG_S)
        self.concluded = True

    def close(self) -> None:
        """Whatever still runs is killed, the directories removed (a failed case leaves nothing either)."""
        for w in self.apps + self.commands:
            w.stop()
        for p in self.proxies | serving({w.pid for w in self.apps}):
            try:
                os.kill(p, signal.SIGKILL)
            except OSError:
                pass
        for d in [self.rundir, *self.image_dirs]:
            shutil.rmtree(d, ignore_errors=True)
