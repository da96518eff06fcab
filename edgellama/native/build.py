"""cffi (API mode) builder for the C kernel library in csrc/.

Run by setuptools through ``cffi_modules`` (``make_ffibuilder``) during ``pip install .``; the
declarations come straight from ``csrc/edgellama.h`` (and the test API of ``csrc/edgellama_test.h``)
so the C API has one source of truth.
"""

from __future__ import annotations

import os
import re
import sys
from pathlib import Path

from cffi import FFI

ROOT = Path(__file__).resolve().parent.parent.parent
CSRC = ROOT / "csrc"


def _rel(p: Path) -> str:
    # setuptools wants paths relative to the project; the in-place developer build compiles from a
    # temporary directory, so it gets absolute ones.
    if __name__ == "__main__":
        return str(p)
    try:
        return os.path.relpath(p)
    except ValueError:
        return str(p)


def cdef_source(header: str = "edgellama.h") -> str:
    """A header without preprocessor lines, the C++ guard and the EL_API export marks: what cffi's
    parser accepts."""
    out = []
    skip_depth = 0
    for line in (CSRC / header).read_text().splitlines():
        s = line.strip()
        if s.startswith("#ifdef __cplusplus"):
            skip_depth = 1
            continue
        if skip_depth:
            if s.startswith("#endif"):
                skip_depth = 0
            continue
        if s.startswith("#"):
            continue
        out.append(re.sub(r"\bEL_API\s+", "", line))
    return "\n".join(out)


def c_sources() -> list[str]:
    files = sorted(CSRC.glob("*.c")) + sorted((CSRC / "arch").glob("*.c"))
    return [_rel(p) for p in files]


def shared_cflags() -> list[str]:
    """csrc/cflags.txt: the flags every build of the C sources takes (float semantics, visibility)."""
    words: list[str] = []
    for line in (CSRC / "cflags.txt").read_text().splitlines():
        words += line.split("#", 1)[0].split()
    return words


def cflags() -> list[str]:
    """The extension's compiler flags: the shared ones, -O3 and the warnings, then $EDGELLAMA_CFLAGS."""
    flags = ["-O3", *shared_cflags(), "-Wall", "-Wextra", "-Wno-unused-parameter"]
    return flags + os.environ.get("EDGELLAMA_CFLAGS", "").split()


def make_ffibuilder() -> FFI:
    """The extension's cffi builder (setup.py's cffi_modules entry). A function, not a module global:
    the wheel carries this module without csrc/, and importing it must read no source file."""
    ffibuilder = FFI()
    ffibuilder.cdef(cdef_source())
    ffibuilder.cdef(cdef_source("edgellama_test.h"))  # the test API: for edgellama's tests, not stable
    ffibuilder.set_source(
        "edgellama.native._edgellama_c",
        '#include "edgellama.h"\n#include "edgellama_test.h"',
        sources=c_sources(),
        include_dirs=[_rel(CSRC)],
        extra_compile_args=cflags(),
        extra_link_args=["-pthread"],
        libraries=["m"],
    )
    return ffibuilder


if __name__ == "__main__":
    # Developer shortcut: build the extension in place (python edgellama/native/build.py).
    os.chdir(ROOT)
    if sys.stderr.isatty():  # progress on a terminal only
        print(f"edgellama: compiling the C library ({len(c_sources())} files, about a minute on 2 cores)",
              file=sys.stderr)
    make_ffibuilder().compile(tmpdir=str(ROOT / "build" / "cffi"), verbose="-v" in sys.argv)
    import glob
    import shutil
    import tempfile

    for so in glob.glob(str(ROOT / "build" / "cffi" / "edgellama" / "native" / "_edgellama_c*.so")):
        # Copy to a temporary file next to the target, then rename: processes that have the old .so
        # mapped keep their inode instead of seeing it rewritten under them (which crashed them).
        dest = ROOT / "edgellama" / "native" / os.path.basename(so)
        fd, tmp = tempfile.mkstemp(prefix=".tmp_", suffix=".so", dir=ROOT / "edgellama" / "native")
        os.close(fd)
        try:
            shutil.copy(so, tmp)
            os.replace(tmp, dest)
        except BaseException:
            os.unlink(tmp)
            raise
