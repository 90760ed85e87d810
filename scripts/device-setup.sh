#!/usr/bin/env bash
# Set up nvproxy on a bare GPU machine of the device tool (offline): install the
# carried wheels (.gpu-wheels) and build the package in place.  Source it:
#   . scripts/device-setup.sh
set -e
# (with byte code: the device's Python does not write it itself, PYTHONDONTWRITEBYTECODE, so without it every
# process compiled numpy and nvproxy again, 0.2-0.3 s of each proxy's start that no installed copy pays)
python3 -m pip install -q --no-index --no-deps --target /tmp/site .gpu-wheels/*.whl
export PYTHONPATH=/tmp/site:${PYTHONPATH:-}
python3 -m pip install -q --no-index --no-deps --no-build-isolation -e . >/tmp/nvproxy-build.log 2>&1 || {
    cat /tmp/nvproxy-build.log; exit 1; }
python3 -m compileall -q -j 0 /tmp/site src >/dev/null 2>&1 || true
export PATH=$(python3 -c 'import sys, os; print(os.path.dirname(sys.executable))'):$PATH
set +e
