"""The activation formats Q8_0, Q8_1 and Q8_K written in numpy from their definitions (ggml's
quantize_row_q8_0_ref, q8_1_ref, q8_K_ref), independent of the C code the tests check: float32
arithmetic as in C, fp16 fields through numpy's round-to-nearest-even cast."""

from __future__ import annotations

import numpy as np
import numpy.typing as npt

F32 = np.float32


def _roundf(v: npt.NDArray[np.float32]) -> npt.NDArray[np.int32]:
    """C roundf (half away from zero) of float32 values, in float64 so |v| + 0.5 cannot round up;
    inf and NaN (a block whose 1/d overflows) give 0, as ggml's int8 store does on x86."""
    a = np.floor(np.abs(v.astype(np.float64)) + 0.5) * np.sign(v)
    return np.where(np.isfinite(v), a, 0.0).astype(np.int32)


def _q8_0_blocks(x: npt.NDArray[np.float32]) -> tuple[npt.NDArray[np.float32], npt.NDArray[np.int8]]:
    """d = amax / 127 and q = roundf(x / d) (x times the float32 1 / d) per 32 values."""
    b = np.asarray(x, F32).reshape(-1, 32)
    d = (np.abs(b).max(axis=1) / F32(127)).astype(F32)
    with np.errstate(divide="ignore", over="ignore", invalid="ignore"):
        inv = np.where(d != 0, F32(1) / np.where(d != 0, d, F32(1)), F32(0)).astype(F32)
        q = _roundf((b * inv[:, None]).astype(F32))
    return d, np.clip(q, -128, 127).astype(np.int8)


def q8_0_reference(x: npt.NDArray[np.float32]) -> npt.NDArray[np.uint8]:
    d, q = _q8_0_blocks(x)
    out = np.zeros((d.size, 34), np.uint8)
    out[:, 0:2] = d.astype(np.float16).view(np.uint8).reshape(-1, 2)
    out[:, 2:] = q.view(np.uint8)
    return out.reshape(-1)


def q8_1_reference(x: npt.NDArray[np.float32]) -> npt.NDArray[np.uint8]:
    """Q8_0's d and q, and s = fp16(sum(q) * d) with the float32 d before its fp16 rounding."""
    d, q = _q8_0_blocks(x)
    with np.errstate(over="ignore"):  # a sum beyond 65504 is inf in fp16, in ggml too
        s = (q.astype(np.int32).sum(axis=1).astype(F32) * d).astype(F32).astype(np.float16)
    out = np.zeros((d.size, 36), np.uint8)
    out[:, 0:2] = d.astype(np.float16).view(np.uint8).reshape(-1, 2)
    out[:, 2:4] = s.view(np.uint8).reshape(-1, 2)
    out[:, 4:] = q.view(np.uint8)
    return out.reshape(-1)


def q8_K_reference(x: npt.NDArray[np.float32]) -> npt.NDArray[np.uint8]:
    """Per 256 values: the signed max (first of largest |x|), iscale = -127 / max, q = nearest
    (half to even) of iscale x capped at 127, d = 1 / iscale (float32), bsums per 16 values. A zero
    block is all zero; where -127 / max overflows (|max| < 127 / FLT_MAX) every product is inf or
    NaN, which ggml's nearest_int and int8 store turn into 0, leaving d = 1 / iscale = -0 or +0."""
    blocks = np.asarray(x, F32).reshape(-1, 256)
    out = np.zeros((blocks.shape[0], 292), np.uint8)
    for i, b in enumerate(blocks):
        mx = b[np.argmax(np.abs(b))]
        if mx == 0:
            continue
        with np.errstate(over="ignore"):
            iscale = F32(-127.0) / mx
        out[i, 0:4] = np.array([F32(1.0) / iscale], F32).view(np.uint8)
        if not np.isfinite(iscale):
            continue
        q = np.minimum(np.rint(iscale * b), 127).astype(np.int8)
        out[i, 4:260] = q.view(np.uint8)
        out[i, 260:] = q.astype(np.int16).reshape(16, 16).sum(axis=1).astype(np.int16).view(np.uint8)
    return out.reshape(-1)
