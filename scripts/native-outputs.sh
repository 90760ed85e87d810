#!/usr/bin/env bash
# Build every test program and save what it prints natively (for comparing
# nvproxy's sim transcripts with the real runtime).  Usage: scripts/native-outputs.sh OUTDIR
set -u
out=${1:?outdir}
mkdir -p "$out/bin"
for f in tests/apps/*.cu; do
    n=$(basename "$f" .cu)
    nvcc -cudart shared -o "$out/bin/$n" "$f" || continue
done
for spec in vector_add copies streams_events callbacks multithread printf_assert "printf_assert assert" symbols \
            bigparam errors device_query unsupported; do
    set -- $spec
    id=$(echo "$spec" | tr ' ' '-')
    timeout 60 "$out/bin/$1" "${@:2}" >"$out/$id.txt" 2>"$out/$id.err"
    echo "$id rc=$?"
done
