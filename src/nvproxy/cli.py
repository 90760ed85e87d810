"""The nvproxy command: run | proxy | demo | info."""

from __future__ import annotations

import argparse
import os
import shutil
import signal
import subprocess
import sys
import tempfile
from importlib import resources
from pathlib import Path

from . import shim_path


def cmd_run(args: argparse.Namespace) -> int:
    from .launcher import exec_app, proxy_env, spawn_proxy

    argv = [a for a in args.command if a != "--"] if args.command[:1] == ["--"] else args.command
    if not argv:
        print("nvproxy run: no command given", file=sys.stderr)
        return 2
    sock, pid = spawn_proxy(os.getpid(), proxy_env(args.backend, args.sim_kernels))
    exec_app(argv, sock, pid)
    return 127


def cmd_proxy(args: argparse.Namespace) -> int:
    # started from a checkpointer's hook, the signal mask may block nearly everything
    signal.pthread_sigmask(signal.SIG_SETMASK, [])
    sys.stdout = sys.stderr  # fd 1 belongs to kernel printf output
    from .backends import open_backend
    from .proxy.dispatch import Dispatcher
    from .proxy.server import Server

    backend = open_backend(args.backend)
    dispatch = Dispatcher(backend)
    server = Server(args.socket, args.owner_pid, backend, dispatch)
    dispatch.server = server
    server.serve()
    os._exit(0)  # driver threads must not keep a proxy alive without its application


def cmd_demo(args: argparse.Namespace) -> int:
    """Build the bundled example with nvcc and run it under nvproxy."""
    nvcc = shutil.which("nvcc")
    if not nvcc:
        print("nvproxy demo: nvcc is not on PATH", file=sys.stderr)
        return 2
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
    """The microbenchmark suite (benchmarks/run.py of the source tree)."""
    runner = Path(__file__).resolve().parents[2] / "benchmarks" / "run.py"
    if not runner.exists():
        print("nvproxy bench: benchmarks/ is part of the source tree; run it from a checkout", file=sys.stderr)
        return 2
    return subprocess.run([sys.executable, str(runner), *args.rest]).returncode


def cmd_info(args: argparse.Namespace) -> int:
    print(f"shim: {shim_path()}")
    return 0


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["bench"]:  # every option belongs to the runner
        return cmd_bench(argparse.Namespace(rest=argv[1:]))
    ap = argparse.ArgumentParser(prog="nvproxy", description=__doc__)
    sub = ap.add_subparsers(dest="cmd", required=True)
    r = sub.add_parser("run", help="run a CUDA program through nvproxy")
    r.add_argument("--backend", choices=("gpu", "sim"), help="default: gpu if usable, else sim")
    r.add_argument("--sim-kernels", action="append", default=[], help="Python kernels for the sim backend")
    r.add_argument("command", nargs=argparse.REMAINDER)
    r.set_defaults(fn=cmd_run)
    p = sub.add_parser("proxy", help="the proxy daemon (started for you by run or the shim)")
    p.add_argument("--socket", required=True)
    p.add_argument("--owner-pid", type=int, required=True)
    p.add_argument("--backend", choices=("gpu", "sim"))
    p.set_defaults(fn=cmd_proxy)
    d = sub.add_parser("demo", help="build and run the bundled vector-add example")
    d.add_argument("--backend", choices=("gpu", "sim"))
    d.set_defaults(fn=cmd_demo)
    b = sub.add_parser("bench", help="microbenchmarks, native vs nvproxy (options: benchmarks/run.py --help)")
    b.add_argument("rest", nargs=argparse.REMAINDER)
    b.set_defaults(fn=cmd_bench)
    i = sub.add_parser("info", help="where the shim is")
    i.set_defaults(fn=cmd_info)
    args = ap.parse_args(argv)
    return int(args.fn(args) or 0)
