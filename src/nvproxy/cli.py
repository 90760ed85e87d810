"""The nvproxy command line: each command (COMMANDS) and its options."""

from __future__ import annotations

import argparse
import functools
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

from . import install_problem, libcuda_name_path, shim_path


def cmd_run(args: argparse.Namespace) -> int:
    from . import settings
    from .launcher import dmtcp_problem, exec_app, proxy_env, spawn_proxy

    argv = [a for a in args.command if a != "--"] if args.command[:1] == ["--"] else args.command
    if not argv:
        print("nvproxy run: no command given", file=sys.stderr)
        return 2
    dmtcp = args.dmtcp or bool(args.dmtcp_args)
    readers = (settings.SHIM, settings.PROXY, settings.RUN, settings.TEST_HOOKS) + ((settings.DMTCP,) if dmtcp else ())
    settings.check_or_exit(os.environ, readers, "nvproxy run")
    if _bad_sim_kernels(args.sim_kernels, "nvproxy run"):
        return 2
    if dmtcp and (why := dmtcp_problem("dmtcp_launch")):
        print(why, file=sys.stderr)
        return 2
    refusal = _containment_refusal(argv)
    if refusal is not None:
        if not args.allow_unprotected:
            print(refusal, file=sys.stderr)
            return 2
        print(f"nvproxy run: {argv[0]} runs UNPROTECTED, without nvproxy: no checkpoint can save its GPU state",
              file=sys.stderr)
        return _exec_plainly(argv)
    env = proxy_env(args.backend, args.sim_kernels)
    taken = None if dmtcp else _take_from_pool(env)
    if taken is not None:
        sock, pid = taken
    else:  # (not waited for: the program starts while its proxy does, and its first call waits for the rest;
        # under DMTCP, whose start takes longer anyway, the proxy listens before it)
        sock, pid = spawn_proxy(os.getpid(), env, wait=dmtcp)
    exec_app(argv, sock, pid, env, args.dmtcp_args.split() if dmtcp else None)
    return 127


def _bad_sim_kernels(paths: list[str], command: str) -> bool:
    """Is one of the --sim-kernels paths not Python files to load? (said in one line)"""
    from . import settings

    for path in paths:
        why = settings.python_files(path)
        if why:
            print(f"{command}: --sim-kernels {why}", file=sys.stderr)
            return True
    return False


def _take_from_pool(env: dict[str, str]) -> tuple[str, int] | None:
    """(socket, pid) of a warm proxy of the pool (nvproxy pool) for this process, another started in its place
    (of the backend the taken one was started with: the pool keeps its own); None where the pool has none of these
    settings and backend."""
    from .launcher import private_dir_path

    try:
        if not any(n.startswith("pool-") for n in os.listdir(private_dir_path())):
            return None
    except OSError:
        return None
    from . import pool

    taken = pool.take(env)
    if taken is None:
        return None
    pool.spawn(env, taken.idle, wait=False, backend=taken.backend)
    return taken.socket, taken.pid


def cmd_pool(args: argparse.Namespace) -> int:
    from . import pool, settings
    from .launcher import proxy_env

    if args.action == "start":
        settings.check_or_exit(os.environ, (settings.SHIM, settings.PROXY, settings.RUN), "nvproxy pool")
        if _bad_sim_kernels(args.sim_kernels, "nvproxy pool"):
            return 2
        env = proxy_env(args.backend, args.sim_kernels)
        for _ in range(args.size):
            sock, pid = pool.spawn(env, args.idle, wait=True)
            print(f"nvproxy pool: proxy {pid} ready at {sock} for {args.idle:g} s")
        return 0
    answers = pool.ask_all({"cmd": "stop" if args.action == "stop" else "status"})
    for path, info in answers:
        if args.action == "stop":
            print(f"nvproxy pool: stopped proxy {info.get('pid')}")
        else:
            print(f"nvproxy pool: proxy {info.get('pid')} at {path}, backend {info.get('backend')} (started as "
                  f"{info.get('started')}), up {info.get('age', 0):.0f} s, expires in {info.get('left', 0):.0f} s")
    if not answers:
        print("nvproxy pool: no warm proxies")
    return 0


def _containment_refusal(argv: list[str]) -> str | None:
    """Why argv's GPU work would bypass the proxy (a statically linked CUDA runtime), or None."""
    from .containment import check_program

    return check_program(argv)


def _exec_plainly(argv: list[str]) -> int:
    """Run argv without the shim (a static runtime under the shim fails loudly at its first call instead)."""
    ours = {str(shim_path()), str(libcuda_name_path())}
    kept = [p for p in os.environ.get("LD_PRELOAD", "").split(":") if p and os.path.realpath(p) not in ours]
    if kept:
        os.environ["LD_PRELOAD"] = ":".join(kept)
    else:
        os.environ.pop("LD_PRELOAD", None)
    try:
        os.execvp(argv[0], argv)
    except OSError as e:
        print(f"nvproxy run: cannot run {argv[0]}: {e.strerror}", file=sys.stderr)
    return 127


def _since_exec() -> float:
    """Seconds since this process began (to 10 ms): what starting the interpreter, importing and the driver's
    initialisation took before a restore (0 where /proc cannot say)."""
    try:
        with open("/proc/self/stat") as f:
            start = int(f.read().rsplit(")", 1)[1].split()[19])  # (field 22, starttime, in clock ticks)
        with open("/proc/uptime") as f:
            return max(0.0, float(f.read().split()[0]) - start / os.sysconf("SC_CLK_TCK"))
    except (OSError, ValueError, IndexError):
        return 0.0


def _driver_times(born: float) -> dict[str, float]:
    """When, in s since this process began (born: then, on time.monotonic()'s clock), the driver's initialisation
    began and a restore's contexts were made (backends/warmup.py; nothing where it did not run)."""
    if "nvproxy.backends.warmup" not in sys.modules:
        return {}
    from .backends import warmup

    return {k: t - born for k, t in (("cuinit_at", warmup.began), ("contexts_at", warmup.ready)) if t}


def _more_descriptors() -> None:
    """Up to the hard limit of open files: every application thread's channel holds a socket and its mailbox's
    memfd here (and a staging memfd once it copies pageable memory), and 1024 is a common soft limit."""
    import resource

    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    want = 1 << 20 if hard == resource.RLIM_INFINITY else hard  # (1 << 20: Linux's default fs.nr_open)
    if soft != resource.RLIM_INFINITY and want > soft:
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (want, hard))
        except (ValueError, OSError):
            pass  # (kept as it was)


def _not_the_image(path: str, header: dict, want: str) -> str | None:
    """Why the image at path is not the one a DMTCP image was taken with (None: it is).  A GPU image written after
    DMTCP's own (NVPROXY_DMTCP_OVERLAP) is missing, or an earlier checkpoint's, where the program was ended first."""
    if want == "unwritten":  # (the plugin's word for a checkpoint whose GPU image the proxy failed to write)
        return ("this DMTCP checkpoint's GPU image was not written (the program's stderr said why at the checkpoint), "
                "so this checkpoint cannot be restarted")
    late = ("the program ended before this DMTCP checkpoint's GPU image was written (it is written after DMTCP's "
            "own image where NVPROXY_DMTCP_OVERLAP or nvproxy checkpoint --dmtcp asks), so this checkpoint cannot be "
            "restarted")
    if not os.path.exists(path):
        return f"it does not exist; {late}"
    if header and header.get("id") != want:
        return f"it is the GPU image of another checkpoint (id {header.get('id')}, not {want}); {late}"
    return None


def cmd_proxy(args: argparse.Namespace) -> int:
    # started from a checkpointer's hook, the signal mask may block nearly everything
    signal.pthread_sigmask(signal.SIG_SETMASK, [])
    _more_descriptors()
    from . import settings

    settings.check_or_exit(os.environ, (settings.PROXY,), "nvproxy proxy")
    log = os.environ.get("NVPROXY_PROXY_LOG")
    if log:  # the proxy's own messages to a file rather than the application's stderr
        try:
            fd = os.open(log, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
        except OSError as e:
            print(f"nvproxy proxy: NVPROXY_PROXY_LOG={log}: {e.strerror}", file=sys.stderr)
            return 2
        os.dup2(fd, 2)
        os.close(fd)
    sys.stdout = sys.stderr  # fd 1 belongs to kernel printf output
    import faulthandler

    faulthandler.enable()  # a crash in the driver or cffi leaves a trace on stderr
    faulthandler.register(signal.SIGUSR1, all_threads=True)  # kill -USR1 <proxy>: where is every thread?
    # hold on to no one's terminal or pipes but stderr (the application's, or, when
    # migrating, the controller's until the hand-over)
    null = os.open(os.devnull, os.O_RDWR)
    os.dup2(null, 0)
    os.dup2(null, 1)
    os.close(null)
    from . import boot

    # (done already where boot.main started this proxy: the application's ranges held, the driver started)
    header = boot.begin(args.restore, args.backend or os.environ.get("NVPROXY_BACKEND") or "auto")
    for note in boot.notes:
        print(note, file=sys.stderr)
    if boot.held:
        from .proxy import libc

        libc.adopt_holds(boot.held)
    if args.restore and args.image_id and (why := _not_the_image(args.restore, header, args.image_id)):
        print(f"nvproxy: cannot restore from {args.restore}: {why}", file=sys.stderr)
        return 1
    check = None
    if header:
        from .checkpoint import earlycheck

        check = earlycheck.start(args.restore, header)  # (its sums, while the driver makes the contexts)
    from .backends import open_backend
    from .proxy.dispatch import Dispatcher
    from .proxy.server import Server

    try:
        backend = open_backend(args.backend)
    except Exception as e:  # (a sim kernel file that raises, a driver that fails): one line, and the program's
        # first call fails (the shim says the proxy ended)
        print(f"nvproxy: the proxy cannot open its backend: {type(e).__name__}: {e}", file=sys.stderr)
        return 1
    dispatch = Dispatcher(backend)
    from . import stale

    stale.sweep_private_dir()  # (the sockets of proxies that died without removing theirs)
    listener = None
    if args.pool_idle is not None:  # a warm proxy of the pool: it serves whoever takes it
        from . import pool

        if args.adopt or args.restore:
            print("nvproxy proxy: --pool-idle starts a new proxy: not with --adopt or --restore", file=sys.stderr)
            return 2
        taken = pool.wait_to_be_taken(args.socket, args.pool_idle, args.backend or pool.backend_of(os.environ),
                                      backend.name)
        if taken is None:
            os._exit(0)  # (expired or stopped; its socket is gone)
        args.socket, args.owner_pid, listener = taken.sock, taken.owner_pid, taken.listener
    if args.adopt:
        server = _adopt(args, backend, dispatch)
        if server is None:
            return 1
    elif args.restore:  # the application lost its proxy and wants this image back (NVPROXY_RECOVER)
        from .checkpoint.image import ImageError
        from .checkpoint.restore import restore_image
        from .proxy.handlers import graphs, ipc

        started = _since_exec()
        born = time.monotonic() - started
        try:
            stats = restore_image(dispatch.state, args.restore, None, functools.partial(graphs.defer_restore, dispatch),
                                  check=check)
            stats["phases"] = {"proxy_start": started, **stats["phases"], **_driver_times(born)}
        except (ImageError, OSError) as e:
            print(f"nvproxy: cannot recover from {args.restore}: {e}", file=sys.stderr)
            return 1
        finally:
            if check is not None:
                check.stop()
        dispatch.captures_changed()  # (managed variables: launches through Python)
        phases = ", ".join(f"{k} {v:.3f}" for k, v in stats["phases"].items())
        print(f"nvproxy: restored {stats['device_bytes'] >> 20} MiB from {args.restore} in {stats['seconds']:.3f} s "
              f"({stats['gbps']:.1f} GB/s; s per phase: {phases}); %d of its %d chunks were summed while the proxy "
              "started" % stats["checked_early"], file=sys.stderr)
        server = Server(args.socket, args.owner_pid, backend, dispatch, owner_fd=args.owner_pidfd)
        ipc.register(dispatch.state, server.ctl_path)  # (importers restored too may open its memory now)
    else:
        server = Server(args.socket, args.owner_pid, backend, dispatch, listener=listener, owner_fd=args.owner_pidfd)
    dispatch.server = server
    try:
        server.serve()
    except Exception as e:
        import traceback

        traceback.print_exc()
        raise SystemExit(f"nvproxy: proxy failed: {e!r}") from None
    os._exit(0)  # driver threads must not keep a proxy alive without its application


def _adopt(args: argparse.Namespace, backend, dispatch):
    """Take over from a running proxy: it checkpoints into an image, hands over
    its connections, and exits once this proxy has restored the image."""
    import socket

    from .checkpoint.hostimage import HostImage
    from .checkpoint.image import ImageError
    from .checkpoint.restore import restore_image
    from .proxy import control
    from .proxy.handlers import graphs, ipc
    from .proxy.server import Server

    # the old proxy's host image buffer becomes ours: mapped and registered while the application runs
    t = time.monotonic()
    ctl = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        himg = _early_buffer(args.adopt, backend)
        prepare_s = time.monotonic() - t
        ctl.connect(args.adopt)
        control.send(ctl, {"cmd": "handoff", "image": args.image})
        info, blob, fds = control.recv(ctl)
    except (FileNotFoundError, ConnectionError):  # (it ended meanwhile, with its application most likely: before
        # the connection, or with it open, which then closes before the answer)
        if args.report_fd is not None:  # (nvproxy migrate says so, in its one line)
            os.write(args.report_fd, b"gone\n")
        else:
            print(f"nvproxy migrate: the proxy to take over from has ended ({args.adopt} is gone)", file=sys.stderr)
        return None
    if not info.get("ok"):
        print(f"nvproxy migrate: the running proxy refused: {info.get('error')}", file=sys.stderr)
        return None
    n_chan_fds = sum(1 + bool(d["staging"]) + bool(d.get("mailbox")) for d in info["channels"])
    at = 2 + n_chan_fds + len(info["host"])
    host_fds = dict(zip(info["host"], fds[2 + n_chan_fds : at], strict=True))
    exported = dict(zip(info["ipc_exported"], fds[at:-1], strict=True))  # (CUDA IPC: the memory itself)
    try:
        t = time.monotonic()  # (what the buffer grew by since is registered now, and counts)
        if himg is None or not himg.follow(fds[-1]):
            if himg is not None:
                himg.close()
            himg = HostImage(backend, 0, fd=fds[-1])
        dispatch.state.host_image = himg
        pin_s = time.monotonic() - t
        stats = restore_image(dispatch.state, himg, host_fds, functools.partial(graphs.restore, dispatch),
                              exported)
        dispatch.captures_changed()  # (managed variables: launches through Python)
        stats["seconds"] += pin_s
        stats["phases"] = dict(stats["phases"], buffer=pin_s)
        stats["gbps"] = stats["device_bytes"] / stats["seconds"] / 1e9 if stats["seconds"] else 0.0
    except (ImageError, OSError) as e:
        print(f"nvproxy migrate: {e}", file=sys.stderr)
        control.send(ctl, {"cmd": "resume", "error": str(e)})
        return None
    finally:
        for fd in exported.values():  # (the restore imported what it needed)
            os.close(fd)
    if not os.environ.get("NVPROXY_PROXY_LOG"):
        os.dup2(fds[1], 2)  # from now on, speak on the application's stderr
    server = Server(args.socket, args.owner_pid, backend, dispatch, listener=socket.socket(fileno=fds[0]),
                    owner_fd=args.owner_pidfd)
    server.adopt(info, blob, fds)
    ipc.register(dispatch.state, server.ctl_path)  # (importers of its memory ask this proxy from now on)
    control.send(ctl, {"cmd": "done"})
    ctl.close()
    if args.report_fd is not None:  # (nvproxy migrate learns that the hand-over happened, not only that one ended)
        try:
            os.write(args.report_fd, b"adopted\n")
            os.close(args.report_fd)
        except OSError:
            pass
    phases = ", ".join(f"{k} {v:.3f}" for k, v in stats["phases"].items())
    print(f"nvproxy: restored {stats['device_bytes'] >> 20} MiB in {stats['seconds']:.3f} s "
          f"({stats['gbps']:.1f} GB/s; s per phase: {phases}; buffer prepared before in {prepare_s:.3f} s); "
          f"checkpoint took {info['stats']['seconds']:.3f} s "
          f"({info['stats']['gbps']:.1f} GB/s)", file=sys.stderr)
    return server


def _early_buffer(ctl_path: str, backend):
    """The running proxy's host image buffer, mapped and registered here (None if it
    has none to give: the hand-over then brings it)."""
    import socket

    from .checkpoint.hostimage import HostImage
    from .proxy import control

    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as ctl:
        ctl.connect(ctl_path)
        control.send(ctl, {"cmd": "buffer"})
        info, _blob, fds = control.recv(ctl)
    if not info.get("ok") or not fds:
        for fd in fds:
            os.close(fd)
        return None
    try:
        return HostImage(backend, 0, fd=fds[0])
    except OSError as e:
        print(f"nvproxy migrate: cannot map the running proxy's image buffer early ({e})", file=sys.stderr)
        os.close(fds[0])
        return None


def _dmtcp_checkpoint(args: argparse.Namespace) -> int:
    """A DMTCP checkpoint of the whole computation, reported once every image is complete (dmtcp_checkpoint.py)."""
    from . import dmtcp_checkpoint, settings

    settings.check_or_exit(os.environ, (settings.DMTCP,), "nvproxy checkpoint")
    port = args.coord_port or int(os.environ.get("DMTCP_COORD_PORT") or 7779)
    return dmtcp_checkpoint.main(port, args.timeout, args.overlap, args.concurrent)


def cmd_restart(args: argparse.Namespace) -> int:
    """dmtcp_restart of the images in a checkpoint directory (nvproxy's GPU image is found by the plugin)."""
    from . import settings
    from .launcher import dmtcp_problem, dmtcp_tool

    if args.device is not None and (why := settings.problem_of("NVPROXY_DEVICES", args.device)):
        print(f"nvproxy restart: --device {args.device}: {why}", file=sys.stderr)
        return 2
    settings.check_or_exit(os.environ, (settings.DMTCP,), "nvproxy restart")
    if why := dmtcp_problem("dmtcp_restart"):
        print(why, file=sys.stderr)
        return 2
    if not Path(args.dir).is_dir():
        print(f"nvproxy restart: {args.dir} is not a directory", file=sys.stderr)
        return 2
    images = sorted(str(p) for p in Path(args.dir).glob("ckpt_*.dmtcp"))
    if not images:
        print(f"nvproxy restart: no DMTCP images in {args.dir}", file=sys.stderr)
        return 1
    cmd = [dmtcp_tool("dmtcp_restart"), "--no-strict-checking"]
    if args.coord_port:
        cmd += ["--coord-port", str(args.coord_port)]
    if args.device is not None:
        # read by the plugin through dmtcp_get_restart_env: the restored
        # application keeps the environment it was checkpointed with
        os.environ["NVPROXY_DEVICES"] = args.device
    os.execv(cmd[0], cmd + images)
    return 127


def _control_call(sock: str, proxy_pid: int, msg: dict, notice: Callable[[dict], None] | None = None,
                  deadline: float | None = None) -> dict:
    """One command on a proxy's control socket; its reply (notice: given what the proxy says before it, if it
    asks for that: msg["notices"]; deadline: a time.monotonic() by which the reply must have come)."""
    import socket

    from .proxy import control

    try:
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as c:
            c.connect(f"{sock}.{proxy_pid}.ctl")
            control.send(c, msg)
            reply, _b, _f = control.recv(c, deadline)
            while "notice" in reply and notice is not None:
                notice(reply)
                reply, _b, _f = control.recv(c, deadline)
    except TimeoutError:
        return {"ok": False, "error": f"proxy {proxy_pid} did not answer in time"}
    except (FileNotFoundError, ConnectionRefusedError):
        return {"ok": False, "error": f"proxy {proxy_pid} has ended (the program ended, or it was killed)",
                "ended": True}
    except (ConnectionError, OSError) as e:
        why = "closed its connection" if isinstance(e, ConnectionError) else e.strerror or str(e)
        return {"ok": False, "error": f"proxy {proxy_pid} ended before it answered ({why})", "lost": True}
    return reply


def _remove_partial_image(image: str, proxy_pid: int) -> None:
    """The temporary file a proxy killed while it wrote image left behind (checkpoint/image.py atomic_file)."""
    from .checkpoint.image import temp_prefix

    d, name = os.path.split(image)
    for leftover in Path(d or ".").glob(temp_prefix(name, proxy_pid) + "*.tmp"):
        leftover.unlink(missing_ok=True)


def _image_path(output: str | None, app_pid: int) -> tuple[str, str]:
    """(image file, what to tell first) for `nvproxy checkpoint -o OUTPUT`; SystemExit(2) with one line where no
    image can be written there."""
    default = f"nvproxy-{app_pid}.img"
    path = os.path.abspath(output or default)
    note = ""
    if os.path.isdir(path):  # (a directory: the image goes in it)
        path, note = os.path.join(path, default), f"{output} is a directory: writing {os.path.join(output, default)}"
    parent = os.path.dirname(path)
    if os.path.exists(path) and not os.path.isfile(path):
        why = "it exists and is not a regular file"
    elif not os.path.isdir(parent):
        why = f"no directory {parent}"
    elif not os.access(parent, os.W_OK | os.X_OK):
        why = f"the directory {parent} is not writable"
    else:
        return path, note
    print(f"nvproxy checkpoint: cannot write {path}: {why}", file=sys.stderr)
    raise SystemExit(2)


def cmd_checkpoint(args: argparse.Namespace) -> int:
    """Write a checkpoint image of a running application's GPU state; it goes on."""

    if args.dmtcp:
        return _dmtcp_checkpoint(args)
    if args.pid is None:
        print("nvproxy checkpoint: give the application's pid (or --dmtcp)", file=sys.stderr)
        return 2

    from .launcher import find_proxy

    image, note = _image_path(args.output, args.pid)
    pid, sock = find_proxy(args.pid)
    if note:
        print(f"nvproxy checkpoint: {note}", file=sys.stderr)
    def released(n: dict) -> None:  # (a concurrent checkpoint: the application goes on now, the copy goes on)
        print(f"{image}: the application went on after {n['stopped_s'] * 1e3:.1f} ms; the image is being copied "
              "out", flush=True)

    reply = _control_call(sock, pid, {"cmd": "checkpoint", "image": image, "incremental": args.incremental,
                                      "verify": not args.tracked, "concurrent": args.concurrent, "notices": True},
                          released)
    # (a connection the proxy closed without an answer: it is ending, though /proc may not say so yet: a killed
    # process closes its descriptors before it becomes a zombie)
    from .boot import live

    if not reply.get("ok") and (reply.get("lost") or not live(pid)):
        _remove_partial_image(image, pid)
        print(f"nvproxy checkpoint: no image of process {args.pid} written to {image}: {reply.get('error')}",
              file=sys.stderr)
        return 1
    if not reply.get("ok"):
        print(f"nvproxy checkpoint: {reply.get('error')}", file=sys.stderr)
        return 1
    s = reply["stats"]
    if s.get("note"):
        print(f"nvproxy checkpoint: {s['note']}", file=sys.stderr)
    print(f"{image}: {s.get('copied_bytes', s['device_bytes']) >> 20} MiB of device memory copied out in "
          f"{s['seconds']:.3f} s "
          f"({s['gbps']:.1f} GB/s); the application was stopped {s['stopped_s']:.3f} s; "
          f"file written in {s['file_s']:.3f} s")
    if s.get("concurrent"):
        from .checkpoint.report import concurrent_line

        print(concurrent_line(s))
    if args.incremental:
        from .checkpoint.report import incremental_line

        print(incremental_line(s))
    return 0


def cmd_migrate(args: argparse.Namespace) -> int:
    """Move a running application's GPU state into a new proxy (optionally on another GPU)."""
    from .launcher import alive, find_proxy, how_it_ended, proxy_env, spawn_proxy

    old_pid, sock = find_proxy(args.pid)
    # the image travels in memory (the old proxy's host image buffer); --image also writes it out
    image = os.path.abspath(args.image) if args.image else None
    env = proxy_env(None, [])
    try:  # the new proxy runs like the old one (backend, sim kernels)
        raw = Path(f"/proc/{old_pid}/environ").read_bytes()
    except OSError:
        raw = b""
    if not raw:  # (gone, or ending: a zombie's environment reads empty, and a new proxy would not run like it)
        return _nothing_to_migrate(args.pid, old_pid, alive)
    for item in raw.split(b"\0"):
        k, _, v = item.decode(errors="replace").partition("=")
        if k in ("NVPROXY_BACKEND", "NVPROXY_SIM_KERNELS", "NVPROXY_SIM_DEVICES", "CUDA_VISIBLE_DEVICES"):
            env[k] = v
    if args.device is not None:
        env["CUDA_VISIBLE_DEVICES"] = args.device
    # the new proxy says on this pipe when it has taken over: the old one's end alone does not say so (the
    # application, and with it the old proxy, may end first, and the new one then has nothing to take over)
    r, w = os.pipe()
    os.set_inheritable(w, True)
    extra = ["--adopt", f"{sock}.{old_pid}.ctl", "--report-fd", str(w)] + (["--image", image] if image else [])
    try:
        _s, new_pid = spawn_proxy(args.pid, env, extra, sock=sock, wait=False)
    finally:
        os.close(w)
    try:
        said = _read_within(r, args.timeout)
    finally:
        os.close(r)
    if said is None:
        print("nvproxy migrate: timed out", file=sys.stderr)
        return 1
    if said.startswith(b"adopted"):
        print(f"migrated process {args.pid}: proxy {old_pid} -> {new_pid}")
        return 0
    if said.startswith(b"gone"):
        return _nothing_to_migrate(args.pid, old_pid, alive)
    time.sleep(0.05)  # (so that how_it_ended may see its exit status)
    how = how_it_ended(new_pid)
    if alive(old_pid):
        print(f"nvproxy migrate: the new proxy failed{how}; process {args.pid} goes on with proxy {old_pid}",
              file=sys.stderr)
    else:
        ended = "" if alive(args.pid) else f"; process {args.pid} has ended"
        print(f"nvproxy migrate: the new proxy ended{how} before it took over, and proxy {old_pid} has ended "
              f"too{ended}", file=sys.stderr)
    return 1


def _nothing_to_migrate(app_pid: int, proxy_pid: int, alive: Callable[[int], bool]) -> int:
    state = "still runs" if alive(app_pid) else "has ended"
    print(f"nvproxy migrate: nothing to migrate: proxy {proxy_pid} has ended before the hand-over; process "
          f"{app_pid} {state}", file=sys.stderr)
    return 1


def _read_within(fd: int, timeout: float) -> bytes | None:
    """What arrives on fd until its end, None if it has not ended within timeout seconds."""
    import select

    got = b""
    deadline = time.monotonic() + timeout
    while (left := deadline - time.monotonic()) > 0:
        if select.select([fd], [], [], left)[0]:
            chunk = os.read(fd, 64)
            got += chunk
            if not chunk or got.endswith(b"\n"):
                return got
    return None


def cmd_demo(args: argparse.Namespace) -> int:
    """Build the bundled example with nvcc and run it under nvproxy."""
    nvcc = shutil.which("nvcc")
    if not nvcc:
        print("nvproxy demo: nvcc is not on PATH", file=sys.stderr)
        return 2
    from importlib import resources

    ex = resources.files("nvproxy").joinpath("examples")
    with tempfile.TemporaryDirectory() as td:
        src = Path(td) / "vector_add.cu"
        src.write_text(ex.joinpath("vector_add.cu").read_text())
        kern = Path(td) / "vector_add_sim.py"
        kern.write_text(ex.joinpath("vector_add_sim.py").read_text())
        exe = Path(td) / "vector_add"
        print(f"nvproxy demo: nvcc -cudart shared -o {exe.name} {src.name}", file=sys.stderr)
        subprocess.run([nvcc, "-cudart", "shared", "-o", str(exe), str(src)], check=True)
        cmd = [sys.executable, "-m", "nvproxy", "run", "--sim-kernels", str(kern)]
        if args.backend:
            cmd += ["--backend", args.backend]
        return subprocess.run(cmd + ["--", str(exe)]).returncode


def cmd_bench(args: argparse.Namespace) -> int:
    """The benchmark suite (nvproxy.bench): native and nvproxy runs of the same programs, and their ratios."""
    from .bench.run import main as bench_main

    return bench_main(args.rest)


def cmd_info(args: argparse.Namespace) -> int:
    print(f"shim: {shim_path()}")
    print(f"libcuda.so.1 by name (preloaded after the shim): {libcuda_name_path()}")
    return 0


def cmd_settings(args: argparse.Namespace) -> int:
    from . import settings

    if args.markdown:
        print(settings.markdown_table())
        return 0
    print(settings.text_table(os.environ))
    return 2 if settings.problems(os.environ) else 0


def _positive(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        value = float("nan")
    if not 0 < value < float("inf"):
        raise argparse.ArgumentTypeError(f"{text!r} is not a positive number of seconds")
    return value


# (name, one line for `nvproxy --help`); each command's options are in _options
COMMANDS = (
    ("run", "run a CUDA program through nvproxy (a proxy is started for it and ends with it)"),
    ("checkpoint", "write a checkpoint image of a running program's GPU state (or a DMTCP checkpoint); it goes on"),
    ("restart", "restart a DMTCP checkpoint of a program run with nvproxy run --dmtcp"),
    ("migrate", "move a running program's GPU state into a new proxy, live (optionally onto another GPU)"),
    ("demo", "build the bundled vector-add example with nvcc and run it through nvproxy"),
    ("bench", "benchmarks, native against nvproxy in the same run (nvproxy bench --help)"),
    ("settings", "every NVPROXY_* environment setting: default, allowed values, meaning, and its value here"),
    ("info", "where the shim (the LD_PRELOAD library) is"),
    ("pool", "start, stop or list warm proxies that nvproxy run takes instead of starting one (faster start-up)"),
    ("proxy", "the proxy daemon itself (started for you by run or by the shim)"),
)


def _options(name: str, p: argparse.ArgumentParser) -> None:
    if name == "run":
        p.add_argument("--backend", choices=("gpu", "sim"), help="default: gpu if usable, else sim")
        p.add_argument("--sim-kernels", action="append", default=[], help="Python kernels for the sim backend")
        p.add_argument("--dmtcp", action="store_true", help="run under dmtcp_launch with nvproxy as a DMTCP plugin")
        p.add_argument("--dmtcp-args", default="", help="options for dmtcp_launch, e.g. '--coord-port 7779 --no-gzip'")
        p.add_argument("--allow-unprotected", action="store_true",
                       help="run a program nvproxy cannot contain (a static CUDA runtime) plainly, without checkpoints")
        p.add_argument("command", nargs=argparse.REMAINDER)
        p.set_defaults(fn=cmd_run)
    elif name == "proxy":
        p.add_argument("--socket", required=True)
        p.add_argument("--owner-pid", type=int, required=True)
        p.add_argument("--backend", choices=("gpu", "sim"))
        p.add_argument("--adopt", help="control socket of a proxy to take over from (nvproxy migrate)")
        p.add_argument("--image", help="where the proxy being taken over writes its image")
        p.add_argument("--report-fd", type=int, help="a pipe to say 'adopted' on once the hand-over is done")
        p.add_argument("--restore", help="start from this checkpoint image (NVPROXY_RECOVER)")
        p.add_argument("--image-id", help="the id the --restore image must have (a DMTCP restart's)")
        p.add_argument("--owner-pidfd", type=int, help="a pidfd of the owner, inherited from the spawner")
        p.add_argument("--pool-idle", type=_positive, help="a warm proxy of the pool: waits this long to be taken")
        p.set_defaults(fn=cmd_proxy)
    elif name == "pool":
        p.add_argument("action", choices=("start", "stop", "status"))
        p.add_argument("--size", type=int, default=1, help="warm proxies to start (default 1)")
        p.add_argument("--idle", type=_positive, default=600.0,
                       help="seconds a warm proxy waits to be taken before it ends (default 600)")
        p.add_argument("--backend", choices=("gpu", "sim"), help="default: gpu if usable, else sim")
        p.add_argument("--sim-kernels", action="append", default=[], help="Python kernels for the sim backend")
        p.set_defaults(fn=cmd_pool)
    elif name == "checkpoint":
        p.add_argument("pid", type=int, nargs="?")
        p.add_argument("-o", "--output", help="image file, or a directory to write nvproxy-PID.img in "
                       "(default: nvproxy-PID.img here)")
        p.add_argument("--dmtcp", action="store_true", help="checkpoint the DMTCP computation instead (and wait)")
        p.add_argument("--incremental", action="store_true",
                       help="write from the device only what changed since the last image of this program in the "
                       "same directory, taking the rest from that image's file (the image stays whole): everything "
                       "is copied out and compared, and memory that write tracking had not marked is reported")
        p.add_argument("--tracked", action="store_true",
                       help="with --incremental: copy out only what write tracking marks, a shorter stop (exact for "
                       "programs that keep device addresses in pointer-sized words: docs/architecture.md)")
        p.add_argument("--concurrent", action=argparse.BooleanOptionalAction, default=None,
                       help="let the application go on once its device memory is safe (snapshotted in spare device "
                       "memory, or guarded by copy-before-write) and copy it out while it runs (default: "
                       "NVPROXY_CKPT_CONCURRENT); with --dmtcp, once DMTCP lets it go on")
        p.add_argument("--coord-port", type=int, help="DMTCP coordinator port (with --dmtcp; default: "
                       "$DMTCP_COORD_PORT, else 7779)")
        p.add_argument("--overlap", action=argparse.BooleanOptionalAction, default=True,
                       help="with --dmtcp: the GPU images are written while DMTCP writes its images and after the "
                       "program resumes, and this command waits for both (default); --no-overlap writes them before "
                       "DMTCP writes, the program stopped meanwhile")
        p.add_argument("--timeout", type=_positive, default=600, help="seconds (default 600)")
        p.set_defaults(fn=cmd_checkpoint)
    elif name == "restart":
        p.add_argument("dir", help="DMTCP's checkpoint directory")
        p.add_argument("--coord-port", type=int, help="DMTCP coordinator port")
        p.add_argument("--device", help="GPU(s) to restart on, as CUDA_VISIBLE_DEVICES (default: as before)")
        p.set_defaults(fn=cmd_restart)
    elif name == "migrate":
        p.add_argument("pid", type=int)
        p.add_argument("--device", help="GPU(s) for the new proxy, as CUDA_VISIBLE_DEVICES")
        p.add_argument("--image", help="also write the image to this file (it moves in memory either way)")
        p.add_argument("--timeout", type=_positive, default=600, help="seconds (default 600)")
        p.set_defaults(fn=cmd_migrate)
    elif name == "demo":
        p.add_argument("--backend", choices=("gpu", "sim"))
        p.set_defaults(fn=cmd_demo)
    elif name == "bench":
        p.add_argument("rest", nargs=argparse.REMAINDER)
        p.set_defaults(fn=cmd_bench)
    elif name == "settings":
        p.add_argument("--markdown", action="store_true", help="the table as Markdown (as the user guide has it)")
        p.set_defaults(fn=cmd_settings)
    elif name == "info":
        p.set_defaults(fn=cmd_info)


def parser() -> argparse.ArgumentParser:
    width = max(len(name) for name, _ in COMMANDS)
    listing = "\n".join(f"  {name:<{width}}  {line}" for name, line in COMMANDS)
    ap = argparse.ArgumentParser(prog="nvproxy", formatter_class=argparse.RawDescriptionHelpFormatter,
                                 description="Transparent checkpoint/restart for unmodified CUDA programs.",
                                 epilog=f"commands:\n{listing}\n\n'nvproxy COMMAND --help' for a command's options.")
    sub = ap.add_subparsers(dest="cmd", required=True, metavar="COMMAND", help="one of the commands below")
    for name, line in COMMANDS:
        _options(name, sub.add_parser(name, description=line))
    return ap


def whole_lines() -> None:
    """Each line on stderr in one write.  A program, its proxy and a migration's new proxy share one stderr, and
    Python's stderr writes a message and its newline apart (write-through): another process's line could come
    between the two, leaving two messages on one line and an empty one after."""
    try:
        sys.stderr.reconfigure(line_buffering=True, write_through=False)  # type: ignore[union-attr]
    except (AttributeError, ValueError):  # (not a text stream of io's: a test's capture, say)
        pass


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    whole_lines()
    bench = argv[:1] == ["bench"]  # (every option of bench belongs to the benchmark runner)
    args = argparse.Namespace(rest=argv[1:], fn=cmd_bench) if bench else parser().parse_args(argv)
    if args.fn is not cmd_settings and (problem := install_problem()):
        print(problem, file=sys.stderr)
        return 1
    try:
        return int(args.fn(args) or 0)
    except BrokenPipeError:  # (its output went into `head`, say, which has had enough)
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 0
