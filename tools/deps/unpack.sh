#!/usr/bin/env bash
# Offline dependency bundle, step 2 of 2 (run on the GPU host at the start of every command).
#
# Extracts the .deb files that tools/deps/fetch.sh downloaded (carried to the host in .debs/)
# into a private prefix with `dpkg -x`, never into /, so the host's own packages stay intact.
# Debian's .pc files and a few symlinks name absolute /usr paths; they are rewritten to point
# into the prefix. pkg-config's default search path still covers the host's own .pc files
# (hwloc, zstd, CUDA), so the prefix is only prepended. PKG_CONFIG_SYSROOT_DIR was rejected:
# it would also prefix the host's own packages' paths.
#
# When the bundle holds Open MPI (fetch.sh --mpi), it also recreates the links that Debian's
# update-alternatives would make (mpirun, mpicc, mpi.pc) and exports what Open MPI needs to run
# from the prefix instead of /usr; see the Open MPI section below.
#
# Prints `export` lines on stdout (diagnostics go to stderr); use it as
#   eval "$(tools/deps/unpack.sh [DEBDIR] [PREFIX])"
# DEBDIR defaults to <repo>/.debs, PREFIX to /tmp/flexdiag-deps. Re-running is cheap and safe.
set -euo pipefail

repo=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
debdir=${1:-"$repo/.debs"}
prefix=${2:-/tmp/flexdiag-deps}
multiarch=x86_64-linux-gnu

fail() {
    echo "unpack.sh: $*" >&2
    exit 1
}

command -v dpkg >/dev/null || fail "dpkg not found on this host; it is needed to extract .deb files"
shopt -s nullglob
debs=("$debdir"/*.deb)
[ ${#debs[@]} -gt 0 ] || fail "no .deb files in $debdir; run tools/deps/fetch.sh on the CI \
machine and carry .debs/ to this host"

mkdir -p "$prefix"
for deb in "${debs[@]}"; do
    dpkg -x "$deb" "$prefix" || fail "cannot extract $deb (truncated download? re-run fetch.sh)"
done

# Absolute symlinks (e.g. libz.so -> /lib/.../libz.so.1.2.13) would resolve on the host's /:
# re-point each one at the same path inside the prefix when the prefix has it.
while IFS= read -r link; do
    target=$(readlink "$link")
    case "$target" in
        /*) [ -e "$prefix$target" ] && ln -sfn "$prefix$target" "$link" ;;
    esac
done < <(find "$prefix" -type l)

# Open MPI's .pc files live in its own libdir; usr/lib/<multiarch>/pkgconfig only holds relative
# symlinks to them (skipped below), so that directory is rewritten too.
ompi_libdir="$prefix/usr/lib/$multiarch/openmpi/lib"

# .pc files spell /usr either through ${prefix} or literally (cmocka.pc, liburing.pc).
pcdirs=("$prefix/usr/lib/$multiarch/pkgconfig" "$prefix/usr/share/pkgconfig" "$ompi_libdir/pkgconfig")
for dir in "${pcdirs[@]}"; do
    [ -d "$dir" ] || continue
    for pc in "$dir"/*.pc; do
        [ -L "$pc" ] && continue
        sed -i -E "s#(=|-I|-L)/usr(/|\$|[[:space:]])#\\1$prefix/usr\\2#g" "$pc"
    done
done

libdirs="$prefix/usr/lib/$multiarch:$prefix/lib/$multiarch"
pcpath="$prefix/usr/lib/$multiarch/pkgconfig:$prefix/usr/share/pkgconfig"

# Open MPI, only when this bundle carries it (fetch.sh --mpi). Debian's postinst would run
# update-alternatives; `dpkg -x` does not, so the plain names are linked here. They go into a
# bin folder of their own rather than usr/bin, which also holds the bundled pkgconf: putting
# usr/bin on PATH would shadow the host's own pkg-config (see the end of this script).
mpidebs=("$debdir"/openmpi-bin_*.deb)
if [ ${#mpidebs[@]} -gt 0 ]; then
    [ -x "$prefix/usr/bin/orterun" ] || fail "openmpi-bin extracted but $prefix/usr/bin/orterun is missing"
    mpibin="$prefix/usr/lib/$multiarch/openmpi/bin"
    mkdir -p "$mpibin"
    # opal_wrapper (mpicc, mpicxx) picks its wrapper-data file from the name it was run as.
    for tool in mpirun mpiexec mpicc mpicxx mpic++ ompi_info orterun orted; do
        target=$tool
        [ -e "$prefix/usr/bin/$tool.openmpi" ] && target=$tool.openmpi
        [ -e "$prefix/usr/bin/$target" ] || fail "$prefix/usr/bin/$target missing from the Open MPI packages"
        ln -sfn "../../../../bin/$target" "$mpibin/$tool"
    done
    # meson's dependency('mpi', language: 'c') asks pkg-config for ompi-c (shipped as a relative
    # link); mpi.pc and mpi-c.pc are Debian's alternatives names, linked for plain pkg-config use.
    for pc in mpi mpi-c mpi-cxx; do
        ln -sfn "ompi${pc#mpi}.pc" "$prefix/usr/lib/$multiarch/pkgconfig/$pc.pc"
    done
    libdirs="$libdirs:$ompi_libdir"
    echo "export PATH=\"$mpibin:\$PATH\""
    # Relocation: Open MPI derives bindir, libdir, pkglibdir (the MCA plugins), pkgdatadir (help
    # files, mpicc's wrapper data) from OPAL_PREFIX. Debian configured sysconfdir as absolute
    # /etc/openmpi, which OPAL_PREFIX does not move: point it at the bundle's copy, whose
    # openmpi-mca-params.conf disables the openib/ofi/ucx transports.
    echo "export OPAL_PREFIX=\"$prefix/usr\""
    echo "export OPAL_SYSCONFDIR=\"$prefix/etc/openmpi\""
    # Debian's PMIx (a separate library, prefix /usr/lib/<multiarch>/pmix2) has absolute libdir
    # and datadir, so OPAL_PREFIX does not move it either: name its plugin and help-file folders.
    # Its sysconfdir is left alone on purpose: the bundled pmix-mca-params.conf only sets the
    # plugin path back to /usr.
    pmixdir="$prefix/usr/lib/$multiarch/pmix2"
    echo "export PMIX_PKGLIBDIR=\"$pmixdir/lib/pmix\" PMIX_PKGDATADIR=\"$pmixdir/share/pmix\""
    # psm/psm2 (Intel Omni-Path) link libraries the bundle leaves out; without this every rank
    # prints a load error for them. ofi stays excluded as in Debian's openmpi-mca-params.conf,
    # which this variable overrides.
    echo "export OMPI_MCA_mtl=\"^ofi,psm,psm2\""
    # mpirun's rsh launcher insists on finding ssh or rsh, even for a job that stays on this
    # host, and aborts ("plm_rsh_agent: ssh : rsh ... could not be found") on hosts without
    # either. An empty agent makes that launcher step aside for the local-only one. (`command -v`
    # alone is not enough: bash reports a non-executable file when it finds nothing better.)
    runnable() {
        local path
        path=$(command -v "$1") && [ -f "$path" ] && [ -x "$path" ]
    }
    if ! runnable ssh && ! runnable rsh; then
        echo "export OMPI_MCA_plm_rsh_agent="
    fi
    # The GPU hosts run everything as root, which mpirun refuses without these two.
    echo "export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1"
fi

echo "export PKG_CONFIG_PATH=\"$pcpath\${PKG_CONFIG_PATH:+:\$PKG_CONFIG_PATH}\""
echo "export LD_LIBRARY_PATH=\"$libdirs\${LD_LIBRARY_PATH:+:\$LD_LIBRARY_PATH}\""
# Use the bundled pkgconf only where the host has no pkg-config of its own.
if ! command -v pkg-config >/dev/null; then
    [ -x "$prefix/usr/bin/pkgconf" ] || fail "host has no pkg-config and the bundle has no pkgconf"
    echo "export PATH=\"$prefix/usr/bin:\$PATH\""
    echo "export PKG_CONFIG=\"$prefix/usr/bin/pkgconf\""
fi
echo "unpack.sh: ${#debs[@]} packages extracted into $prefix" >&2
