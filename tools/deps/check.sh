#!/usr/bin/env bash
# Builds and runs tools/deps/smoke.c against the libraries pkg-config finds, then reports where
# each one was loaded from. Run on the GPU host after the bundle is unpacked:
#   eval "$(tools/deps/unpack.sh)" && tools/deps/check.sh
# (On a machine with the Debian -dev packages installed it checks those instead.)
# Exit status: that of the smoke test (0 = every library works).
set -euo pipefail

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT
pkgs=(jansson libpcre2-8 libpng zlib liburing cmocka)
if ! flags=$(pkg-config --cflags --libs "${pkgs[@]}"); then
    echo "check.sh: pkg-config cannot resolve: ${pkgs[*]} (did you eval unpack.sh's output?)" >&2
    exit 1
fi
echo "check.sh: pkg-config flags: $flags"
# shellcheck disable=SC2086  # flags must split into separate arguments
cc -std=c11 -Wall -Wextra -Werror -o "$out/smoke" "$here/smoke.c" $flags
ldd "$out/smoke" | grep -E 'jansson|pcre2|png|libz|uring|cmocka' || true
"$out/smoke"
