"""The torch suite of `nvproxy bench`: torch_steps.py natively and through nvproxy, and its rows' targets."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

SCRIPT = Path(__file__).resolve().parent / "torch_steps.py"
# nvproxy/native time per training step
TARGETS = {"torch resnet18 step": 1.05, "torch transformer step": 1.10}


def program(backend: str) -> list[str] | None:
    """The command of the suite's program; None, with one line on stderr saying why, where it cannot run."""
    why = ("the sim backend runs no PyTorch" if backend == "sim" else
           f"PyTorch is not installed in this Python ({sys.executable})"
           if importlib.util.find_spec("torch") is None else "")
    if why:
        print(f"nvproxy bench: torch benchmarks skipped: {why}", file=sys.stderr, flush=True)
        return None
    return [sys.executable, str(SCRIPT)]


def target(bench: str, unit: str) -> tuple[str, float] | None:
    limit = TARGETS.get(bench)
    return ("<=", limit) if limit is not None and unit == "ms" else None
