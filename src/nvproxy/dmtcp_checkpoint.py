"""`nvproxy checkpoint --dmtcp`: a DMTCP checkpoint of a computation run with `nvproxy run --dmtcp`, reported
written only once every process's DMTCP image and every GPU image is complete and on disk.

DMTCP 4.2's coordinator says nothing that tells a checkpoint not yet begun from one that is over (`-bc` does not
block; its status reads RUNNING while the processes still drain their GPU work), so completion is read from the
files: the coordinator writes its restart script, which names every process's image, once the last of them is
in place.  The plugin has each process's proxy write its GPU image (nvproxy-PID.img, by its real pid) into the
same directory unless NVPROXY_IMAGE_DIR says otherwise: by default this command asks the proxies to write it while
DMTCP writes the process's image and after the program resumes (overlap), and then asks each proxy for the outcome;
without overlap it is written before DMTCP writes.  DMTCP does not fsync an uncompressed image: this command does,
before it says the checkpoint is written.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

POLL_S = 0.02
ENDED_CHECK_EVERY_S = 0.5


class Failed(Exception):
    """The checkpoint was not written; the message says why, for the user."""


@dataclass
class Process:
    """A process of the computation, as `dmtcp_command -l` lists it."""

    program: str
    pid: int  # its real pid: the proxy serving it and its GPU image go by this one
    unique_pid: str  # DMTCP's name for it, part of its image's name
    device_bytes: int = 0  # held by its proxy before the checkpoint (0: none, or no proxy)
    has_proxy: bool = False
    gpu_image_before: tuple[int, int] | None = None  # (inode, mtime) of a GPU image from an earlier checkpoint
    proxy: tuple[int, str] | None = None  # (pid, socket) of its proxy


class Coordinator:
    def __init__(self, port: int) -> None:
        from .launcher import dmtcp_tool

        self.port = port
        self.cmd = [dmtcp_tool("dmtcp_command"), "--coord-port", str(port)]

    def _run(self, flag: str) -> subprocess.CompletedProcess:
        return subprocess.run([*self.cmd, flag], capture_output=True, text=True, timeout=60)

    def status(self) -> tuple[int, bool] | None:
        """(processes connected, whether they all run), or None where no coordinator answers."""
        r = self._run("-s")
        peers, running = re.search(r"NUM_PEERS=(\d+)", r.stdout), re.search(r"RUNNING=(\w+)", r.stdout)
        if r.returncode != 0 or not peers or not running:
            return None
        return int(peers.group(1)), running.group(1) == "yes"

    def processes(self) -> list[Process]:
        out = self._run("-l").stdout
        found = re.findall(r"^\d+, (.*)\[\d+:(\d+)\]@[^,]*, ([^,\s]+), ", out, re.M)
        return [Process(program, int(pid), unique) for program, pid, unique in found]

    def checkpoint(self) -> None:
        r = self._run("-c")
        if r.returncode == 0:
            return
        said = " ".join((r.stdout + r.stderr).split())
        if "not in running state" in said:
            raise Failed("DMTCP did not start a checkpoint: the computation is not running (another checkpoint under "
                         "way, or it has just ended)")
        raise Failed(f"dmtcp_command -c failed: {said}")

    def checkpoint_dir(self) -> Path:
        """Where this coordinator writes its restart script (its --ckptdir, else $DMTCP_CHECKPOINT_DIR, else its
        working directory): it must run on this machine."""
        pid = _listener(self.port)
        if pid is None:
            raise Failed(f"the DMTCP coordinator of port {self.port} is not a process of this user on this machine: "
                         "its images cannot be seen from here")
        argv = Path(f"/proc/{pid}/cmdline").read_bytes().decode(errors="replace").split("\0")
        cwd = os.readlink(f"/proc/{pid}/cwd")
        for i, arg in enumerate(argv[:-1]):
            if arg.strip() in ("-c", "--ckptdir"):
                return Path(cwd, argv[i + 1])
        return Path(cwd, _environ(pid).get("DMTCP_CHECKPOINT_DIR", "."))


def _listener(port: int) -> int | None:
    """The pid of this user's process listening on TCP port."""
    inodes = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        try:
            lines = Path(table).read_text().splitlines()[1:]
        except OSError:
            continue
        for line in lines:
            f = line.split()
            if f[3] == "0A" and int(f[1].rsplit(":", 1)[1], 16) == port:  # (0A: LISTEN)
                inodes.add(f"socket:[{f[9]}]")
    for d in Path("/proc").iterdir():
        if not inodes or not d.name.isdigit():
            continue
        try:
            if any(os.readlink(d / "fd" / fd) in inodes for fd in os.listdir(d / "fd")):
                return int(d.name)
        except OSError:
            continue
    return None


def _environ(pid: int) -> dict[str, str]:
    try:
        items = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
    except OSError:
        return {}
    return dict(i.decode(errors="replace").split("=", 1) for i in items if b"=" in i)


def _stamp(path: Path) -> tuple[int, int] | None:
    """(inode, mtime in ns) of path, None where it does not exist."""
    try:
        st = path.stat()
    except OSError:
        return None
    return st.st_ino, st.st_mtime_ns


def _alive(pid: int) -> bool:
    from .launcher import alive

    return alive(pid)


def _gpu_dir(p: Process, dmtcp_image: Path) -> Path:
    return Path(_environ(p.pid).get("NVPROXY_IMAGE_DIR") or dmtcp_image.parent)


def _look_at_proxies(procs: list[Process], where: Path, arm: dict) -> None:
    """What each process's proxy holds now, and the GPU image an earlier checkpoint left where this one's may go
    (NVPROXY_IMAGE_DIR, the process's checkpoint directory, the coordinator's).  arm: how each proxy is to write the
    image of the next DMTCP checkpoint (proxy/dmtcp_overlap.py), under a token to ask for the outcome with."""
    from .cli import _control_call
    from .launcher import find_proxy

    for p in procs:
        try:
            proxy_pid, sock = find_proxy(p.pid)
        except SystemExit:  # (no proxy: no CUDA call yet, or not a CUDA program)
            continue
        p.has_proxy, p.proxy = True, (proxy_pid, sock)
        try:
            p.device_bytes = int(_control_call(sock, proxy_pid, {"cmd": "usage"}).get("device_bytes", 0))
        except (OSError, ValueError):
            p.device_bytes = 0
        _control_call(sock, proxy_pid, {"cmd": "overlap", **arm})  # (a proxy gone: seen below)
        env = _environ(p.pid)
        dirs = [Path(d) for d in (env.get("NVPROXY_IMAGE_DIR"), env.get("DMTCP_CHECKPOINT_DIR")) if d] + [where]
        for d in dirs:
            if (stamp := _stamp(d / f"nvproxy-{p.pid}.img")) is not None:
                p.gpu_image_before = stamp
                break


def _listed_images(script: Path) -> list[Path] | None:
    """The images a restart script names, None while its line naming them is not all written."""
    try:
        text = script.read_text(errors="replace")
    except OSError:
        return None
    m = re.search(r'^given_ckpt_files="([^"]*)"\n', text, re.M)
    return [Path(n) for n in m.group(1).split()] if m else None


def _sync(paths: list[Path]) -> None:
    """fsync each file, then each directory holding one."""
    for path in [*paths, *sorted({p.parent for p in paths})]:
        fd = os.open(path, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)


def _wait_running(coord: Coordinator, deadline: float) -> list[Process]:
    """The computation's processes, once it runs (it may be starting, or in another checkpoint)."""
    while True:
        st = coord.status()
        if st is None:
            raise Failed(f"no DMTCP coordinator answers on port {coord.port} (is the program running under "
                         "nvproxy run --dmtcp with this --coord-port?)")
        peers, running = st
        if peers == 0:
            raise Failed(f"no process is connected to the DMTCP coordinator on port {coord.port} yet: nothing to "
                         "checkpoint")
        if running:
            return coord.processes()
        if time.monotonic() > deadline:
            raise Failed(f"the computation on port {coord.port} did not come to run (a checkpoint or restart under "
                         "way?)")
        time.sleep(POLL_S)


def _scripts(where: Path) -> dict[Path, tuple[int, int] | None]:
    return {p: _stamp(p) for p in where.glob("dmtcp_restart_script_*.sh")}


def _wait_written(where: Path, before: dict[Path, tuple[int, int] | None], procs: list[Process],
                  deadline: float) -> tuple[Path, list[Path]]:
    """(the restart script, the images it names) once the coordinator has written it anew for this checkpoint:
    it does so once every process's image is in place.  (It names them in one line, near its end; one of this
    computation's processes among them tells its script from another computation's in the same directory.)"""

    def written() -> tuple[Path, list[Path]] | None:
        for script, stamp in _scripts(where).items():
            if stamp is not None and stamp != before.get(script):
                images = _listed_images(script)
                names = " ".join(i.name for i in images or [])
                if images and any(f"_{p.unique_pid}.dmtcp" in names for p in procs):
                    return script, images
        return None

    next_look = time.monotonic() + ENDED_CHECK_EVERY_S
    while (done := written()) is None:
        now = time.monotonic()
        if now > deadline:
            raise Failed("DMTCP did not finish the checkpoint in time (--timeout)")
        if now > next_look:
            next_look = now + ENDED_CHECK_EVERY_S
            if not any(_alive(p.pid) for p in procs) and (done := written()) is None:
                raise Failed("the program ended before DMTCP had written its images: no checkpoint was written")
        time.sleep(POLL_S)
    return done


def _gpu_outcome(p: Process, token: str, deadline: float) -> str | None:
    """Once p's proxy has written the GPU image of this checkpoint: None where it was written (or where the proxy
    cannot tell: it saw no checkpoint, or it ended, and the image file tells), else why not."""
    from .cli import _control_call

    if p.proxy is None:
        return None
    msg = {"cmd": "written", "token": token, "wait_s": max(deadline - time.monotonic(), 0.0)}
    reply = _control_call(p.proxy[1], p.proxy[0], msg, deadline=deadline + 5)
    if reply.get("ok") or reply.get("none") or reply.get("lost") or reply.get("ended"):
        return None  # (a proxy ends only once its image is written: the file tells)
    return str(reply.get("error"))


def _disarm(procs: list[Process], token: str) -> None:
    from .cli import _control_call

    for p in procs:
        if p.proxy is not None:
            _control_call(p.proxy[1], p.proxy[0], {"cmd": "overlap", "clear": True, "token": token})


def checkpoint(port: int, timeout: float, overlap: bool = True, concurrent: bool | None = None) -> list[str]:
    """Checkpoint the computation of the coordinator on port; lines saying what was written.  Raises Failed.
    overlap: the GPU images are written while DMTCP writes and after the program resumes (this waits for them);
    else before DMTCP writes.  concurrent (with overlap): the program's device memory is copied out after it
    resumes, as `nvproxy checkpoint --concurrent` does (None: as each proxy's NVPROXY_CKPT_CONCURRENT says)."""
    if concurrent and not overlap:
        raise Failed("--concurrent copies device memory out after the program resumes: not with --no-overlap")
    deadline = time.monotonic() + timeout
    coord = Coordinator(port)
    procs = _wait_running(coord, deadline)
    where = coord.checkpoint_dir()
    token = os.urandom(8).hex()
    _look_at_proxies(procs, where, {"token": token, "mode": "resume" if overlap else "off", "for_s": timeout,
                                    "concurrent": concurrent if overlap else False})
    before = _scripts(where)
    try:
        coord.checkpoint()
        script, images = _wait_written(where, before, procs, deadline)
    except BaseException:  # (where no checkpoint took the arm, the next one, DMTCP's own say, goes as nobody asked)
        _disarm(procs, token)
        raise
    missing = [str(p) for p in images if not p.is_file()]
    if missing:
        raise Failed(f"DMTCP listed images that are not there: {', '.join(missing)}")
    lines, problems, gpu_images = [], [], []
    for p in procs:
        mine = [i for i in images if i.name.endswith(f"_{p.unique_pid}.dmtcp")]
        if not mine:
            if _alive(p.pid):
                problems.append(f"no DMTCP image of {p.program} (pid {p.pid}) in {script}")
            else:
                lines.append(f"  ({p.program}, pid {p.pid}, ended before the checkpoint)")
            continue
        lines.append(f"  {mine[0]}  (DMTCP image of {p.program}, pid {p.pid})")
        gpu = _gpu_dir(p, mine[0]) / f"nvproxy-{p.pid}.img"
        if (why := _gpu_outcome(p, token, deadline)) is not None:
            problems.append(f"the GPU image of {p.program} (pid {p.pid}) was not written: {why}")
            continue
        stamp = _stamp(gpu)
        if stamp is not None and stamp != p.gpu_image_before:
            gpu_images.append(gpu)
            lines.append(f"  {gpu}  (GPU image of {p.program}, pid {p.pid}: {p.device_bytes >> 20} MiB of device "
                         "memory)")
        elif p.device_bytes:
            problems.append(f"{p.program} (pid {p.pid}) holds {p.device_bytes >> 20} MiB of device memory but no "
                            f"GPU image was written at {gpu} (its stderr says why)")
        elif p.has_proxy:
            lines.append(f"  (no GPU image of {p.program}, pid {p.pid}: it holds no device memory)")
    if problems:
        raise Failed("; ".join(problems))
    _sync([*images, *gpu_images, script])
    count = sum(1 for line in lines if not line.startswith("  ("))
    dirs = sorted({str(i.parent) for i in images})
    restart = [f"restart: nvproxy restart {dirs[0]}"] if len(dirs) == 1 else []
    return [f"checkpoint written: {count} images, complete and synced to disk", *lines, *restart]


def main(port: int, timeout: float, overlap: bool = True, concurrent: bool | None = None) -> int:
    try:
        lines = checkpoint(port, timeout, overlap, concurrent)
    except Failed as e:
        print(f"nvproxy checkpoint: {e}", file=sys.stderr)
        return 1
    print("\n".join(lines))
    return 0
