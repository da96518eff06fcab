"""The C library's boundary: the extension module exports exactly the declared C API (the functions of
csrc/edgellama.h and of the test API csrc/edgellama_test.h, which cffi's cdef is made of) and its init
function; every internal el_* symbol stays hidden (-fvisibility=hidden)."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

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


# ---- one set of compiler flags: the C test runner tests the arithmetic of the shipped library ----

# flags that would let the compiler change float results behind the shared ones
UNSAFE_MATH = ("-ffast-math", "-Ofast", "-funsafe-math-optimizations", "-fassociative-math", "-freciprocal-math")


def _build_module() -> Any:
    import importlib.util

    spec = importlib.util.spec_from_file_location("_el_build", ROOT / "edgellama" / "native" / "build.py")
    assert spec and spec.loader
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def check_flags_hold(flags: list[str], shared: list[str], what: str) -> None:
    """Every shared flag is in flags and no later flag of the same option undoes it."""
    for f in shared:
        assert f in flags, f"{what} lacks {f}: {flags}"
        key = f.split("=", 1)[0] + "=" if "=" in f else None
        if key:
            last = [g for g in flags if g.startswith(key)][-1]
            assert last == f, f"{what}: {last} overrides {f}"
    assert not [f for f in flags if f in UNSAFE_MATH], f"{what} relaxes float semantics: {flags}"


def test_shared_flags_fix_the_float_semantics() -> None:
    shared = _build_module().shared_cflags()
    assert {"-ffp-contract=off", "-fno-math-errno", "-std=gnu11", "-fvisibility=hidden"} <= set(shared)


def test_extension_build_takes_the_shared_flags() -> None:
    build = _build_module()
    check_flags_hold(build.CFLAGS, build.shared_cflags(), "edgellama/native/build.py")


def test_c_runner_build_takes_the_shared_flags(tmp_path: Path) -> None:
    """csrc/tests/build.sh (which the native, sanitizer, aarch64 and armhf runners are built by) passes
    the compiler the library's flags: recorded by a stand-in compiler."""
    log = tmp_path / "argv"
    cc = tmp_path / "cc"
    cc.write_text(f"#!/bin/sh\nprintf '%s\\n' \"$@\" > '{log}'\n")
    cc.chmod(0o755)
    env = dict(os.environ, CC=str(cc))
    env.pop("CFLAGS", None)
    subprocess.run(["sh", str(ROOT / "csrc" / "tests" / "build.sh"), str(tmp_path / "out"), "-O1"], env=env,
                   check=True, timeout=60)
    argv = log.read_text().splitlines()
    check_flags_hold(argv, _build_module().shared_cflags(), "csrc/tests/build.sh")
    assert str(ROOT / "csrc" / "tests" / "run_tests.c") in argv


def test_every_script_that_compiles_the_library_takes_the_shared_flags() -> None:
    """A script compiling csrc/*.c itself reads cflags.txt or build.py's CFLAGS; the cross runners go
    through csrc/tests/build.sh."""
    scripts = [*(ROOT / "cross").glob("*.sh"), *(ROOT / "csrc").rglob("*.sh")]
    compiling = [s for s in scripts if re.search(r'csrc"?/\*\.c', s.read_text())]
    assert {s.name for s in compiling} >= {"build.sh", "build-wheel.sh"}
    for s in compiling:
        text = s.read_text()
        assert "cflags.txt" in text or "_build.CFLAGS" in text, f"{s} compiles csrc/*.c without the shared flags"
    for name in ("build-tests.sh", "run-armhf-tests.sh", "run-tests.sh"):
        assert "csrc/tests/build.sh" in (ROOT / "cross" / name).read_text(), name

