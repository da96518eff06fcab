"""ggml tensor types: the one table of type numbers, block sizes and byte sizes.

Shared by the GGUF reader/writer and the kernel bindings; knows nothing about files or C (the reader
runs without the C library), and tests/test_c_api.py holds it to the C library's own table.
"""

from __future__ import annotations

from enum import IntEnum
from typing import NamedTuple


class GGMLType(IntEnum):
    F32 = 0
    F16 = 1
    Q4_0 = 2
    Q4_1 = 3
    Q5_0 = 6
    Q5_1 = 7
    Q8_0 = 8
    Q8_1 = 9
    Q2_K = 10
    Q3_K = 11
    Q4_K = 12
    Q5_K = 13
    Q6_K = 14
    Q8_K = 15
    IQ2_XXS = 16
    IQ2_XS = 17
    IQ3_XXS = 18
    IQ1_S = 19
    IQ4_NL = 20
    IQ3_S = 21
    IQ2_S = 22
    IQ4_XS = 23
    I8 = 24
    I16 = 25
    I32 = 26
    I64 = 27
    F64 = 28
    IQ1_M = 29
    BF16 = 30
    TQ1_0 = 34
    TQ2_0 = 35
    MXFP4 = 39


class TypeSize(NamedTuple):
    block_size: int  # values per block
    type_size: int  # bytes per block


# Sizes of every type a GGUF file may hold (so the reader can validate files it cannot compute on).
TYPE_SIZES: dict[int, TypeSize] = {
    GGMLType.F32: TypeSize(1, 4),
    GGMLType.F16: TypeSize(1, 2),
    GGMLType.Q4_0: TypeSize(32, 18),
    GGMLType.Q4_1: TypeSize(32, 20),
    GGMLType.Q5_0: TypeSize(32, 22),
    GGMLType.Q5_1: TypeSize(32, 24),
    GGMLType.Q8_0: TypeSize(32, 34),
    GGMLType.Q8_1: TypeSize(32, 36),
    GGMLType.Q2_K: TypeSize(256, 84),
    GGMLType.Q3_K: TypeSize(256, 110),
    GGMLType.Q4_K: TypeSize(256, 144),
    GGMLType.Q5_K: TypeSize(256, 176),
    GGMLType.Q6_K: TypeSize(256, 210),
    GGMLType.Q8_K: TypeSize(256, 292),
    GGMLType.IQ2_XXS: TypeSize(256, 66),
    GGMLType.IQ2_XS: TypeSize(256, 74),
    GGMLType.IQ3_XXS: TypeSize(256, 98),
    GGMLType.IQ1_S: TypeSize(256, 50),
    GGMLType.IQ4_NL: TypeSize(32, 18),
    GGMLType.IQ3_S: TypeSize(256, 110),
    GGMLType.IQ2_S: TypeSize(256, 82),
    GGMLType.IQ4_XS: TypeSize(256, 136),
    GGMLType.I8: TypeSize(1, 1),
    GGMLType.I16: TypeSize(1, 2),
    GGMLType.I32: TypeSize(1, 4),
    GGMLType.I64: TypeSize(1, 8),
    GGMLType.F64: TypeSize(1, 8),
    GGMLType.IQ1_M: TypeSize(256, 56),
    GGMLType.BF16: TypeSize(1, 2),
    GGMLType.TQ1_0: TypeSize(256, 54),
    GGMLType.TQ2_0: TypeSize(256, 66),
    GGMLType.MXFP4: TypeSize(32, 17),
}

# Types the C library can dequantize, quantize and multiply (weights).
COMPUTE_TYPES: frozenset[int] = frozenset(
    {
        GGMLType.F32,
        GGMLType.F16,
        GGMLType.BF16,
        GGMLType.Q4_0,
        GGMLType.Q4_1,
        GGMLType.Q5_0,
        GGMLType.Q5_1,
        GGMLType.Q8_0,
        GGMLType.Q2_K,
        GGMLType.Q3_K,
        GGMLType.Q4_K,
        GGMLType.Q5_K,
        GGMLType.Q6_K,
    }
)


def type_name(t: int) -> str:
    try:
        return GGMLType(t).name
    except ValueError:
        return f"type{t}"


def row_bytes(t: int, n: int) -> int:
    """Bytes of n values of type t; ValueError if t is unknown or n is not a whole number of blocks."""
    ts = TYPE_SIZES.get(t)
    if ts is None:
        raise ValueError(f"unknown ggml type {t}")
    if n % ts.block_size:
        raise ValueError(f"{n} values is not a whole number of {type_name(t)} blocks of {ts.block_size}")
    return n // ts.block_size * ts.type_size
