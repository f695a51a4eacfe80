#!/bin/sh
# run_generate.sh GENERATE FOLDER [ARCH] - run examples/generate.c's program into FOLDER
# (tiny-janus unless ARCH names another built-in shape) and check its 4 images: binary PPMs
# ("P6", then "W H", then "255", each on its line) of W x H RGB pixels, W and H as the run
# printed them.
set -eu
prog=$1 dir=$2 arch=${3:-tiny-janus}
rm -rf "$dir"
if ! log=$("$prog" "$dir" "a red apple" "$arch"); then
    echo "$log"
    echo "FAIL $prog $dir: it failed" >&2
    exit 1
fi
echo "$log"
for i in 0 1 2 3; do
    f=$dir/$i.ppm
    size=$(echo "$log" | sed -n "s|^wrote $f (\([0-9]*\)x\([0-9]*\))$|\1 \2|p")
    [ -n "$size" ] || { echo "FAIL $f: not reported written" >&2; exit 1; }
    w=${size% *} h=${size#* }
    head=$(printf 'P6\n%s %s\n255\n' "$w" "$h")
    [ "$(head -c ${#head} "$f")" = "$head" ] ||
        { echo "FAIL $f: header is not P6 $w $h 255" >&2; exit 1; }
    want=$((${#head} + 1 + w * h * 3))
    [ "$(wc -c < "$f")" -eq "$want" ] || { echo "FAIL $f: not $want bytes" >&2; exit 1; }
done
echo "ok: 4 PPM images in $dir"
