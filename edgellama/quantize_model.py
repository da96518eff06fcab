"""Quantize a GGUF model to one of llama.cpp's file types, streaming tensor by tensor.

Tensor types come from quant_mix (llama-quant.cpp's rules); the bytes from the C library's reference
quantizers (csrc/quants.c, quants_k.c: llama.cpp's quantize_row_*_ref, tested bit-exact against them),
which is what llama-quantize runs when it has no importance matrix. The file is laid out as
llama-quantize lays it out: its metadata with general.quantization_version and general.file_type set
last, tensors in its loader's order. Each tensor is converted in slabs of rows written as they are
made: memory stays at a slab of floats and its output, whatever the model's size.
It runs the C library's quantizers, so it lives above the GGUF layer (edgellama/gguf/), not in it.
"""

from __future__ import annotations

import mmap
import os
import sys
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt

from edgellama.gguf.ggml_types import row_bytes, type_name
from edgellama.gguf.quant_mix import (
    QUANTIZATION_VERSION,
    QUANTIZED,
    Choice,
    Options,
    choose_types,
    file_type,
    llama_order,
)
from edgellama.gguf.reader import GGUFTensor, GGUFValueType
from edgellama.gguf.split import SPLIT_KEYS, open_model_file
from edgellama.gguf.writer import GGUFWriter

SLAB_FLOATS = 1 << 22  # 16 MiB of float32 per slab and thread
_OVERRIDE_TYPES = {"int": GGUFValueType.UINT32, "float": GGUFValueType.FLOAT32, "bool": GGUFValueType.BOOL,
                   "str": GGUFValueType.STRING}


class RequantizeError(ValueError):
    pass


@dataclass
class Override:
    key: str
    vtype: GGUFValueType
    value: Any


def parse_override(text: str) -> Override:
    """--override-kv KEY=TYPE:VALUE (TYPE int, float, bool, str), as llama.cpp takes it. int is stored
    as u32 of its absolute value and float as f32, as llama-quantize stores them."""
    key, sep, rest = text.partition("=")
    kind, sep2, value = rest.partition(":")
    if not sep or not sep2 or not key or kind not in _OVERRIDE_TYPES:
        raise ValueError(f"--override-kv {text!r}: want KEY=TYPE:VALUE with TYPE one of int, float, bool, str")
    vt = _OVERRIDE_TYPES[kind]
    try:
        v: Any = abs(int(value)) if kind == "int" else float(value) if kind == "float" else value
    except ValueError:
        raise ValueError(f"--override-kv {text!r}: {value!r} is not a {kind}") from None
    if kind == "bool":
        if value not in ("true", "false"):
            raise ValueError(f"--override-kv {text!r}: bool is true or false")
        v = value == "true"
    return Override(key, vt, v)


def _floats(t: GGUFTensor, start: int, count: int, n_per_row: int) -> npt.NDArray[np.float32]:
    """Rows [start, start + count) of t as float32 (a view for F32 input)."""
    from edgellama.native import kernels

    rb = row_bytes(t.ggml_type, n_per_row)
    raw = t.data[start * rb : (start + count) * rb]
    if t.ggml_type == 0:
        return raw.view(np.float32)
    return kernels.dequantize(raw, t.ggml_type, count * n_per_row)


def _convert(t: GGUFTensor, new_type: int, threads: int) -> Iterator[npt.NDArray[np.uint8]]:
    from edgellama.native import kernels
    from edgellama.native.lib import KernelError

    n_per_row = t.shape[0]
    n_rows = t.n_elements // n_per_row
    # at most SLAB_FLOATS a slab, and at least one slab a thread (rows quantize independently, so the
    # bytes do not depend on the split)
    per_slab = max(1, min(SLAB_FLOATS // n_per_row, -(-n_rows // threads)))
    slabs = [(r, min(per_slab, n_rows - r)) for r in range(0, n_rows, per_slab)]

    def one(slab: tuple[int, int]) -> npt.NDArray[np.uint8]:
        x = _floats(t, slab[0], slab[1], n_per_row)
        try:
            q = kernels.quantize(x, new_type)
        except (KernelError, ValueError) as exc:
            raise ValueError(f"tensor {t.name!r} rows {slab[0]}..{slab[0] + slab[1]}: cannot convert to "
                             f"{type_name(new_type)}: {exc} (inf or NaN in the input?)") from None
        rb = row_bytes(t.ggml_type, n_per_row)
        _release(t, slab[0] * rb, slab[1] * rb)
        return q

    if threads <= 1 or len(slabs) == 1:
        yield from map(one, slabs)
        return
    with ThreadPoolExecutor(threads) as pool:  # the C calls release the GIL; map keeps the order
        for i in range(0, len(slabs), threads):
            yield from pool.map(one, slabs[i : i + threads])


@dataclass
class Result:
    path: Path
    file_type: str
    choices: list[Choice]
    size_in: int
    size_out: int


def quantize_model(src_path: str | os.PathLike[str], out_path: str | os.PathLike[str], type_name_: str, *,
                   opts: Options | None = None, allow_requantize: bool = False, threads: int = 1,
                   overrides: list[Override] | None = None,
                   progress: Callable[[int, int, Choice], None] | None = None) -> Result:
    opts = opts or Options()
    ft, ft_id, _ = file_type(type_name_)
    out_path = Path(out_path)
    with open_model_file(src_path) as src:
        if out_path.exists() and any(out_path.samefile(p) for p in getattr(src, "paths", [src.path])):
            raise ValueError(f"{out_path}: is the input model")
        order = llama_order([t.name for t in src.tensors])
        tensors = [src.tensor(n) for n in order]
        choices = choose_types(tensors, src.metadata, ft, opts)
        from edgellama.native.kernels import WEIGHT_TYPES

        for c in choices:
            if c.new_type != c.src_type and c.src_type not in WEIGHT_TYPES:
                raise ValueError(f"tensor {c.name!r}: its type {type_name(c.src_type)} is not supported by the "
                                 "kernels, so it cannot be converted")
            if c.new_type != c.src_type and c.src_type in QUANTIZED and not allow_requantize:
                raise RequantizeError(f"tensor {c.name!r} is already {type_name(c.src_type)}: requantizing is "
                                      "refused without --allow-requantize (quality loss)")
        w = GGUFWriter(out_path, alignment=src.alignment)
        w.remove("general.alignment")
        skip = {*SPLIT_KEYS, "general.quantization_version", "general.file_type"}
        skip |= {o.key for o in overrides or []}
        for key in src.metadata:
            if key not in skip:
                w.add_kv_bytes(key, src.kv_bytes(key))
        w.add("general.quantization_version", QUANTIZATION_VERSION, GGUFValueType.UINT32)
        w.add("general.file_type", ft_id, GGUFValueType.UINT32)
        for o in overrides or []:
            w.add(o.key, o.value, o.vtype)
        n = len(tensors)
        for i, (t, c) in enumerate(zip(tensors, choices)):
            w.add_tensor_producer(t.name, t.shape, c.new_type, _producer(t, c, threads, i, n, progress))
        w.write()
        size_in = sum(t.n_bytes for t in tensors)
    return Result(out_path, ft, choices, size_in, out_path.stat().st_size)


def _producer(t: GGUFTensor, c: Choice, threads: int, i: int, n: int,
              progress: Callable[[int, int, Choice], None] | None) -> Callable[[], Any]:
    def produce() -> Iterator[Any]:
        if progress is not None:
            progress(i, n, c)
        if c.new_type == t.ggml_type:
            yield t.data  # copied from the mapping as it is
        else:
            yield from _convert(t, c.new_type, threads)
        _release(t)  # the writer has written the last slab when the generator resumes here
    return produce


def _release(t: GGUFTensor, rel: int = 0, n: int | None = None) -> None:
    """Drop bytes [rel, rel + n) of the input tensor (all of it by default) from this process; they
    stay in the page cache. Without it the mapped input counts in the RSS until the end, as much as
    the whole model; with it, per slab, the peak is a slab or two, not the largest tensor."""
    mm = t._buf
    n = t.n_bytes - rel if n is None else n
    if not isinstance(mm, mmap.mmap) or not hasattr(mmap, "MADV_DONTNEED") or n <= 0:
        return
    first = t.offset + rel
    start = first - first % mmap.PAGESIZE  # a shared edge page is simply read again if needed
    try:
        mm.madvise(mmap.MADV_DONTNEED, start, first + n - start)
    except (OSError, ValueError):
        pass  # only a memory figure is lost


def stderr_progress(i: int, n: int, c: Choice) -> None:
    if sys.stderr.isatty():
        sys.stderr.write(f"\r[{i + 1:4d}/{n:4d}] {c.name:<40} {type_name(c.src_type):>5} -> {type_name(c.new_type):<5}")
        if i + 1 == n:
            sys.stderr.write("\n")
        sys.stderr.flush()
