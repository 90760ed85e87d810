"""CuPy on the GPU through each of NVIDIA's libraries and a kernel compiled at run time, deterministically: one
line of results per round.

    python3 cupy_ops.py [--rounds N] [--round-ms MS]

Each round: an elementwise kernel (NVRTC), a matrix product (cuBLAS), an FFT (cuFFT), random numbers (cuRAND, one
generator going on with its sequence), a sparse matrix-vector product (cuSPARSE) and a linear solve (cuSOLVER).
Two native runs on one GPU print the same bits; so must a run through nvproxy, checkpointed or not.
"""

from __future__ import annotations

import argparse
import hashlib
import sys
import time

import cupy as cp
import cupyx.scipy.sparse as sparse


def digest(a: cp.ndarray) -> str:
    return hashlib.sha256(cp.asnumpy(a).tobytes()).hexdigest()[:16]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--round-ms", type=float, default=0.0)
    args = ap.parse_args()
    saxpy = cp.ElementwiseKernel("float32 a, float32 x, float32 y", "float32 z", "z = a * x + y", "nvp_saxpy")
    rng = cp.random.RandomState(seed=1234)
    n = 512
    base = cp.arange(n * n, dtype=cp.float32).reshape(n, n) / (n * n)
    eye = cp.eye(n, dtype=cp.float64) * n
    rows = cp.arange(n * 4, dtype=cp.int32) // 4
    cols = (rows * 7 + cp.arange(n * 4, dtype=cp.int32)) % n
    vals = cp.linspace(0.5, 1.5, n * 4, dtype=cp.float32)
    sp = sparse.csr_matrix(sparse.coo_matrix((vals, (rows, cols)), shape=(n, n)))
    for r in range(args.rounds):
        x = saxpy(cp.float32(r + 1), base, base.T.copy())
        m = x @ base
        f = cp.fft.fftn(x.astype(cp.complex64))
        u = rng.standard_normal(n * n, dtype=cp.float32)
        v = sp @ u[:n]
        s = cp.linalg.solve(eye + cp.asarray(m, dtype=cp.float64) / n, cp.ones(n))
        print(f"round {r} saxpy {digest(x)} gemm {digest(m)} fft {digest(f)} rand {digest(u)} spmv {digest(v)} "
              f"solve {digest(s)}", flush=True)
        if args.round_ms:
            time.sleep(args.round_ms / 1000)
    return 0


if __name__ == "__main__":
    sys.exit(main())
