#!/usr/bin/env bash
# tools/device/sjd.sh - speculative Jacobi decoding on a GPU host, in one call: build (CUDA,
# sm_90; the dependency bundle of tools/deps/), the window attention and SJD tests, then the
# cost of a window pass on Janus-Pro-7B shapes (random weights, one image, greedy: --top-k 1):
# `generate --decode sjd --draft-len L` for L in $LENS (1 = sequential), decode seconds over
# the decode passes the image took = seconds a pass at L rows. $WEIGHTS, when set (e.g.
# 0,100,0), adds rows at the windows $WLENS (default 1 8) with the weights streamed from
# pinned host memory.
# Logs go to $OUT; a short table comes last.
set -u -o pipefail
cd "$(dirname "$0")/../.."
OUT=${OUT:-/tmp/out}
mkdir -p "$OUT"
. tools/device/build_gpu.sh
gpu_build flexdiag tests/test_attn_cuda tests/test_sjd
export FLEXDIAG_GEMM_TUNE=0
timeout 200 meson test -C build-gpu --no-rebuild test_attn_cuda test_sjd >"$OUT/test.log" 2>&1
echo "tests: rc=$?"; grep -E '^ *[0-9]+/[0-9]+ ' "$OUT/test.log"
row() { # $1: label, $2: the windows, $3..: extra flags
    local label=$1 lens=$2; shift 2
    for L in $lens; do
        local dec="--decode sjd --draft-len $L"; [ "$L" = 1 ] && dec=""
        timeout ${ROW_S:-150} build-gpu/flexdiag generate --arch janus-pro-7b --random-weights \
            --prompt "a red apple" --images-per-prompt 1 --batch 1 --top-k 1 $dec "$@" \
            --out /tmp/sjd_$L --quiet >"$OUT/gen_${label}_$L.log" 2>&1
        local rc=$? dec_s passes
        dec_s=$(grep -oE 'decode [0-9.]+ s' "$OUT/gen_${label}_$L.log" | grep -oE '[0-9.]+')
        passes=$(grep -oE 'sjd: [0-9.]+' "$OUT/gen_${label}_$L.log" | grep -oE '[0-9.]+$')
        [ -z "$passes" ] && passes=575
        echo "| $label | $L | rc $rc | decode ${dec_s:-?} s | $passes passes | $(awk -v d="${dec_s:-0}" -v p="$passes" 'BEGIN{printf "%.2f ms a pass", 1000*d/p}') |"
    done
}
row resident "${LENS:-1 2 4 8 16 32}"
[ -n "${WEIGHTS:-}" ] && row "weights_$WEIGHTS" "${WLENS:-1 8}" --weights "$WEIGHTS"
exit 0
