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

# .pc files spell /usr either through ${prefix} or literally (cmocka.pc, liburing.pc).
pcdirs=("$prefix/usr/lib/$multiarch/pkgconfig" "$prefix/usr/share/pkgconfig")
for dir in "${pcdirs[@]}"; do
    [ -d "$dir" ] || continue
    for pc in "$dir"/*.pc; do
        [ -L "$pc" ] && continue
        sed -i -E "s#(=|-I|-L)/usr(/|\$|[[:space:]])#\\1$prefix/usr\\2#g" "$pc"
    done
done

libdirs="$prefix/usr/lib/$multiarch:$prefix/lib/$multiarch"
pcpath="$prefix/usr/lib/$multiarch/pkgconfig:$prefix/usr/share/pkgconfig"
echo "export PKG_CONFIG_PATH=\"$pcpath\${PKG_CONFIG_PATH:+:\$PKG_CONFIG_PATH}\""
echo "export LD_LIBRARY_PATH=\"$libdirs\${LD_LIBRARY_PATH:+:\$LD_LIBRARY_PATH}\""
# Use the bundled pkgconf only where the host has no pkg-config of its own.
if ! command -v pkg-config >/dev/null; then
    [ -x "$prefix/usr/bin/pkgconf" ] || fail "host has no pkg-config and the bundle has no pkgconf"
    echo "export PATH=\"$prefix/usr/bin:\$PATH\""
    echo "export PKG_CONFIG=\"$prefix/usr/bin/pkgconf\""
fi
echo "unpack.sh: ${#debs[@]} packages extracted into $prefix" >&2
