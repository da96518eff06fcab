"""llama.cpp for aarch64, cross-compiled here: the peer that cross/count_instructions.py --peer llamacpp
counts instructions of under qemu. Its source is the llama-cpp-python sdist from PyPI, pinned to the
version whose x86 build made the shared reference outputs (tests/llamacpp_ref.py downloads and unpacks
it); nothing of llama.cpp is copied into this repository.

Two variants, as llama.cpp's CPU backend is built for a Pi without GGML_NATIVE: armv8-a (Pi 4,
Cortex-A72) and armv8.2-a+dotprod (Pi 5, Cortex-A76). Only the `llama` static library is built (CPU
backend, no OpenMP: one thread means one thread), then cross/llamacpp_driver.cpp is linked against it
statically, so qemu-aarch64 runs it without an arm64 root. Both steps are cached under the edgellama
cache folder: the library by (sdist version, variant), the driver by that and the driver's hash; a lock
file per variant serializes concurrent builds.
Usage: python3 cross/build_llamacpp.py [--variant armv8-a|armv8.2-a+dotprod|all]  (prints the driver path)
"""

from __future__ import annotations

import argparse
import fcntl
import hashlib
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
DRIVER_SRC = ROOT / "cross" / "llamacpp_driver.cpp"
VARIANTS = ("armv8-a", "armv8.2-a+dotprod")
CC, CXX = "aarch64-linux-gnu-gcc", "aarch64-linux-gnu-g++"
# the static libraries `llama` pulls in, in link order (dependents first)
LIBS = ("src/libllama.a", "ggml/src/libggml.a", "ggml/src/libggml-cpu.a", "ggml/src/libggml-base.a")


def _sys_path_tests() -> None:
    sys.path.insert(0, str(ROOT / "tests"))
    sys.path.insert(0, str(ROOT))


def sdist_version() -> str:
    _sys_path_tests()
    from llamacpp_ref import LLAMA_CPP_PYTHON

    return LLAMA_CPP_PYTHON


def source_dir() -> Path:
    """llama.cpp's tree inside the cached, unpacked sdist (downloaded on first use)."""
    _sys_path_tests()
    from llamacpp_ref import cached_sdist

    from edgellama.default_model import cache_dir

    return cached_sdist(cache_dir()) / "vendor" / "llama.cpp"


def llamacpp_commit(src: Path) -> str:
    """The llama.cpp commit the sdist vendors (its git metadata ships in the sdist), or 'unknown'."""
    proc = subprocess.run(["git", "-C", str(src), "rev-parse", "HEAD"], capture_output=True, text=True,
                          check=False)
    return proc.stdout.strip() if proc.returncode == 0 else "unknown"


def _need(tool: str) -> str:
    path = shutil.which(tool)
    if path is None:
        raise SystemExit(f"{tool} not found: install g++-aarch64-linux-gnu and cmake (apt)")
    return path


def _run(cmd: list[str], log: Path) -> None:
    with open(log, "a") as f:
        f.write(f"$ {' '.join(cmd)}\n")
        f.flush()
        proc = subprocess.run(cmd, stdout=f, stderr=subprocess.STDOUT, check=False)
    if proc.returncode != 0:
        tail = log.read_text().splitlines()[-40:]
        raise SystemExit(f"{' '.join(cmd)} failed ({proc.returncode}); end of {log}:\n" + "\n".join(tail))


def cache_root() -> Path:
    _sys_path_tests()
    from edgellama.default_model import cache_dir

    return cache_dir() / "llamacpp-aarch64"


def build_library(variant: str, src: Path, jobs: int) -> Path:
    """The cmake build folder of VARIANT with the libraries of LIBS in it, built on first use."""
    if variant not in VARIANTS:
        raise SystemExit(f"unknown variant {variant!r} (one of {', '.join(VARIANTS)})")
    out = cache_root() / f"{sdist_version()}-{variant}"
    if (out / "built").is_file():
        return out
    out.mkdir(parents=True, exist_ok=True)
    with open(out / "lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if (out / "built").is_file():
            return out
        build, log = out / "build", out / "build.log"
        shutil.rmtree(build, ignore_errors=True)  # an interrupted attempt
        log.write_text("")
        t0 = time.perf_counter()
        _run([_need("cmake"), "-S", str(src), "-B", str(build), "-DCMAKE_BUILD_TYPE=Release",
              "-DCMAKE_SYSTEM_NAME=Linux", "-DCMAKE_SYSTEM_PROCESSOR=aarch64",
              f"-DCMAKE_C_COMPILER={_need(CC)}", f"-DCMAKE_CXX_COMPILER={_need(CXX)}",
              "-DBUILD_SHARED_LIBS=OFF", "-DGGML_NATIVE=OFF", "-DGGML_OPENMP=OFF", "-DGGML_BACKEND_DL=OFF",
              f"-DGGML_CPU_ARM_ARCH={variant}", "-DGGML_METAL=OFF", "-DGGML_CUDA=OFF", "-DGGML_VULKAN=OFF",
              "-DLLAMA_BUILD_COMMON=OFF", "-DLLAMA_BUILD_TESTS=OFF", "-DLLAMA_BUILD_TOOLS=OFF",
              "-DLLAMA_BUILD_EXAMPLES=OFF", "-DLLAMA_BUILD_SERVER=OFF", "-DLLAMA_BUILD_APP=OFF",
              "-DLLAMA_OPENSSL=OFF", "-DLLAMA_CURL=OFF"], log)
        _run([_need("cmake"), "--build", str(build), "--target", "llama", "-j", str(jobs)], log)
        missing = [lib for lib in LIBS if not (build / lib).is_file()]
        if missing:
            raise SystemExit(f"the llama build in {build} produced no {', '.join(missing)}")
        (out / "built").write_text(f"{time.perf_counter() - t0:.0f} s\n")
    return out


def driver_digest() -> str:
    return hashlib.sha256(DRIVER_SRC.read_bytes()).hexdigest()[:16]


def build_driver(variant: str, jobs: int = 2) -> Path:
    """The static aarch64 driver binary of VARIANT (library built first if needed)."""
    src = source_dir()
    lib = build_library(variant, src, jobs)
    exe = lib / f"llamacpp-driver-{driver_digest()}"
    if exe.is_file():
        return exe
    with open(lib / "lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if exe.is_file():
            return exe
        part = exe.with_suffix(".part")
        build = lib / "build"
        # -march as the library's variant: the driver's own loop is then built like the library
        _run([_need(CXX), "-std=c++17", "-O2", f"-march={variant}", "-Wall", "-Wextra", "-Werror",
              f"-I{src / 'include'}", f"-I{src / 'ggml' / 'include'}", str(DRIVER_SRC),
              *[str(build / x) for x in LIBS], "-static", "-pthread", "-lm", "-o", str(part)],
             lib / "driver.log")
        part.rename(exe)
    return exe


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--variant", default="all", help=f"{' | '.join(VARIANTS)} | all")
    ap.add_argument("-j", "--jobs", type=int, default=os.cpu_count() or 2)
    args = ap.parse_args(argv)
    for v in VARIANTS if args.variant == "all" else (args.variant,):
        print(build_driver(v, args.jobs), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
