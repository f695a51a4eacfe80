#!/usr/bin/env bash
# tools/device/continuous.sh - the continuous-batching rows of bench/RESULTS.md on a GPU host, in
# one call: build (CUDA, sm_90; the dependency bundle of tools/deps/), the engine's GPU test, then
#   text:    a mix of OPT-6.7B-shaped requests (prompt 16-512, output 8-256, seed 1), continuous
#            against --batching blocks at the same memory;
#   gather:  the text mix, continuous only, with admissions gathered into fewer prefill passes
#            (FLEXDIAG_ADMIT_IDLE in $GATHER, default 0.1 0.25 1);
#   arrive:  Janus-Pro-7B-shaped single-image requests arriving as a Poisson stream into a full
#            engine (queue time, first-image latency);
#   images:  `generate` of 4 prompts x 128 images (Diagonal 95 %, default flags) and the bench
#            row of the same budget and sharing (its steady state: one full block).
# Each step's log goes to $OUT; a short table comes last. Steps to run: the arguments (default
# all), e.g. tools/device/continuous.sh text images.
set -u -o pipefail
cd "$(dirname "$0")/../.."
OUT=${OUT:-/tmp/out}
mkdir -p "$OUT"
. tools/device/build_gpu.sh
gpu_build flexdiag flexdiag-bench tests/test_engine_cuda
export FLEXDIAG_GEMM_TUNE=0
B=build-gpu
steps=${*:-"test text arrive images"}
for step in $steps; do
    s=$(date +%s)
    case "$step" in
    test)
        timeout ${TEST_S:-200} meson test -C build-gpu --no-rebuild test_engine_cuda >"$OUT/test.log" 2>&1
        echo "test_engine_cuda: rc=$?"; grep -E '^ *1/1' "$OUT/test.log"
        cp build-gpu/meson-logs/testlog.txt "$OUT/testlog.txt" 2>/dev/null ;;
    ab)  # the landed rows against the parent commit's code (parent.tgz: git archive of it)
        rm -rf /tmp/parent && mkdir -p /tmp/parent && tar -xzf parent.tgz -C /tmp/parent &&
            (cd /tmp/parent && meson setup /tmp/pb -Dcuda=enabled -Dcuda-arch=90 -Dmpi=disabled \
                 >/dev/null 2>&1 && ninja -C /tmp/pb flexdiag flexdiag-bench >"$OUT/parent_build.log" 2>&1) ||
            { echo "parent build failed"; continue; }
        for rep in ${AB_REPS:-1 2}; do for bin in /tmp/pb $B; do
            timeout 60 $bin/flexdiag bench --arch janus-pro-7b --random-weights --batch 32 --prompt-len 50 \
                --policies dense,diagonal --sparsities 0.95 >"$OUT/ab32_${rep}_$(basename $bin).log" 2>&1
            echo "32 images, $bin, run $rep:"; grep -E '^\| (dense|diag)' "$OUT/ab32_${rep}_$(basename $bin).log" | cut -d'|' -f2,5,6,10
        done; done ;;
    ab48)  # the 48G rows (batch auto at --gpu-mem 48G) against the parent commit's build of `ab`
        [ -x /tmp/pb/flexdiag ] || { echo "ab48 needs the parent build of step ab"; continue; }
        for rep in ${AB_REPS:-1 2}; do for bin in /tmp/pb $B; do
            timeout 150 $bin/flexdiag bench --arch janus-pro-7b --random-weights --batch auto --gpu-mem 48G \
                --prompt-len 50 --policies dense,diagonal --sparsities 0.95 >"$OUT/ab48_${rep}_$(basename $bin).log" 2>&1
            echo "48G, $bin, run $rep:"; grep -E '^\| (dense|diag)' "$OUT/ab48_${rep}_$(basename $bin).log" | cut -d'|' -f2,3,5,6,10
        done; done ;;
    text)
        timeout 300 $B/flexdiag-bench requests --arch opt-6.7b --random-weights --requests 2000 \
            --prompt-len 16:512 --gen-len 8:256 --json "$OUT/text.jsonl" >"$OUT/text.log" 2>&1
        echo "text: rc=$?"; grep -E '^\| (continuous|blocks)' "$OUT/text.log" ;;
    gather)  # the text mix with admissions gathered (FLEXDIAG_ADMIT_IDLE, serve.c admit_due)
        for idle in ${GATHER:-0.1 0.25 1}; do
            FLEXDIAG_ADMIT_IDLE=$idle timeout 150 $B/flexdiag-bench requests --arch opt-6.7b --random-weights \
                --requests 2000 --prompt-len 16:512 --gen-len 8:256 --batching continuous \
                --json "$OUT/gather_$idle.jsonl" >"$OUT/gather_$idle.log" 2>&1
            echo "text, FLEXDIAG_ADMIT_IDLE=$idle: rc=$?"; grep -E '^\| continuous' "$OUT/gather_$idle.log"
        done ;;
    arrive)
        timeout 120 $B/flexdiag-bench requests --arch janus-pro-7b --random-weights --requests 300 \
            --prompt-len 50 --batch 64 --arrival-rate 20 --policy diagonal --sparsity 0.95 \
            --batching continuous --json "$OUT/arrive.jsonl" >"$OUT/arrive.log" 2>&1
        echo "arrive: rc=$?"; grep -E '^\| continuous' "$OUT/arrive.log" ;;
    images)
        printf 'a red apple on a table\na blue car on a road\ntwo cats on a sofa\na lighthouse at dusk\n' >/tmp/p4.txt
        timeout 150 $B/flexdiag generate --arch janus-pro-7b --random-weights --prompts /tmp/p4.txt \
            --images-per-prompt 128 --policy diagonal --sparsity 0.95 --out /tmp/gen4 >"$OUT/gen.log" 2>&1
        echo "generate: rc=$?"; grep -E 'fit the budget|^generated' "$OUT/gen.log" | cut -c1-330
        timeout 120 $B/flexdiag bench --arch janus-pro-7b --random-weights --prompt-len 50 --batch auto \
            --policies diagonal --sparsities 0.95 --images-per-prompt 128 --json "$OUT/bench.jsonl" \
            >"$OUT/bench.log" 2>&1
        echo "bench: rc=$?"; grep -E '^\| diag' "$OUT/bench.log" ;;
    esac
    echo "  ($step: $(($(date +%s) - s)) s)"
done
