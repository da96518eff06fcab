"""Python face of the C kernels: dequantize / quantize rows, dot products, ISA selection.

Thin and strict: sizes are checked here and again in C; no arithmetic happens in Python.
"""

from __future__ import annotations

import numpy as np
import numpy.typing as npt

from edgellama.gguf.ggml_types import row_bytes, type_name
from edgellama.native.lib import check, ffi, lib

# The type lists, asked of the C library: the weight types it dequantizes, quantizes and multiplies,
# and the activation formats their dot products take (which it quantizes too: Q8_0, Q8_1, Q8_K).
WEIGHT_TYPES: frozenset[int] = frozenset(t for t in range(lib.EL_TYPE_COUNT) if lib.el_type_supported(t))
ACT_TYPES: frozenset[int] = frozenset(int(lib.el_vec_dot_type(t)) for t in WEIGHT_TYPES) - {int(lib.EL_TYPE_F32)}


def _require_type(t: int) -> None:
    if t not in WEIGHT_TYPES:
        raise ValueError(f"ggml type {type_name(t)} is not supported by the kernels")


def _u8(raw: npt.ArrayLike) -> npt.NDArray[np.uint8]:
    a = np.asarray(raw)
    if a.dtype != np.uint8:
        a = a.view(np.uint8) if a.flags.c_contiguous else np.ascontiguousarray(a).view(np.uint8)
    return np.ascontiguousarray(a.reshape(-1))


def dequantize(raw: npt.ArrayLike, ggml_type: int, n: int) -> npt.NDArray[np.float32]:
    """raw block bytes of ggml_type holding n values -> float32 array of n values."""
    _require_type(ggml_type)
    src = _u8(raw)
    need = row_bytes(ggml_type, n)
    if src.size != need:
        raise ValueError(f"{type_name(ggml_type)}: {n} values need {need} bytes, got {src.size}")
    out = np.empty(n, dtype=np.float32)
    check(
        lib.el_dequantize(ggml_type, ffi.from_buffer(src), src.size, ffi.from_buffer("float[]", out), n),
        f"dequantize {type_name(ggml_type)}",
    )
    return out


def quantize(x: npt.ArrayLike, ggml_type: int) -> npt.NDArray[np.uint8]:
    """float32 values -> raw block bytes of ggml_type (reference quantizer)."""
    if ggml_type not in WEIGHT_TYPES and ggml_type not in ACT_TYPES:
        raise ValueError(f"ggml type {type_name(ggml_type)} is not supported by the kernels")
    src = np.ascontiguousarray(np.asarray(x, dtype=np.float32).reshape(-1))
    need = row_bytes(ggml_type, src.size)
    out = np.empty(need, dtype=np.uint8)
    check(
        lib.el_quantize(ggml_type, ffi.from_buffer("float[]", src), src.size, ffi.from_buffer(out), need),
        f"quantize {type_name(ggml_type)}",
    )
    return out


def vec_dot_type(wtype: int) -> int:
    _require_type(wtype)
    return int(lib.el_vec_dot_type(wtype))


def vec_dot(wtype: int, w_raw: npt.ArrayLike, a_raw: npt.ArrayLike, n: int) -> float:
    """Dot product of one weight row (wtype bytes) with an activation row in vec_dot_type(wtype)."""
    w = _u8(w_raw)
    a = _u8(a_raw)
    out = ffi.new("float *")
    check(
        lib.el_vec_dot(wtype, n, ffi.from_buffer(w), w.size, ffi.from_buffer(a), a.size, out),
        f"vec_dot {type_name(wtype)}",
    )
    return float(out[0])


def isa() -> str:
    return ffi.string(lib.el_isa_name()).decode()


def set_isa(name: str | None) -> None:
    """Switch kernels ('scalar', 'avx2', 'neon', 'neon-dotprod'; None = best). Not during a computation."""
    status = lib.el_isa_set(ffi.NULL if name is None else name.encode())
    if status != 0:
        raise ValueError(f"ISA {name!r} is not available on this CPU/build")


def isa_available(name: str) -> bool:
    return bool(lib.el_isa_available(name.encode()))


def cpu_features() -> str:
    return ffi.string(lib.el_cpu_features()).decode()


def matmul(w_raw: npt.ArrayLike, wtype: int, rows: int, cols: int, x: npt.ArrayLike, pool: object) -> npt.NDArray[np.float32]:
    """Y = W X^T for W (rows x cols of wtype, raw bytes) and X (n_vec x cols float32): Y is n_vec x rows.

    pool: an edgellama.engine.Pool (its threads and scratch are used)."""
    _require_type(wtype)
    w = _u8(w_raw)
    xs = np.ascontiguousarray(np.asarray(x, dtype=np.float32))
    if xs.ndim == 1:
        xs = xs.reshape(1, -1)
    if xs.ndim != 2 or xs.shape[1] != cols:
        raise ValueError(f"activations must be n_vec x {cols}, got {xs.shape}")
    need = rows * row_bytes(wtype, cols)
    if w.size != need:
        raise ValueError(f"{rows}x{cols} {type_name(wtype)} needs {need} bytes, got {w.size}")
    y = np.empty((xs.shape[0], rows), dtype=np.float32)
    check(
        lib.el_matmul(pool.ptr, wtype, ffi.from_buffer(w), w.size, rows, cols,  # type: ignore[attr-defined]
                      ffi.from_buffer("float[]", xs), xs.shape[0], ffi.from_buffer("float[]", y)),
        f"matmul {type_name(wtype)} {rows}x{cols}",
    )
    return y
