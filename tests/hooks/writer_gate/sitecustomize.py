"""A test's hook into a proxy, loaded where PYTHONPATH names this folder (a proxy runs `site` after its boot): the
proxy writes no checkpoint image file until the file that NVPROXY_TEST_WRITER_GATE names exists, so that a test can
see what the program does while its GPU image is being written.  A writer that waits says so first, by making the
file GATE.waiting."""

import os
import time

GATE = os.environ.get("NVPROXY_TEST_WRITER_GATE")

if GATE:
    from nvproxy.checkpoint import hostimage

    _write_file = hostimage.HostImage.write_file

    def _gated_write_file(self, path, *args, **kwargs):  # noqa: ANN001, ANN002, ANN003, ANN202
        if not os.path.exists(GATE):
            open(f"{GATE}.waiting", "w").close()
        while not os.path.exists(GATE):
            time.sleep(0.005)
        return _write_file(self, path, *args, **kwargs)

    hostimage.HostImage.write_file = _gated_write_file
