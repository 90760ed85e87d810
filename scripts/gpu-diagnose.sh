#!/usr/bin/env bash
# Diagnosis on the GPU machine: run a test program under nvproxy, and if it is
# still running after T seconds, dump every proxy thread's Python stack.
# Usage: scripts/gpu-diagnose.sh PROGRAM_NAME SECONDS
set -u
n=$1; t=$2
exe=/tmp/diag-$n
nvcc -cudart shared -o "$exe" "tests/apps/$n.cu" || exit 1
python3 -m nvproxy run --backend gpu -- "$exe" >/tmp/diag.out 2>/tmp/diag.err &
sleep "$t"
for p in /proc/[0-9]*; do
    if tr '\0' ' ' <"$p/cmdline" 2>/dev/null | grep -q "nvproxy proxy"; then kill -USR1 "${p#/proc/}"; fi
done
sleep 1
echo "--- stdout"; cat /tmp/diag.out; echo "--- stderr"; cat /tmp/diag.err
