"""A test's hook into a proxy, loaded where PYTHONPATH names this folder (a proxy runs `site` after its boot): the
proxy writes no checkpoint image file until the file that NVPROXY_TEST_WRITER_GATE names exists, so that a test can
see what the program does while its GPU image is being written.  A writer that waits says so first, by making the
file GATE.waiting."""

import os
import time

GATE = os.environ.get("NVPROXY_TEST_WRITER_GATE")

if GATE:
    from nvproxy.checkpoint import hostimage

    _atomic_file = hostimage.atomic_file

    def _wait() -> None:
        if not os.path.exists(GATE):
            open(f"{GATE}.waiting", "w").close()
        while not os.path.exists(GATE):
            time.sleep(0.005)

    def _gated_atomic_file(path, write):  # noqa: ANN001, ANN202
        # (inside the write: its temporary file exists meanwhile, as it does while a large image is written)
        return _atomic_file(path, lambda fd: (_wait(), write(fd))[1])

    hostimage.atomic_file = _gated_atomic_file
