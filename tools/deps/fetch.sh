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
# Usage: tools/deps/fetch.sh [--mpi] [DEST]      (DEST defaults to <repo>/.debs)
#   --mpi  also download Open MPI (mpirun, mpicc, libmpi, headers, ompi-c.pc) and the shared
#          libraries it needs that a bare host lacks; see mpi_packages below.
# Alternatives rejected: building from source on the host (slow, needs sources shipped too);
# vendoring the libraries as meson subprojects (extra code to maintain, different versions
# than the CI machine's Debian packages).
set -euo pipefail

repo=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
mpi=0
if [ "${1:-}" = --mpi ]; then
    mpi=1
    shift
fi
dest=${1:-"$repo/.debs"}

# -dev package first, then the runtime libraries its .so symlinks and .pc files need.
packages=(
    libjansson-dev libjansson4
    libpcre2-dev libpcre2-8-0 libpcre2-16-0 libpcre2-32-0 libpcre2-posix3
    libpng-dev libpng16-16
    zlib1g-dev zlib1g
    libcmocka-dev libcmocka0
    liburing-dev liburing2
    libmicrohttpd-dev libmicrohttpd12
    pkgconf pkgconf-bin libpkgconf3
)

# Open MPI 4.1 as Debian splits it, for `mpirun -n 2 flexdiag generate` and meson's
# dependency('mpi') (found through ompi-c.pc). The list is the ldd closure of mpirun/orterun,
# orted, opal_wrapper (mpicc), libmpi.so.40 and the MCA plugins that a single-host run opens
# (pml ob1, btl self/vader/tcp, pmix ext3x + PMIx's own plugins, reachable netlink -> libnl-3),
# minus what a bare Debian/Ubuntu host already has: libc6, zlib1g (also in the default list),
# libudev1, and libhwloc15 (the host's hwloc; bookworm's 2.9 would shadow the host's newer one
# through LD_LIBRARY_PATH for flexdiag itself). libopenmpi-dev's other Depends (libevent-dev,
# libhwloc-dev, libpmix-dev, libibverbs-dev, gfortran) are not needed: ompi-c.pc has no
# Requires and `-lmpi` links against the shared library only.
# Not shipped on purpose (about 2.1 MB more, no use on a single GPU host): the interconnect
# libraries that only the fabric plugins link (libfabric1, libucx0, libibverbs1, librdmacm1,
# libpsm2-2, libpsm-infinipath1, libnuma1, libnl-route-3-200). Debian's openmpi-mca-params.conf
# already disables the ofi/openib/ucx plugins and unpack.sh excludes psm/psm2, so an MPI job
# never dlopen()s them; only ompi_info and OpenSHMEM's ucx plugins still report them missing.
mpi_packages=(
    openmpi-bin openmpi-common libopenmpi3 libopenmpi-dev
    libpmix2 libmunge2
    libevent-core-2.1-7 libevent-pthreads-2.1-7
    libnl-3-200
)
if [ "$mpi" -eq 1 ]; then
    packages+=("${mpi_packages[@]}")
fi

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
