#!/bin/sh
# test_install.sh BUILD PREFIX LIBDIR INCLUDEDIR VERSION CC SANITIZE EXAMPLE [ARCH] - what
# `meson install` puts on a machine, installed into a temporary DESTDIR: the headers, the
# library with its soname and links, flexdiag.pc (its version, and flags that point into the
# install through PKG_CONFIG_SYSROOT_DIR), the CLI's run path; then EXAMPLE
# (examples/generate.c) compiled and linked with `pkg-config --cflags --libs flexdiag` alone,
# as README "Embedding (C)" does, run against the installed library (LD_LIBRARY_PATH only
# because a DESTDIR is not where the loader looks; ARCH: its built-in model) and its images
# checked (run_generate.sh).
set -eu
build=$1 prefix=$2 libdir=$3 includedir=$4 version=$5 cc=$6 sanitize=$7 example=$8
arch=${9:-tiny-janus}
here=$(dirname "$0")
major=${version%%.*}
case $libdir in /*) ;; *) libdir=$prefix/$libdir ;; esac
case $includedir in /*) ;; *) includedir=$prefix/$includedir ;; esac
dest=$(mktemp -d)
trap 'rm -rf "$dest"' EXIT
fail() { echo "FAIL $*" >&2; exit 1; }

meson install -C "$build" --no-rebuild --quiet --destdir "$dest" >/dev/null
lib=$dest$libdir
for f in "$dest$includedir/flexdiag.h" "$dest$includedir/flexdiag_version.h" \
         "$lib/libflexdiag.so.$version" "$lib/pkgconfig/flexdiag.pc"; do
    [ -f "$f" ] || fail "not installed: ${f#"$dest"}"
done
[ "$(readlink "$lib/libflexdiag.so.$major")" = "libflexdiag.so.$version" ] ||
    fail "libflexdiag.so.$major does not point at libflexdiag.so.$version"
[ "$(readlink "$lib/libflexdiag.so")" = "libflexdiag.so.$major" ] ||
    fail "libflexdiag.so does not point at libflexdiag.so.$major"
readelf -d "$lib/libflexdiag.so.$version" | grep -q "(SONAME).*\[libflexdiag.so.$major\]" ||
    fail "the soname of libflexdiag.so.$version is not libflexdiag.so.$major"
readelf -d "$dest$prefix/bin/flexdiag" | grep -q "(RUNPATH).*\[$libdir\]" ||
    fail "the installed flexdiag does not find its library in $libdir"
echo "installed: headers, libflexdiag.so.$version (soname libflexdiag.so.$major), flexdiag.pc"

export PKG_CONFIG_PATH="$lib/pkgconfig" PKG_CONFIG_SYSROOT_DIR="$dest"
[ "$(pkg-config --modversion flexdiag)" = "$version" ] || fail "flexdiag.pc is not version $version"
flags=$(pkg-config --cflags --libs flexdiag)
echo "pkg-config --cflags --libs flexdiag: $flags"
san=
[ "$sanitize" = none ] || san=-fsanitize=$sanitize # an ASan library needs an ASan program
# shellcheck disable=SC2086 # the flags are words
"$cc" $san "$example" $flags -o "$dest/generate" || fail "the example does not build"
LD_LIBRARY_PATH=$lib ldd "$dest/generate" | grep -q "libflexdiag.so.$major => $lib/" ||
    fail "the example does not load the installed library"
LD_LIBRARY_PATH=$lib "$here/run_generate.sh" "$dest/generate" "$dest/out" "$arch" ||
    fail "the example failed"
echo "the example, built from the installed files, ran against the installed library"
