"""Merges LoRA adapters into a new GGUF model (llama-export-lora's job): W' = W + sum(scale * B @ A)
for every base tensor an adapter touches, computed in float32 and quantized back to the base tensor's
type (or a chosen one) by the same reference quantizers as `edgellama quantize`.

Every other tensor and every metadata key is copied byte for byte, in the base file's order. The
merge streams tensor by tensor and slab by slab of rows: memory stays at a slab of floats plus the
adapters (float32, small), whatever the model's size. The base model is never modified.
"""

from __future__ import annotations

import math
import os
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt

from edgellama.gguf.ggml_types import TYPE_SIZES, GGMLType, row_bytes, type_name
from edgellama.gguf.reader import GGUFTensor
from edgellama.gguf.split import SPLIT_KEYS, model_paths, open_model_file
from edgellama.gguf.writer import GGUFWriter
from edgellama.lora.adapter import LoraAdapter, LoraError, LoraWeight, read_adapter
from edgellama.quantize_model import SLAB_FLOATS, _floats, _release

# (adapter's weight for the tensor, its scale user_scale * alpha / rank)
Part = tuple[LoraWeight, float]


@dataclass
class Merged:
    name: str
    src_type: int
    out_type: int
    n_adapters: int


@dataclass
class ExportResult:
    path: Path
    adapters: list[LoraAdapter]
    merged: list[Merged]  # the base tensors that changed, in file order
    n_tensors: int
    size_out: int


def export_lora(base_path: str | os.PathLike[str], adapters: Sequence[tuple[str | os.PathLike[str], float]],
                out_path: str | os.PathLike[str], *, outtype: int | None = None, threads: int = 1,
                progress: Callable[[int, int, Merged], None] | None = None) -> ExportResult:
    """Write base with adapters [(path, user scale), ...] merged in to out_path. outtype: the type of
    the merged tensors (default: each base tensor's own type); the other tensors keep theirs."""
    if not adapters:
        raise ValueError("export-lora: give at least one adapter (--lora or --lora-scaled)")
    if threads < 1:
        raise ValueError(f"threads {threads}: must be at least 1")
    out_path = Path(out_path)
    with open_model_file(base_path) as base:
        inputs = model_paths(base)
        for p in [*inputs, *(Path(a) for a, _ in adapters)]:
            if out_path.exists() and p.exists() and out_path.samefile(p):
                raise ValueError(f"{out_path}: is an input of the merge")
        for path, scale in adapters:
            if not math.isfinite(scale):
                raise ValueError(f"{path}: adapter scale {scale} is not a finite number")
        loaded = [(read_adapter(Path(path), base), float(scale)) for path, scale in adapters]
        parts: dict[str, list[Part]] = {}
        for ad, scale in loaded:
            for name, lw in ad.weights.items():
                s = ad.scale_of(name, scale)
                if not math.isfinite(s):
                    raise ValueError(f"{ad.path}: scale {scale:g} * alpha {ad.alpha} / rank {lw.rank} is not a "
                                     "finite number")
                parts.setdefault(name, []).append((lw, s))
        merged = [_plan(base.tensor(t.name), len(parts[t.name]), outtype) for t in base.tensors if t.name in parts]

        w = GGUFWriter(out_path, alignment=base.alignment)
        w.remove("general.alignment")  # copied with the rest, in its place
        for key in base.metadata:
            if key not in SPLIT_KEYS:
                w.add_kv_bytes(key, base.kv_bytes(key))
        by_name = {m.name: (i, m) for i, m in enumerate(merged)}
        for t in base.tensors:
            if t.name not in by_name:
                w.add_tensor(t.name, t.data, t.shape, t.ggml_type)
                continue
            i, m = by_name[t.name]
            w.add_tensor_producer(t.name, t.shape, m.out_type,
                                  _producer(t, parts[t.name], m, threads, i, len(merged), progress))
        w.write()
        n_tensors = len(base.tensors)
    return ExportResult(out_path, [a for a, _ in loaded], merged, n_tensors, out_path.stat().st_size)


def _plan(t: GGUFTensor, n_adapters: int, outtype: int | None) -> Merged:
    from edgellama.native.kernels import WEIGHT_TYPES

    out = t.ggml_type if outtype is None else int(outtype)
    if t.ggml_type not in WEIGHT_TYPES:
        raise ValueError(f"tensor {t.name!r}: its type {type_name(t.ggml_type)} cannot be dequantized, "
                         "so no adapter can be merged into it")
    if out not in WEIGHT_TYPES:
        raise ValueError(f"--outtype {type_name(out)}: not a type edgellama can quantize to")
    block = TYPE_SIZES[out].block_size
    if t.shape[0] % block:
        raise ValueError(f"tensor {t.name!r}: row length {t.shape[0]} is not a multiple of the "
                         f"{type_name(out)} block size {block}; choose another --outtype")
    return Merged(t.name, t.ggml_type, out, n_adapters)


def merge_rows(w_rows: npt.NDArray[np.float32], parts: Sequence[Part], start: int) -> npt.NDArray[np.float32]:
    """Rows [start, start + n) of W' = W + sum(scale * B @ A), float32 as llama-export-lora does it
    (each delta scaled, then added in adapter order). w_rows: those rows of W, [n, n_in]; modified."""
    n = w_rows.shape[0]
    with np.errstate(over="ignore", invalid="ignore"):  # an overflow is refused by the caller, by name
        for lw, scale in parts:
            b, a = np.asarray(lw.b[start : start + n], np.float32), np.asarray(lw.a, np.float32)  # F16: widened
            w_rows += np.float32(scale) * (b @ a)
    return w_rows


def _merged_slabs(t: GGUFTensor, parts: Sequence[Part], m: Merged, threads: int) -> Iterator[npt.NDArray[Any]]:
    from edgellama.native import kernels

    n_in = t.shape[0]
    n_rows = t.n_elements // n_in
    per_slab = max(1, min(SLAB_FLOATS // n_in, -(-n_rows // threads)))
    slabs = [(r, min(per_slab, n_rows - r)) for r in range(0, n_rows, per_slab)]

    def one(slab: tuple[int, int]) -> npt.NDArray[Any]:
        r0, n = slab
        x = merge_rows(np.array(_floats(t, r0, n, n_in)).reshape(n, n_in), parts, r0)
        if not np.isfinite(x).all():
            raise LoraError(f"tensor {t.name!r}: the merge gives inf or NaN in rows {r0}..{r0 + n} "
                            "(an adapter scale too large?)")
        rb = row_bytes(t.ggml_type, n_in)
        _release(t, r0 * rb, n * rb)
        return x if m.out_type == GGMLType.F32 else kernels.quantize(x, m.out_type)

    if threads <= 1 or len(slabs) == 1:
        yield from map(one, slabs)
        return
    with ThreadPoolExecutor(threads) as pool:  # numpy's matmul and the C quantizers release the GIL
        for i in range(0, len(slabs), threads):
            yield from pool.map(one, slabs[i : i + threads])


def _producer(t: GGUFTensor, parts: Sequence[Part], m: Merged, threads: int, i: int, n: int,
              progress: Callable[[int, int, Merged], None] | None) -> Callable[[], Any]:
    def produce() -> Iterator[Any]:
        if progress is not None:
            progress(i, n, m)
        yield from _merged_slabs(t, parts, m, threads)
        _release(t)
    return produce
