#!/usr/bin/env bash
# Offline dependency bundle, step 1 of 2 (run on a Debian bookworm machine with apt access).
#
# The GPU hosts have nvcc, cuBLAS, hwloc and zstd headers, meson and ninja, but no liburing,
# jansson, pcre2, libpng or cmocka development files and no package registry. This script
# downloads the bookworm .deb files of those libraries (runtime + -dev packages, plus every
# library that a -dev package's .so symlinks or .pc files point at) into .debs/ at the repo
# root (git-ignored). pkgconf is included because a bare host may lack pkg-config, which meson
# needs to find the libraries. tools/deps/unpack.sh extracts them on the GPU host.
#
# Usage: tools/deps/fetch.sh [DEST]      (DEST defaults to <repo>/.debs)
# Alternatives rejected: building from source on the host (slow, needs sources shipped too);
# vendoring the libraries as meson subprojects (extra code to maintain, different versions
# than the CI machine's Debian packages).
set -euo pipefail

repo=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
dest=${1:-"$repo/.debs"}

# -dev package first, then the runtime libraries its .so symlinks and .pc files need.
packages=(
    libjansson-dev libjansson4
    libpcre2-dev libpcre2-8-0 libpcre2-16-0 libpcre2-32-0 libpcre2-posix3
    libpng-dev libpng16-16
    zlib1g-dev zlib1g
    libcmocka-dev libcmocka0
    liburing-dev liburing2
    pkgconf pkgconf-bin libpkgconf3
)

if ! command -v apt-get >/dev/null; then
    echo "fetch.sh: apt-get not found; run this on Debian bookworm (the CI machine image)" >&2
    exit 1
fi
mkdir -p "$dest"
cd "$dest"
# Old versions of the same package would make unpack.sh pick the wrong files: start clean.
rm -f ./*.deb
if ! apt-get download "${packages[@]}"; then
    echo "fetch.sh: apt-get download failed; run 'apt-get update' first (as root) and retry" >&2
    exit 1
fi
count=$(find . -maxdepth 1 -name '*.deb' | wc -l)
if [ "$count" -ne "${#packages[@]}" ]; then
    echo "fetch.sh: expected ${#packages[@]} .deb files in $dest, found $count" >&2
    exit 1
fi
echo "fetch.sh: $count packages in $dest ($(du -sh . | cut -f1))"
