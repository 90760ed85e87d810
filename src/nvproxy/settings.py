"""Every setting nvproxy reads from the environment, in one table: name, default, what it allows, what it means.

`problems` checks an environment against the table (`nvproxy run` before it starts anything, a proxy as it
starts), `text_table` and `markdown_table` render it (`nvproxy settings`, the user guide).  The shim (C) reads
some of these too and checks its numbers itself, against the same ranges.
"""

from __future__ import annotations

import os
import re
import shutil
import sys
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass

# words NVPROXY_DEBUG may hold (empty: any word is accepted until the flags are listed here)
DEBUG_FLAGS: tuple[str, ...] = ("no-mailbox", "answered-copies", "no-inline")


@dataclass(frozen=True)
class Kind:
    """What a setting allows: `allowed` for people, `problem(value)` for the check (None: fine)."""

    allowed: str
    problem: Callable[[str], str | None]


def choice(*values: str) -> Kind:
    allowed = values[0] if len(values) == 1 else ", ".join(values[:-1]) + " or " + values[-1]
    return Kind(allowed, lambda v: None if v in values else f"expected {allowed}")


def integer(lo: int, hi: int, unit: str = "") -> Kind:
    allowed = f"a whole number from {lo} to {hi}{unit}"

    def problem(v: str) -> str | None:
        if not re.fullmatch(r"[0-9]+", v.strip()):
            return f"expected {allowed}"
        return None if lo <= int(v) <= hi else f"{v} is out of range: expected {allowed}"

    return Kind(allowed, problem)


def _missing_parent(path: str) -> str | None:
    parent = os.path.dirname(os.path.abspath(path))
    if not os.path.isdir(parent):
        return f"its directory {parent} does not exist"
    if not os.access(parent, os.W_OK | os.X_OK):
        return f"its directory {parent} is not writable"
    return None


def _writable_file(v: str) -> str | None:
    if os.path.isdir(v):
        return "is a directory"
    if os.path.exists(v):
        return None if os.access(v, os.W_OK) else "is not writable"
    return _missing_parent(v)


def _image_path(v: str) -> str | None:
    if os.path.exists(v):
        return None if os.path.isfile(v) and os.access(v, os.R_OK) else "is not a readable file"
    return _missing_parent(v)


def python_files(v: str) -> str | None:
    """What is wrong with the first bad file of a list of Python files (None: all are fine)."""
    for p in filter(None, v.split(os.pathsep)):
        try:
            with open(p, "rb") as f:
                compile(f.read(), p, "exec")
        except OSError as e:
            return f"{p}: {e.strerror}"
        except (SyntaxError, ValueError) as e:
            return f"{p}: not Python ({e})"
    return None


def _directory(v: str) -> str | None:
    if not os.path.isdir(v):
        return "no such directory"
    return None if os.access(v, os.W_OK | os.X_OK) else "not writable"


# the longest name in the private directory: pPID-TIME.sock.PID.ctl.PID.tmp (proxy/listen.py's while it binds),
# PIDs of 7 digits (pid_max's limit), TIME of 10; a Unix socket's path holds at most 107 bytes
LONGEST_SOCKET_NAME = len("/p1234567-1234567890.sock.1234567.ctl.1234567.tmp")
RUNTIME_DIR_MAX = 107 - LONGEST_SOCKET_NAME - len("/nvproxy")


def _runtime_dir(v: str) -> str | None:
    if len(v) > RUNTIME_DIR_MAX:
        return f"{len(v)} characters long"
    return None if os.path.isdir(v) else "no such directory"


def _existing_directory(v: str) -> str | None:
    return None if os.path.isdir(v) else "no such directory"


def _dmtcp_dir(v: str) -> str | None:
    return None if os.path.isfile(os.path.join(v, "bin", "dmtcp_launch")) else f"no {v}/bin/dmtcp_launch"


def _executable(v: str) -> str | None:
    if "/" not in v:
        return None if shutil.which(v) else "not found on PATH"
    if not os.path.isfile(v):
        return "no such file"
    return None if os.access(v, os.X_OK) else "not executable"


def _debug_words(v: str) -> list[str]:
    return [w.strip() for w in v.split(",")]


def debug_flag(name: str, env: Mapping[str, str] | None = None) -> bool:
    """Is NVPROXY_DEBUG's flag `name` set (in env, else this process's environment)?"""
    v = (os.environ if env is None else env).get("NVPROXY_DEBUG", "")
    return bool(v) and name in _debug_words(v)


def _words(v: str) -> str | None:
    words = _debug_words(v)
    bad = [w for w in words if not re.fullmatch(r"[A-Za-z0-9_-]+", w)]
    if bad:
        return f"{bad[0]!r} is not a word"
    unknown = [w for w in words if DEBUG_FLAGS and w not in DEBUG_FLAGS]
    return f"unknown flag {unknown[0]} (known: {', '.join(DEBUG_FLAGS)})" if unknown else None


def _devices(v: str) -> str | None:
    bad = [d for d in v.split(",") if not re.fullmatch(r"[0-9]+|(GPU|MIG)-[0-9A-Fa-f-]+", d.strip())]
    return f"{bad[0]!r} is neither a device number nor a UUID" if bad else None


def with_reason(allowed: str, check: Callable[[str], str | None]) -> Kind:
    """A kind whose problems are told with what is allowed."""
    return Kind(allowed, lambda v: (f"{why} (expected {allowed})" if (why := check(v)) else None))


ON_OFF = choice("0", "1")
RUNTIME_DIR = with_reason(f"a directory whose path has at most {RUNTIME_DIR_MAX} characters, for socket paths",
                          _runtime_dir)
ANY = Kind("any value", lambda v: None)
PYTHON_FILES = with_reason(f"Python files, separated by '{os.pathsep}'", python_files)
WRITABLE_FILE = with_reason("a file this user may create or append to", _writable_file)
IMAGE_PATH = with_reason("a checkpoint image file; it may be written later, but its directory must exist", _image_path)
DIRECTORY = with_reason("a writable directory", _directory)
LIBRARY_DIR = with_reason("a directory", _existing_directory)
DMTCP_DIR = with_reason("a DMTCP installation: the directory holding bin/dmtcp_launch", _dmtcp_dir)
EXECUTABLE = with_reason("a Python interpreter with nvproxy installed: a path, or a name on PATH", _executable)
WORDS = with_reason("debug flags separated by commas", _words)
DEVICES = with_reason("device numbers or UUIDs separated by commas, as CUDA_VISIBLE_DEVICES", _devices)

# who reads a setting: the shim (in the program), the proxy, `nvproxy run` itself, the DMTCP commands, the test
# suite's hook library (tests/hooks, preloaded by the tests only)
SHIM, PROXY, RUN, DMTCP, TEST_HOOKS = "shim", "proxy", "run", "dmtcp", "test hooks"
GROUPS = {
    "main": "Settings",
    "tuning": "Tuning",
    "debug": "Debugging and comparisons",
    "testing": "Test hooks (read only by the test suite's hook library, tests/hooks)",
}


@dataclass(frozen=True)
class Setting:
    name: str
    default: str  # as people read it ("" : unset, with the meaning saying what that does)
    kind: Kind
    meaning: str
    readers: tuple[str, ...]
    group: str = "main"
    option: str = ""  # the command-line option that sets it, if one does


SETTINGS: tuple[Setting, ...] = (
    Setting("NVPROXY_BACKEND", "auto: gpu if a GPU is usable, else sim (with a message)", choice("auto", "gpu", "sim"),
            "the device the proxy drives: the GPU, or the sim backend (a CPU model of the device)", (PROXY, RUN),
            option="nvproxy run --backend"),
    Setting("NVPROXY_SIM_DEVICES", "1", integer(1, 16), "how many devices the sim backend models", (PROXY,)),
    Setting("NVPROXY_SIM_MEMORY", "16384", integer(64, 1 << 24, " (MiB)"),
            "how much memory each device of the sim backend has", (PROXY,)),
    Setting("NVPROXY_SIM_KERNELS", "", PYTHON_FILES,
            "Python implementations of the program's kernels for the sim backend (nvproxy.sim_kernels)",
            (PROXY, RUN), option="nvproxy run --sim-kernels"),
    Setting("NVPROXY_PROXY_LOG", "", WRITABLE_FILE,
            "where the proxy writes its messages (appended) instead of the program's stderr", (PROXY,)),
    Setting("NVPROXY_RECOVER", "", IMAGE_PATH,
            "when the proxy dies, a new one starts from this checkpoint image and the program goes on", (SHIM,)),
    Setting("NVPROXY_PYTHON", "the Python nvproxy was built with; nvproxy run sets its own", EXECUTABLE,
            "the interpreter the shim starts proxies with (for a forked child, or to recover)", (SHIM, RUN)),
    Setting("NVPROXY_DMTCP_DIR", "DMTCP on PATH", DMTCP_DIR,
            "where DMTCP is installed, for nvproxy run --dmtcp, checkpoint --dmtcp and restart", (DMTCP,)),
    Setting("NVPROXY_IMAGE_DIR", "DMTCP's checkpoint directory", DIRECTORY,
            "under DMTCP, where the plugin writes each process's GPU image (nvproxy-PID.img)", (SHIM,)),
    Setting("NVPROXY_DMTCP_OVERLAP", "off", choice("off", "write", "resume"),
            "under DMTCP, when a checkpoint's GPU image is written: before DMTCP writes the process's image (off); "
            "while it does, the program resuming once both are written (write); or also after the program resumed "
            "(resume). With write or resume, dmtcp_command may report a checkpoint whose GPU image is not yet "
            "written. Not for nvproxy checkpoint --dmtcp, which chooses itself (--overlap, --no-overlap) and waits "
            "for both", (PROXY,)),
    Setting("NVPROXY_DEVICES", "the GPUs it ran on", DEVICES,
            "at a DMTCP restart, the GPUs the program comes back on", (SHIM,), option="nvproxy restart --device"),
    Setting("NVPROXY_LIB_DIR", "", LIBRARY_DIR,
            "where the proxy looks first for the GPU libraries a program calls (cuBLAS, cuFFT...); the sim backend "
            "looks nowhere else", (PROXY,)),
    Setting("NVPROXY_SPIN_US", "400", integer(0, 200000, " (microseconds)"),
            "how long a thread waiting for a reply spins before it sleeps (longer for a long synchronous copy; 0: "
            "it sleeps at once)", (SHIM,), "tuning"),
    Setting("NVPROXY_COPY_THREADS", "half the cores, at most 4", integer(1, 8),
            "threads that copy pageable memory into the staging buffers (1: the calling thread alone)", (SHIM,),
            "tuning"),
    Setting("NVPROXY_LAUNCH_THREADS", "8, at most half the cores", integer(0, 8),
            "threads of the proxy that issue kernel launches while several of the program's threads make calls "
            "(0: the proxy's one thread issues them all)", (PROXY,), "tuning"),
    Setting("NVPROXY_MANAGED", "auto", choice("auto", "migrate", "zero-copy"),
            "managed memory: moved between host and device memory as each uses it (migrate; auto where the kernel "
            "lets this user watch page faults and the proxy has one device), or host memory kernels read over the "
            "bus (zero-copy)", (SHIM,), "tuning"),
    Setting("NVPROXY_CKPT_BUFFER", "prefault", choice("prefault", "lazy", "transient"),
            "the host buffer images are built in: grown and page-locked in the background as device memory grows; "
            "made at the first checkpoint and kept; or made and released at every checkpoint", (PROXY,), "tuning"),
    Setting("NVPROXY_CKPT_CONCURRENT", "0", ON_OFF,
            "nvproxy checkpoint without --concurrent or --no-concurrent lets the application go on while the image "
            "is copied out (1) or stops it for the copy (0); so does nvproxy checkpoint --dmtcp without --no-overlap; "
            "DMTCP's own checkpoints and migrations always stop it",
            (PROXY,), "tuning"),
    Setting("NVPROXY_CKPT_SPARE", "free device memory less a margin", integer(0, 1 << 24, " (MiB)"),
            "at most this much spare device memory for a concurrent checkpoint's snapshot (0: none; what does not "
            "fit is saved by copy-before-write)", (PROXY,), "tuning"),
    Setting("NVPROXY_CKPT_COW", "1", ON_OFF,
            "a concurrent checkpoint saves what does not fit in spare device memory by copy-before-write after the "
            "release (1), or before it (0)", (PROXY,), "tuning"),
    Setting("NVPROXY_RESTORE_READ", "bounce", choice("bounce", "map"),
            "how a restore reads an image file: through pinned bounce buffers on 16 threads, or by page-locking the "
            "file's pages (slower; falls back to bounce where that fails)", (PROXY,), "tuning"),
    Setting("NVPROXY_EARLY_CHECK", "1", choice("0", "1", "load"),
            "a restoring proxy sums the image while the driver starts (0: during the load; load: stop at the load)",
            (PROXY,), "tuning"),
    Setting("NVPROXY_EARLY_CONTEXT", "1", ON_OFF,
            "a proxy starts the driver, and makes device 0's context, before Python's site processing (0: the "
            "driver when the backend opens, the context at the program's first call that needs one)", (PROXY,),
            "tuning"),
    Setting("NVPROXY_DEBUG", "", WORDS, "turns single mechanisms of the call path or the restore off, to compare or "
            "to isolate a fault, not for production: no-mailbox (replies by socket only), answered-copies (every "
            "staged copy waits for its answer), no-inline (the proxy's C serving stops for every call only Python "
            "executes)", (SHIM, PROXY), "debug"),
    Setting("NVPROXY_TRACE", "", choice("1"), "the shim prints every request it sends on stderr", (SHIM,), "debug"),
    Setting("NVPROXY_SERVE_STATS", "", choice("1"), "the proxy prints on stderr at its end how its C fast path "
            "served: its share of the time, why each of its serves ended, the requests C and Python executed, those "
            "C left to Python by operation, and the gaps between serves (the longest with why C stopped and what "
            "Python executed)", (PROXY,), "debug"),
    Setting("NVPROXY_LIB_FAST", "1", ON_OFF,
            "the proxy's C fast path makes GPU library calls of functions that ran once in Python (0: never)",
            (PROXY,), "debug"),
    Setting("NVPROXY_LIB_SYNC", "0", ON_OFF,
            "every GPU library call waits for its answer (0: ordered calls with no output go unanswered)", (SHIM,),
            "debug"),
    Setting("NVPROXY_CHECKPOINT_AT", "", integer(1, 1 << 40),
            "under DMTCP, the program waits for a checkpoint as its Nth CUDA call begins", (TEST_HOOKS,), "testing"),
    Setting("NVPROXY_CHECKPOINT_IN", "", choice("child"),
            "NVPROXY_CHECKPOINT_AT counts only in the processes the program starts", (TEST_HOOKS,), "testing"),
    Setting("NVPROXY_CHECKPOINT_WAITERS", "1", integer(1, 4096),
            "how many processes wait at their NVPROXY_CHECKPOINT_AT call", (TEST_HOOKS,), "testing"),
    Setting("NVPROXY_MIGRATE_AT", "", integer(1, 1 << 40),
            "nvproxy migrate moves the program to a new proxy at its Nth CUDA call", (TEST_HOOKS,), "testing"),
    Setting("NVPROXY_CALLS_OUT", "", WRITABLE_FILE,
            "each process adds the number of CUDA calls it made to this file as it exits", (TEST_HOOKS,), "testing"),
    Setting("NVPROXY_TEST_PAUSE_MS", "0", integer(0, 60000, " (ms)"),
            "cudaHostAlloc waits this long between the proxy's part and the shim's (a test's window)",
            (TEST_HOOKS,), "testing"),
    Setting("NVPROXY_TEST_HOLD_REQUEST", "", integer(1, 1 << 40),
            "the thread whose request gets this number waits, once, before sending it, until NVPROXY_TEST_HOLD_FIFO "
            "is written (a test's gap in the call order)", (TEST_HOOKS,), "testing"),
    Setting("NVPROXY_TEST_HOLD_FIFO", "", WRITABLE_FILE,
            "the FIFO that releases the request NVPROXY_TEST_HOLD_REQUEST holds", (TEST_HOOKS,), "testing"),
    Setting("NVPROXY_TEST_SOCKET_LOOK_US", "0", integer(0, 1000000, " (us)"),
            "a thread waiting for a reply that may come through its mailbox waits this long before each look at its "
            "socket (a test's window: the proxy answers meanwhile)", (TEST_HOOKS,), "testing"),
    Setting("CUDA_VISIBLE_DEVICES", "all", ANY, "the GPUs the proxy uses (the driver's setting; the sim backend "
            "honours it too)", (PROXY,), option="nvproxy migrate --device"),
    Setting("XDG_RUNTIME_DIR", "/tmp/nvproxy-UID", RUNTIME_DIR,
            "sockets and handles go to $XDG_RUNTIME_DIR/nvproxy (else /tmp/nvproxy-UID)", (SHIM, PROXY, RUN)),
    Setting("XDG_CACHE_HOME", "~/.cache", ANY, "nvproxy bench builds its CUDA programs into "
            "$XDG_CACHE_HOME/nvproxy/bench", ()),
)

# set by nvproxy itself for the processes it starts: not settings
INTERNAL: dict[str, str] = {
    "NVPROXY_SOCKET": "the proxy's socket, for the shim",
    "NVPROXY_OWNER_PID": "the process the proxy serves",
    "NVPROXY_PROXY_PID": "the proxy's pid",
    "NVPROXY_BOOT": "how the shim starts a proxy (boot.py)",
    "NVPROXY_ROOT": "the directory holding the nvproxy package, for NVPROXY_BOOT",
    "NVPROXY_DMTCP_NOCHECKPOINT": "DMTCP's dmtcp_nocheckpoint, which starts proxies outside the computation",
}

BY_NAME = {s.name: s for s in SETTINGS}


def problems(env: Mapping[str, str], readers: Iterable[str] | None = None) -> list[str]:
    """'NAME=value: what is wrong' for each setting in env (read by one of readers) that the table refuses.
    An empty value counts as unset."""
    want = set(readers) if readers is not None else None
    out = []
    for s in SETTINGS:
        value = env.get(s.name)
        if not value or (want is not None and not want & set(s.readers)):
            continue
        why = s.kind.problem(value)
        if why:
            out.append(f"{s.name}={value}: {why}")
    return out


def problem_of(name: str, value: str) -> str | None:
    """What is wrong with value for setting name (None: fine)."""
    return BY_NAME[name].kind.problem(value)


def check_or_exit(env: Mapping[str, str], readers: Iterable[str] | None = None, who: str = "nvproxy") -> None:
    """SystemExit(2) with one line per refused setting, naming it and what it allows."""
    found = problems(env, readers)
    for line in found:
        print(f"{who}: {line}", file=sys.stderr)
    if found:
        raise SystemExit(2)


def _rows(groups: Iterable[str]) -> list[tuple[str, list[Setting]]]:
    return [(g, [s for s in SETTINGS if s.group == g]) for g in groups]


def _default(s: Setting) -> str:
    return s.default or "unset"


def markdown_table(groups: Iterable[str] = ("main", "tuning", "debug")) -> str:
    """The settings of groups as one Markdown table (the user guide has it between its settings-table markers;
    the test hooks stay out of it)."""
    out = ["| variable | default | allowed values | meaning |", "|---|---|---|---|"]
    for _group, settings in _rows(groups):
        for s in settings:
            meaning = s.meaning + (f"; `{s.option}` sets it" if s.option else "")
            out.append(f"| `{s.name}` | {_default(s)} | {s.kind.allowed} | {meaning} |")
    return "\n".join(out)


def text_table(env: Mapping[str, str] | None = None, width: int = 120) -> str:
    """The table for a terminal; with env, each setting's value there (and what is wrong with it)."""
    import textwrap

    out = []
    for group, settings in _rows(GROUPS):
        out.append(f"{GROUPS[group]}:")
        for s in settings:
            out.append(f"  {s.name}")
            meaning = s.meaning + (f" (also: {s.option})" if s.option else "")
            for text in (meaning, f"default: {_default(s)}; allowed: {s.kind.allowed}"):
                out += textwrap.wrap(text, width, initial_indent="      ", subsequent_indent="        ")
            value = env.get(s.name) if env is not None else None
            if value:
                why = s.kind.problem(value)
                out.append(f"      set here: {value}" + (f"  <- NOT ALLOWED: {why}" if why else ""))
        out.append("")
    return "\n".join(out)
