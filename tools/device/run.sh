#!/usr/bin/env bash
# tools/device/run.sh - one call on the GPU host: unpack the dependency bundle, build with CUDA
# for sm_90, then run the named steps, logging each under $OUT and printing a short summary
# last (the GPU, and the host's CPU and huge-page mode). Steps: tests (gpu + golden suites),
# attn (decode-attention microbench), bench ARGS... (one `flexdiag bench` row), peer ARGS...
# (transformers peer), fidelity ARGS...
#   tools/device/run.sh tests attn "bench --arch janus-pro-7b --batch 32"
set -u -o pipefail
cd "$(dirname "$0")/../.."
OUT=${OUT:-/tmp/out}
mkdir -p "$OUT"
summary=()
eval "$(tools/deps/unpack.sh)" || { echo "dependency bundle failed"; exit 1; }
if [ ! -f build-gpu/build.ninja ]; then
    meson setup build-gpu -Dcuda=enabled -Dcuda-arch=90 >"$OUT/setup.log" 2>&1 ||
        { tail -30 "$OUT/setup.log"; exit 1; }
fi
ninja -C build-gpu >"$OUT/build.log" 2>&1 || { grep -E "error" "$OUT/build.log" | head -30; tail -20 "$OUT/build.log"; exit 1; }
nvidia-smi --query-gpu=name,memory.total,memory.used,clocks.sm,clocks.mem --format=csv,noheader >"$OUT/gpu.txt" 2>&1
summary+=("gpu: $(cat "$OUT/gpu.txt")")
# the host beside it: the CPU attention's rates depend on its cores and on huge pages
{ lscpu | grep -E '^(Model name|Model|CPU\(s\)|NUMA node\(s\)|L3 cache):'
  echo "THP: $(cat /sys/kernel/mm/transparent_hugepage/enabled 2>/dev/null)"; } >"$OUT/host.txt" 2>&1
summary+=("host: $(tr -s ' ' <"$OUT/host.txt" | tr '\n' ';')")
n=0
for step in "$@"; do
    n=$((n + 1))
    log="$OUT/step$n.log"
    case "$step" in
    tests)
        meson test -C build-gpu --suite gpu --suite golden --print-errorlogs --no-rebuild >"$log" 2>&1
        summary+=("tests: $(grep -E '^(Ok|Fail|Skipped):' "$log" | tr -s ' ' | tr '\n' ' ')")
        grep -hE "rel L2|relative L2|VQ-16 decode|plan entries|FAIL|mismatch" build-gpu/meson-logs/testlog.txt | head -60 >"$OUT/test_lines.txt"
        ;;
    attn)
        build-gpu/tests/gpu/bench_attn >"$log" 2>&1
        summary+=("attn: see step$n.log"); tail -15 "$log" ;;
    bench*)
        read -ra args <<<"$step"
        build-gpu/flexdiag "${args[@]}" --json "$OUT/bench.jsonl" >"$log" 2>&1
        summary+=("$step: rc=$?"); tail -3 "$log" ;;
    peer*)
        read -ra args <<<"$step"
        PYTHONUNBUFFERED=1 python3 tools/peer/janus_transformers.py "${args[@]:1}" \
            --json "$OUT/peer.jsonl" >"$log" 2>&1
        summary+=("$step: rc=$?"); tail -4 "$log" ;;
    *)
        bash -c "$step" >"$log" 2>&1; summary+=("$step: rc=$?"); tail -5 "$log" ;;
    esac
done
printf '%s\n' "${summary[@]}"
