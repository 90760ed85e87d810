"""The first-call probe (native/probe/first_call.c, preloaded by `nvproxy bench --apps`): a program's calls give the
same results with it as without (stack arguments, structures returned in registers and through memory, floating
point, many threads), and it writes one line: when the first cuda* call returned, and which it was."""

from __future__ import annotations

import os
import platform
import subprocess
import time
from pathlib import Path

import pytest

from nvproxy.bench import apps

pytestmark = pytest.mark.skipif(platform.machine() != "x86_64", reason="the probe's trampolines are x86-64 code")

LIBRARY = r"""
struct pair { long a, b; };
struct big { long v[5]; };
int cudaSum9(int a, int b, int c, int d, int e, int f, int g, int h, int i)
{ return a + 2 * b + 3 * c + 4 * d + 5 * e + 6 * f + 7 * g + 8 * h + 9 * i; }
struct pair cudaPair(long x) { struct pair p = {x, -x}; return p; }
struct big cudaBig(long x) { struct big b = {{x, x + 1, x + 2, x + 3, x + 4}}; return b; }
double cudaHalf(double x, float y) { return x / 2 + y; }
"""

PROGRAM = r"""
#include <pthread.h>
#include <stdio.h>
struct pair { long a, b; };
struct big { long v[5]; };
int cudaSum9(int, int, int, int, int, int, int, int, int);
struct pair cudaPair(long);
struct big cudaBig(long);
double cudaHalf(double, float);
static void *worker(void *arg) { long s = 0; for (int i = 0; i < 100000; i++) s += cudaSum9(i, 1, 1, 1, 1, 1, 1, 1, 1);
                                 *(long *)arg = s; return 0; }
int main(void)
{
    printf("sum9 %d\n", cudaSum9(1, 2, 3, 4, 5, 6, 7, 8, 9));
    struct pair p = cudaPair(41);
    struct big b = cudaBig(7);
    printf("pair %ld %ld big %ld %ld half %.3f\n", p.a, p.b, b.v[0], b.v[4], cudaHalf(5.0, 0.25f));
    pthread_t t[8]; long s[8];
    for (int i = 0; i < 8; i++) pthread_create(&t[i], 0, worker, &s[i]);
    for (int i = 0; i < 8; i++) { pthread_join(t[i], 0); printf("thread %d %ld\n", i, s[i]); }
    return 0;
}
"""

WANT = ("sum9 285\npair 41 -41 big 7 11 half 2.750\n"
        + "".join(f"thread {i} {sum(range(100000)) + 44 * 100000}\n" for i in range(8)))


@pytest.mark.parametrize("binding", ["lazy", "now"])
def test_probe_keeps_results_and_writes_the_first_call(tmp_path: Path, binding: str) -> None:
    lib, exe, log = tmp_path / "libcudafake.so", tmp_path / "prog", tmp_path / "first"
    (tmp_path / "lib.c").write_text(LIBRARY)
    (tmp_path / "prog.c").write_text(PROGRAM)
    subprocess.run(["gcc", "-O2", "-shared", "-fPIC", "-o", str(lib), str(tmp_path / "lib.c")], check=True)
    subprocess.run(["gcc", "-O2", "-o", str(exe), str(tmp_path / "prog.c"), f"-L{tmp_path}", "-lcudafake",
                    "-pthread", f"-Wl,-rpath,{tmp_path}", *(["-Wl,-z,now"] if binding == "now" else [])],
                   check=True)
    plain = subprocess.run([str(exe)], capture_output=True, text=True, timeout=60)
    assert plain.stdout == WANT and plain.returncode == 0
    env = {**os.environ, "LD_PRELOAD": str(apps.probe_path()), "NVP_FIRST_CALL_FILE": str(log)}
    before = time.monotonic()
    probed = subprocess.run([str(exe)], capture_output=True, text=True, timeout=60, env=env)
    after = time.monotonic()
    assert (probed.stdout, probed.stderr, probed.returncode) == (WANT, "", 0)
    ((when, name),) = [line.split() for line in log.read_text().splitlines()]
    assert name == "cudaSum9" and before < float(when) < after


def test_probe_without_its_variable_does_nothing(tmp_path: Path) -> None:
    r = subprocess.run(["true"], env={**os.environ, "LD_PRELOAD": str(apps.probe_path())}, capture_output=True,
                       text=True, timeout=60)
    assert (r.returncode, r.stderr) == (0, "")
