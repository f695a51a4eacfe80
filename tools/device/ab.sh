#!/usr/bin/env bash
# tools/device/ab.sh - A/B speed check on the GPU host: the same `flexdiag bench` rows from two
# builds, alternately, in one call, so a change is judged against its parent on the same machine
# and the same minute rather than against numbers from another day (the run-to-run spread of a
# 48G row is about 2.5%).
#
#   tools/device/ab.sh BASE_TREE ROUNDS "bench ARGS..." ["bench ARGS..." ...]
#
# BASE_TREE is a source tree of the other version (e.g. `git archive <commit> | tar -x -C
# .baseline`, carried to the host). Both trees are built with CUDA for sm_90, in parallel (the
# current one in build-gpu/, the base in $BASE_BUILD, default /tmp/ab-base); `flexdiag` lives at
# bench/flexdiag in builds older than the per-folder layout and at flexdiag after it. Each row runs
# ROUNDS times per build, base first (ORDER="new base" reverses it), and every run appends its JSON row to $OUT/ab.jsonl with the
# build's name in a "build" field; the summary prints img/s per build and row (mean and spread)
# and new/base.
set -u -o pipefail
cd "$(dirname "$0")/../.."
OUT=${OUT:-/tmp/out}
mkdir -p "$OUT"
base=$1 rounds=$2
shift 2
eval "$(tools/deps/unpack.sh)" || { echo "dependency bundle failed"; exit 1; }

build() { # tree builddir log
    { [ -f "$2/build.ninja" ] ||
        meson setup "$2" "$1" -Dcuda=enabled -Dcuda-arch=90 >"$3" 2>&1; } &&
        ninja -C "$2" >>"$3" 2>&1 || { tail -30 "$3"; exit 1; }
}
bin() { # builddir -> its flexdiag
    if [ -x "$1/flexdiag" ]; then echo "$1/flexdiag"; else echo "$1/bench/flexdiag"; fi
}
base_build=${BASE_BUILD:-/tmp/ab-base} # outside the tree: a carried tree is replaced per call
build "$base" "$base_build" "$OUT/build-base.log" &
build . build-gpu "$OUT/build-new.log"
wait $! || exit 1
nvidia-smi --query-gpu=name,memory.total,clocks.sm,clocks.mem --format=csv,noheader

for row in "$@"; do
    read -ra args <<<"$row"
    for ((i = 0; i < rounds; i++)); do
        for which in ${ORDER:-base new}; do
            dir=$([ $which = base ] && echo "$base_build" || echo build-gpu)
            tmp="$OUT/row.jsonl"
            rm -f "$tmp"
            "$(bin "$dir")" "${args[@]}" --json "$tmp" >>"$OUT/ab-$which.log" 2>&1 ||
                { echo "$which: $row failed"; tail -5 "$OUT/ab-$which.log"; continue; }
            sed "s/^{/{\"build\":\"$which\",\"row\":\"$row\",/" "$tmp" >>"$OUT/ab.jsonl"
        done
    done
done

python3 - "$OUT/ab.jsonl" <<'PY'
import json, sys, statistics as st
rows = {}
for line in open(sys.argv[1]):
    r = json.loads(line)
    key = (r["row"], r.get("policy", "?"), r.get("batch"))
    rows.setdefault(key, {}).setdefault(r["build"], []).append(r["img_per_s"])
print("| row | policy | batch | base img/s | new img/s | new/base |")
print("|---|---|---|---|---|---|")
for (row, pol, batch), v in rows.items():
    b, n = v.get("base", []), v.get("new", [])
    fmt = lambda x: f"{st.mean(x):.2f} ({min(x):.2f}-{max(x):.2f})" if x else "-"
    ratio = f"{st.mean(n) / st.mean(b):.3f}" if b and n else "-"
    print(f"| {row} | {pol} | {batch} | {fmt(b)} | {fmt(n)} | {ratio} |")
PY
