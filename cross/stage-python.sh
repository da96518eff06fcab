#!/bin/sh
# stage-python.sh - lays out what the emulated arm64 Python needs on its PYTHONPATH, in
# build/py-aarch64/: site/ = the aarch64 wheel installed by pip --target (rebuilt by cross/build-wheel.sh when any
# package or C source is newer than it), hostpure/ = the host's pure-Python gguf and yaml packages
# (.py files only: gguf-py is pure Python on numpy, and yaml falls back to pure Python without its
# C extension), which some tests use as their independent reference.
# Usage: cross/stage-python.sh   Prints "ARM_ROOT STAGE" as its last line.
set -eu
root=$(cd "$(dirname "$0")/.." && pwd)
stage=$root/build/py-aarch64
ARM_ROOT=$("$root/cross/make-root.sh" | tail -n 1)
version=$(python3 -c "import sys, tomllib; print(tomllib.load(open(sys.argv[1], 'rb'))['project']['version'])" \
    "$root/pyproject.toml")
wheel=$root/dist/edgellama-$version-cp311-cp311-linux_aarch64.whl

stale=no
if [ ! -f "$wheel" ]; then
    stale=yes
elif [ -n "$(find "$root/csrc" "$root/edgellama" "$root/cross/build-wheel.sh" -newer "$wheel" \
        \( -name '*.[ch]' -o -name '*.py' -o -name '*.sh' \) -print | head -n 1)" ]; then
    stale=yes
fi
if [ "$stale" = yes ]; then
    "$root/cross/build-wheel.sh" "$root/dist" >&2
fi

# Installed by pip (the host's, told the target's tags), as a user's pip would on the Pi: this also
# proves the wheel's name, tags and RECORD are acceptable to a real installer.
rm -rf "$stage/site"
PIP_ROOT_USER_ACTION=ignore python3 -m pip install -q --disable-pip-version-check --no-deps --no-compile \
    --target "$stage/site" --platform linux_aarch64 --python-version 3.11 --implementation cp --abi cp311 \
    --only-binary=:all: "$wheel" >&2

# The host's packages, located by the host's Python; missing ones are simply not staged (the tests
# that need them then skip or are left out of the emulated subset).
rm -rf "$stage/hostpure"
mkdir -p "$stage/hostpure"
python3 - "$stage/hostpure" <<'PY'
import importlib.util, shutil, sys
from pathlib import Path

dest = Path(sys.argv[1])
for name in ("gguf", "yaml"):
    spec = importlib.util.find_spec(name)
    if spec is None or not spec.submodule_search_locations:
        print(f"stage-python: host has no {name} package, not staged", file=sys.stderr)
        continue
    src = Path(next(iter(spec.submodule_search_locations)))
    for py in src.rglob("*.py"):
        out = dest / name / py.relative_to(src)
        out.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(py, out)
PY
echo "$ARM_ROOT $stage"
