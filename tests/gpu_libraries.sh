#!/usr/bin/env bash
# The math-library and cuDNN tests on a bare GPU machine of the device tool: set nvproxy up, then run with -m gpu
# tests/test_libraries.py (the library programs) and tests/test_library_samples.py (NVIDIA's library samples of
# .samples), the log teed to $OUT/lib.log.  Extra arguments go to pytest, e.g. -k matches_native.
# The run stops itself before the device tool's 10 minutes (NVPROXY_GPU_TIMEOUT seconds, default 560) so that the
# log comes back; pytest-xdist, where installed, runs NVPROXY_GPU_WORKERS tests at a time (default 4).
# Carry .gpu-wheels, .samples and .dmtcp (git-ignored; without .dmtcp the DMTCP tests are skipped, saying so).
# cuDNN comes from NVPROXY_CUDNN_DIR or the machine Python's nvidia-cudnn wheel (PyTorch's); without it lib_cudnn skips.
# Usage, from the repository root: bash tests/gpu_libraries.sh [pytest arguments]
set -u
. scripts/device-setup.sh
export NVPROXY_SAMPLES_DIR=$PWD/.samples
if [ -x .dmtcp/bin/dmtcp_launch ]; then export NVPROXY_DMTCP_DIR=$PWD/.dmtcp; fi
out=${OUT:-/tmp}/lib.log
workers=()
if python3 -c 'import xdist' 2>/dev/null; then workers=(-n "${NVPROXY_GPU_WORKERS:-4}"); fi
nvidia-smi -L 2>&1 | tee "$out"
timeout -k 10 "${NVPROXY_GPU_TIMEOUT:-560}" python3 -m pytest -m gpu tests/test_libraries.py \
    tests/test_library_samples.py -v -x -rs --durations=0 "${workers[@]}" "$@" 2>&1 | tee -a "$out"
exit "${PIPESTATUS[0]}"
