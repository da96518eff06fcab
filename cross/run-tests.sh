#!/bin/sh
# run-tests.sh - runs the cross-built C test runner under qemu-aarch64 as a Cortex-A72 (Pi 4: NEON,
# no dotprod) and a Cortex-A76 (Pi 5: NEON + dotprod). Each must pick its ISA, pass every kernel
# test, and reproduce the golden vectors of the native (x86) scalar reference.
# Usage: cross/run-tests.sh   (builds what is missing: build/aarch64/run_tests, build/native/run_tests)
set -eu
root=$(cd "$(dirname "$0")/.." && pwd)
bin=$root/build/aarch64/run_tests
native=$root/build/native/run_tests
golden=$root/build/aarch64/golden.txt
SYSROOT=${CROSS_SYSROOT:-/usr/aarch64-linux-gnu}
command -v qemu-aarch64 >/dev/null 2>&1 || { echo "qemu-aarch64 missing: run cross/setup.sh" >&2; exit 2; }

# rebuild whatever is missing or older than a source file
stale() { [ ! -x "$1" ] || [ -n "$(find "$root/csrc" -name '*.[ch]' -newer "$1" | head -n 1)" ]; }
if stale "$bin"; then "$root/cross/build-tests.sh" "$bin"; fi
if stale "$native"; then
    mkdir -p "$(dirname "$native")"
    "$root/csrc/tests/build.sh" "$native"
fi
"$native" --emit-golden "$golden" >/dev/null

cpus=$(qemu-aarch64 -cpu help || true) # (exits non-zero after listing)
fail=0
run() { # cpu expected-isa extra-args...
    cpu=$1 want=$2
    shift 2
    case "$cpus" in *"$cpu"*) ;; *) echo "qemu-aarch64 has no -cpu $cpu" >&2; fail=1; return ;; esac
    start=$(date +%s)
    log=$(mktemp)
    rc=0
    qemu-aarch64 -L "$SYSROOT" -cpu "$cpu" "$bin" "$@" >"$log" 2>&1 || rc=$?
    secs=$(( $(date +%s) - start ))
    got=$(sed -n 's/^edgellama run_tests: isa=\([^ ]*\).*/\1/p' "$log" | head -n 1)
    last=$(tail -n 1 "$log")
    if [ "$rc" -ne 0 ] || [ "$got" != "$want" ]; then
        cat "$log"
        echo "FAILED: -cpu $cpu ${EDGELLAMA_ISA:+EDGELLAMA_ISA=$EDGELLAMA_ISA }$*: isa=$got (want $want), exit $rc"
        fail=1
    else
        grep '^golden vs' "$log" | sed 's/^/    /'
        echo "ok: -cpu $cpu ${EDGELLAMA_ISA:+EDGELLAMA_ISA=$EDGELLAMA_ISA }isa=$got: $last (${secs} s)"
    fi
    rm -f "$log"
}

run cortex-a72 neon --check-golden "$golden"
run cortex-a76 neon-dotprod --check-golden "$golden"
# the override: a lesser ISA on a better CPU works; a missing one falls back to the best available
EDGELLAMA_ISA=neon run cortex-a76 neon --check-golden "$golden" --golden-only
EDGELLAMA_ISA=neon-dotprod run cortex-a72 neon --check-golden "$golden" --golden-only
exit $fail
