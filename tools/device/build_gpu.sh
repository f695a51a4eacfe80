# tools/device/build_gpu.sh - sourced by the device scripts (continuous.sh, sjd.sh): unpack the
# dependency bundle of tools/deps/, configure build-gpu (CUDA, sm_90, no MPI) once, build the
# targets given to gpu_build and print one line: build seconds, the card, the commit. Logs go
# to $OUT (setup.log, build.log); a failure prints their errors and exits.
gpu_build() {
    local t0
    t0=$(date +%s)
    eval "$(tools/deps/unpack.sh)" >/dev/null 2>&1 || { echo "dependency bundle failed"; exit 1; }
    if [ ! -f build-gpu/build.ninja ]; then
        meson setup build-gpu -Dcuda=enabled -Dcuda-arch=90 -Dmpi=disabled >"$OUT/setup.log" 2>&1 ||
            { tail -30 "$OUT/setup.log"; exit 1; }
    fi
    ninja -C build-gpu "$@" >"$OUT/build.log" 2>&1 ||
        { grep -E "error" "$OUT/build.log" | head -30; exit 1; }
    echo "build: $(($(date +%s) - t0)) s; $(nvidia-smi --query-gpu=name --format=csv,noheader); $(git log --oneline -1 2>/dev/null)"
}
