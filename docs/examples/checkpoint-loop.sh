#!/bin/bash
# Run a CUDA program under nvproxy and DMTCP and checkpoint it every INTERVAL seconds into CKPT_DIR.  Where
# CKPT_DIR already holds a checkpoint (the last run was stopped or the machine went down), restart from it
# instead of starting over.  See docs/hpc-jobs.md.
#
#   checkpoint-loop.sh CKPT_DIR INTERVAL ./my_cuda_program args... > out.txt 2>&1
#
# Send the output to a file: DMTCP restores files, not pipes.  Needs DMTCP (its bin/ on PATH, or
# NVPROXY_DMTCP_DIR), and a program linked with the shared CUDA runtime (nvcc -cudart shared).

set -u

if [ $# -lt 2 ]; then
    echo "usage: $0 CKPT_DIR INTERVAL [PROGRAM ARGS...]" >&2
    exit 2
fi
dir=$1
interval=$2
shift 2
mkdir -p "$dir" && dir=$(cd "$dir" && pwd) || exit 1

dmtcp_tool() {
    local tool=$1
    shift
    "${NVPROXY_DMTCP_DIR:+$NVPROXY_DMTCP_DIR/bin/}$tool" "$@"
}

# A DMTCP coordinator of our own, on a free port; it exits with the last process of the computation.
rm -f "$dir/port"
dmtcp_tool dmtcp_coordinator --daemon --exit-on-last --coord-port 0 --port-file "$dir/port" --ckptdir "$dir" ||
    exit 1
for _ in $(seq 100); do
    [ -s "$dir/port" ] && break
    sleep 0.1
done
port=$(cat "$dir/port")

if compgen -G "$dir/ckpt_*.dmtcp" >/dev/null; then
    echo "restarting from $dir" >&2
    nvproxy restart "$dir" --coord-port "$port" &
else
    if [ $# -eq 0 ]; then
        echo "$dir holds no checkpoint: give the program to run" >&2
        dmtcp_tool dmtcp_command --coord-port "$port" --quit >/dev/null 2>&1
        exit 2
    fi
    nvproxy run --dmtcp --dmtcp-args "--coord-port $port --no-gzip --ckptdir $dir" -- "$@" &
fi
app=$!

while kill -0 "$app" 2>/dev/null; do
    for _ in $(seq "$interval"); do
        kill -0 "$app" 2>/dev/null || break 2
        sleep 1
    done
    if nvproxy checkpoint --dmtcp --coord-port "$port" >/dev/null; then
        echo "$(date '+%F %T') checkpoint written to $dir" >&2
    else
        echo "$(date '+%F %T') checkpoint failed" >&2
    fi
done

wait "$app"
rc=$?
if [ "$rc" -eq 0 ]; then
    rm -f "$dir"/ckpt_*.dmtcp "$dir"/nvproxy-*.img "$dir"/dmtcp_restart_script*.sh "$dir/port"
fi
exit "$rc"
