#!/usr/bin/env bash
# Set up nvproxy on a bare GPU machine of the device tool (offline): install the
# carried wheels (.gpu-wheels) and build the package in place.  Source it:
#   . scripts/device-setup.sh
set -e
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .gpu-wheels/*.whl
export PYTHONPATH=/tmp/site:${PYTHONPATH:-}
python3 -m pip install -q --no-index --no-deps --no-build-isolation -e . >/tmp/nvproxy-build.log 2>&1 || {
    cat /tmp/nvproxy-build.log; exit 1; }
export PATH=$(python3 -c 'import sys, os; print(os.path.dirname(sys.executable))'):$PATH
set +e
