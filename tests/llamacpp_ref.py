"""llama.cpp's reference quantizers (quantize_row_*_ref of ggml-quants.c), built for the tests from the
llama-cpp-python sdist on PyPI, which vendors llama.cpp's source. Nothing of llama.cpp is copied into
this repository: pip downloads the sdist, and ggml-quants.c alone (with stubs for the four ggml
symbols it links against but the _ref quantizers never call) is compiled into a small shared
library, cached under the edgellama cache folder and loaded with ctypes. cached_sdist() is also the
source of cross/build_llamacpp.py's aarch64 build of the whole library."""

from __future__ import annotations

import ctypes
import fcntl
import os
import platform
import shutil
import subprocess
import sys
import tarfile
import tempfile
from pathlib import Path

import numpy as np
import numpy.typing as npt

from edgellama.gguf.ggml_types import TYPE_SIZES
from edgellama.gguf.ggml_types import GGMLType as T

LLAMA_CPP_PYTHON = "0.3.36"

# the types with a quantize_row_<name>_ref: weights and the activation formats
REF_TYPES = [T.Q4_0, T.Q4_1, T.Q5_0, T.Q5_1, T.Q8_0, T.Q8_1, T.Q2_K, T.Q3_K, T.Q4_K, T.Q5_K, T.Q6_K, T.Q8_K]

# ggml-quants.c links against these; none is reached from a _ref quantizer
STUBS = r"""
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
void ggml_abort(const char *file, int line, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    fprintf(stderr, "%s:%d: ", file, line);
    vfprintf(stderr, fmt, ap);
    va_end(ap);
    fputc('\n', stderr);
    abort();
}
size_t ggml_row_size(int type, int64_t ne) { (void)type; (void)ne; abort(); }
size_t ggml_type_size(int type) { (void)type; abort(); }
const char *ggml_type_name(int type) { (void)type; abort(); }
"""


class ReferenceUnavailable(Exception):
    """The sdist could not be downloaded (offline) or built; the message says which and why."""


def _download_sdist(dest: Path) -> Path:
    # --no-binary for this package only: build dependencies (cmake, ninja) may come as wheels; pip
    # prepares the sdist's metadata with them, which takes a minute or two
    cmd = [sys.executable, "-m", "pip", "download", "--disable-pip-version-check", "--no-deps",
           "--no-binary", "llama-cpp-python", f"llama-cpp-python=={LLAMA_CPP_PYTHON}", "-d", str(dest)]
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=1800, check=False)
    except subprocess.TimeoutExpired as exc:
        raise ReferenceUnavailable(f"pip download of llama-cpp-python timed out: {' '.join(cmd)}") from exc
    sdists = list(dest.glob("llama_cpp_python-*.tar.gz"))
    if proc.returncode != 0 or not sdists:
        last = (proc.stderr.strip().splitlines() or ["no output"])[-1]
        raise ReferenceUnavailable(f"cannot download llama-cpp-python=={LLAMA_CPP_PYTHON} sdist: {last}")
    return sdists[0]


def _compile(ggml: Path, tmp: Path, so: Path) -> None:
    cc = os.environ.get("CC", "cc")
    if shutil.which(cc) is None:
        raise ReferenceUnavailable(f"no C compiler ({cc}) to build llama.cpp's reference quantizers")
    stubs = tmp / "stubs.c"
    stubs.write_text(STUBS)
    # -DNDEBUG as llama.cpp's release builds (nearest_int's range assert would abort on denormal
    # blocks); no contraction into FMA, like csrc/quants*.c, so the comparison holds on aarch64 too
    cmd = [cc, "-std=gnu11", "-O2", "-DNDEBUG", "-ffp-contract=off", "-fPIC", "-shared",
           f"-I{ggml / 'include'}", f"-I{ggml / 'src'}", f"-I{ggml / 'src' / 'ggml-cpu'}",
           str(ggml / "src" / "ggml-quants.c"), str(stubs), "-o", str(so), "-lm", "-Wl,--no-undefined"]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=900, check=False)
    if proc.returncode != 0:  # a real failure, not a missing prerequisite
        raise RuntimeError(f"building llama.cpp's ggml-quants.c failed: {proc.stderr.strip()[-2000:]}")


def cached_sdist(cache: Path) -> Path:
    """The unpacked sdist (its llama_cpp_python-<version>/ folder) under CACHE, downloaded on first
    use; a lock file serializes concurrent first uses (the test runner, cross/build_llamacpp.py)."""
    base = cache / f"llama-cpp-python-{LLAMA_CPP_PYTHON}"
    src = base / f"llama_cpp_python-{LLAMA_CPP_PYTHON}"
    done = base / "unpacked"
    if done.is_file():
        return src
    base.mkdir(parents=True, exist_ok=True)
    with open(base / "lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # released when the file closes
        if done.is_file():
            return src
        with tempfile.TemporaryDirectory(prefix="sdist-", dir=base) as tmp:
            sdist = _download_sdist(Path(tmp) / "sdist")
            # the data filter refuses absolute paths, links out of the folder and device files
            with tarfile.open(sdist) as tar:
                tar.extractall(Path(tmp) / "x", filter="data")
            unpacked = Path(tmp) / "x" / src.name
            if not (unpacked / "vendor" / "llama.cpp" / "ggml" / "src" / "ggml-quants.c").is_file():
                raise ReferenceUnavailable(f"{sdist.name} holds no vendor/llama.cpp/ggml/src/ggml-quants.c")
            shutil.rmtree(src, ignore_errors=True)  # a half-moved earlier attempt
            unpacked.rename(src)
        done.write_text(f"{sdist.name}\n")
    return src


def build(cache: Path) -> Path:
    """The cached library, built from the cached sdist on first use."""
    so = cache / f"llama-cpp-python-{LLAMA_CPP_PYTHON}" / f"ggml-quants-{platform.machine()}.so"
    if so.is_file():
        return so
    ggml = cached_sdist(cache) / "vendor" / "llama.cpp" / "ggml"
    with tempfile.TemporaryDirectory(prefix="edgellama-ggml-") as tmp:
        part = Path(tmp) / so.name
        _compile(ggml, Path(tmp), part)
        shutil.move(str(part), so)  # whole or not at all: a concurrent run sees no half-written file
    return so


class LlamaCppQuants:
    """quantize(t, x): the bytes llama.cpp's quantize_row_<t>_ref writes for the float32 row x."""

    def __init__(self, so: Path) -> None:
        self.lib = ctypes.CDLL(str(so))
        for t in REF_TYPES:
            fn = getattr(self.lib, self.symbol(t))
            fn.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int64]
            fn.restype = None

    @staticmethod
    def symbol(t: int) -> str:
        name = T(t).name.lower()
        return f"quantize_row_{name[:-2] + '_K' if name.endswith('_k') else name}_ref"

    def quantize(self, t: int, x: npt.NDArray[np.float32]) -> npt.NDArray[np.uint8]:
        bs, ts = TYPE_SIZES[t]
        src = np.ascontiguousarray(x, dtype=np.float32).reshape(-1)
        assert src.size % bs == 0
        # zeroed: an all-zero Q8_K block leaves its bsums unwritten in ggml (ours are zero)
        out = np.zeros(src.size // bs * ts, np.uint8)
        getattr(self.lib, self.symbol(t))(src.ctypes.data, out.ctypes.data, src.size)
        return out
