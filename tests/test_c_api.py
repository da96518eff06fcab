"""The C library's boundary: the extension module exports exactly the declared C API (the functions of
csrc/edgellama.h and of the test API csrc/edgellama_test.h, which cffi's cdef is made of) and its init
function; every internal el_* symbol stays hidden (-fvisibility=hidden)."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from edgellama.native.lib import lib

ROOT = Path(__file__).resolve().parent.parent
MODULE = "edgellama.native._edgellama_c"


def declared_exports() -> set[str]:
    """The functions the cffi cdef declares (the EL_API ones) and the module's init function."""
    return {n for n in dir(lib) if n.startswith("el_")} | {"PyInit_" + MODULE.rsplit(".", 1)[1]}


def exported_symbols(so: Path, nm: str = "nm") -> set[str]:
    """Names in the dynamic symbol table that the shared object defines (what a dlopen can reach)."""
    tool = shutil.which(nm)
    if tool is None:
        if os.environ.get("CI") == "true":
            pytest.fail(f"{nm} (binutils) is missing in CI")
        pytest.skip(f"{nm} (binutils) not found")
    proc = subprocess.run([tool, "-D", "--defined-only", str(so)], capture_output=True, text=True, check=True)
    return {line.split()[-1] for line in proc.stdout.splitlines() if line.strip()}


def check_exports(so: Path, nm: str = "nm") -> None:
    got, want = exported_symbols(so, nm), declared_exports()
    extra, missing = sorted(got - want), sorted(want - got)
    assert not extra, f"{so.name} exports symbols outside the declared API: {extra}"
    assert not missing, f"{so.name} does not export declared functions (EL_API missing?): {missing}"


def test_extension_exports_only_the_declared_api() -> None:
    so = Path(sys.modules[MODULE].__file__ or "")
    assert so.is_file(), so
    check_exports(so)
    # the internals tests used to reach by dlopen are among those hidden now
    got = exported_symbols(so)
    for internal in ("el_kern", "el_pool_for", "el_quantize_act", "el_matmul_act", "el_get_type_traits"):
        assert internal not in got
    assert {"el_matmul", "el_model_eval", "el_isa_set"} <= got
