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
import time
from pathlib import Path

import pytest
from conftest import nvproxy_cmd, run

BACKENDS = ["sim", pytest.param("gpu", marks=pytest.mark.gpu)]


def dmtcp_bin() -> Path:
    base = os.environ.get("NVPROXY_DMTCP_DIR")
    if base and (Path(base) / "bin" / "dmtcp_launch").exists():
        return Path(base) / "bin"
    found = shutil.which("dmtcp_launch")
    if not found:
        pytest.skip("DMTCP is not installed (no dmtcp_launch on PATH or in $NVPROXY_DMTCP_DIR/bin)")
    return Path(found).parent


@pytest.mark.parametrize("backend", BACKENDS)
def test_dmtcp_checkpoint_kill_restart(build, backend: str, tmp_path: Path) -> None:
    bin_ = dmtcp_bin()
    exe = build("ckpt_steps")
    reference = run(nvproxy_cmd(exe, backend, "ckpt_steps", "40", "0")).stdout.splitlines(keepends=True)
    env = dict(os.environ, PATH=f"{bin_}:{os.environ['PATH']}")
    env.pop("LD_PRELOAD", None)
    port_file = tmp_path / "port"
    subprocess.run([str(bin_ / "dmtcp_coordinator"), "--daemon", "--exit-on-last", "--coord-port", "0",
                    "--port-file", str(port_file), "--ckptdir", str(tmp_path)], check=True, env=env,
                   capture_output=True)
    for _ in range(100):
        if port_file.exists() and port_file.read_text().strip():
            break
        time.sleep(0.05)
    port = port_file.read_text().strip()
    out = open(tmp_path / "out.txt", "w")  # a file: DMTCP restores it, a pipe it would not
    cmd = nvproxy_cmd(exe, backend, "ckpt_steps", "40", "150")
    cmd[cmd.index("--"):cmd.index("--")] = ["--dmtcp-args", f"--coord-port {port} --no-gzip --ckptdir {tmp_path}"]
    app = subprocess.Popen(cmd, stdout=out, stderr=subprocess.PIPE, text=True, env=env)
    try:
        for _ in range(200):  # a few steps first
            if (tmp_path / "out.txt").read_text().count("\n") >= 4:
                break
            time.sleep(0.05)
        command = [str(bin_ / "dmtcp_command"), "--coord-port", port]
        ck = subprocess.run([sys.executable, "-m", "nvproxy", "checkpoint", "--dmtcp", "--coord-port", port],
                            env=env, capture_output=True, text=True, timeout=300)
        assert ck.returncode == 0, ck.stderr
        assert list(tmp_path.glob("ckpt_*.dmtcp")), "DMTCP wrote no image"
        assert list(tmp_path.glob("nvproxy-*.img")), "the plugin wrote no GPU image beside DMTCP's"
        subprocess.run([*command, "-k"], env=env, capture_output=True, timeout=60)
        app.wait(timeout=60)
    finally:
        if app.poll() is None:
            app.kill()
    subprocess.run([str(bin_ / "dmtcp_coordinator"), "--daemon", "--exit-on-last", "--coord-port", port,
                    "--ckptdir", str(tmp_path)], env=env, capture_output=True)
    r = subprocess.run([sys.executable, "-m", "nvproxy", "restart", str(tmp_path), "--coord-port", port],
                       capture_output=True, text=True, env=env, timeout=300)
    after = r.stdout.splitlines(keepends=True)
    assert after, r.stderr
    first = reference.index(after[0]) if after[0] in reference else -1
    assert first >= 0 and after == reference[first:], r.stderr
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
