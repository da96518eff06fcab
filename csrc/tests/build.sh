#!/bin/sh
# build.sh - builds the standalone C test runner from every library source (csrc/*.c, csrc/arch/*.c).
# Usage: csrc/tests/build.sh OUT [extra cflags...]; CC selects the compiler (a cross compiler works).
# Warnings are errors here: the library promises -Wall -Wextra clean C11.
set -eu
here=$(cd "$(dirname "$0")" && pwd)
csrc=$(dirname "$here")
out=${1:?usage: build.sh OUT [cflags...]}
shift
# the library's own flags (float semantics: csrc/cflags.txt, shared with edgellama/native/build.py)
shared=$(sed 's/#.*//' "$csrc/cflags.txt")
# shellcheck disable=SC2086 # shared and CFLAGS are word lists
${CC:-cc} $shared -O2 -Wall -Wextra -Werror ${CFLAGS:-} "$@" \
    -I"$csrc" "$csrc"/*.c "$csrc"/arch/*.c "$here"/run_tests.c -lm -o "$out"
