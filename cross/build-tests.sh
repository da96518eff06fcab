#!/bin/sh
# build-tests.sh - cross-compiles the C test runner for aarch64 (-march=armv8-a: one binary for every
# 64-bit Pi; NEON vs NEON+dotprod is chosen at run time from HWCAP). Output: build/aarch64/run_tests.
# Usage: cross/build-tests.sh [OUT]
set -eu
root=$(cd "$(dirname "$0")/.." && pwd)
out=${1:-$root/build/aarch64/run_tests}
CC=${CROSS_CC:-aarch64-linux-gnu-gcc}
command -v "$CC" >/dev/null 2>&1 || { echo "$CC missing: run cross/setup.sh" >&2; exit 2; }
mkdir -p "$(dirname "$out")"
start=$(date +%s)
CC=$CC "$root/csrc/tests/build.sh" "$out" -march=armv8-a
# the dotprod variant must really use sdot, and only there (a stray sdot elsewhere would SIGILL on A72)
n_sdot=$(aarch64-linux-gnu-objdump -d "$out" | grep -c 'sdot' || true)
[ "$n_sdot" -gt 0 ] || { echo "build-tests: no sdot instruction in $out" >&2; exit 1; }
echo "cross/build-tests.sh: $out ($n_sdot sdot instructions) in $(( $(date +%s) - start )) s"
