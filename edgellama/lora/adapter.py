"""Reads a GGUF LoRA adapter as llama.cpp's convert_lora_to_gguf.py writes it and checks it against
the base model it is meant for; the low-rank matrices come back as float16 where the file stores F16
(kept as halves: the engine reads them as they are, half the bytes per pass) and as float32 otherwise
(BF16 and Q8_0 widened; adapters are small).

The layout: general.type "adapter", adapter.type "lora", adapter.lora.alpha (f32), and per adapted
base tensor W (GGUF ne = [n_in, n_out]) a pair ``W.lora_a`` (ne = [n_in, rank]) and ``W.lora_b``
(ne = [rank, n_out]), so that W x + scale * B (A x) is the adapted product. Every problem is a
LoraError naming the file and, where there is one, the tensor; nothing is half loaded.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt

from edgellama.gguf.ggml_types import GGMLType, type_name
from edgellama.gguf.reader import GGUFError, GGUFFile, GGUFTensor, GGUFValueType
from edgellama.gguf.split import ModelFile

SUFFIX_A = ".lora_a"
SUFFIX_B = ".lora_b"
KEY_TYPE = "general.type"
KEY_ADAPTER_TYPE = "adapter.type"
KEY_ALPHA = "adapter.lora.alpha"
KEY_ALORA_TOKENS = "adapter.alora.invocation_tokens"
# optional strings llama.cpp reads and llama-server lists on GET /lora-adapters
KEY_TASK_NAME = "adapter.lora.task_name"
KEY_PROMPT_PREFIX = "adapter.lora.prompt_prefix"
# The tensor types convert_lora_to_gguf.py writes (--outtype f32, f16, bf16, q8_0).
ADAPTER_TYPES = (GGMLType.F32, GGMLType.F16, GGMLType.BF16, GGMLType.Q8_0)
_NUMERIC = {GGUFValueType.FLOAT32, GGUFValueType.FLOAT64, GGUFValueType.INT8, GGUFValueType.UINT8,
            GGUFValueType.INT16, GGUFValueType.UINT16, GGUFValueType.INT32, GGUFValueType.UINT32,
            GGUFValueType.INT64, GGUFValueType.UINT64}


class LoraError(ValueError):
    """An adapter file that cannot be used with this base model; the message names file and problem."""


@dataclass(frozen=True, eq=False)
class LoraWeight:
    """The pair for one base tensor, numpy (row-major) order: y += scale * b @ (a @ x)."""

    a: npt.NDArray[np.floating[Any]]  # [rank, n_in]  (GGUF lora_a: ne = [n_in, rank]); float16 or float32
    # [n_out, rank] (GGUF lora_b: ne = [rank, n_out]); likewise. From the reader it is the transpose of a
    # C-contiguous [rank, n_out] array: the layout the engine reads (csrc/lora.c), handed over uncopied.
    b: npt.NDArray[np.floating[Any]]

    @property
    def rank(self) -> int:
        return int(self.a.shape[0])


@dataclass
class LoraAdapter:
    path: Path
    name: str  # file stem, for logs and /lora-adapters
    alpha: float
    weights: dict[str, LoraWeight]  # base tensor name (e.g. "blk.0.attn_q.weight") -> its pair
    task_name: str = ""  # adapter.lora.task_name, "" when absent (as llama.cpp reads it)
    prompt_prefix: str = ""  # adapter.lora.prompt_prefix, likewise

    def scale_of(self, base_name: str, user_scale: float) -> float:
        """user_scale * alpha / rank, in float32 as llama.cpp computes it (alpha 0: user_scale alone)."""
        rank = self.weights[base_name].rank  # KeyError for a tensor this adapter does not touch
        if self.alpha == 0:
            return float(np.float32(user_scale))
        with np.errstate(over="ignore"):  # a huge user scale gives inf, for the caller to refuse
            return float(np.float32(user_scale) * np.float32(self.alpha) / np.float32(rank))

    @property
    def nbytes(self) -> int:
        """Bytes of the arrays held (what the memory plan counts)."""
        return sum(w.a.nbytes + w.b.nbytes for w in self.weights.values())


def read_adapter(path: str | Path, base: ModelFile) -> LoraAdapter:
    """Read the adapter at path and check it against base (the opened base model, a single file or a
    split set); F16 tensors are copied as float16, the others dequantized to float32, and the file is
    closed again."""
    path = Path(path)
    try:
        f = GGUFFile(path)
    except GGUFError as exc:
        raise LoraError(f"LoRA adapter {exc}") from None
    with f:
        alpha = _check_metadata(f, base)
        pairs = _pair_tensors(f)
        weights = {name: _load_pair(f, name, a, b, base) for name, (a, b) in pairs.items()}
        task_name, prompt_prefix = _string(f, KEY_TASK_NAME) or "", _string(f, KEY_PROMPT_PREFIX) or ""
    if not weights:
        raise LoraError(f"{path}: LoRA adapter holds no lora_a/lora_b tensor pairs")
    return LoraAdapter(path=path, name=path.stem, alpha=alpha, weights=weights, task_name=task_name,
                       prompt_prefix=prompt_prefix)


def _string(f: GGUFFile, key: str) -> str | None:
    v = f.metadata.get(key)
    return v if f.metadata_types.get(key) == (GGUFValueType.STRING,) else None


def _check_metadata(f: GGUFFile, base: ModelFile) -> float:
    p = f.path
    gtype = _string(f, KEY_TYPE)
    if gtype != "adapter":
        got = "missing" if KEY_TYPE not in f.metadata else repr(f.metadata[KEY_TYPE])
        model = gtype in (None, "model") and any(not t.name.endswith((SUFFIX_A, SUFFIX_B)) for t in f.tensors)
        raise LoraError(f"{p}: not a LoRA adapter: {KEY_TYPE} is {got}, expected 'adapter'"
                        + (" (this is a model file; give it with -m)" if model else ""))
    atype = _string(f, KEY_ADAPTER_TYPE)
    if atype != "lora":
        got = "missing" if KEY_ADAPTER_TYPE not in f.metadata else repr(f.metadata[KEY_ADAPTER_TYPE])
        raise LoraError(f"{p}: {KEY_ADAPTER_TYPE} is {got}, expected 'lora' (only LoRA adapters are supported)")
    arch = _string(f, "general.architecture")
    if arch is None:
        raise LoraError(f"{p}: LoRA adapter has no general.architecture")
    if arch != base.architecture:
        raise LoraError(f"{p}: LoRA adapter is for architecture {arch!r}, the base model "
                        f"{base.path.name} is {base.architecture!r}")
    if KEY_ALORA_TOKENS in f.metadata:
        raise LoraError(f"{p}: activated LoRA ({KEY_ALORA_TOKENS}) is not supported")
    if KEY_ALPHA not in f.metadata:
        # llama.cpp reads a missing alpha as 0 (scale = user scale, whatever the rank), which silently
        # changes the strength of any adapter trained with alpha != rank: refused rather than guessed.
        raise LoraError(f"{p}: LoRA adapter has no {KEY_ALPHA}; cannot tell its scale")
    if f.metadata_types[KEY_ALPHA] not in {(t,) for t in _NUMERIC}:
        raise LoraError(f"{p}: {KEY_ALPHA} has type {f.metadata_types[KEY_ALPHA][0].name}, expected a number")
    alpha = float(f.metadata[KEY_ALPHA])
    if not math.isfinite(alpha):
        raise LoraError(f"{p}: {KEY_ALPHA} is {alpha}, not a finite number")
    return float(np.float32(alpha))


def _pair_tensors(f: GGUFFile) -> dict[str, tuple[GGUFTensor, GGUFTensor]]:
    a_of: dict[str, GGUFTensor] = {}
    b_of: dict[str, GGUFTensor] = {}
    for t in f.tensors:
        if t.name.endswith(SUFFIX_A):
            a_of[t.name[: -len(SUFFIX_A)]] = t
        elif t.name.endswith(SUFFIX_B):
            b_of[t.name[: -len(SUFFIX_B)]] = t
        elif t.name.endswith("_norm.weight"):
            continue  # mergekit-extract-lora carries norms along; llama.cpp ignores them too
        else:
            raise LoraError(f"{f.path}: tensor {t.name!r} is neither a .lora_a nor a .lora_b tensor")
    for name in a_of.keys() - b_of.keys():
        raise LoraError(f"{f.path}: tensor {name + SUFFIX_A!r} has no {name + SUFFIX_B!r}")
    for name in b_of.keys() - a_of.keys():
        raise LoraError(f"{f.path}: tensor {name + SUFFIX_B!r} has no {name + SUFFIX_A!r}")
    return {name: (a_of[name], b_of[name]) for name in a_of}


def _dims2(t: GGUFTensor) -> tuple[int, int] | None:
    """(ne0, ne1) of a matrix; None when the tensor has more than two non-trivial dimensions."""
    ne = (*t.shape, 1, 1)
    return (ne[0], ne[1]) if all(d == 1 for d in ne[2:]) else None


def _load_pair(f: GGUFFile, name: str, ta: GGUFTensor, tb: GGUFTensor, base: ModelFile) -> LoraWeight:
    p = f.path
    if name == "token_embd.weight":
        raise LoraError(f"{p}: LoRA on token_embd is not supported (tensor {name!r})")
    try:
        w = base.tensor(name)
    except KeyError:
        raise LoraError(f"{p}: tensor {name!r} does not exist in the base model {base.path.name} "
                        "(an adapter for another model?)") from None
    wd = _dims2(w)
    if wd is None or len(w.shape) < 2:
        raise LoraError(f"{p}: base tensor {name!r} {w.shape} is not a matrix; LoRA applies to matrices only")
    for t in (ta, tb):
        if t.ggml_type not in ADAPTER_TYPES:
            raise LoraError(f"{p}: tensor {t.name!r} has type {t.type_name}; LoRA tensors must be "
                            f"{', '.join(type_name(x) for x in ADAPTER_TYPES)}")
    ad, bd = _dims2(ta), _dims2(tb)
    if ad is None or bd is None:
        raise LoraError(f"{p}: tensor {name!r}: lora_a {ta.shape} and lora_b {tb.shape} must be matrices")
    (n_in, rank_a), (rank_b, n_out) = ad, bd
    if n_in != wd[0] or n_out != wd[1]:
        raise LoraError(f"{p}: tensor {name!r}: lora_a ne {ta.shape} and lora_b ne {tb.shape} do not fit the "
                        f"base tensor's ne {w.shape} (expected lora_a [{wd[0]}, rank], lora_b [rank, {wd[1]}]; "
                        "an adapter for another model?)")
    if rank_a != rank_b:
        raise LoraError(f"{p}: tensor {name!r}: lora_a rank {rank_a} differs from lora_b rank {rank_b} "
                        "(lora_a must be [n_in, rank], lora_b [rank, n_out])")
    a = _floats(f, ta).reshape(rank_a, n_in)
    bt = np.ascontiguousarray(_floats(f, tb).reshape(n_out, rank_b).T)
    return LoraWeight(a=a, b=bt.T)


def _floats(f: GGUFFile, t: GGUFTensor) -> npt.NDArray[np.floating[Any]]:
    from edgellama.native import kernels

    x: npt.NDArray[np.floating[Any]]
    if t.ggml_type == GGMLType.F32:
        x = np.array(t.data.view(np.float32))  # a copy: the file is closed after reading
    elif t.ggml_type == GGMLType.F16:
        x = np.array(t.data.view(np.float16))  # the engine's F16 terms read halves as they are
    else:
        x = kernels.dequantize(t.data, t.ggml_type, t.n_elements)
    if not np.isfinite(x).all():
        bad = int(np.argmin(np.isfinite(x)))
        raise LoraError(f"{f.path}: tensor {t.name!r} holds a non-finite value ({x[bad]} at element {bad})")
    return x
