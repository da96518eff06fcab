#!/bin/sh
# make-root.sh - builds (once) an arm64 Debian bookworm root with python3, numpy, cffi, pyserial, h11 and
# pytest, runnable with `qemu-aarch64 -L ROOT ROOT/usr/bin/python3.11` (no chroot, no binfmt needed).
# Usage: cross/make-root.sh [ROOT]   (default $EDGELLAMA_ARM64_ROOT or ~/.cache/edgellama/arm64-bookworm)
# Prints the root's path as its last line. Skips all work when the root is already complete.
set -eu

ROOT=${1:-${EDGELLAMA_ARM64_ROOT:-${XDG_CACHE_HOME:-$HOME/.cache}/edgellama/arm64-bookworm}}
MIRROR=${DEBIAN_MIRROR:-http://deb.debian.org/debian}
# python3-ply: pycparser needs it (cffi parses the header when emitting the extension source) and
# debootstrap does not pull it in by itself
PKGS=python3,python3-numpy,python3-cffi,python3-serial,python3-h11,python3-pytest,python3-ply,libpython3.11-dev
STAMP="$ROOT/.edgellama-root-ok"

if [ -f "$STAMP" ] && [ "$(cat "$STAMP")" = "$PKGS" ]; then
    echo "cross/make-root.sh: cached root"
    echo "$ROOT"
    exit 0
fi

command -v debootstrap >/dev/null 2>&1 || PATH="$PATH:/usr/sbin"
command -v debootstrap >/dev/null 2>&1 || { echo "debootstrap missing: run cross/setup.sh" >&2; exit 2; }

start=$(date +%s)
rm -rf "$ROOT"
mkdir -p "$ROOT"
# --foreign only downloads and unpacks the base; the second stage (which would need to run arm64
# binaries as root inside a chroot) is replaced by extracting every downloaded .deb below.
debootstrap --arch=arm64 --variant=minbase --foreign --include="$PKGS" bookworm "$ROOT" "$MIRROR"
t1=$(date +%s)
for deb in "$ROOT"/var/cache/apt/archives/*.deb; do
    dpkg-deb -x "$deb" "$ROOT"
done
# The links the alternatives system would have made in postinst (numpy loads libblas.so.3).
lib="$ROOT/usr/lib/aarch64-linux-gnu"
for l in blas lapack; do
    if [ ! -e "$lib/lib$l.so.3" ] && [ -e "$lib/$l/lib$l.so.3" ]; then
        ln -sf "$l/lib$l.so.3" "$lib/lib$l.so.3"
    fi
done
# python3 -> python3.11 is shipped as a link by python3-minimal; make sure it resolves in the root.
[ -e "$ROOT/usr/bin/python3" ] || ln -sf python3.11 "$ROOT/usr/bin/python3"
t2=$(date +%s)

if command -v qemu-aarch64 >/dev/null 2>&1; then
    qemu-aarch64 -cpu cortex-a72 -L "$ROOT" "$ROOT/usr/bin/python3.11" -c \
        "import numpy, cffi, serial, pytest; print('arm64 root:', 'numpy', numpy.__version__, 'cffi', cffi.__version__, 'pyserial', serial.VERSION, 'pytest', pytest.__version__)"
fi
printf '%s' "$PKGS" >"$STAMP"
echo "cross/make-root.sh: debootstrap $((t1 - start)) s, extract $((t2 - t1)) s"
echo "$ROOT"
