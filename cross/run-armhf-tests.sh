#!/bin/sh
# run-armhf-tests.sh - 32-bit Raspberry Pi OS (armhf: ARMv7-A, VFPv4 + NEON, hard float): cross-builds
# the C test runner with Debian's gcc-arm-linux-gnueabihf and runs it under qemu-arm as a Cortex-A7
# (Pi 2) and a Cortex-A15, against the x86 scalar golden vectors. The kernels' NEON code is
# aarch64-only, so this proves the portable scalar path on 32-bit ARM (ILP32, size_t = 32 bits).
# Usage: cross/run-armhf-tests.sh   (apt-get install gcc-arm-linux-gnueabihf libc6-dev-armhf-cross)
set -eu
root=$(cd "$(dirname "$0")/.." && pwd)
CC=${ARMHF_CC:-arm-linux-gnueabihf-gcc}
SYSROOT=${ARMHF_SYSROOT:-/usr/arm-linux-gnueabihf}
command -v "$CC" >/dev/null 2>&1 || {
    echo "$CC missing: apt-get install gcc-arm-linux-gnueabihf libc6-dev-armhf-cross" >&2
    exit 2
}
command -v qemu-arm >/dev/null 2>&1 || { echo "qemu-arm missing: run cross/setup.sh" >&2; exit 2; }
bin=$root/build/armhf/run_tests
native=$root/build/native/run_tests
golden=$root/build/armhf/golden.txt
mkdir -p "$(dirname "$bin")"
start=$(date +%s)
# Raspberry Pi OS armhf's own baseline is ARMv6 + VFP2 (Pi 1/Zero); ARMv7 + NEON is the Pi 2 and
# later, what a NEON port would target. EXTRA_CFLAGS: e.g. -Wno-unused-parameter while a source
# has a parameter that only the x86/aarch64 branches use (the runner builds with -Werror).
# shellcheck disable=SC2086 # EXTRA_CFLAGS is a word list
CC=$CC "$root/csrc/tests/build.sh" "$bin" -march=armv7-a -mfpu=neon-vfpv4 -mfloat-abi=hard ${EXTRA_CFLAGS:-}
if [ ! -x "$native" ] || [ -n "$(find "$root/csrc" -name '*.[ch]' -newer "$native" | head -n 1)" ]; then
    mkdir -p "$(dirname "$native")"
    "$root/csrc/tests/build.sh" "$native"
fi
"$native" --emit-golden "$golden" >/dev/null
echo "cross/run-armhf-tests.sh: built in $(( $(date +%s) - start )) s"
fail=0
for cpu in cortex-a7 cortex-a15; do
    t0=$(date +%s)
    log=$(mktemp)
    rc=0
    qemu-arm -L "$SYSROOT" -cpu "$cpu" "$bin" --check-golden "$golden" >"$log" 2>&1 || rc=$?
    isa=$(sed -n 's/^edgellama run_tests: isa=\([^ ]*\).*/\1/p' "$log" | head -n 1)
    if [ "$rc" -ne 0 ] || [ "$isa" != scalar ]; then
        cat "$log"
        echo "FAILED: qemu-arm -cpu $cpu: isa=$isa, exit $rc"
        fail=1
    else
        grep '^golden vs' "$log" | sed 's/^/    /'
        echo "ok: qemu-arm -cpu $cpu isa=$isa: $(tail -n 1 "$log") ($(( $(date +%s) - t0 )) s)"
    fi
    rm -f "$log"
done
exit $fail
