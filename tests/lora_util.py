"""Synthetic LoRA adapters for tests: written with edgellama's GGUF writer in llama.cpp's layout
(convert_lora_to_gguf.py's keys, names and shapes), random low-rank pairs shaped from a base model.

Pairs are given in numpy order: a [rank, n_in], b [n_out, rank] (GGUF ne [n_in, rank], [rank, n_out]).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt

from edgellama.gguf.ggml_types import GGMLType
from edgellama.gguf.reader import GGUFValueType
from edgellama.gguf.split import ModelFile
from edgellama.gguf.writer import GGUFWriter

Pair = tuple[npt.NDArray[Any], npt.NDArray[Any]]
DTYPES = ("F32", "F16", "BF16", "Q8_0")
ALL_TARGETS = ("attn_q", "attn_k", "attn_v", "attn_output", "ffn_gate", "ffn_up", "ffn_down")


def to_bf16(x: npt.ArrayLike) -> npt.NDArray[np.uint16]:
    """float32 -> bf16 bits, rounding to nearest even (as gguf-py and ggml do; no NaN in test data)."""
    bits = np.ascontiguousarray(x, dtype=np.float32).view(np.uint32).astype(np.uint64)
    return ((bits + 0x7FFF + ((bits >> 16) & 1)) >> 16).astype(np.uint16)


def encode(x: npt.NDArray[Any], dtype: str) -> tuple[npt.NDArray[Any], int]:
    """A float matrix as (raw data, ggml type) of dtype; Q8_0 through the C reference quantizer."""
    x32 = np.ascontiguousarray(x, dtype=np.float32)
    if dtype == "F32":
        return x32, GGMLType.F32
    if dtype == "F16":
        return x32.astype(np.float16), GGMLType.F16
    if dtype == "BF16":
        return to_bf16(x32), GGMLType.BF16
    if dtype == "Q8_0":
        from edgellama.native import kernels

        return kernels.quantize(x32, GGMLType.Q8_0), GGMLType.Q8_0
    raise ValueError(f"dtype {dtype!r}: want one of {DTYPES}")


def write_adapter(
    path: str | Path,
    arch: str,
    alpha: float,
    weights: Mapping[str, Pair],
    dtype: str = "F32",
    extra_kv: Mapping[str, Any] | None = None,
    drop_kv: Iterable[str] = (),
    extra_tensors: Mapping[str, npt.NDArray[Any]] | None = None,
) -> Path:
    """Write an adapter file: metadata as convert_lora_to_gguf.py writes it, then W.lora_a and W.lora_b
    for every base tensor W of weights. extra_kv adds or replaces keys (a value, or (value, vtype)),
    drop_kv leaves keys out, extra_tensors adds tensors as given (ggml type from the numpy dtype)
under any name: what broken files are made of."""
    kv: dict[str, Any] = {
        "general.architecture": arch,
        "general.type": "adapter",
        "adapter.type": "lora",
        "adapter.lora.alpha": (float(alpha), GGUFValueType.FLOAT32),
    }
    kv.update(extra_kv or {})
    w = GGUFWriter(path)
    for key, value in kv.items():
        if key in drop_kv:
            continue
        if isinstance(value, tuple) and len(value) == 2 and isinstance(value[1], GGUFValueType):
            w.add(key, value[0], value[1])
        else:
            w.add(key, value)
    for name, (a, b) in weights.items():
        for suffix, m in ((".lora_a", a), (".lora_b", b)):
            # a row (ne0) that is not whole Q8_0 blocks (lora_b of rank < 32) goes F16, as convert does
            raw, gtype = encode(m, "F16" if dtype == "Q8_0" and m.shape[1] % 32 else dtype)
            w.add_tensor(name + suffix, raw, (m.shape[1], m.shape[0]), gtype)
    for name, t in (extra_tensors or {}).items():
        w.add_tensor(name, np.ascontiguousarray(t))
    return w.write()


def random_adapter(
    base: ModelFile,
    rank: int,
    targets: Iterable[str] = ALL_TARGETS,
    *,
    seed: int = 0,
    amplitude: float = 0.05,
) -> dict[str, Pair]:
    """Random pairs for every layer's listed matrices of base. Entries of a and b are Gaussian with
    std sqrt(amplitude / n_in) and sqrt(amplitude / rank), so B @ A has entries of std about
    amplitude / sqrt(n_in): a perturbation of relative size ~amplitude next to a weight matrix whose
    entries have std 1 / sqrt(n_in) (what trained weights have, roughly)."""
    rng = np.random.default_rng(seed)
    want = set(targets)
    out: dict[str, Pair] = {}
    for t in base.tensors:
        parts = t.name.split(".")
        if len(parts) == 4 and parts[0] == "blk" and parts[2] in want and parts[3] == "weight":
            n_in, n_out = t.shape[0], t.shape[1]
            a = rng.standard_normal((rank, n_in)) * np.sqrt(amplitude / n_in)
            b = rng.standard_normal((n_out, rank)) * np.sqrt(amplitude / rank)
            out[t.name] = (a.astype(np.float32), b.astype(np.float32))
    return out


def merged_delta(pairs: Mapping[str, Pair], scale: float) -> dict[str, npt.NDArray[np.float64]]:
    """scale * B @ A per base tensor, in float64 ([n_out, n_in], numpy order of the base matrix)."""
    return {n: scale * (b.astype(np.float64) @ a.astype(np.float64)) for n, (a, b) in pairs.items()}
