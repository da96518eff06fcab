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
from conftest import skip_or_fail

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
        skip_or_fail(f"{nm} (binutils) not found")
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
    check_flags_hold(build.cflags(), build.shared_cflags(), "edgellama/native/build.py")


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
    """A script compiling csrc/*.c itself reads cflags.txt or build.py's cflags(); the cross runners go
    through csrc/tests/build.sh."""
    scripts = [*(ROOT / "cross").glob("*.sh"), *(ROOT / "csrc").rglob("*.sh")]
    compiling = [s for s in scripts if re.search(r'csrc"?/\*\.c', s.read_text())]
    assert {s.name for s in compiling} >= {"build.sh", "build-wheel.sh"}
    for s in compiling:
        text = s.read_text()
        assert "cflags.txt" in text or "_build.cflags()" in text, f"{s} compiles csrc/*.c without the shared flags"
    for name in ("build-tests.sh", "run-armhf-tests.sh", "run-tests.sh"):
        assert "csrc/tests/build.sh" in (ROOT / "cross" / name).read_text(), name


# ---- constants and type lists: the binding reads the C enums; the pure tables agree with them ----


def test_pure_ggml_type_table_agrees_with_the_c_library() -> None:
    """edgellama/gguf/ggml_types.py stays pure (the GGUF reader runs without C): its numbers, block
    sizes and bytes are those of the C library for every type the library knows."""
    from edgellama.gguf.ggml_types import COMPUTE_TYPES, TYPE_SIZES, GGMLType, row_bytes
    from edgellama.native import kernels

    c_enum = {n[len("EL_TYPE_"):]: int(getattr(lib, n)) for n in dir(lib) if n.startswith("EL_TYPE_")}
    count = c_enum.pop("COUNT")
    assert len(c_enum) == 15
    for name, value in c_enum.items():
        assert GGMLType[name] == value, name
    known = [t for t in range(count + 8) if lib.el_type_block_size(t)]
    assert known == sorted(c_enum.values())  # the C library knows its enum, nothing else
    for t in known:
        bs, nbytes = int(lib.el_type_block_size(t)), int(lib.el_type_block_bytes(t))
        assert TYPE_SIZES[t] == (bs, nbytes), GGMLType(t).name
        for k in (1, 3, 64):
            assert row_bytes(t, k * bs) == lib.el_row_bytes(t, k * bs)
        if bs > 1:
            assert lib.el_row_bytes(t, bs + 1) == 0  # not a whole number of blocks
    # the weight types the kernels compute on: the pure list (the wiring's check) is the C one
    assert COMPUTE_TYPES == kernels.WEIGHT_TYPES
    assert kernels.ACT_TYPES == {GGMLType.Q8_0, GGMLType.Q8_1, GGMLType.Q8_K}


def test_binding_names_are_the_c_enums() -> None:
    from edgellama.cli.common import NUMERICS
    from edgellama.native import engine

    assert engine.ARCHS == {"llama": lib.EL_ARCH_LLAMA, "gemma3": lib.EL_ARCH_GEMMA3, "bert": lib.EL_ARCH_BERT}
    assert engine.ACTS == {"silu": lib.EL_ACT_SILU, "gelu": lib.EL_ACT_GELU}
    assert engine.NUMERICS == {"native": lib.EL_NUMERICS_NATIVE, "llamacpp": lib.EL_NUMERICS_LLAMACPP,
                               "llamacpp-avx2": lib.EL_NUMERICS_LLAMACPP_AVX2,
                               "llamacpp-avx512": lib.EL_NUMERICS_LLAMACPP_AVX512}
    assert NUMERICS == tuple(engine.NUMERICS)  # the CLI's --numerics choices
    assert engine.KV_TYPES == {"f32": lib.EL_TYPE_F32, "f16": lib.EL_TYPE_F16, "q8_0": lib.EL_TYPE_Q8_0}


def test_cli_choices_are_the_engine_names() -> None:
    """The CLI lists its choices without loading the C extension; they must be the binding's names."""
    import argparse

    from edgellama.cli import build_parser
    from edgellama.native import engine

    want = {"--cache-type": set(engine.KV_TYPES), "--numerics": set(engine.NUMERICS)}
    seen = 0
    sub = next(a for a in build_parser()._actions if isinstance(a, argparse._SubParsersAction))
    for name, parser in sub.choices.items():
        for action in parser._actions:
            for opt in set(action.option_strings) & set(want):
                assert set(action.choices or ()) == want[opt], f"edgellama {name} {opt}"
                seen += 1
    assert seen >= 4  # run, perplexity, bench and info take both


def test_unknown_architecture_or_activation_is_refused_by_name(smollm2_path: Path) -> None:
    from dataclasses import replace

    from edgellama.gguf.reader import GGUFFile
    from edgellama.native.engine import plan_bytes
    from edgellama.wiring import build_desc

    f = GGUFFile(smollm2_path)
    try:
        desc = build_desc(f)[1]
        assert (desc.arch, desc.act) == ("llama", "silu")
        assert plan_bytes(desc, 64, 16, "f16", 1)[0] > 0
        with pytest.raises(ValueError, match="unknown architecture 'mamba'"):
            plan_bytes(replace(desc, arch="mamba"), 64, 16, "f16", 1)
        with pytest.raises(ValueError, match="unknown activation 'relu'"):
            plan_bytes(replace(desc, act="relu"), 64, 16, "f16", 1)
    finally:
        f.close()


def test_test_api_refuses_buffers_that_do_not_hold_the_rows() -> None:
    """The test API checks sizes like the public one: a call that would read past a buffer is refused."""
    from edgellama.gguf.ggml_types import GGMLType as T
    from edgellama.native.lib import ffi

    n = 64
    w = bytearray(2 * 34)  # two Q8_0 blocks: one row of 64
    a = bytearray(lib.EL_TEST_NV_MAX * 2 * 34)  # NV_MAX activation rows, stride 68
    out = ffi.new("float[]", 2 * lib.EL_TEST_NV_MAX)
    scalar, q8 = b"scalar", int(T.Q8_0)
    args = (ffi.from_buffer(w), len(w), ffi.from_buffer(a))
    # sizes are checked before the entry is looked up; the best ISA has a Q8_0 vec_dot_nv where SIMD exists
    best = lib.el_isa_name()
    fits = lib.EL_OK if lib.el_test_kernel_present(best, lib.EL_TEST_VEC_DOT_NV, q8) else lib.EL_EUNSUPPORTED
    assert lib.el_test_vec_dot_nv(best, q8, n, *args, len(a), 68, lib.EL_TEST_NV_MAX, out) == fits
    assert lib.el_test_vec_dot(scalar, q8, n, ffi.from_buffer(w), len(w), ffi.from_buffer(a), 68, out) == lib.EL_OK
    assert lib.el_test_vec_dot_nv(scalar, q8, n, *args, len(a) - 1, 68, lib.EL_TEST_NV_MAX, out) == lib.EL_EINVAL
    assert lib.el_test_vec_dot_nv(scalar, q8, n, *args, len(a), 68, lib.EL_TEST_NV_MAX + 1, out) == lib.EL_EINVAL
    assert lib.el_test_vec_dot_nv(scalar, q8, n + 1, *args, len(a), 68, 1, out) == lib.EL_EINVAL
    assert lib.el_test_vec_dot(scalar, q8, n, ffi.from_buffer(w), len(w) - 1, ffi.from_buffer(a), 68, out) == lib.EL_EINVAL
    # a tile reads EL_TEST_TILE_ROWS weight rows: one row's buffer is too small
    assert lib.el_test_vec_dot_tile(scalar, q8, n, ffi.from_buffer(w), len(w), 68, ffi.from_buffer(a), len(a), 68, 1,
                                    out, 4) == lib.EL_EINVAL
    assert lib.el_test_kernel_present(b"no-such-isa", lib.EL_TEST_VEC_DOT, q8) == lib.EL_EUNSUPPORTED
    assert lib.el_test_kernel_present(scalar, 99, q8) == lib.EL_EINVAL
    assert lib.el_test_kernel_present(scalar, lib.EL_TEST_VEC_DOT, lib.EL_TYPE_COUNT) == lib.EL_EINVAL
    assert lib.el_test_kernel_present(scalar, lib.EL_TEST_VEC_DOT, q8) == 1  # the scalar table's own
    assert lib.el_test_kernel_present(scalar, lib.EL_TEST_VEC_DOT_NV, q8) == 0  # scalar loops over vec_dot
