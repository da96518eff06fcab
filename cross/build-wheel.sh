#!/bin/sh
# build-wheel.sh - cross-compiles the cffi extension for aarch64 against the arm64 root's Python 3.11
# and packs an installable wheel (dist/edgellama-VERSION-cp311-cp311-linux_aarch64.whl) for a 64-bit
# Raspberry Pi OS / Debian bookworm; then smoke-tests it under qemu (A72 and A76).
# Usage: cross/build-wheel.sh [OUTDIR]   (the root comes from cross/make-root.sh, cached)
set -eu
root=$(cd "$(dirname "$0")/.." && pwd)
outdir=${1:-$root/dist}
CC=${CROSS_CC:-aarch64-linux-gnu-gcc}
command -v "$CC" >/dev/null 2>&1 || { echo "$CC missing: run cross/setup.sh" >&2; exit 2; }
start=$(date +%s)
ARM_ROOT=$("$root/cross/make-root.sh" | tail -n 1)
PY="qemu-aarch64 -L $ARM_ROOT $ARM_ROOT/usr/bin/python3.11"
stage=$root/build/wheel-aarch64
rm -rf "$stage"
mkdir -p "$stage/pkg/edgellama/native" "$outdir"

# 1. The extension's C source, emitted by the *target's* cffi (1.15 in bookworm) running under qemu,
#    so the generated code matches the _cffi_backend it will load, whatever cffi the host has.
#    (make_c_source is what emit_c_code calls, minus a distutils Extension Debian ships separately.)
(cd "$root" && $PY -c "
import importlib.util
spec = importlib.util.spec_from_file_location('el_build', 'edgellama/native/build.py')
_build = importlib.util.module_from_spec(spec)
spec.loader.exec_module(_build)
from cffi import recompiler
ffibuilder = _build.make_ffibuilder()
module_name, preamble = ffibuilder._assigned_source[:2]
recompiler.make_c_source(ffibuilder, module_name, preamble, '$stage/_edgellama_c.c')
")
t1=$(date +%s)

# 2. Compile and link it with the library sources, as setuptools would, for the target.
suffix=$($PY -c "import sysconfig; print(sysconfig.get_config_var('EXT_SUFFIX'))")
cflags=$(cd "$root" && $PY -c "
import importlib.util
spec = importlib.util.spec_from_file_location('el_build', 'edgellama/native/build.py')
_build = importlib.util.module_from_spec(spec)
spec.loader.exec_module(_build)
print(' '.join(_build.cflags()))
")
# Debian's pyconfig.h includes <aarch64-linux-gnu/python3.11/pyconfig.h>: the root's /usr/include
# is searched for that, but after the cross toolchain's own libc headers (-idirafter), not before
# shellcheck disable=SC2086 # cflags is a word list
$CC $cflags -march=armv8-a -fPIC -shared \
    -I"$ARM_ROOT/usr/include/python3.11" -idirafter "$ARM_ROOT/usr/include" -I"$root/csrc" \
    "$stage/_edgellama_c.c" "$root"/csrc/*.c "$root"/csrc/arch/*.c -lm -pthread \
    -o "$stage/pkg/edgellama/native/_edgellama_c$suffix"
t2=$(date +%s)

# 3. The wheel: the package's Python files, the extension, a dist-info with RECORD hashes.
wheel=$(python3 - "$root" "$stage/pkg" "$outdir" <<'PY'
import base64, hashlib, shutil, sys, tomllib, zipfile
from pathlib import Path

root, pkg, outdir = Path(sys.argv[1]), Path(sys.argv[2]), Path(sys.argv[3])
project = tomllib.loads((root / "pyproject.toml").read_text())
meta = project["project"]
name, version = meta["name"], meta["version"]
# data files (the systemd units) as setuptools puts them: NAME-VERSION.data/data/<target>/<file>
for target, files in project["tool"]["setuptools"].get("data-files", {}).items():
    dst = pkg / f"{name}-{version}.data" / "data" / target
    dst.mkdir(parents=True, exist_ok=True)
    for f in files:
        shutil.copy(root / f, dst / Path(f).name)
# every package folder (one with an __init__.py) under edgellama/, as setuptools' find would
for init in sorted((root / "edgellama").rglob("__init__.py")):
    sub = init.parent.relative_to(root)
    (pkg / sub).mkdir(parents=True, exist_ok=True)
    for py in sorted(init.parent.glob("*.py")):
        shutil.copy(py, pkg / sub / py.name)
tag = "cp311-cp311-linux_aarch64"
di = pkg / f"{name}-{version}.dist-info"
di.mkdir()
lines = ["Metadata-Version: 2.1", f"Name: {name}", f"Version: {version}", f"Summary: {meta.get('description', '')}",
         f"Requires-Python: {meta.get('requires-python', '>=3.9')}"]
lines += [f"Requires-Dist: {d}" for d in meta.get("dependencies", [])]
(di / "METADATA").write_text("\n".join(lines) + "\n")
(di / "WHEEL").write_text(f"Wheel-Version: 1.0\nGenerator: edgellama cross/build-wheel.sh\nRoot-Is-Purelib: false\nTag: {tag}\n")
scripts = meta.get("scripts", {})
if scripts:
    (di / "entry_points.txt").write_text("[console_scripts]\n" + "".join(f"{k} = {v}\n" for k, v in scripts.items()))
files = sorted(p for p in pkg.rglob("*") if p.is_file())
record = []
for p in files:
    data = p.read_bytes()
    digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
    record.append(f"{p.relative_to(pkg).as_posix()},sha256={digest},{len(data)}")
record.append(f"{di.name}/RECORD,,")
(di / "RECORD").write_text("\n".join(record) + "\n")
out = outdir / f"{name}-{version}-{tag}.whl"
with zipfile.ZipFile(out, "w", zipfile.ZIP_DEFLATED) as z:
    for p in files + [di / "RECORD"]:
        z.write(p, p.relative_to(pkg).as_posix())
print(out)
PY
)
t3=$(date +%s)

# 4. Smoke test: the wheel's contents on PYTHONPATH of the arm64 Python, on both CPUs.
smoke=$stage/smoke
mkdir -p "$smoke"
python3 -c "import sys, zipfile; zipfile.ZipFile(sys.argv[1]).extractall(sys.argv[2])" "$wheel" "$smoke"
for cpu_isa in cortex-a72:neon cortex-a76:neon-dotprod; do
    cpu=${cpu_isa%%:*} want=${cpu_isa#*:}
    # from inside the unpacked wheel, so the source tree's edgellama/ cannot shadow it
    (cd "$smoke" && PYTHONPATH=$smoke qemu-aarch64 -L "$ARM_ROOT" -cpu "$cpu" "$ARM_ROOT/usr/bin/python3.11" -c "
import numpy as np
import edgellama
from edgellama.native import kernels
assert kernels.isa() == '$want', kernels.isa()
# one Q8_0 block by hand: d = 0.5 (fp16 0x3800), quants -16..15 -> values q / 2
raw = np.concatenate([np.frombuffer(np.float16(0.5).tobytes(), np.uint8), np.arange(-16, 16, dtype=np.int8).view(np.uint8)])
got = edgellama.dequantize(raw, 8, 32)
assert np.array_equal(got, np.arange(-16, 16, dtype=np.float32) / 2), got
# Q4_K round trip of a smooth row stays within its step
x = np.sin(np.arange(512, dtype=np.float32) / 7)
y = edgellama.dequantize(edgellama.quantize(x, 12), 12, 512)
assert float(np.max(np.abs(x - y))) < 0.1
assert kernels.__file__.startswith('$smoke'), kernels.__file__
# every module the wheel carries imports (the command's __main__ entry points excepted)
import importlib, pkgutil
mods = sorted(m.name for m in pkgutil.walk_packages(edgellama.__path__, 'edgellama.') if not m.name.endswith('__main__'))
for name in mods:
    assert importlib.import_module(name).__file__.startswith('$smoke'), name
print('smoke modules:', ' '.join(mods))
print('smoke ok: -cpu $cpu isa', kernels.isa(), 'features', kernels.cpu_features())
")
done
t4=$(date +%s)
echo "cross/build-wheel.sh: emit $((t1 - start)) s, compile $((t2 - t1)) s, pack $((t3 - t2)) s, smoke $((t4 - t3)) s"
echo "$wheel"
