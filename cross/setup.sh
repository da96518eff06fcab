#!/bin/sh
# setup.sh - installs the Debian cross toolchain, cmake and qemu user emulation for the aarch64 checks.
# Idempotent: does nothing (and needs no root) when every tool is already there.
set -eu

need=""
command -v aarch64-linux-gnu-gcc >/dev/null 2>&1 || need="$need gcc-aarch64-linux-gnu"
# g++ and cmake: cross/build_llamacpp.py (llama.cpp, the instruction-count peer)
command -v aarch64-linux-gnu-g++ >/dev/null 2>&1 || need="$need g++-aarch64-linux-gnu"
command -v cmake >/dev/null 2>&1 || need="$need cmake"
[ -f /usr/aarch64-linux-gnu/lib/libc.so.6 ] || need="$need libc6-dev-arm64-cross"
command -v qemu-aarch64 >/dev/null 2>&1 || need="$need qemu-user"
command -v qemu-aarch64-static >/dev/null 2>&1 || need="$need qemu-user-static"
command -v debootstrap >/dev/null 2>&1 || [ -x /usr/sbin/debootstrap ] || need="$need debootstrap"

if [ -z "$need" ]; then
    echo "cross/setup.sh: toolchain and qemu already installed"
    exit 0
fi

SUDO=""
[ "$(id -u)" -eq 0 ] || SUDO="sudo"
echo "cross/setup.sh: installing$need"
start=$(date +%s)
$SUDO apt-get update -qq
# shellcheck disable=SC2086 # word splitting of the package list is intended
DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends $need
echo "cross/setup.sh: done in $(( $(date +%s) - start )) s"
