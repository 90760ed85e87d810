"""The nvproxy command line: what it says and does with good and bad input (sim backend)."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from conftest import nvproxy_cmd

from nvproxy import cli
from nvproxy.checkpoint.image import atomic_file, read_header


def nvproxy(*args: str, **kw) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k != "LD_PRELOAD"}
    return subprocess.run([sys.executable, "-m", "nvproxy", *args], capture_output=True, text=True, env=env,
                          timeout=kw.pop("timeout", 120), **kw)


@pytest.fixture
def waiting_app(build) -> Iterator[subprocess.Popen]:
    """A program under nvproxy (sim) holding device memory, waiting for a line on stdin."""
    p = subprocess.Popen(nvproxy_cmd(build("dead_proxy"), "sim", "dead_proxy"), stdin=subprocess.PIPE,
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    assert p.stdout is not None and p.stdout.readline() == "ready\n"
    yield p
    out, err = p.communicate("\n", timeout=60)
    assert p.returncode == 0, out + err


def test_help_lists_every_command_with_one_line() -> None:
    r = nvproxy("--help")
    assert r.returncode == 0
    listed = r.stdout.split("commands:\n", 1)[1].splitlines()
    for name, line in cli.COMMANDS:
        assert any(entry.split() == [name, *line.split()] for entry in listed), (name, r.stdout)
    names = {name for name, _ in cli.COMMANDS}
    assert names >= {"run", "proxy", "demo", "info", "checkpoint", "restart", "migrate", "bench", "settings"}
    assert sorted(names) == sorted(cli.parser()._subparsers._group_actions[0].choices)  # every command listed


def _no_temporary_files(*dirs: Path) -> list[str]:
    return [p.name for d in dirs for p in d.iterdir() if p.name.endswith(".tmp")]


def test_checkpoint_into_a_directory_writes_an_image_there(waiting_app: subprocess.Popen, tmp_path: Path) -> None:
    out = tmp_path / "images"
    out.mkdir()
    r = nvproxy("checkpoint", str(waiting_app.pid), "-o", str(out))
    image = out / f"nvproxy-{waiting_app.pid}.img"
    assert r.returncode == 0, r.stderr
    assert r.stderr == f"nvproxy checkpoint: {out} is a directory: writing {image}\n"
    assert r.stdout.startswith(f"{image}: ")
    os.close(read_header(str(image))[0])  # (a complete image)
    assert _no_temporary_files(out, tmp_path) == []


@pytest.mark.parametrize(("where", "why"), [("missing/x.img", "no directory {tmp}/missing"),
                                            ("fifo", "it exists and is not a regular file")])
def test_checkpoint_refuses_a_path_it_cannot_write_naming_it(waiting_app: subprocess.Popen, tmp_path: Path,
                                                              where: str, why: str) -> None:
    """(A device or a pipe is not replaced by an image: /dev/null once was.)"""
    target = str(tmp_path / where)
    if where == "fifo":
        os.mkfifo(target)
    r = nvproxy("checkpoint", str(waiting_app.pid), "-o", target)
    assert (r.returncode, r.stdout) == (2, "")
    assert r.stderr == f"nvproxy checkpoint: cannot write {target}: {why.format(tmp=tmp_path)}\n"
    assert _no_temporary_files(tmp_path) == []


@pytest.mark.parametrize("timeout", ["0", "-1", "nan", "soon"])
def test_checkpoint_refuses_a_timeout_that_is_not_positive(timeout: str) -> None:
    r = nvproxy("checkpoint", "1", "--timeout", timeout)
    assert r.returncode == 2
    assert r.stderr.splitlines()[-1] == (f"nvproxy checkpoint: error: argument --timeout: {timeout!r} is not a "
                                         "positive number of seconds")


def test_an_image_that_cannot_be_renamed_into_place_leaves_no_temporary_file(tmp_path: Path) -> None:
    (tmp_path / "taken").mkdir()
    with pytest.raises(IsADirectoryError):
        atomic_file(tmp_path / "taken", lambda fd: os.write(fd, b"x" * 4096))
    assert sorted(p.name for p in tmp_path.iterdir()) == ["taken"]


def test_proxy_errors_name_the_users_path_not_the_temporary_one() -> None:
    said = "writing /a b/x.img: [Errno 28] No space left on device: '/a b/.x.img.4242.tmp'"
    assert cli._in_users_words(said, "/a b/x.img") == \
        "writing /a b/x.img: [Errno 28] No space left on device: '/a b/x.img'"
