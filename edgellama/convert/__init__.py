"""Hugging Face folder -> GGUF (`edgellama convert`): the file llama.cpp's convert_hf_to_gguf.py writes
for the same folder and outtype (metadata keys in its order, its vocabulary layout, tensor names, order
and types, Q8_0 from the reference quantizer), so llama.cpp and edgellama both load it.

BERT only so far (edgellama.convert.bert); reads safetensors with numpy, never imports torch or
transformers, and writes the same bytes every run.
"""

from __future__ import annotations

import math
import os
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt

from edgellama.convert import bert
from edgellama.convert.hf_folder import ConvertError, find_hparam, load_config, pooling_type, weight_files
from edgellama.convert.model_card import general_keys, read_model_card, size_label
from edgellama.gguf.ggml_types import GGMLType, type_name
from edgellama.gguf.reader import GGUFValueType
from edgellama.gguf.writer import GGUFWriter

__all__ = ["OUTTYPES", "ConvertError", "Result", "convert"]

# --outtype -> (tensor type of the weights, general.file_type: LlamaFileType ALL_F32, MOSTLY_F16, MOSTLY_Q8_0)
OUTTYPES: dict[str, tuple[int, int]] = {"f32": (GGMLType.F32, 0), "f16": (GGMLType.F16, 1), "q8_0": (GGMLType.Q8_0, 7)}
QUANTIZATION_VERSION = 2  # gguf-py's GGML_QUANT_VERSION
SLAB_VALUES = 1 << 20  # a tensor is converted and written in slabs of rows of about this many values


@dataclass
class Result:
    path: Path
    outtype: str
    n_tensors: int
    n_params: int
    types: dict[str, int]  # tensor type name -> how many tensors have it
    size: int


def _slabs(t: bert.Tensor, ggml_type: int) -> Iterator[npt.NDArray[Any]]:
    a = t.load()
    rows = a.reshape(-1, a.shape[-1]) if a.ndim > 1 else a.reshape(1, -1)
    step = max(1, SLAB_VALUES // rows.shape[1])
    for r in range(0, rows.shape[0], step):
        x = rows[r : r + step]
        if ggml_type == GGMLType.F32:
            yield x if x.dtype == np.float32 else x.astype(np.float32)
        elif ggml_type == GGMLType.F16:
            yield x.astype(np.float16)  # round to nearest even, as gguf-py's quantize(F16) does
        else:
            from edgellama.native import kernels

            yield kernels.quantize(x.astype(np.float32), ggml_type)


def _producer(t: bert.Tensor, ggml_type: int, progress: Callable[[str, int], None] | None) -> Callable[[], Any]:
    def produce() -> Iterator[npt.NDArray[Any]]:
        if progress is not None:
            progress(t.name, ggml_type)
        yield from _slabs(t, ggml_type)
    return produce


def _general_value(key: str, value: Any) -> tuple[Any, GGUFValueType | None, GGUFValueType | None]:
    if key.endswith(".count"):
        return value, GGUFValueType.UINT32, None
    if isinstance(value, list):
        return [str(v) for v in value if v is not None], GGUFValueType.ARRAY, GGUFValueType.STRING
    return str(value), GGUFValueType.STRING, None


def convert(folder: str | os.PathLike[str], out: str | os.PathLike[str], outtype: str = "f16",
            progress: Callable[[str, int], None] | None = None) -> Result:
    """Writes folder's model to out as outtype (f32, f16, q8_0); the file appears whole or not at all."""
    if outtype not in OUTTYPES:
        raise ValueError(f"outtype {outtype!r}: want one of {', '.join(OUTTYPES)}")
    src, out = Path(folder), Path(out)
    weight_type, file_type = OUTTYPES[outtype]
    config = load_config(src)
    bert.check_architecture(config)
    n_layer = bert._uint(find_hparam(config, ["n_layers", "num_hidden_layers", "n_layer", "num_layers"]),
                         "num_hidden_layers")
    files = weight_files(src)
    try:
        ts = bert.tensors(files)
        for t in ts:
            if t.name.startswith("blk.") and int(t.name.split(".")[1]) >= n_layer:
                raise ConvertError(f"tensor {t.src!r}: layer {t.name.split('.')[1]} of {n_layer} (num_hidden_layers)")
            if not t.shape or 0 in t.shape or len(t.shape) > 4:
                raise ConvertError(f"tensor {t.src!r}: shape {list(t.shape)} cannot be stored in GGUF")
        n_params = sum(math.prod(t.shape) for t in ts)
        card = read_model_card(src, n_params)
        if card.size_label is None and n_params > 0:
            card.size_label = size_label(n_params)
        if card.name is None:
            card.name = src.resolve().name
        w = GGUFWriter(out, arch="bert")
        w.add("general.type", "model")
        for key, value in general_keys(card):
            v, vt, et = _general_value(key, value)
            w.add(key, v, vt, et)
        for key, value, vt in bert.hparams(config, n_layer, file_type, pooling_type(src, config)):
            w.add(key, value, vt)
        w.add("general.quantization_version", QUANTIZATION_VERSION, GGUFValueType.UINT32)
        tok_kv, _ = bert.tokenizer_keys(src, config)
        for key, value, vt in tok_kv:
            w.add(key, value, vt)
        types: dict[str, int] = {}
        for t in ts:
            tt = bert.tensor_type(t, weight_type)
            types[type_name(tt)] = types.get(type_name(tt), 0) + 1
            w.add_tensor_producer(t.name, tuple(reversed(t.shape)), tt, _producer(t, tt, progress))
        if out.exists() and any(out.samefile(f.path) for f in files):
            raise ValueError(f"{out}: is the input model")
        w.write()
    finally:
        for f in files:
            f.close()
    return Result(out, outtype, len(ts), n_params, types, out.stat().st_size)

