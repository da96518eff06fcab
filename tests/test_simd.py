"""SIMD kernels (AVX2, AVX-512 VNNI; NEON through the same tests when built there) against the scalar
reference: vec_dot per type, activation quantization bytes, float helpers, matmul vs float64 numpy, and
the multi-row (prefill) dots and batched matmuls bit-identical to their single-row forms."""

from __future__ import annotations

import os
from typing import Any

import numpy as np
import numpy.typing as npt
import pytest
from act_reference import q8_0_reference, q8_1_reference, q8_K_reference
from conftest import SIMD_ISAS

import edgellama
from edgellama.gguf.ggml_types import TYPE_SIZES
from edgellama.gguf.ggml_types import GGMLType as T
from edgellama.native import kernels
from edgellama.native.engine import Pool
from edgellama.native.lib import check, ffi, lib

FLOAT_TYPES = [T.F32, T.F16, T.BF16]
BLOCK_TYPES = [T.Q4_0, T.Q4_1, T.Q5_0, T.Q5_1, T.Q8_0, T.Q2_K, T.Q3_K, T.Q4_K, T.Q5_K, T.Q6_K]
WEIGHT_TYPES = FLOAT_TYPES + BLOCK_TYPES

# Tolerance of a SIMD float result vs the scalar one. The integer sum of each block is exact on both
# paths; they differ only in how the per-block float terms are rounded and summed (lanes, FMA), so
# the difference is bounded by a few ulp per term: |simd - scalar| <= REL_TOL * sum|terms|.
REL_TOL = 1e-5

# Block layouts (ggml-common.h): fp16 scale fields, and the byte ranges holding only quant bits
# (zeroing them leaves each value at its block's offset, which bounds the min terms of the dot).
HALF_FIELDS: dict[int, list[int]] = {
    T.Q4_0: [0], T.Q4_1: [0, 2], T.Q5_0: [0], T.Q5_1: [0, 2], T.Q8_0: [0],
    T.Q2_K: [80, 82], T.Q3_K: [108], T.Q4_K: [0, 2], T.Q5_K: [0, 2], T.Q6_K: [208],
}
QUANT_BYTES: dict[int, list[tuple[int, int]]] = {
    T.Q4_1: [(4, 20)], T.Q5_1: [(4, 24)], T.Q2_K: [(16, 80)], T.Q4_K: [(16, 144)], T.Q5_K: [(16, 176)],
}

# ---- what each ISA's dispatch table is supposed to hold (csrc/arch/*.c fillers) ----
# Per ISA and entry, the weight types (activation types for quantize_act) with a kernel of that ISA:
# for vec_dot and quantize_act an entry other than the scalar one; for the batch entries (NULL in the
# scalar table) any entry at all. A test needing an entry fails when the table expects it and it is
# NULL, and test_kernel_tables_hold_what_each_isa_is_supposed_to_have fails on any entry the table
# does not list, so the table cannot go stale.
LEGACY = {T.Q4_0, T.Q4_1, T.Q5_0, T.Q5_1, T.Q8_0}
K_QUANTS = {T.Q2_K, T.Q3_K, T.Q4_K, T.Q5_K, T.Q6_K}
ACT_TYPES = {T.Q8_0, T.Q8_1, T.Q8_K}
FLOATS = {T.F32, T.F16, T.BF16}  # float weights: one FMA chain per output (avx2.c, avx512.c, neon.c)
AVX2_KERNELS: dict[str, set[int]] = {
    "vec_dot": {T.F32, T.F16, T.BF16} | LEGACY | K_QUANTS,
    "quantize_act": ACT_TYPES,
    "vec_dot_nv": LEGACY | {T.Q4_K, T.Q5_K, T.Q6_K} | FLOATS,
    # 2 x 4 tiles: the two-blocks-per-register kernels (csrc/arch/avx2.c), Q4_K and Q6_K, the float types
    "vec_dot_tile": {T.Q5_0, T.Q8_0, T.Q4_K, T.Q6_K} | FLOATS,
    "vec_dot_rows": LEGACY | {T.Q4_K, T.Q6_K} | FLOATS,
}
# NEON (csrc/arch/neon_batch.c): nv kernels for every quantized type; 2 x 4 tiles for the 32-value
# types and the float types (csrc/arch/neon.c), and for Q4_K with dotprod only (two rows of Q4_K spill without it). Q2_K, Q3_K, Q5_K and
# Q6_K have no tiles: 8 unpacked registers per row per step, two rows spill.
NEON_KERNELS: dict[str, set[int]] = {
    "vec_dot": LEGACY | K_QUANTS | FLOATS,
    "quantize_act": ACT_TYPES,
    "vec_dot_nv": LEGACY | K_QUANTS | FLOATS,
    "vec_dot_tile": LEGACY | FLOATS,
    "vec_dot_rows": LEGACY | K_QUANTS | FLOATS,
}
ISA_KERNELS: dict[str, dict[str, set[int]]] = {
    "avx2": AVX2_KERNELS,
    # AVX-512 VNNI replaces the legacy types and Q4_K / Q6_K, all with 2-row tiles, and the float types
    # (one 16-lane chain per output); the rest stay AVX2's
    "avx512": {**AVX2_KERNELS, "vec_dot_tile": LEGACY | {T.Q4_K, T.Q6_K} | FLOATS},
    "neon": NEON_KERNELS,
    "neon-dotprod": {**NEON_KERNELS, "vec_dot_tile": LEGACY | {T.Q4_K} | FLOATS},
}
BATCH_ENTRIES = ("vec_dot_nv", "vec_dot_tile", "vec_dot_rows")

# ---- single kernels of one ISA's dispatch table: the test API (csrc/edgellama_test.h) ----
# Each call names its ISA and runs that ISA's entry whatever ISA is active, with checked buffer sizes.
EL_NV_MAX, EL_TILE_ROWS, EL_MV_ROWS = lib.EL_TEST_NV_MAX, lib.EL_TEST_TILE_ROWS, lib.EL_TEST_MV_ROWS
ENTRY = {"vec_dot": lib.EL_TEST_VEC_DOT, "quantize_act": lib.EL_TEST_QUANTIZE_ACT, "vec_dot_nv": lib.EL_TEST_VEC_DOT_NV,
         "vec_dot_tile": lib.EL_TEST_VEC_DOT_TILE, "vec_dot_rows": lib.EL_TEST_VEC_DOT_ROWS}


def kernel_kind(isa: str, entry: str, t: int) -> int:
    """0: ISA's table has no ENTRY for type t (NULL), 1: it holds the scalar table's function, 2: its own."""
    kind = lib.el_test_kernel_present(isa.encode(), ENTRY[entry], t)
    assert kind in (0, 1, 2), f"el_test_kernel_present({isa}, {entry}, {t}) = {kind}"
    return int(kind)


def need_kernel(isa: str, entry: str, t: int) -> None:
    """ISA's batch kernel ENTRY for weight type t: a NULL entry fails where ISA_KERNELS says the ISA has
    it and skips, as an expected absence, where it says the ISA has none."""
    expected = t in ISA_KERNELS[isa][entry]
    present = kernel_kind(isa, entry, t) != 0
    if present != expected:
        pytest.fail(f"{isa} {'lacks' if expected else 'has'} {entry}[{T(t).name}]: "
                    f"ISA_KERNELS says it {'should' if expected else 'should not'} (update the table or the filler)")
    if not present:
        # an expected absence: NEON's missing K-quant tiles are a choice (csrc/arch/neon_batch.c)
        pytest.skip(f"{entry} for {T(t).name} not implemented for ISA {isa}")


def isa_vec_dot(isa: str, wtype: int, w: npt.NDArray[Any], a: npt.NDArray[Any], n: int) -> float:
    """vec_dot of isa's table (the single-row form the multi-row entries must reproduce)."""
    out = ffi.new("float *")
    check(lib.el_test_vec_dot(isa.encode(), wtype, n, ffi.from_buffer(w), w.nbytes, ffi.from_buffer(a), a.nbytes, out),
          f"{isa} vec_dot {T(wtype).name}")
    return float(out[0])


def test_kernel_tables_hold_what_each_isa_is_supposed_to_have(simd_isa: str) -> None:
    got: dict[str, set[int]] = {}
    for entry in ("vec_dot", "quantize_act", *BATCH_ENTRIES):
        types = range(lib.EL_TYPE_COUNT)  # the length of the table's arrays
        got[entry] = {t for t in types if kernel_kind(simd_isa, entry, t) == 2}
    want = ISA_KERNELS[simd_isa]
    diff = {e: (sorted(T(t).name for t in want[e] - got[e]), sorted(T(t).name for t in got[e] - want[e]))
            for e in got if got[e] != want[e]}
    assert not diff, f"{simd_isa}: entry -> (expected but missing, present but not expected): {diff}"


# ---- data ----


def random_blocks(wtype: int, n: int, rng: np.random.Generator) -> npt.NDArray[np.uint8]:
    """Every bit pattern of the quant fields, with finite fp16 scales: a stronger probe of the
    unpacking than quantized Gaussians, which leave many patterns unused."""
    if wtype == T.F32:
        return rng.standard_normal(n).astype(np.float32).view(np.uint8)
    if wtype == T.F16:
        return rng.standard_normal(n).astype(np.float16).view(np.uint8)
    if wtype == T.BF16:
        return (rng.standard_normal(n).astype(np.float32).view(np.uint32) >> 16).astype(np.uint16).view(np.uint8)
    bs, ts = TYPE_SIZES[wtype]
    raw = rng.integers(0, 256, size=(n // bs, ts), dtype=np.uint8)
    for off in HALF_FIELDS[wtype]:
        raw[:, off : off + 2] = (rng.standard_normal(n // bs) * 0.05).astype(np.float16).view(np.uint8).reshape(-1, 2)
    if wtype == T.Q8_0:
        # -128 is outside what any Q8_0 quantizer writes (|q| <= 127); the sign trick of the SIMD
        # dot products (vpsignb / vpmaddubsw) relies on it, as ggml's do
        q = raw[:, 2:]
        q[q == 0x80] = 0x81
    return raw.reshape(-1)


def activations(wtype: int, x: npt.NDArray[np.float32]) -> npt.NDArray[Any]:
    at = kernels.vec_dot_type(wtype)
    return x if at == T.F32 else kernels.quantize(x, at)


def dequant(t: int, raw: npt.NDArray[Any], n: int) -> npt.NDArray[np.float64]:
    """Any type's bytes (weights or the activation formats Q8_1 / Q8_K) as float64."""
    src = np.ascontiguousarray(np.asarray(raw).reshape(-1)).view(np.uint8)
    out = np.empty(n, np.float32)
    check(lib.el_dequantize(t, ffi.from_buffer(src), src.size, ffi.from_buffer("float[]", out), n), "dequantize")
    return out.astype(np.float64)


def term_scale(wtype: int, w: npt.NDArray[np.uint8], a: npt.NDArray[Any], n: int) -> float:
    """sum over values of (|w| + 2 |min offset|) |a|: bounds the magnitude of the per-block float terms
    either path adds (for types with a min, d*q*a and m*a are added separately)."""
    at = kernels.vec_dot_type(wtype)
    wd = np.abs(dequant(wtype, w, n)) + 2 * np.abs(min_offsets(wtype, w, n))
    return float(np.sum(wd * np.abs(dequant(at, a, n)))) + 1e-30


def both_isas(isa: str, fn: Any, *args: Any) -> tuple[Any, Any]:
    """fn(*args) under the scalar reference, then under isa."""
    kernels.set_isa("scalar")
    ref = fn(*args)
    kernels.set_isa(isa)
    return ref, fn(*args)


def sizes_for(wtype: int) -> list[int]:
    bs = TYPE_SIZES[wtype].block_size
    if bs == 1:
        return [1, 7, 8, 31, 33, 64, 257, 640]
    return [bs * k for k in (1, 2, 3, 5, 8)] if bs == 32 else [256, 512, 768, 2048]


# ---- vec_dot ----


@pytest.mark.parametrize("wtype", WEIGHT_TYPES, ids=lambda t: T(t).name)
def test_vec_dot_matches_scalar_on_random_blocks(simd_isa: str, wtype: int) -> None:
    rng = np.random.default_rng(int(wtype) + 100)
    for n in sizes_for(wtype):
        for _ in range(4):
            w = random_blocks(wtype, n, rng)
            a = activations(wtype, rng.standard_normal(n).astype(np.float32))
            ref, got = both_isas(simd_isa, kernels.vec_dot, wtype, w, a, n)
            tol = REL_TOL * term_scale(wtype, w, a, n)
            assert abs(got - ref) <= tol, f"{T(wtype).name} n={n}: {got} vs scalar {ref} (tol {tol:.3g})"


@pytest.mark.parametrize("wtype", WEIGHT_TYPES, ids=lambda t: T(t).name)
def test_vec_dot_matches_scalar_on_quantized_rows_at_odd_addresses(simd_isa: str, wtype: int) -> None:
    """Real rows come from the reference quantizer, and GGUF packs blocks at any byte offset."""
    rng = np.random.default_rng(int(wtype) + 200)
    n = sizes_for(wtype)[-2]
    w0 = kernels.quantize(rng.standard_normal(n).astype(np.float32), wtype)
    a0 = activations(wtype, rng.standard_normal(n).astype(np.float32)).view(np.uint8)
    for off in (1, 2, 3):
        w = np.zeros(w0.size + off, np.uint8)[off:]
        w[:] = w0
        a = np.zeros(a0.size + off, np.uint8)[off:]
        a[:] = a0
        assert w.ctypes.data % 2 == off % 2
        ref, got = both_isas(simd_isa, kernels.vec_dot, wtype, w, a, n)
        assert abs(got - ref) <= REL_TOL * term_scale(wtype, w0, a0, n)


@pytest.mark.parametrize("wtype", BLOCK_TYPES, ids=lambda t: T(t).name)
def test_vec_dot_of_integer_valued_blocks_is_exact(simd_isa: str, wtype: int) -> None:
    """With unit scales every float step is exact, so any unpacking slip shows as a wrong integer."""
    rng = np.random.default_rng(int(wtype) + 300)
    bs, ts = TYPE_SIZES[wtype]
    n = 2 * bs
    blocks = random_blocks(wtype, n, rng).reshape(-1, ts)
    for off in HALF_FIELDS[wtype]:  # d = 1 and any min / dmin = 1
        blocks[:, off : off + 2] = np.frombuffer(np.float16(1.0).tobytes(), np.uint8)
    w = blocks.reshape(-1)
    # small integers, and 127 first in every activation block: Q8_0/Q8_1 get d = 1, Q8_K d = -1, so
    # the quantized activations are these integers and every partial sum stays below 2^24
    x = rng.integers(-3, 4, size=n).astype(np.float32)
    x[::bs] = 127.0
    a = activations(wtype, x)
    expect = float(np.dot(dequant(wtype, w, n), dequant(kernels.vec_dot_type(wtype), a, n)))
    ref, got = both_isas(simd_isa, kernels.vec_dot, wtype, w, a, n)
    assert abs(expect) < 2**24  # so float32 holds it exactly
    assert ref == expect
    assert got == expect


# ---- activation quantization: byte-identical to the reference ----

ACT_FOR: dict[int, int] = {T.Q8_0: T.Q8_0, T.Q8_1: T.Q4_1, T.Q8_K: T.Q4_K}  # activation type -> a weight type using it


def quantize_act(isa: str, act_type: int, x: npt.NDArray[np.float32]) -> bytes:
    """isa's activation quantizer, the one matmul runs on the rows of a weight type using act_type."""
    assert kernels.vec_dot_type(ACT_FOR[act_type]) == act_type
    out = np.zeros(kernels.quantize(np.zeros(x.size, np.float32), act_type).size, np.uint8)
    check(lib.el_test_quantize_act(isa.encode(), act_type, ffi.from_buffer("float[]", x), x.size, ffi.from_buffer(out),
                                   out.size), f"{isa} quantize_act {T(act_type).name}")
    return out.tobytes()


def act_inputs(act_type: int, rng: np.random.Generator) -> list[npt.NDArray[np.float32]]:
    bs = TYPE_SIZES[act_type].block_size
    n = 4 * bs
    out = [rng.standard_normal(n).astype(np.float32) * s for s in (1.0, 1e-3, 1e-6, 300.0)]
    # exact .5 ties after scaling: Q8_0/Q8_1 round half away from zero (amax 127 -> d = 1);
    # Q8_K rounds half to even (max -127 -> iscale = 1)
    ties = (rng.integers(-120, 120, size=n) + 0.5).astype(np.float32)
    ties[::bs] = -127.0 if act_type == T.Q8_K else 127.0
    out.append(ties)
    # the sign of the first largest magnitude decides Q8_K's scale: ties inside one 8-lane group
    # and across groups, either sign first
    for i, j, v in ((3, 5, 5.0), (2, 6, -5.0), (4, 20, 5.0), (1, 17, -5.0)):
        first = rng.uniform(-4, 4, size=n).astype(np.float32)
        first[i::bs], first[j::bs] = v, -v
        out.append(first)
    z = rng.standard_normal(n).astype(np.float32)
    z[:bs] = 0.0  # an all-zero block
    out.append(z)
    # normal floats below 127 / FLT_MAX, and denormals: Q8_K's -127 / max and Q8_0's 1 / d overflow
    out.append((rng.uniform(1.2e-38, 3.6e-37, n) * rng.choice([-1.0, 1.0], n)).astype(np.float32))
    out.append((rng.standard_normal(n) * 1e-40).astype(np.float32))
    return out


ACT_REFERENCE = {T.Q8_0: q8_0_reference, T.Q8_1: q8_1_reference, T.Q8_K: q8_K_reference}


@pytest.mark.parametrize("act_type", [T.Q8_0, T.Q8_1, T.Q8_K], ids=lambda t: T(t).name)
def test_quantize_act_bytes_equal_reference(simd_isa: str, act_type: int) -> None:
    """The activation quantizer of the ISA and the scalar one, against the format written in numpy
    (act_reference.py; test_quants holds el_quantize to llama.cpp's own _ref quantizers)."""
    rng = np.random.default_rng(int(act_type))
    for x in act_inputs(act_type, rng):
        ref = ACT_REFERENCE[act_type](x).tobytes()
        assert quantize_act(simd_isa, act_type, x) == ref
        assert quantize_act("scalar", act_type, x) == ref


def test_test_api_tables_are_the_ones_the_library_activates(simd_isa: str) -> None:
    """What the test API calls per ISA is what matmul and the engine run once that ISA is set."""
    kernels.set_isa(simd_isa)
    assert kernels.isa() == simd_isa
    assert lib.el_test_table_is_active(simd_isa.encode()) == 1
    assert lib.el_test_table_is_active(b"scalar") == 0
    kernels.set_isa("scalar")
    assert kernels.isa() == "scalar"
    assert lib.el_test_table_is_active(b"scalar") == 1
    assert lib.el_test_table_is_active(simd_isa.encode()) == 0
    assert lib.el_test_table_is_active(b"no-such-isa") == lib.EL_EUNSUPPORTED


# ---- float helpers used by attention ----


@pytest.mark.parametrize("n", [1, 7, 8, 31, 64, 100, 256, 1027])
def test_float_helpers_match_scalar(simd_isa: str, n: int) -> None:
    rng = np.random.default_rng(n)
    a = rng.standard_normal(n).astype(np.float32)
    b = rng.standard_normal(n).astype(np.float32)
    h = rng.standard_normal(n).astype(np.float16)
    y0 = rng.standard_normal(n).astype(np.float32)
    alpha = np.float32(0.37)
    fa, fb = ffi.from_buffer("float[]", a), ffi.from_buffer("float[]", b)
    fh = ffi.from_buffer("uint16_t[]", h.view(np.uint16))
    eps = float(np.finfo(np.float32).eps)

    def run(isa: str) -> tuple[float, float, npt.NDArray[np.float32], npt.NDArray[np.float32]]:
        name = isa.encode()
        y16, y32 = y0.copy(), y0.copy()
        d, dh = ffi.new("float *"), ffi.new("float *")
        check(lib.el_test_axpy_f16(name, n, float(alpha), fh, ffi.from_buffer("float[]", y16)), "axpy_f16")
        check(lib.el_test_axpy_f32(name, n, float(alpha), fa, ffi.from_buffer("float[]", y32)), "axpy_f32")
        check(lib.el_test_dot_f32(name, n, fa, fb, d), "dot_f32")
        check(lib.el_test_dot_f32_f16(name, n, fa, fh, dh), "dot_f32_f16")
        return d[0], dh[0], y16, y32

    (d_ref, dh_ref, y16_ref, y32_ref), (d, dh, y16, y32) = run("scalar"), run(simd_isa)
    hf = h.astype(np.float64)
    assert abs(d - d_ref) <= REL_TOL * float(np.sum(np.abs(a * b.astype(np.float64))))
    assert abs(dh - dh_ref) <= REL_TOL * float(np.sum(np.abs(a * hf)))
    # y + alpha x: one rounding with FMA, two without; both within an ulp of the exact value
    for got, ref, x in ((y16, y16_ref, hf), (y32, y32_ref, a.astype(np.float64))):
        exact = y0.astype(np.float64) + float(alpha) * x
        bound = 2 * eps * (np.abs(y0) + np.abs(float(alpha) * x))
        assert np.all(np.abs(got - exact) <= bound)
        assert np.all(np.abs(ref - exact) <= bound)


# ---- matmul: every ISA against float64 numpy, thread counts bit-identical ----


def matmul_cols(wtype: int) -> int:
    bs = TYPE_SIZES[wtype].block_size
    return 33 if bs == 1 else 96 if bs == 32 else 512


def min_offsets(wtype: int, w: npt.NDArray[np.uint8], n: int) -> npt.NDArray[np.float64]:
    """Each value's block offset (m of Q4_1/Q5_1, -dmin*min of the K-quants), 0 for symmetric types."""
    if wtype not in QUANT_BYTES:
        return np.zeros(n)
    z = w.reshape(-1, TYPE_SIZES[wtype].type_size).copy()
    for lo, hi in QUANT_BYTES[wtype]:
        z[:, lo:hi] = 0
    return dequant(wtype, z.reshape(-1), n)


def reference_matmul(
    wtype: int, w: npt.NDArray[np.uint8], rows: int, cols: int, x: npt.NDArray[np.float32]
) -> tuple[npt.NDArray[np.float64], npt.NDArray[np.float64]]:
    """float64 Y = A W^T on the dequantized weights and the activations as quantized (by the reference),
    and the bound sum |terms| per output. Q8_1 keeps s = d*sum(q) as fp16 and the Q4_1/Q5_1 dot uses
    it for the min term (as ggml's), so the model does too."""
    at = kernels.vec_dot_type(wtype)
    wd = dequant(wtype, w, rows * cols).reshape(rows, cols)
    mo = min_offsets(wtype, w, rows * cols).reshape(rows, cols)
    acts = [activations(wtype, r) for r in x]
    ad = np.stack([dequant(at, a, cols) for a in acts])
    if at == T.Q8_1:
        s = np.stack([a.reshape(-1, 36)[:, 2:4].copy().view(np.float16).reshape(-1) for a in acts]).astype(np.float64)
        m = mo[:, ::32]  # one offset per block
        expect = ad @ (wd - mo).T + s @ m.T
    else:
        expect = ad @ wd.T
    scale = np.abs(ad) @ (np.abs(wd) + 2 * np.abs(mo)).T
    return expect, scale


@pytest.mark.parametrize("wtype", WEIGHT_TYPES, ids=lambda t: T(t).name)
def test_matmul_matches_float64_reference_on_odd_sizes(simd_isa: str, wtype: int) -> None:
    rng = np.random.default_rng(int(wtype) + 400)
    cols = matmul_cols(wtype)
    kernels.set_isa(simd_isa)
    pool = Pool(2)
    try:
        for rows in (1, 7, 33, 257):
            w = random_blocks(wtype, rows * cols, rng)
            for n_vec in (1, 3, 17):
                x = rng.standard_normal((n_vec, cols)).astype(np.float32)
                y = kernels.matmul(w, wtype, rows, cols, x, pool)
                assert y.shape == (n_vec, rows)
                expect, scale = reference_matmul(wtype, w, rows, cols, x)
                err = np.abs(y - expect)
                assert np.all(err <= REL_TOL * scale + 1e-30), f"rows={rows} n_vec={n_vec}: max err {err.max()}"
    finally:
        pool.close()


@pytest.mark.parametrize("wtype", [T.Q8_0, T.Q5_0, T.Q4_1, T.Q4_K, T.Q6_K, T.F16], ids=lambda t: T(t).name)
def test_matmul_thread_counts_give_identical_bits(simd_isa: str, wtype: int) -> None:
    rng = np.random.default_rng(int(wtype) + 500)
    rows, cols, n_vec = 257, 512, 9  # large enough that quantization and rows both go to the pool
    w = random_blocks(wtype, rows * cols, rng)
    x = rng.standard_normal((n_vec, cols)).astype(np.float32)
    kernels.set_isa(simd_isa)
    results = []
    for n_threads in (1, 2, 3, 4):
        pool = Pool(n_threads)
        try:
            results.append(kernels.matmul(w, wtype, rows, cols, x, pool))
        finally:
            pool.close()
    for r in results[1:]:
        assert r.tobytes() == results[0].tobytes()
    kernels.set_isa("scalar")
    pool = Pool(1)
    try:
        ref = kernels.matmul(w, wtype, rows, cols, x, pool)
    finally:
        pool.close()
    assert not np.array_equal(ref, np.zeros_like(ref))  # the comparison above compared real numbers
    assert np.allclose(results[0], ref, rtol=1e-4, atol=1e-4 * float(np.abs(ref).max()))


# ---- batches (prefill): each output has the bits of the single-row computation ----

def pack_rows(rows: list[npt.NDArray[np.uint8]], pad: int) -> tuple[npt.NDArray[np.uint8], int]:
    """rows (of equal size) at a stride of size + pad bytes in one buffer: an odd pad keeps every row
    but the first off alignment, as GGUF packs blocks at any byte offset"""
    stride = rows[0].size + pad
    buf = np.zeros(stride * len(rows), np.uint8)
    for i, r in enumerate(rows):
        buf[i * stride : i * stride + r.size] = r
    return buf, stride


NV_TYPES = [T.Q8_0, T.Q5_0, T.Q4_0, T.Q4_1, T.Q5_1, T.Q4_K, T.Q5_K, T.Q6_K]


@pytest.mark.parametrize("wtype", NV_TYPES, ids=lambda t: T(t).name)
def test_vec_dot_nv_lanes_equal_vec_dot_bits(simd_isa: str, wtype: int) -> None:
    """The dispatch contract: lane j of vec_dot_nv is vec_dot of activation row j, to the bit."""
    need_kernel(simd_isa, "vec_dot_nv", wtype)
    rng = np.random.default_rng(int(wtype) + 600)
    for n in sizes_for(wtype):
        w = random_blocks(wtype, n, rng)
        acts = [activations(wtype, rng.standard_normal(n).astype(np.float32)).view(np.uint8) for _ in range(EL_NV_MAX)]
        buf, stride = pack_rows(acts, 5)
        for nv in range(1, EL_NV_MAX + 1):
            out = np.zeros(nv, np.float32)
            check(lib.el_test_vec_dot_nv(simd_isa.encode(), wtype, n, ffi.from_buffer(w), w.size, ffi.from_buffer(buf),
                                         buf.size, stride, nv, ffi.from_buffer("float[]", out)), "vec_dot_nv")
            single = np.array([isa_vec_dot(simd_isa, wtype, w, a, n) for a in acts[:nv]], np.float32)
            assert out.tobytes() == single.tobytes(), f"{T(wtype).name} n={n} nv={nv}: {out} vs {single}"
            assert np.all(np.isfinite(out)) and np.any(out != 0)


@pytest.mark.parametrize("wtype", NV_TYPES, ids=lambda t: T(t).name)
def test_vec_dot_tile_outputs_equal_vec_dot_bits(simd_isa: str, wtype: int) -> None:
    need_kernel(simd_isa, "vec_dot_tile", wtype)
    rng = np.random.default_rng(int(wtype) + 800)
    for n in sizes_for(wtype):
        ws = [random_blocks(wtype, n, rng) for _ in range(EL_TILE_ROWS)]
        acts = [activations(wtype, rng.standard_normal(n).astype(np.float32)).view(np.uint8) for _ in range(EL_NV_MAX)]
        (wbuf, w_stride), (abuf, a_stride) = pack_rows(ws, 3), pack_rows(acts, 1)
        for nv in range(1, EL_NV_MAX + 1):
            out = np.zeros((EL_TILE_ROWS, EL_NV_MAX), np.float32)
            check(lib.el_test_vec_dot_tile(simd_isa.encode(), wtype, n, ffi.from_buffer(wbuf), wbuf.size, w_stride,
                                           ffi.from_buffer(abuf), abuf.size, a_stride, nv,
                                           ffi.from_buffer("float[]", out), EL_NV_MAX), "vec_dot_tile")
            single = np.array([[isa_vec_dot(simd_isa, wtype, w, a, n) for a in acts[:nv]] for w in ws], np.float32)
            assert out[:, :nv].tobytes() == single.tobytes(), f"{T(wtype).name} n={n} nv={nv}"


@pytest.mark.parametrize("wtype", NV_TYPES, ids=lambda t: T(t).name)
def test_vec_dot_rows_outputs_equal_vec_dot_bits(simd_isa: str, wtype: int) -> None:
    """The matvec kernel: EL_MV_ROWS rows far apart (as matmul passes them) give vec_dot's bits."""
    need_kernel(simd_isa, "vec_dot_rows", wtype)
    rng = np.random.default_rng(int(wtype) + 900)
    for n in sizes_for(wtype):
        ws = [random_blocks(wtype, n, rng) for _ in range(EL_MV_ROWS)]
        a = activations(wtype, rng.standard_normal(n).astype(np.float32)).view(np.uint8)
        wbuf, w_stride = pack_rows(ws, 2 * ws[0].size + 7)  # rows far apart, as matmul passes them
        abuf = np.zeros(a.size + 1, np.uint8)
        abuf[1:] = a
        out = np.zeros(EL_MV_ROWS, np.float32)
        check(lib.el_test_vec_dot_rows(simd_isa.encode(), wtype, n, ffi.from_buffer(wbuf), wbuf.size, w_stride,
                                       ffi.from_buffer(abuf) + 1, a.size, ffi.from_buffer("float[]", out)), "vec_dot_rows")
        single = np.array([isa_vec_dot(simd_isa, wtype, w, a, n) for w in ws], np.float32)
        assert out.tobytes() == single.tobytes(), f"{T(wtype).name} n={n}: {out} vs {single}"
        assert np.all(np.isfinite(out)) and np.any(out != 0)


@pytest.mark.parametrize("wtype", NV_TYPES, ids=lambda t: T(t).name)
def test_matvec_any_row_count_and_thread_count_gives_vec_dot_bits(simd_isa: str, wtype: int) -> None:
    """Matvec through the multi-row kernel (rows split into EL_MV_ROWS streams, leftovers one by one):
    every row count, including ones that are no multiple of EL_MV_ROWS or of the row block, and 1-4
    threads give each row the bits of a one-row matmul."""
    rng = np.random.default_rng(int(wtype) + 950)
    cols = 512 if TYPE_SIZES[wtype].block_size == 256 else 160
    kernels.set_isa(simd_isa)
    pools = [Pool(t) for t in (1, 2, 3, 4)]
    try:
        for rows in (1, 3, 4, 5, 17, 63, 130, 1027):
            w = random_blocks(wtype, rows * cols, rng)
            x = rng.standard_normal((1, cols)).astype(np.float32)
            rb = w.size // rows
            one = np.concatenate([kernels.matmul(w[r * rb : (r + 1) * rb], wtype, 1, cols, x, pools[0])[0]
                                  for r in range(rows)])
            for pool in pools:
                y = kernels.matmul(w, wtype, rows, cols, x, pool)[0]
                assert y.tobytes() == one.tobytes(), f"{T(wtype).name} rows={rows}"
    finally:
        for p in pools:
            p.close()


@pytest.mark.parametrize("wtype", [*NV_TYPES, T.F16], ids=lambda t: T(t).name)
def test_batched_matmul_rows_equal_single_row_matmuls(simd_isa: str, wtype: int) -> None:
    """What makes a batched prompt give the logits of token-by-token evaluation."""
    rng = np.random.default_rng(int(wtype) + 700)
    cols = 512 if TYPE_SIZES[wtype].block_size == 256 else 160
    rows, n_vec = 45, 70  # a partial group of EL_NV_MAX rows and a partial row block
    w = random_blocks(wtype, rows * cols, rng)
    x = rng.standard_normal((n_vec, cols)).astype(np.float32)
    kernels.set_isa(simd_isa)
    pool = Pool(2)
    try:
        batch = kernels.matmul(w, wtype, rows, cols, x, pool)
        single = np.stack([kernels.matmul(w, wtype, rows, cols, x[v : v + 1], pool)[0] for v in range(n_vec)])
    finally:
        pool.close()
    assert batch.tobytes() == single.tobytes()
    assert np.any(batch != 0)


# ---- ISA choice ----


@pytest.mark.parametrize("want", [*SIMD_ISAS, "scalar"])
def test_edgellama_isa_selects_that_isa_at_start(want: str) -> None:
    """EDGELLAMA_ISA picks the table before any call (a fresh process); without it the best one wins."""
    import subprocess
    import sys

    if not kernels.isa_available(want):
        pytest.skip(f"ISA {want} not available on this CPU/build")
    code = "from edgellama.native import kernels; print(kernels.isa())"
    # the child imports the same edgellama this process did (a source tree or an installed wheel):
    # its folder leads PYTHONPATH and is the cwd, so another copy cannot shadow it
    root = os.path.dirname(os.path.dirname(os.path.abspath(edgellama.__file__)))
    path = os.pathsep.join(p for p in (root, os.environ.get("PYTHONPATH", "")) if p)
    env = dict(os.environ, EDGELLAMA_ISA=want, PYTHONPATH=path)
    got = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True, cwd=root)
    assert got.stdout.strip() == want
    env.pop("EDGELLAMA_ISA")
    best = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True,
                          cwd=root)
    order = [i for i in ("neon-dotprod", "neon", "avx512", "avx2", "scalar") if kernels.isa_available(i)]
    assert best.stdout.strip() == order[0]
