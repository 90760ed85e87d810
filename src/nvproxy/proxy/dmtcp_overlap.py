"""When a DMTCP checkpoint's GPU image is written, and what came of it.

The plugin (native/shim/dmtcp.c) asks for the image at PRECHECKPOINT.  It is written before DMTCP writes the
process's image (off), while DMTCP writes it, the program resuming once both are written (write), or also after the
program resumed (resume).  DMTCP 4.2 reports a checkpoint done before RESUME, so only a waiter that asks the proxy
can know an overlapped image is complete: `nvproxy checkpoint --dmtcp` arms the next checkpoint with a token and a
mode (resume, or off for --no-overlap), and afterwards asks for the outcome under that token.  An armed checkpoint may
also be concurrent (checkpoint/concurrent.py: the program goes on as soon as its device memory is safe, before it is
copied out), where the program resumes before its image is written anyway.  Checkpoints nobody armed go as
NVPROXY_DMTCP_OVERLAP says, and are never concurrent.
"""

from __future__ import annotations

import os
import threading
import time
from dataclasses import dataclass
from typing import Any

MODES = ("off", "write", "resume")
MAX_ARM_S = 3600.0


@dataclass
class Arm:
    token: str
    mode: str
    until: float  # (time.monotonic) after this, the arm is void: its command is long gone
    concurrent: bool | None  # (None: as NVPROXY_CKPT_CONCURRENT says)


class DmtcpOverlap:
    def __init__(self) -> None:
        self.cv = threading.Condition()
        self.arm: Arm | None = None
        self.taken: set[str] = set()  # tokens of checkpoints under way or done, whose outcome may still be asked for
        self.outcomes: dict[str, dict[str, Any]] = {}

    def arm_next(self, token: str, mode: str, for_s: float, concurrent: bool | None = None) -> None:
        if mode not in ("off", "resume") or not token or (concurrent and mode != "resume"):
            raise ValueError(f"overlap: mode {mode!r} with token {token!r}, concurrent {concurrent!r}")
        with self.cv:
            self.arm = Arm(token, mode, time.monotonic() + min(max(for_s, 0.0), MAX_ARM_S), concurrent)

    def disarm(self, token: str) -> None:
        """The command that armed gave up before DMTCP's checkpoint: the next one goes as nobody asked."""
        with self.cv:
            if self.arm is not None and self.arm.token == token:
                self.arm = None

    def begin(self) -> tuple[str, str | None, bool]:
        """A DMTCP checkpoint begins: its mode, the token it answers to (None where nobody armed), and whether it is
        concurrent."""
        with self.cv:
            arm, self.arm = self.arm, None
            if arm is not None and time.monotonic() < arm.until:
                self.taken.add(arm.token)
                concurrent = arm.concurrent
                if concurrent is None:
                    concurrent = arm.mode == "resume" and os.environ.get("NVPROXY_CKPT_CONCURRENT", "0") == "1"
                return arm.mode, arm.token, concurrent
        mode = os.environ.get("NVPROXY_DMTCP_OVERLAP", "off")
        return (mode if mode in MODES else "off"), None, False

    def finished(self, token: str | None, outcome: dict[str, Any]) -> None:
        if token is None:
            return
        with self.cv:
            self.outcomes[token] = outcome
            self.cv.notify_all()

    def outcome(self, token: str, timeout: float) -> dict[str, Any]:
        """The outcome of the checkpoint armed with token once its image is written ({"none": True} where no
        checkpoint took the arm: this proxy's program made no DMTCP checkpoint since)."""
        with self.cv:
            if token not in self.taken:
                if self.arm is not None and self.arm.token == token:
                    self.arm = None
                return {"ok": False, "none": True, "error": "no DMTCP checkpoint came to this proxy"}
            if not self.cv.wait_for(lambda: token in self.outcomes, min(max(timeout, 0.0), MAX_ARM_S)):
                return {"ok": False, "error": "its GPU image was not written in time (--timeout)"}
            self.taken.discard(token)
            return self.outcomes.pop(token)
