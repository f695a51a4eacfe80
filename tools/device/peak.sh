#!/usr/bin/env bash
# tools/device/peak.sh - run a command while nvidia-smi samples the device's used memory every
# 50 ms; print the command's output, then "peak device memory: N MiB (baseline B MiB before the
# command)". The peak is what `--gpu-mem` must cover.
#   tools/device/peak.sh build-gpu/flexdiag bench --arch janus-pro-7b --gpu-mem 24G --batch auto
set -u
q() { nvidia-smi --query-gpu=memory.used --format=csv,noheader,nounits | head -1; }
base=$(q)
log=$(mktemp)
nvidia-smi --query-gpu=memory.used --format=csv,noheader,nounits -lms 50 >"$log" 2>/dev/null &
smi=$!
"$@"
rc=$?
sleep 0.2
kill "$smi" 2>/dev/null
wait "$smi" 2>/dev/null
peak=$(sort -n "$log" | tail -1)
echo "peak device memory: ${peak} MiB (baseline ${base} MiB before the command; $(wc -l <"$log") samples)"
rm -f "$log"
exit $rc
