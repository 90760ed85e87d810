"""tests/apps/ckpt_steps under a test's control: run with a pause of -1 it waits after each step for a line on its
standard input, so a test acts between two steps for as long as its action takes (a checkpoint, killing the
proxy) and only then lets the program go on."""

from __future__ import annotations

import os
import queue
import select
import signal
import subprocess
import threading
from collections.abc import Mapping

import pytest

WAIT_S = 120  # (a failure bound: a program that printed nothing for this long is stuck)


class Gated:
    def __init__(self, cmd: list[str], env: Mapping[str, str] | None = None) -> None:
        self.p = subprocess.Popen(cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                  text=True, env=env)
        self.pid = self.p.pid
        self.lines: list[str] = []
        self._out: queue.SimpleQueue[str | None] = queue.SimpleQueue()
        self._err: list[str] = []
        threading.Thread(target=self._pump, daemon=True).start()
        self._err_reader = threading.Thread(target=lambda: self._err.append(self.p.stderr.read()), daemon=True)
        self._err_reader.start()

    def __enter__(self) -> Gated:
        return self

    def __exit__(self, *_exc: object) -> None:
        if self.p.poll() is None:  # (a test that failed midway)
            self.p.kill()
            self.p.wait()

    def _pump(self) -> None:
        assert self.p.stdout is not None
        for line in self.p.stdout:
            self._out.put(line)
        self._out.put(None)

    def _next(self) -> str | None:
        """The program's next line of output; None at its end."""
        try:
            got = self._out.get(timeout=WAIT_S)
        except queue.Empty:
            self.p.kill()
            pytest.fail(f"the program printed nothing for {WAIT_S} s after:\n{''.join(self.lines)}")
        if got is not None:
            self.lines.append(got)
        return got

    def _ended(self) -> None:
        self.p.wait(timeout=WAIT_S)
        self._err_reader.join(timeout=WAIT_S)

    def line(self) -> str:
        """The program's next line of output (its next step is done and it waits for go())."""
        got = self._next()
        if got is None:
            self._ended()
            pytest.fail(f"the program ended early ({self.p.returncode}):\n{''.join(self.lines)}\n{self.err}")
        return got

    def go(self) -> str:
        """Let the program run its next step; the line that step printed."""
        assert self.p.stdin is not None
        self.p.stdin.write("\n")
        self.p.stdin.flush()
        return self.line()

    @property
    def err(self) -> str:
        return "".join(self._err)

    def finish(self) -> tuple[str, str]:
        """Let the program run to its end: (all its output, its stderr)."""
        assert self.p.stdin is not None
        self.p.stdin.close()
        while self._next() is not None:
            pass
        self._ended()
        return "".join(self.lines), self.err


def kill_and_wait(pid: int) -> None:
    """SIGKILL pid and return once it has ended (its pidfd turns readable)."""
    fd = os.pidfd_open(pid)
    try:
        os.kill(pid, signal.SIGKILL)
        if not select.select([fd], [], [], WAIT_S)[0]:
            pytest.fail(f"process {pid} outlived SIGKILL for {WAIT_S} s")
    finally:
        os.close(fd)
