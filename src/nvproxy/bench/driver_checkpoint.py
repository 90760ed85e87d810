"""NVIDIA's driver checkpoint (what the cuda-checkpoint tool drives) on a running
native process: lock, checkpoint (device memory out to host memory), restore,
unlock, timed.  Used by ckpt_run.py where the cuda-checkpoint tool is absent.

    python -m nvproxy.bench.driver_checkpoint PID      -> one JSON line
"""

from __future__ import annotations

import ctypes
import json
import sys
import time


def main(pid: int) -> int:
    try:
        cuda = ctypes.CDLL("libcuda.so.1")
    except OSError as e:
        print(json.dumps({"ok": False, "error": str(e)}))
        return 1
    zeros = ctypes.create_string_buffer(64)  # every Args struct: 64 bytes, zero = defaults

    def call(name: str) -> int:
        fn = getattr(cuda, name, None)
        if fn is None:
            return -1
        return fn(ctypes.c_int(pid), zeros)

    cuda.cuInit(0)
    t0 = time.monotonic()
    rc = call("cuCheckpointProcessLock") or call("cuCheckpointProcessCheckpoint")
    t1 = time.monotonic()
    rc = rc or call("cuCheckpointProcessRestore") or call("cuCheckpointProcessUnlock")
    t2 = time.monotonic()
    print(json.dumps({"ok": rc == 0, "error": f"CUresult {rc}" if rc else "", "suspend_s": t1 - t0,
                      "resume_s": t2 - t1}))
    return 0 if rc == 0 else 1


if __name__ == "__main__":
    raise SystemExit(main(int(sys.argv[1])))
